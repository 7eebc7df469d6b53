"""`smearcli compare`: every schedule under the old and the fixed smear, against the full forward."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...util import jsonsafe
from ...util.errors import UserError
from ...util.defaults import NOISE_MARGIN
from ..errors import CheckFailed
from ..options import RunSpec, check_scope, shared_options


@shared_options
def compare(
    spec: RunSpec,
    json_out: Annotated[bool, typer.Option("--json", "--no-json", help="Print the results as JSON (schema "
                        "smearcli.compare/1) instead of the table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--save", help="Write every run's logits and "
                    "metadata to this .pt file (load with torch.load(..., weights_only=True)).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if any run of the chosen --logic "
                     "leaves the tolerance: a CI gate for a fork's fix (use with --logic fixed). With --impl "
                     "hf, vllm or llamacpp a finding upstream already tracks (open, fixed in a later release, "
                     "by design: smearcli/census/known.toml) is listed, not failed; `--check all` fails on "
                     "it too.")] = False,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Allowed max |Δlogit| as a multiple "
                         "of the measured noise floor.")] = NOISE_MARGIN,
    profile: Annotated[bool, typer.Option("--profile", help="Print to stderr, at the end, the wall time "
                       "of each stage (imports, build, runs, forwards, float64 floor, metrics, "
                       "confirmation, power, output) and the rest (also SMEARCLI_PROFILE=1).")] = False,
    scope: Annotated[Optional[str], typer.Argument(hidden=True, metavar="[all]", help="After --check: `all` fails "
                     "on findings upstream already tracks too.")] = None,
) -> None:
    """Run each schedule with the old and the fixed smear logic and measure it against the full
    forward pass: per position, per layer, logits, KL, top-1, and a one-line verdict. Try
    `smearcli compare --chunk-sizes 100,60,1,159` or, as a CI gate for a fix,
    `smearcli compare --logic fixed --check`."""
    from ...measure.profile import section, session

    with session(profile) as prof:  # --profile / SMEARCLI_PROFILE=1: the table goes to stderr at the end
        if prof is not None:  # torch and the library, which the run imports anyway: named apart
            with section("imports"):
                from ...measure import compare as _library  # noqa: F401
                from ...render import table as _table  # noqa: F401
        return _compare(spec, json_out, save, check, tolerance, check_scope("compare", check, scope))


def _compare(spec: RunSpec, json_out: bool, save: Optional[Path], check: bool, tolerance: float,
             every: bool = False) -> None:
    from ...util.files import atomic_write, check_output_path
    from ...measure.profile import section
    from ...render.table import console
    from ..impls import implementation, schedules_for
    from ..progress import progress_bar

    if not 0 < tolerance < float("inf"):  # also refuses nan, which would fail every run
        raise UserError(f"--tolerance must be a positive finite number, got {tolerance}")
    impl = implementation(spec, "compare")
    impl.runner_classes()  # imported now: the schedules an implementation brings are known by name below
    if check and spec.leak_limit is None and "packed" in spec.schedule_list():
        raise UserError("--check with --schedules packed gates on a leak limit you give: add --leak-limit "
                        "(a leak across documents is a measurement, not a bug)")
    if save is not None:
        check_output_path(save, (".pt",))
    job = impl.job(spec, schedules_for(spec, impl), tolerance)
    with progress_bar("compare", quiet=spec.quiet, unit="tokens") as bar:
        report = job.run(bar)
    if json_out:  # strict JSON: a non-finite number (an overflowing model) is null, said why
        with section("json"):  # the document is built only when it is printed
            sys.stdout.write(jsonsafe.dumps(report.document(), indent=1) + "\n")
    else:
        with section("table"):
            report.render(console())
    if save is not None:
        with section("save"):
            payload = report.payload()
            if payload is None:
                sys.stderr.write(f"smearcli: nothing was run, so nothing was saved to {save}\n")
            else:
                import torch
                with atomic_write(save, "wb") as f:
                    torch.save(payload, f)
    if check and report.failing(every):
        raise CheckFailed(report.verdict)
    if check and report.failed:  # every finding is one upstream already tracks: listed above, not failed
        sys.stderr.write("smearcli: --check: every finding is known upstream (listed above), so this run does "
                         "not fail; `--check all` fails on it\n")
