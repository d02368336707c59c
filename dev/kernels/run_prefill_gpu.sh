#!/usr/bin/env bash
# On the GPU machine: run the prefill kernel tests and timings built here into build/pf
# (see dev/kernels/prefill_bench.cu for the build line). Logs go to $OUT (or build/pf/logs).
# A crash (not a test failure) in the full run is retried without the wgmma tiles, so one bad
# kernel cannot hide the results of the others.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/pf/logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$out/gpu.txt"
command -v cuobjdump >/dev/null && cuobjdump --dump-sass build/pf/prefill_bench 2>/dev/null |
    grep -oE 'HGMMA[.A-Z0-9x]*|HMMA[.A-Z0-9]*' | sort | uniq -c >> "$out/gpu.txt"
case "${1:-all}" in
test|all)
    timeout 200 build/pf/test_prefill_kernels > "$out/test_prefill.log" 2>&1
    rc=$?
    if [ $rc -gt 1 ]; then
        echo "full test run exited $rc; retrying with mma.sync tiles only" >> "$out/test_prefill.log"
        TL_TEST_TILES=mma timeout 200 build/pf/test_prefill_kernels >> "$out/test_prefill.log" 2>&1
    fi ;;
esac
case "${1:-all}" in
bench|all)
    timeout 150 build/pf/prefill_bench ${2:-} > "$out/bench_prefill.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "bench exited $rc; retrying without wgmma tiles" >> "$out/bench_prefill.log"
        TL_BENCH_TILES=3 timeout 150 build/pf/prefill_bench ${2:-} >> "$out/bench_prefill.log" 2>&1
    fi ;;
esac
