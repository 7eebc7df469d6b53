"""The census on vLLM (the scan's vLLM engine): every architecture the installed vLLM
registers that transformers has a causal-LM class for, each on its tiny config in vLLM against
the same weights' full pass in transformers (`vllm_check`), with one vLLM process for them all
(`vllm_engine.Worker`) and each architecture in its own forked process (`isolate`).

The engine's `Session` (`census.engines`) runs in the census's one loop (`isolate.census`: the
record file, resuming, shards and merging are the transformers census's), `summary(...)` is the
benchmark (the census's wall time and the shares spent importing vLLM and starting engines),
`sections(...)` the engine's own part of the census's page (`report.markdown`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..verdicts import CRASHED, NOT_BUILT, UNCONFIRMED
from . import vllm_check
from .report import sort_key
from .vllm_engine import Worker, archs
from .record import Record
from .reference import model_types

SKIP = str(NOT_BUILT)  # an architecture the census could not run, with why
ENGINE_REFUSED = vllm_check.ENGINE_REFUSED
FINDINGS = (str(CRASHED), str(UNCONFIRMED))


def names_for(worker: Worker) -> list[str]:
    """Every model type this census can check: vLLM's architectures with a transformers
    causal-LM class."""
    return model_types(archs(worker))


def check_one(name: str, worker: Worker, timeout: float, memory: Optional[int], repro_dir: Path) -> Record:
    """One architecture's record, in its forked process; its wait on vLLM ends before isolate's."""
    rec = vllm_check.check(name, worker, timeout=max(5.0, timeout - 10.0), memory=memory, repro_dir=repro_dir)
    # the imports so far, as this process saw them: a census stopped early still has its benchmark
    rec.vllm = {**(rec.vllm or {}), "import_s_so_far": round(worker.import_s, 2), "starts": worker.starts}
    return rec


# where a refusal is the model's own whatever the process served before: vLLM validating the
# config (`ModelConfig`), before any engine or kernel state exists
CONFIG_FRAMES = ("(at vllm/engine/arg_utils.py:", "(at vllm/config/")


def refused_by_the_process(rec: Record) -> bool:
    """Whether an engine refusal may be the worker process's rather than the model's: any refusal
    but vLLM's config validation. What an earlier model left in a process can refuse the next:
    vLLM 0.32's process-wide parallel state ("expert parallel group is not initialized", a MoE
    after others), and, once a model's module has imported llvmlite (numba), every later engine
    ("'_lib_fn_wrapper' object has no attribute 'get'", vLLM's kernel rebinding scanning the
    process's modules)."""
    reason = str(rec.reason or "")
    return (rec.verdict == SKIP and reason.startswith(ENGINE_REFUSED)
            and not any(f in reason for f in CONFIG_FRAMES))


class Session:
    """The vLLM engine's census (`census.engines`): one worker (`vllm_engine.Worker`) for every
    architecture, each checked in its own forked process, one at a time. Between architectures a
    worker that died, hung or left an answer unread is started again; an engine vLLM refused in a
    worker that had served others is checked again in a fresh one before it counts, unless vLLM's
    config validation refused it (`refused_by_the_process`)."""

    def __init__(self, worker: Worker, python: Optional[str] = None, quiet: bool = True):
        self.worker, self.python, self.quiet = worker, python, quiet
        self.t0 = time.monotonic()
        self.done: list[Record] = []
        self.again: Optional[str] = None  # the architecture being checked again

    def model_types(self) -> list[str]:
        return names_for(self.worker)

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record:
        return check_one(model_type, self.worker, timeout, memory, repro_dir)

    def checked(self, rec: Record, more: bool) -> bool:
        w = self.worker
        w.served += 1
        if rec.model_type == self.again:
            rec.notes = list(rec.notes or []) + ["checked again in a fresh vLLM process"]
        elif refused_by_the_process(rec) and w.served > 1:
            w.kill()
            w.start()
            self.again = rec.model_type
            return True
        self.done.append(rec)
        clean = (rec.vllm or {}).get("answered") and not (rec.vllm or {}).get("stuck")
        if more and (not clean or not w.alive()):
            w.kill()
            w.start()
        return False

    def meta(self) -> dict:
        """vLLM's version and the benchmark (said on stderr unless quiet)."""
        bench = summary(self.done, self.worker, time.monotonic() - self.t0)
        if not self.quiet:
            sys.stderr.write("smearcli: " + summary_line(bench) + "\n")
        return {"engine": "vllm", "vllm_version": self.worker.ready.get("vllm"), "vllm_python": self.python,
                "benchmark": bench}

    def close(self) -> None:
        self.worker.close()


def open_session(python: str, quiet: bool = False) -> Session:
    """vLLM's environment checked by its handshake (a UserError when it is not one), then its
    worker started (vLLM imported): the census's fixed cost."""
    from ..impls.vllm.environment import check_python

    check_python(python)
    t0 = time.monotonic()
    w = Worker(python)
    w.start()
    s = Session(w, python, quiet)
    s.t0 = t0
    return s


def summary(recs: Sequence[Record], worker: Optional[Worker], wall_s: float) -> dict:
    """The benchmark: wall time, and the time importing vLLM and starting engines, with shares."""
    engines = sum(float(s or 0) for r in recs for s in (r.vllm or {}).get("engine_start_s") or [])
    imports = worker.import_s if worker is not None else 0.0
    share = (lambda x: round(100 * x / wall_s, 1) if wall_s > 0 else None)
    return {"wall_s": round(wall_s, 1), "architectures": len(recs), "vllm_import_s": round(imports, 1),
            "vllm_imports": worker.starts if worker is not None else 0, "vllm_import_share": share(imports),
            "engine_start_s": round(engines, 1), "engine_start_share": share(engines)}


def summary_line(s: dict) -> str:
    return (f"census on vLLM: {s['architectures']} architectures in {s['wall_s']:g} s; importing vLLM "
            f"{s['vllm_import_s']:g} s ({s['vllm_import_share']}%, {s['vllm_imports']} start(s)), starting engines "
            f"{s['engine_start_s']:g} s ({s['engine_start_share']}%)")


def _cell(text, n: int = 120) -> str:
    return str(text or "").replace("|", "/").replace("\n", " ")[:n]


def _departure(r: dict) -> str:
    """Why a departure is what it is: the prefill note when the one-step path departs too (the
    model, not a cache), else the confirmation's why."""
    said = [n for n in r.notes or [] if n.startswith("prefill")]
    return said[0] if said else (r.confirmation or {}).get("why") or ""


def sections(recs: Sequence[Record], meta: dict) -> list[str]:
    """The vLLM engine's page (`report.markdown` puts the title and counts above): findings with
    reproducers, what could not run and why, then every architecture."""
    out = []
    found = [r for r in sorted(recs, key=sort_key) if r.verdict in FINDINGS]
    if found:
        out += ["## Findings", "", "vLLM has no float64 form, so a departure reads unconfirmed; a crash is "
                "vLLM's own frame. Each reproducer needs only vLLM's environment and exits 1 while the bug is there.",
                "", "| architecture | verdict | schedule | max abs dlogprob | why | reproducer (exit) |",
                "|---|---|---|---|---|---|"]
        for r in found:
            rep = f"`{Path(r.reproducer).name}` ({r.reproducer_status})" if r.reproducer else "-"
            err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
            out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | "
                       f"{_cell(r.reason or _departure(r))} | {rep} |")
        out.append("")
    skipped = [r for r in sorted(recs, key=lambda r: r.model_type) if r.verdict == SKIP]
    if skipped:
        out += ["## Not run on the CPU backend", "", "| architecture | why |", "|---|---|"]
        out += [f"| {r.model_type} | {_cell(r.reason, 200)} |" for r in skipped]
        out.append("")
    out += ["## Every architecture", "", "| architecture | verdict | worst schedule | error | x floor | notes |",
            "|---|---|---|---|---|---|"]
    for r in sorted(recs, key=sort_key):
        err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
        mult = "-" if r.multiple is None else f"{r.multiple:.2g}"
        notes = "; ".join(r.notes or []) or (r.reason if r.verdict != SKIP else "")
        out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | {mult} | "
                   f"{_cell(notes)} |")
    return out
