/* Gated DeltaNet recurrent step (decode, and token-by-token prefill until the chunked kernel is
 * wired in): gates, L2 norms, the delta rule on an fp32 state, and the gated RMSNorm of the output,
 * fused in one kernel per (segment, value head). */
#include "cuda/cuda_common.cuh"

#define GDN_D 128 /* key and value head dim (shape.h TL_GDN_K_DIM, TL_GDN_V_DIM) */

/* The recurrent state is f32, or bf16 (--state-dtype bf16): loaded into f32 registers at the
 * start of a segment and rounded back (nearest even) at its end. */
static __device__ __forceinline__ float state_ld(const void *S, int bf, size_t i) {
    return bf ? bf2f(((const uint16_t *)S)[i]) : ((const float *)S)[i];
}
static __device__ __forceinline__ void state_st(void *S, int bf, size_t i, float v) {
    if (bf)
        ((uint16_t *)S)[i] = f2bf(v);
    else
        ((float *)S)[i] = v;
}

/* The element offset of copy (slot, position pos) of a head's state in ring (gpu.h
 * tl_gpu_ring), or -1 when that token keeps no copy. */
static __device__ __forceinline__ long long ring_at(const tl_gpu_ring &ring, int slot, int pos,
                                                    int nv, int h) {
    int p0 = ring.base ? ring.pos0[slot] : -1, j = pos - p0;
    if (p0 < 0 || j < 0 || j >= ring.n) return -1;
    return (((long long)slot * ring.n + j) * nv + h) * GDN_D * GDN_D;
}

/* gdn_step_kernel  (docs/model.md §2.4 steps 4-8, HF torch_recurrent_gated_delta_rule)
 *   beta = sigmoid(b);  g = a_neg * softplus(a + dt_bias)
 *   q = l2norm(q) / sqrt(128);  k = l2norm(k)            (x * rsqrt(sum x^2 + 1e-6))
 *   S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;  o = S^T q
 *   y = o / sqrt(mean(o^2) + eps) * norm_w * silu(z)
 * Shapes: qkv [n_tok, 2*nk*128 + nv*128] (q | k | v, head-major); proj [n_tok, ld_proj] holds z
 *   (nv*128 at z_off), b (nv at b_off), a (nv at a_off); S [n_slot][nv][128 (key)][128 (value)]
 *   f32 or bf16 (state_ld); y [n_tok, nv*128]. Value head h reads key head h / (nv/nk).
 * Threads: one block of 512 per (value head, segment); thread i owns state column c = i%128 and
 *   rows 32*(i/128) .. +31 in registers (a warp reads 128 contiguous bytes of one state row); the
 *   four owners of a column add their partial sums through shared memory in a fixed order.
 *   Tokens of the segment run in order inside the block.
 * Bytes: S read and written once per segment (64 KiB per head) + q, k, v, z per token (+ S
 *   written once more per token with a ring copy: gpu.h tl_gpu_ring, a speculative verify).
 * Tested against cpu_l2norm + cpu_gdn_step + cpu_rmsnorm_gated (test_kernels.c: test_gdn). */
__global__ void __launch_bounds__(512)
    gdn_step_kernel(float *y, void *S, int s_bf16, const float *qkv, const float *proj, int ld_proj,
                    int z_off, int b_off, int a_off, const float *dt_bias, const float *a_neg,
                    const float *norm_w, int nk, int nv, float eps, tl_gpu_seqs s,
                    tl_gpu_ring ring) {
    __shared__ float sq[GDN_D], sk[GDN_D];
    __shared__ float s_part[4][GDN_D];
    __shared__ float sbuf[32];
    __shared__ float s_gate[2];
    int h = blockIdx.x, g = blockIdx.y, tid = threadIdx.x;
    int c = tid & (GDN_D - 1), rp = tid >> 7, kh = h / (nv / nk);
    int slot = s.seg_slot[g], t0 = s.seg_tok0[g], n = s.seg_n[g];
    int ld_qkv = 2 * nk * GDN_D + nv * GDN_D;
    size_t Sh = ((size_t)slot * nv + h) * GDN_D * GDN_D; /* element offset of the head */
    float st[32];
    /* under PDL the state load may overlap the previous kernel: only this layer's GDN step
     * touches S inside a step, and the slot table was uploaded before the step began */
    pdl_trigger();
#pragma unroll
    for (int i = 0; i < 32; i++)
        st[i] = state_ld(S, s_bf16, Sh + (size_t)(rp * 32 + i) * GDN_D + c);
    pdl_wait();
    float nwc = norm_w[c], dtb = dt_bias[h], an = a_neg[h];
    for (int i = 0; i < n; i++) {
        size_t t = (size_t)(t0 + i);
        const float *row = qkv + t * ld_qkv;
        const float *pr = proj + t * ld_proj;
        /* q in threads 0..127, k in 128..255: L2 norms by block reduction */
        float val = 0.0f;
        if (tid < GDN_D)
            val = row[kh * GDN_D + tid];
        else if (tid < 2 * GDN_D)
            val = row[nk * GDN_D + kh * GDN_D + tid - GDN_D];
        float sqq = block_sum(tid < GDN_D ? val * val : 0.0f, sbuf);
        float skk = block_sum(tid >= GDN_D && tid < 2 * GDN_D ? val * val : 0.0f, sbuf);
        if (tid < GDN_D)
            sq[tid] = val * rsqrtf(sqq + 1e-6f) * rsqrtf((float)GDN_D);
        else if (tid < 2 * GDN_D)
            sk[tid - GDN_D] = val * rsqrtf(skk + 1e-6f);
        if (tid == 0) {
            s_gate[0] = sigmoid_f(pr[b_off + h]);
            s_gate[1] = expf(an * softplus_f(pr[a_off + h] + dtb));
        }
        __syncthreads();
        float beta = s_gate[0], decay = s_gate[1];
        float vc = row[2 * nk * GDN_D + h * GDN_D + c];
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            st[j] *= decay;
            m = fmaf(st[j], sk[rp * 32 + j], m);
        }
        s_part[rp][c] = m;
        __syncthreads();
        m = s_part[0][c] + s_part[1][c] + s_part[2][c] + s_part[3][c];
        float d = beta * (vc - m);
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            st[j] = fmaf(sk[rp * 32 + j], d, st[j]);
            o = fmaf(st[j], sq[rp * 32 + j], o);
        }
        __syncthreads(); /* everyone has read m's partials */
        s_part[rp][c] = o;
        __syncthreads();
        o = s_part[0][c] + s_part[1][c] + s_part[2][c] + s_part[3][c];
        float oo = block_sum(rp == 0 ? o * o : 0.0f, sbuf);
        if (rp == 0) {
            float z = pr[z_off + h * GDN_D + c];
            y[t * (nv * GDN_D) + h * GDN_D + c] =
                o * rsqrtf(oo / (float)GDN_D + eps) * nwc * silu_f(z);
        }
        long long rc = ring_at(ring, slot, s.seg_pos0[g] + i, nv, h);
        if (rc >= 0) {
#pragma unroll
            for (int j = 0; j < 32; j++)
                state_st(ring.base, s_bf16, (size_t)rc + (size_t)(rp * 32 + j) * GDN_D + c, st[j]);
        }
        __syncthreads(); /* sq/sk/s_gate are rewritten by the next token */
    }
#pragma unroll
    for (int i = 0; i < 32; i++) state_st(S, s_bf16, Sh + (size_t)(rp * 32 + i) * GDN_D + c, st[i]);
}

extern "C" int tl_gpu_gdn(float *y, void *S, int s_bf16, const float *qkv, const float *proj,
                          int ld_proj, int z_off, int b_off, int a_off, const float *dt_bias,
                          const float *a_neg, const float *norm_w, int n_k_head, int n_v_head,
                          float eps, const tl_gpu_seqs *s, const tl_gpu_ring *ring,
                          const tl_gpu_stream *st) {
    if (s->n_seg <= 0) return 0;
    dim3 grid(n_v_head, s->n_seg);
    tl_gpu_ring r = {NULL, NULL, 0};
    if (ring && ring->base) r = *ring;
    TL_LAUNCH(st, "gdn_step", gdn_step_kernel, grid, dim3(512), 0, y, S, s_bf16, qkv, proj, ld_proj,
              z_off, b_off, a_off, dt_bias, a_neg, norm_w, n_k_head, n_v_head, eps, *s, r);
    return 0;
}

/* gdn_cols_kernel: the same step (steps 4-7) without the gated norm, for many sequences at once
 * (the batched decode path, cuda_forward.cu), cut by state columns: the columns of S are
 * independent once q and k are normalised (m_c = S[:,c] . k, d_c = beta (v_c - m_c), S[:,c] += k
 * d_c, o_c = S[:,c] . q), so four blocks of 128 threads share a (value head, segment), each with
 * 32 columns (16 KiB of state). Four times the blocks of gdn_step_kernel at a quarter of the size:
 * their state loads, recurrences and stores interleave on an SM instead of alternating in two
 * large blocks. o is raw (f32 [n_tok, nv*128]); the gated RMSNorm follows
 * (tl_gpu_gated_rmsnorm_bf16). Thread (warp w, lane l) owns column 32*quarter + l, rows 32w..+31;
 * partial sums added in the fixed order of gdn_step_kernel. Loads its state, then waits for its
 * predecessor (PDL).
 * Launch bounds of 6 blocks an SM cap ptxas at 80 registers (no spills; without them it took 96
 * and 5 blocks fit): more state loads in flight, 107.5 -> 98.2 us a call and -2.1% / -2.5% a step
 * at decode batches of 64 / 256 (H100, session 17); 8 blocks (64 registers) spilled and lost.
 * Tested against cpu_gdn_step (test_kernels.c: test_gdn, raw output and state). */
__global__ void __launch_bounds__(128, 6)
    gdn_cols_kernel(float *o_out, void *S, int s_bf16, const float *qkv, const float *proj,
                    int ld_proj, int b_off, int a_off, const float *dt_bias, const float *a_neg,
                    int nk, int nv, tl_gpu_seqs s, tl_gpu_ring ring, int trig) {
    __shared__ float sq[GDN_D], sk[GDN_D];
    __shared__ float s_part[4][32];
    __shared__ float sbuf[32];
    __shared__ float s_gate[2];
    int h = blockIdx.x >> 2, g = blockIdx.y, tid = threadIdx.x;
    int c = (blockIdx.x & 3) * 32 + (tid & 31), rp = tid >> 5, kh = h / (nv / nk);
    int slot = s.seg_slot[g], t0 = s.seg_tok0[g], n = s.seg_n[g];
    int ld_qkv = 2 * nk * GDN_D + nv * GDN_D;
    size_t Sh = ((size_t)slot * nv + h) * GDN_D * GDN_D; /* element offset of the head */
    float st[32];
    /* the state before the wait (PDL, cuda_common.cuh: pdl_enter): it was last written by this
     * layer's step of an earlier micro-batch, complete by the time this kernel starts (the
     * in-projection two kernels back waited before it triggered) */
#pragma unroll
    for (int i = 0; i < 32; i++)
        st[i] = state_ld(S, s_bf16, Sh + (size_t)(rp * 32 + i) * GDN_D + c);
    float dtb = dt_bias[h], an = a_neg[h];
    pdl_enter(trig); /* launched with PDL on the batched path */
    for (int i = 0; i < n; i++) {
        size_t t = (size_t)(t0 + i);
        const float *row = qkv + t * ld_qkv;
        const float *pr = proj + t * ld_proj;
        float qv = row[kh * GDN_D + tid], kv = row[nk * GDN_D + kh * GDN_D + tid];
        float sqq = block_sum(qv * qv, sbuf);
        float skk = block_sum(kv * kv, sbuf);
        sq[tid] = qv * rsqrtf(sqq + 1e-6f) * rsqrtf((float)GDN_D);
        sk[tid] = kv * rsqrtf(skk + 1e-6f);
        if (tid == 0) {
            s_gate[0] = sigmoid_f(pr[b_off + h]);
            s_gate[1] = expf(an * softplus_f(pr[a_off + h] + dtb));
        }
        __syncthreads();
        float beta = s_gate[0], decay = s_gate[1];
        float vc = row[2 * nk * GDN_D + h * GDN_D + c];
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            st[j] *= decay;
            m = fmaf(st[j], sk[rp * 32 + j], m);
        }
        s_part[rp][tid & 31] = m;
        __syncthreads();
        m = s_part[0][tid & 31] + s_part[1][tid & 31] + s_part[2][tid & 31] + s_part[3][tid & 31];
        float d = beta * (vc - m);
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            st[j] = fmaf(sk[rp * 32 + j], d, st[j]);
            o = fmaf(st[j], sq[rp * 32 + j], o);
        }
        __syncthreads(); /* everyone has read m's partials */
        s_part[rp][tid & 31] = o;
        __syncthreads();
        if (rp == 0)
            o_out[t * (nv * GDN_D) + h * GDN_D + c] =
                s_part[0][tid] + s_part[1][tid] + s_part[2][tid] + s_part[3][tid];
        long long rc = ring_at(ring, slot, s.seg_pos0[g] + i, nv, h);
        if (rc >= 0) {
#pragma unroll
            for (int j = 0; j < 32; j++)
                state_st(ring.base, s_bf16, (size_t)rc + (size_t)(rp * 32 + j) * GDN_D + c, st[j]);
        }
        __syncthreads(); /* sq/sk/s_part/s_gate are rewritten by the next token */
    }
#pragma unroll
    for (int i = 0; i < 32; i++) state_st(S, s_bf16, Sh + (size_t)(rp * 32 + i) * GDN_D + c, st[i]);
}

extern "C" int tl_gpu_gdn_raw(float *o, void *S, int s_bf16, const float *qkv, const float *proj,
                              int ld_proj, int b_off, int a_off, const float *dt_bias,
                              const float *a_neg, int n_k_head, int n_v_head, const tl_gpu_seqs *s,
                              const tl_gpu_ring *ring, const tl_gpu_stream *st) {
    if (s->n_seg <= 0) return 0;
    dim3 grid(n_v_head * 4, s->n_seg);
    tl_gpu_ring r = {NULL, NULL, 0};
    if (ring && ring->base) r = *ring;
    TL_LAUNCH(st, "gdn_cols", gdn_cols_kernel, grid, dim3(128), 0, o, S, s_bf16, qkv, proj, ld_proj,
              b_off, a_off, dt_bias, a_neg, n_k_head, n_v_head, *s, r, tl_pdl_trig(st));
    return 0;
}
