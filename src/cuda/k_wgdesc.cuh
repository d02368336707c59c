/* The shared-memory tile layout the wgmma operands use (k_gemm.cu, k_attn_prefill.cu): K-major
 * rows of 64 bf16 = 128 B with the 128-byte swizzle (16-byte chunk c of row r stored at chunk
 * c ^ (r % 8)), 8-row groups 1024 B apart, the tile 1024-byte aligned; and the matrix descriptor
 * that describes it to the tensor cores (start address, stride byte offset 1024, swizzle mode
 * 1). A k16 step inside the 64 columns advances the start address by 32 B.
 * The same bytes read as an MN-major operand (wg_desc_mn; the B of a wgmma with imm-trans-b 1):
 * each 128-byte row is one k holding 64 consecutive n, 8-k groups SBO bytes apart, 64-n blocks
 * LBO bytes apart (PTX ISA, "Matrix Descriptor", MN-major swizzled: the leading byte offset
 * steps between groups of 8 128-bit rows along MN, the stride byte offset between groups of 8
 * k). Plain arithmetic, shared by the device code and the host emulator (dev/emu). */
#ifndef TL_K_WGDESC_CUH
#define TL_K_WGDESC_CUH

/* byte offset of 16-byte chunk c of row r */
static __device__ __forceinline__ uint32_t wg_swz(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}
/* MN-major, 128-byte swizzle: lbo = bytes between 64-n blocks, sbo = bytes between 8-k groups */
static __device__ __forceinline__ uint64_t wg_desc_mn(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = 0;
    d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    d |= 1ull << 62; /* 128-byte swizzle */
    return d;
}
/* K-major: the same fields, the leading byte offset unused with the 128-byte swizzle (16), the
 * stride byte offset 8 rows x 128 B */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return wg_desc_mn(saddr, 16, 1024);
}

#endif
