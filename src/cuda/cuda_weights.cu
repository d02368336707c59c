/* Weights onto the device: host staging of checkpoint matrices into the kernels' layouts (bf16
 * with an optional low plane, or q4 tiled), the device-side MLX -> q4 repack and SwiGLU
 * interleave, stacked experts, random full-size weights built on the device from a seed (bench),
 * and the whole model's upload (cb_weights_load). */
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/util.h"
#include "cpu/cpu.h"
}

/* ====== Host staging ====== */

/* 4 when every part is MLX affine 4-bit, group 64, rows a multiple of 8; else 16. */
int cb_parts_bits(const tl_mat *const *parts, int n_parts) {
    for (int i = 0; i < n_parts; i++) {
        const tl_mat *m = parts[i];
        if (m->bits != 4 || m->group != 64 || m->rows % 8 || m->cols % 128) return 16;
    }
    return 4;
}

static uint16_t host_f2bf(float f) { return tl_f32_to_bf16(f); }

/* Writes the parts, stacked by rows and zero-padded to rows_pad, into device memory dst_w
 * (and dst_sb for bits 4) in the kernels' layout. Host staging, one copy per call. For bits 16,
 * dst_sb (if non-NULL) receives the low plane: lo = bf16(v - hi) with hi = bf16(v), so that
 * hi + lo carries ~16 significant bits of values that are not bf16 (8-bit dequantized). */
int cb_mat_fill(void *dst_w, void *dst_sb, int bits, const tl_mat *const *parts, int n_parts,
                int rows_pad, char *err, size_t errlen) {
    int cols = parts[0]->cols;
    for (int i = 0; i < n_parts; i++)
        if (parts[i]->cols != cols)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "stacked parts differ in columns (%d vs %d)",
                           parts[i]->cols, cols);
    if (bits == 16) {
        size_t n = (size_t)rows_pad * cols;
        uint16_t *h = (uint16_t *)calloc(n, 2), *lo = dst_sb ? (uint16_t *)calloc(n, 2) : NULL;
        float *row = (float *)malloc(sizeof(float) * cols);
        if (!h || !row || (dst_sb && !lo)) {
            free(h), free(lo), free(row);
            return tl_errf(err, errlen, TL_ERR_NOMEM, "upload staging of %zu bytes", n * 2);
        }
        size_t r0 = 0;
        for (int i = 0; i < n_parts; i++) {
            const tl_mat *m = parts[i];
            if (m->bits == 0 && m->wtype == TL_DT_BF16) {
                memcpy(h + r0 * cols, m->w, (size_t)m->rows * cols * 2); /* lo stays 0 */
            } else {
                for (int r = 0; r < m->rows; r++) {
                    cpu_mat_row(row, m, r);
                    for (int c = 0; c < cols; c++) {
                        uint16_t hb = host_f2bf(row[c]);
                        h[(r0 + r) * cols + c] = hb;
                        if (lo) lo[(r0 + r) * cols + c] = host_f2bf(row[c] - tl_bf16_to_f32(hb));
                    }
                }
            }
            r0 += m->rows;
        }
        cudaError_t e = cudaMemcpy(dst_w, h, n * 2, cudaMemcpyHostToDevice);
        if (e == cudaSuccess && lo) e = cudaMemcpy(dst_sb, lo, n * 2, cudaMemcpyHostToDevice);
        free(h), free(lo), free(row);
        if (e != cudaSuccess)
            return tl_errf(err, errlen, TL_ERR_CUDA, "upload: %s", cudaGetErrorString(e));
        return 0;
    }
    /* q4 tiled: word (rb, kb, lane) nibble n = column 32kb + 2(lane%4) + q4col(n) of row 8rb +
     * lane/4 */
    int KB = cols / 32, G = cols / 64;
    size_t nw = (size_t)rows_pad / 8 * KB * 32, nsb = (size_t)G * rows_pad;
    uint32_t *hw = (uint32_t *)calloc(nw, 4), *hsb = (uint32_t *)calloc(nsb, 4);
    if (!hw || !hsb) {
        free(hw), free(hsb);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "upload staging of %zu bytes", (nw + nsb) * 4);
    }
    /* Nibble n < 4 of the output word is column 32kb + 2t + 8n, nibble 4 + n column 32kb + 2t +
     * 8n + 1: both are byte t of source word 4kb + n (MLX packs column c at bits 4(c % 8) of word
     * c / 8), low and high nibble. One byte per (n) instead of one shift per nibble: the
     * repack of a 19.5 GB checkpoint is ~10x faster than the nibble-by-nibble loop. */
    size_t r0 = 0;
    for (int i = 0; i < n_parts; i++) {
        const tl_mat *m = parts[i];
        const uint32_t *src = (const uint32_t *)m->w;
        int wpr = cols / 8;
        const uint16_t *s16 = (const uint16_t *)m->scales, *b16 = (const uint16_t *)m->biases;
        for (int r = 0; r < m->rows; r++) {
            size_t gr = r0 + r, rb = gr / 8;
            int r8 = (int)(gr % 8);
            const uint32_t *sr = src + (size_t)r * wpr;
            uint32_t *dst = hw + rb * KB * 32 + r8 * 4;
            for (int kb = 0; kb < KB; kb++, dst += 32) {
                const uint32_t *s4 = sr + 4 * kb;
                for (int t = 0; t < 4; t++) {
                    uint32_t word = 0;
                    for (int n = 0; n < 4; n++) {
                        uint32_t byte = (s4[n] >> (8 * t)) & 0xFFu;
                        word |= (byte & 15u) << (4 * n) | (byte >> 4) << (16 + 4 * n);
                    }
                    dst[t] = word;
                }
            }
            if (m->stype == TL_DT_BF16) { /* bf16 -> f32 -> bf16 is the identity */
                for (int g = 0; g < G; g++)
                    hsb[(size_t)g * rows_pad + gr] =
                        s16[(size_t)r * G + g] | ((uint32_t)b16[(size_t)r * G + g] << 16);
            } else {
                for (int g = 0; g < G; g++) {
                    float s = tl_load_elem(m->scales, m->stype, (size_t)r * G + g);
                    float b = tl_load_elem(m->biases, m->stype, (size_t)r * G + g);
                    hsb[(size_t)g * rows_pad + gr] = host_f2bf(s) | ((uint32_t)host_f2bf(b) << 16);
                }
            }
        }
        r0 += m->rows;
    }
    cudaError_t e = cudaMemcpy(dst_w, hw, nw * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(dst_sb, hsb, nsb * 4, cudaMemcpyHostToDevice);
    free(hw), free(hsb);
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "upload: %s", cudaGetErrorString(e));
    return 0;
}

static size_t mat_w_bytes(int bits, int rows, int cols) {
    return bits == 4 ? (size_t)rows * cols / 2 : (size_t)rows * cols * 2;
}
static size_t mat_sb_bytes(int bits, int rows, int cols) {
    return bits == 4 ? (size_t)rows * (cols / 64) * 4 : 0;
}

extern "C" size_t tl_gpu_mat_bytes(const tl_gpu_gemm_w *m) {
    size_t lo = m->bits == 16 && m->sb ? mat_w_bytes(16, m->rows, m->cols) : 0; /* bf16 low plane */
    return mat_w_bytes(m->bits, m->rows, m->cols) + mat_sb_bytes(m->bits, m->rows, m->cols) + lo;
}

static int mat_alloc(tl_gpu_gemm_w *m, int bits, int rows, int cols, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->bits = bits, m->rows = rows, m->cols = cols;
    size_t wb = mat_w_bytes(bits, rows, cols), sbb = mat_sb_bytes(bits, rows, cols);
    void *w = tl_gpu_malloc(wb), *sb = sbb ? tl_gpu_malloc(sbb) : NULL;
    if (!w || (sbb && !sb)) {
        tl_gpu_free(w), tl_gpu_free(sb);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMalloc of %zu bytes failed (weights)",
                       wb + sbb);
    }
    m->w = w, m->sb = sb;
    return 0;
}

extern "C" void tl_gpu_mat_free(tl_gpu_gemm_w *m) {
    tl_gpu_free((void *)m->w);
    tl_gpu_free((void *)m->sb);
    memset(m, 0, sizeof *m);
}

extern "C" int tl_gpu_mat_upload(tl_gpu_gemm_w *out, const tl_mat *const *parts, int n_parts,
                                 int rows_pad, char *err, size_t errlen) {
    int rows = 0;
    for (int i = 0; i < n_parts; i++) rows += parts[i]->rows;
    if (rows_pad < rows) rows_pad = rows;
    int bits = cb_parts_bits(parts, n_parts);
    if (bits == 4 && rows_pad % 8) bits = 16;
    int st = mat_alloc(out, bits, rows_pad, parts[0]->cols, err, errlen);
    if (st) return st;
    int exact = 1; /* every part already bf16: no low plane */
    for (int i = 0; i < n_parts; i++) exact &= parts[i]->bits == 0 && parts[i]->wtype == TL_DT_BF16;
    if (bits == 16 && !exact &&
        !(out->sb = tl_gpu_malloc(mat_w_bytes(16, rows_pad, parts[0]->cols)))) {
        tl_gpu_mat_free(out);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMalloc of a low bf16 plane failed");
    }
    st = cb_mat_fill((void *)out->w, (void *)out->sb, bits, parts, n_parts, rows_pad, err, errlen);
    if (st) tl_gpu_mat_free(out);
    return st;
}

/* A view of rows r0 .. r0+n-1 of m. */
static tl_mat mat_rows(const tl_mat *m, int r0, int n) {
    tl_mat v = *m;
    v.rows = n;
    if (m->bits == 0) {
        v.w = (const char *)m->w + (size_t)r0 * m->cols * tl_dtype_size(m->wtype);
    } else {
        v.w = (const uint32_t *)m->w + (size_t)r0 * m->cols * m->bits / 32;
        size_t g = (size_t)r0 * (m->cols / m->group) * tl_dtype_size(m->stype);
        v.scales = (const char *)m->scales + g;
        v.biases = (const char *)m->biases + g;
    }
    return v;
}

/* ====== Random weights (bench): built on the device from a seed ====== */

__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = tl_mix64(seed + TL_GOLDEN64 * (i + 1));
        float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        p[i] = f2bf(amp * u);
    }
}
__global__ void fill_u32_kernel(uint32_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint32_t)(tl_mix64(seed + TL_GOLDEN64 * (i + 1)) >> 16);
}
__global__ void fill_sb_kernel(uint32_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = tl_mix64(seed + TL_GOLDEN64 * (i + 1));
        float s = scale * (0.75f + 0.5f * (float)(z >> 40) * (1.0f / 16777216.0f));
        p[i] = (uint32_t)f2bf(s) | ((uint32_t)f2bf(-7.5f * s) << 16);
    }
}

static int fill_bf16(const void *p, size_t n, uint64_t seed, float amp) {
    TL_LAUNCH(NULL, "fill_bf16", fill_bf16_kernel, dim3(4096), dim3(256), 0, (uint16_t *)p, n, seed,
              amp);
    return 0;
}
static int fill_u32(const void *p, size_t n, uint64_t seed) {
    TL_LAUNCH(NULL, "fill_u32", fill_u32_kernel, dim3(4096), dim3(256), 0, (uint32_t *)p, n, seed);
    return 0;
}
static int fill_sb(const void *p, size_t n, uint64_t seed, float scale) {
    TL_LAUNCH(NULL, "fill_sb", fill_sb_kernel, dim3(1024), dim3(256), 0, (uint32_t *)p, n, seed,
              scale);
    return 0;
}

/* Values uniform with standard deviation std (bf16), or 4-bit s*(q - 7.5) with s ~ std*sqrt(3)/7.5.
 */
static int mat_random(tl_gpu_gemm_w *m, int bits, int rows, int cols, uint64_t seed, float std,
                      char *err, size_t errlen) {
    int st = mat_alloc(m, bits, rows, cols, err, errlen);
    if (st) return st;
    float amp = std * sqrtf(3.0f);
    if (bits == 16)
        st = fill_bf16(m->w, (size_t)rows * cols, seed, amp);
    else if (!(st = fill_u32(m->w, (size_t)rows * cols / 8, seed)))
        st = fill_sb(m->sb, (size_t)rows * (cols / 64), seed ^ 0x5bd1e995ull, amp / 7.5f);
    return st ? tl_errf(err, errlen, st, "random weight fill failed (see log)") : 0;
}

/* *d = a device copy of h[0..n); 0 or a status with the message naming `what`. */
static int upload_f32(float **d, const float *h, size_t n, const char *what, char *err,
                      size_t errlen) {
    *d = (float *)tl_gpu_malloc(n * sizeof(float));
    if (!*d) return tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMalloc of %s failed", what);
    if (tl_gpu_upload(*d, h, n * sizeof(float)))
        return tl_errf(err, errlen, TL_ERR_CUDA, "upload of %s failed", what);
    return 0;
}
static int const_f32(float **d, size_t n, float v, const char *what, char *err, size_t errlen) {
    float *h = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = v;
    int st = upload_f32(d, h, n, what, err, errlen);
    free(h);
    return st;
}
static uint64_t host_rng(uint64_t *s) { return tl_mix64(*s += TL_GOLDEN64); }
static float host_uniform(uint64_t *s) { return (float)(host_rng(s) >> 40) * (1.0f / 16777216.0f); }

extern "C" int tl_gpu_experts_upload(tl_gpu_gemm_w *gate_up, tl_gpu_gemm_w *down,
                                     const tl_mat *const *gate, const tl_mat *const *up,
                                     const tl_mat *const *dn, int n, char *err, size_t errlen) {
    int F = gate[0]->rows, D = gate[0]->cols, st, bits = 4;
    if (F % 8 || F / 8 > 256) return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "expert width %d", F);
    for (int e = 0; e < n && bits == 4; e++) {
        const tl_mat *three[3] = {gate[e], up[e], dn[e]};
        if (cb_parts_bits(three, 3) != 4) bits = 16;
    }
    memset(gate_up, 0, sizeof *gate_up), memset(down, 0, sizeof *down);
    if ((st = mat_alloc(gate_up, bits, n * 2 * F, D, err, errlen))) return st;
    if ((st = mat_alloc(down, bits, n * D, F, err, errlen))) return st;
    size_t gu_w = mat_w_bytes(bits, 2 * F, D), gu_sb = mat_sb_bytes(bits, 2 * F, D);
    size_t dn_w = mat_w_bytes(bits, D, F), dn_sb = mat_sb_bytes(bits, D, F);
    const tl_mat *parts[512];
    tl_mat views[512];
    for (int e = 0; e < n; e++) {
        for (int i = 0; i < F / 8; i++) {
            views[2 * i] = mat_rows(gate[e], 8 * i, 8);
            views[2 * i + 1] = mat_rows(up[e], 8 * i, 8);
            parts[2 * i] = &views[2 * i], parts[2 * i + 1] = &views[2 * i + 1];
        }
        char *gw = (char *)gate_up->w + e * gu_w,
             *gsb = bits == 4 ? (char *)gate_up->sb + e * gu_sb : NULL;
        if ((st = cb_mat_fill(gw, gsb, bits, parts, 2 * F / 8, 2 * F, err, errlen))) return st;
        char *dw = (char *)down->w + e * dn_w,
             *dsb = bits == 4 ? (char *)down->sb + e * dn_sb : NULL;
        if ((st = cb_mat_fill(dw, dsb, bits, &dn[e], 1, D, err, errlen))) return st;
    }
    return 0;
}

/* ====== The model ====== */

#define UP(dst, src, n) TRY(upload_f32(&(dst), src, n, #dst, err, errlen))
#define ONES(dst, n)    TRY(const_f32(&(dst), n, 1.0f, #dst, err, errlen))

/* The norm, conv and gate vectors of one layer from a loaded model. */
static int upload_layer_vectors(cuda_be *be, cb_layer *L, const tl_layer *src, char *err,
                                size_t errlen) {
    const tl_config *c = &be->cfg;
    UP(L->attn_norm, src->attn_norm, c->n_embd);
    UP(L->ffn_norm, src->ffn_norm, c->n_embd);
    if (L->kind == TL_LAYER_GDN) {
        UP(L->conv_w, src->gdn_conv, (size_t)be->conv_dim * 4);
        UP(L->dt_bias, src->gdn_dt_bias, c->gdn_n_v_head);
        UP(L->a_neg, src->gdn_a_neg, c->gdn_n_v_head);
        UP(L->gdn_norm, src->gdn_norm, 128);
    } else {
        UP(L->q_norm, src->attn_q_norm, 256);
        UP(L->k_norm, src->attn_k_norm, 256);
    }
    return 0;
}

/* The experts of one layer, expert-major, shared expert last. */
static int upload_layer_experts(cuda_be *be, cb_layer *L, const tl_layer *src, char *err,
                                size_t errlen) {
    int E = be->cfg.n_expert;
    const tl_mat **g = (const tl_mat **)xmalloc(sizeof(tl_mat *) * 3 * (E + 1));
    const tl_mat **u = g + (E + 1), **d = g + 2 * (E + 1);
    for (int e = 0; e < E; e++)
        g[e] = &src->exp_gate[e], u[e] = &src->exp_up[e], d[e] = &src->exp_down[e];
    g[E] = &src->sh_gate, u[E] = &src->sh_up, d[E] = &src->sh_down;
    int st = tl_gpu_experts_upload(&L->gate_up, &L->down, g, u, d, E + 1, err, errlen);
    free(g);
    return st;
}

/* Uploads one layer from a loaded model. */
static int upload_layer(cuda_be *be, cb_layer *L, const tl_layer *src, char *err, size_t errlen) {
    TRY(upload_layer_vectors(be, L, src, err, errlen));
    if (L->kind == TL_LAYER_GDN) {
        const tl_mat *parts[4] = {&src->gdn_qkv, &src->gdn_z, &src->gdn_b, &src->gdn_a};
        TRY(tl_gpu_mat_upload(&L->in, parts, 4, be->ld_gdn_in, err, errlen));
        const tl_mat *po[1] = {&src->gdn_out};
        TRY(tl_gpu_mat_upload(&L->out, po, 1, 0, err, errlen));
    } else {
        const tl_mat *parts[3] = {&src->attn_q, &src->attn_k, &src->attn_v};
        TRY(tl_gpu_mat_upload(&L->in, parts, 3, be->ld_attn_in, err, errlen));
        const tl_mat *po[1] = {&src->attn_o};
        TRY(tl_gpu_mat_upload(&L->out, po, 1, 0, err, errlen));
    }
    /* router + shared gate: bf16, never 4-bit (routing precision); E + 1 rows (not a multiple
     * of 8) keep tl_gpu_mat_upload on bf16. 8-bit weights (MLX files) dequantize to values bf16
     * cannot hold: they get a low bf16 plane too (w.sb, read by the bf16 GEMV: y = hi x + lo x),
     * so the router sees the checkpoint's weights to ~2^-17 and not to bf16's 2^-9, which moved
     * routing near-ties (tools/hf_fullwidth.py 4-bit: logits NMSE 9.7e-4 with hi alone). */
    const tl_mat *rp[2] = {&src->moe_router, &src->sh_gate_inp};
    TRY(tl_gpu_mat_upload(&L->router, rp, 2, be->cfg.n_expert + 1, err, errlen));
    return upload_layer_experts(be, L, src, err, errlen);
}

/* The vectors of a random GDN layer: conv weights ~ U(-0.5, 0.5) (torch's conv init bound
 * 1/sqrt(4)), -A with A ~ U(1, 16), unit dt_bias and norm. */
static int random_gdn_vectors(cuda_be *be, cb_layer *L, uint64_t *rs, char *err, size_t errlen) {
    int nv = be->cfg.gdn_n_v_head;
    size_t nc = (size_t)be->conv_dim * 4;
    float *h = (float *)xmalloc(sizeof(float) * nc);
    for (size_t i = 0; i < nc; i++) h[i] = host_uniform(rs) - 0.5f;
    int st = upload_f32(&L->conv_w, h, nc, "conv_w", err, errlen);
    for (int i = 0; i < nv && !st; i++) h[i] = -(1.0f + 15.0f * host_uniform(rs));
    if (!st) st = upload_f32(&L->a_neg, h, nv, "a_neg", err, errlen);
    free(h);
    if (st) return st;
    ONES(L->dt_bias, nv);
    ONES(L->gdn_norm, 128);
    return 0;
}

/* A random layer (bench): matrices with standard deviation 0.02; in 4-bit, the router carries a
 * low plane as a 4-bit MLX checkpoint's 8-bit router does (upload_layer). */
static int random_layer(cuda_be *be, cb_layer *L, int bits, uint64_t *rs, char *err,
                        size_t errlen) {
    const tl_config *c = &be->cfg;
    int F = c->n_ff_expert, E = c->n_expert, D = c->n_embd;
    const float sd = 0.02f;
    ONES(L->attn_norm, D);
    ONES(L->ffn_norm, D);
    if (L->kind == TL_LAYER_GDN) {
        TRY(mat_random(&L->in, bits, be->ld_gdn_in, D, host_rng(rs), sd, err, errlen));
        TRY(mat_random(&L->out, bits, D, be->val_dim, host_rng(rs), sd, err, errlen));
        TRY(random_gdn_vectors(be, L, rs, err, errlen));
    } else {
        TRY(mat_random(&L->in, bits, be->ld_attn_in, D, host_rng(rs), sd, err, errlen));
        TRY(mat_random(&L->out, bits, D, c->n_head * 256, host_rng(rs), sd, err, errlen));
        ONES(L->q_norm, 256);
        ONES(L->k_norm, 256);
    }
    TRY(mat_random(&L->router, 16, E + 1, D, host_rng(rs), sd, err, errlen));
    if (bits == 4) {
        void *lo = tl_gpu_malloc(mat_w_bytes(16, E + 1, D));
        if (!lo)
            return tl_errf(err, errlen, TL_ERR_NOMEM,
                           "cudaMalloc of the router's low plane failed");
        L->router.sb = lo;
        int st = fill_bf16(lo, (size_t)(E + 1) * D, host_rng(rs), sd * 0.004f);
        if (st) return tl_errf(err, errlen, st, "random fill of the router's low plane failed");
    }
    TRY(mat_random(&L->gate_up, bits, (E + 1) * 2 * F, D, host_rng(rs), sd, err, errlen));
    return mat_random(&L->down, bits, (E + 1) * D, F, host_rng(rs), sd, err, errlen);
}

static int random_model(cuda_be *be, const tl_cuda_params *p, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    uint64_t rs = p->seed ? p->seed : 1;
    int bits = p->weight_bits;
    TRY(mat_random(&be->embd, bits, c->n_vocab, c->n_embd, host_rng(&rs), 0.02f, err, errlen));
    TRY(mat_random(&be->lm_head, bits, c->n_vocab, c->n_embd, host_rng(&rs), 0.02f, err, errlen));
    ONES(be->out_norm, c->n_embd);
    for (int il = 0; il < c->n_layer; il++)
        TRY(random_layer(be, &be->L[il], bits, &rs, err, errlen));
    return 0;
}

static int upload_model(cuda_be *be, const tl_model *m, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    const tl_mat *pe[1] = {&m->tok_embd}, *po[1] = {&m->output};
    TRY(tl_gpu_mat_upload(&be->embd, pe, 1, 0, err, errlen));
    TRY(tl_gpu_mat_upload(&be->lm_head, po, 1, 0, err, errlen));
    UP(be->out_norm, m->out_norm, c->n_embd);
    for (int il = 0; il < c->n_layer; il++) {
        TRY(upload_layer(be, &be->L[il], &m->layers[il], err, errlen));
        if (isatty(2)) fprintf(stderr, "\rtulip: uploading layer %d/%d", il + 1, c->n_layer);
    }
    if (isatty(2)) fprintf(stderr, "\n");
    return 0;
}

/* The MTP head (docs/model.md §3.1) when speculative decoding is asked for: its block as a trunk
 * attention layer (the same layouts: 4-bit where the checkpoint's parts are MLX 4-bit g64, else
 * bf16), fc [n_embd, 2 n_embd] as one matrix, the three norms; random (from a seed of its own, so
 * the trunk is the same with and without it) with random weights. */
static int mtp_load(cuda_be *be, const tl_model *m, const tl_cuda_params *p, char *err,
                    size_t errlen) {
    const tl_config *c = &be->cfg;
    cb_spec *sp = (cb_spec *)xcalloc(1, sizeof *sp);
    be->sp = sp;
    sp->K = p->spec_tokens;
    sp->L.kind = TL_LAYER_ATTN;
    sp->L.st_idx = be->n_attn; /* its KV: the pool's layer after the trunk's */
    if (p->random_weights) {
        uint64_t rs = (p->seed ? p->seed : 1) ^ 0x6d74702d68656164ull;
        TRY(random_layer(be, &sp->L, p->weight_bits, &rs, err, errlen));
        TRY(mat_random(&sp->fc, p->weight_bits, c->n_embd, 2 * c->n_embd, host_rng(&rs), 0.02f, err,
                       errlen));
        ONES(sp->norm_emb, c->n_embd);
        ONES(sp->norm_hid, c->n_embd);
        ONES(sp->norm, c->n_embd);
        return 0;
    }
    const tl_mtp *x = &m->mtp;
    TRY(upload_layer(be, &sp->L, &x->layer, err, errlen));
    const tl_mat *pf[1] = {&x->fc};
    TRY(tl_gpu_mat_upload(&sp->fc, pf, 1, 0, err, errlen));
    UP(sp->norm_emb, x->norm_emb, c->n_embd);
    UP(sp->norm_hid, x->norm_hid, c->n_embd);
    UP(sp->norm, x->norm, c->n_embd);
    return 0;
}

static void layer_free(cb_layer *L) {
    tl_gpu_mat_free(&L->in), tl_gpu_mat_free(&L->out), tl_gpu_mat_free(&L->router);
    tl_gpu_mat_free(&L->gate_up), tl_gpu_mat_free(&L->down);
    float *vs[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm,
                   L->conv_w,    L->dt_bias,  L->a_neg,  L->gdn_norm};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) tl_gpu_free(vs[i]);
}

int cb_weights_load(cuda_be *be, const tl_model *m, const tl_cuda_params *p, char *err,
                    size_t errlen) {
    double t0 = tl_time_s();
    TRY(p->random_weights ? random_model(be, p, err, errlen) : upload_model(be, m, err, errlen));
    if (p->spec_tokens > 0) TRY(mtp_load(be, m, p, err, errlen));
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "weight upload: %s", cudaGetErrorString(e));
    if (!p->random_weights || getenv("TL_CUDA_VERBOSE"))
        fprintf(stderr, "tulip: weights on GPU: %.2f GB in %.1f s\n", cb_weight_bytes(be) / 1e9,
                tl_time_s() - t0);
    return 0;
}

void cb_weights_free(cuda_be *be) {
    for (int il = 0; il < be->cfg.n_layer; il++) layer_free(&be->L[il]);
    tl_gpu_mat_free(&be->embd), tl_gpu_mat_free(&be->lm_head);
    tl_gpu_free(be->out_norm);
    if (be->sp) { /* the MTP head's weights (its buffers: cb_spec_free) */
        layer_free(&be->sp->L);
        tl_gpu_mat_free(&be->sp->fc);
        tl_gpu_free(be->sp->norm_emb), tl_gpu_free(be->sp->norm_hid), tl_gpu_free(be->sp->norm);
    }
}

/* ====== 4-bit repack (MLX -> q4 tiled) and SwiGLU interleave. ====== */

/* Source row of destination row r: plain, or the SwiGLU interleave by 8 (gate rows then up). */
static __device__ __forceinline__ int rp_src_row(int r, int swiglu, int *is_up) {
    if (!swiglu) {
        *is_up = 0;
        return r;
    }
    int g = r >> 4, w = r & 15;
    *is_up = w >= 8;
    return g * 8 + (w & 7);
}

/* threads: one per destination word (mat, rb, kb, lane) then one per (mat, group, row) scale. */
__global__ void q4_repack_kernel(uint32_t *dw, uint32_t *dsb, tl_gpu_mlx_q4 s0, tl_gpu_mlx_q4 s1,
                                 int n_mat, int rows, int cols, int swiglu) {
    const int src_rows = swiglu ? rows / 2 : rows;
    const long long n_words = (long long)rows * cols / 8, n_groups = (long long)rows * cols / 64;
    const long long total = (long long)n_mat * (n_words + n_groups);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int mat = (int)(i / (n_words + n_groups));
        long long j = i % (n_words + n_groups);
        if (j < n_words) {
            int lane = (int)(j & 31);
            long long blk = j >> 5;
            int kb = (int)(blk % (cols / 32));
            int rb = (int)(blk / (cols / 32));
            int r = rb * 8 + lane / 4, t = lane & 3, up;
            int sr = rp_src_row(r, swiglu, &up);
            const uint32_t *src = (up ? s1.w : s0.w) + ((size_t)mat * src_rows + sr) * (cols / 8);
            const int coff[8] = {0, 1, 8, 9, 16, 17, 24, 25};
            const int pos[8] = {0, 4, 1, 5, 2, 6, 3, 7};
            uint32_t word = 0;
            for (int q = 0; q < 8; q++) {
                int c = kb * 32 + 2 * t + coff[q];
                uint32_t nib = (src[c / 8] >> (4 * (c % 8))) & 0xF;
                word |= nib << (4 * pos[q]);
            }
            dw[(size_t)mat * n_words + j] = word;
        } else {
            j -= n_words;
            int g = (int)(j / rows), r = (int)(j % rows), up;
            int sr = rp_src_row(r, swiglu, &up);
            const tl_gpu_mlx_q4 *s = up ? &s1 : &s0;
            size_t si = ((size_t)mat * src_rows + sr) * (cols / 64) + g;
            dsb[(size_t)mat * n_groups + j] =
                (uint32_t)s->scales[si] | ((uint32_t)s->biases[si] << 16);
        }
    }
}

extern "C" size_t tl_gpu_q4_w_bytes(int rows, int cols) { return (size_t)rows * cols / 2; }
extern "C" size_t tl_gpu_q4_sb_bytes(int rows, int cols) { return (size_t)rows * (cols / 64) * 4; }

static int q4_repack(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 s0, tl_gpu_mlx_q4 s1, int n_mat,
                     int rows, int cols, int swiglu, const tl_gpu_stream *st) {
    if (!dst_w || !dst_sb || !s0.w || !s0.scales || !s0.biases || n_mat < 0) return TL_ERR_INVALID;
    if (rows <= 0 || cols <= 0 || rows % 16 || cols % 64) return TL_ERR_INVALID;
    if (n_mat == 0) return 0;
    TL_LAUNCH(st, "q4_repack", q4_repack_kernel, dim3(4096), dim3(256), 0, (uint32_t *)dst_w,
              (uint32_t *)dst_sb, s0, s1, n_mat, rows, cols, swiglu);
    return 0;
}

extern "C" int tl_gpu_q4_repack(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 src, int n_mat, int rows,
                                int cols, const tl_gpu_stream *st) {
    return q4_repack(dst_w, dst_sb, src, src, n_mat, rows, cols, 0, st);
}

extern "C" int tl_gpu_q4_repack_swiglu(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 gate,
                                       tl_gpu_mlx_q4 up, int n_mat, int F, int cols,
                                       const tl_gpu_stream *st) {
    if (!up.w || !up.scales || !up.biases) return TL_ERR_INVALID;
    return q4_repack(dst_w, dst_sb, gate, up, n_mat, 2 * F, cols, 1, st);
}

/* threads: one per destination 16-byte chunk (8 bf16). */
__global__ void bf16_pack_swiglu_kernel(uint16_t *dst, const uint16_t *gate, const uint16_t *up,
                                        int n_mat, long long src_stride, int F, int cols) {
    const long long per_mat = 2LL * F * cols / 8, total = n_mat * per_mat;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int mat = (int)(i / per_mat);
        long long j = i % per_mat;
        int r = (int)(j / (cols / 8)), c8 = (int)(j % (cols / 8)), is_up;
        int sr = rp_src_row(r, 1, &is_up);
        const uint16_t *s = (is_up ? up : gate) + mat * src_stride + (size_t)sr * cols + c8 * 8;
        *(uint4 *)(dst + (size_t)mat * 2 * F * cols + (size_t)r * cols + c8 * 8) =
            *(const uint4 *)s;
    }
}

extern "C" int tl_gpu_bf16_pack_swiglu(uint16_t *dst, const uint16_t *gate, const uint16_t *up,
                                       int n_mat, long long src_mat_stride, int F, int cols,
                                       const tl_gpu_stream *st) {
    if (!dst || !gate || !up || n_mat < 0 || F <= 0 || F % 8 || cols % 8) return TL_ERR_INVALID;
    if (n_mat == 0) return 0;
    TL_LAUNCH(st, "bf16_pack_swiglu", bf16_pack_swiglu_kernel, dim3(4096), dim3(256), 0, dst, gate,
              up, n_mat, src_mat_stride, F, cols);
    return 0;
}
