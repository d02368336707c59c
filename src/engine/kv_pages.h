/* Bookkeeping of the paged KV cache, host side and backend-independent: a pool of n_page pages
 * (TL_KV_PAGE tokens each) shared by max_seqs slots, the page table of each slot (the ids of the
 * pages that hold its positions, in order) and the free list. The CUDA backend mirrors the
 * table on the device (src/cuda/gpu.h: paged KV cache); this module only decides which page
 * goes where. Plain C, tested in tests/cpu/test_kv_pages.c. */
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
/* Returns all pages of slot to the pool (their contents are stale: a page is only read below its
 * slot's length, which the next owner writes first). */
void tl_kv_pages_release(tl_kv_pages *p, int slot);
/* Shrinks slot to the pages of its first len positions (a speculative verify rolled back,
 * docs/architecture.md §3.6); the pages past them return to the pool. Nothing when it holds no
 * more. */
void tl_kv_pages_truncate(tl_kv_pages *p, int slot, int len);

#endif
