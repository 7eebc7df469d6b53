"""Where input token ids come from: seeded random ids, a token file, or text.

A byte-level model's token id is a byte value (vocabulary 256), so its text needs no tokenizer:
the UTF-8 bytes are the ids. Every reader returns a (B, T) int64 tensor on the CPU and raises a
`UserError` that names the file, never a command-line flag (the CLI adds those).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..util.errors import UserError
from ..util.files import odd_tensor, regular_file, uncompressed_size

TOKENS_MAX_BYTES = 64 << 20  # a token file (JSON text, or a saved tensor's data): ~8M int64 ids at most
TEXT_MAX_BYTES = 16 << 20  # --text-file: 16M byte tokens, far beyond any run a model can do


def random_tokens(config, seq_len: int, batch: int = 1, seed: int = 0) -> Tensor:
    """(batch, seq_len) token ids, uniform over the real vocabulary (`config.vocab_size`, or
    `config` itself when it is a number), from a fixed seed."""
    vocab = config if isinstance(config, int) else config.vocab_size
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq_len), generator=g)


# -- token files ----------------------------------------------------------------------------------
def load_tokens(path: Path, vocab_size: int, max_len: Optional[int] = None) -> Tensor:
    """A JSON list of ids (or list of equal-length lists), or a torch.save'd integer tensor.
    `max_len`: the most ids a row may hold (the model's rotary table), checked before any id is."""
    path = Path(path)
    size = _input_file(path)
    if size > TOKENS_MAX_BYTES:
        raise UserError(f"{path}: {size:,} bytes is too large for a token file (at most {TOKENS_MAX_BYTES >> 20} MiB)")
    if path.suffix == ".json":
        t = _json_tokens(path, vocab_size, max_len)
    else:
        from ..gpt.checkpoint import check_torch_file, describe_load_failure, torch_load

        inflated = uncompressed_size(path)  # the zip index's sizes, before anything is inflated
        if inflated > TOKENS_MAX_BYTES:
            raise UserError(f"{path}: its tensors take {inflated:,} bytes once read, too large "
                            f"for a token file (at most {TOKENS_MAX_BYTES >> 20} MiB)")
        check_torch_file(path, str(path))  # a FIFO, a corrupt zip (CRC) refused before torch reads it
        try:
            t = torch_load(path)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"{path}: {describe_load_failure(e, 'JSON list or saved tensor')}") from e
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{path}: expected a 1-D or 2-D integer tensor, found a {type(t).__name__}")
        kind = odd_tensor(t) or (f"a {str(t.dtype).removeprefix('torch.')} tensor" if t.dtype == torch.bool
                                 or t.is_floating_point() or t.is_complex() else None)
        if kind is not None or t.dim() not in (1, 2):
            raise UserError(f"{path}: expected a 1-D or 2-D integer tensor, found {kind or f'{t.dim()}-D'}")
        _check_length(path, t.size(-1), max_len)
        t = t.long().reshape(-1, t.size(-1)) if t.dim() == 2 else t.long().unsqueeze(0)
    if t.numel() == 0:
        raise UserError(f"{path}: no tokens")
    bad = (t < 0) | (t >= vocab_size)
    if bad.any():
        v = int(t[bad][0])
        raise UserError(f"{path}: id {v} is outside the vocabulary [0, {vocab_size})")
    return t


def _check_length(path: Path, n: int, max_len: Optional[int]) -> None:
    if max_len is not None and n > max_len:
        raise UserError(f"{path}: {n:,} tokens per row exceed what the model's rotary table covers "
                        f"({max_len:,} positions)")


def _input_file(path: Path) -> int:
    """The size of an input file, after refusing what is not a regular readable file."""
    try:
        return regular_file(path)
    except UserError as e:
        if isinstance(e.__cause__, FileNotFoundError) and not os.path.islink(path):
            raise UserError(f"{path}: file not found") from e
        raise


# the first row of a JSON token file, when it is plain: "[[1, 2, 3], ..." or "[1, 2, 3]"
_FIRST_ROW = re.compile(rb"\s*\[\s*\[?([-0-9,\s]*)\]")


def _json_row_length(raw: bytes) -> Optional[int]:
    """The ids in a JSON token file's first row, counted from its text (a regular expression and a
    count, in C) before the file is parsed, or None when the row is not plain digits and commas."""
    m = _FIRST_ROW.match(raw)
    if m is None or not m.group(1).strip():
        return None
    return m.group(1).count(b",") + 1


def _json_tokens(path: Path, vocab_size: int, max_len: Optional[int] = None) -> Tensor:
    try:
        raw = path.read_bytes()
        if max_len is not None:  # a file far too long is refused before 10 MB of ids are parsed
            n = _json_row_length(raw)
            if n is not None:
                _check_length(path, n, max_len)
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: invalid JSON ({e})") from e
    except RecursionError as e:
        raise UserError(f"{path}: invalid JSON (nested too deeply)") from e
    except ValueError as e:  # an integer beyond Python's digit limit
        from ..gpt.checkpoint import one_line_reason
        raise UserError(f"{path}: invalid JSON ({one_line_reason(e)})") from e
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from e
    if isinstance(data, list) and data and all(isinstance(v, int) for v in data):
        data = [data]
    ok = (isinstance(data, list) and data and all(isinstance(r, list) and r for r in data)
          and all(isinstance(v, int) and not isinstance(v, bool) for r in data for v in r))
    if not ok:
        raise UserError(f"{path}: expected a list of integer ids or a list of such lists")
    if len({len(r) for r in data}) != 1:
        raise UserError(f"{path}: rows have different lengths")
    _check_length(path, len(data[0]), max_len)
    bad_id = next((v for r in data for v in r if not 0 <= v < vocab_size), None)
    if bad_id is not None:  # before torch.tensor, which cannot hold ids beyond int64
        raise UserError(f"{path}: id {bad_id} is outside the vocabulary [0, {vocab_size})")
    return torch.tensor(data, dtype=torch.long)


# -- bytes <-> ids --------------------------------------------------------------------------------
def encode(text: str) -> list[int]:
    """UTF-8 bytes as token ids."""
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int]) -> str:
    """Token ids as UTF-8 text; a byte sequence that is not valid UTF-8 shows as U+FFFD."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def text_tokens(data: bytes | str, config) -> Tensor:
    """(1, T) ids for a byte-level model; a UserError for other vocabularies or empty text."""
    if not config.is_byte_level:
        raise UserError(f"the model's vocabulary has {config.vocab_size} tokens, not the 256 bytes of a "
                        "byte-level model; give it token ids instead")
    try:  # a shell passes bytes that are not UTF-8 as lone surrogates: those bytes, as they were
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    except UnicodeEncodeError as e:
        raise UserError(f"the text has a character that UTF-8 cannot encode ({data[e.start]!r} at "
                        f"character {e.start}); give its bytes in a file instead") from e
    if not raw:
        raise UserError("the text is empty")
    return torch.tensor([list(raw)], dtype=torch.long)


def text_documents(data: bytes | str, config, bos: int) -> Tensor:
    """(1, T) ids of a packed text for a byte-level model: the text split at each `<|bos|>` marker
    (`tokenizer.split_documents`), each document's bytes after the id `bos` (the stand-in for BOS,
    which must not occur in the text itself)."""
    from ..gpt.tokenizer import BOS, split_documents

    raw = text_tokens(data, config)[0].tolist()  # the same checks as any text: UTF-8, not empty
    if bos in raw:
        at = raw.index(bos)
        raise UserError(f"the text holds byte {bos} (at byte {at}), which stands in for BOS in a packed row: "
                        f"mark each document's start with {BOS} instead")
    ids: list[int] = []
    for doc in split_documents(bytes(raw)):
        ids += [bos] + list(doc)
    return torch.tensor([ids], dtype=torch.long)


def read_text_bytes(path: Path) -> bytes:
    """A text file's bytes, checked before reading: a regular file, at most TEXT_MAX_BYTES."""
    path = Path(path)
    size = _input_file(path)
    if size > TEXT_MAX_BYTES:
        raise UserError(f"{path}: {size:,} bytes is too large for a text file (at most {TEXT_MAX_BYTES >> 20} MiB)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from e


def read_text_file(path: Path, config, bos: Optional[int] = None) -> Tensor:
    """(1, T) ids of a file's bytes, as they are (a byte-level model); with `bos`, a packed text
    split at its <|bos|> markers (`text_documents`)."""
    raw = read_text_bytes(path)
    try:
        return text_tokens(raw, config) if bos is None else text_documents(raw, config, bos)
    except UserError as e:
        raise UserError(f"{path}: {e}") from e
