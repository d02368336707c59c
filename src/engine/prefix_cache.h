/* The prefix cache's bookkeeping (docs/architecture.md §4.1), host side and backend-independent:
 * which token prefixes have a state snapshot, which cache pages hold their KV, reference counts,
 * LRU and the memory budget. The backend only stores and copies bytes (backend.h cache_save /
 * cache_load); every decision is made here, the same for the CPU and the CUDA backend. Plain C,
 * tested in tests/cpu/test_prefix_cache.c.
 *
 * Model. The cache's pages ARE KV-pool pages (kv_pages.h): a page holds the KV of page_tokens
 * consecutive positions. A full page is content addressed: its identity is (salt, parent page,
 * its tokens), hashed as a chain (the hash of its tokens mixed with its parent's hash), and
 * verified exactly on every match, so a hash collision never shares a page. A snapshot holds the
 * GDN conv and recurrent state after the first n tokens of a sequence, and refers to the chain of
 * full pages below n plus one private partial page holding the positions n - n % page_tokens ..
 * n - 1 (copied, never shared). Saving publishes the slot's own full pages (no copy: the cache
 * takes a reference on them) and copies only the partial one; a hit maps the full pages into the
 * new slot's page table (a reference each) and copies only the partial page. Pages are reference
 * counted by the snapshots that use them, and the cache holds a pool reference on every page a
 * snapshot uses; a page only the cache holds is idle and counts as available to the pool. When
 * the pool runs short (its reclaim hook) or a snapshot slot is needed, snapshots are evicted LRU
 * (a lookup hit or a repeated save makes one the newest); evicting one drops its pages, which
 * return to the pool unless a slot still holds them. A slot never writes below its length, so a
 * shared page is never written while anyone uses it, and a page in a slot's table is never
 * freed. */
#ifndef TL_PREFIX_CACHE_H
#define TL_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kv_pages.h"

/* The cache's view of one pool page (indexed by the pool's page id). */
typedef struct tl_pc_page {
    uint64_t hash;
    int32_t parent; /* page id below, -1 for the first page of a sequence */
    int32_t refs;   /* snapshots using it; > 0: the cache holds the pool page */
    int32_t next;   /* next page in its hash bucket */
    int32_t full;   /* 1: content addressed (in the hash table); 0: a snapshot's partial page */
    uint64_t salt;
} tl_pc_page;

typedef struct tl_pc_snap {
    int used;
    int reserved; /* taken for a snapshot inside a step (tl_pc_reserve), not yet used */
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
    int page_tokens, n_page, n_snap; /* the pool's page size and count */
    size_t page_bytes, snap_bytes;
    tl_kv_pages *pool;
    tl_pc_page *pg;  /* [n_page] */
    int32_t *pg_tok; /* [n_page][page_tokens] the tokens of each full page (exact matches) */
    int32_t *bucket; /* [n_bucket] first page of each hash bucket, -1: empty */
    int n_bucket;
    int n_held; /* pool pages the cache holds */
    int pinned; /* a snapshot that is not evicted (a load in progress), -1: none */
    tl_pc_snap *sn;
    uint64_t clock;
    tl_pc_stats st;
} tl_prefix_cache;

/* What the backend must do for one save or load of positions [0, n_tok) of a slot.
 * Save: the slot's full pages are shared as they are; copy rows [0, part_rows) of pool page
 * part_src (the slot's last page) into pool page part_dst (the snapshot's partial page;
 * part_rows 0: none) and the GDN state into snapshot snap.
 * Load: map page[0..n_full) (shared full pages) into the empty slot's table, give it a page of
 * its own for the rest and copy rows [0, n_tok % page_tokens) of page[n_full] (the snapshot's
 * partial page) into it, and restore the GDN state from snapshot snap. */
typedef struct tl_pc_io {
    int n_tok;
    int n_full;
    const int32_t *page; /* load: n_full + (n_tok % page_tokens ? 1 : 0) pool page ids */
    int part_src, part_dst, part_rows;
    int snap;
    /* save: 1 when the GDN state is in snapshot snap already (the forward wrote it there:
     * tl_pc_plan_save_at), so only the partial page is copied */
    int state_in;
} tl_pc_io;

/* How many snapshot states a budget of `bytes` holds (snap_bytes each, at least one). 0, or
 * TL_ERR_INVALID when it holds none (the message says the least). */
int tl_pc_layout(long long bytes, size_t snap_bytes, int *n_snap, char *err, size_t errlen);
/* A cache of n_snap snapshots over the KV pool `pool` (whose page size is the cache's; the
 * backend holds the storage). Installs itself as the pool's reclaim hook. page_bytes: one pool
 * page (for the stats). 0, TL_ERR_INVALID for bad sizes, TL_ERR_NOMEM. */
int tl_pc_init(tl_prefix_cache *c, tl_kv_pages *pool, int n_snap, size_t page_bytes,
               size_t snap_bytes, char *err, size_t errlen);
/* Frees the bookkeeping and removes the reclaim hook; the pool references it holds are not
 * given back (tl_pc_clear first when the pool lives on). */
void tl_pc_free(tl_prefix_cache *c);

/* The longest snapshot for salt whose tokens are a prefix of tokens[0..n) with n_tok <= max_len:
 * its index, and io filled (page ids in pages_out, at least ceil(max_len / page_tokens) entries)
 * for the backend's load; -1 when there is none. Counts a query (and a hit with its tokens) and
 * makes the hit the most recently used. */
int tl_pc_lookup(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int max_len,
                 int32_t *pages_out, tl_pc_io *io);

/* Plans a snapshot of tokens[0..n) for salt, held by pool slot `slot` (which holds exactly the
 * pages of n tokens): the cached full pages of its chain are referenced, the slot's own full pages
 * past them published (shared, no copy), a pool page taken for the partial page (with `last`, for
 * a slot that will not be written again, the slot's own partial page is held instead: nothing to
 * copy, part_rows 0) and a snapshot slot (evicting least recently used snapshots as needed); io
 * filled. Returns 1 when the backend
 * must now copy (then tl_pc_commit or tl_pc_abort), 2 when it is already cached (made most
 * recent), 0 when it cannot be saved (no free page or snapshot, no host memory). */
int tl_pc_plan_save(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int slot,
                    int last, tl_pc_io *io);
/* A snapshot taken inside an engine step (docs/architecture.md §4.1): the state after tokens[0..n)
 * is written by the forward that computes position n - 1 while the step goes on past it.
 * tl_pc_reserve, before the step: a snapshot slot for it (evicting least recently used snapshots
 * as needed), not visible and never evicted until planned or given back. Returns its index, or
 * -1 when there is nothing to do (already cached: made most recent) or no slot. */
int tl_pc_reserve(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n);
/* A reservation given back (the step failed or was not run). */
void tl_pc_unreserve(tl_prefix_cache *c, int snap);
/* After the step succeeded: tl_pc_plan_save for the reserved snapshot `snap` of a slot that now
 * holds at least the pages of n tokens (its full pages below n published, the rows of its page
 * at n - n % page_tokens to copy), io->state_in set. The reservation ends either way; returns as
 * tl_pc_plan_save (1: copy the page, then tl_pc_commit or tl_pc_abort). */
int tl_pc_plan_save_at(tl_prefix_cache *c, const char *salt, const int32_t *tokens, int n, int slot,
                       int snap, tl_pc_io *io);
/* After a successful backend copy: the planned snapshot becomes visible. */
void tl_pc_commit(tl_prefix_cache *c, const tl_pc_io *io);
/* After a failed copy: the planned snapshot and its new pages are dropped. */
void tl_pc_abort(tl_prefix_cache *c, const tl_pc_io *io);

/* Drops every snapshot (and so every page the cache holds). */
void tl_pc_clear(tl_prefix_cache *c);
void tl_pc_get_stats(const tl_prefix_cache *c, tl_pc_stats *out);

/* The 64-bit hash of a salt string (NULL and "" are the same: no salt). */
uint64_t tl_pc_salt_hash(const char *salt);

#endif
