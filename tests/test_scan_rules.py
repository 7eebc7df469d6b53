"""The rules a finding must pass before the census calls it a bug (issue 42), each held with a
stand-in model: the reference checked first (a full pass that reads later tokens is the finding,
and no cached path is blamed for it)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_standin import ShiftConfig, ShiftLM  # noqa: E402
from smearcli.census import causal  # noqa: E402
from smearcli.census.check import check_model, split_points  # noqa: E402
from smearcli.verdicts import BUG, OK  # noqa: E402

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
    assert out["verdict"] == BUG and out["shape"] == causal.LEAK, out
    assert out["worst_schedule"] == causal.SCHEDULE and out["confirmation"]["status"] == BUG
    cut = T - min(causal.CHANGED, T // 4)  # the tokens from `cut` on were changed
    assert out["born_at"] == f"logits@{cut - 1}"  # position cut-1 reads token cut, no earlier one
    assert any("tokens changed" in n or "tokens removed" in n for n in out["notes"])
    assert not out.get("schedules") and not out.get("boundaries")  # no cached schedule judged
    assert any("the reference is not causal" in n for n in out["notes"])
    assert out["born_in"]["module"]  # where the leak starts: a module whose inputs agree before cut


def test_a_causal_full_pass_passes_the_reference_check():
    m, ids = model(ShiftLM), tokens()
    from smearcli.impls.hf.cache_runner import CacheRunner, full_run

    runner = CacheRunner(m)
    ref = full_run(runner, ids)
    assert causal.leak(runner, ids, ref, 1e-6) is None
    assert check_model(m, ids, split_points(m.config, T))["verdict"] == OK
