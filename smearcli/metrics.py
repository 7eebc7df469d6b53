"""How far a run is from the reference, per position and per layer, in units a person can act on.

Capture points ("layers"): the post-smear embedding `emb`, every block's output `block0..`, and
the `logits`. For each run against the reference (same inputs, same weights):

- abs error per (layer, position): max |run - ref| over rows and channels;
- relative error: that divided by the largest |ref| at the same (layer, position);
- the noise floor, measured: decode against full (no smear logic is involved in that pair,
  since both logics treat one-token steps the same), per layer, never below one ulp of the
  layer's scale; errors are reported as multiples of it;
- for logits: KL(ref || run) per position, top-1 agreement;
- where the error is born: its share on chunk starts and the first (layer, position) above
  `NOISE_MARGIN` x the floor;
- the analytic check: at a chunk start t the old logic misses exactly gate_t * x_{t-1}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .names import NOISE_MARGIN, layer_names  # noqa: F401 (layer_names: re-exported)
from .schedules import RunResult


def _stack(run: RunResult) -> list[Tensor]:
    return list(run.hiddens or []) + [run.logits]


def abs_error(ref: RunResult, run: RunResult) -> Tensor:
    """(layers, T): max |run - ref| over rows and channels at every capture point."""
    out = []
    for r, x in zip(_stack(ref), _stack(run)):
        out.append((x - _rows(r, run.row_map)).abs().amax(dim=(0, 2)))
    return torch.stack(out)


def ref_scale(ref: RunResult) -> Tensor:
    """(layers, T): max |ref| over rows and channels."""
    return torch.stack([x.abs().amax(dim=(0, 2)) for x in _stack(ref)])


@dataclass
class NoiseFloor:
    per_layer: list[float]  # one value per capture point
    source: str = "decode vs full, max over positions, at least one ulp of the layer's scale"
    measured_logits: float = 0.0  # decode's logits distance from the full pass, before the ulp minimum

    def tensor(self) -> Tensor:
        return torch.tensor(self.per_layer).unsqueeze(1)


def noise_floor(ref: RunResult, decode: RunResult, dtype: torch.dtype) -> NoiseFloor:
    measured = abs_error(ref, decode).amax(dim=1)
    # one ulp of the compute dtype at the layer's largest value: a zero floor would make every
    # multiple infinite, and rounding in the compute dtype is the least noise any run can have
    ulp = torch.finfo(dtype).eps * ref_scale(ref).amax(dim=1)
    return NoiseFloor(torch.maximum(measured, ulp).tolist(), measured_logits=float(measured[-1]))


KL_CHUNK = 32  # positions per block of the double-precision KL: stays in cache, no (R, T, V) doubles


def _rows(ref: Tensor, row_map: list[int]) -> Tensor:
    """ref's rows in run order; ref itself when that is every row in order (no copy)."""
    return ref if row_map == list(range(ref.size(0))) else ref[torch.tensor(row_map)]


def kl_per_position(ref_logits: Tensor, run_logits: Tensor, row_map: list[int]) -> Tensor:
    """(T,): KL(ref || run) in nats, max over rows. Computed KL_CHUNK positions at a time: each
    position's sum is the same reduction either way (tests/test_perf.py checks it bit for bit),
    with a fraction of the memory traffic."""
    ref_logits = _rows(ref_logits, row_map)
    R, T = run_logits.shape[:2]
    kl = torch.empty(R, T, dtype=torch.float64, device=run_logits.device)
    for s in range(0, T, KL_CHUNK):
        p = F.log_softmax(ref_logits[:, s:s + KL_CHUNK].double(), dim=-1)
        q = F.log_softmax(run_logits[:, s:s + KL_CHUNK].double(), dim=-1)
        kl[:, s:s + KL_CHUNK] = (p.exp() * (p - q)).sum(-1)
    return kl.amax(dim=0).clamp_min(0).float()


@dataclass
class RunMetrics:
    schedule: str
    logic: str
    steps: list[int]
    chunk_starts: list[int]
    abs_err: Tensor  # (layers, T)
    rel_err: Tensor  # (layers, T)
    kl: Tensor  # (T,)
    top1_agreement: float
    noise: NoiseFloor
    tolerance: float  # multiple of the logits noise floor allowed by --check

    @property
    def max_abs_logits(self) -> float:
        return float(self.abs_err[-1].max())

    @property
    def multiple_of_noise(self) -> list[float]:
        """Per layer: max abs error / that layer's noise floor."""
        return (self.abs_err.amax(dim=1) / self.noise.tensor().squeeze(1)).tolist()

    @property
    def logits_multiple(self) -> float:
        return self.multiple_of_noise[-1]

    @property
    def chunk_start_share(self) -> Optional[float]:
        """Share of the post-smear embedding's error that sits on chunk starts (None: no starts)."""
        return self.chunk_start_share_at(0)

    def chunk_start_share_at(self, layer: int) -> Optional[float]:
        """Share of one capture point's error that sits on chunk starts. None when there are no
        starts or when that capture point never leaves NOISE_MARGIN x its floor: the share of pure
        rounding noise that happens to sit on chunk starts says nothing, and differs between CPUs."""
        if not self.chunk_starts:
            return None
        e = self.abs_err[layer]
        if not bool((e > NOISE_MARGIN * self.noise.per_layer[layer]).any()):
            return None
        return float(e[self.chunk_starts].sum()) / float(e.sum())

    @property
    def first_departure(self) -> Optional[tuple[int, int]]:
        """(layer index, position) of the earliest position where any layer leaves the noise
        floor by NOISE_MARGIN, lowest layer first; None if the run stays within noise."""
        above = self.abs_err > NOISE_MARGIN * self.noise.tensor()
        if not above.any():
            return None
        pos = int(above.any(dim=0).nonzero()[0])
        layer = int(above[:, pos].nonzero()[0])
        return layer, pos

    @property
    def positions_above_noise(self) -> int:
        """How many positions' logits are off by more than NOISE_MARGIN x the floor: how far the
        error born at chunk starts has spread through attention."""
        return int((self.abs_err[-1] > NOISE_MARGIN * self.noise.per_layer[-1]).sum())

    @property
    def kl_max(self) -> float:
        return float(self.kl.max())

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def passed(self) -> bool:
        return self.logits_multiple <= self.tolerance


def measure(ref: RunResult, run: RunResult, noise: NoiseFloor, tolerance: float = NOISE_MARGIN) -> RunMetrics:
    err = abs_error(ref, run)
    rel = err / ref_scale(ref).clamp_min(torch.finfo(torch.float32).tiny)
    top1 = (_rows(ref.logits, run.row_map).argmax(-1) == run.logits.argmax(-1)).float().mean().item()
    return RunMetrics(run.schedule, run.logic, list(run.steps), run.chunk_starts, err, rel,
                      kl_per_position(ref.logits, run.logits, run.row_map), top1, noise, tolerance)


@dataclass
class AnalyticCheck:
    """At chunk start t, old minus reference at the first capture point should be
    -scale * gate_t * x_{t-1}."""
    position: int
    predicted: float  # max |scale * gate_t * x_{t-1}| over rows and channels
    measured: float  # max |old - ref| at the first capture point
    residual: float  # max |(ref - old) - scale * gate_t * x_{t-1}|: should be rounding noise


@torch.inference_mode()
def analytic_check(runner, tokens: Tensor, ref: RunResult, old: RunResult) -> list[AnalyticCheck]:
    """The error the old logic makes at each chunk start, against the exact term it drops.

    `runner.smear_terms(tokens)` (a runner that declares `runner.SMEAR_TERMS`) gives the pre-smear
    embedding x (B, T, C), the gate (B, T, 1) and the scale between the post-smear embedding and
    the first capture point (1 for our model, whose first capture point is the post-smear
    embedding itself). Empty when the runs carry no hidden states, rows differ, there are no
    chunk starts, or the runner has no smear terms."""
    from .runner import SMEAR_TERMS

    if ref.hiddens is None or old.hiddens is None or old.row_map != ref.row_map or not old.chunk_starts:
        return []
    if not runner.can(SMEAR_TERMS):
        return []
    terms = runner.smear_terms(tokens.to(runner.device))
    if terms is None:
        return []
    x, gate, scale = terms
    out = []
    for t in old.chunk_starts:
        term = (scale * (gate[:, t] * x[:, t - 1])).float()  # (B, C)
        diff = ref.hiddens[0][:, t] - old.hiddens[0][:, t]
        out.append(AnalyticCheck(t, float(term.abs().max()), float(diff.abs().max()),
                                 float((diff - term).abs().max())))
    return out
