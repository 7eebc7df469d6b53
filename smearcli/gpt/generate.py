"""Greedy and speculative generation under a chosen smear logic.

Generation keeps a KV cache and feeds it in steps, as an inference engine does: a prompt
prefilled in chunks, one token per step while decoding, several tokens at once when a chat turn
is appended or a speculative draft is verified. `CachedSession` runs those steps with the old or
the fixed smear logic; `ReferenceSession` has the same interface but recomputes a full forward
pass over everything seen so far at every step, so it is the ground truth the cached runs must
reproduce.

```python
from smearcli.gpt import generate, weights
from smearcli.measure import inputs
lm = weights.tiny_model()
prompt = inputs.encode("def main():")
old = generate.generate(lm.model, prompt, 40, logic="old", chunk_sizes=[4, 7])
print(inputs.decode(old))
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..measure.inputs import decode, encode
from .model import GPT, rms_norm

UNCACHED = "reference"  # a "logic" name for generation without a cache


# -- sessions -------------------------------------------------------------------------------------
class CachedSession:
    """One sequence fed through a KV cache in steps, with the `logic` smear ("old" or "fixed")."""

    def __init__(self, model: GPT, logic: str, max_len: Optional[int] = None):
        self.model = model
        self.logic = logic
        self.cache = model.new_cache(1, max_len or model.config.sequence_len)
        self.ids: list[int] = []
        self.steps: list[int] = []
        self.last_logits: Optional[Tensor] = None
        self._logits: list[Tensor] = []

    @property
    def logits(self) -> Tensor:
        """(len(ids), V): the logits of every token fed so far."""
        return torch.cat(self._logits) if self._logits else torch.empty(0)

    @torch.inference_mode()
    def feed(self, ids: Sequence[int]) -> Tensor:
        """Run `ids` as one step; returns their logits (T, V), the last one predicts what follows."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("feed() needs at least one token")
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        logits = self.model(x, cache=self.cache, smear=self.logic)[0]
        self.ids += ids
        self.steps.append(len(ids))
        self._logits.append(logits)
        self.last_logits = logits[-1]
        return logits

    def feed_chunks(self, ids: Sequence[int], chunk_sizes: Optional[Sequence[int]] = None) -> Tensor:
        """Feed `ids` in steps of `chunk_sizes` (all at once when None); logits of every token."""
        sizes = [len(ids)] if chunk_sizes is None else list(chunk_sizes)
        if sum(sizes) != len(ids) or any(n < 1 for n in sizes):
            raise ValueError(f"chunk sizes {sizes} do not split {len(ids)} tokens")
        out, pos = [], 0
        for n in sizes:
            out.append(self.feed(ids[pos:pos + n]))
            pos += n
        return torch.cat(out)

    def generate(self, n: int) -> list[int]:
        """Greedily pick `n` tokens, feeding each back as a one-token step (the decode path), so
        afterwards the session holds them and `last_logits` predicts what follows."""
        if self.last_logits is None:
            raise ValueError("feed a prompt before generating")
        out: list[int] = []
        for _ in range(n):
            tok = int(self.last_logits.argmax())
            out.append(tok)
            self.feed([tok])
        return out

    def rewind(self, length: int) -> None:
        """Forget everything after the first `length` tokens (a rejected speculative draft).

        The smear state is restored too: the cache's `prev_embedding` becomes the pre-smear
        embedding of the last kept token, a function of its id alone."""
        if not 0 < length <= len(self.ids):
            raise ValueError(f"cannot rewind {len(self.ids)} tokens to {length}")
        last = torch.tensor([[self.ids[length - 1]]], device=self.model.device)
        with torch.inference_mode():
            self.cache.truncate(length, rms_norm(self.model.transformer.wte(last).to(self.model.dtype)))
        self.ids = self.ids[:length]
        self._logits = [self.logits[:length]]
        self.last_logits = None


class ReferenceSession(CachedSession):
    """The same interface without a cache: every step recomputes a full forward pass."""

    def __init__(self, model: GPT, logic: str = UNCACHED, max_len: Optional[int] = None):
        self.model = model
        self.logic = UNCACHED
        self.ids = []
        self.steps = []
        self.last_logits = None
        self._logits = []

    @torch.inference_mode()
    def feed(self, ids: Sequence[int]) -> Tensor:
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("feed() needs at least one token")
        self.ids += ids
        self.steps.append(len(ids))
        x = torch.tensor([self.ids], dtype=torch.long, device=self.model.device)
        logits = self.model(x)[0, -len(ids):]
        self._logits.append(logits)
        self.last_logits = logits[-1]
        return logits

    def rewind(self, length: int) -> None:
        if not 0 < length <= len(self.ids):
            raise ValueError(f"cannot rewind {len(self.ids)} tokens to {length}")
        self.ids = self.ids[:length]
        self._logits = [self.logits[:length]]
        self.last_logits = None


def session(model: GPT, logic: str, max_len: Optional[int] = None) -> CachedSession:
    """A `CachedSession` for "old"/"fixed", a `ReferenceSession` for "reference"."""
    if logic == UNCACHED:
        return ReferenceSession(model)
    return CachedSession(model, logic, max_len)


def generate(model: GPT, prompt: Sequence[int], n_new: int, logic: str = "fixed",
             chunk_sizes: Optional[Sequence[int]] = None) -> list[int]:
    """Prefill `prompt` in `chunk_sizes` steps (one step when None), then pick `n_new` tokens
    greedily one step at a time. `logic`: "old", "fixed" or "reference" (no cache)."""
    s = session(model, logic, len(prompt) + n_new)
    s.feed_chunks(list(prompt), chunk_sizes)
    return s.generate(n_new)


@dataclass
class Transcript:
    """What one session saw and said while running a script (see `run_script`)."""
    logic: str
    ids: list[int]  # every token fed, in order
    steps: list[int]  # the size of every forward step
    replies: list[list[int]]  # the tokens each ("generate", n) action picked
    logits: Tensor  # (len(ids), V): the logits of every token fed

    @property
    def text(self) -> str:
        return decode(self.ids)


def run_script(model: GPT, logic: str, script: Sequence[tuple]) -> Transcript:
    """Drive one session through `script`, a list of actions as an inference engine takes them:

    - ("feed", text_or_ids) feeds them in one step; ("feed", text_or_ids, chunk_sizes) in chunks
      (a prompt, a chat turn, forced tool output);
    - ("generate", n) picks n tokens greedily, one step each (decoding).
    """
    feeds = [a for a in script if a[0] == "feed"]
    gens = [a for a in script if a[0] == "generate"]
    if len(feeds) + len(gens) != len(script):
        raise ValueError("script actions are ('feed', ids[, chunk_sizes]) or ('generate', n)")
    as_ids = [encode(a[1]) if isinstance(a[1], str) else [int(i) for i in a[1]] for a in feeds]
    total = sum(len(i) for i in as_ids) + sum(int(a[1]) for a in gens)
    s = session(model, logic, total + 1)
    replies, k = [], 0
    for a in script:
        if a[0] == "feed":
            s.feed_chunks(as_ids[k], a[2] if len(a) > 2 else None)
            k += 1
        else:
            replies.append(s.generate(int(a[1])))
    return Transcript(logic, list(s.ids), list(s.steps), replies, s.logits)


# -- speculative decoding -------------------------------------------------------------------------
@dataclass
class SpeculativeResult:
    ids: list[int]  # generated tokens
    proposed: int  # draft tokens proposed
    accepted: int  # draft tokens the target accepted
    verify_steps: int

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 1.0


def speculative_generate(model: GPT, prompt: Sequence[int], n_new: int, draft_len: int,
                         logic: str, draft_model: Optional[GPT] = None) -> SpeculativeResult:
    """Greedy speculative decoding: a draft model proposes `draft_len` tokens one at a time, the
    target `model` verifies them in ONE cached step (a chunk on a non-empty cache: where the old
    smear logic drops the chunk's first predecessor), keeps the agreeing prefix plus its own next
    pick, and rewinds its cache past the rest. With a correct target the output equals plain
    greedy decoding whatever the draft proposes. The draft defaults to the target itself run
    token by token with the fixed logic (a perfect draft: every disagreement is the target's)."""
    if draft_len < 1:
        raise ValueError(f"draft_len must be >= 1, got {draft_len}")
    prompt = [int(i) for i in prompt]
    max_len = len(prompt) + n_new + 2 * draft_len + 1
    target = CachedSession(model, logic, max_len)
    draft = CachedSession(draft_model or model, "fixed", max_len)
    target.feed(prompt)
    draft.feed(prompt)
    out: list[int] = []
    nxt = int(target.last_logits.argmax())  # the target's own pick after the prompt
    proposed = accepted = steps = 0
    while len(out) < n_new:
        out.append(nxt)
        if len(out) >= n_new:
            break
        # the draft keeps what it shares with the accepted text, catches up, proposes draft_len
        seq = prompt + out
        shared = first_divergence(draft.ids, seq)
        keep = min(len(seq) - 1, len(draft.ids) if shared is None else shared)
        draft.rewind(keep)
        draft.feed(seq[keep:])
        props = draft.generate(draft_len)
        # the target verifies [nxt, props...] in one step
        base = len(target.ids)
        logits = target.feed([nxt] + props)
        picks = logits.argmax(-1).tolist()  # picks[i]: the target's choice after token i of the chunk
        steps += 1
        proposed += len(props)
        k = 0
        while k < len(props) and props[k] == picks[k]:
            k += 1
        accepted += k
        out += props[:k]
        nxt = picks[k]
        target.rewind(base + 1 + k)
    return SpeculativeResult(out[:n_new], proposed, accepted, steps)


# -- comparing texts ------------------------------------------------------------------------------
def first_divergence(a: Sequence, b: Sequence) -> Optional[int]:
    """Index of the first differing element (or the shorter length); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mark_divergence(text: str, at: Optional[int], marker: str = "\u2016") -> str:
    """`text` with `marker` inserted before character `at` (unchanged when `at` is None)."""
    if at is None:
        return text
    return text[:at] + marker + text[at:]
