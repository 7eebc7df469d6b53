"""The llama.cpp worker as a subprocess: `call_worker(settings, request, workdir)` runs it, starts a
fresh one after each death (the schedule it died in is that schedule's crash, `death` says why with
llama.cpp's frame), and reads its result.json (`read_result`: trusted only once it is small, speaks
the protocol and has well-formed entries; anything else is the environment's fault, a UserError).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from ...util.errors import UserError
from ...impls import foreign
from ...impls.foreign import one_line, runnable
from . import forkserver
from .environment import ENGINE, PROTOCOL, hello, worker_env

# the worker's words (`environment`: the machine failed it, a torn state file; `inapplicable`: the
# schedule does not apply to the model) and its watchdog's exit status
RAISED, REFUSED, ENVIRONMENT, INAPPLICABLE, STUCK_EXIT = "raised", "refused", "environment", "inapplicable", 3


def garbage(s, what: str) -> UserError:
    return ENGINE.garbage(s.python, what)


def read_result(s, path: Path) -> dict:
    """result.json, trusted once it is small, speaks PROTOCOL and has well-formed entries."""
    res = foreign.read_json(ENGINE, s.python, path)
    entries = res.get("schedules")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                for e in entries):
        raise garbage(s, "its schedules are not a list of named entries")
    for e in entries:
        foreign.check_entry(ENGINE, s.python, e, (RAISED, REFUSED, ENVIRONMENT, INAPPLICABLE))
        foreign.check_counts(ENGINE, s.python, e, ("steps", "cuts"))
    return res


FRAME = re.compile(r"(\S+\.(?:c|cc|cpp|h|hpp)):(\d+): (.+)")


def death(rc: Optional[int], err: str, s) -> str:
    """Why the worker died, in one line, with llama.cpp's frame where it printed one (an assert's
    `file.cpp:LINE: message`), else the Python line that called into it (faulthandler)."""
    lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
    if rc is None:
        what = f"the llama.cpp worker ran past {s.timeout_s:g} s and was ended"
    elif rc == STUCK_EXIT:
        what = f"llama.cpp did not finish the schedule in {s.stuck_s:g} s (the watchdog ended the worker)"
    elif rc < 0:
        try:
            what = f"the llama.cpp worker was killed by {signal.Signals(-rc).name}"
        except ValueError:
            what = f"the llama.cpp worker was killed by signal {-rc}"
    else:
        what = f"the llama.cpp worker exited with status {rc}"
    frame = next((m for m in (FRAME.search(ln) for ln in reversed(lines)) if m), None)
    if frame is not None:
        path = frame.group(1).split("vendor/llama.cpp/")[-1]
        return f"{what} (at {path}:{frame.group(2)}: {one_line(frame.group(3), 200)})"
    py = [ln for ln in lines if ln.startswith("File ") and "worker.py" in ln]
    if py:
        return f"{what} (inside llama.cpp, called from {one_line(py[0], 200)})"
    return f"{what}: {one_line(lines[-1], 200)}" if lines else what


def call_worker(s, req: dict, workdir: Path) -> dict:
    """Run the worker on `req`, a fresh one after each death, until every schedule has its entry;
    the final result.json (arrays stay in `workdir`). The environment's own problems are the
    user's setup (UserError); a death inside llama.cpp is the schedule's crash."""
    env = worker_env(s.env)
    server = forkserver.serving(s.python, s.worker, s.env)
    if server is None:  # the census's server checked the environment when it started
        hello(s.python, s.worker, s.env)
    req_path = workdir / "request.json"
    req_path.write_text(json.dumps(req, allow_nan=False), encoding="utf-8")
    out = workdir / "result.json"
    start, deaths = time.time(), []
    wanted = len(req["schedules"]) + (2 if req.get("f16_too") else 0) + (1 if req.get("spread") else 0)
    while True:
        left = s.timeout_s - (time.time() - start)
        if server is not None:
            try:
                rc, err = forkserver.spawn(server, str(req_path), str(workdir), left)
            except forkserver.Gone as e:  # the census's machinery, not the model's: a fresh worker instead
                forkserver.forget(server)
                server = None
                sys.stderr.write(f"smearcli: llama.cpp's fork server: {e}; workers start afresh from here\n")
                hello(s.python, s.worker, s.env)
                continue
        else:
            rc, err = foreign.spawn([runnable(s.python), s.worker, str(req_path), str(workdir)], env, left)
        res = read_result(s, out) if out.is_file() else None
        if rc == 0 and res is not None and res.get("running") is None:
            break
        if rc == 0 and res is None:
            raise garbage(s, "it exited with status 0 without writing result.json")
        why = death(rc, err, s)
        running = res.get("running") if res else None
        if running in (None, "convert", "load"):  # nothing ran: no fresh worker would do better
            if req.get("gguf") and running == "load":
                raise UserError(f"{req['gguf']}: llama.cpp's loader died on it after smearcli's header check "
                                f"passed ({why}); the file is not one llama.cpp can load")
            res = res or {"protocol": PROTOCOL, "schedules": []}
            res["not_built"] = f"{'converting' if running == 'convert' else 'loading'} the model: {why}"
            break
        deaths.append(why)
        res["schedules"].append({"name": running, "outcome": RAISED, "message": why, "arrays": {}, "died": True})
        res["running"] = None
        tmp = out.with_suffix(".part")
        tmp.write_text(json.dumps(res, allow_nan=False), encoding="utf-8")
        tmp.replace(out)
        if len(res["schedules"]) >= wanted or time.time() - start > s.timeout_s:
            break
    res["wall_s"] = round(time.time() - start, 2)
    res["deaths"] = deaths
    return res
