/* Micro-batch packing and classification of a backend step (batch_plan.h). */
#include "engine/batch_plan.h"
#include "common/util.h"

tl_mb_iter tl_mb_begin(const int *n_tok, int n, int max_tok, int max_seg, int long_min) {
    tl_mb_iter it = {n_tok, n, max_tok, max_seg, long_min, 0, NULL, 0, 0, 0};
    return it;
}

tl_mb_iter tl_mb_begin_mixed(const int *n_tok, int n, int max_tok, int max_seg, int long_min) {
    tl_mb_iter it = tl_mb_begin(n_tok, n, max_tok, max_seg, long_min);
    it.mix = long_min > 0;
    return it;
}

int tl_mb_next(tl_mb_iter *it, tl_mb_seg *segs, int *n_seg) {
    int ns = 0, T = 0;
    for (; it->pass < 2; it->pass++, it->i = 0) {
        for (; it->i < it->n; it->i++, it->off = 0) {
            int nt = it->n_tok[it->i];
            int big = it->long_min > 0 && nt >= it->long_min;
            if (big != it->pass) continue;
            int c = it->cut ? it->cut[it->i] : 0;
            int end = c > it->off && c < nt ? c : nt; /* this piece ends there */
            /* a long entry runs alone (flush what is pending), or, mixed, joins only with at least
             * long_min tokens (the long segments of a micro-batch come after the short ones) */
            if (big && ns > 0 &&
                (!it->mix || TL_MIN(end - it->off, it->max_tok - T) < it->long_min))
                break;
            while (it->off < nt) {
                int take = TL_MIN(end - it->off, it->max_tok - T);
                segs[ns].entry = it->i, segs[ns].start = it->off, segs[ns].n = take;
                ns++, T += take, it->off += take;
                if (it->off == c && c < nt) { /* the cut: the micro-batch ends here */
                    *n_seg = ns;
                    return 1;
                }
                if (T == it->max_tok || ns == it->max_seg || (big && !it->mix)) {
                    if (it->off == nt) it->i++, it->off = 0;
                    *n_seg = ns;
                    return 1;
                }
            }
        }
        if (it->i < it->n) break; /* flushed before a long entry */
    }
    *n_seg = ns;
    return ns > 0;
}

int tl_mb_rows(const tl_fwd_entry *e, int n, int long_min, int *row_of) {
    int r = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            int big = long_min > 0 && e[i].n_tok >= long_min;
            if (big == pass) row_of[i] = (e[i].logits || e[i].sample) ? r++ : -1;
        }
    return r;
}

void tl_mb_fill(const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg, const int *row_of,
                tl_mb_meta *m, tl_mb_info *info) {
    int T = 0, n_out = 0, out_row0 = -1, all_single = 1, max_kv = 0;
    for (int i = 0; i < n_seg; i++) {
        const tl_mb_seg *sg = &segs[i];
        const tl_fwd_entry *en = &e[sg->entry];
        m->seg_tok0[i] = T, m->seg_n[i] = sg->n, m->seg_slot[i] = en->slot;
        m->seg_pos0[i] = en->pos + sg->start;
        for (int j = 0; j < sg->n; j++, T++) {
            m->tokens[T] = en->tokens[sg->start + j];
            m->tok_pos[T] = en->pos + sg->start + j;
            m->tok_slot[T] = en->slot;
            m->tok_seg[T] = i;
        }
        max_kv = TL_MAX(max_kv, en->pos + sg->start + sg->n);
        if (sg->n != 1) all_single = 0;
        if (sg->start + sg->n == en->n_tok && row_of[sg->entry] >= 0) {
            if (out_row0 < 0) out_row0 = row_of[sg->entry];
            m->out_rows[n_out++] = T - 1;
        }
    }
    info->n_tok = T, info->n_seg = n_seg, info->n_out = n_out;
    info->out_row0 = out_row0 < 0 ? 0 : out_row0;
    info->all_single = all_single, info->max_kv = max_kv;
}

tl_mb_kind tl_mb_kind_of(const tl_mb_info *info, int long_min, int max_decode) {
    if (long_min > 0 && info->n_seg == 1 && info->n_tok >= long_min) return TL_MB_LONG;
    if (info->all_single && info->n_tok <= max_decode) return TL_MB_DECODE;
    return TL_MB_GENERIC;
}

int tl_mb_attn_splits(const tl_mb_info *info, tl_mb_kind kind, int max_split, int part_rows) {
    if (kind == TL_MB_DECODE) return max_split;
    int n = TL_MAX(1, TL_MIN(max_split, part_rows / TL_MAX(1, info->n_tok)));
    return TL_MIN(n, TL_MAX(1, TL_CEIL_DIV(info->max_kv, 32)));
}
