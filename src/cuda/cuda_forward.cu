/* The schedule of one batched step on the GPU: the entries' tokens are packed into micro-batches
 * of at most max_tok tokens (a long prefill chunk spans several, in order), each runs through the
 * 40 layers, the last token of every finished entry goes through the final norm and the LM head,
 * and the device sampler picks the next tokens. Pure decode micro-batches (one token per
 * sequence) replay a CUDA graph captured once per batch size.
 *
 * Per layer (decode, B tokens): GDN layer = in-proj GEMV (RMSNorm fused; for q4 decode the conv1d
 * too, else a conv1d kernel) -> GDN step
 * (gates, L2 norms, delta rule, gated norm) -> out-proj GEMV (+residual); attention layer =
 * in-proj GEMV -> q/k norm + RoPE + KV write -> split-KV attention -> combine*gate -> o-proj
 * GEMV (+residual); MoE = router GEMV (norm fused) -> top-k -> experts gate/up (norm fused) ->
 * experts down + weighted combine + shared expert (+residual). */
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/util.h"
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int st_ = (x);                                                                             \
        if (st_) return st_;                                                                       \
    } while (0)

typedef struct mb_seg {
    int entry, start, n;
} mb_seg;

/* Views of the metadata block (device or host base). */
typedef struct meta_view {
    int32_t *tokens, *tok_pos, *tok_slot, *tok_seg, *seg_tok0, *seg_n, *seg_slot, *seg_pos0,
        *out_rows;
} meta_view;

static meta_view meta_at(const cuda_be *be, int32_t *base) {
    meta_view v;
    int T = be->max_tok, S = be->max_seqs;
    v.tokens = base, v.tok_pos = base + T, v.tok_slot = base + 2 * T, v.tok_seg = base + 3 * T;
    v.seg_tok0 = base + 4 * T, v.seg_n = v.seg_tok0 + S, v.seg_slot = v.seg_n + S;
    v.seg_pos0 = v.seg_slot + S, v.out_rows = v.seg_pos0 + S;
    return v;
}

/* All launches of one micro-batch (graph-capturable: no host sync, no allocation). */
static int run_layers_impl(cuda_be *be, int T, int n_seg, int n_out, int out_row0, int n_split) {
    const tl_config *c = &be->cfg;
    meta_view d = meta_at(be, be->d_meta);
    tl_gpu_seqs s;
    s.tok_pos = d.tok_pos, s.tok_slot = d.tok_slot, s.tok_seg = d.tok_seg;
    s.seg_tok0 = d.seg_tok0, s.seg_n = d.seg_n, s.seg_slot = d.seg_slot, s.seg_pos0 = d.seg_pos0;
    s.n_tok = T, s.n_seg = n_seg;
    int D = c->n_embd, nv = c->gdn_n_v_head, K = c->n_expert_used, E = c->n_expert;
    float eps = c->rms_eps;
    size_t kv_layer = (size_t)be->n_page * TL_KV_PAGE * c->n_head_kv * 256;
    size_t conv_layer = (size_t)be->max_seqs * 3 * be->conv_dim;
    size_t rec_layer = (size_t)be->max_seqs * nv * 128 * 128;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};

    TRY(tl_gpu_embed(be->x, &be->embd, d.tokens, T));
    for (int il = 0; il < c->n_layer; il++) {
        const cb_layer *L = &be->L[il];
        if (L->kind == TL_LAYER_GDN) {
            int ld = be->ld_gdn_in;
            float *cst = be->conv_st + L->st_idx * conv_layer;
            if (L->in.bits == 4 && n_seg == T) { /* one token per sequence: conv in the epilogue */
                TRY(tl_gpu_gemv_conv1d(be->proj, ld, &L->in, be->x, D, L->attn_norm, eps, T,
                                       be->conv_out, cst, L->conv_w, be->conv_dim, d.tok_slot));
            } else {
                TRY(tl_gpu_gemv(be->proj, ld, &L->in, be->x, D, L->attn_norm, eps, T, 0));
                TRY(tl_gpu_conv1d(be->conv_out, cst, be->proj, ld, L->conv_w, be->conv_dim, &s));
            }
            int z_off = be->conv_dim, b_off = z_off + be->val_dim, a_off = b_off + nv;
            TRY(tl_gpu_gdn(be->y, be->rec_st + L->st_idx * rec_layer, be->conv_out, be->proj, ld,
                           z_off, b_off, a_off, L->dt_bias, L->a_neg, L->gdn_norm, c->gdn_n_k_head,
                           nv, eps, &s));
            TRY(tl_gpu_gemv(be->x, D, &L->out, be->y, be->val_dim, NULL, 0.0f, T, 1));
        } else {
            int ld = be->ld_attn_in;
            uint16_t *kc = be->kc + L->st_idx * kv_layer, *vc = be->vc + L->st_idx * kv_layer;
            TRY(tl_gpu_gemv(be->proj, ld, &L->in, be->x, D, L->attn_norm, eps, T, 0));
            TRY(tl_gpu_qk_rope_kv(be->q, kc, vc, be->proj, ld, L->q_norm, L->k_norm, c->n_head,
                                  c->n_head_kv, &pg, c->rope_theta, eps, &s));
            TRY(tl_gpu_attn(be->y, be->part, be->q, kc, vc, be->proj, ld, c->n_head, c->n_head_kv,
                            &pg, n_split, &s));
            TRY(tl_gpu_gemv(be->x, D, &L->out, be->y, c->n_head * 256, NULL, 0.0f, T, 1));
        }
        TRY(tl_gpu_gemv(be->rlog, E + 1, &L->router, be->x, D, L->ffn_norm, eps, T, 0));
        if (L->gate_up.bits == 4) {
            TRY(tl_gpu_moe_up_route(be->act, be->ids, be->wts, be->wsh, &L->gate_up, be->x,
                                    L->ffn_norm, eps, be->rlog, E + 1, K, E, T));
        } else {
            TRY(tl_gpu_moe_route(be->ids, be->wts, be->wsh, NULL, be->rlog, E + 1, E, K, T));
            TRY(tl_gpu_moe_up(be->act, &L->gate_up, be->x, L->ffn_norm, eps, be->ids, K, E, T));
        }
        TRY(tl_gpu_moe_down(be->x, &L->down, be->act, be->ids, be->wts, be->wsh, K, E, T));
    }
    if (n_out > 0) {
        TRY(tl_gpu_rmsnorm(be->xo, be->x, be->out_norm, d.out_rows, n_out, D, eps));
        TRY(tl_gpu_gemv(be->logits + (size_t)out_row0 * c->n_vocab, c->n_vocab, &be->lm_head,
                        be->xo, D, NULL, 0.0f, n_out, 0));
    }
    return 0;
}

/* run_layers_impl with the decode kernels launched under programmatic dependent launch
 * (cuda_common.cuh: each waits for its predecessor with griddepcontrol.wait, so its weight loads
 * and launch overlap the previous kernel's tail) unless TL_CUDA_NO_PDL=1. */
static int run_layers(cuda_be *be, int T, int n_seg, int n_out, int out_row0, int n_split) {
    tl_cuda_pdl = !be->pdl_off;
    int st = run_layers_impl(be, T, n_seg, n_out, out_row0, n_split);
    tl_cuda_pdl = 0;
    return st;
}

/* Expert e of a stacked expert matrix as a one-expert tl_gpu_gemm_w (rows_e rows). */
static tl_gpu_gemm_w expert_w(const tl_gpu_gemm_w *W, int e, int rows_e) {
    tl_gpu_gemm_w r = *W;
    size_t K = (size_t)W->cols;
    r.rows = rows_e;
    if (W->bits == 4) {
        r.w = (const char *)W->w + (size_t)e * rows_e * K / 2;
        r.sb = (const char *)W->sb + (size_t)e * rows_e * (K / 64) * 4;
    } else {
        r.w = (const char *)W->w + (size_t)e * rows_e * K * 2;
    }
    return r;
}

/* One prefill chunk of one sequence (T tokens at slot, pos0) on the tensor-core path: bf16
 * activations into the GEMMs of gpu_prefill.h (residual stream stays f32), chunked GDN, flash
 * attention, grouped MoE. Same math as run_layers; rounding differs (bf16 GEMM inputs). */
static int run_prefill(cuda_be *be, int T, int slot, int pos0, int n_out, int out_row0) {
    const tl_config *c = &be->cfg;
    meta_view d = meta_at(be, be->d_meta);
    tl_gpu_seqs s;
    s.tok_pos = d.tok_pos, s.tok_slot = d.tok_slot, s.tok_seg = d.tok_seg;
    s.seg_tok0 = d.seg_tok0, s.seg_n = d.seg_n, s.seg_slot = d.seg_slot, s.seg_pos0 = d.seg_pos0;
    s.n_tok = T, s.n_seg = 1;
    int D = c->n_embd, nv = c->gdn_n_v_head, nk = c->gdn_n_k_head, K = c->n_expert_used;
    int E = c->n_expert, F = c->n_ff_expert;
    float eps = c->rms_eps;
    void *st = (void *)be->stream;
    size_t kv_layer = (size_t)be->n_page * TL_KV_PAGE * c->n_head_kv * 256;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};
    size_t conv_layer = (size_t)be->max_seqs * 3 * be->conv_dim;
    size_t rec_layer = (size_t)be->max_seqs * nv * 128 * 128;

    TRY(tl_gpu_embed(be->x, &be->embd, d.tokens, T));
    for (int il = 0; il < c->n_layer; il++) {
        const cb_layer *L = &be->L[il];
        TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, L->attn_norm, T, D, eps));
        if (L->kind == TL_LAYER_GDN) {
            int ld = be->ld_gdn_in, z_off = be->conv_dim, b_off = z_off + be->val_dim,
                a_off = b_off + nv;
            TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, st));
            tl_cuda_prof_mark("gemm_in");
            TRY(tl_gpu_conv1d(be->conv_out, be->conv_st + L->st_idx * conv_layer, be->proj, ld,
                              L->conv_w, be->conv_dim, &s));
            TRY(tl_gpu_gdn_gates(be->gg, be->gbeta, be->proj + a_off, be->proj + b_off, ld,
                                 L->dt_bias, L->a_neg, T, st));
            float *S = be->rec_st + L->st_idx * rec_layer + (size_t)slot * nv * 128 * 128;
            TRY(tl_gpu_gdn_chunk(be->y, S, be->conv_out, be->conv_out + nk * 128,
                                 be->conv_out + 2 * nk * 128, be->conv_dim, be->gg, be->gbeta, T,
                                 TL_GDN_L2NORM | TL_GDN_OUT_F32 | TL_GDN_IN_F32, be->gdn_ws, st));
            tl_cuda_prof_mark("gdn_chunk");
            TRY(tl_gpu_gated_rmsnorm_bf16(be->yb, be->y, be->proj, ld, z_off, L->gdn_norm, nv, T,
                                          eps));
        } else {
            int ld = be->ld_attn_in;
            uint16_t *kc = be->kc + L->st_idx * kv_layer, *vc = be->vc + L->st_idx * kv_layer;
            TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, st));
            tl_cuda_prof_mark("gemm_in");
            TRY(tl_gpu_qk_rope_kv(NULL, kc, vc, be->proj, ld, L->q_norm, L->k_norm, c->n_head,
                                  c->n_head_kv, &pg, c->rope_theta, eps, &s));
            tl_gpu_kv_view kv;
            memset(&kv, 0, sizeof kv);
            kv.k = kc, kv.v = vc;
            kv.pages = be->d_ptab + (size_t)slot * be->max_pages, kv.page_tokens = TL_KV_PAGE;
            kv.tok_stride = c->n_head_kv * 256;
            kv.page_stride = (long long)TL_KV_PAGE * kv.tok_stride;
            tl_gpu_heads qh = {be->proj, ld, 512}, gh = {be->proj + 256, ld, 512};
            TRY(tl_gpu_attn_prefill(be->yb, &qh, &gh, &kv, T, pos0, TL_ATTN_IN_F32, st));
            tl_cuda_prof_mark("attn_prefill");
        }
        TRY(tl_gpu_gemm(be->x, be->yb, &L->out, T, be->x, TL_GEMM_OUT_F32 | TL_GEMM_ADD_RES, st));
        tl_cuda_prof_mark("gemm_out");
        /* MoE */
        TRY(tl_gpu_gemv(be->rlog, E + 1, &L->router, be->x, D, L->ffn_norm, eps, T, 0));
        TRY(tl_gpu_moe_route(be->ids, be->wts, be->wsh, be->shl, be->rlog, E + 1, E, K, T));
        TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, L->ffn_norm, T, D, eps));
        TRY(tl_gpu_moe_pf_plan(be->plan, be->ids, T, st));
        tl_gpu_gemm_w gu0 = expert_w(&L->gate_up, 0, 2 * F), dn0 = expert_w(&L->down, 0, D);
        TRY(tl_gpu_moe_pf_gate_up(be->hexp, be->xb, &gu0, be->plan, T, st));
        tl_cuda_prof_mark("moe_pf_gate_up");
        TRY(tl_gpu_moe_pf_down(be->yslot, be->hexp, &dn0, be->plan, T, st));
        tl_cuda_prof_mark("moe_pf_down");
        tl_gpu_gemm_w gus = expert_w(&L->gate_up, E, 2 * F), dns = expert_w(&L->down, E, D);
        TRY(tl_gpu_gemm(be->hs, be->xb, &gus, T, NULL, TL_GEMM_SWIGLU, st));
        TRY(tl_gpu_gemm(be->ys, be->hs, &dns, T, NULL, 0, st));
        tl_cuda_prof_mark("gemm_shared");
        TRY(tl_gpu_moe_pf_combine(be->x, be->x, be->yslot, be->wts, be->ys, be->shl, T,
                                  TL_GEMM_OUT_F32, st));
        tl_cuda_prof_mark("moe_pf_combine");
    }
    if (n_out > 0) {
        TRY(tl_gpu_rmsnorm(be->xo, be->x, be->out_norm, d.out_rows, n_out, D, eps));
        TRY(tl_gpu_gemv(be->logits + (size_t)out_row0 * c->n_vocab, c->n_vocab, &be->lm_head,
                        be->xo, D, NULL, 0.0f, n_out, 0));
    }
    return 0;
}

/* Runs one micro-batch: fills the metadata, uploads it, then replays a graph or launches. */
static int micro_step(cuda_be *be, const tl_fwd_entry *e, const mb_seg *segs, int n_seg,
                      const int *row_of, int *n_out_total, char *err, size_t errlen) {
    CUDA_TRY(cudaEventSynchronize(be->meta_ev)); /* the previous upload has read h_meta */
    meta_view h = meta_at(be, be->h_meta);
    int T = 0, n_out = 0, out_row0 = -1, all_single = 1, max_kv = 0;
    for (int i = 0; i < n_seg; i++) {
        const mb_seg *sg = &segs[i];
        const tl_fwd_entry *en = &e[sg->entry];
        h.seg_tok0[i] = T, h.seg_n[i] = sg->n, h.seg_slot[i] = en->slot;
        h.seg_pos0[i] = en->pos + sg->start;
        for (int j = 0; j < sg->n; j++, T++) {
            h.tokens[T] = en->tokens[sg->start + j];
            h.tok_pos[T] = en->pos + sg->start + j;
            h.tok_slot[T] = en->slot;
            h.tok_seg[T] = i;
        }
        max_kv = TL_MAX(max_kv, en->pos + sg->start + sg->n);
        if (sg->n != 1) all_single = 0;
        if (sg->start + sg->n == en->n_tok && row_of[sg->entry] >= 0) {
            if (out_row0 < 0) out_row0 = row_of[sg->entry];
            h.out_rows[n_out++] = T - 1;
        }
    }
    if (out_row0 < 0) out_row0 = 0;
    CUDA_TRY(cudaMemcpyAsync(be->d_meta, be->h_meta, be->meta_ints * 4, cudaMemcpyHostToDevice,
                             be->stream));
    CUDA_TRY(cudaEventRecord(be->meta_ev, be->stream));
    int decode = all_single && T <= be->max_seqs;
    int n_split = CB_DECODE_SPLIT;
    if (!decode) {
        n_split = TL_MAX(1, TL_MIN(CB_DECODE_SPLIT, be->part_rows / T));
        n_split = TL_MIN(n_split, TL_MAX(1, TL_CEIL_DIV(max_kv, 32)));
    }
    int use_graph = decode && T <= CB_MAX_GRAPH_B && n_out == T && out_row0 == 0 &&
                    !be->graphs_off && !cb_prof_active();
    if (be->pf_ok && n_seg == 1 && T >= CB_PF_MIN) {
        int st = run_prefill(be, T, h.seg_slot[0], h.seg_pos0[0], n_out, out_row0);
        if (st) return tl_errf(err, errlen, st, "CUDA prefill failed (see log)");
    } else if (use_graph) {
        if (!be->graph[T]) {
            cudaGraph_t g;
            CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
            tl_cuda_capturing = 1;
            int st = run_layers(be, T, n_seg, n_out, 0, n_split);
            tl_cuda_capturing = 0;
            cudaError_t ce = cudaStreamEndCapture(be->stream, &g);
            if (st || ce != cudaSuccess)
                return tl_errf(err, errlen, TL_ERR_CUDA, "graph capture failed (%s)",
                               st ? tl_status_str(st) : cudaGetErrorString(ce));
            ce = cudaGraphInstantiate(&be->graph[T], g, 0);
            cudaGraphDestroy(g);
            if (ce != cudaSuccess) {
                be->graph[T] = NULL;
                return tl_errf(err, errlen, TL_ERR_CUDA, "graph instantiate: %s",
                               cudaGetErrorString(ce));
            }
        }
        CUDA_TRY(cudaGraphLaunch(be->graph[T], be->stream));
    } else {
        int st = run_layers(be, T, n_seg, n_out, out_row0, n_split);
        if (st) return tl_errf(err, errlen, st, "CUDA forward failed (see log)");
    }
    *n_out_total += n_out;
    return 0;
}

static uint64_t rng_draw(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int has_penalty(const tl_sample_params *p) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           p->repetition_penalty != 1.0f;
}

/* Gives every entry's slot the KV pages for positions up to pos + n_tok (all or nothing: when
 * the pool has too few free pages nothing changes and the step fails with
 * TL_ERR_CONTEXT_FULL), and uploads the new page-table entries. h_ptab may be rewritten here:
 * every earlier upload from it finished at the previous forward's final synchronize. */
static int kv_reserve(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    if (be->n_attn == 0) return 0;
    long need = 0;
    for (int i = 0; i < n; i++) {
        int want = TL_CEIL_DIV(e[i].pos + e[i].n_tok, TL_KV_PAGE) - be->slot_np[e[i].slot];
        if (want > 0) need += want;
    }
    if (need > be->n_free)
        return tl_errf(
            err, errlen, TL_ERR_CONTEXT_FULL,
            "KV cache full: the step needs %ld more pages of %d tokens, %d of %d are free", need,
            TL_KV_PAGE, be->n_free, be->n_page);
    for (int i = 0; i < n; i++) {
        int slot = e[i].slot, have = be->slot_np[slot];
        int want = TL_CEIL_DIV(e[i].pos + e[i].n_tok, TL_KV_PAGE);
        if (want <= have) continue;
        int32_t *row = be->h_ptab + (size_t)slot * be->max_pages;
        for (int j = have; j < want; j++) row[j] = be->free_pg[--be->n_free];
        be->slot_np[slot] = want;
        CUDA_TRY(cudaMemcpyAsync(be->d_ptab + (size_t)slot * be->max_pages + have, row + have,
                                 (size_t)(want - have) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 be->stream));
    }
    return 0;
}

static int forward_impl(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    const tl_config *c = &be->cfg;
    if (n > be->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch of %d entries, backend has %d slots", n,
                       be->max_seqs);
    int row_of[1024], n_rows = 0;
    if (n > 1024) return tl_errf(err, errlen, TL_ERR_INVALID, "batch too large");
    for (int i = 0; i < n; i++) {
        const tl_fwd_entry *en = &e[i];
        if (en->slot < 0 || en->slot >= be->max_seqs || en->pos < 0 || en->n_tok < 1)
            return tl_errf(err, errlen, TL_ERR_INVALID, "entry %d: bad slot %d / pos %d / n_tok %d",
                           i, en->slot, en->pos, en->n_tok);
        if ((long)en->pos + en->n_tok > be->max_ctx)
            return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                           "entry %d: %d + %d tokens exceed the context of %d", i, en->pos,
                           en->n_tok, be->max_ctx);
        for (int j = 0; j < en->n_tok; j++)
            if (en->tokens[j] < 0 || en->tokens[j] >= c->n_vocab)
                return tl_errf(err, errlen, TL_ERR_INVALID,
                               "entry %d: token id %d out of range [0, %d)", i, en->tokens[j],
                               c->n_vocab);
        row_of[i] = (en->logits || en->sample) ? n_rows++ : -1;
    }
    tl_cuda_stream = be->stream;
    TRY(kv_reserve(be, e, n, err, errlen));
    tl_cuda_prof_mark("start");

    /* micro-batches: on the GEMM path (pf_ok) a long chunk of one sequence runs alone; short
     * ones (decode tokens) are batched together. Different sequences are independent, so the
     * order between them does not matter. */
    mb_seg segs[1024];
    int n_seg = 0, T = 0, n_out = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            int big = be->pf_ok && e[i].n_tok >= CB_PF_MIN;
            if (big != pass) continue;
            if (big && n_seg > 0) {
                TRY(micro_step(be, e, segs, n_seg, row_of, &n_out, err, errlen));
                n_seg = 0, T = 0;
            }
            int off = 0;
            while (off < e[i].n_tok) {
                int take = TL_MIN(e[i].n_tok - off, be->max_tok - T);
                segs[n_seg].entry = i, segs[n_seg].start = off, segs[n_seg].n = take;
                n_seg++, T += take, off += take;
                if (T == be->max_tok || n_seg == be->max_seqs || big) {
                    TRY(micro_step(be, e, segs, n_seg, row_of, &n_out, err, errlen));
                    n_seg = 0, T = 0;
                }
            }
        }
    if (n_seg > 0) TRY(micro_step(be, e, segs, n_seg, row_of, &n_out, err, errlen));

    /* sampling */
    if (n_rows > 0) {
        int V = c->n_vocab, any_pen = 0, any_sample = 0;
        for (int i = 0; i < n; i++) {
            int r = row_of[i];
            if (r < 0) continue;
            tl_sample_params *p = &be->h_params[r];
            if (e[i].sample) {
                *p = *e[i].sample;
                if (p->n_logprobs > TL_MAX_LOGPROBS) p->n_logprobs = TL_MAX_LOGPROBS;
                if (p->n_logprobs < 0) p->n_logprobs = 0;
                be->h_keys[r] = e[i].rng ? rng_draw(e[i].rng) : 0;
                any_sample = 1;
                if (has_penalty(p)) any_pen = 1;
            } else {
                memset(p, 0, sizeof *p);
                p->top_p = 1.0f, p->repetition_penalty = 1.0f;
                be->h_keys[r] = 0;
            }
        }
        if (any_sample) {
            CUDA_TRY(cudaMemcpyAsync(be->d_params, be->h_params, n_rows * sizeof(tl_sample_params),
                                     cudaMemcpyHostToDevice, be->stream));
            CUDA_TRY(cudaMemcpyAsync(be->d_keys, be->h_keys, n_rows * sizeof(uint64_t),
                                     cudaMemcpyHostToDevice, be->stream));
            if (any_pen) {
                size_t hoff = 0;
                for (int i = 0; i < n; i++) {
                    int r = row_of[i];
                    if (r < 0) continue;
                    int use = e[i].sample && has_penalty(&be->h_params[r]) && e[i].history;
                    int nh = use ? TL_MIN(e[i].n_history, be->max_ctx) : 0;
                    if (nh > 0)
                        CUDA_TRY(cudaMemcpyAsync(be->d_hist + hoff, e[i].history, nh * 4,
                                                 cudaMemcpyHostToDevice, be->stream));
                    TRY(tl_gpu_penalty_counts(be->d_counts + (size_t)r * V, be->d_hist + hoff, nh,
                                              e[i].n_prompt, V));
                    hoff += nh;
                }
            }
            TRY(tl_gpu_sample(be->d_out, be->logits, V, be->n_valid, be->d_params, be->d_keys,
                              any_pen ? be->d_counts : NULL, be->d_sscratch, n_rows));
            CUDA_TRY(cudaMemcpyAsync(be->h_out, be->d_out, n_rows * sizeof(tl_sample_out),
                                     cudaMemcpyDeviceToHost, be->stream));
        }
        for (int i = 0; i < n; i++)
            if (e[i].logits && row_of[i] >= 0)
                CUDA_TRY(cudaMemcpyAsync(e[i].logits, be->logits + (size_t)row_of[i] * V,
                                         sizeof(float) * V, cudaMemcpyDeviceToHost, be->stream));
        CUDA_TRY(cudaStreamSynchronize(be->stream));
        for (int i = 0; i < n; i++)
            if (e[i].sample && e[i].out && row_of[i] >= 0) *e[i].out = be->h_out[row_of[i]];
    }
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    CUDA_TRY(cudaGetLastError());
    (void)n_out;
    return 0;
}

int cb_forward(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (err && errlen) err[0] = 0;
    if (be->lost)
        return tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the GPU was lost after an earlier error");
    int st = forward_impl(be, e, n, err, errlen);
    if (st == TL_ERR_CUDA) {
        be->lost = 1;
        if (err && errlen && !err[0])
            tl_errf(err, errlen, st, "CUDA error during the forward (see log)");
    }
    return st;
}

/* ====== tulip bench --ops: each decode op of one token timed in place ======
 * After a decode step at the bench's context (the metadata of that step stays on the device),
 * every op of the decode schedule is captured R times back to back into a graph (launched as in
 * run_layers, PDL included) and the graph replayed; the best of 5 replays / R is the op's cost
 * inside a stream of launches: its own time plus the dependent-launch gap, at warm clocks
 * (unlike ncu's serialized, idle-between-kernels replays). Ops that update state (conv, GDN,
 * KV write, residual adds) repeat on their own outputs, which changes values, not the work. */
typedef int (*op_fn)(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s);

static int op_gdn_in(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv(be->proj, be->ld_gdn_in, &G->in, be->x, be->cfg.n_embd, G->attn_norm,
                       be->cfg.rms_eps, 1, 0);
}
static int op_gdn_in_conv(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv_conv1d(be->proj, be->ld_gdn_in, &G->in, be->x, be->cfg.n_embd, G->attn_norm,
                              be->cfg.rms_eps, 1, be->conv_out, be->conv_st, G->conv_w,
                              be->conv_dim, s->tok_slot);
}
static int op_conv(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_conv1d(be->conv_out, be->conv_st, be->proj, be->ld_gdn_in, G->conv_w,
                         be->conv_dim, s);
}
static int op_gdn(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    int nv = be->cfg.gdn_n_v_head, z_off = be->conv_dim, b_off = z_off + be->val_dim,
        a_off = b_off + nv;
    return tl_gpu_gdn(be->y, be->rec_st, be->conv_out, be->proj, be->ld_gdn_in, z_off, b_off, a_off,
                      G->dt_bias, G->a_neg, G->gdn_norm, be->cfg.gdn_n_k_head, nv, be->cfg.rms_eps,
                      s);
}
static int op_gdn_out(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv(be->x, be->cfg.n_embd, &G->out, be->y, be->val_dim, NULL, 0.0f, 1, 1);
}
static int op_attn_in(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv(be->proj, be->ld_attn_in, &A->in, be->x, be->cfg.n_embd, A->attn_norm,
                       be->cfg.rms_eps, 1, 0);
}
static int op_rope(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    const tl_config *c = &be->cfg;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};
    return tl_gpu_qk_rope_kv(be->q, be->kc, be->vc, be->proj, be->ld_attn_in, A->q_norm, A->k_norm,
                             c->n_head, c->n_head_kv, &pg, c->rope_theta, c->rms_eps, s);
}
static int op_attn(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    const tl_config *c = &be->cfg;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};
    return tl_gpu_attn(be->y, be->part, be->q, be->kc, be->vc, be->proj, be->ld_attn_in, c->n_head,
                       c->n_head_kv, &pg, CB_DECODE_SPLIT, s);
}
static int op_attn_out(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv(be->x, be->cfg.n_embd, &A->out, be->y, be->cfg.n_head * 256, NULL, 0.0f, 1,
                       1);
}
static int op_router(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    int E = be->cfg.n_expert;
    return tl_gpu_gemv(be->rlog, E + 1, &G->router, be->x, be->cfg.n_embd, G->ffn_norm,
                       be->cfg.rms_eps, 1, 0);
}
static int op_route(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    int E = be->cfg.n_expert;
    return tl_gpu_moe_route(be->ids, be->wts, be->wsh, NULL, be->rlog, E + 1, E,
                            be->cfg.n_expert_used, 1);
}
static int op_moe_up(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    const tl_config *c = &be->cfg;
    if (G->gate_up.bits == 4) /* the step routes inside moe_up */
        return tl_gpu_moe_up_route(be->act, be->ids, be->wts, be->wsh, &G->gate_up, be->x,
                                   G->ffn_norm, c->rms_eps, be->rlog, c->n_expert + 1,
                                   c->n_expert_used, c->n_expert, 1);
    return tl_gpu_moe_up(be->act, &G->gate_up, be->x, G->ffn_norm, c->rms_eps, be->ids,
                         c->n_expert_used, c->n_expert, 1);
}
static int op_moe_down(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    const tl_config *c = &be->cfg;
    return tl_gpu_moe_down(be->x, &G->down, be->act, be->ids, be->wts, be->wsh, c->n_expert_used,
                           c->n_expert, 1);
}
static int op_lm_head(cuda_be *be, const cb_layer *G, const cb_layer *A, const tl_gpu_seqs *s) {
    return tl_gpu_gemv(be->logits, be->cfg.n_vocab, &be->lm_head, be->xo, be->cfg.n_embd, NULL,
                       0.0f, 1, 0);
}

extern "C" int tl_cuda_bench_ops(tl_backend *b, void *file) {
    cuda_be *be = (cuda_be *)b->impl;
    FILE *f = (FILE *)file;
    const tl_config *c = &be->cfg;
    const cb_layer *G = NULL, *A = NULL;
    for (int il = 0; il < c->n_layer; il++) {
        if (!G && be->L[il].kind == TL_LAYER_GDN) G = &be->L[il];
        if (!A && be->L[il].kind == TL_LAYER_ATTN) A = &be->L[il];
    }
    if (!G || !A) return TL_ERR_INVALID;
    meta_view d = meta_at(be, be->d_meta);
    tl_gpu_seqs s;
    s.tok_pos = d.tok_pos, s.tok_slot = d.tok_slot, s.tok_seg = d.tok_seg;
    s.seg_tok0 = d.seg_tok0, s.seg_n = d.seg_n, s.seg_slot = d.seg_slot, s.seg_pos0 = d.seg_pos0;
    s.n_tok = 1, s.n_seg = 1;
    struct {
        const char *name;
        op_fn fn;
        int per_step;
        size_t bytes;
    } ops[] = {
        {"gdn in-proj gemv_q4 (+ conv1d fused)", op_gdn_in_conv, G->in.bits == 4 ? be->n_gdn : 0,
         tl_gpu_mat_bytes(&G->in)},
        {"gdn in-proj gemv", op_gdn_in, G->in.bits == 4 ? 0 : be->n_gdn, tl_gpu_mat_bytes(&G->in)},
        {"conv1d (unfused)", op_conv, G->in.bits == 4 ? 0 : be->n_gdn, 0},
        {"gdn_step", op_gdn, be->n_gdn, (size_t)c->gdn_n_v_head * 128 * 128 * 8},
        {"gdn out-proj gemv_q4", op_gdn_out, be->n_gdn, tl_gpu_mat_bytes(&G->out)},
        {"attn in-proj gemv_q4", op_attn_in, be->n_attn, tl_gpu_mat_bytes(&A->in)},
        {"qk_rope_kv", op_rope, be->n_attn, 0},
        {"attn split+combine", op_attn, be->n_attn, 0},
        {"attn o-proj gemv_q4", op_attn_out, be->n_attn, tl_gpu_mat_bytes(&A->out)},
        {"router gemv_bf16", op_router, c->n_layer, tl_gpu_mat_bytes(&G->router)},
        {"moe_route (bf16 experts only)", op_route, G->gate_up.bits == 4 ? 0 : c->n_layer, 0},
        {G->gate_up.bits == 4 ? "moe_up + route" : "moe_up", op_moe_up, c->n_layer,
         tl_gpu_mat_bytes(&G->gate_up) / (c->n_expert + 1) * (c->n_expert_used + 1)},
        {"moe_down", op_moe_down, c->n_layer,
         tl_gpu_mat_bytes(&G->down) / (c->n_expert + 1) * (c->n_expert_used + 1)},
        {"lm_head gemv_q4", op_lm_head, 1, tl_gpu_mat_bytes(&be->lm_head)},
    };
    const int R = 40;
    cudaEvent_t e0, e1;
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    tl_cuda_stream = be->stream;
    double total = 0;
    fprintf(f, "| op (one token) | per step | us per call | GB/s | us per step "
               "|\n|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!ops[i].per_step) continue; /* not in this model's step */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
        tl_cuda_capturing = 1, tl_cuda_pdl = !be->pdl_off;
        int st = 0;
        for (int r = 0; r < R && !st; r++) st = ops[i].fn(be, G, A, &s);
        tl_cuda_capturing = 0, tl_cuda_pdl = 0;
        CUDA_TRY(cudaStreamEndCapture(be->stream, &g));
        if (st) return st;
        CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
        cudaGraphDestroy(g);
        float best = 1e30f;
        for (int rep = 0; rep < 6; rep++) {
            CUDA_TRY(cudaEventRecord(e0, be->stream));
            CUDA_TRY(cudaGraphLaunch(ge, be->stream));
            CUDA_TRY(cudaEventRecord(e1, be->stream));
            CUDA_TRY(cudaEventSynchronize(e1));
            float ms;
            CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
            if (rep > 0 && ms < best) best = ms; /* rep 0 warms up */
        }
        cudaGraphExecDestroy(ge);
        double us = 1000.0 * best / R;
        total += us * ops[i].per_step;
        if (ops[i].bytes)
            fprintf(f, "| %s | %d | %.2f | %.0f | %.1f |\n", ops[i].name, ops[i].per_step, us,
                    ops[i].bytes / us / 1e3, us * ops[i].per_step);
        else
            fprintf(f, "| %s | %d | %.2f | | %.1f |\n", ops[i].name, ops[i].per_step, us,
                    us * ops[i].per_step);
    }
    fprintf(f, "| sum over one step | | | | %.1f |\n", total);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    CUDA_TRY(cudaGetLastError());
    return 0;
}
