#!/usr/bin/env python3
"""Compares two MLX checkpoints tensor by tensor: names, shapes, dtypes and bytes.

Used to check `tulip quantize` against mlx-lm's own converter on a tiny fixture:

    /tmp/mlxvenv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"
    /tmp/mlxvenv/bin/python -m mlx_lm convert --hf-path tests/data/tiny-a --mlx-path /tmp/ref -q
    build/tulip quantize --in tests/data/tiny-a --out /tmp/ours
    /tmp/mlxvenv/bin/python tools/check_mlx_convert.py /tmp/ref /tmp/ours

Result on 2026-12-02: all 166 tensors of tiny-a identical (notes/2026-12-02-mlx-affine-quantize.md).
Exit status 1 on any difference.
"""
import glob
import sys

import mlx.core as mx


def load(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        out.update(mx.load(f))
    return out


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    bad = 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print("only in", sys.argv[1] if k in a else sys.argv[2], k)
            bad += 1
        elif a[k].shape != b[k].shape or a[k].dtype != b[k].dtype:
            print("shape/dtype", k, a[k].shape, a[k].dtype, b[k].shape, b[k].dtype)
            bad += 1
        elif not mx.array_equal(a[k], b[k]).item():
            print("values", k)
            bad += 1
    print(f"{len(a)} vs {len(b)} tensors, {bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
