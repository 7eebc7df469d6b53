"""`census.measured`: one rule for every engine's record of a measured verdict (vLLM's, llama.cpp's):
the headline, its float64 rerun where it departed, and power wherever it was measured."""

import types

import pytest

from smearcli.census import measured
from smearcli.judging import evidence, judge
from smearcli.judging.verdicts import CRASHED, OK, UNCONFIRMED

POWER = evidence.Power(8, 1e-5, {"kv": 0.3})


def metrics(err: float, passed: bool):
    return types.SimpleNamespace(max_abs_logits=err, logits_multiple=err / 1e-6, passed=passed)


def unconfirmed(err: float) -> evidence.Confirmation:
    return evidence.Confirmation(err, "float32", why="not confirmed: this engine has no float64 form")


def test_an_unconfirmed_record_keeps_power_and_says_why_its_headline_is_not_confirmed():
    runs = [measured.Ran("prefill", [16], metrics(1e-7, True)),
            measured.Ran("chunked@3", [3, 3], metrics(0.02, False), unconfirmed(0.02)),
            measured.Ran("decode", [1], metrics(0.5, False), unconfirmed(0.5))]
    j = measured.judged(runs, POWER)
    got = measured.verdict_fields(runs, j, POWER, j.named(UNCONFIRMED))
    assert j.word == UNCONFIRMED and got["worst_schedule"] == "decode" and got["max_abs"] == 0.5
    assert got["confirmation"]["status"] == str(UNCONFIRMED) and got["confirmation"]["original"] == 0.5
    assert got["power"] == POWER.to_json()


def test_a_crash_keeps_power_and_has_no_confirmation():
    runs = [measured.Ran("prefill", [16], metrics(1e-7, True)),
            measured.Ran("prefix", [8, 8], outcome=judge.RAISED, why="mamba_mixer2.py:12: RuntimeError")]
    j = measured.judged(runs, POWER)
    got = measured.verdict_fields(runs, j, POWER)
    assert j.word == CRASHED and got["worst_schedule"] == "prefix" and "RuntimeError" in got["reason"]
    assert "confirmation" not in got and got["power"] == POWER.to_json()


@pytest.mark.parametrize("power", [POWER, evidence.Power(8, 1e-5, why="no state found"), None])
def test_an_ok_headline_has_no_confirmation_and_power_only_where_measured(power):
    runs = [measured.Ran("prefill", [16], metrics(1e-7, True)), measured.Ran("decode", [1], metrics(2e-7, True))]
    j = measured.judged(runs, POWER)
    got = measured.verdict_fields(runs, j, power)
    assert j.word == OK and got["worst_schedule"] == "decode" and "confirmation" not in got
    assert got.get("power") == (POWER.to_json() if power is POWER else None)
