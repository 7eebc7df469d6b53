"""Each architecture in its own process, with a time and a memory limit (smearcli scan, issue 21).

`scan(names, check, out)` forks one child per architecture (the parent has imported torch and
transformers once, so a child starts in milliseconds), at most `jobs` at a time. In the child:
`resource.setrlimit(RLIMIT_AS)` caps the memory, one thread, then `check(name)`; its record comes
back over a pipe as one JSON line. The parent kills a child that outlives its wall-clock limit.
A child that hangs, dies (a signal, an allocation refused) or raises is that architecture's
result (`crashed` with the reason), never the scan's end.

Records are appended to a JSON Lines file as they finish (flushed per line), so `resume` skips
what a killed scan already wrote; `shard(names, i, n)` picks every n-th name for one machine of a
CI matrix, and `merge(paths)` reads shard files back into one list (the last record of a name
wins, sorted by name), which is the same list a single scan writes.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from ...errors import UserError

DEFAULT_TIMEOUT = 240.0  # seconds per architecture
DEFAULT_MEMORY = 3 << 30  # bytes of address space per architecture


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal LM, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def shard(names: Sequence[str], index: int, count: int) -> list[str]:
    """The `index`-th (1-based) of `count` near-equal shares of `names`, round robin."""
    if count < 1 or not 1 <= index <= count:
        raise UserError(f"a shard is i/n with 1 <= i <= n, got {index}/{count}")
    return list(names)[index - 1::count]


def read_records(path: Path) -> list[dict]:
    """The records of a JSON Lines file; a torn last line (a killed scan) is skipped."""
    out = []
    if not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "model_type" in rec:
            out.append(rec)
    return out


def merge(paths: Iterable[Path]) -> list[dict]:
    """One record per model type from any number of scan files, sorted by model type."""
    by_name: dict[str, dict] = {}
    for p in paths:
        if not Path(p).exists():
            raise UserError(f"{p}: no such scan file")
        for rec in read_records(p):
            by_name[rec["model_type"]] = rec
    return [by_name[k] for k in sorted(by_name)]


def _child(check: Callable[[str], dict], name: str, fd: int, memory: Optional[int]) -> None:
    code = 0
    try:
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        try:
            import torch

            torch.set_num_threads(1)
        except Exception:
            pass
        try:
            rec = check(name)
        except MemoryError:
            rec = {"model_type": name, "verdict": "crashed",
                   "reason": f"out of memory: an allocation over the {memory >> 20} MiB limit was refused"}
        except BaseException as e:  # the check's own guard missed it: still this name's result
            rec = {"model_type": name, "verdict": "crashed", "reason": f"{type(e).__name__}: {e}"[:300]}
        data = (json.dumps(rec, default=str) + "\n").encode()
        while data:
            n = os.write(fd, data)
            data = data[n:]
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def _died(name: str, status: int, memory: Optional[int], wall: float) -> dict:
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        why = f"the process died of {sig}"
        if os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT) and memory:
            why += f" (memory limit {memory >> 20} MiB)"
    else:
        why = f"the process exited with status {os.WEXITSTATUS(status)} and no result"
    return {"model_type": name, "verdict": "crashed", "reason": why, "wall_s": round(wall, 2)}


def scan(names: Sequence[str], check: Callable[[str], dict], out: Path, jobs: int = 1,
         timeout: float = DEFAULT_TIMEOUT, memory: Optional[int] = DEFAULT_MEMORY, resume: bool = False,
         on_record: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """Check every name in its own process; append each record to `out`; the records of this run
    (those skipped by `resume` left out), in the order they finished."""
    if jobs < 1:
        raise UserError(f"jobs must be at least 1, got {jobs}")
    out = Path(out)
    done = {r["model_type"] for r in read_records(out)} if resume else set()
    if not resume and out.exists():
        out.unlink()
    if resume and out.exists():  # a torn last line (the scan was killed mid-write) is cut off
        data = out.read_bytes()
        if data and not data.endswith(b"\n"):
            out.write_bytes(data[:data.rfind(b"\n") + 1])
    todo = [n for n in names if n not in done]
    running: dict[int, tuple[str, int, float, bytearray]] = {}  # pid -> (name, read fd, start, buffer)
    results: list[dict] = []
    with open(out, "a") as sink:
        def finish(rec: dict) -> None:
            sink.write(json.dumps(rec, default=str) + "\n")
            sink.flush()
            results.append(rec)
            if on_record is not None:
                on_record(rec)

        while todo or running:
            while todo and len(running) < jobs:
                name = todo.pop(0)
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _child(check, name, w, memory)
                os.close(w)
                running[pid] = (name, r, time.monotonic(), bytearray())
            fds = {v[1]: pid for pid, v in running.items()}
            ready, _, _ = select.select(list(fds), [], [], 0.2)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                name, _, start, buf = running[fds[fd]]
                if chunk:
                    buf.extend(chunk)
                    continue
                pid = fds[fd]  # end of file: the child is done
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                del running[pid]
                wall = time.monotonic() - start
                try:
                    rec = json.loads(buf.decode())
                    rec.setdefault("wall_s", round(wall, 2))
                except ValueError:
                    rec = _died(name, status, memory, wall)
                finish(rec)
            now = time.monotonic()
            for pid, (name, fd, start, _) in list(running.items()):
                if now - start > timeout:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    os.close(fd)
                    del running[pid]
                    finish({"model_type": name, "verdict": "crashed",
                            "reason": f"timed out: no result within {timeout:g} s (a hang, or too slow)",
                            "wall_s": round(now - start, 2)})
    return results
