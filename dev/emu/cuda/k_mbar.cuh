/* Host emulation of src/cuda/k_mbar.cuh (shared-memory mbarriers) for the programs in dev/emu:
 * found before the real header on their include path. A barrier's 8 bytes hold its pending
 * arrivals, its expected count and its completed phases; cp.async copies at once here, so its
 * arrive is an ordinary one; a wait yields the thread (emu_yield) until the phase completes, and
 * gives up (abort) after a long spin: a protocol that never completes. Register reallocation
 * (setmaxnreg) does nothing here. */
#ifndef TL_K_MBAR_CUH
#define TL_K_MBAR_CUH

#include "cuda/cuda_common.cuh"

struct emu_mbar {
    uint16_t pending, count;
    uint32_t phase;
};
static_assert(sizeof(emu_mbar) == 8, "an mbarrier is 8 bytes");

static inline void mbar_init(uint64_t *b, int count) {
    emu_mbar *m = (emu_mbar *)b;
    m->pending = m->count = (uint16_t)count, m->phase = 0;
}
static inline void mbar_arrive(uint64_t *b) {
    emu_mbar *m = (emu_mbar *)b;
    if (--m->pending == 0) m->pending = m->count, m->phase++;
}
static inline void mbar_arrive_cp_async(uint64_t *b) { mbar_arrive(b); }
/* the phase of this parity: the current one while its parity matches (wait), else the last */
static inline void mbar_wait(uint64_t *b, int parity) {
    const emu_mbar *m = (const emu_mbar *)b;
    for (long spins = 0; (int)(m->phase & 1) == (parity & 1); spins++) {
        if (spins > 100000000L) {
            fprintf(stderr, "emu: mbarrier wait never completes (block %u, thread %u)\n",
                    blockIdx.x, threadIdx.x);
            abort();
        }
        emu_yield();
    }
}

template <int N> static inline void regs_dec(void) {}
template <int N> static inline void regs_inc(void) {}

#endif
