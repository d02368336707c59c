/* The test of tl_gpu_draft_pick (k_sample.cu) shared by tests/gpu/test_kernels.c, which runs it on
 * the GPU, and dev/emu/q4_emu.cpp, which runs the kernel in the host emulation: n chained entries
 * over K steps of random laws (empty ones, single survivors, up to TL_LAW_MAX ids with some zero
 * probabilities), random draft counts, greedy and sampling rows. The reference is the engine's own
 * host loop: tl_law_draw (engine/sample.c) with each entry's RNG, the entry stopping at an empty
 * law or at its k drafts. After every step the fed tokens and the penalty adjustments, at the end
 * every entry's drafts, counts, uniforms used and last token must be the same. */
#ifndef TL_DRAFT_PICK_CASE_H
#define TL_DRAFT_PICK_CASE_H

#include <stdlib.h>
#include <string.h>
#include "cuda/gpu.h"
#include "engine/sample.h"
#include "t_check.h"

/* Runs the pick of step j over host arrays (c and adj in and out, next out); 0 on success. */
typedef int (*draft_pick_call)(tl_gpu_chain *c, int n, const tl_law *laws, int j, int32_t *next,
                               int32_t *adj);

static void draft_pick_law(tl_law *l, unsigned long long *g) {
    int kind = (int)(t_rng_next(g) % 10);
    l->n = kind == 0 ? 0 : kind == 1 ? 1 : 2 + (int)(t_rng_next(g) % (TL_LAW_MAX - 1));
    double tot = 0;
    for (int i = 0; i < l->n; i++) {
        l->id[i] = (int32_t)(t_rng_next(g) % 150000);
        l->p[i] = t_rng_next(g) % 7 == 0 ? 0.0f : (float)(t_rng_next(g) % 1000 + 1);
        l->lp[i] = -(float)i;
        tot += l->p[i];
    }
    for (int i = 0; i < l->n; i++) l->p[i] = tot > 0 ? (float)(l->p[i] / tot) : 0.0f;
}

/* Mismatches between the pick and the host loop (0: the same). */
static int draft_pick_case(unsigned long long *g, int n, int K, draft_pick_call call) {
    tl_gpu_chain *c = (tl_gpu_chain *)calloc((size_t)n, sizeof *c);
    tl_gpu_chain *ref = (tl_gpu_chain *)calloc((size_t)n, sizeof *ref);
    tl_law *laws = (tl_law *)calloc((size_t)n, sizeof *laws);
    uint64_t *rng = (uint64_t *)calloc((size_t)n, sizeof *rng);
    int32_t *next = (int32_t *)calloc((size_t)n, 4),
            *adj = (int32_t *)calloc((size_t)n * TL_LAW_ADJ, 4);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        rng[i] = t_rng_next(g) | 1;
        uint64_t r = rng[i];
        c[i].k = 1 + (int)(t_rng_next(g) % K), c[i].greedy = t_rng_next(g) % 4 == 0;
        c[i].tok = (int32_t)(t_rng_next(g) % 150000), c[i].live = 1;
        for (int j = 0; j < c[i].k; j++) c[i].u[j] = tl_rng_uniform(&r);
        ref[i] = c[i];
        adj[(size_t)i * TL_LAW_ADJ] = c[i].tok + 1;
    }
    int32_t *adj_ref = (int32_t *)malloc((size_t)n * TL_LAW_ADJ * 4);
    memcpy(adj_ref, adj, (size_t)n * TL_LAW_ADJ * 4);
    for (int j = 0; j < K; j++) {
        for (int i = 0; i < n; i++) draft_pick_law(&laws[i], g);
        CHECK_EQ_INT(call(c, n, laws, j, next, adj), 0);
        for (int i = 0; i < n; i++) {
            tl_gpu_chain *x = &ref[i];
            if (x->live && laws[i].n < 1) x->live = 0;
            if (x->live) {
                uint64_t before = rng[i];
                x->tok = tl_law_draw(&laws[i], x->greedy, &rng[i]);
                x->n_draws += rng[i] != before;
                x->drafts[j] = x->tok, x->n_drafted = j + 1;
                if (j + 1 >= x->k) x->live = 0;
            }
            adj_ref[(size_t)i * TL_LAW_ADJ + j + 1] = x->tok + 1;
            bad += next[i] != x->tok;
        }
        bad += memcmp(adj, adj_ref, (size_t)n * TL_LAW_ADJ * 4) != 0;
    }
    for (int i = 0; i < n; i++) {
        const tl_gpu_chain *a = &c[i], *b = &ref[i];
        int same = a->live == b->live && a->tok == b->tok && a->n_drafted == b->n_drafted &&
                   a->n_draws == b->n_draws;
        for (int j = 0; same && j < b->n_drafted; j++) same = a->drafts[j] == b->drafts[j];
        bad += !same;
    }
    free(c), free(ref), free(laws), free(rng), free(next), free(adj), free(adj_ref);
    return bad;
}

#endif
