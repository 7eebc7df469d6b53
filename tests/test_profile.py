"""smearcli.profile: wall time per section (each second counted once, in the innermost section),
forwards timed by hooks on the model, and `compare --profile` / SMEARCLI_PROFILE=1."""

import io
import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli import profile
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
    lines = stderr[stderr.index("profile: "):].splitlines()
    return [ln.split()[0] for ln in lines[2:] if ln.strip() and not ln.strip().startswith("outside")]


def test_compare_profile_prints_the_table_to_stderr(monkeypatch):
    monkeypatch.delenv(profile.ENV, raising=False)
    plain = CliRunner().invoke(app, SMALL + ["--json"])
    r = CliRunner().invoke(app, SMALL + ["--json", "--profile"])
    assert plain.exit_code == r.exit_code == 0, r.output
    assert "profile: " not in plain.stderr
    assert sections(r.stderr) == ["build", "forwards", "metrics", "rest"]
    assert json.loads(r.stdout)["runs"] == json.loads(plain.stdout)["runs"]  # stdout is the same document


def test_the_environment_variable_profiles_compare(monkeypatch):
    monkeypatch.setenv(profile.ENV, "1")
    r = CliRunner().invoke(app, SMALL)
    assert r.exit_code == 0 and sections(r.stderr) == ["build", "forwards", "metrics", "rest"]
    monkeypatch.setenv(profile.ENV, "0")
    assert "profile: " not in CliRunner().invoke(app, SMALL).stderr
