/* The comparison of tl_gpu_moe_route_plan's outputs with tl_gpu_moe_route + tl_gpu_moe_pf_plan's,
 * shared by tests/gpu/test_kernels.c (on the GPU) and dev/emu/q4_emu.cpp (the host emulation):
 * ids, weights, shared-expert weights and logits bit for bit, the plan's offsets and tile starts
 * bit for bit, and each expert's assignments (the plan's perm: in any order inside an expert) the
 * same set. */
#ifndef TL_ROUTE_PLAN_CASE_H
#define TL_ROUTE_PLAN_CASE_H

#include <stdlib.h>
#include <string.h>
#include "cuda/gpu.h"

/* One way's outputs on the host, for up to 32 tokens of 8 experts. */
typedef struct route_plan_out {
    int32_t ids[32 * 8], plan[PLAN_PERM + 32 * 8];
    float w[32 * 8], sh[32], sl[32];
} route_plan_out;

static int route_plan_cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* 1 when o[1] (fused) is o[0] (two kernels) for T tokens over E experts; sorts the perm ranges. */
static int route_plan_same(route_plan_out *o, int T, int E) {
    size_t n = (size_t)T * 8;
    int same = !memcmp(o[0].ids, o[1].ids, 4 * n) && !memcmp(o[0].w, o[1].w, 4 * n) &&
               !memcmp(o[0].sh, o[1].sh, 4 * (size_t)T) &&
               !memcmp(o[0].sl, o[1].sl, 4 * (size_t)T) &&
               !memcmp(o[0].plan, o[1].plan, 4 * PLAN_PERM);
    for (int e = 0; same && e < E; e++) {
        int a = o[0].plan[PLAN_OFF + e], b = o[0].plan[PLAN_OFF + e + 1];
        if (a < 0 || b < a || (size_t)b > n) return 0;
        for (int v = 0; v < 2; v++)
            qsort(o[v].plan + PLAN_PERM + a, (size_t)(b - a), 4, route_plan_cmp_i32);
        same = !memcmp(o[0].plan + PLAN_PERM + a, o[1].plan + PLAN_PERM + a, 4 * (size_t)(b - a));
    }
    return same;
}

#endif
