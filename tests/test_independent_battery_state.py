"""`compare --impl llamacpp --schedules restore` when llama.cpp's save of the state file leaves a
file shorter than the byte count it returned (a full disk): exit status 2, one line naming the torn
file, no traceback, nothing left in $TMPDIR (docs/threat-model.md, "A state file is held to what was
saved"; docs/errors.md, "the restore schedule's state file torn on disk").

There is no llama.cpp here: smearcli's real worker (`smearcli/engines/llamacpp/worker.py`) runs in
a stand-in of llama.cpp's environment made under the test's scratch directory:

- `env/`: a virtual environment of this test's Python, so that its `sys.prefix` (where the worker
  looks for the converter, `share/llamacpp-convert`) is the scratch directory;
- `fakes/` on its PYTHONPATH: llama-cpp-python 0.3.36's distribution metadata (what the handshake
  reads), a stand-in `llama_cpp.llama_cpp` (FAKE_BINDINGS) and a stand-in `gguf` (FAKE_GGUF);
- `env/share/llamacpp-convert/`: the converter's script (the handshake looks for it) and a stand-in
  `conversion` package (FAKE_CONVERSION) that writes a placeholder GGUF.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import venv
from pathlib import Path

import numpy
import torch

ROOT = Path(__file__).resolve().parents[1]

FAKE_BINDINGS = '''\
"""A stand-in for llama-cpp-python 0.3.36's low-level bindings (`llama_cpp.llama_cpp`): only the
functions and constants smearcli's worker calls for the prefill, decode and restore schedules.

The "model" is no network: the logits at a position are a fixed function of its sequence's tokens up
to that position, so every schedule agrees with the one-call prefill. A saved state is the
sequence's token count and tokens, then PAD bytes standing in for its cache. `llama_state_seq_save_file`
is a save onto a full disk: it returns the state's whole size and leaves only its first half in the file.
"""

import ctypes
import json
import zlib
from types import SimpleNamespace

import numpy as np

GGML_TYPE_F32 = 0
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
PAD = 4096


def llama_log_callback(fn):
    return fn


def ggml_abort_callback(fn):
    return fn


def llama_log_set(callback, data):
    pass


def llama_backend_init():
    pass


def llama_model_default_params():
    return SimpleNamespace(n_gpu_layers=0)


def llama_context_default_params():
    return SimpleNamespace()


def llama_model_load_from_file(path, params):
    with open(path, "rb") as f:  # the stand-in converter's placeholder: {"vocab_size": V}
        return SimpleNamespace(n_vocab=int(json.load(f)["vocab_size"]))


def llama_model_get_vocab(model):
    return model


def llama_vocab_n_tokens(vocab):
    return vocab.n_vocab


def llama_model_is_recurrent(model):
    return False


def llama_model_is_hybrid(model):
    return False


def llama_init_from_model(model, params):
    return SimpleNamespace(model=model, seqs={}, out=[])  # seqs: sequence -> {position: token}


def llama_free(ctx):
    pass


def llama_batch_init(n, embd, n_seq_max):
    return SimpleNamespace(n_tokens=0, token=[0] * n, pos=[0] * n, n_seq_id=[0] * n,
                           seq_id=[[0] for _ in range(n)], logits=[0] * n)


def llama_batch_free(batch):
    pass


def _logits(tokens, n_vocab):
    seed = zlib.crc32(np.asarray(tokens, dtype=np.int32).tobytes())
    return np.random.default_rng(seed).standard_normal(n_vocab).astype(np.float32)


def llama_decode(ctx, batch):
    ctx.out = []
    for i in range(batch.n_tokens):
        seq = ctx.seqs.setdefault(batch.seq_id[i][0], {})
        seq[batch.pos[i]] = batch.token[i]
        ctx.out.append(_logits([seq[p] for p in range(batch.pos[i] + 1)], ctx.model.n_vocab))
    return 0


def llama_get_logits_ith(ctx, i):
    return ctx.out[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _state(ctx, seq):
    toks = ctx.seqs.get(seq, {})
    ids = [toks[p] for p in sorted(toks)]
    return np.asarray([len(ids)] + ids, dtype=np.int32).tobytes() + bytes(PAD)


def llama_state_seq_get_size(ctx, seq):
    return len(_state(ctx, seq))


def llama_state_seq_save_file(ctx, path, seq, tokens, n_tokens):
    data = _state(ctx, seq)
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])  # the disk filled up half way
    return len(data)


def llama_state_seq_load_file(ctx, path, seq, tokens_out, capacity, n_out):
    with open(path, "rb") as f:
        data = f.read()
    n = int(np.frombuffer(data[:4], dtype=np.int32)[0]) if len(data) >= 4 else 0
    if len(data) < 4 * (n + 1) + PAD or n > capacity:
        return 0  # a read that fails, as llama.cpp's does
    ids = np.frombuffer(data[4:4 * (n + 1)], dtype=np.int32).tolist()
    tokens_out[:n] = ids
    n_out._obj.value = n
    ctx.seqs[seq] = dict(enumerate(ids))
    return len(data)
'''

FAKE_GGUF = '''\
"""A stand-in for the `gguf` package: the two names smearcli's worker_convert.py reads."""
MODEL_ARCH_NAMES = {"llama": "llama"}


class LlamaFileType:
    ALL_F32 = 0
'''

FAKE_CONVERSION = '''\
"""A stand-in for llama.cpp's converter package (`conversion`): one architecture, and in place of a
GGUF a placeholder holding the config's vocab_size, which the stand-in loader reads."""
import json
from pathlib import Path

TEXT_MODEL_MAP = {"LlamaForCausalLM": "llama"}


class ModelType:
    TEXT = "text"


class ModelBase:
    model_arch = "llama"

    def __init__(self, dir_model, ftype, fname_out, eager=False):
        self.hparams, self.fname_out = self.load_hparams(Path(dir_model), False), Path(fname_out)

    @staticmethod
    def load_hparams(dir_model, is_mistral):
        return json.loads((Path(dir_model) / "config.json").read_text())

    def write(self):
        self.fname_out.write_text(json.dumps({"vocab_size": self.hparams["vocab_size"]}))


def get_model_architecture(hparams, model_type):
    return (hparams.get("architectures") or ["LlamaForCausalLM"])[0]


def get_model_class(arch, mmproj=False):
    return ModelBase
'''


def fake_llamacpp_python(root: Path, worker: Path | None = None) -> Path:
    """A stand-in for llama.cpp's environment under `root`; its Python (a shell script). With
    `worker`, that file runs in place of the worker smearcli names (a mutation check)."""
    env = root / "env"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(env)
    fakes = root / "fakes"
    (fakes / "llama_cpp").mkdir(parents=True)
    (fakes / "llama_cpp" / "__init__.py").write_text('"""A stand-in for llama-cpp-python (its bindings: llama_cpp.py)."""\n')
    (fakes / "llama_cpp" / "llama_cpp.py").write_text(FAKE_BINDINGS)
    (fakes / "gguf.py").write_text(FAKE_GGUF)
    dist = fakes / "llama_cpp_python-0.3.36.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llama-cpp-python\nVersion: 0.3.36\n")
    conv = env / "share" / "llamacpp-convert"
    (conv / "conversion").mkdir(parents=True)
    (conv / "convert_hf_to_gguf.py").write_text("# a stand-in: the handshake only looks for this file\n")
    (conv / "conversion" / "__init__.py").write_text(FAKE_CONVERSION)
    # numpy and torch (worker_convert imports torch) from this test's Python, after the stand-ins
    host = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (numpy, torch))
    path = os.pathsep.join([str(fakes), *host])
    py = root / "python"
    run = f'shift\nexec "{env / "bin" / "python"}" "{worker}" "$@"' if worker else f'exec "{env / "bin" / "python"}" "$@"'
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{path}"\nexport PYTHONPATH\n{run}\n')
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return py


def compare_restore(tmp_path: Path, worker: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    from smearcli.engines import transformers as hf

    model = tmp_path / "hf"
    hf.tiny_model("llama").save_pretrained(model, safe_serialization=True)
    py = fake_llamacpp_python(tmp_path / "llamacpp", worker)
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "HF_HUB_OFFLINE": "1"}
    env.pop("SMEARCLI_LLAMACPP_PYTHON", None)
    p = subprocess.run([sys.executable, "-m", "smearcli", "compare", "--impl", "llamacpp", "--hf-model", str(model),
                        "--llamacpp-python", str(py), "--schedules", "restore", "--seq-len", "16"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return p, scratch


def test_torn_state_file_is_the_machines_failure(tmp_path):
    p, scratch = compare_restore(tmp_path)
    said = p.stdout + p.stderr
    assert p.returncode == 2, said
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, said
    assert lines[0].startswith("smearcli: error: "), said
    assert "torn" in lines[0] and "restore" in lines[0], said
    assert "Traceback" not in said and "internal error" not in said.lower(), said
    assert sorted(os.listdir(scratch)) == [], "left behind in $TMPDIR"
