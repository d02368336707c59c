/* The Hopper warpgroup MMA (wgmma) instructions the prefill GEMMs use (k_gemm.cu), as inline PTX:
 * the fences, the commit and wait of a wgmma group, m64n256k16 with both operands in shared
 * memory (descriptors), m64n64k16 and m64n128k16 likewise with a run-time scale-d (the
 * attention's S, the router), m64nNk16 (N = 32, 64, 96,
 * 128, 256) with A in registers, and m64n256k16 with A in registers and B N-major (wg_mma_rs_tb:
 * imm-trans-b 1, B described by wg_desc_mn). bf16 inputs, f32 accumulators, no scaling. The
 * descriptors and the swizzled tile layout they describe: k_wgdesc.cuh (wg_desc, wg_swz). The host
 * emulator (dev/emu) replaces this header with its own model of the same instructions. Fragments
 * (per warp w of the warpgroup, g = lane / 4, t = lane % 4): A in registers as the mma.sync
 * m16n8k16 A fragment of rows 16w .. 16w + 15 (a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3
 * (g + 8, 2t + 8..)); D[4j + 2h + e] = (row 16w + g + 8h, column 8j + 2t + e). */
#ifndef TL_K_WGMMA_CUH
#define TL_K_WGMMA_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/k_wgdesc.cuh"

/* cp.async (generic proxy) writes to shared memory become visible to the wgmma (async proxy) */
static __device__ __forceinline__ void wg_fence_proxy(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* before the first wgmma that reads registers (A, D) written by ordinary instructions */
static __device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* wait until at most N committed wgmma groups are in flight */
template <int N> static __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Registers r pinned here: the compiler may not move their uses above this point (after a
 * wgmma wait the accumulators' values exist only from the wait on; CUTLASS's
 * warpgroup_fence_operand does the same). */
template <int N> static __device__ __forceinline__ void wg_pin(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* The 64 accumulator operands of an m64n128 wgmma: placeholders %0 .. %63, bindings d[0 .. 63]. */
#define WG_R64                                                                                     \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"   \
    "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_D64                                                                                     \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])

/* The 128 accumulator operands of an m64n256 wgmma: their placeholders %0 .. %127 and the
 * read-write bindings to d[0 .. 127]. */
#define WG_R128                                                                                    \
    WG_R64 ","                                                                                     \
           "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,"                              \
           "%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,"                              \
           "%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,"                        \
           "%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,"                \
           "%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_D128                                                                                    \
    WG_D64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),          \
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), \
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), \
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),          \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),        \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),        \
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),        \
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* d[0..127] += A(64x16, smem desc) * B(16x256, smem desc)^T, bf16 in, f32 accumulate. */
static __device__ __forceinline__ void wg_mma_m64n256k16(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{" WG_R128 "}, %128, %129, 1, 1, 1, 0, 0;\n"
                 "}\n"
                 : WG_D128
                 : "l"(da), "l"(db));
}

/* d[0..N/2) += A(64x16, registers) * B(N x 16, smem desc)^T */
template <int N>
static __device__ __forceinline__ void wg_mma_rs(float *d, const uint32_t (&a)[4], uint64_t db,
                                                 int acc_on);
template <>
__device__ __forceinline__ void wg_mma_rs<32>(float *d, const uint32_t (&a)[4], uint64_t db,
                                              int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %21, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                 "}, {%16, %17, %18, %19}, %20, sd, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}
template <>
__device__ __forceinline__ void wg_mma_rs<64>(float *d, const uint32_t (&a)[4], uint64_t db,
                                              int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %37, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32, %33, %34, %35}, %36, sd, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}
template <>
__device__ __forceinline__ void wg_mma_rs<96>(float *d, const uint32_t (&a)[4], uint64_t db,
                                              int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %53, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
                 "}, {%48, %49, %50, %51}, %52, sd, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}
template <>
__device__ __forceinline__ void wg_mma_rs<128>(float *d, const uint32_t (&a)[4], uint64_t db,
                                               int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %69, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R64
                 "}, {%64, %65, %66, %67}, %68, sd, 1, 1, 0;\n}\n"
                 : WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}

template <>
__device__ __forceinline__ void wg_mma_rs<256>(float *d, const uint32_t (&a)[4], uint64_t db,
                                               int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %133, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_R128
                 "}, {%128, %129, %130, %131}, %132, sd, 1, 1, 0;\n}\n"
                 : WG_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}

/* d[0..127] (+)= A(64x16, registers) * B(16 x 256, smem desc, N-major: wg_desc_mn) */
static __device__ __forceinline__ void wg_mma_rs_tb256(float *d, const uint32_t (&a)[4],
                                                       uint64_t db, int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %133, "
                 "0;\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_R128
                 "}, {%128, %129, %130, %131}, %132, sd, 1, 1, 1;\n}\n"
                 : WG_D128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc_on));
}

/* d[0..N/2) (+)= A(64x16, smem desc) * B(N x 16, smem desc)^T; acc_on 0: d = the product */
template <int N>
static __device__ __forceinline__ void wg_mma_ss(float *d, uint64_t da, uint64_t db, int acc_on);
template <>
__device__ __forceinline__ void wg_mma_ss<64>(float *d, uint64_t da, uint64_t db, int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, sd, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc_on));
}

template <>
__device__ __forceinline__ void wg_mma_ss<128>(float *d, uint64_t da, uint64_t db, int acc_on) {
    asm volatile("{\n.reg .pred sd;\nsetp.ne.b32 sd, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R64
                 "}, %64, %65, sd, 1, 1, 0, 0;\n}\n"
                 : WG_D64
                 : "l"(da), "l"(db), "r"(acc_on));
}

#endif
