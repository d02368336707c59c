/* The MTP head's rows on the GPU, host side and backend-independent (docs/architecture.md §3.6):
 * which head rows a micro-batch of the trunk makes computable and where their hiddens come from,
 * which hiddens the per-slot ring keeps, which rows are a verify's logits, and the rows of a
 * draft step. The device keeps one array of final-normed hiddens: rows 0 .. ring0 - 1 the running
 * micro-batch's, then per slot K + 1 ring rows (position p at p % (K + 1)), then one chain row per
 * slot (the last draft step's h'). Plain C, tested in tests/cpu/test_spec_plan.c; the CUDA
 * backend (src/cuda/cuda_spec.cu) uploads what it fills. */
#ifndef TL_SPEC_PLAN_H
#define TL_SPEC_PLAN_H

#include <stdint.h>
#include "engine/batch_plan.h"

typedef struct tl_spec_layout {
    int K;        /* most draft tokens a step */
    int ring0;    /* first ring row (the micro-batch's rows come before it) */
    int max_seqs; /* slots */
} tl_spec_layout;

/* Row of slot's hidden at position pos in the ring, and of its chain row. */
int tl_spec_ring_row(const tl_spec_layout *l, int slot, int pos);
int tl_spec_chain_row(const tl_spec_layout *l, int slot);

/* The head's rows of one micro-batch (segments segs of entries e, as tl_mb_fill lays out the
 * trunk's tokens: segment after segment):
 *   m, src   one head row per token at position q >= 1: row q - 1 of its slot, the token at q,
 *            its hidden src[t] = the previous token's micro-batch row, or for a segment's first
 *            token the slot's ring row of q - 1; one head segment per trunk segment that has
 *            such a token (m holds tokens, tok_pos, tok_slot, tok_seg, seg_*; out_rows unused);
 *   rdst, rsrc  the ring rows the segments' last K + 1 tokens fill, from their micro-batch rows;
 *   asrc     the micro-batch rows of the tokens of entries with all_logits, in order; the logits
 *            row of token k of entry i is arow[i * (K + 1) + k] = alog0 + its index in asrc.
 * Arrays of at least the micro-batch's token count. Returns the head's token count; *n_hseg,
 * *n_ring, *n_alog the other counts. */
int tl_spec_head_rows(const tl_spec_layout *l, const tl_fwd_entry *e, const tl_mb_seg *segs,
                      int n_seg, tl_mb_meta *m, int32_t *src, int32_t *rdst, int32_t *rsrc,
                      int32_t *asrc, int *arow, int alog0, int *n_hseg, int *n_ring, int *n_alog);

/* One draft step of n entries (slot[i] holding len[i] tokens, draft step step[i], token
 * token[i]): one single-token segment each at position len - 1 + step, its hidden from the ring
 * row of len - 1 (step 0) or the chain row (step > 0), and the chain row it writes (cdst). */
void tl_spec_draft_rows(const tl_spec_layout *l, const int *slot, const int *len, const int *step,
                        const int32_t *token, int n, tl_mb_meta *m, int32_t *src, int32_t *cdst);

#endif
