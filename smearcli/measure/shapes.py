"""The shape of a failure, named from its per-position error.

A run's logits error along the positions, against its boundaries, says what kind of bug it is:

- *state dropped at chunk starts*: fine before the first boundary, off from it to the end (the
  state a chunk should start from was forgotten, and everything after reads the wrong one);
- *context lost*: off for the first tokens after each boundary, then fading (a short window, a
  conv's taps, a cache that a chunk does not read);
- *positions restart*: every cached step off, fixed by explicit `position_ids` (decided by a
  rerun, `classify`'s `fixed_by`);
- *mask wrong*: off inside the first call too, or fixed by an explicit attention mask;
- *decode path differs*: the one-token step disagrees with the chunk path (decode fails, chunks
  of several tokens pass);
- *cache misreports its length*: after a cached step the cache's `get_seq_length()` is not the
  number of tokens fed (a layer 0 that keeps no keys reports 0), so the next step's positions and
  masks start from the wrong place (decided by asking the cache, `diagnose.misreported`);
- *departs at the sliding window*: every cached schedule departs first exactly at the window's
  length, whatever its steps (a mask or window that the cached path sizes differently);
- the boundaries' own shapes (each registered boundary's `shape`, `smearcli.measure.schedules.shape`):
  *padding leaks into a row* (a row beside padded ones in one batch differs from the row alone)
  and *state not rolled back* (a cache cropped or restored after rejected drafts keeps what the
  drafts left), named by the schedule that failed.

`profile_shape` names the shape from the error alone; `classify` puts reruns first (what an
explicit argument fixes decides it) and falls back to the profile.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .schedules import census_schedules, shape

STATE_DROPPED = "state dropped at chunk starts"
CONTEXT_LOST = "context lost"
POSITIONS = "positions restart"
MASK = "mask wrong"
DECODE_PATH = "decode path differs"
LENGTH = "cache misreports its length"
WINDOW_EDGE = "departs at the sliding window"
LEAK = "the full pass leaks future tokens"  # the reference itself reads later tokens (`causal`)
OTHER = "other"

THROUGH_GENERATE = "through generate only"  # a finding only generate's own paths show (engines.transformers.reach)
PROFILE_SHAPES = (STATE_DROPPED, CONTEXT_LOST, POSITIONS, MASK, DECODE_PATH)  # what a step plan's error can show
RERUN_SHAPES = (LENGTH, WINDOW_EDGE)  # what asking the cache or comparing every schedule shows


def leak_schedule(how: str) -> str:
    """A leak's `worst_schedule`: the full pass rerun with its last tokens `how` ("removed", the
    probe a cached step's view matches, or "changed"), whichever moved the earlier positions."""
    return f"full pass, last tokens {how}"


def all_shapes() -> tuple[str, ...]:
    """Every shape a finding may have: the step plans', each census boundary's own, then other."""
    return PROFILE_SHAPES + RERUN_SHAPES + tuple(shape(name) for name in census_schedules()) + (OTHER,)

FADED = 0.1  # a chunk's tail under this share of its head's error: the error faded
SPREAD = 0.9  # share of positions from the first boundary on that must be off: state dropped


def boundaries(steps: Sequence[int]) -> list[int]:
    """Every step start after position 0 (one-token steps included)."""
    out, pos = [], 0
    for n in steps[:-1]:
        pos += n
        out.append(pos)
    return out


def profile_shape(err: Sequence[float], steps: Sequence[int], threshold: float) -> str:
    """The shape of a failing run from its per-position logits error (`err`, one value per
    position), the steps it ran in and the error above which a position is off."""
    err = [float(e) for e in err]
    T = len(err)
    above = [e > threshold for e in err]
    if not any(above):
        return OTHER
    first = above.index(True)
    starts = boundaries(steps)
    if not starts or first < starts[0]:
        return DECODE_PATH if steps and all(n == 1 for n in steps) else MASK
    if all(n == 1 for n in steps[1:]):
        return DECODE_PATH
    tail = above[starts[0]:]
    if sum(tail) >= SPREAD * len(tail):
        return STATE_DROPPED
    # context lost: each chunk that starts off ends (nearly) back in the noise
    edges = [0] + starts + [T]
    faded = checked = 0
    for a, b in zip(edges[1:-1], edges[2:]):
        if b - a < 3 or not above[a]:
            continue
        checked += 1
        head, end = max(err[a:a + max(1, (b - a) // 4)]), err[b - 1]
        faded += end < FADED * head or not above[b - 1]
    if checked and faded == checked:
        return CONTEXT_LOST
    return OTHER


def classify(err: Sequence[float], steps: Sequence[int], threshold: float,
             fixed_by: Optional[str] = None, decode_fails: bool = False,
             chunks_pass: bool = False, matches_dropped_state: bool = False,
             schedule: Optional[str] = None, length: bool = False, window_edge: bool = False) -> str:
    """The shape: a census boundary's (padded, rollback) failure is that boundary's own shape; then
    reruns first: `fixed_by` "position_ids" or "attention_mask" when the run passes
    with that argument given explicitly; `decode_fails` and `chunks_pass` for the decode path;
    `matches_dropped_state` when decode with the state zeroed at the run's chunk starts equals the
    run (the hypothesis replayed); `length` when the cache misreports its length after a step and
    `window_edge` when every cached schedule departs first at the window: those name the cause
    before any rerun does (an explicit `position_ids` may hide a wrong length, not fix it)."""
    if schedule in census_schedules():
        return shape(schedule)
    if length:
        return LENGTH
    if window_edge:
        return WINDOW_EDGE
    if fixed_by == "position_ids":
        return POSITIONS
    if fixed_by == "attention_mask":
        return MASK
    if decode_fails and chunks_pass:
        return DECODE_PATH
    if matches_dropped_state:
        return STATE_DROPPED
    return profile_shape(err, steps, threshold)
