"""A stand-in Hugging Face model for the tests: the PreTrainedModel API, a per-token state in its
cache (each layer mixes in the previous token's input, a token shift), and a switch that makes a
multi-token cached step forget that state at its first token, the bug class of nanochat #756 and
transformers #46032. Written for smearcli's tests; no real model's code."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

_FIELDS = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
_CACHE_FIELD = "cache" if "cache" in _FIELDS else "past_key_values"


class ShiftConfig(PretrainedConfig):
    model_type = "smearcli_shift_standin"

    def __init__(self, vocab_size=64, hidden_size=32, num_hidden_layers=2, bug_layer=-1, **kw):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.bug_layer = bug_layer  # -1: every layer carries its state correctly
        super().__init__(**kw)


class ShiftCache:
    """Per layer, the last token's input (B, 1, C); None before the first step."""
    def __init__(self, n_layers):
        self.last = [None] * n_layers


class ShiftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.cur = nn.Linear(c, c)
        self.prev = nn.Linear(c, c, bias=False)

    def forward(self, x, prev_last, forget):
        B, T, C = x.shape
        first = torch.zeros(B, 1, C, dtype=x.dtype) if prev_last is None or forget else prev_last
        shifted = torch.cat([first, x[:, :-1]], dim=1)
        return x + torch.tanh(self.cur(x) + self.prev(shifted))


class ShiftLM(PreTrainedModel):
    config_class = ShiftConfig
    base_model_prefix = "shift"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ShiftLayer(config.hidden_size) for _ in range(config.num_hidden_layers))
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        pass  # keep torch's default init, seeded by the caller

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids=None, cache=None, use_cache=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        x = self.embed(input_ids)
        T = x.size(1)
        if use_cache and cache is None:
            cache = ShiftCache(len(self.layers))
        hs = [x]
        for i, layer in enumerate(self.layers):
            prev = cache.last[i] if cache is not None else None
            forget = i == self.config.bug_layer and T > 1  # the bug: multi-token steps drop the state
            if cache is not None:
                cache.last[i] = x[:, -1:]
            x = layer(x, prev, forget)
            hs.append(x)
        out = {"logits": self.head(x), "hidden_states": tuple(hs) if output_hidden_states else None}
        out[_CACHE_FIELD] = cache if use_cache else None
        return CausalLMOutputWithPast(**out)


def shift_model(bug_layer=-1, seed=0):
    torch.manual_seed(seed)
    return ShiftLM(ShiftConfig(bug_layer=bug_layer)).eval()
