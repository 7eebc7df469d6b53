"""The documentation site: a strict build, offline pages, the generated CLI reference, and every
command the docs show, run as shown."""

from __future__ import annotations

import html
import json
import math
import os
import re
import shlex
import sys
from html.parser import HTMLParser
from pathlib import Path

from conftest import ROOT  # noqa: E402 - the clone's root
import pytest
from typer.testing import CliRunner

from smearcli import __version__
from smearcli.cli.reference import cli_reference, walk
from smearcli.cli.app import app

DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
NOTEBOOKS = ROOT / "notebooks"

sys.path.insert(0, str(DOCS))
import gen_snippets  # noqa: E402  (docs/gen_snippets.py: the commands whose outputs the docs show)


# -- the strict build -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(built_site) -> Path:
    """`mkdocs build --strict` into a temporary directory (tests/conftest.py); fails on any warning."""
    return built_site


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.text.append(data)


def parse(path: Path) -> _Tags:
    p = _Tags()
    p.feed(path.read_text(encoding="utf-8"))
    return p


REMOTE = re.compile(r"^(https?:)?//", re.I)


@pytest.mark.slow
def test_strict_build_renders_every_page(site):
    for page in ["index.html", "installation.html", "guide/compare.html", "reading-the-numbers.html",
                 "reference/cli.html", "reference/api.html", "changelog.html", "notebooks/index.html"]:
        assert (site / page).is_file(), page
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert (site / "notebooks" / f"{nb.stem}.html").is_file(), nb.name


@pytest.mark.slow
def test_site_loads_nothing_from_the_network(site):
    """No script, stylesheet, font, image or frame from another host: the built site reads
    offline (fonts are the system's; search works from file:// with the local worker shim)."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        for tag, attrs in parse(page).tags:
            url = None
            if tag in ("script", "img", "iframe", "source", "video", "audio", "embed"):
                url = attrs.get("src")
            elif tag == "link" and attrs.get("rel", "").lower() not in ("canonical", "alternate"):
                url = attrs.get("href")
            if url and REMOTE.match(url):
                bad.append(f"{page.relative_to(site)}: <{tag}> {url}")
    for css in sorted(site.rglob("*.css")):
        for url in re.findall(r"(?:@import\s+|url\()\s*['\"]?((?:https?:)?//[^'\")\s]+)", css.read_text(encoding="utf-8")):
            bad.append(f"{css.relative_to(site)}: {url}")
    assert not bad, "\n".join(bad)


def _local_images(site: Path, page: str) -> list[Path]:
    base = (site / page).parent
    out = []
    for tag, attrs in parse(site / page).tags:
        src = attrs.get("src", "") if tag == "img" else ""
        if src and not src.startswith("data:"):
            out.append((base / src.split("#")[0].split("?")[0]).resolve())
    return out


@pytest.mark.slow
def test_pages_show_their_figures(site):
    """Every <img> on every page points at a file that was built; the home page shows the
    figure(s) from docs/figures when there are any."""
    missing = []
    for page in sorted(site.rglob("*.html")):
        rel = str(page.relative_to(site))
        missing += [f"{rel}: {img}" for img in _local_images(site, rel) if not img.is_file()]
    assert not missing, "\n".join(missing)
    figures = sorted((DOCS / "figures").glob("*.png")) + sorted((DOCS / "figures").glob("*.svg"))
    if figures:
        shown = {p.name for p in _local_images(site, "index.html")}
        assert shown & {f.name for f in figures}, f"index.html shows none of {[f.name for f in figures]}"


def _notebook_outputs(nb_path: Path) -> tuple[list[str], int]:
    """(first line of each text output, number of PNG outputs) of a committed notebook."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    texts, pngs = [], 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = "".join(out.get("text", []))
            else:
                data = out.get("data", {})
                pngs += "image/png" in data
                text = "".join(data.get("text/plain", [])) if "image/png" not in data and "text/html" not in data else ""
            line = next((ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 8), "")
            if line:
                texts.append(line)
    return texts, pngs


@pytest.mark.slow
def test_notebook_pages_show_committed_outputs(site):
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        page = site / "notebooks" / f"{nb.stem}.html"
        parsed = parse(page)
        text = html.unescape(" ".join(" ".join(parsed.text).split()))
        texts, pngs = _notebook_outputs(nb)
        for line in texts:
            assert " ".join(line.split()) in text, f"{nb.name}: output {line!r} not on its page"
        inline = sum(1 for tag, a in parsed.tags if tag == "img" and a.get("src", "").startswith("data:image/png"))
        assert inline >= pngs, f"{nb.name}: {pngs} PNG outputs, {inline} on the page"


@pytest.mark.slow
def test_notebook_pages_link_their_notebook_file(site):
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        links = [a.get("href") for tag, a in parse(site / "notebooks" / f"{nb.stem}.html").tags if tag == "a"]
        assert nb.name in links, f"{nb.stem}.html has no link to {nb.name}"
        copy = site / "notebooks" / nb.name
        assert copy.is_file() and copy.read_bytes() == nb.read_bytes(), f"{copy} is not a copy of {nb}"


@pytest.mark.slow
def test_search_indexes_notebook_code_once(site):
    """The copy button's hidden source and its "Copied!" notice stay out of the search index, so
    a notebook's code is found once, not twice."""
    docs = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    text = "\n".join(d["text"] for d in docs)
    assert "Copied!" not in text
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        code = [c for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
        lines = [ln.strip() for c in code for ln in "".join(c["source"]).splitlines() if len(ln.strip()) > 30]
        assert lines, nb.name
        line = html.escape(lines[0], quote=False)
        found = sum(d["text"].count(line) for d in docs if d["location"].startswith(f"notebooks/{nb.stem}.html"))
        assert found == 1, f"{nb.name}: {line!r} is in the search index {found} times"


@pytest.mark.slow
def test_no_repository_widget_and_a_relative_404(site):
    """No page carries Material's repository widget (it asks api.github.com for stars and forks
    on every view), and the 404 page links its styles and scripts relatively, so it is styled
    when opened from file://."""
    for page in sorted(site.rglob("*.html")):
        assert 'data-md-component="source"' not in page.read_text(encoding="utf-8"), page.name
    rooted = [f"<{tag}> {a.get('href') or a.get('src')}" for tag, a in parse(site / "404.html").tags
              if re.match(r"^/(?!/)", a.get("href") or a.get("src") or "")]
    assert not rooted, rooted


@pytest.mark.slow
def test_cli_reference_page_is_built(site):
    text = html.unescape(" ".join(parse(site / "reference" / "cli.html").text))
    for path, cmd, ctx in walk(app):
        assert path in text
        for name in _ref_options(cli_reference(cmd, path)):
            assert name in text, (path, name)


@pytest.mark.slow
def test_api_reference_is_generated_from_docstrings(site):
    from smearcli.measure import compare, inputs

    text = html.unescape(" ".join(" ".join(parse(site / "reference" / "api.html").text).split()))
    for obj in (compare.compare, inputs.random_tokens, compare.Comparison):
        assert f"smearcli.measure.compare.{obj.__name__}" in text or obj.__name__ in text
    # code spans render as <code> elements, which the text extraction separates with blanks
    first = "".join(inputs.random_tokens.__doc__.split()).replace("`", "")
    assert first in "".join(text.split())


# -- the CLI reference against --help ---------------------------------------------------------

runner = CliRunner()


def _help(*args: str) -> str:
    r = runner.invoke(app, [*args, "--help"], prog_name="smearcli", env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    return r.output


def _help_panels(text: str) -> dict[str, list[str]]:
    """{panel title: [first column of each row]} from rich's boxed help."""
    panels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\s*╭─ (.+?) ─", line)
        if m:
            current = panels.setdefault(m.group(1), [])
            continue
        if line.lstrip().startswith("╰"):
            current = None
            continue
        if current is not None and line.lstrip().startswith("│"):
            body = line.lstrip()[1:].rstrip().rstrip("│")
            indent = len(body) - len(body.lstrip())
            if body.strip() and indent <= 4:  # a new row (continuations are indented further)
                current.append(body.strip())
    return panels


def _help_options(text: str) -> set[str]:
    names = set()
    for title, rows in _help_panels(text).items():
        if title == "Commands":
            continue
        for row in rows:
            for token in row.lstrip("* ").split():
                if not token.startswith("-"):
                    break
                names.update(t for t in token.split(",") if t)
    return names


def _help_commands(text: str) -> set[str]:
    return {row.split()[0] for row in _help_panels(text).get("Commands", [])}


def _ref_options(markdown: str) -> set[str]:
    """Flags in the first column of the reference's option tables."""
    names = set()
    for cell in re.findall(r"^\| <code>(.*?)</code> \|", markdown, re.M):
        for token in html.unescape(cell).replace(",", " ").split():
            if token.startswith("-"):
                names.add(token)
    return names


def _ref_section(markdown: str, path: str) -> str:
    m = re.search(rf"^#+ `{re.escape(path)}`.*?$(.*?)(?=^#+ `|\Z)", markdown, re.M | re.S)
    assert m, f"no section for {path}"
    return m.group(1)


def test_cli_reference_lists_every_command_and_option_that_help_shows():
    ref = cli_reference(app)
    commands = _help_commands(_help())
    assert commands, "could not read the commands from smearcli --help"
    for name in commands:
        assert f"`smearcli {name}`" in ref, f"command {name} missing from the reference"
    for path in ["smearcli"] + [f"smearcli {c}" for c in sorted(commands)]:
        shown = _help_options(_help(*path.split()[1:]))
        documented = _ref_options(_ref_section(ref, path))
        assert shown, f"could not read the options of {path} --help"
        assert shown == documented, (path, sorted(shown - documented), sorted(documented - shown))


def test_cli_reference_changes_when_an_option_changes():
    """Generated from the app, not copied: a renamed option or new help shows up at once."""
    import typer

    def build(flag: str, help_: str):
        toy = typer.Typer()

        @toy.command()
        def first(width: int = typer.Option(3, flag, help=help_)) -> None:
            """Do the first thing."""

        @toy.command()
        def second() -> None:
            """Do the second thing."""

        return toy

    before = cli_reference(build("--width", "How wide."), "toy")
    after = cli_reference(build("--breadth", "How broad, in cells."), "toy")
    assert "--width" in before and "How wide." in before and "[default: 3]" in before
    assert "--width" not in after and "--breadth" in after and "How broad, in cells." in after
    assert "`toy first`" in before and "`toy second`" in before and "Do the second thing." in before


def test_cli_reference_escapes_markdown():
    import typer

    toy = typer.Typer()

    @toy.command()
    def only(x: str = typer.Option("a|b", "--x", help="Pipes | and <tags> stay text.")) -> None:
        """One | command."""

    ref = cli_reference(toy, "toy")
    row = next(line for line in ref.splitlines() if line.startswith("| <code>--x"))
    assert row.count("|") == 3  # two cells: no stray pipe from the help or the default
    assert "&lt;tags&gt;" in row and "&#124;" in row


# -- every command the docs show, run as shown -------------------------------------------------

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(?P<reason>[^>]*?)\s*-->\s*$")
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$', re.M)


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if SNIPPETS not in p.parents)


def _expand(body: str) -> str:
    return INCLUDE.sub(lambda m: (SNIPPETS / m.group(1)).read_text(encoding="utf-8"), body)


def _commands_in(body: str) -> list[tuple[str, int]]:
    """(smearcli command line, expected exit status) for each command in a code block: lines
    `smearcli ...` or `$ smearcli ...`, also after `&&`; a `$ echo $?` line and its number after
    a command give its exit status (0 otherwise)."""
    lines = body.splitlines()
    prompted = any(line.strip().startswith("$ ") for line in lines)  # then other lines are output
    out: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:].strip()
            if line == "echo $?" and out and i + 1 < len(lines):
                out[-1] = (out[-1][0], int(lines[i + 1].strip()))
                continue
        elif prompted:
            continue
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("smearcli ") or part == "smearcli":
                out.append((part, 0))
    return out


INLINE = re.compile(r"`(smearcli [^`]*)`")


def help_examples() -> list[tuple[str, str, int]]:
    """Every `smearcli ...` example (in backticks) in a command's or an option's --help text."""
    found = []
    for path, cmd, _ in walk(app):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        found += [("sh", m, 0) for text in texts for m in INLINE.findall(" ".join(text.split()))]
    return found


def doc_examples() -> list[tuple[str, list[tuple[str, str, int]]]]:
    """Per page (the docs, README.md, then the --help texts), in order: ("sh", command, exit
    status) and ("python", code, 0) examples. README.md's inline `smearcli ...` spans count too."""
    pages = []
    for page in [*doc_pages(), ROOT / "README.md"]:
        md = page.read_text(encoding="utf-8")
        items = []
        for m in FENCE.finditer(md):
            before = md[:m.start()].rstrip().splitlines()[-1:] or [""]
            if SKIP.search(before[0]):
                continue
            lang, body = m.group("lang").lower(), _expand(m.group("body"))
            if lang in ("python", "py"):
                items.append(("python", body, 0))
            else:
                items += [("sh", cmd, rc) for cmd, rc in _commands_in(body)]
        if page.name == "README.md":
            prose = "\n".join(line for line in md.splitlines() if not line.startswith("#"))  # not headings
            items += [("sh", cmd, 0) for cmd in INLINE.findall(prose) if "..." not in cmd]
        if items:
            pages.append((str(page.relative_to(ROOT if page.name == "README.md" else DOCS)), items))
    return pages + [("--help", help_examples())]


def test_docs_examples_are_found():
    found = {page: items for page, items in doc_examples()}
    assert any(cmd == "smearcli compare --chunks 4" for _, cmd, _ in found["index.md"])
    assert any(kind == "python" for kind, _, _ in found["guide/compare.md"])
    assert ("sh", "smearcli compare --logic fixed --check", 0) in found["README.md"]  # inline, too
    assert any("--chunk-sizes" in cmd for _, cmd, _ in found["--help"])
    # every snippet file the pages include is one gen_snippets writes, with its command on top
    listed = {name: cmd for name, cmd, _ in gen_snippets.SNIPPETS}
    for page in doc_pages():
        for name in INCLUDE.findall(page.read_text(encoding="utf-8")):
            assert name in listed, f"{page.name} includes {name}, which docs/gen_snippets.py does not write"
            first = (SNIPPETS / name).read_text(encoding="utf-8").splitlines()[0]
            assert first == f"$ {listed[name]}", (name, first)


def test_commands_are_read_from_code_blocks():
    block = ("$ smearcli compare --check\nsmearcli bench: a note in the output\nsmearcli: error: x\n"
             "$ echo $?\n1\n")
    assert _commands_in(block) == [("smearcli compare --check", 1)]
    assert _commands_in("pip install -e . && smearcli compare --chunks 4  # first\nsmearcli --version\n") == [
        ("smearcli compare --chunks 4  # first", 0), ("smearcli --version", 0)]


def test_skip_marker_needs_a_reason():
    for page in doc_pages():
        for m in re.finditer(r"<!--\s*docs-test:\s*skip\b([^>]*)-->", page.read_text(encoding="utf-8")):
            assert m.group(1).strip(), f"{page.name}: docs-test skip without a reason"


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory):
    """Every example in the docs run once, in order (in-process, in a scratch directory shared by
    all pages, so a python example can read a file a command wrote): (failures, {command: click
    Result}). Shared by the exit-status test and the snippet drift tests below."""
    import torch

    scratch = tmp_path_factory.mktemp("doc-examples")
    cwd, env = os.getcwd(), os.environ.get("MPLBACKEND")
    os.chdir(scratch)
    os.environ["MPLBACKEND"] = "Agg"
    (scratch / "docs" / "figures").mkdir(parents=True)  # README.md's commands run from a clone's root
    # one thread: on a busy shared machine torch's worker threads wait on each other and these
    # runs take several times longer; no exit status depends on the thread count
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        failures, results = _run_examples()
    finally:
        torch.set_num_threads(threads)
        os.chdir(cwd)
        if env is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env
    return failures, results


@pytest.mark.slow
def test_docs_examples_run_as_shown(doc_runs):
    """Each `smearcli ...` line in a code block runs and exits as the docs show; each python block
    runs. A command shown on several pages runs once."""
    failures, results = doc_runs
    assert results, "no commands found in the docs"
    assert not failures, "\n".join(failures)


def _run_examples() -> tuple[list[str], dict]:
    failures, done, results = [], set(), {}
    for page, items in doc_examples():
        for kind, what, rc in items:
            if kind == "python":
                try:
                    exec(compile(what, f"<{page}>", "exec"), {"__name__": "__docs__"})
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{page}: python example failed ({type(e).__name__}: {e}):\n{what}")
                continue
            key = (tuple(shlex.split(what, comments=True)), rc)  # the same command, comments aside
            if key in done:
                continue
            done.add(key)
            r = runner.invoke(app, shlex.split(what, comments=True)[1:], prog_name="smearcli")
            results[what] = r
            if r.exit_code != rc:
                failures.append(f"{page}: {what}: exit {r.exit_code}, the docs show {rc}\n{r.output[-2000:]}")
    return failures, results


# -- the snippets, the figure and README.md against what the tool prints today ----------------
#
# docs/gen_snippets.py wrote every output the pages and README.md show, and the figure. These
# tests rerun the same commands (the runs above, shared) and fail when the committed text drifts
# from what the tool prints now. Machine-dependent parts are left out of the comparison, and
# only those: numbers at rounding level (the noise floor, the errors of correct runs, their
# multiples of the floor), which differ between CPUs and thread counts, and bench's timings.

# a table row: schedule, the logic (only when several runners ran), steps, then the numbers
_TABLE_ROW = re.compile(r"^(?P<head>\s*\w+\s+(?:(?:old|fixed|bosmask|yours)\s+)?\d+\s+)(?P<err>\S+)(?P<s1>\s+)(?P<noise>\S+)"
                        r"(?P<s2>\s+)(?P<kl>\S+)(?P<rest>.*?)(?P<verdict>ok|BUG)\s*$")


def deterministic(name: str, text: str) -> str:
    """The parts of snippet `name` that do not depend on the machine, whitespace collapsed (a
    table's column widths follow its numbers)."""
    lines = text.splitlines()
    if name.startswith("bench"):  # the command, the model line, and what each row ran
        keep = lines[:2] + [" ".join(ln.split()[:3]) for ln in lines
                            if re.match(r"^\s*\w+\s+(old|fixed)\s+\d+\s", ln)]
        return "\n".join(keep)
    out = []
    for ln in lines:
        if ln.startswith("threads: "):  # the thread rule's footer names this machine's load
            continue
        ln = re.sub(r"threads: \d+ \([^()]*\)", "threads: N", ln)  # plot's "wrote" line says it too
        m = _TABLE_ROW.match(ln)
        if m:  # ×noise always; error and KL of a run that passes: rounding noise
            ok = m["verdict"] == "ok"
            ln = (m["head"] + ("~" if ok else m["err"]) + " N " + ("~" if ok else m["kl"])
                  + m["rest"] + m["verdict"])
        out.append(ln)
    text = "\n".join(out)
    text = re.sub(r"─+", "─", text)  # a table's rule is as wide as its columns, which follow the numbers
    # power: the smallest share of a state's effect the check would see is the threshold (a multiple of
    # the floor) over that effect, so it follows the floor: 0.011% on one machine is 9.7e-03% on another
    text = re.sub(r"[0-9.]+(e[+-]?[0-9]+)?% error in", "N% error in", text)
    text = re.sub(r'("(threshold|detectable_fraction)": )(\{[^}]*\}|[^,\n{]+)', r"\1N", text)
    text = re.sub(r"\(?[0-9.]+(e[+-]?[0-9]+)?x noise\)?", "(Nx noise)", text)
    text = re.sub(r'("\w*noise\w*": )(\[[^\]]*\]|[^,\n{]+)', r"\1N", text)  # JSON: noise and its multiples
    text = re.sub(r"(?<![\w.])-?\d+(\.\d+)?e-\d+|(?<![\w.])0\.0(?![\d.])", "~", text)  # rounding-level numbers
    return " ".join(text.split())


_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[+-]?\d+)?")
LAST_DIGITS = 5e-5  # relative: a float32 number's last digits, which follow the CPU's kernels
ROUNDING = 1e-5  # absolute: a difference of float32 logits (scale ~10, one ulp ~1e-6) rounds this much


def agree(name: str, a: str, b: str) -> bool:
    """Two outputs of snippet `name` agree: the same `deterministic` text, its decimals equal up to
    their last digits (an error of 0.047757 on one CPU is 0.047756 on another: float32 kernels
    round differently; a change at the fifth significant digit is not rounding)."""
    da, db = deterministic(name, a), deterministic(name, b)
    na, nb = [float(m.group()) for m in _DECIMAL.finditer(da)], [float(m.group()) for m in _DECIMAL.finditer(db)]
    return (_DECIMAL.sub("#", da) == _DECIMAL.sub("#", db) and len(na) == len(nb)
            and all(math.isclose(x, y, rel_tol=LAST_DIGITS, abs_tol=ROUNDING) for x, y in zip(na, nb)))


def test_snippets_agree_up_to_the_last_digits_of_a_cpus_rounding():
    # two CPUs' runs of the same command (compare-json.txt, this repository's CI and its author's)
    one = '"kl_mean": 0.00336424, "abs_logits": [0.0, 0.047757, 0.00213329], "max_abs_logits": 1.2179,'
    two = '"kl_mean": 0.00336423, "abs_logits": [0.0, 0.047756, 0.00213318], "max_abs_logits": 1.2179,'
    assert agree("x", one, two) and deterministic("x", one) != deterministic("x", two)
    assert not agree("x", one, one.replace("1.2179", "1.2178"))  # the bug's size moved: not rounding
    assert not agree("x", one, one.replace("0.047757", "0.048757"))
    assert not agree("x", one, one.replace('"max_abs_logits"', '"max_rel_logits"'))


def test_deterministic_keeps_the_bug_and_drops_the_noise():
    one = "OK: ...; it would see a 3.3e-03% error in the kv state, a 0.011% error in the recurrent state"
    two = "OK: ...; it would see a 3.0e-03% error in the kv state, a 9.7e-03% error in the recurrent state"
    assert deterministic("x", one) == deterministic("x", two)
    assert deterministic("x", one) != deterministic("x", one.replace("recurrent", "conv"))
    # one runner's table has no logic column: its noise multiples are masked all the same
    assert deterministic("x", " chunked    4   1.9e-06   0.22   4.7e-13   100.0%   -   -   0/64   ok") == \
        deterministic("x", " chunked    4   1.9e-06   0.25   4.7e-13   100.0%   -   -   0/64   ok")
    row_ok = " chunked       fixed       4       8.6e-06      0.56   1.7e-12   100.0%        0%   -           0/256   ok"
    row_ok2 = " chunked    fixed       4       4.8e-06      0.31   9.9e-13   100.0%        0%   -      0/256   ok"
    assert deterministic("x", row_ok) == deterministic("x", row_ok2)
    row_bug = " chunked       old         4       5.8e+00   3.8e+05   2.0e+00    98.4%      100%   emb@64    192/256   BUG"
    for changed in ("5.9e+00", "2.1e+00", "98.0%", "emb@65", "191/256"):
        bad = row_bug.replace({"5.9e+00": "5.8e+00", "2.1e+00": "2.0e+00", "98.0%": "98.4%",
                               "emb@65": "emb@64", "191/256": "192/256"}[changed], changed)
        assert deterministic("x", bad) != deterministic("x", row_bug), changed
    assert deterministic("x", row_bug) == deterministic("x", row_bug.replace("3.8e+05", "4.1e+05"))
    assert deterministic("x", "max |dlogit| 5.79 (3.8e+05x noise) at") == deterministic("x", "max |dlogit| 5.79 (2e5x noise) at")
    assert deterministic("x", '"max_abs_logits": 1.2179,') != deterministic("x", '"max_abs_logits": 1.2178,')
    # a ×noise of 2.6e+05 on one machine is 2e+05 on another (its floor follows the thread count):
    # the column, and the rule under the header, one character narrower
    assert deterministic("x", "\n".join([" schedule", " " + "─" * 104, row_bug])) == \
        deterministic("x", "\n".join([" schedule", " " + "─" * 103, row_bug.replace("3.8e+05", "4e+05")]))


@pytest.mark.slow
def test_snippets_match_a_fresh_run(doc_runs):
    """Each docs/snippets/ file equals what its command prints now, as gen_snippets renders it
    (up to the machine-dependent numbers, see `deterministic`)."""
    _, results = doc_runs
    drifted = []
    for name, cmd, keep in gen_snippets.SNIPPETS:
        assert cmd in results, f"{name}: `{cmd}` is shown on no page, so it was not run"
        r = results[cmd]
        fresh = gen_snippets.render(cmd, r.stdout, r.stderr, r.exit_code, keep)
        committed = (SNIPPETS / name).read_text(encoding="utf-8")
        if not agree(name, fresh, committed):
            drifted.append(f"{name}:\n--- committed\n{committed[:3000]}\n--- now\n{fresh[:3000]}")
    assert not drifted, "snippets differ from a fresh run; run python docs/gen_snippets.py:\n" + "\n".join(drifted)


def _figure_summary(figure: str) -> dict:
    from smearcli.render.figures import read_summary

    summary = read_summary(DOCS / "figures" / figure)
    assert summary, f"docs/figures/{figure} carries no smearcli summary; run python docs/gen_snippets.py"
    return summary


@pytest.mark.parametrize("figure,snippet,opts", gen_snippets.FIGURE_RUNS)
def test_figure_is_the_run_of_its_snippet(figure, snippet, opts):
    """The committed figure draws the run its snippet shows: same model, tokens, chunking, noise
    floor and error (to the digits the snippet prints)."""
    s = _figure_summary(figure)
    text = (SNIPPETS / snippet).read_text(encoding="utf-8")
    cmd = text.splitlines()[0][2:]
    assert f"smearcli plot {opts} " in gen_snippets.plot_command(figure)
    assert shlex.split(cmd)[2:] == shlex.split(opts), (cmd, opts)  # compare <opts>: the same options
    model, shape = re.match(r"^(\S+): d(\d+) n_embd (\d+), (\w+) on (\w+), (\d+ x \d+) tokens", text.splitlines()[1]).group(1, 0)
    assert s["title"].startswith(f"{model} ("), (s["title"], model)
    assert re.search(r"(\d+ x \d+) tokens", s["title"]).group(1) in shape
    floor = re.search(r"noise floor \(logits\): (\S+)", text).group(1)
    assert f"{s['noise_logits']:.1e}" == floor
    row = next(ln.split() for ln in text.splitlines() if re.match(rf"^\s*{s['schedule']}\s+old\s", ln))
    assert f"{s['max_abs_logits']['old']:.1e}" == row[3], row
    assert int(row[2]) == len(s["steps"])
    starts = re.search(r"chunk starts of \w+: ([\d, ]+)", " ".join(text.split())).group(1)
    assert [int(x) for x in starts.split(",")] == s["chunk_starts"]


@pytest.mark.slow
@pytest.mark.parametrize("figure,snippet,opts", gen_snippets.FIGURE_RUNS)
def test_figure_matches_a_fresh_compare_json(figure, snippet, opts):
    """The figure's title (model name), chunking, error and noise floor against `compare --json`
    with the same options, run now. The old logic's error is the bug (not noise): it must agree
    to 1e-4; the fixed logic's is noise: both must pass; the floor itself differs between CPUs
    in its last digits, so it must agree within a factor of 2."""
    import torch

    s = _figure_summary(figure)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = runner.invoke(app, ["compare", *shlex.split(opts), "--json"], prog_name="smearcli")
    finally:
        torch.set_num_threads(threads)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    m = j["model"]
    assert s["title"].startswith(f"{m['name']} (d{m['config']['n_layer']} n_embd {m['config']['n_embd']}), "
                                  f"{m['dtype']} on {m['device']}, {j['input']['batch']} x {j['input']['seq_len']} tokens"), s["title"]
    runs = {x["logic"]: x for x in j["runs"] if x["schedule"] == s["schedule"]}
    assert runs["old"]["steps"] == s["steps"] and runs["old"]["chunk_starts"] == s["chunk_starts"]
    floor = j["noise_floor"]["per_layer"][-1]
    assert 0.5 <= s["noise_logits"] / floor <= 2, (s["noise_logits"], floor)
    assert s["max_abs_logits"]["old"] == pytest.approx(runs["old"]["max_abs_logits"], rel=1e-4)
    assert runs["fixed"]["passed"] and s["max_abs_logits"]["fixed"] <= s["tolerance"] * s["noise_logits"]
    assert s["tolerance"] == j["tolerance"]


@pytest.mark.parametrize("figure,opts", gen_snippets.BOUNDARY_FIGURES)
def test_boundaries_page_shows_each_boundary_figure(figure, opts):
    """docs/guide/boundaries.md shows each boundary's committed figure with the command that drew
    it, and the PNG carries the numbers it draws."""
    from smearcli.render.figures import read_summary

    page = (DOCS / "guide" / "boundaries.md").read_text(encoding="utf-8")
    assert f"](../figures/{figure})" in page
    assert gen_snippets.plot_command(figure) in page
    assert read_summary(DOCS / "figures" / figure), f"docs/figures/{figure} carries no summary; run python docs/gen_snippets.py boundaries"


@pytest.mark.slow
def test_packed_figure_matches_a_fresh_packed_json():
    """The committed packed figure's leaks are those `compare --json` measures now: the leaks
    themselves (far above the floor) to 1e-4, the masked smear part of bosmask under 10x noise."""
    from smearcli.render.figures import read_summary

    opts = dict(gen_snippets.BOUNDARY_FIGURES)["packed.png"]
    s = read_summary(DOCS / "figures" / "packed.png")
    r = runner.invoke(app, ["compare", *shlex.split(opts), "--json"], prog_name="smearcli")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert s["document_starts"] == [d["start"] for d in j["logics"][0]["documents"][1:]]
    for lg in j["logics"]:
        drawn = s["parts"][lg["logic"]]
        for d in lg["documents"][1:]:
            assert drawn[str(d["index"])]["first"] == pytest.approx(d["first"], rel=1e-4)
            assert drawn[str(d["index"])]["attention_first"] == pytest.approx(d["attention_first"], rel=1e-4)
    bos = next(lg for lg in j["logics"] if lg["logic"] == "bosmask")
    assert all(v["masked_first"] < 10 * bos["noise_floor_logits"] for v in s["parts"]["bosmask"].values())


def test_readme_snippet_blocks_are_the_snippets():
    """README.md's copies of command output (between `<!-- snippet: NAME -->` markers) are the
    committed snippets, byte for byte; python docs/gen_snippets.py refreshes them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = {m["name"]: m["body"] for m in gen_snippets.BLOCK.finditer(readme)}
    assert "compare.txt" in blocks, "README.md has no <!-- snippet: compare.txt --> block"
    for name, body in blocks.items():
        assert body == gen_snippets.readme_block(name), f"README.md's {name} block differs from docs/snippets/{name}"
    assert gen_snippets.fill_readme(readme) == readme
    assert gen_snippets.plot_command("smear-error.png") in readme  # how the README's figure is made


def test_notebook_math_becomes_mathml_outside_code():
    hooks = pytest.importorskip("hooks")  # docs/hooks.py
    out = hooks.math_to_mathml('<p>With $x_t$ and</p><p>$$g_t\\,x_{t-1}$$</p>'
                               '<p>it costs $5 or $6.</p><pre>$a$</pre><code>$b$</code>')
    assert out.count("<math") == 2 and 'display="block"' in out and 'display="inline"' in out
    assert "$x_t$" not in out and "$$" not in out
    assert "it costs $5 or $6." in out and "<pre>$a$</pre>" in out and "<code>$b$</code>" in out


# -- small facts ------------------------------------------------------------------------------

def test_changelog_has_this_version():
    assert re.search(rf"^## {re.escape(__version__)}\b", (DOCS / "changelog.md").read_text(), re.M)


def test_test_extra_installs_the_doc_tools():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower() for req in extra}
    for pkg in ("mkdocs", "mkdocs-material", "mkdocs-jupyter", "mkdocstrings", "latex2mathml"):
        assert pkg in names, pkg
