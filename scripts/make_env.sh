#!/usr/bin/env bash
# Make the environment an engine of smearcli runs in: its own, since each engine pins torch and
# transformers versions that differ from smearcli's. Two arguments: the engine and the directory to
# create.
#   scripts/make_env.sh vllm /path/to/vllm-env
#   smearcli compare --impl vllm --vllm-python /path/to/vllm-env/bin/python --hf-model DIR
#   scripts/make_env.sh llamacpp /path/to/llamacpp-env
#   smearcli compare --impl llamacpp --llamacpp-python /path/to/llamacpp-env/bin/python --hf-model DIR
# PYTHON (default python3) is the Python the venv is made from, for any engine.
#
# Each engine's recipe is in its folder, smearcli/engines/ENGINE/make_env.sh (what it installs, its
# variables, how to build it for a GPU): it defines `make_env`, which makes $dir from $python, and
# `use_it`, the line saying how to point smearcli at it. The engines are the folders that have one.
set -euo pipefail
engines_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/smearcli/engines"
engines=()
for recipe in "$engines_dir"/*/make_env.sh; do
    [ -f "$recipe" ] && engines+=("$(basename "$(dirname "$recipe")")")
done
names="$(printf '%s\n' "${engines[@]}" | paste -sd' ' | sed 's/ / or /g')"
usage="usage: $0 ENGINE DIR   (ENGINE: $names; DIR: the directory to create its environment in)"
if [ "$#" -ne 2 ]; then
    echo "$usage" >&2
    exit 2
fi
engine="$1"
dir="$2"
if [ -z "$engine" ] || [ ! -f "$engines_dir/$engine/make_env.sh" ] || [[ "$engine" == */* ]]; then
    echo "error: unknown engine '$engine'; ENGINE is $names" >&2
    echo "$usage" >&2
    exit 2
fi
if [ -e "$dir" ]; then
    echo "error: $dir already exists; give a new directory" >&2
    exit 2
fi
python="${PYTHON:-python3}"
start=$(date +%s)

stamp() { echo "[$(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s] $*"; }

# shellcheck source=/dev/null
source "$engines_dir/$engine/make_env.sh"
make_env
end=$(date +%s)
echo "made $dir in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s ($(du -sh "$dir" | cut -f1))"
use_it
