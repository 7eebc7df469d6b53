"""The module a census finding is born in (`engines.transformers.born`), findings grouped by root cause
(`engines.transformers.groups`), and what the table, the Markdown, the JSON and the drafts make of them."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

import dataclasses

from smearcli.engines.transformers import born, draft, groups, repro
from smearcli.census import record, records, report
from smearcli.util.errors import UserError

transformers = pytest.importorskip("transformers")
MAMBA_FAMILY = ("falcon_mamba", "jamba", "mamba", "zamba")  # one Mamba-v1 mixer, copied with changes


@pytest.fixture(scope="module")
def mamba(census_record):
    """The real check of Mamba (about 4 s of one core, shared with tests/docs/test_schemas.py)."""
    return census_record("mamba")


HYBRIDS = ("jamba", "zamba")  # two layer orders each: the defaults' order alone holds the finding here


@pytest.fixture(scope="module")
def family(mamba, census_record):
    """The real check of the four architectures whose mixers skip their state on multi-token steps,
    the hybrids in their defaults' layer order (about 5 s more; every order of a hybrid is
    tests/census/test_scan_reach.py's)."""
    return {name: mamba if name == "mamba" else census_record(name, order=0 if name in HYBRIDS else None)
            for name in MAMBA_FAMILY}


def forward_lines(cls) -> list[int]:
    lines, first = inspect.getsourcelines(cls.forward)
    return [first, first + len(lines) - 1]


# -- born in ------------------------------------------------------------------------------------
def test_mamba_is_born_in_its_mixer(mamba):
    from transformers.models.mamba.modeling_mamba import MambaMixer

    rec = mamba
    b = rec.born_in
    assert rec.verdict == "bug" and b.module.endswith(".mixer") and b.class_name == "MambaMixer"
    assert b.file == "transformers/models/mamba/modeling_mamba.py"
    assert b.lines == forward_lines(MambaMixer)
    assert b.position == int(rec.born_at.split("@")[1])  # the run's first bad position
    # the first output off is a projection inside the mixer whose input was already off: the trace
    # climbed to the mixer, whose own input (the normed hidden state) agrees with the full pass
    assert b.first_off.startswith(b.module + ".") and b.first_off != b.module
    text = [t for _, t, _ in b.suspects]
    assert "if recurrent_state is not None and seq_len == 1:" in text


def test_the_step_holding_the_position_is_mapped_onto_the_full_pass():
    assert born.steps_span([5, 3, 4], 0) == (0, 0, 5)
    assert born.steps_span([5, 3, 4], 6) == (1, 5, 3)
    with pytest.raises(ValueError):
        born.steps_span([5, 3], 8)
    full = torch.randn(1, 12, 4)
    step = full[:, 5:8].clone()  # the step of positions 5, 6, 7
    assert born.gap(step, full, None, (5, 3, 7), 12)[0] == 0.0
    step[0, 2] += 1.0  # position 7 off: not seen before it, seen at it
    assert born.gap(step, full, None, (5, 3, 6), 12)[0] == 0.0
    assert born.gap(step, full, None, (5, 3, 7), 12)[0] == pytest.approx(1.0)
    # positions in dim 2 (a conv's (batch, channels, positions)); a padded length is not laid on positions
    assert born.seq_dim(torch.zeros(1, 6, 3), torch.zeros(1, 6, 12), 3, 12) == 2
    assert born.seq_dim(torch.zeros(1, 6, 6), torch.zeros(1, 6, 15), 3, 12) is None


def test_floor_per_module_output_comes_from_float64():
    full = torch.ones(1, 4, 2)
    f64 = full.double() + 1e-3
    err, floor = born.gap(full + 1e-4, full, f64, (0, 4, 3), 4)
    assert floor == pytest.approx(1e-3) and err < floor  # within the float64 floor: not off
    assert born.gap(full + 1e-4, full, None, (0, 4, 3), 4)[1] == pytest.approx(torch.finfo(torch.float32).eps)


def test_normalised_code_reads_alike_across_copies():
    mamba = ['    @decorator("x")\n', "    def forward(self, x: MambaCache, c: MambaConfig):\n",
             '        """Docs of Mamba."""\n', "        # a comment\n", "        return MambaThing(x)  # why\n"]
    falcon = ["    def forward(self, x: FalconMambaCache, c: FalconMambaConfig):\n",
              '        """Other docs."""\n', "        return FalconMambaThing(x)\n"]
    a = born.normalised(born.canonical(mamba), ["Mamba"])
    b = born.normalised(born.canonical(falcon), ["FalconMamba"])
    assert a == b and "MambaThing" not in a and "Config" in a
    assert born.normalised(born.canonical(falcon), []) != a  # the names are what differed


# -- groups -------------------------------------------------------------------------------------
def test_the_mamba_family_is_one_root_cause(family):
    recs = list(family.values())
    found = groups.groups(recs)
    assert len(found) == 1
    g = found[0]
    assert g["architectures"] == sorted(MAMBA_FAMILY) and g["first"] == "mamba"  # the mixer the others copy
    assert len({r.born_in.code for r in recs}) == 4  # four different forwards ...
    assert "if recurrent_state is not None and seq_len == 1:" in g["lines"]  # ... one shared branch
    assert g["members"]["mamba"]["class"] == "MambaMixer"


def test_the_mamba_mixers_declared_copies_are_read_from_their_modular_files(family):
    """modular_falcon_mamba.py has `class FalconMambaMixer(MambaMixer)` and modular_jamba.py
    `class JambaMambaMixer(FalconMambaMixer)`; Zamba's mixer declares no copy."""
    copies = {n: r.born_in.copies for n, r in family.items()}
    assert copies == {"falcon_mamba": ["mamba.MambaMixer"], "jamba": ["falcon_mamba.FalconMambaMixer", "mamba.MambaMixer"],
                      "mamba": [], "zamba": []}
    unlined = [dataclasses.replace(r, born_in=r.born_in.but(suspects=[])) for r in family.values()]  # no shared line left
    assert [g["architectures"] for g in groups.groups(unlined)] == [["falcon_mamba", "jamba", "mamba"], ["zamba"]]


def finding(name, code, lines=(), shape="state dropped at chunk starts", verdict="bug"):
    return record.bare(name, verdict, shape=shape, born_in={
        "module": "m.layers.0.mixer", "class": f"{name.title()}Mixer", "file": f"modeling_{name}.py",
        "lines": [10, 20], "code": code, "suspects": [[12, x, "a branch"] for x in lines]})


def test_grouping_rules():
    recs = [finding("d", "c1", ["if seq_len == 1:"], shape="decode path differs"),
            finding("b", "c2", ["if seq_len == 1:"]), finding("a", "c1"), finding("c", "c3", ["if seq_len == 1:"]),
            record.bare("e", "ok"), finding("f", None, verdict="unconfirmed"),
            record.bare("g", "bug", worst_schedule="padded", born_in=None)]
    got = {tuple(g["architectures"]): g for g in groups.groups(recs)}
    # a and d: the same code; b and c: the same suspect line and shape; d's line has another shape
    assert set(got) == {("a", "d"), ("b", "c"), ("f",), ("g",)}
    assert got["a", "d"]["by"].startswith("the same forward") and got["b", "c"]["by"] == "the same suspect line"
    assert got["a", "d"]["first"] == "a" and got["f",]["code"] == "FMixer.forward (modeling_f.py:10-20)"
    assert got["g",]["code"] is None and got["g",]["by"] is None  # a boundary finding: no module


def test_merged_shards_group_like_one_scan(family, tmp_path):
    recs = sorted(family.values(), key=lambda r: r.model_type)
    for i, part in enumerate((recs[::2], recs[1::2])):
        (tmp_path / f"s{i}.jsonl").write_text("".join(json.dumps(r.to_json(), default=str) + "\n" for r in part))
    merged = records.merge([tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"])
    assert groups.groups(merged) == groups.groups(recs)


def test_born_in_must_be_an_object():
    records.check_record("x", {"model_type": "a", "verdict": "bug", "born_in": {"module": "m"}})
    with pytest.raises(UserError, match="born_in"):
        records.check_record("x", {"model_type": "a", "verdict": "bug", "born_in": "m"})
    with pytest.raises(UserError, match='"born_in": "lines" must be a list'):  # a file's, held to its types
        records.check_record("x", {"model_type": "a", "verdict": "bug", "born_in": {"module": "m", "lines": "10-20"}})
    odd = record.bare("a", "bug", born_in={"module": "m", "lines": [10], "suspects": [3, ["x"]], "copies": "A"})
    b = record.born_module(odd)  # made in the process, not read from a file: each reader still copes
    assert b.span() is None and b.suspect_lines() == [] and b.copied() == []
    report.table([odd]), report.markdown([odd])  # an edited record still reports


# -- the report and the drafts ------------------------------------------------------------------
def test_table_markdown_and_json_show_the_module_and_the_groups(family):
    recs = list(family.values())
    text = report.table(recs)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "born in backbone.layers.0.mixer (MambaMixer)" in text
    md = report.markdown(recs)
    assert "| born in |" in md and "| `MambaMixer` |" in md and "`MambaMixer.forward`, modeling_mamba.py:" in md
    assert "## Root causes" in md and "4 findings, 1 root cause." in md
    assert "| falcon_mamba, jamba, mamba, zamba |" in md
    doc = report.document(recs)
    assert doc["groups"][0]["architectures"] == sorted(MAMBA_FAMILY)
    assert doc["architectures"][2]["born_in"]["class"] == "MambaMixer"


def test_group_draft_quotes_the_forward_and_names_every_architecture(family, tmp_path):
    from transformers.models.mamba.modeling_mamba import MambaMixer

    # as a scan leaves the architecture heading the group (Mamba's mixer, which the others declare
    # they copy): a reproducer and a draft of its own
    head = dataclasses.replace(family["mamba"], report_draft=str(tmp_path / "mamba.md"), reproducer=str(tmp_path / "mamba.py"))
    (tmp_path / "mamba.md").write_text("the draft check wrote\n")
    (tmp_path / "mamba.py").write_text('"""Reproducer: x.\n"""\nimport sys\n')
    written = draft.write_groups([family[n] for n in ("falcon_mamba", "jamba")] + [head, family["zamba"]],
                                 {"transformers": "x"})
    assert written == [tmp_path / "mamba.md"]
    text = written[0].read_text()
    lines = inspect.getsource(MambaMixer.forward).splitlines()
    assert lines[-1] in text and "def forward(" in text  # the forward, quoted
    assert "inside the forward above" in text
    assert "The same code breaks 3 more architectures" in text
    for name in ("falcon_mamba", "jamba", "zamba"):
        assert f"- {name}: `" in text
    note = (tmp_path / "mamba.py").read_text()
    assert note.count(repro.GROUP_LINE) == 1 and "falcon_mamba, jamba, zamba" in note  # every other one
    repro.note_group(tmp_path / "mamba.py", ["jamba"])  # a second scan rewrites, never adds
    assert (tmp_path / "mamba.py").read_text().count(repro.GROUP_LINE) == 1


def test_boundary_findings_have_no_module():
    assert born.born_in(None, None, [49], (0, 3), schedule="padded") is None
    assert born.born_in(None, None, [49], None) is None
