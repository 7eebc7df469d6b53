"""Where input token ids come from: seeded random ids, a token file, or text.

A byte-level model's token id is a byte value (vocabulary 256), so its text needs no tokenizer:
the UTF-8 bytes are the ids. Every reader returns a (B, T) int64 tensor on the CPU and raises a
`UserError` that names the file, never a command-line flag (the CLI adds those).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from .errors import UserError


def random_tokens(config, seq_len: int, batch: int = 1, seed: int = 0) -> Tensor:
    """(batch, seq_len) token ids, uniform over the real vocabulary, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq_len), generator=g)


# -- token files ----------------------------------------------------------------------------------
def load_tokens(path: Path, vocab_size: int) -> Tensor:
    """A JSON list of ids (or list of equal-length lists), or a torch.save'd integer tensor."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    if path.suffix == ".json":
        t = _json_tokens(path, vocab_size)
    else:
        from .weights import describe_load_failure

        try:
            t = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"{path}: {describe_load_failure(e, 'JSON list or saved tensor')}") from e
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dim() not in (1, 2):
            raise UserError(f"{path}: expected a 1-D or 2-D integer tensor")
        t = t.long().reshape(-1, t.size(-1)) if t.dim() == 2 else t.long().unsqueeze(0)
    if t.numel() == 0:
        raise UserError(f"{path}: no tokens")
    bad = (t < 0) | (t >= vocab_size)
    if bad.any():
        v = int(t[bad][0])
        raise UserError(f"{path}: id {v} is outside the vocabulary [0, {vocab_size})")
    return t


def _json_tokens(path: Path, vocab_size: int) -> Tensor:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: invalid JSON ({e})") from e
    except RecursionError as e:
        raise UserError(f"{path}: invalid JSON (nested too deeply)") from e
    if isinstance(data, list) and data and all(isinstance(v, int) for v in data):
        data = [data]
    ok = (isinstance(data, list) and data and all(isinstance(r, list) and r for r in data)
          and all(isinstance(v, int) and not isinstance(v, bool) for r in data for v in r))
    if not ok:
        raise UserError(f"{path}: expected a list of integer ids or a list of such lists")
    if len({len(r) for r in data}) != 1:
        raise UserError(f"{path}: rows have different lengths")
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
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if not raw:
        raise UserError("the text is empty")
    return torch.tensor([list(raw)], dtype=torch.long)


def read_text_file(path: Path, config) -> Tensor:
    """(1, T) ids of a file's bytes, as they are."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        return text_tokens(raw, config)
    except UserError as e:
        raise UserError(f"{path}: {e}") from e
