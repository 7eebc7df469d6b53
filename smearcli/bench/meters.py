"""What bench measures with: clocks (wall, CPU, a fake one for tests) synchronised with the
device, the matmul peak, the peak-memory meter, and the environment a result was measured in."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from ..gpt import flops as F

CLOCKS = {
    # wall time: what a user waits for
    "wall": time.perf_counter,
    # CPU time of the whole process (all threads): on a shared CPU it leaves out the time other
    # processes hold the cores, so with one thread it measures the work, not the queue
    "cpu": time.process_time,
}


class Timer:
    """Times a callable: synchronise the device, read the clock, run, synchronise, read again.

    `clock` is a name from CLOCKS or a callable returning seconds (tests pass a fake one)."""

    def __init__(self, device: torch.device | str = "cpu", clock: Union[str, Callable[[], float]] = "wall"):
        self.device = torch.device(device)
        if isinstance(clock, str):
            if clock not in CLOCKS:
                raise ValueError(f"unknown clock {clock!r}; choose from {', '.join(CLOCKS)}")
            if clock == "cpu" and self.device.type != "cpu":
                raise ValueError(f"the cpu clock cannot time work on {self.device.type}: use the wall clock")
            self.name, self.clock = clock, CLOCKS[clock]
        else:
            self.name, self.clock = getattr(clock, "__name__", "custom"), clock

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def measure(self, fn: Callable[[], object]) -> float:
        self.sync()
        t0 = self.clock()
        fn()
        self.sync()
        return self.clock() - t0


@dataclass
class Peak:
    size: int
    dtype: str
    samples: list[float]  # seconds per matmul, timed ones only
    warmup: int = 0  # untimed matmuls before them

    @property
    def flops(self) -> int:
        return F.matmul_flops(self.size, self.size, self.size)

    @property
    def flops_per_s(self) -> float:
        """The best observed rate: a peak is what the hardware can do, not what it usually does."""
        return self.flops / min(self.samples)

    @property
    def method(self) -> str:
        return (f"{self.size}x{self.size} {self.dtype} matmul, best of {len(self.samples)} after "
                f"{self.warmup} warm-up")


def measure_peak(device: torch.device, dtype: torch.dtype, timer: Timer, size: Optional[int] = None,
                 warmup: int = 3, repeats: int = 10, warmup_s: float = 0.5, max_s: float = 3.0,
                 tick: Optional[Callable[[str], None]] = None) -> Peak:
    """Best of `repeats` square matmuls in `dtype` on `device`, after at least `warmup` untimed
    ones and `warmup_s` seconds of them (caches, clocks and thread pools settle), stopping early
    after `max_s` seconds of timed ones (at least 3 are kept)."""
    n = size or (2048 if device.type == "cpu" else 8192)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    tick = tick or (lambda what: None)
    done_warm, spent = 0, 0.0
    with torch.inference_mode():
        while done_warm < warmup or (spent < warmup_s and done_warm < 20 * warmup):
            tick("peak (warm-up)")
            spent += timer.measure(lambda: torch.mm(a, b))
            done_warm += 1
        samples: list[float] = []
        while len(samples) < repeats and (len(samples) < 3 or sum(samples) < max_s):
            tick("peak")
            samples.append(timer.measure(lambda: torch.mm(a, b)))
    return Peak(n, str(dtype).removeprefix("torch."), samples, done_warm)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _proc_status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
        return True
    except OSError:
        return False


def _maxrss_bytes() -> Optional[int]:
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB on Linux


class MemoryMeter:
    """Peak memory a callable adds: `meter.measure(fn)` -> bytes, or None where unknown.

    CUDA: the allocator's peak (torch.cuda.max_memory_allocated) above what was allocated before.
    CPU on Linux: VmHWM after the run minus VmRSS before it, with VmHWM reset first and freed heap
    returned to the OS (malloc_trim) so the run's allocations show up as growth. Elsewhere on CPU:
    the growth of ru_maxrss, which never resets (a lower bound after the first big run)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.kind = "cuda allocator peak"
        elif self.device.type == "cpu":
            self.kind = "peak RSS growth" if _proc_status_kb("VmHWM") is not None and _reset_hwm() \
                else "ru_maxrss growth"
        else:
            self.kind = "unavailable"
        self._libc = _libc() if self.device.type == "cpu" else None

    def measure(self, fn: Callable[[], object]) -> Optional[int]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - base)
        if self.device.type != "cpu":
            fn()
            return None
        if self.kind == "peak RSS growth":
            trim = getattr(self._libc, "malloc_trim", None)  # glibc only
            if trim is not None:
                trim(0)
            _reset_hwm()
            base = _proc_status_kb("VmRSS")
            fn()
            peak = _proc_status_kb("VmHWM")
            return None if base is None or peak is None else max(0, (peak - base) * 1024)
        base = _maxrss_bytes()
        fn()
        after = _maxrss_bytes()
        return None if base is None or after is None else max(0, after - base)


# -- environment ----------------------------------------------------------------------------------
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What the numbers were measured on: device, its name, threads, torch, dtype, load."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = env["cpu"] if device.type == "cpu" else device.type
    if hasattr(os, "getloadavg"):
        env["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return env
