"""A user's GGUF file, checked here before llama.cpp's loader sees it (the file is untrusted input).

`check(path, vocab=None)` reads the header with `struct` alone (no llama.cpp, no gguf package) and
returns a `Header` (architecture, version, counts, tensor types, the declared vocabulary), or
raises `BadGGUF` with the reason: not a GGUF (magic), a version other than 2 or 3, tensor or
key/value counts past the bounds below, strings or arrays longer than the file could hold or than
the bounds, a tensor of an unknown type or with more than 4 dimensions, a tensor whose data
(shape x type) runs past the end of the file or overlaps another's, a truncated header, no
`general.architecture`, a declared vocabulary past MAX_VOCAB or (given `vocab`, the config's)
of another size than the model's. A file that passes is still loaded by llama.cpp in a worker
process of its own: a crash there is that worker's, not smearcli's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 had 32-bit counts and is long gone
MAX_TENSORS = 1 << 16  # a real model has hundreds to a few thousand
MAX_KV = 1 << 16
MAX_STRING = 1 << 24  # bytes of one string (a chat template is kilobytes)
MAX_ARRAY = 1 << 24  # items of one array (a tokenizer's merges: hundreds of thousands)
MAX_VOCAB = 1 << 20  # tokens: the largest real vocabularies are about 262k
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32

# ggml tensor types: id -> (name, elements per block, bytes per block) (the GGUF specification)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
         7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
         11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
         15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
         19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
         23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
         28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
         35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17)}
# value types of the key/value section: id -> struct format (8: string, 9: array)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class BadGGUF(ValueError):
    """The file is not a GGUF llama.cpp should be given; the message says why."""


@dataclass
class Header:
    version: int
    architecture: str
    n_tensors: int
    n_kv: int
    vocab: Optional[int]  # tokens the file declares (its token list, else `{arch}.vocab_size`)
    types: dict = field(default_factory=dict)  # tensor type name -> count
    embd_rows: Optional[int] = None  # rows of token_embd.weight

    @property
    def float32(self) -> bool:
        return set(self.types) <= {"F32"}


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise BadGGUF(f"truncated: {what} at byte {self.pos:,} needs {n:,} bytes, the file has "
                          f"{max(len(self.data) - self.pos, 0):,} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"the length of {what}")
        if n > MAX_STRING:
            raise BadGGUF(f"{what} declares {n:,} bytes, over the {MAX_STRING:,} limit")
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str, depth: int = 0):
        if vtype in SCALARS:
            return self.unpack(SCALARS[vtype], f"the value of {key}")
        if vtype == STRING:
            return self.string(f"the value of {key}")
        if vtype == ARRAY and depth == 0:
            itype = self.unpack("<I", f"the item type of {key}")
            count = self.unpack("<Q", f"the length of {key}")
            if key == "tokenizer.ggml.tokens" and count > MAX_VOCAB:
                raise BadGGUF(f"it declares a vocabulary of {count:,} tokens, over the {MAX_VOCAB:,} limit")
            if count > MAX_ARRAY:
                raise BadGGUF(f"{key} declares {count:,} items, over the {MAX_ARRAY:,} limit")
            if itype in SCALARS:  # fixed-size items: check the room once, keep only the count
                self.take(count * struct.calcsize(SCALARS[itype]), f"the {count:,} items of {key}")
                return _Count(count)
            if itype == STRING:
                for _ in range(count):
                    self.string(f"an item of {key}")
                return _Count(count)
            raise BadGGUF(f"{key}: an array of value type {itype}, which GGUF does not define")
        raise BadGGUF(f"{key}: value type {vtype}, which GGUF does not define")


@dataclass(frozen=True)
class _Count:
    n: int


def check(path, vocab: Optional[int] = None) -> Header:
    """The header of the GGUF at `path`, checked (module docstring); BadGGUF says what is wrong."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        data = f.read(min(size, 1 << 28))  # the header; tensor data is checked by offsets only
    r = _Reader(data)
    if data[:4] != MAGIC:
        raise BadGGUF("not a GGUF file (it does not start with the magic bytes 'GGUF')")
    r.pos = 4
    version = r.unpack("<I", "the version")
    if version not in VERSIONS:
        raise BadGGUF(f"GGUF version {version}; llama.cpp reads versions 2 and 3")
    n_tensors = r.unpack("<Q", "the tensor count")
    n_kv = r.unpack("<Q", "the key/value count")
    if n_tensors > MAX_TENSORS:
        raise BadGGUF(f"the header declares {n_tensors:,} tensors, over the {MAX_TENSORS:,} limit")
    if n_kv > MAX_KV:
        raise BadGGUF(f"the header declares {n_kv:,} key/value pairs, over the {MAX_KV:,} limit")
    kv = {}
    for i in range(n_kv):
        key = r.string(f"key {i}")
        kv[key] = r.value(r.unpack("<I", f"the type of {key}"), key)
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch or not arch.replace("_", "").replace("-", "").isalnum():
        raise BadGGUF("no general.architecture naming the model's architecture")
    align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1) or align > 1 << 16:
        raise BadGGUF(f"general.alignment {align!r} is not a power of two")
    tensors, types, embd_rows = [], {}, None
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        nd = r.unpack("<I", f"the dimensions of {name}")
        if not 1 <= nd <= MAX_DIMS:
            raise BadGGUF(f"tensor {name} has {nd} dimensions; ggml has 1 to {MAX_DIMS}")
        dims = [r.unpack("<Q", f"a dimension of {name}") for _ in range(nd)]
        ttype = r.unpack("<I", f"the type of {name}")
        offset = r.unpack("<Q", f"the offset of {name}")
        if ttype not in TYPES:
            raise BadGGUF(f"tensor {name} has type {ttype}, which this llama.cpp does not define")
        tname, block, nbytes = TYPES[ttype]
        n = 1
        for d in dims:
            n *= d
            if n > size * 256:  # more elements than any type packs into the file
                break
        if dims[0] % block:
            raise BadGGUF(f"tensor {name}: its rows of {dims[0]} are not whole {tname} blocks of {block}")
        tensors.append((name, offset, n // block * nbytes))
        types[tname] = types.get(tname, 0) + 1
        if name == "token_embd.weight" and nd == 2:
            embd_rows = dims[1]
    declared = kv.get("tokenizer.ggml.tokens")
    n_vocab = declared.n if isinstance(declared, _Count) else kv.get(f"{arch}.vocab_size")
    if n_vocab is not None and (not isinstance(n_vocab, int) or isinstance(n_vocab, bool)):
        raise BadGGUF(f"{arch}.vocab_size is not a count")
    for what, n in (("a vocabulary of", n_vocab), ("a token embedding of", embd_rows)):
        if n is not None and n > MAX_VOCAB:
            raise BadGGUF(f"it declares {what} {n:,} tokens, over the {MAX_VOCAB:,} limit")
    start = -(-r.pos // align) * align
    room = size - start
    if room < 0:
        raise BadGGUF(f"truncated: the header ends at byte {r.pos:,}, past the file's {size:,} bytes")
    end_prev = 0
    for name, offset, nbytes in sorted(tensors, key=lambda t: t[1]):
        if offset % align:
            raise BadGGUF(f"tensor {name}'s data offset {offset:,} is not aligned to {align}")
        if offset < end_prev:
            raise BadGGUF(f"tensor {name}'s data overlaps the tensor before it")
        if offset + nbytes > room:
            raise BadGGUF(f"tensor {name} declares {nbytes:,} bytes at offset {offset:,}, past the end of the "
                          f"file's data ({room:,} bytes): the header lies about its size, or the file is truncated")
        end_prev = offset + nbytes
    if vocab is not None:
        for what, n in (("vocabulary", n_vocab), ("token embedding", embd_rows)):
            if n is not None and n != vocab:
                raise BadGGUF(f"its {what} has {n:,} tokens, the config's vocab_size {vocab:,}: "
                              "not the model the config describes")
    return Header(version, arch, n_tensors, n_kv, n_vocab, types, embd_rows)
