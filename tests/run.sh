#!/usr/bin/env bash
# Runs every test and prints one closing line "N passed, N failed".
#   tests/run.sh          C tests (plain and ASan+UBSan builds), fuzz smoke runs, Python tests
#   tests/run.sh --gpu    GPU test binaries (build/cuda/tests/*)
# A test binary prints "PASS name" / "FAIL name" per test; a binary that crashes or exits non-zero
# without printing a FAIL line counts as one failure. Python tests run with the pytest of .venv.
set -u
cd "$(dirname "$0")/.."
pass=0
fail=0
log=build/test-logs
mkdir -p "$log"

run_bin() { # $1 = binary, $2 = label prefix
    local b=$1 p=$2 name out rc np nf
    name=$(basename "$b")
    out="$log/$p$name.log"
    "$b" >"$out" 2>&1
    rc=$?
    np=$(grep -c '^PASS ' "$out")
    nf=$(grep -c '^FAIL ' "$out")
    grep -E '^(FAIL )' "$out" | sed "s/^/  $p/"
    if [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ]; then
        nf=1
        echo "  ${p}$name: exited with status $rc"
        tail -n 20 "$out" | sed 's/^/    /'
    elif [ "$nf" -gt 0 ]; then
        grep -v -E '^(PASS|FAIL|#) ' "$out" | tail -n 30 | sed 's/^/    /'
    fi
    printf '%-40s %3d passed, %d failed\n' "$p$name" "$np" "$nf"
    pass=$((pass + np))
    fail=$((fail + nf))
}

if [ "${1:-}" = "--gpu" ]; then
    for b in build/cuda/tests/test_*; do [ -x "$b" ] && run_bin "$b" "gpu:"; done
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit
fi

for b in build/cpu/tests/test_*; do [ -x "$b" ] && run_bin "$b" ""; done
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for b in build/asan/tests/test_*; do [ -x "$b" ] && run_bin "$b" "asan:"; done

# Fuzz smoke runs (libFuzzer, clang): each target for FUZZ_TIME seconds; a crash is a failure.
if command -v clang >/dev/null 2>&1 && ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
    for src in tests/fuzz/fuzz_*.c; do
        t=$(basename "$src" .c)
        if ! make -s "build/fuzz/$t" >"$log/fuzz-build-$t.log" 2>&1; then
            echo "  fuzz:$t: build failed"; tail -n 20 "$log/fuzz-build-$t.log"; fail=$((fail + 1)); continue
        fi
        mkdir -p "build/fuzz/corpus-$t"
        seeds=""
        [ -d "tests/fuzz/corpus/$t" ] && seeds="tests/fuzz/corpus/$t"
        if "build/fuzz/$t" -max_total_time="${FUZZ_TIME:-20}" "build/fuzz/corpus-$t" $seeds >"$log/fuzz-$t.log" 2>&1; then
            printf '%-40s %3d passed, %d failed\n' "fuzz:$t" 1 0; pass=$((pass + 1))
        else
            echo "  fuzz:$t crashed:"; tail -n 30 "$log/fuzz-$t.log" | sed 's/^/    /'; fail=$((fail + 1))
        fi
    done
fi

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
