"""`--impl nanochat`: the audit of a user's own nanochat code.

The code under audit is a stand-in package written for these tests with upstream's layout and API
(tests/standin/old/nanochat/: gpt.py with GPT and GPTConfig, engine.py with KVCache), with the
old smear. The fixed variant is made from it by rewriting the cache branch of its smear (and
nothing else), as are the broken variants (wrong API, lost engine state, missing third-party
imports), in temporary directories."""

import difflib
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from smearcli.gpt import weights
from smearcli.engines.nanochat import adapter, audit, sandbox
from smearcli.util.errors import UserError
from smearcli.util.defaults import NOISE_MARGIN
from smearcli.util.formatters import compact
from smearcli.measure.schedules import ScheduleOptions

STANDIN = Path(__file__).resolve().parents[1] / "standin"
OLD = STANDIN / "old"
# the cache branch of the stand-in's smear, as written (the bug) and as issue #756 fixes it
OLD_BRANCH = """            if T > 1:  # taken to start the sequence, even after earlier chunks: the bug
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
            elif prev is not None:
                x = x + gate * prev
"""
FIXED_BRANCH = """            if prev is not None:  # the first token's predecessor is the cached last token
                x = x + gate * torch.cat([prev, x[:, :-1]], dim=1)
            elif T > 1:  # the true start of the sequence
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
"""
OPTS = ScheduleOptions(chunks=3, gen_len=8, draft=3)
from conftest import AUDIT_SEQ as SEQ  # the `ours` / `tokens` fixtures' length


def nanochat_modules():
    return sorted(k for k in sys.modules if k == "nanochat" or k.startswith("nanochat."))


def snapshot(root: Path) -> dict:
    """Every path under root with its size and mtime: what an import must not change."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run_audit(path, ours, tokens, reference=True, schedules=("prefill", "decode", "chunked", "engine", "speculative")):
    code = sandbox.import_nanochat(path, dtype=torch.float32)
    theirs = adapter.nanochat_from_model(code, ours)
    return audit.audit(theirs, tokens, list(schedules), OPTS, reference=ours if reference else None)


@pytest.fixture(scope="module")
def old_audit(ours, tokens):
    return run_audit(OLD, ours, tokens)


@pytest.fixture(scope="module")
def FIXED(tmp_path_factory) -> Path:
    """The stand-in with the fixed smear: the old one with its smear's cache branch rewritten."""
    root = tmp_path_factory.mktemp("fixed") / "standin"
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("__pycache__"))
    gpt = root / "nanochat" / "gpt.py"
    text = gpt.read_text()
    assert text.count(OLD_BRANCH) == 1
    gpt.write_text(text.replace(OLD_BRANCH, FIXED_BRANCH))
    return root


@pytest.fixture(scope="module")
def fixed_audit(ours, tokens, FIXED):
    return run_audit(FIXED, ours, tokens)


def copy_standin(tmp_path: Path, variant: Path = OLD) -> Path:
    dst = tmp_path / "checkout"
    shutil.copytree(variant, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


# -- the two stand-ins, told apart -------------------------------------------------------------------

def test_old_standin_is_reported_with_the_chunk_boundary_bug(old_audit):
    c = old_audit.comparison
    failed = {m.schedule for m in c.metrics if not m.passed}
    assert failed == {"chunked", "speculative"}  # the schedules with multi-token steps on a filled cache
    assert old_audit.failed
    assert old_audit.verdict.startswith("BUG: your code has the chunk-boundary smear bug: error ")
    assert old_audit.word == c.word == "bug" and "keeps its size in float64" in c.verdict
    assert [f.kind for f in old_audit.findings] == ["chunk-smear"]
    assert old_audit.likeness.behaves_like == "old"
    # the number in the verdict, recomputed from the raw logits of the user's runs
    run = next(r for r in c.runs if r.schedule == "chunked")
    spec = next(r for r in c.runs if r.schedule == "speculative")
    at_starts = max(float((r.logits - c.reference.logits).abs().amax(-1)[0, r.chunk_starts].max())
                    for r in (run, spec))
    assert f"error {compact(at_starts)} at chunk starts" in old_audit.verdict
    assert f"{compact(at_starts / c.noise.per_layer[-1])} x noise floor" in old_audit.verdict
    assert at_starts > 1e4 * c.noise.per_layer[-1]


def test_fixed_standin_is_reported_consistent(fixed_audit):
    c = fixed_audit.comparison
    assert not fixed_audit.failed and not fixed_audit.findings
    assert fixed_audit.verdict.startswith("OK: your code is consistent across all schedules (prefill, decode, "
                                          "chunked, engine, speculative)")
    assert fixed_audit.word == c.word == "ok" and "; it would see a" in fixed_audit.verdict
    assert fixed_audit.likeness.behaves_like == "fixed"
    for m in c.metrics:
        assert m.max_abs_logits <= NOISE_MARGIN * c.noise.per_layer[-1]


@torch.inference_mode()
def test_old_standin_error_is_the_dropped_smear_term(old_audit, ours, tokens):
    """The user's error at block 0's input, computed from the weights without any smearcli code:
    (resid_lambdas[0] + x0_lambdas[0]) * gate_t * x_{t-1} at chunk starts, zero elsewhere."""
    c = old_audit.comparison
    run = next(r for r in c.runs if r.schedule == "chunked")
    sd = ours.state_dict()
    x = F.rms_norm(sd["transformer.wte.weight"][tokens[0]], (ours.config.n_embd,))  # (T, C)
    gate = sd["smear_lambda"] * torch.sigmoid(x[:, :24] @ sd["smear_gate.weight"].T)  # (T, 1)
    scale = sd["resid_lambdas"][0] + sd["x0_lambdas"][0]
    diff = (c.reference.hiddens[0] - run.hiddens[0])[0]  # (T, C): full minus chunked
    starts = run.chunk_starts
    assert starts == [14, 27]  # 40 tokens in 3 chunks: 14, 13, 13
    for t in starts:
        torch.testing.assert_close(diff[t], scale * gate[t] * x[t - 1], rtol=0, atol=1e-5)
    others = [t for t in range(SEQ) if t not in starts]
    assert float(diff[others].abs().max()) <= 1e-5
    # smearcli's own analytic check says the same
    checks = c.analytic["chunked"]
    assert [a.position for a in checks] == starts
    assert all(a.residual <= 1e-5 and a.predicted > 1e-2 for a in checks)


def test_their_parameters_are_left_as_their_loader_leaves_them(ours):
    """requires_grad stays on, as upstream's checkpoint_manager leaves it: torch picks the matmul
    kernel of a sliced input from it, so turning it off moved upstream's smear gate on a 4-token
    draft by 1e-6 (against upstream's own code, on speculative)."""
    theirs = adapter.nanochat_from_model(sandbox.import_nanochat(OLD, dtype=torch.float32), ours)
    assert all(p.requires_grad for p in theirs.net.parameters())
    assert not theirs.net.training


def test_user_code_matches_ours_under_the_same_logic(old_audit, fixed_audit):
    """Same weights, same tokens: the stand-ins' per-position errors are ours under old / fixed."""
    for a, logic in ((old_audit, "old"), (fixed_audit, "fixed")):
        noise = max(a.comparison.noise.per_layer[-1], a.ours.noise.per_layer[-1])
        for m in a.comparison.metrics:
            theirs = m.abs_err[-1]
            mine = a.ours.get(m.schedule, logic).abs_err[-1]
            assert float((theirs - mine).abs().max()) <= NOISE_MARGIN * noise, (logic, m.schedule)
        assert a.likeness.full_forward_diff <= NOISE_MARGIN * noise


def test_standin_variants_differ_only_in_the_smear_branch(FIXED):
    for name in ("__init__.py", "engine.py"):
        assert (OLD / "nanochat" / name).read_bytes() == (FIXED / "nanochat" / name).read_bytes()
    old = (OLD / "nanochat" / "gpt.py").read_text().splitlines()
    fixed = (FIXED / "nanochat" / "gpt.py").read_text().splitlines()
    begin = next(i for i, line in enumerate(old) if "# smear:" in line)
    end = next(i for i, line in enumerate(old) if "# end of smear" in line)
    changed = [op for op in difflib.SequenceMatcher(a=old, b=fixed).get_opcodes() if op[0] != "equal"]
    assert changed and all(begin < i1 and i2 <= end for _, i1, i2, _, _ in changed)


# -- isolation ------------------------------------------------------------------------------------

def test_import_leaves_no_trace(tmp_path, ours, tokens, FIXED):
    root = copy_standin(tmp_path, FIXED)
    before = snapshot(root)
    path, env = list(sys.path), os.environ.get("NANOCHAT_DTYPE")
    bytecode = sys.dont_write_bytecode
    sentinel = types.ModuleType("nanochat")  # an unrelated `nanochat` already imported elsewhere
    sys.modules["nanochat"] = sentinel
    try:
        code = sandbox.import_nanochat(root, dtype=torch.float32)
        assert nanochat_modules() == ["nanochat"] and sys.modules["nanochat"] is sentinel
    finally:
        del sys.modules["nanochat"]
    assert nanochat_modules() == []
    assert sys.path == path and os.environ.get("NANOCHAT_DTYPE") == env
    assert sys.dont_write_bytecode == bytecode
    assert snapshot(root) == before  # nothing written: no __pycache__, no touched file
    # the imported objects still work once the modules are gone from sys.modules
    theirs = adapter.nanochat_from_model(code, ours)
    a = audit.audit(theirs, tokens, ["chunked"], OPTS)
    assert not a.failed
    assert nanochat_modules() == [] and snapshot(root) == before


def test_not_a_checkout(tmp_path):
    with pytest.raises(UserError, match="directory not found"):
        sandbox.import_nanochat(tmp_path / "nope")
    (tmp_path / "nanochat").mkdir()
    with pytest.raises(UserError, match=r"not a nanochat checkout \(no nanochat/gpt.py and no nanochat/engine.py"):
        sandbox.import_nanochat(tmp_path)


def test_the_package_directory_itself_is_accepted():
    assert sandbox.import_nanochat(OLD / "nanochat").root == OLD


@pytest.mark.parametrize("file, old, new, missing", [
    ("engine.py", "class KVCache:", "class Cache:", "nanochat.engine.KVCache"),
    ("engine.py", "def prefill(self, other):", "def copy_from(self, other):", "KVCache.prefill()"),
    ("engine.py", "head_dim, num_layers, device", "head_dim, n_layers, device", "KVCache(num_layers=...)"),
    ("gpt.py", "def init_weights(self):", "def reset_parameters(self):", "GPT.init_weights()"),
    ("gpt.py", "class GPTConfig:", "class ModelConfig:", "nanochat.gpt.GPTConfig"),
    ("gpt.py", "def forward(self, idx, targets=None, kv_cache=None):",
     "def forward(self, idx, targets=None, cache=None):\n        kv_cache = cache", "GPT.forward(..., kv_cache=...)"),
])
def test_api_differences_are_named(tmp_path, file, old, new, missing):
    root = copy_standin(tmp_path)
    edit(root / "nanochat" / file, old, new)
    with pytest.raises(UserError, match="nanochat API differs") as e:
        sandbox.import_nanochat(root)
    assert missing in str(e.value)
    assert nanochat_modules() == []


def test_broken_user_code_is_a_user_error(tmp_path):
    root = copy_standin(tmp_path)
    edit(root / "nanochat" / "gpt.py", "import os\n", "import os\nraise RuntimeError('half-finished edit')\n")
    with pytest.raises(UserError, match="importing nanochat failed: RuntimeError: half-finished edit"):
        sandbox.import_nanochat(root)
    assert nanochat_modules() == []


def test_missing_third_party_modules_are_stood_in_and_named(tmp_path, ours, tokens):
    root = copy_standin(tmp_path)
    edit(root / "nanochat" / "engine.py", "import torch\n",
         "import torch\nimport smearcli_test_absent_a\nfrom smearcli_test_absent_b import Tokenizer\n")
    code = sandbox.import_nanochat(root)
    assert code.stand_ins == ["smearcli_test_absent_a", "smearcli_test_absent_b"]
    assert not any(k.startswith("smearcli_test_absent") for k in sys.modules)
    a = audit.audit(adapter.nanochat_from_model(code, ours), tokens, ["chunked"], OPTS)
    assert a.failed  # the old smear, found as before
    # using a stood-in name fails with a message that names the module
    with pytest.raises(UserError, match="'smearcli_test_absent_b' is not installed"):
        code.modules["nanochat.engine"].Tokenizer()


def test_flash_attention_kernel_is_never_fetched(tmp_path, ours, tokens):
    """Like upstream, the code tries `kernels` for FA3 at import: the audit blocks that import
    (here a fake `kernels` that would fail loudly) and forces the SDPA path."""
    root = copy_standin(tmp_path)
    (root / "kernels.py").write_text("raise RuntimeError('the audit must not import kernels')\n")
    (root / "nanochat" / "flash_attention.py").write_text(
        "try:\n    import kernels\n    HAS_FA3 = True\nexcept ImportError:\n    HAS_FA3 = False\n"
        "_override_impl = None\nUSE_FA3 = True\n")
    edit(root / "nanochat" / "gpt.py", "import torch\n", "import torch\nfrom nanochat import flash_attention\n")
    before = snapshot(root)
    code = sandbox.import_nanochat(root)
    fa = code.modules["nanochat.flash_attention"]
    assert fa.HAS_FA3 is False and fa.USE_FA3 is False and fa._override_impl == "sdpa"
    assert code.attention.startswith("sdpa")
    assert "kernels" not in sys.modules and snapshot(root) == before


def test_compute_dtype_mismatch_is_named(tmp_path):
    root = copy_standin(tmp_path)
    edit(root / "nanochat" / "gpt.py", 'COMPUTE_DTYPE = getattr(torch, os.environ.get("NANOCHAT_DTYPE", "float32"))',
         "COMPUTE_DTYPE = torch.bfloat16")
    with pytest.raises(UserError, match="computes in bfloat16 .*compute in bfloat16 instead"):
        sandbox.import_nanochat(root, dtype=torch.float32)
    # and the dtype asked for reaches code that honours NANOCHAT_DTYPE, as upstream does
    assert sandbox.import_nanochat(OLD, dtype=torch.bfloat16).compute_dtype == torch.bfloat16


# -- other kinds of bug ---------------------------------------------------------------------------

def test_engine_expansion_that_drops_the_smear_state(tmp_path, ours, tokens, FIXED):
    root = copy_standin(tmp_path, FIXED)
    edit(root / "nanochat" / "engine.py",
         "            self.prev_embedding = other.prev_embedding.expand(self.batch_size, -1, -1).clone()",
         "            pass  # forgets the smear state")
    a = run_audit(root, ours, tokens, schedules=("decode", "chunked", "engine"))
    assert [f.kind for f in a.findings] == ["engine-expansion"]
    P = SEQ - OPTS.gen_len
    assert f"at position {P} (the first token after the copy)" in a.verdict
    engine = a.comparison.get("engine", adapter.USER_LOGIC)
    assert engine.first_departure == (0, P)
    assert a.likeness.behaves_like == "fixed"  # chunked is right; engine departs from both logics
    assert "departs from both on engine" in a.likeness.summary


# -- checkpoints and the CLI ----------------------------------------------------------------------

def test_checkpoint_is_loaded_into_the_users_code(tmp_path, ours, tokens):
    weights.save_checkpoint(ours, tmp_path / "ckpt", step=7)
    code = sandbox.import_nanochat(OLD)
    theirs, step, meta = adapter.nanochat_from_checkpoint(code, tmp_path / "ckpt", device="cpu")
    assert step == 7 and meta["model_config"] == ours.config.to_dict()
    same = adapter.nanochat_from_model(code, ours)
    with torch.inference_mode():
        assert torch.equal(theirs(tokens), same(tokens))


runner = CliRunner()
SMALL = ["--depth", "2", "--seq-len", "40", "--chunks", "3", "--gen-len", "8", "--draft", "3"]


def test_cli_json_check_and_errors(FIXED):
    from smearcli.cli.app import app

    r = runner.invoke(app, ["compare", "--impl", "nanochat", "--nanochat-path", str(OLD), "--json",
                            "--schedules", "chunked", *SMALL])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == audit.SCHEMA and doc["impl"] == "nanochat" and doc["passed"] is False
    assert doc["code"]["path"] == str(OLD) and doc["code"]["first_capture"] == "block0_in"
    run = doc["nanochat"]["runs"][0]
    assert run["logic"] == "yours" and run["first_departure"] == {"layer": "block0_in", "position": 14}
    assert doc["nanochat"]["layers"][0] == "block0_in"
    assert doc["verdict"].startswith("BUG: your code has the chunk-boundary smear bug")

    r = runner.invoke(app, ["compare", "--impl", "both", "--nanochat-path", str(FIXED), "--check",
                            "--schedules", "chunked", *SMALL])
    assert r.exit_code == 0, r.output
    assert "behaves like the fixed logic" in r.stdout and "consistent across all schedules" in r.stdout
    r = runner.invoke(app, ["compare", "--impl", "nanochat", "--nanochat-path", str(OLD), "--check",
                            "--schedules", "chunked", *SMALL])
    assert r.exit_code == 1 and "chunk-boundary smear bug" in r.output

    r = runner.invoke(app, ["compare", "--impl", "nanochat", *SMALL])
    assert r.exit_code == 2 and "--impl nanochat needs --nanochat-path" in r.output
    assert nanochat_modules() == []


@pytest.mark.parametrize("impl", ["ours", "nanochat", "both"])
def test_our_float64_copy_is_made_while_drawing_only_where_our_model_is_compared(impl, FIXED, monkeypatch):
    """A random model's float64 copy is converted during its build for the floor of our runs: with
    --impl nanochat the user's model runs in its place, and ours gets none (it would hold 1.1 GB at
    d12 that nothing reads)."""
    from smearcli.cli import build
    from smearcli.cli.app import app

    asked = []
    real = build.random_model
    monkeypatch.setattr(build, "random_model", lambda *a, **k: asked.append(k.get("float64")) or real(*a, **k))
    path = [] if impl == "ours" else ["--nanochat-path", str(FIXED)]
    r = runner.invoke(app, ["compare", "--impl", impl, *path, "--schedules", "chunked", *SMALL])
    assert r.exit_code == 0, r.output
    assert asked == [impl != "nanochat"]


# -- one judge: the audit says what compare says -----------------------------------------------------

def test_a_rounding_only_difference_is_no_finding(old_audit, fixed_audit):
    """The old stand-in's departures, had their float64 reruns vanished: float32 rounding, which
    counts as ok. The audit then finds nothing and says OK, as compare does (not "your code
    diverges")."""
    import dataclasses

    from smearcli.judging import evidence
    from smearcli.judging.verdicts import OK, ROUNDING

    c = old_audit.comparison
    gone = {k: dataclasses.replace(v, lifted=0.0, status=ROUNDING, why="float32 rounding, gone in float64")
            for k, v in c.confirmations.items()}
    assert set(gone) == {("chunked", "yours"), ("speculative", "yours")}
    rounded = dataclasses.replace(c, confirmations=gone, power=fixed_audit.comparison.power)
    a = audit.Audit(old_audit.model, rounded)
    assert rounded.word is OK and a.word is OK and not a.failed and a.findings == []
    assert a.verdict.startswith("OK: your code is consistent across all schedules") and "diverges" not in a.verdict
    assert "chunked, speculative left the tolerance in float32 only: float32 rounding, gone in float64" in a.verdict
    assert rounded.verdict.startswith("OK: ") and [rounded.status(m) for m in rounded.metrics].count(ROUNDING) == 2
    assert isinstance(fixed_audit.comparison.power, evidence.Power)


def test_a_powerless_check_is_inconclusive(fixed_audit):
    """The fixed stand-in's agreement, had zeroing its cache moved the logits only 10x the
    threshold (so only a 10% error in it could show): INCONCLUSIVE, as compare says, and --check fails."""
    import dataclasses

    from smearcli.judging import evidence
    from smearcli.judging.verdicts import INCONCLUSIVE

    c = fixed_audit.comparison
    weak = evidence.Power(c.power.split, c.power.threshold, {"kv": 10 * c.power.threshold})
    powerless = dataclasses.replace(c, power=weak)
    a = audit.Audit(fixed_audit.model, powerless)
    assert powerless.word is INCONCLUSIVE and a.word is INCONCLUSIVE and a.failed and a.findings == []
    assert a.verdict.startswith("INCONCLUSIVE: your code is consistent across all schedules")
    assert a.verdict.endswith("but the check could not see a 10% error in the kv state (OK needs 1%)")
    assert powerless.verdict.endswith("but the check could not see a 10% error in the kv state (OK needs 1%)")


# -- plot -----------------------------------------------------------------------------------------

def test_merged_comparison_draws_ours_and_yours(old_audit):
    from smearcli.render import figures

    c = audit.merged(old_audit)
    assert [m.logic for m in c.metrics if m.schedule == "chunked"] == ["old", "fixed", "yours"]
    assert c.layers[0] == "emb | block0_in" and len(c.layers) == len(old_audit.comparison.layers)
    fig = figures.figure(c, "chunked", kind="error")
    d = fig.smearcli_data
    assert d.logics == ["old", "fixed", "yours"]
    ours = old_audit.comparison.get("chunked", adapter.USER_LOGIC).abs_err[-1].double().numpy()
    assert (d.abs_logits["yours"] == ours).all()


def test_cli_plot_with_impl_nanochat(tmp_path):
    from smearcli.cli.app import app

    out = tmp_path / "fig.svg"
    r = runner.invoke(app, ["plot", "--impl", "nanochat", "--nanochat-path", str(OLD), "-o", str(out),
                            "--kind", "error", *SMALL])
    assert r.exit_code == 0, r.output
    assert "chunk-boundary smear bug" in r.stdout
    svg = out.read_text()
    assert "abs_logits:yours" in svg and "abs_logits:old" not in svg
