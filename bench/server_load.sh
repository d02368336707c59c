#!/usr/bin/env bash
# Server load protocol of issue 5 (part 6): `tulip serve` on a full-size random-weight model
# (4-bit by default, no checkpoint needed), then tools/loadtest.py with 1, 8 and 64 concurrent
# streaming clients. Prints one markdown table (paste it into BENCHMARKS.md with date, commit,
# GPU and this command) and leaves the JSON of each run in $OUT (default bench/out/server-load).
#
#   bench/server_load.sh                       # build/tulip, 30 s per level, 256 tokens/request
#   DURATION=60 MAX_TOKENS=512 LEVELS="1 8 64 128" bench/server_load.sh --weight-bits 16
#
# Extra arguments go to `tulip serve`; LOADTEST_ARGS go to tools/loadtest.py (e.g.
# LOADTEST_ARGS="--temperature 0" for greedy; its default, temperature 1.0 with the server's other
# defaults, is the model card's sampling; "--distinct-prompts" gives every request its own prompt:
# by default all clients send one prompt, which the prefix cache serves and which makes greedy
# streams identical, routing to the same experts). The tokenizer defaults to ../shared/data's Qwen3 one
# (its chat tokens are all the template needs; ignore_eos keeps every request at MAX_TOKENS).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tulip}
DURATION=${DURATION:-30}
MAX_TOKENS=${MAX_TOKENS:-256}
PROMPT_WORDS=${PROMPT_WORDS:-64}
LEVELS=${LEVELS:-"1 8 64"}
OUT=${OUT:-bench/out/server-load}
PY=${PY:-python3}
mkdir -p "$OUT"
source bench/serve_lib.sh
serve_start "$@"

echo "| clients | requests | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s |"
echo "|---|---|---|---|---|---|---|---|"
for n in $LEVELS; do
    "$PY" tools/loadtest.py --url "$url" -n "$n" -t "$DURATION" --max-tokens "$MAX_TOKENS" \
        --prompt-words "$PROMPT_WORDS" --json "$OUT/n$n.json" ${LOADTEST_ARGS:-} | tail -1
done
