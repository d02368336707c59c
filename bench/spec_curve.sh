#!/usr/bin/env bash
# Speculative decoding's cost and its speedup curve (issue 17, item 5a): `tulip bench` at one
# context with K = 0 (plain) and each K in $KS draft tokens, then the tok/s each K would give at
# acceptance rates 0.5 .. 0.9, computed from the measured step costs: a step yields
# (1 - a^(K+1)) / (1 - a) tokens at per-draft acceptance a. With random weights the MTP head's
# drafts are never accepted, so every measured step is a full draft + verify + rollback: the cost
# side of the trade. Run on the GPU machine from the repository root with a CUDA build.
#   LEN   context length (default 4096)      GEN   decode tokens timed (default 64)
#   KS    draft token counts (default "1 2 3 4")
#   ARGS  extra bench arguments (default "--random-weights --bits 4": the model card's sampling;
#         add --greedy for argmax)       TULIP the binary (default build/cuda/tulip)
set -u
TULIP=${TULIP:-build/cuda/tulip}
ARGS=${ARGS:---random-weights --bits 4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for K in 0 ${KS:-1 2 3 4}; do
    spec=""
    [ "$K" -gt 0 ] && spec="--speculative-tokens $K"
    # shellcheck disable=SC2086
    if ! "$TULIP" bench $ARGS --lengths "${LEN:-4096}" --gen "${GEN:-64}" --repeats 1 $spec \
        --json >"$tmp/$K.json" 2>"$tmp/$K.err"; then
        echo "spec_curve: K=$K failed: $(tail -1 "$tmp/$K.err")" >&2
        exit 1
    fi
done
python3 - "$tmp" ${KS:-1 2 3 4} <<'PY'
import json, sys
d, ks = sys.argv[1], [int(k) for k in sys.argv[2:]]
def row(k):
    doc = json.loads(open("%s/%d.json" % (d, k)).read().strip().splitlines()[-1])
    return doc["rows"][0]
plain = row(0)["gen_ms_per_step"]
print("| K | draft ms | forward ms | acceptance ms | ms per step | x plain step |")
print("|---:|---:|---:|---:|---:|---:|")
print("| 0 | | | | %.3f | 1.00 |" % plain)
cost = {}
for k in ks:
    r = row(k)
    cost[k] = r["gen_ms_per_step"]  # one step, whatever it yielded
    print("| %d | %.3f | %.3f | %.3f | %.3f | %.2f |" % (k, r["spec_ms_draft"],
          r["spec_ms_forward"], r["spec_ms_accept"], cost[k], cost[k] / plain))
print()
print("| acceptance | " + " | ".join("K = %d" % k for k in ks) + " |")
print("|---:|" + "---:|" * len(ks))
for a in (0.5, 0.6, 0.7, 0.75, 0.8, 0.9):
    cells = []
    for k in ks:
        tps = (1 - a ** (k + 1)) / (1 - a) / cost[k] * 1000
        cells.append("%.0f (%.2fx)" % (tps, tps * plain / 1000))
    print("| %.2f | %s |" % (a, " | ".join(cells)))
print("\nplain decode: %.1f tok/s (%.3f ms a step)" % (1000 / plain, plain))
PY
