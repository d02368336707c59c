/* CPU reference backend: one cpu_state per slot, entries run one after another through
 * cpu_forward (the oracle). Used by CI end to end and wherever no GPU is present. Its KV pool
 * (backend.h) is bookkeeping over kv_pages.c: with kv_tokens set, a real limit on the tokens
 * all slots hold together, as on the GPU; without, one page of max_ctx per slot. */
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "cpu/cpu.h"
#include "engine/backend.h"
#include "engine/kv_pages.h"

typedef struct {
    const tl_model *m;
    int max_seqs;
    cpu_state *st;
    tl_kv_pages pages;
    /* prefix cache storage (backend.h): pages [n_pc_page][attn layer][TL_PC_PAGE][kv row] K
     * then V, f32; snapshots [n_pc_snap][gdn layer] conv then recurrent state, f32 */
    float *pc_pages, *pc_snaps;
    int n_pc_page, n_pc_snap;
    size_t kv_row;        /* floats of one position's K (or V) of one layer */
    size_t conv_n, rec_n; /* floats of one layer's conv / recurrent state */
    int n_attn, n_gdn;
} cpu_backend;

static void cpu_free(cpu_backend *c, int n_state) {
    for (int i = 0; i < n_state; i++) cpu_state_free(&c->st[i]);
    tl_kv_pages_free(&c->pages);
    free(c->pc_pages);
    free(c->pc_snaps);
    free(c->st);
    free(c);
}

static void cpu_close(tl_backend *b) {
    cpu_backend *c = b->impl;
    cpu_free(c, c->max_seqs);
    free(b);
}

static int cpu_reset_slot(tl_backend *b, int slot) {
    cpu_backend *c = b->impl;
    if (slot < 0 || slot >= c->max_seqs) return TL_ERR_INVALID;
    tl_kv_pages_release(&c->pages, slot);
    cpu_state_reset(&c->st[slot], &c->m->cfg);
    return TL_OK;
}

static void cpu_kv_stats(tl_backend *b, tl_kv_stats *out) {
    const tl_kv_pages *p = &((cpu_backend *)b->impl)->pages;
    out->page_tokens = p->page_tokens;
    out->pages_total = p->n_page;
    out->pages_free = p->n_free;
    out->pages_per_seq = p->max_pages;
}

/* Every entry's position is checked, then the pages of the whole step are taken (all or
 * nothing: TL_ERR_CONTEXT_FULL changes no slot), then the entries run. */
static int cpu_fwd(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    int slot_stack[64], len_stack[64];
    int *slot = n <= 64 ? slot_stack : malloc(sizeof(int) * (size_t)n);
    int *len = n <= 64 ? len_stack : malloc(sizeof(int) * (size_t)n);
    int rc = slot && len ? 0 : tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        cpu_state *st = &c->st[e[i].slot];
        if (st->n_past != e[i].pos)
            rc = tl_errf(err, errlen, TL_ERR_INTERNAL, "slot %d holds %d tokens, step expects %d",
                         e[i].slot, st->n_past, e[i].pos);
        slot[i] = e[i].slot, len[i] = e[i].pos + e[i].n_tok;
    }
    if (!rc) rc = tl_kv_pages_reserve(&c->pages, slot, len, n, NULL, err, errlen);
    if (slot != slot_stack) free(slot);
    if (len != len_stack) free(len);
    for (int i = 0; i < n && !rc; i++) {
        rc = cpu_forward(c->m, &c->st[e[i].slot], e[i].tokens, e[i].n_tok, e[i].logits, NULL);
        if (rc) rc = tl_errf(err, errlen, rc, "cpu forward: %s", tl_status_str(rc));
    }
    return rc;
}

/* ====== Prefix cache storage (backend.h): plain copies between a slot and the cache. ====== */

static int cpu_cache_alloc(tl_backend *b, int n_page, int n_snap, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    if (c->pc_pages) return tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache allocated twice");
    c->pc_pages = malloc((size_t)n_page * b->pc_page_bytes);
    c->pc_snaps = malloc((size_t)n_snap * b->pc_snap_bytes);
    if (!c->pc_pages || !c->pc_snaps) {
        free(c->pc_pages), free(c->pc_snaps);
        c->pc_pages = c->pc_snaps = NULL;
        return tl_errf(err, errlen, TL_ERR_NOMEM,
                       "out of memory for the prefix cache (%d pages, %d snapshots)", n_page,
                       n_snap);
    }
    c->n_pc_page = n_page, c->n_pc_snap = n_snap;
    return 0;
}

/* Copies positions [p0, p1) of every attention layer between slot state st and cache page pg
 * (rows p0 % TL_PC_PAGE on); to_cache picks the direction. */
static void copy_page(cpu_backend *c, cpu_state *st, int pg, int p0, int p1, int to_cache) {
    const tl_config *cfg = &c->m->cfg;
    float *page = c->pc_pages + (size_t)pg * (2 * c->n_attn * TL_PC_PAGE * c->kv_row);
    size_t n = (size_t)(p1 - p0) * c->kv_row, r0 = (size_t)(p0 % TL_PC_PAGE) * c->kv_row;
    for (int il = 0, a = 0; il < cfg->n_layer; il++) {
        if (cfg->layer_kind[il] != TL_LAYER_ATTN) continue;
        float *pk = page + (size_t)(2 * a) * TL_PC_PAGE * c->kv_row + r0;
        float *pv = pk + (size_t)TL_PC_PAGE * c->kv_row;
        float *sk = st->kv_k[il] + (size_t)p0 * c->kv_row,
              *sv = st->kv_v[il] + (size_t)p0 * c->kv_row;
        if (to_cache)
            memcpy(pk, sk, n * sizeof(float)), memcpy(pv, sv, n * sizeof(float));
        else
            memcpy(sk, pk, n * sizeof(float)), memcpy(sv, pv, n * sizeof(float));
        a++;
    }
}

static void copy_snap(cpu_backend *c, cpu_state *st, int sn, int to_cache) {
    const tl_config *cfg = &c->m->cfg;
    float *p = c->pc_snaps + (size_t)sn * c->n_gdn * (c->conv_n + c->rec_n);
    for (int il = 0; il < cfg->n_layer; il++) {
        if (cfg->layer_kind[il] == TL_LAYER_ATTN) continue;
        if (to_cache)
            memcpy(p, st->conv[il], c->conv_n * 4),
                memcpy(p + c->conv_n, st->rec[il], c->rec_n * 4);
        else
            memcpy(st->conv[il], p, c->conv_n * 4),
                memcpy(st->rec[il], p + c->conv_n, c->rec_n * 4);
        p += c->conv_n + c->rec_n;
    }
}

static int check_io(const cpu_backend *c, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    int bad = slot < 0 || slot >= c->max_seqs || io->n_tok <= 0 || io->snap < 0 ||
              io->snap >= c->n_pc_snap || io->n_pages != TL_CEIL_DIV(io->n_tok, TL_PC_PAGE) ||
              io->n_tok > c->st[0].max_ctx;
    for (int k = 0; k < io->n_pages && !bad; k++) bad = io->page[k] >= c->n_pc_page;
    return bad ? tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache: bad copy (slot %d, %d tokens)",
                         slot, io->n_tok)
               : 0;
}

static int cpu_cache_save(tl_backend *b, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    int rc = check_io(c, slot, io, err, errlen);
    if (rc) return rc;
    cpu_state *st = &c->st[slot];
    if (st->n_past != io->n_tok)
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix save: slot %d holds %d tokens, not %d",
                       slot, st->n_past, io->n_tok);
    for (int k = 0; k < io->n_pages; k++)
        if (io->page[k] >= 0)
            copy_page(c, st, io->page[k], k * TL_PC_PAGE, TL_MIN(io->n_tok, (k + 1) * TL_PC_PAGE),
                      1);
    copy_snap(c, st, io->snap, 1);
    return 0;
}

static int cpu_cache_load(tl_backend *b, int slot, const tl_pc_io *io, const int32_t *tokens,
                          int n_prompt, char *err, size_t errlen) {
    (void)tokens, (void)n_prompt; /* the host sampler reads the session's own history */
    cpu_backend *c = b->impl;
    int rc = check_io(c, slot, io, err, errlen);
    for (int k = 0; k < io->n_pages && !rc; k++)
        if (io->page[k] < 0)
            rc = tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: no page %d", k);
    cpu_state *st = &c->st[slot];
    if (!rc && st->n_past != 0)
        rc = tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: slot %d is not empty", slot);
    if (!rc) rc = tl_kv_pages_reserve(&c->pages, &slot, &io->n_tok, 1, NULL, err, errlen);
    if (rc) return rc;
    for (int k = 0; k < io->n_pages; k++)
        copy_page(c, st, io->page[k], k * TL_PC_PAGE, TL_MIN(io->n_tok, (k + 1) * TL_PC_PAGE), 0);
    copy_snap(c, st, io->snap, 0);
    st->n_past = io->n_tok;
    return 0;
}

static void cpu_cache_sizes(tl_backend *b, const tl_config *cfg) {
    cpu_backend *c = b->impl;
    c->kv_row = (size_t)cfg->n_head_kv * cfg->head_dim;
    c->conv_n = (size_t)(cfg->gdn_conv_k - 1) * tl_config_gdn_conv_dim(cfg);
    c->rec_n = (size_t)cfg->gdn_n_v_head * cfg->gdn_k_dim * cfg->gdn_v_dim;
    for (int il = 0; il < cfg->n_layer; il++)
        cfg->layer_kind[il] == TL_LAYER_ATTN ? c->n_attn++ : c->n_gdn++;
    b->pc_page_bytes = TL_MAX(1, 2 * (size_t)c->n_attn * TL_PC_PAGE * c->kv_row * sizeof(float));
    b->pc_snap_bytes = TL_MAX(1, (size_t)c->n_gdn * (c->conv_n + c->rec_n) * sizeof(float));
    b->cache_alloc = cpu_cache_alloc;
    b->cache_save = cpu_cache_save;
    b->cache_load = cpu_cache_load;
}

/* The pool: kv_tokens rounded up to pages of TL_CPU_KV_PAGE (at most every slot full), or one
 * page of max_ctx tokens per slot. */
static int cpu_pool(cpu_backend *c, int max_ctx, long kv_tokens, char *err, size_t errlen) {
    if (kv_tokens <= 0)
        return tl_kv_pages_init(&c->pages, c->max_seqs, c->max_seqs, 1, max_ctx, NULL, err, errlen);
    long max_pages = TL_CEIL_DIV((long)max_ctx, TL_CPU_KV_PAGE);
    long n_page = TL_MIN(TL_CEIL_DIV(kv_tokens, TL_CPU_KV_PAGE), c->max_seqs * max_pages);
    return tl_kv_pages_init(&c->pages, (int)n_page, c->max_seqs, (int)max_pages, TL_CPU_KV_PAGE,
                            NULL, err, errlen);
}

int tl_backend_cpu_open(tl_backend **out, const tl_model *m, int max_seqs, int max_ctx,
                        long kv_tokens, int n_threads, char *err, size_t errlen) {
    *out = NULL;
    cpu_backend *c = xcalloc(1, sizeof *c);
    c->m = m;
    c->max_seqs = max_seqs;
    c->st = xcalloc(max_seqs, sizeof(cpu_state));
    /* note: KV for max_ctx tokens is allocated per slot up front (calloc: pages are touched only
     * when used), so a step never allocates. */
    for (int i = 0; i < max_seqs; i++) {
        if (cpu_state_init(&c->st[i], &m->cfg, max_ctx)) {
            cpu_free(c, i);
            return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for %d sequences of %d tokens",
                           max_seqs, max_ctx);
        }
    }
    int rc = cpu_pool(c, max_ctx, kv_tokens, err, errlen);
    if (rc) {
        cpu_free(c, max_seqs);
        return rc;
    }
    cpu_set_threads(n_threads);
    tl_backend *b = xcalloc(1, sizeof *b);
    b->name = "cpu";
    b->can_sample = 0;
    b->max_ctx = max_ctx;
    b->impl = c;
    b->close = cpu_close;
    b->reset_slot = cpu_reset_slot;
    b->kv_stats = cpu_kv_stats;
    b->forward = cpu_fwd;
    cpu_cache_sizes(b, &m->cfg);
    *out = b;
    return TL_OK;
}
