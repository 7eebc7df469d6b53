"""How far a run is from the reference, per position and per layer, in units a person can act on.

Capture points ("layers"): the post-smear embedding `emb`, every block's output `block0..`, and
the `logits`. For each run against the reference (same inputs, same weights):

- abs error per (layer, position): max |run - ref| over rows and channels;
- relative error: that divided by the largest |ref| at the same (layer, position);
- the noise floor, measured: the full pass against itself in float64 (`smearcli.judging.evidence.floor`;
  no schedule under test sets it), per layer, never below one ulp of the layer's scale; errors
  are reported as multiples of it;
- for logits: KL(ref || run) per position, top-1 agreement;
- where the error is born: its share on chunk starts and the first (layer, position) above
  `NOISE_MARGIN` x the floor;
- the analytic check: at a chunk start t the old logic misses exactly gate_t * x_{t-1}.

`measure` reads each run once: one pass over its logits gives the abs error, KL and top-1
together, a few positions at a time (so a block's float64 stays in cache and no (T, V) double
tensor is made), and run rows that reproduce one reference row are compared by broadcasting, not
gathered. The numbers are those of the whole-tensor formulas, bit for bit (tests/core/test_metrics.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from . import profile
from ..util.defaults import NOISE_MARGIN
from .steps import RunResult


BLOCK = 1 << 17  # elements per block of the one pass (a float32 block stays in a core's L2 cache)


def _groups(row_map: list[int], ref_rows: int) -> list[tuple[slice, slice]]:
    """(ref rows, run rows) slices that cover a run: every row in order is one pair of equal
    slices; otherwise each stretch of run rows that reproduce one ref row is compared against
    that row by broadcasting. Nothing is gathered, so nothing is copied."""
    R = len(row_map)
    if row_map == list(range(ref_rows)):
        return [(slice(0, R), slice(0, R))]
    out, i = [], 0
    while i < R:
        j = i
        while j + 1 < R and row_map[j + 1] == row_map[i]:
            j += 1
        out.append((slice(row_map[i], row_map[i] + 1), slice(i, j + 1)))
        i = j + 1
    return out


def _positions(rows: int, width: int, T: int) -> int:
    return max(1, min(T, BLOCK // max(rows * width, 1)))


def _max_abs_diff(ref: Tensor, run: Tensor, groups, dtype: Optional[torch.dtype] = None) -> Tensor:
    """(T,): max |run - ref| over rows and channels, a block of positions at a time; with `dtype`,
    each block converted to it first (the whole-tensor conversion's numbers, without its copies)."""
    R, T, C = run.shape
    out = torch.zeros(T, dtype=dtype or run.dtype, device=run.device)
    K = _positions(R, C, T)
    for rs, xs in groups:
        for s in range(0, T, K):
            x, r = run[xs, s:s + K], ref[rs, s:s + K]
            d = torch.sub(x, r) if dtype is None else torch.sub(x.to(dtype), r.to(dtype))
            out[s:s + K] = torch.maximum(out[s:s + K], d.abs_().amax(dim=(0, 2)))
    return out


def _max_abs(x: Tensor) -> Tensor:
    """(T,): max |x| over rows and channels, without a full-size temporary."""
    B, T, C = x.shape
    K = _positions(B, C, T)
    return torch.cat([x[:, s:s + K].abs().amax(dim=(0, 2)) for s in range(0, T, K)])


def _stack(run: RunResult) -> list[Tensor]:
    return list(run.hiddens or []) + [run.logits]


_SHARED: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("shared_work", default=None)
MEMO_SIZE = 4


@contextlib.contextmanager
def shared_work():
    """A scope in which `measure` computes what runs share once: the reference's scale and
    softmax terms for every run, and the one decode run measured under each logic. The memo lives
    as long as the scope (one comparison), never beyond it."""
    token = _SHARED.set([])  # [(weak references to the tensors read, other inputs, result)], newest first
    try:
        yield
    finally:
        _SHARED.reset(token)


def _memo(tensors: list[Tensor], key: tuple, compute):
    """`compute()` once per scope (`shared_work`) for the same tensors (the same objects, alive)
    and `key`. Schedules make runs under inference mode, and outside it their tensors cannot be
    changed in place, so the same objects hold the same values."""
    memo = _SHARED.get()
    if memo is None:
        return compute()
    for i, (refs, k, result) in enumerate(memo):
        if k == key and len(refs) == len(tensors) and all(w() is t for w, t in zip(refs, tensors)):
            memo.insert(0, memo.pop(i))  # the reference's terms, asked for by every run, stay in
            return result
    result = compute()
    memo.insert(0, ([weakref.ref(t) for t in tensors], key, result))
    del memo[MEMO_SIZE:]
    return result


def abs_error(ref: RunResult, run: RunResult, dtype: Optional[torch.dtype] = None) -> Tensor:
    """(layers, T): max |run - ref| over rows and channels at every capture point; with `dtype`
    (float64: a float32 difference without float32 rounding), computed in it a block at a time,
    the numbers of converting both runs first."""
    groups = _groups(run.row_map, ref.logits.size(0))
    return torch.stack([_max_abs_diff(r, x, groups, dtype) for r, x in zip(_stack(ref), _stack(run))])


def ref_scale(ref: RunResult) -> Tensor:
    """(layers, T): max |ref| over rows and channels."""
    return torch.stack([_max_abs(x) for x in _stack(ref)])


def _ref_scale(ref: RunResult) -> Tensor:
    """ref_scale, computed once per reference."""
    return _memo(_stack(ref), ("scale",), lambda: ref_scale(ref))


@dataclass
class NoiseFloor:
    per_layer: list[float]  # one value per capture point
    source: str = "another run of the full pass against it, at least one ulp of the layer's scale"
    float64: bool = False  # measured against the full pass in float64 (`evidence.floor`), not the ulp minimum

    def tensor(self) -> Tensor:
        return torch.tensor(self.per_layer).unsqueeze(1)


def noise_floor(ref: RunResult, other: RunResult, dtype: torch.dtype) -> NoiseFloor:
    """Per capture point, max over positions of |other - ref| (`other`: the same full pass in
    float64, `evidence.floor`), at least one ulp of `dtype` at the layer's scale."""
    with profile.section("metrics"):
        measured = abs_error(ref, other).amax(dim=1)
        # one ulp of the compute dtype at the layer's largest value: a zero floor would make every
        # multiple infinite, and rounding in the compute dtype is the least noise any run can have
        ulp = torch.finfo(dtype).eps * _ref_scale(ref).amax(dim=1)
        return NoiseFloor(torch.maximum(measured, ulp).tolist())


KL_CHUNK = 32  # at most this many positions per block of the logits pass, also for small vocabularies


def _same_rows_before(run: Tensor, groups, until: Optional[int]) -> bool:
    """Whether the run rows that reproduce one ref row are copies of one another before position
    `until` (the engine's expanded prompt): there, one row stands for all of them."""
    if not until or any(rs.stop - rs.start != 1 for rs, _ in groups):
        return False  # every row in order: no row stands for another
    if all(xs.stop - xs.start == 1 for _, xs in groups):
        return False
    return all(torch.equal(run[i, :until], run[xs.start, :until]) for _, xs in groups
               for i in range(xs.start + 1, xs.stop))


def _ref_softmax_terms(ref: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The reference's argmax (B, T) and, in float64, each position's max and log-sum-exp (B, T, 1),
    as log_softmax computes them: its output at the argmax is exactly -lse."""
    top = ref.argmax(-1)
    B, T, V = ref.shape
    K = min(_positions(B, V, T), KL_CHUNK)
    mx = torch.empty(B, T, 1, dtype=torch.float64, device=ref.device)
    lse = torch.empty_like(mx)
    for s in range(0, T, K):
        r, i = ref[:, s:s + K].double(), top[:, s:s + K, None]
        mx[:, s:s + K] = r.gather(-1, i)
        lse[:, s:s + K] = F.log_softmax(r, dim=-1).gather(-1, i).neg_()
    return top, mx, lse


@functools.lru_cache(maxsize=None)
def _log_softmax_is_shifted_input() -> bool:
    """Whether this torch's log_softmax is (x - max) - lse, bit for bit (checked once on random
    rows): then the reference's is rebuilt from its cached max and lse in two subtractions."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 2, 4099, generator=g) * 5).double()
    x[0, 0, :7] = x[0, 0].amax()  # ties at the max
    top = x.argmax(-1, keepdim=True)
    p = F.log_softmax(x, dim=-1)
    return torch.equal((x - x.gather(-1, top)) - p.gather(-1, top).neg(), p)


def _ref_log_softmax(r: Tensor, mx: Tensor, lse: Tensor) -> Tensor:
    """log_softmax of a block of reference logits in float64, bit for bit."""
    if _log_softmax_is_shifted_input():
        return r.double().sub_(mx).sub_(lse)
    return F.log_softmax(r.double(), dim=-1)


def _logits_pass(ref: Tensor, run: Tensor, row_map: list[int], expand_at: Optional[int] = None):
    """One pass over the logits, a block of positions at a time: max |run - ref| (T,), KL(ref ||
    run) per row (R, T) in float64 and top-1 agreement per row (R, T). Every number is what the
    whole-tensor formulas give, bit for bit: the maxima and argmaxes are exact, and each KL is the
    same double-precision reduction over one position's vocabulary, however positions are blocked.
    No (T, V) double tensor is made; each block's doubles stay in cache."""
    return _logits_passes(ref, [(run, row_map, expand_at)])[0]


def _logits_passes(ref: Tensor, runs: list) -> list[tuple[Tensor, Tensor, Tensor]]:
    """`_logits_pass` of each run in `runs` ((logits, row_map, expand_at) each), their blocks taken
    in order of position: a block of the reference's float64 log-softmax (and its exp) that several
    runs need is computed once for all of them (a compare's chunked runs, its decode and its
    speculative runs all depart after the first chunk), and dropped once the positions move on."""
    T, V = ref.size(1), ref.size(2)
    ref_top, ref_max, ref_lse = _memo([ref], ("softmax",), lambda: _ref_softmax_terms(ref))  # for every run
    outs, blocks = [], []
    for n, (run, row_map, expand_at) in enumerate(runs):
        R = run.size(0)
        groups = _groups(row_map, ref.size(0))
        outs.append((torch.zeros(T, dtype=run.dtype, device=run.device),  # err
                     torch.empty(R, T, dtype=torch.float64, device=run.device),  # kl
                     torch.empty(R, T, dtype=torch.bool, device=run.device)))  # agree
        shared = expand_at if _same_rows_before(run, groups, expand_at) else 0
        for rs, xs in groups:
            for lo, hi, rows in ((0, shared, slice(xs.start, xs.start + 1)), (shared, T, xs)):
                K = min(_positions(rows.stop - rows.start, V, T), KL_CHUNK)
                blocks += [(s, min(s + K, hi), rs, rows, xs, n) for s in range(lo, hi, K)]
    blocks.sort(key=lambda b: (b[0], b[2].start, b[1]))  # stable: within one block, the runs in order
    terms: dict = {}  # (ref rows, s, e) -> (log p, p) of the reference's block, while positions reach it
    # (ref rows, s, e, rows) -> [(block, its err, agree, kl)] of the runs measured there so far: a
    # block bit-identical to one of them gets its numbers (the engine's and the speculative run's
    # prompts are one prefill of one logic), at the cost of one comparison
    measured: dict = {}
    for s, e, rs, rows, xs, n in blocks:
        (run, _, _), (err, kl, agree) = runs[n], outs[n]
        r, x = ref[rs, s:e], run[rows, s:e]
        if (torch.equal(x, r) if x.shape == r.shape else  # rows in order, or rows of one ref row
                r.size(0) == 1 and all(torch.equal(x[i:i + 1], r) for i in range(x.size(0)))):
            # bit-identical to the reference (a first chunk, a prompt): the formulas below give
            # exactly this (err 0, the same argmax, p - q = +0.0 so KL +0.0) at the cost of one
            # comparison instead of a float64 log-softmax
            agree[xs, s:e] = True
            kl[xs, s:e] = 0.0
            continue
        key = (rs.start, rs.stop, s, e)
        if key not in terms:
            for done in [k for k in terms if k[3] <= s]:  # no later block reads them
                del terms[done]
                measured.pop(done, None)
        same = next((m for m in measured.get(key, ()) if torch.equal(m[0], x)), None)
        if same is not None:
            _, block_err, block_agree, block_kl = same
        else:
            block_err = torch.sub(x, r).abs_().amax(dim=(0, 2))
            block_agree = _agrees(x, ref_top[rs, s:e])
            if key not in terms:
                p = _ref_log_softmax(r, ref_max[rs, s:e], ref_lse[rs, s:e])
                terms[key] = (p, p.exp())
            p, prob = terms[key]
            q = F.log_softmax(x.double(), dim=-1)
            torch.sub(p, q, out=q)
            block_kl = q.mul_(prob).sum(-1)  # exp(p) * (p - q), summed over the vocabulary
            measured.setdefault(key, []).append((x, block_err, block_agree, block_kl))
        err[s:e] = torch.maximum(err[s:e], block_err)
        agree[xs, s:e] = block_agree
        kl[xs, s:e] = block_kl
    return outs


def _agrees(x: Tensor, top: Tensor) -> Tensor:
    """(rows, K): whether `x.argmax(-1)` (x: (rows, K, V)) is `top` ((1 or rows, K)), without
    the argmax, whose kernel takes four times an amax's time. argmax is the first index that holds
    the maximum (the first NaN, where there is one: such a block is left to argmax), so a row
    agrees where its value at `top` is its maximum and no earlier index holds that maximum too."""
    m = x.amax(-1, keepdim=True)  # (rows, K, 1)
    top = top.expand(x.size(0), -1)
    if bool(m.isnan().any()):
        return x.argmax(-1) == top
    hit = (x.gather(-1, top.unsqueeze(-1)) == m).squeeze(-1)
    for i, k in hit.nonzero().tolist():  # a tie before `top` is argmax's pick, not `top`
        j = int(top[i, k])
        if j and bool(x[i, k, :j].amax() == m[i, k, 0]):  # the maximum held earlier (amax: a fast kernel)
            hit[i, k] = False
    return hit


@dataclass
class RunMetrics:
    schedule: str
    logic: str
    steps: list[int]
    chunk_starts: list[int]
    abs_err: Tensor  # (layers, T)
    rel_err: Tensor  # (layers, T)
    kl: Tensor  # (T,)
    top1_agreement: float
    noise: NoiseFloor
    tolerance: float  # multiple of the logits noise floor allowed by --check
    marks: dict = field(default_factory=dict)  # the run's boundaries beyond chunk starts: kind -> positions

    @property
    def max_abs_logits(self) -> float:
        return float(self.abs_err[-1].max())

    @property
    def multiple_of_noise(self) -> list[float]:
        """Per layer: max abs error / that layer's noise floor."""
        return (self.abs_err.amax(dim=1) / self.noise.tensor().squeeze(1)).tolist()

    @property
    def logits_multiple(self) -> float:
        return self.multiple_of_noise[-1]

    @property
    def chunk_start_share(self) -> Optional[float]:
        """Share of the post-smear embedding's error that sits on chunk starts (None: no starts)."""
        return self.chunk_start_share_at(0)

    def chunk_start_share_at(self, layer: int) -> Optional[float]:
        """Share of one capture point's error that sits on chunk starts. None when there are no
        starts or when that capture point never leaves NOISE_MARGIN x its floor: the share of pure
        rounding noise that happens to sit on chunk starts says nothing, and differs between CPUs."""
        if not self.chunk_starts:
            return None
        e = self.abs_err[layer]
        if not bool((e > NOISE_MARGIN * self.noise.per_layer[layer]).any()):
            return None
        return float(e[self.chunk_starts].sum()) / float(e.sum())

    @property
    def first_departure(self) -> Optional[tuple[int, int]]:
        """(layer index, position) of the earliest position where any layer leaves the noise
        floor by NOISE_MARGIN, lowest layer first; None if the run stays within noise."""
        above = self.abs_err > NOISE_MARGIN * self.noise.tensor()
        if not above.any():
            return None
        pos = int(above.any(dim=0).nonzero()[0])
        layer = int(above[:, pos].nonzero()[0])
        return layer, pos

    @property
    def positions_above_noise(self) -> int:
        """How many positions' logits are off by more than NOISE_MARGIN x the floor: how far the
        error born at chunk starts has spread through attention."""
        return int((self.abs_err[-1] > NOISE_MARGIN * self.noise.per_layer[-1]).sum())

    @property
    def kl_max(self) -> float:
        return float(self.kl.max())

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def passed(self) -> bool:
        return self.logits_multiple <= self.tolerance


def _errors(ref: RunResult, run: RunResult, passed=None) -> tuple[Tensor, Tensor, Tensor, float]:
    """abs error (layers, T), relative error, KL (T,) and top-1 agreement of `run` against `ref`;
    `passed`: its logits' pass, made already (`measure_all` makes every run's at once)."""
    groups = _groups(run.row_map, ref.logits.size(0))
    logits_err, kl, agree = passed or _logits_pass(ref.logits, run.logits, run.row_map, run.expand_at)
    hidden = [_max_abs_diff(r, x, groups) for r, x in zip(ref.hiddens or [], run.hiddens or [])]
    err = torch.stack(hidden + [logits_err])
    scale = _ref_scale(ref)[-err.size(0):]
    rel = err / scale.clamp_min(torch.finfo(torch.float32).tiny)
    return err, rel, kl.amax(dim=0).clamp_min(0).float(), agree.float().mean().item()


def measure_all(ref: RunResult, runs: Sequence[RunResult], noise: NoiseFloor,
                tolerance: float = NOISE_MARGIN) -> list[RunMetrics]:
    """`measure` of every run against one reference, sharing the work they have in common: the
    logits of every run are passed over together (`_logits_passes`), the rest per run."""
    def logits_of(r: RunResult) -> tuple:  # decode under two logics is one tensor: one pass
        return id(r.logits), tuple(r.row_map), r.expand_at

    with shared_work():
        with profile.section("metrics"):
            distinct = {logits_of(r): r for r in runs}
            made = _logits_passes(ref.logits, [(r.logits, r.row_map, r.expand_at) for r in distinct.values()])
            passes = dict(zip(distinct, made))
        return [_measure(ref, r, noise, tolerance, passes[logits_of(r)]) for r in runs]


def measure(ref: RunResult, run: RunResult, noise: NoiseFloor, tolerance: float = NOISE_MARGIN) -> RunMetrics:
    """One run against the reference: one pass over its logits, one over each hidden state."""
    return _measure(ref, run, noise, tolerance)


def _measure(ref: RunResult, run: RunResult, noise: NoiseFloor, tolerance: float, passed=None) -> RunMetrics:
    with profile.section("metrics"):
        key = ("run", tuple(run.row_map), run.expand_at, ref.hiddens is None, run.hiddens is None)
        err, rel, kl, top1 = _memo(_stack(ref) + _stack(run), key, lambda: _errors(ref, run, passed))
        return RunMetrics(run.schedule, run.logic, list(run.steps), run.chunk_starts, err.clone(), rel.clone(),
                          kl.clone(), top1, noise, tolerance, {k: list(v) for k, v in run.marks.items()})


@dataclass
class AnalyticCheck:
    """At chunk start t, old minus reference at the first capture point should be
    -scale * gate_t * x_{t-1}."""
    position: int
    predicted: float  # max |scale * gate_t * x_{t-1}| over rows and channels
    measured: float  # max |old - ref| at the first capture point
    residual: float  # max |(ref - old) - scale * gate_t * x_{t-1}|: should be rounding noise


@torch.inference_mode()
def analytic_check(runner, tokens: Tensor, ref: RunResult, old: RunResult) -> list[AnalyticCheck]:
    """The error the old logic makes at each chunk start, against the exact term it drops.

    `runner.smear_terms(tokens)` (a runner that declares `runner.SMEAR_TERMS`) gives the pre-smear
    embedding x (B, T, C), the gate (B, T, 1) and the scale between the post-smear embedding and
    the first capture point (1 for our model, whose first capture point is the post-smear
    embedding itself). Empty when the runs carry no hidden states, rows differ, there are no
    chunk starts, or the runner has no smear terms."""
    from .runner import SMEAR_TERMS

    if ref.hiddens is None or old.hiddens is None or old.row_map != ref.row_map or not old.chunk_starts:
        return []
    if not runner.can(SMEAR_TERMS):
        return []
    terms = runner.smear_terms(tokens.to(runner.device))
    if terms is None:
        return []
    x, gate, scale = terms
    out = []
    for t in old.chunk_starts:
        term = (scale * (gate[:, t] * x[:, t - 1])).float()  # (B, C)
        diff = ref.hiddens[0][:, t] - old.hiddens[0][:, t]
        out.append(AnalyticCheck(t, float(term.abs().max()), float(diff.abs().max()),
                                 float((diff - term).abs().max())))
    return out
