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
} cpu_backend;

static void cpu_free(cpu_backend *c, int n_state) {
    for (int i = 0; i < n_state; i++) cpu_state_free(&c->st[i]);
    tl_kv_pages_free(&c->pages);
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
    *out = b;
    return TL_OK;
}
