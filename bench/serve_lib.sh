# Sourced by the load benchmarks (server_load.sh, structured.sh): starts `tulip serve` for them.
# serve_start ARGS...: the tokenizer from $TOKENIZER (a .gz is unpacked into $OUT), the model from
# $MODEL or full-size random 4-bit weights, --max-seqs the largest of $LEVELS, --ctx 4096, then
# ARGS; waits until it listens and sets $url; the server is stopped when the script exits.
# Needs BIN, OUT, LEVELS set and the repository root as the working directory.
serve_start() {
    local tok=${TOKENIZER:-../shared/data/qwen3-tokenizer.json.gz} src max_level
    if [[ "$tok" == *.gz ]]; then
        gunzip -c "$tok" > "$OUT/tokenizer.json"
        tok="$OUT/tokenizer.json"
    fi
    max_level=$(printf '%s\n' $LEVELS | sort -n | tail -1)
    if [ -n "${MODEL:-}" ]; then
        src=(--model "$MODEL") # a checkpoint (e.g. MODEL=tests/data/tiny-a ... --allow-test-shape)
    else
        src=(--random-weights --weight-bits 4)
    fi
    "$BIN" serve "${src[@]}" --tokenizer "$tok" --port 0 \
        --max-seqs "$max_level" --ctx 4096 "$@" > "$OUT/serve.out" 2> "$OUT/serve.err" &
    serve_pid=$!
    trap 'kill -TERM $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null || true' EXIT
    for _ in $(seq 600); do
        grep -q "listening on" "$OUT/serve.out" 2>/dev/null && break
        kill -0 $serve_pid 2>/dev/null || { cat "$OUT/serve.err"; exit 1; }
        sleep 0.5
    done
    url=$(grep -o 'http://[0-9.]*:[0-9]*' "$OUT/serve.out" | head -1)
    head -1 "$OUT/serve.out"
}
