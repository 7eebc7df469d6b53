"""Figures of a `compare.Comparison`: where the smear bug is born and how far it spreads.

```python
from smearcli.measure import compare, inputs
from smearcli.gpt import weights
from smearcli.render import figures
lm = weights.tiny_model()
c = compare.compare(lm.model, inputs.random_tokens(lm.model.config, 256), schedules=["chunked"])
figures.save(figures.figure(c), "err.png")  # a matplotlib Figure, nothing shown
```

Every array drawn comes from the `RunMetrics` that `compare` measured (what `compare --json`
reports); nothing is recomputed. Panels:

- `error`: max |logit - reference logit| per position (log scale) for each logic, chunk starts
  as vertical lines, the measured noise floor as a band and the `--check` tolerance as a line;
- `heatmap`: log10 of the relative error per (layer, position): post-smear embedding, every
  block, logits; one map per logic on one shared colour scale, chunk starts marked above;
- `kl`: KL(reference || run) per position, in nats.

matplotlib is used only through `matplotlib.figure.Figure`, imported inside the functions: no
pyplot, GUI backend or display, so it works headless and under any MPLBACKEND.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from ..util.defaults import figure_schedule
from .axes import positive_min, value_axis

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from matplotlib.figure import Figure

    from ..measure.compare import Comparison

KINDS = ("all", "error", "heatmap", "kl")
FORMATS = (".png", ".svg", ".pdf")

# One palette for every series, whoever's code ran: Okabe-Ito colours (safe for the common
# colour-vision deficiencies), each with its own line style so a figure survives greyscale
# printing. Series take them in the order they appear in a comparison.
PALETTE = (("#D55E00", "-"), ("#0072B2", "--"), ("#009E73", (0, (6, 2, 1, 2))), ("#CC79A7", ":"),
           ("#E69F00", (0, (3, 1, 1, 1, 1, 1))), ("#56B4E9", (0, (1, 1))), ("#F0E442", (0, (8, 3))))
START_COLOR = "#000000"
# the boundaries a schedule records beyond chunk starts (`RunResult.marks`) are drawn as their own
# lines, in a colour of the palette's that no series takes first; each schedule names the legend's
# words for its marks (`steps.Schedule.marks`, read through `mark_words`)
MARK_COLOR = "#7B3294"
NOISE_COLOR = "#999999"
HEATMAP_CMAP = "viridis"
# figure(..., transparent=True): no background; text, axes and marks in a grey that reads on white
# and on a dark page alike. In a notebook on its own: `plt.rcParams.update(TRANSPARENT_RC)`.
FOREGROUND_ON_ANY = "#888888"
TRANSPARENT_RC = {"figure.facecolor": "none", "axes.facecolor": "none", "savefig.facecolor": "none",
                  "savefig.transparent": True, "legend.framealpha": 0.0, "grid.alpha": 0.35,
                  **{k: FOREGROUND_ON_ANY for k in ("text.color", "axes.labelcolor", "axes.edgecolor",
                                                    "xtick.color", "ytick.color", "grid.color")}}
# relative errors below eps(dtype) * this are drawn at the bottom of the colour scale (an exact 0
# has no logarithm): they are far below anything rounding in the compute dtype can produce
HEATMAP_FLOOR_EPS = 0.1


@dataclass
class PlotData:
    """Exactly what a figure draws, per series, taken from the Comparison's RunMetrics."""
    schedule: str
    logics: list[str]  # the series' labels, in order
    layers: list[str]  # heat-map rows, bottom to top: emb, block0.., logits
    positions: "np.ndarray"  # (T,) 0..T-1
    steps: list[int]
    chunk_starts: list[int]
    abs_logits: dict  # label -> (T,) max |Δlogit|, = RunMetrics.abs_err[-1]
    kl: dict  # label -> (T,) KL(ref || run) in nats, = RunMetrics.kl
    rel_err: dict  # label -> (layers, T), = RunMetrics.rel_err
    log10_rel: dict  # label -> (layers, T), log10(max(rel_err, rel_floor)): the heat map
    rel_floor: float
    noise_logits: float  # measured noise floor of the logits, = NoiseFloor.per_layer[-1]
    tolerance: float  # --check passes below tolerance x noise_logits
    title: str
    legend: dict = None  # label -> the legend's words (Described.series)
    departs_at_starts: list = None  # labels whose error is born on a chunk start
    marks: dict = None  # boundary kind -> positions, beyond chunk starts (`mark_words`)

    def color(self, label: str) -> str:
        return PALETTE[self.logics.index(label) % len(PALETTE)][0]

    def style(self, label: str):
        return PALETTE[self.logics.index(label) % len(PALETTE)][1]

    def words(self, label: str) -> str:
        return (self.legend or {}).get(label, label)


def plottable_schedules(c: "Comparison") -> list[str]:
    """Schedules of `c` in run order, without repeats."""
    return list(dict.fromkeys(m.schedule for m in c.metrics))


def pick_schedule(c: "Comparison", schedule: Optional[str] = None) -> str:
    """`schedule` if given (it must have been run), else `names.figure_schedule` of the runs."""
    names = plottable_schedules(c)
    if not names:
        raise ValueError("the comparison holds no runs to plot")
    if schedule is not None:
        if schedule not in names:
            raise ValueError(f"schedule {schedule!r} was not run; the comparison holds {', '.join(names)}")
        return schedule
    return figure_schedule(names)


def describe_steps(steps: Sequence[int]) -> str:
    if len(steps) == 1:
        return f"1 step of {steps[0]}"
    if len(steps) <= 8:
        return f"steps {'+'.join(map(str, steps))}"
    return f"{len(steps)} steps"


def default_title(c: "Comparison", schedule: str, model_name: Optional[str] = None) -> str:
    d = c.description()
    m = next(m for m in c.metrics if m.schedule == schedule)
    shape = f" ({d.shape})" if d.shape else ""
    return (f"{model_name or d.name}{shape}, {d.dtype} on {d.device}, "
            f"{c.tokens.size(0)} x {c.tokens.size(1)} tokens; schedule {schedule}: "
            f"{describe_steps(m.steps)}, vs the full forward pass")


def plot_data(c: "Comparison", schedule: Optional[str] = None, model_name: Optional[str] = None,
              title: Optional[str] = None) -> PlotData:
    """Collect the arrays a figure of `schedule` draws (default: see `pick_schedule`)."""
    import numpy as np
    import torch

    schedule = pick_schedule(c, schedule)
    runs = [m for m in c.metrics if m.schedule == schedule]
    floor = float(torch.finfo(c.dtype).eps) * HEATMAP_FLOOR_EPS
    first = runs[0]

    def arr(t):
        return t.detach().cpu().double().numpy()

    rel = {m.logic: arr(m.rel_err) for m in runs}
    marks = {k: sorted(set(v)) for k, v in first.marks.items() if k in mark_words() and v}
    return PlotData(
        schedule=schedule,
        logics=[m.logic for m in runs],
        layers=list(c.layers),
        positions=np.arange(first.abs_err.size(1)),
        steps=list(first.steps),
        chunk_starts=list(first.chunk_starts),
        abs_logits={m.logic: arr(m.abs_err[-1]) for m in runs},
        kl={m.logic: arr(m.kl) for m in runs},
        rel_err=rel,
        log10_rel={k: np.log10(np.maximum(v, floor)) for k, v in rel.items()},
        rel_floor=floor,
        noise_logits=float(c.noise.per_layer[-1]),
        tolerance=float(c.tolerance),
        title=title or default_title(c, schedule, model_name),
        legend={d.label: d.series for d in c.described},
        departs_at_starts=[m.logic for m in runs
                           if m.first_departure is not None and m.first_departure[1] in m.chunk_starts],
        marks=marks,
    )


# -- panels -------------------------------------------------------------------------------------

def mark_words() -> dict[str, str]:
    """The legend's words for every mark kind a registered schedule records (`schedules.mark_words`)."""
    from ..measure.schedules import mark_words as registered  # torch: only once a figure is drawn

    return registered()


def start_color() -> str:
    """Black, or the transparent figures' grey (see TRANSPARENT_RC) while those are drawn."""
    import matplotlib
    return FOREGROUND_ON_ANY if matplotlib.rcParams["text.color"] == FOREGROUND_ON_ANY else START_COLOR


def _chunk_lines(ax, d: PlotData, label: bool) -> None:
    for i, s in enumerate(d.chunk_starts):
        ax.axvline(s, color=start_color(), lw=0.9, ls=":", alpha=0.8, zorder=1, gid="chunk-start",
                   label="chunk start" if (label and i == 0) else None)
    words = mark_words()
    for kind, positions in (d.marks or {}).items():
        for i, s in enumerate(positions):
            ax.axvline(s, color=MARK_COLOR, lw=1.1, ls=(0, (4, 2)), alpha=0.8, zorder=1, gid=f"mark:{kind}",
                       label=words[kind] if (label and i == 0) else None)


def _position_axis(ax, d: PlotData) -> None:
    T = len(d.positions)
    ax.set_xlim(-0.5, T - 0.5)
    ax.set_xlabel("token position")
    grey = start_color() == FOREGROUND_ON_ANY  # transparent: the grid in rc's grey, see-through
    ax.grid(True, which="major", axis="y", lw=0.6, **({} if grey else {"color": "#dddddd"}))


def draw_error(ax, d: PlotData, panel: str = "") -> None:
    """Max |Δlogit| per position, log scale (exact zeros on the bottom edge), noise floor band, tolerance line, chunk starts."""
    import numpy as np

    for logic in d.logics:
        ax.plot(d.positions, d.abs_logits[logic], color=d.color(logic), ls=d.style(logic), lw=1.4,
                label=d.words(logic), gid=f"abs_logits:{logic}", zorder=3)
    lo = min(positive_min(d.abs_logits.values(), d.noise_logits), d.noise_logits) / 10
    hi = max([float(np.max(a)) for a in d.abs_logits.values()] + [d.tolerance * d.noise_logits]) * 3
    bottom = value_axis(ax, d.abs_logits.values(), lo, hi)
    ax.axhspan(bottom, d.noise_logits, color=NOISE_COLOR, alpha=0.25, lw=0, zorder=0, gid="noise-floor",
               label=f"below the measured noise floor ({d.noise_logits:.1e})")
    ax.axhline(d.tolerance * d.noise_logits, color=NOISE_COLOR, lw=1.0, ls="-.", zorder=2,
               gid="tolerance", label=f"tolerance ({d.tolerance:g} x noise floor)")
    _chunk_lines(ax, d, label=True)
    _position_axis(ax, d)
    ax.set_ylabel("max |Δlogit| (logit units)")
    departs = [d.words(g) for g in d.departs_at_starts or []]
    claim = f": the {' and the '.join(departs)} departs at chunk starts" if departs else ""
    ax.set_title(f"{panel}logit error per position{claim}", loc="left", fontsize="medium")


def draw_kl(ax, d: PlotData, panel: str = "") -> None:
    """KL(reference || run) per position, log scale, chunk starts."""
    import numpy as np

    for logic in d.logics:
        ax.plot(d.positions, d.kl[logic], color=d.color(logic), ls=d.style(logic), lw=1.4,
                label=d.words(logic), gid=f"kl:{logic}", zorder=3)
    pos = positive_min(d.kl.values(), 1e-12)
    top = max([float(np.max(a)) for a in d.kl.values()] + [pos])
    value_axis(ax, d.kl.values(), pos / 10, top * 3)
    _chunk_lines(ax, d, label=True)
    _position_axis(ax, d)
    ax.set_ylabel("KL(reference ‖ run) (nats)")
    ax.set_title(f"{panel}next-token distribution shift per position",
                 loc="left", fontsize="medium")


def draw_heatmaps(fig, axes, d: PlotData, panel: str = "") -> None:
    """One position x layer map per logic, shared colour scale, chunk starts marked on top."""
    import numpy as np
    from matplotlib.colors import Normalize
    from matplotlib.transforms import blended_transform_factory

    vmin = float(np.log10(d.rel_floor))
    vmax = max(float(np.max(a)) for a in d.log10_rel.values())
    norm = Normalize(vmin=vmin, vmax=max(vmax, vmin + 1))
    T, L = len(d.positions), len(d.layers)
    image = None
    for ax, logic in zip(axes, d.logics):
        image = ax.imshow(d.log10_rel[logic], aspect="auto", origin="lower", cmap=HEATMAP_CMAP,
                          norm=norm, interpolation="nearest", extent=(-0.5, T - 0.5, -0.5, L - 0.5))
        image.set_gid(f"heatmap:{logic}")
        ax.set_yticks(range(L), d.layers)
        ax.set_xlabel("token position")
        if ax is axes[0]:
            ax.set_title(f"{panel}relative error per layer", loc="left", fontsize="medium")
        ax.set_title(d.words(logic), loc="right", fontsize="medium", color=d.color(logic),
                     fontweight="bold")
        if d.chunk_starts:
            trans = blended_transform_factory(ax.transData, ax.transAxes)
            ax.plot(d.chunk_starts, [1.0] * len(d.chunk_starts), ls="none", marker="v", ms=7,
                    color=start_color(), transform=trans, clip_on=False, gid="chunk-start",
                    label="chunk start")
    axes[0].set_ylabel("layer (capture point)")
    for ax in axes[1:]:
        ax.tick_params(labelleft=False)
    cb = fig.colorbar(image, ax=list(axes), extend="min", fraction=0.05, pad=0.02)
    cb.set_label("log10 relative error\n(|run - ref| / max |ref|)", fontsize="small")


# -- figures ------------------------------------------------------------------------------------

SUBTITLE = ("Token smearing adds gₜ·xₜ₋₁ (a gate times the previous token's embedding) to each "
            "token. Under chunked prefill the old logic\ndrops that term for the first token of "
            "every later chunk (nanochat #756); the fixed logic takes xₜ₋₁ from the KV cache.")


GENERIC_SUBTITLE = ("Every schedule feeds the same tokens through the implementation's own cache; "
                    "the reference is one forward pass over every token without a cache.")


def _legend_handles(d: PlotData, kind: str) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [] if kind == "heatmap" else [
        Line2D([], [], color=d.color(g), ls=d.style(g), lw=1.6, label=d.words(g)) for g in d.logics]
    if d.chunk_starts:
        handles.append(Line2D([], [], color=start_color(), ls=":", marker="v", ms=6, lw=1.0,
                              label="chunk start"))
    words = mark_words()
    for mark in (d.marks or {}):
        handles.append(Line2D([], [], color=MARK_COLOR, ls=(0, (4, 2)), lw=1.1, label=words[mark]))
    if kind in ("all", "error"):
        handles.append(Patch(color=NOISE_COLOR, alpha=0.25, lw=0,
                             label=f"below the measured noise floor ({d.noise_logits:.1e})"))
        handles.append(Line2D([], [], color=NOISE_COLOR, ls="-.", lw=1.0,
                              label=f"tolerance ({d.tolerance:g} x floor)"))
    return handles


def figure(c: "Comparison", schedule: Optional[str] = None, kind: str = "all",
           model_name: Optional[str] = None, title: Optional[str] = None,
           subtitle: str = "", transparent: bool = False) -> "Figure":
    """A matplotlib Figure of `c` for one schedule (default: `pick_schedule`), never shown.

    `kind`: "all" (three panels), "error", "heatmap" or "kl"; the drawn arrays are at
    `fig.smearcli_data`. `subtitle` replaces the smear explanation; `transparent=True` uses
    `TRANSPARENT_RC`."""
    import matplotlib
    from matplotlib.figure import Figure

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    d = plot_data(c, schedule, model_name, title)
    n = len(d.logics)
    sizes = {"all": (11, 11.5), "error": (11, 4.8), "heatmap": (11, 4.8), "kl": (11, 4.4)}
    with matplotlib.rc_context({"font.size": 11, **(TRANSPARENT_RC if transparent else {})}):
        fig = Figure(figsize=sizes[kind], layout="constrained")
        if kind == "all":
            hm_names = [f"heatmap:{g}" for g in d.logics]
            ax = fig.subplot_mosaic([["error"] * n, hm_names, ["kl"] * n],
                                    height_ratios=[1.15, 1.0, 0.9])
            draw_error(ax["error"], d, panel="(a) ")
            draw_heatmaps(fig, [ax[h] for h in hm_names], d, panel="(b) ")
            draw_kl(ax["kl"], d, panel="(c) ")
        elif kind == "error":
            draw_error(fig.subplots(), d)
        elif kind == "kl":
            draw_kl(fig.subplots(), d)
        else:
            hm = fig.subplots(1, n, sharey=True, squeeze=False)[0]
            draw_heatmaps(fig, hm, d)
        handles = _legend_handles(d, kind)
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3),
                       fontsize="small", frameon=False)
        smear = any(x.smear_lambda is not None for x in c.described)
        fig.suptitle(d.title + "\n" + (subtitle or (SUBTITLE if smear else GENERIC_SUBTITLE)), fontsize="medium")
    fig.smearcli_data = d
    return fig


PNG_SUMMARY_KEY = "smearcli"


def summary(d: PlotData) -> dict:
    """What a figure shows, in numbers: its title (model name first), schedule, chunk starts,
    the largest logit error per logic, the noise floor and the tolerance. `save` writes it into
    a PNG as a text chunk, so a figure can be checked against a fresh `compare --json`."""
    return {"title": d.title, "schedule": d.schedule, "steps": d.steps, "chunk_starts": d.chunk_starts,
            "max_abs_logits": {g: float(d.abs_logits[g].max()) for g in d.logics},
            "noise_logits": d.noise_logits, "tolerance": d.tolerance}


def read_summary(path) -> Optional[dict]:
    """The `summary` a PNG written by `save` carries, or None."""
    import json
    from PIL import Image
    with Image.open(path) as im:
        text = getattr(im, "text", {}).get(PNG_SUMMARY_KEY)
    return json.loads(text) if text else None


def save(fig: "Figure", path, dpi: Optional[float] = None) -> Path:
    """Write `fig` atomically, format chosen by the suffix (.png, .svg, .pdf), without
    timestamps so the same figure gives the same file. A PNG of a `figure` carries its
    `summary` as a text chunk (`read_summary`)."""
    import matplotlib

    from ..util import jsonsafe
    from ..util.files import atomic_write

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if f".{fmt}" not in FORMATS:
        raise ValueError(f"{path}: unknown suffix {path.suffix or '(none)'}; use {', '.join(FORMATS)}")
    metadata = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    data = getattr(fig, "smearcli_data", None)
    if fmt == "png" and data is not None:  # this module's figures, or another's with its own summary()
        told = summary(data) if isinstance(data, PlotData) else data.summary() if hasattr(data, "summary") else None
        if told is not None:
            metadata[PNG_SUMMARY_KEY] = jsonsafe.dumps(told, sort_keys=True)  # strict: null for NaN
    rc = {"svg.hashsalt": "smearcli"}
    with matplotlib.rc_context(rc), atomic_write(path, "wb") as f:
        fig.savefig(f, format=fmt, dpi=dpi, metadata=metadata)
    return path
