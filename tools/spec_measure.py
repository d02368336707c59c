#!/usr/bin/env python3
"""Measures speculative decoding on a checkpoint with an MTP head (made for the trained tiny model
of tools/train_tiny_mtp.py, works on any): the head's acceptance per draft position on real text,
and the end-to-end decode speed with and without --speculative-tokens K.

  python3 tools/spec_measure.py --model DIR [--backend cpu|cuda] [--k 1,2,3] [--gen 128]
                                [--prompts 8] [--bench-lengths 64,512] [--tulip build/tulip]

1. acceptance: greedy `tulip run --raw` from --prompts passages of the held-out end of the
   training corpus (train_tiny_mtp.held_out_prompts: the same text on the same Python), --gen
   tokens each, for every K; the counters `tulip run` prints on stderr are summed over the prompts.
   Position i's rate is accepted_i / drafted_i: of the verify steps that drafted i tokens or
   more, the share whose first i drafts were all accepted (vLLM's per-position counter divided
   by the drafts). The greedy ids must equal those of K = 0 (checked: speculation is lossless).
2. speed: `tulip bench --greedy --json` (random prompt ids of each length, --gen decode steps,
   batch 1, median of 3) for K = 0 and every K; speedup = decode tok/s over K = 0's.
Prints one markdown table per part, ready for BENCHMARKS.md.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_tiny_mtp as ttm  # noqa: E402

SPEC_RE = re.compile(r"speculation: (\d+) steps drafted (\d+) tokens, (\d+) accepted "
                     r"\([0-9.]+%\); accepted by draft position:((?: \d+: \d+/\d+)+)")


def tulip(args, cmd):
    r = subprocess.run([args.tulip, *cmd], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])} ...: exit {r.returncode}\n{r.stderr}")
    return r


def acceptance(args, ks):
    """K -> (steps, drafted, accepted, [(accepted_i, drafted_i)])."""
    base = ["run", "--model", args.model, "--allow-test-shape", "--backend", args.backend,
            "--raw", "--temperature", "0", "--print-ids", "--ignore-eos", "-n", str(args.gen)]
    res = {}
    plain = [tulip(args, base + ["-p", p]).stdout.split("\n")[0] for p in args.texts]
    for k in ks:
        tot = [0, 0, 0]
        pos = [[0, 0] for _ in range(k)]
        for p, want in zip(args.texts, plain):
            r = tulip(args, base + ["-p", p, "--speculative-tokens", str(k)])
            if r.stdout.split("\n")[0] != want:
                raise SystemExit(f"K={k}: greedy ids differ from K=0 on prompt {p[:40]!r}")
            m = SPEC_RE.search(r.stderr)
            if not m:
                raise SystemExit(f"K={k}: no speculation line on stderr:\n{r.stderr}")
            for j in range(3):
                tot[j] += int(m[j + 1])
            for i, (a, d) in enumerate(re.findall(r"\d+: (\d+)/(\d+)", m[4])):
                pos[i][0] += int(a)
                pos[i][1] += int(d)
        res[k] = (tot, pos)
    return res


def speed(args, ks):
    """K -> {ctx: decode tok/s} from tulip bench."""
    out = {}
    for k in [0] + ks:
        r = tulip(args, ["bench", "--model", args.model, "--allow-test-shape", "--backend",
                         args.backend, "--greedy", "--json", "--lengths", args.bench_lengths,
                         "--gen", str(args.gen), "--speculative-tokens", str(k)])
        j = json.loads(r.stdout)
        out[k] = {row["ctx"]: row for row in j["rows"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--k", default="1,2,3", help="draft token counts to measure")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--bench-lengths", default="64,512")
    ap.add_argument("--tulip", default=os.path.join(ttm.REPO, "build", "tulip"))
    args = ap.parse_args()
    ks = [int(x) for x in args.k.split(",")]
    args.texts = ttm.held_out_prompts(args.prompts)
    acc = acceptance(args, ks)
    print(f"## MTP acceptance, {args.model}, backend {args.backend}: greedy, {len(args.texts)} "
          f"held-out corpus passages, {args.gen} tokens each\n")
    print("| K | verify steps | drafted | accepted | tokens per step | "
          + " | ".join(f"pos {i + 1}" for i in range(max(ks))) + " |")
    print("|---:" * (5 + max(ks)) + "|")
    for k in ks:
        (steps, dr, ac), pos = acc[k]
        cells = [f"{a / d:.3f} ({a}/{d})" if d else "-" for a, d in pos]
        cells += [""] * (max(ks) - k)
        print(f"| {k} | {steps} | {dr} | {ac} | {(steps + ac) / max(steps, 1):.2f} | "
              + " | ".join(cells) + " |")
    sp = speed(args, ks)
    lengths = sorted(sp[0])
    print(f"\n## Decode speed, tulip bench --greedy, batch 1, {args.gen} tokens "
          f"(random prompt ids)\n")
    print("| K | " + " | ".join(f"ctx {L}: tok/s (speedup, acceptance)" for L in lengths) + " |")
    print("|---:" * (1 + len(lengths)) + "|")
    for k in [0] + ks:
        cells = []
        for L in lengths:
            row, base = sp[k][L], sp[0][L]["gen_tps"]
            extra = f", {row['spec_acceptance']:.2f}" if k else ""
            cells.append(f"{row['gen_tps']:.1f} ({row['gen_tps'] / base:.2f}x{extra})")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
