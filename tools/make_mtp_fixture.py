#!/usr/bin/env python3
"""tests/data/tiny-mtp: tiny-a's trunk plus a whole MTP head, and the head's expected outputs from
an independent numpy reference of docs/model.md §3.2 (float64).

Why not transformers: its Qwen3.5/3.6-MoE classes ignore `mtp.*` on load (`_keys_to_ignore_on_load
_unexpected = [r"^mtp.*"]`), so there is no HF forward of the head to compare with. The reference
below is written from the model description alone (it shares no code with src/cpu); its inputs are
the trunk's final-normed hidden states that transformers itself computed for tiny-a's prompt
(tiny-a/ref.safetensors `hidden[L]`), so the chain HF trunk -> MTP input is pinned too.

Layout written (exercises the loader's harder cases): the trunk in model-00001-of-00002.safetensors
(tiny-a's tensors, fused experts, minus its partial mtp.*), the whole head in its own shard
model-00002-of-00002.safetensors with per-expert experts, and model.safetensors.index.json.

mtp_ref.safetensors:
  tokens [T] i32      row p's token: the token at position p + 1 (prompt[1:] + decode_ids[0])
  hidden [T, D] f32   row p's hidden: HF's final-normed trunk hidden at position p
  h_out [T, D] f32    RMSNorm1p(t; mtp.norm) of every row (rows at positions 0..T-1, one pass)
  logits [T, V] f32   lm_head . h_out
  chain_tokens [K] i32, chain_logits [K, V] f32: K further draft steps from the last row, each
      feeding the argmax of the previous step's logits and that step's h_out, positions T, T+1, ...

Usage: .venv/bin/python tools/make_mtp_fixture.py tests/data  (needs numpy only)
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

SEED = 1717
CHAIN = 3


def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[a:b]
        if v["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif v["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        elif v["dtype"] == "I32":
            arr = np.frombuffer(raw, dtype=np.int32)
        else:
            raise SystemExit(f"{path}: {k}: dtype {v['dtype']} not handled")
        out[k] = (v["dtype"], arr.reshape(v["shape"]).copy())
    return out


def st_write(path, tensors, metadata=None):
    """tensors: name -> (dtype, array); BF16 arrays are float32 already holding bf16 values.
    metadata: the header's __metadata__ (a dict of strings), or None for none."""
    hdr, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dt, arr = tensors[k]
        if dt == "BF16":
            raw = (np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32) >> 16).astype(
                np.uint16).tobytes()
        elif dt == "F32":
            raw = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        elif dt == "I32":
            raw = np.ascontiguousarray(arr, dtype=np.int32).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata is not None:
        hdr["__metadata__"] = metadata
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16(x):
    """Round to nearest even bf16, returned as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


# ---- the reference (float64), docs/model.md §2.1, §2.2, §2.3, §2.5, §3.2 ----

def rmsnorm1p(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope_neox(x, pos, n_rot, theta):
    """x [H, hd] at one position: pairs (d, d + n_rot/2) for d < n_rot/2."""
    half = n_rot // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    ang = pos * inv
    c, s = np.cos(ang), np.sin(ang)
    y = x.copy()
    a, b = x[:, :half], x[:, half:n_rot]
    y[:, :half] = a * c - b * s
    y[:, half:n_rot] = b * c + a * s
    return y


class MtpRef:
    def __init__(self, W, cfg):
        self.W, self.c = W, cfg
        self.K, self.V = [], []  # the head's KV cache, one entry per position

    def attention(self, u, pos):
        c, W, p = self.c, self.W, "mtp.layers.0.self_attn."
        H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        n_rot = int(hd * c["rope_parameters"]["partial_rotary_factor"])
        theta = c["rope_parameters"]["rope_theta"]
        eps = c["rms_norm_eps"]
        qg = (W[p + "q_proj.weight"] @ u).reshape(H, 2 * hd)
        q, gate = qg[:, :hd], qg[:, hd:]
        k = (W[p + "k_proj.weight"] @ u).reshape(Hkv, hd)
        v = (W[p + "v_proj.weight"] @ u).reshape(Hkv, hd)
        q = rope_neox(rmsnorm1p(q, W[p + "q_norm.weight"], eps), pos, n_rot, theta)
        k = rope_neox(rmsnorm1p(k, W[p + "k_norm.weight"], eps), pos, n_rot, theta)
        del self.K[pos:], self.V[pos:]
        assert len(self.K) == pos
        self.K.append(k)
        self.V.append(v)
        Ks, Vs = np.stack(self.K), np.stack(self.V)  # [pos+1, Hkv, hd]
        o = np.zeros((H, hd))
        for h in range(H):
            kv = h // (H // Hkv)
            s = Ks[:, kv, :] @ q[h] / np.sqrt(hd)
            pr = np.exp(s - s.max())
            pr /= pr.sum()
            o[h] = pr @ Vs[:, kv, :]
        o = o * sigmoid(gate)
        return W[p + "o_proj.weight"] @ o.reshape(-1)

    def moe(self, u):
        c, W, p = self.c, self.W, "mtp.layers.0.mlp."
        E, k = c["num_experts"], c["num_experts_per_tok"]
        lg = W[p + "gate.weight"] @ u
        pr = np.exp(lg - lg.max())
        pr /= pr.sum()
        ids = sorted(range(E), key=lambda e: (-pr[e], e))[:k]
        w = pr[ids] / pr[ids].sum()
        out = np.zeros_like(u)
        for wi, e in zip(w, ids):
            g = W[p + f"experts.{e}.gate_proj.weight"] @ u
            up = W[p + f"experts.{e}.up_proj.weight"] @ u
            out += wi * (W[p + f"experts.{e}.down_proj.weight"] @ (silu(g) * up))
        g = W[p + "shared_expert.gate_proj.weight"] @ u
        up = W[p + "shared_expert.up_proj.weight"] @ u
        s = W[p + "shared_expert.down_proj.weight"] @ (silu(g) * up)
        sg = sigmoid(W[p + "shared_expert_gate.weight"] @ u)[0]
        return out + sg * s

    def step(self, token, hidden, pos, E, lm_head):
        c, W, eps = self.c, self.W, self.c["rms_norm_eps"]
        e = rmsnorm1p(E[token], W["mtp.pre_fc_norm_embedding.weight"], eps)
        hn = rmsnorm1p(hidden, W["mtp.pre_fc_norm_hidden.weight"], eps)
        x = W["mtp.fc.weight"] @ np.concatenate([e, hn])
        x = x + self.attention(rmsnorm1p(x, W["mtp.layers.0.input_layernorm.weight"], eps), pos)
        x = x + self.moe(rmsnorm1p(x, W["mtp.layers.0.post_attention_layernorm.weight"], eps))
        h = rmsnorm1p(x, W["mtp.norm.weight"], eps)
        return h, lm_head @ h


def draw_head(rng, c):
    D, H, Hkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, ff, fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    shapes = {
        "mtp.pre_fc_norm_embedding.weight": [D], "mtp.pre_fc_norm_hidden.weight": [D],
        "mtp.fc.weight": [D, 2 * D], "mtp.norm.weight": [D],
        "mtp.layers.0.input_layernorm.weight": [D],
        "mtp.layers.0.post_attention_layernorm.weight": [D],
        "mtp.layers.0.self_attn.q_proj.weight": [2 * H * hd, D],
        "mtp.layers.0.self_attn.k_proj.weight": [Hkv * hd, D],
        "mtp.layers.0.self_attn.v_proj.weight": [Hkv * hd, D],
        "mtp.layers.0.self_attn.o_proj.weight": [D, H * hd],
        "mtp.layers.0.self_attn.q_norm.weight": [hd], "mtp.layers.0.self_attn.k_norm.weight": [hd],
        "mtp.layers.0.mlp.gate.weight": [E, D],
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": [fs, D],
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": [fs, D],
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": [D, fs],
        "mtp.layers.0.mlp.shared_expert_gate.weight": [1, D],
    }
    for e in range(E):
        shapes[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = [ff, D]
        shapes[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = [ff, D]
        shapes[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = [D, ff]
    W = {}
    for name in sorted(shapes):
        sh = shapes[name]
        if "norm" in name:
            std = 0.1  # zero-centred RMSNorm1p weights, drawn non-zero
        else:
            std = 1.0 / np.sqrt(sh[-1])  # unit-variance outputs for unit inputs
        W[name] = bf16(rng.standard_normal(sh).astype(np.float32) * np.float32(std))
    return W


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    src, dst = os.path.join(out, "tiny-a"), os.path.join(out, "tiny-mtp")
    os.makedirs(dst, exist_ok=True)
    cfg_all = json.load(open(os.path.join(src, "config.json")))
    c = cfg_all["text_config"]
    trunk = st_read(os.path.join(src, "model.safetensors"))
    ref = st_read(os.path.join(src, "ref.safetensors"))
    rng = np.random.default_rng(SEED)
    head = draw_head(rng, c)

    shard1 = {k: v for k, v in trunk.items() if not k.startswith("mtp.")}
    shard2 = {k: ("BF16", v) for k, v in head.items()}
    n1, n2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    st_write(os.path.join(dst, n1), shard1)
    st_write(os.path.join(dst, n2), shard2)
    wmap = {k: n1 for k in shard1}
    wmap.update({k: n2 for k in shard2})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": dict(sorted(wmap.items()))}, f,
                  indent=2)
    for aux in ("config.json", "generation_config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, aux), os.path.join(dst, aux))

    W = {k: v.astype(np.float64) for k, v in head.items()}
    E = trunk["model.language_model.embed_tokens.weight"][1].astype(np.float64)
    lm = trunk["lm_head.weight"][1].astype(np.float64)
    L = c["num_hidden_layers"]
    prompt = ref["prompt_ids"][1].astype(np.int64)
    dec = ref["decode_ids"][1].astype(np.int64)
    hid = ref["hidden"][1][L].astype(np.float64)  # [T, D]: HF's final-normed hidden
    T = len(prompt)
    tokens = np.concatenate([prompt[1:], dec[:1]])
    m = MtpRef(W, c)
    h_out, logits = [], []
    for p in range(T):
        h, lg = m.step(int(tokens[p]), hid[p], p, E, lm)
        h_out.append(h)
        logits.append(lg)
    chain_tok, chain_lg = [], []
    h, lg = h_out[-1], logits[-1]
    for i in range(CHAIN):
        t = int(np.argmax(lg))
        chain_tok.append(t)
        h, lg = m.step(t, h, T + i, E, lm)
        chain_lg.append(lg)
    lgs = np.stack(logits)
    srt = np.sort(lgs, axis=1)
    margin = float((srt[:, -1] - srt[:, -2]).min())
    st_write(os.path.join(dst, "mtp_ref.safetensors"), {
        "tokens": ("I32", tokens.astype(np.int32)),
        "hidden": ("F32", hid.astype(np.float32)),
        "h_out": ("F32", np.stack(h_out).astype(np.float32)),
        "logits": ("F32", lgs.astype(np.float32)),
        "chain_tokens": ("I32", np.array(chain_tok, dtype=np.int32)),
        "chain_logits": ("F32", np.stack(chain_lg).astype(np.float32)),
    })
    print(f"tiny-mtp: seed {SEED}, {T} rows, chain {chain_tok}, logit range "
          f"[{lgs.min():.3f}, {lgs.max():.3f}], min top1-top2 margin over rows {margin:.4f}, "
          f"numpy {np.__version__}")


if __name__ == "__main__":
    main()
