"""Boundary inputs that cannot form the boundary they ask for, or would never cross it, are refused
up front with the numbers, for every --impl: document lengths that do not sum to the input, one
document, an empty one between <|bos|> markers, a draft longer than what is verified, a reject
that leaves nothing of the draft, a rollback in which no draft is ever taken back. A `--check`
over a boundary that never happened would pass having checked nothing; these are exit 2 with one
line, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hardening_util import invoke, leftovers

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"
F = ["--depth", "1", "--seq-len", "16", "--gen-len", "4"]
MINE = ["--impl", "nanochat", "--nanochat-path", "mine"]
HF = ["--impl", "hf", "--hf-model", "llama"]
VLLM = ["--impl", "vllm", "--hf-model", "m", "--vllm-python", "/bin/true"]
NEVER = "no draft would ever be taken back"

CASES = [  # (id, arguments after `compare`, the whole message after "smearcli: error: ")
    ("documents sum", [*F, "--schedules", "packed", "--documents", "8,4"],
     "--documents 8,4: the lengths sum to 12 but the input has 16 tokens"),
    ("one document", ["--depth", "1", "--schedules", "packed", "--documents", "16", "--check", "--leak-limit", "1"],
     "--documents 16: one document, so no boundary between documents is ever crossed; give two or more lengths"),
    ("an empty document", [*F, "--schedules", "packed", "--documents", "8,0,8"],
     "--documents: every document needs at least one token (its BOS), got 8,0,8"),
    ("an empty document between markers", ["--depth", "1", "--schedules", "packed", "--text", "a<|bos|><|bos|>b"],
     "--text: document 2 of the 3 the <|bos|> markers split the text into is empty (two <|bos|> markers with "
     "nothing between them); remove the extra marker"),
    ("a marker at the end", ["--depth", "1", "--schedules", "packed", "--text", "a<|bos|>"],
     "--text: document 2 of the 2 the <|bos|> markers split the text into is empty (the text ends with a "
     "marker); remove the extra marker"),
    ("a text without markers", ["--depth", "1", "--schedules", "packed", "--text", "hello", "--check",
                                "--leak-limit", "1"],
     "--schedules packed: the input is one document of 6 tokens (no BOS, id 0, after position 0), so no "
     "boundary between documents is ever crossed; mark each document's start, or give --documents LENGTHS"),
    ("token ids of one document", ["--depth", "1", "--schedules", "packed", "--tokens", "one.json"],
     "--schedules packed: the input is one document of 4 tokens (no BOS, id 0, after position 0), so no "
     "boundary between documents is ever crossed; mark each document's start, or give --documents LENGTHS"),
    ("markers against --documents", ["--depth", "1", "--schedules", "packed", "--text", "ab<|bos|>cd",
                                     "--documents", "2,4"],
     "--documents 2,4: the text's <|bos|> markers split it into documents of 3,3 tokens; give the markers or "
     "--documents"),
    ("reject = draft", [*F, "--schedules", "rollback", "--reject", "4", "--draft", "4"],
     "--reject 4 with --draft 4: rollback rejects 1 to 3 tokens of each draft (fewer than --draft), so the "
     "cache has something to keep"),
    ("reject > draft", [*F, "--schedules", "rollback", "--reject", "5", "--draft", "3"],
     "--reject 5 with --draft 3: rollback rejects 1 to 2 tokens of each draft (fewer than --draft), so the "
     "cache has something to keep"),
    ("a draft never whole", [*F, "--schedules", "rollback", "--draft", "6", "--check"],
     f"--schedules rollback: {NEVER}: the 4 tokens verified after the prompt (--gen-len 4 of a 16-token "
     "input) are fewer than one --draft of 6; give --draft 4 or less, or a longer --gen-len or input"),
    ("a draft longer than the input", ["--depth", "1", "--seq-len", "4", "--schedules", "rollback", "--check"],
     f"--schedules rollback: {NEVER}: the 3 tokens verified after the prompt (all but the first of a "
     "4-token input) are fewer than one --draft of 4; give --draft 3 or less, or a longer --gen-len or input"),
    ("token ids too short for a draft", ["--depth", "1", "--schedules", "rollback", "--tokens", "short.json"],
     f"--schedules rollback: {NEVER}: the 2 tokens verified after the prompt (all but the first of a "
     "3-token input) are fewer than one --draft of 4; give --draft 2 or less, or a longer --gen-len or input"),
    ("speculative draft longer than verified", [*F, "--schedules", "speculative", "--draft", "6"],
     "--draft 6: longer than the 4 tokens verified after the prompt (--gen-len 4 of a 16-token input); "
     "give --draft 4 or less"),
    ("--reject without rollback", [*F, "--reject", "1"],
     "--reject sizes the rollback schedule; add --schedules rollback"),
    ("--leak-limit nan", [*F, "--schedules", "packed", "--documents", "8,8", "--leak-limit", "nan"],
     "--leak-limit must be a finite number >= 0, got nan"),
    # the user's checkout: the same refusals, before their code is imported
    ("nanochat: documents sum", [*MINE, *F, "--schedules", "packed", "--documents", "10,10"],
     "--documents 10,10: the lengths sum to 20 but the input has 16 tokens"),
    ("nanochat: one document", [*MINE, "--depth", "1", "--schedules", "packed", "--documents", "12"],
     "--documents 12: one document, so no boundary between documents is ever crossed; give two or more lengths"),
    # a checkout's cache can be neither cropped nor copied: rollback is not offered, before its numbers
    ("nanochat: rollback", [*MINE, *F, "--schedules", "rollback", "--draft", "5", "--reject", "1"],
     "--schedules: rollback cannot run with --impl nanochat (it can neither copy nor crop its cache); "
     "choose from prefill, decode, chunked, engine, speculative, packed"),
    # a transformers model
    ("hf: a draft longer than the input", [*HF, "--seq-len", "4", "--schedules", "rollback", "--check"],
     f"--schedules rollback: {NEVER}: the 3 tokens verified after the prompt (all but the first of a "
     "4-token input) are fewer than one --draft of 4; give --draft 3 or less, or a longer --gen-len or input"),
    ("hf: token ids too short for a draft", [*HF, "--schedules", "rollback", "--tokens", "short.json"],
     f"--schedules rollback: {NEVER}: the 2 tokens verified after the prompt (all but the first of a "
     "3-token input) are fewer than one --draft of 4; give --draft 2 or less, or a longer --gen-len or input"),
    ("hf: reject = draft", [*HF, "--schedules", "rollback", "--reject", "4"],
     "--reject 4 with --draft 4: rollback rejects 1 to 3 tokens of each draft (fewer than --draft), so the "
     "cache has something to keep"),
    ("hf: --documents", [*HF, "--documents", "8,8"], "--documents sizes the packed schedule, which --impl hf "
                                                     "does not run"),
    ("hf: --leak-limit", [*HF, "--leak-limit", "1"], "--leak-limit gates the packed schedule, which --impl hf "
                                                     "does not run"),
    # vLLM runs neither packed nor rollback: refused before its environment is even looked at
    ("vllm: --reject", [*VLLM, "--reject", "1"], "--reject sizes the rollback schedule, which --impl vllm does "
                                                 "not run"),
    ("vllm: --documents", [*VLLM, "--documents", "8,8"], "--documents sizes the packed schedule, which --impl "
                                                         "vllm does not run"),
    ("vllm: --leak-limit", [*VLLM, "--leak-limit", "1"], "--leak-limit gates the packed schedule, which --impl "
                                                         "vllm does not run"),
    ("vllm: --draft", [*VLLM, "--draft", "2"], "--draft sizes the engine and speculative schedules, which "
                                               "--impl vllm does not run"),
]


@pytest.mark.parametrize("args,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_boundary_that_cannot_form_is_refused_with_the_numbers(tmp_path, monkeypatch, args, message):
    if "--impl" in args and args[args.index("--impl") + 1] in ("hf", "vllm"):
        pytest.importorskip("transformers")
    shutil.copytree(STANDIN, tmp_path / "mine", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "m").mkdir()
    (tmp_path / "one.json").write_text(json.dumps([0, 5, 6, 7]))
    (tmp_path / "short.json").write_text(json.dumps([1, 5, 6]))
    monkeypatch.chdir(tmp_path)
    before = {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    r = invoke(["compare", *args, "--json"], allowed=(2,))
    assert r.stderr.strip().splitlines()[-1] == f"smearcli: error: {message}"
    assert r.stdout == ""
    assert {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")} == before  # nothing written
    assert not leftovers(tmp_path)


def test_a_boundary_that_forms_still_runs(tmp_path, monkeypatch):
    """The limits are exact: one whole draft, two documents, a draft as long as what is verified."""
    monkeypatch.chdir(tmp_path)
    for args in ([*F, "--schedules", "rollback", "--draft", "4", "--reject", "3"],
                 ["--depth", "1", "--schedules", "packed", "--documents", "1,15"],
                 [*F, "--schedules", "speculative", "--draft", "4"],
                 ["--depth", "1", "--seq-len", "3", "--gen-len", "2", "--schedules", "rollback", "--draft", "2",
                  "--reject", "1"]):
        r = invoke(["compare", *args, "--json"], allowed=(0,))
        doc = json.loads(r.stdout)
        assert doc.get("runs") or doc.get("documents"), args
