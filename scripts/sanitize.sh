#!/usr/bin/env bash
# Builds torch_convgrad with AddressSanitizer and UndefinedBehaviorSanitizer in
# its own copy of the tree (build/tree-sanitize; the main build is left alone)
# and runs the error, edge-case, sweep and algorithm tests under them. Any
# report fails.
#   scripts/sanitize.sh [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree="$root/build/tree-sanitize"
PYTHON=${PYTHON:-python3}
bash "$root/scripts/copy_tree.sh" "$tree"
cd "$tree"
TORCH_CONVGRAD_SANITIZE=1 TORCH_CONVGRAD_CUDA=0 "$PYTHON" setup.py --quiet build_ext --inplace
# Python and torch are not instrumented: the runtimes must load first, leaks
# are Python's own, and torch frees some of its allocations with other
# allocator calls than it made them with.
compiler=${CXX:-c++}
export LD_PRELOAD="$("$compiler" -print-file-name=libasan.so):$("$compiler" -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:alloc_dealloc_mismatch=0:halt_on_error=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$PYTHON" -m pytest -p no:cacheprovider tests/test_errors.py tests/test_edge_cases.py tests/test_semantics.py \
  tests/test_algorithms.py "$@"
