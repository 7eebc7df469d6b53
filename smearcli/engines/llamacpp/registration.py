"""llama.cpp's one registration (`engines.registry`): `compare --impl llamacpp` (a model directory,
or its GGUF file, run by llama.cpp against its full forward in transformers) and `scan --engine
llamacpp` (every architecture both llama.cpp's converter and transformers register)."""

from __future__ import annotations

from ...census.engines import Engine
from ...judging.verdicts import FAILURES
from ..registry import NANOCHAT_ONLY, Implementation, register
from .data import LlamaCppData

CENSUS = Engine(
    "llamacpp", "llama.cpp's micro-batches, calls, seq_cp and seq_rm, against the transformers full pass",
    open="smearcli.engines.llamacpp.session:open_session", env_var="SMEARCLI_LLAMACPP_PYTHON",
    environment="an environment with llama-cpp-python; scripts/make_env.sh llamacpp DIR makes one (then DIR/bin/python)",
    failing=tuple(str(v) for v in FAILURES),
    names_are="an architecture both llama.cpp's converter and transformers register as a causal LM",
    repro_tails=("-llamacpp.py", "-llamacpp.gguf"), product="llama-cpp-python",
    release=lambda r: r.llamacpp.llama_cpp_python if isinstance(r.llamacpp, LlamaCppData) else None,
    stamp=lambda v: {"llamacpp": {"llama_cpp_python": v}},
    title="# smearcli scan on llama.cpp: transformers {transformers_version} reference",
    sections="smearcli.engines.llamacpp.session:sections", data={"llamacpp": LlamaCppData})

register(Implementation("llamacpp", "the model of {hf_model} DIR (or your {gguf} FILE of it) run by llama.cpp (its "
                        "micro-batches, calls, sequence copies and removals, in its own environment: "
                        "{llamacpp_python}), against its full forward in transformers and its own one-call prefill",
                        "smearcli.engines.llamacpp.prepare:prepare", needs=(("hf_model", "DIR (a local safetensors model)"),),
                        owns=("hf_model", "llamacpp_python", "gguf"), refuses=NANOCHAT_ONLY,
                        runners=("smearcli.engines.llamacpp:LlamaCppRunner",), census=CENSUS))
