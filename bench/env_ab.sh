#!/usr/bin/env bash
# A/B of environment switches on one binary: `tulip bench` at one context for each variant in
# $VARIANTS (variants separated by ';', each a list of NAME=VALUE, "-" for none), the variants
# alternated ROUNDS times so drift hits them all alike, then one markdown table: decode tok/s and
# ms a step per round (METRIC=prefill: prefill tok/s and ms for the prompt), and the best. Run on
# the GPU machine from the repository root.
#   VARIANTS  e.g. "TL_GEMV_SLICE=0 TL_MOE_SLICE=0; TL_GEMV_SLICE=1; TL_MOE_SLICE=1" (required)
#   LEN       context length, or a comma list: one table each (default 4096)
#   GEN       decode tokens timed (default 128)
#   ROUNDS    alternations (default 2)            TULIP   the binary (default build/cuda/tulip)
#   ARGS      bench arguments (default "--random-weights --bits 4": the model card's sampling)
#   METRIC    decode (default) or prefill
# A variant that fails is said on stderr, its cells read "failed", the others still run; the
# exit status is then 1.
set -u
TULIP=${TULIP:-build/cuda/tulip}
ARGS=${ARGS:---random-weights --bits 4}
if [ -z "${VARIANTS:-}" ]; then
    echo "env_ab: set VARIANTS (see the header)" >&2
    exit 2
fi
METRIC=${METRIC:-decode}
if [ "$METRIC" != decode ] && [ "$METRIC" != prefill ]; then
    echo "env_ab: METRIC must be decode or prefill, not '$METRIC'" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
IFS=';' read -r -a vars <<<"$VARIANTS"
failed=0
for ((r = 0; r < ${ROUNDS:-2}; r++)); do
    for i in "${!vars[@]}"; do
        v=$(echo "${vars[$i]}" | xargs)
        envs=()
        [ "$v" != "-" ] && [ -n "$v" ] && read -r -a envs <<<"$v"
        # shellcheck disable=SC2086
        if ! env ${envs[@]+"${envs[@]}"} "$TULIP" bench $ARGS --lengths "${LEN:-4096}" \
            --gen "${GEN:-128}" --repeats 1 --json >"$tmp/$i.$r.json" 2>"$tmp/$i.$r.err"; then
            echo "env_ab: variant '$v' failed: $(tail -1 "$tmp/$i.$r.err")" >&2
            rm -f "$tmp/$i.$r.json"
            failed=1
        fi
    done
done
[ -n "$(ls "$tmp"/*.json 2>/dev/null)" ] || exit 1
python3 - "$tmp" "${ROUNDS:-2}" "$METRIC" "${vars[@]}" <<'PY'
import json, sys
d, rounds, metric = sys.argv[1], int(sys.argv[2]), sys.argv[3]
vs = [v.strip() for v in sys.argv[4:]]
unit = "ms a step" if metric == "decode" else "ms the prompt"
docs = {}
for i in range(len(vs)):
    for r in range(rounds):
        try:
            docs[(i, r)] = json.loads(open("%s/%d.%d.json" % (d, i, r)).read().strip().splitlines()[-1])
        except OSError:
            pass  # the variant failed this round (said above); its cell reads "failed"
first = docs[min(docs)]
for k, ctx in enumerate(row["ctx"] for row in first["rows"]):
    if k:
        print()
    print("| variant (ctx %d) | " % ctx + " | ".join("round %d %s tok/s (%s)" % (r + 1, metric, unit)
                                                  for r in range(rounds)) + " | best tok/s |")
    print("|---|" + "---:|" * (rounds + 1))
    for i, v in enumerate(vs):
        cells, best = [], 0.0
        for r in range(rounds):
            if (i, r) not in docs:
                cells.append("failed")
                continue
            row = docs[(i, r)]["rows"][k]
            if metric == "decode":
                ms = row["gen_ms_per_step"]
                tps = 1000.0 / ms
            else:
                tps = row["prefill_tps"]
                ms = 1000.0 * row["ctx"] / tps
            cells.append("%.1f (%.3f)" % (tps, ms))
            best = max(best, tps)
        print("| %s | %s | %.1f |" % (v or "-", " | ".join(cells), best))
PY
exit $failed
