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

Two tulip runs: the prompt through the decode kernels (TL_CUDA_NO_PREFILL_GEMM=1), which keep
the KV cache and nothing else in bf16 and accumulate in fp32 -- expected logits NMSE ~1e-6 against
the fp32 reference; required: <= 1e-4 at every step and identical greedy tokens for all --steps
steps (32 by default) -- and through the tensor-core prefill path (bf16 GEMM inputs): there a
bf16 rounding can swap a token's 8th and 9th expert in these random 256-expert layers, so the
logits after the prompt must be within NMSE 1e-3 (measured 2.0e-4) and the greedy tokens may only
part at a near-tie (reference top-2 margin < 0.01; measured: step 23, margin 0.0035).

4-bit: not covered here (see the report); the 4-bit path is checked against the CPU oracle on
the same dequantized weights at full width in tests/gpu/test_gpu_e2e.c.

usage: python3 tools/hf_fullwidth.py --out /tmp/fw [--layers 4] [--steps 32] [--seed 1]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch


def build_model(layers, seed):
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    cfg = Qwen3_5MoeTextConfig()
    cfg.num_hidden_layers = layers
    cfg.layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen3_5MoeForCausalLM(cfg)
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, device="cuda", generator=g) * 15 + 1))
            elif name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, device="cuda", generator=g) + 0.5)
            elif "conv1d" in name:
                p.copy_((torch.rand(p.shape, device="cuda", generator=g) - 0.5))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, device="cuda", generator=g))
            elif p.dim() == 1:  # zero-centred RMSNorm weights (used as 1 + w)
                p.copy_(0.1 * torch.randn(p.shape, device="cuda", generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, device="cuda", generator=g))
    model = model.to(torch.bfloat16)
    return model, cfg


@torch.no_grad()
def reference(model, prompt, steps):
    m32 = model.float().eval()
    seq = list(prompt)
    logits, toks = [], []
    for _ in range(steps):
        out = m32(torch.tensor([seq], device="cuda"), use_cache=False)
        lg = out.logits[0, -1].float().cpu().numpy()
        t = int(lg.argmax())
        logits.append(lg)
        toks.append(t)
        seq.append(t)
    return np.stack(logits), toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tulip", default="build/cuda/tulip")
    a = ap.parse_args()
    t0 = time.time()
    model, cfg = build_model(a.layers, a.seed)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"# built and saved {a.layers}-layer full-width model in {time.time() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(a.seed)
    prompt = [int(x) for x in rng.integers(0, 248077, a.prompt_len)]
    ref_logits, ref_toks = reference(model, prompt, a.steps)
    del model
    torch.cuda.empty_cache()
    ok_all = True
    results = {}
    # two runs: the prompt through the decode kernels (TL_CUDA_NO_PREFILL_GEMM=1: f32 GEMVs, the
    # reference-exact path) and through the tensor-core prefill path (bf16 GEMM inputs)
    for mode, env_extra in (("decode-path prefill", {"TL_CUDA_NO_PREFILL_GEMM": "1"}), ("gemm-path prefill", {})):
        dump = os.path.join(a.out, "tulip_logits.f32")
        cmd = [a.tulip, "run", "--model", a.out, "--allow-test-shape", "--backend", "cuda", "--prompt-ids",
               ",".join(map(str, prompt)), "-n", str(a.steps), "--temperature", "0", "--ignore-eos",
               "--print-ids", "--dump-logits", dump, "--ctx", "256"]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_extra})
        if r.returncode != 0:
            print(f"FAIL tulip run ({mode}):", r.returncode, r.stderr[-2000:])
            return 1
        V = ref_logits.shape[1]
        got = np.fromfile(dump, dtype=np.float32).reshape(-1, V)[: a.steps]
        toks = [int(x) for x in r.stdout.split()][: a.steps]
        worst, agree, first_div = 0.0, 0, None
        for s in range(min(len(got), a.steps)):
            if first_div is None and s < len(toks) and toks[s] != ref_toks[s]:
                first_div = s
            if first_div is not None and s > first_div:
                break  # the sequences differ from here on: logits are no longer comparable
            d = got[s].astype(np.float64) - ref_logits[s]
            nmse = float((d * d).sum() / (ref_logits[s].astype(np.float64) ** 2).sum())
            worst = max(worst, nmse)
            agree += int(got[s].argmax() == ref_logits[s].argmax())
            if s < 2 or s == a.steps - 1:
                print(f"# {mode} step {s}: nmse {nmse:.3e} max_abs {np.abs(d).max():.3e} top1 {got[s].argmax()} vs {ref_logits[s].argmax()}")
        srt = np.sort(ref_logits[first_div]) if first_div is not None else None
        margin = float(srt[-1] - srt[-2]) if srt is not None else None
        same = toks == ref_toks
        print(f"# full width bf16, {a.layers} layers, {mode}: worst nmse {worst:.3e} over the common steps, "
              f"greedy identical: {same} (first divergence at step {first_div}, reference top-2 margin there {margin})")
        # decode path: exact up to fp32 order and the bf16 KV cache. GEMM path: bf16 GEMM inputs
        # plus chaotic routing (a rounding can swap a token's 8th and 9th expert), so only the
        # logits right after the prompt are bounded (measured 2.0e-4 on 2026-12-02, f86662d) and
        # the greedy tokens must agree up to the first step whose reference top-2 margin < 0.01.
        nm0 = float(((got[0].astype(np.float64) - ref_logits[0]) ** 2).sum() / (ref_logits[0].astype(np.float64) ** 2).sum())
        if mode.startswith("decode"):
            ok = same and worst <= 1e-4
        else:
            ok = nm0 <= 1e-3 and (first_div is None or margin < 0.01)
        print(("PASS" if ok else "FAIL") + f" hf_fullwidth_bf16 ({mode})")
        ok_all = ok_all and ok
        results[mode] = {"worst_nmse": worst, "same_tokens": same, "first_divergence": first_div,
                         "margin": margin, "tulip_tokens": toks}
    results["ref_tokens"] = ref_toks
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(results, f)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
