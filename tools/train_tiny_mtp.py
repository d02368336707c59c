#!/usr/bin/env python3
"""Trains a tiny Qwen3.6-architecture model and its MTP head on real text, offline, and writes it
as a checkpoint tulip loads (docs/model.md §5.1 layout, BF16), so that speculative decoding has a
real acceptance rate to measure and `make demo` prints readable text.

  python3 tools/train_tiny_mtp.py --out DIR [--minutes 4] [--device cuda] [--steps N] [--seed 17]

What it does, in order:
  1. corpus: the docstrings of the Python standard library this interpreter runs on (ast over the
     .py files under sysconfig's stdlib dir, sorted) plus pydoc's topic texts; nothing is
     downloaded. The last 5% of the tokens are held out.
  2. tokenizer: a byte-level BPE trained with `tokenizers` in Qwen3.6's pipeline (NFC, the
     Qwen3.5 split regex, ByteLevel), VOCAB - 33 learned ids, then the 33 Qwen3.6 added tokens
     (docs/model.md §4.2). tokenizer_config.json carries no chat template: tulip renders its own
     Qwen3.6 template (src/tokenizer/chat.c), as for tests/data/tiny-a.
  3. trunk: transformers' Qwen3_5MoeForCausalLM (GDN and gated full attention, MoE with a shared
     expert), next-token loss plus the router's load-balancing loss. The shape is the smallest
     the CUDA kernels take (src/cuda/cuda_runtime.cu check_dims: head_dim 256, 64 rotary dims,
     GDN head dims 128, hidden and expert widths multiples of 256), so one checkpoint runs on
     both backends.
  4. MTP head: MtpHead below, written from docs/model.md §3 (transformers has no MTP forward),
     trained at the same time on the trunk's detached final-normed hidden states, with frozen
     copies of the trunk's embedding and lm_head: the loss of draft depth d (d = 1..DEPTH, chained
     as tulip chains drafts, §3.3) is half cross-entropy on the true token and half on the trunk's
     own next-position distribution (what greedy verification accepts). Before training the head
     is checked against the float64 numpy reference of tests/data/tiny-mtp (mtp_ref.safetensors).
  5. report: held-out trunk loss, the head's top-1 accuracy per depth, and how often its argmax
     equals the trunk's (an estimate of greedy acceptance per draft position).
  6. writes DIR/config.json, generation_config.json, model.safetensors (BF16; trunk in the
     published names with fused experts, head per expert), tokenizer.json, tokenizer_config.json,
     train-log.txt.

Needs torch, transformers (>= 5, qwen3_5_moe) and tokenizers; numpy. CPU works for a smoke run
(--steps 20). The pieces that need no torch (corpus, tokenizer, tensor names, the BF16 writer,
config files) are importable alone: tests/py/test_tiny_trained.py uses them.
"""
import argparse
import ast
import json
import math
import os
import sys
import sysconfig
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

VOCAB = 2048
DEPTH = 2  # draft depths the head is trained on (tulip chains K drafts; §3.3)
QWEN35_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# The language model's config (config.json text_config). 4 layers, 3 GDN : 1 attention.
TEXT = dict(
    hidden_size=256, num_hidden_layers=4, vocab_size=VOCAB,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=2, num_key_value_heads=1, head_dim=256,
    linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
    shared_expert_intermediate_size=256, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    max_position_embeddings=4096, router_aux_loss_coef=0.001,
)


def log(f, msg):
    print(msg, flush=True)
    if f:
        f.write(msg + "\n")
        f.flush()


# ====== Corpus and tokenizer (no torch) ======

def corpus_text():
    """The stdlib's docstrings (module, class, function; files and nodes in a fixed order) and
    pydoc's topic texts, joined by blank lines. Deterministic for one Python version."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__",
            "lib2to3", "turtledemo", "pydoc_data"}
    parts = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in skip)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    s = ast.get_docstring(node)
                    if s and len(s) >= 40:
                        parts.append(s.strip())
    try:
        from pydoc_data.topics import topics
        parts += [topics[k].strip() for k in sorted(topics)]
    except ImportError:
        pass
    return "\n\n".join(parts) + "\n"


def added_tokens():
    sys.path.insert(0, os.path.join(REPO, "tests", "py"))
    sys.path.insert(0, HERE)
    from tok_corpus import QWEN36_ADDED
    from tok_tiktoken_to_json import NOT_SPECIAL
    return QWEN36_ADDED, NOT_SPECIAL


def train_tokenizer(text, vocab=VOCAB):
    """Byte-level BPE of vocab ids: vocab - 33 learned (the 256 bytes first), then the 33 added
    tokens in Qwen3.6's order, so <|endoftext|> = vocab - 33, <|im_start|> + 1, <|im_end|> + 2."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        trainers
    from tokenizers import AddedToken
    added, not_special = added_tokens()
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(added), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator([text[i:i + 65536] for i in range(0, len(text), 65536)], trainer)
    if tok.get_vocab_size() != vocab - len(added):
        raise SystemExit(f"BPE trained {tok.get_vocab_size()} ids, wanted {vocab - len(added)}: "
                         "corpus too small for this vocabulary")
    tok.add_tokens([AddedToken(c, special=c not in not_special, normalized=False)
                    for c in added])
    ids = [tok.token_to_id(c) for c in added]
    assert ids == list(range(vocab - len(added), vocab)), ids
    return tok


def special_ids(vocab=VOCAB):
    base = vocab - 33
    return {"<|endoftext|>": base, "<|im_start|>": base + 1, "<|im_end|>": base + 2}


# ====== Checkpoint layout (no torch) ======

def head_shapes(c):
    """name -> shape of the MTP head (docs/model.md §3.1), experts stored per expert."""
    D, H, Hkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], \
        c["head_dim"]
    E, F, Fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    p = "mtp.layers.0."
    s = {"mtp.pre_fc_norm_embedding.weight": [D], "mtp.pre_fc_norm_hidden.weight": [D],
         "mtp.fc.weight": [D, 2 * D], "mtp.norm.weight": [D],
         p + "input_layernorm.weight": [D], p + "post_attention_layernorm.weight": [D],
         p + "self_attn.q_proj.weight": [2 * H * hd, D], p + "self_attn.k_proj.weight": [Hkv * hd, D],
         p + "self_attn.v_proj.weight": [Hkv * hd, D], p + "self_attn.o_proj.weight": [D, H * hd],
         p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
         p + "mlp.gate.weight": [E, D], p + "mlp.shared_expert_gate.weight": [1, D],
         p + "mlp.shared_expert.gate_proj.weight": [Fs, D],
         p + "mlp.shared_expert.up_proj.weight": [Fs, D],
         p + "mlp.shared_expert.down_proj.weight": [D, Fs]}
    for e in range(E):
        s[p + f"mlp.experts.{e}.gate_proj.weight"] = [F, D]
        s[p + f"mlp.experts.{e}.up_proj.weight"] = [F, D]
        s[p + f"mlp.experts.{e}.down_proj.weight"] = [D, F]
    return s


def trunk_shapes(c):
    """name -> shape of the trunk in the published layout (docs/model.md §2.7): names under
    model.language_model., fused 3-D experts, lm_head at top level."""
    D, V, E, F = c["hidden_size"], c["vocab_size"], c["num_experts"], c["moe_intermediate_size"]
    H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, ck = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    Fs = c["shared_expert_intermediate_size"]
    m = "model.language_model."
    s = {m + "embed_tokens.weight": [V, D], m + "norm.weight": [D], "lm_head.weight": [V, D]}
    for il, kind in enumerate(c["layer_types"]):
        p = f"{m}layers.{il}."
        s[p + "input_layernorm.weight"] = [D]
        s[p + "post_attention_layernorm.weight"] = [D]
        if kind == "full_attention":
            a = p + "self_attn."
            s.update({a + "q_proj.weight": [2 * H * hd, D], a + "k_proj.weight": [Hkv * hd, D],
                      a + "v_proj.weight": [Hkv * hd, D], a + "o_proj.weight": [D, H * hd],
                      a + "q_norm.weight": [hd], a + "k_norm.weight": [hd]})
        else:
            g, conv = p + "linear_attn.", 2 * nk * dk + nv * dv
            s.update({g + "in_proj_qkv.weight": [conv, D], g + "in_proj_z.weight": [nv * dv, D],
                      g + "in_proj_b.weight": [nv, D], g + "in_proj_a.weight": [nv, D],
                      g + "conv1d.weight": [conv, 1, ck], g + "dt_bias": [nv], g + "A_log": [nv],
                      g + "norm.weight": [dv], g + "out_proj.weight": [D, nv * dv]})
        x = p + "mlp."
        s.update({x + "gate.weight": [E, D], x + "experts.gate_up_proj": [E, 2 * F, D],
                  x + "experts.down_proj": [E, D, F], x + "shared_expert.gate_proj.weight": [Fs, D],
                  x + "shared_expert.up_proj.weight": [Fs, D],
                  x + "shared_expert.down_proj.weight": [D, Fs],
                  x + "shared_expert_gate.weight": [1, D]})
    return s


def bf16_bits(a):
    """float32 array -> uint16 bf16 bit patterns, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    """tensors: name -> float32 array, written as BF16 (names sorted): make_mtp_fixture's
    writer, with the {"format": "pt"} metadata transformers writes."""
    sys.path.insert(0, HERE)
    from make_mtp_fixture import st_write
    u = {k: (bf16_bits(v).astype(np.uint32) << 16).view(np.float32) for k, v in tensors.items()}
    st_write(path, {k: ("BF16", v) for k, v in u.items()}, metadata={"format": "pt"})


def write_checkpoint(out, tensors, tok, text=TEXT, versions=""):
    """The directory tulip opens: tensors (name -> float32 array, exactly trunk_shapes + head_shapes
    of text), tok (a tokenizers.Tokenizer) and the config files."""
    want = dict(trunk_shapes(text), **head_shapes(text))
    got = {k: list(v.shape) for k, v in tensors.items()}
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise SystemExit(f"checkpoint tensors differ from the layout: {diff[:8]}")
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    sp = special_ids(text["vocab_size"])
    eot, ims, ime = sp["<|endoftext|>"], sp["<|im_start|>"], sp["<|im_end|>"]
    D = text["hidden_size"]
    cfg = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": dict(
            text, model_type="qwen3_5_moe_text", hidden_act="silu", attention_bias=False,
            attention_dropout=0.0, attn_output_gate=True, full_attention_interval=4,
            mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
            mamba_ssm_dtype="float32", dtype="bfloat16", tie_word_embeddings=False,
            partial_rotary_factor=text["rope_parameters"]["partial_rotary_factor"],
            output_router_logits=False, initializer_range=0.02, use_cache=True,
            eos_token_id=eot, bos_token_id=eot),
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 8,
                          "out_hidden_size": D},
        "transformers_version": versions,
    }
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": eot, "do_sample": True,
                                   "eos_token_id": [ime, eot], "pad_token_id": eot,
                                   "temperature": 0.7, "top_k": 20, "top_p": 0.95},
        "tokenizer_config.json": {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
                                  "pad_token": "<|endoftext|>", "bos_token": None,
                                  "model_max_length": text["max_position_embeddings"],
                                  "add_prefix_space": False, "errors": "replace",
                                  "clean_up_tokenization_spaces": False},
    }
    for name, obj in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    tok.save(os.path.join(out, "tokenizer.json"))
    assert ims == ime - 1


# ====== The MTP head (torch) ======

def torch_modules():
    """Defines the torch classes (torch is imported only here and in train())."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Norm1p(nn.Module):
        """RMSNorm1p (docs/model.md §2.1): x / rms(x) * (1 + w), w zero-centred."""

        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(n))
            self.eps = eps

        def forward(self, x):
            x32 = x.float()
            y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * (1.0 + self.weight.float())).to(x.dtype)

    class Mlp(nn.Module):
        def __init__(self, d, f):
            super().__init__()
            self.gate_proj = nn.Linear(d, f, bias=False)
            self.up_proj = nn.Linear(d, f, bias=False)
            self.down_proj = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Moe(nn.Module):
        """§2.5: softmax router over all experts, top-k renormalised, SwiGLU experts, plus the
        shared expert scaled by sigmoid(shared_expert_gate). Every expert runs on every row (the
        head is small); the unchosen ones get weight 0, so the sum equals the sparse one."""

        def __init__(self, c):
            super().__init__()
            D = c["hidden_size"]
            self.k = c["num_experts_per_tok"]
            self.gate = nn.Linear(D, c["num_experts"], bias=False)
            self.experts = nn.ModuleList(Mlp(D, c["moe_intermediate_size"])
                                         for _ in range(c["num_experts"]))
            self.shared_expert = Mlp(D, c["shared_expert_intermediate_size"])
            self.shared_expert_gate = nn.Linear(D, 1, bias=False)

        def forward(self, x):
            pr = torch.softmax(self.gate(x).float(), dim=-1)
            top, idx = torch.topk(pr, self.k, dim=-1)
            w = torch.zeros_like(pr).scatter(-1, idx, top / top.sum(-1, keepdim=True))
            y = sum(w[..., e:e + 1].to(x.dtype) * ex(x) for e, ex in enumerate(self.experts))
            return y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    class Attn(nn.Module):
        """§2.2 gated attention: q_proj gives per head [q | gate]; q_norm/k_norm (RMSNorm1p per
        head), NeoX RoPE on the first n_rot dims (§2.3), GQA, softmax(q.k / sqrt(hd)) v, times
        sigmoid(gate), o_proj. The keys of a depth-d draft row (anchor p, position p + d - 1)
        are the depth-1 rows at positions <= p and the chain's own rows d' = 2..d at anchor p,
        which is what tulip's head cache holds while it chains drafts (§3.3)."""

        def __init__(self, c):
            super().__init__()
            D, self.H, self.Hkv, self.hd = (c["hidden_size"], c["num_attention_heads"],
                                            c["num_key_value_heads"], c["head_dim"])
            rp = c["rope_parameters"]
            self.n_rot = int(self.hd * rp["partial_rotary_factor"])
            self.theta = rp["rope_theta"]
            self.q_proj = nn.Linear(D, 2 * self.H * self.hd, bias=False)
            self.k_proj = nn.Linear(D, self.Hkv * self.hd, bias=False)
            self.v_proj = nn.Linear(D, self.Hkv * self.hd, bias=False)
            self.o_proj = nn.Linear(self.H * self.hd, D, bias=False)
            self.q_norm = Norm1p(self.hd, c["rms_norm_eps"])
            self.k_norm = Norm1p(self.hd, c["rms_norm_eps"])

        def rope(self, x, pos):
            """x [B, S, h, hd], pos [S]: pairs (i, i + n_rot/2) for i < n_rot/2."""
            half = self.n_rot // 2
            inv = self.theta ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2
                                 / self.n_rot)
            ang = pos.to(torch.float64)[:, None] * inv[None, :]
            cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
            sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
            a, b = x[..., :half], x[..., half:self.n_rot]
            return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., self.n_rot:]], -1)

        def forward(self, x, depth, cache):
            """x [B, S, D] rows of one depth (1-based), row p at position p + depth - 1.
            cache: list of (k, v) [B, S, Hkv, hd] of the depths before; this one's is added."""
            B, S, _ = x.shape
            H, Hkv, hd = self.H, self.Hkv, self.hd
            qg = self.q_proj(x).view(B, S, H, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:]
            pos = torch.arange(S, device=x.device) + (depth - 1)
            q = self.rope(self.q_norm(q), pos)
            k = self.rope(self.k_norm(self.k_proj(x).view(B, S, Hkv, hd)), pos)
            v = self.v_proj(x).view(B, S, Hkv, hd)
            cache.append((k, v))
            rep = H // Hkv
            qh = q.transpose(1, 2)  # [B, H, S, hd]
            k1 = cache[0][0].repeat_interleave(rep, 2).transpose(1, 2)
            v1 = cache[0][1].repeat_interleave(rep, 2).transpose(1, 2)
            s1 = qh @ k1.transpose(-1, -2) / math.sqrt(hd)  # [B, H, S(anchor), S(key)]
            mask = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
            s1 = s1.masked_fill(~mask, float("-inf"))
            if depth == 1:
                o = torch.softmax(s1.float(), -1).to(v1.dtype) @ v1
            else:
                kx = torch.stack([kv[0] for kv in cache[1:]], 3).repeat_interleave(rep, 2)
                vx = torch.stack([kv[1] for kv in cache[1:]], 3).repeat_interleave(rep, 2)
                sx = torch.einsum("bhsd,bshmd->bhsm", qh, kx) / math.sqrt(hd)
                pr = torch.softmax(torch.cat([s1, sx], -1).float(), -1).to(v1.dtype)
                o = pr[..., :S] @ v1 + torch.einsum("bhsm,bshmd->bhsd", pr[..., S:], vx)
            o = o.transpose(1, 2) * torch.sigmoid(gate)
            return self.o_proj(o.reshape(B, S, H * hd))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            D, eps = c["hidden_size"], c["rms_norm_eps"]
            self.input_layernorm = Norm1p(D, eps)
            self.self_attn = Attn(c)
            self.post_attention_layernorm = Norm1p(D, eps)
            self.mlp = Moe(c)

    class MtpHead(nn.Module):
        """docs/model.md §3.2; parameter names are the checkpoint's without the "mtp." prefix."""

        def __init__(self, c):
            super().__init__()
            D, eps = c["hidden_size"], c["rms_norm_eps"]
            self.pre_fc_norm_embedding = Norm1p(D, eps)
            self.pre_fc_norm_hidden = Norm1p(D, eps)
            self.fc = nn.Linear(2 * D, D, bias=False)
            self.layers = nn.ModuleList([Block(c)])
            self.norm = Norm1p(D, eps)

        def forward(self, embed, hidden, tokens):
            """embed [V, D] (the trunk's), hidden [B, S, D] (the trunk's final-normed hidden at
            anchors 0..S-1), tokens: one [B, S] per depth d (the token fed with row p: the one at
            position p + d). Returns one h' [B, S, D] per depth; logits = lm_head . h'."""
            cache, outs, h = [], [], hidden
            blk = self.layers[0]
            for d, tk in enumerate(tokens, start=1):
                e = self.pre_fc_norm_embedding(F.embedding(tk, embed))
                t = self.fc(torch.cat([e, self.pre_fc_norm_hidden(h)], -1))
                t = t + blk.self_attn(blk.input_layernorm(t), d, cache)
                t = t + blk.mlp(blk.post_attention_layernorm(t))
                h = self.norm(t)
                outs.append(h)
            return outs

    return MtpHead


# ====== Checking the head against the numpy reference of tests/data/tiny-mtp ======

def st_read_f32(path):
    """safetensors -> name -> numpy array (BF16 widened to float32): make_mtp_fixture's reader."""
    sys.path.insert(0, HERE)
    from make_mtp_fixture import st_read
    return {k: a for k, (_, a) in st_read(path).items()}


def check_head(MtpHead, f):
    """The head in float64 on tiny-mtp's weights and HF hidden states == mtp_ref.safetensors
    (rows, then the chain of drafts from the last row as tulip chains them)."""
    import torch
    d = os.path.join(REPO, "tests", "data", "tiny-mtp")
    if not os.path.exists(os.path.join(d, "mtp_ref.safetensors")):
        log(f, "head check: tests/data/tiny-mtp not found, skipped")
        return
    c = json.load(open(os.path.join(d, "config.json")))["text_config"]
    W = {}
    for n in sorted(os.listdir(d)):
        if n.startswith("model-"):
            W.update(st_read_f32(os.path.join(d, n)))
    ref = st_read_f32(os.path.join(d, "mtp_ref.safetensors"))
    head = MtpHead(c).double()
    head.load_state_dict({k[4:]: torch.from_numpy(v).double() for k, v in W.items()
                          if k.startswith("mtp.")})
    emb = torch.from_numpy(W["model.language_model.embed_tokens.weight"]).double()
    lm = torch.from_numpy(W["lm_head.weight"]).double()
    hid = torch.from_numpy(ref["hidden"]).double()[None]
    tok = torch.from_numpy(ref["tokens"]).long()[None]
    with torch.no_grad():
        rows = (head(emb, hid, [tok])[0] @ lm.T)[0].numpy()
        T, chain = tok.shape[1], ref["chain_tokens"].astype(np.int64)
        toks = [tok] + [torch.full((1, T), int(t)) for t in chain]
        outs = head(emb, hid, toks)
        chain_lg = np.stack([(o @ lm.T)[0, T - 1].numpy() for o in outs[1:]])
    e1 = np.abs(rows - ref["logits"]).max()
    e2 = np.abs(chain_lg - ref["chain_logits"]).max()
    log(f, f"head check vs tests/data/tiny-mtp numpy reference: rows max |dlogit| {e1:.2e}, "
        f"chain of {len(chain)} max |dlogit| {e2:.2e}")
    if not (e1 < 1e-5 and e2 < 1e-5):
        raise SystemExit("the MTP head disagrees with the reference of docs/model.md §3")


# ====== Training (torch, transformers) ======

def official_name(k):
    return "model.language_model." + k[len("model."):] if k.startswith("model.") else k


def batches(ids, n, seq, gen, device):
    import torch
    start = torch.randint(0, len(ids) - seq - 1, (n,), generator=gen)
    return torch.stack([ids[s:s + seq] for s in start.tolist()]).to(device)


def losses(model, head, x, aux_fn, depth=DEPTH):
    """x [B, S] -> (trunk CE + router aux, head loss, stats). The head sees the trunk's detached
    final-normed hidden and detached embedding / lm_head; depth d's row p is fed the token at
    p + d and predicts the one at p + d + 1, against the true token and the trunk's law there."""
    import torch
    import torch.nn.functional as F
    c = model.config
    out = model.model(input_ids=x, output_router_logits=True)
    hid = out.last_hidden_state
    logits = model.lm_head(hid)
    V = logits.shape[-1]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), x[:, 1:].reshape(-1))
    aux = aux_fn(out.router_logits, c.num_experts, c.num_experts_per_tok, None)
    B, S = x.shape
    A = S - 1 - depth  # anchors with a target at every depth
    emb, lm = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    toks = [x[:, d:d + A] for d in range(1, depth + 1)]
    hs = head(emb, hid[:, :A].detach(), toks)
    lg_t = logits.detach().float()
    loss_h, st = 0.0, {"ce": ce.detach()}  # tensors: read (a device sync) only when printed
    for d, h in enumerate(hs, start=1):
        lg = (h @ lm.T).float()
        tgt = x[:, d + 1:d + 1 + A]
        teach = torch.softmax(lg_t[:, d:d + A], -1)
        hard = F.cross_entropy(lg.reshape(-1, V), tgt.reshape(-1))
        soft = -(teach * torch.log_softmax(lg, -1)).sum(-1).mean()
        loss_h = loss_h + 0.5 * (hard + soft)
        st[f"acc{d}"] = (lg.argmax(-1) == tgt).float().mean()
        st[f"agree{d}"] = (lg.argmax(-1) == lg_t[:, d:d + A].argmax(-1)).float().mean()
    return ce + c.router_aux_loss_coef * aux, loss_h / depth, st


def evaluate(model, head, ids, seq, device, aux_fn, n_batch=8, bs=16):
    import torch
    n = min(n_batch * bs, (len(ids) - 1) // seq)
    x = ids[:n * seq].view(n, seq).to(device)
    agg = {}
    with torch.no_grad():
        for i in range(0, n, bs):
            _, _, st = losses(model, head, x[i:i + bs], aux_fn)
            for k, v in st.items():
                agg[k] = agg.get(k, 0.0) + float(v) * len(x[i:i + bs]) / n
    return agg


def fmt(st):
    return " ".join(f"{k} {float(v):.3f}" for k, v in st.items())


def train(args):
    import torch
    import transformers
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as cfgmod
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modmod

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    f = open(os.path.join(args.out, "train-log.txt"), "w")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log(f, f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, device {device}, seed {args.seed}")
    MtpHead = torch_modules()
    check_head(MtpHead, f)

    text = corpus_text()
    tok = train_tokenizer(text)
    ids = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    n_held = len(ids) // 20
    train_ids, held_ids = ids[:-n_held], ids[-n_held:]
    log(f, f"corpus: {len(text)} chars of stdlib docstrings and pydoc topics, {len(ids)} tokens "
        f"({len(text) / len(ids):.2f} chars/token), {n_held} held out; BPE vocab {VOCAB}")

    tcfg = cfgmod.Qwen3_5MoeTextConfig(**TEXT)
    tcfg._attn_implementation = "sdpa"
    model = modmod.Qwen3_5MoeForCausalLM(tcfg).float().to(device)
    head = fit(args, f, model, MtpHead(TEXT).float().to(device), train_ids, held_ids, device,
               modmod.load_balancing_loss_func)
    report(args, f, model, head, tok, held_ids, device, modmod.load_balancing_loss_func,
           transformers.__version__)
    log(f, f"done in {time.time() - t0:.1f}s in all")
    f.close()


def fit(args, f, model, head, train_ids, held_ids, device, aux_fn):
    """The training loop: AdamW, 50 warm-up steps, cosine to 10% over --minutes (or --steps).
    Every --log-every steps a quick held-out loss; the weights of the best one are kept (a few
    MB of text for millions of parameters: later epochs can overfit)."""
    import torch
    for n_, p in head.named_parameters():  # HF-like init; norms stay 0 (scale 1 + w)
        if not n_.endswith("norm.weight") and "norm_" not in n_:
            torch.nn.init.normal_(p, std=0.02)
    n_trunk = sum(p.numel() for p in model.parameters())
    n_head = sum(p.numel() for p in head.parameters())
    log(f, f"trunk {n_trunk / 1e6:.2f} M parameters, head {n_head / 1e6:.2f} M; "
        f"batch {args.batch} x {args.seq} tokens")
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    head.train()
    budget, step, t_train = args.minutes * 60.0, 0, time.time()
    best = (float("inf"), 0, None)
    while True:
        frac = step / args.steps if args.steps else (time.time() - t_train) / budget
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches(train_ids, args.batch, args.seq, gen, device)
        lt, lh, st = losses(model, head, x, aux_fn)
        opt.zero_grad(set_to_none=True)
        (lt + lh).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0:
            best = checkpoint_best(args, f, model, head, held_ids, device, aux_fn, best, step, lr,
                                   st, time.time() - t_train)
    if step % args.log_every:
        best = checkpoint_best(args, f, model, head, held_ids, device, aux_fn, best, step, lr, st,
                               time.time() - t_train)
    model.load_state_dict(best[2][0])
    head.load_state_dict(best[2][1])
    log(f, f"trained {step} steps in {time.time() - t_train:.1f}s; kept step {best[1]} "
        f"(held-out trunk loss {best[0]:.3f})")
    return head


def checkpoint_best(args, f, model, head, held_ids, device, aux_fn, best, step, lr, st, secs):
    """Logs the step with a held-out loss on 2 batches; returns best updated (loss, step,
    (trunk state, head state) copied)."""
    model.eval()
    head.eval()
    ev = evaluate(model, head, held_ids, args.seq, device, aux_fn, n_batch=2)
    model.train()
    head.train()
    log(f, f"step {step:5d} {secs:6.1f}s lr {lr:.2e} train {fmt(st)} | held-out ce "
        f"{ev['ce']:.3f} agree1 {ev['agree1']:.3f}")
    if ev["ce"] >= best[0]:
        return best
    copy = ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {k: v.detach().clone() for k, v in head.state_dict().items()})
    return (ev["ce"], step, copy)


def report(args, f, model, head, tok, held_ids, device, aux_fn, versions):
    """Held-out figures, the checkpoint, a greedy sample, the simulated acceptance."""
    model.eval()
    head.eval()
    ev = evaluate(model, head, held_ids, args.seq, device, aux_fn)
    log(f, f"held-out: trunk loss "
        f"{ev['ce']:.3f} (ppl {math.exp(ev['ce']):.1f}); MTP head top-1 accuracy by depth "
        + ", ".join(f"{d}: {ev[f'acc{d}']:.3f}" for d in range(1, DEPTH + 1))
        + "; head argmax == trunk argmax (greedy acceptance estimate) "
        + ", ".join(f"{d}: {ev[f'agree{d}']:.3f}" for d in range(1, DEPTH + 1)))

    tensors = {official_name(k): v.detach().float().cpu().numpy()
               for k, v in model.state_dict().items()}
    tensors.update({"mtp." + k: v.detach().float().cpu().numpy()
                    for k, v in head.state_dict().items()})
    write_checkpoint(args.out, tensors, tok, versions=versions)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    sample = sample_text(model, tok, device)
    log(f, f"greedy sample from 'The': {sample!r}")
    model, head, tok = load_checkpoint(args.out, device)  # the BF16 weights tulip reads
    pos = simulate_spec(model, head, tok, device, args.sim_k, args.sim_gen, args.sim_prompts)
    log(f, f"simulated greedy speculation on the written checkpoint (K {args.sim_k}, "
        f"{args.sim_prompts} held-out prompts, {args.sim_gen} tokens each; tools/spec_measure.py "
        "should find the same in tulip): accepted by draft position "
        + " ".join(f"{i + 1}: {a}/{d}" for i, (a, d) in enumerate(pos)))
    log(f, f"wrote {args.out} (model.safetensors {size / 2**20:.1f} MiB BF16)")


def held_out_prompts(n, chars=300):
    """n passages of the held-out last 5% of the corpus, each cut at spaces (spec_measure.py
    feeds the same ones to tulip)."""
    text = corpus_text()
    held = text[len(text) * 19 // 20:]
    step = max(len(held) // n, chars)
    out = []
    for i in range(n):
        p = held[i * step:i * step + chars]
        out.append(p[p.find(" ") + 1:p.rfind(" ")])
    return out


def simulate_spec(model, head, tok, device, k=2, gen=64, n_prompts=4):
    """Greedy speculative decoding as tulip runs it (engine.c spec_finish, backend draft: draft 1
    from the last fed position's hidden and the sampled token, draft j + 1 from draft j's h'),
    recomputing everything each step: [(accepted_i, drafted_i)] per draft position, summed over
    held-out prompts. What tools/spec_measure.py should find in tulip on the same checkpoint."""
    import torch
    emb, lm = model.model.embed_tokens.weight, model.lm_head.weight
    pos = [[0, 0] for _ in range(k)]
    with torch.no_grad():
        for text in held_out_prompts(n_prompts):
            x = tok.encode(text).ids
            x.append(int(model(input_ids=torch.tensor([x], device=device)).logits[0, -1].argmax()))
            made = 1
            while made < gen:
                kk = min(k, gen - made - 1)
                if kk == 0:
                    break
                ids = torch.tensor([x], device=device)
                hid = model.model(input_ids=ids[:, :-1]).last_hidden_state  # positions 0..len-1
                drafts, toks = [], [ids[:, 1:]]
                for j in range(kk):
                    hs = head(emb, hid, toks)
                    drafts.append(int((hs[-1][0, -1] @ lm.T).argmax()))
                    toks.append(torch.full_like(toks[0], drafts[-1]))  # row len-1 matters
                acc = 0
                for j in range(kk):  # as tl_spec_stats counts: drafted_pos[j] for every j < kk
                    pos[j][1] += 1
                for j in range(kk):
                    g = int(model(input_ids=torch.tensor([x], device=device)).logits[0, -1].argmax())
                    if g != drafts[j]:
                        x.append(g)
                        break
                    x.append(g)
                    pos[j][0] += 1
                    acc += 1
                else:  # all accepted: the bonus token
                    x.append(int(model(input_ids=torch.tensor([x], device=device)).logits[0, -1]
                                 .argmax()))
                made += acc + 1
    return pos


def sample_text(model, tok, device, prompt="The", n=40):
    import torch
    x = torch.tensor([tok.encode(prompt).ids], device=device)
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=x).logits[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], 1)
    return tok.decode(x[0].tolist())


def load_checkpoint(d, device):
    """A directory written by write_checkpoint -> (HF trunk, MtpHead, tokenizer), fp32."""
    import torch
    from tokenizers import Tokenizer
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as cfgmod
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modmod
    text = json.load(open(os.path.join(d, "config.json")))["text_config"]
    tcfg = cfgmod.Qwen3_5MoeTextConfig(**text)
    tcfg._attn_implementation = "sdpa"
    model = modmod.Qwen3_5MoeForCausalLM(tcfg).float()
    head = torch_modules()(text).float()
    W = {k: torch.from_numpy(v) for k, v in
         st_read_f32(os.path.join(d, "model.safetensors")).items()}
    model.load_state_dict({("model." + k[len("model.language_model."):]
                            if k.startswith("model.language_model.") else k): v
                           for k, v in W.items() if not k.startswith("mtp.")})
    head.load_state_dict({k[4:]: v for k, v in W.items() if k.startswith("mtp.")})
    return (model.to(device).eval(), head.to(device).eval(),
            Tokenizer.from_file(os.path.join(d, "tokenizer.json")))


def simulate(args):
    import torch
    model, head, tok = load_checkpoint(args.simulate, torch.device(args.device))
    pos = simulate_spec(model, head, tok, torch.device(args.device), k=args.sim_k,
                        gen=args.sim_gen, n_prompts=args.sim_prompts)
    print(f"{args.simulate}: simulated greedy speculation, K {args.sim_k}, {args.sim_prompts} "
          f"held-out prompts, {args.sim_gen} tokens each; accepted by draft position: "
          + " ".join(f"{i + 1}: {a}/{d}" for i, (a, d) in enumerate(pos)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="checkpoint directory to write")
    ap.add_argument("--simulate", metavar="DIR", help="no training: load DIR and simulate greedy "
                    "speculation in PyTorch (the per-position counts tulip should report)")
    ap.add_argument("--sim-k", type=int, default=3)
    ap.add_argument("--sim-gen", type=int, default=64)
    ap.add_argument("--sim-prompts", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=4.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=0, help="a fixed step count instead (smoke runs)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.simulate:
        return simulate(args)
    if not args.out:
        ap.error("--out DIR is required")
    if args.steps < 0 or (not args.steps and args.minutes <= 0):
        ap.error("--minutes must be > 0 (or --steps N > 0)")
    train(args)


if __name__ == "__main__":
    main()
