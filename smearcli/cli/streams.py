"""Standard output that prints every character, whatever the locale's encoding.

Under LC_ALL=C with PYTHONUTF8=0, stdout is ASCII: the first "Δ" of a table raised
UnicodeEncodeError after the whole run (an internal error, exit 1). A path the shell gave as
bytes that are not UTF-8 reaches Python as lone surrogates, which no encoding holds. Both now
print: the surrogates as the bytes they stand for (the path as it is on disk), any other
character the encoding lacks as a backslash escape (Δ as \\u0394), as Python's stderr does."""

from __future__ import annotations

import codecs

HANDLER = "smearcli.escape"


def _escape(e: UnicodeError):
    if not isinstance(e, UnicodeEncodeError):
        raise e
    try:
        return codecs.lookup_error("surrogateescape")(e)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(e)


codecs.register_error(HANDLER, _escape)


def escape_unprintable(stream) -> None:
    """Make `stream` (a text stream) print what its encoding cannot hold instead of failing."""
    if getattr(stream, "errors", None) in ("strict", "surrogateescape") and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors=HANDLER)
