"""The CLI reference page, generated from the Typer app itself.

`cli_reference(app)` walks the click command tree that Typer builds (`typer.main.get_command`)
and writes Markdown: every command, its help, and every option with the same name column, help
text and default that `--help` prints. The docs build calls it at build time (docs/hooks.py), so
the page changes whenever an option changes; nothing here is copied by hand.

Imports nothing heavy: the Typer app itself is torch-free.
"""

from __future__ import annotations

import html
import re
from typing import Iterator, Optional

DEFAULT_PANEL = "Options"
ARGUMENTS_PANEL = "Arguments"


def _context(cmd, name: str, parent=None):
    """A context built the way the command builds its own (context_settings such as -h)."""
    settings = dict(getattr(cmd, "context_settings", None) or {})
    return cmd.context_class(cmd, info_name=name, parent=parent, **settings)


def _panel(param_or_cmd, default: str) -> str:
    panel = getattr(param_or_cmd, "rich_help_panel", None)
    return panel if isinstance(panel, str) and panel else default


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: escaped HTML, no pipes, no newlines."""
    text = html.escape(" ".join(text.split()), quote=False)
    return text.replace("|", "&#124;")


def _code(text: str) -> str:
    """Inline code inside a table cell (a pipe would still split the cell, so use the entity
    inside <code>)."""
    return "<code>" + _cell(text) + "</code>"


def _help_text(cmd) -> str:
    text = (getattr(cmd, "help", None) or "").strip()
    # click's convention: a \f ends the help shown to people
    return text.split("\f", 1)[0].strip()


def _paragraphs(text: str) -> str:
    """Help text as Markdown: paragraphs kept, lines inside a paragraph joined."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(html.escape(p, quote=False) for p in paras)


def _short_help(cmd) -> str:
    short = getattr(cmd, "short_help", None)
    if short:
        return short
    text = " ".join(_help_text(cmd).split())
    return text


def _param_rows(cmd, ctx) -> dict[str, list[tuple[str, str]]]:
    """{panel: [(name column, help column)]}, in the order --help shows them."""
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if getattr(param, "param_type_name", "option") == "argument":
            name = (param.human_readable_name or param.name or "").upper()
            metavar = param.make_metavar(ctx) if _takes_ctx(param.make_metavar) else param.make_metavar()
            first = f"{name} {metavar}".strip() if metavar and metavar != name else name
            help_ = getattr(param, "help", None) or ""
            if param.required:
                help_ = f"{help_}  [required]".strip()
            panels.setdefault(_panel(param, ARGUMENTS_PANEL), []).append((first, help_))
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        first, help_ = record
        panels.setdefault(_panel(param, DEFAULT_PANEL), []).append((first, help_ or ""))
    # --help shows the command's own options first, then the named panels in order of appearance
    ordered = {}
    for key in (ARGUMENTS_PANEL, DEFAULT_PANEL):
        if key in panels:
            ordered[key] = panels.pop(key)
    ordered.update(panels)
    return ordered


def _takes_ctx(method) -> bool:
    import inspect

    try:
        return "ctx" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def walk(app_or_cmd, prog: str = "smearcli") -> Iterator[tuple[str, object, object]]:
    """(full command path, click command, context) for the root and every subcommand, depth first
    in the order --help lists them."""
    cmd = _to_click(app_or_cmd)

    def rec(c, path, parent):
        ctx = _context(c, path.split()[-1], parent)
        yield path, c, ctx
        subs = getattr(c, "commands", None)
        if subs:
            for sub_name in c.list_commands(ctx):
                sub = c.get_command(ctx, sub_name)
                if sub is None or getattr(sub, "hidden", False):
                    continue
                yield from rec(sub, f"{path} {sub_name}", ctx)

    yield from rec(cmd, prog, None)


def _to_click(app_or_cmd):
    if hasattr(app_or_cmd, "get_params"):
        return app_or_cmd
    import typer

    return typer.main.get_command(app_or_cmd)


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def cli_reference(app_or_cmd, prog: str = "smearcli", heading_level: int = 2) -> str:
    """Markdown for every command and option of the app (generated, never edited by hand)."""
    h = "#" * heading_level
    parts: list[str] = []
    for path, cmd, ctx in walk(app_or_cmd, prog):
        depth = len(path.split()) - 1
        parts.append(f'{h}{"#" * min(depth, 1)} `{path}` {{ #{_anchor(path)} }}\n')
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        parts.append(f"```text\nUsage: {path} {usage}\n```\n")
        help_ = _help_text(cmd)
        if help_:
            parts.append(_paragraphs(help_) + "\n")
        subs = getattr(cmd, "commands", None)
        if subs:
            names = [n for n in cmd.list_commands(ctx) if not getattr(cmd.get_command(ctx, n), "hidden", False)]
            if names:
                parts.append("| command | what it does |\n| --- | --- |")
                for n in names:
                    parts.append(f"| [`{n}`](#{_anchor(path + ' ' + n)}) | {_cell(_short_help(cmd.get_command(ctx, n)))} |")
                parts.append("")
        for panel, rows in _param_rows(cmd, ctx).items():
            parts.append(f"**{html.escape(panel, quote=False)}**\n")
            parts.append("| option | description |\n| --- | --- |")
            for first, text in rows:
                parts.append(f"| {_code(first)} | {_cell(text)} |")
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def page(app_or_cmd=None, prog: str = "smearcli") -> str:
    """The whole docs page (reference/cli.md)."""
    if app_or_cmd is None:
        from .app import app as app_or_cmd
    return (
        "# CLI reference\n\n"
        "Generated from the Typer app when the site is built (`smearcli.cli.reference.cli_reference`), so "
        "it lists exactly what `smearcli COMMAND --help` prints. Exit status: 0 ok, 1 a `--check` "
        "failure or an internal error, 2 bad usage or input.\n\n"
        + cli_reference(app_or_cmd, prog)
    )


def main(argv: Optional[list[str]] = None) -> None:
    """`python -m smearcli.cli.reference` prints the reference (handy for a diff in review)."""
    import sys

    sys.stdout.write(page())


if __name__ == "__main__":
    main()
