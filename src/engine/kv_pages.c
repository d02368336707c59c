/* The paged KV cache's host bookkeeping (kv_pages.h). */
#include <stdlib.h>
#include <string.h>
#include "engine/kv_pages.h"
#include "common/status.h"
#include "common/util.h"

int tl_kv_pages_init(tl_kv_pages *p, int n_page, int max_seqs, int max_pages, int page_tokens,
                     int32_t *table, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (n_page < 0 || max_seqs < 1 || max_pages < 1 || page_tokens < 1)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "KV pages: bad pool (%d pages, %d slots of %d pages, %d tokens a page)",
                       n_page, max_seqs, max_pages, page_tokens);
    size_t nt = (size_t)max_seqs * max_pages;
    p->n_page = n_page, p->max_seqs = max_seqs, p->max_pages = max_pages;
    p->page_tokens = page_tokens;
    p->own_table = table == NULL;
    p->table = table ? table : calloc(nt, sizeof(int32_t));
    p->np = calloc((size_t)max_seqs, sizeof(int));
    p->free_pg = malloc((size_t)(n_page > 0 ? n_page : 1) * sizeof(int));
    p->refs = calloc((size_t)(n_page > 0 ? n_page : 1), sizeof(int32_t));
    p->held = calloc((size_t)(n_page > 0 ? n_page : 1), 1);
    if (!p->table || !p->np || !p->free_pg || !p->refs || !p->held) {
        tl_kv_pages_free(p);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "KV pages: out of memory for %zu entries", nt);
    }
    for (int i = 0; i < n_page; i++) p->free_pg[i] = n_page - 1 - i; /* page 0 on top */
    p->n_free = n_page;
    return 0;
}

void tl_kv_pages_free(tl_kv_pages *p) {
    if (p->own_table) free(p->table);
    free(p->np);
    free(p->free_pg);
    free(p->refs);
    free(p->held);
    memset(p, 0, sizeof *p);
}

int tl_kv_pages_available(const tl_kv_pages *p) { return p->n_free + p->n_idle; }

static int is_idle(const tl_kv_pages *p, int id) { return p->held[id] && p->refs[id] == 1; }

/* Adds d (+1 or -1) to page id's references, keeping n_idle; a page that nobody holds any more
 * returns to the free stack. */
static void ref_add(tl_kv_pages *p, int id, int d) {
    TL_ASSERT(id >= 0 && id < p->n_page && p->refs[id] + d >= 0);
    p->n_idle -= is_idle(p, id);
    p->refs[id] += d;
    p->n_idle += is_idle(p, id);
    if (p->refs[id] == 0) {
        TL_ASSERT(!p->held[id]);
        p->free_pg[p->n_free++] = id;
    }
}

/* A page off the free stack, one reference. */
static int32_t pop_free(tl_kv_pages *p) {
    int32_t id = p->free_pg[--p->n_free];
    TL_ASSERT(p->refs[id] == 0 && !p->held[id]);
    p->refs[id] = 1;
    return id;
}

static void make_free(tl_kv_pages *p, long need) {
    if (need > p->n_free && need <= tl_kv_pages_available(p) && p->reclaim)
        p->reclaim(p->reclaim_ctx, (int)need);
}

int tl_kv_pages_map(tl_kv_pages *p, int slot, const int32_t *ids, int n, char *err, size_t errlen) {
    if (slot < 0 || slot >= p->max_seqs || p->np[slot] != 0 || n < 0 || n > p->max_pages)
        return tl_errf(err, errlen, TL_ERR_INVALID, "KV pages: cannot map %d pages into slot %d", n,
                       slot);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= p->n_page || p->refs[ids[k]] <= 0)
            return tl_errf(err, errlen, TL_ERR_INVALID, "KV pages: page %d is not held", ids[k]);
    int32_t *row = p->table + (size_t)slot * p->max_pages;
    for (int k = 0; k < n; k++) {
        row[k] = ids[k];
        ref_add(p, ids[k], 1);
    }
    p->np[slot] = n;
    return 0;
}

void tl_kv_pages_hold(tl_kv_pages *p, int id) {
    TL_ASSERT(id >= 0 && id < p->n_page && !p->held[id] && p->refs[id] > 0);
    p->held[id] = 1; /* it was not idle before (not held) */
    p->refs[id]++;
    p->n_idle += is_idle(p, id);
}

void tl_kv_pages_unhold(tl_kv_pages *p, int id) {
    TL_ASSERT(id >= 0 && id < p->n_page && p->held[id]);
    p->n_idle -= is_idle(p, id);
    p->held[id] = 0;
    p->refs[id]--; /* the cache's own reference */
    p->n_idle += is_idle(p, id);
    if (p->refs[id] == 0) p->free_pg[p->n_free++] = id;
}

int tl_kv_pages_take(tl_kv_pages *p) {
    make_free(p, 1);
    if (p->n_free < 1) return -1;
    int32_t id = pop_free(p);
    p->held[id] = 1; /* the one reference is the cache's: idle */
    p->n_idle++;
    return id;
}

static int pages_for(const tl_kv_pages *p, int len) {
    return (int)(((long)len + p->page_tokens - 1) / p->page_tokens);
}

int tl_kv_pages_reserve(tl_kv_pages *p, const int *slot, const int *len, int n, int *old_np,
                        char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (slot[i] < 0 || slot[i] >= p->max_seqs || len[i] < 0)
            return tl_errf(err, errlen, TL_ERR_INVALID, "KV pages: bad slot %d / length %d",
                           slot[i], len[i]);
        if (pages_for(p, len[i]) > p->max_pages)
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "KV pages: %d positions exceed a slot's %d pages", len[i], p->max_pages);
    }
    /* pass 1: grow np as planned (remembering the old counts), count the pages needed */
    long need = 0;
    int *old = old_np ? old_np : malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    if (!old) return tl_errf(err, errlen, TL_ERR_NOMEM, "KV pages: out of memory");
    for (int i = 0; i < n; i++) {
        int s = slot[i], want = pages_for(p, len[i]);
        old[i] = p->np[s];
        if (want > p->np[s]) need += want - p->np[s], p->np[s] = want;
    }
    make_free(p, need);     /* the prefix cache's idle pages first (it changes no slot's count) */
    if (need > p->n_free) { /* roll back in reverse: a repeated slot restores its first count */
        for (int i = n - 1; i >= 0; i--) p->np[slot[i]] = old[i];
        if (!old_np) free(old);
        return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                       "KV cache full: the step needs %ld more pages of %d tokens, %d of %d are "
                       "free",
                       need, p->page_tokens, p->n_free, p->n_page);
    }
    /* pass 2: hand out the pages; a repeated slot's old count already includes the growth
     * of its earlier entries, so the ranges are disjoint */
    for (int i = 0; i < n; i++) {
        int32_t *row = p->table + (size_t)slot[i] * p->max_pages;
        for (int k = old[i]; k < pages_for(p, len[i]); k++) row[k] = pop_free(p);
    }
    if (!old_np) free(old);
    return 0;
}

void tl_kv_pages_release(tl_kv_pages *p, int slot) {
    if (slot < 0 || slot >= p->max_seqs) return;
    int32_t *row = p->table + (size_t)slot * p->max_pages;
    for (int i = p->np[slot] - 1; i >= 0; i--) ref_add(p, row[i], -1);
    p->np[slot] = 0;
}

void tl_kv_pages_truncate(tl_kv_pages *p, int slot, int len) {
    if (slot < 0 || slot >= p->max_seqs || len < 0) return;
    int32_t *row = p->table + (size_t)slot * p->max_pages;
    int keep = pages_for(p, len);
    for (int i = p->np[slot] - 1; i >= keep; i--) ref_add(p, row[i], -1);
    if (keep < p->np[slot]) p->np[slot] = keep;
}
