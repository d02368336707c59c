/* Phase hand-off on the GPU (issue 18 item 4): what one dependent phase of a decode step costs
 * when its weights must stream from HBM and its input is the whole previous phase's output.
 * N phases, y_i = W_i x_{i-1} (W_i: R rows x D = 2048 bf16, a slice of R / #SM rows per block,
 * x and y f32 in global memory; every phase needs all of the previous y), four ways:
 *   kernels          one kernel per phase, the N launches captured in one CUDA graph
 *   kernels + PDL    the same with programmatic dependent launch: a kernel triggers its
 *                    dependents at once and loads its weight slice (cp.async into shared memory)
 *                    before griddepcontrol.wait
 *   persistent       one kernel, one block per SM, phases separated by a device counter (a grid
 *                    barrier: __threadfence + atomicAdd, then a spin), weights loaded after it
 *   persistent + pf  the same, the next phase's slice loaded before the barrier (prefetch)
 * R = 0 is the hand-off alone. Per phase: us, and the weights' GB/s. Every way computes the same
 * y's in the same order: the last y must match bit for bit ("same" column), which also checks
 * that no phase read a stale x. Not part of any test run:
 *   make build/cuda/dev/handoff_bench && build/cuda/dev/handoff_bench
 * Results on the H200 (session 6, 2026-12-04): BENCHMARKS.md "phase hand-off"; PDL kernels were
 * the fastest way at every size, so the decode step stays a chain of PDL kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "../../tests/gpu/cu_check.h"

#define D      2048
#define NT     256
#define NPH    32   /* phases a run */
#define MAXR   4096 /* rows a phase at most (16 MB of weights: 128 KB of shared memory a block) */
#define XMAX   (MAXR > D ? MAXR : D)
#define REPEAT 7

struct hparams {
    const uint16_t *W; /* [NPH][R][D] */
    float *buf;        /* [2][XMAX]: phase i writes buf[i & 1], reads buf[(i + 1) & 1] */
    unsigned *cnt;     /* [NPH] arrivals per phase (persistent) */
    int R, rpb;        /* rows, rows a block */
};

/* Block b's rows of phase i into shared memory (16 bytes a cp.async), committed, not waited. */
__device__ void load_slice(uint16_t *sw, const hparams &p, int i, int r0, int nr) {
    const char *src = (const char *)(p.W + ((size_t)i * p.R + r0) * D);
    for (int c = threadIdx.x; c < nr * D / 8; c += NT)
        cp_async16(sw + (size_t)c * 8, src + (size_t)c * 16, 16);
    cp_async_commit();
}

/* Waits for the slice, reads x (L2: other SMs wrote it), one warp a row, fixed order. */
__device__ void compute(const uint16_t *sw, float *sx, const hparams &p, int i, int r0, int nr) {
    cp_async_wait<0>();
    const float *x = p.buf + (size_t)((i + 1) & 1) * XMAX;
    for (int j = threadIdx.x; j < D; j += NT) sx[j] = __ldcg(x + j);
    __syncthreads();
    float *y = p.buf + (size_t)(i & 1) * XMAX;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = w; r < nr; r += NT / 32) {
        const uint16_t *row = sw + (size_t)r * D;
        float acc = 0.0f;
        for (int j = 2 * lane; j < D; j += 64) {
            uint32_t v = *(const uint32_t *)(row + j);
            acc += bf16x2_lo(v) * sx[j] + bf16x2_hi(v) * sx[j + 1];
        }
        acc = warp_sum(acc);
        if (lane == 0) __stcg(y + r0 + r, acc);
    }
    __syncthreads();
}

template <bool PF> __global__ void __launch_bounds__(NT, 1) persist_kernel(hparams p) {
    extern __shared__ uint16_t sw[];
    __shared__ float sx[D];
    int r0 = blockIdx.x * p.rpb, nr = max(0, min(p.R - r0, p.rpb));
    for (int i = 0; i < NPH; i++) {
        if (PF && nr) load_slice(sw, p, i, r0, nr);
        if (i > 0 && threadIdx.x == 0) {
            while (*(volatile unsigned *)(p.cnt + i - 1) < gridDim.x) {
            }
            __threadfence();
        }
        __syncthreads();
        if (!PF && nr) load_slice(sw, p, i, r0, nr);
        compute(sw, sx, p, i, r0, nr);
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(p.cnt + i, 1u);
        }
    }
}

template <bool PDL> __global__ void __launch_bounds__(NT, 1) phase_kernel(hparams p, int i) {
    extern __shared__ uint16_t sw[];
    __shared__ float sx[D];
    int r0 = blockIdx.x * p.rpb, nr = max(0, min(p.R - r0, p.rpb));
    if (PDL) {
        pdl_trigger();
        if (nr) load_slice(sw, p, i, r0, nr);
        pdl_wait();
    } else if (nr) {
        load_slice(sw, p, i, r0, nr);
    }
    compute(sw, sx, p, i, r0, nr);
}

static float best_ms(cudaStream_t s, const hparams &p, int way, int nsm, size_t smem) {
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    cudaGraphExec_t ge = NULL;
    if (way < 2) { /* the N kernels as one graph */
        cudaGraph_t g;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < NPH; i++) {
            cudaLaunchConfig_t cfg = {dim3(nsm), dim3(NT), smem, s, NULL, 0};
            cudaLaunchAttribute at;
            at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at.val.programmaticStreamSerializationAllowed = 1;
            if (way == 1) cfg.attrs = &at, cfg.numAttrs = 1;
            if (way == 0)
                CU(cudaLaunchKernelEx(&cfg, phase_kernel<false>, p, i));
            else
                CU(cudaLaunchKernelEx(&cfg, phase_kernel<true>, p, i));
        }
        CU(cudaStreamEndCapture(s, &g));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphDestroy(g));
    }
    float best = 1e30f;
    for (int rep = 0; rep < REPEAT; rep++) {
        CU(cudaMemsetAsync(p.cnt, 0, NPH * sizeof(unsigned), s));
        CU(cudaMemsetAsync(p.buf, 0, 2 * XMAX * sizeof(float), s));
        CU(cudaEventRecord(e0, s));
        if (ge)
            CU(cudaGraphLaunch(ge, s));
        else if (way == 2)
            persist_kernel<false><<<nsm, NT, smem, s>>>(p);
        else
            persist_kernel<true><<<nsm, NT, smem, s>>>(p);
        CU(cudaGetLastError());
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < best) best = ms; /* rep 0 warms up */
    }
    if (ge) CU(cudaGraphExecDestroy(ge));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    return best;
}

__global__ void fill_kernel(uint16_t *w, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)(tl_mix64(i) >> 32);
        float v = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 2.0f / 45.25f; /* ~U(-1, 1) / sqrt(D) */
        w[i] = f2bf(v);
    }
}

int main(void) {
    int nsm;
    CU(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    size_t wn = (size_t)NPH * MAXR * D;
    hparams p;
    CU(cudaMalloc((void **)&p.W, wn * 2));
    CU(cudaMalloc(&p.buf, 2 * XMAX * sizeof(float)));
    CU(cudaMalloc(&p.cnt, NPH * sizeof(unsigned)));
    fill_kernel<<<1024, 256>>>((uint16_t *)p.W, wn);
    CU(cudaDeviceSynchronize());
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const char *names[4] = {"kernels", "kernels + PDL", "persistent", "persistent + prefetch"};
    printf("%d SMs, %d phases a run, best of %d; us a phase (weights' GB/s)\n\n", nsm, NPH,
           REPEAT - 1);
    printf("| rows | MB a phase | floor at 4.2 TB/s | %s | %s | %s | %s | same |\n", names[0],
           names[1], names[2], names[3]);
    printf("|---:|---:|---:|---:|---:|---:|---:|---|\n");
    const int rows[] = {0, 64, 512, 2048, 4096};
    float *ref = (float *)malloc(2 * XMAX * sizeof(float)),
          *got = (float *)malloc(2 * XMAX * sizeof(float));
    for (int k = 0; k < 5; k++) {
        p.R = rows[k], p.rpb = CEIL_DIV(p.R, nsm);
        size_t smem = (size_t)p.rpb * D * 2;
        void *fs[4] = {(void *)phase_kernel<false>, (void *)phase_kernel<true>,
                       (void *)persist_kernel<false>, (void *)persist_kernel<true>};
        for (int f = 0; f < 4; f++)
            CU(cudaFuncSetAttribute(fs[f], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int occ;
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist_kernel<true>, NT, smem));
        if (occ < 1) {
            printf("| %d | persistent kernel not resident |\n", p.R);
            continue;
        }
        double mb = (double)p.R * D * 2 / 1e6, floor_us = mb / 4.2e6 * 1e6;
        float us[4];
        int same = 1;
        for (int w = 0; w < 4; w++) {
            us[w] = 1000.0f * best_ms(s, p, w, nsm, smem) / NPH;
            CU(cudaMemcpy(w ? got : ref, p.buf, 2 * XMAX * sizeof(float), cudaMemcpyDeviceToHost));
            if (w) same &= !memcmp(ref, got, 2 * XMAX * sizeof(float));
        }
        printf("| %d | %.2f | %.2f |", p.R, mb, floor_us);
        for (int w = 0; w < 4; w++)
            printf(" %.2f (%.0f) |", us[w], mb * 1e6 / 1e9 / (us[w] * 1e-6));
        printf(" %s |\n", same ? "yes" : "NO");
    }
    free(ref), free(got);
    return 0;
}
