#!/usr/bin/env python3
"""Checks `tulip quantize` against MLX's own mx.quantize, bit for bit.

    python -m venv /tmp/mlxvenv && /tmp/mlxvenv/bin/pip install "mlx[cpu]==0.32.4"
    build/tulip quantize --in tests/data/tiny-a --out /tmp/qa [--group G --bits B]
    /tmp/mlxvenv/bin/python tools/check_mlx_quant.py tests/data/tiny-a /tmp/qa [--group G --bits B]

For every linear of the HF checkpoint that tulip quantized, quantizes the same bf16 weight with
mx.quantize (router and shared_expert_gate at 8 bits, as tulip and mlx-lm do) and compares the
packed words, scales and biases. Exit status 1 on any difference. Result on 2026-12-02 (mlx 0.32.4,
CPU device): tiny-a g64 4-bit 45/45 identical, tiny-a g64 8-bit 45/45, tiny-b g32 4-bit 60/60
(notes/2026-12-02-mlx-affine-quantize.md).
"""
import argparse
import sys

import mlx.core as mx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("mlx_dir")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--bits", type=int, default=4)
    a = ap.parse_args()
    src = mx.load(a.hf_dir + "/model.safetensors")
    out = {}
    import glob
    for f in glob.glob(a.mlx_dir + "/*.safetensors"):
        out.update(mx.load(f))
    pre = "model.language_model."
    ok = bad = 0
    for name, w in src.items():
        if w.ndim < 2 or "conv1d" in name:
            continue
        if name == "lm_head.weight":
            pairs = [(w, "language_model.lm_head")]
        elif name.startswith(pre):
            base = name[len(pre):]
            dst = "language_model.model."
            if base.endswith("experts.gate_up_proj"):
                ff = w.shape[1] // 2
                m = dst + base.replace("experts.gate_up_proj", "switch_mlp.")
                pairs = [(w[:, :ff, :], m + "gate_proj"), (w[:, ff:, :], m + "up_proj")]
            elif base.endswith("experts.down_proj"):
                pairs = [(w, dst + base.replace("experts.down_proj", "switch_mlp.down_proj"))]
            elif base.endswith(".weight"):
                pairs = [(w, dst + base[: -len(".weight")])]
            else:
                continue
        else:
            continue
        for x, m in pairs:
            if m + ".scales" not in out:
                continue  # left unquantized (input width not a multiple of the group)
            bits = 8 if m.endswith("mlp.gate") or m.endswith("shared_expert_gate") else a.bits
            wq, s, b = mx.quantize(x, group_size=a.group, bits=bits)
            same = all(mx.array_equal(p, out[m + suf]).item()
                       for p, suf in ((wq, ".weight"), (s, ".scales"), (b, ".biases")))
            if same:
                ok += 1
            else:
                bad += 1
                print("DIFFERENT:", m)
    print(f"{ok} identical, {bad} different (mlx {mx.__version__}, {mx.default_device()})")
    return 1 if bad or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
