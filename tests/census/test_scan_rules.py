"""The rules a finding must pass before the census calls it a bug (issue 42), each held with a
stand-in model: the reference checked first (a full pass that reads later tokens is the finding,
and no cached path is blamed for it)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_standin import ShiftConfig, ShiftLM  # noqa: E402
from smearcli.engines.transformers import causal  # noqa: E402
from smearcli.measure import shapes  # noqa: E402
from smearcli.census import record  # noqa: E402
from smearcli.census.record import BornIn  # noqa: E402
from smearcli.engines.transformers.check import check_model, split_points  # noqa: E402
from smearcli.judging.verdicts import BUG, OK, UNCONFIRMED  # noqa: E402

T = 33


class PeekLM(ShiftLM):
    """The shift stand-in whose full pass also mixes in the next token's embedding: every position
    reads one token ahead (a causal LM that is not causal), its cached steps carry their state."""

    def forward(self, input_ids=None, cache=None, use_cache=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        out = super().forward(input_ids=input_ids, cache=cache, use_cache=use_cache,
                              output_hidden_states=output_hidden_states)
        if input_ids.size(1) > 1:
            ahead = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1)
            out.logits = out.logits + self.head(self.embed(ahead))
        return out


def model(cls, seed=0):
    torch.manual_seed(seed)
    return cls(ShiftConfig()).eval()


def tokens(seed=0, vocab=64):
    return torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


def test_a_full_pass_that_reads_ahead_is_the_finding_and_no_cached_path_is_blamed():
    m, ids = model(PeekLM), tokens()
    out = check_model(m, ids, split_points(m.config, T))
    assert out["verdict"] == BUG and out["shape"] == shapes.LEAK, out
    assert out["confirmation"]["status"] == BUG
    cut = T - min(causal.CHANGED, T // 4)  # the tokens from `cut` on were changed
    assert out["born_at"] == f"logits@{cut - 1}"  # position cut-1 reads token cut, no earlier one
    how = [h for h in ("removed", "changed") if any(f"tokens {h}" in n for n in out["notes"])]
    assert len(how) == 1 and out["worst_schedule"] == shapes.leak_schedule(how[0])  # the probe that moved it
    assert not out.get("schedules") and not out.get("boundaries")  # no cached schedule judged
    assert any("the reference is not causal" in n for n in out["notes"])
    assert out["born_in"].module  # where the leak starts: a module whose inputs agree before cut


def test_a_causal_full_pass_passes_the_reference_check():
    m, ids = model(ShiftLM), tokens()
    from smearcli.engines.transformers.cache_runner import CacheRunner, full_run

    runner = CacheRunner(m)
    ref = full_run(runner, ids)
    assert causal.leak(runner, ids, ref, 1e-6) is None
    assert check_model(m, ids, split_points(m.config, T))["verdict"] == OK


# -- ties: a top-k whose choice is an exact tie is not a logic error ------------------------------
class TieLM(ShiftLM):
    """The shift stand-in plus a top-k over scores that are exactly 0 for most keys (a ReLU): each
    position adds the embeddings its top-2 visible keys select. Which of several tied keys a top-k
    returns is the kernel's business (`kernel` below stands in for one that breaks ties one way on
    a single query row, the other way on many): the full pass and a decode step pick differently."""

    def forward(self, input_ids=None, cache=None, use_cache=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        past = getattr(cache, "ids", None) if cache is not None else None
        out = super().forward(input_ids=input_ids, cache=cache, use_cache=use_cache,
                              output_hidden_states=output_hidden_states)
        held = input_ids if past is None else torch.cat([past, input_ids], 1)
        if use_cache:
            (out.cache if hasattr(out, "cache") else out.past_key_values).ids = held
        e = self.embed(held)  # (1, S, C)
        S, n = held.size(1), input_ids.size(1)
        scores = torch.relu(e[..., 0] - 1).expand(n, S).clone()  # exactly 0 for most keys
        q = torch.arange(S - n, S).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(S).unsqueeze(0) > q, -1.0)  # below every visible key
        k = min(2, S)
        idx = torch.topk(scores, k, dim=-1).indices
        seen = (idx <= q).unsqueeze(-1)  # a future key picked where fewer than k are visible: left out
        out.logits = out.logits + self.head((e[0][idx] * seen).sum(1) / 2).unsqueeze(0)
        return out


REAL_TOPK = torch.topk


def kernel(input, k, dim=-1, largest=True, sorted=True, **kw):
    """A top-k whose tie-break depends on the shape, as a kernel's may: on one query row, among
    equal values the higher index wins; on many, the lower."""
    flip = input.dim() == 2 and input.size(0) == 1 and dim in (-1, 1)
    x = input.flip(-1) if flip else input
    vals, idx = torch.sort(x, dim=dim, descending=largest, stable=True)
    vals, idx = vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)
    return torch.return_types.topk((vals, input.size(-1) - 1 - idx if flip else idx))


@pytest.fixture
def shape_dependent_ties(monkeypatch):
    from smearcli.measure import topk

    monkeypatch.setattr(torch, "topk", kernel)
    monkeypatch.setattr(torch.Tensor, "topk", lambda self, *a, **kw: kernel(self, *a, **kw))
    monkeypatch.setattr(topk, "_TOPK", kernel)  # what `watching` calls through


def test_ties_are_seen_and_broken_the_same_way_everywhere():
    from smearcli.engines.transformers import ties

    with ties.watching() as seen:
        torch.topk(torch.tensor([[0.0, 0.0, 1.0]]), 2)  # 1.0, then two zeros for one place
        torch.tensor([[3.0, 2.0, 1.0]]).topk(1)
    assert (seen.calls, seen.ties) == (2, 1)
    with ties.tie_break():
        assert torch.tensor([0.0, 5.0, 0.0, 0.0]).topk(2).indices.tolist() == [1, 0]  # the lower index
    assert torch.topk is REAL_TOPK  # put back


def test_a_departure_that_a_tie_break_removes_is_a_tie_artifact(shape_dependent_ties):
    from smearcli.engines.transformers import ties

    m, ids = model(TieLM), tokens()
    plans = {"decode": [1] * T, "chunks of 8": [8] * 4 + [1]}
    with ties.watching() as seen:
        first = check_model(m, ids, plans)
    assert first["verdict"] == BUG and seen.ties > 0  # what the census called a bug before the rule

    def rerun(seed, broke):
        with ties.tie_break() if broke else ties.watching() as s:
            out = check_model(model(TieLM, seed), tokens(seed), plans)
        out["_ties"] = getattr(s, "ties", 0)
        return out
    out = ties.replicate(first, seen.ties, rerun, 0)
    assert out["verdict"] == ties.TIE_ARTIFACT, out["notes"]
    assert out["replication"]["ties"] == seen.ties and out["replication"]["tie_break"]["verdict"] == OK
    assert any(n.startswith("a tie artifact") for n in out["notes"])


def test_a_real_departure_survives_the_tie_break_and_the_second_seed():
    from smearcli.engines.transformers import ties

    broken = ShiftLM(ShiftConfig(bug_layer=0)).eval()  # a multi-token step drops its state
    calls = []

    def rerun(seed, broke):
        calls.append((seed, broke))
        torch.manual_seed(seed)
        mm = ShiftLM(ShiftConfig(bug_layer=0)).eval()
        return check_model(mm, tokens(seed), {"chunks of 8": [8] * 4 + [1]})
    first = check_model(broken, tokens(), {"chunks of 8": [8] * 4 + [1]})
    assert first["verdict"] == BUG
    out = ties.replicate(first, 0, rerun, 0)
    assert out["verdict"] == BUG and calls == [(1, False)]  # no tie: the second seed alone
    assert out["replication"]["second_seed"]["verdict"] == BUG
    fixed = ties.replicate(check_model(broken, tokens(), {"chunks of 8": [8] * 4 + [1]}), 0,
                           lambda s, b: {"verdict": OK, "notes": []}, 0)
    assert fixed["verdict"] == UNCONFIRMED and "not replicated" in fixed["notes"][-1]


# -- the default head and expert counts: a departure the tiny config's shrinking made is no bug ---
class CountsConfig(ShiftConfig):
    """The shift stand-in with head and expert counts: its defaults are large (as a real config's),
    and it refuses more experts per token than experts (as a router's top-k would)."""
    model_type = "smearcli_counts_standin"

    def __init__(self, num_attention_heads=16, num_key_value_heads=8, num_experts=64, num_experts_per_tok=8,
                 index_topk=2048, head_dim=None, num_hidden_layers=4, **kw):
        if num_experts_per_tok > num_experts:
            raise ValueError(f"num_experts_per_tok {num_experts_per_tok} > num_experts {num_experts}")
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.num_experts, self.num_experts_per_tok, self.index_topk = num_experts, num_experts_per_tok, index_topk
        self.head_dim = head_dim
        super().__init__(num_hidden_layers=num_hidden_layers, **kw)


def tiny_counts():
    """A `CountsConfig` derived the way the census derives every config, and what it changed."""
    from smearcli.tiny import derive

    d = {k: v for k, v in CountsConfig().to_dict().items() if k not in ("transformers_version", "architectures")}
    small, changed, _ = derive.shrink(d)
    return CountsConfig(**small), changed


def test_derivation_says_which_counts_it_shrank_and_they_come_back_within_the_bound():
    from smearcli.tiny import derive

    cfg, changed = tiny_counts()
    shrunk = derive.shrunk_counts(changed)
    assert shrunk["attention heads"] == {"num_attention_heads": (16, derive.HEADS)}
    assert shrunk["key/value heads"] == {"num_key_value_heads": (8, 2)}
    assert shrunk["experts"] == {"num_experts": (64, 4), "num_experts_per_tok": (8, 2)}  # one router
    assert "num_hidden_layers" in changed and all("num_hidden_layers" not in v for v in shrunk.values())
    sizes = []

    def size(c):  # a stand-in parameter count: 1M per head, 10k per expert
        sizes.append(c.num_attention_heads)
        return c.num_attention_heads * 1_000_000 + c.num_experts * 10_000
    got = derive.default_counts(cfg, changed, size, 49, bound=20_000_000)
    assert got.restored == {"num_attention_heads": (4, 16), "num_key_value_heads": (2, 8),
                            "num_experts": (4, 64), "num_experts_per_tok": (2, 8)}
    assert (got.config.num_attention_heads, got.config.num_experts, got.config.num_experts_per_tok) == (16, 64, 8)
    assert got.config.head_dim == derive.HEAD_DIM and got.config.hidden_size == cfg.hidden_size  # heads stay narrow
    assert cfg.num_attention_heads == derive.HEADS  # the tiny config itself is left as it was
    assert "2048" in got.skipped["indexer top-k"] and "choose nothing" in got.skipped["indexer top-k"]
    assert got.words().startswith("num_attention_heads 4 -> 16")
    small = derive.default_counts(cfg, changed, size, 49, bound=10_000_000)  # 16 heads: 16M, over 10M
    assert "over the bound of 10M" in small.skipped["attention heads"] and small.config.num_attention_heads == 4
    assert small.config.num_experts == 64  # the next count is still restored
    assert derive.default_counts(cfg, changed, size, 4096).restored["index_topk"] == (8, 2048)  # a long input


def test_a_count_the_config_class_refuses_is_skipped_with_its_reason():
    from smearcli.tiny import derive

    cfg, changed = tiny_counts()
    changed = {k: v for k, v in changed.items() if k != "num_experts"}  # experts not shrunk: 8 of 4 per token
    got = derive.default_counts(cfg, changed, lambda c: 1, 49)
    assert "refuses the defaults: ValueError: num_experts_per_tok 8 > num_experts 4" in got.skipped["experts"]
    assert "num_experts" not in got.restored and got.restored["num_attention_heads"] == (4, 16)


def counts_rerun(bug_below: int):
    """`check._check`'s rerun for the counts stand-in: the seed's weights and tokens, and a model
    that drops its state on multi-token steps while it has fewer than `bug_below` heads."""
    plans = {"chunks of 8": [8] * 4 + [1]}
    calls = []

    def rerun(seed, broke, config=None):
        calls.append((seed, broke, config is not None))
        cfg = config or tiny_counts()[0]
        torch.manual_seed(seed)
        m = ShiftLM(ShiftConfig(bug_layer=0 if cfg.num_attention_heads < bug_below else -1)).eval()
        return check_model(m, tokens(seed), plans)
    return rerun, plans, calls


def test_a_departure_gone_at_the_default_counts_is_not_replicated_and_one_that_stays_is_a_bug():
    from smearcli.tiny import derive
    from smearcli.engines.transformers import ties
    from smearcli.tiny.derive import parameters

    cfg, changed = tiny_counts()
    defaults = derive.default_counts(cfg, changed, lambda c: 1, 49)
    for bug_below, want in ((8, UNCONFIRMED), (10_000, BUG)):  # 4 heads break it; or any count does
        rerun, plans, calls = counts_rerun(bug_below)
        first = rerun(0, False)
        assert first["verdict"] == BUG
        out = ties.replicate(first, 0, rerun, 0, defaults)
        assert out["verdict"] == want and calls[1:] == [(1, False, False), (0, False, True)], (out["notes"], calls)
        got = out["replication"]["default_counts"]
        assert got["restored"]["num_attention_heads"] == [4, 16] and got["ties"] == 0
        assert got["rerun"]["verdict"] == (OK if want == UNCONFIRMED else BUG)
        if want == UNCONFIRMED:
            assert out["notes"][-1].startswith("not replicated: at the default head/expert counts "
                                               "(num_attention_heads 4 -> 16, "), out["notes"]
        else:
            assert out["notes"][-1].startswith("replicated at the default head/expert counts (")
    # ties seen at the default counts: a departure that vanishes there is a tie artifact
    rerun, plans, calls = counts_rerun(8)

    def tied(seed, broke, config=None):
        out = rerun(seed, broke, config)
        out["_ties"] = 3 if config is not None else 0
        return out
    out = ties.replicate(rerun(0, False), 0, tied, 0, defaults)
    assert out["verdict"] == ties.TIE_ARTIFACT and out["replication"]["default_counts"]["ties"] == 3
    assert "at the default head/expert counts" in out["notes"][-1]
    llama = derive.derive("llama").config  # the bound's count: the model built on the meta device
    assert parameters(llama) == sum(p.numel() for p in census_model("llama").parameters()) > 0


def test_a_rerun_that_cannot_run_at_the_default_counts_leaves_the_bug_and_says_why():
    from smearcli.tiny import derive
    from smearcli.engines.transformers import ties

    cfg, changed = tiny_counts()
    defaults = derive.default_counts(cfg, changed, lambda c: 1, 49)
    rerun, plans, _ = counts_rerun(10_000)

    def refuses(seed, broke, config=None):  # what `check.recheck(safe=True)` returns for a model that raises
        if config is not None:
            return {"verdict": "crashed", "notes": [], "_ties": 0, "reason": "RuntimeError: shapes"}
        return rerun(seed, broke)
    out = ties.replicate(rerun(0, False), 0, refuses, 0, defaults)
    assert out["verdict"] == BUG and out["replication"]["default_counts"]["reason"] == "RuntimeError: shapes"
    assert "could not be checked at the default head/expert counts" in out["notes"][-1]
    none = ties.replicate(rerun(0, False), 0, rerun, 0, derive.Counts())  # nothing shrunk: no rerun
    assert none["verdict"] == BUG and "rerun" not in none["replication"]["default_counts"]
    assert "no head or expert count was shrunk" in none["notes"][-1]


# -- the right shape and the right line -----------------------------------------------------------
def test_a_cache_that_misreports_its_length_is_named_so():
    from test_scan_reach import ReachConfig, ReachLM

    from smearcli.measure import shapes

    torch.manual_seed(0)
    m = ReachLM(ReachConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                            layer_types=["linear_attention", "full_attention"])).eval()
    out = check_model(m, tokens(), {"chunks of 8": [8] * 4 + [1], "decode": [1] * T})
    assert out["verdict"] == BUG and out["shape"] == shapes.LENGTH, out
    assert any("ReachCache.get_seq_length() is 0 after " in n for n in out["notes"])
    torch.manual_seed(0)  # attention first: the length is right, and so is everything else
    m = ReachLM(ReachConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2)).eval()
    from smearcli.engines.transformers import diagnose
    assert diagnose.misreported(m, tokens(), [8] * 4 + [1]) is None


def test_a_departure_at_the_window_on_every_cached_schedule():
    from types import SimpleNamespace as M

    from smearcli.engines.transformers import diagnose
    from smearcli.measure import shapes

    # moshi on 5.24: each cached schedule departs first at its first step that starts once the cache
    # holds the window (8): decode at 8, chunks of 16 at 16, a prefill of T-6 at T-6
    plans = {"decode": [1] * T, "prefill": [T], "chunks of 16": [16, 16, 1],
             "prefill, then single tokens": [T - 6] + [1] * 6, "widths 7,8,9": [7, 8, 9, 9]}
    every = {"decode": M(passed=False, first_departure=(0, 8)), "prefill": M(passed=True, first_departure=None),
             "chunks of 16": M(passed=False, first_departure=(1, 16)),
             "prefill, then single tokens": M(passed=False, first_departure=(0, T - 6)),
             "widths 7,8,9": M(passed=False, first_departure=(1, 15))}
    assert "holds the sliding window (8 tokens)" in diagnose.window_edge(every, plans, 8)
    assert diagnose.window_edge(every, plans, None) is None  # no window: nothing to line up with
    one_off = dict(every, **{"chunks of 16": M(passed=False, first_departure=(0, 9))})
    assert diagnose.window_edge(one_off, plans, 8) is None
    one_passes = dict(every, **{"chunks of 16": M(passed=True, first_departure=None)})
    assert diagnose.window_edge(one_passes, plans, 8) is None
    dropped = dict(every, decode=M(passed=False, first_departure=(0, 1)))  # state dropped: at the first step
    assert diagnose.window_edge(dropped, plans, 8) is None
    assert shapes.classify([0.0] * T, [1] * T, 1e-6, decode_fails=True, chunks_pass=True,
                           window_edge=True) == shapes.WINDOW_EDGE
    assert shapes.classify([0.0] * T, [1] * T, 1e-6, fixed_by="position_ids", length=True) == shapes.LENGTH


def test_the_born_in_lines_are_those_of_the_state_the_replay_zeroed():
    from smearcli.engines.transformers import born

    conv = [535, "if conv_state is not None and seq_len == 1:", "a branch on a one-token step"]
    scan = [584, "if recurrent_state is not None and seq_len == 1:", "a branch on a one-token step"]
    b = born.narrow(BornIn("m", suspects=[conv, scan]), ["recurrent"])
    assert b.suspects == [scan] and "recurrent state" in b.cause
    assert born.narrow(BornIn("m", suspects=[conv, scan]), ["conv"]).suspects == [conv]
    assert born.narrow(BornIn("m", suspects=[conv]), []).suspects == [conv]  # no replay: as found


# -- reachability: the finding through generate ---------------------------------------------------
def census_model(model_type, seed=0):
    from smearcli.engines.transformers.check import build
    from smearcli.tiny.derive import derive

    return build(derive(model_type).config, None, seed)


def test_reachability_says_what_generate_does_on_each_path():
    from smearcli.engines.transformers import reach

    m, a = census_model("llama"), census_model("llama", 1)
    ids = tokens(vocab=256)
    clean = reach.paths(m, ids, 1e-4, a)
    assert {e.result for e in clean.values()} == {reach.AGREES}, clean
    real = m.forward

    def wrong(*args, **kw):  # a multi-token step onto a cache that holds tokens: its logits shifted
        out = real(*args, **kw)
        cache = kw.get("cache", kw.get("past_key_values"))
        ids = kw.get("input_ids", args[0] if args else None)
        if cache is not None and cache.get_seq_length() > ids.size(1) and ids.size(1) > 1:
            out.logits = out.logits + 1.0
        return out
    m.forward = wrong
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    # chunks of 16, 16 and 8: the last one, whose logits generate returns, lands on a cache
    got = reach.paths(m, ids, 1e-4, a)
    assert got["generate"].result == reach.AGREES  # prefill, then one token at a time
    assert got["prefill_chunk_size"].result == reach.SILENT and got["prefill_chunk_size"].max_abs >= 0.5
    assert got["assistant model"].result == reach.SILENT  # the verify steps hold several tokens
    assert reach.summary(got) == reach.SILENT and "prefill_chunk_size: silently wrong" in reach.words(got)
    assert reach.paths(m, ids, 1e-4)["assistant model"].result == reach.NOT_RUN


def test_generate_raising_first_and_refusing_are_told_apart():
    from smearcli.engines.transformers import reach

    got = reach.paths(census_model("mamba"), tokens(vocab=256), 1e-4, census_model("mamba", 1))
    assert got["assistant model"].result == reach.REFUSED  # generate: "not supported with stateful models"
    assert "stateful" in got["assistant model"].why
    assert got["prefill_chunk_size"].result == reach.RAISES  # inside the cache, not generate's check
    assert "get_seq_length" in got["prefill_chunk_size"].why


def leaking(m, how):
    """`m` whose uncached multi-token forward (the full pass, generate's prompt pass) leaks: "peek"
    adds the next token's one-hot to each position's logits (which tokens follow), "length" adds
    0.01 per token in the call (how many follow); cached steps are untouched."""
    import torch.nn.functional as F

    real = m.forward

    def forward(*args, **kw):
        out = real(*args, **kw)
        ids = kw.get("input_ids", args[0] if args else None)
        cache = kw.get("cache", kw.get("past_key_values"))
        if ids.size(1) > 1 and (cache is None or cache.get_seq_length() == ids.size(1)):
            if how == "peek":
                ahead = torch.cat([ids[:, 1:], ids[:, -1:]], 1)
                out.logits = out.logits + F.one_hot(ahead, out.logits.size(-1)).to(out.logits.dtype)
            else:
                out.logits = out.logits + 0.01 * ids.size(1)
        return out
    m.forward = forward
    return m


def test_a_leak_says_who_runs_the_full_pass_that_leaks():
    from smearcli.engines.transformers import reach

    ids = tokens(vocab=256)
    clean = reach.leak_paths(census_model("llama"), ids, 1e-4)
    assert list(clean) == list(reach.LEAK_PATHS) and {e.result for e in clean.values()} == {reach.AGREES}, clean
    assert "prefill_chunk_size=1" in clean["generate"].why  # the causal run it is held against
    peek = reach.leak_paths(leaking(census_model("llama"), "peek"), ids, 1e-4, "cpmant")
    assert {e.result for e in peek.values()} == {reach.SILENT}, peek
    assert peek["full pass"].max_abs == pytest.approx(1.0, abs=0.01)  # one one-hot moved
    assert peek["full pass"].why.startswith(reach.DESIGN["cpmant"])  # their design, said where it is theirs
    assert "depend on" not in peek["full pass"].why  # removed and changed both move it
    m = leaking(census_model("llama"), "peek")
    m.config.causal = False  # a config that declares itself not causal (XLM's default)
    said = reach.leak_paths(m, ids, 1e-4, "llama")["full pass"].why
    assert said.startswith("by configuration: LlamaConfig.causal is False"), said
    assert reach.design("llama", census_model("llama").config) is None
    length = reach.leak_paths(leaking(census_model("llama"), "length"), ids, 1e-4)
    assert length["full pass"].result == reach.SILENT and length["generate's prompt pass"].result == reach.SILENT
    assert "how many tokens follow, not on which" in length["full pass"].why
    assert length["full pass"].max_abs == pytest.approx(0.01 * min(causal.CHANGED, T // 4), rel=1e-3)
    assert "full pass: silently wrong" in reach.words(length) and reach.summary(length) == reach.SILENT
    from smearcli.engines.transformers import draft

    lead = draft.reach_section(length, leak=True)
    assert lead[0].startswith("**Through the public API** (who runs the full pass that leaks")
    assert "greedy `generate`, compared" in draft.reach_section(clean_paths())[0]  # a cache's finding: as before


def clean_paths():
    from smearcli.engines.transformers import reach

    return reach.entries({k: {"result": reach.AGREES, "max_abs": 0.0, "why": None} for k in reach.PATHS})


def test_the_draft_leads_with_reachability_and_the_table_says_it(tmp_path):
    from smearcli.engines.transformers import draft, reach
    from smearcli.census import report

    rec = record.new("x", "bug", worst_schedule="chunks of 16", steps=[16, 16, 1],
                     max_abs=0.5, shape="state dropped at chunk starts", notes=[],
                     reach={"generate": {"result": reach.AGREES, "max_abs": 0.0, "why": None},
                            "prefill_chunk_size": {"result": reach.SILENT, "max_abs": 0.5, "why": None},
                            "assistant model": {"result": reach.REFUSED, "max_abs": None, "why": "stateful"}})
    text = draft.write(rec, tmp_path / "x.md", {"transformers": "t"}).read_text().splitlines()
    lead = text.index(next(line for line in text if line.startswith("**Through the public API**")))
    assert lead < next(i for i, line in enumerate(text) if line.startswith("Shape of the error"))
    assert "- `prefill_chunk_size`: **silently wrong**, max |dlogit| 0.5" in text
    assert "- `assistant model`: **refused**: stateful" in text
    md = report.markdown([rec])
    assert "| public API |" in md and f"| {reach.SILENT} |" in md


@pytest.mark.slow  # two reproducers in isolated Pythons, each importing transformers (20-80 s)
def test_a_leak_has_a_reproducer_that_exits_1_and_0_on_a_causal_full_pass(tmp_path):
    """A leak finding is a bug only with a reproducer that shows it without smearcli (issue 42):
    the leak template exits 1 on prophetnet (its ngram attention moves earlier positions when the
    last tokens go) and 0 on llama, whose full pass is causal."""
    from smearcli.engines.transformers import repro
    from smearcli.census.record import new as record
    from smearcli.tiny.derive import derive

    for model_type, want in (("prophetnet", 1), ("llama", 0)):
        rec = record(model_type, BUG, worst_schedule=shapes.leak_schedule("removed"), steps=[41, 8], max_abs=0.0054,
                     shape=shapes.LEAK, born_at="logits@0")
        path = repro.write(rec, derive(model_type).config, tmp_path / f"{model_type}.py")
        status, line = repro.run(path)
        assert status == want, (model_type, line)
        assert "import smearcli" not in path.read_text() and "CUT = T - CHANGED" in path.read_text()


# -- one report per cause across declared copies --------------------------------------------------
def fake_transformers(tmp_path):
    """A stand-in transformers package: Beta's mixer is `# Copied from` Alpha's, Gamma's modular file
    inherits Beta's, Delta copies Alpha's `forward` only, and Omega's mixer copies nothing."""
    files = {
        "alpha/modeling_alpha.py": "class AlphaMixer(nn.Module):\n    def forward(self, x):\n        return x\n",
        "beta/modeling_beta.py": "import torch\n\n\n# Copied from transformers.models.alpha.modeling_alpha.AlphaMixer "
                                 "with Alpha->Beta\nclass BetaMixer(nn.Module):\n    def forward(self, x):\n"
                                 "        return x + 0\n",
        "gamma/modeling_gamma.py": "class GammaMixer(nn.Module):\n    def forward(self, x):\n        return x * 1\n",
        "gamma/modular_gamma.py": "from ..beta.modeling_beta import BetaMixer as Base\nfrom ..alpha.configuration_alpha "
                                  "import AlphaConfig\n\n\nclass GammaMixer(Base):\n    pass\n",
        "delta/modeling_delta.py": "class DeltaMixer(nn.Module):\n    def __init__(self):\n        pass\n\n"
                                   "    # Copied from transformers.models.alpha.modeling_alpha.AlphaMixer.forward\n"
                                   "    def forward(self, x):\n        return x\n",
        "omega/modeling_omega.py": "class OmegaMixer(nn.Module):\n    def forward(self, x):\n        return -x\n",
    }
    for rel, text in files.items():
        path = tmp_path / "transformers" / "models" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "transformers")


def finding(name, cls, shape="state dropped at chunk starts", copies=None):
    return record.bare(name, BUG, shape=shape, born_in={
        "module": "layers.0.mixer", "class": cls, "file": f"transformers/models/{name}/modeling_{name}.py",
        "lines": [1, 3], "code": f"digest-{name}", "suspects": [], **({"copies": copies} if copies else {})})


def test_declared_copies_are_read_through_chains(tmp_path):
    from smearcli.engines.transformers import groups

    root = fake_transformers(tmp_path)
    where = lambda name: f"transformers/models/{name}/modeling_{name}.py"
    assert groups.copies(where("beta"), "BetaMixer", root) == ["alpha.AlphaMixer"]
    assert groups.copies(where("gamma"), "GammaMixer", root) == ["beta.BetaMixer", "alpha.AlphaMixer"]  # nearest first
    assert groups.copies(where("delta"), "DeltaMixer", root) == ["alpha.AlphaMixer"]  # its forward is the copy
    assert groups.copies(where("omega"), "OmegaMixer", root) == []
    assert groups.copies(where("alpha"), "AlphaMixer", root) == []
    assert groups.copies("elsewhere.py", "AlphaMixer", root) == []  # not a model's file


def test_findings_born_in_declared_copies_are_one_cause(tmp_path):
    from smearcli.engines.transformers import groups

    root = fake_transformers(tmp_path)
    recs = [finding(n, c, copies=groups.copies(f"transformers/models/{n}/modeling_{n}.py", c, root))
            for n, c in (("alpha", "AlphaMixer"), ("beta", "BetaMixer"), ("gamma", "GammaMixer"),
                         ("omega", "OmegaMixer"))]
    got = {tuple(g["architectures"]): g for g in groups.groups(recs)}
    assert set(got) == {("alpha", "beta", "gamma"), ("omega",)}, list(got)  # different digests, no shared line
    assert got[("alpha", "beta", "gamma")]["by"].startswith("declared copies of the same code")
    other_shape = [recs[0], dataclasses.replace(recs[1], shape="decode path differs")]  # a copy that breaks another way
    assert [g["architectures"] for g in groups.groups(other_shape)] == [["alpha"], ["beta"]]
    # two copies of a class that is no finding are not one cause: what they changed may be it
    assert [g["architectures"] for g in groups.groups(recs[1:3] + [recs[3]])] == [["beta", "gamma"], ["omega"]]
    assert [g["architectures"] for g in groups.groups([recs[2], recs[3]])] == [["gamma"], ["omega"]]


def test_a_group_of_declared_copies_is_headed_by_the_original():
    """The row, draft and reproducer of a group of declared copies are the original's (the class the
    others copy, which copies none of theirs), though another member comes first by name."""
    from smearcli.engines.transformers import groups

    def rec(name, model, cls, copies):
        r = finding(name, cls, copies=copies)
        r.born_in.file = f"transformers/models/{model}/modeling_{model}.py"
        return dataclasses.replace(r, reproducer=f"{name}.py", report_draft=f"{name}.md")

    recs = [rec("a_copy", "beta", "BetaMixer", ["alpha.AlphaMixer"]),
            rec("b_copy", "gamma", "GammaMixer", ["beta.BetaMixer", "alpha.AlphaMixer"]),
            rec("z_original", "alpha", "AlphaMixer", [])]
    [g] = groups.groups(recs)
    assert g["architectures"] == ["a_copy", "b_copy", "z_original"]  # listed by name
    assert (g["first"], g["reproducer"], g["report_draft"]) == ("z_original", "z_original.py", "z_original.md")
    assert g["code"].startswith("AlphaMixer.forward")
    # without Alpha's finding, the class the other copies heads it: Beta's, which Gamma copies
    [g] = groups.groups(recs[1::-1])
    assert g["first"] == "a_copy" and g["code"].startswith("BetaMixer.forward")


def test_a_rerun_at_other_counts_reports_what_the_model_refuses_instead_of_raising():
    from smearcli.engines.transformers.check import recheck

    class Unbuilt(ShiftConfig):  # a model type no test registers: the stand-in's own may be, by another test
        model_type = "smearcli_unbuilt_standin"

    cfg = Unbuilt()  # no AutoModelForCausalLM builds it: what a refused count looks like to recheck
    got = recheck(cfg, None, 0, False, T, 64, {"decode": [1] * T}, 1.0, safe=True)
    assert got["verdict"] == "not built" and got["reason"].startswith("the model cannot be built: ")
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        recheck(cfg, None, 0, False, T, 64, {"decode": [1] * T}, 1.0)  # the architecture's own config: its crash


def test_an_lm_head_sized_apart_from_the_embedding_shrinks_with_it():
    """Inkling-2 sizes its LM head by `unpadded_vocab_size` (200058), its embedding by `vocab_size`:
    shrinking only the embedding's left a head of 200058 logits, generate picked ids past the
    embedding's 256, and every generate path raised an IndexError of our config's making (5.24's
    census called it inkling2_text's crash)."""
    from smearcli.tiny import derive

    small, changed, _ = derive.shrink({"vocab_size": 200064, "unpadded_vocab_size": 200058, "hidden_size": 1024})
    assert small["vocab_size"] == small["unpadded_vocab_size"] == derive.VOCAB
    assert changed["unpadded_vocab_size"] == (200058, derive.VOCAB)


def test_a_bar_in_a_reason_reads_as_written_and_keeps_the_tables_cells():
    """Every page's cells go through `report.cell`: a bar in their words ("max |d log-prob|") is
    escaped, not turned into another character, and a row keeps its number of cells."""
    import re

    from smearcli.census import report

    said = "IndexError in step: max |d log-prob| 3.1\nat position 7"
    assert report.cell(said) == "IndexError in step: max \\|d log-prob\\| 3.1 at position 7"
    assert report.cell("a|b", 2) == "a\\|"  # cut first: no escape is left half
    rec = record.new("x", "crashed", reason=said, worst_schedule="chunks of 16", notes=[])
    rows = [ln for ln in report.markdown([rec]).splitlines() if ln.startswith("| x |")]
    assert rows and all("max \\|d log-prob\\|" in ln for ln in rows)
    header = {ln.count("|") - ln.count("\\|") for ln in report.markdown([rec]).splitlines() if ln.startswith("| arch")}
    assert all(len(re.split(r"(?<!\\)\|", ln)) - 1 in header for ln in rows)
