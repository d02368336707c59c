/* The production shape of Qwen3.6-35B-A3B (docs/model.md §1.3). Per-head and per-expert dimensions
 * are the compile-time constants CUDA kernels specialise on; counts are checked at load against
 * these numbers (the CPU reference accepts other self-consistent counts with --allow-test-shape).
 */
#ifndef TL_SHAPE_H
#define TL_SHAPE_H

#define TL_N_EMBD          2048
#define TL_N_LAYER         40
#define TL_N_VOCAB         248320 /* embedding rows (padded) */
#define TL_N_VOCAB_TOKENS  248077 /* ids the tokenizer can produce; never sample above */
#define TL_N_HEAD          16
#define TL_N_HEAD_KV       2
#define TL_HEAD_DIM        256
#define TL_N_ROT           64
#define TL_ROPE_THETA      10000000.0f
#define TL_GDN_N_K_HEAD    16
#define TL_GDN_N_V_HEAD    32
#define TL_GDN_K_DIM       128
#define TL_GDN_V_DIM       128
#define TL_GDN_CONV_K      4
#define TL_N_EXPERT        256
#define TL_N_EXPERT_USED   8
#define TL_N_FF_EXPERT     512
#define TL_N_FF_SHARED     512
#define TL_RMS_EPS         1e-6f
#define TL_MAX_POS         262144
#define TL_FULL_ATTN_EVERY 4 /* layers 3, 7, ..., 39 are full attention */

#define TL_MAX_LAYERS 64 /* array bound for any config we accept */

#endif
