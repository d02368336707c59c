#!/usr/bin/env bash
# On the GPU machine: run the prefill kernel tests and timings built here into build/pf
# (see dev/kernels/prefill_bench.cu for the build line). Logs go to $OUT (or build/pf/logs).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/pf/logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
case "${1:-all}" in
test|all) timeout 400 build/pf/test_prefill_kernels 2>&1 | tee "$out/test_prefill.log" ;;
esac
case "${1:-all}" in
bench|all) timeout 300 build/pf/prefill_bench ${2:-} 2>&1 | tee "$out/bench_prefill.log" ;;
esac
