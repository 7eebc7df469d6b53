import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


LLAMACPP_PYTHON = os.environ.get("SMEARCLI_LLAMACPP_PYTHON", "")
# the marks of a test that runs llama.cpp's real environment: skipped, with how to make one, without it
NEEDS_LLAMACPP = [pytest.mark.llamacpp, pytest.mark.skipif(
    not LLAMACPP_PYTHON or not Path(LLAMACPP_PYTHON).is_file(),
    reason="needs llama.cpp's environment: scripts/make_env.sh llamacpp DIR, then "
           "SMEARCLI_LLAMACPP_PYTHON=DIR/bin/python")]


def standin_python(directory: Path, script: Path) -> Path:
    """An executable standing in for an engine's Python (vLLM's, llama.cpp's): it runs the stand-in
    `script` with the worker's arguments, as that Python would run the worker."""
    import stat

    p = Path(directory) / "python"
    p.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{script}" "$@"\n')
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p
# The CLI's tables take their width from COLUMNS when piped (120 without it). pytest-xdist's workers
# start with COLUMNS=80 and LINES=24 in their environment, and a developer's shell may export its
# own: every test starts without them, as a plain CI run does, and a test about width sets them.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# Written by upstream nanochat's own code and kept in the repository (see its README), so a
# clone passes its tests with nothing beside it.
FIXTURE = Path(os.environ.get("SMEARCLI_FIXTURE", ROOT / "tests" / "fixtures" / "nanochat-d4-bytes"))


def scan_into(names, check, out, resume=False, **kw):
    """The census loop (`isolate.run`) over `names` with `check` as every architecture's check,
    into the record file `out` (kept and continued with `resume`): the records of this run."""
    from smearcli.census import isolate, records

    with records.Sink(out, resume) as sink:
        return isolate.run(names, check, sink, **kw)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not (FIXTURE / "reference.pt").is_file():
        pytest.fail(f"upstream fixture not found at {FIXTURE} (set SMEARCLI_FIXTURE)")
    return FIXTURE


@pytest.fixture(scope="session")
def reference(fixture_dir):
    return torch.load(fixture_dir / "reference.pt", weights_only=True)


@pytest.fixture(scope="session")
def upstream_model(fixture_dir):
    from smearcli.gpt.weights import load_checkpoint
    return load_checkpoint(fixture_dir).model


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` of the docs into a temporary directory, once per test run (shared
    by tests/docs/test_docs.py and tests/docs/test_browser.py); fails on any warning."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MPLBACKEND": "Agg"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    log = p.stdout + p.stderr
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    return out


@pytest.fixture(autouse=True)
def json_matches_its_schema(monkeypatch):
    """Every JSON document a test makes smearcli write, and every scan record it writes to a
    record file, is checked against its schema file (docs/schemas/, `schema_check`); a mismatch
    fails the test that wrote it. Documents are caught where they are all written,
    `smearcli.util.jsonsafe.dumps` (`--json`, bench's `--output`), records where the scan appends them
    to its file (`census.records.Sink.write`). Yields the list of problems found so far (a test of
    this fixture empties it)."""
    import schema_check
    from smearcli.util import jsonsafe
    from smearcli.census import records

    found: list[str] = []
    dumps, write = jsonsafe.dumps, records.Sink.write

    def checked_dumps(obj, **kwargs):
        text = dumps(obj, **kwargs)
        found.extend(schema_check.document_problems(json.loads(text)))
        return text

    def checked_write(sink, rec):
        write(sink, rec)
        found.extend(schema_check.record_problems(json.loads(dumps(rec.to_json(), default=str))))

    monkeypatch.setattr(jsonsafe, "dumps", checked_dumps)
    monkeypatch.setattr(records.Sink, "write", checked_write)
    yield found
    if found:
        pytest.fail("JSON that does not match its schema file under docs/schemas/ (a new field goes into "
                    "the schema file and docs/json-schema.md):\n" + "\n".join(found[:20]), pytrace=False)


@pytest.fixture(scope="session")
def census_record():
    """`census_record(name)`: the real census check of one architecture (`engines.transformers.check.check`, in
    one thread as a scan's child runs it), made once per test session and shared by the files that
    read it; each call gets its own copy. `order=0` checks only the defaults' layer order of a
    hybrid (`derive`'s first variant): its record, without the other orders'."""
    import copy

    made: dict = {}

    def get(name: str, order=None):
        if (name, order) not in made:
            pytest.importorskip("transformers")
            from smearcli.engines.transformers import check
            from smearcli.tiny import derive

            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                config = None if order is None else derive.derive(name).variants[order].config
                made[name, order] = check.check(name, config=config)
            finally:
                torch.set_num_threads(before)
        return copy.deepcopy(made[name, order])
    return get


# The audit's and the fix's tests: a small random model and the tokens they run it on.
AUDIT_SEQ = 40


@pytest.fixture(scope="session")
def ours():
    from smearcli.gpt import weights
    return weights.random_model(weights.random_config(depth=2), seed=0).model


@pytest.fixture(scope="session")
def tokens(ours):
    from smearcli.measure.inputs import random_tokens
    return random_tokens(ours.config, AUDIT_SEQ, batch=1, seed=1)


# The slow families, each a marker, so the fast loop can leave them out (CONTRIBUTING.md):
#   python -m pytest -m "not (notebooks or docs or browser or slow)"
FAMILIES = {"test_docs.py": "docs", "test_browser.py": "browser", "test_errors_table.py": "docs"}
# With pytest-xdist (`-n 2`, `--dist loadgroup` from pyproject.toml) each file runs whole on one
# worker, in order (a notebook's cells, a module's fixtures made once); the files that share the
# built site (`built_site`, session-scoped) run on the same one, so the site is built once.
SAME_WORKER = {"test_docs.py": "the built site", "test_browser.py": "the built site"}

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if WORKERS > 1:  # the workers share the cores: torch's threads per worker, so none waits on another's
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // WORKERS))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.name.endswith(".ipynb"):
            item.add_marker(pytest.mark.notebooks)
        elif path.name in FAMILIES:
            item.add_marker(getattr(pytest.mark, FAMILIES[path.name]))
        group = SAME_WORKER.get(path.name) or path.relative_to(config.rootpath).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
