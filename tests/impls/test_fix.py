"""The patch for a user's checkout (smearcli.engines.nanochat.fix): found by structure, applied with
`patch -p1` / `git apply` from the checkout root, and judged by the audit, before and after.

The checkouts are copies of the test stand-in (tests/standin/old/nanochat/) in temporary
directories, edited here into the other shapes (upstream's, renamed locals, already fixed, no
smear, unknown). With SMEARCLI_NANOCHAT_PATH set to a real nanochat checkout, one test copies it,
fixes it and audits it."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from smearcli.engines.nanochat import adapter, audit, sandbox
from smearcli.engines.nanochat import fix as nf
from smearcli.measure.schedules import ScheduleOptions

OLD = Path(__file__).resolve().parents[1] / "standin" / "old"
OPTS = ScheduleOptions(chunks=3, gen_len=8, draft=3)
SCHEDULES = ("decode", "chunked", "engine")
GPT = "nanochat/gpt.py"
ENGINE = "nanochat/engine.py"

# the stand-in's smear, rewritten into upstream's shape at 92d63d4 (a gate computed in each branch,
# a plain read of the cache, `elif ... is not None` for decode), with other local names and comments
UPSTREAM_SHAPED = """        # smear: mix a gated copy of the previous token's embedding into each token
        if kv_cache is None:
            g = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[:, 1:, :24]))
            x = torch.cat([x[:, :1], x[:, 1:] + g * x[:, :-1]], dim=1)
        else:
            # the cache holds the last pre-smear embedding of the previous step
            cached = kv_cache.prev_embedding
            kv_cache.prev_embedding = x[:, -1:, :]
            if 1 < T:
                # several tokens
                g = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[:, 1:, :24]))
                x = torch.cat([x[:, :1], x[:, 1:] + g * x[:, :-1]], dim=1)

            elif   cached is not None :   # one token
                g = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[..., :24]))
                x = x + cached * g  # trailing comment
        # end of smear
"""

# other ways to write the fixed cache branch of the stand-in, each correct
FIXED_BRANCHES = {
    "prev first": """            if prev is not None:
                x = x + gate * torch.cat([prev, x[:, :-1]], dim=1)
            elif T > 1:
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
""",
    "first token smeared inside the multi-token branch": """            if T > 1:
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
                if prev is not None:
                    x = torch.cat([x[:, :1] + gate[:, :1] * prev, x[:, 1:]], dim=1)
            elif prev is not None:
                x = x + gate * prev
""",
    "one predecessor tensor": """            if prev is None:
                prev = torch.zeros_like(x[:, :1])
            x = x + gate * torch.cat([prev, x[:, :-1]], dim=1)
""",
}


def smear_region(text: str) -> tuple[int, int]:
    """Character span of the stand-in's smear, from its `# smear:` line to its `# end of smear` line."""
    a = text.index("        # smear:")
    b = text.index("# end of smear\n") + len("# end of smear\n")
    return a, b


def cached_branch_span(text: str) -> tuple[int, int]:
    """Character span of the stand-in's dispatch in the cached branch (after the cache write)."""
    a = text.index("            if T > 1:")
    b = text.index("        # end of smear")
    return a, b


def copy_standin(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def rewrite(path: Path, span_of, new: str) -> None:
    text = path.read_text()
    a, b = span_of(text)
    path.write_text(text[:a] + new + text[b:])


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def patch_tools() -> list:
    return [pytest.param(t, marks=pytest.mark.skipif(shutil.which(t) is None, reason=f"{t} is not installed"))
            for t in ("patch", "git")]


def apply_diff(root: Path, diff: str, tool: str) -> None:
    """Apply `diff` from the checkout root as a maintainer would."""
    (root / "fix.diff").write_bytes(diff.encode("utf-8"))
    if tool == "patch":
        cmd = [["patch", "-p1", "--dry-run", "-i", "fix.diff"], ["patch", "-p1", "-i", "fix.diff"]]
    else:
        cmd = [["git", "apply", "--check", "fix.diff"], ["git", "apply", "fix.diff"]]
    for c in cmd:
        p = subprocess.run(c, cwd=root, capture_output=True, text=True)
        assert p.returncode == 0, f"{' '.join(c)} failed:\n{p.stdout}{p.stderr}\n{diff}"
    (root / "fix.diff").unlink()


def run_audit(root, ours, tokens):
    code = sandbox.import_nanochat(root, dtype=torch.float32)
    return audit.audit(adapter.nanochat_from_model(code, ours), tokens, list(SCHEDULES), OPTS, reference=ours)


def check_loop(root: Path, ours, tokens, tool: str, shape: str) -> nf.FixResult:
    """Audit (bug), fix (diff applied with `tool`), audit (no bug), fix again (nothing to do)."""
    before = run_audit(root, ours, tokens)
    assert before.failed and [f.kind for f in before.findings] == ["chunk-smear"]
    original = (root / GPT).read_text()
    r = nf.apply_fix(root)
    assert r.status == nf.FIXABLE and r.shape == shape and r.files == (GPT,), r.message
    assert "chunk-boundary smear bug" in r.message
    assert r.diff.startswith(f"--- a/{GPT}\n+++ b/{GPT}\n")
    assert (root / GPT).read_text() == original  # write=False writes nothing
    apply_diff(root, r.diff, tool)
    assert (root / GPT).read_text() == r.fixed[GPT]
    after = run_audit(root, ours, tokens)
    assert not after.failed and not after.findings, after.verdict
    assert after.likeness.behaves_like == "fixed"
    again = nf.apply_fix(root)
    assert again.status == nf.ALREADY_FIXED and again.diff == "" and "already fixed" in again.message
    return r


# -- the loop: audit, fix, apply, audit, fix again ------------------------------------------------

@pytest.mark.parametrize("tool", patch_tools())
def test_standin_is_fixed_by_the_diff(tmp_path, ours, tokens, tool):
    root = copy_standin(tmp_path)
    r = check_loop(root, ours, tokens, tool, nf.SHAPE_GATE_BEFORE)
    # the diff touches the cached branch's dispatch and nothing else
    old = (OLD / "nanochat" / "gpt.py").read_text()
    new = r.fixed[GPT]
    a, b = cached_branch_span(old)
    assert new[:a] == old[:a] and new.endswith(old[b:])
    assert (root / ENGINE).read_bytes() == (OLD / "nanochat" / "engine.py").read_bytes()


@pytest.mark.parametrize("tool", patch_tools())
def test_upstream_shape_with_other_names_is_fixed(tmp_path, ours, tokens, tool):
    root = copy_standin(tmp_path)
    rewrite(root / GPT, smear_region, UPSTREAM_SHAPED)
    r = check_loop(root, ours, tokens, tool, nf.SHAPE_UPSTREAM)
    assert "`cached`" in r.message
    assert "x = x + torch.cat([cached, x[:, :-1]], dim=1) * g  # trailing comment" in r.fixed[GPT]


def test_crlf_file_keeps_its_line_endings(tmp_path, ours, tokens):
    root = copy_standin(tmp_path)
    gpt = root / GPT
    gpt.write_bytes(gpt.read_bytes().replace(b"\n", b"\r\n"))
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.FIXABLE
    raw = gpt.read_bytes()
    assert raw.count(b"\n") == raw.count(b"\r\n")
    assert not run_audit(root, ours, tokens).failed


# -- files as Python reads them: odd characters, line endings, a byte order mark ---------------

# characters str.splitlines() ends a line at, though Python's tokenizer (and so ast's line numbers)
# does not; a form feed is also legal between statements (PEP 8 uses it to separate sections)
NOT_LINE_BREAKS = ["\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def sprinkle(text: str, c: str) -> str:
    """`text` with `c` in a comment above the smear and, for a form feed, on a line of its own."""
    out = text.replace("        # smear: mix", f"        # {c}smear:{c}{c} mix", 1)
    out = out.replace("\nclass GPT(", f"\n#{c}\nclass GPT(", 1)
    if c == "\x0c":
        out = out.replace("\nclass GPT(", "\n\x0c\nclass GPT(", 1)
    assert out.count(c) >= 4, "the stand-in changed: put the characters elsewhere"
    return out


def fixed_standin(tmp_path: Path) -> tuple[str, str]:
    """The stand-in's gpt.py and its fix (checked against the audit by the loop tests above)."""
    root = copy_standin(tmp_path / "plain")
    r = nf.apply_fix(root)
    assert r.status == nf.FIXABLE
    return (root / GPT).read_bytes().decode(), r.fixed[GPT]


def as_bytes(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # read_text() would turn a lone CR into LF


@pytest.mark.parametrize("tool", [*patch_tools(), "write"])
@pytest.mark.parametrize("c", NOT_LINE_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_characters_splitlines_breaks_at_do_not_move_the_patch(tmp_path, c, tool):
    plain, plain_fixed = fixed_standin(tmp_path)
    root = copy_standin(tmp_path)
    (root / GPT).write_bytes(sprinkle(plain, c).encode())
    r = nf.apply_fix(root, write=tool == "write")
    assert r.status == nf.FIXABLE, r.message
    assert r.fixed[GPT] == sprinkle(plain_fixed, c)  # the same rewrite, the characters where they were
    if tool != "write":
        apply_diff(root, r.diff, tool)
    assert as_bytes(root / GPT) == r.fixed[GPT]


def test_a_form_feed_file_fixed_passes_the_audit(tmp_path, ours, tokens):
    root = copy_standin(tmp_path)
    (root / GPT).write_bytes(sprinkle(as_bytes(root / GPT), "\x0c").encode())
    assert nf.apply_fix(root, write=True).status == nf.FIXABLE
    after = run_audit(root, ours, tokens)
    assert not after.failed and after.likeness.behaves_like == "fixed", after.verdict


@pytest.mark.parametrize("tool", [*patch_tools(), "write"])
@pytest.mark.parametrize("ending", ["\r\n", "\r"], ids=["CRLF", "CR"])
def test_line_endings_are_kept(tmp_path, ending, tool):
    plain, plain_fixed = fixed_standin(tmp_path)
    root = copy_standin(tmp_path)
    (root / GPT).write_bytes(plain.replace("\n", ending).encode())
    r = nf.apply_fix(root, write=tool == "write")
    assert r.status == nf.FIXABLE, r.message
    assert r.fixed[GPT] == plain_fixed.replace("\n", ending)  # no LF mixed in
    if tool != "write":
        apply_diff(root, r.diff, tool)
    assert as_bytes(root / GPT) == r.fixed[GPT]
    assert (ending == "\r") == any("CR alone" in n for n in r.notes)


@pytest.mark.parametrize("tool", [*patch_tools(), "write"])
def test_a_byte_order_mark_is_accepted_and_kept(tmp_path, tool):
    plain, plain_fixed = fixed_standin(tmp_path)
    root = copy_standin(tmp_path)
    (root / GPT).write_bytes(b"\xef\xbb\xbf" + plain.encode())
    compile((root / GPT).read_bytes(), "gpt.py", "exec")  # Python accepts the file as it is
    r = nf.apply_fix(root, write=tool == "write")
    assert r.status == nf.FIXABLE, r.message
    if tool != "write":
        apply_diff(root, r.diff, tool)
    assert (root / GPT).read_bytes() == b"\xef\xbb\xbf" + plain_fixed.encode()


def test_a_symlinked_gpt_py_is_never_replaced_by_a_file(tmp_path):
    root = copy_standin(tmp_path)
    real = tmp_path / "elsewhere" / "gpt.py"
    real.parent.mkdir()
    (root / GPT).rename(real)
    (root / GPT).symlink_to(real)
    original = real.read_bytes()
    assert nf.apply_fix(root).status == nf.FIXABLE  # read through the link: the diff is printed
    with pytest.raises(nf.FixError, match="symbolic link.*nothing written"):
        nf.apply_fix(root, write=True)
    assert (root / GPT).is_symlink() and real.read_bytes() == original
    assert not (root / (GPT + ".orig")).exists()


def test_a_huge_gpt_py_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    root = copy_standin(tmp_path)
    with open(root / GPT, "ab") as f:
        f.write(b"#" * (nf.MAX_SOURCE_BYTES + 1) + b"\n")
    monkeypatch.setattr(nf, "make_fix", lambda *a: pytest.fail("the file was parsed"))
    with pytest.raises(nf.FixError, match=r"1\.0 MiB, larger than the 1 MiB"):
        nf.apply_fix(root)


# -- writing ------------------------------------------------------------------------------------

def test_write_keeps_a_backup_and_never_overwrites_one(tmp_path):
    root = copy_standin(tmp_path)
    gpt, backup = root / GPT, root / (GPT + ".orig")
    original = gpt.read_bytes()
    gpt.chmod(0o640)
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.FIXABLE and r.written == (gpt,) and r.backups == (backup,)
    assert gpt.read_text() == r.fixed[GPT] and backup.read_bytes() == original
    assert (gpt.stat().st_mode & 0o777) == 0o640
    # a second run: nothing to do, nothing written
    before = snapshot(root)
    again = nf.apply_fix(root, write=True)
    assert again.status == nf.ALREADY_FIXED and again.written == () and snapshot(root) == before
    # the old file back, the backup still there: refused, nothing written
    gpt.write_bytes(original)
    before = snapshot(root)
    with pytest.raises(nf.FixError, match=r"gpt\.py\.orig already exists"):
        nf.apply_fix(root, write=True)
    assert snapshot(root) == before


def test_a_failed_write_leaves_every_file_as_it_was(tmp_path, monkeypatch):
    """Two files to write (engine.py's reset needs the clearing too); the second replace fails."""
    root = copy_standin(tmp_path)
    engine = root / ENGINE
    text = engine.read_text()
    engine.write_text(text.replace("        self.cache_seqlens.zero_()\n        self.prev_embedding = None\n",
                                   "        self.cache_seqlens.zero_()\n", 1))
    r = nf.apply_fix(root)
    assert r.files == (GPT, ENGINE) and "reset now clears it" in r.message
    before = snapshot(root)
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(nf.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        nf.apply_fix(root, write=True)
    monkeypatch.setattr(nf.os, "replace", real)
    assert snapshot(root) == before  # originals back, no backup, no temporary file


@pytest.mark.parametrize("tool", patch_tools())
def test_engine_reset_that_keeps_the_embedding_is_fixed_too(tmp_path, ours, tokens, tool):
    root = copy_standin(tmp_path)
    engine = root / ENGINE
    engine.write_text(engine.read_text().replace(
        "        self.cache_seqlens.zero_()\n        self.prev_embedding = None\n", "        self.cache_seqlens.zero_()\n", 1))
    r = nf.apply_fix(root)
    assert r.status == nf.FIXABLE and r.files == (GPT, ENGINE)
    assert f"--- a/{ENGINE}\n+++ b/{ENGINE}\n" in r.diff
    apply_diff(root, r.diff, tool)
    code = sandbox.import_nanochat(root)
    cache = code.KVCache(batch_size=1, num_heads=2, seq_len=8, head_dim=4, num_layers=1, device="cpu",
                         dtype=torch.float32)
    cache.prev_embedding = torch.ones(1, 1, 4)
    cache.reset()
    assert cache.prev_embedding is None
    assert not run_audit(root, ours, tokens).failed
    assert nf.apply_fix(root).status == nf.ALREADY_FIXED


# -- recognised as already fixed ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIXED_BRANCHES))
def test_already_fixed_shapes_are_left_alone(tmp_path, ours, tokens, name):
    root = copy_standin(tmp_path)
    rewrite(root / GPT, cached_branch_span, FIXED_BRANCHES[name])
    assert not run_audit(root, ours, tokens).failed  # really fixed, as the audit measures it
    before = snapshot(root)
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.ALREADY_FIXED and r.diff == "" and "nothing to do" in r.message
    assert snapshot(root) == before


# -- nothing changed, and why ------------------------------------------------------------------

UNKNOWN_BRANCHES = {
    # one test for both step kinds: the structure is neither of the known shapes
    "joint test": ("""            if T == 1 and prev is not None:
                x = x + gate * prev
            elif T > 1:
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
""", "looks like the chunk-boundary smear bug"),
    # the decode smear written differently (an extra factor)
    "other decode formula": ("""            if T > 1:
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
            elif prev is not None:
                x = x + 0.5 * gate * prev
""", "does not end with `x = x + gate * prev`"),
    # the gate of a decode step read from the first position only: not general for a chunk
    "decode gate of one position": ("""            if T > 1:
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
            elif prev is not None:
                g1 = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[:, :1, :24]))
                x = x + g1 * prev
""", "does not read every position of the chunk"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN_BRANCHES))
def test_unknown_bug_shapes_change_nothing(tmp_path, name):
    branch, why = UNKNOWN_BRANCHES[name]
    root = copy_standin(tmp_path)
    rewrite(root / GPT, cached_branch_span, branch)
    before = snapshot(root)
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.UNRECOGNISED and r.diff == "" and r.written == ()
    assert why in r.message and "Nothing changed" in r.message
    assert snapshot(root) == before


def test_cache_write_of_something_else_is_named(tmp_path):
    root = copy_standin(tmp_path)
    gpt = root / GPT
    gpt.write_text(gpt.read_text().replace("kv_cache.prev_embedding, x[:, -1:]", "kv_cache.prev_embedding, x[:, :1]"))
    r = nf.apply_fix(root)
    assert r.status == nf.UNRECOGNISED and "expected the chunk's last embedding" in r.message


def test_no_smear_at_all(tmp_path):
    root = copy_standin(tmp_path)
    rewrite(root / GPT, smear_region, "")
    before = snapshot(root)
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.NO_SMEAR and r.diff == "" and "no smear" in r.message
    assert snapshot(root) == before


def test_code_that_does_not_parse(tmp_path):
    root = copy_standin(tmp_path)
    (root / GPT).write_text((root / GPT).read_text() + "\ndef broken(:\n")
    r = nf.apply_fix(root, write=True)
    assert r.status == nf.UNRECOGNISED and "does not parse" in r.message
    assert not (root / (GPT + ".orig")).exists()


def test_not_a_checkout(tmp_path):
    with pytest.raises(nf.FixError, match="directory not found"):
        nf.apply_fix(tmp_path / "nope")
    (tmp_path / "gpt.py").write_text("")
    with pytest.raises(nf.FixError, match="gpt.py: not a directory"):
        nf.apply_fix(tmp_path / "gpt.py")
    with pytest.raises(nf.FixError, match="not a nanochat checkout"):
        nf.apply_fix(tmp_path)
    root = copy_standin(tmp_path)
    assert nf.apply_fix(root / "nanochat").root == root  # the package directory itself is accepted


def test_diff_marks_a_last_line_without_newline(tmp_path):
    old = "a\nb\nc"
    new = "a\nB\nc"
    d = nf.unified_diff(old, new, "f.txt")
    assert d.endswith("+B\n c\n\\ No newline at end of file\n")
    (tmp_path / "f.txt").write_text(old)
    if shutil.which("patch"):
        (tmp_path / "d").write_text(d)
        subprocess.run(["patch", "-p1", "-i", "d"], cwd=tmp_path, check=True, capture_output=True)
        assert (tmp_path / "f.txt").read_text() == new


# -- a real checkout --------------------------------------------------------------------------

@pytest.mark.slow
def test_real_checkout_is_fixed_and_audited(tmp_path, ours, tokens):
    src = os.environ.get("SMEARCLI_NANOCHAT_PATH")
    if not src:
        pytest.skip("set SMEARCLI_NANOCHAT_PATH to a nanochat checkout to fix and audit a copy of it")
    src_root = nf.checkout_root(src)
    root = tmp_path / "checkout"
    shutil.copytree(src_root / "nanochat", root / "nanochat", ignore=shutil.ignore_patterns("__pycache__"))
    before = run_audit(root, ours, tokens)
    if before.failed:  # upstream's code as it is: every schedule is our old logic, bit for bit
        old = {r.schedule: r for r in before.ours.runs if r.logic == "old"}
        for run in before.comparison.runs:
            assert torch.equal(run.logits, old[run.schedule].logits), run.schedule
    r = nf.apply_fix(root, write=True)
    if before.failed:
        assert [f.kind for f in before.findings] == ["chunk-smear"], before.verdict
        assert r.status == nf.FIXABLE, r.message
        assert r.backups and all(b.exists() for b in r.backups)
    else:
        assert r.status == nf.ALREADY_FIXED, r.message
    after = run_audit(root, ours, tokens)
    assert not after.failed, after.verdict
    assert nf.apply_fix(root).status == nf.ALREADY_FIXED
    # the diff also applies to a pristine copy with patch -p1 / git apply
    if r.diff:
        fresh = tmp_path / "fresh"
        shutil.copytree(src_root / "nanochat", fresh / "nanochat", ignore=shutil.ignore_patterns("__pycache__"))
        apply_diff(fresh, r.diff, "patch" if shutil.which("patch") else "git")
        assert (fresh / GPT).read_text() == (root / GPT).read_text()
