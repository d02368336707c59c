/* The host emulator's runtime (dev/emu/cuda/cuda_common.cuh declares it): a block's threads as
 * coroutines (ucontext) in one OS thread, barriers (block, warp, the first n threads), warp
 * shuffles and reductions, and the tensor-core mma's of the PTX fragment layouts (m16n8k8 tf32,
 * m16n8k16 bf16) computed in f32. Linked by dev/emu/gdn_tc_emu.cpp and dev/emu/q4_emu.cpp, which
 * define emu_head_on (which grid rows run). */
#include <ucontext.h>

#include "cuda/cuda_common.cuh"

extern "C" {
#include "common/util.h"
}

dim3 threadIdx, blockIdx, blockDim, gridDim;
int emu_round_bf16;

/* ---- coroutine threads ---- */
struct emu_thr {
    ucontext_t ctx;
    int done, wait;
};
enum { EMU_MAX = 1024, EMU_STACK = 256 << 10, EMU_WARPS = EMU_MAX / 32 };
static emu_thr thr[EMU_MAX];
static char *stacks[EMU_MAX];
static ucontext_t sched;
static int cur, nthr;
static const std::function<void()> *body;

static void entry(void) {
    (*body)();
    thr[cur].done = 1;
}
void emu_barrier(int id) {
    thr[cur].wait = id;
    swapcontext(&thr[cur].ctx, &sched);
}
void emu_yield(void) { /* stays runnable: the scheduler comes back to it next round */
    swapcontext(&thr[cur].ctx, &sched);
}
/* named barrier id with n threads (EMU_NAMED + 2048 id + n): whichever n threads arrive */
enum { EMU_NAMED = 3000 };
static int in_group(int id, int i) {
    if (id == 0) return 1;
    if (id < 100) return i / 32 == id - 1;
    if (id >= EMU_NAMED) return thr[i].wait == id;
    if (id >= 1000) return i / 128 == id - 1000; /* a warpgroup */
    return i < id - 100;
}
/* whether the threads waiting at barrier id (thread i among them) are all it waits for */
static int group_complete(int id) {
    int n_in = 0, all = 1;
    for (int j = 0; j < nthr; j++) {
        if (id >= EMU_NAMED) {
            n_in += !thr[j].done && thr[j].wait == id;
            continue;
        }
        if (in_group(id, j) && !thr[j].done && thr[j].wait != id) all = 0;
    }
    return id >= EMU_NAMED ? n_in == (id - EMU_NAMED) % 2048 : all;
}
static void run_block(void) {
    for (int i = 0; i < nthr; i++) {
        if (!stacks[i]) stacks[i] = (char *)xmalloc(EMU_STACK);
        getcontext(&thr[i].ctx);
        thr[i].ctx.uc_stack.ss_sp = stacks[i];
        thr[i].ctx.uc_stack.ss_size = EMU_STACK;
        thr[i].ctx.uc_link = &sched;
        makecontext(&thr[i].ctx, entry, 0);
        thr[i].done = 0, thr[i].wait = -1;
    }
    for (;;) {
        int ran = 0; /* a thread ran and stayed runnable (emu_yield): not a deadlock */
        for (int i = 0; i < nthr; i++)
            if (!thr[i].done && thr[i].wait < 0) {
                cur = i;
                threadIdx = dim3(i, 0, 0);
                swapcontext(&sched, &thr[i].ctx);
                ran |= !thr[i].done && thr[i].wait < 0;
            }
        int alive = 0, released = 0;
        for (int i = 0; i < nthr; i++) alive += !thr[i].done;
        if (!alive) return;
        for (int i = 0; i < nthr; i++) {
            if (thr[i].done || thr[i].wait < 0) continue;
            int id = thr[i].wait;
            if (!group_complete(id)) continue;
            for (int j = 0; j < nthr; j++)
                if (in_group(id, j) && !thr[j].done) thr[j].wait = -1;
            released = 1;
        }
        if (!released && !ran) {
            fprintf(stderr, "emu: deadlock in block (%u, %u)\n", blockIdx.x, blockIdx.y);
            abort();
        }
    }
}
void emu_launch(dim3 grid, dim3 block, const std::function<void()> &fn) {
    body = &fn;
    nthr = (int)block.x;
    blockDim = block, gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++) {
            if (!emu_head_on((int)y)) continue;
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                run_block();
            }
        }
}

/* ---- warp collectives ---- */
static uint32_t shfl_slot[EMU_WARPS][32];
uint32_t emu_shfl_u(uint32_t v, int src) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    shfl_slot[w][l] = v;
    emu_barrier(1 + w);
    uint32_t r = shfl_slot[w][src];
    emu_barrier(1 + w);
    return r;
}
float emu_shfl(float v, int src) { return __uint_as_float(emu_shfl_u(__float_as_uint(v), src)); }
uint32_t emu_match_any(uint32_t v) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    shfl_slot[w][l] = v;
    emu_barrier(1 + w);
    uint32_t r = 0;
    for (int i = 0; i < 32; i++) r |= (shfl_slot[w][i] == v ? 1u : 0u) << i;
    emu_barrier(1 + w);
    return r;
}
uint32_t emu_ballot(int pred) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    shfl_slot[w][l] = pred != 0;
    emu_barrier(1 + w);
    uint32_t r = 0;
    for (int i = 0; i < 32; i++) r |= shfl_slot[w][i] << i;
    emu_barrier(1 + w);
    return r;
}
uint32_t emu_reduce_u(uint32_t v, int max) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    shfl_slot[w][l] = v;
    emu_barrier(1 + w);
    uint32_t r = shfl_slot[w][0];
    for (int i = 1; i < 32; i++)
        r = max == 2 ? r + shfl_slot[w][i]
            : max    ? (shfl_slot[w][i] > r ? shfl_slot[w][i] : r)
                     : (shfl_slot[w][i] < r ? shfl_slot[w][i] : r);
    emu_barrier(1 + w);
    return r;
}
static uint32_t mma_a[EMU_WARPS][32][4], mma_b[EMU_WARPS][32][2];
/* m16n8k8 tf32 from the PTX fragment layout: g = lane / 4, t = lane % 4; A: a0 (g, t), a1 (g+8,
 * t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (k t, n g), b1 (k t+4, n g); D: (g + 8 (e/2), 2t + e%2). */
void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    memcpy(mma_a[w][l], a, sizeof a);
    mma_b[w][l][0] = b0, mma_b[w][l][1] = b1;
    emu_barrier(1 + w);
    float A[16][8], B[8][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        A[g][t] = __uint_as_float(mma_a[w][L][0]);
        A[g + 8][t] = __uint_as_float(mma_a[w][L][1]);
        A[g][t + 4] = __uint_as_float(mma_a[w][L][2]);
        A[g + 8][t + 4] = __uint_as_float(mma_a[w][L][3]);
        B[t][g] = __uint_as_float(mma_b[w][L][0]);
        B[t + 4][g] = __uint_as_float(mma_b[w][L][1]);
    }
    int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 8; k++) s += A[row][k] * B[k][col];
        d[e] = s;
    }
    emu_barrier(1 + w);
}


/* m16n8k16 bf16 (f32 accumulate) from the PTX fragment layout: g = lane / 4, t = lane % 4; each
 * register holds two bf16, the lower k in the low half. A: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g,
 * 2t+8..), a3 (g+8, 2t+8..); B: b0 (k 2t.., n g), b1 (k 2t+8.., n g); D as m16n8k8. */
void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
              uint32_t b1) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    mma_a[w][l][0] = a0, mma_a[w][l][1] = a1, mma_a[w][l][2] = a2, mma_a[w][l][3] = a3;
    mma_b[w][l][0] = b0, mma_b[w][l][1] = b1;
    emu_barrier(1 + w);
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = bf16x2_half(mma_a[w][L][0], h);
            A[g + 8][2 * t + h] = bf16x2_half(mma_a[w][L][1], h);
            A[g][2 * t + 8 + h] = bf16x2_half(mma_a[w][L][2], h);
            A[g + 8][2 * t + 8 + h] = bf16x2_half(mma_a[w][L][3], h);
            B[2 * t + h][g] = bf16x2_half(mma_b[w][L][0], h);
            B[2 * t + 8 + h][g] = bf16x2_half(mma_b[w][L][1], h);
        }
    }
    int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[e] = s;
    }
    emu_barrier(1 + w);
}

/* ---- shared-memory operands: ldmatrix and the wgmma (dev/emu/cuda/k_wgmma.cuh) ---- */
uint8_t *emu_smem_base;
static const uint8_t *ldm_ptr[EMU_WARPS][32];
/* ldmatrix .x1/.x2/.x4 (.trans): lane 8j + r gives row r of matrix j; lane (g, t) receives from
 * matrix j the two bf16 at row g, columns 2t, 2t + 1 (trans: rows 2t, 2t + 1 of column g). */
void emu_ldmatrix(uint32_t *r, int nmat, const void *p, int trans) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    ldm_ptr[w][l] = (const uint8_t *)p;
    emu_barrier(1 + w);
    int g = l >> 2, t = l & 3;
    for (int j = 0; j < nmat; j++) {
        uint16_t lo, hi;
        if (!trans) {
            memcpy(&lo, ldm_ptr[w][8 * j + g] + 4 * t, 2);
            memcpy(&hi, ldm_ptr[w][8 * j + g] + 4 * t + 2, 2);
        } else {
            memcpy(&lo, ldm_ptr[w][8 * j + 2 * t] + 2 * g, 2);
            memcpy(&hi, ldm_ptr[w][8 * j + 2 * t + 1] + 2 * g, 2);
        }
        r[j] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    emu_barrier(1 + w);
}

float emu_wg_elem(uint64_t d, int r, int k, int mn) {
    uint32_t start = (uint32_t)(d & 0x3FFF) << 4, sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
    uint32_t lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4;
    if ((d >> 62) != 1 || k < 0 || k > 15 || (start & 15) || (mn && (lbo & 1023 || !lbo))) {
        fprintf(stderr, "emu: wgmma descriptor %llx not a 128-byte-swizzled %s tile\n",
                (unsigned long long)d, mn ? "MN-major" : "K-major");
        abort();
    }
    uint32_t a = mn ? start + (uint32_t)(r / 64) * lbo + (uint32_t)(k / 8) * sbo +
                          (uint32_t)(k % 8) * 128 + 2 * (r % 64)
                    : start + (uint32_t)(r / 8) * sbo + (uint32_t)(r % 8) * 128 + 2 * k;
    a ^= ((a >> 7) & 7) << 4;
    uint16_t v;
    memcpy(&v, emu_smem_base + a, 2);
    return bf2f(v);
}

static uint32_t wg_a[EMU_MAX / 128][128][4];
void emu_wg_mma(float *d, int n, const uint32_t *a_regs, uint64_t da, uint64_t db, int acc_on,
                int tb) {
    int i = (int)threadIdx.x, wg = i / 128, w = (i % 128) / 32, l = i % 32, g = l >> 2, t = l & 3;
    float A[2][16]; /* this thread's rows 16w + g, 16w + g + 8 */
    if (a_regs) {
        memcpy(wg_a[wg][i % 128], a_regs, 16);
        emu_barrier(1000 + wg);
        for (int h = 0; h < 2; h++)
            for (int kh = 0; kh < 2; kh++)
                for (int tt = 0; tt < 4; tt++)
                    for (int e = 0; e < 2; e++)
                        A[h][8 * kh + 2 * tt + e] =
                            bf16x2_half(wg_a[wg][w * 32 + g * 4 + tt][h + 2 * kh], e);
        emu_barrier(1000 + wg);
    } else {
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k++) A[h][k] = emu_wg_elem(da, 16 * w + g + 8 * h, k, 0);
    }
    for (int j = 0; j < n / 8; j++)
        for (int e = 0; e < 2; e++) {
            int col = 8 * j + 2 * t + e;
            float B[16];
            for (int k = 0; k < 16; k++) B[k] = emu_wg_elem(db, col, k, tb);
            for (int h = 0; h < 2; h++) {
                float s = acc_on ? d[4 * j + 2 * h + e] : 0.f;
                for (int k = 0; k < 16; k++) s += A[h][k] * B[k];
                d[4 * j + 2 * h + e] = s;
            }
        }
}
