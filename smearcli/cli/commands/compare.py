"""`smearcli compare`: every schedule under the old and the fixed smear, against the full forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...errors import UserError
from ...names import NOISE_MARGIN
from ..errors import CheckFailed
from ..options import RunSpec, shared_options


@shared_options
def compare(
    spec: RunSpec,
    json_out: Annotated[bool, typer.Option("--json", "--no-json", help="Print the results as JSON (schema "
                        "smearcli.compare/1) instead of the table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--save", help="Write every run's logits and "
                    "metadata to this .pt file (load with torch.load(..., weights_only=True)).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if any run of the chosen --logic "
                     "leaves the tolerance: a CI gate for a fork's fix (use with --logic fixed).")] = False,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Allowed max |Δlogit| as a multiple "
                         "of the measured noise floor.")] = NOISE_MARGIN,
) -> None:
    """Run each schedule with the old and the fixed smear logic and measure it against the full
    forward pass: per position, per layer, logits, KL, top-1, and a one-line verdict. Try
    `smearcli compare --chunk-sizes 100,60,1,159` or, as a CI gate for a fix,
    `smearcli compare --logic fixed --check`."""
    from ... import compare as lib
    from ...files import atomic_write, check_output_path
    from ...render.table import console, print_comparison, title_line
    from ..build import build_setup
    from ...checkpoint import NoSmearParameters
    from ..progress import progress_bar

    if not 0 < tolerance < float("inf"):  # also refuses nan, which would fail every run
        raise UserError(f"--tolerance must be a positive finite number, got {tolerance}")
    if save is not None:
        check_output_path(save, (".pt",))
    if spec.impl == "hf":  # a Hugging Face model (cli.hf imports transformers, only here)
        from .. import hf
        return hf.compare(spec, json_out, save, check, tolerance)
    try:
        setup = build_setup(spec)
    except NoSmearParameters as e:  # an answer, not an error: exit 0, also with --check
        return _no_smear(spec, getattr(e, "found", None), json_out, save)
    if setup.audited is not None:
        return _audit(setup, json_out, save, check, tolerance, spec.quiet)
    with progress_bar("compare", quiet=spec.quiet, unit="tokens") as bar:
        result = lib.compare(setup.model, setup.tokens, setup.schedules, setup.logics, setup.options,
                             tolerance=tolerance, progress=bar.label, tokens_progress=bar.tokens)
    info = _model_info(setup)
    document = lib.to_json(result, info)
    if json_out:
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        print_comparison(result, console(), title_line(setup.loaded.name, setup.model, setup.tokens),
                         footer=setup.threads)
    if save is not None:
        import torch
        with atomic_write(save, "wb") as f:
            torch.save(lib.save_payload(document, {"": result}), f)
    if check and result.failures:
        raise CheckFailed(result.verdict)


def _model_info(setup) -> dict:
    from ..build import checkpoint_info

    info = {"name": setup.loaded.name, "source": setup.loaded.source, "step": setup.loaded.step}
    if setup.found is not None:
        info["checkpoint"] = checkpoint_info(setup.found)
    return info


def _no_smear(spec: RunSpec, found, json_out: bool, save: Optional[Path]) -> None:
    """A checkpoint from before nanochat added the smear: the verdict, no runs."""
    from ..build import NO_SMEAR_VERDICT, checkpoint_info

    impl = getattr(spec.impl, "value", spec.impl)
    if save is not None:
        sys.stderr.write(f"smearcli: nothing was run, so nothing was saved to {save}\n")
    if json_out:
        info = {"name": None if found is None else f"{found.leaf}@{found.step}",
                "source": None if found is None else str(found.leaf),
                "step": None if found is None else found.step, "checkpoint": checkpoint_info(found)}
        doc = {"schema": "smearcli.compare/1" if impl == "ours" else "smearcli.audit/1", "model": info,
               "no_smear": True, "runs": [], "verdict": NO_SMEAR_VERDICT}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        typer.echo(NO_SMEAR_VERDICT)


def _audit(setup, json_out: bool, save: Optional[Path], check: bool, tolerance: float,
           quiet: bool = False) -> None:
    """--impl nanochat|both: the same runs on the user's own nanochat code."""
    from ...files import atomic_write
    from ...impls.nanochat import audit
    from ...render.table import console, title_line
    from ..progress import progress_bar

    extra = "decode" not in setup.schedules
    n_runs = 1 + len(setup.schedules) + extra
    if setup.impl == "both":
        n_runs += 1 + 2 * len(setup.schedules) + extra
    reference = setup.model if setup.impl == "both" else None
    with progress_bar("audit", n_runs, quiet=quiet) as bar:
        result = audit.audit(setup.audited, setup.tokens, setup.schedules, setup.options, tolerance,
                             reference=reference, progress=bar.advance)
    info = _model_info(setup)
    if json_out:
        sys.stdout.write(json.dumps(audit.to_json(result, info), indent=1) + "\n")
    else:
        audit.print_audit(result, console(), title_line(setup.loaded.name, setup.audited, setup.tokens),
                          footer=setup.threads)
    if save is not None:
        import torch
        with atomic_write(save, "wb") as f:
            torch.save(audit.save_payload(result, info), f)
    if check and result.failed:
        raise CheckFailed(result.verdict)
