"""`--impl vllm`: the model of `--hf-model DIR` run by vLLM (smearcli.engines.vllm) as a registry job.

Owns what only vLLM needs from the CLI: its interpreter (`--vllm-python`, else
$SMEARCLI_VLLM_PYTHON), `--device` and `--tensor-parallel-size` passed through, the checks of the
chunk plan and the prefix schedule against what vLLM can do, and the reference: the same
directory loaded in transformers here (`cli.hf_model`), compared as log-probabilities. Imported
only when `--impl vllm` runs.
"""

from __future__ import annotations

from pathlib import Path

from ...util.errors import UserError
from ...cli.options import Device, DType, RunSpec, foreign_python

SUBTITLE = ("vLLM runs each schedule with its own scheduler and caches (in its own environment); "
            "the reference is\nthe same model's full forward in transformers; both as log-probabilities.")


def vllm_python(spec: RunSpec) -> tuple[str, str]:
    """(vLLM's interpreter, where it was given: the option or the environment variable, which a
    refusal of it names)."""
    from .implementation import ENV_PYTHON

    return foreign_python(spec.vllm_python, "--vllm-python", ENV_PYTHON, "--impl vllm",
                          "an environment with vLLM; scripts/make_env.sh vllm DIR makes one (then DIR/bin/python)")


def check_vllm_spec(spec: RunSpec, schedules):
    """What the options alone decide for --impl vllm, before anything is loaded (the model directory
    must hold safetensors weights: what vLLM and the transformers reference both read)."""
    from ...cli.hf_model import check_hf_spec, check_weights

    opts = check_hf_spec(spec, [s for s in schedules if s != "prefix"])
    if not Path(spec.hf_model).is_dir():
        raise UserError(f"--hf-model {spec.hf_model}: --impl vllm needs a local model directory "
                        "(vLLM loads it from disk; the built-in tiny configs are for --impl hf)")
    check_weights(spec)  # the weights vLLM and the reference load, before vLLM's environment starts
    if spec.tensor_parallel_size < 1:
        raise UserError(f"--tensor-parallel-size must be >= 1, got {spec.tensor_parallel_size}")
    if spec.tensor_parallel_size > 1 and spec.device != Device.cuda:
        raise UserError("--tensor-parallel-size splits the model over GPUs; give --device cuda with it")
    return opts


def check_plan(T: int, schedules, opts) -> None:
    """The chunk plan and the prefix schedule against what vLLM can run on T tokens."""
    from . import implementation as vllm
    from ...cli.build import flag

    if "chunked" in schedules:
        with flag("--chunk-sizes" if opts.chunk_sizes else "--chunks", ": "):
            vllm.chunk_budget(T, opts)
    if "prefix" in schedules:
        with flag("--schedules prefix", ": "):
            vllm.prefix_len(T)


def path_name(schedule: str, steps) -> str:
    """A compare run's schedule named as the vLLM census names it ("chunked@13": chunked prefill at
    a budget of its first chunk), so that what upstream knows about that path covers it."""
    return f"chunked@{steps[0]}" if schedule == "chunked" and steps else schedule


def prepare(spec: RunSpec, schedules, tolerance: float):
    """A Job that runs vLLM on `schedules` against the transformers reference (compare/1 document)."""
    from . import implementation as vllm
    from .environment import hello
    from ...cli.build import flag
    from ...cli.hf_model import load, reference as reference_of, tokens_for
    from ...cli.reports import comparison_job
    from ...cli.threads import apply_threads

    schedules = [s for s in schedules if s != "full"]
    opts = check_vllm_spec(spec, schedules)
    python, given_as = vllm_python(spec)
    with flag(given_as):  # its handshake, before any model is loaded: a bad environment is exit 2
        hello(python)
    if spec.tokens is None:  # random input: its length is known before the model loads
        check_plan(spec.seq_len_value(), schedules, opts)
    threads = apply_threads(spec.threads)
    model, info, device = load(spec)
    tokens = tokens_for(spec, model)
    T = tokens.size(1)
    check_plan(T, schedules, opts)
    reference = reference_of(spec, model, info.source, tokens)
    dtype = "float32" if spec.dtype == DType.auto and device.type == "cpu" else info.dtype
    settings = vllm.Settings(python=python, model=spec.hf_model, vocab=int(model.config.vocab_size), dtype=dtype,
                             device=device.type, tensor_parallel_size=spec.tensor_parallel_size)
    runner = vllm.VLLMRunner(settings, schedules)

    def place(c):  # after the run: the worker said its vLLM version
        from ...census import known

        return known.of_run(c, "vllm", getattr(model.config, "model_type", None) or "",
                            (runner.result or {}).get("vllm_version"), path_name)
    return comparison_job([runner], tokens, schedules, opts, tolerance, footer=threads, reference=reference,
                          info={"name": spec.hf_model, "source": "vllm"}, place=place,
                          title=f"{spec.hf_model}: {info.model_class} in vLLM, {dtype} on {device}, "
                                f"{tokens.size(0)} x {T} tokens", subtitle=SUBTITLE)
