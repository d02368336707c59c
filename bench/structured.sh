#!/usr/bin/env bash
# Constrained-decoding speed of issue 16 (item 4): `tulip serve` on a full-size random-weight model
# (4-bit by default, as bench/server_load.sh), then tools/loadtest.py at each client count, once
# unconstrained and once with response_format json_schema (bench/structured_schema.json: a nested
# object with uuid, date-time and email formats, an enum, an array of objects with a pattern, integer
# and number bounds, nullable and free strings). Thinking is off in both (a constraint starts after
# the reasoning, which a random model never closes) and ignore_eos keeps both at MAX_TOKENS tokens
# (with max_tokens the grammar closes the document in time; after it only the end token is allowed).
# Prints one markdown table with output tok/s and ITL per mode, then the ratio
# constrained / unconstrained per client count (issue 16 asks >= 0.90 at 1 and 64); the JSON of
# each run stays in $OUT (default bench/out/structured).
#
#   bench/structured.sh                             # build/tulip, 30 s per run, 256 tokens
#   DURATION=60 LEVELS="1 8 64" bench/structured.sh --weight-bits 16
#   SCHEMA=my_response_format.json bench/structured.sh
#
# Extra arguments go to `tulip serve`; LOADTEST_ARGS go to tools/loadtest.py. MODEL=dir serves a
# checkpoint instead (e.g. MODEL=tests/data/tiny-a TOKENIZER=tests/data/tiny-tokenizer/tokenizer.json
# ... --allow-test-shape --backend cpu, as tests/py/test_bench_structured.py does).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tulip}
DURATION=${DURATION:-30}
MAX_TOKENS=${MAX_TOKENS:-256}
PROMPT_WORDS=${PROMPT_WORDS:-64}
LEVELS=${LEVELS:-"1 64"}
OUT=${OUT:-bench/out/structured}
SCHEMA=${SCHEMA:-bench/structured_schema.json}
PY=${PY:-python3}
mkdir -p "$OUT"
source bench/serve_lib.sh
serve_start "$@"

for n in $LEVELS; do
    for mode in free schema; do
        rf=()
        [ "$mode" = schema ] && rf=(--response-format "$SCHEMA")
        "$PY" tools/loadtest.py --url "$url" -n "$n" -t "$DURATION" --max-tokens "$MAX_TOKENS" \
            --prompt-words "$PROMPT_WORDS" --no-think "${rf[@]}" --json "$OUT/n$n-$mode.json" \
            ${LOADTEST_ARGS:-} > "$OUT/n$n-$mode.out" 2>&1 || { cat "$OUT/n$n-$mode.out"; exit 1; }
    done
done

grep -hE "finish=(error|abort)" "$OUT/serve.err" | head -3 | sed 's/^/server: /' || true
"$PY" - "$OUT" $LEVELS <<'PYEOF'
import json, sys
out, levels = sys.argv[1], sys.argv[2:]
print("| clients | output | requests | errors | TTFT p50 ms | ITL p50 ms | ITL mean ms | output tok/s |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for n in levels:
    r = {m: json.load(open(f"{out}/n{n}-{m}.json")) for m in ("free", "schema")}
    for m, name in (("free", "unconstrained"), ("schema", "json_schema")):
        x = r[m]
        print(f"| {n} | {name} | {x['requests']} | {x['errors']} | {x['ttft_p50_ms']} | "
              f"{x['itl_p50_ms']} | {x['itl_mean_ms']} | {x['output_tok_s']} |")
    f, s = r["free"]["output_tok_s"], r["schema"]["output_tok_s"]
    ratios.append((n, s / f if f > 0 else float("nan")))
for n in levels:  # what failed, in the client's and the server's words (first few)
    for m in ("free", "schema"):
        for e in json.load(open(f"{out}/n{n}-{m}.json")).get("error_samples", []):
            print(f"error ({n} clients, {m}): {e}")
print()
print("| clients | constrained / unconstrained output tok/s |")
print("|---|---|")
for n, q in ratios:
    print(f"| {n} | {q:.3f} |")
PYEOF
