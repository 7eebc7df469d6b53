"""The benchmark of public bugs (benchmarks/public_bugs, scripts/public_bugs.py): the list is valid,
every probe stands alone (torch, transformers and the standard library only), and the script's
decision (found / missed / found on the fixed release too) on hand-made records. Fast: no network,
no release installed, no scan run."""
import ast
import json
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from smearcli.census import record

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "public_bugs"


@pytest.fixture(scope="module")
def pb():
    spec = importlib.util.spec_from_file_location("public_bugs_script", ROOT / "scripts" / "public_bugs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)
    return mod


@pytest.fixture(scope="module")
def bugs(pb):
    return pb.load()


# --------------------------------------------------------------------------- the list


def test_at_least_twelve_bugs_over_four_path_classes_and_both_sets(bugs):
    assert len(bugs) >= 12
    classes = {b["path_class"].split(" (")[0] for b in bugs}
    assert len(classes) >= 4, classes
    for which in ("development", "independent"):
        assert sum(b["set"] == which for b in bugs) >= 4
    assert len({b["buggy"] for b in bugs}) >= 5  # releases spread over 5.x


def test_every_entry_is_whole_and_well_formed(bugs, pb):
    for b in bugs:
        assert pb.problems(b) == [], b["slug"]
        assert re.fullmatch(r"huggingface/transformers#\d+", b["link"])
        if b["fixed"] != "open":
            assert pb.version_key(b["buggy"]) < pb.version_key(b["fixed"])
        assert b["set"] == ("development" if int(b["link"].split("#")[1]) % 2 == 0 else "independent")
        assert pb.url(b["link"]).startswith("https://github.com/huggingface/transformers/issues/")


def test_a_broken_entry_is_refused(pb, tmp_path, bugs):
    good = dict(bugs[0])
    assert pb.problems(good) == []
    assert any("link" in p for p in pb.problems({**good, "link": "transformers#12"}))
    assert any("not before" in p for p in pb.problems({**good, "buggy": "5.9.0", "fixed": "5.9.0"}))
    assert any("not before" in p for p in pb.problems({**good, "buggy": "5.10.0", "fixed": "5.9.0"}))
    assert any("5.x release" in p for p in pb.problems({**good, "buggy": "4.57.1"}))
    assert pb.problems({**good, "fixed": "open"}) == []
    assert any("set" in p for p in pb.problems({**good, "set": "independent" if good["set"] == "development" else "development"}))
    assert any("probe" in p for p in pb.problems({**good, "probe": "probe_missing.py"}))
    assert any("no description" in p for p in pb.problems({k: v for k, v in good.items() if k != "description"}))
    assert any("paths" in p for p in pb.problems({**good, "paths": []}))
    assert any("raises" in p for p in pb.problems({**good, "raises": "("}))
    assert pb.problems({**good, "raises": r"KeyError: 'x'"}) == []
    path = tmp_path / "bugs.toml"
    path.write_text('[[bug]]\nslug = "x"\nlink = "huggingface/transformers#1"\n')
    with pytest.raises(SystemExit, match="no title"):
        pb.load(path)


def test_probes_stand_alone(bugs):
    """A probe imports torch, transformers and the standard library only: never smearcli, never
    a sibling file, so that it runs in any release's Python as a user would."""
    allowed = {"torch", "transformers"} | set(sys.stdlib_module_names)
    probes = sorted(BENCH.glob("probe_*.py"))
    assert {b["probe"] for b in bugs} == {p.name for p in probes}  # one probe per bug, none left over
    for p in probes:
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{p.name}: relative import"
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{p.name} imports {name}"
        assert "smearcli" not in p.read_text(), p.name
        assert ast.get_docstring(tree), f"{p.name}: no docstring naming its bug"
        assert re.search(r"transformers#\d+", ast.get_docstring(tree))


# --------------------------------------------------------------------------- the decision


BUG = {"slug": "x", "link": "huggingface/transformers#2", "combination": "c", "architectures": ["mamba2"], "fixed": "5.13.0",
       "buggy": "5.12.1", "paths": ["chunks of *", "widths *", "rollback*", "prefill_chunk_size"],
       "set": "development"}


def rec(verdict="ok", **fields):
    return record.bare("mamba2", verdict, **fields)


def test_found_on_the_buggy_release_and_gone_on_the_fixed(pb):
    buggy = rec("bug", worst_schedule="widths 3,4 (conv 4)", shape="state dropped at chunk starts")
    o = pb.decide(BUG, {"mamba2": buggy}, {"mamba2": rec("ok")})
    assert o.word == "found"
    assert o.buggy.found and "widths 3,4 (conv 4): bug (state dropped at chunk starts)" in o.buggy.said
    assert not o.fixed.found and o.fixed.said == "mamba2: ok"


def test_a_finding_on_another_path_is_a_miss_that_says_what_it_was(pb):
    other = rec("bug", worst_schedule="decode", shape="decode path differs")
    o = pb.decide(BUG, {"mamba2": other}, {"mamba2": rec("ok")})
    assert o.word == "missed"
    assert o.buggy.said == "mamba2: bug elsewhere: decode, decode path differs"


def test_nothing_found_is_missed(pb):
    for verdict in ("ok", "inconclusive", "unconfirmed"):
        o = pb.decide(BUG, {"mamba2": rec(verdict, worst_schedule="chunks of 16")}, {"mamba2": rec("ok")})
        assert o.word == "missed", verdict


def test_found_on_the_fixed_release_too_is_not_found(pb):
    r = rec("bug", worst_schedule="chunks of 16")
    o = pb.decide(BUG, {"mamba2": r}, {"mamba2": r})
    assert o.word == "found on the fixed release too"
    assert pb.recall([o]) == (0, 1)


def test_a_finding_upstream_files_under_another_thread_is_that_bugs_not_this_ones(pb):
    """On the fixing release mamba2's rollback is still a bug, the crop bug #49036 (fixed later),
    which known.toml places there: "rollback" is among this bug's paths, but the finding is the
    other report's, so the fix holds and the page names the other thread. Placed against this
    bug's own thread, or against none, it counts as before."""
    other = {"path": "rollback", "threads": [{"url": "https://github.com/huggingface/transformers/issues/49036"}]}
    fixed = rec("bug", worst_schedule="rollback", shape="state not rolled back", upstream=[other])
    buggy = rec("bug", worst_schedule="widths 3,4 (conv 4)", shape="state dropped at chunk starts")
    o = pb.decide(BUG, {"mamba2": buggy}, {"mamba2": fixed})
    assert o.word == "found", o
    assert o.fixed.said == "mamba2: bug elsewhere: rollback, state not rolled back (upstream's #49036)"
    mine = {"path": "rollback", "threads": [{"url": "https://github.com/huggingface/transformers/issues/2"}]}
    for up in ([mine], None):
        again = rec("bug", worst_schedule="rollback", shape="state not rolled back", upstream=up)
        assert pb.decide(BUG, {"mamba2": buggy}, {"mamba2": again}).word == "found on the fixed release too"


def test_generates_path_placed_under_another_thread_is_that_bugs_too(pb):
    """A crash on generate's prefill_chunk_size (a key of `reach`; its headline "generate:
    prefill_chunk_size") that known.toml files under another report (zamba2 on 5.13.0: #47086's
    mask, not #46741's mixer) is that report's on the fixing release; unplaced, it counts."""
    crash = {"prefill_chunk_size": {"result": "raises first", "why": "modeling_zamba2.py:729: RuntimeError"}}
    other = {"path": "generate: prefill_chunk_size",
             "threads": [{"url": "https://github.com/huggingface/transformers/issues/47086"}]}
    buggy = rec("bug", worst_schedule="widths 3,4 (conv 4)", shape="state dropped at chunk starts")
    placed = rec("crashed", worst_schedule="generate: prefill_chunk_size", reach=crash, upstream=[other])
    assert pb.decide(BUG, {"mamba2": buggy}, {"mamba2": placed}).word == "found"
    alone = rec("crashed", worst_schedule="generate: prefill_chunk_size", reach=crash)
    assert pb.decide(BUG, {"mamba2": buggy}, {"mamba2": alone}).word == "found on the fixed release too"


def test_generates_path_beside_another_headline_is_placed_by_the_same_table(pb):
    """zamba2 on 5.13.0: its headline is another bug, and generate's prefill_chunk_size raises beside
    it, unplaced by the census (which places headlines and boundaries); known.toml files that crash
    under #47086 for 5.13.0, so it is not #46741's on its fixing release. On a release known.toml
    does not file it for (no entry of that architecture), it counts."""
    bug = {**BUG, "architectures": ["zamba2"], "link": "huggingface/transformers#46741"}
    crash = {"prefill_chunk_size": {"result": "raises first", "why": "modeling_zamba2.py:729: RuntimeError"}}
    buggy = record.bare("zamba2", "bug", worst_schedule="widths 3,4 (conv 4)", shape="state dropped at chunk starts")
    beside = record.bare("zamba2", "bug", worst_schedule="decode", reach=crash, transformers_version="5.13.0")
    o = pb.decide(bug, {"zamba2": buggy}, {"zamba2": beside})
    assert o.word == "found" and o.fixed.said == ("zamba2: bug elsewhere: decode; generate's prefill_chunk_size "
                                                  "raises (upstream's #47086)"), o.fixed.said
    other = record.bare("zamba2", "bug", worst_schedule="decode", reach=crash, transformers_version="5.13.0")
    other.model_type = "mamba2"
    assert pb.decide(BUG, {"mamba2": buggy}, {"mamba2": other}).word == "found on the fixed release too"


def test_a_schedule_beside_the_headline_counts(pb):
    r = rec("bug", worst_schedule="decode", schedules={"decode": {"status": "bug"},
                                                       "chunks of 16": {"passed": False, "status": "bug"}})
    assert pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")}).word == "found"
    r = rec("bug", worst_schedule="decode", schedules={"chunks of 16": {"passed": False, "status": "unconfirmed"}})
    assert pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")}).word == "missed"


def test_a_boundary_and_their_crop_count(pb):
    r = rec("bug", worst_schedule="decode", boundaries={"rollback": {"status": "bug", "shape": "state not rolled back"}})
    o = pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")})
    assert o.word == "found" and "rollback: bug (state not rolled back)" in o.buggy.said
    r = rec("bug", worst_schedule="decode", boundaries={"rollback": {"status": "not judged",
                                                                     "their_crop": {"status": "crashed"}}})
    o = pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")})
    assert o.word == "found" and "rollback (their crop): crashed" in o.buggy.said
    # a boundary whose name the bug does not name does not count
    r = rec("bug", worst_schedule="decode", boundaries={"padded": {"status": "bug"}})
    assert pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")}).word == "missed"
    # a boundary that is the headline counts once, under its name
    r = rec("bug", worst_schedule="rollback (3 drafts across the window)", shape="state not rolled back",
            boundaries={"rollback (3 drafts across the window)": {"status": "bug"}})
    o = pb.decide(BUG, {"mamba2": r}, {"mamba2": rec("ok")})
    assert o.word == "found" and o.buggy.said.count("rollback") == 1


def test_reach_counts_only_where_the_census_has_a_finding(pb):
    reach = {"prefill_chunk_size": {"result": "silently wrong", "max_abs": 0.1, "why": None}}
    o = pb.decide(BUG, {"mamba2": rec("bug", worst_schedule="decode", reach=reach)}, {"mamba2": rec("ok")})
    assert o.word == "found" and "generate's prefill_chunk_size: silently wrong" in o.buggy.said
    o = pb.decide(BUG, {"mamba2": rec("ok", reach=reach)}, {"mamba2": rec("ok")})
    assert o.word == "missed"


def test_a_crash_on_the_path_counts_and_elsewhere_does_not(pb):
    on = rec("crashed", worst_schedule=None, reason="modeling_mamba2.py:350 in forward: IndexError",
             notes=["cache passed back as cache_params=", "chunks of 16 raised; the full pass runs"])
    o = pb.decide(BUG, {"mamba2": on}, {"mamba2": rec("ok")})
    assert o.word == "found" and "chunks of 16: crashed (modeling_mamba2.py:350" in o.buggy.said
    # a note that only mentions the path (rollback's description) is not the path raising
    off = rec("crashed", worst_schedule=None, reason="modeling_x.py:3 in forward: ValueError",
              notes=["rollback: drafts of 4, the last 2 of each rejected", "decode raised; the full pass runs"])
    o = pb.decide(BUG, {"mamba2": off}, {"mamba2": rec("ok")})
    assert o.word == "missed" and "crashed elsewhere" in o.buggy.said
    # a crash headed by a combination the bug does not name is not the bug
    combo = rec("crashed", worst_schedule="padded-chunks", reason="apply_mask_to_padding_states: RuntimeError",
                notes=["rollback: drafts of 4", "padded-chunks crashed: RuntimeError"])
    assert pb.decide(BUG, {"mamba2": combo}, {"mamba2": rec("ok")}).word == "missed"


def test_a_generate_path_raising_counts_and_its_message_tells_which_bug(pb):
    """A public path that raised inside their code once generate accepted the call is the census's
    crash on that path: on a record whose headline is it, and in the reach of a finding found
    elsewhere. A bug whose symptom is an exception names its message (`raises`), so another crash
    on the same path (an earlier error hiding it) is not counted as this one."""
    static = dict(BUG, paths=["*static*"])
    head = rec("crashed", worst_schedule="generate: static cache", shape="through generate only",
               reason="transformers/masking_utils.py:9 in create_masks_for_generate: KeyError: 'linear_attention'")
    o = pb.decide(static, {"mamba2": head}, {"mamba2": rec("ok")})
    assert o.word == "found" and "generate: static cache: crashed (through generate only)" in o.buggy.said
    raised = {"static cache": {"result": "raises first", "max_abs": None,
                               "why": "transformers/masking_utils.py:9 in f: KeyError: 'linear_attention'"}}
    beside = rec("bug", worst_schedule="rollback", reach=raised)
    o = pb.decide(static, {"mamba2": beside}, {"mamba2": rec("ok")})
    assert o.word == "found" and "generate's static cache: raises first (reach; " in o.buggy.said
    refused = {"static cache": {"result": "refused", "max_abs": None, "why": "transformers/generation/utils.py:1"}}
    assert pb.decide(static, {"mamba2": rec("bug", worst_schedule="rollback", reach=refused)},
                     {"mamba2": rec("ok")}).word == "missed"
    other = dict(static, raises=r"RuntimeError")  # the early-init bug's error, hidden by the KeyError
    for r in (head, beside):
        assert pb.decide(other, {"mamba2": r}, {"mamba2": rec("ok")}).word == "missed"
    assert pb.decide(dict(static, raises=r"KeyError: 'linear_attention'"), {"mamba2": head},
                     {"mamba2": rec("ok")}).word == "found"
    # on the fixing release any failure on the path counts against the fix, whatever its message
    assert pb.decide(other, {"mamba2": rec("crashed", worst_schedule="generate: static cache", reason="RuntimeError")},
                     {"mamba2": head}).word == "found on the fixed release too"


def test_not_run_and_open_bugs(pb):
    assert pb.decide(BUG, {}, {}).word == "not run yet"
    found = rec("bug", worst_schedule="chunks of 16")
    assert pb.decide(BUG, {"mamba2": found}, {}).word == "not run yet"  # the fixed release still to run
    o = pb.decide({**BUG, "fixed": "open"}, {"mamba2": found}, None)
    assert o.word == "found" and o.fixed is None
    nb = rec("not built", reason="'Qwen3_5Config' object has no attribute 'vocab_size'")
    assert pb.decide(BUG, {"mamba2": nb}, {"mamba2": rec("ok")}).buggy.said.startswith("mamba2: not built: ")


def test_any_named_architecture_finds_it(pb):
    bug = {**BUG, "architectures": ["mamba2", "zamba2"]}
    z = record.bare("zamba2", "bug", worst_schedule="chunks of 16")
    o = pb.decide(bug, {"mamba2": rec("ok"), "zamba2": z},
                  {"mamba2": rec("ok"), "zamba2": record.bare("zamba2", "ok")})
    assert o.word == "found" and o.buggy.said.startswith("zamba2: ")


def test_recall_per_set_and_the_page(pb, bugs):
    found = pb.Outcome({**BUG, "set": "development"}, pb.Seen(True, "x"), pb.Seen(False, "ok"), "found")
    missed = pb.Outcome({**BUG, "set": "independent"}, pb.Seen(False, "ok"), pb.Seen(False, "ok"), "missed")
    assert pb.recall([found, missed]) == (1, 2)
    assert pb.recall([found, missed], "development") == (1, 1)
    assert pb.recall([found, missed], "independent") == (0, 1)
    outs = [pb.decide(b, {}, {}) for b in bugs]
    text = pb.page(outs, {}, None)
    assert text.startswith("# Public bugs")
    assert f"**Recall: 0 of {len(bugs)}**" in text
    for b in bugs:
        assert b["link"] in text and b["slug"] in text
    assert "## The development set" in text and "## The independent set" in text


def test_records_are_kept_per_census(pb, tmp_path, monkeypatch):
    """A rerun of the same census resumes from its records; a rerun after the census changed
    (any .py or .toml under smearcli/) scans afresh, so the page says what this checkout finds."""
    (tmp_path / "smearcli").mkdir()
    (tmp_path / "smearcli" / "rules.py").write_text("A = 1\n")
    monkeypatch.setattr(pb, "ROOT", tmp_path)
    monkeypatch.setenv("SMEARCLI_RELEASES", str(tmp_path / "cache"))
    first = pb.record_file("5.12.1", "mamba2")
    assert first == pb.record_file("5.12.1", "mamba2")
    assert first.is_relative_to(tmp_path / "cache" / "public-bugs")
    (tmp_path / "smearcli" / "notes.md").write_text("not code\n")
    assert pb.record_file("5.12.1", "mamba2") == first
    (tmp_path / "smearcli" / "rules.py").write_text("A = 2\n")
    assert pb.record_file("5.12.1", "mamba2") != first
    assert pb.read_record(first) is None  # nothing scanned: not run yet, never an error


def test_the_page_without_running_shows_the_last_census_and_says_so(pb, tmp_path, monkeypatch, bugs):
    """--no-run after the census changed shows the records of the last census that ran, and says
    they are an earlier census's, never "not run yet" for all."""
    monkeypatch.setenv("SMEARCLI_RELEASES", str(tmp_path))
    b = bugs[0]
    old = tmp_path / "public-bugs" / "census-0123456789ab"
    found = record.bare(b["architectures"][0], "bug", worst_schedule="chunks of 16")
    for release, r in ((b["buggy"], found), (b["fixed"], record.bare(b["architectures"][0], "ok"))):
        (old / release).mkdir(parents=True)
        (old / release / f"{b['architectures'][0]}.jsonl").write_text(json.dumps(r.to_json()) + "\n")
    page = tmp_path / "page.md"
    monkeypatch.setattr(pb, "_PINNED", None)
    assert pb.main(["--no-run", "--only", b["slug"], "--page", str(page)]) == 0
    text = page.read_text()
    assert "the records of census key 0123456789ab, an earlier state of smearcli" in text
    assert f"{b['slug']} | {b['path_class']}" in text and "**found**" in text
