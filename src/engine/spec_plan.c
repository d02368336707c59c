/* The MTP head's rows on the GPU, host side (spec_plan.h). */
#include "engine/spec_plan.h"
#include "common/util.h"

int tl_spec_ring_row(const tl_spec_layout *l, int slot, int pos) {
    return l->ring0 + slot * (l->K + 1) + pos % (l->K + 1);
}

int tl_spec_chain_row(const tl_spec_layout *l, int slot) {
    return l->ring0 + l->max_seqs * (l->K + 1) + slot;
}

int tl_spec_head_rows(const tl_spec_layout *l, const tl_fwd_entry *e, const tl_mb_seg *segs,
                      int n_seg, tl_mb_meta *m, int32_t *src, int32_t *rdst, int32_t *rsrc,
                      int32_t *asrc, int *arow, int alog0, int *n_hseg, int *n_ring, int *n_alog) {
    int K1 = l->K + 1, t0 = 0, nt = 0, ns = 0, nr = 0, na = 0;
    for (int g = 0; g < n_seg; g++) {
        const tl_fwd_entry *en = &e[segs[g].entry];
        int start = segs[g].start, n = segs[g].n, pos0 = en->pos + start, slot = en->slot;
        int j0 = pos0 == 0 ? 1 : 0; /* position 0 has no hidden before it */
        if (j0 < n) {
            m->seg_tok0[ns] = nt, m->seg_n[ns] = n - j0, m->seg_slot[ns] = slot;
            m->seg_pos0[ns] = pos0 + j0 - 1;
            for (int j = j0; j < n; j++, nt++) {
                int q = pos0 + j;
                m->tokens[nt] = en->tokens[start + j];
                m->tok_pos[nt] = q - 1, m->tok_slot[nt] = slot, m->tok_seg[nt] = ns;
                src[nt] = j > 0 ? t0 + j - 1 : tl_spec_ring_row(l, slot, q - 1);
            }
            ns++;
        }
        for (int j = TL_MAX(0, n - K1); j < n; j++, nr++)
            rdst[nr] = tl_spec_ring_row(l, slot, pos0 + j), rsrc[nr] = t0 + j;
        if (en->all_logits || en->all_laws)
            for (int j = 0; j < n; j++, na++) {
                asrc[na] = t0 + j;
                arow[(size_t)segs[g].entry * K1 + start + j] = alog0 + na;
            }
        t0 += n;
    }
    *n_hseg = ns, *n_ring = nr, *n_alog = na;
    return nt;
}

void tl_spec_draft_rows(const tl_spec_layout *l, const int *slot, const int *len, const int *step,
                        const int32_t *token, int n, tl_mb_meta *m, int32_t *src, int32_t *cdst) {
    for (int i = 0; i < n; i++) {
        int pos = len[i] - 1 + step[i];
        m->tokens[i] = token[i], m->tok_pos[i] = pos, m->tok_slot[i] = slot[i], m->tok_seg[i] = i;
        m->seg_tok0[i] = i, m->seg_n[i] = 1, m->seg_slot[i] = slot[i], m->seg_pos0[i] = pos;
        src[i] =
            step[i] == 0 ? tl_spec_ring_row(l, slot[i], len[i] - 1) : tl_spec_chain_row(l, slot[i]);
        cdst[i] = tl_spec_chain_row(l, slot[i]);
    }
}
