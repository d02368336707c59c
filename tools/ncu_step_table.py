#!/usr/bin/env python3
"""Per-kernel table of one decode step from an ncu CSV (ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum ...).

The step is taken as the kernels from the last launch whose name contains --first (default
embed_row_kernel, the first kernel of a forward) to the end of the log. Each kernel is timed by
ncu alone (serialised, caches flushed per kernel by default, no launch gaps), so the sum is the
device time of the step without launch overhead; the table groups kernels by name.
Usage: tools/ncu_step_table.py ncu.csv [--first NAME]
"""
import csv
import sys
from collections import OrderedDict


def main():
    path = sys.argv[1]
    first = "embed_row_kernel"
    if "--first" in sys.argv:
        first = sys.argv[sys.argv.index("--first") + 1]
    rows = OrderedDict()
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        k = (int(r["ID"]), r["Kernel Name"], r["Grid Size"], r["Block Size"])
        v = r["Metric Value"].replace(",", "")
        try:
            val = float(v)
        except ValueError:
            continue
        unit = r["Metric Unit"]
        if r["Metric Name"] == "gpu__time_duration.sum":
            val *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1.0)
        else:
            val *= {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1.0)
        rows.setdefault(k, {})[r["Metric Name"]] = val
    ks = list(rows.keys())
    start = max((i for i, k in enumerate(ks) if first in k[1]), default=0)
    step = ks[start:]
    groups = OrderedDict()
    for k in step:
        name = k[1].split("(")[0].split("<")[0].replace("void ", "")
        m = rows[k]
        g = groups.setdefault(name, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += m.get("gpu__time_duration.sum", 0.0)
        g[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    tot = sum(g[1] for g in groups.values())
    totb = sum(g[2] for g in groups.values())
    print("| kernel | calls | us | us/call | share | DRAM MB | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (n, us, b) in sorted(groups.items(), key=lambda x: -x[1][1]):
        print(f"| {name} | {n} | {us:.1f} | {us / n:.2f} | {100 * us / tot:.1f}% | {b / 1e6:.1f} | {b / 1e3 / us if us else 0:.0f} |")
    print(f"| total ({len(step)} kernels) | | {tot:.1f} | | 100% | {totb / 1e6:.1f} | {totb / 1e3 / tot if tot else 0:.0f} |")


if __name__ == "__main__":
    main()
