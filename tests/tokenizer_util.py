"""A small nanochat-format BPE tokenizer built in the test: the 256 single bytes, a few hundred merges
learned here from a short corpus, a split pattern, and nanochat's special tokens after the merges;
saved as nanochat saves it (`pickle.dump(enc, f)` of the tiktoken Encoding)."""

from __future__ import annotations

import functools
import pickle
from collections import Counter
from pathlib import Path

import regex

from smearcli.gpt.tokenizer import SPECIAL_TOKENS

PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}{1,2}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CORPUS = (
    "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox runs away into the woods. "
    "a model reads tokens one chunk at a time, and the cache keeps what it has seen so far. "
    "when the prompt is long, the engine prefills it in chunks; every chunk after the first must "
    "smear its first token with the last token of the chunk before it. hello world, hello there! "
    "numbers like 12 34 56 and 2024 appear too. user asks, assistant answers, and the chat goes on. "
) * 3


def learn_merges(text: str, n_merges: int) -> dict[bytes, int]:
    """Byte-level BPE: ranks 0..255 for the bytes, then the most frequent adjacent pair, merged
    repeatedly inside the pattern's pieces."""
    ranks = {bytes([b]): b for b in range(256)}
    words = Counter(tuple(bytes([b]) for b in piece.encode()) for piece in regex.findall(PATTERN, text))
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks[a + b] = len(ranks)
        merged = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return ranks


@functools.lru_cache(maxsize=1)
def encoding_state() -> tuple:
    ranks = learn_merges(CORPUS, 300)
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return ranks, specials


def build_encoding():
    import tiktoken

    ranks, specials = encoding_state()
    return tiktoken.Encoding(name="rustbpe", pat_str=PATTERN, mergeable_ranks=dict(ranks),
                             special_tokens=dict(specials))


def write_tokenizer(path: Path, enc=None) -> Path:
    """Save as nanochat's RustBPETokenizer.save does: the Encoding object itself, pickled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(enc if enc is not None else build_encoding(), f)
    return path


def encoding_pickle(state) -> bytes:
    """The bytes pickle.dump writes for a tiktoken Encoding (its one global, tiktoken.core.Encoding,
    created with no arguments, then handed its state), but with any `state`: what a tampered or
    broken tokenizer.pkl holds. Written opcode by opcode (protocol 3) since pickle will not write
    an Encoding with a state tiktoken would reject."""
    body = pickle.dumps(state, protocol=3)
    assert body[:2] == b"\x80\x03" and body[-1:] == pickle.STOP
    return (b"\x80\x03" + pickle.GLOBAL + b"tiktoken.core\nEncoding\n" + pickle.EMPTY_TUPLE + pickle.NEWOBJ
            + body[2:-1] + pickle.BUILD + pickle.STOP)


def write_state(path: Path, state) -> Path:
    path.write_bytes(encoding_pickle(state))
    return path


def good_state() -> dict:
    ranks, specials = encoding_state()
    return {"name": "rustbpe", "pat_str": PATTERN, "mergeable_ranks": dict(ranks), "special_tokens": dict(specials)}
