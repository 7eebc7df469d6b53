"""metrics.measure against the whole-tensor formulas it replaced, bit for bit, on random runs:
every row in order, engine rows expanded from one prompt, rows out of order; small and large
vocabularies; and no (T, V) float64 tensor on the way."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from smearcli.measure import metrics
from smearcli.measure.metrics import NoiseFloor, abs_error, measure, noise_floor, ref_scale
from smearcli.measure.steps import CACHE_COPY, RunResult


# -- the plain formulas measure must equal (one whole-tensor expression each) -----------------------
def plain_rows(ref, row_map):
    return ref if row_map == list(range(ref.size(0))) else ref[torch.tensor(row_map)]


def plain_stack(run):
    return list(run.hiddens or []) + [run.logits]


def plain_abs_error(ref, run):
    return torch.stack([(x - plain_rows(r, run.row_map)).abs().amax(dim=(0, 2))
                        for r, x in zip(plain_stack(ref), plain_stack(run))])


def plain_ref_scale(ref):
    return torch.stack([x.abs().amax(dim=(0, 2)) for x in plain_stack(ref)])


def plain_kl(ref_logits, run_logits, row_map):
    p = F.log_softmax(plain_rows(ref_logits, row_map).double(), dim=-1)
    q = F.log_softmax(run_logits.double(), dim=-1)
    return (p.exp() * (p - q)).sum(-1).amax(dim=0).clamp_min(0).float()


def plain_measure(ref, run):
    err = plain_abs_error(ref, run)
    rel = err / plain_ref_scale(ref).clamp_min(torch.finfo(torch.float32).tiny)
    top1 = (plain_rows(ref.logits, run.row_map).argmax(-1) == run.logits.argmax(-1)).float().mean().item()
    return err, rel, plain_kl(ref.logits, run.logits, run.row_map), top1


# -- random runs ----------------------------------------------------------------------------------
def make(B, T, V, C, layers, row_map, seed, expand_at=None, noise=1e-2, ties=False, exact_until=0):
    g = torch.Generator().manual_seed(seed)
    ref_logits = torch.randn(B, T, V, generator=g) * 4
    if ties:  # equal maxima in a row: argmax must pick the same one
        ref_logits[:, :, 1] = ref_logits[:, :, 0] = ref_logits.amax(-1) + 1
    ref_h = [torch.randn(B, T, C, generator=g) for _ in range(layers)]
    idx = torch.tensor(row_map)
    R = len(row_map)

    def perturb(x):
        y = x[idx] + torch.randn(R, T, x.size(-1), generator=g) * noise
        y[:, :exact_until] = x[idx][:, :exact_until]  # bit for bit the reference there (a first chunk)
        if expand_at:  # engine: rows expanded from one prompt are copies before expand_at
            for i in range(1, R):
                if row_map[i] == row_map[i - 1]:
                    y[i, :expand_at] = y[i - 1, :expand_at]
        return y
    ref = RunResult("full", "fixed", ref_logits, ref_h, [T], list(range(B)))
    run = RunResult("engine" if expand_at else "chunked", "old", perturb(ref_logits),
                    [perturb(h) for h in ref_h], [T], list(row_map), {CACHE_COPY: [expand_at]} if expand_at else {})
    return ref, run


CASES = [
    dict(B=1, T=50, V=256, C=32, layers=3, row_map=[0]),
    dict(B=2, T=37, V=1000, C=48, layers=2, row_map=[0, 1]),
    dict(B=1, T=40, V=300, C=24, layers=2, row_map=[0, 0], expand_at=31),  # engine, samples 2
    dict(B=2, T=21, V=500, C=24, layers=1, row_map=[0, 0, 0, 1, 1, 1], expand_at=13),
    dict(B=2, T=9, V=130, C=16, layers=1, row_map=[1, 0]),  # rows out of order
    dict(B=2, T=9, V=130, C=16, layers=1, row_map=[0, 0, 1, 1]),  # expanded, no expand_at
    dict(B=1, T=6, V=70000, C=16, layers=1, row_map=[0, 0], expand_at=4),  # a block of one position
    dict(B=1, T=30, V=256, C=32, layers=2, row_map=[0], ties=True),
    dict(B=1, T=12, V=256, C=32, layers=0, row_map=[0]),  # logits only
    dict(B=1, T=40, V=300, C=24, layers=2, row_map=[0], exact_until=23),  # a first chunk equal to the reference
    dict(B=2, T=21, V=500, C=24, layers=1, row_map=[0, 0, 1, 1], expand_at=13, exact_until=21),  # all of it
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c['B']}T{c['T']}V{c['V']}rows{len(c['row_map'])}")
def test_measure_is_the_whole_tensor_formulas_bit_for_bit(case):
    ref, run = make(seed=len(str(case)), **case)
    if case["layers"] == 0:
        ref.hiddens = run.hiddens = None
    noise = NoiseFloor([1e-3] * (case["layers"] + 1))
    m = measure(ref, run, noise)
    err, rel, kl, top1 = plain_measure(ref, run)
    assert torch.equal(m.abs_err, err)
    assert torch.equal(m.rel_err, rel)
    assert torch.equal(m.kl, kl)
    assert m.top1_agreement == top1
    assert torch.equal(abs_error(ref, run), err)
    doubled = [dataclasses.replace(r, logits=r.logits.double(), hiddens=r.hiddens and [h.double() for h in r.hiddens])
               for r in (ref, run)]
    in64 = abs_error(ref, run, torch.float64)  # converted a block at a time: the whole conversion's numbers
    assert in64.dtype == torch.float64 and torch.equal(in64, plain_abs_error(*doubled))
    assert torch.equal(ref_scale(ref), plain_ref_scale(ref))
    assert (m.schedule, m.logic, m.steps, m.chunk_starts, m.noise, m.tolerance) == \
        (run.schedule, run.logic, run.steps, run.chunk_starts, noise, metrics.NOISE_MARGIN)


def test_engine_rows_that_are_not_copies_are_each_measured():
    # expand_at says rows were expanded, but row 1 differs before it: measured as its own row
    ref, run = make(B=1, T=20, V=200, C=16, layers=1, row_map=[0, 0], seed=3)
    run.marks[CACHE_COPY] = [15]
    run.logits[1, 2, 7] += 50.0
    m = measure(ref, run, NoiseFloor([1e-3, 1e-3]))
    assert torch.equal(m.abs_err, plain_abs_error(ref, run)) and torch.equal(m.kl, plain_kl(ref.logits, run.logits, [0, 0]))
    assert float(m.abs_err[-1, 2]) >= 49.0


def test_noise_floor_is_the_plain_definition():
    ref, dec = make(B=1, T=33, V=256, C=24, layers=2, row_map=[0], seed=5)
    floor = noise_floor(ref, dec, torch.float32)
    ulp = torch.finfo(torch.float32).eps * plain_ref_scale(ref).amax(dim=1)
    assert floor.per_layer == torch.maximum(plain_abs_error(ref, dec).amax(dim=1), ulp).tolist()


def test_measuring_a_run_twice_gives_equal_but_separate_results():
    ref, run = make(B=1, T=16, V=256, C=16, layers=1, row_map=[0], seed=8)
    noise = NoiseFloor([1e-3, 1e-3])
    a, b = measure(ref, run, noise), measure(ref, run, noise)
    assert torch.equal(a.abs_err, b.abs_err) and a.abs_err is not b.abs_err
    other = RunResult(run.schedule, run.logic, run.logits + 1.0, run.hiddens, run.steps, run.row_map)
    assert float(measure(ref, other, noise).abs_err[-1].min()) > 0.5  # new tensors: measured anew


class LargestDouble(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_position_by_vocabulary_double_tensor_is_made():
    T, V = 64, 20000
    ref, run = make(B=1, T=T, V=V, C=16, layers=1, row_map=[0, 0], seed=2, expand_at=50)
    with LargestDouble() as mode:
        measure(ref, run, NoiseFloor([1e-3, 1e-3]))
    assert 0 < mode.largest <= metrics.BLOCK * 2 < T * V


def test_hidden_errors_copy_no_hidden_state():
    # expanded rows are compared by broadcasting: nothing of a hidden state's size is allocated
    ref, run = make(B=1, T=256, V=64, C=512, layers=2, row_map=[0, 0, 0, 0], seed=4)
    seen = []

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                seen.append(out.numel())
            return out
    with Sizes():
        abs_error(ref, run)
    assert max(seen) <= metrics.BLOCK < run.hiddens[0].numel()


def test_without_the_log_softmax_shortcut_the_numbers_are_the_same(monkeypatch):
    # on a torch whose log_softmax is not (x - max) - lse bit for bit, the reference's is computed
    ref, run = make(B=1, T=40, V=300, C=24, layers=1, row_map=[0, 0], seed=9, expand_at=31)
    monkeypatch.setattr(metrics, "_log_softmax_is_shifted_input", lambda: False)
    m = measure(ref, run, NoiseFloor([1e-3, 1e-3]))
    assert torch.equal(m.kl, plain_kl(ref.logits, run.logits, run.row_map))


def test_a_block_equal_to_the_reference_skips_the_float64_pass(monkeypatch):
    """Positions bit-identical to the reference (a prompt, a first chunk, a prefill from position
    0) take one comparison, not a float64 log-softmax: measuring a run equal to the reference makes
    no log_softmax call once the reference's own terms are known, and gives exactly 0 everywhere."""
    ref, run = make(B=1, T=40, V=300, C=24, layers=1, row_map=[0], seed=5)
    noise = NoiseFloor([1e-3] * 2)
    same = RunResult("prefill", "old", ref.logits.clone(), [h.clone() for h in ref.hiddens], [40], [0])
    calls = []
    real = metrics.F.log_softmax
    with metrics.shared_work():  # one comparison: the reference's softmax terms once for every run
        measure(ref, run, noise)
        monkeypatch.setattr(metrics.F, "log_softmax", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        m = measure(ref, same, noise)
    assert not calls
    assert float(m.abs_err.max()) == 0.0 and float(m.kl.max()) == 0.0 and m.top1_agreement == 1.0


def test_shared_work_lives_as_long_as_one_comparison(monkeypatch):
    """measure_all computes the reference's scale once for all its runs; the memo ends with the
    call, so a later measure of the same tensors computes it again (no process-wide cache)."""
    ref, _ = make(B=1, T=12, V=50, C=8, layers=1, row_map=[0], seed=3)
    runs = [make(B=1, T=12, V=50, C=8, layers=1, row_map=[0], seed=3 + i)[1] for i in range(3)]
    floor = NoiseFloor([1e-3] * 2)
    calls = []
    real = metrics.ref_scale
    monkeypatch.setattr(metrics, "ref_scale", lambda r: calls.append(r) or real(r))
    together = metrics.measure_all(ref, runs, floor)
    assert len(calls) == 1
    apart = [measure(ref, r, floor) for r in runs]
    assert len(calls) == 4  # outside a scope nothing is kept
    for a, b in zip(together, apart):
        assert torch.equal(a.abs_err, b.abs_err) and a.kl_max == b.kl_max


def test_the_reference_terms_stay_shared_past_the_memo_size(monkeypatch):
    """A d12 compare measures 9 runs, more than the memo holds (MEMO_SIZE): the reference's scale
    and softmax terms, asked for by every run, are still computed once (they were recomputed every
    few runs), and every run's numbers are the same as measured alone."""
    ref, _ = make(B=1, T=12, V=50, C=8, layers=1, row_map=[0], seed=3)
    runs = [make(B=1, T=12, V=50, C=8, layers=1, row_map=[0], seed=10 + i)[1] for i in range(3 * metrics.MEMO_SIZE)]
    floor = NoiseFloor([1e-3] * 2)
    scales, softmax = [], []
    real_scale, real_softmax = metrics.ref_scale, metrics._ref_softmax_terms
    monkeypatch.setattr(metrics, "ref_scale", lambda r: scales.append(1) or real_scale(r))
    monkeypatch.setattr(metrics, "_ref_softmax_terms", lambda r: softmax.append(1) or real_softmax(r))
    together = metrics.measure_all(ref, runs, floor)
    assert (len(scales), len(softmax)) == (1, 1)
    for a, r in zip(together, runs):
        b = measure(ref, r, floor)
        assert torch.equal(a.abs_err, b.abs_err) and torch.equal(a.kl, b.kl) and a.top1_agreement == b.top1_agreement


def test_top1_agreement_without_argmax_is_argmax_on_ties_and_nans():
    """`metrics._agrees` answers `x.argmax(-1) == top` without argmax: argmax's pick is the first
    index holding the maximum, so a tie before `top` disagrees and a tie after it agrees; a NaN is
    argmax's maximum (the block is left to argmax)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 4, 50, generator=g)
    top = x.argmax(-1)
    top[0, 1] = (top[0, 1] + 1) % 50  # disagrees
    peak = x.amax(-1)
    x[1, 0, 2], x[1, 0, 40] = peak[1, 0] + 1, peak[1, 0] + 1  # a tie: argmax is 2
    top[1, 0] = 40  # the later of the tie: disagrees
    x[1, 2, 5], x[1, 2, 30] = peak[1, 2] + 1, peak[1, 2] + 1
    top[1, 2] = 5  # the first of the tie: agrees
    x[2, 3, 0] = peak[2, 3] + 1
    top[2, 3] = 0  # the maximum at index 0
    for case in (x, torch.where(torch.arange(50) == 17, float("nan"), x)):  # NaN at index 17 everywhere
        got = metrics._agrees(case, top)
        assert torch.equal(got, case.argmax(-1) == top)
    assert metrics._agrees(x, top).tolist() == [[True, False, True, True], [False, True, True, True],
                                               [True, True, True, True]]
    one = top[:1]  # one reference row for every run row (an engine's samples)
    assert torch.equal(metrics._agrees(x, one), x.argmax(-1) == one.expand(3, -1))


def test_measuring_runs_together_is_measuring_each_and_shares_the_reference_blocks(monkeypatch):
    """measure_all passes over every run's logits together (`metrics._logits_passes`): each run's
    numbers are its own `measure`'s, bit for bit (runs in order, an engine's expanded rows, a run
    equal to the reference at first, the same run under two names), and a block of the reference's
    float64 log-softmax that several runs need is computed once: one computation per distinct block,
    where measuring them one by one computes it once per run."""
    T, V = 40, 300
    ref, chunked = make(B=1, T=T, V=V, C=24, layers=1, row_map=[0], seed=21, exact_until=12)
    _, decode = make(B=1, T=T, V=V, C=24, layers=1, row_map=[0], seed=22)
    _, engine = make(B=1, T=T, V=V, C=24, layers=1, row_map=[0, 0], seed=23, expand_at=31)
    twin = dataclasses.replace(decode, logic="fixed")  # the same tensors: one pass for both
    runs = [chunked, decode, engine, twin]
    noise = NoiseFloor([1e-3, 1e-3])
    together = metrics.measure_all(ref, runs, noise)
    alone = [measure(ref, r, noise) for r in runs]
    for a, b in zip(together, alone):
        assert torch.equal(a.abs_err, b.abs_err) and torch.equal(a.rel_err, b.rel_err)
        assert torch.equal(a.kl, b.kl) and a.top1_agreement == b.top1_agreement
    for m, r in zip(together, runs):
        assert torch.equal(m.kl, plain_kl(ref.logits, r.logits, r.row_map))
    made = []  # the reference's blocks computed, for runs of one row each (the same blocks)
    real = metrics._ref_log_softmax
    monkeypatch.setattr(metrics, "_ref_log_softmax", lambda r, *a: made.append(r.shape) or real(r, *a))
    metrics.measure_all(ref, [chunked, decode, twin], noise)
    K = min(metrics._positions(1, V, T), metrics.KL_CHUNK)
    assert len(made) == len(range(0, T, K)) >= 2  # together: each block of the reference once
    made.clear()
    for r in (chunked, decode):
        measure(ref, r, noise)
    assert len(made) == 2 * len(range(0, T, K))  # one by one: once per run


def test_a_block_equal_to_another_run_s_is_measured_once(monkeypatch):
    """An engine's prompt and the speculative run's are one prefill of one logic, bit for bit: a
    block equal to one another run has at the same positions takes that run's numbers instead of
    another float64 pass, and every number is what measuring the run alone gives."""
    T, V, P = 40, 300, 32  # blocks of 32 positions: the prompt ends on one
    ref, spec = make(B=1, T=T, V=V, C=24, layers=1, row_map=[0], seed=21)
    _, engine = make(B=1, T=T, V=V, C=24, layers=1, row_map=[0, 0], seed=21, expand_at=P)
    logits = engine.logits.clone()
    logits[:, :P] = spec.logits[0, :P]  # its prompt is the speculative run's
    engine = dataclasses.replace(engine, logits=logits)
    noise = NoiseFloor([1e-3, 1e-3])
    passes = []
    real = metrics._agrees
    monkeypatch.setattr(metrics, "_agrees", lambda x, top: passes.append(x.size(1)) or real(x, top))
    together = metrics.measure_all(ref, [spec, engine], noise)
    assert sum(passes) == T + (T - P)  # the speculative run whole, the engine after its prompt
    for a, r in zip(together, [spec, engine]):
        b = measure(ref, r, noise)
        assert torch.equal(a.abs_err, b.abs_err) and torch.equal(a.kl, b.kl) and a.top1_agreement == b.top1_agreement
