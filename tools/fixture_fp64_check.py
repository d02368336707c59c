#!/usr/bin/env python3
"""Cross-check of a tiny fixture: runs transformers in float64 on the fixture weights and prints how far
HF float32 (ref.safetensors) and our CPU oracle (logits dumped to a raw f32 file of [T, V]) are from it.
Usage: python3 tools/fixture_fp64_check.py tests/data/tiny-b OURS.bin   (run from the repo root)"""
import sys, json, torch, numpy as np
sys.path.insert(0, "tools")
import make_fixtures as mf
from safetensors.torch import load_file
from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as cfgmod, modeling_qwen3_5_moe as modmod
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))["text_config"]
keep = {k: v for k, v in cfg.items() if k in mf.FIXTURES[d.split("/")[-1]]["text"]}
tc = cfgmod.Qwen3_5MoeTextConfig(**keep); tc._attn_implementation = "eager"; tc._experts_implementation = "eager"
model = modmod.Qwen3_5MoeForCausalLM(tc).double().eval()
w = load_file(d + "/model.safetensors")
sd = {}
for k, v in w.items():
    if k.startswith("model.language_model."): sd["model." + k[len("model.language_model."):]] = v
    elif k == "lm_head.weight": sd[k] = v
# per-expert -> fused
import re
fused = {}
for k in list(sd):
    m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", k)
    if m:
        fused.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = sd.pop(k)
for pre, parts in fused.items():
    E = max(e for e, _ in parts) + 1
    sd[pre + ".gate_up_proj"] = torch.stack([torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(E)])
    sd[pre + ".down_proj"] = torch.stack([parts[(e, "down")] for e in range(E)])
model.load_state_dict({k: v.double() for k, v in sd.items()})
ref = load_file(d + "/ref.safetensors")
with torch.no_grad():
    lg = model(ref["prompt_ids"].long()[None]).logits[0].double()
ours = torch.from_numpy(np.fromfile(sys.argv[2], dtype=np.float32).reshape(lg.shape)).double()
print("HF fp32 vs HF fp64: max", (ref["prefill_logits"].double() - lg).abs().max().item())
print("ours vs HF fp64:    max", (ours - lg).abs().max().item())
