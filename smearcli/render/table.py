"""Rendering a `Comparison` for people (whichever runners it holds): the title line, a rich
table, what ran, the analytic check and the verdict, on a console sized for the terminal (or
COLUMNS, else 120 columns, when piped).

Tables fit the console: `fitted_table` leaves out the least needed columns, in a stated order,
until the table fits, and says which it left out; prose lines are written whole when piped
(`say`), so grep finds a sentence on one line."""

from __future__ import annotations

import io
import os

from rich.console import Console
from rich import box
from rich.measure import Measurement
from rich.table import Table

from ..measure.compare import Comparison
from ..util.defaults import NOISE_MARGIN
from ..util.formatters import sci, times
from ..judging.verdicts import BUG, UNCONFIRMED

# the comparison's columns; the verdict (last, unnamed) and the error columns are never left out
COLUMNS = [("schedule", "left"), ("logic", "left"), ("steps", "right"), ("max|Δlogit|", "right"),
           ("×noise", "right"), ("KL max", "right"), ("top-1", "right"), ("@starts", "right"),
           ("born at", "left"), ("spread", "right"), ("", "left")]
DROP_ORDER = ("steps", "KL max", "spread", "top-1", "@starts")  # first left out on a narrow console


def fitted_table(columns, rows, width: int, drop=(), wrap=()) -> tuple[Table, list[str]]:
    """A table of `columns` [(name, justify)] and `rows` that fits `width` columns, leaving out
    columns named in `drop`, in that order, only as far as needed. Columns named in `wrap` may
    wrap; no other cell is ever cut. Returns the table and the names left out."""
    probe = Console(width=10_000, file=io.StringIO())  # measures without printing
    left_out: list[str] = []
    for n in range(len(drop) + 1):
        left_out = list(drop[:n])
        keep = [i for i, (name, _) in enumerate(columns) if name not in left_out]
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for i in keep:
            name, justify = columns[i]
            t.add_column(name, justify=justify, no_wrap=name not in wrap,
                         overflow="fold")  # never "1…": a cell too wide folds, it is not cut
        for row in rows:
            t.add_row(*(row[i] for i in keep))
        if Measurement.get(probe, probe.options, t).maximum <= width:
            break
    return t, left_out


def say(console: Console, text: str, **kw) -> None:
    """Print prose: wrapped at words on a terminal, one whole line when piped."""
    console.print(text, soft_wrap=not console.is_terminal, **kw)


def print_table(console: Console, table: Table) -> None:
    """Print a table; piped, without the padding rich leaves at the end of lines."""
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as cap:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))


def left_out_note(left_out: list[str], width: int) -> str:
    return (f"left out to fit {width} columns: {', '.join(left_out)} (a wider terminal or the JSON "
            f"output shows them)" if left_out else "")


def comparison_table(c: Comparison, width: int = 10_000) -> tuple[Table, list[str]]:
    """One row per run, fitted to `width`; the logic column only when several runners ran.
    Relative errors and per-position arrays are in --json. Returns the table and the columns
    left out."""
    logic = len(c.labels) > 1
    columns = COLUMNS if logic else [col for col in COLUMNS if col[0] != "logic"]
    rows = []
    for m in c.metrics:
        born, share = c.born_at(m), c.start_share(m)
        rows.append([
            m.schedule, *[m.logic] * logic, str(len(m.steps)), sci(m.max_abs_logits), times(m.logits_multiple),
            sci(m.kl_max), f"{100 * m.top1_agreement:.1f}%",
            "-" if share is None else f"{100 * share:.0f}%",
            "-" if born is None else f"{born[0]}@{born[1]}",
            f"{m.positions_above_noise}/{m.abs_err.size(1)}",
            status_cell(c.status(m)),
        ])
    return fitted_table(columns, rows, width, DROP_ORDER)


def status_cell(status: str) -> str:
    """A run's word in its colour: ok (green, also for float32 rounding gone in float64), BUG (red),
    unconfirmed (yellow)."""
    from ..measure.compare import run_word

    word = run_word(status)
    colour = "bold red" if word == str(BUG).upper() else "yellow" if word == str(UNCONFIRMED) else "green"
    return f"[{colour}]{word}[/]"


def print_table_of(c: Comparison, console: Console, title: str = "") -> list[str]:
    """The title line and the comparison's table, fitted to the console; the columns left out."""
    if title:
        say(console, title)
    table, left_out = comparison_table(c, console.width)
    print_table(console, table)
    return left_out


LEGEND = (f"born at: first layer@position above {NOISE_MARGIN:g}x noise; @starts: share of the error "
          f"at that layer on chunk starts; spread: positions whose logits are above {NOISE_MARGIN:g}x noise.")


def print_comparison(c: Comparison, console: Console, title: str = "", footer: str = "") -> None:
    """Title, table, noise floor and legend, what ran, the analytic check, the verdict."""
    left_out = print_table_of(c, console, title)
    for r in c.unmeasured:
        say(console, f"[{'bold red' if r in c.crashed else 'yellow'}]{c.outcome_line(r)}[/]", highlight=False)
    say(console, f"noise floor (logits): {sci(c.noise.per_layer[-1])} ({c.noise.source}); "
                 f"a run passes within {c.tolerance:g}x. {LEGEND}")
    notes = list(dict.fromkeys(list(c.notes) + [n for d in c.described for n in d.notes]))
    for line in [left_out_note(left_out, console.width), footer] + [f"what ran: {n}" for n in notes]:
        if line:
            say(console, line, highlight=False)
    print_analytic(c, console, "equals gate*x_prev to within")
    style = "bold green" if c.passed else "bold red"
    say(console, f"[{style}]{c.verdict}[/]")


def print_analytic(c: Comparison, console: Console, claim: str) -> None:
    """One line per schedule: the error at its chunk starts against the dropped smear term."""
    for sched, checks in c.analytic.items():
        worst = max(checks, key=lambda a: a.residual)
        label = c.analytic_labels.get(sched)
        who = f"{c.description(label).series}, " if label else ""
        say(console, f"analytic check ({sched}, {who}{c.layers[0]}): the error at each of {len(checks)} "
                     f"chunk starts {claim} {sci(worst.residual)} (e.g. position {checks[0].position}: "
                     f"predicted {checks[0].predicted:.4g}, measured {checks[0].measured:.4g})")


def piped_width(default: int = 120) -> int:
    """The width for piped output: COLUMNS when set to a number, else `default`."""
    cols = os.environ.get("COLUMNS", "").strip()
    return int(cols) if cols.isdigit() and int(cols) > 0 else default


def console(stderr: bool = False) -> Console:
    """A console for tables: the terminal's width, or COLUMNS (else 120) when output is piped."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=piped_width())


def title_line(c_or_described, tokens=None) -> str:
    """The line above a table: which model, how it ran, on what input ("tiny@500: d4 n_embd 256,
    float32 on cpu, 1 x 256 tokens"), from a Comparison or a runner's Described and the tokens."""
    if isinstance(c_or_described, Comparison):
        d, tokens = c_or_described.description(), c_or_described.tokens
    else:
        d = c_or_described
    shape = f"{d.shape}, " if d.shape else ""
    return f"{d.name}: {shape}{d.dtype} on {d.device}, {tokens.size(0)} x {tokens.size(1)} tokens"
