#!/usr/bin/env bash
# What a GPU machine can check that this project's CPU machines cannot, sized for a lent
# machine's 10-minute calls: build, the suite's CUDA cases, the benchmark on CUDA. Each step
# has its own time limit and log under OUTDIR; failures' tracebacks go to OUTDIR/failures.log
# as they happen, so a step stopped by its limit still says why what failed failed.
#
#   bash scripts/gpu_check.sh [OUTDIR] [STEP...]     (make gpu-check OUT=OUTDIR)
#
# Steps: build, cuda-tests, bench (the default: all three; their limits add up to 560 s, one such
# call; with 16 cores the build took 34 s under C++17 on an H100 machine and, under C++20, 137 s
# after a first try stopped at 90 s, and 188 and 197 s on an H200 machine; the CUDA tests 86-100 s;
# the benchmark 92-94 s at 3 repeats, 172 s at 5), layouts (every CUDA algorithm forced on the
# benchmark's layers, and the layout copy's bandwidth: the CUDA cost model's calibration,
# benchmarks/forced_algorithms.py), cpu-tests
# (the rest of the suite, which CI runs anyway). The build honours CC, CXX, MAX_JOBS and
# TORCH_CUDA_ARCH_LIST.
# pytest-xdist, where installed, runs the tests in parallel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-build/gpu-check}
shift || true
STEPS=${*:-build cuda-tests bench}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=. TORCH_CONVGRAD_FAILURE_LOG="$OUTDIR/failures.log"
rm -f "$TORCH_CONVGRAD_FAILURE_LOG"

PARALLEL=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then PARALLEL=(-n auto); fi
PYTEST=("$PYTHON" -m pytest tests -q -p no:cacheprovider "${PARALLEL[@]}" --durations=15)

run_step() {  # name, limit in seconds, command...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name (limit ${limit} s)"
  timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  local status=$?
  echo "   exit $status after $((SECONDS - start)) s$([ $status = 124 ] && echo ': stopped by its limit')"
  tail -n 4 "$OUTDIR/$name.log" | cut -c1-240 | sed "s/^/   /"
}

"$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.cuda.is_available() and torch.cuda.get_device_name())"
for step in $STEPS; do
  case $step in
    build) run_step build 260 "$PYTHON" setup.py --quiet build_ext --inplace ;;
    cuda-tests) run_step cuda-tests 150 "${PYTEST[@]}" -k cuda ;;
    bench) run_step bench 150 "$PYTHON" -m torch_convgrad bench --device cuda --markdown --repeats 3 ;;
    layouts) run_step layouts 150 "$PYTHON" benchmarks/forced_algorithms.py --device cuda --json "$OUTDIR/layouts.json" ;;
    cpu-tests) run_step cpu-tests 400 "${PYTEST[@]}" -k "not cuda" ;;
    *) echo "unknown step '$step' (build, cuda-tests, bench, layouts, cpu-tests)" >&2; exit 2 ;;
  esac
done
[ -s "$TORCH_CONVGRAD_FAILURE_LOG" ] && echo "failures: $(grep -c '^=== ' "$TORCH_CONVGRAD_FAILURE_LOG") (tracebacks in $TORCH_CONVGRAD_FAILURE_LOG)"
exit 0
