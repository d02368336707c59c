/* Private to the prefill GEMM (k_gemm.cu) and the prefill MoE (k_moe.cu): the layout of the MoE
 * routing plan, and the grouped GEMM that runs the experts over it. */
#ifndef TL_K_GEMM_CUH
#define TL_K_GEMM_CUH

#include "cuda/cuda_common.cuh"

/* MoE plan layout (ints): off[257], tile starts for 128-row tiles [257], for 64-row tiles
 * [257], for 16-row tiles [257], then perm[n_tok*8] (assignment ids grouped by expert). */
#define PLAN_OFF   0
#define PLAN_TS128 257
#define PLAN_TS64  514
#define PLAN_TS16  771
#define PLAN_PERM  1028

/* Grouped GEMM over the plan: gather = 1: y row (plan order) = x[token of the assignment] W_e^T
 * (gate/up, flags TL_GEMM_SWIGLU); gather = 0: y[assignment] = x row (plan order) W_e^T (down).
 * w describes expert 0; the experts lie contiguously after it (gpu.h: stacked experts). shared =
 * 1: expert 256 (the shared one) also runs, for every token, as plan rows / assignments
 * 8 n_tok + t after the routed ones. */
int cb_moe_gemm(uint16_t *y, const uint16_t *x, const tl_gpu_gemm_w *w, const int32_t *plan,
                int n_tok, int gather, int flags, int shared, const tl_gpu_stream *st);

#endif
