#!/usr/bin/env bash
# Replicas behind HAProxy (issue 19, docs/deploy.md): N `tulip serve` replicas on ports
# BASE_PORT..BASE_PORT+N-1, one per GPU (--device i), HAProxy in front (the configuration of
# packaging/haproxy/tulip-haproxy-cfg), then through the balancer: tools/loadtest.py at each of
# LEVELS concurrent streaming clients (the table: clients, requests, errors, latencies, output
# tok/s), bench/multiturn.py (each conversation sends X-Session-Id, so it stays on one replica;
# the cached-token rate = cached / reusable prompt tokens over all turns after the first), and
# with KILL=1 the kill test: a load run at KILL_CLIENTS clients during which replica 0 gets SIGKILL
# after KILL_AT seconds; then every request of a short run after it must succeed. Every process
# started here is stopped on exit (trap), whatever happens.
#
#   bench/replicas.sh                              # one replica per visible GPU, random 4-bit weights
#   REPLICAS=1 bench/replicas.sh                   # the 1-replica baseline, same protocol
#   KILL=1 bench/replicas.sh                       # and the kill test
#   REPLICAS=2 SAME_GPU=1 bench/replicas.sh --kv-tokens 65536 --gpu-memory-utilization 0.45
#                                                  # dry run: N replicas on GPU 0 (small pools)
#   BACKEND=cpu MODEL=tests/data/tiny-a TOKENIZER=tests/data/tiny-tokenizer/tokenizer.json \
#     BIN=build/cpu/tulip REPLICAS=2 LEVELS="1 4" DURATION=5 MAX_TOKENS=16 \
#     MT_ARGS="--sys-tokens 200 --turn-tokens 30 --gen 8 --turns 3 --convs 2" KILL=1 \
#     bench/replicas.sh --allow-test-shape       # CPU smoke run (numbers mean nothing)
#
# Variables: BIN (build/tulip), REPLICAS (GPUs nvidia-smi lists, else 2), BASE_PORT (8100),
# LB_PORT (8090), LEVELS ("1 8 64 128"), DURATION (30 s a level), MAX_TOKENS (256), PROMPT_WORDS
# (64), MAX_SEQS (the largest level, per replica), CTX (32768), MODEL (a checkpoint instead of
# random weights), TOKENIZER (../shared/data's Qwen3 one), BACKEND (cpu: no --device), SAME_GPU
# (1: no --device, every replica on the default device), MT_ARGS (bench/multiturn.py's sizes;
# default its protocol at 8 conversations), NO_MT (1: skip it), KILL, KILL_AT (DURATION/3),
# KILL_CLIENTS (the largest level), HAPROXY (haproxy in PATH, else .deps/haproxy/haproxy from
# tools/gpu_deps.sh), OUT (bench/out/replicas). Extra arguments go to every `tulip serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tulip}
if [ -z "${REPLICAS:-}" ]; then
    REPLICAS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${REPLICAS:-0}" -gt 0 ] || REPLICAS=2
fi
BASE_PORT=${BASE_PORT:-8100}
LB_PORT=${LB_PORT:-8090}
LEVELS=${LEVELS:-"1 8 64 128"}
DURATION=${DURATION:-30}
MAX_TOKENS=${MAX_TOKENS:-256}
PROMPT_WORDS=${PROMPT_WORDS:-64}
CTX=${CTX:-32768}
OUT=${OUT:-bench/out/replicas}
TOK=${TOKENIZER:-../shared/data/qwen3-tokenizer.json.gz}
PY=${PY:-python3}
MT_ARGS=${MT_ARGS:-"--convs 8"}
max_level=$(printf '%s\n' $LEVELS | sort -n | tail -1)
MAX_SEQS=${MAX_SEQS:-$max_level}
KILL_CLIENTS=${KILL_CLIENTS:-$max_level}
KILL_AT=${KILL_AT:-$((DURATION / 3))}
if [ -z "${HAPROXY:-}" ]; then
    if command -v haproxy >/dev/null 2>&1; then
        HAPROXY=haproxy
    elif [ -x .deps/haproxy/haproxy ]; then
        HAPROXY=.deps/haproxy/haproxy
        export LD_LIBRARY_PATH=.deps/haproxy/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    else
        echo "replicas: no haproxy (apt-get install haproxy; or tools/gpu_deps.sh and carry .deps)"
        exit 1
    fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [[ "$TOK" == *.gz ]]; then
    gunzip -c "$TOK" > "$OUT/tokenizer.json"
    TOK="$OUT/tokenizer.json"
fi
if [ -n "${MODEL:-}" ]; then src=(--model "$MODEL"); else src=(--random-weights --weight-bits 4); fi

pids=() hpid=""
cleanup() {
    set +e
    [ -n "$hpid" ] && kill -TERM "$hpid" 2>/dev/null
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}" $hpid; do
        for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# GET url -> HTTP status (000 when nothing answers)
status() {
    "$PY" -c 'import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")' "$1"
}

for port in $(seq "$BASE_PORT" $((BASE_PORT + REPLICAS - 1))) "$LB_PORT"; do
    [ "$(status "http://127.0.0.1:$port/health")" = 000 ] ||
        { echo "replicas: port $port is in use (a server left from an earlier run?)"; exit 1; }
done
for i in $(seq 0 $((REPLICAS - 1))); do
    dev=()
    [ "${BACKEND:-}" = cpu ] && dev=(--backend cpu)
    [ "${BACKEND:-}" != cpu ] && [ "${SAME_GPU:-0}" != 1 ] && dev=(--device "$i")
    "$BIN" serve "${src[@]}" --tokenizer "$TOK" --port $((BASE_PORT + i)) "${dev[@]}" \
        --max-seqs "$MAX_SEQS" --ctx "$CTX" "$@" > "$OUT/serve$i.out" 2> "$OUT/serve$i.err" &
    pids+=($!)
done
for i in $(seq 0 $((REPLICAS - 1))); do
    for _ in $(seq 1800); do
        grep -q "listening on" "$OUT/serve$i.out" 2>/dev/null &&
            [ "$(status "http://127.0.0.1:$((BASE_PORT + i))/health")" = 200 ] && break
        kill -0 "${pids[$i]}" 2>/dev/null || { echo "replica $i exited:"; tail -5 "$OUT/serve$i.err"; exit 1; }
        sleep 0.5
    done
    echo "replica $i: $(grep -m1 'tulip serve: model' "$OUT/serve$i.out" || true)"
done

packaging/haproxy/tulip-haproxy-cfg --replicas "$REPLICAS" --base-port "$BASE_PORT" \
    --listen "127.0.0.1:$LB_PORT" --stats-socket "$OUT/haproxy.sock" > "$OUT/haproxy.cfg"
"$HAPROXY" -c -f "$OUT/haproxy.cfg" >/dev/null
"$HAPROXY" -db -f "$OUT/haproxy.cfg" > "$OUT/haproxy.log" 2>&1 &
hpid=$!
url="http://127.0.0.1:$LB_PORT"
# every replica UP in haproxy's view (its checks: 2 successes 1 s apart)
servers_up() {
    "$PY" -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall(b"show stat\n"); d = b""
while True:
    b = s.recv(65536)
    if not b: break
    d += b
rows = [l.split(",") for l in d.decode().splitlines()[1:] if l.startswith("tulip_affinity,r")]
print(" ".join(r[1] + "=" + r[17] for r in rows))' "$OUT/haproxy.sock" 2>/dev/null || true
}
up=0
for _ in $(seq 60); do
    kill -0 "$hpid" 2>/dev/null || { echo "haproxy exited:"; tail -5 "$OUT/haproxy.log"; exit 1; }
    st=$(servers_up)
    if [ -n "$st" ] && ! grep -qv '=UP$' <(tr ' ' '\n' <<< "$st"); then up=1; break; fi
    sleep 0.5
done
[ "$up" = 1 ] || { echo "haproxy: replicas not all UP: $(servers_up)"; exit 1; }
echo "haproxy $("$HAPROXY" -v | head -1 | awk '{print $3}') on $url: $(servers_up)"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

echo
echo "replicas: $REPLICAS, commit $commit, $MAX_TOKENS tokens a request, $DURATION s a level"
echo
echo "| replicas | clients | requests | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in $LEVELS; do
    "$PY" tools/loadtest.py --url "$url" -n "$n" -t "$DURATION" --max-tokens "$MAX_TOKENS" \
        --prompt-words "$PROMPT_WORDS" --json "$OUT/n$n.json" ${LOADTEST_ARGS:-} 2> "$OUT/n$n.err" |
        tail -1 | sed "s/^|/| $REPLICAS |/"
done

if [ "${NO_MT:-0}" != 1 ]; then
    echo
    # shellcheck disable=SC2086
    "$PY" bench/multiturn.py --url "$url" --mode balanced $MT_ARGS --json "$OUT/multiturn.json" |
        tail -n +2
    "$PY" - "$OUT/multiturn.json" <<'PYEOF'
import json, sys
rows = [r for level in json.load(open(sys.argv[1]))["on"].values() for r in level]
c = sum(r["cached_tokens"] for r in rows if r["turn"] > 1)
u = sum(r["reusable_tokens"] for r in rows if r["turn"] > 1)
print(f"\nmulti-turn through the balancer: {c} cached of {u} reusable prompt tokens after the "
      f"first turn: cached-token rate {c / u:.3f}" if u else "\nmulti-turn: nothing reusable")
PYEOF
fi

if [ "${KILL:-0}" = 1 ]; then
    echo
    echo "kill test: $KILL_CLIENTS clients for $DURATION s; replica 0 (pid ${pids[0]}) gets SIGKILL at $KILL_AT s"
    ( sleep "$KILL_AT"; kill -KILL "${pids[0]}"; echo "  killed replica 0 at $(date +%T)" ) &
    killer=$!
    "$PY" tools/loadtest.py --url "$url" -n "$KILL_CLIENTS" -t "$DURATION" --max-tokens "$MAX_TOKENS" \
        --prompt-words "$PROMPT_WORDS" --json "$OUT/kill.json" ${LOADTEST_ARGS:-} 2> "$OUT/kill.err" |
        tail -1 | sed "s/^|/| $REPLICAS (kill) |/"
    wait "$killer" || true
    echo "  errors (requests in flight on replica 0 when it died): $("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["errors"])' "$OUT/kill.json"); samples in $OUT/kill.err"
    echo "  haproxy after the kill: $(servers_up)"
    echo "  after the kill, every request must succeed:"
    "$PY" tools/loadtest.py --url "$url" -n "$KILL_CLIENTS" -t "$((DURATION / 3 + 1))" \
        --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --json "$OUT/after-kill.json" \
        ${LOADTEST_ARGS:-} 2> "$OUT/after-kill.err" | tail -1 | sed "s/^|/| $((REPLICAS - 1)) (after) |/"
    "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(1 if r["errors"] or not r["requests"] else 0)' \
        "$OUT/after-kill.json" && echo "  ok: no errors after the kill" || { echo "  FAILED: errors after the kill"; exit 1; }
fi
