#!/usr/bin/env bash
# Runs every test and prints one closing line "N passed, N failed".
#   tests/run.sh          C tests (plain and ASan+UBSan builds), fuzz smoke runs, Python tests
#   tests/run.sh --gpu    GPU test binaries (build/cuda/tests/*)
# A test binary prints "PASS name" / "FAIL name" per test; a binary that crashes or exits non-zero
# without printing a FAIL line counts as one failure. Binaries and fuzz runs share a pool of
# TEST_JOBS jobs (default: the CPU count; the GPU binaries run one at a time). Python tests run
# with the pytest of .venv.
set -u
cd "$(dirname "$0")/.."
pass=0
fail=0
log=build/test-logs
mkdir -p "$log"

# Test binaries and fuzz runs go through a pool of TEST_JOBS (default: the CPU count) jobs, each
# writing its log and exit status under $log; the results are then reported in a fixed order.
JOBS=${TEST_JOBS:-$(nproc)}
started=() # "kind|label|log" in report order

start_job() { # $1 = label, $2 = log file, then the command
    local label=$1 out=$2
    shift 2
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    rm -f "$out.rc"
    ( "$@" >"$out" 2>&1; echo $? >"$out.rc" ) &
    started+=("$label|$out")
}

report_bin() { # $1 = label, $2 = log; PASS/FAIL lines counted, a crash without FAIL counts one
    local p=$1 out=$2 rc np nf
    rc=$(cat "$out.rc" 2>/dev/null || echo 1)
    np=$(grep -c '^PASS ' "$out")
    nf=$(grep -c '^FAIL ' "$out")
    grep -E "^FAIL " "$out" | sed "s/^/  $p: /"
    if [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ]; then
        nf=1
        echo "  $p: exited with status $rc"
        tail -n 20 "$out" | sed 's/^/    /'
    elif [ "$nf" -gt 0 ]; then
        grep -v -E '^(PASS|FAIL|#) ' "$out" | tail -n 30 | sed 's/^/    /'
    fi
    printf '%-40s %3d passed, %d failed\n' "$p" "$np" "$nf"
    pass=$((pass + np))
    fail=$((fail + nf))
}

report_fuzz() { # $1 = label, $2 = log; one pass when the run ended without a crash
    local p=$1 out=$2
    if [ "$(cat "$out.rc" 2>/dev/null || echo 1)" -eq 0 ]; then
        printf '%-40s %3d passed, %d failed\n' "$p" 1 0; pass=$((pass + 1))
    else
        echo "  $p crashed:"; tail -n 30 "$out" | sed 's/^/    /'; fail=$((fail + 1))
    fi
}

report_all() {
    local e label out
    wait
    for e in "${started[@]}"; do
        label=${e%%|*}; out=${e#*|}
        case $label in
            fuzz:*) report_fuzz "$label" "$out" ;;
            *) report_bin "$label" "$out" ;;
        esac
    done
    started=()
}

if [ "${1:-}" = "--gpu" ]; then
    for b in build/cuda/tests/test_*; do
        [ -x "$b" ] || continue
        JOBS=1 start_job "gpu:$(basename "$b")" "$log/gpu:$(basename "$b").log" "$b"
    done
    report_all
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit
fi

# Fuzz targets (libFuzzer, clang) are built first, all together; each then runs for FUZZ_TIME
# seconds in the pool, and a crash is a failure.
fuzzers=()
built=()
if command -v clang >/dev/null 2>&1 && ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
    for src in tests/fuzz/fuzz_*.c; do fuzzers+=("build/fuzz/$(basename "$src" .c)"); done
    make -s -k -j"$JOBS" "${fuzzers[@]}" >"$log/fuzz-build.log" 2>&1
    # which built, checked now: a source edited while the tests run must not count as a failure
    for f in "${fuzzers[@]}"; do make -s -q "$f" 2>/dev/null && built+=("$f"); done
fi

# The ASan builds first: they are the longest jobs.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for b in build/asan/tests/test_*; do
    [ -x "$b" ] && start_job "asan:$(basename "$b")" "$log/asan:$(basename "$b").log" "$b"
done
for f in "${fuzzers[@]}"; do
    t=$(basename "$f")
    if [[ " ${built[*]} " != *" $f "* ]]; then
        echo "  fuzz:$t: build failed"; grep -A3 -E "error|$t" "$log/fuzz-build.log" | head -n 20
        fail=$((fail + 1)); continue
    fi
    mkdir -p "build/fuzz/corpus-$t"
    seeds=()
    [ -d "tests/fuzz/corpus/$t" ] && seeds=("tests/fuzz/corpus/$t")
    start_job "fuzz:$t" "$log/fuzz-$t.log" "$f" -max_total_time="${FUZZ_TIME:-20}" \
        "build/fuzz/corpus-$t" "${seeds[@]}"
done
for b in build/cpu/tests/test_*; do
    [ -x "$b" ] && start_job "$(basename "$b")" "$log/$(basename "$b").log" "$b"
done
report_all

# Python tests: references (HF tokenizers, jinja2) and end-to-end server tests.
PY=.venv/bin/python
if [ -x "$PY" ] && ls tests/py/test_*.py >/dev/null 2>&1; then
    "$PY" -m pytest -q -p no:cacheprovider tests/py --junitxml="$log/pytest.xml" >"$log/pytest.log" 2>&1
    rc=$?
    tail -n 40 "$log/pytest.log" | grep -E 'FAILED|ERROR|passed|failed|error' | sed 's/^/  py: /'
    counts=$("$PY" - "$log/pytest.xml" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    t, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    print(t - f - e - sk, f + e)
except Exception:
    print(0, 1)
PYEOF
)
    np=${counts% *}; nf=${counts#* }
    if [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ]; then nf=1; tail -n 30 "$log/pytest.log"; fi
    printf '%-40s %3d passed, %d failed\n' "pytest" "$np" "$nf"
    pass=$((pass + np)); fail=$((fail + nf))
elif ls tests/py/test_*.py >/dev/null 2>&1; then
    echo "  pytest: .venv missing (run: bash .ci/run, or make venv)"; fail=$((fail + 1))
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
