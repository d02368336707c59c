"""tools/ncu_step_table.py (the per-kernel tables of bench/prefill_profile.sh) on a hand-written
ncu --csv log, tests/data/ncu/prefill_sample.csv. Expected rows are worked out by hand from the
values in the file: 7 launches, 5220.5 us in all --
  embed_row_kernel            ID 0, 5   10 us + 10 us       2 + 1 MB (ID 5: n/a)
  gemm_mma_kernel<4, 1, 4>    ID 1, 4   1.20 ms + 1,200 us  0.5 GB + 100 MB, 500 MB + 100 MB
  gemm_mma_kernel<4, 2, 4>    ID 2      800 us              300 MB
  conv1d_silu_kernel          ID 3      2,000 us            100 + 100 MB
  rms_norm_kernel<(int)256>   ID 6      500 ns              -
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ncu_step_table as nt  # noqa: E402

CSV = os.path.join(ROOT, "tests", "data", "ncu", "prefill_sample.csv")


def rows():
    with open(CSV, newline="") as f:
        return nt.parse(list(f))


def test_parse_units_and_separators():
    r = rows()
    assert [k[0] for k in r] == [0, 1, 2, 3, 4, 5, 6]
    t = {k[0]: m["gpu__time_duration.sum"] for k, m in r.items()}
    assert t == pytest.approx({0: 10, 1: 1200, 2: 800, 3: 2000, 4: 1200, 5: 10, 6: 0.5})
    k1 = list(r)[1]
    assert r[k1]["dram__bytes_read.sum"] == pytest.approx(0.5e9)
    assert "dram__bytes_read.sum" not in r[list(r)[5]]  # "n/a" is skipped
    assert k1[2:] == ("(64, 16, 1)", "(256, 1, 1)")  # grid, block


def test_kernel_names():
    assert nt.kernel_name("void gemm_mma_kernel<4, 1, 4>(const float *, int)") == "gemm_mma_kernel"
    assert nt.kernel_name("void gemm_mma_kernel<4, 1, 4>(const float *, int)", True) == "gemm_mma_kernel<4, 1, 4>"
    assert nt.kernel_name("void rms_norm_kernel<(int)256>(float *)", True) == "rms_norm_kernel<(int)256>"
    assert nt.kernel_name("attn_prefill_kernel", True) == "attn_prefill_kernel"


def test_prefill_table_all_kernels_ms_templates():
    r = rows()
    lines = nt.table(nt.group(r, nt.select(r, all_kernels=True), templates=True), ms=True)
    assert lines[0] == "| kernel | calls | ms | share | DRAM GB | GB/s |"
    assert lines[2:] == [
        "| gemm_mma_kernel<4, 1, 4> | 2 | 2.40 | 46.0% | 1.20 | 500 |",
        "| conv1d_silu_kernel | 1 | 2.00 | 38.3% | 0.20 | 100 |",
        "| gemm_mma_kernel<4, 2, 4> | 1 | 0.80 | 15.3% | 0.30 | 375 |",
        "| embed_row_kernel | 2 | 0.02 | 0.4% | 0.00 | 150 |",
        "| rms_norm_kernel<(int)256> | 1 | 0.00 | 0.0% | 0.00 | 0 |",
        "| total (7 kernels) | | 5.22 | 100% | 1.70 | 326 |",
    ]


def test_top_folds_the_rest_and_names_group():
    r = rows()
    lines = nt.table(nt.group(r, nt.select(r, all_kernels=True), templates=True), ms=True, top=2)
    assert lines[4] == "| the rest (3 kernels by name) | 4 | 0.82 | 15.7% | 0.30 | 369 |"
    assert lines[5].startswith("| total (7 kernels) | | 5.22 |")
    g = nt.group(r, nt.select(r, all_kernels=True))  # without templates: one gemm_mma_kernel row
    assert list(g.items())[0] == ("gemm_mma_kernel", [3, pytest.approx(3200), pytest.approx(1.5e9)])


def test_decode_step_table_from_the_last_embed():
    r = rows()
    step = nt.select(r)  # from the last embed_row_kernel (ID 5) to the end
    assert [k[0] for k in step] == [5, 6]
    lines = nt.table(nt.group(r, step))
    assert lines[2] == "| embed_row_kernel | 1 | 10.0 | 10.00 | 95.2% | 0.0 | 0 |"
    assert lines[-1] == "| total (2 kernels) | | 10.5 | | 100% | 0.0 | 0 |"


def test_unknown_time_unit_is_an_error():
    lines = open(CSV).read().replace('"usecond","800"', '"furlong","800"').splitlines(True)
    with pytest.raises(ValueError, match="furlong"):
        nt.parse(lines)


def test_cli(tmp_path):
    py = sys.executable
    r = subprocess.run([py, os.path.join(ROOT, "tools", "ncu_step_table.py"), CSV, "--all", "--ms", "--templates",
                        "--top", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[2] == "| gemm_mma_kernel<4, 1, 4> | 2 | 2.40 | 46.0% | 1.20 | 500 |" and len(out) == 7
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== Disconnected from process 1\n")
    r = subprocess.run([py, os.path.join(ROOT, "tools", "ncu_step_table.py"), str(empty), "--all"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "no ncu CSV rows" in r.stderr


def test_short_unit_names():
    # ncu 2025+ writes "ns" / "byte" (the H200's ncu did): the same values as the long names
    lines = open(CSV).read().replace('"usecond","800"', '"ns","800000"').splitlines(True)
    t = {k[0]: m["gpu__time_duration.sum"] for k, m in nt.parse(lines).items()}
    assert t[2] == pytest.approx(800)


def test_grid_groups_the_launch_shapes_apart():
    r = rows()
    g = nt.group(r, nt.select(r, all_kernels=True), templates=True, grid=True)
    # embed_row_kernel ran on two grids (IDs 0 and 5): two rows; gemm<4, 1, 4> on one
    assert g["embed_row_kernel grid (4096, 1, 1)"][0] == 1
    assert g["embed_row_kernel grid (2048, 1, 1)"][0] == 1
    assert g["gemm_mma_kernel<4, 1, 4> grid (64, 16, 1)"] == [2, pytest.approx(2400), pytest.approx(1.2e9)]
    assert len(g) == 6
