"""`--impl hf`: a Hugging Face model (smearcli.engines.transformers) as a registry job.

Owns what only a transformers model needs from the CLI (loading `--hf-model` and its input are
`cli.hf_model`'s, which vLLM and llama.cpp share): the mapping of the adapter's errors to
`--hf-model` and the schedule flags, and its report: the standard one, with the `smearcli.compare/1` JSON document and a figure title that
says what the reference is. Which shared options apply is the registry's (`cli.impls`).

Imported only when `--impl hf` runs, so transformers never loads on the nanochat paths.
"""

from __future__ import annotations

from ...util.errors import UserError
from ...cli.options import RunSpec

SUBTITLE = ("The model runs each schedule through its own cache API (use_cache=True, the cache passed "
            "back each step);\nthe reference is one call over every token with use_cache=False.")


def prepare(spec: RunSpec, schedules, tolerance: float):
    """A Job that checks the model of --hf-model on `schedules`; its report writes smearcli.compare/1."""
    from .. import transformers as hf
    from ...util.defaults import DRAFT
    from ...measure.steps import chunk_plan
    from ...cli.build import check_boundaries
    from ...cli.hf_model import check_hf_spec, flag_model, load, tokens_for
    from ...cli.threads import apply_threads

    schedules = [s for s in schedules if s != "full"]
    opts = check_hf_spec(spec, schedules)
    threads = apply_threads(spec.threads)
    model, info, device = load(spec)
    tokens = tokens_for(spec, model)
    try:
        if "chunked" in schedules:  # the plan of a schedule that does not run refuses nothing
            chunk_plan(tokens.size(1), opts)
    except ValueError as e:
        raise UserError(f"{'--chunk-sizes' if opts.chunk_sizes else '--chunks'}: {e}") from e
    check_boundaries(tokens.size(1), schedules, opts, draft_given=spec.draft != DRAFT)  # --tokens' length
    from . import compare_check as hf_check
    from ...cli.reports import ComparisonReport, Job

    with their_code(spec), flag_model(spec):
        runner = hf.runner(model, info.source, tokens)
    report_kw = dict(document=lambda c: hf.to_json(c, info, opts, str(device)),
                     title=f"{info.source}: {info.model_class}, {info.dtype} on {device}, "
                           f"{tokens.size(0)} x {tokens.size(1)} tokens", subtitle=SUBTITLE)

    def run(bar):
        import transformers

        from ...census import known
        from ...cli.hf_model import flag_model
        from .check import path_name

        with their_code(spec), flag_model(spec):
            c = hf_check.sound_compare(runner, tokens, schedules, opts, tolerance, progress=bar.label,
                                       tokens_progress=bar.tokens, notes=[info.describe()])
        upstream = known.of_run(c, "transformers", getattr(model.config, "model_type", None) or "",
                                transformers.__version__, path_name)
        return ComparisonReport(c, None, threads, upstream=upstream, **report_kw)
    return Job(run, runner.name)


class their_code:
    """An exception raised inside transformers is the model's result: exit 1 naming the frame in
    transformers that raised, never "a bug in smearcli"."""

    def __init__(self, spec: RunSpec):
        self.spec = spec

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        from ...util.errors import UserCodeError
        from .compare_check import their_frame

        if exc is None or isinstance(exc, (UserError, KeyboardInterrupt)):
            return False
        where = their_frame(exc)
        if where is None:
            return False
        first = (str(exc).splitlines() or [""])[0][:200]
        raise UserCodeError(f"--hf-model {self.spec.hf_model}: the model's own code raised "
                            f"{type(exc).__name__} at {where}: {first}") from exc
