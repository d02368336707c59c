/* The tokenizer's segment cache: the ids of long stretches of text between added tokens, so
 * that a chat prompt sent again with one more turn (agents resend the whole conversation every
 * turn) only runs the new text through NFC, the regex and BPE (bpe.c encode_segment says why the
 * key is the bytes and the flags).
 *
 * Owns the entries (one malloc each: header, ids, key bytes) in a chained hash table and an LRU
 * list, within a byte budget (SEG_BUDGET_DEFAULT, tl_tokenizer_set_seg_cache). One mutex
 * guards it all; it is held to find an entry and copy its ids out, or to link a new entry in,
 * never while text is encoded, hashed or an entry is built or freed. Running out of memory only
 * means a segment is not cached: the ids the caller computed are unaffected. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "tokenizer/bpe_priv.h"

struct seg_entry {
    seg_entry *chain;         /* next in the bucket */
    seg_entry *newer, *older; /* LRU list */
    uint64_t hash;
    size_t len, n_ids, charge;
    unsigned flags;
    int32_t ids[]; /* n_ids ids, then the len key bytes */
};

static const uint8_t *seg_key(const seg_entry *e) { return (const uint8_t *)(e->ids + e->n_ids); }

/* Buckets for a budget: one per KB (an entry takes at least SEG_MIN_LEN key bytes, its ids and
 * the header, about 200 bytes; most take far more), so chains stay short. */
static size_t seg_n_bucket(size_t budget) {
    size_t n = 16;
    while (n < budget / 1024 && n < ((size_t)1 << 22)) n *= 2;
    return n;
}

void bpe_seg_init(seg_cache *c, size_t budget) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->budget = budget;
}

/* Frees every entry and the buckets; the caller holds the lock or is the only user. */
static void seg_clear(seg_cache *c) {
    for (seg_entry *e = c->newest, *next; e; e = next) {
        next = e->older;
        free(e);
    }
    free(c->bucket);
    c->bucket = NULL;
    c->newest = c->oldest = NULL;
    c->bytes = c->entries = 0;
}

void bpe_seg_free(seg_cache *c) {
    seg_clear(c);
    pthread_mutex_destroy(&c->lock);
}

void bpe_seg_set_budget(seg_cache *c, size_t budget) {
    pthread_mutex_lock(&c->lock);
    seg_clear(c);
    c->budget = budget;
    c->hits = c->misses = c->evictions = 0;
    pthread_mutex_unlock(&c->lock);
}

void bpe_seg_stats(seg_cache *c, tl_tok_seg_stats *out) {
    pthread_mutex_lock(&c->lock);
    *out = (tl_tok_seg_stats){c->entries, c->bytes, c->budget, c->hits, c->misses, c->evictions};
    pthread_mutex_unlock(&c->lock);
}

static void lru_unlink(seg_cache *c, seg_entry *e) {
    if (e->newer)
        e->newer->older = e->older;
    else
        c->newest = e->older;
    if (e->older)
        e->older->newer = e->newer;
    else
        c->oldest = e->newer;
}

static void lru_push(seg_cache *c, seg_entry *e) {
    e->newer = NULL;
    e->older = c->newest;
    if (c->newest) c->newest->newer = e;
    c->newest = e;
    if (!c->oldest) c->oldest = e;
}

/* The entry for (h, s, n, flags), or NULL; lock held. */
static seg_entry *seg_find(const seg_cache *c, uint64_t h, const uint8_t *s, size_t n,
                           unsigned flags) {
    if (!c->bucket) return NULL;
    for (seg_entry *e = c->bucket[h & (c->n_bucket - 1)]; e; e = e->chain)
        if (e->hash == h && e->len == n && e->flags == flags && !memcmp(seg_key(e), s, n)) return e;
    return NULL;
}

int bpe_seg_lookup(seg_cache *c, uint64_t h, const uint8_t *s, size_t n, unsigned flags,
                   tl_tok_ids *out) {
    pthread_mutex_lock(&c->lock);
    seg_entry *e = seg_find(c, h, s, n, flags);
    if (!e) {
        c->misses += c->budget > 0;
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    if (bpe_ids_reserve(out, e->n_ids)) {
        pthread_mutex_unlock(&c->lock);
        return TL_ERR_NOMEM;
    }
    memcpy(out->ids + out->n, e->ids, e->n_ids * sizeof(int32_t));
    out->n += e->n_ids;
    lru_unlink(c, e);
    lru_push(c, e);
    c->hits++;
    pthread_mutex_unlock(&c->lock);
    return 1;
}

/* Unlinks e from its bucket chain; lock held. */
static void chain_remove(seg_cache *c, seg_entry *e) {
    seg_entry **p = &c->bucket[e->hash & (c->n_bucket - 1)];
    while (*p != e) p = &(*p)->chain;
    *p = e->chain;
}

/* Links e in, evicting the least recently used entries until it fits; they are handed back in
 * the list *gone (through ->chain) to be freed after the lock is released. Returns 0, or 1 when
 * e was not linked (the same segment is already there, or no buckets) and the caller frees it. */
static int seg_link(seg_cache *c, seg_entry *e, seg_entry **gone) {
    if (!c->budget || e->charge > c->budget / 8) return 1; /* one segment never flushes all */
    if (!c->bucket) {
        c->n_bucket = seg_n_bucket(c->budget);
        c->bucket = calloc(c->n_bucket, sizeof *c->bucket);
        if (!c->bucket) return 1;
    }
    if (seg_find(c, e->hash, seg_key(e), e->len, e->flags)) return 1; /* another thread's */
    while (c->bytes + e->charge > c->budget) {
        seg_entry *old = c->oldest;
        lru_unlink(c, old);
        chain_remove(c, old);
        c->bytes -= old->charge;
        c->entries--;
        c->evictions++;
        old->chain = *gone;
        *gone = old;
    }
    seg_entry **b = &c->bucket[e->hash & (c->n_bucket - 1)];
    e->chain = *b;
    *b = e;
    lru_push(c, e);
    c->bytes += e->charge;
    c->entries++;
    return 0;
}

void bpe_seg_insert(seg_cache *c, uint64_t h, const uint8_t *s, size_t n, unsigned flags,
                    const int32_t *ids, size_t n_ids) {
    size_t charge = sizeof(seg_entry) + n_ids * sizeof(int32_t) + n;
    seg_entry *e = malloc(charge);
    if (!e) return;
    *e = (seg_entry){.hash = h, .len = n, .n_ids = n_ids, .charge = charge, .flags = flags};
    if (n_ids) memcpy(e->ids, ids, n_ids * sizeof(int32_t));
    memcpy(e->ids + n_ids, s, n);
    seg_entry *gone = NULL;
    pthread_mutex_lock(&c->lock);
    int unused = seg_link(c, e, &gone);
    pthread_mutex_unlock(&c->lock);
    if (unused) free(e);
    while (gone) {
        seg_entry *next = gone->chain;
        free(gone);
        gone = next;
    }
}
