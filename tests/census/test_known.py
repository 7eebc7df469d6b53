"""What upstream knows (`smearcli.census.known`, `smearcli/census/known.toml`): the table read
strictly, every entry held to the finding it was written from, each finding placed (new,
regression, open, fixed later, by design) on the record, the page, the JSON and the draft, and
`scan --check` failing on new findings and regressions only (`--check all`: on every finding)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import smearcli.engines  # noqa: F401 - the built-in engines registered: a record without `engine` is transformers'
from smearcli.census import engines, known, record
from smearcli.census.record import BoundaryResult
from smearcli.util.errors import UserError
from smearcli.judging.judge import by_design
from smearcli.judging.verdicts import BUG, BY_DESIGN, CRASHED, OK

TABLE = '''
[[thread]]
id = "mamba-zero-state"
engine = "transformers"
architectures = ["mamba", "falcon_mamba"]
paths = ["widths *", "chunks of *", "rollback"]
shape = "*"
status = "open"
url = "https://github.com/huggingface/transformers/issues/1"
title = "cached multi-token step starts from zero"
seen = {release = "5.25.0", model_type = "mamba", path = "widths 3,4 (conv 4)", shape = "state dropped at chunk starts", verdict = "bug"}

[[thread]]
id = "v4-padding"
engine = "transformers"
architectures = ["deepseek_v4"]
paths = ["padded"]
shape = "padding leaks into a row"
status = "by design"
url = "https://github.com/huggingface/transformers/issues/2"
quote = "intended for this architecture"
seen = {release = "5.25.0", model_type = "deepseek_v4", path = "padded", shape = "padding leaks into a row", verdict = "bug"}

[[thread]]
id = "rg-positions"
engine = "transformers"
architectures = ["recurrent_gemma"]
paths = ["odd widths (seeded)"]
shape = "cache misreports its length"
status = "fixed in 5.24.0"
url = "https://github.com/huggingface/transformers/pull/3"
seen = {release = "5.25.0", model_type = "recurrent_gemma", path = "odd widths (seeded)", shape = "cache misreports its length", verdict = "bug"}

[[thread]]
id = "bamba-positions"
engine = "transformers"
architectures = ["bamba"]
paths = ["widths *"]
shape = "positions restart"
status = "new"
searched = "bamba position_ids cache; bamba chunked prefill"
seen = {release = "5.25.0", model_type = "bamba", path = "widths 3,4 (conv 4)", shape = "positions restart", verdict = "bug"}
'''


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "known.toml"
    path.write_text(TABLE)
    monkeypatch.setattr(known, "TABLE", path)  # what `scan` reads, in this process
    return known.load(path)


def finding(name, path, shape, release="5.25.0", verdict="bug", **kw):
    return record.bare(name, verdict, worst_schedule=path, shape=shape, transformers_version=release,
                       max_abs=0.1, multiple=1e4, **kw)


RECORDS = [finding("mamba", "widths 3,4 (conv 4)", "state dropped at chunk starts"),
           finding("deepseek_v4", "padded", "padding leaks into a row"),
           finding("recurrent_gemma", "odd widths (seeded)", "cache misreports its length"),
           finding("bamba", "widths 3,4 (conv 4)", "positions restart"),
           finding("xlm", "full pass, last tokens changed", "the full pass leaks future tokens"),
           record.bare("llama", "ok", transformers_version="5.25.0")]


def placed(table, records=RECORDS):
    return {r.model_type: r for r in known.place([record.Record.from_json(r.to_json()) for r in records], table)}


def test_each_finding_is_placed_by_what_upstream_knows(table):
    by = placed(table)
    assert {k: known.worst(r) for k, r in by.items()} == {
        "mamba": known.OPEN, "deepseek_v4": known.DESIGNED, "recurrent_gemma": known.REGRESSION,
        "bamba": known.NEW, "xlm": known.NEW, "llama": None}
    assert by["deepseek_v4"].verdict == BY_DESIGN  # the judge's word, outside the bug count
    assert by["mamba"].verdict == BUG and by["llama"].verdict == OK and by["llama"].upstream is None
    assert by["mamba"].upstream[0].threads[0].url.endswith("/issues/1")
    assert by["bamba"].upstream[0].searched.startswith("bamba position_ids")  # new, and what was searched
    assert by["xlm"].upstream[0].searched is None  # new, and nobody looked: no entry


def test_a_fix_in_a_later_release_is_known_and_the_same_release_is_a_regression(table):
    early = placed(table, [finding("recurrent_gemma", "odd widths (seeded)", "cache misreports its length", "5.23.0")])
    assert known.worst(early["recurrent_gemma"]) == known.FIXED_LATER
    same = placed(table, [finding("recurrent_gemma", "odd widths (seeded)", "cache misreports its length", "5.24.0")])
    assert known.worst(same["recurrent_gemma"]) == known.REGRESSION


def test_an_entry_matches_the_record_never_the_name_alone(table):
    other_shape = placed(table, [finding("deepseek_v4", "padded", "mask wrong")])
    other_path = placed(table, [finding("deepseek_v4", "decode", "padding leaks into a row")])
    other_engine = placed(table, [finding("deepseek_v4", "padded", "padding leaks into a row", engine="vllm")])
    for by in (other_shape, other_path, other_engine):
        assert known.worst(by["deepseek_v4"]) == known.NEW and by["deepseek_v4"].verdict == BUG


def test_every_part_of_a_finding_is_placed_and_one_new_part_keeps_the_bug(table):
    both = finding("deepseek_v4", "padded", "padding leaks into a row",
                   boundaries={"padded": {"status": "bug", "shape": "padding leaks into a row"},
                               "rollback": {"status": "bug", "shape": "state not rolled back"}})
    r = placed(table, [both])["deepseek_v4"]
    assert [(u.path, u.class_name) for u in r.upstream] == [("padded", known.DESIGNED), ("rollback", known.NEW)]
    assert r.verdict == BUG and known.worst(r) == known.NEW
    assert isinstance(r.boundaries["rollback"], BoundaryResult)


def test_placing_twice_gives_the_same_words(table):
    once = placed(table)
    twice = known.place(list(once.values()), table)
    assert {r.model_type: (r.verdict, r.upstream) for r in twice} == {
        k: (r.verdict, r.upstream) for k, r in once.items()}


def test_by_design_is_the_judges_rule():
    assert by_design(BUG, [known.DESIGNED]) == BY_DESIGN
    assert by_design(CRASHED, [known.DESIGNED, known.DESIGNED]) == BY_DESIGN
    assert by_design(BUG, [known.DESIGNED, known.NEW]) == BUG
    assert by_design(BUG, []) == BUG and by_design(OK, [known.DESIGNED]) == OK


def test_the_packages_table_is_whole_and_each_entry_matches_the_finding_it_was_written_from():
    entries = known.load()
    by_id = {e.id: e for e in entries}
    for e in entries:
        seen = e.seen
        assert seen["model_type"] in e.architectures, e.id
        r = known.stand_in(e)
        part = known.findings(r)[0]
        covering = [x.id for x in entries if x.covers(e.engine, r.model_type, part)]
        assert e.id in covering, f"{e.id}: no longer matches the finding it was written from ({seen})"
        # one finding, one thread: another entry covering it must say it is a duplicate of this one
        others = [x for x in covering if x != e.id and by_id[x].duplicate_of != e.id and e.duplicate_of != x]
        assert not others, f"{e.id}: the same finding is also covered by {others}"


@pytest.mark.parametrize("text, says", [
    ('[[thread]]\nid = "a"\nengine = "transformers"\narchitectures = ["x"]\npaths = ["decode"]\nshape = "*"\n'
     'status = "open"\nurl = "https://x"\nbogus = 1\n', "unknown field 'bogus'"),
    (TABLE + TABLE.split("\n\n")[1], "id 'v4-padding' is already entry 2"),
    (TABLE.replace('status = "open"', 'status = "opened"'), "status 'opened' is none of"),
    (TABLE.replace('status = "open"', 'status = "duplicate of nothing-here"'), "a duplicate of 'nothing-here'"),
    (TABLE.replace('url = "https://github.com/huggingface/transformers/issues/1"', ''), "needs its url"),
    (TABLE.replace('searched = "bamba position_ids cache; bamba chunked prefill"', ''), "what was searched"),
    (TABLE.replace('architectures = ["bamba"]', 'architectures = "bamba"'), "'architectures' must be a list"),
    ("[[thread]\n", "not a valid TOML"),
    (TABLE.replace('seen = {release = "5.25.0", model_type = "bamba", ', 'seen = {'), "'seen' needs release"),
], ids=["unknown field", "id twice", "status", "duplicate of none", "no url", "new unsearched", "types", "toml",
        "seen"])
def test_a_broken_table_is_refused_naming_the_file_and_the_entry(tmp_path, text, says):
    path = tmp_path / "known.toml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        known.load(path)
    assert str(path) in str(e.value) and says in str(e.value)


def test_stale_entries_are_named(table):
    by = placed(table, [finding("mamba", "widths 3,4 (conv 4)", "state dropped at chunk starts"),
                        record.bare("deepseek_v4", "ok", transformers_version="5.26.0")])
    assert [e.id for e in known.stale(list(by.values()), table)] == ["v4-padding"]  # checked, matched nothing


def test_drafts_become_a_comment_a_regression_report_or_none(table, tmp_path):
    recs = []
    for r in RECORDS[:4]:
        (tmp_path / f"{r.model_type}.md").write_text(f"# {r.model_type}: draft\n")
        recs.append(record.Record.from_json({**r.to_json(), "report_draft": str(tmp_path / f"{r.model_type}.md")}))
    from smearcli.engines.transformers.draft import for_upstream

    by = {r.model_type: r for r in known.place(recs, table)}
    for_upstream(list(by.values()))
    mamba = (tmp_path / "mamba.md").read_text()
    assert mamba.startswith("# A comment for https://github.com/huggingface/transformers/issues/1")
    assert "# mamba: draft" in mamba  # the census's evidence below
    assert not (tmp_path / "deepseek_v4.md").exists() and by["deepseek_v4"].report_draft is None
    assert (tmp_path / "recurrent_gemma.md").read_text().startswith("> **A regression.**")
    assert (tmp_path / "bamba.md").read_text() == "# bamba: draft\n"  # new: the report as it was


def invoke(*args):
    r = CliRunner().invoke(app(), ["scan", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def app():
    from smearcli.cli.app import app

    return app


def test_scan_check_fails_on_new_findings_and_regressions_only(table, tmp_path):
    pytest.importorskip("transformers")
    f = tmp_path / "census.jsonl"
    f.write_text("".join(json.dumps(r.to_json()) + "\n" for r in RECORDS))
    r = invoke("--merge", f, "--check")
    assert r.exit_code == 1
    assert "3 architectures with a finding upstream does not know or had fixed" in r.stderr
    assert "bamba (new)" in r.stderr and "recurrent_gemma (regression)" in r.stderr and "xlm (new)" in r.stderr
    assert "known upstream, listed and not failed: mamba (open)" in r.stderr
    every = invoke("--merge", f, "--check", "all")  # today's gate: every bug, known or not
    assert every.exit_code == 1 and "4 architectures disagree" in every.stderr
    known_only = tmp_path / "known.jsonl"
    known_only.write_text("".join(json.dumps(r.to_json()) + "\n" for r in RECORDS[:2]))
    assert invoke("--merge", known_only, "--check").exit_code == 0
    assert invoke("--merge", known_only, "--check", "all").exit_code == 1
    stray = invoke("--merge", known_only, "all")
    assert stray.exit_code == 2 and "--check all" in stray.output


def test_the_page_the_json_and_the_table_say_it(table, tmp_path):
    pytest.importorskip("transformers")
    f, md = tmp_path / "census.jsonl", tmp_path / "census.md"
    f.write_text("".join(json.dumps(r.to_json()) + "\n" for r in RECORDS))
    r = invoke("--merge", f, "--markdown", md)
    assert r.exit_code == 0, r.output
    assert "upstream: open huggingface/transformers#1" in r.stdout and "upstream: new" in r.stdout
    page = md.read_text()
    assert "**2 new findings** of 5 against what upstream knows: 2 new, 1 regression, 1 known and open upstream, " \
           "1 by design" in page
    assert "[open](https://github.com/huggingface/transformers/issues/1)" in page
    assert "[fixed in 5.24.0](https://github.com/huggingface/transformers/pull/3): regression" in page
    doc = json.loads(invoke("--merge", f, "--json").stdout)
    assert doc["counts"]["by design"] == 1 and doc["counts"]["bug"] == 4
    v4 = next(a for a in doc["architectures"] if a["model_type"] == "deepseek_v4")
    assert v4["verdict"] == "by design" and v4["upstream"][0]["threads"][0]["quote"] == "intended for this architecture"


def test_a_declared_limit_their_crop_departed_from_anyway_is_placed_too(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text('''[[thread]]
id = "linear-crop"
engine = "transformers"
architectures = ["qwen3_next"]
paths = ["rollback"]
shape = "*"
verdicts = ["unsupported"]
status = "fixed in 5.25.0"
url = "https://github.com/huggingface/transformers/issues/9"
seen = {release = "5.24.0", model_type = "qwen3_next", path = "rollback", shape = "", verdict = "unsupported"}
''')
    entry, = known.load(path)
    r, = known.place([known.stand_in(entry)], [entry])
    assert r.verdict == OK and r.upstream[0].verdict == "unsupported"
    assert known.worst(r) == known.FIXED_LATER  # 5.24 declared it, 5.25 fixed it
    assert known.failing([r], ("bug",)) == []  # an ok architecture: listed on the page, never failed
    again, = known.place([r], [entry])
    assert again.upstream == r.upstream


def test_placing_a_record_before_any_engine_is_registered_says_so(monkeypatch):
    """A record without `engine` is the unnamed engine's; with none registered (a notebook that did not
    import smearcli.engines) its findings would match nothing and read `new`: it is refused instead."""
    monkeypatch.setattr(engines, "ENGINES", {})
    with pytest.raises(UserError, match="importing smearcli.engines"):
        known.place([record.bare("mamba", "bug", worst_schedule="chunked")], known.load())
