"""Hugging Face transformers models under the same schedules and metrics (optional extra `hf`).

```python
from smearcli.engines import transformers as hf
model, info = hf.load("mamba")            # a built-in tiny random config, or a local model dir
check = hf.check_model(model, hf.random_tokens(model, 48), chunks=3)
print(check.table())
```

Built-in names (`TINY_CONFIGS`): tiny random configs (hidden 64, 2 layers, vocab 128, float32),
seeded, built on the CPU in well under a second. A directory is loaded offline by
`smearcli.engines.transformers.loading` (safetensors only, `trust_remote_code` never on, every file checked
before transformers reads it).

Each schedule runs through the model's own cache API: a first call without a cache and
`use_cache=True` makes the model create its cache, which every later call passes back under the
keyword the installed release's `forward` takes (`cache` in transformers 5.24; `past_key_values`
or, for Mamba-style models, `cache_params` with `cache_position` in 5.0), detected from the
signature by `hf.api`, the one detector (the census and its reproducers use it too). Every
release from 5.0 on is supported (`OLDEST`). The reference is one call with `use_cache=False`.
Hidden states come from `output_hidden_states=True`. `HFRunner` is the model as a `smearcli.measure.runner.Runner`, so
`smearcli.measure.compare` measures it like any other implementation.

transformers is imported lazily, only here: nothing on the nanochat paths imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ...measure import inputs
from ...util.errors import UserError
from ...util.defaults import DEFAULT_SCHEDULES, NOISE_MARGIN
from ...measure.compare import Comparison
from ...measure.runner import Described
from ...measure.schedules import runnable
from ...measure.steps import ScheduleOptions
from .loading import load_dir_with_notes, require_transformers
from .cache_runner import CacheRunner
from . import api


# -- built-in tiny configs ------------------------------------------------------------------------
_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2)


def _llama(tf):
    return tf.LlamaConfig(**_COMMON, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def _gemma3(tf):
    # layer 0 slides over 8 tokens, layer 1 attends to everything: a window shorter than a chunk
    return tf.Gemma3TextConfig(**_COMMON, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])


def _mamba(tf):
    return tf.MambaConfig(**_COMMON, state_size=8, expand=2, conv_kernel=4)


def _mamba2(tf):
    return tf.Mamba2Config(**_COMMON, state_size=16, expand=2, n_groups=1, num_heads=8, head_dim=16,
                           chunk_size=16, conv_kernel=4)


def _zamba2(tf):
    # one Mamba2 layer, then one hybrid layer (shared attention + Mamba2)
    return tf.Zamba2Config(**_COMMON, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                           mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8, chunk_size=16,
                           layers_block_type=["mamba", "hybrid"])


TINY_CONFIGS: dict[str, Callable] = {
    "llama": _llama,
    "gemma3": _gemma3,
    "mamba": _mamba,
    "mamba2": _mamba2,
    "zamba2": _zamba2,
}


@dataclass
class HFModelInfo:
    """What was loaded, for the report."""
    source: str  # built-in name or directory
    model_class: str
    transformers_version: str
    dtype: str
    n_layers: int  # hidden states returned per call, the embedding output included
    cache_keyword: str  # the forward keyword the cache is passed back under
    cache_position: bool  # whether cache_position is passed
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        pos = ", with cache_position" if self.cache_position else ""
        return (f"{self.source}: {self.model_class}, {self.dtype}, transformers {self.transformers_version}; "
                f"cache passed back as {self.cache_keyword}={{model's own cache}}{pos}; "
                f"reference: one call with use_cache=False")


def tiny_model(name: str, seed: int = 0):
    """A built-in tiny random model by name, in eval mode, float32, seeded."""
    tf = require_transformers()
    if name not in TINY_CONFIGS:
        raise UserError(f"unknown Hugging Face test model {name!r}; choose from {', '.join(TINY_CONFIGS)} "
                        "or give a local model directory")
    cfg = TINY_CONFIGS[name](tf)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(cfg)
    return model.float().eval()


def load(name_or_dir: str, seed: int = 0, dtype: Optional[torch.dtype] = None):
    """(model, HFModelInfo) for a built-in name or a local directory."""
    notes: list[str] = []
    if name_or_dir in TINY_CONFIGS:
        model = tiny_model(name_or_dir, seed)
        source = f"{name_or_dir} (tiny random config, seed {seed})"
    elif Path(name_or_dir).exists():
        model, notes = load_dir_with_notes(name_or_dir, dtype)
        source = str(name_or_dir)
    else:
        raise UserError(f"{name_or_dir!r} is neither a built-in test model ({', '.join(TINY_CONFIGS)}) "
                        "nor an existing directory")
    info = model_info(model, source)
    info.notes.extend(notes)  # what the directory asked for and did not get (an auto_map)
    return model, info


# -- the cache API ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheAPI:
    keyword: str  # forward keyword for the cache
    cache_position: bool  # pass cache_position=arange(pos, pos+n)


def cache_api(model) -> CacheAPI:
    """The keyword the installed model's forward takes its cache under, and whether cache_position
    is passed (`hf.api.detect`, the rule `hf.cache_runner.CacheRunner` follows)."""
    found = api.detect(model)
    if found is None:
        raise UserError(f"{api.no_cache_reason(model)}: smearcli cannot pass its cache back")
    return CacheAPI(found.keyword, found.cache_position)


def _device(model) -> torch.device:
    return next(model.parameters()).device


class HFRunner(CacheRunner):
    """A transformers causal LM behind `smearcli.measure.runner.Runner`: the reference is one call over
    every token with use_cache=False; a cached step passes the model's own cache back under the
    keyword its forward takes (`hf.cache_runner.CacheRunner`, the one HF runner, which `scan` and
    `compare --impl hf` use too), described with what was loaded (`HFModelInfo`)."""

    def __init__(self, model, info: "HFModelInfo", layers: Sequence[str]):
        super().__init__(model, layers, info.source)
        self.info = info

    def describe(self) -> Described:
        cfg = getattr(self.model, "config", None)
        config = cfg.to_dict() if hasattr(cfg, "to_dict") else None
        return Described(self.label, self.series, self.name, self.info.model_class,
                         str(self.dtype).removeprefix("torch."), str(self.device), config, None,
                         (self.info.describe(), *self.info.notes, *self.notes()[1:]))


def hidden_names(model, ids: Tensor, hidden_states: Sequence[Tensor]) -> list[str]:
    """Names for a model's hidden states (+ logits). Releases and models differ in what
    `hidden_states[0]` is (the embedding output for Llama, layer 0's output for Mamba), so it is
    compared with the embedding lookup; the last entry is the final norm's output when there is
    one entry per layer plus one and the first is not the embedding."""
    n = len(hidden_states)
    L = getattr(model.config, "num_hidden_layers", None)
    try:
        with torch.inference_mode():
            emb = model.get_input_embeddings()(ids.to(_device(model)))
        starts_at_emb = emb.shape == hidden_states[0].shape and torch.allclose(emb.float(), hidden_states[0].float())
    except Exception:  # no plain embedding lookup (a multimodal or composite model): count only
        starts_at_emb = False
    if n == (L or -1) + 1:
        if starts_at_emb:
            names = ["emb"] + [f"layer{i}" for i in range(L)]  # the last often after the final norm
        else:
            names = [f"layer{i}" for i in range(L)] + ["norm"]
    else:
        names = [f"hidden_states[{i}]" for i in range(n)]
    return names + ["logits"]


def model_info(model, source: str) -> HFModelInfo:
    tf = require_transformers()
    api = cache_api(model)
    n = getattr(model.config, "num_hidden_layers", None)
    return HFModelInfo(source, type(model).__name__, tf.__version__,
                       str(next(model.parameters()).dtype).removeprefix("torch."),
                       (n + 1) if isinstance(n, int) else -1, api.keyword, api.cache_position)


def vocab_size(model) -> int:
    emb = model.get_input_embeddings()
    return int(getattr(emb, "num_embeddings", None) or model.config.vocab_size)


def random_tokens(model, seq_len: int, batch: int = 1, seed: int = 0) -> Tensor:
    """`inputs.random_tokens` over the model's vocabulary."""
    return inputs.random_tokens(vocab_size(model), seq_len, batch, seed)


def runner(model, source: str = "model", tokens: Optional[Tensor] = None) -> HFRunner:
    """The model as a runner, its capture points named from a two-token probe (`hidden_names`)."""
    info = model_info(model, source)
    probe_ids = tokens[:, :2] if tokens is not None else random_tokens(model, 2)
    with torch.inference_mode():
        out = model(input_ids=probe_ids.to(_device(model)), use_cache=False, output_hidden_states=True,
                    return_dict=True)
    hs = getattr(out, "hidden_states", None)
    names = hidden_names(model, probe_ids, hs) if hs else ["logits"]
    return HFRunner(model, info, names)


def check_model(model, tokens: Tensor, chunk_sizes: Optional[Sequence[int]] = None, *, chunks: int = 3,
                schedules: Optional[Sequence[str]] = None, options: Optional[ScheduleOptions] = None,
                tolerance: float = NOISE_MARGIN, source: str = "model", progress=None,
                tokens_progress=None) -> Comparison:
    """Every schedule through the model's own cache against one uncached call, measured as
    `compare --impl hf` measures it (`hf.check.sound_compare`: a float64 floor, then the live-state
    check); the result's notes say exactly what ran."""
    from .compare_check import sound_compare

    if options is None:
        options = ScheduleOptions(chunks=chunks, chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes))
    r = runner(model, source, tokens)
    if schedules is None:  # the default list, less what its runner cannot run (no engine expansion)
        schedules = [s for s in DEFAULT_SCHEDULES if runnable(r, s)]
    return sound_compare(r, tokens, list(schedules), options, tolerance, progress=progress,
                         tokens_progress=tokens_progress, notes=[r.info.describe()])


# -- the --json document ----------------------------------------------------------------------------
def to_json(check: Comparison, info: HFModelInfo, options: Optional[ScheduleOptions] = None,
            device: str = "cpu") -> dict:
    """The `--json` document of a Hugging Face check: schema "smearcli.compare/1" like every
    implementation's (docs/json-schema.md), with what was loaded as its `model`, the same facts as
    one sentence (`what_ran`), and per run where its error is born and its share on chunk starts."""
    from ...measure.jsondoc import comparison_json, run_json

    runs = []
    for m in check.metrics:
        born, share = check.born_at(m), check.start_share(m)
        runs.append({**run_json(m, check.layers),
                     "born_at": None if born is None else f"{born[0]}@{born[1]}",
                     "born_at_chunk_start_share": None if share is None else float(f"{share:.6g}")})
    model = {"source": info.source, "model_class": info.model_class,
             "transformers_version": info.transformers_version, "dtype": info.dtype, "device": device,
             "cache_keyword": info.cache_keyword, "cache_position": info.cache_position}
    return comparison_json(check, model, options or ScheduleOptions(), runs, what_ran=info.describe())
