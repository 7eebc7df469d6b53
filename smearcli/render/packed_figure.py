"""The figure of the packed schedule (`smearcli.measure.packed`): how much of each document reaches the
next when documents share one row, and whose part it is.

```python
from smearcli.gpt import gpt_runners, weights
from smearcli.measure import packed
from smearcli.render import figures, packed_figure
model = weights.tiny_model().model
lengths = (100, 60, 96)
tokens = packed.packed_tokens(model.config.vocab_size, lengths, packed.default_bos(model.config))
result = packed.measure(gpt_runners.runners(model, ["old", "fixed", "bosmask"], bos=int(tokens[0, 0])), tokens, lengths)
figures.save(packed_figure.figure(result), "packed.png")
```

Two panels, every number taken from the `PackedResult` (what `smearcli.packed/1` reports):

- (a) `error`: max |Δlogit| per position, the packed row against each document run alone, one
  line per logic, document starts (each a BOS) as vertical lines, the noise floor as a band;
- (b) `split`: per document boundary and logic, the leak into the document's first tokens and
  its two parts: the smear's (document-causal mask on) and attention's (the mask's effect). A
  part that was not measured (a runner without a document mask) is left out, never drawn as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .axes import positive_min, value_axis
from ..util.defaults import DOCUMENT_START
from .figures import NOISE_COLOR, PALETTE, TRANSPARENT_RC, mark_words, start_color  # one look for every figure

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..measure.packed import PackedResult

KINDS = ("all", "error", "split")
PARTS = (("first", "leak", None), ("masked_first", "smear part", "//"), ("attention_first", "attention part", ".."))


@dataclass
class PackedPlotData:
    """What the packed figure draws: per logic the per-position error, per boundary the parts."""
    logics: list[str]
    legend: dict  # label -> the legend's words
    positions: "object"  # (T,) numpy
    abs_logits: dict  # label -> (T,) max |Δlogit| of the packed row against the documents alone
    starts: list[int]  # document starts after position 0 (each a BOS)
    noise: float  # the largest of the logics' noise floors
    parts: dict  # (label, document index) -> {part: value or None}
    first: int
    title: str

    def summary(self) -> dict:
        """What the figure shows, in numbers (`figures.save` writes it into a PNG): the title,
        the document starts, the noise floor and each boundary's leak and parts per logic."""
        return {"title": self.title, "document_starts": self.starts, "first_tokens": self.first,
                "noise_logits": self.noise,
                "parts": {label: {str(i): v for (lb, i), v in self.parts.items() if lb == label}
                          for label in self.logics}}


def plot_data(p: "PackedResult", title: str = "") -> PackedPlotData:
    c = p.logics[0].comparison
    d = c.description()
    abs_logits, parts = {}, {}
    for lg in p.logics:
        abs_logits[lg.label] = lg.comparison.metrics[0].abs_err[-1].detach().cpu().double().numpy()
        for doc in lg.documents[1:]:
            parts[(lg.label, doc.index)] = {attr: getattr(doc, attr) for attr, _, _ in PARTS}
    import numpy as np

    T = c.tokens.size(1)
    shape = f" ({d.shape})" if d.shape else ""
    return PackedPlotData(
        logics=[lg.label for lg in p.logics],
        legend={x.label: x.series for lg in p.logics for x in lg.comparison.described},
        positions=np.arange(T), abs_logits=abs_logits,
        starts=[doc.start for doc in p.logics[0].documents[1:]],
        noise=max(lg.noise for lg in p.logics), parts=parts, first=p.first,
        title=title or (f"{d.name}{shape}, {d.dtype} on {d.device}: {len(p.lengths)} documents packed in one "
                        f"row ({','.join(map(str, p.lengths))}), each against itself run alone"))


def _color(d: PackedPlotData, label: str):
    return PALETTE[d.logics.index(label) % len(PALETTE)]


def _grid(ax) -> None:
    import matplotlib

    see_through = matplotlib.rcParams["axes.facecolor"] == "none"  # transparent: rc's own grid grey
    ax.grid(True, which="major", axis="y", lw=0.6, **({} if see_through else {"color": "#dddddd"}))


def draw_error(ax, d: PackedPlotData, panel: str = "") -> None:
    import numpy as np

    for label in d.logics:
        colour, style = _color(d, label)
        ax.plot(d.positions, d.abs_logits[label], color=colour, ls=style, lw=1.4, label=d.legend.get(label, label),
                gid=f"abs_logits:{label}", zorder=3)
    lo = min(positive_min(d.abs_logits.values(), d.noise), d.noise) / 10
    hi = max([float(np.max(a)) for a in d.abs_logits.values()] + [d.noise]) * 3
    bottom = value_axis(ax, d.abs_logits.values(), lo, hi)
    ax.axhspan(bottom, d.noise, color=NOISE_COLOR, alpha=0.25, lw=0, zorder=0, gid="noise-floor",
               label=f"below the measured noise floor ({d.noise:.1e})")
    for i, s in enumerate(d.starts):
        ax.axvline(s, color=start_color(), lw=0.9, ls=":", alpha=0.8, zorder=1, gid="document-start",
                   label=mark_words()[DOCUMENT_START] if i == 0 else None)
    ax.set_xlim(-0.5, len(d.positions) - 0.5)
    ax.set_xlabel("token position in the packed row")
    ax.set_ylabel("max |Δlogit| (logit units)")
    _grid(ax)
    ax.set_title(f"{panel}the packed row against each document alone: what leaks across documents",
                 loc="left", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def draw_split(ax, d: PackedPlotData, panel: str = "") -> None:
    """Grouped bars: per boundary, per logic, the leak over the first tokens and its two parts."""
    import numpy as np

    docs = sorted({i for _, i in d.parts})
    n_logic, n_part = len(d.logics), len(PARTS)
    width = 0.8 / (n_logic * n_part)
    values = [v for p in d.parts.values() for v in p.values() if v is not None]
    lo = min(positive_min([np.array(values)], d.noise), d.noise) / 10
    hi = max(values + [d.noise]) * 3
    bottom = value_axis(ax, [np.array(values)], lo, hi)
    for li, label in enumerate(d.logics):
        colour, _ = _color(d, label)
        for pi, (attr, words, hatch) in enumerate(PARTS):
            xs, hs = [], []
            for k, doc in enumerate(docs):
                v = d.parts[(label, doc)][attr]
                if v is None:  # not measured: no bar, not a zero
                    continue
                xs.append(k - 0.4 + width * (li * n_part + pi + 0.5))
                hs.append(v)
            ax.bar(xs, [h - bottom for h in hs], width=width * 0.95, bottom=bottom, color=colour,
                   alpha=1.0 if hatch is None else 0.45, hatch=hatch, edgecolor=colour, lw=0.6,
                   gid=f"{attr}:{label}", label=f"{d.legend.get(label, label)}: {words}")
    ax.axhspan(bottom, d.noise, color=NOISE_COLOR, alpha=0.25, lw=0, zorder=0)
    ax.set_xticks(range(len(docs)), [f"document {i}\n(BOS at {d.starts[k]})" for k, i in enumerate(docs)])
    ax.set_xlim(-0.5, len(docs) - 0.5)
    ax.set_ylabel(f"max |Δlogit|, first {d.first} tokens")
    _grid(ax)
    ax.set_title(f"{panel}each boundary's leak and its parts: the smear's (attention kept inside\neach "
                 "document) and attention's (what that mask takes away)", loc="left", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def figure(p: "PackedResult", kind: str = "all", title: str = "", transparent: bool = False) -> "Figure":
    """A matplotlib Figure of a packed result, never shown; the drawn arrays at `fig.smearcli_data`.
    `transparent=True`: no background, marks in a grey that reads on a light and a dark page."""
    import matplotlib
    from matplotlib.figure import Figure

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} for the packed figure; choose from {', '.join(KINDS)}")
    d = plot_data(p, title)
    sizes = {"all": (11, 9.0), "error": (11, 4.8), "split": (11, 4.6)}
    with matplotlib.rc_context({"font.size": 11, **(TRANSPARENT_RC if transparent else {})}):
        fig = Figure(figsize=sizes[kind], layout="constrained")
        if kind == "all":
            top, low = fig.subplots(2, 1, height_ratios=[1.1, 1.0])
            draw_error(top, d, "(a) ")
            draw_split(low, d, "(b) ")
        elif kind == "error":
            draw_error(fig.subplots(), d)
        else:
            draw_split(fig.subplots(), d)
        fig.suptitle(d.title + "\na leak is what training sees against what inference sees: a measurement, "
                     "not a bug;\nthe BOS mask and a document mask together bring it down to the noise floor",
                     fontsize="medium")
    fig.smearcli_data = d
    return fig
