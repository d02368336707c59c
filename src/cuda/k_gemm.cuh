/* Private to the prefill GEMM (k_gemm.cu) and the prefill MoE (k_moe.cu): the grouped GEMM that
 * runs the experts over the MoE routing plan. */
#ifndef TL_K_GEMM_CUH
#define TL_K_GEMM_CUH

#include "cuda/cuda_common.cuh"

/* The MoE plan's layout (PLAN_*) is in gpu.h (tl_gpu_moe_pf_plan). */

/* Grouped GEMM over the plan: gather = 1: y row (plan order) = x[token of the assignment] W_e^T
 * (gate/up, flags TL_GEMM_SWIGLU); gather = 0: y[assignment] = x row (plan order) W_e^T (down).
 * w describes expert 0; the experts lie contiguously after it (gpu.h: stacked experts). shared =
 * 1: expert 256 (the shared one) also runs, for every token, as plan rows / assignments
 * 8 n_tok + t after the routed ones. */
int cb_moe_gemm(uint16_t *y, const uint16_t *x, const tl_gpu_gemm_w *w, const int32_t *plan,
                int n_tok, int gather, int flags, int shared, const tl_gpu_stream *st);

#endif
