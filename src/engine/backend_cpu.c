/* CPU reference backend: one cpu_state per slot, entries run one after another through
 * cpu_forward (the oracle). Used by CI end to end and wherever no GPU is present. Its KV pool
 * (backend.h) is bookkeeping over kv_pages.c: with kv_tokens set, a real limit on the tokens
 * all slots hold together, as on the GPU; without, room for every slot full.
 * Prefix cache (docs/architecture.md §4.1): cpu_forward reads a slot's own contiguous KV, so the
 * pool's pages are mirrored in a page store written through on every forward (each slot's rows
 * into the pages its table names). Sharing a page is then bookkeeping only, as on the GPU; a load
 * copies the shared pages' rows into the slot (the copy path), and a slot's reset checks that
 * every page it held still holds its rows (a shared page overwritten or reused while in use
 * would fail that check).
 * Speculative decoding (docs/architecture.md §3.6): the MTP head's cache and hiddens per slot;
 * a verify is rolled back by restoring the GDN state saved before it and recomputing the
 * accepted tokens (exact on the CPU: a chunk computes what token-by-token steps compute). The
 * page store also keeps the head's KV rows and a snapshot the last hidden, so a session loaded
 * from the cache drafts as if it had computed its prefix. */
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "cpu/cpu.h"
#include "engine/backend.h"
#include "engine/kv_pages.h"

/* A slot's speculative-decoding state (docs/architecture.md §3.6). */
typedef struct {
    cpu_mtp_state mtp;
    int mtp_len;         /* head rows computed: positions 0 .. mtp_len - 1; -1: not kept */
    float *hid;          /* [max_draft + 1][n_embd] trunk hiddens of positions hid_pos0 .. */
    int hid_pos0, hid_n; /* .. hid_pos0 + hid_n - 1 (the last forward's last ones) */
    float *chain;        /* [n_embd] h' of the last draft step */
    float *gdn;          /* the GDN state before the last verify */
    int32_t *vtok;       /* the last verify's tokens, at positions vpos .. vpos + vn - 1 */
    int vpos, vn;        /* vn 0: no verify to roll back */
} cpu_spec;

typedef struct {
    const tl_model *m;
    int max_seqs;
    cpu_state *st;
    int spec_k;   /* most draft tokens per step; 0: no speculation */
    cpu_spec *sp; /* [max_seqs] when spec_k > 0 */
    tl_kv_pages pages;
    /* prefix cache storage (backend.h): the page store [pool page][attn layer, then the MTP
     * head's when the model has one][TL_PC_PAGE][kv row] K then V, f32; snapshots [n_pc_snap]
     * [gdn layer] conv then recurrent state, then (with a head) a flag and the trunk's hidden of
     * the snapshot's last position, f32. pc_mtp_rows[page]: the head rows 0 .. n - 1 of the
     * page that hold the head's KV (written in order; the last row of a page needs the token
     * after it) */
    float *pc_pages, *pc_snaps;
    int *pc_mtp_rows;
    int n_pc_snap, n_mtp;
    size_t kv_row;        /* floats of one position's K (or V) of one layer */
    size_t conv_n, rec_n; /* floats of one layer's conv / recurrent state */
    int n_attn, n_gdn;
} cpu_backend;

static void spec_free(cpu_backend *c) {
    for (int i = 0; c->sp && i < c->max_seqs; i++) {
        cpu_spec *x = &c->sp[i];
        cpu_mtp_state_free(&x->mtp);
        free(x->hid), free(x->chain), free(x->gdn), free(x->vtok);
    }
    free(c->sp);
    c->sp = NULL;
}

static void cpu_free(cpu_backend *c, int n_state) {
    spec_free(c);
    for (int i = 0; i < n_state; i++) cpu_state_free(&c->st[i]);
    tl_kv_pages_free(&c->pages);
    free(c->pc_pages);
    free(c->pc_snaps);
    free(c->pc_mtp_rows);
    free(c->st);
    free(c);
}

static void cpu_close(tl_backend *b) {
    cpu_backend *c = b->impl;
    cpu_free(c, c->max_seqs);
    free(b);
}

static void store_check(cpu_backend *c, int slot);
static void copy_snap(cpu_backend *c, cpu_state *st, int sn, int to_cache);
static void snap_hidden(cpu_backend *c, int slot, int sn, int n);

static int cpu_reset_slot(tl_backend *b, int slot) {
    cpu_backend *c = b->impl;
    if (slot < 0 || slot >= c->max_seqs) return TL_ERR_INVALID;
    store_check(c, slot);
    tl_kv_pages_release(&c->pages, slot);
    cpu_state_reset(&c->st[slot], &c->m->cfg);
    if (c->sp) c->sp[slot].mtp_len = 0, c->sp[slot].hid_n = 0, c->sp[slot].vn = 0;
    return TL_OK;
}

static void cpu_kv_stats(tl_backend *b, tl_kv_stats *out) {
    const tl_kv_pages *p = &((cpu_backend *)b->impl)->pages;
    out->page_tokens = p->page_tokens;
    out->pages_total = p->n_page;
    out->pages_free = tl_kv_pages_available(p); /* idle cached pages are evicted on demand */
    out->pages_per_seq = p->max_pages;
}

static tl_kv_pages *cpu_kv_pool(tl_backend *b) { return &((cpu_backend *)b->impl)->pages; }

/* Copies the GDN conv and recurrent state of st to buf (to_buf) or back. */
static void gdn_copy(cpu_backend *c, cpu_state *st, float *buf, int to_buf) {
    const tl_config *cfg = &c->m->cfg;
    for (int il = 0; il < cfg->n_layer; il++) {
        if (cfg->layer_kind[il] == TL_LAYER_ATTN) continue;
        if (to_buf)
            memcpy(buf, st->conv[il], c->conv_n * 4),
                memcpy(buf + c->conv_n, st->rec[il], c->rec_n * 4);
        else
            memcpy(st->conv[il], buf, c->conv_n * 4),
                memcpy(st->rec[il], buf + c->conv_n, c->rec_n * 4);
        buf += c->conv_n + c->rec_n;
    }
}

/* ====== Speculative decoding (backend.h, docs/architecture.md §3.6). ====== */

static void mtp_store(cpu_backend *c, int slot, int p0, int p1);

/* The head's rows an entry makes computable: mtp_len .. pos + n_tok - 2 (row p pairs the hidden
 * of position p with the token at p + 1); h [n_tok][D] are the entry's trunk hiddens. */
static int spec_rows(cpu_backend *c, cpu_spec *x, const tl_fwd_entry *e, const float *h) {
    int D = c->m->cfg.n_embd, r0 = x->mtp_len, r1 = e->pos + e->n_tok - 1;
    if (r0 < 0) return TL_OK;
    if (r0 < e->pos - 1) { /* rows missing below this entry: the head is not kept for the slot */
        x->mtp_len = -1;
        return TL_OK;
    }
    int n = r1 - r0;
    if (n <= 0) return TL_OK;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    float *hid = malloc(sizeof(float) * (size_t)n * D);
    if (!tok || !hid) {
        free(tok), free(hid);
        return TL_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        int p = r0 + i;
        tok[i] = e->tokens[p + 1 - e->pos];
        const float *src =
            p < e->pos ? x->hid + (size_t)(p - x->hid_pos0) * D : h + (size_t)(p - e->pos) * D;
        TL_ASSERT(p >= e->pos || (p >= x->hid_pos0 && p < x->hid_pos0 + x->hid_n));
        memcpy(hid + (size_t)i * D, src, sizeof(float) * D);
    }
    int rc = cpu_mtp_forward(c->m, &x->mtp, tok, hid, n, r0, NULL, NULL, NULL);
    if (!rc) x->mtp_len = r1, mtp_store(c, e->slot, r0, r1);
    free(tok), free(hid);
    return rc;
}

/* One entry with speculation on: the GDN state saved first when it is a verify, the trunk with
 * its hiddens, the head's rows, the last hiddens kept. */
static int spec_forward(cpu_backend *c, const tl_fwd_entry *e) {
    cpu_state *st = &c->st[e->slot];
    cpu_spec *x = &c->sp[e->slot];
    int D = c->m->cfg.n_embd, n = e->n_tok;
    x->vn = 0;
    if (e->all_logits) {
        if (n > c->spec_k + 1) return TL_ERR_INVALID;
        gdn_copy(c, st, x->gdn, 1);
        memcpy(x->vtok, e->tokens, sizeof(int32_t) * (size_t)n);
        x->vpos = e->pos, x->vn = n;
    }
    float *h = malloc(sizeof(float) * (size_t)n * D);
    if (!h) return TL_ERR_NOMEM;
    int rc = cpu_forward_h(c->m, st, e->tokens, n, e->logits, e->all_logits, h);
    if (!rc) rc = spec_rows(c, x, e, h);
    if (!rc) {
        int keep = TL_MIN(n, c->spec_k + 1);
        memcpy(x->hid, h + (size_t)(n - keep) * D, sizeof(float) * (size_t)keep * D);
        x->hid_pos0 = e->pos + n - keep, x->hid_n = keep;
    }
    free(h);
    return rc;
}

static int cpu_spec_ready(tl_backend *b, int slot) {
    cpu_backend *c = b->impl;
    if (!c->sp || slot < 0 || slot >= c->max_seqs) return 0;
    int len = c->st[slot].n_past;
    return len > 0 && c->sp[slot].mtp_len == len - 1;
}

static int cpu_draft(tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    int D = c->m->cfg.n_embd;
    for (int i = 0; i < n; i++) {
        if (!c->sp || d[i].slot < 0 || d[i].slot >= c->max_seqs || d[i].step < 0 ||
            d[i].step >= c->spec_k)
            return tl_errf(err, errlen, TL_ERR_INVALID, "draft: bad slot %d / step %d", d[i].slot,
                           d[i].step);
        cpu_spec *x = &c->sp[d[i].slot];
        int len = c->st[d[i].slot].n_past, pos = len - 1 + d[i].step;
        if (d[i].step == 0 && !cpu_spec_ready(b, d[i].slot))
            return tl_errf(err, errlen, TL_ERR_INTERNAL,
                           "draft: slot %d has no MTP rows up to its length %d", d[i].slot, len);
        const float *h = d[i].step ? x->chain : x->hid + (size_t)(len - 1 - x->hid_pos0) * D;
        float *hn = malloc(sizeof(float) * D);
        if (!hn) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
        int rc = cpu_mtp_forward(c->m, &x->mtp, &d[i].token, h, 1, pos, hn, d[i].logits, NULL);
        if (!rc) memcpy(x->chain, hn, sizeof(float) * D);
        free(hn);
        if (rc) return tl_errf(err, errlen, rc, "draft: MTP head: %s", tl_status_str(rc));
        if (d[i].step == 0) x->mtp_len = len, mtp_store(c, d[i].slot, len - 1, len);
    }
    return TL_OK;
}

static void store_rows(cpu_backend *c, int slot, int p0, int p1);
static void mtp_unstore(cpu_backend *c, int slot, int p);

static int cpu_rollback(tl_backend *b, int slot, int n_keep, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    if (!c->sp || slot < 0 || slot >= c->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "rollback: bad slot %d", slot);
    cpu_state *st = &c->st[slot];
    cpu_spec *x = &c->sp[slot];
    if (!x->vn || n_keep <= x->vpos || n_keep > x->vpos + x->vn || st->n_past != x->vpos + x->vn)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "rollback: slot %d to %d tokens, but its verify covered %d..%d", slot,
                       n_keep, x->vpos, x->vpos + x->vn);
    if (n_keep < st->n_past) { /* restore, then recompute the accepted tokens */
        gdn_copy(c, st, x->gdn, 0);
        st->n_past = x->vpos;
        int rc = cpu_forward(c->m, st, x->vtok, n_keep - x->vpos, NULL, NULL);
        if (rc) return tl_errf(err, errlen, rc, "rollback: recompute: %s", tl_status_str(rc));
        tl_kv_pages_truncate(&c->pages, slot, n_keep);
        store_rows(c, slot, x->vpos, n_keep);
        if (x->mtp_len > n_keep - 1) x->mtp_len = n_keep - 1, mtp_unstore(c, slot, n_keep - 1);
        x->hid_n = n_keep - x->hid_pos0;
        TL_ASSERT(x->hid_n >= 1);
    }
    x->vn = 0;
    return TL_OK;
}

static int cpu_spec_init(tl_backend *b, int max_draft, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    if (!c->m->has_mtp)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "the checkpoint has no MTP head");
    if (max_draft < 1 || max_draft > TL_MAX_SPEC || c->sp)
        return tl_errf(err, errlen, TL_ERR_INVALID, "spec_init: %d draft tokens", max_draft);
    int D = c->m->cfg.n_embd, ok = 1;
    c->sp = xcalloc((size_t)c->max_seqs, sizeof *c->sp);
    for (int i = 0; i < c->max_seqs && ok; i++) {
        cpu_spec *x = &c->sp[i];
        ok = !cpu_mtp_state_init(&x->mtp, &c->m->cfg, c->st[i].max_ctx);
        x->hid = malloc(sizeof(float) * (size_t)(max_draft + 1) * D);
        x->chain = malloc(sizeof(float) * D);
        x->gdn = malloc(b->pc_snap_bytes);
        x->vtok = malloc(sizeof(int32_t) * (size_t)(max_draft + 1));
        ok = ok && x->hid && x->chain && x->gdn && x->vtok;
    }
    if (!ok) {
        spec_free(c);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for the MTP state of %d slots",
                       c->max_seqs);
    }
    c->spec_k = max_draft;
    return TL_OK;
}

static int one_forward(cpu_backend *c, const tl_fwd_entry *e) {
    return c->spec_k
               ? spec_forward(c, e)
               : cpu_forward(c->m, &c->st[e->slot], e->tokens, e->n_tok, e->logits, e->all_logits);
}

/* One entry; with a snapshot point inside it (backend.h snap_at), as two entries cut there with
 * the GDN state copied into the snapshot between them: exactly what two steps and a save do. */
static int entry_forward(cpu_backend *c, const tl_fwd_entry *e) {
    if (!e->snap_at) return one_forward(c, e);
    if (e->snap_at <= e->pos || e->snap_at >= e->pos + e->n_tok || e->snap < 0 ||
        e->snap >= c->n_pc_snap || e->all_logits)
        return TL_ERR_INVALID;
    int k = e->snap_at - e->pos;
    tl_fwd_entry a = *e, z = *e;
    a.n_tok = k, a.logits = NULL, a.snap_at = 0;
    z.pos = e->snap_at, z.tokens = e->tokens + k, z.n_tok = e->n_tok - k, z.snap_at = 0;
    int rc = one_forward(c, &a);
    if (!rc)
        copy_snap(c, &c->st[e->slot], e->snap, 1), snap_hidden(c, e->slot, e->snap, k + e->pos);
    return rc ? rc : one_forward(c, &z);
}

/* Every entry's position is checked, then the pages of the whole step are taken (all or
 * nothing: TL_ERR_CONTEXT_FULL changes no slot); pages new to a slot hold no head rows yet. */
static int take_pages(cpu_backend *c, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    int stack[3 * 64] = {0};
    int *v = n <= 64 ? stack : malloc(sizeof(int) * 3 * (size_t)n);
    if (!v) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    int *slot = v, *len = v + n, *old = v + 2 * n, rc = 0;
    for (int i = 0; i < n; i++) {
        if (!rc && c->st[e[i].slot].n_past != e[i].pos)
            rc = tl_errf(err, errlen, TL_ERR_INTERNAL, "slot %d holds %d tokens, step expects %d",
                         e[i].slot, c->st[e[i].slot].n_past, e[i].pos);
        slot[i] = e[i].slot, len[i] = e[i].pos + e[i].n_tok;
    }
    if (!rc) rc = tl_kv_pages_reserve(&c->pages, slot, len, n, old, err, errlen);
    for (int i = 0; i < n && !rc && c->pc_mtp_rows; i++)
        for (int k = old[i]; k < c->pages.np[slot[i]]; k++)
            c->pc_mtp_rows[c->pages.table[(size_t)slot[i] * c->pages.max_pages + k]] = 0;
    if (v != stack) free(v);
    return rc;
}

static int cpu_fwd(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    int rc = take_pages(c, e, n, err, errlen);
    for (int i = 0; i < n && !rc; i++) {
        rc = entry_forward(c, &e[i]);
        /* even after a failure: the rows the slot now counts, so its reset's check holds */
        store_rows(c, e[i].slot, e[i].pos, c->st[e[i].slot].n_past);
        if (rc) rc = tl_errf(err, errlen, rc, "cpu forward: %s", tl_status_str(rc));
    }
    return rc;
}

/* ====== Prefix cache storage (backend.h): the page store and plain copies. ====== */

static int cpu_cache_alloc(tl_backend *b, int n_snap, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    if (c->pc_pages) return tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache allocated twice");
    c->pc_pages = calloc((size_t)c->pages.n_page, b->pc_page_bytes); /* touched as used */
    c->pc_snaps = malloc((size_t)n_snap * b->pc_snap_bytes);
    c->pc_mtp_rows = calloc((size_t)c->pages.n_page, sizeof(int));
    if (!c->pc_pages || !c->pc_snaps || !c->pc_mtp_rows) {
        free(c->pc_pages), free(c->pc_snaps), free(c->pc_mtp_rows);
        c->pc_pages = c->pc_snaps = NULL;
        c->pc_mtp_rows = NULL;
        return tl_errf(err, errlen, TL_ERR_NOMEM,
                       "out of memory for the prefix cache (%d pages, %d snapshots)",
                       c->pages.n_page, n_snap);
    }
    c->n_pc_snap = n_snap;
    return 0;
}

/* Where row r (< TL_PC_PAGE) of K (v = 0) or V (v = 1) of attention layer a (a = n_attn: the MTP
 * head's) lies in store page pg. */
static float *store_at(cpu_backend *c, int pg, int a, int v, int r) {
    size_t page = (size_t)2 * (c->n_attn + c->n_mtp) * TL_PC_PAGE * c->kv_row;
    return c->pc_pages + (size_t)pg * page + ((size_t)(2 * a + v) * TL_PC_PAGE + r) * c->kv_row;
}

/* Copies positions [p0, p1) (within one page) of every attention layer between slot state st and
 * store page pg (rows p0 % TL_PC_PAGE on); to_store picks the direction; check instead compares
 * them and returns 1 when they differ. */
static int copy_page(cpu_backend *c, cpu_state *st, int pg, int p0, int p1, int to_store,
                     int check) {
    const tl_config *cfg = &c->m->cfg;
    size_t n = (size_t)(p1 - p0) * c->kv_row * sizeof(float);
    int diff = 0;
    for (int il = 0, a = 0; il < cfg->n_layer; il++) {
        if (cfg->layer_kind[il] != TL_LAYER_ATTN) continue;
        float *pk = store_at(c, pg, a, 0, p0 % TL_PC_PAGE),
              *pv = store_at(c, pg, a, 1, p0 % TL_PC_PAGE);
        float *sk = st->kv_k[il] + (size_t)p0 * c->kv_row,
              *sv = st->kv_v[il] + (size_t)p0 * c->kv_row;
        if (check)
            diff |= memcmp(pk, sk, n) != 0 || memcmp(pv, sv, n) != 0;
        else if (to_store)
            memcpy(pk, sk, n), memcpy(pv, sv, n);
        else
            memcpy(sk, pk, n), memcpy(sv, pv, n);
        a++;
    }
    return diff;
}

/* The slot's positions [p0, p1) into the store pages its table names (write-through). */
static void store_rows(cpu_backend *c, int slot, int p0, int p1) {
    if (!c->pc_pages) return;
    const int32_t *row = c->pages.table + (size_t)slot * c->pages.max_pages;
    for (int p = p0; p < p1;) {
        int q = TL_MIN(p1, (p / TL_PC_PAGE + 1) * TL_PC_PAGE);
        copy_page(c, &c->st[slot], row[p / TL_PC_PAGE], p, q, 1, 0);
        p = q;
    }
}

/* The MTP head's rows [p0, p1) of the slot into its store pages, each page's rows in order only
 * (pc_mtp_rows: a row out of order leaves the page's count where it is). */
static void mtp_store(cpu_backend *c, int slot, int p0, int p1) {
    if (!c->pc_pages || !c->n_mtp || !c->sp) return;
    const int32_t *row = c->pages.table + (size_t)slot * c->pages.max_pages;
    const cpu_mtp_state *m = &c->sp[slot].mtp;
    size_t n = c->kv_row * sizeof(float);
    for (int p = p0; p < p1; p++) {
        int pg = row[p / TL_PC_PAGE], r = p % TL_PC_PAGE;
        if (c->pc_mtp_rows[pg] != r) continue;
        memcpy(store_at(c, pg, c->n_attn, 0, r), m->k + (size_t)p * c->kv_row, n);
        memcpy(store_at(c, pg, c->n_attn, 1, r), m->v + (size_t)p * c->kv_row, n);
        c->pc_mtp_rows[pg] = r + 1;
    }
}

/* The slot's head rows from position p on no longer hold (a rollback): its pages' counts cut. */
static void mtp_unstore(cpu_backend *c, int slot, int p) {
    if (!c->pc_pages || !c->n_mtp) return;
    const int32_t *row = c->pages.table + (size_t)slot * c->pages.max_pages;
    for (int k = p / TL_PC_PAGE; k < c->pages.np[slot]; k++) {
        int keep = k == p / TL_PC_PAGE ? p % TL_PC_PAGE : 0;
        if (c->pc_mtp_rows[row[k]] > keep) c->pc_mtp_rows[row[k]] = keep;
    }
}

/* Every page the slot holds still holds the slot's rows: no page was overwritten or handed to
 * another holder while the slot used it (docs/architecture.md §4.1). A broken invariant. */
static void store_check(cpu_backend *c, int slot) {
    if (!c->pc_pages) return;
    const int32_t *row = c->pages.table + (size_t)slot * c->pages.max_pages;
    int n = c->st[slot].n_past, diff = 0;
    TL_ASSERT(c->pages.np[slot] >= TL_CEIL_DIV(n, TL_PC_PAGE));
    for (int p = 0; p < n && !diff; p += TL_PC_PAGE)
        diff = copy_page(c, &c->st[slot], row[p / TL_PC_PAGE], p, TL_MIN(n, p + TL_PC_PAGE), 0, 1);
    TL_ASSERT(!diff);
}

/* Floats of one snapshot: the GDN state, then (with a head) a flag and a hidden. */
static size_t snap_floats(const cpu_backend *c) {
    return (size_t)c->n_gdn * (c->conv_n + c->rec_n) +
           (c->n_mtp ? 1 + (size_t)c->m->cfg.n_embd : 0);
}

static void copy_snap(cpu_backend *c, cpu_state *st, int sn, int to_cache) {
    gdn_copy(c, st, c->pc_snaps + (size_t)sn * snap_floats(c), to_cache);
}

/* With a head: snapshot sn's flag, then its hidden (the last 1 + n_embd floats). */
static float *snap_head(cpu_backend *c, int sn) {
    return c->pc_snaps + (size_t)(sn + 1) * snap_floats(c) - 1 - c->m->cfg.n_embd;
}

/* With a head: the slot's trunk hidden of position n - 1 into snapshot sn (flag 1) when the slot
 * keeps it and its head rows reach n - 1, else flag 0 (a load then does not draft). */
static void snap_hidden(cpu_backend *c, int slot, int sn, int n) {
    if (!c->n_mtp) return;
    int D = c->m->cfg.n_embd;
    float *f = snap_head(c, sn);
    const cpu_spec *x = c->sp ? &c->sp[slot] : NULL;
    int ok = x && x->mtp_len >= n - 1 && n - 1 >= x->hid_pos0 && n - 1 < x->hid_pos0 + x->hid_n;
    f[0] = (float)ok;
    if (ok)
        memcpy(f + 1, x->hid + (size_t)(n - 1 - x->hid_pos0) * D, sizeof(float) * D);
    else
        memset(f + 1, 0, sizeof(float) * D);
}

const void *tl_backend_cpu_snapshot(const tl_backend *b, int snap) {
    const cpu_backend *c = b->impl;
    if (!c->pc_snaps || snap < 0 || snap >= c->n_pc_snap) return NULL;
    return c->pc_snaps + (size_t)snap * snap_floats(c);
}

static int check_io(const cpu_backend *c, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    int bad = slot < 0 || slot >= c->max_seqs || io->n_tok <= 0 || io->snap < 0 ||
              io->snap >= c->n_pc_snap || io->n_full != io->n_tok / TL_PC_PAGE ||
              io->n_tok > c->st[0].max_ctx || c->pages.page_tokens != TL_PC_PAGE;
    return bad ? tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache: bad copy (slot %d, %d tokens)",
                         slot, io->n_tok)
               : 0;
}

static int cpu_cache_save(tl_backend *b, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    cpu_backend *c = b->impl;
    int rc = check_io(c, slot, io, err, errlen);
    if (rc) return rc;
    cpu_state *st = &c->st[slot];
    int n_page = c->pages.n_page;
    int held = io->state_in ? st->n_past >= io->n_tok : st->n_past == io->n_tok;
    if (!held || (io->part_rows && io->part_rows != io->n_tok % TL_PC_PAGE) ||
        (io->part_rows && (io->part_src < 0 || io->part_src >= n_page || io->part_dst < 0 ||
                           io->part_dst >= n_page)))
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "prefix save: slot %d holds %d tokens, asked %d (partial page %d -> %d)",
                       slot, st->n_past, io->n_tok, io->part_src, io->part_dst);
    if (io->part_rows) { /* store page to store page: what the slot wrote there */
        for (int a = 0; a < c->n_attn + c->n_mtp; a++)
            for (int v = 0; v < 2; v++)
                memcpy(store_at(c, io->part_dst, a, v, 0), store_at(c, io->part_src, a, v, 0),
                       (size_t)io->part_rows * c->kv_row * sizeof(float));
        c->pc_mtp_rows[io->part_dst] = TL_MIN(c->pc_mtp_rows[io->part_src], io->part_rows);
    }
    if (!io->state_in) /* else the forward wrote it */
        copy_snap(c, st, io->snap, 1), snap_hidden(c, slot, io->snap, io->n_tok);
    return 0;
}

/* After a load of io->n_tok = n tokens: the head's rows 0 .. n - 2 from the pages and the hidden
 * of n - 1 from the snapshot, so the slot drafts as if it had computed the prefix itself; when a
 * page lacks rows or the snapshot its hidden, no head rows (no drafting; §3.6). */
static void load_head(cpu_backend *c, int slot, const tl_pc_io *io) {
    cpu_spec *x = &c->sp[slot];
    int n = io->n_tok, D = c->m->cfg.n_embd, ok = c->n_mtp;
    const float *f = snap_head(c, io->snap);
    ok = ok && f[0] == 1.0f;
    for (int k = 0; ok && k * TL_PC_PAGE < n - 1; k++)
        ok = c->pc_mtp_rows[io->page[k]] >= TL_MIN(TL_PC_PAGE, n - 1 - k * TL_PC_PAGE);
    x->mtp_len = -1, x->hid_n = 0;
    if (!ok) return;
    size_t b = c->kv_row * sizeof(float);
    for (int p = 0; p < n - 1; p++) {
        int pg = io->page[p / TL_PC_PAGE], r = p % TL_PC_PAGE;
        memcpy(x->mtp.k + (size_t)p * c->kv_row, store_at(c, pg, c->n_attn, 0, r), b);
        memcpy(x->mtp.v + (size_t)p * c->kv_row, store_at(c, pg, c->n_attn, 1, r), b);
    }
    memcpy(x->hid, f + 1, sizeof(float) * D);
    x->hid_pos0 = n - 1, x->hid_n = 1, x->mtp_len = n - 1;
    mtp_store(c, slot, io->n_full * TL_PC_PAGE, n - 1); /* the slot's own last page */
}

static int cpu_cache_load(tl_backend *b, int slot, const tl_pc_io *io, const int32_t *tokens,
                          int n_prompt, char *err, size_t errlen) {
    (void)tokens, (void)n_prompt; /* the host sampler reads the session's own history */
    cpu_backend *c = b->impl;
    int rc = check_io(c, slot, io, err, errlen), part = io->n_tok % TL_PC_PAGE;
    cpu_state *st = &c->st[slot];
    if (!rc && (st->n_past != 0 || c->pages.np[slot] != 0))
        rc = tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: slot %d is not empty", slot);
    if (!rc && part && (io->page[io->n_full] < 0 || io->page[io->n_full] >= c->pages.n_page))
        rc = tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: no partial page");
    if (!rc) rc = tl_kv_pages_map(&c->pages, slot, io->page, io->n_full, err, errlen);
    if (!rc) {
        rc = tl_kv_pages_reserve(&c->pages, &slot, &io->n_tok, 1, NULL, err, errlen);
        if (rc) tl_kv_pages_release(&c->pages, slot); /* the slot unchanged */
    }
    if (rc) return rc;
    if (part && c->pc_mtp_rows) /* the slot's own last page: no head rows yet */
        c->pc_mtp_rows[c->pages.table[(size_t)slot * c->pages.max_pages + io->n_full]] = 0;
    for (int k = 0; k < io->n_full; k++) /* the copy path: shared rows into the slot's own KV */
        copy_page(c, st, io->page[k], k * TL_PC_PAGE, (k + 1) * TL_PC_PAGE, 0, 0);
    if (part) {
        int p0 = io->n_full * TL_PC_PAGE;
        copy_page(c, st, io->page[io->n_full], p0, p0 + part, 0, 0);
    }
    copy_snap(c, st, io->snap, 0);
    st->n_past = io->n_tok;
    if (part) store_rows(c, slot, io->n_full * TL_PC_PAGE, io->n_tok); /* its own last page */
    if (c->sp) load_head(c, slot, io);
    return 0;
}

static void cpu_cache_sizes(tl_backend *b, const tl_config *cfg) {
    cpu_backend *c = b->impl;
    c->kv_row = (size_t)cfg->n_head_kv * cfg->head_dim;
    c->conv_n = (size_t)(cfg->gdn_conv_k - 1) * tl_config_gdn_conv_dim(cfg);
    c->rec_n = (size_t)cfg->gdn_n_v_head * cfg->gdn_k_dim * cfg->gdn_v_dim;
    for (int il = 0; il < cfg->n_layer; il++)
        cfg->layer_kind[il] == TL_LAYER_ATTN ? c->n_attn++ : c->n_gdn++;
    c->n_mtp = c->m->has_mtp ? 1 : 0;
    b->pc_page_bytes =
        TL_MAX(1, 2 * (size_t)(c->n_attn + c->n_mtp) * TL_PC_PAGE * c->kv_row * sizeof(float));
    b->pc_snap_bytes = TL_MAX(1, snap_floats(c) * sizeof(float));
    b->kv_pool = cpu_kv_pool;
    b->cache_alloc = cpu_cache_alloc;
    b->cache_save = cpu_cache_save;
    b->cache_load = cpu_cache_load;
}

/* The pool: kv_tokens rounded up to pages of TL_CPU_KV_PAGE, at most (and by default) every slot
 * full. */
static int cpu_pool(cpu_backend *c, int max_ctx, long kv_tokens, char *err, size_t errlen) {
    long max_pages = TL_CEIL_DIV((long)max_ctx, TL_CPU_KV_PAGE);
    long all = c->max_seqs * max_pages;
    long n_page = kv_tokens > 0 ? TL_MIN(TL_CEIL_DIV(kv_tokens, TL_CPU_KV_PAGE), all) : all;
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
    b->spec_init = cpu_spec_init;
    b->spec_ready = cpu_spec_ready;
    b->draft = cpu_draft;
    b->rollback = cpu_rollback;
    cpu_cache_sizes(b, &m->cfg);
    *out = b;
    return TL_OK;
}
