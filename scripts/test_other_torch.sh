#!/usr/bin/env bash
# Builds and tests torch_convgrad against another torch release, in its own
# virtual environment and its own copy of the tracked files, so the main
# build (and its torch) is left alone.
#   scripts/test_other_torch.sh 2.14.1 [pytest args...]
# torch 2.14.1 is a CUDA build: the CUDA kernels are compiled and linked too
# (where nvcc is found), and the suite runs on whatever devices are present.
set -euo pipefail
version=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/venv-torch-$version"
tree="$root/build/tree-torch-$version"
PYTHON=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet "torch==$version" ninja "setuptools>=64" wheel -r "$root/requirements-test.txt"
bash "$root/scripts/copy_tree.sh" "$tree"
cd "$tree"
# With no GPU to ask, nvcc needs a target: the H100s this project runs on.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# nvcc on PATH may be a wrapper script, whose folder's parent torch would take
# for the toolkit (and miss libcudart): ask nvcc where it really lives.
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc > /dev/null 2>&1; then
  toolkit=$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  if [ -n "$toolkit" ]; then export CUDA_HOME=$(cd "$toolkit" && pwd); fi
fi
"$venv/bin/python" setup.py --quiet build_ext --inplace
"$venv/bin/python" -m pytest tests "$@"
