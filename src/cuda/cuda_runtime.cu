/* CUDA backend runtime: device selection and memory helpers, then the backend object: open (in
 * phases: parameters, streams, weights via cuda_weights.cu, sequence state, activations), close,
 * and the reset of a slot. The schedule of one step is in cuda_forward.cu. */
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/util.h"
}

/* ====== Device and memory ====== */

/* `device` indexes the devices the runtime sees: CUDA_VISIBLE_DEVICES, applied by the runtime,
 * decides which those are (docs/deploy.md). The calling thread's current device becomes it. */
extern "C" int tl_gpu_init(int device, char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return tl_errf(err, errlen, TL_ERR_CUDA, "no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
    if (device < 0 || device >= n)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "CUDA device %d does not exist: %d visible (0..%d; CUDA_VISIBLE_DEVICES "
                       "selects which)",
                       device, n, n - 1);
    cudaDeviceProp pr;
    if ((e = cudaGetDeviceProperties(&pr, device)) != cudaSuccess ||
        (e = cudaSetDevice(device)) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot open CUDA device %d: %s", device,
                       cudaGetErrorString(e));
    if (pr.major != 9)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "GPU %s is compute capability %d.%d; this build targets sm_90a (Hopper)",
                       pr.name, pr.major, pr.minor);
    int st = cb_attn_setup();
    if (!st) st = cb_gemv_setup();
    if (!st) st = cb_moe_setup();
    if (st) return tl_errf(err, errlen, st, "kernel setup (shared-memory limits) failed");
    cb_grid_cap();
    return 0;
}

extern "C" int tl_gpu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
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

/* ====== Close and reset ====== */

static void free_state(cuda_be *be) {
    void *ps[] = {be->kc,         be->vc,          be->conv_st, be->rec_st,    be->x,
                  be->proj,       be->conv_out,    be->y,       be->q,         be->part,
                  be->rlog,       be->wts,         be->wsh,     be->act,       be->xo,
                  be->logits,     be->ids,         be->d_meta,  be->d_params,  be->d_keys,
                  be->d_out,      be->d_counts,    be->d_cbits, be->d_nprompt, be->d_sscratch,
                  be->xb,         be->xlo,         be->yb,      be->hexp,      be->yslot,
                  be->hs,         be->ys,          be->gg,      be->gbeta,     be->shl,
                  be->plan,       be->gdn_ws,      be->gemm_ws, be->d_ptab,    be->d_rowslot,
                  be->d_bias_ids, be->d_bias_vals, be->d_allow, be->d_rlogits, be->cv_edge};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) tl_gpu_free(ps[i]);
    void *hs[] = {be->h_meta,    be->h_ptab,    be->h_params,   be->h_keys,      be->h_out,
                  be->h_nprompt, be->h_rowslot, be->h_bias_ids, be->h_bias_vals, be->h_allow};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (hs[i]) cudaFreeHost(hs[i]);
    tl_kv_pages_free(&be->pages);
    cb_pc_free(be);
}

/* The CUDA runtime's current device is per host thread: every entry point of the backend makes
 * the backend's device current first, since the thread that opened it (the server's loader) is
 * not the one that steps it (the engine thread). Returns 0 or TL_ERR_CUDA. */
int cb_bind(const cuda_be *be) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == be->device) return 0;
    return cudaSetDevice(be->device) == cudaSuccess ? 0 : TL_ERR_CUDA;
}

static void cb_close(tl_backend *b) {
    if (!b) return;
    cuda_be *be = (cuda_be *)b->impl;
    if (be) {
        cb_bind(be);
        cudaDeviceSynchronize();
        for (int i = 0; i <= CB_MAX_GRAPH_B; i++)
            if (be->graph[i]) cudaGraphExecDestroy(be->graph[i]);
        cb_weights_free(be);
        cb_spec_free(be);
        free_state(be);
        free(be->prof);
        if (be->meta_ev) cudaEventDestroy(be->meta_ev);
        if (be->stream) cudaStreamDestroy(be->stream);
        free(be);
    }
    free(b);
}

/* The slot's KV pages go back to the pool; its conv and recurrent state and its penalty counts
 * are zeroed. A failure is a CUDA error (a sticky one loses the device: every later step fails). */
static int cb_reset_slot(tl_backend *b, int slot) {
    cuda_be *be = (cuda_be *)b->impl;
    if (slot < 0 || slot >= be->max_seqs) return TL_ERR_INVALID;
    if (be->lost) return TL_ERR_DEVICE_LOST;
    TRY(cb_bind(be));
    tl_kv_pages_release(&be->pages, slot);
    cb_spec_slot(be, slot, 0);
    size_t rec = (size_t)be->cfg.gdn_n_v_head * 128 * 128, conv = (size_t)3 * be->conv_dim;
    cudaError_t e = cudaSuccess;
    for (int g = 0; g < be->n_gdn && e == cudaSuccess; g++) {
        e = cudaMemsetAsync(be->rec_st + ((size_t)g * be->max_seqs + slot) * rec * be->st_esz, 0,
                            rec * be->st_esz, be->stream);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(be->conv_st + ((size_t)g * be->max_seqs + slot) * conv, 0, conv * 4,
                                be->stream);
    }
    if (e == cudaSuccess) /* the slot's penalty counts and their bits */
        e = cudaMemsetAsync(be->d_counts + (size_t)slot * be->cfg.n_vocab, 0,
                            (size_t)be->cfg.n_vocab * sizeof(int32_t), be->stream);
    size_t cw = TL_GPU_COUNT_WORDS(be->cfg.n_vocab);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(be->d_cbits + slot * cw, 0, cw * sizeof(uint32_t), be->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(be->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "tulip: CUDA reset of slot %d failed: %s\n", slot, cudaGetErrorString(e));
        if (cb_device_broken(be)) be->lost = 1;
        return TL_ERR_CUDA;
    }
    return 0;
}

static void cb_kv_stats(tl_backend *b, tl_kv_stats *out) {
    const tl_kv_pages *p = &((cuda_be *)b->impl)->pages;
    out->page_tokens = p->page_tokens;
    out->pages_total = p->n_page;
    out->pages_free = tl_kv_pages_available(p); /* idle prefix-cache pages are evicted on demand */
    out->pages_per_seq = p->max_pages;
}

/* ====== Open ====== */

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

/* The limits of the backend's parameters, checked before anything is allocated. */
static int check_params(const tl_config *c, const tl_model *m, const tl_cuda_params *p, char *err,
                        size_t errlen) {
    if (!c) return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: no model and no config");
    if (!m && !p->random_weights)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: no model");
    if (p->max_seqs < 1 || p->max_seqs > CB_MAX_SEQS)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: max_seqs = %d, must be 1..%d",
                       p->max_seqs, CB_MAX_SEQS);
    if (p->max_ctx < 0 || p->max_ctx > c->max_pos)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "CUDA backend: context %d tokens, must be 1..%d (max_position_embeddings) "
                       "or 0 (chosen from the KV pool)",
                       p->max_ctx, c->max_pos);
    if (p->kv_tokens < 0)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: kv_tokens = %ld is negative",
                       p->kv_tokens);
    if (!(p->gpu_memory_utilization >= 0 && p->gpu_memory_utilization <= 1))
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "CUDA backend: gpu_memory_utilization = %g, must be in (0, 1] (0: 0.9)",
                       p->gpu_memory_utilization);
    if (p->device < 0)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: device %d is negative",
                       p->device);
    if (p->spec_tokens < 0 || p->spec_tokens > TL_MAX_SPEC)
        return tl_errf(err, errlen, TL_ERR_INVALID, "CUDA backend: spec_tokens = %d, must be 0..%d",
                       p->spec_tokens, TL_MAX_SPEC);
    if (p->spec_tokens > 0 && !p->random_weights && !(m && m->has_mtp))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "CUDA backend: speculative decoding asked for, but the checkpoint has no "
                       "MTP head (mtp.*)");
    if (p->random_weights && p->weight_bits != 4 && p->weight_bits != 16)
        return tl_errf(err, errlen, TL_ERR_INVALID, "random weights: bits must be 4 or 16, not %d",
                       p->weight_bits);
    return check_dims(c, err, errlen);
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : 0;
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Sizes, paths and switches (TL_CUDA_* environment, read here once). */
static void set_params(cuda_be *be, const tl_config *c, const tl_cuda_params *p) {
    be->cfg = *c;
    be->max_seqs = p->max_seqs;
    /* 0: chosen with the KV pool (alloc_state); until then the most it can be */
    be->max_ctx = p->max_ctx > 0 ? p->max_ctx : c->max_pos;
    be->pf_ok = c->n_embd == TL_N_EMBD && c->n_head == TL_N_HEAD && c->n_head_kv == TL_N_HEAD_KV &&
                c->gdn_n_k_head == TL_GDN_N_K_HEAD && c->gdn_n_v_head == TL_GDN_N_V_HEAD &&
                c->n_expert == TL_N_EXPERT && c->n_expert_used == TL_N_EXPERT_USED &&
                c->n_ff_expert == TL_N_FF_EXPERT && !env_int("TL_CUDA_NO_PREFILL_GEMM");
    be->max_tok = be->pf_ok ? 8192 : 512; /* 8192: measured (BENCHMARKS.md session 8) */
    if (getenv("TL_CUDA_MAX_TOK")) be->max_tok = TL_MAX(16, env_int("TL_CUDA_MAX_TOK"));
    be->max_out = p->max_seqs;
    be->part_rows = TL_MAX(p->max_seqs * CB_DECODE_SPLIT, 2048);
    be->conv_dim = tl_config_gdn_conv_dim(c);
    be->val_dim = tl_config_gdn_val_dim(c);
    be->ld_gdn_in = round_up(be->conv_dim + be->val_dim + 2 * c->gdn_n_v_head, 128);
    be->ld_attn_in = round_up(c->n_head * 512 + 2 * c->n_head_kv * 256, 128);
    be->n_valid = TL_MIN(c->n_vocab, TL_N_VOCAB_TOKENS);
    be->graphs_off = env_int("TL_CUDA_NO_GRAPH") || tl_cuda_sync_each();
    be->pdl_off = env_int("TL_CUDA_NO_PDL") != 0;
    be->st_bf16 = p->state_bf16 != 0 || env_int("TL_CUDA_STATE_BF16") != 0;
    be->st_esz = be->st_bf16 ? 2 : 4;
    be->router_min = getenv("TL_CUDA_ROUTER_GEMM_MIN")
                         ? TL_MAX(0, env_int("TL_CUDA_ROUTER_GEMM_MIN"))
                         : CB_ROUTER_GEMM_MIN;
    be->tc_min = getenv("TL_CUDA_TC_MIN") ? TL_MAX(0, env_int("TL_CUDA_TC_MIN")) : CB_TC_MIN;
    be->sh_max =
        getenv("TL_MOE_SHARED_GROUPED") ? TL_MAX(0, env_int("TL_MOE_SHARED_GROUPED")) : be->max_tok;
    be->attn.cuda_core = env_int("TL_CUDA_ATTN_NO_TC") != 0;
    /* gpu.h tl_gpu_stream.pdl: 0 none, 1 PDL, 2 PDL with the early triggers (pdl_enter) */
    be->tc_pdl = getenv("TL_CUDA_TC_PDL") ? TL_MIN(TL_MAX(env_int("TL_CUDA_TC_PDL"), 0), 2) : 2;
    be->pf_pdl = getenv("TL_CUDA_PF_PDL") ? TL_MIN(TL_MAX(env_int("TL_CUDA_PF_PDL"), 0), 2) : 1;
    be->gdn_cols = getenv("TL_GDN_COLS") && env_int("TL_GDN_COLS") == 1;
    be->mix = be->pf_ok && be->tc_min > 0 && be->tc_min <= CB_PF_MIN && !env_int("TL_CUDA_NO_MIX");
    be->attn.min_chunk = TL_MAX(0, env_int("TL_CUDA_ATTN_MIN_CHUNK"));
    int ia = 0, ig = 0;
    for (int il = 0; il < c->n_layer; il++) {
        be->L[il].kind = c->layer_kind[il];
        be->L[il].st_idx = c->layer_kind[il] == TL_LAYER_ATTN ? ia++ : ig++;
    }
    be->n_attn = ia, be->n_gdn = ig;
    be->n_kv_layers = ia + (p->spec_tokens > 0); /* the MTP head's KV: layer n_attn */
}

#define ALLOC(ptr, type, count)                                                                    \
    do {                                                                                           \
        size_t n_ = (size_t)(count) * sizeof(type);                                                \
        if (!((ptr) = (type *)tl_gpu_malloc(n_))) {                                                \
            return tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMalloc of %zu bytes failed (%s)", n_,   \
                           #ptr);                                                                  \
        }                                                                                          \
    } while (0)

#define PINNED(ptr, bytes)                                                                         \
    do {                                                                                           \
        if (cudaMallocHost(&(ptr), (bytes)) != cudaSuccess)                                        \
            return tl_errf(err, errlen, TL_ERR_NOMEM, "cudaMallocHost of %zu bytes failed (%s)",   \
                           (size_t)(bytes), #ptr);                                                 \
    } while (0)
#define ZERO(ptr, bytes)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = cudaMemset((ptr), 0, (bytes));                                            \
        if (e_ != cudaSuccess)                                                                     \
            return tl_errf(err, errlen, TL_ERR_CUDA, "cudaMemset of %s: %s", #ptr,                 \
                           cudaGetErrorString(e_));                                                \
    } while (0)

/* Bytes of one KV page: K and V of every attention layer (and the MTP head's), bf16. */
static size_t kv_page_bytes(const cuda_be *be) {
    return (size_t)2 * be->n_kv_layers * TL_KV_PAGE * be->cfg.n_head_kv * 256 * sizeof(uint16_t);
}

/* The pages the GPU's memory allows: the process may hold `util` of the device's memory once the
 * pool is allocated; what is in use now (weights, activations, state, the page table still to
 * come, and anything of other processes) is taken off first. */
static int kv_pages_from_memory(const cuda_be *be, double util, long long *out, char *err,
                                size_t errlen) {
    size_t free_b = 0, total_b = 0, page = kv_page_bytes(be);
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "cudaMemGetInfo: %s", cudaGetErrorString(e));
    double ptab = (double)be->max_seqs * TL_CEIL_DIV(be->max_ctx, TL_KV_PAGE) * sizeof(int32_t);
    double used = (double)(total_b - free_b), budget = util * (double)total_b - used - ptab;
    *out = budget > 0 ? (long long)(budget / (double)page) : 0;
    if (*out < 1)
        return tl_errf(err, errlen, TL_ERR_NOMEM,
                       "GPU memory: %.1f of %.1f GiB in use after the weights, activations and "
                       "state; --gpu-memory-utilization %.2f leaves no room for a KV page of "
                       "%.1f MiB (raise it, lower --max-seqs, or set --kv-tokens)",
                       used / 1073741824.0, total_b / 1073741824.0, util, page / 1048576.0);
    return 0;
}

/* The pool's pages (kv_tokens, or what the memory allows; at most every slot full) and, when
 * not given, the context: the model's maximum if the pool holds one such sequence, else the
 * pool's size. An explicit context the memory-sized pool cannot hold is an error. */
static int size_pool(cuda_be *be, const tl_cuda_params *p, char *err, size_t errlen) {
    double util = p->gpu_memory_utilization > 0 ? p->gpu_memory_utilization : 0.9;
    long long full = (long long)be->max_seqs * TL_CEIL_DIV(be->max_ctx, TL_KV_PAGE), n = full;
    if (p->kv_tokens > 0)
        n = TL_CEIL_DIV((long long)p->kv_tokens, TL_KV_PAGE);
    else if (kv_page_bytes(be) > 0)
        TRY(kv_pages_from_memory(be, util, &n, err, errlen));
    n = TL_MIN(n, full);
    const char *why = "given";
    if (p->max_ctx == 0) {
        be->max_ctx = (int)TL_MIN((long long)be->cfg.max_pos, n * TL_KV_PAGE);
        why = be->max_ctx == be->cfg.max_pos ? "the model's maximum" : "the KV pool's size";
    } else if (p->kv_tokens == 0 && n * TL_KV_PAGE < be->max_ctx) {
        return tl_errf(err, errlen, TL_ERR_NOMEM,
                       "a context of %d tokens does not fit in the KV pool of %lld tokens that "
                       "--gpu-memory-utilization %.2f allows: lower --ctx or --max-seqs, raise "
                       "the fraction, or set --kv-tokens",
                       be->max_ctx, n * TL_KV_PAGE, util);
    }
    be->max_pages = TL_CEIL_DIV(be->max_ctx, TL_KV_PAGE);
    be->n_page = (int)TL_MIN(n, (long long)be->max_seqs * be->max_pages);
    if (p->max_ctx == 0 || n < full) /* chosen here, not by the caller: say what */
        fprintf(stderr,
                "tulip: KV cache %d pages of %d tokens (%lld tokens, %.2f GiB%s); context %d "
                "tokens (%s)\n",
                be->n_page, TL_KV_PAGE, (long long)be->n_page * TL_KV_PAGE,
                (double)be->n_page * kv_page_bytes(be) / 1073741824.0,
                p->kv_tokens > 0 ? ", --kv-tokens" : ", from the GPU's free memory", be->max_ctx,
                why);
    return 0;
}

/* Conv and recurrent state, then the paged KV pool (size_pool) and its page tables, all zeroed
 * but the pool (a page is read only below its slot's length, which is written first). */
static int alloc_state(cuda_be *be, const tl_cuda_params *p, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    size_t conv = (size_t)be->n_gdn * be->max_seqs * 3 * be->conv_dim;
    size_t rec = (size_t)be->n_gdn * be->max_seqs * c->gdn_n_v_head * 128 * 128;
    ALLOC(be->conv_st, float, conv > 0 ? conv : 1);
    ALLOC(be->rec_st, char, rec > 0 ? rec * be->st_esz : 1);
    ZERO(be->conv_st, conv * 4);
    ZERO(be->rec_st, rec * be->st_esz);
    TRY(cb_pc_alloc_storage(be, p, err, errlen)); /* before the pool takes what is left */
    TRY(size_pool(be, p, err, errlen));
    size_t kv = (size_t)be->n_kv_layers * be->n_page * TL_KV_PAGE * c->n_head_kv * 256;
    ALLOC(be->kc, uint16_t, kv > 0 ? kv : 1);
    ALLOC(be->vc, uint16_t, kv > 0 ? kv : 1);
    size_t nt = (size_t)be->max_seqs * be->max_pages;
    ALLOC(be->d_ptab, int32_t, nt);
    PINNED(be->h_ptab, nt * sizeof(int32_t));
    TRY(tl_kv_pages_init(&be->pages, be->n_page, be->max_seqs, be->max_pages, TL_KV_PAGE,
                         be->h_ptab, err, errlen));
    ZERO(be->d_ptab, nt * sizeof(int32_t));
    return cb_pc_alloc_meta(be, err, errlen);
}

/* The bf16 buffers and workspaces of the prefill GEMM path. */
static int alloc_prefill(cuda_be *be, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    size_t T = be->max_tok, D = c->n_embd, K = c->n_expert_used, F = c->n_ff_expert;
    size_t yd = TL_MAX(be->val_dim, c->n_head * 256);
    ALLOC(be->xb, uint16_t, T * D);
    ALLOC(be->xlo, uint16_t, T * D);
    ALLOC(be->yb, uint16_t, T * yd);
    /* + the shared expert's rows where it runs inside the grouped GEMMs (moe_prefill: micro-
     * batches of <= be->sh_max tokens) */
    const size_t moe_rows = (size_t)T * K + TL_MIN(T, (size_t)be->sh_max);
    ALLOC(be->hexp, uint16_t, moe_rows * F);
    ALLOC(be->yslot, uint16_t, moe_rows * D);
    ALLOC(be->hs, uint16_t, T * F);
    ALLOC(be->ys, uint16_t, T * D);
    ALLOC(be->gg, float, T * c->gdn_n_v_head);
    ALLOC(be->gbeta, float, T * c->gdn_n_v_head);
    ALLOC(be->shl, float, T);
    ALLOC(be->plan, int32_t, tl_gpu_moe_pf_plan_ints((int)T));
    ALLOC(be->gdn_ws, char, tl_gpu_gdn_chunk_ws_bytes());
    if (be->n_gdn > 0)
        ALLOC(be->cv_edge, float, tl_gpu_gemm_conv1d_edge_floats((int)T, be->conv_dim));
    /* split-K partials (k_gemm.cu): the most any dense 4-bit product of a decode batch needs */
    size_t ws = 0;
    tl_gpu_gemm_w gus = be->L[0].gate_up, dns = be->L[0].down;
    gus.rows = 2 * (int)F, dns.rows = (int)D;
    const tl_gpu_gemm_w *m[2] = {&gus, &dns};
    for (int i = 0; i < 2; i++) ws = TL_MAX(ws, tl_gpu_gemm_ws_bytes(m[i], (int)T));
    for (int il = 0; il < c->n_layer; il++) {
        ws = TL_MAX(ws, tl_gpu_gemm_ws_bytes(&be->L[il].in, (int)T));
        ws = TL_MAX(ws, tl_gpu_gemm_ws_bytes(&be->L[il].out, (int)T));
    }
    if (ws) ALLOC(be->gemm_ws, float, ws / sizeof(float));
    be->gemm_ws_bytes = ws;
    return 0;
}

/* Activations for max_tok tokens, step metadata, sampling buffers. */
static int alloc_activations(cuda_be *be, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    size_t T = be->max_tok, D = c->n_embd, K = c->n_expert_used, F = c->n_ff_expert;
    size_t ldp = TL_MAX(be->ld_gdn_in, be->ld_attn_in), V = c->n_vocab, O = be->max_out;
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
    ALLOC(be->xo, float, O *D);
    ALLOC(be->logits, float, O *V);
    if (be->pf_ok) TRY(alloc_prefill(be, err, errlen));
    be->meta_ints = 4 * (size_t)be->max_tok + 5 * (size_t)be->max_seqs;
    ALLOC(be->d_meta, int32_t, be->meta_ints);
    ALLOC(be->d_params, tl_sample_params, O);
    ALLOC(be->d_keys, uint64_t, O);
    ALLOC(be->d_out, tl_sample_out, O);
    ALLOC(be->d_counts, int32_t, (size_t)be->max_seqs * V);
    ZERO(be->d_counts, (size_t)be->max_seqs * V * sizeof(int32_t));
    ALLOC(be->d_cbits, uint32_t, (size_t)be->max_seqs * TL_GPU_COUNT_WORDS(V));
    ZERO(be->d_cbits, (size_t)be->max_seqs * TL_GPU_COUNT_WORDS(V) * sizeof(uint32_t));
    ALLOC(be->d_nprompt, int32_t, be->max_seqs);
    ALLOC(be->d_rowslot, int32_t, O);
    ALLOC(be->d_sscratch, float, O * 2 * V);
    PINNED(be->h_meta, be->meta_ints * 4);
    PINNED(be->h_params, O * sizeof(tl_sample_params));
    PINNED(be->h_keys, O * sizeof(uint64_t));
    PINNED(be->h_out, O * sizeof(tl_sample_out));
    PINNED(be->h_nprompt, (size_t)be->max_seqs * sizeof(int32_t));
    PINNED(be->h_rowslot, O * sizeof(int32_t));
    be->allow_words = (V + 31) / 32;
    ALLOC(be->d_bias_ids, int32_t, O * TL_MAX_LOGIT_BIAS);
    ALLOC(be->d_bias_vals, float, O *TL_MAX_LOGIT_BIAS);
    ALLOC(be->d_allow, uint32_t, O * be->allow_words);
    ALLOC(be->d_rlogits, float, O *V);
    PINNED(be->h_bias_ids, O * TL_MAX_LOGIT_BIAS * sizeof(int32_t));
    PINNED(be->h_bias_vals, O * TL_MAX_LOGIT_BIAS * sizeof(float));
    PINNED(be->h_allow, O * be->allow_words * sizeof(uint32_t));
    return 0;
}

static int create_stream(cuda_be *be, char *err, size_t errlen) {
    cudaError_t e = cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&be->meta_ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(be->meta_ev, be->stream);
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "CUDA stream/event creation failed: %s",
                       cudaGetErrorString(e));
    return 0;
}

static int open_phases(cuda_be *be, const tl_model *m, const tl_cuda_params *p, char *err,
                       size_t errlen) {
    TRY(create_stream(be, err, errlen));
    TRY(cb_weights_load(be, m, p, err, errlen));
    TRY(alloc_activations(be, err, errlen)); /* before the state: the KV pool takes what is left */
    if (be->sp) TRY(cb_spec_alloc(be, err, errlen));
    TRY(alloc_state(be, p, err, errlen));
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "CUDA backend init: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" int tl_backend_cuda_open(tl_backend **out, const tl_model *m, const tl_config *cfg,
                                    const tl_cuda_params *p, char *err, size_t errlen) {
    *out = NULL;
    const tl_config *c = m ? &m->cfg : cfg;
    TRY(check_params(c, m, p, err, errlen));
    TRY(tl_gpu_init(p->device, err, errlen));
    tl_backend *b = (tl_backend *)xcalloc(1, sizeof *b);
    cuda_be *be = (cuda_be *)xcalloc(1, sizeof *be);
    be->device = p->device;
    b->name = "cuda";
    b->can_sample = 1;
    b->impl = be;
    b->close = cb_close;
    b->reset_slot = cb_reset_slot;
    b->kv_stats = cb_kv_stats;
    b->forward = cb_forward;
    set_params(be, c, p);
    int st = open_phases(be, m, p, err, errlen);
    if (st) {
        cb_close(b);
        return st;
    }
    b->max_ctx = be->max_ctx; /* chosen in alloc_state when p->max_ctx is 0 */
    cb_pc_attach(be, b);
    cb_spec_attach(be, b);
    *out = b;
    return 0;
}
