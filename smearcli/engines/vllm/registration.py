"""vLLM's one registration (`engines.registry`): `compare --impl vllm` (a model directory run by
vLLM against its full forward in transformers) and `scan --engine vllm` (every architecture both
vLLM and transformers register)."""

from __future__ import annotations

from ...census.engines import Engine
from ...census.record import STRING
from ...judging.verdicts import FAILURES
from ..registry import NANOCHAT_ONLY, Implementation, register
from .data import VllmData

CENSUS = Engine(
    "vllm", "vLLM's scheduler and caches, against the transformers full pass",
    open="smearcli.engines.vllm.session:open_session", env_var="SMEARCLI_VLLM_PYTHON", concurrent=False,
    environment="an environment with vLLM; scripts/make_env.sh vllm DIR makes one (then DIR/bin/python)",
    failing=tuple(str(v) for v in FAILURES),
    names_are="an architecture both the installed vLLM and transformers register as a causal LM",
    repro_tails=("-vllm.py",), product="vLLM", release=lambda r: r.vllm_version, stamp=lambda v: {"vllm_version": v},
    title="# smearcli scan on vLLM: vLLM {vllm_version} (CPU), transformers {transformers_version} reference",
    sections="smearcli.engines.vllm.session:sections", data={"vllm_version": STRING, "vllm": VllmData})

REFUSES = NANOCHAT_ONLY + tuple(
    (f, "sizes the engine and speculative schedules, which {this} does not run") for f in ("gen_len", "draft")) + (
    ("reject", "sizes the rollback schedule, which {this} does not run"),)

register(Implementation("vllm", "the model of {hf_model} DIR run by vLLM (its chunked prefill and prefix cache, "
                        "in its own environment: {vllm_python}), against its full forward in transformers",
                        "smearcli.engines.vllm.prepare:prepare", needs=(("hf_model", "DIR (a local safetensors model)"),),
                        owns=("hf_model", "vllm_python", "tensor_parallel_size"), refuses=REFUSES,
                        runners=("smearcli.engines.vllm:VLLMRunner",), census=CENSUS))
