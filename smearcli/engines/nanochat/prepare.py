"""`--impl ours|nanochat|both`: nanochat-shaped models from the CLI, as registry jobs.

ours: our GPT under each `--logic` (runners from `smearcli.gpt.gpt_runners`), the standard report. nanochat
and both: the audit of the user's checkout (`engines.nanochat.audit`), with its own report (its
table, findings and likeness; schema smearcli.audit/1). `--schedules packed` is the packed
report (`cli.packed`) for each: the user's runner, with `both` beside ours under old and fixed. A checkpoint from before the smear is an
answer, not an error: a report without runs that exits 0, also with --check.
"""

from __future__ import annotations

from ...cli.reports import AnswerReport, Job, Report, comparison_job


def _model_info(setup) -> dict:
    from ...cli.build import checkpoint_info

    info = {"name": setup.loaded.name, "source": setup.loaded.source, "step": setup.loaded.step}
    if setup.found is not None:
        info["checkpoint"] = checkpoint_info(setup.found)
    return info


def prepare(spec, schedules, tolerance) -> Job:
    from ...gpt.checkpoint import NoSmearParameters
    from ...util.errors import UserError
    from ...util.defaults import PACKED
    from ...gpt.gpt_runners import runners
    from ...cli.build import build_setup

    if PACKED in schedules and len(schedules) > 1:
        raise UserError("--schedules packed measures documents against the packed row and runs on its own; "
                        "give it alone")
    if spec.documents is not None and PACKED not in schedules:
        raise UserError("--documents sizes the packed schedule; add --schedules packed")
    if spec.leak_limit is not None and PACKED not in schedules:
        raise UserError("--leak-limit gates the packed schedule; add --schedules packed")
    try:
        # every comparison has a float64 floor, and its forwards reuse the memory the last one freed
        setup = build_setup(spec, schedules=schedules, float64=True, keep_memory=True)
    except NoSmearParameters as e:
        found = getattr(e, "found", None)
        return Job(lambda bar: no_smear(spec, found))
    if PACKED in schedules:  # ours, the user's checkout, or both side by side
        from ...cli.packed import packed_job

        return packed_job(spec, setup, tolerance, _model_info(setup))
    if setup.audited is not None:
        return Job(lambda bar: _audit(setup, tolerance, bar), setup.loaded.name)
    return comparison_job(runners(setup.model, setup.logics, setup.loaded.name), setup.tokens, setup.schedules,
                          setup.options, tolerance, _model_info(setup), setup.threads)


def no_smear(spec, found) -> Report:
    from ...measure.jsondoc import header
    from ...cli.build import NO_SMEAR_VERDICT, checkpoint_info

    info = {"name": None if found is None else f"{found.leaf}@{found.step}",
            "source": None if found is None else str(found.leaf),
            "step": None if found is None else found.step, "checkpoint": checkpoint_info(found)}
    doc = header("compare" if spec.impl == "ours" else "audit", info, no_smear=True, runs=[],
                 verdict=NO_SMEAR_VERDICT)
    return AnswerReport(NO_SMEAR_VERDICT, doc)


class AuditReport(Report):
    """The audit of a user's checkout: its report, the smearcli.audit/1 document, --save."""

    def __init__(self, a, setup):
        self.audit, self.setup, self.footer = a, setup, setup.threads
        self.verdict, self.failed = a.verdict, a.failed
        self.info = _model_info(setup)

    def document(self) -> dict:
        from . import audit

        return audit.to_json(self.audit, self.info)

    def render(self, console) -> None:
        from . import audit
        from ...render.table import title_line

        audit.print_audit(self.audit, console, title_line(self.audit.comparison), footer=self.footer)

    def payload(self) -> dict:
        from . import audit

        return audit.save_payload(self.audit, self.info)

    def figure(self, schedule: str):
        from .audit import merged

        return merged(self.audit), None, ""


def _audit(setup, tolerance, bar) -> Report:
    from ...measure import runplan
    from . import audit

    reference = setup.model if setup.impl == "both" else None
    total = runplan.forward_runs(audit.planned(setup.audited, setup.schedules, reference)) * setup.tokens.size(1)
    seen = {"base": 0, "last": 0}

    def tokens(done, _total):  # the audit's comparisons one after the other, on one bar
        if done < seen["last"]:
            seen["base"] += seen["last"]
        seen["last"] = done
        bar.tokens(seen["base"] + done, total)
    a = audit.audit(setup.audited, setup.tokens, setup.schedules, setup.options, tolerance,
                    reference=reference, progress=bar.label, tokens_progress=tokens, name=setup.loaded.name)
    return AuditReport(a, setup)
