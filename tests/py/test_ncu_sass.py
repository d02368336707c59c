"""tools/ncu_sass_profile.py on hand-written ncu CSVs: tests/data/ncu/sass_sample.csv (a source page
of 7 SASS lines) and raw_sample.csv (two kernels' stall reasons). Worked out by hand:
  instructions 100 + 100 + 800 + 800 + 1,600 + 1,600 + 100 = 5,100; stall samples 100
  runs of equal execution counts: lines 0..1 (100, 3 samples), 2..3 (800, 40), 4..5 (1,600, 56),
  6 (100, 1)
  kernel 0's reasons without the not-issued column: barrier 20, long_scoreboard 60, selected 20
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ncu_sass_profile as sp  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "ncu")
SRC, RAW = os.path.join(DATA, "sass_sample.csv"), os.path.join(DATA, "raw_sample.csv")
TOOL = os.path.join(ROOT, "tools", "ncu_sass_profile.py")


def lines():
    with open(SRC, newline="") as f:
        return sp.parse_source(list(f))


def test_parse_source():
    ls = lines()
    assert len(ls) == 7
    assert sum(e for _, e, _ in ls) == 5100  # "1,600" read with its separator
    assert sum(s for _, _, s in ls) == 100
    assert ls[3] == ("@!P0 BRA 0x100", 800, 10)


def test_runs_and_opcodes():
    assert sp.runs(lines()) == [(0, 1, 100, 3), (2, 3, 800, 40), (4, 5, 1600, 56), (6, 6, 100, 1)]
    assert sp.opcode("@!P0 BRA 0x100") == "BRA" and sp.opcode("LDS.128 R4, [R2]") == "LDS"
    mix = sp.opcode_mix(lines())
    assert list(mix)[:2] == ["LDS", "HMMA"] and mix["LDS"] == pytest.approx(1600 / 5100)
    assert sum(mix.values()) == pytest.approx(1.0)


def test_stall_reasons():
    with open(RAW, newline="") as f:
        k = sp.stall_reasons(list(f))
    assert [n for n, _, _ in k] == ["void k<1>(int)", "void k2(int)"]
    name, dur, shares = k[0]
    assert dur == "27.5 usecond"
    assert shares == pytest.approx({"long_scoreboard": 0.6, "barrier": 0.2, "selected": 0.2})
    assert list(shares)[0] == "long_scoreboard"
    assert all(v == 0 for v in k[1][2].values())  # no samples: shares 0, no division by zero


def test_cli(tmp_path):
    r = subprocess.run([sys.executable, TOOL, SRC, "--raw", RAW, "--min-share", "10", "--top", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "7 SASS lines, 5100 warp instructions executed, 100 stall samples" in out
    assert "| 4..5 | 1600 | 56.0% | `LDS.128 R4, [R2]` |" in out
    assert "| 2..3 | 800 | 40.0% |" in out
    assert "| 0..1 |" not in out  # 3% is under --min-share 10
    assert "stalls     40  LDS.128" in out and "stalls     16" not in out  # --top 2: 40 and 30
    assert "void k<1>(int): 27.5 usecond; long_scoreboard 60%" in out
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== Disconnected from process 1\n")
    r = subprocess.run([sys.executable, TOOL, str(empty)], capture_output=True, text=True)
    assert r.returncode == 1 and "no ncu source-page header" in r.stderr
