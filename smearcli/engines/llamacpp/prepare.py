"""`--impl llamacpp`: the model of `--hf-model DIR` (or a user's `--gguf FILE` of it) run by
llama.cpp (smearcli.engines.llamacpp) as a registry job.

Owns what only llama.cpp needs from the CLI: its interpreter (`--llamacpp-python`, else
$SMEARCLI_LLAMACPP_PYTHON), the header check of `--gguf` before llama.cpp sees the file (a bad one
is exit 2 with the reason), the schedules it runs by default (all of llama.cpp's), the reference
(the same directory loaded in transformers here, compared as log-probabilities) and the report:
the standard one, whose verdict and notes add the cached paths held to llama.cpp's own one-call
prefill (`engines.llamacpp.own_prefill`). Imported only when `--impl llamacpp` runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...util.errors import UserError
from ...cli.options import RunSpec, foreign_python

SUBTITLE = ("llama.cpp runs each schedule with its own micro-batches, calls and sequence operations (in its "
            "own environment);\nthe reference is the same model's full forward in transformers; both as "
            "log-probabilities.")


def llamacpp_python(spec: RunSpec) -> tuple[str, str]:
    """(llama.cpp's interpreter, where it was given: the option or the environment variable)."""
    from .implementation import ENV_PYTHON

    return foreign_python(spec.llamacpp_python, "--llamacpp-python", ENV_PYTHON, "--impl llamacpp",
                          "an environment with llama-cpp-python; scripts/make_env.sh llamacpp DIR makes one "
                          "(then DIR/bin/python)")


def check_gguf_file(spec: RunSpec, vocab: int):
    """--gguf's header against the bounds and the config's vocabulary (UserError with the reason)."""
    from .gguf_header import BadGGUF, check as check_gguf

    path = Path(spec.gguf)
    if not path.is_file():
        raise UserError(f"--gguf {spec.gguf}: {'a directory, not a file' if path.is_dir() else 'file not found'}")
    try:
        return check_gguf(path, vocab)
    except BadGGUF as e:
        raise UserError(f"--gguf {spec.gguf}: refused before llama.cpp reads it: {e}") from None
    except OSError as e:
        raise UserError(f"--gguf {spec.gguf}: cannot read it ({e.strerror or e})") from None


def schedules_to_run(spec: RunSpec, schedules) -> list:
    from .implementation import LLAMACPP_SCHEDULES
    from ...util.defaults import DEFAULT_SCHEDULES

    if spec.schedules == ",".join(DEFAULT_SCHEDULES):  # not chosen: every schedule llama.cpp runs
        return list(LLAMACPP_SCHEDULES)
    return [s for s in schedules if s != "full"]


def prepare(spec: RunSpec, schedules, tolerance: float):
    """A Job that runs llama.cpp on `schedules` against the transformers reference (compare/1)."""
    from . import implementation as llamacpp
    from .environment import found, hello
    from ...util.defaults import DEFAULT_SCHEDULES
    from ...cli.build import check_boundaries, flag
    from ...cli.hf_model import check_hf_spec, load, reference as reference_of, tokens_for
    from ...cli.reports import ComparisonReport, Job
    from ...cli.threads import apply_threads

    chosen = spec.schedules != ",".join(DEFAULT_SCHEDULES)
    schedules = schedules_to_run(spec, schedules)
    try:
        opts = check_hf_spec(spec, [s for s in schedules if s in ("chunked", "rollback")])
    except UserError as e:  # a random input too short for a draft: the default list leaves rollback out
        if chosen or not str(e).startswith("--schedules rollback"):
            raise
        schedules = [s for s in schedules if s != "rollback"]
        opts = check_hf_spec(spec, [s for s in schedules if s == "chunked"])
    if not Path(spec.hf_model).is_dir():
        raise UserError(f"--hf-model {spec.hf_model}: --impl llamacpp needs a local model directory (converted "
                        "to GGUF, and loaded in transformers for the reference; the built-in tiny configs are "
                        "for --impl hf)")
    if spec.device.value not in ("auto", "cpu"):
        raise UserError(f"--device {spec.device.value}: --impl llamacpp runs on the CPU here; a GPU build of "
                        "llama.cpp (CMAKE_ARGS=-DGGML_CUDA=on) is not driven by this smearcli yet")
    python, given_as = llamacpp_python(spec)
    with flag(given_as):  # the handshake before any model is loaded: a bad environment is exit 2
        answer = hello(python)
    threads = apply_threads(spec.threads)
    model, info, _ = load(spec)
    vocab = int(model.config.vocab_size)
    header = check_gguf_file(spec, vocab) if spec.gguf is not None else None
    tokens = tokens_for(spec, model)
    T = tokens.size(1)
    try:
        llamacpp.request(llamacpp.Settings(python, spec.hf_model, vocab), tokens[:, :0].new_zeros(1, T),
                         schedules, opts)  # the plans of the schedules refuse a length now, with the flag
    except UserError as e:
        raise UserError(f"--seq-len/--tokens: {e}") from None
    try:
        check_boundaries(T, [s for s in schedules if s == "rollback"], opts, draft_given=False)
    except UserError:
        if not chosen:  # too short for a draft: the default list leaves rollback out, a chosen one refuses
            schedules = [s for s in schedules if s != "rollback"]
        else:
            raise
    reference = reference_of(spec, model, info.source, tokens)
    settings = llamacpp.Settings(python=python, model=spec.hf_model, vocab=vocab,
                                 gguf=str(spec.gguf) if spec.gguf is not None else None,
                                 gguf_arch=header.architecture if header else None,
                                 widths=llamacpp.widths_for(model.config, T), threads=threads_for(spec))
    runner = llamacpp.LlamaCppRunner(settings, schedules)
    notes = [f"llama.cpp environment: {found(answer)}"]
    if header is not None and not header.float32:
        notes.append(f"--gguf holds {', '.join(sorted(header.types))} tensors: its weights differ from the "
                     "transformers reference's, which its one-call prefill shows")
    title = (f"{spec.gguf or spec.hf_model}: {info.model_class} in llama.cpp, float32 on cpu, "
             f"{tokens.size(0)} x {T} tokens")

    def run(bar):
        from ...measure import compare
        from .own_prefill import held

        c = compare.compare([runner], tokens, runner.schedules, options=opts, tolerance=tolerance,
                            progress=bar.label, tokens_progress=bar.tokens, notes=notes, reference=reference,
                            overlap=True)
        c = held(c, spread=runner.spread)  # the cached paths held to llama.cpp's own one-call prefill
        from ...census import known

        upstream = known.of_run(c, "llamacpp", getattr(model.config, "model_type", None) or "",
                                (runner.result or {}).get("llama_cpp_python") or answer.get("llama_cpp_python"))
        return ComparisonReport(c, {"name": spec.hf_model, "source": "llamacpp"}, threads, title=title,
                                subtitle=SUBTITLE, upstream=upstream)
    return Job(run, runner.name)


def threads_for(spec: RunSpec) -> int:
    """llama.cpp's own threads: --threads, else the cores this process may use."""
    if spec.threads:
        return int(spec.threads)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
