"""`smearcli plot`: one figure of the old and the fixed logic on one schedule (PNG, SVG or PDF)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ...util.errors import UserError
from ...util.defaults import NOISE_MARGIN, figure_schedule
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
                    "position. With --schedules packed, all draws the packed figure's two panels "
                    "(error per position, and each document boundary's leak split into the smear's "
                    "and attention's parts); heatmap and kl draw the first logic's.")] = Kind.all,
) -> None:
    """Draw where the smear bug is born and how far it spreads, old vs fixed logic, on one
    schedule (chunked if --schedules lists it, else speculative if listed, else the first listed): logit error per position
    with the noise floor, a position x layer heat map, and KL per position. The numbers are
    those `compare --json` reports for the same options."""
    from ...util.files import check_output_path
    from ...render import figures
    from ..impls import implementation, schedules_for
    from ..progress import progress_bar

    check_output_path(out, FORMATS)
    if not 1 <= dpi <= 1200:
        raise UserError(f"--dpi must be between 1 and 1200, got {dpi:g}")
    impl = implementation(spec, "plot")
    listed = schedules_for(spec, impl)
    schedule = figure_schedule(listed)
    if len(listed) > 1 and spec.schedules != RunSpec().schedules:
        sys.stderr.write(f"smearcli: plot draws one schedule per figure: {schedule} "
                         f"(of {', '.join(listed)})\n")
    job = impl.job(spec, [schedule], NOISE_MARGIN)
    with progress_bar("plot", quiet=spec.quiet, unit="tokens") as bar:
        report = job.run(bar)
    fig = report.draw(schedule, kind.value)
    if fig is None:  # an answer without runs
        typer.echo(f"{report.verdict}; no figure written")
        return
    figures.save(fig, out, dpi=dpi)
    footer = f"; {report.footer}" if report.footer else ""
    typer.echo(f"wrote {out} ({kind.value}, schedule {schedule}{footer})")
    typer.echo(report.verdict)
