/* The prefix cache's bookkeeping (docs/architecture.md §4.1), host side and backend-independent:
 * which token prefixes have a state snapshot, which cache pages hold their KV, reference counts,
 * LRU and the memory budget. The backend only stores and copies bytes (backend.h cache_save /
 * cache_load); every decision is made here, the same for the CPU and the CUDA backend. Plain C,
 * tested in tests/cpu/test_prefix_cache.c.
 *
 * Model. A cache page holds the KV of page_tokens consecutive positions. A full page is content
 * addressed: its identity is (salt, parent page, its tokens), hashed as a chain (the hash of its
 * tokens mixed with its parent's hash), and verified exactly on every match, so a hash collision
 * never shares a page. A snapshot holds the GDN conv and recurrent state after the first n tokens
 * of a sequence, and refers to the chain of full pages below n plus one private partial page
 * holding the positions n - n % page_tokens .. n - 1 (copied, never shared). Pages are reference
 * counted by the snapshots that use them; a page nobody references is free. Eviction is LRU over
 * the snapshots (a lookup hit or a repeated save makes a snapshot the newest); evicting one
 * releases its pages, so pages are LRU with the snapshots that make them reachable. Sessions never
 * hold cache memory: a hit copies the pages and the state into the session's own slot, so
 * eviction can never touch a running sequence. */
#ifndef TL_PREFIX_CACHE_H
#define TL_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tl_pc_page {
    uint64_t hash;
    int32_t parent; /* page id below, -1 for the first page of a sequence */
    int32_t refs;   /* snapshots using it; 0: free */
    int32_t next;   /* next page in its hash bucket, or in the free list */
    int32_t full;   /* 1: content addressed (in the hash table); 0: a snapshot's partial page */
    uint64_t salt;
} tl_pc_page;

typedef struct tl_pc_snap {
    int used;
    uint64_t salt;
    char *salt_str; /* exact salt ("" for none) */
    int n_tok;      /* the snapshot is the state after this many tokens */
    int n_full;     /* full pages below n_tok: n_tok / page_tokens */
    int32_t *pages; /* [n_full + (partial ? 1 : 0)] cache page ids, in position order */
    int32_t *tail;  /* [n_tok % page_tokens] the tokens of the partial page */
    uint64_t lru;   /* larger = used more recently */
} tl_pc_snap;

typedef struct tl_pc_stats {
    long long queries, hits, hit_tokens, evictions, saves;
    long snaps_used, snaps_total, pages_used, pages_total;
    long long bytes_used, bytes_total; /* snapshot states + pages in use / the budget */
} tl_pc_stats;

typedef struct tl_prefix_cache {
    int page_tokens, n_page, n_snap;
    size_t page_bytes, snap_bytes;
    tl_pc_page *pg;
    int32_t *pg_tok; /* [n_page][page_tokens] the tokens of each full page (exact matches) */
    int32_t *bucket; /* [n_bucket] first page of each hash bucket, -1: empty */
    int n_bucket;
    int32_t free_head; /* free page list through tl_pc_page.next */
    int n_free;
    tl_pc_snap *sn;
    uint64_t clock;
    tl_pc_stats st;
} tl_prefix_cache;

/* What the backend must copy for one save or load: positions [0, n_tok) of a slot against cache
 * pages page[k] for position page k (k < n_pages = ceil(n_tok / page_tokens)); on a save, page[k]
 * < 0 means that page is already in the cache (nothing to copy). snap: the state snapshot. */
typedef struct tl_pc_io {
    int n_tok;
    int n_pages;
    const int32_t *page;
    int snap;
} tl_pc_io;

/* How a budget of `bytes` is split: half for snapshot states (snap_bytes each, at least one), the
 * rest for pages (page_bytes each, at least two). 0, or TL_ERR_INVALID when the budget is below
 * one snapshot and two pages (the message says the least). */
int tl_pc_layout(long long bytes, size_t page_bytes, size_t snap_bytes, int *n_page, int *n_snap,
                 char *err, size_t errlen);
/* A cache of n_page pages and n_snap snapshots (the backend holds the storage). 0,
 * TL_ERR_INVALID for bad sizes, TL_ERR_NOMEM. */
int tl_pc_init(tl_prefix_cache *c, int n_page, int n_snap, int page_tokens, size_t page_bytes,
               size_t snap_bytes, char *err, size_t errlen);
void tl_pc_free(tl_prefix_cache *c);

/* The longest snapshot for salt whose tokens are a prefix of tokens[0..n) with n_tok <= max_len:
 * its index, and io filled (page ids in pages_out, at least ceil(max_len / page_tokens) entries)
 * for the backend's load; -1 when there is none. Counts a query (and a hit with its tokens) and
 * makes the hit the most recently used. */
int tl_pc_lookup(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int max_len,
                 int32_t *pages_out, tl_pc_io *io);

/* Plans a snapshot of tokens[0..n) for salt: reuses the cached full pages of its chain, takes new
 * pages and a snapshot slot (evicting least recently used snapshots as needed), and fills io
 * (pages_out: at least ceil(n / page_tokens) entries, -1 where the page is already cached).
 * Returns 1 when the backend must now copy (then tl_pc_commit or tl_pc_abort), 2 when it is
 * already cached (made most recent), 0 when it cannot be saved (longer than the budget, or no
 * host memory). */
int tl_pc_plan_save(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n,
                    int32_t *pages_out, tl_pc_io *io);
/* After a successful backend copy: the planned snapshot becomes visible. */
void tl_pc_commit(tl_prefix_cache *c, const tl_pc_io *io);
/* After a failed copy: the planned snapshot and its new pages are dropped. */
void tl_pc_abort(tl_prefix_cache *c, const tl_pc_io *io);

/* Drops every snapshot (and so every page). */
void tl_pc_clear(tl_prefix_cache *c);
void tl_pc_get_stats(const tl_prefix_cache *c, tl_pc_stats *out);

/* The 64-bit hash of a salt string (NULL and "" are the same: no salt). */
uint64_t tl_pc_salt_hash(const char *salt);

#endif
