#!/usr/bin/env python3
"""Where one kernel's time goes inside its code, from ncu's SASS source page.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` for ONE profiled kernel
(a report from `ncu --set full --import-source yes ...`; other lines, such as ==PROF== ones, are
skipped), and optionally the CSV of `ncu -i REPORT --page raw --csv` (--raw) for the stall
reasons of its kernels. Prints:
  - the totals: SASS lines, warp instructions executed, stall samples;
  - the opcode mix (share of executed instructions by opcode, predicates and modifiers dropped);
  - the runs: maximal runs of consecutive SASS lines with the same execution count (a basic
    block, or blocks that run equally often: a loop body shows as one run executed trips x warps
    times), each with its share of the stall samples, those at or above --min-share percent;
  - the --top SASS lines by stall samples;
  - with --raw: each kernel's duration and its stall reasons (smsp__pcsamp_warps_issue_stalled_*,
    the not-issued variants left out), largest first.
A run of lines is how session 17 found the MoE GEMM's tile search (one run of 10 lines executed
8 times a warp, 16% of the samples) and the dense GEMM's loop (59%).
Usage: tools/ncu_sass_profile.py source.csv [--raw raw.csv] [--top N] [--min-share P]
"""
import argparse
import csv
import sys

STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


def number(text):
    """ncu's numbers may carry thousands separators; empty or non-numeric cells count 0."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def header(rows, column, page):
    """(index, row) of the first CSV row holding the column name; ValueError naming the page
    when none does (ncu's ==PROF== lines and the like come before it)."""
    for i, r in enumerate(rows):
        if column in r:
            return i, r
    raise ValueError(f"no ncu {page} header (a '{column}' column) in the input")


def parse_source(lines):
    """Source-page CSV lines -> [(sass text, instructions executed, stall samples)] in address
    order. Raises ValueError when no header with Source, Instructions Executed and Warp Stall
    Sampling (All Samples) columns is found."""
    rows = list(csv.reader(lines))
    i, head = header(rows, "Source", "source-page")

    def column(prefix):
        for j, c in enumerate(head):
            if c.startswith(prefix):
                return j
        raise ValueError(f"the source page has no '{prefix}' column")

    src, ie, st = head.index("Source"), column("Instructions Executed"), column("Warp Stall Sampling (All")
    out = []
    for r in rows[i + 1:]:
        if len(r) != len(head):
            continue
        out.append((r[src].strip(), number(r[ie]), number(r[st])))
    return out


def opcode(sass):
    """'@!P1 LDS.128 R4, [R2]' -> 'LDS'."""
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def opcode_mix(lines):
    """{opcode: share of executed instructions}, largest first."""
    total = sum(e for _, e, _ in lines) or 1.0
    mix = {}
    for s, e, _ in lines:
        mix[opcode(s)] = mix.get(opcode(s), 0.0) + e
    return dict(sorted(((k, v / total) for k, v in mix.items()), key=lambda kv: -kv[1]))


def runs(lines):
    """Maximal runs of consecutive lines with equal execution counts:
    [(first index, last index, execution count, stall samples)]."""
    out = []
    for i, (_, e, st) in enumerate(lines):
        if out and out[-1][2] == e:
            f, _, _, s = out[-1]
            out[-1] = (f, i, e, s + st)
        else:
            out.append((i, i, e, st))
    return out


def stall_reasons(lines):
    """Raw-page CSV lines (a header row, a units row, a row per kernel) -> [(kernel name,
    duration with its unit, {reason: share of the kernel's stall samples})], one per kernel."""
    rows = [r for r in csv.reader(lines) if r]
    i, head = header(rows, "Kernel Name", "raw-page")
    out, unit = [], ""
    for r in rows[i + 1:]:
        if len(r) != len(head):
            continue
        d = dict(zip(head, r))
        if not d["Kernel Name"].strip():  # the units row
            unit = d.get("gpu__time_duration.sum", "")
            continue
        st = {k[len(STALL_PREFIX):]: number(v) for k, v in d.items()
              if k.startswith(STALL_PREFIX) and not k.endswith("_not_issued")}
        total = sum(st.values()) or 1.0
        shares = dict(sorted(((k, v / total) for k, v in st.items()), key=lambda kv: -kv[1]))
        out.append((d["Kernel Name"], f"{d.get('gpu__time_duration.sum', '?')} {unit}".strip(), shares))
    return out


def report(lines, top, min_share, out):
    ins = sum(e for _, e, _ in lines)
    stalls = sum(s for _, _, s in lines) or 1.0
    print(f"{len(lines)} SASS lines, {ins:.0f} warp instructions executed, {stalls:.0f} stall samples",
          file=out)
    mix = opcode_mix(lines)
    print("opcodes: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in list(mix.items())[:20]), file=out)
    print(f"runs of lines with one execution count, >= {min_share}% of the stall samples:", file=out)
    print("| lines | executed | stall share | first line |\n|---|---:|---:|---|", file=out)
    for f, last, e, s in runs(lines):
        if s / stalls * 100 >= min_share:
            print(f"| {f}..{last} | {e:.0f} | {s / stalls * 100:.1f}% | `{lines[f][0][:60]}` |", file=out)
    print(f"the {top} lines with the most stall samples:", file=out)
    order = sorted(range(len(lines)), key=lambda i: -lines[i][2])[:top]
    for i in order:
        s, e, st = lines[i]
        print(f"  {i:5d}  executed {e:9.0f}  stalls {st:6.0f}  {s[:80]}", file=out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", help="CSV of ncu --page source --csv --print-source sass")
    ap.add_argument("--raw", help="CSV of ncu --page raw --csv (stall reasons)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--min-share", type=float, default=1.0, help="percent of the stall samples")
    a = ap.parse_args(argv)
    try:
        with open(a.source, newline="") as f:
            lines = parse_source(list(f))
        if a.raw:
            with open(a.raw, newline="") as f:
                kernels = stall_reasons(list(f))
    except (OSError, ValueError) as e:
        print(f"ncu_sass_profile: {e}", file=sys.stderr)
        return 1
    if not lines:
        print("ncu_sass_profile: the source page has no SASS lines", file=sys.stderr)
        return 1
    report(lines, a.top, a.min_share, sys.stdout)
    if a.raw:
        for name, dur, shares in kernels:
            print(f"{name[:70]}: {dur}; " +
                  ", ".join(f"{k} {v * 100:.0f}%" for k, v in list(shares.items())[:9]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
