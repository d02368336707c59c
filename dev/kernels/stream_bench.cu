/* Weight-stream layout on the GPU: does the order in which a MoE GEMM block requests its 4-bit
 * weights change the HBM bandwidth it gets? A block of the decode batch's MoE kernel
 * (gemm_q4w_kernel) owns 128 weight rows and walks K in stages of 64 columns; in the q4 tiled
 * layout (gpu.h) one stage of its rows is 16 pieces of 256 bytes, one per 8-row block, 8 KB apart
 * (gate/up, K = 2048) or 2 KB apart (down, K = 512), plus 512 contiguous bytes of scale/bias
 * words from another array. This program streams the same bytes through the same cp.async ring
 * (4 stages, 128 threads, 5 blocks an SM, as q4w) in two orders:
 *   tiled   the current layout: stage s of block b reads 256 bytes of each of its 16 row blocks
 *   stage   a stage-major layout: stage s of block b is 4 KB in one piece
 * and reports GB/s (weights and scale words) for the gate/up and down shapes, each over a working
 * set far beyond L2, best of REPEAT. A consumer reads every staged byte (an XOR into one word a
 * thread, written out), so no load is dead. Not part of any test run:
 *   make build/cuda/dev/stream_bench && build/cuda/dev/stream_bench
 * H100, session 27 (BENCHMARKS.md "2026-12-07 (session 27)"): the two orders within 3% of each
 * other (2.7-3.0 TB/s; plain read 3.08): the experts' layout stays. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_common.cuh"
#include "../../tests/gpu/cu_check.h"

#define THREADS 128
#define STAGES  4
#define STAGE_W 4096 /* weight bytes a stage: 128 rows x 64 columns x 4 bits */
#define STAGE_S 512  /* scale/bias bytes a stage: 128 rows x 4 */
#define REPEAT  10

/* Block b of nb streams its 128 rows x kt stages: weights w (tiled or stage order), scale words
 * sb (stage g of every block's rows at sb + g * nb * 512, as sb[g * rows + row]). */
template <bool STAGE_MAJOR>
__global__ void __launch_bounds__(THREADS, 5)
    stream_kernel(const uint8_t *w, const uint8_t *sb, uint32_t *out, int kt) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x, nb = gridDim.x, b = blockIdx.x;
    const uint8_t *wb = w + (size_t)b * kt * STAGE_W;
    auto issue = [&](int s) {
        uint8_t *st = sm + (s % STAGES) * (STAGE_W + STAGE_S);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int c = tid + THREADS * j; /* 16-byte chunk c of the stage */
            const uint8_t *src = STAGE_MAJOR
                                     ? wb + (size_t)s * STAGE_W + c * 16
                                     : wb + (size_t)(c >> 4) * kt * 256 + s * 256 + (c & 15) * 16;
            cp_async16(st + c * 16, src, 16);
        }
        if (tid < 32)
            cp_async16(st + STAGE_W + tid * 16, sb + ((size_t)s * nb + b) * 512 + tid * 16, 16);
    };
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < kt) issue(s);
        cp_async_commit();
    }
    uint32_t acc = 0;
    for (int s = 0; s < kt; s++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (s + STAGES - 1 < kt) issue(s + STAGES - 1);
        cp_async_commit();
        const uint4 *st = (const uint4 *)(sm + (s % STAGES) * (STAGE_W + STAGE_S));
        uint4 a = st[tid], c = st[tid + THREADS];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ c.x ^ c.y ^ c.z ^ c.w;
        if (tid < 32) acc ^= st[STAGE_W / 16 + tid].x;
    }
    cp_async_wait<0>();
    out[(size_t)b * THREADS + tid] = acc;
}

/* The read roof: every thread XORs uint4s of [0, n) at a grid stride (ld.global.nc). */
__global__ void __launch_bounds__(256) read_kernel(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (size_t)gridDim.x * 256) {
        uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    out[(size_t)blockIdx.x * 256 + threadIdx.x] = acc;
}

/* Best time of REPEAT runs of launch(), ms. */
template <class F> static float best_ms(F launch) {
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int r = 0; r < REPEAT; r++) {
        CU(cudaEventRecord(e0));
        launch();
        CU(cudaEventRecord(e1));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    return best;
}

/* Best GB/s of one order over nb blocks of kt stages. */
template <bool SM>
static double run(const uint8_t *w, const uint8_t *sb, uint32_t *out, int nb, int kt) {
    /* the ring needs 18 KB; 40 KB keeps 5 blocks an SM resident, as q4w's registers do */
    size_t smem = 40 * 1024;
    CU(cudaFuncSetAttribute(stream_kernel<SM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)smem));
    float ms = best_ms([&] { stream_kernel<SM><<<nb, THREADS, smem>>>(w, sb, out, kt); });
    return (double)nb * kt * (STAGE_W + STAGE_S) / (ms * 1e-3) / 1e9;
}

int main(void) {
    const size_t bytes = (size_t)1 << 30; /* 1 GB of weights: 20x the L2 */
    uint8_t *w, *sb;
    uint32_t *out;
    CU(cudaMalloc(&w, bytes));
    CU(cudaMalloc(&sb, bytes / 8));
    CU(cudaMalloc(&out, (size_t)16384 * THREADS * 4));
    CU(cudaMemset(w, 0x5a, bytes));
    CU(cudaMemset(sb, 0x3c, bytes / 8));
    int dev;
    cudaDeviceProp pr;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&pr, dev));
    printf("# %s, %d SMs; 128 threads, %d-stage cp.async ring, 5 blocks an SM; GB/s best of %d\n",
           pr.name, pr.multiProcessorCount, STAGES, REPEAT);
    float rd = best_ms([&] {
        read_kernel<<<pr.multiProcessorCount * 8, 256>>>((const uint4 *)w, bytes / 16, out);
    });
    printf("# plain read of 1 GB (uint4 a thread, grid stride): %.0f GB/s\n",
           (double)bytes / (rd * 1e-3) / 1e9);
    printf("| shape | stages a block | blocks | MB | tiled GB/s | stage-major GB/s |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    const struct {
        const char *name;
        int kt, nb;
    } shapes[] = {{"gate/up (K = 2048)", 32, 1850},
                  {"down (K = 512)", 8, 3700},
                  {"gate/up, 4x the blocks", 32, 7400},
                  {"down, 4x the blocks", 8, 14800}};
    for (const auto &s : shapes) {
        size_t need = (size_t)s.nb * s.kt * STAGE_W;
        if (need > bytes) continue;
        double a = run<false>(w, sb, out, s.nb, s.kt), b = run<true>(w, sb, out, s.nb, s.kt);
        printf("| %s | %d | %d | %.0f | %.0f | %.0f |\n", s.name, s.kt, s.nb,
               (double)s.nb * s.kt * (STAGE_W + STAGE_S) / 1e6, a, b);
    }
    CU(cudaFree(w));
    CU(cudaFree(sb));
    CU(cudaFree(out));
    return 0;
}
