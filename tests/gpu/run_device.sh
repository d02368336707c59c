#!/usr/bin/env bash
# One call on the lent GPU machine (GPU.md): GPU tests, compute-sanitizer on the small model,
# then `tulip bench`. Built here (make cuda + the test binaries), carried with .deps (tools/gpu_deps.sh).
# Usage: bash tests/gpu/run_device.sh "<bench args>" ["<second bench args>"]; logs go to $OUT.
set -u
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/tulip-out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader >"$O/gpu.txt" 2>&1
cat "$O/gpu.txt"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$O/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    bash tests/run.sh --gpu 2>&1 | tee "$O/test-gpu.txt"
    cat build/test-logs/gpu:test_kernels.log build/test-logs/gpu:test_gpu_e2e.log >"$O/test-logs.txt" 2>/dev/null
    grep -E '^#' build/test-logs/gpu:test_*.log | cut -c1-160
    timeout "${MEMCHECK_S:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 \
        build/cuda/tests/test_gpu_e2e --quick >"$O/memcheck.txt" 2>&1
    echo "memcheck rc=$? ($(grep -c 'Invalid\|ERROR SUMMARY' "$O/memcheck.txt") error lines): $(grep 'ERROR SUMMARY' "$O/memcheck.txt")"
fi
n=0
for args in "$@"; do
    n=$((n + 1))
    echo "== tulip bench $args"
    timeout "${BENCH_S:-300}" build/cuda/tulip bench $args >"$O/bench$n.txt" 2>&1
    echo "rc=$?"
    cat "$O/bench$n.txt"
done
if [ "${HF:-0}" = 1 ]; then
    echo "== tools/hf_fullwidth.py"
    PYTHONUNBUFFERED=1 timeout "${HF_S:-200}" python3 tools/hf_fullwidth.py --out /tmp/fw --layers 4 --steps 32 >"$O/hf.txt" 2>&1
    echo "rc=$?"
    grep -E '^#|PASS|FAIL|Error|error' "$O/hf.txt" | tail -n 15
fi
