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

Three tulip runs: the prompt through the decode kernels (TL_CUDA_NO_PREFILL_GEMM=1), which keep
the KV cache and nothing else in bf16 and accumulate in fp32 -- expected logits NMSE ~1e-6 against
the fp32 reference; required: <= 1e-4 at every common step and identical greedy tokens for all
--steps steps (32 by default) unless they part at a reference near-tie (top-2 margin below the
logit error measured before it) -- and through the tensor-core prefill path (bf16 GEMM inputs):
there a bf16 rounding can swap a token's 8th and 9th expert in these random 256-expert layers, so
the logits after the prompt must be within NMSE 2e-2 with the same top-1 (measured 2e-4 .. 9e-3
over seeds 1-3, bf16 and 4-bit) and the greedy tokens may only part at such a near-tie -- and with
every decode step on the tensor-core decode path too (TL_CUDA_TC_MIN=1: the batched-decode path,
bf16 GEMM inputs): the GEMM-path bound after the prompt and NMSE <= 5e-2 at every common step.

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
directory are compared with the same bounds ("PASS hf_fullwidth_q4 (...)"). Why the same bounds:
the engine's 4-bit kernels dequantize to exactly these values and accumulate in fp32, so against
this reference the only differences left are the ones of the bf16 check (fp32 order, the bf16 KV
cache, and on the GEMM path the bf16 GEMM inputs with their chaotic expert swaps); quantization
error itself, the 8-bit router's changed routing included, is inside the reference.

Local end-to-end run of the whole flow without a GPU (hidden test options: a reduced shape that
the CPU backend accepts with --allow-test-shape, torch on the CPU, `tulip run --backend cpu`):
    python3 tools/hf_fullwidth.py --out /tmp/fws --small --device cpu --backend cpu \
        --tulip build/cpu/tulip

usage: python3 tools/hf_fullwidth.py --out /tmp/fw [--layers 4] [--steps 32] [--seed 1]
       [--bits 16,4]
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch


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


@torch.no_grad()
def reference(model, prompt, steps, dev="cuda"):
    m32 = model.float().eval()
    seq = list(prompt)
    logits, toks = [], []
    for _ in range(steps):
        out = m32(torch.tensor([seq], device=dev), use_cache=False)
        lg = out.logits[0, -1].float().cpu().numpy()
        t = int(lg.argmax())
        logits.append(lg)
        toks.append(t)
        seq.append(t)
    return np.stack(logits), toks


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


@torch.no_grad()
def load_dequantized(model, q_dir, dev):
    """Sets every parameter of the (fp32) HF model from tulip's quantized checkpoint in q_dir.
    Returns a one-line summary (counts and the relative squared change of the matrices)."""
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


def check(a, tag, label, model_dir, prompt, ref_logits, ref_toks):
    """Runs tulip on model_dir in the three modes; prints and returns (ok, results) or None when
    tulip failed. tag/label: "bf16"/"" keep the lines of the bf16-only version of this script."""
    ok_all = True
    results = {}
    # two runs: the prompt through the decode kernels (TL_CUDA_NO_PREFILL_GEMM=1: f32 GEMVs, the
    # reference-exact path) and through the tensor-core prefill path (bf16 GEMM inputs)
    # and a third: every decode step of batch 1 on the tensor-core decode path (TL_CUDA_TC_MIN=1;
    # by default it serves batches of 16 and more), bf16 GEMM inputs as on the prefill path
    modes = (("decode-path prefill", {"TL_CUDA_NO_PREFILL_GEMM": "1"}), ("gemm-path prefill", {}),
             ("tensor-core decode", {"TL_CUDA_TC_MIN": "1"}))
    for mode, env_extra in modes:
        dump = os.path.join(model_dir, "tulip_logits.f32")
        cmd = [a.tulip, "run", "--model", model_dir, "--allow-test-shape", "--backend", a.backend, "--prompt-ids",
               ",".join(map(str, prompt)), "-n", str(a.steps), "--temperature", "0", "--ignore-eos",
               "--print-ids", "--dump-logits", dump, "--ctx", "256"]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_extra})
        if r.returncode != 0:
            print(f"FAIL tulip run ({label}{mode}):", r.returncode, r.stderr[-2000:])
            return None
        print(f"# {label}tulip run ({mode}) in {time.time() - t0:.1f} s", flush=True)
        V = ref_logits.shape[1]
        got = np.fromfile(dump, dtype=np.float32).reshape(-1, V)[: a.steps]
        toks = [int(x) for x in r.stdout.split()][: a.steps]
        worst, agree, first_div, noise = 0.0, 0, None, 0.0
        for s in range(min(len(got), a.steps)):
            if first_div is None and s < len(toks) and toks[s] != ref_toks[s]:
                first_div = s
            if first_div is not None and s > first_div:
                break  # the sequences differ from here on: logits are no longer comparable
            d = got[s].astype(np.float64) - ref_logits[s]
            nmse = float((d * d).sum() / (ref_logits[s].astype(np.float64) ** 2).sum())
            worst = max(worst, nmse)
            if first_div is None or s < first_div:  # the logit error on the common steps
                noise = max(noise, float(np.abs(d).max()))
            agree += int(got[s].argmax() == ref_logits[s].argmax())
            if s < 2 or s == a.steps - 1:
                print(f"# {label}{mode} step {s}: nmse {nmse:.3e} max_abs {np.abs(d).max():.3e} top1 {got[s].argmax()} vs {ref_logits[s].argmax()}")
        srt = np.sort(ref_logits[first_div]) if first_div is not None else None
        margin = float(srt[-1] - srt[-2]) if srt is not None else None
        same = toks == ref_toks
        print(f"# full width {'bf16' if tag == 'bf16' else '4-bit'}, {a.layers} layers, {mode}: worst nmse {worst:.3e} over the common steps, "
              f"greedy identical: {same} (first divergence at step {first_div}, reference top-2 margin there {margin}, "
              f"largest logit error before it {noise:.3e})")
        # Greedy tokens may part only at a reference near-tie: a step whose top-2 margin is below
        # the largest logit error measured on the steps before it (`noise`); anywhere else a
        # split is a FAIL. Decode path: exact up to fp32 order and the bf16 KV cache, worst NMSE
        # <= 1e-4 over the common steps (measured 2.3e-7 .. 4.8e-7, seeds 1-3, bf16 and 4-bit,
        # 2026-12-03; seed 2 bf16 parted at step 16 at a 7.4e-4 margin with 2.6e-3 max error).
        # GEMM path: bf16 GEMM inputs plus chaotic routing (a rounding can swap a token's 8th and
        # 9th expert in these random 256-expert layers), so the logits right after the prompt are
        # bounded loosely: NMSE <= 2e-2 with the same top-1 (measured on the H200, 2026-12-03,
        # seeds 1/2/3: bf16 2.0e-4 / 2.8e-3 / 3.1e-4, 4-bit 8.9e-3 / 9.7e-4 / 1.9e-3; a layout
        # or dequantization error gives ~1). test_gpu_e2e compares the GEMM path with the decode
        # path as well. 4-bit: the same bounds against the dequantized reference (docstring).
        nm0 = float(((got[0].astype(np.float64) - ref_logits[0]) ** 2).sum() / (ref_logits[0].astype(np.float64) ** 2).sum())
        tie_ok = first_div is None or (margin is not None and margin < noise)
        if mode.startswith("decode"):
            ok = worst <= 1e-4 and tie_ok
        elif mode.startswith("tensor-core"):
            # the GEMM-path bound after the prompt, and every common decode step within 5e-2:
            # measured 2026-12-03 (seed 1, 4-bit) 2.13e-2 at step 1, where the gemm-path prefill
            # run's own decode step measured 2.14e-2 (the state after a bf16-GEMM prefill of these
            # chaotic random layers, not the decode path, sets that error); 2e-2 was a first guess
            ok = (nm0 <= 2e-2 and worst <= 5e-2 and tie_ok and
                  int(got[0].argmax()) == int(ref_logits[0].argmax()))
        else:
            ok = nm0 <= 2e-2 and int(got[0].argmax()) == int(ref_logits[0].argmax()) and tie_ok
        print(("PASS" if ok else "FAIL") + f" hf_fullwidth_{tag} ({mode})")
        ok_all = ok_all and ok
        results[mode] = {"worst_nmse": worst, "same_tokens": same, "first_divergence": first_div,
                         "margin": margin, "tulip_tokens": toks}
    results["ref_tokens"] = ref_toks
    return ok_all, results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tulip", default="build/cuda/tulip")
    ap.add_argument("--bits", default="16,4", help="16 (bf16), 4 (tulip quantize), or both: 16,4")
    # test options: the whole flow on a machine without a GPU (CPU oracle as the engine)
    ap.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args()
    bits = {int(b) for b in a.bits.split(",") if b.strip()}
    if not bits or bits - {16, 4}:
        ap.error("--bits: 16, 4 or 16,4")
    dev = a.device
    t0 = time.time()
    model, cfg = build_model(a.layers, a.seed, dev, a.small)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"# built and saved {a.layers}-layer {'small test-shape' if a.small else 'full-width'} model in {time.time() - t0:.1f} s", flush=True)
    q_dir = os.path.join(a.out, "q4")
    quant = None
    if 4 in bits:  # on the CPU, while the GPU computes the bf16 reference
        t_q = time.time()
        qlog = open(os.path.join(a.out, "quantize.log"), "w")
        quant = subprocess.Popen([a.tulip, "quantize", "--in", a.out, "--out", q_dir],
                                 stdout=qlog, stderr=subprocess.STDOUT)
    rng = np.random.default_rng(a.seed)
    prompt = [int(x) for x in rng.integers(0, min(248077, cfg.vocab_size), a.prompt_len)]
    refs = {}
    if 16 in bits:
        t1 = time.time()
        refs[16] = reference(model, prompt, a.steps, dev)
        print(f"# bf16 reference: {a.steps} steps in {time.time() - t1:.1f} s", flush=True)
    if 4 in bits:
        rc = quant.wait()
        qlog.close()
        if rc != 0:
            print(f"FAIL tulip quantize: {rc}", open(os.path.join(a.out, "quantize.log")).read()[-2000:])
            return 1
        print(f"# tulip quantize -> {q_dir} done {time.time() - t_q:.1f} s after its start", flush=True)
        t1 = time.time()
        model = model.float()
        print(f"# 4-bit weights: {load_dequantized(model, q_dir, dev)}; {time.time() - t1:.1f} s", flush=True)
        t1 = time.time()
        refs[4] = reference(model, prompt, a.steps, dev)
        print(f"# 4-bit reference: {a.steps} steps in {time.time() - t1:.1f} s", flush=True)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    ok_all = True
    results = {}
    if 16 in bits:
        r = check(a, "bf16", "", a.out, prompt, *refs[16])
        if r is None:
            return 1
        ok_all = ok_all and r[0]
        results.update(r[1])  # the bf16 entries stay at the top level, as before --bits
    if 4 in bits:
        r = check(a, "q4", "4-bit ", q_dir, prompt, *refs[4])
        if r is None:
            return 1
        ok_all = ok_all and r[0]
        results["q4"] = r[1]
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(results, f)
    print(f"# total {time.time() - t0:.1f} s", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
