/* Byte-level BPE tokenizer (Qwen3/3.5/3.6 tokenizer.json), matching HF tokenizers id for id:
 * the tokenizer object's tables, BPE on one piece, the encoding pipeline and decoding. Loading
 * is bpe_load.c (with tokjson.c, the tokenizer.json scanner), the pre-tokenizer regex
 * bpe_regex.c; bpe_priv.h holds what they share.
 *
 * Owns: the loaded vocabulary (id -> raw bytes, raw bytes -> id), the merge table
 * ((left id, right id) -> (rank, merged id)), the added-token tries, the compiled pre-tokenizer
 * regex and a word cache. Everything but the two caches is immutable after load: the word cache
 * (short pieces -> ids) is guarded by striped mutexes, the segment cache (bpe_seg.c: long text
 * between added tokens -> ids) by its own mutex, so concurrent tl_tokenize calls on one tokenizer
 * are safe (each call makes its own PCRE2 match data). Neither cache changes any result.
 *
 * Invariant: every piece of text handed to the regex and to BPE is valid UTF-8 (invalid input is
 * repaired first, common/utf8.c), so PCRE2 runs with its UTF check off. The merge loop is HF's
 * Word::merge_all (heap of (rank, position), stale entries skipped by re-checking the merged
 * id), not a simplified variant, so odd vocabularies give HF's answer too. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/buf.h"
#include "common/status.h"
#include "common/utf8.h"
#include "tokenizer/bpe_priv.h"

/* ====== Id arrays. ====== */

void tl_tok_ids_free(tl_tok_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int bpe_ids_reserve(tl_tok_ids *v, size_t extra) {
    if (v->n + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return TL_ERR_NOMEM;
    v->ids = p;
    v->cap = cap;
    return 0;
}

/* ====== Hashing. ====== */

uint64_t bpe_hash_bytes(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        h = (h ^ (k * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++) k |= (uint64_t)p[i] << (8 * i);
    h = (h ^ (k * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

/* ====== The tables. ====== */

static const uint8_t *tok_bytes(const tl_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id];
    return (const uint8_t *)t->arena + t->off[id];
}

static int32_t vocab_find(const tl_tokenizer *t, const void *s, size_t n) {
    if (!t->vcap) return -1;
    size_t mask = t->vcap - 1, i = bpe_hash_bytes(s, n) & mask;
    for (;;) {
        int32_t v = t->vhash[i];
        if (!v) return -1;
        size_t l;
        const uint8_t *b = tok_bytes(t, v - 1, &l);
        if (l == n && !memcmp(b, s, n)) return v - 1;
        i = (i + 1) & mask;
    }
}

void bpe_vocab_insert(tl_tokenizer *t, int32_t id) {
    size_t n;
    const uint8_t *s = tok_bytes(t, id, &n);
    size_t mask = t->vcap - 1, i = bpe_hash_bytes(s, n) & mask;
    for (;;) {
        int32_t v = t->vhash[i];
        if (!v) {
            t->vhash[i] = id + 1;
            return;
        }
        size_t l;
        const uint8_t *b = tok_bytes(t, v - 1, &l);
        if (l == n && !memcmp(b, s, n)) return; /* first one wins */
        i = (i + 1) & mask;
    }
}

static const merge_val *merge_find(const tl_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->mcap - 1, i = hash_u64(key) & mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == key) return &t->mval[i];
        if (k == UINT64_MAX) return NULL;
        i = (i + 1) & mask;
    }
}

void bpe_merge_insert(tl_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->mcap - 1, i = hash_u64(key) & mask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key) i = (i + 1) & mask;
    t->mkey[i] = key;
    t->mval[i].rank = rank;
    t->mval[i].new_id = new_id;
}

/* ====== Added-token tries. ====== */

/* Trie construction goes through a dense temporary node table (256 children per node; added
 * tokens are few and short), then flattens each node's children into a contiguous edge list. */
typedef struct {
    int32_t child[256];
    int32_t id;
} trie_tmp;

void bpe_trie_free(trie *t) {
    free(t->nodes);
    free(t->edges);
    memset(t, 0, sizeof *t);
}

int bpe_trie_build(trie *t, const trie_item *items, size_t n) {
    memset(t, 0, sizeof *t);
    for (int b = 0; b < 256; b++) t->root[b] = -1;
    t->lead = -1;
    t->n_tokens = (int)n;
    if (!n) return 0;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total += items[i].n;
    trie_tmp *tmp = malloc(total * sizeof *tmp);
    if (!tmp) return TL_ERR_NOMEM;
    int32_t n_nodes = 1;
    memset(tmp[0].child, 0xff, sizeof tmp[0].child);
    tmp[0].id = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t cur = 0;
        for (size_t k = 0; k < items[i].n; k++) {
            uint8_t b = (uint8_t)items[i].s[k];
            if (tmp[cur].child[b] < 0) {
                memset(tmp[n_nodes].child, 0xff, sizeof tmp[n_nodes].child);
                tmp[n_nodes].id = -1;
                tmp[cur].child[b] = n_nodes++;
            }
            cur = tmp[cur].child[b];
        }
        tmp[cur].id = items[i].id; /* a later duplicate content wins */
    }
    t->nodes = malloc((size_t)n_nodes * sizeof *t->nodes);
    t->edges = malloc((size_t)n_nodes * sizeof *t->edges);
    if (!t->nodes || !t->edges) {
        free(tmp);
        bpe_trie_free(t);
        return TL_ERR_NOMEM;
    }
    int32_t n_edges = 0;
    for (int32_t v = 0; v < n_nodes; v++) {
        t->nodes[v].id = tmp[v].id;
        t->nodes[v].first_edge = n_edges;
        t->nodes[v].n_edge = 0;
        for (int b = 0; b < 256; b++) {
            if (tmp[v].child[b] < 0) continue;
            t->edges[n_edges].byte = (uint8_t)b;
            t->edges[n_edges].child = tmp[v].child[b];
            n_edges++;
            t->nodes[v].n_edge++;
        }
    }
    int n_lead = 0;
    for (int b = 0; b < 256; b++) {
        t->root[b] = tmp[0].child[b];
        if (t->root[b] >= 0) t->lead = n_lead++ ? -1 : b;
    }
    t->n_nodes = n_nodes;
    free(tmp);
    return 0;
}

/* Longest token starting at s[0]; returns its id and sets *mlen, or -1. */
static int32_t trie_longest(const trie *t, const uint8_t *s, size_t n, size_t *mlen) {
    int32_t cur = t->root[s[0]], best = -1;
    size_t k = 1;
    while (cur >= 0) {
        if (t->nodes[cur].id >= 0) {
            best = t->nodes[cur].id;
            *mlen = k;
        }
        if (k >= n) break;
        const trie_node *nd = &t->nodes[cur];
        int32_t next = -1;
        for (int32_t e = nd->first_edge; e < nd->first_edge + nd->n_edge; e++) {
            if (t->edges[e].byte == s[k]) {
                next = t->edges[e].child;
                break;
            }
        }
        cur = next;
        k++;
    }
    return best;
}

/* ====== Lookups. ====== */

int tl_tokenizer_n_vocab(const tl_tokenizer *t) { return t->n_vocab; }

void tl_tokenizer_set_seg_cache(tl_tokenizer *t, size_t bytes) {
    bpe_seg_set_budget(&t->seg, bytes);
}

void tl_tokenizer_seg_cache_stats(const tl_tokenizer *t, tl_tok_seg_stats *out) {
    bpe_seg_stats((seg_cache *)&t->seg, out);
}

int tl_token_id(const tl_tokenizer *t, const char *text) {
    size_t n = strlen(text);
    if (!n) return TL_ERR_INVALID;
    for (int k = 0; k < 2; k++) {
        const trie *tr = k ? &t->added_norm : &t->added_raw;
        size_t ml = 0;
        int32_t id = tr->n_tokens ? trie_longest(tr, (const uint8_t *)text, n, &ml) : -1;
        if (id >= 0 && ml == n) return id;
    }
    int32_t id = vocab_find(t, text, n);
    return id >= 0 ? id : TL_ERR_INVALID;
}

const char *tl_token_str(const tl_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !t->present[id]) {
        *len = 0;
        return NULL;
    }
    return (const char *)tok_bytes(t, id, len);
}

int tl_token_is_special(const tl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_SPECIAL);
}

int tl_token_is_added(const tl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_ADDED);
}

/* ====== BPE on one pre-tokenized piece. ====== */

typedef struct {
    uint32_t rank;
    int32_t pos, new_id;
} heap_ent;

static int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

typedef struct {
    int32_t c, prev, next, len;
} bpe_sym;

#define BPE_STACK 64

/* One symbol per byte (its single-byte token, or unk; HF drops a byte with neither, and fuses
 * runs of unk with fuse_unk), linked as a list. Returns the count. */
static int32_t bpe_symbols(const tl_tokenizer *t, const uint8_t *s, size_t n, bpe_sym *sym) {
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && ns > 0 && sym[ns - 1].c == t->unk_id) {
                sym[ns - 1].len++;
                continue;
            }
            id = t->unk_id;
        }
        sym[ns] = (bpe_sym){id, ns - 1, ns + 1, 1};
        ns++;
    }
    if (ns) sym[ns - 1].next = -1;
    return ns;
}

/* Pushes the merge of symbol pos with its successor, if the pair has one. */
static inline void bpe_push_pair(const tl_tokenizer *t, const bpe_sym *sym, int32_t pos,
                                 heap_ent *heap, size_t *nh) {
    const merge_val *m = merge_find(t, sym[pos].c, sym[sym[pos].next].c);
    if (m) heap_push(heap, nh, (heap_ent){m->rank, pos, m->new_id});
}

/* HF's Word::merge_all: the lowest-ranked pair first (leftmost among equal ranks); an entry is
 * stale when its left symbol was merged away or its pair no longer gives new_id. Each merge
 * pushes at most two entries and removes one symbol, so the heap never holds more than 3n. */
static void bpe_merge_all(const tl_tokenizer *t, bpe_sym *sym, int32_t ns, heap_ent *heap) {
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) bpe_push_pair(t, sym, i, heap, &nh);
    while (nh) {
        heap_ent top = heap_pop(heap, &nh);
        bpe_sym *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t np = cur->next;
        const merge_val *m = merge_find(t, cur->c, sym[np].c);
        if (!m || m->new_id != top.new_id) continue;
        cur->c = top.new_id;
        cur->len += sym[np].len;
        cur->next = sym[np].next;
        sym[np].len = 0;
        if (cur->next >= 0) sym[cur->next].prev = top.pos;
        if (cur->prev >= 0) bpe_push_pair(t, sym, cur->prev, heap, &nh);
        if (cur->next >= 0) bpe_push_pair(t, sym, top.pos, heap, &nh);
    }
}

/* BPE on the bytes of one piece; appends the ids to out. */
static int bpe_word(const tl_tokenizer *t, const uint8_t *s, size_t n, tl_tok_ids *out) {
    bpe_sym sym_stack[BPE_STACK];
    heap_ent heap_stack[3 * BPE_STACK];
    bpe_sym *sym = sym_stack;
    heap_ent *heap = heap_stack;
    if (n > BPE_STACK) {
        sym = malloc(n * sizeof *sym);
        heap = malloc(3 * n * sizeof *heap);
        if (!sym || !heap) {
            free(sym);
            free(heap);
            return TL_ERR_NOMEM;
        }
    }
    int32_t ns = bpe_symbols(t, s, n, sym);
    bpe_merge_all(t, sym, ns, heap);
    int st = bpe_ids_reserve(out, (size_t)ns);
    if (!st)
        for (int32_t i = 0; i < ns; i++)
            if (sym[i].len) out->ids[out->n++] = sym[i].c;
    if (sym != sym_stack) {
        free(sym);
        free(heap);
    }
    return st;
}

/* BPE with the word cache in front. The cache only holds short pieces with few ids; it is
 * direct-mapped (a colliding word evicts the old one) and each slot is read and written under
 * its stripe's mutex. */
static int bpe_piece(const tl_tokenizer *t, const uint8_t *s, size_t n, tl_tok_ids *out) {
    if (n == 1 && t->byte_id[s[0]] >= 0 && !t->ignore_merges) {
        if (bpe_ids_reserve(out, 1)) return TL_ERR_NOMEM;
        out->ids[out->n++] = t->byte_id[s[0]];
        return 0;
    }
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, s, n);
        if (id >= 0 && !(t->flags[id] & TOKF_ADDED)) {
            if (bpe_ids_reserve(out, 1)) return TL_ERR_NOMEM;
            out->ids[out->n++] = id;
            return 0;
        }
    }
    if (n > CACHE_MAX_LEN) return bpe_word(t, s, n, out);
    uint64_t h = bpe_hash_bytes(s, n);
    size_t slot = (size_t)(h & (t->cache_slots - 1));
    pthread_mutex_t *lock = (pthread_mutex_t *)&t->locks[slot % CACHE_LOCKS];
    cache_slot *c = &t->cache[slot];
    pthread_mutex_lock(lock);
    if (c->len == n && c->hash == (uint32_t)(h >> 32) && !memcmp(c->bytes, s, n)) {
        int nid = c->n_ids;
        if (bpe_ids_reserve(out, (size_t)nid)) {
            pthread_mutex_unlock(lock);
            return TL_ERR_NOMEM;
        }
        memcpy(out->ids + out->n, c->ids, (size_t)nid * sizeof(int32_t));
        out->n += (size_t)nid;
        pthread_mutex_unlock(lock);
        return 0;
    }
    pthread_mutex_unlock(lock);
    size_t before = out->n;
    int st = bpe_word(t, s, n, out);
    if (st || out->n == before || out->n - before > CACHE_MAX_IDS) return st;
    pthread_mutex_lock(lock);
    c->hash = (uint32_t)(h >> 32);
    c->len = (uint8_t)n;
    c->n_ids = (uint8_t)(out->n - before);
    memcpy(c->bytes, s, n);
    memcpy(c->ids, out->ids + before, (out->n - before) * sizeof(int32_t));
    pthread_mutex_unlock(lock);
    return 0;
}

/* ====== Encoding pipeline. ====== */

typedef struct {
    const tl_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    unsigned flags;
    tl_tok_ids *out;
} enc_ctx;

static int regex_match(enc_ctx *e, const pcre2_code *re, int jit, const uint8_t *s, size_t n,
                       size_t off) {
    int rc;
    for (;;) {
        if (jit)
            rc = pcre2_jit_match(re, s, n, off, 0, e->md, e->mctx);
        else
            rc = pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || e->jstack) return rc;
        /* deep backtracking (very long runs): retry once with a big JIT stack */
        e->mctx = pcre2_match_context_create(NULL);
        e->jstack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
        if (!e->mctx || !e->jstack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
    }
}

/* Splits normalized text with the pre-tokenizer regex (Isolated: matches and the gaps between
 * them are both pieces) and runs BPE on each piece. */
static int encode_pretok(enc_ctx *e, const uint8_t *s, size_t n) {
    const tl_tokenizer *t = e->t;
    const pcre2_code *re = t->re;
    int jit = t->jit;
    if (t->re_compat && bpe_regex_needs_compat(s, n)) re = t->re_compat, jit = t->jit_compat;
    size_t last = 0, off = 0;
    while (off < n) {
        int rc = regex_match(e, re, jit, s, n, off);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return rc == PCRE2_ERROR_NOMEMORY ? TL_ERR_NOMEM : TL_ERR_INTERNAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m0 > last) {
            int st = bpe_piece(e->t, s + last, m0 - last, e->out);
            if (st) return st;
        }
        if (m1 > m0) {
            int st = bpe_piece(e->t, s + m0, m1 - m0, e->out);
            if (st) return st;
            off = last = m1;
        } else { /* empty match: splits the gap here; step one character */
            last = m0;
            if (m0 >= n) break;
            size_t adv = 1;
            tl_utf8_decode(s + m0, n - m0, NULL, &adv);
            off = m0 + adv;
        }
    }
    if (last < n) return bpe_piece(e->t, s + last, n - last, e->out);
    return 0;
}

/* The first position >= i of s[0, n) where a token of tr may start, or n. Qwen's added tokens
 * all start with '<': memchr finds the next one far faster than a loop over the root table. */
static size_t trie_next_start(const trie *tr, const uint8_t *s, size_t i, size_t n) {
    if (tr->lead >= 0) {
        const uint8_t *p = i < n ? memchr(s + i, tr->lead, n - i) : NULL;
        return p ? (size_t)(p - s) : n;
    }
    while (i < n && tr->root[s[i]] < 0) i++;
    return i;
}

/* Splits text at added tokens of trie tr (leftmost-longest, HF's Aho-Corasick match kind); the
 * text between them goes to next(). With TL_TOKENIZE_SPLIT_SPECIAL a special token's match is
 * left in the text, as HF does (the search then resumes after it). */
static int split_added(enc_ctx *e, const trie *tr, const uint8_t *s, size_t n,
                       int (*next)(enc_ctx *, const uint8_t *, size_t)) {
    if (!tr->n_tokens) return next(e, s, n);
    size_t gap = 0, i = 0;
    while ((i = trie_next_start(tr, s, i, n)) < n) {
        size_t ml = 0;
        int32_t id = trie_longest(tr, s + i, n - i, &ml);
        if (id < 0) {
            i++;
            continue;
        }
        if ((e->flags & TL_TOKENIZE_SPLIT_SPECIAL) && (e->t->flags[id] & TOKF_SPECIAL)) {
            i += ml;
            continue;
        }
        if (i > gap) {
            int st = next(e, s + gap, i - gap);
            if (st) return st;
        }
        if (bpe_ids_reserve(e->out, 1)) return TL_ERR_NOMEM;
        e->out->ids[e->out->n++] = id;
        i += ml;
        gap = i;
    }
    if (gap < n) return next(e, s + gap, n - gap);
    return 0;
}

static int encode_normalized(enc_ctx *e, const uint8_t *s, size_t n) {
    return split_added(e, &e->t->added_norm, s, n, encode_pretok);
}

/* ====== NFC as HF computes it. ======
 * HF tokenizers' normalization tables predate Unicode 15 (utf8proc's): the marks below are unknown
 * to it, so it treats each as a starter that neither decomposes nor composes, and canonical
 * reordering does not move it. We get the same by cutting the text at those code points and
 * running utf8proc's NFC on the pieces between them. Generated and verified against HF by
 * tools/tok_nfc_compat.py (see notes/2026-12-02-tokenizer.md); rerun it when either library's
 * Unicode version changes. */
/* 111 code points, 39 ranges; utf8proc 15.0.0; 15141 candidates checked */
static const uint32_t HF_NFC_OPAQUE[][2] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E},
    {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
    {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}};

static int nfc_opaque(uint32_t cp) {
    return cp >= HF_NFC_OPAQUE[0][0] &&
           bpe_in_ranges(HF_NFC_OPAQUE, (int)(sizeof HF_NFC_OPAQUE / sizeof HF_NFC_OPAQUE[0]), cp);
}

static int nfc_append(tl_buf *b, const uint8_t *s, size_t n) {
    if (!n) return 0;
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t ol =
        utf8proc_map(s, (utf8proc_ssize_t)n, &o, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (ol < 0) return ol == UTF8PROC_ERROR_NOMEM ? TL_ERR_NOMEM : TL_ERR_INTERNAL;
    int st = tl_buf_append(b, o, (size_t)ol);
    free(o);
    return st;
}

/* NFC of valid UTF-8 s, appended to b. Only the stretches that can change are given to
 * utf8proc: a character below U+0300 has combining class 0 and is never the second half of a
 * composition, so the text splits before it without changing the result. A stretch is a run of
 * characters >= U+0300 plus the character just before it (a base letter may compose with the
 * run's first mark). Opaque characters (above) end a stretch and are copied as they are. */
static int nfc_hf(const uint8_t *s, size_t n, tl_buf *b) {
    size_t i = 0, copied = 0, low = SIZE_MAX; /* low: start of the previous char if < U+0300 */
    while (i < n) {
        if (s[i] < 0xCC) {
            low = i;
            i += s[i] < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        size_t k;
        if (tl_utf8_decode(s + i, n - i, &cp, &k) != TL_UTF8_OK) return TL_ERR_INTERNAL;
        if (nfc_opaque(cp)) {
            low = SIZE_MAX;
            i += k;
            continue;
        }
        size_t r = low != SIZE_MAX ? low : i, j = i + k;
        while (j < n && s[j] >= 0xCC) {
            if (tl_utf8_decode(s + j, n - j, &cp, &k) != TL_UTF8_OK) return TL_ERR_INTERNAL;
            if (nfc_opaque(cp)) break;
            j += k;
        }
        int st = tl_buf_append(b, s + copied, r - copied);
        if (st || (st = nfc_append(b, s + r, j - r))) return st;
        copied = i = j;
        low = SIZE_MAX;
    }
    return tl_buf_append(b, s + copied, n - copied);
}

/* NFC, skipped when no byte could start a character >= U+0300: every code point below U+0300
 * has combining class 0 and is its own NFC, and nothing before it can compose with it. */
static int encode_gap(enc_ctx *e, const uint8_t *s, size_t n) {
    if (!e->t->nfc) return encode_normalized(e, s, n);
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++;
    if (i == n) return encode_normalized(e, s, n);
    tl_buf b = {0};
    int st = nfc_hf(s, n, &b);
    if (!st) st = encode_normalized(e, (const uint8_t *)b.p, b.n);
    tl_buf_free(&b);
    return st;
}

/* A stretch of raw text between added tokens, through the segment cache (bpe_seg.c) when it is
 * long. Its ids are a function of its bytes and of flags alone: encode_gap reads nothing else
 * but the immutable tables and the word cache (whose answers equal bpe_word's), and flags enter
 * only through split_added on added_norm (TL_TOKENIZE_SPLIT_SPECIAL leaves special normalized
 * tokens in the text). Hence the key (bytes, flags), compared in full. */
static int encode_segment(enc_ctx *e, const uint8_t *s, size_t n) {
    if (n < SEG_MIN_LEN) return encode_gap(e, s, n);
    seg_cache *c = (seg_cache *)&e->t->seg;
    uint64_t h = bpe_hash_bytes(s, n);
    int hit = bpe_seg_lookup(c, h, s, n, e->flags, e->out);
    if (hit) return hit < 0 ? hit : 0;
    size_t before = e->out->n;
    int st = encode_gap(e, s, n);
    if (!st) bpe_seg_insert(c, h, s, n, e->flags, e->out->ids + before, e->out->n - before);
    return st;
}

int tl_tokenize(const tl_tokenizer *t, const char *text, size_t len, unsigned flags,
                tl_tok_ids *out) {
    size_t before = out->n;
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *fixed = NULL;
    if (!tl_utf8_valid(s, len)) {
        fixed = malloc(3 * len);
        if (!fixed) return TL_ERR_NOMEM;
        len = tl_utf8_repair(s, len, fixed);
        s = fixed;
    }
    enc_ctx e = {t, NULL, NULL, NULL, flags, out};
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    int st = e.md ? 0 : TL_ERR_NOMEM;
    if (!st && len) st = split_added(&e, &t->added_raw, s, len, encode_segment);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.mctx) pcre2_match_context_free(e.mctx);
    if (e.jstack) pcre2_jit_stack_free(e.jstack);
    free(fixed);
    if (st) {
        out->n = before;
        return st;
    }
    size_t added = out->n - before;
    return added > INT32_MAX ? TL_ERR_INVALID : (int)added;
}

/* ====== Decoding. ====== */

int tl_detokenize(const tl_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                  size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    tl_buf raw = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            tl_buf_free(&raw);
            return TL_ERR_INVALID;
        }
        if (!t->present[id]) continue;
        if ((flags & TL_DETOK_SKIP_SPECIAL) && (t->flags[id] & TOKF_SPECIAL)) continue;
        size_t l;
        const uint8_t *b = tok_bytes(t, id, &l);
        tl_buf_append(&raw, b, l);
    }
    char *res = raw.err ? NULL : malloc(3 * raw.n + 1);
    if (!res) {
        tl_buf_free(&raw);
        return TL_ERR_NOMEM;
    }
    size_t rl = raw.n ? tl_utf8_repair(raw.p, raw.n, (uint8_t *)res) : 0;
    res[rl] = 0;
    tl_buf_free(&raw);
    *out = res;
    *out_len = rl;
    return 0;
}

/* The stream keeps an unfinished character's bytes in a tl_utf8_carry: the repair decides from
 * at most 4 bytes, so the pushes give the same characters as repairing everything at once. */
struct tl_detok_stream {
    const tl_tokenizer *t;
    unsigned flags;
    tl_utf8_carry carry;
    tl_buf out;
};

int tl_detok_stream_create(const tl_tokenizer *t, unsigned flags, tl_detok_stream **out) {
    tl_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return TL_ERR_NOMEM;
    s->t = t;
    s->flags = flags;
    *out = s;
    return 0;
}

void tl_detok_stream_free(tl_detok_stream *s) {
    if (!s) return;
    tl_buf_free(&s->out);
    free(s);
}

size_t tl_detok_stream_pending(const tl_detok_stream *s) { return s->carry.n; }

int tl_detok_stream_push(tl_detok_stream *s, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (id < 0 || id >= s->t->n_vocab) return TL_ERR_INVALID;
    size_t l = 0;
    const uint8_t *b = NULL;
    if (s->t->present[id] &&
        !((s->flags & TL_DETOK_SKIP_SPECIAL) && (s->t->flags[id] & TOKF_SPECIAL)))
        b = tok_bytes(s->t, id, &l);
    tl_buf_truncate(&s->out, 0);
    int st = tl_buf_reserve(&s->out, 0);
    if (!st) st = tl_utf8_repair_stream(&s->carry, b, l, &s->out);
    if (st) return st;
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}

int tl_detok_stream_flush(tl_detok_stream *s, const char **text, size_t *len) {
    tl_buf_truncate(&s->out, 0);
    int st = tl_buf_reserve(&s->out, 0);
    if (!st) st = tl_utf8_repair_end(&s->carry, &s->out);
    if (st) return st;
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}
