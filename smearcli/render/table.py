"""Rendering a `Comparison` (or a `testing.CacheCheck`) for people: the title line, a rich table,
the analytic check and the verdict, on a console sized for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich import box
from rich.table import Table

from ..compare import Comparison
from ..names import NOISE_MARGIN
from ..testing import CacheCheck
from ..units import sci


def comparison_table(c: Comparison, title: str = "", share=None, logic: bool = True) -> Table:
    """One row per (schedule, logic). Relative errors and per-position arrays are in --json.

    `c` may also be a `testing.CacheCheck` (the same metrics, layers and runs); `share(m)` then
    gives @starts (default: the embedding's share) and `logic=False` drops the logic column."""
    share_of = share or (lambda m: m.chunk_start_share)
    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in [("schedule", "left")] + [("logic", "left")] * logic + [("steps", "right"),
                          ("max|Δlogit|", "right"), ("×noise", "right"), ("KL max", "right"),
                          ("top-1", "right"), ("@starts", "right"), ("born at", "left"), ("spread", "right"), ("", "left")]:
        t.add_column(name, justify=justify, no_wrap=True)
    for m in c.metrics:
        fd = m.first_departure
        share = share_of(m)
        t.add_row(
            m.schedule, *[m.logic] * logic, str(len(m.steps)), sci(m.max_abs_logits), f"{m.logits_multiple:.2g}",
            sci(m.kl_max), f"{100 * m.top1_agreement:.1f}%",
            "-" if share is None else f"{100 * share:.0f}%",
            "-" if fd is None else f"{c.layers[fd[0]]}@{fd[1]}",
            f"{m.positions_above_noise}/{m.abs_err.size(1)}",
            "[green]ok[/]" if m.passed else "[bold red]BUG[/]",
        )
    return t


def print_comparison(c: Comparison, console: Console, title: str = "") -> None:
    console.print(comparison_table(c, title))
    console.print(f"noise floor (logits): {sci(c.noise.per_layer[-1])} ({c.noise.source}); "
                  f"a run passes within {c.tolerance:g}x. @starts: share of the embedding error on "
                  f"chunk starts; born at: first layer@position above {NOISE_MARGIN:g}x noise; spread: "
                  f"positions whose logits are above {NOISE_MARGIN:g}x noise.")
    print_analytic(c.analytic, console, "old logic, layer 0", "equals gate*x_prev to within")
    style = "bold green" if c.verdict.startswith("OK") else "bold red"
    console.print(f"[{style}]{c.verdict}[/]")


def print_cache_check(check: CacheCheck, console: Console, title: str = "", what_ran: str = "") -> None:
    """A `testing.CacheCheck` the way `print_comparison` prints a Comparison: table, noise floor,
    what ran, verdict."""
    console.print(comparison_table(check, title, share=check.start_share, logic=False))
    console.print(f"noise floor (logits): {sci(check.noise.per_layer[-1])} ({check.noise.source}); "
                  f"a run passes within {check.tolerance:g}x. born at: first layer@position above "
                  f"{NOISE_MARGIN:g}x noise; @starts: share of the error at that layer on chunk starts; "
                  f"spread: positions whose logits are above {NOISE_MARGIN:g}x noise.")
    if what_ran:
        console.print(f"what ran: {what_ran}", highlight=False)
    style = "bold green" if check.passed else "bold red"
    console.print(f"[{style}]{check.verdict}[/]")


def print_analytic(analytic: dict, console: Console, where: str, claim: str) -> None:
    """One line per schedule: the error at its chunk starts against the dropped smear term."""
    for sched, checks in analytic.items():
        worst = max(checks, key=lambda a: a.residual)
        console.print(f"analytic check ({sched}, {where}): the error at each of {len(checks)} chunk "
                      f"starts {claim} {sci(worst.residual)} (e.g. position {checks[0].position}: "
                      f"predicted {checks[0].predicted:.4g}, measured {checks[0].measured:.4g})")


def console(stderr: bool = False) -> Console:
    """A console for tables: the terminal's width, or 120 columns when output is piped."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=120)


def title_line(name: str, model, tokens) -> str:
    """The line above a table: which model, how it ran, on what input."""
    cfg = model.config
    return (f"{name}: d{cfg.n_layer} n_embd {cfg.n_embd}, {str(model.dtype).removeprefix('torch.')} "
            f"on {model.device}, {tokens.size(0)} x {tokens.size(1)} tokens")
