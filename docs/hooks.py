"""mkdocs hooks for the smearcli site (listed under `hooks:` in mkdocs.yml).

- reference/cli.md is generated at build time from the Typer app (`smearcli.cli.reference.page`), so it
  changes whenever a command or option does; it is never a file on disk.
- Every notebooks/*.ipynb at the repository root becomes a page under notebooks/ (rendered by
  mkdocs-jupyter from its committed outputs, never executed) and is added to the "Notebooks"
  section of the nav. No copies and no symlinks: the pages are virtual files.
- Notebook pages lose nbconvert's CDN <script> tags (MathJax, Mermaid), so the built site loads
  nothing from the network; their $...$ math becomes MathML at build time (latex2mathml), which
  browsers draw without any script.
- Each notebook page links to its .ipynb, which is copied into the site beside the page.
- Search indexes a notebook cell's code once: the hidden copy of the source kept for the copy
  button (and its "Copied!" notice) is marked data-search-exclude.
- The 404 page links its styles, scripts and nav relatively (mkdocs writes them from "/"), so it
  is styled when opened from file:// too.
- pymdownx.snippets' base_path is made absolute, so the build works from any directory.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.smearcli")

CLI_PAGE = "reference/cli.md"
NOTEBOOK_DIR = "notebooks"  # at the repository root, and the folder of their pages in the site
NOTEBOOK_SECTION = "Notebooks"

# A <script> that loads from the network (nbconvert adds MathJax and Mermaid from a CDN), or from
# nowhere (mkdocs-jupyter writes src="" when no MathJax URL is configured).
_REMOTE_SCRIPT = re.compile(
    r"<script\b[^>]*\bsrc=[\"'](?:https?://[^\"']*)?[\"'][^>]*>\s*</script>"
    r"|<script\b[^>]*>(?:(?!</script>).)*?\bimport\b[^<]*?https?://(?:(?!</script>).)*?</script>",
    re.S | re.I,
)


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _notebooks(config) -> list[Path]:
    return sorted((_root(config) / NOTEBOOK_DIR).glob("*.ipynb"))


def on_config(config):
    root = _root(config)
    snip = config.mdx_configs.get("pymdownx.snippets")
    if snip is not None:
        snip["base_path"] = [str(root / p) for p in snip.get("base_path", [])]
    # the Notebooks section lists every committed notebook, in file-name order
    for item in config.nav or []:
        if isinstance(item, dict) and NOTEBOOK_SECTION in item:
            section = item[NOTEBOOK_SECTION]
            listed = {v if isinstance(v, str) else next(iter(v.values())) for v in section}
            for nb in _notebooks(config):
                uri = f"{NOTEBOOK_DIR}/{nb.name}"
                if uri not in listed:
                    section.append(uri)
    # `mkdocs serve` rebuilds when the CLI or a notebook changes
    for extra in (root / "smearcli", root / NOTEBOOK_DIR):
        if extra.is_dir() and str(extra) not in config.watch:
            config.watch.append(str(extra))
    return config


@event_priority(100)  # before mkdocs-jupyter wraps .ipynb files as pages
def on_files(files, config):
    import sys

    root = str(_root(config))
    try:
        from smearcli.cli.reference import page
    except ImportError:  # smearcli not installed: use the checkout's
        sys.path.insert(0, root)
        from smearcli.cli.reference import page

    files.append(File.generated(config, CLI_PAGE, content=page()))
    for nb in _notebooks(config):
        uri = f"{NOTEBOOK_DIR}/{nb.name}"
        if files.get_file_from_path(uri) is None:
            # a File whose source folder is the repository root: its page is notebooks/NAME,
            # read straight from notebooks/NAME.ipynb (File.generated would leave src_dir unset,
            # which mkdocs-jupyter's wrapper cannot read from)
            files.append(File(uri, src_dir=root, dest_dir=config.site_dir,
                              use_directory_urls=config.use_directory_urls))
    return files


NOTEBOOK_LIST = "<!-- notebook-list: docs/hooks.py writes the list of notebooks here -->"


def _notebook_title(path: Path) -> str:
    """The first Markdown heading of a notebook, or its file name."""
    import json

    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return path.stem
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", []))
            m = re.search(r"^#+\s+(.+?)\s*#*$", source, re.M)
            if m:
                return m.group(1)
    return path.stem


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != f"{NOTEBOOK_DIR}/index.md" or NOTEBOOK_LIST not in markdown:
        return markdown
    items = [f"- [{_notebook_title(nb)}]({nb.name})" for nb in _notebooks(config)]
    return markdown.replace(NOTEBOOK_LIST, "\n".join(items) or "(No notebooks yet.)")


# Math in notebook Markdown ($...$, $$...$$), as Jupyter shows it, is turned into MathML at build
# time: browsers draw MathML themselves, so no MathJax is needed. Code, outputs and scripts are
# left alone.
_VERBATIM = re.compile(r"(<(pre|code|script|style|textarea|math)\b.*?</\2\s*>)", re.S | re.I)
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?!\s)([^$\n<>]+?)(?<![\s\\])\$(?![\w$])")


def _mathml(tex: str, display: bool, where: str) -> str:
    import html

    from latex2mathml.converter import convert

    try:
        return convert(html.unescape(tex).strip(), display="block" if display else "inline")
    except Exception as e:  # noqa: BLE001 - a formula we cannot convert is a docs bug: warn
        log.warning("%s: cannot convert the formula %r to MathML: %s", where, tex, e)
        return tex


def math_to_mathml(page_html: str, where: str = "") -> str:
    parts = _VERBATIM.split(page_html)
    out = []
    for i, part in enumerate(parts):
        kind = i % 3  # re.split with two groups: text, whole verbatim element, its tag name
        if kind == 2:
            continue
        if kind == 0:
            part = _DISPLAY_MATH.sub(lambda m: _mathml(m.group(1), True, where), part)
            part = _INLINE_MATH.sub(lambda m: _mathml(m.group(1), False, where), part)
        out.append(part)
    return "".join(out)


# nbconvert's copy button: a visible icon with a hidden "Copied!" notice, and a hidden <div> with
# the cell's source for the clipboard. The search index would hold both beside the highlighted
# code; Material's search skips elements marked data-search-exclude (and strips the mark).
_COPY_PARTS = re.compile(r'<div class="(zeroclipboard-container|clipboard-copy-txt)"')


def notebook_content(html: str, ipynb_name: str) -> str:
    """A notebook page's HTML: copy-button parts kept out of search, a download link on top."""
    html = _COPY_PARTS.sub(r'<div class="\1" data-search-exclude', html)
    link = (f'<p class="smearcli-nb-download" data-search-exclude><a href="{ipynb_name}" download>'
            f'Download this notebook ({ipynb_name})</a></p>\n')
    return link + html


@event_priority(-100)  # after mkdocs-jupyter has rendered the notebook
def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    return notebook_content(html, Path(page.file.src_uri).name)


def on_post_build(config):
    import shutil

    dest = Path(config.site_dir) / NOTEBOOK_DIR
    for nb in _notebooks(config):
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(nb, dest / nb.name)


# The 404 page is written with links from the server's root ("/assets/...", "base": "/"). It
# sits at the top of the site, so the same links without the leading "/" work from file:// (and
# for a server's 404 at the top level).
_ROOT_LINK = re.compile(r'(\b(?:href|src)=")/(?!/)')


def relative_404(html: str) -> str:
    html = _ROOT_LINK.sub(r"\1", html)
    html = html.replace('"base": "/"', '"base": "."')  # Material's script config
    return re.sub(r'("search": ")/', r"\1", html)


def on_post_template(output, template_name, config):
    return relative_404(output) if template_name == "404.html" else output


def on_post_page(output, page, config):
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    stripped, n = _REMOTE_SCRIPT.subn("", output)
    if n:
        log.debug("%s: removed %d CDN script(s)", page.file.src_uri, n)
    return math_to_mathml(stripped, page.file.src_uri)
