#!/usr/bin/env python3
"""Per-kernel table of one step from an ncu CSV (ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum ...).

The step is taken as the kernels from the last launch whose name contains --first (default
embed_row_kernel, the first kernel of a forward) to the end of the log; --all takes every kernel
in the CSV (a log of `ncu --profile-from-start off` around one step: tulip bench
--profile-range, bench/prefill_profile.sh). Each kernel is timed by ncu alone (serialised,
caches flushed per kernel by default, no launch gaps), so the sum is the device time of the step
without launch overhead; the table groups kernels by name (--templates: by name with template
arguments, gemm_mma_kernel<4, 1, 4> apart from gemm_mma_kernel<4, 2, 4>; --grid: also by launch
grid, so the calls of one kernel on different shapes -- a MoE's gate/up and down -- are rows of
their own), sorted by time.
--ms: the columns of issue 13 (kernel, calls, ms, share, DRAM GB, GB/s); --top N: the N slowest
groups, then one row for the rest.
Usage: tools/ncu_step_table.py ncu.csv [--first NAME | --all] [--templates] [--grid] [--ms] [--top N]
"""
import argparse
import csv
from collections import OrderedDict

# ncu spells units either way depending on its version ("nsecond" / "ns", "Kbyte" / "KB")
TIME_UNIT_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
                "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
BYTE_UNIT = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
             "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def parse(lines):
    """ncu --csv lines (others, such as ==PROF== lines, are skipped) -> OrderedDict
    {(ID, kernel name, grid, block): {metric: value}}, times in us and byte counts in bytes."""
    rows = OrderedDict()
    for r in csv.DictReader([l for l in lines if l.startswith('"')]):
        k = (int(r["ID"]), r["Kernel Name"], r["Grid Size"], r["Block Size"])
        try:
            val = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        unit = r["Metric Unit"]
        if r["Metric Name"] == "gpu__time_duration.sum":
            if unit not in TIME_UNIT_US:
                raise ValueError(f"kernel {k[0]}: time unit {unit!r} not known")
            val *= TIME_UNIT_US[unit]
        else:
            val *= BYTE_UNIT.get(unit, 1.0)
        rows.setdefault(k, {})[r["Metric Name"]] = val
    return rows


def kernel_name(full, templates=False):
    """'void gemm_mma_kernel<4, 1, 4>(const float *, int)' -> 'gemm_mma_kernel' (templates:
    'gemm_mma_kernel<4, 1, 4>'): the argument list (the first '(' outside template brackets) and
    a leading 'void ' dropped."""
    name = full[5:] if full.startswith("void ") else full
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            name = name[:i]
            break
    name = name.strip()
    return name if templates else name.split("<")[0]


def select(rows, first="embed_row_kernel", all_kernels=False):
    """The kernels of the step: all of them, or from the last launch whose name contains first."""
    ks = list(rows.keys())
    if all_kernels:
        return ks
    start = max((i for i, k in enumerate(ks) if first in k[1]), default=0)
    return ks[start:]


def group(rows, step, templates=False, grid=False):
    """{name: [calls, us, DRAM bytes]} over the step's kernels, slowest first (grid: the name
    followed by ' grid (x, y, z)', one group per launch grid)."""
    groups = OrderedDict()
    for k in step:
        m = rows[k]
        name = kernel_name(k[1], templates) + (f" grid {k[2]}" if grid else "")
        g = groups.setdefault(name, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += m.get("gpu__time_duration.sum", 0.0)
        g[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    return OrderedDict(sorted(groups.items(), key=lambda x: -x[1][1]))


def table(groups, ms=False, top=None):
    """Markdown lines: us columns (the decode-step table) or ms columns (the prefill table)."""
    tot = sum(g[1] for g in groups.values())
    totb = sum(g[2] for g in groups.values())
    n_k = sum(g[0] for g in groups.values())
    items = list(groups.items())
    if top is not None and len(items) > top:
        rest = items[top:]
        items = items[:top] + [(f"the rest ({len(rest)} kernels by name)",
                                [sum(g[0] for _, g in rest), sum(g[1] for _, g in rest),
                                 sum(g[2] for _, g in rest)])]
    out = []
    if ms:
        out += ["| kernel | calls | ms | share | DRAM GB | GB/s |", "|---|---:|---:|---:|---:|---:|"]
        for name, (n, us, b) in items:
            out.append(f"| {name} | {n} | {us / 1e3:.2f} | {100 * us / tot:.1f}% | {b / 1e9:.2f} | "
                       f"{b / 1e3 / us if us else 0:.0f} |")
        out.append(f"| total ({n_k} kernels) | | {tot / 1e3:.2f} | 100% | {totb / 1e9:.2f} | "
                   f"{totb / 1e3 / tot if tot else 0:.0f} |")
        return out
    out += ["| kernel | calls | us | us/call | share | DRAM MB | GB/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, (n, us, b) in items:
        out.append(f"| {name} | {n} | {us:.1f} | {us / n:.2f} | {100 * us / tot:.1f}% | {b / 1e6:.1f} | "
                   f"{b / 1e3 / us if us else 0:.0f} |")
    out.append(f"| total ({n_k} kernels) | | {tot:.1f} | | 100% | {totb / 1e6:.1f} | "
               f"{totb / 1e3 / tot if tot else 0:.0f} |")
    return out


def main():
    ap = argparse.ArgumentParser(description="per-kernel table from an ncu --csv log")
    ap.add_argument("csv")
    ap.add_argument("--first", default="embed_row_kernel")
    ap.add_argument("--all", action="store_true", help="every kernel in the CSV")
    ap.add_argument("--templates", action="store_true", help="group by name with template arguments")
    ap.add_argument("--grid", action="store_true", help="one group per kernel name and launch grid")
    ap.add_argument("--ms", action="store_true", help="ms columns (issue 13's prefill table)")
    ap.add_argument("--top", type=int, help="the N slowest groups, then one row for the rest")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = parse(list(f))
    if not rows:
        raise SystemExit(f"{a.csv}: no ncu CSV rows (was the range empty, or ncu not run with --csv?)")
    groups = group(rows, select(rows, a.first, a.all), a.templates, a.grid)
    print("\n".join(table(groups, a.ms, a.top)))


if __name__ == "__main__":
    main()
