/* CPU reference backend: one cpu_state per slot, entries run one after another through
 * cpu_forward (the oracle). Used by CI end to end and wherever no GPU is present. */
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "cpu/cpu.h"
#include "engine/backend.h"

typedef struct {
    const tl_model *m;
    int max_seqs;
    cpu_state *st;
} cpu_backend;

static void cpu_close(tl_backend *b) {
    cpu_backend *c = b->impl;
    for (int i = 0; i < c->max_seqs; i++) cpu_state_free(&c->st[i]);
    free(c->st);
    free(c);
    free(b);
}

static int cpu_reset_slot(tl_backend *b, int slot) {
    cpu_backend *c = b->impl;
    if (slot < 0 || slot >= c->max_seqs) return TL_ERR_INVALID;
    cpu_state_reset(&c->st[slot], &c->m->cfg);
    return TL_OK;
}

static int cpu_fwd(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    for (int i = 0; i < n; i++) {
        cpu_state *st = &c->st[e[i].slot];
        if (st->n_past != e[i].pos)
            return tl_errf(err, errlen, TL_ERR_INTERNAL, "slot %d holds %d tokens, step expects %d",
                           e[i].slot, st->n_past, e[i].pos);
        int rc = cpu_forward(c->m, st, e[i].tokens, e[i].n_tok, e[i].logits, NULL);
        if (rc) return tl_errf(err, errlen, rc, "cpu forward: %s", tl_status_str(rc));
    }
    return TL_OK;
}

int tl_backend_cpu_open(tl_backend **out, const tl_model *m, int max_seqs, int max_ctx,
                        int n_threads, char *err, size_t errlen) {
    *out = NULL;
    cpu_backend *c = xcalloc(1, sizeof *c);
    c->m = m;
    c->max_seqs = max_seqs;
    c->st = xcalloc(max_seqs, sizeof(cpu_state));
    /* note: KV for max_ctx tokens is allocated per slot up front (calloc: pages are touched only
     * when used), so a step never allocates. */
    for (int i = 0; i < max_seqs; i++) {
        if (cpu_state_init(&c->st[i], &m->cfg, max_ctx)) {
            for (int j = 0; j < i; j++) cpu_state_free(&c->st[j]);
            free(c->st);
            free(c);
            return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for %d sequences of %d tokens",
                           max_seqs, max_ctx);
        }
    }
    cpu_set_threads(n_threads);
    tl_backend *b = xcalloc(1, sizeof *b);
    b->name = "cpu";
    b->can_sample = 0;
    b->impl = c;
    b->close = cpu_close;
    b->reset_slot = cpu_reset_slot;
    b->forward = cpu_fwd;
    *out = b;
    return TL_OK;
}
