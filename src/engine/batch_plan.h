/* How a backend step is cut into micro-batches, host side and backend-independent: the entries'
 * tokens are packed into micro-batches of at most max_tok tokens and max_seg segments (a segment
 * = consecutive tokens of one entry); when long_min > 0, an entry of at least long_min tokens
 * (a long prefill chunk) runs alone, chunk after chunk, after all the short entries (decode
 * tokens, short prompts), which are batched together. Then each micro-batch's metadata (the
 * layout of tl_gpu_seqs in src/cuda/gpu.h) and its kind: the many-token GEMM path, the
 * one-token-per-sequence decode path, or the generic path. Plain C, tested in
 * tests/cpu/test_batch_plan.c. */
#ifndef TL_BATCH_PLAN_H
#define TL_BATCH_PLAN_H

#include <stdint.h>
#include "engine/backend.h"

typedef struct tl_mb_seg {
    int entry, start, n; /* tokens start .. start+n-1 of entry */
} tl_mb_seg;

typedef struct tl_mb_iter {
    const int *n_tok; /* [n] tokens per entry, each >= 1 */
    int n, max_tok, max_seg, long_min;
    int mix; /* long chunks join the short entries' micro-batch (tl_mb_begin_mixed) */
    /* NULL, or [n]: cut[i] > 0 ends a micro-batch after token cut[i] - 1 of entry i (set after
     * tl_mb_begin*; a backend that snapshots the state there: backend.h snap_at) */
    const int *cut;
    int pass, i, off; /* position: pass 0 = short entries, 1 = long ones */
} tl_mb_iter;

/* Starts an iteration (max_tok >= 1, max_seg >= 1; long_min 0 = no long path). */
tl_mb_iter tl_mb_begin(const int *n_tok, int n, int max_tok, int max_seg, int long_min);
/* The same, mixed: the long entries' chunks are packed after the short entries into the same
 * micro-batches (so that one pass over the weights serves decode tokens and prefill chunks
 * together) instead of running alone. Within every micro-batch the segments shorter than
 * long_min come first and all later ones have at least long_min tokens (a long entry's piece
 * joins a micro-batch only if at least long_min tokens of room are left; else the micro-batch
 * ends). A micro-batch holding one segment of >= long_min tokens is still TL_MB_LONG. */
tl_mb_iter tl_mb_begin_mixed(const int *n_tok, int n, int max_tok, int max_seg, int long_min);
/* The next micro-batch into segs[0 .. *n_seg) (segs holds max_seg): 1, or 0 when done. */
int tl_mb_next(tl_mb_iter *it, tl_mb_seg *segs, int *n_seg);

/* Metadata of one micro-batch: arrays of at least max_tok (tokens, tok_*) or max_seg (seg_*,
 * out_rows) entries, filled by tl_mb_fill. */
typedef struct tl_mb_meta {
    int32_t *tokens, *tok_pos, *tok_slot, *tok_seg, *seg_tok0, *seg_n, *seg_slot, *seg_pos0,
        *out_rows;
} tl_mb_meta;

typedef enum { TL_MB_GENERIC = 0, TL_MB_DECODE = 1, TL_MB_LONG = 2 } tl_mb_kind;

typedef struct tl_mb_info {
    int n_tok, n_seg;
    int n_out;      /* rows whose last token's hidden state goes to the LM head */
    int out_row0;   /* logits row of the first of them (rows are consecutive) */
    int all_single; /* every segment is one token */
    int max_kv;     /* the longest context any token attends to */
} tl_mb_info;

/* Logits rows of a step's entries: row_of[i] = -1 where entry i wants neither logits nor a
 * sample, else its row, numbered in the order the plan finishes the entries (the short ones in
 * entry order, then the long ones), so that the outputs of every micro-batch have consecutive rows
 * from out_row0. Numbering in entry order breaks that when a long entry with a row lies between
 * short ones. Returns the number of rows. */
int tl_mb_rows(const tl_fwd_entry *e, int n, int long_min, int *row_of);

/* Fills m from entries e and segments segs[0..n_seg): token t of the micro-batch gets its id,
 * position, slot and segment; segment s its first token, length, slot and first position. A
 * segment that ends its entry, where row_of[entry] >= 0, yields an output row (its last token),
 * whose logits row is row_of[entry]; these rows must be consecutive (row_of from tl_mb_rows). */
void tl_mb_fill(const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg, const int *row_of,
                tl_mb_meta *m, tl_mb_info *info);

/* The path of a micro-batch: TL_MB_LONG when long_min > 0, it is one segment and has at least
 * long_min tokens; TL_MB_DECODE when every segment is one token and there are at most
 * max_decode of them; else TL_MB_GENERIC. */
tl_mb_kind tl_mb_kind_of(const tl_mb_info *info, int long_min, int max_decode);

/* Split-KV partials per (token, head) for the attention of a micro-batch: max_split on the
 * decode path; otherwise as many as part_rows partial rows allow for its tokens, at most one per
 * 32 keys of its longest context, at least 1. */
int tl_mb_attn_splits(const tl_mb_info *info, tl_mb_kind kind, int max_split, int part_rows);

#endif
