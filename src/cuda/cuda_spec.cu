/* The CUDA backend's speculative decoding (backend.h spec_init / spec_ready / draft / rollback,
 * docs/architecture.md §3.6): the MTP head's rows after every micro-batch of the trunk (only
 * their K and V: the head's KV is layer n_attn of the paged pool, on the slot's own pages), the
 * final-normed hiddens the head reads (a ring of the last K + 1 positions per slot), the logits
 * of every token of a verify entry, the draft steps (the whole head block), and the rollback of a
 * verify: the GDN state the verify's kernels copied after the last accepted token copied back
 * (or, with TL_CUDA_SPEC_RECOMPUTE=1, the state saved before the verify restored and the accepted
 * tokens run again). The head's weights are uploaded by cuda_weights.cu; the block itself is
 * cb_mtp_block (cuda_forward.cu). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/status.h"
#include "common/util.h"
#include "engine/sample.h"
#include "engine/spec_plan.h"
}

/* The rows of sp->hid (engine/spec_plan.h): the micro-batch's, the ring, the chain. */
static tl_spec_layout layout(const cuda_be *be) {
    tl_spec_layout l = {be->sp->K, be->max_tok, be->max_seqs};
    return l;
}

/* The head's extra metadata after the meta_at block: source rows of the hiddens, the ring's
 * destination and source rows, the verify rows to gather (each [max_tok]). */
static int32_t *extra(const cuda_be *be, int32_t *base, int k) {
    return base + be->meta_ints + (size_t)k * be->max_tok;
}

/* Arrays of max_seqs ints a chained draft step's metadata has (chain_meta). */
#define CHAIN_ARRAYS 10

#define SP_ALLOC(ptr, type, count)                                                                 \
    do {                                                                                           \
        size_t n_ = (size_t)(count) * sizeof(type);                                                \
        if (!((ptr) = (type *)tl_gpu_malloc(n_)))                                                  \
            return tl_errf(err, errlen, TL_ERR_NOMEM,                                              \
                           "cudaMalloc of %zu bytes for speculative decoding failed (%s)", n_,     \
                           #ptr);                                                                  \
    } while (0)

/* TL_CUDA_SPEC_CHAIN (0, the default until a GPU has run test_mtp_chain_* and measured it: off;
 * 1: eager; 2: graphs) and, when on, the chain's buffers (cb_spec). */
static int chain_alloc(cuda_be *be, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    const char *ch = getenv("TL_CUDA_SPEC_CHAIN");
    sp->chain_mode = ch && *ch ? TL_MAX(0, TL_MIN(2, atoi(ch))) : 0;
    if (!sp->chain_mode) return 0;
    size_t S = be->max_seqs, R = (size_t)sp->law_rows;
    SP_ALLOC(sp->d_chain, int32_t, (size_t)sp->K * CHAIN_ARRAYS * S);
    SP_ALLOC(sp->d_ctl, tl_gpu_chain, S);
    if (cudaMallocHost(&sp->h_chain, (size_t)sp->K * CHAIN_ARRAYS * S * 4) != cudaSuccess ||
        cudaMallocHost(&sp->h_ctl, S * sizeof(tl_gpu_chain)) != cudaSuccess ||
        cudaMallocHost(&sp->h_law, R * sizeof(tl_law)) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_NOMEM, "speculative decoding: pinned memory");
    return 0;
}

/* At open, after the activations and before the KV pool (the weights made be->sp). */
int cb_spec_alloc(cuda_be *be, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    const tl_config *c = &be->cfg;
    size_t D = c->n_embd, T = be->max_tok, S = be->max_seqs, K1 = sp->K + 1, V = c->n_vocab;
    SP_ALLOC(sp->hid, float, (T + S * K1 + S) * D);
    /* finite from the start: a slot loaded from the prefix cache computes head rows (never used)
     * from ring rows nobody wrote */
    if (cudaMemset(sp->hid, 0, (T + S * K1 + S) * D * sizeof(float)) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "speculative decoding: cudaMemset failed");
    SP_ALLOC(sp->cat, float, T * 2 * D);
    SP_ALLOC(sp->eb, float, T *D);
    SP_ALLOC(sp->alog, float, S *K1 *V);
    const char *rv = getenv("TL_CUDA_SPEC_RECOMPUTE");
    sp->recompute = rv && atoi(rv) != 0;
    if (sp->recompute) {
        SP_ALLOC(sp->gdn, char, S *TL_MAX(cb_pc_snap_bytes(be), (size_t)1));
    } else if (be->n_gdn > 0) {
        size_t n = (size_t)be->n_gdn * S * sp->K;
        SP_ALLOC(sp->conv_ring, float, n * 3 * be->conv_dim);
        SP_ALLOC(sp->rec_ring, char, n * c->gdn_n_v_head * 128 * 128 * be->st_esz);
    }
    SP_ALLOC(sp->d_rpos, int32_t, S);
    if (cudaMallocHost(&sp->h_rpos, S * sizeof(int32_t)) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_NOMEM, "speculative decoding: pinned memory");
    for (size_t i = 0; i < S; i++) sp->h_rpos[i] = -1;
    if (cudaMemcpy(sp->d_rpos, sp->h_rpos, S * sizeof(int32_t), cudaMemcpyHostToDevice) !=
        cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "speculative decoding: upload failed");
    size_t mi = be->meta_ints + 4 * T, R = S * K1, li = (3 + TL_LAW_ADJ) * R;
    sp->law_rows = (int)R;
    SP_ALLOC(sp->d_meta, int32_t, mi);
    SP_ALLOC(sp->d_lp, tl_sample_params, R);
    SP_ALLOC(sp->d_li, int32_t, li);
    SP_ALLOC(sp->d_law, tl_law, R);
    SP_ALLOC(sp->d_lscr, float, tl_gpu_law_scratch_floats((int)R));
    if (cudaMallocHost(&sp->h_meta, mi * 4) != cudaSuccess ||
        cudaMallocHost(&sp->h_lp, R * sizeof(tl_sample_params)) != cudaSuccess ||
        cudaMallocHost(&sp->h_li, li * 4) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_NOMEM, "speculative decoding: pinned memory");
    if (cudaEventCreateWithFlags(&sp->meta_ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(sp->meta_ev, be->stream) != cudaSuccess)
        return tl_errf(err, errlen, TL_ERR_CUDA, "speculative decoding: event creation failed");
    sp->len = (int *)xcalloc(S, sizeof(int));
    sp->ok = (int *)xcalloc(S, sizeof(int));
    sp->vpos = (int *)xcalloc(S, sizeof(int));
    sp->vn = (int *)xcalloc(S, sizeof(int));
    sp->vtok = (int32_t *)xcalloc(S * K1, sizeof(int32_t));
    sp->vprompt = (int32_t *)xcalloc(S, sizeof(int32_t));
    sp->arow = (int *)xcalloc(S * K1, sizeof(int));
    sp->snap_ok = (int *)xcalloc((size_t)TL_MAX(be->pc_n_snap, 1), sizeof(int));
    for (size_t i = 0; i < S; i++) sp->ok[i] = 1;
    sp->tc_ok = be->pf_ok && (size_t)TL_MAX(be->val_dim, c->n_head * 256) >= 2 * D;
    return chain_alloc(be, err, errlen);
}

void cb_spec_free(cuda_be *be) {
    cb_spec *sp = be->sp;
    if (!sp) return;
    void *ds[] = {sp->hid,    sp->cat,       sp->eb,       sp->alog,    sp->gdn,
                  sp->d_meta, sp->conv_ring, sp->rec_ring, sp->d_rpos,  sp->d_lp,
                  sp->d_li,   sp->d_law,     sp->d_lscr,   sp->d_chain, sp->d_ctl};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) tl_gpu_free(ds[i]);
    if (sp->h_meta) cudaFreeHost(sp->h_meta);
    if (sp->h_lp) cudaFreeHost(sp->h_lp);
    if (sp->h_li) cudaFreeHost(sp->h_li);
    if (sp->h_rpos) cudaFreeHost(sp->h_rpos);
    for (int k = 0; k <= TL_MAX_SPEC; k++)
        for (int f = 0; f < 2; f++)
            if (sp->chain_g[k][f]) cudaGraphExecDestroy(sp->chain_g[k][f]);
    if (sp->h_chain) cudaFreeHost(sp->h_chain);
    if (sp->h_ctl) cudaFreeHost(sp->h_ctl);
    if (sp->h_law) cudaFreeHost(sp->h_law);
    if (sp->meta_ev) cudaEventDestroy(sp->meta_ev);
    free(sp->len), free(sp->ok), free(sp->vpos), free(sp->vn);
    free(sp->vtok), free(sp->vprompt), free(sp->arow), free(sp->snap_ok);
    free(sp);
    be->sp = NULL;
}

/* ====== In a forward ====== */

/* Before the micro-batches: what a verify entry's rollback needs (the positions whose GDN
 * states the kernels copy, or with TL_CUDA_SPEC_RECOMPUTE=1 the state saved and the tokens
 * kept); lengths. */
int cb_spec_begin(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    int K1 = sp->K + 1, rpos_set = 0;
    sp->n_alog = 0;
    for (int i = 0; i < n; i++) {
        int slot = e[i].slot;
        sp->vn[slot] = 0;
        if (sp->h_rpos[slot] >= 0) sp->h_rpos[slot] = -1, rpos_set = 1;
        if (e[i].all_logits || e[i].all_laws) {
            if (e[i].n_tok > K1)
                return tl_errf(err, errlen, TL_ERR_INVALID,
                               "entry %d: logits of %d tokens, at most %d (1 + draft tokens)", i,
                               e[i].n_tok, K1);
            if (sp->recompute)
                TRY(cb_state_copy(be, slot, sp->gdn + (size_t)slot * cb_pc_snap_bytes(be), 1));
            else if (e[i].n_tok > 1) /* copies after tokens 0 .. K - 1 */
                sp->h_rpos[slot] = e[i].pos, rpos_set = 1;
            sp->vpos[slot] = e[i].pos, sp->vn[slot] = e[i].n_tok, sp->vprompt[slot] = e[i].n_prompt;
            memcpy(sp->vtok + (size_t)slot * K1, e[i].tokens, sizeof(int32_t) * e[i].n_tok);
        }
        sp->len[slot] = e[i].pos + e[i].n_tok;
    }
    /* h_rpos may be rewritten here: the last upload from it finished at the previous forward's
     * final synchronize */
    if (rpos_set)
        CUDA_TRY(cudaMemcpyAsync(sp->d_rpos, sp->h_rpos, be->max_seqs * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, be->stream));
    return 0;
}

/* After the trunk's layers of one micro-batch (be->x holds its residual rows): the final norm of
 * every row, the LM head over the verify entries' rows, the head's rows, then the ring. */
int cb_spec_micro(cuda_be *be, const tl_fwd_entry *e, const void *segs_v, int n_seg, int tc) {
    const tl_mb_seg *segs = (const tl_mb_seg *)segs_v;
    cb_spec *sp = be->sp;
    const tl_config *c = &be->cfg;
    int D = c->n_embd, V = c->n_vocab, T = 0, ns, nr, na;
    for (int g = 0; g < n_seg; g++) T += segs[g].n;
    tl_gpu_stream st = cb_stream(be, 0);
    TRY(tl_gpu_rmsnorm(sp->hid, be->x, be->out_norm, NULL, T, D, c->rms_eps, &st));
    if (be->pc_n_snap) TRY(cb_spec_snap_rows(be, e, segs, n_seg));
    CUDA_TRY(cudaEventSynchronize(sp->meta_ev)); /* the previous upload has read h_meta */
    tl_spec_layout l = layout(be);
    tl_mb_meta m = cb_meta_at(be, sp->h_meta);
    int32_t *h = sp->h_meta;
    int nt =
        tl_spec_head_rows(&l, e, segs, n_seg, &m, extra(be, h, 0), extra(be, h, 1), extra(be, h, 2),
                          extra(be, h, 3), sp->arow, sp->n_alog, &ns, &nr, &na);
    CUDA_TRY(cudaMemcpyAsync(sp->d_meta, sp->h_meta, (be->meta_ints + 4 * (size_t)be->max_tok) * 4,
                             cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(cudaEventRecord(sp->meta_ev, be->stream));
    if (na > 0) { /* every verify token's logits (its hidden was normed above) */
        TRY(tl_gpu_copy_rows(sp->eb, NULL, sp->hid, extra(be, sp->d_meta, 3), na, D, &st));
        TRY(cb_lm_head(be, sp->alog + (size_t)sp->n_alog * V, sp->eb, sp->eb, NULL, na, tc));
        sp->n_alog += na;
    }
    if (nt > 0) {
        tl_mb_meta dm = cb_meta_at(be, sp->d_meta);
        TRY(cb_mtp_block(be, &dm, nt, ns, 0, tc && sp->tc_ok, 0, extra(be, sp->d_meta, 0)));
    }
    return tl_gpu_copy_rows(sp->hid, extra(be, sp->d_meta, 1), sp->hid, extra(be, sp->d_meta, 2),
                            nr, D, &st);
}

/* Law row j of a launch (tl_gpu_sample_law): logits row `row`, the counts of `slot` adjusted
 * by adj[0..n_adj) (v > 0: token v - 1 once more, v < 0: token -v - 1 once less). */
static void law_row(cb_spec *sp, int j, const tl_sample_params *p, int row, int slot,
                    const int32_t *adj, int n_adj) {
    size_t R = (size_t)sp->law_rows;
    tl_sample_params *q = &sp->h_lp[j];
    *q = *p;
    q->bias_ids = NULL, q->bias_vals = NULL, q->n_bias = 0, q->allow = NULL, q->n_logprobs = 0;
    sp->h_li[j] = row, sp->h_li[R + j] = slot;
    /* adj rows as tl_gpu_sample_law reads them: [row][TL_LAW_ADJ] after the 3 R ints */
    for (int a = 0; a < TL_LAW_ADJ; a++)
        sp->h_li[3 * R + (size_t)j * TL_LAW_ADJ + a] = a < n_adj ? adj[a] : 0;
}

/* The n staged rows (law_row) to the device, on the stream. The pinned staging is free: every
 * earlier upload from it finished at the synchronize that ends each draft call and forward. */
static int law_upload(cuda_be *be, int n) {
    cb_spec *sp = be->sp;
    size_t R = (size_t)sp->law_rows;
    CUDA_TRY(cudaMemcpyAsync(sp->d_lp, sp->h_lp, n * sizeof(tl_sample_params),
                             cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(cudaMemcpyAsync(sp->d_li, sp->h_li, (3 + TL_LAW_ADJ) * R * sizeof(int32_t),
                             cudaMemcpyHostToDevice, be->stream));
    return 0;
}

/* The laws of the first n uploaded rows (logits rows of `logits`) into laws (device). */
static int law_run(cuda_be *be, tl_law *laws, int n, const float *logits) {
    cb_spec *sp = be->sp;
    size_t R = (size_t)sp->law_rows;
    tl_gpu_stream st = cb_stream(be, 0);
    return tl_gpu_sample_law(laws, logits, be->cfg.n_vocab, be->n_valid, sp->d_li, sp->d_lp,
                             sp->h_lp, be->d_counts, be->d_cbits, sp->d_li + R, sp->d_li + 3 * R,
                             sp->d_lscr, n, &st);
}

/* The laws of the n staged rows into sp->d_law. */
static int law_launch(cuda_be *be, int n, const float *logits) {
    TRY(law_upload(be, n));
    return law_run(be, be->sp->d_law, n, logits);
}

/* The verify entries' laws (all_laws): row k of entry i counts its tokens 0..k (the forward fed
 * all of them, so the later ones are taken out). Staged, launched and copied to the host. */
static int verify_laws(cuda_be *be, const tl_fwd_entry *e, int n) {
    cb_spec *sp = be->sp;
    int K1 = sp->K + 1, nl = 0;
    for (int i = 0; i < n; i++) {
        if (!e[i].all_laws) continue;
        for (int k = 0; k < e[i].n_tok; k++) {
            int32_t adj[TL_LAW_ADJ], na = 0;
            for (int j = k + 1; j < e[i].n_tok; j++) adj[na++] = -(e[i].tokens[j] + 1);
            law_row(sp, nl++, e[i].law_sample, sp->arow[(size_t)i * K1 + k], e[i].slot, adj, na);
        }
    }
    if (!nl) return 0;
    TRY(law_launch(be, nl, sp->alog));
    for (int i = 0, r = 0; i < n; i++) {
        if (!e[i].all_laws) continue;
        CUDA_TRY(cudaMemcpyAsync(e[i].all_laws, sp->d_law + r, e[i].n_tok * sizeof(tl_law),
                                 cudaMemcpyDeviceToHost, be->stream));
        r += e[i].n_tok;
    }
    return 0;
}

/* Before the step's final synchronize: each verify entry's logits rows or laws to the host. */
int cb_spec_end(cuda_be *be, const tl_fwd_entry *e, int n) {
    cb_spec *sp = be->sp;
    size_t V = be->cfg.n_vocab;
    int K1 = sp->K + 1;
    TRY(verify_laws(be, e, n));
    for (int i = 0; i < n; i++) {
        if (!e[i].all_logits) continue;
        for (int k = 0; k < e[i].n_tok;) { /* runs of consecutive rows in one copy */
            int r0 = sp->arow[(size_t)i * K1 + k], m = 1;
            while (k + m < e[i].n_tok && sp->arow[(size_t)i * K1 + k + m] == r0 + m) m++;
            CUDA_TRY(cudaMemcpyAsync(e[i].all_logits + k * V, sp->alog + (size_t)r0 * V,
                                     sizeof(float) * V * m, cudaMemcpyDeviceToHost, be->stream));
            k += m;
        }
    }
    return 0;
}

/* The step could not take its pages: pages a draft took past a slot's length go back, so the
 * slot holds exactly those of its tokens again (no session changed, backend.h). */
void cb_spec_unreserve(cuda_be *be, const tl_fwd_entry *e, int n) {
    for (int i = 0; i < n; i++) tl_kv_pages_truncate(&be->pages, e[i].slot, e[i].pos);
}

/* ====== The backend's ops ====== */

static int op_begin(cuda_be *be, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (be->lost)
        return tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the GPU was lost after an earlier error");
    if (cb_bind(be))
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot make CUDA device %d current", be->device);
    return 0;
}

/* A failed op: a sticky CUDA error loses the device (as a failed forward does). */
static int op_end(cuda_be *be, int st, const char *what, char *err, size_t errlen) {
    if (st == TL_ERR_CUDA && cb_device_broken(be)) be->lost = 1;
    if (st && err && errlen && !err[0]) tl_errf(err, errlen, st, "%s: %s", what, tl_status_str(st));
    return st;
}

static int cb_spec_init(tl_backend *b, int max_draft, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (!be->sp)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "the CUDA backend was opened without the MTP head "
                       "(tl_cuda_params.spec_tokens 0)");
    if (max_draft < 1 || max_draft > be->sp->K)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "spec_init: %d draft tokens, the backend was opened for 1..%d", max_draft,
                       be->sp->K);
    be->sp->on = 1;
    return 0;
}

static int cb_spec_ready(tl_backend *b, int slot) {
    cuda_be *be = (cuda_be *)b->impl;
    cb_spec *sp = be->sp;
    return sp && sp->on && slot >= 0 && slot < be->max_seqs && sp->ok[slot] && sp->len[slot] > 0;
}

/* What every draft op checks first: speculation on, 1 .. max_seqs entries. */
static int draft_op_ok(const cuda_be *be, int n, const char *op, char *err, size_t errlen) {
    if (!be->sp || !be->sp->on)
        return tl_errf(err, errlen, TL_ERR_INVALID, "%s: speculative decoding is not on", op);
    if (n < 1 || n > be->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "%s: %d entries", op, n);
    return 0;
}

/* Entry i's slot, slot[i] (slot[0 .. i) the earlier entries'): not repeated, the head's rows up
 * to its length, and its last draft step's row (position len - 1 + last) inside the context;
 * *need = len + last, the tokens its pages must hold. */
static int draft_slot_ok(const cuda_be *be, const int *slot, int i, int last, const char *op,
                         int *need, char *err, size_t errlen) {
    const cb_spec *sp = be->sp;
    int s = slot[i];
    for (int j = 0; j < i; j++)
        if (slot[j] == s) return tl_errf(err, errlen, TL_ERR_INVALID, "%s: slot %d twice", op, s);
    if (!sp->ok[s] || sp->len[s] < 1)
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "%s: slot %d has no MTP rows up to its length %d", op, s, sp->len[s]);
    *need = sp->len[s] + last;
    if (*need > be->max_ctx)
        return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                       "%s: slot %d at %d tokens, draft step %d is past the context of %d", op, s,
                       sp->len[s], last, be->max_ctx);
    return 0;
}

static int check_drafts(cuda_be *be, const tl_draft_entry *d, int n, int *slot, int *need,
                        char *err, size_t errlen) {
    TRY(draft_op_ok(be, n, "draft", err, errlen));
    for (int i = 0; i < n; i++) {
        int s = d[i].slot;
        if (s < 0 || s >= be->max_seqs || d[i].step < 0 || d[i].step >= be->sp->K ||
            (!d[i].logits && !d[i].law) || d[i].token < 0 || d[i].token >= be->cfg.n_vocab ||
            (d[i].law && (!d[i].sample || !d[i].chain || !tl_law_ok(d[i].sample))))
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "draft %d: bad slot %d / step %d / token %d", i, s, d[i].step,
                           d[i].token);
        slot[i] = s;
        TRY(draft_slot_ok(be, slot, i, d[i].step, "draft", &need[i], err, errlen));
    }
    return 0;
}

/* The laws of the draft entries that ask for one (row i of be->logits is entry i's): the slot's
 * counts hold its tokens before its length; the chain's tokens (the sampled one, the drafts
 * before this step) are counted in as generated. Copied to the host. */
static int draft_laws(cuda_be *be, const tl_draft_entry *d, int n) {
    cb_spec *sp = be->sp;
    int nl = 0;
    for (int i = 0; i < n; i++) {
        if (!d[i].law) continue;
        int32_t adj[TL_LAW_ADJ];
        for (int a = 0; a <= d[i].step; a++) adj[a] = d[i].chain[a] + 1;
        law_row(sp, nl++, d[i].sample, i, d[i].slot, adj, d[i].step + 1);
    }
    if (!nl) return 0;
    TRY(law_launch(be, nl, be->logits));
    for (int i = 0, r = 0; i < n; i++)
        if (d[i].law)
            CUDA_TRY(cudaMemcpyAsync(d[i].law, sp->d_law + r++, sizeof(tl_law),
                                     cudaMemcpyDeviceToHost, be->stream));
    return 0;
}

/* One head step for n entries: the whole block (attention over the head's rows 0 .. pos of the
 * slot, MoE), mtp.norm into the chain rows, the LM head, the logits to the host. */
static int draft_impl(cuda_be *be, const tl_draft_entry *d, int n, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    int slot[CB_MAX_SEQS], need[CB_MAX_SEQS];
    size_t V = be->cfg.n_vocab;
    TRY(check_drafts(be, d, n, slot, need, err, errlen));
    TRY(cb_kv_grow(be, slot, need, n, err, errlen)); /* rows past the length: the verify's pages */
    CUDA_TRY(cudaEventSynchronize(sp->meta_ev));
    int len[CB_MAX_SEQS], step[CB_MAX_SEQS];
    int32_t tok[CB_MAX_SEQS];
    for (int i = 0; i < n; i++) len[i] = sp->len[slot[i]], step[i] = d[i].step, tok[i] = d[i].token;
    tl_spec_layout l = layout(be);
    tl_mb_meta m = cb_meta_at(be, sp->h_meta);
    tl_spec_draft_rows(&l, slot, len, step, tok, n, &m, extra(be, sp->h_meta, 0),
                       extra(be, sp->h_meta, 1));
    CUDA_TRY(cudaMemcpyAsync(sp->d_meta, sp->h_meta, (be->meta_ints + 4 * (size_t)be->max_tok) * 4,
                             cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(cudaEventRecord(sp->meta_ev, be->stream));
    int tc = be->pf_ok && sp->tc_ok && be->tc_min > 0 && n >= be->tc_min;
    tl_mb_meta dm = cb_meta_at(be, sp->d_meta);
    TRY(cb_mtp_block(be, &dm, n, n, 1, tc, CB_DECODE_SPLIT, extra(be, sp->d_meta, 0)));
    tl_gpu_stream st = cb_stream(be, 0);
    TRY(tl_gpu_rmsnorm(be->xo, be->x, sp->norm, NULL, n, be->cfg.n_embd, be->cfg.rms_eps, &st));
    TRY(tl_gpu_copy_rows(sp->hid, extra(be, sp->d_meta, 1), be->xo, NULL, n, be->cfg.n_embd, &st));
    TRY(cb_lm_head(be, be->logits, be->xo, be->xo, NULL, n, tc));
    TRY(draft_laws(be, d, n));
    for (int i = 0; i < n; i++)
        if (!d[i].law)
            CUDA_TRY(cudaMemcpyAsync(d[i].logits, be->logits + (size_t)i * V, sizeof(float) * V,
                                     cudaMemcpyDeviceToHost, be->stream));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    return 0;
}

static int cb_draft(tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    TRY(op_begin(be, err, errlen));
    return op_end(be, draft_impl(be, d, n, err, errlen), "CUDA draft step", err, errlen);
}

/* ====== Drafts chained on the device (backend.h draft_chain) ======
 * Entries sorted by k, most first, so step j runs the first n_j of them (those with k > j):
 * each step is draft_impl's block, norm, LM head and law for n_j rows, then tl_gpu_draft_pick
 * draws the drafts and feeds them to step j + 1's tokens and penalty adjustments. The metadata
 * of every step goes up in one copy, the laws and picks come back in one, one synchronize. */

/* Step j's metadata views (device or host base): arrays of max_seqs ints, CHAIN_ARRAYS a step:
 * the tl_mb_meta ones but out_rows, then the hiddens' source rows and the chain rows. */
static tl_mb_meta chain_meta(const cuda_be *be, int32_t *base, int j, int32_t **src,
                             int32_t **cdst) {
    size_t S = (size_t)be->max_seqs;
    int32_t *a = base + (size_t)j * CHAIN_ARRAYS * S;
    tl_mb_meta m = {a,         a + S,     a + 2 * S, a + 3 * S, a + 4 * S,
                    a + 5 * S, a + 6 * S, a + 7 * S, NULL};
    *src = a + 8 * S, *cdst = a + 9 * S;
    return m;
}

static int check_chain(cuda_be *be, const tl_chain_entry *d, int n, char *err, size_t errlen) {
    int slot[CB_MAX_SEQS], need;
    TRY(draft_op_ok(be, n, "draft_chain", err, errlen));
    for (int i = 0; i < n; i++) {
        int s = d[i].slot;
        if (s < 0 || s >= be->max_seqs || d[i].k < 1 || d[i].k > be->sp->K || d[i].token < 0 ||
            d[i].token >= be->cfg.n_vocab || !d[i].law || !d[i].drafts || !d[i].sample ||
            !tl_law_ok(d[i].sample))
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "draft_chain %d: bad slot %d / k %d / token %d", i, s, d[i].k,
                           d[i].token);
        slot[i] = s;
        TRY(draft_slot_ok(be, slot, i, d[i].k - 1, "draft_chain", &need, err, errlen));
    }
    return 0;
}

/* The host side of a chain: entries in order of k (ord), their pages, every step's metadata and
 * the control rows, the law rows (penalty adjustment: the sampled token), uploaded. */
static int chain_stage(cuda_be *be, const tl_chain_entry *d, int n, int *ord, char *err,
                       size_t errlen) {
    cb_spec *sp = be->sp;
    int slot[CB_MAX_SEQS], len[CB_MAX_SEQS], need[CB_MAX_SEQS], step[CB_MAX_SEQS];
    int32_t tok[CB_MAX_SEQS];
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort, k descending, stable */
        for (int j = i; j > 0 && d[ord[j]].k > d[ord[j - 1]].k; j--) {
            int t = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        const tl_chain_entry *x = &d[ord[i]];
        slot[i] = x->slot, len[i] = sp->len[x->slot], tok[i] = x->token;
        need[i] = len[i] + x->k - 1;
        tl_gpu_chain *c = &sp->h_ctl[i];
        memset(c, 0, sizeof *c);
        memcpy(c->u, x->u, sizeof c->u);
        c->k = x->k, c->greedy = x->greedy, c->tok = x->token, c->live = 1;
        int32_t adj = x->token + 1;
        law_row(sp, i, x->sample, i, x->slot, &adj, 1);
    }
    TRY(cb_kv_grow(be, slot, need, n, err, errlen));
    tl_spec_layout l = layout(be);
    for (int j = 0, nj = n; j < d[ord[0]].k; j++) {
        while (d[ord[nj - 1]].k <= j) nj--;
        int32_t *src, *cdst;
        tl_mb_meta m = chain_meta(be, sp->h_chain, j, &src, &cdst);
        for (int i = 0; i < nj; i++) step[i] = j;
        tl_spec_draft_rows(&l, slot, len, step, tok, nj, &m, src, cdst);
    }
    size_t S = (size_t)be->max_seqs;
    CUDA_TRY(cudaMemcpyAsync(sp->d_chain, sp->h_chain,
                             (size_t)d[ord[0]].k * CHAIN_ARRAYS * S * sizeof(int32_t),
                             cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(cudaMemcpyAsync(sp->d_ctl, sp->h_ctl, n * sizeof(tl_gpu_chain), cudaMemcpyHostToDevice,
                             be->stream));
    return law_upload(be, n);
}

/* Step j of a staged chain over its first nj entries (n in all). */
static int chain_step(cuda_be *be, int j, int nj, int n, int last) {
    cb_spec *sp = be->sp;
    int32_t *src, *cdst, *nsrc, *ncdst, *next_tok = NULL;
    tl_mb_meta m = chain_meta(be, sp->d_chain, j, &src, &cdst);
    if (!last) next_tok = chain_meta(be, sp->d_chain, j + 1, &nsrc, &ncdst).tokens;
    int tc = be->pf_ok && sp->tc_ok && be->tc_min > 0 && nj >= be->tc_min;
    TRY(cb_mtp_block(be, &m, nj, nj, 1, tc, CB_DECODE_SPLIT, src));
    tl_gpu_stream st = cb_stream(be, 0);
    TRY(tl_gpu_rmsnorm(be->xo, be->x, sp->norm, NULL, nj, be->cfg.n_embd, be->cfg.rms_eps, &st));
    TRY(tl_gpu_copy_rows(sp->hid, cdst, be->xo, NULL, nj, be->cfg.n_embd, &st));
    TRY(cb_lm_head(be, be->logits, be->xo, be->xo, NULL, nj, tc));
    tl_law *laws = sp->d_law + (size_t)j * n;
    TRY(law_run(be, laws, nj, be->logits));
    return tl_gpu_draft_pick(sp->d_ctl, laws, j, nj, next_tok, sp->d_li + 3 * (size_t)sp->law_rows,
                             &st);
}

/* Every step of a staged chain whose entries want k[ord[i]] drafts. */
static int chain_steps(cuda_be *be, const tl_chain_entry *d, int n, const int *ord) {
    int K = d[ord[0]].k;
    for (int j = 0, nj = n; j < K; j++) {
        while (d[ord[nj - 1]].k <= j) nj--;
        TRY(chain_step(be, j, nj, n, j + 1 == K));
    }
    return 0;
}

/* The steps of a one-entry chain of k drafts as a graph (TL_CUDA_SPEC_CHAIN=2), captured the
 * first time for each k and law parts count (the only host choices inside). */
static int chain_graph(cuda_be *be, const tl_chain_entry *d, const int *ord, char *err,
                       size_t errlen) {
    cb_spec *sp = be->sp;
    int few = tl_gpu_law_parts(sp->h_lp, 1) != tl_gpu_law_parts(NULL, 1);
    cudaGraphExec_t *ge = &sp->chain_g[d[0].k][few];
    if (!*ge) {
        cudaGraph_t g;
        CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
        int st = chain_steps(be, d, 1, ord);
        cudaError_t ce = cudaStreamEndCapture(be->stream, &g);
        if (st || ce != cudaSuccess)
            return tl_errf(err, errlen, TL_ERR_CUDA, "draft chain graph capture failed (%s)",
                           st ? tl_status_str(st) : cudaGetErrorString(ce));
        ce = cudaGraphInstantiate(ge, g, 0);
        cudaGraphDestroy(g);
        if (ce != cudaSuccess) {
            *ge = NULL;
            return tl_errf(err, errlen, TL_ERR_CUDA, "draft chain graph: %s",
                           cudaGetErrorString(ce));
        }
    }
    CUDA_TRY(cudaGraphLaunch(*ge, be->stream));
    return 0;
}

static int chain_impl(cuda_be *be, tl_chain_entry *d, int n, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    int ord[CB_MAX_SEQS];
    TRY(check_chain(be, d, n, err, errlen));
    TRY(chain_stage(be, d, n, ord, err, errlen));
    int K = d[ord[0]].k;
    if (sp->chain_mode == 2 && n == 1 && !be->graphs_off && !be->prof)
        TRY(chain_graph(be, d, ord, err, errlen));
    else
        TRY(chain_steps(be, d, n, ord));
    CUDA_TRY(cudaMemcpyAsync(sp->h_ctl, sp->d_ctl, n * sizeof(tl_gpu_chain), cudaMemcpyDeviceToHost,
                             be->stream));
    CUDA_TRY(cudaMemcpyAsync(sp->h_law, sp->d_law, (size_t)K * n * sizeof(tl_law),
                             cudaMemcpyDeviceToHost, be->stream));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    for (int i = 0; i < n; i++) {
        tl_chain_entry *x = &d[ord[i]];
        const tl_gpu_chain *c = &sp->h_ctl[i];
        x->n_drafted = c->n_drafted, x->n_draws = c->n_draws;
        for (int j = 0; j < c->n_drafted; j++) {
            x->drafts[j] = c->drafts[j];
            x->law[j] = sp->h_law[(size_t)j * n + i];
        }
    }
    return 0;
}

static int cb_draft_chain(tl_backend *b, tl_chain_entry *d, int n, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    TRY(op_begin(be, err, errlen));
    return op_end(be, chain_impl(be, d, n, err, errlen), "CUDA draft chain", err, errlen);
}

/* The slot's GDN state := the copies after the verify's token j (every GDN layer: one strided
 * copy for the recurrent states, one for the conv states), on the stream: the next call's
 * kernels see it, and an error surfaces at its synchronize. */
static int ring_restore(cuda_be *be, int slot, int j) {
    cb_spec *sp = be->sp;
    if (be->n_gdn == 0) return 0;
    size_t rec = (size_t)be->cfg.gdn_n_v_head * 128 * 128 * be->st_esz;
    size_t conv = 3 * (size_t)be->conv_dim * sizeof(float), S = be->max_seqs, K = sp->K;
    const char *r_src = sp->rec_ring + ((size_t)slot * K + j) * rec;
    const char *c_src = (const char *)sp->conv_ring + ((size_t)slot * K + j) * conv;
    CUDA_TRY(cudaMemcpy2DAsync(be->rec_st + slot * rec, S * rec, r_src, S * K * rec, rec, be->n_gdn,
                               cudaMemcpyDeviceToDevice, be->stream));
    CUDA_TRY(cudaMemcpy2DAsync((char *)be->conv_st + slot * conv, S * conv, c_src, S * K * conv,
                               conv, be->n_gdn, cudaMemcpyDeviceToDevice, be->stream));
    return 0;
}

/* The slot back to n_keep tokens: its GDN state the copy the verify's kernels wrote after token
 * n_keep - 1 (TL_CUDA_SPEC_RECOMPUTE=1: the state from before the verify, the accepted tokens run
 * again), the pages past n_keep returned; the KV below n_keep, the head's rows below n_keep - 1
 * and the hidden of n_keep - 1 are the verify's own; the rejected tokens leave the penalty
 * counts. */
static int rollback_impl(cuda_be *be, int slot, int n_keep, char *err, size_t errlen) {
    cb_spec *sp = be->sp;
    if (!sp || !sp->on)
        return tl_errf(err, errlen, TL_ERR_INVALID, "rollback: speculative decoding is not on");
    if (slot < 0 || slot >= be->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "rollback: bad slot %d", slot);
    int v0 = sp->vpos[slot], vn = sp->vn[slot];
    if (!vn || n_keep <= v0 || n_keep > v0 + vn || sp->len[slot] != v0 + vn)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "rollback: slot %d to %d tokens, but its verify covered %d..%d", slot,
                       n_keep, v0, v0 + vn);
    sp->vn[slot] = 0;
    if (n_keep == v0 + vn) return 0;
    /* the counts hold every verify token: the rejected ones out (all of them when recomputing,
     * whose forward counts the kept ones in again); verify tokens are all generated */
    int32_t *vt = sp->vtok + (size_t)slot * (sp->K + 1);
    int out0 = sp->recompute ? 0 : n_keep - v0;
    tl_gpu_stream st = cb_stream(be, 0);
    TRY(tl_gpu_penalty_sub(be->d_counts, be->cfg.n_vocab, vt + out0, slot, vn - out0, &st));
    if (sp->recompute) {
        TRY(cb_state_copy(be, slot, sp->gdn + (size_t)slot * cb_pc_snap_bytes(be), 0));
        tl_fwd_entry x;
        memset(&x, 0, sizeof x);
        x.slot = slot, x.pos = v0, x.tokens = sp->vtok + (size_t)slot * (sp->K + 1);
        x.n_tok = n_keep - v0, x.n_prompt = sp->vprompt[slot];
        TRY(cb_forward_impl(be, &x, 1, err, errlen));
    } else {
        TRY(ring_restore(be, slot, n_keep - v0 - 1));
        sp->len[slot] = n_keep;
    }
    tl_kv_pages_truncate(&be->pages, slot, n_keep);
    return 0;
}

static int cb_rollback(tl_backend *b, int slot, int n_keep, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    TRY(op_begin(be, err, errlen));
    return op_end(be, rollback_impl(be, slot, n_keep, err, errlen), "CUDA rollback", err, errlen);
}

/* A slot was reset (n_tok 0) or loaded from the prefix cache without a hidden (no drafting). */
void cb_spec_slot(cuda_be *be, int slot, int n_tok) {
    cb_spec *sp = be->sp;
    if (!sp) return;
    sp->len[slot] = n_tok, sp->ok[slot] = n_tok == 0, sp->vn[slot] = 0;
}

/* ====== Prefix cache (docs/architecture.md §3.6) ======
 * A snapshot of n tokens keeps, after the GDN state, the final-normed hidden of position n - 1
 * (f32 [n_embd]); snap_ok says it was written by a slot whose head rows cover it. The head's KV
 * is layer n_attn of the pool pages, shared or copied with the others. */

static float *snap_hid(cuda_be *be, int snap) {
    return (float *)(be->pc_snap + (size_t)snap * cb_pc_snap_bytes(be) + cb_pc_hid_off(be));
}

/* After a step that left the slot at n_tok tokens: its ring row of n_tok - 1 into the snapshot. */
int cb_spec_snap_save(cuda_be *be, int slot, int snap, int n_tok) {
    cb_spec *sp = be->sp;
    if (!sp) return 0;
    sp->snap_ok[snap] = sp->ok[slot] && sp->len[slot] == n_tok;
    if (!sp->snap_ok[snap]) return 0;
    tl_spec_layout l = layout(be);
    size_t D = (size_t)be->cfg.n_embd;
    const float *src = sp->hid + (size_t)tl_spec_ring_row(&l, slot, n_tok - 1) * D;
    CUDA_TRY(cudaMemcpyAsync(snap_hid(be, snap), src, D * sizeof(float), cudaMemcpyDeviceToDevice,
                             be->stream));
    return 0;
}

/* A load of n_tok tokens: with the snapshot's hidden, into the slot's ring row of n_tok - 1 (the
 * head's rows 0 .. n_tok - 2 came with the pages): the slot drafts; else it does not. */
int cb_spec_snap_load(cuda_be *be, int slot, int snap, int n_tok) {
    cb_spec *sp = be->sp;
    if (!sp) return 0;
    cb_spec_slot(be, slot, n_tok);
    if (!sp->snap_ok[snap]) return 0;
    tl_spec_layout l = layout(be);
    size_t D = (size_t)be->cfg.n_embd;
    float *dst = sp->hid + (size_t)tl_spec_ring_row(&l, slot, n_tok - 1) * D;
    CUDA_TRY(cudaMemcpyAsync(dst, snap_hid(be, snap), D * sizeof(float), cudaMemcpyDeviceToDevice,
                             be->stream));
    sp->ok[slot] = 1;
    return 0;
}

/* In a forward, after the final norm of a micro-batch (sp->hid rows 0 .. T - 1, segment after
 * segment): the row of position snap_at - 1 of each entry whose snapshot point is in it. */
int cb_spec_snap_rows(cuda_be *be, const tl_fwd_entry *e, const void *segs_v, int n_seg) {
    const tl_mb_seg *segs = (const tl_mb_seg *)segs_v;
    cb_spec *sp = be->sp;
    size_t D = (size_t)be->cfg.n_embd;
    for (int g = 0, row0 = 0; g < n_seg; row0 += segs[g].n, g++) {
        const tl_fwd_entry *en = &e[segs[g].entry];
        int p0 = en->pos + segs[g].start, k = en->snap_at - 1 - p0;
        if (!en->snap_at || k < 0 || k >= segs[g].n) continue;
        sp->snap_ok[en->snap] = sp->ok[en->slot];
        if (!sp->snap_ok[en->snap]) continue;
        CUDA_TRY(cudaMemcpyAsync(snap_hid(be, en->snap), sp->hid + (size_t)(row0 + k) * D,
                                 D * sizeof(float), cudaMemcpyDeviceToDevice, be->stream));
    }
    return 0;
}

/* Always: without the head (tl_cuda_params.spec_tokens 0) spec_init says so and the others
 * refuse, so a caller learns why rather than finding NULL ops. */
void cb_spec_attach(cuda_be *be, tl_backend *b) {
    (void)be;
    b->spec_init = cb_spec_init;
    b->spec_ready = cb_spec_ready;
    b->draft = cb_draft;
    b->draft_chain = be->sp && be->sp->chain_mode ? cb_draft_chain : NULL;
    b->rollback = cb_rollback;
    b->can_law = be->sp != NULL;
}
