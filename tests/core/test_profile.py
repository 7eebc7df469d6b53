"""smearcli.measure.profile: wall time per section (each second counted once, in the innermost section),
forwards timed by hooks on the model, and `compare --profile` / SMEARCLI_PROFILE=1."""

import io
import json
import re

import pytest
import torch
from typer.testing import CliRunner

from smearcli.measure import profile
from smearcli.cli.app import app


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(profile.time, "perf_counter", c)
    return c


def test_nested_sections_count_each_second_once(clock):
    out = io.StringIO()
    with profile.session(True, out) as prof:
        clock.now += 1  # rest
        with profile.section("metrics"):
            clock.now += 2
            with profile.section(profile.FORWARDS):
                clock.now += 5
            clock.now += 1
        with profile.section("build"):
            clock.now += 3
    assert prof.rows() == [("build", 3.0, 1), ("forwards", 5.0, 1), ("metrics", 3.0, 1), ("rest", 1.0, 0)]
    assert prof.total == 12.0
    text = out.getvalue()
    assert "profile: 12.00 s wall" in text and "outside forwards: 58.3%" in text
    assert [ln.split()[0] for ln in text.splitlines()[2:6]] == ["build", "forwards", "metrics", "rest"]


def test_without_a_session_nothing_is_recorded(monkeypatch):
    monkeypatch.delenv(profile.ENV, raising=False)
    with profile.session(False) as prof:
        assert prof is None and profile.active() is None
        with profile.section("build"):
            pass
        assert profile.watch_forwards(torch.nn.Linear(2, 2)) == []


def test_forward_hooks_time_every_forward_even_one_that_raises(clock):
    class Net(torch.nn.Module):
        def forward(self, x):
            clock.now += 2
            if x is None:
                raise ValueError("boom")
            return x
    net = Net()
    with profile.session(True, io.StringIO()) as prof:
        assert len(profile.watch_forwards(net)) == 2
        assert profile.watch_forwards(net) == []  # hooked once
        for _ in range(3):
            net(torch.ones(1))
        with pytest.raises(ValueError):
            net(None)
        clock.now += 1
    assert prof.seconds[profile.FORWARDS] == 8.0 and prof.calls[profile.FORWARDS] == 4
    assert prof.rows()[-1] == ("rest", 1.0, 0)
    net(torch.ones(1))  # after the session, the hooks do nothing


def test_a_wrapped_module_is_hooked_through_net(clock):
    class Wrapper:
        def __init__(self):
            self.net = torch.nn.Identity()

        def __call__(self, x):
            return self.net(x)
    w = Wrapper()
    with profile.session(True, io.StringIO()) as prof:
        profile.watch_forwards(w)
        w(torch.ones(1))
    assert prof.calls[profile.FORWARDS] == 1


SMALL = ["compare", "--depth", "1", "--seq-len", "16", "--gen-len", "4", "--threads", "1", "--quiet"]


def sections(stderr: str) -> list[str]:
    """The section names of the table `--profile` prints (a name may hold a space)."""
    lines = stderr[stderr.index("profile: "):].splitlines()
    rows = [re.match(r"^  (\S.*?)\s+-?[\d.]+\s+-?[\d.]+%", ln) for ln in lines[2:]]
    return [m.group(1) for m in rows if m]


# what every compare passes through, in the table's order; the verdict decides whether analytic,
# confirmation or power follow the metrics, and the output whether json or table ends it
WHOLE = ["imports", "build", "runs", "forwards", "float64 floor", "metrics"]


def in_table_order(names: list[str]) -> bool:
    known = [n for n in names if n in profile.ORDER]
    return known == sorted(known, key=profile.ORDER.index) and names[-1] == "rest"


def test_compare_profile_prints_the_table_to_stderr(monkeypatch):
    monkeypatch.delenv(profile.ENV, raising=False)
    plain = CliRunner().invoke(app, SMALL + ["--json"])
    r = CliRunner().invoke(app, SMALL + ["--json", "--profile"])
    assert plain.exit_code == r.exit_code == 0, r.output
    assert "profile: " not in plain.stderr
    names = sections(r.stderr)
    assert names[:len(WHOLE)] == WHOLE and in_table_order(names)
    assert "json" in names and "table" not in names and "save" not in names
    assert json.loads(r.stdout)["runs"] == json.loads(plain.stdout)["runs"]  # stdout is the same document


def test_the_environment_variable_profiles_compare(monkeypatch):
    monkeypatch.setenv(profile.ENV, "1")
    r = CliRunner().invoke(app, SMALL)
    names = sections(r.stderr)
    assert r.exit_code == 0 and names[:len(WHOLE)] == WHOLE and in_table_order(names)
    assert "table" in names and "json" not in names
    monkeypatch.setenv(profile.ENV, "0")
    assert "profile: " not in CliRunner().invoke(app, SMALL).stderr


def test_the_table_alone_builds_no_json_document(monkeypatch, tmp_path):
    """The compare/1 document is built for --json and --save only: printing the table does not
    pay for it."""
    from smearcli.measure import jsondoc

    monkeypatch.delenv(profile.ENV, raising=False)
    built = []
    to_json = jsondoc.to_json
    monkeypatch.setattr(jsondoc, "to_json", lambda *a, **k: built.append(1) or to_json(*a, **k))
    assert CliRunner().invoke(app, SMALL).exit_code == 0 and built == []
    assert CliRunner().invoke(app, SMALL + ["--json"]).exit_code == 0 and built == [1]
    assert CliRunner().invoke(app, SMALL + ["--save", str(tmp_path / "r.pt")]).exit_code == 0 and built == [1, 1]


def test_a_named_section_longer_than_the_column_keeps_the_table_aligned(clock):
    out = io.StringIO()
    with profile.session(True, out):
        with profile.section("float64 floor"):
            clock.now += 1
        clock.now += 1
    head, floor, rest = out.getvalue().splitlines()[1:4]
    assert floor.startswith("  float64 floor ") and sections(out.getvalue()) == ["float64 floor", "rest"]
    assert len({head.index("seconds") + len("seconds"), floor.index("1.00") + 4, rest.index("1.00") + 4}) == 1
