"""What a bench result says: its JSON document (schema `smearcli.bench/1`) and its console table."""

from __future__ import annotations

from typing import Optional

from ..util.formatters import duration, nbytes
from ..measure.jsondoc import header, options_json
from .harness import IQR_MIN_PAIRS, BenchResult, Ratio
from .stats import Summary


def nbytes_or_dash(n: Optional[int]) -> str:
    return "-" if n is None else nbytes(n)


def to_json(result: BenchResult, model_info: Optional[dict] = None) -> dict:
    """Everything, raw samples included (schema smearcli.bench/1). Times are in seconds."""
    s = result.settings
    return header(
        "bench", {**(model_info or {}), "config": result.config},
        input={"batch": result.batch, "seq_len": result.seq_len},
        environment=result.env,
        settings={"warmup": s.warmup, "repeats": s.repeats, "budget_s": s.budget_s,
                  "min_repeats": s.min_repeats, "max_repeats": s.max_repeats,
                  "micro_repeats": s.micro_repeats, "micro_inner": s.micro_inner,
                  "order": "alternating, logics in this order every round",
                  "logics": list(dict.fromkeys(c.logic for c in result.cells)),
                  "schedule_options": options_json(result.options)},
        peak=None if result.peak is None else {
            "size": result.peak.size, "dtype": result.peak.dtype, "flops": result.peak.flops,
            "samples_s": result.peak.samples, "flops_per_s": result.peak.flops_per_s,
            "warmup": result.peak.warmup, "method": result.peak.method + " (the fastest sample)"},
        memory_kind=result.memory_kind,
        cells=[{
            "schedule": c.schedule, "logic": c.logic, "steps": c.steps, "tokens": c.tokens,
            "flops": c.flops, "samples_s": c.samples, "summary_s": c.summary.to_json(),
            "tokens_per_s": c.tokens_per_s, "flops_per_s": c.flops_per_s,
            "peak_fraction": result.peak_fraction(c), "peak_mem_bytes": c.peak_mem,
            "sampled": None if c.sampled is None else {
                "timed_steps": c.sampled.steps, "from_position": c.sampled.start, "of_steps": c.sampled.total,
                "method": "time these one-token steps after an untimed prefill, scale by of_steps / timed_steps"},
        } for c in result.cells],
        ratios=[{"schedule": r.name, "of": "fixed/old", "pairs": r.ratios, "summary": r.summary.to_json()}
                for r in result.ratios],
        smear_micro=[{
            "case": m.name, "shape": list(m.shape), "cached": m.cached, "with_prev": m.with_prev,
            "calls_per_sample": m.inner,
            "samples_s": m.samples, "summary_s": {lg: Summary.of(v).to_json() for lg, v in m.samples.items()},
            "ratio": None if m.ratio is None else {"of": "fixed/old", "pairs": m.ratio.ratios,
                                                   "summary": m.ratio.summary.to_json()},
        } for m in result.micro],
        wall_s=result.wall_s,
    )


def _ratio(r: Ratio) -> tuple[str, str]:
    s = r.summary
    return f"{s.median:.3f}", f"{s.q1:.3f}-{s.q3:.3f}"


def render(result: BenchResult, console, title: str = "", footer: str = "") -> None:
    """Print the tables: per cell, per fixed/old pair, the smear micro-benchmark, the environment.
    Each table fits the console: the least needed columns are left out first, never a ratio."""
    from ..render.table import say

    if title:
        say(console, title)
    left_out = render_cells(result, console)
    left_out += render_ratios(result, console)
    render_footer(result, console, footer, left_out)


def render_cells(result: BenchResult, console) -> list[str]:
    """The table of cells (one per schedule and logic), with what sampling and few pairs mean;
    returns the columns it left out."""
    from ..render.table import fitted_table, print_table, say

    cols = [("schedule", "left"), ("logic", "left"), ("steps", "right"), ("median", "right"),
            ("IQR", "right"), ("tok/s", "right"), ("GFLOP", "right"), ("GFLOP/s", "right")]
    if result.peak is not None:
        cols.append(("% peak", "right"))
    cols.append(("peak mem", "right"))
    rows = []
    for c in result.cells:
        s = c.summary
        iqr = duration(s.iqr) if s.n >= IQR_MIN_PAIRS else "-"
        row = [c.schedule + ("*" if c.sampled else ""), c.logic, str(c.steps), duration(s.median), iqr,
               f"{c.tokens_per_s:,.0f}",
               f"{c.flops / 1e9:.3g}", f"{c.flops_per_s / 1e9:.3g}"]
        if result.peak is not None:
            row.append(f"{100 * result.peak_fraction(c):.1f}%")
        row.append(nbytes_or_dash(c.peak_mem))
        rows.append(row)
    t, left_out = fitted_table(cols, rows, console.width, ("GFLOP", "steps", "IQR", "GFLOP/s", "peak mem"))
    print_table(console, t)
    sampled = {c.schedule: c.sampled for c in result.cells if c.sampled is not None}
    for name, smp in sampled.items():
        say(console, f"{name}*: sampled: {smp.steps} of its {smp.total} one-token steps timed per run "
                     f"(from position {smp.start}, after an untimed prefill), times scaled by "
                     f"{smp.total}/{smp.steps} to the whole decode")
    few = sorted({len(c.samples) for c in result.cells if len(c.samples) < IQR_MIN_PAIRS})
    if few:
        say(console, f"IQR not shown: only {', '.join(map(str, few))} pair(s) per cell within the budget "
                     f"(needs {IQR_MIN_PAIRS}; a larger budget or more repeats gives one)")
    return list(left_out)


def render_ratios(result: BenchResult, console) -> list[str]:
    """fixed/old per alternated pair, the whole forwards' and the smear's alone (or, with one
    logic, the smear's time per call); returns the columns it left out."""
    from ..render.table import fitted_table, print_table, say

    if not (result.ratios or any(m.ratio for m in result.micro)):
        for m in result.micro:
            for lg, v in m.samples.items():
                say(console, f"smear alone, {m.name} {m.shape}, {lg}: {duration(Summary.of(v).median)} per call")
        return []
    rows = []
    for r in result.ratios:
        s = r.summary
        q = _ratio(r) if s.n >= IQR_MIN_PAIRS else (_ratio(r)[0], "-")
        rows.append([r.name, *q, f"{s.min:.3f}-{s.max:.3f}", str(s.n),
                     duration(result.cell(r.name, "old").summary.median),
                     duration(result.cell(r.name, "fixed").summary.median)])
    for m in result.micro:
        if m.ratio is None:
            continue
        s = m.ratio.summary
        B, T, C = m.shape
        rows.append([f"smear alone, {m.name} ({B}x{T}x{C})", *_ratio(m.ratio), f"{s.min:.3f}-{s.max:.3f}",
                     str(s.n), duration(Summary.of(m.samples["old"]).median),
                     duration(Summary.of(m.samples["fixed"]).median)])
    say(console, "fixed / old time, per alternated pair")
    rt, left_out = fitted_table([("what", "left"), ("median", "right"), ("IQR (q1-q3)", "right"),
                                 ("min-max", "right"), ("pairs", "right"), ("old median", "right"),
                                 ("fixed median", "right")], rows, console.width,
                                ("min-max", "old median", "fixed median", "pairs"), wrap=("what",))
    print_table(console, rt)
    return list(left_out)


def render_footer(result: BenchResult, console, footer: str, left_out: list[str]) -> None:
    """Where and how it ran, what the table left out, how the peak and memory were taken."""
    from ..render.table import left_out_note, say

    env = result.env
    where = env.get("device_name", env["device"])
    rounds = ", ".join(f"{r.name} {len(r.ratios)}" for r in result.ratios) or ", ".join(
        f"{c.schedule} {len(c.samples)}" for c in result.cells)
    line = (f"{env['device']} ({where}), {env['threads']} threads, torch {env['torch']}, {env['dtype']}, "
            f"{env.get('clock', 'wall')} clock; "
            f"{result.settings.warmup} warm-up round(s), then timed rounds ({rounds})"
            + (", logics alternating" if len({c.logic for c in result.cells}) > 1 else ""))
    if "loadavg" in env:
        line += f"; load average {env['loadavg'][0]:g} at the start"
    say(console, line)
    for extra in (footer, left_out_note(list(dict.fromkeys(left_out)), console.width)):
        if extra:
            say(console, extra)
    if result.peak is not None:
        p = result.peak
        say(console, f"matmul peak: {p.flops_per_s / 1e9:.4g} GFLOP/s ({p.method}); % peak = achieved "
                     "FLOP/s of the median run / that peak")
    say(console, f"peak mem: {result.memory_kind}, on one untimed run per cell (an extra run after the timed "
                 "ones, or the warm-up run when the budget left no room; sampled decode: the run that filled "
                 f"its cache). Total {result.wall_s:.1f} s.")
