"""Freed memory kept for the next forward, in a process that runs one model (`compare`, `plot`).

glibc's malloc hands every block over 32 MB (its largest mmap threshold) to the kernel as a
mapping of its own and unmaps it when freed. A forward at d12 over 1024 tokens frees several such
blocks (the logits alone are 256 MB), so the next forward maps them again, and the kernel zeroes
and faults in every page anew: 4.5M page faults of a 6.3M total in a default compare, 28-31 s of
system time in a 71-73 s run. With mmap off and the heap's top kept (`keep_freed`), freed blocks
stay in the heap and the next forward reuses pages already mapped: 1.4M faults in the forwards,
the compare 14% sooner (docs/speed.md), its peak memory 6-8% higher (blocks that cannot be
coalesced).

Only for a process smearcli owns (the command line), and not for a census, which loads hundreds
of models in one process and must give their memory back, nor for `bench`, whose peak-memory
column is the process's growth during a run: with blocks kept, that would read how glibc's heap
fragments (prefill at d12 / 512 tokens: 596 MiB with them kept, 476 MiB without), not what the
schedule needs. A no-op where the C library is not glibc. Torch-free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (glibc's malloc.h)
M_MMAP_MAX = -4
KEEP = 2**31 - 1  # the largest threshold mallopt takes (an int): the heap's top is never trimmed below


def keep_freed() -> bool:
    """Turn off glibc's per-block mappings and the trimming of the heap's top, for this process:
    True when glibc took both settings, False elsewhere (another C library, or none found)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))
