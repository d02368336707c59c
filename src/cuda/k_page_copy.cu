/* Copies of whole KV page rows between two paged pools of the same row layout, every layer in one
 * launch: the prefix cache's save (a slot's pages -> cache pages) and load (cache pages -> a
 * slot's pages), docs/architecture.md §4.1. Plain data movement, 16 bytes per thread per
 * iteration; bit-exact by construction (tests/gpu/test_kernels.c checks it against a host copy). */
#include "cuda/cuda_common.cuh"

/* grid (n_pairs, n_layer): block (p, l) copies rows [0, pairs[p].rows) of page pairs[p].src of
 * layer l in src to page pairs[p].dst of layer l in dst. */
__global__ void kv_page_copy_kernel(uint16_t *dst, long long dst_layer, const uint16_t *src,
                                    long long src_layer, const int32_t *pairs, int row_elems) {
    int p = blockIdx.x, l = blockIdx.y;
    int sp = pairs[3 * p], dp = pairs[3 * p + 1], rows = pairs[3 * p + 2];
    long long page = (long long)TL_KV_PAGE * row_elems;
    const uint4 *s = (const uint4 *)(src + l * src_layer + sp * page);
    uint4 *d = (uint4 *)(dst + l * dst_layer + dp * page);
    int n = rows * row_elems / 8; /* uint4 = 8 bf16 */
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

extern "C" int tl_gpu_kv_page_copy(uint16_t *dst, int dst_pages, const uint16_t *src, int src_pages,
                                   const int32_t *pairs, int n_pairs, int n_layer, int row_elems,
                                   const tl_gpu_stream *st) {
    if (n_pairs <= 0 || n_layer <= 0) return 0;
    if (row_elems % 8 || ((uintptr_t)dst | (uintptr_t)src) % 16) return TL_ERR_INVALID;
    long long page = (long long)TL_KV_PAGE * row_elems;
    TL_LAUNCH(st, "kv_page_copy", kv_page_copy_kernel, dim3(n_pairs, n_layer), dim3(256), 0, dst,
              (long long)dst_pages * page, src, (long long)src_pages * page, pairs, row_elems);
    return 0;
}
