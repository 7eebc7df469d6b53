"""Pre-flight checks: refuse, before any heavy work, what this machine cannot run.

- `check_dtype`: run the model's operations once on a few numbers in the requested dtype, so a
  device without the kernels is refused with one line instead of failing mid-run.
- Memory estimates, from the configuration alone: `model_bytes` (building a model),
  `load_bytes` (loading a checkpoint file), `run_bytes` (a `compare` run: every run's logits and
  hidden states are kept for comparison, plus the largest step's activations and KV cache).
  `check_memory` compares an estimate with the memory available now (on Linux MemAvailable and
  the effective limit of this process's own cgroup, v1 or v2, its ancestors included; on CUDA `torch.cuda.mem_get_info`) and raises a `UserError` that states
  both, so a run that cannot fit is refused up front instead of being killed by the OS.
- `check_inflation`: a checkpoint's compressed records, from the zip index, against what the
  config's weights can take (a deflate bomb is refused before anything is inflated).

The estimates aim at an upper bound of the peak: they were checked against the measured peak
resident memory of `compare` runs on CPU, and tests/cli/test_refusals.py checks that they cover
every tensor `compare` keeps. Where the available memory cannot be read, nothing is refused.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional, Sequence

from .errors import UserError
from ..gpt.model import param_shapes
from .formatters import nbytes

FP32 = 4
RUN_OVERHEAD = 64 << 20  # allocator slack, Python objects, metric bookkeeping (measured on small runs)
# a process that keeps what it frees (`allocator.keep_freed`) holds blocks it cannot coalesce: the
# default compare at d12 / 1024 tokens took 6.6 GiB beyond its model and float64 copy with them
# kept, 6.0 GiB without, against 5.8 estimated
KEPT_SLACK = 0.15


def device_kind(device) -> str:
    """"cpu", "cuda", ... of a torch.device or of its name ("cuda:0")."""
    return getattr(device, "type", str(device).split(":")[0])


class TooLarge(UserError):
    """A model or run that does not fit in the memory available now."""


EXACT_LAYERS = 8  # deeper models are counted from the inventory of 1, 2 and 3 layers


def param_count(config) -> int:
    """Parameters of `GPT(config)`, from the model's own inventory (nothing allocated).

    The inventory builds the model on the meta device, about a millisecond a layer: a config of a
    million layers would keep the preflight busy for minutes before it could refuse it. Beyond
    EXACT_LAYERS, the count comes from the inventories of 1, 2 and 3 layers: every layer adds the
    same block, and every other layer a value embedding (the last always has one)."""
    n = config.n_layer
    if n <= EXACT_LAYERS:
        return _inventory_count(config)
    p1, p2, p3 = (_inventory_count(dataclasses.replace(config, n_layer=k)) for k in (1, 2, 3))
    block = p2 - p1  # n=1 and n=2 both have one value-embedding layer
    ve = p3 - p2 - block  # n=3 has two
    return p1 - block - ve + n * block + (n + 1) // 2 * ve


def _inventory_count(config) -> int:
    return sum(math.prod(shape) for shape in param_shapes(config).values())


def _itemsize(dtype) -> int:
    return {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}.get(str(dtype).removeprefix("torch."), 4)


def rotary_bytes(config) -> int:
    # fp32 angles, then cos and sin kept in the compute dtype: bounded by four fp32 tables
    return config.rotary_len * (config.head_dim // 2) * FP32 * 4


def model_bytes(config) -> int:
    """Building the model: fp32 master weights (embeddings may be narrower later) + rotary table."""
    return param_count(config) * FP32 + rotary_bytes(config)


def load_bytes(config, file_bytes: int, mmap: bool = False) -> int:
    """Loading a checkpoint: the model, fp32 copies of narrower tensors, and the file's tensors
    unless the file is memory-mapped (then they are page cache, read on use and reclaimable)."""
    return (0 if mmap else file_bytes) + 2 * param_count(config) * FP32 + rotary_bytes(config)


def run_bytes(config, batch: int, seq_len: int, schedules: Sequence[str], logics: Sequence[str],
              samples: int = 1, max_chunk: Optional[int] = None, dtype="float32") -> int:
    """Peak memory of a `compare` run beyond the model: kept results + the largest transient."""
    B, T, L, C, H = batch, seq_len, config.n_layer, config.n_embd, config.n_head
    V, Vp = config.vocab_size, config.padded_vocab_size
    db = _itemsize(dtype)
    kv = 2 * L * config.n_kv_head * config.head_dim * db  # cache bytes per row and position
    kept_row = T * (V + (L + 1) * C) * FP32  # one row's logits and captured hidden states

    def step(rows: int, n: int, keys: int) -> int:
        act = rows * n * (24 * C * db + Vp * db + 3 * V * FP32)  # residual stream, q/k/v, mlp, head
        scores = rows * H * n * keys * (db + FP32) + n * keys  # attention weights and mask
        return act + scores

    runs = ["full"] + [s for s in schedules for _ in logics]
    if "decode" not in schedules:
        runs.append("decode")  # headroom: one decode run counted even when none is asked for, so the estimate does not shrink
    kept, transient = 0, 0
    for s in runs:
        rows = B * samples if s == "engine" else B
        n = T if s in ("full", "prefill", "speculative", "engine") else 1
        if s == "chunked":
            n = min(T, max_chunk or T)
        own = rows * kept_row
        cache = 0 if s == "full" else rows * T * kv
        # while a run ends, its per-step outputs and their concatenation coexist
        transient = max(transient, cache + step(B if s == "engine" else rows, n, T) + own)
        kept += own
    # metrics: per-layer differences and a double-precision KL over the largest run's logits
    rows_max = B * samples if "engine" in schedules else B
    metrics = rows_max * T * ((L + 2) * C * FP32 + 5 * V * 8)
    return kept + max(transient, metrics) + RUN_OVERHEAD


# -- what is available ---------------------------------------------------------------------------
def _read_int(path: str) -> Optional[int]:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", fs_root: str = "/sys/fs/cgroup") -> Optional[int]:
    """Bytes this process's cgroup (v2, or v1's memory controller) may still allocate: the minimum of
    limit - usage over its own cgroup and every ancestor up to the root, or None with no limit.

    /proc/self/cgroup names the process's cgroup ("0::/path" on v2, "N:...memory...:/path" on v1);
    a container that mounts only its own cgroup at the root is covered by the root's files."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    places = []  # (directory of the hierarchy, the process's path in it, limit file, usage file)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            places.append((fs_root, parts[2], "memory.max", "memory.current"))
        elif "memory" in parts[1].split(","):
            places.append((f"{fs_root}/memory", parts[2], "memory.limit_in_bytes", "memory.usage_in_bytes"))
    if not places:
        places = [(fs_root, "/", "memory.max", "memory.current"),
                  (f"{fs_root}/memory", "/", "memory.limit_in_bytes", "memory.usage_in_bytes")]
    room = None
    for base, rel, limit_name, usage_name in places:
        d = Path(base, *[p for p in rel.split("/") if p and p != ".."])
        for _ in range(64):  # the own cgroup, then each ancestor up to the hierarchy's root
            limit, usage = _read_int(str(d / limit_name)), _read_int(str(d / usage_name))
            if limit is not None and usage is not None and limit < (1 << 60):
                here = max(limit - usage, 0)
                room = here if room is None else min(room, here)
            if d == Path(base) or d == d.parent:
                break
            d = d.parent
    return room


def meminfo_available() -> Optional[int]:
    """MemAvailable from /proc/meminfo (bytes), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_available() -> Optional[int]:
    """Bytes this process may still allocate: MemAvailable, capped by the effective cgroup limit."""
    avail = meminfo_available()
    if avail is None:
        return None
    room = cgroup_room()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail


def available(device) -> Optional[int]:
    """Free memory on `device` (bytes), or None where it cannot be read."""
    kind = device_kind(device)
    if kind == "cuda":
        import torch
        try:
            free, _total = torch.cuda.mem_get_info(device)
        except (RuntimeError, AssertionError, ValueError):
            return None
        return int(free)
    if kind == "cpu":
        return host_available()
    return None  # mps shares host memory through its own allocator: no reliable figure


def check_memory(needed: int, device, what: str, hint: str) -> None:
    """Refuse when `needed` bytes exceed what `device` has free."""
    avail = available(device)
    if avail is not None and needed > avail:
        kind = device_kind(device)
        where = "GPU memory" if kind == "cuda" else "memory"
        raise TooLarge(f"{what} needs about {nbytes(needed)} of {where}, {nbytes(avail)} available; {hint}")


def check_model_memory(config, device, file: Optional[Path] = None, mmap: bool = False) -> None:
    """Before building a model (and reading its checkpoint file, if any; `mmap`: it will be
    memory-mapped)."""
    kind = device_kind(device)
    if file is not None:
        from .files import regular_file, uncompressed_size

        regular_file(file, file.name)  # before any open: a FIFO would block
        size = uncompressed_size(file)  # the zip index's sizes: a compressed member inflates
        check_memory(load_bytes(config, size, mmap), "cpu", f"{file.name}: loading it ({nbytes(size)} of "
                     f"tensors, {param_count(config):,} parameters)", "free memory or use a machine with more"
                     + (" (the file is memory-mapped: its bytes are not counted)" if mmap else ""))
        check_inflation(config, file)
    else:
        check_memory(model_bytes(config), "cpu", f"the model ({param_count(config):,} parameters)",
                     "choose a smaller model")
    if kind == "cuda":
        check_memory(model_bytes(config), device, f"the model ({param_count(config):,} parameters)",
                     "use a smaller model or run on the CPU")


RECORD_SLACK = 16 << 20  # beside the tensors: the pickle and the format's records, kilobytes in practice


def check_inflation(config, file: Path) -> None:
    """Refuse, from the zip index alone (before anything is inflated), a torch file whose compressed
    records declare more bytes than the tensors of `config` can take: torch.save compresses
    nothing, a compressed record is inflated whole in memory, and a few KiB of zeros on disk can
    declare a GiB. The bound: every parameter at 8 bytes (float64), plus RECORD_SLACK."""
    import zipfile

    try:
        with zipfile.ZipFile(file) as z:
            inflated = sum(i.file_size for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # not a zip archive (a legacy pickle), or a corrupt one: the file check says which
    params = param_count(config)
    bound = params * 8 + RECORD_SLACK
    if inflated > bound:
        raise UserError(f"{file.name}: its compressed records inflate to {nbytes(inflated)}, more than the "
                        f"{params:,} parameters of model_config take ({nbytes(bound)} at most); it holds "
                        "more than this model's weights (torch.save compresses nothing: was it re-zipped?)")


def check_run_memory(config, device, batch: int, seq_len: int, schedules: Sequence[str],
                     logics: Sequence[str], samples: int, max_chunk: Optional[int], dtype,
                     hint: str = "use fewer tokens, rows or samples, or fewer schedules", kept: bool = False) -> None:
    """Before generating input or running anything: the whole run's estimate (the model is loaded
    already, so what is available excludes it); `kept`: this process keeps the memory it frees
    (`KEPT_SLACK` more)."""
    need = run_bytes(config, batch, seq_len, schedules, logics, samples, max_chunk, dtype)
    if kept and device_kind(device) == "cpu":
        need += int(need * KEPT_SLACK)
    runs = 1 + len(schedules) * len(logics) + ("decode" not in schedules)
    engine = f", engine rows x {samples}" if "engine" in schedules else ""
    check_memory(need, device, f"the run ({batch} x {seq_len} tokens{engine}; {runs} runs whose logits and "
                 "hidden states are kept for comparison)",
                 hint)


# -- dtype ---------------------------------------------------------------------------------------
_PROBED: dict = {}


def check_dtype(device, dtype) -> None:
    """Run each kind of operation the model uses once, in `dtype` on `device`; refuse if any fails."""
    import torch
    import torch.nn.functional as F

    key = (str(device), dtype)
    if key not in _PROBED:
        err = None
        try:
            x = torch.linspace(-1, 1, 2 * 4 * 16, device=device).view(2, 4, 16).to(dtype)
            w = torch.linspace(-1, 1, 16 * 16, device=device).view(16, 16).to(dtype)
            y = F.rms_norm(F.linear(x, w), (16,))
            y = F.relu(y).square() + torch.sigmoid(y) * 3
            ids = torch.arange(4, device=device).view(1, 4)
            e = F.embedding(ids, w)
            q = y.view(2, 4, 2, 8).transpose(1, 2)
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            mask = torch.ones(4, 4, dtype=torch.bool, device=device).tril()
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            torch.tanh(out.float() / 15.0).sum().item()
            e.float().sum().item()
        except (RuntimeError, NotImplementedError, TypeError) as ex:
            err = (str(ex).strip().splitlines() or [type(ex).__name__])[0]
        _PROBED[key] = err
    err = _PROBED[key]
    if err is not None:
        name = str(dtype).removeprefix("torch.")
        raise UserError(f"{name}: {device} cannot run it ({err}); float32 runs everywhere")
