"""`smearcli bench`: what the fixed smear costs, and what each schedule costs, on this machine."""

from __future__ import annotations

import dataclasses
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...util import jsonsafe
from ...util.errors import UserError
from ...util.defaults import REFERENCE
from ..options import RunSpec, shared_options


class Clock(str, Enum):
    wall = "wall"
    cpu = "cpu"


# the two questions bench answers first: what the fix costs, and chunked against one-shot and decode
BENCH_SCHEDULES = "prefill,chunked,decode"


def _schedules_given(ctx: typer.Context) -> bool:
    """Whether the user set --schedules (command line or environment) rather than leaving compare's
    default. Compared by name: typer may bring its own copy of click's ParameterSource."""
    src = ctx.get_parameter_source("schedules")
    return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")


@shared_options
def bench(
    spec: RunSpec,
    ctx: typer.Context,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed rounds per schedule before timing "
                      "(each runs every logic once).")] = 1,
    repeats: Annotated[Optional[int], typer.Option("--repeats", help="Timed rounds per schedule: each "
                       "gives one sample per logic and one fixed/old ratio (default: as many as "
                       "--budget allows, 1 to 20; fewer than 5 pairs and the IQR is not shown).")] = None,
    budget: Annotated[float, typer.Option("--budget", help="Target seconds for the whole bench when "
                      "--repeats is not given: each schedule gets a share for its timed rounds "
                      "(at least 3).")] = 20.0,
    decode_steps: Annotated[Optional[int], typer.Option("--decode-steps", help="decode: time only this "
                            "many one-token steps per run, from the middle of the sequence after an untimed "
                            "prefill, and scale to the whole decode (marked * in the table). Default: the "
                            "whole decode, or a sample when whole decodes would overrun --budget; 0: always "
                            "the whole decode.", show_default=False)] = None,
    micro: Annotated[bool, typer.Option("--micro/--no-micro", help="Also time the two smear "
                     "functions alone on the same inputs.")] = True,
    peak: Annotated[bool, typer.Option("--peak/--no-peak", help="Measure a square-matmul peak on "
                    "the same device and dtype, and report achieved FLOP/s as a share of it.")] = True,
    clock: Annotated[Clock, typer.Option("--clock", help="wall: elapsed time. cpu: the process's CPU "
                     "time, which leaves out time other processes hold the cores (CPU only; use with "
                     "--threads 1 on a shared machine).")] = Clock.wall,
    json_out: Annotated[bool, typer.Option("--json", "--no-json", help="Print the results as JSON "
                        "(schema smearcli.bench/1, raw samples included) instead of the tables.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the JSON "
                      "to this .json file.")] = None,
) -> None:
    """Time each schedule with the old and the fixed smear logic, alternating them: median and
    IQR per cell, tokens/s, FLOPs and share of a measured matmul peak, peak memory, the fixed/old
    ratio per pair, and the smear step alone."""
    if warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {warmup}")
    if repeats is not None and repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    if not 0 < budget < float("inf"):  # also refuses nan
        raise UserError(f"--budget must be a positive finite number of seconds, got {budget}")
    if decode_steps is not None and decode_steps < 0:
        raise UserError(f"--decode-steps must be >= 0, got {decode_steps}")
    if output is not None:
        from ...util.files import check_output_path
        check_output_path(output, (".json",))
    from ..impls import implementation
    implementation(spec, "bench")  # bench times smearcli's own model: the registry says which run it
    if not _schedules_given(ctx):
        spec = dataclasses.replace(spec, schedules=BENCH_SCHEDULES)
    schedules = spec.schedule_list(allow_reference=True)  # bench may time the full forward too
    others = [s for s in schedules if s != REFERENCE] or ["prefill"]

    from ...bench import harness, meters, report
    from ...util.files import atomic_write
    from ...render.table import console
    from ..build import build_setup
    from ..progress import progress_bar

    setup = build_setup(dataclasses.replace(spec, schedules=",".join(others)), schedules=others)
    clock_name = clock.value if isinstance(clock, Clock) else str(clock)
    if clock_name == "cpu" and setup.model.device.type != "cpu":
        raise UserError(f"--clock cpu times CPU work; the model runs on {setup.model.device.type} (use --clock wall)")
    timer = meters.Timer(setup.model.device, clock_name)
    settings = harness.BenchSettings(warmup=warmup, repeats=repeats, budget_s=budget, micro=micro, peak=peak,
                                     decode_sample=decode_steps)
    with progress_bar("bench", quiet=spec.quiet) as bar:
        result = harness.bench(setup.model, setup.tokens, schedules, setup.logics, setup.options, settings,
                               timer=timer, progress=bar.update)
    info = {"name": setup.loaded.name, "source": setup.loaded.source, "step": setup.loaded.step,
            "preset": None if spec.preset is None else spec.preset.value}
    data = report.to_json(result, info)
    if output is not None:
        with atomic_write(output) as f:  # strict JSON: a non-finite number is null, said why
            jsonsafe.dump(data, f, indent=1)
            f.write("\n")
    if json_out:
        sys.stdout.write(jsonsafe.dumps(data, indent=1) + "\n")
        return
    cfg = setup.model.config
    title = (f"{setup.loaded.name}: {cfg.shape} (context {cfg.sequence_len}), "
             f"{str(setup.model.dtype).removeprefix('torch.')} on {setup.model.device}, "
             f"{setup.tokens.size(0)} x {setup.tokens.size(1)} tokens")
    report.render(result, console(), title, footer=setup.threads)
