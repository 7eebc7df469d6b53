"""`--hf-model`: the Hugging Face model that `--impl hf`, `--impl vllm` and `--impl llamacpp` all load
in transformers here (smearcli.engines.transformers), and what each of them needs of it from the CLI:

- `check_hf_spec(spec, schedules)`: what the options alone decide, before transformers is imported;
- `check_weights(spec)`: the directory holds the safetensors weights another engine reads too;
- `load(spec)`: the model on `--device`, in `--dtype` (auto: as loaded), and its info;
- `tokens_for(spec, model)`: `--tokens` checked against its vocabulary, else seeded random ids;
- `reference(spec, model, source, tokens)`: its full pass as log-probabilities, which vLLM and llama.cpp
  are held to (they give log-probabilities, not logits);
- `flag_model(spec)`: an error raised inside names `--hf-model` (exit 2).

Imported only when one of those implementations runs, so transformers never loads on the nanochat paths.
"""

from __future__ import annotations

from pathlib import Path

from .options import DType, RunSpec


def check_hf_spec(spec: RunSpec, schedules):
    """Everything the options alone decide for a `--hf-model` run, before transformers is imported."""
    from .build import check_arguments

    return check_arguments(spec, schedules, spec.chunk_size_tuple())


def check_weights(spec: RunSpec) -> None:
    """The model directory holds the safetensors weights both another engine and the reference read."""
    from ..engines.transformers.files import weight_files
    from .build import flag

    with flag("--hf-model"):
        weight_files(Path(spec.hf_model))


def load(spec: RunSpec):
    """(model, HFModelInfo, device) for --hf-model, on --device, in --dtype (auto: as loaded)."""
    from ..engines import transformers as hf
    from .build import DTYPES, flag, resolve_device

    device = resolve_device(spec.device)
    dtype = None if spec.dtype == DType.auto else DTYPES[spec.dtype.value]
    with flag("--hf-model"):
        model, info = hf.load(spec.hf_model, seed=spec.seed, dtype=dtype)
        model = model.to(device=device, dtype=dtype)
        info = hf.model_info(model, info.source)
    return model, info, device


def tokens_for(spec: RunSpec, model):
    from ..engines import transformers as hf
    from ..measure.inputs import load_tokens
    from .build import flag

    if spec.tokens is not None:
        with flag("--tokens"):
            return load_tokens(spec.tokens, hf.vocab_size(model))
    return hf.random_tokens(model, spec.seq_len_value(), spec.batch, spec.seed)


def reference(spec: RunSpec, model, source: str, tokens):
    """The model's runner in transformers, as log-probabilities: the reference of a foreign engine."""
    from ..engines import transformers as hf
    from ..measure.runner import LogProbs

    with flag_model(spec):
        return LogProbs(hf.runner(model, source, tokens))


def flag_model(spec: RunSpec):
    from .build import flag

    return flag(f"--hf-model {spec.hf_model}:")
