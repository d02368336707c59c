/* The MTP head's rows on the GPU, host side (src/engine/spec_plan.h): a hand-worked micro-batch
 * (a sequence's first tokens, a decode token, a verify entry, the middle of a chunk split over
 * micro-batches), a hand-worked draft step, and a simulation over random steps, random
 * micro-batch cuts and random rollbacks of entries of at most K + 1 tokens (verifies), where
 * every hidden row carries the label (slot, sequence, position) of the hidden it holds: each head
 * row must read the hidden of its own position q - 1 (from the micro-batch or the ring), every
 * token at a position >= 1 must give exactly one head row, and after each step the ring must
 * hold the hidden of the slot's last position (what a draft step 0 reads). */
#include "common/util.h"
#include "engine/spec_plan.h"
#include "t_check.h"

enum { MT = 64 }; /* room for one micro-batch's arrays */

typedef struct bufs {
    int32_t meta[9][MT];
    int32_t src[MT], rdst[MT], rsrc[MT], asrc[MT];
    tl_mb_meta m;
} bufs;

static void bufs_init(bufs *b) {
    memset(b, 0, sizeof *b);
    b->m.tokens = b->meta[0], b->m.tok_pos = b->meta[1], b->m.tok_slot = b->meta[2];
    b->m.tok_seg = b->meta[3], b->m.seg_tok0 = b->meta[4], b->m.seg_n = b->meta[5];
    b->m.seg_slot = b->meta[6], b->m.seg_pos0 = b->meta[7], b->m.out_rows = b->meta[8];
}

static int same(const int32_t *a, const int32_t *b, int n) { return !memcmp(a, b, 4 * (size_t)n); }

/* Layout K = 2 (rings of 3), ring rows from 16, 4 slots: ring(s, p) = 16 + 3 s + p % 3, chain(s)
 * = 28 + s. Micro-batch rows: seg0 0..2, seg1 3, seg2 4..6, seg3 7..10. */
static void test_head_rows_hand(void) {
    tl_spec_layout l = {.K = 2, .ring0 = 16, .max_seqs = 4};
    int32_t t0[3] = {10, 11, 12}, t1[1] = {20}, t2[3] = {30, 31, 32}, t3[5] = {40, 41, 42, 43, 44};
    float lg[1];
    tl_fwd_entry e[4];
    memset(e, 0, sizeof e);
    e[0].slot = 2, e[0].pos = 0, e[0].tokens = t0, e[0].n_tok = 3;
    e[1].slot = 0, e[1].pos = 7, e[1].tokens = t1, e[1].n_tok = 1;
    e[2].slot = 3, e[2].pos = 4, e[2].tokens = t2, e[2].n_tok = 3, e[2].all_logits = lg;
    e[3].slot = 1, e[3].pos = 9, e[3].tokens = t3, e[3].n_tok = 5; /* tokens 1..4 here */
    tl_mb_seg segs[4] = {{0, 0, 3}, {1, 0, 1}, {2, 0, 3}, {3, 1, 4}};
    bufs b;
    bufs_init(&b);
    int arow[12], ns, nr, na;
    memset(arow, 0xff, sizeof arow);
    int nt = tl_spec_head_rows(&l, e, segs, 4, &b.m, b.src, b.rdst, b.rsrc, b.asrc, arow, 5, &ns,
                               &nr, &na);
    CHECK_EQ_INT(nt, 10);
    CHECK_EQ_INT(ns, 4);
    CHECK_EQ_INT(nr, 10);
    CHECK_EQ_INT(na, 3);
    int32_t tok[10] = {11, 12, 20, 30, 31, 32, 41, 42, 43, 44};
    int32_t pos[10] = {0, 1, 6, 3, 4, 5, 9, 10, 11, 12};
    int32_t slot[10] = {2, 2, 0, 3, 3, 3, 1, 1, 1, 1};
    int32_t seg[10] = {0, 0, 1, 2, 2, 2, 3, 3, 3, 3};
    int32_t src[10] = {0, 1, 16, 25, 4, 5, 19, 7, 8, 9};
    CHECK(same(b.m.tokens, tok, 10) && same(b.m.tok_pos, pos, 10));
    CHECK(same(b.m.tok_slot, slot, 10) && same(b.m.tok_seg, seg, 10));
    CHECK(same(b.src, src, 10));
    int32_t s_tok0[4] = {0, 2, 3, 6}, s_n[4] = {2, 1, 3, 4}, s_slot[4] = {2, 0, 3, 1};
    int32_t s_pos0[4] = {0, 6, 3, 9};
    CHECK(same(b.m.seg_tok0, s_tok0, 4) && same(b.m.seg_n, s_n, 4));
    CHECK(same(b.m.seg_slot, s_slot, 4) && same(b.m.seg_pos0, s_pos0, 4));
    int32_t rdst[10] = {22, 23, 24, 17, 26, 27, 25, 21, 19, 20};
    int32_t rsrc[10] = {0, 1, 2, 3, 4, 5, 6, 8, 9, 10};
    CHECK(same(b.rdst, rdst, 10) && same(b.rsrc, rsrc, 10));
    int32_t asrc[3] = {4, 5, 6};
    CHECK(same(b.asrc, asrc, 3));
    CHECK_EQ_INT(arow[6], 5);
    CHECK_EQ_INT(arow[7], 6);
    CHECK_EQ_INT(arow[8], 7);
}

static void test_draft_rows_hand(void) {
    tl_spec_layout l = {.K = 2, .ring0 = 16, .max_seqs = 4};
    int slot[2] = {1, 3}, len[2] = {14, 7}, step[2] = {0, 2};
    int32_t token[2] = {50, 51}, src[2], cdst[2];
    bufs b;
    bufs_init(&b);
    tl_spec_draft_rows(&l, slot, len, step, token, 2, &b.m, src, cdst);
    int32_t tok[2] = {50, 51}, pos[2] = {13, 8}, sl[2] = {1, 3}, sg[2] = {0, 1};
    CHECK(same(b.m.tokens, tok, 2) && same(b.m.tok_pos, pos, 2) && same(b.m.tok_slot, sl, 2));
    CHECK(same(b.m.tok_seg, sg, 2) && same(b.m.seg_pos0, pos, 2) && same(b.m.seg_slot, sl, 2));
    CHECK_EQ_INT(b.m.seg_tok0[1], 1);
    CHECK_EQ_INT(b.m.seg_n[0], 1);
    CHECK_EQ_INT(src[0], 20); /* ring(1, 13) = 16 + 3 + 1 */
    CHECK_EQ_INT(src[1], 31); /* step 2: chain(3) */
    CHECK_EQ_INT(cdst[0], 29);
    CHECK_EQ_INT(cdst[1], 31);
}

/* The label of the hidden of (slot, position) of the slot's current sequence. */
#define LAB(gen, s, p) (((gen)[s] * 16 + (s)) * 1000 + (p))

/* Random steps of 1..4 slots, entries of 1..20 tokens cut into micro-batches of 1..12 tokens;
 * labels (slot, position) follow the hiddens through the micro-batch rows and the ring. */
static void test_head_rows_simulated(void) {
    enum { S = 4, STEPS = 400, LAB_N = 16 + S * 5 + S };
    unsigned long long rs = 0x5bec0ffee1234567ull;
    int bad = 0, rows = 0, expect = 0;
    for (int K = 1; K <= 4; K++) {
        tl_spec_layout l = {.K = K, .ring0 = 16, .max_seqs = S};
        int len[S] = {0}, gen[S] = {0}, label[LAB_N]; /* gen: the slot's sequence number */
        for (int i = 0; i < LAB_N; i++) label[i] = -1;
        int32_t toks[S][24];
        for (int step = 0; step < STEPS; step++) {
            tl_fwd_entry e[S];
            int n = 0, n_tok[S];
            memset(e, 0, sizeof e);
            for (int s = 0; s < S; s++) {
                if (t_rng_next(&rs) % 3 == 0) continue;
                int nt = 1 + (int)(t_rng_next(&rs) % 20);
                for (int j = 0; j < nt; j++) toks[s][j] = (int32_t)(1000 * s + len[s] + j);
                e[n].slot = s, e[n].pos = len[s], e[n].tokens = toks[s], e[n].n_tok = nt;
                n_tok[n++] = nt;
                expect += nt - (len[s] == 0);
            }
            int max_tok = 1 + (int)(t_rng_next(&rs) % 12);
            tl_mb_iter it = tl_mb_begin(n_tok, n, max_tok, S, 0);
            tl_mb_seg segs[S];
            int n_seg;
            while (tl_mb_next(&it, segs, &n_seg)) {
                int T = 0;
                for (int g = 0; g < n_seg; g++)
                    for (int j = 0; j < segs[g].n; j++, T++)
                        label[T] = LAB(gen, e[segs[g].entry].slot,
                                       e[segs[g].entry].pos + segs[g].start + j);
                bufs b;
                bufs_init(&b);
                int arow[S * 5], ns, nr, na;
                int nt = tl_spec_head_rows(&l, e, segs, n_seg, &b.m, b.src, b.rdst, b.rsrc, b.asrc,
                                           arow, 0, &ns, &nr, &na);
                for (int t = 0; t < nt; t++) {
                    int s = b.m.tok_slot[t], q = b.m.tok_pos[t] + 1;
                    bad += label[b.src[t]] != LAB(gen, s, q - 1); /* the hidden of q - 1 */
                    bad += b.m.tokens[t] != 1000 * s + q;         /* the token at q */
                    bad +=
                        b.m.seg_pos0[b.m.tok_seg[t]] + (t - b.m.seg_tok0[b.m.tok_seg[t]]) != q - 1;
                }
                rows += nt;
                int moved[MT];
                for (int r = 0; r < nr; r++) moved[r] = label[b.rsrc[r]];
                for (int r = 0; r < nr; r++) label[b.rdst[r]] = moved[r];
                for (int i = 0; i < T; i++) label[i] = -1; /* the next micro-batch's rows */
            }
            for (int i = 0; i < n; i++) { /* a verify (<= K + 1 tokens) may be rolled back */
                int s = e[i].slot, keep = e[i].n_tok;
                if (keep <= K + 1 && t_rng_next(&rs) % 2) keep = 1 + (int)(t_rng_next(&rs) % keep);
                len[s] += keep;
                /* a draft step 0 reads the ring row of len - 1: its hidden must be there */
                bad += label[tl_spec_ring_row(&l, s, len[s] - 1)] != LAB(gen, s, len[s] - 1);
            }
            for (int s = 0; s < S; s++)
                if (len[s] > 900) len[s] = 0, gen[s]++; /* a new sequence in the slot */
        }
    }
    printf("# %d head rows over 4 x 400 random steps: %d wrong hidden / token / position\n", rows,
           bad);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(rows, expect);
}

int main(void) {
    T_RUN(test_head_rows_hand);
    T_RUN(test_draft_rows_hand);
    T_RUN(test_head_rows_simulated);
    return t_summary();
}
