/* Host emulation of src/cuda/k_wgmma.cuh (the wgmma instructions) for the programs in dev/emu:
 * found before the real header on their include path. A wgmma runs at once when issued (no
 * asynchrony: fences, commits and waits do nothing). Operands in shared memory are read
 * through their descriptors as the hardware reads K-major tiles with the 128-byte swizzle:
 * element (row r, k) of a tile at byte start + (r / 8) SBO + (r % 8) 128 + 2k of the shared
 * window, with bits 4-6 of that address XORed with bits 7-9 (so the tiles must sit 1024-byte
 * aligned in emu_smem_base's window, as on the GPU); an N-major B (wg_mma_rs_tb256) as the
 * hardware reads MN-major tiles: element (n, k) at start + (n / 64) LBO + (k / 8) SBO + (k % 8)
 * 128 + 2 (n % 64), the same swizzle. A in registers: the warpgroup's 128 threads meet
 * (emu_barrier(1000 + warpgroup)) and each reads the others' fragments. */
#ifndef TL_K_WGMMA_CUH
#define TL_K_WGMMA_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/k_wgdesc.cuh"

static inline void wg_fence_proxy(void) {}
static inline void wg_fence(void) {}
static inline void wg_commit(void) {}
template <int N> static inline void wg_wait(void) {}
template <int N> static inline void wg_pin(float (&)[N]) {}

/* element (r, k) of the K-major (mn: (n, k) of the MN-major), 128-byte-swizzled tile the
 * descriptor d describes */
float emu_wg_elem(uint64_t d, int r, int k, int mn = 0);
/* D (64 x N: d[4j + 2h + e] = row 16w + g + 8h, column 8j + 2t + e) (+)= A (64 x 16) B^T
 * (tb: B N-major) */
void emu_wg_mma(float *d, int n, const uint32_t *a_regs, uint64_t da, uint64_t db, int acc_on,
                int tb = 0);

static inline void wg_mma_m64n256k16(float *d, uint64_t da, uint64_t db) {
    emu_wg_mma(d, 256, nullptr, da, db, 1);
}
template <int N> static inline void wg_mma_ss(float *d, uint64_t da, uint64_t db, int acc_on) {
    emu_wg_mma(d, N, nullptr, da, db, acc_on);
}
template <int N>
static inline void wg_mma_rs(float *d, const uint32_t (&a)[4], uint64_t db, int acc_on) {
    emu_wg_mma(d, N, a, 0, db, acc_on);
}
static inline void wg_mma_rs_tb256(float *d, const uint32_t (&a)[4], uint64_t db, int acc_on) {
    emu_wg_mma(d, 256, a, 0, db, acc_on, 1);
}

#endif
