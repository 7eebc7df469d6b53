"""The implementations `--impl` can run, in one registry.

An `Implementation` names itself, says which shared options it needs, owns or refuses (each
refusal with its one-line reason), which commands it serves, the runner classes a run compares
(their declared capabilities decide which schedules it is offered: `schedules.runnable`, never a
list of its own), and how to prepare a run: `prepare(spec, schedules, tolerance) ->
cli.reports.Job`. The commands (`cli/commands/*`) ask `cli.impls.implementation(spec, command)`
and never name an implementation.

```python
from smearcli.cli import registry
registry.register(registry.Implementation("toy", "a toy model", prepare=my_prepare, runners=(MyRunner,)))
```

A built-in entry names its `prepare` and its runners as "module:name", imported when it runs:
`--help` imports no implementation's code (and no torch), and this module imports nothing of the
CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from ..named import load

COMMANDS = ("compare", "plot", "bench")


@dataclass(frozen=True)
class Implementation:
    name: str
    help: str  # one phrase, for --impl's help
    prepare: Union[Callable, str]  # (spec, schedules, tolerance) -> Job, or "module:function" naming it
    needs: tuple[tuple[str, str], ...] = ()  # (RunSpec field, what to give) that must be set
    owns: tuple[str, ...] = ()  # RunSpec fields only this implementation (and those sharing them) use
    refuses: tuple[tuple[str, str], ...] = ()  # (RunSpec field, why it does not apply)
    commands: tuple[str, ...] = ("compare", "plot")
    # the `Runner` classes (or "module:Class") whose runs it compares: a schedule is offered when
    # every one of them can run it (None: a plain Runner's, which steps through a cache and no more)
    runners: Optional[tuple[Union[type, str], ...]] = None

    def job(self, spec, schedules, tolerance: float):
        """Prepare a run (imports the implementation's code now)."""
        return load(self.prepare)(spec, schedules, tolerance)

    def runner_classes(self) -> list[type]:
        """Its runner classes (imports their modules now)."""
        from ..runner import Runner

        return [load(r) for r in self.runners] if self.runners else [Runner]


REGISTRY: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add (or replace) an implementation; `--impl NAME` then runs it."""
    REGISTRY[impl.name] = impl
    return impl


# -- the built-in implementations ----------------------------------------------------------------

NANOCHAT_OPTIONS = ("nanochat_path", "user_code_timeout")
# options that configure nanochat models or inputs, refused with --impl hf
NOT_HF = tuple((f, "configures a nanochat model and does not apply to --impl hf (--hf-model names the model)")
               for f in ("checkpoint", "step", "model", "depth", "text", "text_file", "source",
                         "model_tag", "preset")) + (
    ("chat", "encodes a nanochat conversation; it does not apply to --impl hf"),
    ("logic", "picks nanochat's smear logic; with --impl hf the model's own code runs"),
    ("samples", "sizes the engine schedule, which --impl hf does not run"),
    ("documents", "sizes the packed schedule, which --impl hf does not run"),
    ("leak_limit", "gates the packed schedule, which --impl hf does not run"))

# what each runs is what its runners declare (`smearcli.runner`): our GPT has no padding mask; a
# user's checkout runs packed (its documents alone against the packed row, the attention split
# through its own SDPA calls masked to the documents) but neither padded nor, as it can neither crop
# nor copy its cache, rollback; a transformers model has no engine expansion and no BOS documents
OURS = "smearcli.gpt_runners:GPTRunner"
NANOCHAT = "smearcli.engines.nanochat.adapter:NanochatRunner"
register(Implementation("ours", "smearcli's reimplementation of nanochat's GPT; --logic picks the smear",
                        "smearcli.engines.nanochat.prepare:prepare", commands=COMMANDS, runners=(OURS,)))
register(Implementation("nanochat", "your checkout at --nanochat-path: its own GPT, forward pass and "
                        "KVCache, on the same weights", "smearcli.engines.nanochat.prepare:prepare",
                        needs=(("nanochat_path", "DIR (a nanochat checkout)"),), owns=NANOCHAT_OPTIONS,
                        runners=(NANOCHAT,)))
register(Implementation("both", "your checkout and ours side by side (ours then runs old and fixed)",
                        "smearcli.engines.nanochat.prepare:prepare", needs=(("nanochat_path", "DIR (a nanochat checkout)"),),
                        owns=NANOCHAT_OPTIONS, runners=(NANOCHAT, OURS)))
register(Implementation("hf", "a Hugging Face transformers model (--hf-model) through its own cache API",
                        "smearcli.engines.transformers.prepare:prepare", needs=(("hf_model", "NAME|DIR"),), owns=("hf_model",), refuses=NOT_HF,
                        runners=("smearcli.engines.transformers.cache_runner:CacheRunner",)))
NOT_VLLM = tuple((f, why.replace("--impl hf", "--impl vllm")) for f, why in NOT_HF) + tuple(
    (f, "sizes the engine and speculative schedules, which --impl vllm does not run") for f in ("gen_len", "draft")) + (
    ("reject", "sizes the rollback schedule, which --impl vllm does not run"),)
register(Implementation("vllm", "the model of --hf-model DIR run by vLLM (its chunked prefill and prefix cache, "
                        "in its own environment: --vllm-python), against its full forward in transformers",
                        "smearcli.engines.vllm.prepare:prepare", needs=(("hf_model", "DIR (a local safetensors model)"),),
                        owns=("hf_model", "vllm_python", "tensor_parallel_size"), refuses=NOT_VLLM,
                        runners=("smearcli.engines.vllm:VLLMRunner",)))
NOT_LLAMACPP = tuple((f, why.replace("--impl hf", "--impl llamacpp")) for f, why in NOT_HF)
register(Implementation("llamacpp", "the model of --hf-model DIR (or your --gguf FILE of it) run by llama.cpp (its "
                        "micro-batches, calls, sequence copies and removals, in its own environment: "
                        "--llamacpp-python), against its full forward in transformers and its own one-call prefill",
                        "smearcli.engines.llamacpp.prepare:prepare", needs=(("hf_model", "DIR (a local safetensors model)"),),
                        owns=("hf_model", "llamacpp_python", "gguf"), refuses=NOT_LLAMACPP,
                        runners=("smearcli.engines.llamacpp:LlamaCppRunner",)))
