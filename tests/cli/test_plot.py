"""`smearcli plot` and `smearcli.plotting`: the figure's data, not its pixels.

The drawn arrays are read back from the matplotlib artists and compared with what
`compare --json` reports for the same options; chunk-start lines with the schedule's starts
(computed here from the chunk sizes); every format is opened; writes are atomic."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from smearcli.measure import compare, inputs

from smearcli.gpt import weights
from smearcli.render import figures
from smearcli.cli.app import app
from smearcli.measure.schedules import ScheduleOptions
from conftest import ROOT  # noqa: E402 - the clone's root

runner = CliRunner()
SIZES = [10, 25, 13]  # 48 tokens; chunks start at 10 and 35
STARTS = [int(s) for s in np.cumsum(SIZES)[:-1]]
SMALL = ["--model", "random", "--depth", "2", "--seq-len", "48", "--gen-len", "8",
         "--chunk-sizes", ",".join(map(str, SIZES))]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args):
    return runner.invoke(app, list(args))


def artists(fig):
    """gid -> list of artists, over every axes of the figure."""
    out = {}
    for ax in fig.get_axes():
        for a in [*ax.lines, *ax.images, *ax.patches]:
            if a.get_gid():
                out.setdefault(a.get_gid(), []).append(a)
    return out


@pytest.fixture(scope="module")
def cli_pair(tmp_path_factory):
    """(compare --json document, the Figure `plot` saved) for the same options."""
    r = invoke("compare", *SMALL, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    saved = []
    original = figures.save

    def spy(fig, path, dpi=None):
        saved.append(fig)
        return original(fig, path, dpi=dpi)

    mp = pytest.MonkeyPatch()
    mp.setattr(figures, "save", spy)
    try:
        out = tmp_path_factory.mktemp("plot") / "err.png"
        p = invoke("plot", *SMALL, "--out", str(out))
    finally:
        mp.undo()
    assert p.exit_code == 0, p.output
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert len(saved) == 1
    return doc, saved[0]


@pytest.fixture(scope="module")
def lib_comparison():
    lm = weights.random_model(weights.random_config(2), seed=0)
    tokens = inputs.random_tokens(lm.model.config, 48)
    return compare.compare(lm.model, tokens, schedules=["chunked"],
                           options=ScheduleOptions(chunk_sizes=tuple(SIZES)))


def test_plotted_arrays_equal_compare_json(cli_pair):
    doc, fig = cli_pair
    runs = {(r["schedule"], r["logic"]): r for r in doc["runs"]}
    a = artists(fig)
    floor = torch.finfo(getattr(torch, doc["model"]["dtype"])).eps * figures.HEATMAP_FLOOR_EPS
    for logic in ("old", "fixed"):
        run = runs["chunked", logic]
        (line,) = a[f"abs_logits:{logic}"]
        np.testing.assert_allclose(line.get_xdata(), np.arange(48))
        np.testing.assert_allclose(line.get_ydata(), run["per_position"]["abs_logits"], rtol=1e-5, atol=0)
        (kl,) = a[f"kl:{logic}"]
        np.testing.assert_allclose(kl.get_ydata(), run["per_position"]["kl"], rtol=1e-5, atol=1e-30)
        (img,) = a[f"heatmap:{logic}"]
        rel = np.array(run["rel_error"])
        assert img.get_array().shape == (len(doc["layers"]), 48)
        np.testing.assert_allclose(img.get_array(), np.log10(np.maximum(rel, floor)), atol=1e-5)
    # old and fixed share one colour scale
    (io,), (ifx,) = a["heatmap:old"], a["heatmap:fixed"]
    assert io.norm is ifx.norm or (io.norm.vmin, io.norm.vmax) == (ifx.norm.vmin, ifx.norm.vmax)
    # the noise band ends at the measured logits noise floor; the tolerance line sits above it
    (band,) = a["noise-floor"]
    ys = [band.get_y(), band.get_y() + band.get_height()]
    noise = doc["noise_floor"]["per_layer"][-1]
    assert max(ys) == pytest.approx(noise, rel=1e-5)
    (tol,) = a["tolerance"]
    assert tol.get_ydata()[0] == pytest.approx(doc["tolerance"] * noise, rel=1e-5)
    # the bug is visible in the drawn data: old leaves the tolerance at the first start, fixed never
    old = a["abs_logits:old"][0].get_ydata()
    assert old[STARTS[0]] > doc["tolerance"] * noise
    assert max(a["abs_logits:fixed"][0].get_ydata()) <= doc["tolerance"] * noise


def test_chunk_start_lines_at_schedule_starts(cli_pair):
    doc, fig = cli_pair
    runs = {(r["schedule"], r["logic"]): r for r in doc["runs"]}
    assert runs["chunked", "old"]["chunk_starts"] == STARTS
    a = artists(fig)
    # error and KL panels: one vertical line per start; heat maps: one marker per start
    vlines = [l for l in a["chunk-start"] if l.get_marker() != "v"]
    for l in vlines:
        assert list(l.get_xdata()) == [l.get_xdata()[0]] * 2  # vertical
    by_axes = {}
    for l in vlines:
        by_axes.setdefault(id(l.axes), []).append(float(l.get_xdata()[0]))
    assert sorted(by_axes.values()) == [STARTS, STARTS]  # the error and the KL panel
    markers = [list(l.get_xdata()) for l in a["chunk-start"] if l.get_marker() == "v"]
    assert markers == [STARTS, STARTS]


def test_title_names_model_dtype_device_schedule(cli_pair):
    _, fig = cli_pair
    title = fig.get_suptitle()
    for word in ("random", "float32", "cpu", "chunked", "10+25+13"):
        assert word in title, (word, title)
    a = artists(fig)
    err_ax, kl_ax = a["abs_logits:old"][0].axes, a["kl:old"][0].axes
    hm_ax = a["heatmap:old"][0].axes
    assert "logit" in err_ax.get_ylabel() and "nats" in kl_ax.get_ylabel()
    assert {err_ax.get_yscale(), kl_ax.get_yscale()} <= {"log", "symlog"}
    assert {err_ax.get_xlabel(), kl_ax.get_xlabel(), hm_ax.get_xlabel()} == {"token position"}
    assert [t.get_text() for t in hm_ax.get_yticklabels()] == ["emb", "block0", "block1", "logits"]
    (cbar,) = [i.colorbar for g in ("heatmap:old", "heatmap:fixed") for i in a[g] if i.colorbar]
    assert "log10 relative error" in cbar.ax.get_ylabel()
    assert fig.legends and len(fig.legends[0].get_texts()) == 5


def test_library_data_is_the_metrics(lib_comparison):
    c = lib_comparison
    fig = figures.figure(c)
    d = fig.smearcli_data
    assert d.schedule == "chunked" and d.chunk_starts == STARTS and d.layers == c.layers
    for logic in ("old", "fixed"):
        m = c.get("chunked", logic)
        np.testing.assert_array_equal(d.abs_logits[logic], m.abs_err[-1].double().numpy())
        np.testing.assert_array_equal(d.kl[logic], m.kl.double().numpy())
        np.testing.assert_array_equal(d.rel_err[logic], m.rel_err.double().numpy())
    assert d.noise_logits == c.noise.per_layer[-1]


@pytest.mark.parametrize("kind, present, absent", [
    ("error", {"abs_logits:old", "abs_logits:fixed", "noise-floor", "tolerance"}, {"heatmap:old", "kl:old"}),
    ("heatmap", {"heatmap:old", "heatmap:fixed"}, {"abs_logits:old", "kl:old", "noise-floor"}),
    ("kl", {"kl:old", "kl:fixed"}, {"abs_logits:old", "heatmap:old"}),
    ("all", {"abs_logits:old", "heatmap:fixed", "kl:old", "noise-floor"}, set()),
])
def test_kind_draws_one_panel(lib_comparison, kind, present, absent):
    gids = set(artists(figures.figure(lib_comparison, kind=kind)))
    assert present <= gids
    assert not absent & gids


def test_each_format_opens(lib_comparison, tmp_path):
    fig = figures.figure(lib_comparison, kind="kl")
    png, svg, pdf = (figures.save(fig, tmp_path / f"f.{s}", dpi=40) for s in ("png", "svg", "pdf"))
    assert png.read_bytes().startswith(PNG_MAGIC)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert pdf.read_bytes().startswith(b"%PDF-")
    assert pdf.read_bytes().rstrip().endswith(b"%%EOF")
    # no timestamps or random ids: the same figure drawn again gives the same bytes
    again = figures.save(figures.figure(lib_comparison, kind="kl"), tmp_path / "g.svg", dpi=40)
    svg = figures.save(figures.figure(lib_comparison, kind="kl"), tmp_path / "f.svg", dpi=40)
    assert again.read_bytes() == svg.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png", "f.svg", "g.svg"]


def test_cli_picks_format_by_suffix(tmp_path):
    out = tmp_path / "x.svg"
    r = invoke("plot", *SMALL, "--schedules", "chunked", "--kind", "error", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert ET.fromstring(out.read_bytes()).tag.endswith("svg")


def test_failed_save_leaves_existing_file(lib_comparison, tmp_path, monkeypatch):
    out = tmp_path / "err.png"
    out.write_bytes(b"previous figure")
    fig = figures.figure(lib_comparison, kind="kl")

    def broken(self, f, **kw):
        f.write(PNG_MAGIC + b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(fig), "savefig", broken)
    with pytest.raises(RuntimeError):
        figures.save(fig, out)
    assert out.read_bytes() == b"previous figure"
    assert [p.name for p in tmp_path.iterdir()] == ["err.png"]  # no temporary file left


def test_cli_failure_leaves_existing_file(tmp_path):
    out = tmp_path / "err.png"
    out.write_bytes(b"previous figure")
    r = invoke("plot", *SMALL, "--chunk-sizes", "10,10", "--out", str(out))
    assert r.exit_code == 2
    assert "sum to 20" in r.stderr
    assert out.read_bytes() == b"previous figure"
    assert [p.name for p in tmp_path.iterdir()] == ["err.png"]


@pytest.mark.parametrize("args, fragment", [
    (["--out", "x.txt"], "unknown suffix .txt"),
    (["--out", "no/such/dir/x.png"], "does not exist"),
    (["--out", "x.png", "--dpi", "0"], "--dpi"),
    (["--out", "x.png", "--kind", "pie"], "pie"),
])
def test_bad_options_exit_2(args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("plot", *SMALL, *args)
    assert r.exit_code == 2, r.output
    assert fragment in r.stderr
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


def test_schedule_choice_and_single_logic(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save", lambda fig, path, dpi=None: saved.append(fig))
    r = invoke("plot", *SMALL, "--schedules", "prefill,chunked", "--logic", "old", "--out", str(tmp_path / "a.png"))
    assert r.exit_code == 0, r.output
    d = saved[-1].smearcli_data
    assert (d.schedule, d.logics, d.chunk_starts) == ("chunked", ["old"], STARTS)
    assert "heatmap:fixed" not in artists(saved[-1])
    r = invoke("plot", *SMALL, "--schedules", "speculative", "--draft", "3", "--out", str(tmp_path / "b.png"))
    assert r.exit_code == 0, r.output
    d = saved[-1].smearcli_data
    assert d.schedule == "speculative" and d.steps == [40, 3, 3, 2]
    assert d.chunk_starts == [40, 43, 46]


def test_headless_without_pyplot(lib_comparison, tmp_path):
    """No display, a GUI backend requested: still works, because pyplot is never imported."""
    code = (
        "import sys\n"
        "from smearcli.measure import compare, inputs\n"
        "from smearcli.gpt import weights\n"
        "from smearcli.render import figures\n"
        "lm = weights.random_model(weights.random_config(1), seed=0)\n"
        "c = compare.compare(lm.model, inputs.random_tokens(lm.model.config, 16), schedules=['chunked'])\n"
        f"figures.save(figures.figure(c), {str(tmp_path / 'h.png')!r}, dpi=30)\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MPLBACKEND"] = "TkAgg"
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert (tmp_path / "h.png").read_bytes().startswith(PNG_MAGIC)


def test_help_does_not_import_matplotlib():
    code = ("import sys; from smearcli.cli.app import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['plot', '--help']); assert r.exit_code == 0, r.output; "
            "assert '--kind' in r.output and '--chunk-sizes' in r.output; "
            "heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_shows_the_committed_figure():

    root = ROOT
    readme = (root / "README.md").read_text()
    target = "docs/figures/smear-error.png"
    assert f"]({target})" in readme  # embedded
    assert f"smearcli plot --chunks 4 --out {target}" in readme  # and how (docs/gen_snippets.py)
    assert (root / target).read_bytes().startswith(PNG_MAGIC)


def test_exact_zeros_are_drawn_not_dropped(lib_comparison):
    """Bitwise agreement (error exactly 0) is common on CPU; a plain log axis would drop it."""
    from matplotlib.figure import Figure

    d = figures.plot_data(lib_comparison)
    d.abs_logits["fixed"] = np.zeros_like(d.abs_logits["fixed"])
    ax = Figure().subplots()
    figures.draw_error(ax, d)
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0.0
    (line,) = [l for l in ax.lines if l.get_gid() == "abs_logits:fixed"]
    assert not np.ma.is_masked(ax.transData.transform(np.c_[line.get_xdata(), line.get_ydata()]))
    assert 0.0 in list(ax.yaxis.get_major_locator()())
    d.abs_logits = {k: np.maximum(v, 1e-9) for k, v in d.abs_logits.items()}
    ax2 = Figure().subplots()
    figures.draw_error(ax2, d)  # no zeros: a plain log axis
    assert ax2.get_yscale() == "log"


# -- boundaries beyond chunk starts: their own lines, and the packed schedule's own figure -----------

def _saved_figure(monkeypatch, tmp_path, *args):
    saved = []
    original = figures.save
    monkeypatch.setattr(figures, "save", lambda fig, path, dpi=None: (saved.append(fig), original(fig, path, dpi=dpi))[1])
    out = tmp_path / "fig.png"
    r = invoke("plot", *args, "--out", str(out))
    assert r.exit_code == 0, r.output
    assert len(saved) == 1
    return saved[0], out


def test_rollback_marks_drawn_where_the_json_puts_them(monkeypatch, tmp_path):
    """Each rejected draft taken back is a dashed line at the position compare --json lists
    under the run's boundaries; chunk-start lines stay the chunk starts."""
    args = ["--model", "random", "--depth", "2", "--seq-len", "48", "--schedules", "rollback", "--logic", "fixed"]
    r = invoke("compare", *args, "--json")
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)["runs"][0]
    assert run["boundaries"]["rollback"], run["boundaries"]
    fig, _ = _saved_figure(monkeypatch, tmp_path, *args, "--kind", "error")
    drawn = artists(fig)
    assert sorted(int(a.get_xdata()[0]) for a in drawn["mark:rollback"]) == run["boundaries"]["rollback"]
    assert sorted(int(a.get_xdata()[0]) for a in drawn["chunk-start"]) == run["chunk_starts"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert figures.mark_words()["rollback"] in labels


PACKED = ["--model", "random", "--depth", "2", "--seq-len", "48", "--schedules", "packed",
          "--documents", "20,12,16", "--logic", "both"]


def test_packed_figure_draws_the_packed_json(monkeypatch, tmp_path):
    """plot --schedules packed: one error line per logic equal to nothing but its own run,
    document starts where the documents begin, and one bar per boundary, logic and part whose
    height is the number smearcli.packed/1 reports; the PNG carries those numbers."""
    r = invoke("compare", *PACKED, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    fig, out = _saved_figure(monkeypatch, tmp_path, *PACKED)
    drawn = artists(fig)
    assert sorted(int(a.get_xdata()[0]) for a in drawn["document-start"]) == [20, 32]
    logics = [lg["logic"] for lg in doc["logics"]]
    assert logics == ["old", "fixed", "bosmask"]
    for lg in doc["logics"]:
        (line,) = drawn[f"abs_logits:{lg['logic']}"]
        ys = line.get_ydata()
        for d in lg["documents"][1:]:  # the line's value at each BOS is the reported leak there
            assert ys[d["start"]] == pytest.approx(d["bos"], rel=1e-5, abs=1e-12)
        for attr in ("first", "masked_first", "attention_first"):
            bars = drawn[f"{attr}:{lg['logic']}"]
            bottom = bars[0].get_y()
            heights = [b.get_height() + bottom for b in bars]
            assert heights == pytest.approx([d[attr] for d in lg["documents"][1:]], rel=1e-5)
    told = figures.read_summary(out)
    assert told["document_starts"] == [20, 32]
    bos_masked = told["parts"]["bosmask"]
    assert max(v["masked_first"] for v in bos_masked.values()) < 10 * told["noise_logits"]  # the masks close it
    assert min(v["masked_first"] for v in told["parts"]["old"].values()) > 10 * told["noise_logits"]


def test_packed_figure_leaves_out_a_part_not_measured(monkeypatch, tmp_path):
    """A runner without a document mask has no smear/attention split: those bars are absent, not 0."""
    from smearcli.gpt import gpt_runners
    from smearcli.measure import packed
    from smearcli.render import packed_figure

    lm = weights.random_model(weights.random_config(2), seed=0)
    lengths = (20, 12, 16)
    tokens = packed.packed_tokens(lm.model.config.vocab_size, lengths, packed.default_bos(lm.model.config))
    result = packed.measure(gpt_runners.runners(lm.model, ["old"], bos=int(tokens[0, 0])), tokens, lengths)
    result.logics[0].documents[2].masked_first = None
    drawn = artists(packed_figure.figure(result, "split"))
    assert len(drawn["first:old"]) == 2 and len(drawn["masked_first:old"]) == 1
    with pytest.raises(ValueError, match="packed figure"):
        packed_figure.figure(result, "kl")


def test_packed_heatmap_is_the_first_logics_standard_panel(monkeypatch, tmp_path):
    fig, _ = _saved_figure(monkeypatch, tmp_path, *PACKED, "--kind", "heatmap")
    assert isinstance(fig.smearcli_data, figures.PlotData) and fig.smearcli_data.logics == ["old"]
