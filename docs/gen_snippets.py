"""Run every command whose output the docs show, and write that output into docs/snippets/; draw
the site's figure from the same run; paste the snippets into README.md.

    python docs/gen_snippets.py            # everything: snippets, figure, README blocks
    python docs/gen_snippets.py compare    # only those whose name contains "compare" (the
                                           # figure counts as "compare": it is the same run)

The pages include the files with pymdownx.snippets (`--8<-- "compare.txt"`), so every output on
the site is pasted by this script from a real run, never by hand. Each file starts with the
command line (`$ smearcli ...`); a non-zero exit status is shown as `$ echo $?` and the number.
README.md holds copies between `<!-- snippet: NAME -->` and `<!-- /snippet -->`, refreshed from
docs/snippets/ on every run. docs/figures/smear-error.png is `smearcli plot` with the options of
compare.txt, and docs/figures/{packed,padded,rollback}.png (`boundaries`) are the figures of
docs/guide/boundaries.md, all drawn transparent for the site's light and dark modes; the PNG carries what it
plots as a text chunk (`smearcli.render.figures.read_summary`). tests/docs/test_docs.py runs each
command again and checks the exit status, the output, the figure's numbers and the README.

Outputs depend on the machine only in the last digits of noise-level numbers and of errors, which
tests/docs/test_docs.py compares with a tolerance (`agree`), and, for bench, in the timings. The
committed ones come from a 2-core Intel Xeon CPU, torch 2.13.0, float32.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "snippets"

# (snippet file, command as shown, keep at most this many output lines, or None for all, or
# "json" to shorten long arrays in JSON output, saying so)
SNIPPETS: list[tuple[str, str, int | str | None]] = [
    ("compare.txt", "smearcli compare --chunks 4", None),
    ("compare-chunk-sizes.txt", "smearcli compare --schedules chunked --seq-len 64 --chunk-sizes 24,16,1,23", None),
    ("compare-check-fixed.txt", "smearcli compare --logic fixed --check --seq-len 64", None),
    ("compare-check-old.txt", "smearcli compare --logic old --check --schedules chunked --seq-len 64", None),
    ("compare-json.txt", "smearcli compare --json --logic old --schedules chunked --seq-len 64", "json"),
    ("compare-bad-usage.txt", "smearcli compare --seq-len 320 --chunk-sizes 100,60", None),
    ("plot.txt", "smearcli plot --out smear-error.png", None),
    ("compare-checkpoint.txt", "smearcli compare --checkpoint my-ckpt --schedules chunked --seq-len 64", None),
    ("bench.txt", "smearcli bench --schedules prefill,chunked --seq-len 64 --repeats 5", None),
    ("plot-kind.txt", "smearcli plot --kind heatmap --seq-len 64 --dpi 100 --out heatmap.png", None),
]

# Python run in the scratch directory before a command (the docs show the same code above it).
SETUP = {
    "compare-checkpoint.txt": (
        "from smearcli.gpt import weights\n"
        "lm = weights.random_model(seed=1)\n"
        "weights.save_checkpoint(lm.model, 'my-ckpt', step=100)\n"
    ),
}


def shorten(value, n: int = 4):
    """JSON with every list longer than 2n numbers cut to its first and last n."""
    if isinstance(value, dict):
        return {k: shorten(v, n) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > 2 * n and all(isinstance(v, (int, float)) for v in value):
            return value[:n] + [f"... {len(value) - 2 * n} more ..."] + value[-n:]
        return [shorten(v, n) for v in value]
    return value


def compact_json(value) -> str:
    """Indented JSON, but each list of numbers (or of short lists) kept on one line."""
    out = json.dumps(value, indent=1, ensure_ascii=False)
    # join lines inside innermost lists of scalars
    return re.sub(r"\[\n\s*([^\[\]{}]*?)\n\s*\]",
                  lambda m: "[" + " ".join(x.strip() for x in m.group(1).splitlines()) + "]", out)


def render(cmd: str, stdout: str, stderr: str, rc: int, keep: int | str | None) -> str:
    if keep == "json":
        stdout = compact_json(shorten(json.loads(stdout))) + "\n"
        stderr += "[long arrays shortened by docs/gen_snippets.py]\n"
        keep = None
    lines = (stdout + stderr).rstrip("\n").splitlines()
    lines = [line.rstrip() for line in lines]
    if keep is not None and len(lines) > keep:
        cut = len(lines) - keep
        lines = lines[:keep] + [f"[... {cut} more lines ...]"]
    text = f"$ {cmd}\n" + "\n".join(lines) + "\n"
    if rc != 0:
        text += f"$ echo $?\n{rc}\n"
    return text


def _env() -> dict:
    """This checkout's smearcli (not an installed one), headless, without tracebacks."""
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "MPLBACKEND": "Agg", "SMEARCLI_DEBUG": "0", "PYTHONPATH": path}


def run(cmd: str, setup: str = "") -> tuple[str, str, int]:
    argv = shlex.split(cmd)
    assert argv[0] == "smearcli", cmd
    env = _env()
    with tempfile.TemporaryDirectory() as tmp:  # commands that write files write them here
        if setup:
            subprocess.run([sys.executable, "-c", setup], cwd=tmp, env=env, check=True)
        p = subprocess.run([sys.executable, "-m", "smearcli", *argv[1:]], cwd=tmp, env=env,
                           capture_output=True, text=True)
    return p.stdout, p.stderr, p.returncode


# -- the figure: `smearcli plot` with the options of a snippet's command, drawn transparent --------

FIGURES = HERE / "figures"
# (figure file, the snippet whose run it draws, the plot options: those of that snippet's command)
FIGURE_RUNS: list[tuple[str, str, str]] = [
    ("smear-error.png", "compare.txt", "--chunks 4"),
]
# the figures of docs/guide/boundaries.md: (figure file, the plot options), one per boundary kind
BOUNDARY_FIGURES: list[tuple[str, str]] = [
    ("packed.png", "--schedules packed --documents 100,60,96 --logic both"),
    ("padded.png", "--impl hf --hf-model mamba2 --schedules padded --seq-len 48 --kind error"),
    ("rollback.png", "--schedules rollback --seq-len 64 --kind error"),
]
_PLOT = ("import functools, sys\n"
         "from smearcli.render import figures, packed_figure\n"
         "figures.figure = functools.partial(figures.figure, transparent=True)\n"
         "packed_figure.figure = functools.partial(packed_figure.figure, transparent=True)\n"
         "from smearcli.cli.app import run\n"
         "sys.argv = ['smearcli'] + sys.argv[1:]\n"
         "run()\n")


def plot_command(figure: str) -> str:
    """The command line that draws `figure` (transparency aside)."""
    opts = dict([(name, o) for name, _, o in FIGURE_RUNS] + BOUNDARY_FIGURES)[figure]
    return f"smearcli plot {opts} --out docs/figures/{figure}"


def draw(figure: str) -> None:
    """Run `smearcli plot` exactly as the CLI does, with figures drawn transparent."""
    argv = shlex.split(plot_command(figure))[1:]
    argv[-1] = str(FIGURES / figure)
    p = subprocess.run([sys.executable, "-c", _PLOT, *argv], env=_env(), capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{plot_command(figure)} failed:\n{p.stdout}{p.stderr}")


# -- README.md: copies of snippets between markers ------------------------------------------------

README = HERE.parent / "README.md"
BLOCK = re.compile(r"(?P<open><!-- snippet: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(?P<close>^<!-- /snippet -->)",
                   re.S | re.M)


def readme_block(name: str) -> str:
    """What README.md holds between the markers of snippet `name`: the snippet, fenced."""
    return "```text\n" + (OUT / name).read_text(encoding="utf-8") + "```\n"


def fill_readme(text: str) -> str:
    """`text` with every marker block holding its snippet as it is in docs/snippets/ now."""
    return BLOCK.sub(lambda m: m["open"] + readme_block(m["name"]) + m["close"], text)


def write(name: str, text: str) -> None:
    sys.path.insert(0, str(HERE.parent))
    from smearcli.util.files import atomic_write

    with atomic_write(OUT / name, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    for name, cmd, keep in SNIPPETS:
        if argv and not any(a in name for a in argv):
            continue
        stdout, stderr, rc = run(cmd, SETUP.get(name, ""))
        write(name, render(cmd, stdout, stderr, rc, keep))
        print(f"{name}: exit {rc}, {len((stdout + stderr).splitlines())} lines", file=sys.stderr)
    for figure, snippet in [(f, s) for f, s, _ in FIGURE_RUNS] + [(f, "boundaries") for f, _ in BOUNDARY_FIGURES]:
        if argv and not any(a in figure or a in snippet for a in argv):
            continue
        draw(figure)
        print(f"figures/{figure}: {plot_command(figure)} (transparent)", file=sys.stderr)
    text = README.read_text(encoding="utf-8")
    if fill_readme(text) != text:
        with open(README, "w", encoding="utf-8") as f:
            f.write(fill_readme(text))
        print("README.md: snippet blocks refreshed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
