#!/usr/bin/env bash
# Batched decode sweep: `tulip bench --batch B` for each B in $BATCHES at one context length, one
# markdown row per B (aggregate decode tok/s, ms per step). Run on the GPU machine from the
# repository root with a CUDA build. Settings (environment):
#   BATCHES  batch sizes (default "1 8 32 64 128 256")
#   LEN      context length of every sequence (default 256)
#   GEN      decode steps timed (default 64)
#   ARGS     extra bench arguments (default "--random-weights --bits 4"; add --greedy for argmax)
#   TULIP    the binary (default build/cuda/tulip)
# Any TL_* switch in the environment passes through (e.g. TL_CUDA_TC_MIN=0 for the GEMV path).
set -u
TULIP=${TULIP:-build/cuda/tulip}
ARGS=${ARGS:---random-weights --bits 4}
echo "| B | decode tok/s (aggregate) | ms per step | GB/s moved | prefill tok/s |"
echo "|---:|---:|---:|---:|---:|"
for B in ${BATCHES:-1 8 32 64 128 256}; do
    out=$("$TULIP" bench $ARGS --lengths "${LEN:-256}" --gen "${GEN:-64}" --repeats 1 \
        --batch "$B" --json 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "| $B | failed (rc $rc): $(echo "$out" | tail -1 | cut -c1-120) | | |"
        continue
    fi
    echo "$out" | python3 -c '
import json, sys
b = sys.argv[1]
doc = json.loads(sys.stdin.read().strip().splitlines()[-1])
r = doc["rows"][0]
gb = "%.0f" % r["gen_gbps"] if r.get("gen_gbps") is not None else "-"
print("| %s | %.1f | %.2f | %s | %.1f |" % (b, r["gen_tps"], r["gen_ms_per_step"], gb, r["prefill_tps"]))
' "$B"
done
