"""transformers' one registration (`engines.registry`): `compare --impl hf` (a Hugging Face model
through its own cache API) and `scan --engine transformers` (every causal LM the installed
transformers registers, the census's default)."""

from __future__ import annotations

from ...census.engines import Engine
from ..registry import NANOCHAT_ONLY, Implementation, register


def repro_tails() -> tuple[str, ...]:
    """What a transformers finding writes after its model type: the reproducer, the draft, and one
    reproducer per census boundary."""
    from ...measure.schedules import census_schedules

    return (".py", ".md") + tuple(f"-{b}.py" for b in census_schedules())


CENSUS = Engine(
    "transformers", "transformers' own caches", open="smearcli.engines.transformers.session:InProcess",
    unnamed=True, names_are="a causal LM of this transformers", repro_tails=repro_tails,
    product="transformers", release=lambda r: r.transformers_version, stamp=lambda v: {"transformers_version": v},
    title="# smearcli scan: transformers {transformers_version}", counted="causal-LM architectures",
    sections="smearcli.engines.transformers.page:sections", after_run="smearcli.engines.transformers.draft:after_run",
    groups="smearcli.engines.transformers.groups:groups", footer="smearcli.engines.transformers.page:table_lines",
    under="smearcli.engines.transformers.page:under_row")

# a transformers model has no engine expansion and no BOS documents: its runner declares what it can run
register(Implementation("hf", "a Hugging Face transformers model ({hf_model}) through its own cache API",
                        "smearcli.engines.transformers.prepare:prepare", needs=(("hf_model", "NAME|DIR"),),
                        owns=("hf_model",), refuses=NANOCHAT_ONLY,
                        runners=("smearcli.engines.transformers.cache_runner:CacheRunner",), census=CENSUS))
