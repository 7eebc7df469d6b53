"""smearcli.judging.evidence: the floor never comes from a schedule under test, OK needs power, BUG needs
confirmation in float64 with the float32 islands lifted; smearcli.judging.verdicts: one vocabulary."""

import pytest
import torch

from smearcli.judging import evidence, judge

from smearcli.measure import precision
from smearcli.testing import assert_cache_consistent, check_cache_consistency
from smearcli.judging.verdicts import BUG, INCONCLUSIVE, OK, ROUNDING, Verdict, passed, worst

T = 48
V = 32


def tokens(seed=0, n=T):
    return torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(seed))


class Toy(torch.nn.Module):
    """A recurrent toy LM: h_t = decay * h_{t-1} + emb(x_t); logits = head(emb(x_t) + mix * h_t).
    The cache is {"h": (B, C) state}. `cached_error(x)` is applied to every cached call's hidden
    state (not to the full pass): the place a test puts a bug or a rounding trap."""

    def __init__(self, mix=1.0, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(V, 16, generator=g))
        self.head = torch.nn.Parameter(torch.randn(V, 16, generator=g) / 4)
        self.mix, self.decay = mix, 0.5
        self.cached_error = None

    def scan(self, ids, h):
        e = self.emb[ids]  # (B, T, C)
        out = []
        for t in range(ids.size(1)):
            h = self.decay * h + e[:, t]
            out.append(h)
        hs = torch.stack(out, dim=1)
        return (e + self.mix * hs) @ self.head.T, h

    def full(self, ids):
        return self.scan(ids, torch.zeros(ids.size(0), 16, dtype=self.emb.dtype))[0]

    def step(self, ids, cache):
        h = torch.zeros(ids.size(0), 16, dtype=self.emb.dtype) if cache is None else cache["h"]
        logits, h = self.scan(ids, h)
        if self.cached_error is not None:
            logits = self.cached_error(logits)
        return logits, {"h": h}


# -- the vocabulary -------------------------------------------------------------------------------
def test_one_vocabulary_and_only_ok_passes():
    assert [str(v) for v in Verdict] == ["ok", "bug", "unconfirmed", "inconclusive", "crashed", "timed out",
                                         "not run", "not built", "unsupported", "latent", "tie artifact", "by design"]
    assert passed("ok") and not any(passed(v) for v in Verdict if v is not OK)
    assert worst(["ok", "inconclusive", "bug"]) is BUG and worst([]) is OK


# -- the floor ------------------------------------------------------------------------------------
def test_floor_comes_from_float64_not_decode():
    toy = Toy()
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    assert check.noise.float64 and "float64" in check.noise.source
    assert check.passed, check.table()
    assert check.table().splitlines()[0].count("float64") == 1  # the first line says where the floor is from


def _opaque(ids, cache):  # reaches its model by a name built at run time: no module to find
    return globals()["_HID" + "DEN"].step(ids, cache)


def test_floor_without_a_float64_form_is_one_ulp_and_says_so():
    globals()["_HIDDEN"] = Toy()
    check = check_cache_consistency(_opaque, tokens(), chunk_sizes=(16, 32))
    assert not check.noise.float64 and "one ulp" in check.noise.source
    assert "its runner has no float64 form" in check.noise.source


def test_a_callable_object_holding_the_model_is_found():
    class Wrapper:
        def __init__(self, toy):
            self.toy = toy

        def __call__(self, ids, cache):
            return self.toy.step(ids, cache)
    toy = Toy()
    assert precision.modules_in(Wrapper(toy)) == [toy]


def test_decode_and_chunks_equally_wrong_fail():
    """A step wrong on every cached call (decode and chunks alike) no longer sets its own floor."""
    toy = Toy()
    toy.cached_error = lambda x: x + 0.01
    with pytest.raises(AssertionError) as err:
        assert_cache_consistent(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    msg = str(err.value)
    assert "BUG" in msg and "decode" in msg and "chunked" in msg


# -- confirmation ---------------------------------------------------------------------------------
def test_rounding_is_not_a_bug():
    """Cancellation in float32 on the cached path only (x + 1000 - 1000): far past the floor in
    float32, gone in float64. The check passes and says why."""
    toy = Toy()
    toy.cached_error = lambda x: (x + 1000.0) - 1000.0
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    chunked = check.get("chunked")
    assert not chunked.passed  # past the tolerance in float32 ...
    conf = check.confirmation(chunked)
    assert conf.status == ROUNDING and conf.lifted < conf.bound < conf.original  # ... rounding in float64
    assert check.status(chunked) == ROUNDING and check.word is OK and check.passed
    assert "float32 rounding, gone in float64" in check.verdict


def test_every_confirmation_bounds_rounding_by_the_float64_pass_read_once(monkeypatch):
    """Each departing run's rounding bound is `rounding_bound` at the float64 full pass's largest
    logit, which is read from the logits once for all of them (`Float64.scale`)."""
    import copy

    toy = Toy()
    toy.cached_error = lambda x: (x + 1000.0) - 1000.0
    reads = []
    real = evidence.Float64.scale
    monkeypatch.setattr(evidence.Float64, "scale", lambda self: reads.append(self._scale) or real(self))
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    confirmed = [check.confirmation(m) for m in check.metrics if check.confirmation(m) is not None]
    assert len(confirmed) >= 2 and len(reads) == len(confirmed) and reads[0] is None
    assert all(r is not None for r in reads[1:])  # the later ones found it already read
    scale = float(copy.deepcopy(toy).double().full(tokens()).float().abs().max())
    for conf in confirmed:
        assert conf.bound == evidence.rounding_bound(conf.original, torch.float32, scale)


def test_logic_error_keeps_its_size_in_float64():
    toy = Toy()
    toy.cached_error = lambda x: x * 1.001
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    conf = check.confirmation(check.get("chunked"))
    assert conf.status == BUG and conf.lifted >= judge.KEEPS * conf.original
    assert check.word is BUG and "keeps its size in float64" in check.verdict


def test_the_rounding_bound():
    # rounding shrinks by the ratio of the units: float32 -> float64 is 2**-29
    assert evidence.rounding_bound(1.0, torch.float32, 0.0) == pytest.approx(10 * 2.0 ** -29)


def test_lift_maps_float32_requests():
    x = torch.randn(3)
    with precision.lifted():
        made = [x.float(), x.to(torch.float32), x.to(dtype=torch.float32), torch.zeros(2),
                torch.arange(3, dtype=torch.float32), torch.softmax(x, -1, dtype=torch.float32)]
    assert all(t.dtype == torch.float64 for t in made)
    assert torch.get_default_dtype() == torch.float32  # restored


def test_in_float64_restores_the_very_tensors():
    lin = torch.nn.Linear(3, 3)
    ptr, before = lin.weight.data_ptr(), lin.weight.detach().clone()
    with precision.in_float64([lin]):
        assert lin.weight.dtype == torch.float64
    assert lin.weight.data_ptr() == ptr and lin.weight.dtype == torch.float32 and torch.equal(lin.weight, before)


# -- power ----------------------------------------------------------------------------------------
def test_state_that_barely_moves_the_logits_is_inconclusive():
    """The recurrent state enters the logits with weight 1e-7: a consistent cache, but an error in
    that state would be a fraction of a fraction of the tolerance. Never OK."""
    toy = Toy(mix=1e-7)
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    assert not check.failures
    assert check.power.measured and check.power.weak == ["recurrent"]
    assert check.power.fraction("recurrent") > evidence.MIN_POWER
    assert check.word is INCONCLUSIVE and not check.passed
    assert "error in the recurrent state" in check.verdict  # the line names the state that lacked power
    with pytest.raises(AssertionError):
        assert_cache_consistent(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)


def test_state_that_matters_gives_power():
    toy = Toy(mix=1.0)
    check = check_cache_consistency(toy.step, tokens(), chunk_sizes=(16, 16, 16), full=toy.full)
    assert check.power.sufficient and check.power.fraction("recurrent") <= evidence.MIN_POWER
    assert "would see a" in check.verdict and check.passed


def test_power_not_measured_is_said():
    """A cache smearcli cannot see into (state kept elsewhere): the check cannot show it had power,
    so its agreement is no ok."""
    toy = Toy()
    store = {}

    def hidden_state(ids, cache):
        logits, st = toy.step(ids, None if cache is None else store["h"])
        store["h"] = st
        return logits, "opaque"
    check = check_cache_consistency(hidden_state, tokens(), chunk_sizes=(16, 32), full=toy.full)
    assert not check.power.measured and not check.passed and check.word == "inconclusive"
    assert check.verdict.endswith("but power not measured: the cache holds no floating-point tensor to perturb")


# -- Hugging Face models through the helper ---------------------------------------------------------
tf = pytest.importorskip("transformers")


def _hf_step(model):
    from smearcli.engines.transformers.api import cache_keyword

    kw = cache_keyword(model)

    def step(ids, cache):
        out = model(input_ids=ids, use_cache=True, **({kw: cache} if cache is not None else {}))
        return out.logits, getattr(out, kw, None) or cache

    def full(ids):
        return model(input_ids=ids, use_cache=False).logits
    return step, full


def _build(cfg):
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).float().eval()


def test_helper_raises_on_bamba_whose_decode_is_as_wrong_as_its_chunks():
    """A tiny Bamba at initializer_range 0.3: chunks of 16 are logits off the full pass, and so is
    decode; a floor taken from decode passed it."""
    cfg = tf.BambaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16,
                         mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16, initializer_range=0.3,
                         attn_layer_indices=[1])
    step, full = _hf_step(_build(cfg))
    ids = torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError) as err:
        assert_cache_consistent(step, ids, chunk_sizes=(16, 16, 16), full=full)
    msg = str(err.value)
    assert "noise floor (logits)" in msg.splitlines()[1] and "float64" in msg.splitlines()[1]
    assert "BUG: decode, chunked diverge" in msg and "keeps its size in float64" in msg


def test_helper_passes_a_consistent_llama():
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2)
    step, full = _hf_step(_build(cfg))
    ids = torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(0))
    check = assert_cache_consistent(step, ids, chunk_sizes=(16, 16, 16), full=full)
    assert check.passed and check.power.sufficient and check.noise.float64


def test_hf_check_model_inconclusive_does_not_pass(monkeypatch):
    from smearcli.measure import compare
    from smearcli.engines import transformers as hf

    weak = evidence.Power(24, 1.0, effects={"kv": 2.0})  # an error must be half the state's effect
    monkeypatch.setattr(compare, "measure_power", lambda *a, **k: weak)
    model, _ = hf.load("llama")
    c = hf.check_model(model, hf.random_tokens(model, 32), chunks=2)
    assert c.word is INCONCLUSIVE and c.passed is False
    assert "50% error in the kv state" in c.verdict


def test_the_float64_copy_is_shared_and_made_anew_after_a_weight_changes():
    lin = torch.nn.Linear(3, 3)
    first = precision.float64_model(lin)
    assert precision.float64_model(lin) is first  # every runner of one model shares it
    with torch.no_grad():
        lin.weight.add_(1.0)  # a training step between two checks
    again = precision.float64_model(lin)
    assert again is not first and torch.equal(again.weight, lin.weight.double())


def test_the_float64_copy_converts_the_weights_themselves_exactly():
    """`float64_model` converts each weight straight to float64 (no float32 copy first): the same
    tensors, bit for bit, as `deepcopy(model).double()`, a tied weight still one tensor, the
    original untouched, and a stale float64 copy kept on the model not copied into the new one."""
    import copy

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(3)
            self.emb = torch.nn.Embedding(V, 8)
            self.emb.weight.data = torch.randn(V, 8, generator=g).to(torch.bfloat16).float()
            self.head = torch.nn.Linear(8, V, bias=True)
            self.head.weight = self.emb.weight  # tied, as many LMs are
            self.register_buffer("table", torch.randn(5, generator=g).half())
            self.register_buffer("steps", torch.arange(4))  # not floating point: left as it is

    model = Tied()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = copy.deepcopy(model).double()
    m64 = precision.float64_model(model)
    got, want = m64.state_dict(), expected.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert m64.steps.dtype == torch.int64 and m64.table.dtype == torch.float64
    assert m64.head.weight is m64.emb.weight and m64.emb.weight is not model.emb.weight
    assert isinstance(m64.head.weight, torch.nn.Parameter)
    assert all(torch.equal(model.state_dict()[k], v) and model.state_dict()[k].dtype == v.dtype
               for k, v in before.items())
    with torch.no_grad():
        model.head.bias.add_(1.0)  # a weight changed: made anew
    again = precision.float64_model(model)
    assert again is not m64 and again.__dict__.get("_float64_copy") is None  # the stale copy not copied
    assert torch.equal(again.head.bias, model.head.bias.double())


def test_our_float64_twin_shares_its_lookup_tables_and_computes_the_same_numbers():
    """Our GPT's embedding tables (`GPT.lookup_tables`) are only indexed, each row converted to the
    compute dtype: the float64 twin shares them instead of copying (most of a d12 twin's memory and
    time) and its lifted full pass is, bit for bit, a whole float64 copy's; the original keeps its
    float32 tables."""
    import copy

    from smearcli.gpt.gpt_runners import GPTRunner, runners
    from smearcli.measure.precision import lifted
    from smearcli.measure.schedules import run_schedule
    from smearcli.gpt.weights import preset_model

    model = preset_model("small").model
    tables = model.lookup_tables()
    assert {id(t) for t in tables} == {id(model.transformer.wte.weight)} | {
        id(ve.weight) for ve in model.value_embeds.values()} and len(tables) > 1
    twin = runners(model, ["old"])[0].float64()
    assert all(a is b for a, b in zip(twin.model.lookup_tables(), tables))
    assert twin.model.lm_head.weight.dtype == torch.float64 and tables[0].dtype == torch.float32
    whole = copy.deepcopy(model).double()
    whole.dtype, whole._rotary_device = torch.float64, None
    tokens = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with lifted():
        got = run_schedule(twin, tokens, "full", capture=True)
        want = run_schedule(GPTRunner(whole, "old", "model", None), tokens, "full", capture=True)
    assert torch.equal(got.logits, want.logits)
    assert all(torch.equal(a, b) for a, b in zip(got.hiddens, want.hiddens))
    assert all(t.dtype == torch.float32 for t in model.parameters())


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_a_reference_is_unusable_exactly_when_a_logit_is_not_finite(bad):
    """`unusable` answers from one reduction when every logit is finite, and otherwise counts the
    positions with a non-finite logit as the whole-tensor mask does."""
    from smearcli.measure.steps import RunResult

    logits = torch.randn(2, 6, V, generator=torch.Generator().manual_seed(1)) * 1e30
    if bad is not None:
        logits[1, 4, 7] = logits[0, 4, 2] = logits[0, 1, 0] = bad
    why = evidence.unusable(RunResult("full", "old", logits, None, [6], [0, 1]))
    if bad is None:
        assert why is None
    else:
        assert why is not None and "at 2 of 6 positions" in why


def test_a_plain_step_rerun_is_confirmed_step_by_step_with_the_same_number(monkeypatch):
    """A confirmation of chunked or speculative measures the float64 rerun against the full pass a
    step at a time (no float64 tensor of the whole rerun: at d12 / 1024 tokens 537 MB): the same
    lifted size and status as rerunning it whole. An engine run is still rerun whole."""
    from smearcli.gpt import gpt_runners
    from smearcli.measure import schedules
    from smearcli.measure.steps import ScheduleOptions
    from smearcli.gpt.weights import random_config, random_model

    model = random_model(random_config(1), seed=2).model
    toks = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    old = gpt_runners.GPTRunner(model, "old")
    opts = ScheduleOptions(chunk_sizes=(10, 4, 10), gen_len=8, draft=3)
    f64 = evidence.Float64(old, toks, capture=False)
    real, whole = schedules.run_schedule, []
    monkeypatch.setattr(schedules, "run_schedule", lambda r, t, s, **k: whole.append(s) or real(r, t, s, **k))
    for schedule in ("chunked", "speculative", "engine"):
        streamed = evidence.Confirmer(old, toks, f64).schedule(schedule, opts, 0.5)
        rerun = evidence.Confirmer(old, toks, f64)(lambda r: real(r, toks, schedule, opts=opts, capture=False), 0.5)
        assert (streamed.lifted, streamed.status, streamed.why) == (rerun.lifted, rerun.status, rerun.why)
        assert streamed.lifted > 0.1 if schedule != "engine" else streamed.lifted < 1e-9  # old departs at chunks
    assert whole == ["full", "engine"]  # the float64 full pass, made once; the engine, rerun whole
