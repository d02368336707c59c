/* The warp-specialisation primitives (sm_90a), as inline PTX, for the warp-specialised prefill
 * attention (k_attn_prefill.cu): shared-memory mbarriers, on which a producer's cp.async
 * completions and the consumers' releases of a stage meet, and the per-warpgroup register
 * reallocation (setmaxnreg). The host emulator (dev/emu/cuda/k_mbar.cuh) replaces this header with
 * its own model. */
#ifndef TL_K_MBAR_CUH
#define TL_K_MBAR_CUH

#include "cuda/cuda_common.cuh"

/* count arrivals complete a phase (one thread initialises; a block barrier before any use) */
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
/* one arrival of this thread (release: its earlier shared-memory reads and writes come first) */
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile(
        "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(b))
        : "memory");
}
/* one arrival, made when every cp.async this thread has issued so far has landed (noinc: it is
 * one of the count the barrier was initialised with) */
static __device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b))
                 : "memory");
}
/* waits (acquire) until the phase of this parity has completed: the current phase while its
 * parity is `parity`, else the one before (already complete) */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    uint32_t a = smem_u32(b), done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* this warpgroup's registers a thread become N (a multiple of 8 in 24..256; every warp of the
 * warpgroup executes it): dec gives registers back to the SM, inc waits for them */
template <int N> static __device__ __forceinline__ void regs_dec(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> static __device__ __forceinline__ void regs_inc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif
