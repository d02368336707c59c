#!/usr/bin/env python3
"""Writes a full-size random-weight Qwen3.6-35B-A3B checkpoint in the MLX 4-bit affine format,
laid out as `tulip quantize` writes it (src/model/quant.c), for timing the loader where no real
checkpoint can be had (the GPU machine has no network).

What comes out (docs/model.md §5.3, quant.c build_plan / tl_quantize_checkpoint):
  * tensor names language_model.model.* and language_model.lm_head, in quant.c's plan order:
    embed_tokens, norm, lm_head, then per layer the two norms, the mixer (full attention:
    q/k/v/o_proj + q/k_norm; linear attention: in_proj_qkv/z/b/a, conv1d [C, K, 1], dt_bias,
    A_log, norm, out_proj), mlp.gate, shared_expert.{gate,up,down}_proj, shared_expert_gate,
    switch_mlp.{gate,up,down}_proj stacked [E, out, in];
  * every linear whose input width divides by the group (64) is affine-quantized: .weight U32
    [.., out, in*bits/32], .scales and .biases BF16 [.., out, in/64]; 4 bits, except mlp.gate and
    mlp.shared_expert_gate at 8 bits (recorded per module in config.json "quantization");
    a linear that cannot be quantized stays BF16 (never the case at the production shape);
  * norms, conv1d, dt_bias, A_log as BF16 vectors; RMSNorm1p weights already offset (+1), so
    their mean is near 1 and the loader's MLX norm check (weights.c, TL_NORM_CHECK) passes;
  * shards of --shard-gb GiB (5 by default, as `tulip quantize --shard-gb`), consecutive units up
    to that size, named model-0000i-of-0000n.safetensors plus model.safetensors.index.json
    (a single model.safetensors and no index when everything fits in one, as quant.c does);
  * each header is compact JSON padded with spaces to a multiple of 8 bytes, so the data
    section starts 8-aligned in the mapping and tl_st_parse (st.c) uses the file in place
    instead of copying it into an aligned buffer;
  * config.json (the published multimodal wrapper with text_config, plus "quantization" and
    "quantization_config"), generation_config.json, and RANDOM_WEIGHTS.txt saying what this is.
    No tokenizer: `tulip run --prompt-ids ...` never loads one (src/cli/run.c loads
    tokenizer.json only for -p); give --tokenizer PATH for text prompts.

Values are random but shaped like real ones: packed nibbles uniform, scales positive BF16 in
[2^-9, 2^-7) (about 2e-3..8e-3) for 4-bit and [2^-13, 2^-11) for 8-bit, biases about -8 or -7
times the scale (-128 or -127 at 8 bits), so dequantized weights are centred on 0 with a standard
deviation of about 4.6 scales (~0.02 at 4 bits), norms 1 + small noise, linear_attn.norm
near 1, A_log = log(U(1, 16)), dt_bias near 1, conv1d U(-0.5, 0.5).

Speed: the packed weights (97% of the bytes) are slices of one random block (--block-mb,
64 MiB) taken at different offsets, written with os.pwrite from several threads (the GIL is
released during the write), so the time is the disk's (or the page cache's).

Python standard library only (no numpy, torch or safetensors needed).

Usage:
  python3 tools/make_random_mlx4.py --out /tmp/ckpt                 # production, ~19.5 GB
  python3 tools/make_random_mlx4.py --out /tmp/ckpt4 --layers 4     # quick test, ~2.4 GB
  build/cpu/tulip info --model /tmp/ckpt
"""
import argparse
import array
import json
import math
import os
import random
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GROUP = 64
BITS = 4
ROUTER_BITS = 8  # mlp.gate and mlp.shared_expert_gate (MLX quant_predicate, quant.c)

# config.json of Qwen/Qwen3.6-35B-A3B as docs/model.md §1.2-1.4 gives it (the HF input `tulip
# quantize` would copy); "quantization" blocks are added at the end as quant.c write_config does.
PRODUCTION_CONFIG = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "language_model_only": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "vocab_size": 248320,
        "layer_types": None,  # filled in from the layer count
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 262144,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "bos_token_id": 248044,
        "eos_token_id": 248044,
        "pad_token_id": None,
        "dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "qwen3_5_moe_vision",
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2048,
        "hidden_act": "gelu_pytorch_tanh",
        "deepstack_visual_indexes": [],
    },
    "transformers_version": "4.57.1",
}

GENERATION_CONFIG = {
    "bos_token_id": 248044,
    "do_sample": True,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "temperature": 1.0,
    "top_k": 20,
    "top_p": 0.95,
}

DTYPE_SIZE = {"U32": 4, "BF16": 2}


def die(msg):
    print("make_random_mlx4: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- BF16 helpers (stdlib only) ----

def bf16_bits(x):
    """float -> bf16 bit pattern, round to nearest even (as tl_f32_to_bf16)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def bf16_vec(vals):
    """list of floats -> little-endian BF16 bytes."""
    f = array.array("f", vals)
    u = array.array("I")
    u.frombytes(f.tobytes())
    h = array.array("H", [((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF for x in u])
    if sys.byteorder != "little":
        h.byteswap()
    return h.tobytes()


def interleave(lo, hi):
    """Two byte strings of equal length -> lo[0] hi[0] lo[1] hi[1] ... (little-endian u16s)."""
    out = bytearray(2 * len(lo))
    out[0::2] = lo
    out[1::2] = hi
    return bytes(out)


def scale_bias_blocks(rand_lo, bits):
    """Scales and their biases as BF16 byte blocks built from random low bytes.

    A scale is the bf16 (H << 8) | L with L random and H fixed, i.e. the exponent is 2*H + L>>7
    and the mantissa is L's low 7 bits: positive values in [2^(2H-127), 2^(2H-125)). Its bias is
    -k * scale rounded to bf16, k = 2^(bits-1) or 2^(bits-1) - 1 (by L's lowest bit): an integer
    multiple of the scale before rounding, as MLX's affine quantizer makes it, and zero-mean over
    random codes. The bias is
    looked up per L by translate, so scales[i] and biases[i] pair up when read at one offset."""
    hi = 59 if bits == 4 else 57  # 4-bit: [2^-9, 2^-7); 8-bit: [2^-13, 2^-11)
    lo_tab, hi_tab = bytearray(256), bytearray(256)
    for L in range(256):
        k = float((1 << (bits - 1)) - (L & 1))
        b = bf16_bits(-k * bf16_value((hi << 8) | L))
        lo_tab[L], hi_tab[L] = b & 0xFF, b >> 8
    scales = interleave(rand_lo, bytes([hi]) * len(rand_lo))
    biases = interleave(rand_lo.translate(bytes(lo_tab)), rand_lo.translate(bytes(hi_tab)))
    return scales, biases


# ---- the plan (quant.c build_plan) ----

class Unit:
    """One planned output: a linear ('mat': 3 tensors when quantized, else 1 BF16 tensor) or a
    1-D/conv vector ('vec': BF16 bytes given)."""

    def __init__(self, name, kind, bytes_, align4):
        self.name, self.kind, self.bytes, self.align4 = name, kind, bytes_, align4
        self.shard = 0


def plan_mat(units, qcfg, module, rows, cols, lead, bits, record):
    q = cols % GROUP == 0 and cols % (32 // bits) == 0
    n = lead if lead else 1
    u = Unit(module, "mat", 0, 1)
    u.rows, u.cols, u.lead, u.bits, u.quant = rows, cols, lead, bits, q
    total_rows = n * rows
    if q:
        u.bytes = total_rows * cols * bits // 8 + 2 * total_rows * (cols // GROUP) * 2
        if record:
            qcfg[module] = {"group_size": GROUP, "bits": bits}
    else:  # stays BF16, as a BF16 source would
        u.bytes = total_rows * cols * 2
        u.align4 = int(u.bytes % 4 == 0)
    units.append(u)


def plan_vec(units, name, shape, data):
    nbytes = len(data)
    u = Unit(name, "vec", nbytes, int(nbytes % 4 == 0))
    u.shape, u.data = shape, data
    units.append(u)


def build_plan(tc, n_layer, layer_kinds, tie, rng):
    d = tc["hidden_size"]
    V = tc["vocab_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    kd, vdh = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    K = tc["linear_conv_kernel_dim"]
    E, ff, fs = tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    conv = 2 * nk * kd + nv * vdh
    vd = nv * vdh

    def norm1p(n):  # RMSNorm1p, stored offset (+1) as MLX does
        return bf16_vec([1.0 + rng.gauss(0.0, 0.05) for _ in range(n)])

    P = "language_model.model."
    units = []
    qcfg = {"group_size": GROUP, "bits": BITS, "mode": "affine"}
    plan_mat(units, qcfg, P + "embed_tokens", V, d, 0, BITS, False)
    plan_vec(units, P + "norm.weight", [d], norm1p(d))
    if not tie:
        plan_mat(units, qcfg, "language_model.lm_head", V, d, 0, BITS, False)
    for il in range(n_layer):
        L = "%slayers.%d." % (P, il)
        plan_vec(units, L + "input_layernorm.weight", [d], norm1p(d))
        plan_vec(units, L + "post_attention_layernorm.weight", [d], norm1p(d))
        if layer_kinds[il] == "full_attention":
            plan_mat(units, qcfg, L + "self_attn.q_proj", nh * hd * 2, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "self_attn.k_proj", nkv * hd, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "self_attn.v_proj", nkv * hd, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "self_attn.o_proj", d, nh * hd, 0, BITS, False)
            plan_vec(units, L + "self_attn.q_norm.weight", [hd], norm1p(hd))
            plan_vec(units, L + "self_attn.k_norm.weight", [hd], norm1p(hd))
        else:
            plan_mat(units, qcfg, L + "linear_attn.in_proj_qkv", conv, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "linear_attn.in_proj_z", vd, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "linear_attn.in_proj_b", nv, d, 0, BITS, False)
            plan_mat(units, qcfg, L + "linear_attn.in_proj_a", nv, d, 0, BITS, False)
            plan_vec(units, L + "linear_attn.conv1d.weight", [conv, K, 1],
                     bf16_vec([rng.random() - 0.5 for _ in range(conv * K)]))
            plan_vec(units, L + "linear_attn.dt_bias", [nv],
                     bf16_vec([1.0 + rng.gauss(0.0, 0.2) for _ in range(nv)]))
            plan_vec(units, L + "linear_attn.A_log", [nv],
                     bf16_vec([math.log(rng.uniform(1.0, 16.0)) for _ in range(nv)]))
            plan_vec(units, L + "linear_attn.norm.weight", [vdh],
                     bf16_vec([1.0 + rng.gauss(0.0, 0.05) for _ in range(vdh)]))
            plan_mat(units, qcfg, L + "linear_attn.out_proj", d, vd, 0, BITS, False)
        plan_mat(units, qcfg, L + "mlp.gate", E, d, 0, ROUTER_BITS, True)
        plan_mat(units, qcfg, L + "mlp.shared_expert.gate_proj", fs, d, 0, BITS, False)
        plan_mat(units, qcfg, L + "mlp.shared_expert.up_proj", fs, d, 0, BITS, False)
        plan_mat(units, qcfg, L + "mlp.shared_expert.down_proj", d, fs, 0, BITS, False)
        plan_mat(units, qcfg, L + "mlp.shared_expert_gate", 1, d, 0, ROUTER_BITS, True)
        plan_mat(units, qcfg, L + "mlp.switch_mlp.gate_proj", ff, d, E, BITS, False)
        plan_mat(units, qcfg, L + "mlp.switch_mlp.up_proj", ff, d, E, BITS, False)
        plan_mat(units, qcfg, L + "mlp.switch_mlp.down_proj", d, ff, E, BITS, False)
    return units, qcfg


def unit_entries(u):
    """(name, dtype, shape, nbytes, source) per tensor of a unit, in quant.c unit_entries order.
    source: ('w', bits) packed words, ('s', bits) scales, ('b', bits) biases, ('f',) random BF16,
    ('v', bytes) given bytes."""
    if u.kind == "vec":
        return [(u.name, "BF16", u.shape, u.bytes, ("v", u.data))]
    lead = [u.lead] if u.lead else []
    n = u.lead if u.lead else 1
    rows = n * u.rows
    if not u.quant:
        return [(u.name + ".weight", "BF16", lead + [u.rows, u.cols], rows * u.cols * 2, ("f",))]
    ng = u.cols // GROUP
    wpr = u.cols * u.bits // 32
    return [
        (u.name + ".weight", "U32", lead + [u.rows, wpr], rows * wpr * 4, ("w", u.bits)),
        (u.name + ".scales", "BF16", lead + [u.rows, ng], rows * ng * 2, ("s", u.bits)),
        (u.name + ".biases", "BF16", lead + [u.rows, ng], rows * ng * 2, ("b", u.bits)),
    ]


def layer_types_for(n):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def main():
    ap = argparse.ArgumentParser(
        description="Write a random-weight Qwen3.6-35B-A3B checkpoint in the MLX 4-bit affine "
                    "format, laid out as `tulip quantize` writes it.")
    ap.add_argument("--out", required=True, help="output directory (created; old shards removed)")
    ap.add_argument("--layers", type=int, default=None,
                    help="number of layers (default 40; layer i is full attention when "
                         "(i+1) %% 4 == 0, else linear attention)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random value (default 0)")
    ap.add_argument("--shard-gb", type=float, default=5.0,
                    help="shard size in GiB, as tulip quantize --shard-gb (default 5)")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1),
                    help="writer threads (default min(16, cores))")
    ap.add_argument("--block-mb", type=int, default=64,
                    help="MiB of random packed words reused at different offsets (default 64)")
    ap.add_argument("--fsync", action="store_true",
                    help="fsync every file before reporting the time (the data is on disk, not "
                         "only in the page cache)")
    ap.add_argument("--config-from", metavar="CONFIG_JSON",
                    help="(tests) take config.json and every shape from this HF config instead of "
                         "the built-in Qwen3.6-35B-A3B one, e.g. tests/data/tiny-a/config.json, "
                         "to compare the layout with `tulip quantize --in` that directory")
    a = ap.parse_args()

    if sys.byteorder != "little":
        die("this writer assumes a little-endian host")
    if a.config_from:
        with open(a.config_from) as f:
            cfg = json.load(f)
    else:
        cfg = json.loads(json.dumps(PRODUCTION_CONFIG))
    tc = cfg.get("text_config", cfg)
    n_layer = a.layers if a.layers is not None else tc["num_hidden_layers"]
    if n_layer < 1 or n_layer > 64:
        die("--layers must be in 1..64")
    if a.layers is not None or not a.config_from:
        tc["num_hidden_layers"] = n_layer
        tc["layer_types"] = layer_types_for(n_layer)
    every = tc.get("full_attention_interval") or 4
    kinds = tc.get("layer_types") or [
        "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layer)]
    if "tie_word_embeddings" in tc:
        tie = bool(tc["tie_word_embeddings"])
    else:
        tie = bool(cfg.get("tie_word_embeddings", False))
    if not (a.shard_gb > 0):
        a.shard_gb = 5.0
    shard_bytes = int(a.shard_gb * (1 << 30))
    threads = max(1, a.threads)

    t_start = time.time()
    rng = random.Random(a.seed)

    # ---- random blocks ----
    block_bytes = max(1, a.block_mb) << 20
    wblock = random.Random(a.seed * 1000003 + 1).randbytes(block_bytes)
    sb_vals = max(1 << 16, block_bytes // 8)  # scale values per bits (8 MiB of scales at 64 MiB)
    sblocks = {}
    for bits in (4, 8):
        lo = random.Random(a.seed * 1000003 + 2 + bits).randbytes(sb_vals)
        sblocks[bits] = scale_bias_blocks(lo, bits)
    fblock = bf16_vec([rng.gauss(0.0, 0.02) for _ in range(1 << 16)])  # unquantizable linears

    units, qcfg = build_plan(tc, n_layer, kinds, tie, rng)

    # ---- shards: consecutive units up to shard_bytes each (quant.c) ----
    n_shards, cur = 0, 0
    for u in units:
        if cur and cur + u.bytes > shard_bytes:
            n_shards += 1
            cur = 0
        u.shard = n_shards
        cur += u.bytes
    n_shards += 1

    os.makedirs(a.out, exist_ok=True)
    for fn in os.listdir(a.out):  # shards and index of an earlier run with another shard count
        if fn == "model.safetensors" or fn == "model.safetensors.index.json" or (
                fn.startswith("model-") and fn.endswith(".safetensors")):
            os.unlink(os.path.join(a.out, fn))

    def source_view(src, nbytes, start):
        """memoryview pieces (<= one block each) of nbytes from a source, starting at start."""
        if src[0] == "v":
            return [memoryview(src[1])]
        if src[0] == "w":
            blk = wblock
        elif src[0] == "f":
            blk = fblock
        else:
            blk = sblocks[src[1]][0 if src[0] == "s" else 1]
        mv = memoryview(blk)
        out, pos, left = [], start % len(blk), nbytes
        while left:
            n = min(left, len(blk) - pos)
            out.append(mv[pos:pos + n])
            left -= n
            pos = 0
        return out

    jobs = []  # (fd, offset, memoryview)
    fds = []
    weight_map = {}
    total_data = 0
    file_bytes = 0
    paths = []
    for s in range(n_shards):
        fname = ("model.safetensors" if n_shards == 1
                 else "model-%05d-of-%05d.safetensors" % (s + 1, n_shards))
        path = os.path.join(a.out, fname)
        paths.append(path)
        # 4-aligned units first, then the others (quant.c), so every tensor stays aligned
        order = [u for u in units if u.shard == s and u.align4] + \
                [u for u in units if u.shard == s and not u.align4]
        header = {}
        placed = []
        off = 0
        for u in order:
            sb_start = None
            for name, dt, shape, nb, src in unit_entries(u):
                if nb and off % DTYPE_SIZE[dt]:
                    die("tensor %s would start misaligned at %d" % (name, off))
                header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
                weight_map[name] = fname
                # scales and biases of one module read the same offset of their paired blocks
                if src[0] in ("s", "b"):
                    if sb_start is None:
                        sb_start = 2 * rng.randrange(sb_vals)
                    start = sb_start
                else:
                    start = 4 * rng.randrange(block_bytes // 4)
                placed.append((off, nb, src, start))
                off += nb
            total_data += u.bytes
        text = json.dumps(header, separators=(",", ":")).encode()
        padded = (len(text) + 7) & ~7
        hdr = struct.pack("<Q", padded) + text + b" " * (padded - len(text))
        base = len(hdr)
        size = base + off
        file_bytes += size
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fds.append(fd)
        os.ftruncate(fd, size)
        jobs.append((fd, 0, memoryview(hdr)))
        for toff, nb, src, start in placed:
            pos = base + toff
            for piece in source_view(src, nb, start):
                jobs.append((fd, pos, piece))
                pos += len(piece)
            if pos != base + toff + nb:
                die("internal: wrote %d of %d bytes" % (pos - base - toff, nb))

    t_plan = time.time() - t_start

    def do_write(job):
        fd, pos, mv = job
        while len(mv):
            n = os.pwrite(fd, mv, pos)
            if n <= 0:
                raise OSError("short write")
            mv = mv[n:]
            pos += n

    done = 0
    t0 = time.time()
    big = sorted(jobs, key=lambda j: -len(j[2]))  # big pieces first keep the threads busy
    with ThreadPoolExecutor(max_workers=threads) as ex:
        for _ in ex.map(do_write, big, chunksize=1):
            done += 1
    t_write = time.time() - t0
    t_sync = 0.0
    if a.fsync:
        t1 = time.time()
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(fds)))) as ex:
            list(ex.map(os.fsync, fds))
        t_sync = time.time() - t1
    for fd in fds:
        os.close(fd)

    # ---- index, config, generation config ----
    if n_shards > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total_data}, "weight_map": weight_map}, f,
                      indent=2)
    cfg["quantization"] = qcfg
    cfg["quantization_config"] = qcfg
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if not a.config_from:
        with open(os.path.join(a.out, "generation_config.json"), "w") as f:
            json.dump(GENERATION_CONFIG, f, indent=2)
    else:
        gsrc = os.path.join(os.path.dirname(a.config_from), "generation_config.json")
        if os.path.exists(gsrc):
            with open(gsrc) as fi, open(os.path.join(a.out, "generation_config.json"), "w") as fo:
                fo.write(fi.read())
    with open(os.path.join(a.out, "RANDOM_WEIGHTS.txt"), "w") as f:
        f.write("Random weights written by tools/make_random_mlx4.py (seed %d, %d layers): the "
                "layout of an MLX 4-bit affine Qwen3.6-35B-A3B checkpoint, for load-time and "
                "speed measurements only. Its outputs mean nothing.\n" % (a.seed, n_layer))
    t_total = time.time() - t_start

    gb = file_bytes / 1e9
    print("make_random_mlx4: %s: %d layers, %d shard%s, %d tensors" % (
        a.out, n_layer, n_shards, "" if n_shards == 1 else "s", len(weight_map)))
    print("make_random_mlx4: wrote %d bytes (%.2f GB, %.2f GiB; tensor data %d bytes) "
          "in %.1f s total (plan %.1f s, write %.1f s = %.2f GB/s%s)" % (
              file_bytes, gb, file_bytes / (1 << 30), total_data, t_total, t_plan, t_write,
              gb / t_write if t_write > 0 else 0.0,
              ", fsync %.1f s" % t_sync if a.fsync else ", not fsynced: use --fsync or sync"))


if __name__ == "__main__":
    main()
