#!/usr/bin/env bash
# Per-kernel table of ONE prefill of L tokens (issue 13), or of one decode step of B sequences
# (issue 12), under ncu. Run on the GPU machine from the repository root with a CUDA build:
# `tulip bench --random-weights` with the smallest run that holds the step (one length, one
# repeat, --greedy) and --profile-range, which brackets exactly that step with
# cudaProfilerStart/Stop; ncu --profile-from-start off profiles only the launches in between (each
# kernel serialised and timed alone: the sum is device time without launch gaps), and
# tools/ncu_step_table.py --all turns its CSV into the table (kernel, calls, ms, share, DRAM GB,
# GB/s), slowest first, kernels grouped by name with template arguments. Settings (environment):
#   MODE     prefill (default) or decode
#   L        prompt length (prefill) or context of every sequence (decode); default 4096
#   B        decode: sequences decoding together (default 1)
#   ARGS     bench arguments (default "--random-weights --bits 4"; --bits 16 for bf16)
#   TULIP    the binary (default build/cuda/tulip)
#   TOP      rows before "the rest" (default 12)
#   GRID     1: one row per kernel and launch grid (a MoE's gate/up apart from its down)
#   OUT      where ncu.csv, bench.txt and table.md go (default /tmp/prefill-profile)
#   NCU      ncu binary (default: ncu on PATH); NCU=none, or no ncu found, uses the CUDA-events
#            fallback: bench --prof-prefill / --prof (an event after every launch of an eager
#            step; launch gaps included, so the shares are of wall time on the GPU)
# Any TL_* switch in the environment passes through (e.g. TL_CUDA_NO_PREFILL_GEMM=1).
set -u
MODE=${MODE:-prefill}
L=${L:-4096}
B=${B:-1}
TULIP=${TULIP:-build/cuda/tulip}
ARGS=${ARGS:---random-weights --bits 4}
O=${OUT:-/tmp/prefill-profile}
NCU=${NCU:-$(command -v ncu || echo none)}
mkdir -p "$O"
case $MODE in
prefill) run="--lengths $L --gen 1 --repeats 1 --greedy"; what="one prefill of $L tokens"
    range=prefill; events=--prof-prefill ;;
decode) run="--lengths $L --gen 3 --repeats 1 --greedy --batch $B"
    what="one decode step of $B sequences at context $L"; range=decode; events=--prof ;;
*) echo "MODE must be prefill or decode, not '$MODE'" >&2; exit 2 ;;
esac
echo "# $what; $TULIP bench $ARGS $run; $(git log -1 --format='commit %h' 2>/dev/null)"
if [ "$NCU" = none ]; then
    echo "# ncu not found (or NCU=none): CUDA-events fallback ($events)"
    # shellcheck disable=SC2086
    "$TULIP" bench $ARGS $run $events >"$O/bench.txt" 2>&1
    rc=$?
    sed -n '/^per-kernel time/,/^$/p;/^| kernel/,/^| total/p' "$O/bench.txt" | grep '^|' | tee "$O/table.md"
    [ $rc -eq 0 ] || { echo "bench failed (rc $rc):"; tail -5 "$O/bench.txt"; }
    exit $rc
fi
# shellcheck disable=SC2086
"$NCU" --profile-from-start off --clock-control none --csv --log-file "$O/ncu.csv" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    "$TULIP" bench $ARGS $run --profile-range $range >"$O/bench.txt" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    echo "ncu / bench failed (rc $rc):"; tail -8 "$O/bench.txt" "$O/ncu.csv" 2>/dev/null; exit $rc
fi
grid=
[ "${GRID:-0}" = 1 ] && grid=--grid
# shellcheck disable=SC2086
python3 tools/ncu_step_table.py "$O/ncu.csv" --all --templates $grid --ms --top "${TOP:-12}" |
    tee "$O/table.md"
