"""nanochat's BPE tokenizer, read without running code from the file, and chat rendering.

nanochat saves its tokenizer as `tokenizer.pkl`: `pickle.dump(enc, f)` of a `tiktoken.Encoding`. Such a pickle names
one global, `tiktoken.core.Encoding`, creates an empty instance of it and hands it a plain dict (`name`, `pat_str`,
`mergeable_ranks`, `special_tokens`). An ordinary `pickle.load` would call whatever globals a file names, so a
tampered file could run any code. `load_tokenizer` reads it with an unpickler that resolves that one name to an inert
stand-in and refuses every other global before it is called; the dict is then checked field by field before
`tiktoken.Encoding` gets it. tiktoken is optional: `pip install 'smearcli[text]'`.

```python
from smearcli.gpt import tokenizer as tok
enc = tok.load_tokenizer(tok.find_tokenizer(ckpt_dir, base_dir, required=True))
ids = tok.encode_text(enc, "Once upon a time", vocab_size=model.config.vocab_size)
row = tok.encode_documents(enc, "<|bos|>One.<|bos|>Two.")  # a packed row: BOS before each document
chat = tok.encode_chat(enc, [("user", "Hi!"), ("assistant", "Hello.")])  # .ids; .chunk_sizes: one chunk a turn
```
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..util.errors import UserError

TOKENIZER_FILE = "tokenizer.pkl"
TOKENIZER_MAX_BYTES = 64 << 20  # nanochat's 65,536-token tokenizer pickles to about 1 MB
ENCODING_GLOBAL = ("tiktoken.core", "Encoding")  # what tiktoken.Encoding pickles as
INSTALL_HINT = "pip install 'smearcli[text]' (or pip install tiktoken)"

# nanochat's special tokens (nanochat/tokenizer.py SPECIAL_TOKENS), appended after the merges
BOS = "<|bos|>"
USER_START, USER_END = "<|user_start|>", "<|user_end|>"
ASSISTANT_START, ASSISTANT_END = "<|assistant_start|>", "<|assistant_end|>"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
OUTPUT_START, OUTPUT_END = "<|output_start|>", "<|output_end|>"
SPECIAL_TOKENS = (BOS, USER_START, USER_END, ASSISTANT_START, ASSISTANT_END,
                  PYTHON_START, PYTHON_END, OUTPUT_START, OUTPUT_END)
CHAT_TOKENS = (BOS, USER_START, USER_END, ASSISTANT_START, ASSISTANT_END)

_STATE_KEYS = {"name", "pat_str", "mergeable_ranks", "special_tokens"}
_OPTIONAL_STATE_KEYS = {"explicit_n_vocab"}
_MAX_ID = 2 ** 32 - 1  # tiktoken stores ranks as u32


def require_tiktoken():
    """The tiktoken module, or a UserError saying how to install it."""
    try:
        import tiktoken
    except ImportError as e:
        raise UserError(f"reading a nanochat tokenizer needs tiktoken: {INSTALL_HINT}") from e
    return tiktoken


# -- reading tokenizer.pkl ------------------------------------------------------------------------
class _EncodingRecord:
    """Stands in for tiktoken.core.Encoding while a pickle is read: it only keeps the state the
    pickle hands it, so no tiktoken code runs on unchecked data."""

    state: Any = None  # class defaults: unpickling creates instances without calling __init__
    built = False

    def __setstate__(self, state):
        if self.built:
            raise pickle.UnpicklingError("the encoding's state is set twice")
        self.state, self.built = state, True


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ENCODING_GLOBAL:
            return _EncodingRecord
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it refers to an external object (a persistent id)")


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, qualname: str):
        super().__init__(qualname)
        self.qualname = qualname


def read_encoding_state(path) -> dict:
    """The checked state dict of a nanochat tokenizer.pkl, read without running code from it.

    Raises UserError when the file is missing, too large, not a pickle, names any global other
    than tiktoken.core.Encoding (refused before it is looked up, let alone called), or holds a
    state of the wrong shape. Needs no tiktoken."""
    path = Path(os.path.expanduser(str(path)))
    try:
        if path.is_dir():
            raise UserError(f"{path}: a directory, not a tokenizer file; pass the {TOKENIZER_FILE} inside it")
        size = path.stat().st_size
        if size > TOKENIZER_MAX_BYTES:
            raise UserError(f"{path.name}: {size:,} bytes is too large for a tokenizer "
                            f"(limit {TOKENIZER_MAX_BYTES:,} bytes)")
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise UserError(f"{path}: tokenizer file not found") from e
    except OSError as e:
        raise UserError(f"{path.name}: cannot read ({e.strerror or e})") from e
    if not data:
        raise UserError(f"{path.name}: empty file (0 bytes); copy the tokenizer again")
    try:
        obj = _RestrictedUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as e:
        raise UserError(f"{path.name}: refused: loading it would call {e.qualname}; a nanochat tokenizer "
                        f"names only {'.'.join(ENCODING_GLOBAL)}, and smearcli runs no other code from a "
                        "file") from e
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt pickle can raise almost anything
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path.name}: not a readable tokenizer pickle ({detail})") from e
    if not isinstance(obj, _EncodingRecord):
        raise UserError(f"{path.name}: expected a pickled tiktoken Encoding, found a {type(obj).__name__}")
    return check_encoding_state(obj.state, path.name)


def _check_id_map(what: str, field_name: str, mapping, key_type: type) -> None:
    """`mapping` is exactly a dict of `key_type` -> int, every id in 0.._MAX_ID."""
    if type(mapping) is not dict:
        raise UserError(f"{what}: {field_name} is a {type(mapping).__name__}, expected a dict of "
                        f"{key_type.__name__} to int")
    for k, v in mapping.items():
        if type(k) is not key_type or type(v) is not int:
            raise UserError(f"{what}: {field_name} has an entry {type(k).__name__} -> {type(v).__name__}, "
                            f"expected {key_type.__name__} -> int")
        if not 0 <= v <= _MAX_ID:
            raise UserError(f"{what}: {field_name} has the id {v} (for {k!r}), outside 0..{_MAX_ID}")


def check_encoding_state(state, what: str = TOKENIZER_FILE) -> dict:
    """`state` if it is a well-formed tiktoken Encoding state, else a UserError that says which
    field is wrong: str name, str pat_str, dict[bytes, int] mergeable_ranks covering all 256
    bytes, dict[str, int] special_tokens, optional int explicit_n_vocab; ids unique, in 0..2^32-1."""
    if isinstance(state, str):
        raise UserError(f"{what}: refers to tiktoken's registered encoding {state[:40]!r} by name instead of "
                        "holding its tables; nanochat's tokenizers hold their tables")
    if not isinstance(state, dict):
        raise UserError(f"{what}: the encoding's state is a {type(state).__name__}, expected a dict")
    keys = set(state)
    if not all(isinstance(k, str) for k in keys):
        raise UserError(f"{what}: the encoding's state has non-string field names")
    missing = sorted(_STATE_KEYS - keys)
    extra = sorted(keys - _STATE_KEYS - _OPTIONAL_STATE_KEYS)
    if missing or extra:
        parts = (["missing " + ", ".join(missing)] if missing else []) + \
                (["unexpected " + ", ".join(extra)] if extra else [])
        raise UserError(f"{what}: not a tiktoken Encoding state ({'; '.join(parts)})")
    for field_name in ("name", "pat_str"):
        if type(state[field_name]) is not str:
            raise UserError(f"{what}: {field_name} is a {type(state[field_name]).__name__}, expected a string")
    ranks, specials = state["mergeable_ranks"], state["special_tokens"]
    if type(ranks) is dict and not ranks:
        raise UserError(f"{what}: mergeable_ranks is a dict (empty), expected a dict of bytes to int")
    _check_id_map(what, "mergeable_ranks", ranks, bytes)
    absent = [b for b in range(256) if bytes([b]) not in ranks]
    if absent:
        raise UserError(f"{what}: mergeable_ranks lacks {len(absent)} of the 256 single bytes "
                        f"(first: {absent[0]}); a byte-level BPE needs all of them")
    _check_id_map(what, "special_tokens", specials, str)
    if len(set(ranks.values())) != len(ranks):
        raise UserError(f"{what}: two entries of mergeable_ranks share an id")
    clash = sorted(set(ranks.values()) & set(specials.values())) or \
        ([] if len(set(specials.values())) == len(specials) else ["(between special tokens)"])
    if clash:
        raise UserError(f"{what}: a special token shares the id {clash[0]} with another token")
    if "explicit_n_vocab" in state:
        n = state["explicit_n_vocab"]
        if n is not None and type(n) is not int:
            raise UserError(f"{what}: explicit_n_vocab is a {type(n).__name__}, expected an integer")
    return state


def load_tokenizer(path):
    """A `tiktoken.Encoding` rebuilt from a nanochat tokenizer.pkl without unpickling code.

    Raises UserError (see `read_encoding_state`), including when tiktoken is not installed or
    rejects the tables (for instance an invalid split pattern)."""
    tiktoken = require_tiktoken()
    state = read_encoding_state(path)
    kwargs = dict(state)
    name = kwargs.pop("name")
    if kwargs.get("explicit_n_vocab") is None:
        kwargs.pop("explicit_n_vocab", None)
    try:
        return tiktoken.Encoding(name, **kwargs)
    except (ValueError, AssertionError, TypeError, OverflowError) as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{Path(str(path)).name}: tiktoken cannot build the encoding ({detail})") from e


# -- finding it -----------------------------------------------------------------------------------
def tokenizer_candidates(checkpoint_dir, base_dir=None) -> list[Path]:
    """Where a checkpoint's tokenizer may be, in the order they are tried: beside the weights (the
    flat layout of published checkpoints), in a tokenizer/ folder beside them, then nanochat's
    `<base>/tokenizer/tokenizer.pkl`. The base is `base_dir`, or, when the checkpoint sits in
    `<base>/<source>_checkpoints/<tag>`, that `<base>`."""
    ckpt = Path(os.path.expanduser(str(checkpoint_dir)))
    out = [ckpt / TOKENIZER_FILE, ckpt / "tokenizer" / TOKENIZER_FILE]
    bases = []
    if base_dir is not None:
        bases.append(Path(os.path.expanduser(str(base_dir))))
    if ckpt.parent.name.endswith("_checkpoints"):
        bases.append(ckpt.parent.parent)
    for b in bases:
        p = b / "tokenizer" / TOKENIZER_FILE
        if p not in out:
            out.append(p)
    return out


def find_tokenizer(checkpoint_dir, base_dir=None, required: bool = False) -> Optional[Path]:
    """The first tokenizer.pkl of `tokenizer_candidates` that exists (a file), else None, or a
    UserError listing the places looked at when `required`. Nothing is read."""
    candidates = tokenizer_candidates(checkpoint_dir, base_dir)
    for p in candidates:
        if p.is_file():
            return p
    if required:
        raise UserError("no nanochat tokenizer found; looked for " + ", ".join(map(str, candidates)))
    return None


# -- encoding -------------------------------------------------------------------------------------
def check_vocab(enc, vocab_size: int) -> None:
    """A UserError unless the tokenizer's vocabulary fits the model's: nanochat requires them equal;
    a tokenizer smaller than the model is accepted (its ids are all valid), a larger one is not."""
    if enc.n_vocab > vocab_size:
        raise UserError(f"the tokenizer has {enc.n_vocab:,} tokens but the model's vocabulary is "
                        f"{vocab_size:,}: they do not belong together")


def _check_ids(ids: list[int], vocab_size: Optional[int]) -> list[int]:
    if vocab_size is not None and ids:
        top = max(ids)
        if top >= vocab_size:
            raise UserError(f"the tokenizer produced id {top:,}, outside the model's vocabulary of "
                            f"{vocab_size:,}; the tokenizer does not belong to this model")
    return ids


def special_id(enc, token: str) -> int:
    """The id of special token `token`, or a UserError when the tokenizer lacks it."""
    try:
        return enc.encode_single_token(token)
    except KeyError:
        raise UserError(f"the tokenizer has no {token} token; is it a nanochat tokenizer?") from None


def encode_text(enc, text: str, *, bos: bool = True, vocab_size: Optional[int] = None) -> list[int]:
    """Token ids of plain `text`, after `<|bos|>` unless `bos` is False (nanochat prepends it to every
    document). Special-token strings inside `text` stay ordinary text, as in nanochat. With
    `vocab_size`, a UserError when an id does not fit the model."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    ids = ([special_id(enc, BOS)] if bos else []) + enc.encode_ordinary(utf8_text(text))
    return _check_ids(ids, vocab_size)


def split_documents(text):
    """A packed text's (str or bytes) documents, split at each `<|bos|>` (dropped; each gets the BOS id); empty: refused."""
    marker = BOS if isinstance(text, str) else BOS.encode()
    pieces = text.split(marker)[1:] if text.startswith(marker) else text.split(marker)
    empty = next((i for i, doc in enumerate(pieces, 1) if not doc), 0)
    if empty:
        where = "the text ends with a marker" if empty == len(pieces) else f"two {BOS} markers with nothing between them"
        raise UserError(f"document {empty} of the {len(pieces)} the {BOS} markers split the text into is empty ({where}); "
                        "remove the extra marker")
    return pieces


def encode_documents(enc, text: str, *, vocab_size: Optional[int] = None) -> list[int]:
    """One packed row of the documents of `text` (`split_documents`): each one encoded as ordinary
    text after the BOS id, as nanochat prepends BOS to every document it packs."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    bos = special_id(enc, BOS)
    ids: list[int] = []
    for doc in split_documents(utf8_text(text)):
        ids += [bos] + enc.encode_ordinary(doc)
    return _check_ids(ids, vocab_size)


def utf8_text(text: str, what: str = "the text") -> str:
    """`text`, if UTF-8 can encode it; a UserError otherwise. A shell passes bytes that are not
    UTF-8 as lone surrogates (U+DC80-U+DCFF), which the tokenizer would turn into U+FFFD without a
    word: the ids would not be those of the bytes given."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = text[e.start]
        shown = f"byte 0x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"{c!r}"
        raise UserError(f"{what} is not UTF-8 ({shown} at character {e.start}); a tokenizer model "
                        "takes text, so give it as UTF-8") from None
    return text


@dataclass(frozen=True)
class TurnSpan:
    """One turn's tokens: ids[start:end]. `role` is "user" or "assistant"; `text` its content
    ("" for the assistant turn that only primes the reply)."""
    role: str
    start: int
    end: int
    text: str

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ChatIds:
    """A rendered conversation: `ids` and the `turns` that tile it, in order."""
    ids: list[int]
    turns: list[TurnSpan]

    @property
    def chunk_sizes(self) -> list[int]:
        """One chunk per turn: feeding these reuses the cache across turns as a chat does."""
        return [t.length for t in self.turns]


def _normalize_turns(turns) -> list[tuple[str, str]]:
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise ValueError("a chat is a list of turns: (role, text) pairs, {'role': ..., 'content': ...} "
                         "dicts, or plain strings alternating user and assistant")
    out = []
    for i, t in enumerate(turns):
        if isinstance(t, str):
            role, content = ("user" if i % 2 == 0 else "assistant"), t
        elif isinstance(t, dict):
            role, content = t.get("role"), t.get("content")
        elif isinstance(t, (tuple, list)) and len(t) == 2:
            role, content = t
        else:
            raise ValueError(f"chat turn {i + 1}: expected (role, text), a dict or a string, "
                             f"got {type(t).__name__}")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"chat turn {i + 1}: role must be user, assistant or system, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"chat turn {i + 1}: the text must be a string, got {type(content).__name__}")
        out.append((role, content))
    if not out:
        raise ValueError("a chat needs at least one turn")
    if out[0][0] == "system":  # nanochat folds a system message into the first user message
        if len(out) < 2 or out[1][0] != "user":
            raise ValueError("a system turn must be followed by a user turn")
        out = [("user", out[0][1] + "\n\n" + out[1][1])] + out[2:]
    for i, (role, _) in enumerate(out):
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            raise ValueError(f"chat turn {i + 1} is from the {role} but should be from the {expected}: "
                             "turns alternate, starting with the user (only the first may be a system turn)")
    return out


def encode_chat(enc, turns, *, prime: bool = True, vocab_size: Optional[int] = None) -> ChatIds:
    """Render a conversation as nanochat's chat models were trained on and chat with it:

    ```text
    <|bos|> <|user_start|> user text <|user_end|> <|assistant_start|> reply <|assistant_end|> ...
    ```

    `turns` alternate user and assistant, starting with the user; each is a (role, text) pair, a
    {"role", "content"} dict or a plain string (roles then alternate). A leading system turn is
    folded into the first user turn, as nanochat does. When the last turn is the user's and `prime`
    is True, `<|assistant_start|>` is appended as a final, empty assistant turn so generation
    continues with the reply (nanochat's chat_cli does this). The first turn's span includes
    `<|bos|>`. Text is encoded as ordinary text: special-token strings in it are not special.
    With `vocab_size`, a UserError when an id does not fit the model."""
    rendered = _normalize_turns(turns)
    sid = {t: special_id(enc, t) for t in CHAT_TOKENS}
    ids: list[int] = [sid[BOS]]
    spans: list[TurnSpan] = []
    for i, (role, content) in enumerate(rendered):
        start = 0 if i == 0 else len(ids)
        if role == "user":
            ids += [sid[USER_START], *enc.encode_ordinary(utf8_text(content, f"chat turn {i + 1}")), sid[USER_END]]
        else:
            ids += [sid[ASSISTANT_START], *enc.encode_ordinary(utf8_text(content, f"chat turn {i + 1}")), sid[ASSISTANT_END]]
        spans.append(TurnSpan(role, start, len(ids), content))
    if prime and rendered[-1][0] == "user":
        ids.append(sid[ASSISTANT_START])
        spans.append(TurnSpan("assistant", len(ids) - 1, len(ids), ""))
    _check_ids(ids, vocab_size)
    return ChatIds(ids, spans)


def decode(enc, ids: Sequence[int]) -> str:
    """Text of `ids` (invalid UTF-8 replaced), special tokens shown by name."""
    return enc.decode(list(ids), errors="replace")
