#!/usr/bin/env bash
# One device call for the end of a session (GPU.md): GPU tests + memcheck, the transformers
# full-width check (bf16 and 4-bit), and the load time of a full-size random 4-bit checkpoint
# (tools/make_random_mlx4.py), warm and cold page cache. Logs under $OUT; a short summary on stdout.
# BENCH="--random-weights --bits 4 --repeats 3" adds a tulip bench run; SKIP_LOAD=1 skips the load.
set -u
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/tulip-out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash tests/run.sh --gpu 2>&1 | tee "$O/tests.txt"
grep -hE '^# ' build/test-logs/gpu*.log | grep -E 'prefill GEMM|gemm vs|kv pool|e2e |then 8' | cut -c1-160
timeout "${MEMCHECK_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    build/cuda/tests/test_gpu_e2e --quick >"$O/memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$O/memcheck.txt")"
echo "== hf_fullwidth"
PYTHONUNBUFFERED=1 timeout "${HF_S:-270}" python3 tools/hf_fullwidth.py --out /tmp/fw --layers 4 \
    --steps 32 >"$O/hf.txt" 2>&1
echo "hf rc=$?"
grep -E '^#|PASS|FAIL|Error' "$O/hf.txt" | cut -c1-200 | tail -24
rm -rf /tmp/fw
if [ -n "${BENCH:-}" ]; then
    echo "== tulip bench $BENCH"
    timeout "${BENCH_S:-200}" build/cuda/tulip bench $BENCH >"$O/bench.txt" 2>"$O/bench-err.txt"
    echo "bench rc=$?"; cat "$O/bench.txt"
fi
[ "${SKIP_LOAD:-0}" = 1 ] && exit 0
echo "== load time"
df -h /tmp | tail -1
( time timeout "${GEN_S:-120}" python3 tools/make_random_mlx4.py --out /tmp/ckpt ) >"$O/gen.txt" 2>&1
tail -4 "$O/gen.txt"
build/cuda/tulip info --model /tmp/ckpt 2>&1 | grep -iE 'shape|bytes|GB' | head -4
for pass in warm cold; do
    if [ $pass = cold ]; then sync; echo 3 >/proc/sys/vm/drop_caches && echo "page cache dropped"; fi
    ( time timeout "${LOAD_S:-90}" build/cuda/tulip run --backend cuda --model /tmp/ckpt \
        --prompt-ids 1,2,3 -n 8 --temperature 0 --print-ids ) >"$O/load-$pass.txt" 2>&1
    echo "-- $pass:"; grep -vE '^\s*$|uploading' "$O/load-$pass.txt" | tail -6
done
