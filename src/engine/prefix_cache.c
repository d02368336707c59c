/* The prefix cache's bookkeeping (prefix_cache.h): content-addressed KV-pool pages, snapshots,
 * refcounts, LRU eviction within the snapshot budget and on the pool's demand. No backend calls:
 * the engine passes the tl_pc_io this module fills to the backend's cache_save / cache_load. */
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "engine/prefix_cache.h"

/* ====== Hashing. ====== */

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t tl_pc_salt_hash(const char *salt) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)(salt ? salt : ""); *p; p++)
        h = (h ^ *p) * 0x100000001B3ull;
    return mix64(h);
}

/* A full page's hash: its tokens chained onto its parent's hash (the salt's for the first). */
static uint64_t page_hash(uint64_t parent, const int32_t *tok, int n) {
    uint64_t h = parent;
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)tok[i]) + 0x9E3779B97F4A7C15ull;
    return h;
}

/* ====== Setup. ====== */

int tl_pc_layout(long long bytes, size_t snap_bytes, int *n_snap, char *err, size_t errlen) {
    if (snap_bytes == 0 || bytes < (long long)snap_bytes)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "prefix cache: a budget of %lld bytes holds no snapshot (one needs %zu "
                       "bytes of state: at least %zu bytes)",
                       bytes, snap_bytes, snap_bytes);
    long long ns = bytes / (long long)snap_bytes;
    if (ns > (1 << 30))
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache: %lld bytes is too large", bytes);
    *n_snap = (int)ns;
    return 0;
}

static void pc_reclaim(void *ctx, int need);

int tl_pc_init(tl_prefix_cache *c, tl_kv_pages *pool, int n_snap, size_t page_bytes,
               size_t snap_bytes, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (!pool || pool->page_tokens < 1 || pool->n_page < 1 || n_snap < 1)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "prefix cache: bad sizes (%d pool pages of %d tokens, %d snapshots)",
                       pool ? pool->n_page : 0, pool ? pool->page_tokens : 0, n_snap);
    c->pool = pool;
    c->page_tokens = pool->page_tokens;
    c->n_page = pool->n_page, c->n_snap = n_snap;
    c->page_bytes = page_bytes, c->snap_bytes = snap_bytes;
    c->pinned = -1;
    c->n_bucket = TL_MAX(16, c->n_page * 2);
    c->pg = calloc((size_t)c->n_page, sizeof *c->pg);
    c->pg_tok = malloc((size_t)c->n_page * c->page_tokens * sizeof(int32_t));
    c->bucket = malloc((size_t)c->n_bucket * sizeof(int32_t));
    c->sn = calloc((size_t)c->n_snap, sizeof *c->sn);
    if (!c->pg || !c->pg_tok || !c->bucket || !c->sn) {
        tl_pc_free(c);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "prefix cache: out of memory for %d pages",
                       pool->n_page);
    }
    for (int i = 0; i < c->n_bucket; i++) c->bucket[i] = -1;
    for (int i = 0; i < c->n_page; i++) c->pg[i].next = -1, c->pg[i].parent = -1;
    c->st.snaps_total = c->n_snap, c->st.pages_total = c->n_page;
    c->st.bytes_total = (long long)c->n_snap * snap_bytes + (long long)c->n_page * page_bytes;
    pool->reclaim = pc_reclaim, pool->reclaim_ctx = c;
    return 0;
}

static void snap_drop_mem(tl_pc_snap *s) {
    free(s->salt_str);
    free(s->pages);
    free(s->tail);
    memset(s, 0, sizeof *s);
}

void tl_pc_free(tl_prefix_cache *c) {
    if (c->sn)
        for (int i = 0; i < c->n_snap; i++) snap_drop_mem(&c->sn[i]);
    if (c->pool && c->pool->reclaim_ctx == c) c->pool->reclaim = NULL, c->pool->reclaim_ctx = NULL;
    free(c->pg);
    free(c->pg_tok);
    free(c->bucket);
    free(c->sn);
    memset(c, 0, sizeof *c);
}

/* ====== Pages. ====== */

static int32_t *tok_of(tl_prefix_cache *c, int id) {
    return c->pg_tok + (size_t)id * c->page_tokens;
}

/* The cached full page (salt, parent, tokens), or -1. */
static int page_find(tl_prefix_cache *c, uint64_t salt, int parent, uint64_t h,
                     const int32_t *tok) {
    for (int id = c->bucket[h % (uint64_t)c->n_bucket]; id >= 0; id = c->pg[id].next) {
        const tl_pc_page *p = &c->pg[id];
        if (p->hash == h && p->parent == parent && p->salt == salt &&
            !memcmp(tok_of(c, id), tok, sizeof(int32_t) * (size_t)c->page_tokens))
            return id;
    }
    return -1;
}

static void bucket_unlink(tl_prefix_cache *c, int id) {
    int32_t *pp = &c->bucket[c->pg[id].hash % (uint64_t)c->n_bucket];
    while (*pp != id) {
        TL_ASSERT(*pp >= 0);
        pp = &c->pg[*pp].next;
    }
    *pp = c->pg[id].next;
}

/* A snapshot starts using page id: the cache holds it in the pool from its first user. */
static void page_ref(tl_prefix_cache *c, int id) {
    if (c->pg[id].refs++ == 0) {
        tl_kv_pages_hold(c->pool, id);
        c->n_held++;
    }
}

static void page_unref(tl_prefix_cache *c, int id) {
    tl_pc_page *p = &c->pg[id];
    TL_ASSERT(p->refs > 0);
    if (--p->refs > 0) return;
    if (p->full) bucket_unlink(c, id);
    p->full = 0;
    p->next = -1;
    c->n_held--;
    tl_kv_pages_unhold(c->pool, id);
}

/* Makes a taken page a content-addressed one. */
static void page_publish(tl_prefix_cache *c, int id, uint64_t salt, int parent, uint64_t h,
                         const int32_t *tok) {
    tl_pc_page *p = &c->pg[id];
    p->hash = h, p->parent = parent, p->salt = salt, p->full = 1;
    memcpy(tok_of(c, id), tok, sizeof(int32_t) * (size_t)c->page_tokens);
    int32_t *b = &c->bucket[h % (uint64_t)c->n_bucket];
    p->next = *b;
    *b = id;
}

/* The cached chain of tokens[0..n)'s full pages: ids[k] for k < the returned count (it stops at
 * the first page not cached); hashes[k] (if non-NULL) the chain hashes of all n / P pages. */
static int chain_walk(tl_prefix_cache *c, uint64_t salt, const int32_t *tokens, int n, int32_t *ids,
                      uint64_t *hashes) {
    int P = c->page_tokens, m = 0, stopped = 0;
    uint64_t h = salt;
    for (int k = 0; k < n / P; k++) {
        h = page_hash(h, tokens + (size_t)k * P, P);
        if (hashes) hashes[k] = h;
        if (stopped) continue;
        int id = page_find(c, salt, k ? ids[k - 1] : -1, h, tokens + (size_t)k * P);
        if (id < 0) {
            stopped = 1;
            if (!hashes) break;
            continue;
        }
        ids[m++] = id;
    }
    return m;
}

/* ====== Snapshots. ====== */

static int salt_eq(const tl_pc_snap *s, uint64_t salt, const char *str) {
    return s->salt == salt && !strcmp(s->salt_str, str ? str : "");
}

/* Does snapshot s hold a prefix of tokens, given the prompt's cached chain ids[0..m)? */
static int snap_matches(const tl_prefix_cache *c, const tl_pc_snap *s, const int32_t *tokens,
                        const int32_t *ids, int m) {
    if (s->n_full > m) return 0;
    if (s->n_full > 0 && s->pages[s->n_full - 1] != ids[s->n_full - 1]) return 0;
    int r = s->n_tok - s->n_full * c->page_tokens;
    return !memcmp(s->tail, tokens + (size_t)s->n_full * c->page_tokens, sizeof(int32_t) * r);
}

static void snap_release(tl_prefix_cache *c, int i) {
    tl_pc_snap *s = &c->sn[i];
    int np = s->n_full + (s->n_tok % c->page_tokens ? 1 : 0);
    for (int k = np - 1; k >= 0; k--) page_unref(c, s->pages[k]);
    snap_drop_mem(s);
}

static void fill_io(const tl_prefix_cache *c, const tl_pc_snap *s, int idx, int32_t *pages,
                    tl_pc_io *io) {
    int np = s->n_full + (s->n_tok % c->page_tokens ? 1 : 0);
    memcpy(pages, s->pages, sizeof(int32_t) * np);
    *io = (tl_pc_io){.n_tok = s->n_tok, .n_full = s->n_full, .page = pages, .snap = idx};
}

int tl_pc_lookup(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int max_len,
                 int32_t *pages_out, tl_pc_io *io) {
    c->st.queries++;
    max_len = TL_MIN(max_len, n);
    if (max_len <= 0) return -1;
    uint64_t sh = tl_pc_salt_hash(salt);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(max_len / c->page_tokens + 1));
    if (!ids) return -1; /* a miss: the prompt is computed as without the cache */
    int m = chain_walk(c, sh, tokens, max_len, ids, NULL), best = -1;
    for (int i = 0; i < c->n_snap; i++) {
        const tl_pc_snap *s = &c->sn[i];
        if (!s->used || s->n_tok > max_len || (best >= 0 && s->n_tok <= c->sn[best].n_tok))
            continue;
        if (salt_eq(s, sh, salt) && snap_matches(c, s, tokens, ids, m)) best = i;
    }
    free(ids);
    if (best < 0) return -1;
    c->sn[best].lru = ++c->clock;
    c->st.hits++;
    c->st.hit_tokens += c->sn[best].n_tok;
    fill_io(c, &c->sn[best], best, pages_out, io);
    return best;
}

/* Evicts the least recently used snapshot (not the pinned one); 0 when there is none. */
static int evict_one(tl_prefix_cache *c) {
    int v = -1;
    for (int i = 0; i < c->n_snap; i++)
        if (c->sn[i].used && i != c->pinned && (v < 0 || c->sn[i].lru < c->sn[v].lru)) v = i;
    if (v < 0) return 0;
    snap_release(c, v);
    c->st.evictions++;
    return 1;
}

/* The pool's reclaim hook (kv_pages.h): snapshots evicted LRU until `need` pages are free. */
static void pc_reclaim(void *ctx, int need) {
    tl_prefix_cache *c = ctx;
    while (c->pool->n_free < need && evict_one(c)) {
    }
}

static int free_snap(const tl_prefix_cache *c) {
    for (int i = 0; i < c->n_snap; i++)
        if (!c->sn[i].used && !c->sn[i].reserved) return i;
    return -1;
}

/* An existing snapshot equal to (salt, tokens[0..n)), or -1. */
static int snap_find_same(tl_prefix_cache *c, uint64_t sh, const char *salt, const int32_t *tokens,
                          int n, const int32_t *ids, int m) {
    for (int i = 0; i < c->n_snap; i++) {
        const tl_pc_snap *s = &c->sn[i];
        if (s->used && s->n_tok == n && salt_eq(s, sh, salt) && snap_matches(c, s, tokens, ids, m))
            return i;
    }
    return -1;
}

/* A snapshot slot, evicting the least recently used snapshot when none is free; -1: none. */
static int take_snap(tl_prefix_cache *c) {
    int si = free_snap(c);
    if (si < 0 && evict_one(c)) si = free_snap(c);
    return si;
}

/* The page ids of every page of tokens[0..n) held by `row` (the slot's table): the cached ones of
 * the chain (ids[0..m), already referenced by the caller), then the slot's own full pages
 * published, then a new partial page; each referenced. 0 (nothing held, the chain's references
 * dropped too) when a page cannot be published or taken. */
static int plan_pages(tl_prefix_cache *c, uint64_t sh, const int32_t *tokens, int n,
                      const int32_t *row, int last, int32_t *ids, const uint64_t *hashes, int m) {
    int P = c->page_tokens, nf = n / P, k;
    for (k = m; k < nf; k++) { /* the slot's own page: not in the cache (its chain stops at m) */
        if (c->pg[row[k]].refs > 0) break;
        ids[k] = row[k];
        page_ref(c, ids[k]);
        page_publish(c, ids[k], sh, k ? ids[k - 1] : -1, hashes[k], tokens + (size_t)k * P);
    }
    if (k == nf && n % P && last && c->pg[row[nf]].refs == 0) { /* the slot's own, held */
        page_ref(c, row[nf]);
        ids[k++] = row[nf];
    } else if (k == nf && n % P) {
        int id = tl_kv_pages_take(c->pool); /* may evict: the pages above are referenced */
        if (id >= 0) {
            c->pg[id].refs = 1, c->pg[id].full = 0, c->n_held++;
            ids[k++] = id;
        }
    }
    if (k == nf + (n % P ? 1 : 0)) return 1;
    while (k-- > 0) page_unref(c, ids[k]);
    return 0;
}

/* tl_pc_plan_save's work; si: the snapshot slot reserved for it (tl_pc_reserve), or -1 to take
 * one. The slot holds exactly the pages of n tokens, or (reserved) at least them. */
static int plan_save(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int slot,
                     int last, int si, tl_pc_io *io) {
    int P = c->page_tokens, nf = n / P, np = nf + (n % P ? 1 : 0), rc = 0, res = si >= 0;
    if (res) c->sn[si].reserved = 0; /* taken now, or given back below */
    if (n <= 0 || slot < 0 || slot >= c->pool->max_seqs ||
        (res ? c->pool->np[slot] < np : c->pool->np[slot] != np))
        return 0;
    const int32_t *row = c->pool->table + (size_t)slot * c->pool->max_pages;
    uint64_t sh = tl_pc_salt_hash(salt);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(np + 1));
    uint64_t *hashes = malloc(sizeof(uint64_t) * (size_t)(nf + 1));
    if (!ids || !hashes) goto out;
    int m = chain_walk(c, sh, tokens, n, ids, hashes);
    int same = snap_find_same(c, sh, salt, tokens, n, ids, m);
    if (same >= 0) {
        c->sn[same].lru = ++c->clock;
        rc = 2;
        goto out;
    }
    for (int k = 0; k < m; k++) page_ref(c, ids[k]); /* kept through the evictions below */
    if (!res) si = take_snap(c);
    if (si < 0) {
        for (int k = m - 1; k >= 0; k--) page_unref(c, ids[k]);
        goto out;
    }
    if (!plan_pages(c, sh, tokens, n, row, last, ids, hashes, m)) goto out;
    tl_pc_snap *s = &c->sn[si];
    s->pages = malloc(sizeof(int32_t) * (size_t)np);
    s->tail = malloc(sizeof(int32_t) * (size_t)(n % P + 1));
    s->salt_str = strdup(salt ? salt : "");
    if (!s->pages || !s->tail || !s->salt_str) { /* give everything back: no snapshot */
        snap_drop_mem(s);
        for (int k = np - 1; k >= 0; k--) page_unref(c, ids[k]);
        goto out;
    }
    s->used = 1, s->salt = sh, s->n_tok = n, s->n_full = nf, s->lru = ++c->clock;
    memcpy(s->pages, ids, sizeof(int32_t) * np);
    memcpy(s->tail, tokens + (size_t)nf * P, sizeof(int32_t) * (n % P));
    *io = (tl_pc_io){.n_tok = n,
                     .n_full = nf,
                     .page = NULL,
                     .part_src = n % P ? row[nf] : -1,
                     .part_dst = n % P ? ids[nf] : -1,
                     .part_rows = n % P && ids[nf] != row[nf] ? n % P : 0,
                     .snap = si,
                     .state_in = res};
    rc = 1;
out:
    free(ids);
    free(hashes);
    return rc;
}

int tl_pc_plan_save(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int slot,
                    int last, tl_pc_io *io) {
    return plan_save(c, salt, tokens, n, slot, last, -1, io);
}

int tl_pc_reserve(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n) {
    if (n <= 0) return -1;
    uint64_t sh = tl_pc_salt_hash(salt);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n / c->page_tokens + 1));
    if (!ids) return -1;
    int m = chain_walk(c, sh, tokens, n, ids, NULL);
    int same = snap_find_same(c, sh, salt, tokens, n, ids, m), si = -1;
    free(ids);
    if (same >= 0)
        c->sn[same].lru = ++c->clock;
    else if ((si = take_snap(c)) >= 0)
        c->sn[si].reserved = 1;
    return si;
}

void tl_pc_unreserve(tl_prefix_cache *c, int snap) {
    if (snap >= 0 && snap < c->n_snap) c->sn[snap].reserved = 0;
}

int tl_pc_plan_save_at(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int slot,
                       int snap, tl_pc_io *io) {
    if (snap < 0 || snap >= c->n_snap || !c->sn[snap].reserved) return 0;
    return plan_save(c, salt, tokens, n, slot, 0, snap, io);
}

void tl_pc_commit(tl_prefix_cache *c, const tl_pc_io *io) {
    (void)io;
    c->st.saves++;
}

void tl_pc_abort(tl_prefix_cache *c, const tl_pc_io *io) {
    if (io->snap >= 0 && io->snap < c->n_snap && c->sn[io->snap].used) snap_release(c, io->snap);
}

void tl_pc_clear(tl_prefix_cache *c) {
    for (int i = 0; i < c->n_snap; i++)
        if (c->sn[i].used) snap_release(c, i);
}

void tl_pc_get_stats(const tl_prefix_cache *c, tl_pc_stats *out) {
    *out = c->st;
    long used = 0;
    for (int i = 0; i < c->n_snap; i++) used += c->sn[i].used;
    out->snaps_used = used;
    out->pages_used = c->n_held;
    out->bytes_used = used * (long long)c->snap_bytes + out->pages_used * (long long)c->page_bytes;
}
