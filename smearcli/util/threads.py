"""How many CPU threads torch uses: one rule for every command and example. Torch's own choice,
except on a machine whose cores other processes already keep busy, where extra threads only wait
on each other (a d4 decode on 2 threads of a 2-core machine at load 8 ran ~10x slower than on 1;
the default compare took 21-45 s there, 4-6 s on one thread)."""

from __future__ import annotations

import os
from typing import Optional


def load_and_cores(loadavg: Optional[float] = None, cpu_count: Optional[int] = None):
    """(1-minute load average or None where the OS has none, CPU cores)."""
    if loadavg is None:
        try:
            loadavg = os.getloadavg()[0]
        except (AttributeError, OSError):
            loadavg = None
    return loadavg, cpu_count or os.cpu_count() or 1


def busy_cpu_threads(loadavg: Optional[float] = None, cpu_count: Optional[int] = None) -> Optional[int]:
    """1 when other processes keep every core busy (load average >= cores > 1), else None
    (torch's default)."""
    load, cores = load_and_cores(loadavg, cpu_count)
    return 1 if load is not None and cores > 1 and load >= cores else None


def use_threads(threads: Optional[int] = None, loadavg: Optional[float] = None,
                cpu_count: Optional[int] = None) -> str:
    """Apply the rule (or `threads`, when given) to torch and say what was chosen and why, as
    "threads: 1 (load 3.2 on 2 cores)"."""
    import torch

    load, cores = load_and_cores(loadavg, cpu_count)
    where = f"load {load:.1f} on {cores} cores" if load is not None else f"{cores} cores"
    if threads is not None:
        reason = f"as asked; {where}"
    else:
        threads = busy_cpu_threads(load, cores)
        reason = where if threads is not None else f"torch's default; {where}"
    if threads is not None:
        torch.set_num_threads(threads)
    return f"threads: {torch.get_num_threads()} ({reason})"
