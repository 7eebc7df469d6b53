"""The reference checked first: a full pass that reads later tokens is no reference.

Every cached schedule is judged against the full pass, so before any is judged the full pass must
be causal: `leak(runner, tokens, ref, threshold)` reruns it with the last `CHANGED` tokens removed,
and with them changed; no earlier position may move past the floor (removing them is what a cached
step sees: the tokens after it are not there yet; changing them finds a leak that their presence
alone hides). When one does, the full pass leaks future tokens: that
is the finding (its shape `LEAK`, the first position that moved, the module the leak starts in,
`born.leak_in`), and the cached paths are not judged against it (a cached step cannot see the
tokens after it, so it would "depart" from a reference that can).

The finding is confirmed the way every finding is (`judge.confirmed`): the same two full passes
on the float64 twin under the precision lift; a leak that keeps at least half its size is `bug`,
one that falls to float64 rounding was float32 noise (no finding), anything else `unconfirmed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...judging import evidence, judge
from ...measure.precision import lifted
from ...judging.verdicts import ROUNDING
from ...measure.shapes import LEAK, leak_schedule

CHANGED = 8  # the tokens changed at the end of the sequence


@dataclass
class Leak:
    """Earlier positions that moved when the last tokens changed."""
    cut: int  # positions before this one must not move
    first: int  # the first position that moved past the threshold
    max_abs: float  # the largest |dlogit| over positions before `cut`
    changed: torch.Tensor  # the tokens the second full pass ran on (the last ones removed or changed)
    how: str = "removed"  # what was done to the tokens from `cut` on
    confirmation: Optional[evidence.Confirmation] = None


def changed_tail(tokens: torch.Tensor, vocab: int, n: int = CHANGED) -> torch.Tensor:
    """`tokens` with each of the last `n` replaced by another id below `vocab` (the next one)."""
    out = tokens.clone()
    out[:, -n:] = (tokens[:, -n:] + 1) % max(2, vocab)
    return out


def vocab_of(model, tokens: torch.Tensor) -> int:
    """The ids the scan may draw: below the config's vocabulary, at most 256 (as `check` draws)."""
    cfg = getattr(model, "config", None)
    try:
        cfg = cfg.get_text_config()
    except Exception:
        pass
    v = getattr(cfg, "vocab_size", None)
    return min(256, int(v)) if isinstance(v, int) and v > 1 else int(tokens.max()) + 1


def probe_width(total: int, n: int = CHANGED) -> int:
    """How many of `total` tokens the probes remove or change: `n`, at most a quarter of them."""
    return min(n, max(1, total // 4))


def early_error(a: torch.Tensor, b: torch.Tensor, cut: int) -> torch.Tensor:
    """max |a - b| per position over the positions before `cut` (logits (R, T, V))."""
    return (a[:, :cut].double() - b[:, :cut].double()).abs().amax(dim=(0, 2))


def leak(runner, tokens: torch.Tensor, ref, threshold: float, vocab: Optional[int] = None,
         n: int = CHANGED) -> Optional[Leak]:
    """The leak of `runner`'s full pass (`ref`: on `tokens`), or None when no position before the
    changed ones moves past `threshold` (tolerance x the logits' floor)."""
    T = tokens.size(1)
    n = probe_width(T, n)
    cut = T - n
    probes = {"removed": tokens[:, :cut], "changed": changed_tail(tokens, vocab or vocab_of(runner.model, tokens), n)}
    found = []
    for how, probe in probes.items():
        with torch.inference_mode():
            other = runner.forward(probe, False).logits
        err = early_error(ref.logits, other, cut)
        off = (err > threshold).nonzero()
        if len(off):
            found.append(Leak(cut, int(off[0]), float(err.max()), probe, how))
    return max(found, key=lambda f: f.max_abs) if found else None


def confirm(runner, tokens: torch.Tensor, found: Leak) -> evidence.Confirmation:
    """The leak measured again on the float64 twin under the lift (`judge.confirmed`)."""
    c = evidence.Confirmation(found.max_abs, str(runner.dtype).removeprefix("torch."))
    try:
        twin = runner.float64()
        with torch.inference_mode(), lifted():
            a = twin.forward(tokens, False).logits
            b = twin.forward(found.changed, False).logits
    except Exception as e:
        c.why = f"not confirmed: it does not run in float64 lifted ({type(e).__name__})"  # no rerun: unconfirmed
        return c
    c.lifted = float(early_error(a, b, found.cut).max())
    c.bound = evidence.rounding_bound(c.original, runner.dtype, float(a.abs().max()))
    c.status, c.why = judge.confirmed(c.original, c.lifted, c.bound)
    return c


def fields(runner, tokens: torch.Tensor, found: Leak, born_in) -> dict:
    """The verdict fields of a confirmed (or unconfirmed) leak, for `check_model`'s record."""
    c, name = found.confirmation, leak_schedule(found.how)
    word = judge.judge([judge.Run(name, passed=False, confirmation=c)]).word  # bug or unconfirmed
    return {"verdict": word, "worst_schedule": name,
            "max_abs": found.max_abs, "shape": LEAK, "born_at": f"logits@{found.first}", "born_in": born_in,
            "confirmation": c.to_json(), "steps": [found.cut, tokens.size(1) - found.cut],
            "notes": [f"with the last {tokens.size(1) - found.cut} tokens {found.how}, the full pass moves the logits "
                      f"of position {found.first} and on (max |dlogit| {found.max_abs:.3g} before position {found.cut}): "
                      f"the reference is not causal, so no cached schedule was judged against it; {c.phrase()}"]}


def rounding(found: Leak) -> bool:
    """Whether the float64 rerun showed the leak to be float32 rounding (no finding)."""
    return found.confirmation is not None and judge.status(judge.Run("leak", False, found.confirmation)) == ROUNDING


def finding(runner, tokens: torch.Tensor, ref, noise, tolerance: float) -> Optional[dict]:
    """`check_model`'s first step once the floor is known: the verdict fields of a full pass that
    leaks future tokens (confirmed in float64, born where the leak starts), or None when it is
    causal (a leak that float64 shows to be rounding is none)."""
    from . import born

    found = leak(runner, tokens, ref, tolerance * noise.per_layer[-1])
    if found is None:
        return None
    found.confirmation = confirm(runner, tokens, found)
    if rounding(found):
        return None
    return fields(runner, tokens, found, born.leak_in(runner, tokens, found.changed, found.cut, tolerance))
