#!/usr/bin/env python3
"""Makes the tiny reference fixtures of tests/data/tiny-*/ with Hugging Face transformers.

Runs where transformers >= 5 with `qwen3_5_moe` is installed (the lent GPU machine; CPU math is
enough). For each fixture it:
  1. builds Qwen3_5MoeForCausalLM from a tiny text config with a fixed seed and draws every
     weight itself (normal, per-tensor std below; norms small non-zero so the 1+w convention is
     exercised), rounds all weights to bf16 (the checkpoint dtype) and loads them back, so the
     reference runs in fp32 on exactly the bytes we ship;
  2. writes the checkpoint in the published layout: config.json of the multimodal wrapper
     (Qwen3_5MoeForConditionalGeneration with text_config), tensor names under
     `model.language_model.`, `lm_head.weight` at top level, fused 3-D experts
     (`mlp.experts.gate_up_proj` / `down_proj`, no `.weight`), BF16 safetensors, plus a few
     `mtp.*` and `model.visual.*` tensors the loader must keep addressable / skip;
  3. records the reference: logits of every prompt position (prefill, chunked delta rule), the
     greedy continuation for n_decode steps fed back one token at a time through the KV/recurrent
     cache (recurrent delta rule), each step's logits, and the hidden state after every layer of
     the prefill (for debugging);
  4. tries seeds until the top-1/top-2 logit margin is at least MIN_MARGIN at every greedy step
     (the last prompt position and each decode step), so a correct implementation cannot flip a
     greedy token on noise; other prompt positions are compared by tolerance only.
tiny-a stores the experts fused (`mlp.experts.gate_up_proj`, as the official BF16 release);
tiny-b stores them per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`, as save_pretrained
of transformers 5.2x and the FP8 release do), so both loader paths are checked against HF.

Usage: python3 tools/make_fixtures.py OUT_DIR     (writes OUT_DIR/tiny-a, OUT_DIR/tiny-b, log)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

import transformers
from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as cfgmod
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modmod

MIN_MARGIN = 0.05

FIXTURES = {
    # 4 layers = 3 GDN + 1 attention, 8 experts top-2, GVA ratio 2, GQA 2.
    "tiny-a": dict(
        text=dict(
            hidden_size=64, num_hidden_layers=4, vocab_size=320,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                             "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 2], "mrope_interleaved": True},
            max_position_embeddings=4096, eos_token_id=287, bos_token_id=287,
        ),
        gen_eos=[289, 287], n_prompt=12, n_decode=24, seed0=1000,
    ),
    # 6 layers, pattern attn/gdn mixed differently, GQA 3, GVA 3, 16 experts top-4,
    # other rope theta and rotary fraction, prompt of 150 tokens (3 delta-rule chunks of 64).
    "tiny-b": dict(
        text=dict(
            hidden_size=96, num_hidden_layers=6, vocab_size=320,
            layer_types=["linear_attention", "full_attention", "linear_attention",
                         "linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=6, num_key_value_heads=2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=6,
            linear_key_head_dim=24, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=16, num_experts_per_tok=4, moe_intermediate_size=48,
            shared_expert_intermediate_size=64, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                             "partial_rotary_factor": 0.5,
                             "mrope_section": [1, 1, 2], "mrope_interleaved": True},
            max_position_embeddings=4096, eos_token_id=287, bos_token_id=287,
        ),
        gen_eos=[289, 287], n_prompt=150, n_decode=24, seed0=2000, per_expert=True,
    ),
}


def std_for(name):
    if name.endswith("A_log"):
        return None
    if "norm" in name:
        return 0.2   # zero-centred norm weights: small, non-zero
    if name.endswith("dt_bias"):
        return 0.5
    if "conv1d" in name:
        return 0.3
    if "embed_tokens" in name:
        return 1.0
    if "lm_head" in name:
        return 0.25
    if name.endswith("mlp.gate.weight"):
        return 0.3
    return 0.12


def draw_weights(model, gen):
    sd = {}
    for name, p in model.state_dict().items():
        if name.endswith("A_log"):
            t = torch.empty(p.shape).uniform_(0.5, 8.0, generator=gen).log()
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)  # plain weight around 1
        else:
            t = std_for(name) * torch.randn(p.shape, generator=gen)
        sd[name] = t.to(torch.bfloat16).to(torch.float32)
    model.load_state_dict(sd)
    return sd


def margins(logits):
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[..., 0] - top2[..., 1])


def run_reference(model, prompt, n_decode):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model(ids, use_cache=True, output_hidden_states=True)
        prefill_logits = out.logits[0].float().clone()
        hidden = torch.stack([h[0].float() for h in out.hidden_states])  # [L+1, T, D]
        pkv = out.past_key_values
        nxt = int(prefill_logits[-1].argmax())
        dec_ids, dec_logits = [], []
        for _ in range(n_decode):
            dec_ids.append(nxt)
            o = model(torch.tensor([[nxt]]), past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
            lg = o.logits[0, -1].float().clone()
            dec_logits.append(lg)
            nxt = int(lg.argmax())
        return prefill_logits, hidden, dec_ids, torch.stack(dec_logits), nxt


def official_name(hf_name):
    if hf_name.startswith("model."):
        return "model.language_model." + hf_name[len("model."):]
    return hf_name


def make(name, spec, outdir, log):
    text = dict(spec["text"])
    tcfg = cfgmod.Qwen3_5MoeTextConfig(**text)
    tcfg._attn_implementation = "eager"
    for seed in range(spec["seed0"], spec["seed0"] + 200):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = modmod.Qwen3_5MoeForCausalLM(tcfg).float().eval()
        sd = draw_weights(model, gen)
        prompt = torch.randint(0, 287, (spec["n_prompt"],), generator=gen).tolist()
        pl, hidden, dec_ids, dl, last = run_reference(model, prompt, spec["n_decode"])
        m_all = margins(pl).min().item()   # informational: tests compare prefill logits by tolerance
        m_pre = margins(pl[-1:]).min().item()
        m_dec = margins(dl).min().item()
        if min(m_pre, m_dec) >= MIN_MARGIN:
            break
        log.write(f"{name}: seed {seed} rejected (min margin prefill {m_pre:.4f}, decode {m_dec:.4f})\n")
    else:
        raise SystemExit(f"{name}: no seed with margin >= {MIN_MARGIN}")
    log.write(f"{name}: seed {seed}, min top1-top2 margin: last prompt position {m_pre:.4f}, "
              f"greedy decode steps {m_dec:.4f} (any prompt position {m_all:.4f}), "
              f"logit range [{pl.min().item():.3f}, {pl.max().item():.3f}]\n")

    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    # What save_pretrained writes, for the record (names only).
    tmp = os.path.join(outdir, name + "-save_pretrained")
    model.save_pretrained(tmp)
    from safetensors import safe_open
    with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    log.write(f"{name}: save_pretrained wrote {len(keys)} tensors, e.g. {keys[:3]} ... "
              f"experts: {[k for k in keys if 'experts' in k][:2]}\n")

    tensors = {}
    for k, v in sd.items():
        v = v.to(torch.bfloat16).contiguous()
        if spec.get("per_expert") and k.endswith("mlp.experts.gate_up_proj"):
            ff = v.shape[1] // 2
            for e in range(v.shape[0]):
                tensors[official_name(k[:-len("gate_up_proj")] + f"{e}.gate_proj.weight")] = v[e, :ff].contiguous()
                tensors[official_name(k[:-len("gate_up_proj")] + f"{e}.up_proj.weight")] = v[e, ff:].contiguous()
        elif spec.get("per_expert") and k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                tensors[official_name(k[:-len("down_proj")] + f"{e}.down_proj.weight")] = v[e].contiguous()
        else:
            tensors[official_name(k)] = v
    g2 = torch.Generator().manual_seed(seed + 7)
    D = text["hidden_size"]
    # MTP (kept addressable by the loader) and vision (skipped) tensors, as the real file has.
    tensors["mtp.fc.weight"] = (0.1 * torch.randn(D, 2 * D, generator=g2)).to(torch.bfloat16)
    tensors["mtp.norm.weight"] = (0.1 * torch.randn(D, generator=g2)).to(torch.bfloat16)
    tensors["model.visual.patch_embed.proj.weight"] = (0.1 * torch.randn(8, 3, 2, 2, generator=g2)).to(torch.bfloat16)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    cfg = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        "text_config": dict(
            text, model_type="qwen3_5_moe_text", hidden_act="silu", attention_bias=False,
            attention_dropout=0.0, attn_output_gate=True, full_attention_interval=4,
            mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
            mamba_ssm_dtype="float32", dtype="bfloat16", tie_word_embeddings=False,
            partial_rotary_factor=text["rope_parameters"]["partial_rotary_factor"],
            router_aux_loss_coef=0.001, output_router_logits=False, initializer_range=0.02,
            use_cache=True,
        ),
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 8,
                          "out_hidden_size": D},
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 287, "do_sample": True, "eos_token_id": spec["gen_eos"],
                   "pad_token_id": 287, "temperature": 1.0, "top_k": 20, "top_p": 0.95}, f, indent=2)
    ref = {
        "min_margin": torch.tensor([m_pre, m_dec, m_all], dtype=torch.float32),
        "prompt_ids": torch.tensor(prompt, dtype=torch.int32),
        "decode_ids": torch.tensor(dec_ids + [last], dtype=torch.int32),
        "prefill_logits": pl.contiguous(),
        "decode_logits": dl.contiguous(),
        "hidden": hidden.contiguous(),
    }
    save_file(ref, os.path.join(d, "ref.safetensors"),
              metadata={"seed": str(seed), "transformers": transformers.__version__,
                        "torch": torch.__version__, "min_margin_prefill": f"{m_pre:.6f}",
                        "min_margin_decode": f"{m_dec:.6f}"})
    log.write(f"{name}: prompt {len(prompt)} tokens, greedy {dec_ids + [last]}\n")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    with open(os.path.join(out, "log.txt"), "w") as log:
        log.write(f"transformers {transformers.__version__}, torch {torch.__version__}\n")
        for name, spec in FIXTURES.items():
            make(name, spec, out, log)
            log.flush()
    print(open(os.path.join(out, "log.txt")).read())


if __name__ == "__main__":
    main()
