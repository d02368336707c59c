/* Bookkeeping of the paged KV cache, host side and backend-independent: a pool of n_page pages
 * (TL_KV_PAGE tokens each) shared by max_seqs slots, the page table of each slot (the ids of the
 * pages that hold its positions, in order) and the free list. The CUDA backend mirrors the
 * table on the device (src/cuda/gpu.h: paged KV cache); this module only decides which page
 * goes where. Plain C, tested in tests/cpu/test_kv_pages.c.
 *
 * Sharing (the prefix cache, docs/architecture.md §4.1): a page is reference counted by the slot
 * tables that hold it and, once, by the prefix cache when the cache holds it. A page is free when
 * nobody holds it; a page only the cache holds is idle: evictable, so it counts as available
 * (tl_kv_pages_available), and a reservation that finds too few free pages first asks the cache
 * (the reclaim hook) to drop idle pages. A slot never writes below its length, and a shared page
 * lies wholly below the length of every slot holding it, so sharing is read-only. */
#ifndef TL_KV_PAGES_H
#define TL_KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

typedef struct tl_kv_pages {
    int n_page, max_seqs, max_pages, page_tokens;
    int32_t *table; /* [max_seqs][max_pages]: slot s holds pages table[s*max_pages + 0 .. np[s]) */
    int *np;        /* [max_seqs] pages a slot holds */
    int *free_pg;   /* stack of free page ids (n_free of them) */
    int n_free;
    int own_table;
    int32_t *refs;       /* [n_page] slot tables holding the page, + 1 when the cache holds it */
    unsigned char *held; /* [n_page] 1: the prefix cache holds the page */
    int n_idle;          /* pages only the cache holds (refs 1, held) */
    /* Called by a reservation short of free pages (need > n_free, need <= available): drops cache
     * holds (tl_kv_pages_unhold) until n_free >= need or it can drop nothing more. NULL: none. */
    void (*reclaim)(void *ctx, int need);
    void *reclaim_ctx;
} tl_kv_pages;

/* A pool of n_page pages for max_seqs slots of at most max_pages pages each. table: storage for
 * [max_seqs * max_pages] ids supplied by the caller (pinned host memory, say), or NULL to
 * allocate it. 0, TL_ERR_INVALID for bad sizes, TL_ERR_NOMEM. */
int tl_kv_pages_init(tl_kv_pages *p, int n_page, int max_seqs, int max_pages, int page_tokens,
                     int32_t *table, char *err, size_t errlen);
void tl_kv_pages_free(tl_kv_pages *p);

/* Gives slot[i] the pages for its first len[i] positions (i < n), all or nothing: when the pool
 * has too few free pages, nothing changes and TL_ERR_CONTEXT_FULL is returned (with a message
 * saying how many were needed). A slot may appear more than once (the longest length counts).
 * On success old_np[i] (if non-NULL) is the page count slot[i] had before entry i, so the table
 * entries this call wrote lie in old_np[i] .. np[slot[i]) for every i.
 * TL_ERR_INVALID for a slot out of range or a length over max_pages pages. */
int tl_kv_pages_reserve(tl_kv_pages *p, const int *slot, const int *len, int n, int *old_np,
                        char *err, size_t errlen);
/* Free pages plus idle ones (only the prefix cache holds them: evicted on demand). */
int tl_kv_pages_available(const tl_kv_pages *p);
/* Starts an empty slot with n shared pages ids[0..n) (each already held by someone), in position
 * order: each gains a reference. TL_ERR_INVALID when the slot is not empty, n is over max_pages or
 * an id is not a held page. */
int tl_kv_pages_map(tl_kv_pages *p, int slot, const int32_t *ids, int n, char *err, size_t errlen);
/* The prefix cache holds page id (held by a slot, or just taken): one reference. Once per page. */
void tl_kv_pages_hold(tl_kv_pages *p, int id);
/* The prefix cache lets page id go: its reference dropped (free when no slot holds it). */
void tl_kv_pages_unhold(tl_kv_pages *p, int id);
/* A page for the prefix cache alone (held, idle), reclaiming if needed; -1 when none is free. */
int tl_kv_pages_take(tl_kv_pages *p);
/* Drops the slot's reference on each of its pages; a page nobody else holds returns to the pool
 * (its contents are stale: a page is only read below its slot's length, which the next owner
 * writes first); one the cache holds stays. */
void tl_kv_pages_release(tl_kv_pages *p, int slot);
/* Shrinks slot to the pages of its first len positions (a speculative verify rolled back,
 * docs/architecture.md §3.6); the pages past them return to the pool. Nothing when it holds no
 * more. */
void tl_kv_pages_truncate(tl_kv_pages *p, int slot, int len);

#endif
