# llama.cpp's environment, sourced by scripts/make_env.sh (`scripts/make_env.sh llamacpp DIR`),
# which gives $python (the Python the venv is made from), $dir (the directory to create) and `stamp`.
#
# llama.cpp is a compiled library, and its converter pins other torch/transformers versions than
# smearcli. llama-cpp-python (LLAMACPP_PYTHON_VERSION, default 0.3.36) is built from its source
# distribution (it vendors llama.cpp, the converter convert_hf_to_gguf.py, its conversion/ package
# and gguf-py) with the system's cmake and a C++ compiler. CPU by default; on a GPU machine:
#   CMAKE_ARGS=-DGGML_CUDA=on scripts/make_env.sh llamacpp DIR
# The converter is copied from that same source distribution into DIR/share/llamacpp-convert, so
# the GGUF files smearcli writes come from the converter of the llama.cpp that loads them.
# Its needs: numpy, safetensors, torch (TORCH_PIN, default torch==2.13.0: the CPU wheel; an
# unpinned torch pulls a CUDA build of several GB), transformers (TRANSFORMERS_PIN, default
# transformers==5.24.0) and the vendored gguf-py. sentencepiece is optional for the converter and
# not needed here (smearcli's tiny models carry a synthetic vocabulary).
# On a loaded machine: nice -n 15 env CMAKE_BUILD_PARALLEL_LEVEL=2 scripts/make_env.sh llamacpp DIR

make_env() {
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
    "$dir/bin/python" - <<'PY'
import llama_cpp, gguf, torch, transformers
print("llama_cpp", llama_cpp.__version__, "gguf", gguf.__name__, "torch", torch.__version__,
      "transformers", transformers.__version__)
print("system:", llama_cpp.llama_print_system_info().decode())
PY
    test -f "$convert/convert_hf_to_gguf.py"
}

use_it() {
    echo "use it with: --llamacpp-python $dir/bin/python  (or SMEARCLI_LLAMACPP_PYTHON=$dir/bin/python)"
}
