"""`smearcli plot`: one figure of the old and the fixed logic on one schedule (PNG, SVG or PDF)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ...errors import UserError
from ...names import figure_schedule
from ...render.figures import FORMATS, KINDS
from ..options import RunSpec, shared_options


Kind = Enum("Kind", {k: k for k in KINDS}, type=str)  # the figure kinds, as --kind choices


@shared_options
def plot(
    spec: RunSpec,
    out: Annotated[Path, typer.Option("--out", "-o", help="Figure file to write; the suffix picks the "
                   "format: .png, .svg or .pdf. Written atomically (an existing file is only "
                   "replaced by a complete one).")],
    dpi: Annotated[float, typer.Option("--dpi", help="Resolution of a .png (dots per inch; the "
                   "figure is 11 inches wide).")] = 150.0,
    kind: Annotated[Kind, typer.Option("--kind", help="all: the three panels; error: logit error "
                    "per position; heatmap: relative error per layer and position; kl: KL per "
                    "position.")] = Kind.all,
) -> None:
    """Draw where the smear bug is born and how far it spreads, old vs fixed logic, on one
    schedule (chunked if --schedules lists it, else speculative if listed, else the first listed): logit error per position
    with the noise floor, a position x layer heat map, and KL per position. The numbers are
    those `compare --json` reports for the same options."""
    from ... import compare as lib
    from ...files import check_output_path
    from ...render import figures
    from ..build import build_setup
    from ...checkpoint import NoSmearParameters
    from ..progress import progress_bar

    check_output_path(out, FORMATS)
    if not 1 <= dpi <= 1200:
        raise UserError(f"--dpi must be between 1 and 1200, got {dpi:g}")
    if spec.impl == "hf":  # a Hugging Face model (cli.hf imports transformers, only here)
        from .. import hf
        schedule, verdict = hf.plot(spec, out, dpi, kind.value)
        typer.echo(f"wrote {out} ({kind.value}, schedule {schedule})")
        return typer.echo(verdict)
    listed = spec.schedule_list()
    schedule = figure_schedule(listed)
    if len(listed) > 1 and spec.schedules != RunSpec().schedules:
        sys.stderr.write(f"smearcli: plot draws one schedule per figure: {schedule} "
                         f"(of {', '.join(listed)})\n")
    spec.schedules = schedule
    try:
        setup = build_setup(spec)
    except NoSmearParameters:  # an answer, not an error
        from ..build import NO_SMEAR_VERDICT
        typer.echo(f"{NO_SMEAR_VERDICT}; no figure written")
        return
    n_runs = 1 + len(setup.logics) + (schedule != "decode")
    if setup.impl == "both":
        n_runs += 2 + (schedule != "decode")
    unit = "runs" if setup.audited is not None else "tokens"
    with progress_bar("plot", n_runs if unit == "runs" else None, quiet=spec.quiet, unit=unit) as bar:
        if setup.audited is not None:  # --impl nanochat|both: the user's own code
            from ...impls.nanochat.audit import for_plot
            reference = setup.model if setup.impl == "both" else None
            result, verdict = for_plot(setup.audited, setup.tokens, schedule, setup.options,
                                       reference=reference, progress=bar.advance)
        else:
            result = lib.compare(setup.model, setup.tokens, [schedule], setup.logics, setup.options,
                                 progress=bar.label, tokens_progress=bar.tokens)
            verdict = result.verdict
    fig = figures.figure(result, schedule, kind.value, model_name=setup.loaded.name)
    figures.save(fig, out, dpi=dpi)
    typer.echo(f"wrote {out} ({kind.value}, schedule {schedule}; {setup.threads})")
    typer.echo(verdict)
