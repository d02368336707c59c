/* MLX affine quantization (the 4-bit format of mlx-community checkpoints, docs/model.md §5.3) and
 * the checkpoint writer behind `tulip quantize`.
 *
 * Per group of `group` consecutive columns MLX computes (mlx/backend/cpu/quantized.cpp,
 * notes/2026-12-02-mlx-affine-quantize.md):
 *   lo = min, hi = max, n = 2^bits - 1
 *   s  = max((hi - lo) / n, 1e-7), negated unless |lo| > |hi|
 *   edge = |lo| > |hi| ? lo : hi;  q0 = rint(edge / s)
 *   if q0 != 0: s = edge / q0, bias = edge   (zero lands exactly on an integer code)
 *   else:       bias = 0
 *   q = clamp(rint((w - bias) / s), 0, n);   w ~= s * q + bias
 * The scale may be negative; bias is the endpoint of larger magnitude, not always the minimum.
 * Scales and biases are stored in BF16; codes are computed with the f32 values. */
#ifndef TL_QUANT_H
#define TL_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Quantizes one group of `group` values: codes q[group] in [0, 2^bits-1], scale, bias. */
void tl_quant_group(const float *x, int group, int bits, uint8_t *q, float *scale, float *bias);

/* Quantizes a row of n values (n % group == 0) into packed words (n*bits/32 u32, value c at bit
 * (c % (32/bits))*bits of word c/(32/bits)) and per-group scales/biases rounded to bf16. */
void tl_quant_row(const float *x, int n, int bits, int group, uint32_t *words, uint16_t *scales,
                  uint16_t *biases);

/* Writes an MLX-format checkpoint (language_model.model.* names, switch_mlp stacked experts,
 * offset norms, conv1d [C, K, 1], config.json with "quantization") from the HF checkpoint in
 * in_dir: every linear whose input width is a multiple of `group` is quantized at `bits`, the
 * router (mlp.gate) and mlp.shared_expert_gate at 8 bits; the rest stays as stored. Shards of
 * about shard_bytes (0 = 5 GB) with model.safetensors.index.json when more than one.
 * progress (may be NULL) gets a line per layer. */
int tl_quantize_checkpoint(const char *in_dir, const char *out_dir, int bits, int group,
                           size_t shard_bytes, void (*progress)(const char *msg), char *err,
                           size_t errlen);

#endif
