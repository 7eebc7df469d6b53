"""The smearcli program with a stand-in census, for tests that stop a scan with a signal: no
transformers, no torch model; `python tests/scan_standin.py scan ...` runs `smearcli scan ...`
over ARCHS with a check that marks its start and end in $STANDIN_MARKS and sleeps $STANDIN_SLEEP
seconds. With $STANDIN_TERM_AT_FORK=1, the first fork sends SIGTERM to the parent itself, at the
moment the worker is made (the worst one to be stopped), and each worker's pid is appended
to $STANDIN_FORKED."""

from __future__ import annotations

import os
import signal
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHS = [f"arch{i}" for i in range(6)]


def check(name: str, repro_dir=None):
    marks = Path(os.environ["STANDIN_MARKS"])
    (marks / f"started-{name}-{os.getpid()}").touch()
    time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))
    (marks / f"finished-{name}").touch()
    bug = name.endswith("3")
    from smearcli.judging import evidence
    from smearcli.census import record

    kept = evidence.Confirmation(0.5, "float32", 0.5, 0.0, "bug", "keeps its size in float64").to_json() if bug else None
    return record.new(name, "bug" if bug else "ok", max_abs=0.5 if bug else None, confirmation=kept,
                      worst_schedule="chunks of 16" if bug else None, notes=[f"stand-in for {name}"])


def install() -> None:
    """The stand-ins in place of transformers' list, the real check and the versions it reports."""
    import smearcli.engines.transformers as pkg
    from smearcli.cli.commands import scan as command
    from smearcli.tiny import derive

    fake = types.ModuleType("smearcli.engines.transformers.check")
    fake.check = check
    sys.modules[fake.__name__] = pkg.check = fake
    derive.causal_lm_types = lambda: list(ARCHS)
    command.meta = lambda: {"transformers_version": "stand-in", "torch_version": "-", "python": "-"}
    if os.environ.get("STANDIN_TERM_AT_FORK"):
        real_fork = os.fork

        def fork():
            os.kill(os.getpid(), signal.SIGTERM)  # held back until the worker is listed
            pid = real_fork()
            if pid and os.environ.get("STANDIN_FORKED"):
                with open(os.environ["STANDIN_FORKED"], "a") as f:
                    f.write(f"{pid}\n")
            return pid
        os.fork = fork


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    install()
    sys.argv = ["smearcli", *sys.argv[1:]]
    from smearcli.cli.app import run

    run()
