/* CUDA backend runtime: device selection, memory helpers, weight upload (bf16, or 4-bit repacked
 * into the q4 tiled layout), random full-size weights built on the device, per-slot sequence
 * state, activation buffers, the per-kernel profiler, and tl_backend_cuda_open/close. The
 * schedule of one step is in cuda_forward.cu. */
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/util.h"
#include "cpu/cpu.h"
}

cudaStream_t tl_cuda_stream = 0;
int tl_cuda_sync_each = 0;
int tl_cuda_capturing = 0;
int tl_cuda_pdl = 0; /* set by the backend around the decode schedule (cuda_forward.cu) */

/* ====== Device and memory ====== */

extern "C" int tl_gpu_init(char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return tl_errf(err, errlen, TL_ERR_CUDA, "no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
    cudaDeviceProp pr;
    if (cudaGetDeviceProperties(&pr, 0) != cudaSuccess || cudaSetDevice(0) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot open CUDA device 0");
    if (pr.major != 9)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "GPU %s is compute capability %d.%d; this build targets sm_90a (Hopper)",
                       pr.name, pr.major, pr.minor);
    const char *s = getenv("TL_CUDA_SYNC");
    tl_cuda_sync_each = s && atoi(s) != 0;
    return 0;
}

extern "C" void *tl_gpu_malloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
extern "C" void tl_gpu_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int tl_gpu_upload(void *dst, const void *src, size_t n) {
    CUDA_TRY(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    return 0;
}
extern "C" int tl_gpu_download(void *dst, const void *src, size_t n) {
    CUDA_TRY(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    return 0;
}
extern "C" int tl_gpu_memset(void *dst, int v, size_t n) {
    CUDA_TRY(cudaMemset(dst, v, n));
    return 0;
}
extern "C" int tl_gpu_sync(void) {
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* ====== Per-kernel profiler (eager steps only) ====== */

#define PROF_MAX 8192
static int prof_on, prof_n;
static cudaEvent_t prof_ev[PROF_MAX];
static const char *prof_name[PROF_MAX];

void tl_cuda_prof_mark(const char *name) {
    if (!prof_on || tl_cuda_capturing || prof_n >= PROF_MAX) return;
    if (!prof_ev[prof_n]) cudaEventCreate(&prof_ev[prof_n]);
    cudaEventRecord(prof_ev[prof_n], tl_cuda_stream);
    prof_name[prof_n++] = name;
}

int cb_prof_active(void) { return prof_on; }

extern "C" void tl_cuda_prof_enable(tl_backend *b, int on) {
    prof_on = on;
    prof_n = 0;
}

extern "C" void tl_cuda_prof_report(tl_backend *b, void *file) {
    FILE *f = (FILE *)file;
    cudaDeviceSynchronize();
    const char *names[64];
    double ms[64];
    int calls[64], nn = 0;
    double total = 0;
    for (int i = 1; i < prof_n; i++) {
        float dt = 0;
        cudaEventElapsedTime(&dt, prof_ev[i - 1], prof_ev[i]);
        int k = 0;
        while (k < nn && strcmp(names[k], prof_name[i])) k++;
        if (k == nn && nn < 64) names[nn] = prof_name[i], ms[nn] = 0, calls[nn] = 0, nn++;
        if (k < 64) ms[k] += dt, calls[k]++;
        total += dt;
    }
    for (int i = 0; i < nn; i++) /* sort by time, descending */
        for (int j = i + 1; j < nn; j++)
            if (ms[j] > ms[i]) {
                double tm = ms[i];
                ms[i] = ms[j], ms[j] = tm;
                const char *tn = names[i];
                names[i] = names[j], names[j] = tn;
                int tc = calls[i];
                calls[i] = calls[j], calls[j] = tc;
            }
    fprintf(f, "| kernel | calls | ms | share |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < nn; i++)
        fprintf(f, "| %s | %d | %.4f | %.1f%% |\n", names[i], calls[i], ms[i],
                total > 0 ? 100.0 * ms[i] / total : 0.0);
    fprintf(f, "| total (launch gaps included) | | %.4f | 100%% |\n", total);
    prof_on = 0;
    prof_n = 0;
}

/* ====== Weight upload ====== */

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

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = mix64(seed + 0x9E3779B97F4A7C15ull * (i + 1));
        float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        p[i] = f2bf(amp * u);
    }
}
__global__ void fill_u32_kernel(uint32_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint32_t)(mix64(seed + 0x9E3779B97F4A7C15ull * (i + 1)) >> 16);
}
__global__ void fill_sb_kernel(uint32_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = mix64(seed + 0x9E3779B97F4A7C15ull * (i + 1));
        float s = scale * (0.75f + 0.5f * (float)(z >> 40) * (1.0f / 16777216.0f));
        p[i] = (uint32_t)f2bf(s) | ((uint32_t)f2bf(-7.5f * s) << 16);
    }
}

/* Values uniform with standard deviation std (bf16), or 4-bit s*(q - 7.5) with s ~ std*sqrt(3)/7.5.
 */
static int mat_random(tl_gpu_gemm_w *m, int bits, int rows, int cols, uint64_t seed, float std,
                      char *err, size_t errlen) {
    int st = mat_alloc(m, bits, rows, cols, err, errlen);
    if (st) return st;
    float amp = std * sqrtf(3.0f);
    if (bits == 16) {
        fill_bf16_kernel<<<4096, 256>>>((uint16_t *)m->w, (size_t)rows * cols, seed, amp);
    } else {
        fill_u32_kernel<<<4096, 256>>>((uint32_t *)m->w, (size_t)rows * cols / 8, seed);
        fill_sb_kernel<<<1024, 256>>>((uint32_t *)m->sb, (size_t)rows * (cols / 64),
                                      seed ^ 0x5bd1e995ull, amp / 7.5f);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "random fill: %s", cudaGetErrorString(e));
    return 0;
}

static float *upload_f32(const float *h, size_t n) {
    float *d = (float *)tl_gpu_malloc(n * sizeof(float));
    if (d && tl_gpu_upload(d, h, n * sizeof(float))) {
        tl_gpu_free(d);
        return NULL;
    }
    return d;
}
static float *const_f32(size_t n, float v) {
    float *h = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = v;
    float *d = upload_f32(h, n);
    free(h);
    return d;
}
static uint64_t host_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float host_uniform(uint64_t *s) { return (float)(host_rng(s) >> 40) * (1.0f / 16777216.0f); }

/* ====== Backend open / close ====== */

static void cb_close(tl_backend *b) {
    if (!b) return;
    cuda_be *be = (cuda_be *)b->impl;
    if (be) {
        cudaDeviceSynchronize();
        for (int i = 0; i <= CB_MAX_GRAPH_B; i++)
            if (be->graph[i]) cudaGraphExecDestroy(be->graph[i]);
        for (int il = 0; il < be->cfg.n_layer; il++) {
            cb_layer *L = &be->L[il];
            tl_gpu_mat_free(&L->in), tl_gpu_mat_free(&L->out), tl_gpu_mat_free(&L->router);
            tl_gpu_mat_free(&L->gate_up), tl_gpu_mat_free(&L->down);
            float *vs[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm,
                           L->conv_w,    L->dt_bias,  L->a_neg,  L->gdn_norm};
            for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) tl_gpu_free(vs[i]);
        }
        tl_gpu_mat_free(&be->embd), tl_gpu_mat_free(&be->lm_head);
        void *ps[] = {
            be->out_norm,   be->kc,       be->vc,     be->conv_st, be->rec_st,   be->x,
            be->proj,       be->conv_out, be->y,      be->q,       be->part,     be->rlog,
            be->wts,        be->wsh,      be->act,    be->xo,      be->logits,   be->ids,
            be->d_meta,     be->d_params, be->d_keys, be->d_out,   be->d_counts, be->d_hist,
            be->d_sscratch, be->xb,       be->yb,     be->hexp,    be->yslot,    be->hs,
            be->ys,         be->gg,       be->gbeta,  be->shl,     be->plan,     be->gdn_ws};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) tl_gpu_free(ps[i]);
        if (be->h_meta) cudaFreeHost(be->h_meta);
        if (be->h_ptab) cudaFreeHost(be->h_ptab);
        tl_gpu_free(be->d_ptab);
        free(be->slot_np), free(be->free_pg);
        if (be->h_params) cudaFreeHost(be->h_params);
        if (be->h_keys) cudaFreeHost(be->h_keys);
        if (be->h_out) cudaFreeHost(be->h_out);
        if (be->meta_ev) cudaEventDestroy(be->meta_ev);
        if (be->stream) cudaStreamDestroy(be->stream);
        tl_cuda_stream = 0;
        free(be);
    }
    free(b);
}

static void cb_reset_slot(tl_backend *b, int slot) {
    cuda_be *be = (cuda_be *)b->impl;
    if (slot < 0 || slot >= be->max_seqs) return;
    const tl_config *c = &be->cfg;
    /* the slot's KV pages go back to the pool (their stale contents are never read: a page is
     * only read below its slot's length, which the new owner writes first) */
    int32_t *row = be->h_ptab + (size_t)slot * be->max_pages;
    for (int i = be->slot_np[slot] - 1; i >= 0; i--) be->free_pg[be->n_free++] = row[i];
    be->slot_np[slot] = 0;
    size_t rec = (size_t)c->gdn_n_v_head * 128 * 128, conv = (size_t)3 * be->conv_dim;
    for (int g = 0; g < be->n_gdn; g++) {
        cudaMemsetAsync(be->rec_st + ((size_t)g * be->max_seqs + slot) * rec, 0, rec * 4,
                        be->stream);
        cudaMemsetAsync(be->conv_st + ((size_t)g * be->max_seqs + slot) * conv, 0, conv * 4,
                        be->stream);
    }
    cudaStreamSynchronize(be->stream);
}

/* The dimensions the kernels are specialised on (the CPU reference accepts any). */
static int check_dims(const tl_config *c, char *err, size_t errlen) {
#define NEED(cond, field, want)                                                                    \
    if (!(cond))                                                                                   \
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,                                            \
                       "config %s = %d, the CUDA kernels need %s", #field, (int)c->field, want);
    NEED(c->head_dim == 256, head_dim, "256");
    NEED(c->n_rot == 64, n_rot, "64 (head_dim * partial_rotary_factor)");
    NEED(c->gdn_k_dim == 128, gdn_k_dim, "128");
    NEED(c->gdn_v_dim == 128, gdn_v_dim, "128");
    NEED(c->gdn_conv_k == 4, gdn_conv_k, "4");
    NEED(c->n_head_kv > 0 && c->n_head % c->n_head_kv == 0 && c->n_head / c->n_head_kv <= 16,
         n_head, "a multiple of n_head_kv, at most 16x");
    NEED(c->gdn_n_k_head > 0 && c->gdn_n_v_head % c->gdn_n_k_head == 0, gdn_n_v_head,
         "a multiple of gdn_n_k_head");
    NEED(c->n_embd % 256 == 0, n_embd, "a multiple of 256");
    NEED(c->n_ff_expert % 64 == 0 && c->n_ff_expert % 256 == 0, n_ff_expert, "a multiple of 256");
    NEED(c->n_ff_shared == c->n_ff_expert, n_ff_shared, "n_ff_expert (stacked with the experts)");
    NEED(c->n_expert <= 256, n_expert, "<= 256");
    NEED(c->n_expert_used <= 16 && c->n_expert_used >= 1, n_expert_used, "1..16");
    NEED(c->n_layer <= TL_MAX_LAYERS, n_layer, "<= TL_MAX_LAYERS");
#undef NEED
    return 0;
}

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

/* Uploads one layer from a loaded model. */
static int upload_layer(cuda_be *be, cb_layer *L, const tl_layer *src, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    int st, E = c->n_expert;
    size_t D = (size_t)c->n_embd;
    L->attn_norm = upload_f32(src->attn_norm, D);
    L->ffn_norm = upload_f32(src->ffn_norm, D);
    if (L->kind == TL_LAYER_GDN) {
        const tl_mat *parts[4] = {&src->gdn_qkv, &src->gdn_z, &src->gdn_b, &src->gdn_a};
        if ((st = tl_gpu_mat_upload(&L->in, parts, 4, be->ld_gdn_in, err, errlen))) return st;
        const tl_mat *po[1] = {&src->gdn_out};
        if ((st = tl_gpu_mat_upload(&L->out, po, 1, 0, err, errlen))) return st;
        L->conv_w = upload_f32(src->gdn_conv, (size_t)be->conv_dim * 4);
        L->dt_bias = upload_f32(src->gdn_dt_bias, c->gdn_n_v_head);
        L->a_neg = upload_f32(src->gdn_a_neg, c->gdn_n_v_head);
        L->gdn_norm = upload_f32(src->gdn_norm, 128);
    } else {
        const tl_mat *parts[3] = {&src->attn_q, &src->attn_k, &src->attn_v};
        if ((st = tl_gpu_mat_upload(&L->in, parts, 3, be->ld_attn_in, err, errlen))) return st;
        const tl_mat *po[1] = {&src->attn_o};
        if ((st = tl_gpu_mat_upload(&L->out, po, 1, 0, err, errlen))) return st;
        L->q_norm = upload_f32(src->attn_q_norm, 256);
        L->k_norm = upload_f32(src->attn_k_norm, 256);
    }
    /* router + shared gate: bf16, never 4-bit (routing precision). 8-bit weights (MLX files)
     * dequantize to values bf16 cannot hold: they get a low bf16 plane too (w.sb, read by the
     * bf16 GEMV: y = hi x + lo x), so the router sees the checkpoint's weights to ~2^-17 and not
     * to bf16's 2^-9, which moved routing near-ties (tools/hf_fullwidth.py 4-bit: logits NMSE
     * 9.7e-4 with hi alone, notes/2026-12-03-paged-kv-and-floor.md). */
    {
        tl_mat r = src->moe_router;
        const tl_mat *parts[2] = {&r, &src->sh_gate_inp};
        /* E + 1 rows (not a multiple of 8): tl_gpu_mat_upload keeps it bf16 */
        if ((st = tl_gpu_mat_upload(&L->router, parts, 2, E + 1, err, errlen))) return st;
    }
    /* experts, expert-major, shared expert last */
    {
        const tl_mat **g = (const tl_mat **)xmalloc(sizeof(tl_mat *) * 3 * (E + 1));
        const tl_mat **u = g + (E + 1), **d = g + 2 * (E + 1);
        for (int e = 0; e < E; e++)
            g[e] = &src->exp_gate[e], u[e] = &src->exp_up[e], d[e] = &src->exp_down[e];
        g[E] = &src->sh_gate, u[E] = &src->sh_up, d[E] = &src->sh_down;
        st = tl_gpu_experts_upload(&L->gate_up, &L->down, g, u, d, E + 1, err, errlen);
        free(g);
        if (st) return st;
    }
    return 0;
}

static int random_layer(cuda_be *be, cb_layer *L, int bits, uint64_t *rs, char *err,
                        size_t errlen) {
    const tl_config *c = &be->cfg;
    int st, F = c->n_ff_expert, E = c->n_expert, D = c->n_embd, nv = c->gdn_n_v_head;
    const float std = 0.02f;
    L->attn_norm = const_f32(D, 1.0f);
    L->ffn_norm = const_f32(D, 1.0f);
    if (L->kind == TL_LAYER_GDN) {
        if ((st = mat_random(&L->in, bits, be->ld_gdn_in, D, host_rng(rs), std, err, errlen)))
            return st;
        if ((st = mat_random(&L->out, bits, D, be->val_dim, host_rng(rs), std, err, errlen)))
            return st;
        size_t nc = (size_t)be->conv_dim * 4;
        float *h = (float *)xmalloc(sizeof(float) * nc);
        for (size_t i = 0; i < nc; i++)
            h[i] = host_uniform(rs) - 0.5f; /* torch conv init bound 1/sqrt(4) */
        L->conv_w = upload_f32(h, nc);
        for (int i = 0; i < nv; i++)
            h[i] = -(1.0f + 15.0f * host_uniform(rs)); /* -A, A ~ U(1,16) */
        L->a_neg = upload_f32(h, nv);
        free(h);
        L->dt_bias = const_f32(nv, 1.0f);
        L->gdn_norm = const_f32(128, 1.0f);
    } else {
        if ((st = mat_random(&L->in, bits, be->ld_attn_in, D, host_rng(rs), std, err, errlen)))
            return st;
        if ((st = mat_random(&L->out, bits, D, c->n_head * 256, host_rng(rs), std, err, errlen)))
            return st;
        L->q_norm = const_f32(256, 1.0f);
        L->k_norm = const_f32(256, 1.0f);
    }
    if ((st = mat_random(&L->router, 16, E + 1, D, host_rng(rs), std, err, errlen))) return st;
    if (bits == 4) { /* as a 4-bit MLX checkpoint's 8-bit router: hi + lo planes (upload_layer) */
        void *lo = tl_gpu_malloc(mat_w_bytes(16, E + 1, D));
        if (!lo)
            return tl_errf(err, errlen, TL_ERR_NOMEM,
                           "cudaMalloc of the router's low plane failed");
        fill_bf16_kernel<<<4096, 256>>>((uint16_t *)lo, (size_t)(E + 1) * D, host_rng(rs),
                                        std * 0.004f);
        L->router.sb = lo;
    }
    if ((st = mat_random(&L->gate_up, bits, (E + 1) * 2 * F, D, host_rng(rs), std, err, errlen)))
        return st;
    if ((st = mat_random(&L->down, bits, (E + 1) * D, F, host_rng(rs), std, err, errlen)))
        return st;
    return 0;
}

#define ALLOC(ptr, type, count)                                                                    \
    do {                                                                                           \
        size_t n_ = (size_t)(count) * sizeof(type);                                                \
        if (!((ptr) = (type *)tl_gpu_malloc(n_))) {                                                \
            st = tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMalloc of %zu bytes failed (%s)", n_,     \
                         #ptr);                                                                    \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

extern "C" int tl_backend_cuda_open(tl_backend **out, const tl_model *m, const tl_config *cfg,
                                    const tl_cuda_params *p, char *err, size_t errlen) {
    *out = NULL;
    const tl_config *c = m ? &m->cfg : cfg;
    if (!c) return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: no model and no config");
    if (!m && !p->random_weights)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: no model");
    int st = tl_gpu_init(err, errlen);
    if (st) return st;
    if ((st = check_dims(c, err, errlen))) return st;
    if (p->max_seqs < 1 || p->max_ctx < 1)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "CUDA backend: max_seqs and max_ctx must be >= 1");
    if (p->random_weights && p->weight_bits != 4 && p->weight_bits != 16)
        return tl_errf(err, errlen, TL_ERR_INVALID, "random weights: bits must be 4 or 16, not %d",
                       p->weight_bits);

    tl_backend *b = (tl_backend *)xcalloc(1, sizeof *b);
    cuda_be *be = (cuda_be *)xcalloc(1, sizeof *be);
    b->name = "cuda";
    b->can_sample = 1;
    b->impl = be;
    b->close = cb_close;
    b->reset_slot = cb_reset_slot;
    b->forward = cb_forward;
    be->cfg = *c;
    be->max_seqs = p->max_seqs;
    be->max_ctx = p->max_ctx;
    be->pf_ok = c->n_embd == TL_N_EMBD && c->n_head == TL_N_HEAD && c->n_head_kv == TL_N_HEAD_KV &&
                c->gdn_n_k_head == TL_GDN_N_K_HEAD && c->gdn_n_v_head == TL_GDN_N_V_HEAD &&
                c->n_expert == TL_N_EXPERT && c->n_expert_used == TL_N_EXPERT_USED &&
                c->n_ff_expert == TL_N_FF_EXPERT && !getenv("TL_CUDA_NO_PREFILL_GEMM");
    be->max_tok = be->pf_ok ? 2048 : 512;
    if (getenv("TL_CUDA_MAX_TOK")) be->max_tok = TL_MAX(16, atoi(getenv("TL_CUDA_MAX_TOK")));
    be->max_out = p->max_seqs;
    be->part_rows = TL_MAX(p->max_seqs * CB_DECODE_SPLIT, 2048);
    be->conv_dim = tl_config_gdn_conv_dim(c);
    be->val_dim = tl_config_gdn_val_dim(c);
    be->ld_gdn_in = round_up(be->conv_dim + be->val_dim + 2 * c->gdn_n_v_head, 128);
    be->ld_attn_in = round_up(c->n_head * 512 + 2 * c->n_head_kv * 256, 128);
    be->n_valid = TL_MIN(c->n_vocab, TL_N_VOCAB_TOKENS);
    const char *ng = getenv("TL_CUDA_NO_GRAPH");
    be->graphs_off = (ng && atoi(ng)) || tl_cuda_sync_each;
    const char *amc = getenv("TL_CUDA_ATTN_MIN_CHUNK");
    if (amc && atoi(amc) > 0) tl_attn_min_chunk = atoi(amc);
    const char *ntc = getenv("TL_CUDA_ATTN_NO_TC");
    if (ntc && atoi(ntc)) tl_gpu_attn_force_cuda_core(1);
    const char *npdl = getenv("TL_CUDA_NO_PDL");
    be->pdl_off = npdl && atoi(npdl);
    if (cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking) != cudaSuccess) {
        st = tl_errf(err, errlen, TL_ERR_CUDA, "cudaStreamCreate failed");
        goto fail;
    }
    tl_cuda_stream = be->stream;
    if (cudaEventCreateWithFlags(&be->meta_ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(be->meta_ev, be->stream) != cudaSuccess) {
        st = tl_errf(err, errlen, TL_ERR_CUDA, "cudaEventCreate failed");
        goto fail;
    }
    if ((st = tl_gpu_attn_setup()) || (st = tl_gpu_gemv_setup()) || (st = tl_gpu_moe_setup())) {
        tl_errf(err, errlen, st, "attention kernel setup failed");
        goto fail;
    }

    {
        int ia = 0, ig = 0;
        for (int il = 0; il < c->n_layer; il++) {
            be->L[il].kind = c->layer_kind[il];
            be->L[il].st_idx = c->layer_kind[il] == TL_LAYER_ATTN ? ia++ : ig++;
        }
        be->n_attn = ia, be->n_gdn = ig;
    }

    /* weights */
    {
        double t0 = tl_time_s();
        if (p->random_weights) {
            uint64_t rs = p->seed ? p->seed : 1;
            int bits = p->weight_bits;
            if ((st = mat_random(&be->embd, bits, c->n_vocab, c->n_embd, host_rng(&rs), 0.02f, err,
                                 errlen)))
                goto fail;
            if ((st = mat_random(&be->lm_head, bits, c->n_vocab, c->n_embd, host_rng(&rs), 0.02f,
                                 err, errlen)))
                goto fail;
            be->out_norm = const_f32(c->n_embd, 1.0f);
            for (int il = 0; il < c->n_layer; il++)
                if ((st = random_layer(be, &be->L[il], bits, &rs, err, errlen))) goto fail;
        } else {
            const tl_mat *pe[1] = {&m->tok_embd};
            if ((st = tl_gpu_mat_upload(&be->embd, pe, 1, 0, err, errlen))) goto fail;
            const tl_mat *po[1] = {&m->output};
            if ((st = tl_gpu_mat_upload(&be->lm_head, po, 1, 0, err, errlen))) goto fail;
            be->out_norm = upload_f32(m->out_norm, c->n_embd);
            for (int il = 0; il < c->n_layer; il++) {
                if ((st = upload_layer(be, &be->L[il], &m->layers[il], err, errlen))) goto fail;
                if (isatty(2))
                    fprintf(stderr, "\rtulip: uploading layer %d/%d", il + 1, c->n_layer);
            }
            if (isatty(2)) fprintf(stderr, "\n");
        }
        if (cudaDeviceSynchronize() != cudaSuccess) {
            st = tl_errf(err, errlen, TL_ERR_CUDA, "weight upload: %s",
                         cudaGetErrorString(cudaGetLastError()));
            goto fail;
        }
        if (!p->random_weights || getenv("TL_CUDA_VERBOSE"))
            fprintf(stderr, "tulip: weights on GPU: %.2f GB in %.1f s\n",
                    tl_cuda_weight_bytes(b) / 1e9, tl_time_s() - t0);
    }

    /* sequence state */
    {
        /* paged KV: a pool of n_page pages shared by all slots; by default every slot can reach
         * max_ctx at once, --kv-tokens makes the pool smaller (or larger is pointless) */
        be->max_pages = TL_CEIL_DIV(be->max_ctx, TL_KV_PAGE);
        long long want = p->kv_tokens > 0 ? TL_CEIL_DIV((long long)p->kv_tokens, TL_KV_PAGE)
                                          : (long long)be->max_seqs * be->max_pages;
        be->n_page = (int)TL_MIN(want, (long long)be->max_seqs * be->max_pages);
        size_t kv = (size_t)be->n_attn * be->n_page * TL_KV_PAGE * c->n_head_kv * 256;
        ALLOC(be->kc, uint16_t, kv > 0 ? kv : 1);
        ALLOC(be->vc, uint16_t, kv > 0 ? kv : 1);
        size_t nt = (size_t)be->max_seqs * be->max_pages;
        ALLOC(be->d_ptab, int32_t, nt);
        if (cudaMallocHost(&be->h_ptab, nt * sizeof(int32_t)) != cudaSuccess) {
            st = tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMallocHost of the KV page table failed");
            goto fail;
        }
        be->slot_np = (int *)xcalloc((size_t)be->max_seqs, sizeof(int));
        be->free_pg = (int *)xmalloc((size_t)be->n_page * sizeof(int));
        for (int i = 0; i < be->n_page; i++) be->free_pg[i] = be->n_page - 1 - i; /* 0 on top */
        be->n_free = be->n_page;
        size_t conv = (size_t)be->n_gdn * be->max_seqs * 3 * be->conv_dim;
        size_t rec = (size_t)be->n_gdn * be->max_seqs * c->gdn_n_v_head * 128 * 128;
        ALLOC(be->conv_st, float, conv > 0 ? conv : 1);
        ALLOC(be->rec_st, float, rec > 0 ? rec : 1);
        cudaMemset(be->conv_st, 0, conv * 4);
        cudaMemset(be->rec_st, 0, rec * 4);
    }
    /* activations */
    {
        size_t T = be->max_tok, D = c->n_embd, K = c->n_expert_used, F = c->n_ff_expert;
        size_t ldp = TL_MAX(be->ld_gdn_in, be->ld_attn_in);
        size_t ydim = TL_MAX(be->val_dim, c->n_head * 256);
        ALLOC(be->x, float, T *D);
        ALLOC(be->proj, float, T *ldp);
        ALLOC(be->conv_out, float, T * be->conv_dim);
        ALLOC(be->y, float, T *ydim);
        ALLOC(be->q, float, T * c->n_head * 256);
        ALLOC(be->part, float, (size_t)be->part_rows * c->n_head * 258);
        ALLOC(be->rlog, float, T *(c->n_expert + 1));
        ALLOC(be->ids, int32_t, T * K);
        ALLOC(be->wts, float, T *K);
        ALLOC(be->wsh, float, T);
        ALLOC(be->act, float, T *(K + 1) * F);
        ALLOC(be->xo, float, (size_t)be->max_out *D);
        ALLOC(be->logits, float, (size_t)be->max_out * c->n_vocab);
        if (be->pf_ok) {
            size_t yd = TL_MAX(be->val_dim, c->n_head * 256);
            ALLOC(be->xb, uint16_t, T * D);
            ALLOC(be->yb, uint16_t, T * yd);
            ALLOC(be->hexp, uint16_t, T * K * F);
            ALLOC(be->yslot, uint16_t, T * K * D);
            ALLOC(be->hs, uint16_t, T * F);
            ALLOC(be->ys, uint16_t, T * D);
            ALLOC(be->gg, float, T * c->gdn_n_v_head);
            ALLOC(be->gbeta, float, T * c->gdn_n_v_head);
            ALLOC(be->shl, float, T);
            ALLOC(be->plan, int32_t, tl_gpu_moe_pf_plan_ints((int)T));
            ALLOC(be->gdn_ws, char, tl_gpu_gdn_chunk_ws_bytes());
        }
        be->meta_ints = 4 * (size_t)be->max_tok + 5 * (size_t)be->max_seqs;
        ALLOC(be->d_meta, int32_t, be->meta_ints);
        ALLOC(be->d_params, tl_sample_params, be->max_out);
        ALLOC(be->d_keys, uint64_t, be->max_out);
        ALLOC(be->d_out, tl_sample_out, be->max_out);
        ALLOC(be->d_counts, int32_t, (size_t)be->max_out * c->n_vocab);
        ALLOC(be->d_hist, int32_t, (size_t)be->max_seqs * be->max_ctx);
        ALLOC(be->d_sscratch, float, (size_t)be->max_out * 2 * c->n_vocab);
        if (cudaMallocHost(&be->h_meta, be->meta_ints * 4) != cudaSuccess ||
            cudaMallocHost(&be->h_params, be->max_out * sizeof(tl_sample_params)) != cudaSuccess ||
            cudaMallocHost(&be->h_keys, be->max_out * sizeof(uint64_t)) != cudaSuccess ||
            cudaMallocHost(&be->h_out, be->max_out * sizeof(tl_sample_out)) != cudaSuccess) {
            st = tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMallocHost failed");
            goto fail;
        }
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
        st = tl_errf(err, errlen, TL_ERR_CUDA, "CUDA backend init: %s",
                     cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    *out = b;
    return 0;
fail:
    cb_close(b);
    return st;
}

/* ====== Bench helpers ====== */

extern "C" size_t tl_cuda_weight_bytes(const tl_backend *b) {
    const cuda_be *be = (const cuda_be *)b->impl;
    size_t n = tl_gpu_mat_bytes(&be->embd) + tl_gpu_mat_bytes(&be->lm_head);
    for (int il = 0; il < be->cfg.n_layer; il++) {
        const cb_layer *L = &be->L[il];
        n += tl_gpu_mat_bytes(&L->in) + tl_gpu_mat_bytes(&L->out) + tl_gpu_mat_bytes(&L->router) +
             tl_gpu_mat_bytes(&L->gate_up) + tl_gpu_mat_bytes(&L->down);
    }
    return n;
}

extern "C" double tl_cuda_decode_bytes(const tl_backend *b, int kv_len) {
    const cuda_be *be = (const cuda_be *)b->impl;
    const tl_config *c = &be->cfg;
    double n =
        (double)tl_gpu_mat_bytes(&be->embd) / c->n_vocab + (double)tl_gpu_mat_bytes(&be->lm_head);
    for (int il = 0; il < c->n_layer; il++) {
        const cb_layer *L = &be->L[il];
        double per_exp = (double)(tl_gpu_mat_bytes(&L->gate_up) + tl_gpu_mat_bytes(&L->down)) /
                         (c->n_expert + 1);
        n += tl_gpu_mat_bytes(&L->in) + tl_gpu_mat_bytes(&L->out) + tl_gpu_mat_bytes(&L->router) +
             per_exp * (c->n_expert_used + 1);
        if (L->kind == TL_LAYER_ATTN)
            n += (double)kv_len * c->n_head_kv * 256 * 2 * 2;
        else
            n += 2.0 * (c->gdn_n_v_head * 128.0 * 128.0 * 4 + 3.0 * be->conv_dim * 4);
    }
    return n;
}

__global__ void touch_kernel(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)(i & 1023);
}

extern "C" double tl_gpu_measure_bw(size_t bytes) {
    void *a = tl_gpu_malloc(bytes), *bb = tl_gpu_malloc(bytes);
    if (!a || !bb) {
        tl_gpu_free(a), tl_gpu_free(bb);
        return 0;
    }
    touch_kernel<<<4096, 256>>>((float *)a, bytes / 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float best[7];
    for (int i = 0; i < 7; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(bb, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&best[i], e0, e1);
    }
    for (int i = 0; i < 7; i++) /* median */
        for (int j = i + 1; j < 7; j++)
            if (best[j] < best[i]) {
                float t = best[i];
                best[i] = best[j], best[j] = t;
            }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    tl_gpu_free(a), tl_gpu_free(bb);
    return 2.0 * bytes / (best[3] * 1e-3);
}
