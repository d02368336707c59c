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
#include "common/pool.h"
#include "common/util.h"
#include "engine/batch_plan.h"
}

/* The entries' prepare callbacks (tulip.h tl_batch_entry.prepare), in parallel over the CPU
 * worker pool: each touches only its own entry's parameters. */
typedef struct {
    const tl_fwd_entry *e;
    int idx[CB_MAX_SEQS];
} prep_job;

static void prep_one(void *ctx, int i) {
    const prep_job *j = (const prep_job *)ctx;
    j->e[j->idx[i]].prepare(j->e[j->idx[i]].prepare_ctx);
}

static void run_prepares(const tl_fwd_entry *e, int n) {
    prep_job j;
    int m = 0;
    j.e = e;
    for (int i = 0; i < n; i++)
        if (e[i].prepare) j.idx[m++] = i;
    if (m == 1) prep_one(&j, 0);
    if (m > 1) tl_pool_for(m, prep_one, &j);
}

/* Views of the metadata block (device or host base; batch_plan.h fills the host one). */
static tl_mb_meta meta_at(const cuda_be *be, int32_t *base) {
    tl_mb_meta v;
    int T = be->max_tok, S = be->max_seqs;
    v.tokens = base, v.tok_pos = base + T, v.tok_slot = base + 2 * T, v.tok_seg = base + 3 * T;
    v.seg_tok0 = base + 4 * T, v.seg_n = v.seg_tok0 + S, v.seg_slot = v.seg_n + S;
    v.seg_pos0 = v.seg_slot + S, v.out_rows = v.seg_pos0 + S;
    return v;
}

tl_mb_meta cb_meta_at(const cuda_be *be, int32_t *base) { return meta_at(be, base); }

static tl_gpu_seqs seqs_of(const tl_mb_meta *m, int n_tok, int n_seg) {
    const tl_mb_meta &d = *m;
    tl_gpu_seqs s;
    s.tok_pos = d.tok_pos, s.tok_slot = d.tok_slot, s.tok_seg = d.tok_seg;
    s.seg_tok0 = d.seg_tok0, s.seg_n = d.seg_n, s.seg_slot = d.seg_slot, s.seg_pos0 = d.seg_pos0;
    s.n_tok = n_tok, s.n_seg = n_seg;
    return s;
}

tl_gpu_seqs cb_seqs(const cuda_be *be, int n_tok, int n_seg) {
    tl_mb_meta d = meta_at(be, be->d_meta);
    return seqs_of(&d, n_tok, n_seg);
}

/* The final norm and the LM head over the n_out output rows (logits rows out_row0..). */
static int run_head(cuda_be *be, int n_out, int out_row0, const tl_gpu_stream *st) {
    const tl_config *c = &be->cfg;
    if (n_out <= 0) return 0;
    tl_mb_meta d = meta_at(be, be->d_meta);
    TRY(tl_gpu_rmsnorm(be->xo, be->x, be->out_norm, d.out_rows, n_out, c->n_embd, c->rms_eps, st));
    return tl_gpu_gemv(be->logits + (size_t)out_row0 * c->n_vocab, c->n_vocab, &be->lm_head, be->xo,
                       c->n_embd, NULL, 0.0f, n_out, 0, st);
}

/* The same on the tensor cores (the batched-decode path): the final norm, the rows as bf16, one
 * GEMM that reads the LM head once for all rows. GEMV where the head's shape does not suit the
 * GEMM (rows not the vocabulary or not a multiple of 128: test shapes). */
static int run_head_tc(cuda_be *be, int n_out, int out_row0, const tl_gpu_stream *st) {
    const tl_config *c = &be->cfg;
    if (n_out <= 0) return 0;
    if (be->lm_head.rows != c->n_vocab || c->n_vocab % 128)
        return run_head(be, n_out, out_row0, st);
    tl_mb_meta d = meta_at(be, be->d_meta);
    TRY(tl_gpu_rmsnorm(be->xo, be->x, be->out_norm, d.out_rows, n_out, c->n_embd, c->rms_eps, st));
    TRY(tl_gpu_cast_bf16(be->xb, be->xo, (long)n_out * c->n_embd, st));
    return tl_gpu_gemm(be->logits + (size_t)out_row0 * c->n_vocab, be->xb, &be->lm_head, n_out,
                       NULL, TL_GEMM_OUT_F32, st);
}

/* Per-layer pieces shared by both paths: the state of layer L and the column layout of the
 * fused in-projection. */
typedef struct layer_ctx {
    cuda_be *be;
    const cb_layer *L;
    const tl_gpu_seqs *s;
    const tl_gpu_stream *st;
    int T, z_off, b_off, a_off;
    float *conv_st;
    char *rec_st; /* this layer's recurrent state, be->st_esz bytes per element */
    uint16_t *kc, *vc;
    tl_gpu_kv_pages pg;
    /* a GDN layer's per-token state copies of speculative verifies (cuda_spec.cu); base NULL:
     * none */
    tl_gpu_ring cring, rring;
} layer_ctx;

static const tl_gpu_ring *ring_of(const tl_gpu_ring *r) { return r->base ? r : NULL; }

static layer_ctx layer_of(cuda_be *be, const cb_layer *L, int T, const tl_gpu_seqs *s,
                          const tl_gpu_stream *st) {
    const tl_config *c = &be->cfg;
    size_t kv_layer = (size_t)be->n_page * TL_KV_PAGE * c->n_head_kv * 256;
    size_t conv_layer = (size_t)be->max_seqs * 3 * be->conv_dim;
    size_t rec_layer = (size_t)be->max_seqs * c->gdn_n_v_head * 128 * 128;
    layer_ctx x;
    x.be = be, x.L = L, x.s = s, x.st = st, x.T = T;
    x.z_off = be->conv_dim, x.b_off = x.z_off + be->val_dim, x.a_off = x.b_off + c->gdn_n_v_head;
    x.conv_st = be->conv_st + L->st_idx * conv_layer;
    x.rec_st = be->rec_st + L->st_idx * rec_layer * be->st_esz;
    x.kc = be->kc + L->st_idx * kv_layer, x.vc = be->vc + L->st_idx * kv_layer;
    x.pg.table = be->d_ptab, x.pg.max_pages = be->max_pages;
    memset(&x.cring, 0, sizeof x.cring);
    memset(&x.rring, 0, sizeof x.rring);
    const cb_spec *sp = be->sp;
    if (sp && sp->conv_ring && L->kind == TL_LAYER_GDN) { /* cuda_spec.cu: the rings' layout */
        size_t n = (size_t)be->max_seqs * sp->K;
        x.cring.base = sp->conv_ring + L->st_idx * n * 3 * be->conv_dim;
        x.rring.base = sp->rec_ring + L->st_idx * n * c->gdn_n_v_head * 128 * 128 * be->st_esz;
        x.cring.pos0 = x.rring.pos0 = sp->d_rpos;
        x.cring.n = x.rring.n = sp->K;
    }
    return x;
}

static layer_ctx layer_at(cuda_be *be, int il, int T, const tl_gpu_seqs *s,
                          const tl_gpu_stream *st) {
    return layer_of(be, &be->L[il], T, s, st);
}

/* Decode GDN block: in-proj (norm fused; for q4 with one token per sequence the conv1d too),
 * GDN step, out-proj + residual. */
static int gdn_decode(const layer_ctx *x, const int32_t *tok_slot) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_gdn_in, D = c->n_embd, T = x->T;
    float eps = c->rms_eps;
    if (L->in.bits == 4 && x->s->n_seg == T) {
        TRY(tl_gpu_gemv_conv1d(be->proj, ld, &L->in, be->x, D, L->attn_norm, eps, T, be->conv_out,
                               x->conv_st, L->conv_w, be->conv_dim, tok_slot, x->st));
    } else {
        TRY(tl_gpu_gemv(be->proj, ld, &L->in, be->x, D, L->attn_norm, eps, T, 0, x->st));
        TRY(tl_gpu_conv1d(be->conv_out, x->conv_st, be->proj, ld, L->conv_w, be->conv_dim, x->s,
                          ring_of(&x->cring), x->st));
    }
    if (be->gdn_cols) { /* 4 blocks a head (all SMs at batch 1), then the gated norm */
        TRY(tl_gpu_gdn_raw(be->y, x->rec_st, be->st_bf16, be->conv_out, be->proj, ld, x->b_off,
                           x->a_off, L->dt_bias, L->a_neg, c->gdn_n_k_head, c->gdn_n_v_head, x->s,
                           ring_of(&x->rring), x->st));
        TRY(tl_gpu_gated_rmsnorm_f32(be->y, be->y, be->proj, ld, x->z_off, L->gdn_norm,
                                     c->gdn_n_v_head, T, eps, x->st));
    } else {
        TRY(tl_gpu_gdn(be->y, x->rec_st, be->st_bf16, be->conv_out, be->proj, ld, x->z_off,
                       x->b_off, x->a_off, L->dt_bias, L->a_neg, L->gdn_norm, c->gdn_n_k_head,
                       c->gdn_n_v_head, eps, x->s, ring_of(&x->rring), x->st));
    }
    return tl_gpu_gemv(be->x, D, &L->out, be->y, be->val_dim, NULL, 0.0f, T, 1, x->st);
}

/* Decode attention block: in-proj (norm fused), q/k norm + RoPE + KV write, split-KV attention
 * with the gate, o-proj + residual. */
static int attn_decode(const layer_ctx *x, int n_split) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_attn_in, D = c->n_embd, T = x->T;
    TRY(tl_gpu_gemv(be->proj, ld, &L->in, be->x, D, L->attn_norm, c->rms_eps, T, 0, x->st));
    TRY(tl_gpu_qk_rope_kv(be->q, x->kc, x->vc, be->proj, ld, L->q_norm, L->k_norm, c->n_head,
                          c->n_head_kv, &x->pg, c->rope_theta, c->rms_eps, x->s, x->st));
    TRY(tl_gpu_attn(be->y, be->part, be->q, x->kc, x->vc, be->proj, ld, c->n_head, c->n_head_kv,
                    &x->pg, n_split, x->s, &be->attn, x->st));
    return tl_gpu_gemv(be->x, D, &L->out, be->y, c->n_head * 256, NULL, 0.0f, T, 1, x->st);
}

/* Decode MoE block: router GEMV (norm fused), top-k (inside moe_up for q4 experts), experts
 * gate/up, down + weighted combine + shared expert + residual. */
static int moe_decode(const layer_ctx *x) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int D = c->n_embd, E = c->n_expert, K = c->n_expert_used, T = x->T;
    float eps = c->rms_eps;
    TRY(tl_gpu_gemv(be->rlog, E + 1, &L->router, be->x, D, L->ffn_norm, eps, T, 0, x->st));
    if (L->gate_up.bits == 4) {
        TRY(tl_gpu_moe_up_route(be->act, be->ids, be->wts, be->wsh, &L->gate_up, be->x, L->ffn_norm,
                                eps, be->rlog, E + 1, K, E, T, x->st));
        return tl_gpu_moe_down_after_route(be->x, &L->down, be->act, be->ids, be->rlog, E + 1,
                                           be->wts, be->wsh, K, E, T, x->st);
    } else {
        TRY(tl_gpu_moe_route(be->ids, be->wts, be->wsh, NULL, be->rlog, E + 1, E, K, T, x->st));
        TRY(tl_gpu_moe_up(be->act, &L->gate_up, be->x, L->ffn_norm, eps, be->ids, K, E, T, x->st));
    }
    return tl_gpu_moe_down(be->x, &L->down, be->act, be->ids, be->wts, be->wsh, K, E, T, x->st);
}

/* The micro-batch's T tokens into their slots' penalty counts (gpu.h: tl_gpu_penalty_add). */
static int count_tokens(cuda_be *be, int T, const tl_gpu_stream *st) {
    tl_mb_meta d = meta_at(be, be->d_meta);
    return tl_gpu_penalty_add(be->d_counts, be->d_cbits, be->cfg.n_vocab, d.tokens, d.tok_pos,
                              d.tok_slot, be->d_nprompt, T, st);
}

static int moe_prefill(const layer_ctx *x, const float *next_norm);

/* All launches of one micro-batch on the decode kernels (graph-capturable: no host sync, no
 * allocation), under programmatic dependent launch unless TL_CUDA_NO_PDL=1. tc_moe: the MoE as
 * the tensor-core path's grouped GEMMs (moe_prefill), the rest on the GEMV kernels. */
static int run_layers(cuda_be *be, int T, int n_seg, int n_out, int out_row0, int n_split,
                      int tc_moe) {
    tl_gpu_stream st = cb_stream(be, 1);
    tl_mb_meta d = meta_at(be, be->d_meta);
    tl_gpu_seqs s = cb_seqs(be, T, n_seg);
    TRY(count_tokens(be, T, &st));
    TRY(tl_gpu_embed(be->x, &be->embd, d.tokens, T, &st));
    for (int il = 0; il < be->cfg.n_layer; il++) {
        layer_ctx x = layer_at(be, il, T, &s, &st);
        TRY(x.L->kind == TL_LAYER_GDN ? gdn_decode(&x, d.tok_slot) : attn_decode(&x, n_split));
        TRY(tc_moe ? moe_prefill(&x, NULL) : moe_decode(&x));
    }
    return run_head(be, n_out, out_row0, &st);
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

/* Prefill GDN block (input xb = normed x, bf16): in-proj GEMM, conv1d, gates, chunked delta
 * rule on slot's state, gated norm into yb. */
/* The chunked GDN over tokens t0 .. t0 + n - 1 of the micro-batch (one segment of slot), from the
 * conv output and the gates already computed for them; raw output into be->y. */
static int gdn_chunk_seg(const layer_ctx *x, int slot, size_t t0, int n) {
    cuda_be *be = x->be;
    int nv = be->cfg.gdn_n_v_head, nk = be->cfg.gdn_n_k_head;
    const float *cv = be->conv_out + t0 * be->conv_dim;
    return tl_gpu_gdn_chunk(
        be->y + t0 * nv * 128, x->rec_st + (size_t)slot * nv * 128 * 128 * be->st_esz, cv,
        cv + nk * 128, cv + 2 * nk * 128, be->conv_dim, be->gg + t0 * nv, be->gbeta + t0 * nv, n,
        TL_GDN_L2NORM | TL_GDN_OUT_F32 | TL_GDN_IN_F32 | (be->st_bf16 ? TL_GDN_STATE_BF16 : 0),
        be->gdn_ws, x->st);
}

/* A snapshot point inside a segment that runs on the chunked GDN (backend.h snap_at; docs/
 * architecture.md §4.1): k > 0 tokens of the segment before it, buf the snapshot (cb_pc_snap_bytes
 * layout). Only the GDN is cut there; projections, attention and MoE stay one pass. */
typedef struct seg_snap {
    int k;
    char *buf;
} seg_snap;

static size_t rec_bytes(const cuda_be *be) {
    return (size_t)be->cfg.gdn_n_v_head * 128 * 128 * be->st_esz;
}

/* This layer's conv state at the point (the last 3 pre-conv inputs before it: rows of the
 * in-projection's conv columns, the older ones from the slot's state when the point is fewer
 * than 3 tokens into the segment) into the snapshot. Enqueued after the in-projection and before
 * conv1d, which overwrites the slot's state. */
static int snap_conv(const layer_ctx *x, int slot, size_t t0, const seg_snap *sn) {
    cuda_be *be = x->be;
    size_t C = (size_t)be->conv_dim, ld = (size_t)be->ld_gdn_in;
    int k = sn->k, old = TL_MAX(0, 3 - k);
    float *dst = (float *)(sn->buf + (size_t)be->n_gdn * rec_bytes(be)) + x->L->st_idx * 3 * C;
    if (old)
        CUDA_TRY(cudaMemcpyAsync(dst, x->conv_st + ((size_t)slot * 3 + k) * C, old * C * 4,
                                 cudaMemcpyDeviceToDevice, be->stream));
    CUDA_TRY(cudaMemcpy2DAsync(dst + old * C, C * 4, be->proj + (t0 + k + old - 3) * ld, ld * 4,
                               C * 4, 3 - old, cudaMemcpyDeviceToDevice, be->stream));
    return 0;
}

/* gdn_chunk_seg, cut at the snapshot point when there is one: the chunked GDN up to it, this
 * layer's recurrent state into the snapshot, the chunked GDN of the rest from there. */
static int gdn_chunk_cut(const layer_ctx *x, int slot, size_t t0, int n, const seg_snap *sn) {
    if (!sn || sn->k <= 0) return gdn_chunk_seg(x, slot, t0, n);
    cuda_be *be = x->be;
    size_t rec = rec_bytes(be);
    TRY(gdn_chunk_seg(x, slot, t0, sn->k));
    CUDA_TRY(cudaMemcpyAsync(sn->buf + x->L->st_idx * rec, x->rec_st + slot * rec, rec,
                             cudaMemcpyDeviceToDevice, be->stream));
    return gdn_chunk_seg(x, slot, t0 + sn->k, n - sn->k);
}

/* The flash-attention view of slot's pages in this layer's KV cache. */
static tl_gpu_kv_view slot_kv(const layer_ctx *x, int slot) {
    const cuda_be *be = x->be;
    tl_gpu_kv_view kv;
    memset(&kv, 0, sizeof kv);
    kv.k = x->kc, kv.v = x->vc;
    kv.pages = be->d_ptab + (size_t)slot * be->max_pages, kv.page_tokens = TL_KV_PAGE;
    kv.tok_stride = be->cfg.n_head_kv * 256;
    kv.page_stride = (long long)TL_KV_PAGE * kv.tok_stride;
    return kv;
}

static int gdn_prefill(const layer_ctx *x, int slot, const seg_snap *sn) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_gdn_in, T = x->T, nv = c->gdn_n_v_head;
    /* the conv1d in the in-projection's epilogue, unless a snapshot needs the raw conv inputs */
    float *cst = x->conv_st + (size_t)slot * 3 * be->conv_dim;
    int rc = sn->k ? TL_ERR_UNSUPPORTED
                   : tl_gpu_gemm_conv1d(be->proj, be->xb, &L->in, T, be->conv_out, cst, L->conv_w,
                                        be->conv_dim, be->cv_edge, x->st);
    if (rc == TL_ERR_UNSUPPORTED) {
        TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, x->st));
        if (sn->k) TRY(snap_conv(x, slot, 0, sn));
        TRY(tl_gpu_conv1d(be->conv_out, x->conv_st, be->proj, ld, L->conv_w, be->conv_dim, x->s,
                          NULL, x->st));
    } else {
        TRY(rc);
    }
    TRY(tl_gpu_gdn_gates(be->gg, be->gbeta, be->proj + x->a_off, be->proj + x->b_off, ld,
                         L->dt_bias, L->a_neg, T, x->st));
    TRY(gdn_chunk_cut(x, slot, 0, T, sn));
    return tl_gpu_gated_rmsnorm_bf16(be->yb, be->y, be->proj, ld, x->z_off, L->gdn_norm, nv, T,
                                     c->rms_eps, x->st);
}

/* Prefill attention block: in-proj GEMM, q/k norm + RoPE + KV write (q in place), flash
 * attention over slot's pages from pos0 into yb. */
static int attn_prefill(const layer_ctx *x, int slot, int pos0) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_attn_in;
    TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, x->T, NULL, TL_GEMM_OUT_F32, x->st));
    TRY(tl_gpu_qk_rope_kv(NULL, x->kc, x->vc, be->proj, ld, L->q_norm, L->k_norm, c->n_head,
                          c->n_head_kv, &x->pg, c->rope_theta, c->rms_eps, x->s, x->st));
    tl_gpu_kv_view kv = slot_kv(x, slot);
    tl_gpu_heads qh = {be->proj, ld, 512}, gh = {be->proj + 256, ld, 512};
    return tl_gpu_attn_prefill(be->yb, &qh, &gh, &kv, x->T, pos0, TL_ATTN_IN_F32, x->st);
}

/* The next layer's input norm weight, folded into layer il's MoE combine
 * (tl_gpu_moe_pf_combine_norm: the same bits as the separate rmsnorm_bf16 it replaces, one launch
 * fewer a layer), else NULL (the last layer, or TL_MOE_COMBINE_NORM=0). Measured 2026-12-06
 * (session 19, H100): decode batches 8 / 64 / 256 -1.2% / -0.5% / -0.3% a step, prefill 4K +1.1%.
 */
static const float *fold_norm(const cuda_be *be, int il) {
    static cb_level on = {"TL_MOE_COMBINE_NORM", 1, 1, -1};
    return cb_level_get(&on) && il + 1 < be->cfg.n_layer && be->cfg.n_embd == 2048
               ? be->L[il + 1].attn_norm
               : NULL;
}

/* Prefill MoE block: normed x as bf16 hi + lo planes, router GEMM (split precision) + top-k,
 * plan, grouped expert GEMMs with the shared expert inside them as one more expert of every token
 * (gpu.h: tl_gpu_moe_pf_gate_up's shared; past be->sh_max tokens, TL_MOE_SHARED_GROUPED, as two
 * dense GEMMs), weighted combine + residual; with next_norm (fold_norm) the combine also writes
 * be->xb = the next layer's normed input.
 * note: the shared expert as two dense products is bound by latency at a decode batch (~14 us
 * each, two a layer) and still at a 1K prefill chunk (64 and 128 blocks of 32 k steps: 32 + 21
 * us a layer, ncu, H100, session 25); inside the grouped GEMMs its tiles fill the same grid.
 * note: the router GEMM from be->router_min (64) tokens on; below, the GEMV (f32 input): measured
 * 2026-12-04 (decode batches, tulip bench --batch): GEMV faster at 16 and 32, tied at 64, GEMM
 * faster at 128, 256 and on prefill chunks (notes/2026-12-04-router-conv1d.md); then the GEMM of
 * <= 256 tokens split K 8 ways (it had 5 blocks): at 64, 13.50 -> 12.95 ms a step (H200,
 * BENCHMARKS.md session 9); 8 and 32 not measured yet. */
static int moe_prefill(const layer_ctx *x, const float *next_norm) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int D = c->n_embd, E = c->n_expert, K = c->n_expert_used, F = c->n_ff_expert, T = x->T;
    float eps = c->rms_eps;
    if (D % 128 == 0 && L->router.bits == 16 && be->router_min > 0 && T >= be->router_min) {
        /* the experts' E rows on the tensor cores, the shared gate's row (E) in the norm kernel */
        tl_gpu_gemm_w rw = L->router, gw = L->router;
        rw.rows = E, gw.rows = 1;
        gw.w = (const uint8_t *)L->router.w + (size_t)E * D * 2;
        if (gw.sb) gw.sb = (const uint8_t *)L->router.sb + (size_t)E * D * 2;
        TRY(tl_gpu_rmsnorm_bf16x2_dot(be->xb, be->xlo, be->x, L->ffn_norm, T, D, eps, &gw,
                                      be->rlog + E, E + 1, x->st));
        TRY(tl_gpu_router_gemm(be->rlog, E + 1, &rw, be->xb, be->xlo, T, x->st));
    } else {
        TRY(tl_gpu_gemv(be->rlog, E + 1, &L->router, be->x, D, L->ffn_norm, eps, T, 0, x->st));
        TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, L->ffn_norm, T, D, eps, x->st));
    }
    static cb_level fused = {"TL_MOE_ROUTE_PLAN", 0, 1, -1};
    if (T <= 32 && K == 8 && cb_level_get(&fused)) { /* a decode batch: one launch */
        TRY(tl_gpu_moe_route_plan(be->plan, be->ids, be->wts, be->wsh, be->shl, be->rlog, E + 1, E,
                                  K, T, x->st));
    } else {
        TRY(tl_gpu_moe_route(be->ids, be->wts, be->wsh, be->shl, be->rlog, E + 1, E, K, T, x->st));
        TRY(tl_gpu_moe_pf_plan(be->plan, be->ids, T, x->st));
    }
    tl_gpu_gemm_w gu0 = expert_w(&L->gate_up, 0, 2 * F), dn0 = expert_w(&L->down, 0, D);
    int sh = T <= be->sh_max; /* the shared expert too */
    TRY(tl_gpu_moe_pf_gate_up(be->hexp, be->xb, &gu0, be->plan, T, sh, x->st));
    TRY(tl_gpu_moe_pf_down(be->yslot, be->hexp, &dn0, be->plan, T, sh, x->st));
    const uint16_t *ys = be->yslot + (size_t)T * K * D; /* the shared expert's rows */
    if (!sh) {
        tl_gpu_gemm_w gus = expert_w(&L->gate_up, E, 2 * F), dns = expert_w(&L->down, E, D);
        TRY(tl_gpu_gemm(be->hs, be->xb, &gus, T, NULL, TL_GEMM_SWIGLU, x->st));
        TRY(tl_gpu_gemm(be->ys, be->hs, &dns, T, NULL, 0, x->st));
        ys = be->ys;
    }
    return tl_gpu_moe_pf_combine_norm(be->x, be->x, be->yslot, be->wts, ys, be->shl, T,
                                      TL_GEMM_OUT_F32, next_norm, be->xb, eps, x->st);
}

/* One prefill chunk of one sequence (T tokens at slot, pos0) on the tensor-core path: bf16
 * activations into the GEMMs (residual stream stays f32), chunked GDN, flash attention, grouped
 * MoE. Same math as run_layers; rounding differs (bf16 GEMM inputs). The layers' kernels (the
 * batched path's, which wait for their inputs) run under PDL unless TL_CUDA_PF_PDL=0: at a few
 * hundred tokens a prefill is ~1,300 short kernels whose launch gaps PDL hides; the head, which
 * also runs kernels without a PDL wait (the MTP rows), runs without. */
static int run_prefill(cuda_be *be, int T, int slot, int pos0, int n_out, int out_row0,
                       const seg_snap *sn) {
    const tl_config *c = &be->cfg;
    tl_gpu_stream st = cb_stream(be, 0), lst = cb_stream(be, be->pf_pdl);
    tl_mb_meta d = meta_at(be, be->d_meta);
    tl_gpu_seqs s = cb_seqs(be, T, 1);
    TRY(count_tokens(be, T, &st));
    TRY(tl_gpu_embed(be->x, &be->embd, d.tokens, T, &st));
    const float *folded = NULL; /* the norm the last combine applied (fold_norm) */
    for (int il = 0; il < c->n_layer; il++) {
        layer_ctx x = layer_at(be, il, T, &s, &lst);
        if (!folded) /* else the previous layer's combine wrote it */
            TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, x.L->attn_norm, T, c->n_embd, c->rms_eps, &lst));
        TRY(x.L->kind == TL_LAYER_GDN ? gdn_prefill(&x, slot, sn) : attn_prefill(&x, slot, pos0));
        TRY(tl_gpu_gemm(be->x, be->yb, &x.L->out, T, be->x, TL_GEMM_OUT_F32 | TL_GEMM_ADD_RES,
                        &lst));
        folded = fold_norm(be, il);
        TRY(moe_prefill(&x, folded));
    }
    return run_head(be, n_out, out_row0, &st);
}

/* ====== Batched decode on the tensor cores ======
 * A micro-batch of at least be->tc_min tokens that is not one long chunk (decode tokens of many
 * sequences, short prompts): the GEMM path's projections and grouped MoE, so that every weight
 * and every touched expert is read once per step for all T tokens, around the decode path's
 * per-token conv1d, GDN step and split-KV attention (docs/architecture.md §4). Activations go
 * into the GEMMs as bf16, as on the prefill path: same math as run_layers, prefill rounding. */

/* The long segments of a mixed micro-batch (batch_plan.h tl_mb_begin_mixed): prefill chunks of
 * >= CB_PF_MIN tokens after the short segments (decode tokens, short prompts), which are the
 * first n_short_seg segments and n_short_tok tokens. The short ones take the decode mixers, each
 * long one the prefill mixers (chunked GDN, flash attention); the GEMMs and the MoE run over all
 * tokens at once, so the weights and the touched experts are read once for both. */
typedef struct mb_long {
    int n_short_tok, n_short_seg, n;
    int tok0[CB_MAX_SEQS], len[CB_MAX_SEQS], slot[CB_MAX_SEQS], pos0[CB_MAX_SEQS];
    seg_snap snap[CB_MAX_SEQS]; /* k 0: no snapshot point inside */
} mb_long;

/* A micro-batch of short segments only (T tokens, n_seg segments). */
static void mb_long_none(mb_long *lg, int T, int n_seg) {
    lg->n_short_tok = T, lg->n_short_seg = n_seg, lg->n = 0;
}

/* From a micro-batch's host metadata: the segments from the first long one on. */
static void mb_long_of(const tl_mb_meta *h, int n_seg, int T, mb_long *lg) {
    int k = 0;
    while (k < n_seg && h->seg_n[k] < CB_PF_MIN) k++;
    lg->n_short_seg = k, lg->n_short_tok = k < n_seg ? h->seg_tok0[k] : T, lg->n = 0;
    for (; k < n_seg; k++, lg->n++) {
        lg->tok0[lg->n] = h->seg_tok0[k], lg->len[lg->n] = h->seg_n[k];
        lg->slot[lg->n] = h->seg_slot[k], lg->pos0[lg->n] = h->seg_pos0[k];
        lg->snap[lg->n].k = 0, lg->snap[lg->n].buf = NULL;
    }
}

/* GDN mixer: in-proj GEMM, conv1d, the GDN step per short segment cut by state columns (raw
 * output) and the chunked GDN per long one, the gated norm into bf16. */
static int gdn_tc(const layer_ctx *x, const mb_long *lg) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_gdn_in, T = x->T, nv = c->gdn_n_v_head, nk = c->gdn_n_k_head;
    TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, x->st));
    for (int i = 0; i < lg->n; i++)
        if (lg->snap[i].k) TRY(snap_conv(x, lg->slot[i], lg->tok0[i], &lg->snap[i]));
    TRY(tl_gpu_conv1d(be->conv_out, x->conv_st, be->proj, ld, L->conv_w, be->conv_dim, x->s,
                      ring_of(&x->cring), x->st));
    tl_gpu_seqs ss = cb_seqs(be, lg->n_short_tok, lg->n_short_seg);
    if (lg->n_short_tok > 0)
        TRY(tl_gpu_gdn_raw(be->y, x->rec_st, be->st_bf16, be->conv_out, be->proj, ld, x->b_off,
                           x->a_off, L->dt_bias, L->a_neg, nk, nv, &ss, ring_of(&x->rring), x->st));
    if (lg->n > 0)
        TRY(tl_gpu_gdn_gates(be->gg, be->gbeta, be->proj + x->a_off, be->proj + x->b_off, ld,
                             L->dt_bias, L->a_neg, T, x->st));
    for (int i = 0; i < lg->n; i++)
        TRY(gdn_chunk_cut(x, lg->slot[i], lg->tok0[i], lg->len[i], &lg->snap[i]));
    return tl_gpu_gated_rmsnorm_bf16(be->yb, be->y, be->proj, ld, x->z_off, L->gdn_norm, nv, T,
                                     c->rms_eps, x->st);
}

/* Attention mixer: in-proj GEMM, q/k norm + RoPE + KV write for all tokens, split-KV attention
 * with the gate for the short segments (output as bf16), flash attention over its slot's pages
 * for each long one. */
static int attn_tc(const layer_ctx *x, int n_split, const mb_long *lg) {
    cuda_be *be = x->be;
    const tl_config *c = &be->cfg;
    const cb_layer *L = x->L;
    int ld = be->ld_attn_in, T = x->T, qd = c->n_head * 256;
    TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, x->st));
    TRY(tl_gpu_qk_rope_kv(be->q, x->kc, x->vc, be->proj, ld, L->q_norm, L->k_norm, c->n_head,
                          c->n_head_kv, &x->pg, c->rope_theta, c->rms_eps, x->s, x->st));
    tl_gpu_seqs ss = cb_seqs(be, lg->n_short_tok, lg->n_short_seg);
    if (lg->n_short_tok > 0) {
        TRY(tl_gpu_attn(be->y, be->part, be->q, x->kc, x->vc, be->proj, ld, c->n_head, c->n_head_kv,
                        &x->pg, n_split, &ss, &be->attn, x->st));
        TRY(tl_gpu_cast_bf16(be->yb, be->y, (long)lg->n_short_tok * qd, x->st));
    }
    for (int i = 0; i < lg->n; i++) {
        size_t t0 = (size_t)lg->tok0[i];
        tl_gpu_kv_view kv = slot_kv(x, lg->slot[i]);
        tl_gpu_heads qh = {be->q + t0 * qd, qd, 256}, gh = {be->proj + t0 * ld + 256, ld, 512};
        TRY(tl_gpu_attn_prefill(be->yb + t0 * qd, &qh, &gh, &kv, lg->len[i], lg->pos0[i],
                                TL_ATTN_IN_F32, x->st));
    }
    return 0;
}

/* All launches of one micro-batch on the tensor-core decode path (graph-capturable), under PDL
 * unless TL_CUDA_NO_PDL=1 or TL_CUDA_TC_PDL=0: every kernel on it waits for its predecessor and
 * then triggers its successor (pdl_enter, or triggers first where nothing it reads early depends
 * on the predecessor), and a dense GEMM requests its first weight tiles before waiting. */
static int run_layers_tc(cuda_be *be, int T, int n_seg, int n_out, int out_row0, int n_split,
                         const mb_long *lg) {
    const tl_config *c = &be->cfg;
    tl_gpu_stream st = cb_stream(be, be->tc_pdl);
    tl_mb_meta d = meta_at(be, be->d_meta);
    tl_gpu_seqs s = cb_seqs(be, T, n_seg);
    TRY(count_tokens(be, T, &st));
    TRY(tl_gpu_embed(be->x, &be->embd, d.tokens, T, &st));
    const float *folded = NULL; /* the norm the last combine applied (fold_norm) */
    for (int il = 0; il < c->n_layer; il++) {
        layer_ctx x = layer_at(be, il, T, &s, &st);
        if (!folded) /* else the previous layer's combine wrote it */
            TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, x.L->attn_norm, T, c->n_embd, c->rms_eps, &st));
        TRY(x.L->kind == TL_LAYER_GDN ? gdn_tc(&x, lg) : attn_tc(&x, n_split, lg));
        TRY(tl_gpu_gemm(be->x, be->yb, &x.L->out, T, be->x, TL_GEMM_OUT_F32 | TL_GEMM_ADD_RES,
                        &st));
        folded = fold_norm(be, il);
        TRY(moe_prefill(&x, folded));
    }
    return run_head_tc(be, n_out, out_row0, &st);
}

/* The path of a micro-batch that is not one long chunk: tensor cores from tc_min tokens on (on
 * production shapes), else the GEMV decode kernels. lg: its long segments (NULL: none). */
static int run_short(cuda_be *be, int T, int n_seg, int n_out, int out_row0, int n_split,
                     const mb_long *lg) {
    /* TL_CUDA_GEMV_DENSE_MAX=N: micro-batches of up to N tokens (no long segment) keep their
     * dense products on the GEMV kernels and take only the MoE onto the tensor cores */
    static cb_level gemv_dense = {"TL_CUDA_GEMV_DENSE_MAX", 0, 64, -1};
    int tc = be->pf_ok && be->tc_min > 0 && T >= be->tc_min;
    if (tc && !lg && T <= cb_level_get(&gemv_dense))
        return run_layers(be, T, n_seg, n_out, out_row0, n_split, 1);
    if (tc) {
        mb_long none;
        mb_long_none(&none, T, n_seg);
        return run_layers_tc(be, T, n_seg, n_out, out_row0, n_split, lg ? lg : &none);
    }
    return run_layers(be, T, n_seg, n_out, out_row0, n_split, 0);
}

/* ====== The MTP head's block (docs/model.md §3.2; driven by cuda_spec.cu) ======
 * T rows described by the metadata at d_base (meta_at layout; positions are the rows' own: the
 * position of the hidden each one reads), token embeddings and the hiddens sp->hid[src_rows]
 * normed and concatenated, then fc into be->x. full = 0: only the attention's K and V of the rows
 * into the head's KV layer (all a trunk forward needs: later draft steps attend to them); full =
 * 1: the whole block (attention with the gate, o-proj, MoE), leaving t in be->x. tc: the
 * tensor-core GEMMs (bf16 activations), as the trunk's micro-batch used; else the GEMVs. */
int cb_mtp_block(cuda_be *be, const tl_mb_meta *dm, int T, int n_seg, int full, int tc, int n_split,
                 const int32_t *src_rows) {
    cb_spec *sp = be->sp;
    const tl_config *c = &be->cfg;
    int D = c->n_embd;
    float eps = c->rms_eps;
    tl_gpu_stream st = cb_stream(be, 0);
    const tl_mb_meta &d = *dm;
    tl_gpu_seqs s = seqs_of(dm, T, n_seg);
    layer_ctx x = layer_of(be, &sp->L, T, &s, &st);
    const cb_layer *L = &sp->L;
    TRY(tl_gpu_embed(sp->eb, &be->embd, d.tokens, T, &st));
    TRY(tl_gpu_mtp_cat(sp->cat, sp->eb, sp->norm_emb, sp->hid, src_rows, sp->norm_hid, T, D, eps,
                       &st));
    if (tc) {
        TRY(tl_gpu_cast_bf16(be->yb, sp->cat, (long)T * 2 * D, &st));
        TRY(tl_gpu_gemm(be->x, be->yb, &sp->fc, T, NULL, TL_GEMM_OUT_F32, &st));
        TRY(tl_gpu_rmsnorm_bf16(be->xb, be->x, L->attn_norm, T, D, eps, &st));
        if (!full) {
            TRY(tl_gpu_gemm(be->proj, be->xb, &L->in, T, NULL, TL_GEMM_OUT_F32, &st));
            return tl_gpu_qk_rope_kv(NULL, x.kc, x.vc, be->proj, be->ld_attn_in, L->q_norm,
                                     L->k_norm, c->n_head, c->n_head_kv, &x.pg, c->rope_theta, eps,
                                     &s, &st);
        }
        mb_long none; /* the head's rows are all short segments */
        mb_long_none(&none, T, n_seg);
        TRY(attn_tc(&x, n_split, &none));
        TRY(tl_gpu_gemm(be->x, be->yb, &L->out, T, be->x, TL_GEMM_OUT_F32 | TL_GEMM_ADD_RES, &st));
        return moe_prefill(&x, NULL);
    }
    TRY(tl_gpu_gemv(be->x, D, &sp->fc, sp->cat, 2 * D, NULL, 0.0f, T, 0, &st));
    if (!full) {
        TRY(tl_gpu_gemv(be->proj, be->ld_attn_in, &L->in, be->x, D, L->attn_norm, eps, T, 0, &st));
        return tl_gpu_qk_rope_kv(NULL, x.kc, x.vc, be->proj, be->ld_attn_in, L->q_norm, L->k_norm,
                                 c->n_head, c->n_head_kv, &x.pg, c->rope_theta, eps, &s, &st);
    }
    TRY(attn_decode(&x, n_split));
    return moe_decode(&x);
}

/* The final norm (norm_w) and the LM head over n rows of x into logits [n][n_vocab]: the GEMM
 * on the tensor cores when tc (and the head's shape suits it), else the GEMV. xo: [n][n_embd]
 * scratch that receives the normed rows. */
int cb_lm_head(cuda_be *be, float *logits, float *xo, const float *x, const float *norm_w, int n,
               int tc) {
    const tl_config *c = &be->cfg;
    if (n <= 0) return 0;
    tl_gpu_stream st = cb_stream(be, 0);
    if (norm_w) TRY(tl_gpu_rmsnorm(xo, x, norm_w, NULL, n, c->n_embd, c->rms_eps, &st));
    if (tc && be->lm_head.rows == c->n_vocab && c->n_vocab % 128 == 0) {
        TRY(tl_gpu_cast_bf16(be->xb, xo, (long)n * c->n_embd, &st));
        return tl_gpu_gemm(logits, be->xb, &be->lm_head, n, NULL, TL_GEMM_OUT_F32, &st);
    }
    return tl_gpu_gemv(logits, c->n_vocab, &be->lm_head, xo, c->n_embd, NULL, 0.0f, n, 0, &st);
}

/* Captures the decode launches of a batch of T single tokens into be->graph[T] (once). */
static int capture_decode_graph(cuda_be *be, int T, int n_split, char *err, size_t errlen) {
    cudaGraph_t g;
    CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
    int st = run_short(be, T, T, T, 0, n_split, NULL);
    cudaError_t ce = cudaStreamEndCapture(be->stream, &g);
    if (st || ce != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "graph capture failed (%s)",
                       st ? tl_status_str(st) : cudaGetErrorString(ce));
    ce = cudaGraphInstantiate(&be->graph[T], g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        be->graph[T] = NULL;
        return tl_errf(err, errlen, TL_ERR_CUDA, "graph instantiate: %s", cudaGetErrorString(ce));
    }
    return 0;
}

/* ====== Snapshots inside the step (backend.h snap_at; docs/architecture.md §4.1) ======
 * A point inside a segment on the chunked GDN (a long micro-batch, or a long segment of a
 * tensor-core one) cuts only that GDN (seg_snap above). Anywhere else (the decode kernels step
 * token by token: small models, TL_CUDA_NO_PREFILL_GEMM, short pieces) the micro-batch ends at
 * the point (tl_mb_iter.cut) and the slot's state is copied into the snapshot after it: two
 * passes over the weights, still one step and no host synchronisation. */

static char *snap_buf(cuda_be *be, int snap) {
    return be->pc_snap + (size_t)snap * cb_pc_snap_bytes(be);
}

/* Tokens of segment sg before its entry's snapshot point when the point is strictly inside it;
 * else 0. */
static int seg_snap_k(const tl_fwd_entry *e, const tl_mb_seg *sg) {
    const tl_fwd_entry *en = &e[sg->entry];
    int k = en->snap_at - (en->pos + sg->start);
    return en->snap_at && k > 0 && k < sg->n ? k : 0;
}

/* Does segment k of a micro-batch of T tokens run on the chunked GDN? micro_step's dispatch: a
 * long micro-batch (run_prefill), or on the tensor-core path a segment from the first long one
 * on (mb_long_of); the decode kernels otherwise. */
static int seg_chunked(const cuda_be *be, const tl_mb_seg *segs, int n_seg, int T, int k) {
    if (!be->pf_ok) return 0;
    if (n_seg == 1 && T >= CB_PF_MIN) return 1;
    if (be->tc_min <= 0 || T < be->tc_min) return 0;
    int first = 0;
    while (first < n_seg && segs[first].n < CB_PF_MIN) first++;
    return k >= first;
}

static tl_mb_iter step_iter(const cuda_be *be, const int *n_tok, int n, const int *cut) {
    int long_min = be->pf_ok ? CB_PF_MIN : 0;
    tl_mb_iter it = be->mix ? tl_mb_begin_mixed(n_tok, n, be->max_tok, be->max_seqs, long_min)
                            : tl_mb_begin(n_tok, n, be->max_tok, be->max_seqs, long_min);
    it.cut = cut;
    return it;
}

/* The step's cuts: every snapshot point that the plan puts inside a segment off the chunked GDN
 * ends its micro-batch instead; planned again until no new cut (a cut moves the micro-batches
 * after it). Host only. */
static void plan_cuts(const cuda_be *be, const tl_fwd_entry *e, int n, const int *n_tok, int *cut) {
    tl_mb_seg segs[CB_MAX_SEQS];
    int n_seg, again = 1;
    for (int i = 0; i < n; i++) cut[i] = 0;
    while (again) {
        again = 0;
        tl_mb_iter it = step_iter(be, n_tok, n, cut);
        while (tl_mb_next(&it, segs, &n_seg)) {
            int T = 0;
            for (int k = 0; k < n_seg; k++) T += segs[k].n;
            for (int k = 0; k < n_seg; k++) {
                const tl_fwd_entry *en = &e[segs[k].entry];
                if (!seg_snap_k(e, &segs[k]) || seg_chunked(be, segs, n_seg, T, k)) continue;
                cut[segs[k].entry] = en->snap_at - en->pos;
                again = 1;
            }
        }
    }
}

/* The snapshot points of a micro-batch's segments: inside a chunked segment, where the GDN is
 * cut (lg's long segments, or *one for a long micro-batch); at a segment's end (a cut), the
 * slot's state copied after the micro-batch (snap_after). TL_ERR_INTERNAL for a point inside a
 * segment of the decode kernels (plan_cuts should have cut there). */
static int seg_snaps(cuda_be *be, const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg, int T,
                     mb_long *lg, seg_snap *one) {
    one->k = 0, one->buf = NULL;
    for (int k = 0; k < n_seg; k++) {
        int sk = seg_snap_k(e, &segs[k]);
        if (!sk) continue;
        if (!seg_chunked(be, segs, n_seg, T, k)) return TL_ERR_INTERNAL;
        seg_snap sn = {sk, snap_buf(be, e[segs[k].entry].snap)};
        if (n_seg == 1 && T >= CB_PF_MIN) *one = sn;
        if (lg && k >= lg->n_short_seg) lg->snap[k - lg->n_short_seg] = sn;
    }
    return 0;
}

/* After a micro-batch: the state of each slot whose segment ended at its snapshot point. */
static int snap_after(cuda_be *be, const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg) {
    for (int k = 0; k < n_seg; k++) {
        const tl_fwd_entry *en = &e[segs[k].entry];
        if (en->snap_at && en->pos + segs[k].start + segs[k].n == en->snap_at)
            TRY(cb_state_copy(be, en->slot, snap_buf(be, en->snap), 1));
    }
    return 0;
}

/* Runs one micro-batch: fills and uploads its metadata (batch_plan.h), then takes its path: the
 * prefill GEMMs for a long chunk, a captured graph for a decode batch, else the decode kernels. */
static int micro_step(cuda_be *be, const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg,
                      const int *row_of, char *err, size_t errlen) {
    CUDA_TRY(cudaEventSynchronize(be->meta_ev)); /* the previous upload has read h_meta */
    tl_mb_meta h = meta_at(be, be->h_meta);
    tl_mb_info in;
    tl_mb_fill(e, segs, n_seg, row_of, &h, &in);
    CUDA_TRY(cudaMemcpyAsync(be->d_meta, be->h_meta, be->meta_ints * 4, cudaMemcpyHostToDevice,
                             be->stream));
    CUDA_TRY(cudaEventRecord(be->meta_ev, be->stream));
    int long_min = be->pf_ok ? CB_PF_MIN : 0, T = in.n_tok;
    tl_mb_kind kind = tl_mb_kind_of(&in, long_min, be->max_seqs);
    int n_split = tl_mb_attn_splits(&in, kind, CB_DECODE_SPLIT, be->part_rows);
    int st, tc = be->pf_ok && (kind == TL_MB_LONG || (be->tc_min > 0 && T >= be->tc_min));
    int use_graph = kind == TL_MB_DECODE && T <= CB_MAX_GRAPH_B && in.n_out == T &&
                    in.out_row0 == 0 && !be->graphs_off && !be->prof;
    mb_long lg; /* 28 KB of stack */
    seg_snap one;
    mb_long_of(&h, in.n_seg, T, &lg);
    if (seg_snaps(be, e, segs, n_seg, T, &lg, &one))
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "a snapshot point inside a segment off the chunked GDN");
    if (kind == TL_MB_LONG) {
        st = run_prefill(be, T, h.seg_slot[0], h.seg_pos0[0], in.n_out, in.out_row0, &one);
        if (st) return tl_errf(err, errlen, st, "CUDA prefill failed (see log)");
    } else if (!use_graph) {
        st = run_short(be, T, in.n_seg, in.n_out, in.out_row0, n_split, lg.n ? &lg : NULL);
        if (st) return tl_errf(err, errlen, st, "CUDA forward failed (see log)");
    } else {
        if (!be->graph[T]) TRY(capture_decode_graph(be, T, n_split, err, errlen));
        CUDA_TRY(cudaGraphLaunch(be->graph[T], be->stream));
    }
    st = snap_after(be, e, segs, n_seg);
    if (st) return tl_errf(err, errlen, st, "CUDA snapshot copy failed (see log)");
    if (be->sp) { /* the MTP head's rows, verify logits, hiddens (docs/architecture.md §3.6) */
        st = cb_spec_micro(be, e, segs, n_seg, tc);
        if (st) return tl_errf(err, errlen, st, "CUDA MTP head rows failed (see log)");
    }
    return 0;
}

static uint64_t rng_draw(uint64_t *s) { return tl_mix64(*s += TL_GOLDEN64); }

static int has_penalty(const tl_sample_params *p) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           p->repetition_penalty != 1.0f;
}

/* Gives every entry's slot the KV pages for positions up to pos + n_tok (all or nothing:
 * kv_pages.h; TL_ERR_CONTEXT_FULL changes nothing), and uploads the new page-table entries.
 * h_ptab (the table's storage) may be rewritten here: every earlier upload from it finished at
 * the previous forward's final synchronize. */
static int kv_reserve(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    int slot[CB_MAX_SEQS], len[CB_MAX_SEQS];
    for (int i = 0; i < n; i++) slot[i] = e[i].slot, len[i] = e[i].pos + e[i].n_tok;
    return cb_kv_grow(be, slot, len, n, err, errlen);
}

int cb_kv_grow(cuda_be *be, const int *slot, const int *len, int n, char *err, size_t errlen) {
    if (be->n_kv_layers == 0) return 0;
    int old[CB_MAX_SEQS];
    TRY(tl_kv_pages_reserve(&be->pages, slot, len, n, old, err, errlen));
    for (int i = 0; i < n; i++) {
        int have = old[i], want = be->pages.np[slot[i]];
        if (want <= have) continue;
        size_t off = (size_t)slot[i] * be->max_pages + have;
        CUDA_TRY(cudaMemcpyAsync(be->d_ptab + off, be->h_ptab + off,
                                 (size_t)(want - have) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 be->stream));
    }
    return 0;
}

/* Checks every entry (slot, positions, context, token ids). */
static int check_entries(const cuda_be *be, const tl_fwd_entry *e, int n, char *err,
                         size_t errlen) {
    if (n < 0 || n > be->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch of %d entries, backend has %d slots", n,
                       be->max_seqs);
    for (int i = 0; i < n; i++) {
        const tl_fwd_entry *en = &e[i];
        if (en->slot < 0 || en->slot >= be->max_seqs || en->pos < 0 || en->n_tok < 1)
            return tl_errf(err, errlen, TL_ERR_INVALID, "entry %d: bad slot %d / pos %d / n_tok %d",
                           i, en->slot, en->pos, en->n_tok);
        if ((long)en->pos + en->n_tok > be->max_ctx)
            return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                           "entry %d: %d + %d tokens exceed the context of %d", i, en->pos,
                           en->n_tok, be->max_ctx);
        if (en->snap_at &&
            (en->snap_at <= en->pos || en->snap_at >= en->pos + en->n_tok || en->snap < 0 ||
             en->snap >= be->pc_n_snap || en->all_logits || en->all_laws))
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "entry %d: snapshot %d at %d not inside positions %d .. %d", i, en->snap,
                           en->snap_at, en->pos + 1, en->pos + en->n_tok - 1);
        if ((en->all_logits || en->all_laws) && !be->sp)
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                           "entry %d: logits of every token need speculative decoding "
                           "(tl_cuda_params.spec_tokens)",
                           i);
        for (int j = 0; j < en->n_tok; j++)
            if (en->tokens[j] < 0 || en->tokens[j] >= be->cfg.n_vocab)
                return tl_errf(err, errlen, TL_ERR_INVALID,
                               "entry %d: token id %d out of range [0, %d)", i, en->tokens[j],
                               be->cfg.n_vocab);
    }
    return 0;
}

/* Row r's logit bias and allowed-token mask (tulip.h) into pinned memory and uploaded (only the
 * pairs and the bitset in use); p's host pointers become the device copies'. The pinned rows may
 * be rewritten here: every earlier upload from them finished at the previous forward's final
 * synchronize. Returns 1 if the row has a restriction, 0 if not, or a negative status. */
static int stage_restrictions(cuda_be *be, const tl_sample_params *src, tl_sample_params *p,
                              int r) {
    int nb = TL_MAX(0, TL_MIN(src->n_bias, TL_MAX_LOGIT_BIAS));
    p->n_bias = nb;
    p->bias_ids = NULL, p->bias_vals = NULL, p->allow = NULL;
    if (nb > 0) {
        size_t off = (size_t)r * TL_MAX_LOGIT_BIAS;
        memcpy(be->h_bias_ids + off, src->bias_ids, nb * sizeof(int32_t));
        memcpy(be->h_bias_vals + off, src->bias_vals, nb * sizeof(float));
        CUDA_TRY(cudaMemcpyAsync(be->d_bias_ids + off, be->h_bias_ids + off, nb * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, be->stream));
        CUDA_TRY(cudaMemcpyAsync(be->d_bias_vals + off, be->h_bias_vals + off, nb * sizeof(float),
                                 cudaMemcpyHostToDevice, be->stream));
        p->bias_ids = be->d_bias_ids + off, p->bias_vals = be->d_bias_vals + off;
    }
    if (src->allow) {
        size_t W = be->allow_words, off = (size_t)r * W;
        memcpy(be->h_allow + off, src->allow, W * sizeof(uint32_t));
        CUDA_TRY(cudaMemcpyAsync(be->d_allow + off, be->h_allow + off, W * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, be->stream));
        p->allow = be->d_allow + off;
    }
    return nb > 0 || src->allow;
}

/* Sampling parameters and keys of every output row into pinned memory (restrictions staged and
 * uploaded); 1 if any row samples, or a negative status. *any_pen = 1 if any row applies a
 * penalty, *any_restrict = 1 if any has a logit bias or an allowed-token mask. */
static int stage_sampling(cuda_be *be, const tl_fwd_entry *e, int n, const int *row_of,
                          int *any_pen, int *any_restrict) {
    int any_sample = 0;
    *any_pen = 0, *any_restrict = 0;
    for (int i = 0; i < n; i++) {
        int r = row_of[i];
        if (r < 0) continue;
        tl_sample_params *p = &be->h_params[r];
        if (e[i].sample) {
            *p = *e[i].sample;
            p->n_logprobs = TL_MAX(0, TL_MIN(p->n_logprobs, TL_MAX_LOGPROBS));
            int rs = stage_restrictions(be, e[i].sample, p, r);
            if (rs < 0) return rs;
            if (rs) *any_restrict = 1;
            be->h_keys[r] = e[i].rng ? rng_draw(e[i].rng) : 0;
            any_sample = 1;
            if (has_penalty(p)) *any_pen = 1;
        } else {
            memset(p, 0, sizeof *p);
            p->top_p = 1.0f, p->repetition_penalty = 1.0f;
            be->h_keys[r] = 0;
        }
    }
    return any_sample;
}

/* Samples every output row on the device and copies results and requested logits back. */
static int sample_rows(cuda_be *be, const tl_fwd_entry *e, int n, const int *row_of, int n_rows) {
    int V = be->cfg.n_vocab, any_pen, any_restrict;
    tl_gpu_stream st = cb_stream(be, 0);
    int staged = stage_sampling(be, e, n, row_of, &any_pen, &any_restrict);
    if (staged < 0) return staged;
    if (staged) {
        CUDA_TRY(cudaMemcpyAsync(be->d_params, be->h_params, n_rows * sizeof(tl_sample_params),
                                 cudaMemcpyHostToDevice, be->stream));
        CUDA_TRY(cudaMemcpyAsync(be->d_keys, be->h_keys, n_rows * sizeof(uint64_t),
                                 cudaMemcpyHostToDevice, be->stream));
        if (any_pen) {
            for (int i = 0; i < n; i++)
                if (row_of[i] >= 0) be->h_rowslot[row_of[i]] = e[i].slot;
            CUDA_TRY(cudaMemcpyAsync(be->d_rowslot, be->h_rowslot, n_rows * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, be->stream));
        }
        TRY(tl_gpu_sample(be->d_out, be->logits, V, be->n_valid, be->d_params, be->h_params,
                          be->d_keys, any_pen ? be->d_counts : NULL, be->d_cbits, be->d_rowslot,
                          be->d_sscratch, any_restrict ? be->d_rlogits : NULL, n_rows, &st));
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
    return 0;
}

int cb_forward_impl(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    int row_of[CB_MAX_SEQS], long_min = be->pf_ok ? CB_PF_MIN : 0;
    TRY(check_entries(be, e, n, err, errlen));
    int n_rows = tl_mb_rows(e, n, long_min, row_of); /* in plan order: batch_plan.h */
    int rs = kv_reserve(be, e, n, err, errlen);
    if (rs == TL_ERR_CONTEXT_FULL && be->sp) cb_spec_unreserve(be, e, n); /* pages of drafts */
    if (rs) return rs;
    for (int i = 0; i < n; i++) be->h_nprompt[e[i].slot] = e[i].n_prompt; /* -1: not known */
    CUDA_TRY(cudaMemcpyAsync(be->d_nprompt, be->h_nprompt, be->max_seqs * sizeof(int32_t),
                             cudaMemcpyHostToDevice, be->stream));
    if (be->sp) TRY(cb_spec_begin(be, e, n, err, errlen)); /* after d_nprompt: recounts read it */
    if (be->prof) tl_gpu_prof_mark(be->prof, be->stream, "start");
    int n_tok[CB_MAX_SEQS], cut[CB_MAX_SEQS], any_snap = 0;
    for (int i = 0; i < n; i++) n_tok[i] = e[i].n_tok, any_snap |= e[i].snap_at != 0;
    if (any_snap) plan_cuts(be, e, n, n_tok, cut);
    tl_mb_seg segs[CB_MAX_SEQS];
    int n_seg;
    tl_mb_iter it = step_iter(be, n_tok, n, any_snap ? cut : NULL);
    while (tl_mb_next(&it, segs, &n_seg)) TRY(micro_step(be, e, segs, n_seg, row_of, err, errlen));
    /* the launches above run on the GPU while the callers finish their sample parameters (a
     * grammar's mask: tulip.h tl_batch_entry.prepare), the entries' calls spread over the CPU
     * worker pool (64 constrained streams: 64 masks a step) */
    run_prepares(e, n);
    if (be->sp) TRY(cb_spec_end(be, e, n)); /* verify logits to the host */
    if (n_rows > 0) TRY(sample_rows(be, e, n, row_of, n_rows));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* After a failed step: 1 if the CUDA context is broken (a sticky error such as an illegal
 * address: every later call fails), 0 if the error was not sticky (a launch refused for its
 * configuration, an allocation) and the device still works. */
int cb_device_broken(cuda_be *be) {
    cudaGetLastError(); /* clears a non-sticky error */
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    return e != cudaSuccess;
}

int cb_forward(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (err && errlen) err[0] = 0;
    if (be->lost)
        return tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the GPU was lost after an earlier error");
    if (cb_bind(be))
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot make CUDA device %d current", be->device);
    int st = cb_forward_impl(be, e, n, err, errlen);
    if (st == TL_ERR_CUDA) {
        if (cb_device_broken(be)) be->lost = 1;
        if (err && errlen && !err[0])
            tl_errf(err, errlen, st, "CUDA error during the forward (see log)");
    }
    return st;
}
