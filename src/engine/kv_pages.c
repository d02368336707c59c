/* The paged KV cache's host bookkeeping (kv_pages.h). */
#include <stdlib.h>
#include <string.h>
#include "engine/kv_pages.h"
#include "common/status.h"

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
    if (!p->table || !p->np || !p->free_pg) {
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
    memset(p, 0, sizeof *p);
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
        for (int k = old[i]; k < pages_for(p, len[i]); k++) row[k] = p->free_pg[--p->n_free];
    }
    if (!old_np) free(old);
    return 0;
}

void tl_kv_pages_release(tl_kv_pages *p, int slot) {
    if (slot < 0 || slot >= p->max_seqs) return;
    int32_t *row = p->table + (size_t)slot * p->max_pages;
    for (int i = p->np[slot] - 1; i >= 0; i--) p->free_pg[p->n_free++] = row[i];
    p->np[slot] = 0;
}

void tl_kv_pages_truncate(tl_kv_pages *p, int slot, int len) {
    if (slot < 0 || slot >= p->max_seqs || len < 0) return;
    int32_t *row = p->table + (size_t)slot * p->max_pages;
    int keep = pages_for(p, len);
    for (int i = p->np[slot] - 1; i >= keep; i--) p->free_pg[p->n_free++] = row[i];
    if (keep < p->np[slot]) p->np[slot] = keep;
}
