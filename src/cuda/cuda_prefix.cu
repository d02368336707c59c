/* The CUDA backend's prefix cache storage and copies (backend.h cache_alloc / cache_save /
 * cache_load; docs/architecture.md §4.1). Every decision is prefix_cache.c's. The cache's KV
 * pages are pool pages: a full page is shared by entering its id in a slot's page table (the
 * attention kernels read every position through the table), so only the partial page at the
 * snapshot point moves, pool page to pool page with tl_gpu_kv_page_copy (all layers in one launch
 * each for K and V); the GDN conv and recurrent state move between the slot and a snapshot with
 * one strided cudaMemcpy2DAsync each, and on a load the restored tokens' penalty counts are added
 * (tl_gpu_penalty_add). The snapshot states are set aside at open, before the KV pool takes the
 * free memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/status.h"
#include "common/util.h"
#include "engine/prefix_cache.h"
}

static size_t rec_floats(const cuda_be *be) { return (size_t)be->cfg.gdn_n_v_head * 128 * 128; }
static size_t conv_floats(const cuda_be *be) { return (size_t)3 * be->conv_dim; }
static int row_elems(const cuda_be *be) { return be->cfg.n_head_kv * 256; }

size_t cb_pc_page_bytes(const cuda_be *be) {
    return (size_t)2 * be->n_attn * TL_KV_PAGE * row_elems(be) * sizeof(uint16_t);
}
/* A snapshot: the GDN state ([n_gdn] recurrent, then [n_gdn] conv), then with the MTP head
 * (n_kv_layers > n_attn) the final-normed hidden of its last position, f32 [n_embd]. */
size_t cb_pc_hid_off(const cuda_be *be) {
    return (size_t)be->n_gdn * (rec_floats(be) * be->st_esz + conv_floats(be) * sizeof(float));
}
size_t cb_pc_snap_bytes(const cuda_be *be) {
    size_t hid = be->n_kv_layers > be->n_attn ? (size_t)be->cfg.n_embd * sizeof(float) : 0;
    return cb_pc_hid_off(be) + hid;
}

/* The snapshot budget: given (> 0), or (< 0) an eighth of what --gpu-memory-utilization leaves
 * now (at most 16 GiB); 0 with the cache off. */
static long long pc_budget(const cuda_be *be, const tl_cuda_params *p) {
    if (p->prefix_cache_bytes >= 0) return p->prefix_cache_bytes;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    double util = p->gpu_memory_utilization > 0 ? p->gpu_memory_utilization : 0.9;
    double avail = util * (double)total_b - (double)(total_b - free_b);
    return avail > 0 ? (long long)TL_MIN(avail / 8, 16.0 * (1ll << 30)) : 0;
}

/* Before the KV pool is sized: the snapshot states (none when the budget is 0, or, for the default
 * budget, when it holds not even one snapshot). */
int cb_pc_alloc_storage(cuda_be *be, const tl_cuda_params *p, char *err, size_t errlen) {
    long long bytes = pc_budget(be, p);
    size_t sb = cb_pc_snap_bytes(be);
    if (bytes <= 0 || sb == 0) return 0;
    int ns;
    int st = tl_pc_layout(bytes, sb, &ns, err, errlen);
    if (st && p->prefix_cache_bytes < 0) { /* the default found too little room: say so */
        fprintf(stderr, "tulip: no prefix cache: %s\n", err);
        if (err && errlen) err[0] = 0;
        return 0;
    }
    if (st) return st;
    be->pc_snap = (char *)tl_gpu_malloc((size_t)ns * sb);
    if (!be->pc_snap)
        return tl_errf(err, errlen, TL_ERR_NOMEM,
                       "cudaMalloc of the prefix cache (%.2f GiB) failed: lower --prefix-cache-gb",
                       (double)bytes / (1 << 30));
    be->pc_n_snap = ns, be->pc_bytes = bytes;
    return 0;
}

/* After the pool: the metadata buffers (page pairs, then tokens / positions / slots). */
int cb_pc_alloc_meta(cuda_be *be, char *err, size_t errlen) {
    if (!be->pc_n_snap) return 0;
    be->pc_meta_ints = 3 * (size_t)be->max_pages + 3 * (size_t)be->max_ctx;
    be->d_pc_meta = (int32_t *)tl_gpu_malloc(be->pc_meta_ints * sizeof(int32_t));
    if (!be->d_pc_meta || cudaMallocHost(&be->h_pc_meta, be->pc_meta_ints * sizeof(int32_t)))
        return tl_errf(err, errlen, TL_ERR_NOMEM, "prefix cache metadata: out of memory");
    return 0;
}

void cb_pc_free(cuda_be *be) {
    tl_gpu_free(be->pc_snap);
    tl_gpu_free(be->d_pc_meta);
    if (be->h_pc_meta) cudaFreeHost(be->h_pc_meta);
}

static int cb_cache_alloc(tl_backend *b, int n_snap, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (cb_bind(be))
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot make CUDA device %d current", be->device);
    if (n_snap != be->pc_n_snap)
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "prefix cache: %d snapshots asked, %d allocated", n_snap, be->pc_n_snap);
    return 0;
}

static tl_kv_pages *cb_kv_pool(tl_backend *b) { return &((cuda_be *)b->impl)->pages; }

static int check_io(const cuda_be *be, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    int bad = slot < 0 || slot >= be->max_seqs || io->n_tok <= 0 || io->n_tok > be->max_ctx ||
              io->snap < 0 || io->snap >= be->pc_n_snap || io->n_full != io->n_tok / TL_KV_PAGE;
    if (bad)
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix cache: bad copy (slot %d, %d tokens)",
                       slot, io->n_tok);
    if (be->lost) return tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the GPU was lost");
    return 0;
}

/* Rows [0, rows) of pool page src into pool page dst, K and V of every KV layer (the MTP
 * head's too). */
static int copy_partial(cuda_be *be, int src, int dst, int rows) {
    if (rows == 0 || be->n_kv_layers == 0) return 0;
    tl_gpu_stream st = cb_stream(be, 0);
    be->h_pc_meta[0] = src, be->h_pc_meta[1] = dst, be->h_pc_meta[2] = rows;
    CUDA_TRY(cudaMemcpyAsync(be->d_pc_meta, be->h_pc_meta, 3 * sizeof(int32_t),
                             cudaMemcpyHostToDevice, be->stream));
    TRY(tl_gpu_kv_page_copy(be->kc, be->n_page, be->kc, be->n_page, be->d_pc_meta, 1,
                            be->n_kv_layers, row_elems(be), &st));
    TRY(tl_gpu_kv_page_copy(be->vc, be->n_page, be->vc, be->n_page, be->d_pc_meta, 1,
                            be->n_kv_layers, row_elems(be), &st));
    return 0;
}

/* The slot's conv and recurrent state of every GDN layer <-> snapshot `snap` ([n_gdn][rec], then
 * [n_gdn][conv]): one strided copy each. */
static int copy_state(cuda_be *be, int slot, int snap, int to_cache) {
    return cb_state_copy(be, slot, be->pc_snap + (size_t)snap * cb_pc_snap_bytes(be), to_cache);
}

int cb_state_copy(cuda_be *be, int slot, char *buf, int to_cache) {
    if (be->n_gdn == 0) return 0;
    size_t rec = rec_floats(be) * be->st_esz, conv = conv_floats(be); /* rec in bytes */
    char *s_rec = buf;
    float *s_conv = (float *)(s_rec + (size_t)be->n_gdn * rec);
    char *b_rec = be->rec_st + (size_t)slot * rec;
    float *b_conv = be->conv_st + (size_t)slot * conv;
    size_t bp_rec = (size_t)be->max_seqs * rec, bp_conv = (size_t)be->max_seqs * conv * 4;
    if (to_cache) {
        CUDA_TRY(cudaMemcpy2DAsync(s_rec, rec, b_rec, bp_rec, rec, be->n_gdn,
                                   cudaMemcpyDeviceToDevice, be->stream));
        CUDA_TRY(cudaMemcpy2DAsync(s_conv, conv * 4, b_conv, bp_conv, conv * 4, be->n_gdn,
                                   cudaMemcpyDeviceToDevice, be->stream));
    } else {
        CUDA_TRY(cudaMemcpy2DAsync(b_rec, bp_rec, s_rec, rec, rec, be->n_gdn,
                                   cudaMemcpyDeviceToDevice, be->stream));
        CUDA_TRY(cudaMemcpy2DAsync(b_conv, bp_conv, s_conv, conv * 4, conv * 4, be->n_gdn,
                                   cudaMemcpyDeviceToDevice, be->stream));
    }
    return 0;
}

/* Ends a copy: waits for the stream; a CUDA error fails it (a sticky one loses the device). */
static int finish(cuda_be *be, int st, char *err, size_t errlen) {
    if (st == 0) {
        cudaError_t e = cudaStreamSynchronize(be->stream);
        if (e != cudaSuccess) {
            fprintf(stderr, "tulip: prefix cache copy: %s\n", cudaGetErrorString(e));
            st = TL_ERR_CUDA;
        }
    }
    if (st == TL_ERR_CUDA && cb_device_broken(be)) be->lost = 1;
    if (st) return tl_errf(err, errlen, st, "prefix cache copy failed: %s", tl_status_str(st));
    return 0;
}

static int cb_cache_save(tl_backend *b, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (cb_bind(be))
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot make CUDA device %d current", be->device);
    TRY(check_io(be, slot, io, err, errlen));
    int np = TL_CEIL_DIV(io->n_tok, TL_KV_PAGE), have = be->pages.np[slot];
    if ((be->n_attn && (io->state_in ? have < np : have != np)) ||
        (io->part_rows && io->part_rows != io->n_tok % TL_KV_PAGE) ||
        (io->part_rows && (io->part_src < 0 || io->part_src >= be->n_page || io->part_dst < 0 ||
                           io->part_dst >= be->n_page)))
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "prefix save: slot %d holds %d pages, not %d (partial page %d -> %d)", slot,
                       be->pages.np[slot], np, io->part_src, io->part_dst);
    int st = copy_partial(be, io->part_src, io->part_dst, io->part_rows);
    if (!st && !io->state_in) st = copy_state(be, slot, io->snap, 1); /* else the forward did */
    if (!st && !io->state_in) st = cb_spec_snap_save(be, slot, io->snap, io->n_tok);
    return finish(be, st, err, errlen);
}

/* The restored tokens into the slot's penalty counts (the slot was reset: its counts are 0). */
static int count_restored(cuda_be *be, int slot, const int32_t *tokens, int n, int n_prompt) {
    int32_t *h = be->h_pc_meta + 3 * (size_t)be->max_pages, *d = be->d_pc_meta + 3 * be->max_pages;
    for (int i = 0; i < n; i++) h[i] = tokens[i], h[n + i] = i, h[2 * n + i] = slot;
    be->h_nprompt[slot] = n_prompt;
    CUDA_TRY(cudaMemcpyAsync(be->d_nprompt + slot, be->h_nprompt + slot, sizeof(int32_t),
                             cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(
        cudaMemcpyAsync(d, h, (size_t)3 * n * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream));
    tl_gpu_stream st = cb_stream(be, 0);
    return tl_gpu_penalty_add(be->d_counts, be->d_cbits, be->cfg.n_vocab, d, d + n, d + 2 * n,
                              be->d_nprompt, n, &st);
}

/* The slot's table: the shared full pages, then a page of its own for the partial page (all or
 * nothing: on failure the slot holds no page); the row uploaded. */
static int map_pages(cuda_be *be, int slot, const tl_pc_io *io, char *err, size_t errlen) {
    TRY(tl_kv_pages_map(&be->pages, slot, io->page, io->n_full, err, errlen));
    int len = io->n_tok, rc = tl_kv_pages_reserve(&be->pages, &slot, &len, 1, NULL, err, errlen);
    if (rc) {
        tl_kv_pages_release(&be->pages, slot);
        return rc;
    }
    size_t off = (size_t)slot * be->max_pages;
    CUDA_TRY(cudaMemcpyAsync(be->d_ptab + off, be->h_ptab + off,
                             be->pages.np[slot] * sizeof(int32_t), cudaMemcpyHostToDevice,
                             be->stream));
    return 0;
}

static int cb_cache_load(tl_backend *b, int slot, const tl_pc_io *io, const int32_t *tokens,
                         int n_prompt, char *err, size_t errlen) {
    cuda_be *be = (cuda_be *)b->impl;
    if (cb_bind(be))
        return tl_errf(err, errlen, TL_ERR_CUDA, "cannot make CUDA device %d current", be->device);
    TRY(check_io(be, slot, io, err, errlen));
    int part = io->n_tok % TL_KV_PAGE;
    if (part && (io->page[io->n_full] < 0 || io->page[io->n_full] >= be->n_page))
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: no partial page");
    if (be->pages.np[slot] != 0)
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: slot %d is not empty", slot);
    int st = 0;
    if (be->n_attn) {
        st = map_pages(be, slot, io, err, errlen);
        if (st == TL_ERR_CONTEXT_FULL || st == TL_ERR_INVALID) return st;
        if (!st && part) {
            const int32_t *row = be->h_ptab + (size_t)slot * be->max_pages;
            st = copy_partial(be, io->page[io->n_full], row[io->n_full], part);
        }
    }
    if (!st) st = copy_state(be, slot, io->snap, 0);
    if (!st) st = count_restored(be, slot, tokens, io->n_tok, n_prompt);
    if (!st) st = cb_spec_snap_load(be, slot, io->snap, io->n_tok); /* the head's hidden */
    return finish(be, st, err, errlen);
}

extern "C" int tl_backend_cuda_snapshot(tl_backend *b, int snap, void *out) {
    cuda_be *be = (cuda_be *)b->impl;
    if (snap < 0 || snap >= be->pc_n_snap || !out) return TL_ERR_INVALID;
    if (cb_bind(be)) return TL_ERR_CUDA;
    size_t n = cb_pc_snap_bytes(be);
    CUDA_TRY(cudaMemcpyAsync(out, be->pc_snap + (size_t)snap * n, n, cudaMemcpyDeviceToHost,
                             be->stream));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    return 0;
}

void cb_pc_attach(cuda_be *be, tl_backend *b) {
    if (!be->pc_n_snap) return;
    b->pc_page_bytes = cb_pc_page_bytes(be);
    b->pc_snap_bytes = cb_pc_snap_bytes(be);
    b->pc_budget = be->pc_bytes;
    b->kv_pool = cb_kv_pool;
    b->cache_alloc = cb_cache_alloc;
    b->cache_save = cb_cache_save;
    b->cache_load = cb_cache_load;
}
