"""Helpers shared by the hardening tests: tiny checkpoints, edits to them, malicious pickles, and
one CLI invocation with every promise about errors checked."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
from pathlib import Path

import torch
from typer.testing import CliRunner

from smearcli.cli.app import app
from smearcli.gpt.weights import random_config, random_model, save_checkpoint

runner = CliRunner()
PT, META = "model_000001.pt", "meta_000001.json"
# the smallest model the CLI accepts, on a short input: every run takes a fraction of a second
FAST = ["--depth", "1", "--seq-len", "16", "--gen-len", "4"]


def write_checkpoint(d: Path, depth: int = 1, step: int = 1, vocab_size: int = 256) -> Path:
    model = random_model(random_config(depth, vocab_size=vocab_size), seed=0).model
    save_checkpoint(model, d, step)
    return d


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_meta(d: Path, fn, name: str = META) -> None:
    meta = json.loads((d / name).read_text())
    out = fn(meta)  # a dict it returns replaces the meta object
    (d / name).write_text(json.dumps(out if isinstance(out, dict) else meta))


def edit_config(d: Path, **changes) -> None:
    """Set model_config fields (a value of ... deletes the field)."""
    def fn(meta):
        for k, v in changes.items():
            if v is ...:
                meta["model_config"].pop(k, None)
            else:
                meta["model_config"][k] = v
    edit_meta(d, fn)


def edit_state(d: Path, fn, name: str = PT) -> None:
    sd = torch.load(d / name, weights_only=True)
    out = fn(sd)  # a dict it returns replaces the state dict; anything else is ignored
    torch.save(out if isinstance(out, dict) else sd, d / name)


class Payload:
    """Unpickling this creates `marker` (an open(..., "w")): proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def malicious_state(d: Path, marker: Path) -> None:
    """Plant the payload in the checkpoint's state dict, beside real tensors."""
    edit_state(d, lambda sd: sd.__setitem__("lm_head.weight", Payload(marker)))


def malicious_torch_file(path: Path, marker: Path) -> Path:
    """A torch.save file (zip archive) whose pickle calls the payload."""
    torch.save({"ids": torch.arange(4), "extra": Payload(marker)}, path)
    return path


def malicious_pickle(path: Path, marker: Path) -> Path:
    """A plain pickle, as nanochat's tokenizer.pkl is."""
    with open(path, "wb") as f:
        pickle.dump({"mergeable_ranks": Payload(marker)}, f)
    return path


def invoke(args, allowed=(0, 1, 2)):
    """Run the CLI in-process and check what every invocation owes the user: an allowed exit
    status, no traceback, and on failure exactly one `smearcli: error:` line on stderr."""
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code in allowed, (args, r.exit_code, r.output)
    assert "Traceback" not in r.output, (args, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    err = [line for line in r.stderr.strip().splitlines() if line.startswith("smearcli: error:")]
    if r.exit_code != 0:  # notices (bench's load warning) may precede it; the error is one line
        assert len(err) == 1 and r.stderr.strip().endswith(err[0]), (args, r.stderr)
        assert "internal error" not in err[0], (args, err[0])
    else:
        assert not err, (args, r.stderr)
    return r


def leftovers(d: Path) -> list[Path]:
    """Temporary files atomic_write would leave if it failed to clean up."""
    return sorted(p for p in d.rglob(".*.tmp"))  # atomic_write's names: .{target}.XXXXXXXX.tmp
