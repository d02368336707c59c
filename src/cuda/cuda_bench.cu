/* Measurement inside the CUDA backend: the per-kernel profiler (an event after every launch of
 * an eager step, tulip bench --prof / --prof-prefill), the profiler range around one step
 * (tulip bench --profile-range, for ncu), `tulip bench --ops` (each decode op timed in place),
 * and the byte counts and bandwidth probe the bench reports against. */
#include <cuda_profiler_api.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.cuh"

extern "C" {
#include "common/util.h"
}

/* ====== Per-kernel profiler (eager steps only: graphs are bypassed while it is on) ====== */

#define PROF_MAX 8192
struct tl_gpu_prof {
    int n;
    cudaEvent_t ev[PROF_MAX];
    const char *name[PROF_MAX];
};

void tl_gpu_prof_mark(tl_gpu_prof *p, cudaStream_t stream, const char *name) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (!p || p->n >= PROF_MAX) return;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return;
    if (!p->ev[p->n] && cudaEventCreate(&p->ev[p->n]) != cudaSuccess) return;
    if (cudaEventRecord(p->ev[p->n], stream) != cudaSuccess) return;
    p->name[p->n++] = name;
}

extern "C" void tl_cuda_prof_enable(tl_backend *b, int on) {
    cuda_be *be = (cuda_be *)b->impl;
    if (on && !be->prof) be->prof = (tl_gpu_prof *)xcalloc(1, sizeof *be->prof);
    if (be->prof) be->prof->n = 0;
    if (!on && be->prof) {
        for (int i = 0; i < PROF_MAX; i++)
            if (be->prof->ev[i]) cudaEventDestroy(be->prof->ev[i]);
        free(be->prof);
        be->prof = NULL;
    }
}

typedef struct prof_row {
    const char *name;
    double ms;
    int calls;
} prof_row;

static int prof_cmp(const void *a, const void *b) {
    double d = ((const prof_row *)b)->ms - ((const prof_row *)a)->ms;
    return d > 0 ? 1 : d < 0 ? -1 : 0;
}

/* Sums the time between consecutive events per kernel name, sorted by time. */
static int prof_rows(const tl_gpu_prof *p, prof_row *rows, int max_rows, double *total) {
    int nn = 0;
    *total = 0;
    for (int i = 1; i < p->n; i++) {
        float dt = 0;
        cudaEventElapsedTime(&dt, p->ev[i - 1], p->ev[i]);
        int k = 0;
        while (k < nn && strcmp(rows[k].name, p->name[i])) k++;
        if (k == nn && nn < max_rows)
            rows[nn].name = p->name[i], rows[nn].ms = 0, rows[nn++].calls = 0;
        if (k < nn) rows[k].ms += dt, rows[k].calls++;
        *total += dt;
    }
    qsort(rows, nn, sizeof *rows, prof_cmp);
    return nn;
}

extern "C" void tl_cuda_prof_report(tl_backend *b, void *file) {
    cuda_be *be = (cuda_be *)b->impl;
    FILE *f = (FILE *)file;
    if (!be->prof) return;
    cudaDeviceSynchronize();
    prof_row rows[64];
    double total;
    int nn = prof_rows(be->prof, rows, 64, &total);
    fprintf(f, "| kernel | calls | ms | share |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < nn; i++)
        fprintf(f, "| %s | %d | %.4f | %.1f%% |\n", rows[i].name, rows[i].calls, rows[i].ms,
                total > 0 ? 100.0 * rows[i].ms / total : 0.0);
    fprintf(f, "| total (launch gaps included) | | %.4f | 100%% |\n", total);
    if (be->prof->n >= PROF_MAX)
        fprintf(f, "\n(truncated: the first %d launches only; the profiler holds no more)\n",
                PROF_MAX - 1);
    tl_cuda_prof_enable(b, 0);
}

/* ====== Profiler range (ncu --profile-from-start off, nsys --capture-range=cudaProfilerApi) */

extern "C" int tl_gpu_profiler_range(int on) {
    CUDA_TRY(cudaDeviceSynchronize()); /* the range holds exactly the launches in between */
    CUDA_TRY(on ? cudaProfilerStart() : cudaProfilerStop());
    return 0;
}

/* ====== tulip bench --ops: each decode op of one token timed in place ======
 * After a decode step at the bench's context (the metadata of that step stays on the device),
 * every op of the decode schedule is captured R times back to back into a graph (launched as in
 * run_layers, PDL included) and the graph replayed; the best of 5 replays / R is the op's cost
 * inside a stream of launches: its own time plus the dependent-launch gap, at warm clocks
 * (unlike ncu's serialized, idle-between-kernels replays). Ops that update state (conv, GDN,
 * KV write, residual adds) repeat on their own outputs, which changes values, not the work. */
typedef struct op_ctx {
    cuda_be *be;
    const cb_layer *G, *A; /* the first GDN and attention layers */
    const tl_gpu_seqs *s;
    const tl_gpu_stream *st;
} op_ctx;
typedef int (*op_fn)(const op_ctx *o);
#define OP_VARS                                                                                    \
    cuda_be *be = o->be;                                                                           \
    [[maybe_unused]] const cb_layer *G = o->G;                                                     \
    [[maybe_unused]] const cb_layer *A = o->A;                                                     \
    [[maybe_unused]] const tl_gpu_seqs *s = o->s;                                                  \
    const tl_gpu_stream *st = o->st

static int op_gdn_in(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv(be->proj, be->ld_gdn_in, &G->in, be->x, be->cfg.n_embd, G->attn_norm,
                       be->cfg.rms_eps, 1, 0, st);
}
static int op_gdn_in_conv(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv_conv1d(be->proj, be->ld_gdn_in, &G->in, be->x, be->cfg.n_embd, G->attn_norm,
                              be->cfg.rms_eps, 1, be->conv_out, be->conv_st, G->conv_w,
                              be->conv_dim, s->tok_slot, st);
}
static int op_conv(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_conv1d(be->conv_out, be->conv_st, be->proj, be->ld_gdn_in, G->conv_w,
                         be->conv_dim, s, NULL, st);
}
static int op_gdn(const op_ctx *o) {
    OP_VARS;
    int nv = be->cfg.gdn_n_v_head, z_off = be->conv_dim, b_off = z_off + be->val_dim,
        a_off = b_off + nv;
    return tl_gpu_gdn(be->y, be->rec_st, be->st_bf16, be->conv_out, be->proj, be->ld_gdn_in, z_off,
                      b_off, a_off, G->dt_bias, G->a_neg, G->gdn_norm, be->cfg.gdn_n_k_head, nv,
                      be->cfg.rms_eps, s, NULL, st);
}
static int op_gdn_out(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv(be->x, be->cfg.n_embd, &G->out, be->y, be->val_dim, NULL, 0.0f, 1, 1, st);
}
static int op_attn_in(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv(be->proj, be->ld_attn_in, &A->in, be->x, be->cfg.n_embd, A->attn_norm,
                       be->cfg.rms_eps, 1, 0, st);
}
static int op_rope(const op_ctx *o) {
    OP_VARS;
    const tl_config *c = &be->cfg;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};
    return tl_gpu_qk_rope_kv(be->q, be->kc, be->vc, be->proj, be->ld_attn_in, A->q_norm, A->k_norm,
                             c->n_head, c->n_head_kv, &pg, c->rope_theta, c->rms_eps, s, st);
}
static int op_attn(const op_ctx *o) {
    OP_VARS;
    const tl_config *c = &be->cfg;
    tl_gpu_kv_pages pg = {be->d_ptab, be->max_pages};
    return tl_gpu_attn(be->y, be->part, be->q, be->kc, be->vc, be->proj, be->ld_attn_in, c->n_head,
                       c->n_head_kv, &pg, CB_DECODE_SPLIT, s, &be->attn, st);
}
static int op_attn_out(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv(be->x, be->cfg.n_embd, &A->out, be->y, be->cfg.n_head * 256, NULL, 0.0f, 1,
                       1, st);
}
static int op_router(const op_ctx *o) {
    OP_VARS;
    int E = be->cfg.n_expert;
    return tl_gpu_gemv(be->rlog, E + 1, &G->router, be->x, be->cfg.n_embd, G->ffn_norm,
                       be->cfg.rms_eps, 1, 0, st);
}
static int op_route(const op_ctx *o) {
    OP_VARS;
    int E = be->cfg.n_expert;
    return tl_gpu_moe_route(be->ids, be->wts, be->wsh, NULL, be->rlog, E + 1, E,
                            be->cfg.n_expert_used, 1, st);
}
static int op_moe_up(const op_ctx *o) {
    OP_VARS;
    const tl_config *c = &be->cfg;
    if (G->gate_up.bits == 4) /* the step routes inside moe_up */
        return tl_gpu_moe_up_route(be->act, be->ids, be->wts, be->wsh, &G->gate_up, be->x,
                                   G->ffn_norm, c->rms_eps, be->rlog, c->n_expert + 1,
                                   c->n_expert_used, c->n_expert, 1, st);
    return tl_gpu_moe_up(be->act, &G->gate_up, be->x, G->ffn_norm, c->rms_eps, be->ids,
                         c->n_expert_used, c->n_expert, 1, st);
}
static int op_moe_down(const op_ctx *o) {
    OP_VARS;
    const tl_config *c = &be->cfg;
    if (G->gate_up.bits == 4) /* as the step runs it (the logits do not change here) */
        return tl_gpu_moe_down_after_route(be->x, &G->down, be->act, be->ids, be->rlog,
                                           c->n_expert + 1, be->wts, be->wsh, c->n_expert_used,
                                           c->n_expert, 1, st);
    return tl_gpu_moe_down(be->x, &G->down, be->act, be->ids, be->wts, be->wsh, c->n_expert_used,
                           c->n_expert, 1, st);
}
static int op_lm_head(const op_ctx *o) {
    OP_VARS;
    return tl_gpu_gemv(be->logits, be->cfg.n_vocab, &be->lm_head, be->xo, be->cfg.n_embd, NULL,
                       0.0f, 1, 0, st);
}

/* Best time of `reps` back-to-back launches of graph ge over 5 replays (one more warms up). */
static int best_replay_ms(cuda_be *be, cudaGraphExec_t ge, int reps, float *best) {
    cudaEvent_t e0, e1;
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    *best = 1e30f;
    for (int rep = 0; rep < 6; rep++) {
        CUDA_TRY(cudaEventRecord(e0, be->stream));
        for (int i = 0; i < reps; i++) CUDA_TRY(cudaGraphLaunch(ge, be->stream));
        CUDA_TRY(cudaEventRecord(e1, be->stream));
        CUDA_TRY(cudaEventSynchronize(e1));
        float ms;
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < *best) *best = ms; /* rep 0 warms up */
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 0;
}

/* Where a decode step's time goes beyond the ops: for each batch size T with a captured decode
 * graph (be->graph[T]: the step just measured; launched again it reruns the same positions, so
 * only the state and one KV row per sequence are rewritten), that forward launched back to back,
 * and the sampler over its T rows with the last step's parameters and penalty counts (read only),
 * captured alone. Step − forward − sampler is what the host adds (uploads, launches, the
 * synchronisation and the engine between steps). */
static int step_parts(cuda_be *be, FILE *f) {
    const int R = 20;
    tl_gpu_stream st = cb_stream(be, 0);
    int head = 0;
    for (int T = 1; T <= CB_MAX_GRAPH_B; T++) {
        if (!be->graph[T]) continue;
        if (!head++)
            fprintf(f,
                    "\n| part of a decode step (device time) | tokens | us |\n|---|---:|---:|\n");
        float ms;
        TRY(best_replay_ms(be, be->graph[T], R, &ms));
        fprintf(f, "| forward graph, launched back to back | %d | %.1f |\n", T, 1000.0 * ms / R);
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
        int rc = 0;
        for (int r = 0; r < R && !rc; r++)
            rc = tl_gpu_sample(be->d_out, be->logits, be->cfg.n_vocab, be->n_valid, be->d_params,
                               be->h_params, be->d_keys, be->d_counts, be->d_cbits, be->d_rowslot,
                               be->d_sscratch, NULL, T, &st);
        CUDA_TRY(cudaStreamEndCapture(be->stream, &g));
        if (rc) return rc;
        CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
        cudaGraphDestroy(g);
        rc = best_replay_ms(be, ge, 1, &ms);
        cudaGraphExecDestroy(ge);
        if (rc) return rc;
        fprintf(f, "| sampler (the last step's settings and counts), captured | %d | %.1f |\n", T,
                1000.0 * ms / R);
    }
    return 0;
}

extern "C" int tl_cuda_bench_ops(tl_backend *b, void *file) {
    cuda_be *be = (cuda_be *)b->impl;
    FILE *f = (FILE *)file;
    const tl_config *c = &be->cfg;
    const cb_layer *G = NULL, *A = NULL;
    for (int il = 0; il < c->n_layer; il++) {
        if (!G && be->L[il].kind == TL_LAYER_GDN) G = &be->L[il];
        if (!A && be->L[il].kind == TL_LAYER_ATTN) A = &be->L[il];
    }
    if (!G || !A) return TL_ERR_INVALID;
    tl_gpu_seqs s = cb_seqs(be, 1, 1);
    tl_gpu_stream pst = cb_stream(be, 1);
    pst.prof = NULL;
    op_ctx oc = {be, G, A, &s, &pst};
    struct {
        const char *name;
        op_fn fn;
        int per_step;
        size_t bytes;
    } ops[] = {
        {"gdn in-proj gemv_q4 (+ conv1d fused)", op_gdn_in_conv, G->in.bits == 4 ? be->n_gdn : 0,
         tl_gpu_mat_bytes(&G->in)},
        {"gdn in-proj gemv", op_gdn_in, G->in.bits == 4 ? 0 : be->n_gdn, tl_gpu_mat_bytes(&G->in)},
        {"conv1d (unfused)", op_conv, G->in.bits == 4 ? 0 : be->n_gdn, 0},
        {"gdn_step", op_gdn, be->n_gdn, (size_t)c->gdn_n_v_head * 128 * 128 * 8},
        {"gdn out-proj gemv_q4", op_gdn_out, be->n_gdn, tl_gpu_mat_bytes(&G->out)},
        {"attn in-proj gemv_q4", op_attn_in, be->n_attn, tl_gpu_mat_bytes(&A->in)},
        {"qk_rope_kv", op_rope, be->n_attn, 0},
        {"attn split+combine", op_attn, be->n_attn, 0},
        {"attn o-proj gemv_q4", op_attn_out, be->n_attn, tl_gpu_mat_bytes(&A->out)},
        {"router gemv_bf16", op_router, c->n_layer, tl_gpu_mat_bytes(&G->router)},
        {"moe_route (bf16 experts only)", op_route, G->gate_up.bits == 4 ? 0 : c->n_layer, 0},
        {G->gate_up.bits == 4 ? "moe_up + route" : "moe_up", op_moe_up, c->n_layer,
         tl_gpu_mat_bytes(&G->gate_up) / (c->n_expert + 1) * (c->n_expert_used + 1)},
        {"moe_down", op_moe_down, c->n_layer,
         tl_gpu_mat_bytes(&G->down) / (c->n_expert + 1) * (c->n_expert_used + 1)},
        {"lm_head gemv_q4", op_lm_head, 1, tl_gpu_mat_bytes(&be->lm_head)},
    };
    const int R = 40;
    double total = 0;
    fprintf(f, "| op (one token) | per step | us per call | GB/s | us per step "
               "|\n|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!ops[i].per_step) continue; /* not in this model's step */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_TRY(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal));
        int st = 0;
        for (int r = 0; r < R && !st; r++) st = ops[i].fn(&oc);
        CUDA_TRY(cudaStreamEndCapture(be->stream, &g));
        if (st) return st;
        CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
        cudaGraphDestroy(g);
        float best;
        st = best_replay_ms(be, ge, 1, &best);
        cudaGraphExecDestroy(ge);
        if (st) return st;
        double us = 1000.0 * best / R;
        total += us * ops[i].per_step;
        if (ops[i].bytes)
            fprintf(f, "| %s | %d | %.2f | %.0f | %.1f |\n", ops[i].name, ops[i].per_step, us,
                    ops[i].bytes / us / 1e3, us * ops[i].per_step);
        else
            fprintf(f, "| %s | %d | %.2f | | %.1f |\n", ops[i].name, ops[i].per_step, us,
                    us * ops[i].per_step);
    }
    fprintf(f, "| sum over one step | | | | %.1f |\n", total);
    CUDA_TRY(cudaGetLastError());
    return step_parts(be, f);
}

/* ====== Bytes and bandwidth ====== */

extern "C" size_t tl_cuda_weight_bytes(const tl_backend *b) {
    return cb_weight_bytes((const cuda_be *)b->impl);
}

size_t cb_weight_bytes(const cuda_be *be) {
    size_t n = tl_gpu_mat_bytes(&be->embd) + tl_gpu_mat_bytes(&be->lm_head);
    for (int il = 0; il < be->cfg.n_layer; il++) {
        const cb_layer *L = &be->L[il];
        n += tl_gpu_mat_bytes(&L->in) + tl_gpu_mat_bytes(&L->out) + tl_gpu_mat_bytes(&L->router) +
             tl_gpu_mat_bytes(&L->gate_up) + tl_gpu_mat_bytes(&L->down);
    }
    if (be->sp) { /* the MTP head */
        const cb_layer *L = &be->sp->L;
        n += tl_gpu_mat_bytes(&be->sp->fc) + tl_gpu_mat_bytes(&L->in) + tl_gpu_mat_bytes(&L->out) +
             tl_gpu_mat_bytes(&L->router) + tl_gpu_mat_bytes(&L->gate_up) +
             tl_gpu_mat_bytes(&L->down);
    }
    return n;
}

extern "C" double tl_cuda_decode_bytes(const tl_backend *b, int kv_len) {
    const cuda_be *be = (const cuda_be *)b->impl;
    const tl_config *c = &be->cfg;
    double n =
        (double)tl_gpu_mat_bytes(&be->embd) / c->n_vocab + (double)tl_gpu_mat_bytes(&be->lm_head);
    for (int il = 0; il < c->n_layer; il++) {
        const cb_layer *L = &be->L[il];
        double per_exp = (double)(tl_gpu_mat_bytes(&L->gate_up) + tl_gpu_mat_bytes(&L->down)) /
                         (c->n_expert + 1);
        n += tl_gpu_mat_bytes(&L->in) + tl_gpu_mat_bytes(&L->out) + tl_gpu_mat_bytes(&L->router) +
             per_exp * (c->n_expert_used + 1);
        if (L->kind == TL_LAYER_ATTN)
            n += (double)kv_len * c->n_head_kv * 256 * 2 * 2;
        else
            n += 2.0 * (c->gdn_n_v_head * 128.0 * 128.0 * 4 + 3.0 * be->conv_dim * 4);
    }
    return n;
}

__global__ void touch_kernel(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)(i & 1023);
}

static int touch(float *p, size_t n) {
    TL_LAUNCH(NULL, "touch", touch_kernel, dim3(4096), dim3(256), 0, p, n);
    return 0;
}

extern "C" double tl_gpu_measure_bw(size_t bytes) {
    void *a = tl_gpu_malloc(bytes), *bb = tl_gpu_malloc(bytes);
    if (!a || !bb) {
        tl_gpu_free(a), tl_gpu_free(bb);
        return 0;
    }
    if (touch((float *)a, bytes / 4)) {
        tl_gpu_free(a), tl_gpu_free(bb);
        return 0;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float best[7];
    for (int i = 0; i < 7; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(bb, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&best[i], e0, e1);
    }
    for (int i = 0; i < 7; i++) /* median */
        for (int j = i + 1; j < 7; j++)
            if (best[j] < best[i]) {
                float t = best[i];
                best[i] = best[j], best[j] = t;
            }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    tl_gpu_free(a), tl_gpu_free(bb);
    return 2.0 * bytes / (best[3] * 1e-3);
}
