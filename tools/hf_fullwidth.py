#!/usr/bin/env python3
"""Full-width check of the CUDA engine against HF transformers, run ON THE GPU MACHINE.

transformers builds Qwen3_5MoeForCausalLM with every production dimension (hidden 2048, 16/2
attention heads of 256, 16/32 GDN heads of 128, 256 experts of 512 + shared, vocab 248320) but
--layers layers (pattern 3 GDN : 1 attention), random weights from --seed; saves it with
save_pretrained (text-only HF layout: "model.*", fused experts, zero-centred norms), which the
loader reads; computes the reference greedy continuation of a random prompt (fp32 math on the
bf16 weights, no cache: the full sequence is recomputed each step); runs
`build/cuda/tulip run --backend cuda --dump-logits` on the same prompt; compares, per step, the
logits (NMSE, max abs, top-1) and the greedy tokens.

Three tulip runs per model: the prompt through the decode kernels (TL_CUDA_NO_PREFILL_GEMM=1),
which keep the KV cache and nothing else in bf16 and accumulate in fp32 -- expected logits NMSE
~1e-6 against the fp32 reference; required: <= 1e-4 at every common step and identical greedy
tokens for all --steps steps (32 by default) unless they part at a reference near-tie (top-2
margin below the logit error measured before it) -- through the tensor-core prefill path ("gemm",
bf16 GEMM inputs), and with every decode step on the tensor-core decode path too (TL_CUDA_TC_MIN=1:
the batched-decode path, bf16 GEMM inputs).

The yardstick of the two bf16-GEMM modes is transformers' own bf16 forward (issue 13): on each seed
the same model with its weights in bf16 (4-bit: the dequantized weights rounded to bf16) runs the
reference's token sequence (prompt + reference greedy tokens, one causal forward: the logits at
each step see exactly the reference's context), and its NMSE against the fp32 reference is
measured at the same points as tulip's. Random 256-expert layers route chaotically (a bf16
rounding swaps a token's 8th and 9th expert), so bf16 arithmetic alone moves the logits by NMSE
1.5e-3 .. 2e-2 depending on the seed (measured on the H200, seeds 1-21); a fixed bound is either
too loose for most seeds or fails on a seed where transformers-bf16 fails it too. Required of the
GEMM modes: NMSE <= 2x transformers-bf16's at the same point (or <= 1e-4, the decode path's bound,
whichever is larger) -- after the prompt, and on the tensor-core decode run at every common decode
step as well; the top-1 after the prompt the reference's unless the reference's top-2 margin there
is below transformers-bf16's largest logit error at that point (a tie bf16 arithmetic cannot
resolve); greedy tokens part only at such a tie (margin below the largest tulip logit error before
that step or transformers-bf16's error at it). The decode path keeps its absolute bound. A layout
or dequantization error gives NMSE ~1, far outside every bound.

--seeds 1,2,3,5,7,11,13,21 checks every seed in one process (the model rebuilt, saved, quantized
and checked per seed, its directory under --out removed afterwards unless --keep) and prints one
table: seed, mode, point (after the prompt; the decode step with the worst ratio; the greedy
tokens), tulip NMSE, transformers-bf16 NMSE, their ratio, top-1 agreement, PASS/FAIL; then one
summary line "PASS hf_fullwidth: ..." or "FAIL hf_fullwidth: ...". --out/table.md gets the table,
--out/result.json the numbers.

4-bit (--bits 16,4, the default; --bits 16 is the bf16 check alone): `tulip quantize` turns the
saved checkpoint into the MLX affine format (docs/model.md §5.3: group 64, 4 bits for every linear and
the embedding, 8 bits for mlp.gate and mlp.shared_expert_gate, norms stored as 1+w in bf16,
conv1d as [C, K, 1], switch_mlp stacked experts, "language_model.model.*" names). This script
reads that directory back (its own safetensors reader), dequantizes every quantized matrix as the
engine does (w = scale * q + bias in fp32 per group of 64 columns, q the nibble/byte at bit
(c % (32/bits))*bits of word c/(32/bits), bf16 scales and biases widened to fp32), maps every
tensor back to its HF parameter (experts re-fused gate rows first, norms minus 1 -- exact in
fp32 --, conv1d reshaped) and checks that every parameter of the model was set exactly once; the
fp32 model with these values is the 4-bit reference, and the same two tulip runs on the quantized
directory are compared with the same bounds. Why the same bounds:
the engine's 4-bit kernels dequantize to exactly these values and accumulate in fp32, so against
this reference the only differences left are the ones of the bf16 check (fp32 order, the bf16 KV
cache, and on the GEMM path the bf16 GEMM inputs with their chaotic expert swaps); quantization
error itself, the 8-bit router's changed routing included, is inside the reference.

Local end-to-end run of the whole flow without a GPU (hidden test options: a reduced shape that
the CPU backend accepts with --allow-test-shape, torch on the CPU, `tulip run --backend cpu`):
    python3 tools/hf_fullwidth.py --out /tmp/fws --small --device cpu --backend cpu \
        --tulip build/cpu/tulip

usage: python3 tools/hf_fullwidth.py --out /tmp/fw [--layers 4] [--steps 32]
       [--seeds 1,2,3,5,7,11,13,21 | --seed 1] [--bits 16,4] [--keep]
"""
import argparse
import gc
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # the pure helpers (tests/py/test_hf_fullwidth_helpers.py) need no torch
    torch = None


def build_model(layers, seed, dev="cuda", small=False):
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    if small:  # test shape: production head dims and expert width, fewer heads/experts, small vocab
        cfg = Qwen3_5MoeTextConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=256, linear_num_key_heads=2, linear_num_value_heads=4,
                                   num_experts=16, num_experts_per_tok=4, vocab_size=2048)
    else:
        cfg = Qwen3_5MoeTextConfig()
    cfg.num_hidden_layers = layers
    cfg.layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    torch.manual_seed(seed)
    with torch.device(dev):
        model = Qwen3_5MoeForCausalLM(cfg)
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, device=dev, generator=g) * 15 + 1))
            elif name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, device=dev, generator=g) + 0.5)
            elif "conv1d" in name:
                p.copy_((torch.rand(p.shape, device=dev, generator=g) - 0.5))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, device=dev, generator=g))
            elif p.dim() == 1:  # zero-centred RMSNorm weights (used as 1 + w)
                p.copy_(0.1 * torch.randn(p.shape, device=dev, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, device=dev, generator=g))
    model = model.to(torch.bfloat16)
    return model, cfg


def reference(model, prompt, steps, dev="cuda"):
    """The fp32 reference: model converted to fp32 in place, greedy, the whole sequence
    recomputed each step (no cache). Returns (logits [steps, V] fp32, tokens)."""
    m32 = model.float().eval()
    seq = list(prompt)
    logits, toks = [], []
    with torch.no_grad():
        for _ in range(steps):
            out = m32(torch.tensor([seq], device=dev), use_cache=False)
            lg = out.logits[0, -1].float().cpu().numpy()
            t = int(lg.argmax())
            logits.append(lg)
            toks.append(t)
            seq.append(t)
    return np.stack(logits), toks


def hf_bf16_logits(model, prompt, ref_toks, dev="cuda"):
    """transformers' own bf16 forward, the yardstick of the GEMM modes: model converted to bf16 in
    place (weights that came from bf16 round-trip exactly; 4-bit: the dequantized fp32 weights
    rounded), one causal forward over prompt + the reference's greedy tokens; row s of the result
    is the logits after prompt + ref_toks[:s], the reference's context at step s."""
    m16 = model.to(torch.bfloat16).eval()
    seq = list(prompt) + list(ref_toks[:-1])
    with torch.no_grad():
        out = m16(torch.tensor([seq], device=dev), use_cache=False)
        lg = out.logits[0, len(prompt) - 1:].float().cpu().numpy()
    del out
    return lg


# ---- 4-bit: read tulip's MLX checkpoint back and dequantize it as the engine does ----

def read_safetensors(path, dev):
    """{name: torch tensor on dev}: BF16/F16/F32 as fp32, U32 (packed codes) as int32 bits."""
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            buf = bytearray(b - a)
            f.seek(8 + n + a)
            f.readinto(buf)
            dt = e["dtype"]
            if dt == "BF16":
                t = torch.from_numpy(np.frombuffer(buf, np.int16)).to(dev).view(torch.bfloat16)
            elif dt == "F16":
                t = torch.from_numpy(np.frombuffer(buf, np.float16)).to(dev)
            elif dt == "F32":
                t = torch.from_numpy(np.frombuffer(buf, np.float32)).to(dev)
            elif dt == "U32":
                t = torch.from_numpy(np.frombuffer(buf, np.int32)).to(dev)  # same bits
            else:
                raise ValueError(f"{path}: {name}: dtype {dt} not expected in a tulip quantize output")
            t = t.reshape(e["shape"])
            out[name] = t if dt == "U32" else t.float()
    return out


def dequantize(words, scales, biases, bits, group):
    """words int32 [..., rows, cols*bits/32]; value c at bit (c % (32/bits))*bits of word
    c/(32/bits); w = scale * q + bias (fp32 multiply, then add, as the CPU oracle does)."""
    per, mask = 32 // bits, (1 << bits) - 1
    cols = words.shape[-1] * per
    if scales.shape[-1] * group != cols:
        raise ValueError(f"{bits}-bit words for {cols} columns but {scales.shape[-1]} groups of {group}")
    q = torch.stack([(words >> (bits * k)) & mask for k in range(per)], dim=-1)  # [..., W, per]
    q = q.reshape(*words.shape[:-1], cols // group, group).float()
    w = q * scales.unsqueeze(-1)
    w += biases.unsqueeze(-1)
    return w.reshape(*words.shape[:-1], cols)


NORM1P = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
          "self_attn.k_norm.weight")


def load_dequantized(model, q_dir, dev):
    """Sets every parameter of the (fp32) HF model from tulip's quantized checkpoint in q_dir.
    Returns a one-line summary (counts and the relative squared change of the matrices)."""
    with torch.no_grad():
        return _load_dequantized(model, q_dir, dev)


def _load_dequantized(model, q_dir, dev):
    qcfg = json.load(open(os.path.join(q_dir, "config.json")))["quantization"]
    group, dbits = qcfg["group_size"], qcfg["bits"]
    st = {}
    for path in sorted(glob.glob(os.path.join(q_dir, "*.safetensors"))):
        st.update(read_safetensors(path, dev))
    params = dict(model.named_parameters())
    filled = {k: 0 for k in params}
    nq = {4: 0, 8: 0}
    num = den = 0.0

    def put(hf, val, rows=None):
        nonlocal num, den
        p = params[hf]
        dst = p if rows is None else p[:, rows[0]:rows[1]]
        if val.numel() != dst.numel():
            raise ValueError(f"{hf}{'' if rows is None else rows}: {tuple(val.shape)} for {tuple(dst.shape)}")
        val = val.reshape(dst.shape)
        if val.dim() >= 2 and "conv1d" not in hf:  # in chunks of rows: fp64 temporaries stay small
            step = max(1, (1 << 25) // max(1, dst[0].numel()))
            for i in range(0, dst.shape[0], step):
                o, v = dst[i:i + step].double(), val[i:i + step].double()
                num += float(((o - v) ** 2).sum())
                den += float((o * o).sum())
        dst.copy_(val)
        filled[hf] += val.numel()

    for name in sorted(st):
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        if not name.startswith("language_model."):
            raise ValueError(f"{q_dir}: unexpected tensor {name}")
        hf = name[len("language_model."):]  # "model.*" / "lm_head.weight": the text-only HF names
        t = st[name]
        if name.endswith(".weight") and name[:-7] + ".scales" in st:
            mod = name[:-7]
            ent = qcfg.get(mod)  # per-module override (router, shared_expert_gate: 8 bits)
            bits = ent["bits"] if isinstance(ent, dict) else dbits
            t = dequantize(t, st[mod + ".scales"], st[mod + ".biases"], bits, group)
            nq[bits] = nq.get(bits, 0) + 1
        elif t.dtype != torch.float32:
            raise ValueError(f"{name}: packed codes without scales")
        if ".mlp.switch_mlp." in hf:  # [E, out, in] each -> fused gate_up_proj (gate rows first)
            base = hf.split(".mlp.switch_mlp.")[0] + ".mlp.experts."
            ff = t.shape[1] if "down_proj" not in hf else None
            if hf.endswith("gate_proj.weight"):
                put(base + "gate_up_proj", t, (0, ff))
            elif hf.endswith("up_proj.weight"):
                put(base + "gate_up_proj", t, (ff, 2 * ff))
            else:
                put(base + "down_proj", t)
        elif hf.endswith(NORM1P) or hf == "model.norm.weight":
            put(hf, t - 1)  # stored 1+w (bf16); v - 1 is exact in fp32 and HF adds the 1 back
        else:
            put(hf, t)  # conv1d [C, K, 1] has the bytes of HF's [C, 1, K]; the rest as stored
        del t
    bad = [k for k, v in filled.items() if v != params[k].numel()]
    if bad:
        raise ValueError(f"{q_dir}: parameters not set exactly once: {bad[:8]} ({len(bad)})")
    return (f"{len(params)} parameters from {len(st)} tensors, {nq.get(4, 0)} matrices dequantized "
            f"at 4 bits and {nq.get(8, 0)} at 8, matrices moved by rel. sq. {num / den:.3e}")


# ---- the comparison: pure helpers (numpy only; tests/py/test_hf_fullwidth_helpers.py) ----

# Decode path (f32 GEMVs, the reference-exact path): NMSE <= 1e-4 at every common step (measured
# 2.3e-7 .. 4.8e-7, seeds 1-3, bf16 and 4-bit, 2026-12-03; seed 2 bf16 parted at step 16 at a
# 7.4e-4 margin with 2.6e-3 max error). The bound of the exact path is also the floor of the
# relative bound below: an NMSE the exact path may have is never a failure.
DECODE_BOUND = 1e-4
# GEMM modes (bf16 GEMM inputs): at most 2x transformers-bf16's NMSE at the same point (issue 13:
# transformers-bf16 measured 1.5e-3 .. 2.0e-2 after the 16-token prompt over seeds 1..21).
REL_FACTOR = 2.0
# (mode, environment of the tulip run, kind): the prompt through the decode kernels, through the
# tensor-core prefill path, and every decode step of batch 1 on the tensor-core decode path too
# (TL_CUDA_TC_MIN=1; by default it serves micro-batches of 3 tokens and more), bf16 GEMM inputs as on prefill
MODES = (("decode-path prefill", {"TL_CUDA_NO_PREFILL_GEMM": "1"}, "decode"),
         ("gemm-path prefill", {}, "gemm"),
         ("tensor-core decode", {"TL_CUDA_TC_MIN": "1"}, "tc"))


def parse_seeds(text):
    """"1,2,3" -> [1, 2, 3]: non-negative integers, each once, at least one; ValueError else."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--seeds {text!r}: {part!r} is not a non-negative integer")
        if int(part) in out:
            raise ValueError(f"--seeds {text!r}: seed {int(part)} given twice")
        out.append(int(part))
    return out


def nmse(got, ref):
    """sum((got - ref)^2) / sum(ref^2), in float64."""
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    den = float((r * r).sum())
    if not den > 0:
        raise ValueError("reference logits are all zero")
    return float(((g - r) ** 2).sum() / den)


def top2_margin(row):
    srt = np.sort(np.asarray(row, np.float64))
    return float(srt[-1] - srt[-2])


def rel_bound(hf_nmse):
    """The GEMM modes' NMSE bound at a point where transformers-bf16 measured hf_nmse."""
    return max(REL_FACTOR * hf_nmse, DECODE_BOUND)


def compare_steps(got, toks, ref_logits, ref_toks, hf_logits, steps):
    """Per compared step: tulip's and transformers-bf16's NMSE and largest |error| against the
    reference, top-1 agreement, the reference's top-2 margin. Steps are compared while tulip's
    context equals the reference's: up to and including the first step whose greedy token
    differs. Returns (points, first_div, noise): noise is tulip's largest |error| on the steps
    before first_div (all compared steps when the tokens never part)."""
    n = min(len(got), len(hf_logits), len(ref_logits), steps)
    points, first_div, noise = [], None, 0.0
    for s in range(n):
        if first_div is None and s < len(toks) and toks[s] != ref_toks[s]:
            first_div = s
        if first_div is not None and s > first_div:
            break  # the sequences differ from here on: logits are no longer comparable
        r = np.asarray(ref_logits[s], np.float64)
        g, h = np.asarray(got[s], np.float64), np.asarray(hf_logits[s], np.float64)
        p = {"step": s, "nmse": nmse(g, r), "hf_nmse": nmse(h, r),
             "max_err": float(np.abs(g - r).max()), "hf_max_err": float(np.abs(h - r).max()),
             "top1": int(g.argmax()) == int(r.argmax()), "hf_top1": int(h.argmax()) == int(r.argmax()),
             "margin": top2_margin(r)}
        points.append(p)
        if first_div is None or s < first_div:
            noise = max(noise, p["max_err"])
    return points, first_div, noise


def _ratio(p):
    return p["nmse"] / p["hf_nmse"] if p["hf_nmse"] > 0 else math.inf


def _top1_text(p, tie):
    t = "yes" if p["top1"] else (f"no (near-tie: margin {p['margin']:.3f} < hf err {p['hf_max_err']:.3f})"
                                 if tie else f"NO (margin {p['margin']:.3f})")
    return f"tulip {t}, hf {'yes' if p['hf_top1'] else 'no'}"


def evaluate(kind, got, toks, ref_logits, ref_toks, hf_logits, steps):
    """Judges one tulip run (kind "decode", "gemm" or "tc"; docstring of the script for the bounds).
    Returns (ok, rows, summary): rows for the table (point, tulip, hf, ratio, top1, result) --
    after the prompt, the decode step with the worst ratio, the greedy tokens."""
    points, first_div, noise = compare_steps(got, toks, ref_logits, ref_toks, hf_logits, steps)
    rows = []

    def row(point, p, top1, result):
        rows.append({"point": point, "tulip": p and p["nmse"], "hf": p and p["hf_nmse"],
                     "ratio": p and _ratio(p), "top1": top1, "result": result})

    if not points:
        row("after the prompt", None, "-", "FAIL")
        return False, rows, {"first_divergence": first_div}
    p0 = points[0]
    if kind == "decode":
        row("after the prompt", p0, _top1_text(p0, False), "PASS" if p0["nmse"] <= DECODE_BOUND else "FAIL")
    else:
        tie0 = not p0["top1"] and p0["margin"] < p0["hf_max_err"]
        ok0 = p0["nmse"] <= rel_bound(p0["hf_nmse"]) and (p0["top1"] or tie0)
        row("after the prompt", p0, _top1_text(p0, tie0), "PASS" if ok0 else "FAIL")
    later = points[1:]
    if later:
        if kind == "decode":
            w = max(later, key=lambda p: p["nmse"])
            res = "PASS" if w["nmse"] <= DECODE_BOUND else "FAIL"
        else:
            w = max(later, key=lambda p: p["nmse"] / rel_bound(p["hf_nmse"]))
            # gemm: the decode kernels after a bf16-GEMM prefill carry its state error; only the
            # logits after the prompt are bounded there (test_gpu_e2e compares the two paths)
            res = "info" if kind == "gemm" else ("PASS" if w["nmse"] <= rel_bound(w["hf_nmse"]) else "FAIL")
        row(f"step {w['step']} (worst of 1..{later[-1]['step']})", w, _top1_text(w, False), res)
    # greedy tokens: identical, or parted at a reference near-tie
    same = list(toks) == list(ref_toks)
    margin = top2_margin(ref_logits[first_div]) if first_div is not None else None
    if same:
        g_ok, text = True, f"identical {len(toks)}/{len(ref_toks)}"
    elif first_div is None:
        g_ok, text = False, f"tulip gave {len(toks)} tokens, the reference {len(ref_toks)}"
    else:
        allow = noise
        if kind != "decode" and first_div < len(hf_logits):
            allow = max(allow, float(np.abs(np.asarray(hf_logits[first_div], np.float64) -
                                            np.asarray(ref_logits[first_div], np.float64)).max()))
        g_ok = margin < allow
        text = (f"part at step {first_div}: margin {margin:.2e} {'<' if g_ok else '>='} "
                f"error {allow:.2e}{' (near-tie)' if g_ok else ''}")
    row("greedy tokens", None, text, "PASS" if g_ok else "FAIL")
    ok = all(r["result"] != "FAIL" for r in rows)
    summary = {"worst_nmse": max(p["nmse"] for p in points), "nmse_after_prompt": p0["nmse"],
               "hf_nmse_after_prompt": p0["hf_nmse"], "hf_nmse": [p["hf_nmse"] for p in points],
               "nmse": [p["nmse"] for p in points], "same_tokens": same, "first_divergence": first_div,
               "margin": margin, "noise": noise}
    return ok, rows, summary


def _num(x, fmt):
    if x is None:
        return "-"
    return "inf" if x == math.inf else format(x, fmt)


TABLE_HEAD = ("| seed | mode | point | tulip NMSE | hf-bf16 NMSE | ratio | top-1 agree | result |\n"
              "|---:|---|---|---:|---:|---:|---|---|")


def format_table(rows):
    """The markdown table of rows (dicts with seed, mode and evaluate's row keys)."""
    lines = [TABLE_HEAD]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['mode']} | {r['point']} | {_num(r['tulip'], '.3e')} | "
                     f"{_num(r['hf'], '.3e')} | {_num(r['ratio'], '.2f')} | {r['top1']} | {r['result']} |")
    return "\n".join(lines)


def summary_line(rows, seeds):
    """"PASS hf_fullwidth: ..." when no row failed, else "FAIL hf_fullwidth: ..." naming them."""
    bad = [r for r in rows if r["result"] == "FAIL"]
    where = f"seeds {','.join(map(str, seeds))}"
    if not rows:
        return f"FAIL hf_fullwidth: nothing compared ({where})"
    if not bad:
        return f"PASS hf_fullwidth: {len(rows)} rows, none failed ({where})"
    names = "; ".join(f"seed {r['seed']} {r['mode']} {r['point']}" for r in bad[:8])
    return f"FAIL hf_fullwidth: {len(bad)} of {len(rows)} rows failed ({where}): {names}"


# ---- running tulip and the per-seed flow (torch, on the GPU machine) ----

def run_tulip(a, model_dir, prompt, env_extra, V):
    """tulip run on model_dir: (logits [n, V], tokens) or (None, error text)."""
    dump = os.path.join(model_dir, "tulip_logits.f32")
    cmd = [a.tulip, "run", "--model", model_dir, "--allow-test-shape", "--backend", a.backend, "--prompt-ids",
           ",".join(map(str, prompt)), "-n", str(a.steps), "--temperature", "0", "--ignore-eos",
           "--print-ids", "--dump-logits", dump, "--ctx",
           str(max(256, len(prompt) + a.steps + 16))]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_extra})
    if r.returncode != 0:
        return None, f"rc {r.returncode}: {r.stderr[-2000:]}"
    got = np.fromfile(dump, dtype=np.float32).reshape(-1, V)[: a.steps]
    os.remove(dump)
    return got, [int(x) for x in r.stdout.split()][: a.steps]


def check(a, seed, wname, model_dir, prompt, ref, hf):
    """The three tulip runs on model_dir against ref = (logits, tokens) with transformers-bf16's
    logits hf as the yardstick. Returns (table rows, results for result.json)."""
    ref_logits, ref_toks = ref
    rows, results = [], {"ref_tokens": ref_toks}
    for mode, env_extra, kind in MODES:
        name = f"{wname} {mode}"
        t0 = time.time()
        got, toks = run_tulip(a, model_dir, prompt, env_extra, ref_logits.shape[1])
        if got is None:
            print(f"FAIL tulip run (seed {seed}, {name}): {toks}", flush=True)
            rows.append({"seed": seed, "mode": name, "point": "tulip run", "tulip": None, "hf": None,
                         "ratio": None, "top1": "-", "result": "FAIL"})
            continue
        ok, mrows, summ = evaluate(kind, got, toks, ref_logits, ref_toks, hf, a.steps)
        print(f"# seed {seed}, {name}: tulip run in {time.time() - t0:.1f} s; NMSE after the prompt "
              f"{summ.get('nmse_after_prompt', math.nan):.3e} (hf-bf16 {summ.get('hf_nmse_after_prompt', math.nan):.3e}), "
              f"worst {summ.get('worst_nmse', math.nan):.3e}, greedy identical: {summ.get('same_tokens')} "
              f"(first divergence at step {summ['first_divergence']}) -> {'PASS' if ok else 'FAIL'}", flush=True)
        rows += [{"seed": seed, "mode": name, **r} for r in mrows]
        results[mode] = {**summ, "tulip_tokens": toks, "ok": ok}
    return rows, results


def free_gpu(dev):
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()


def run_seed(a, seed, bits):
    """Builds, saves (and quantizes) the seed's model, computes the references and transformers'
    bf16 logits, frees the model, runs the checks. Returns (rows, results)."""
    t0 = time.time()
    dev = a.device
    sdir = os.path.join(a.out, f"seed{seed}")
    shutil.rmtree(sdir, ignore_errors=True)
    model, cfg = build_model(a.layers, seed, dev, a.small)
    model.save_pretrained(sdir, safe_serialization=True)
    print(f"# seed {seed}: built and saved {a.layers}-layer {'small test-shape' if a.small else 'full-width'} "
          f"model in {time.time() - t0:.1f} s", flush=True)
    q_dir = os.path.join(sdir, "q4")
    quant = None
    if 4 in bits:  # on the CPU, while the GPU computes the bf16 reference
        t_q = time.time()
        qlog = open(os.path.join(sdir, "quantize.log"), "w")
        quant = subprocess.Popen([a.tulip, "quantize", "--in", sdir, "--out", q_dir],
                                 stdout=qlog, stderr=subprocess.STDOUT)
    rng = np.random.default_rng(seed)
    prompt = [int(x) for x in rng.integers(0, min(248077, cfg.vocab_size), a.prompt_len)]
    refs, hfs = {}, {}
    if 16 in bits:
        t1 = time.time()
        refs[16] = reference(model, prompt, a.steps, dev)  # the model is fp32 from here
        hfs[16] = hf_bf16_logits(model, prompt, refs[16][1], dev)  # and bf16 again (exact)
        print(f"# seed {seed}: bf16 reference ({a.steps} steps) and transformers-bf16 in {time.time() - t1:.1f} s",
              flush=True)
    if 4 in bits:
        rc = quant.wait()
        qlog.close()
        if rc != 0:
            print(f"FAIL tulip quantize (seed {seed}): {rc}", open(os.path.join(sdir, "quantize.log")).read()[-2000:])
            return [{"seed": seed, "mode": "4-bit", "point": "tulip quantize", "tulip": None, "hf": None,
                     "ratio": None, "top1": "-", "result": "FAIL"}], {}
        print(f"# seed {seed}: tulip quantize done {time.time() - t_q:.1f} s after its start", flush=True)
        t1 = time.time()
        model = model.float()
        print(f"# seed {seed}: 4-bit weights: {load_dequantized(model, q_dir, dev)}; {time.time() - t1:.1f} s", flush=True)
        t1 = time.time()
        refs[4] = reference(model, prompt, a.steps, dev)
        hfs[4] = hf_bf16_logits(model, prompt, refs[4][1], dev)
        print(f"# seed {seed}: 4-bit reference and transformers-bf16 in {time.time() - t1:.1f} s", flush=True)
    del model  # the GPU is tulip's for the runs; the next seed builds its own
    free_gpu(dev)
    rows, results = [], {}
    if 16 in bits:
        r, results["bf16"] = check(a, seed, "bf16", sdir, prompt, refs[16], hfs[16])
        rows += r
    if 4 in bits:
        r, results["q4"] = check(a, seed, "4-bit", q_dir, prompt, refs[4], hfs[4])
        rows += r
    if not a.keep:
        shutil.rmtree(sdir, ignore_errors=True)
    print(f"# seed {seed}: {time.time() - t0:.1f} s", flush=True)
    return rows, results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1, help="one seed (--seeds overrides)")
    ap.add_argument("--seeds", help="seeds checked one after another, e.g. 1,2,3,5,7,11,13,21")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tulip", default="build/cuda/tulip")
    ap.add_argument("--bits", default="16,4", help="16 (bf16), 4 (tulip quantize), or both: 16,4")
    ap.add_argument("--keep", action="store_true", help="keep each seed's model directory under --out")
    # test options: the whole flow on a machine without a GPU (CPU oracle as the engine)
    ap.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args()
    bits = {int(b) for b in a.bits.split(",") if b.strip()}
    if not bits or bits - {16, 4}:
        ap.error("--bits: 16, 4 or 16,4")
    try:
        seeds = parse_seeds(a.seeds) if a.seeds is not None else [a.seed]
    except ValueError as e:
        ap.error(str(e))
    if a.steps < 1:
        ap.error("--steps: at least 1")
    if torch is None:
        print("tools/hf_fullwidth.py: torch and transformers are needed (the GPU machine has them)")
        return 2
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    rows, results = [], {}
    for seed in seeds:
        r, results[str(seed)] = run_seed(a, seed, bits)
        rows += r
    table = format_table(rows)
    line = summary_line(rows, seeds)
    print(table)
    print(line)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table + "\n" + line + "\n")
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump({"seeds": results, "rows": rows, "pass": line.startswith("PASS")}, f)
    print(f"# total {time.time() - t0:.1f} s", flush=True)
    return 0 if line.startswith("PASS") else 1


if __name__ == "__main__":
    sys.exit(main())
