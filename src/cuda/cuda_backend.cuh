/* The CUDA backend's private state, shared by cuda_runtime.cu (open, close, slots), cuda_weights.cu
 * (weight upload), cuda_forward.cu (the schedule of one step) and cuda_bench.cu (profiler, bench
 * --ops). Nothing outside src/cuda sees it. */
#ifndef TL_CUDA_BACKEND_CUH
#define TL_CUDA_BACKEND_CUH

#include "cuda/cuda_common.cuh"

extern "C" {
#include "engine/kv_pages.h"
#include "engine/batch_plan.h"
}

#define CB_MAX_GRAPH_B                                                                             \
    256 /* decode batch sizes captured as graphs (each once, when first seen)                      \
         */
#define CB_DECODE_SPLIT    128 /* split-KV partials per (token, head) on the decode path */
#define CB_PF_MIN          16 /* a sequence's chunk of at least this many tokens takes the GEMM path */
#define CB_ROUTER_GEMM_MIN 64   /* micro-batches of this many tokens get the router GEMM */
#define CB_TC_MIN          3    /* default tc_min (below): from 3 tokens the batched path wins */
#define CB_MAX_SEQS        1024 /* slots at most (the step's per-entry arrays) */

/* One layer on the device. Matrices are tl_gpu_gemm_w (bf16 or q4 tiled). */
typedef struct cb_layer {
    tl_layer_kind kind;
    float *attn_norm, *ffn_norm; /* [n_embd] (1+w) */
    tl_gpu_gemm_w in;            /* gdn: rows q|k|v (conv_dim), z (val_dim), b, a (nv each),
                                    padded to a multiple of 128; attn: q+gate (n_head*512), k, v */
    tl_gpu_gemm_w out;      /* gdn out_proj [n_embd, val_dim] / attn o_proj [n_embd, n_head*256] */
    float *q_norm, *k_norm; /* [256] (1+w) */
    float *conv_w;          /* [conv_dim, 4] */
    float *dt_bias, *a_neg; /* [nv] */
    float *gdn_norm;        /* [128] */
    tl_gpu_gemm_w router;   /* bf16 [n_expert + 1, n_embd]: router rows, then shared_expert_gate */
    tl_gpu_gemm_w gate_up;  /* (n_expert + 1) experts [2F, n_embd], rows interleaved by 8 */
    tl_gpu_gemm_w down;     /* (n_expert + 1) experts [n_embd, F] */
    int st_idx;             /* index among layers of its kind (KV / GDN state arrays) */
} cb_layer;

/* Speculative decoding on the device (cuda_spec.cu, docs/architecture.md §3.6): the MTP head's
 * weights, its KV (layer n_attn of the paged pool), the hiddens it reads, and per slot what a
 * rollback needs. Allocated at open when tl_cuda_params.spec_tokens > 0. */
typedef struct cb_spec {
    int K;                             /* most draft tokens a step */
    int on;                            /* spec_init was called */
    cb_layer L;                        /* mtp.layers.0 (attention, st_idx = n_attn), MoE */
    float *norm_emb, *norm_hid, *norm; /* [n_embd] (1+w) */
    tl_gpu_gemm_w fc;                  /* [n_embd, 2 n_embd]: embedding columns first */
    /* final-normed hiddens [hid_rows][n_embd]: rows 0 .. max_tok-1 those of the running
     * micro-batch, then ring rows [max_seqs][K+1] (position p of a slot at p % (K+1)), then one
     * chain row per slot (the last draft step's h') */
    float *hid;
    float *cat, *eb; /* [max_tok][2 n_embd], [max_tok][n_embd] */
    float *alog;     /* [max_seqs * (K+1)][n_vocab] verify logits */
    /* rollback (docs/architecture.md §3.6): per-token state copies written by the verify's GDN
     * kernels (gpu.h tl_gpu_ring), conv f32 [n_gdn][max_seqs][K][3][conv_dim] and recurrent
     * [n_gdn][max_seqs][K][nv][128][128] (st_esz), copy j = the state after the verify's token
     * j; d_rpos [max_seqs] the verify's first position per slot (-1: none this step). With
     * TL_CUDA_SPEC_RECOMPUTE=1 instead: gdn, [max_seqs][snap bytes], the GDN state before a
     * verify, restored, and the accepted tokens run again. */
    float *conv_ring;
    char *rec_ring;
    int32_t *d_rpos, *h_rpos;
    int recompute;
    char *gdn;
    /* the head's micro-batch: meta_at layout, then [4][max_tok]: the hiddens' source rows, the
     * ring's destination and source rows, the verify rows to gather */
    int32_t *d_meta, *h_meta;
    cudaEvent_t meta_ev;
    /* sampling laws (tl_gpu_sample_law) of up to max_seqs * (K+1) rows: parameters, then the
     * ints [3 + TL_LAW_ADJ][rows] (logits row, count slot, unused, adjustments), the laws, the
     * kernels' scratch */
    tl_sample_params *d_lp, *h_lp;
    int32_t *d_li, *h_li;
    tl_law *d_law, *h_law; /* h_law: pinned, the chain's laws on their way back */
    float *d_lscr;
    int law_rows;
    /* drafts chained on the device (cuda_spec.cu draft_chain): [K][CHAIN_ARRAYS][max_seqs]
     * metadata, [max_seqs] control rows */
    int32_t *d_chain, *h_chain;
    tl_gpu_chain *d_ctl, *h_ctl;
    int chain_mode;                              /* TL_CUDA_SPEC_CHAIN: 0 off, 1, 2 graphs */
    cudaGraphExec_t chain_g[TL_MAX_SPEC + 1][2]; /* one entry, [k][few law parts] (mode 2) */
    /* per slot (host) */
    int *len;         /* tokens the slot holds */
    int *ok;          /* the head's rows cover the slot (0 after a load without a hidden) */
    int *snap_ok;     /* [pc_n_snap]: the snapshot's hidden of its last position was written */
    int *vpos, *vn;   /* the last verify: positions vpos .. vpos+vn-1; vn 0: none */
    int32_t *vtok;    /* [max_seqs][K+1] its tokens */
    int32_t *vprompt; /* its n_prompt */
    int *arow;        /* [max_seqs][K+1]: the alog row of entry i's token k */
    int n_alog;       /* alog rows used in this step */
    int tc_ok;        /* be->yb holds [max_tok][2 n_embd] bf16 (fc's GEMM) */
} cb_spec;

typedef struct cuda_be {
    tl_config cfg;
    int max_seqs, max_ctx, max_tok, max_out, part_rows;
    int n_attn, n_gdn, conv_dim, val_dim, ld_gdn_in, ld_attn_in, n_valid;
    int lost;
    int device; /* the CUDA device ordinal (tl_cuda_params.device); cb_bind makes it current */
    cb_layer L[TL_MAX_LAYERS];
    tl_gpu_gemm_w embd, lm_head;
    float *out_norm;
    cb_spec *sp;     /* NULL: no speculative decoding */
    int n_kv_layers; /* KV layers in the pool: n_attn, + 1 for the MTP head */

    /* sequence state */
    uint16_t *kc, *vc;        /* [n_attn][n_page][TL_KV_PAGE][n_kv][256] bf16 (gpu.h: paged) */
    int n_page, max_pages;    /* pool pages; pages of one slot at most (max_ctx / TL_KV_PAGE, up) */
    int32_t *d_ptab, *h_ptab; /* [max_seqs][max_pages] page ids: device, pinned host mirror */
    tl_kv_pages pages;        /* which slot holds which page (table = h_ptab) */
    float *conv_st;           /* [n_gdn][max_seqs][3][conv_dim] */
    char *rec_st;             /* [n_gdn][max_seqs][nv][128][128] of st_esz bytes (f32 or bf16) */
    int st_bf16;              /* recurrent state in bf16 (--state-dtype bf16) */
    size_t st_esz;            /* bytes per recurrent-state element: 4, or 2 with st_bf16 */

    /* prefix cache storage (cuda_prefix.cu, docs/architecture.md §4.1); pc_n_snap 0: none */
    char *pc_snap; /* [pc_n_snap]: [n_gdn][nv*128*128] recurrent (st_esz each), [n_gdn][3*conv_dim]
                      f32 */
    int pc_n_snap; /* its KV pages are pool pages (kc, vc) */
    long long pc_bytes;
    int32_t *d_pc_meta, *h_pc_meta; /* page pairs [3*max_pages], then restored tokens,
                                       positions, slots [3*max_ctx]; pinned mirror */
    size_t pc_meta_ints;

    /* activations for max_tok tokens */
    float *x, *proj, *conv_out, *y, *q, *part, *rlog, *wts, *wsh, *act, *xo, *logits;
    int32_t *ids;

    /* prefill path (production shapes only: the prefill kernels of gpu.h are built for
     * them): bf16 activations for the tensor-core GEMMs, GDN gates, MoE plan and slots */
    int pf_ok;
    uint16_t *xb, *xlo, *yb, *hexp, *yslot, *hs, *ys; /* xlo: low plane of xb (router) */
    float *gg, *gbeta, *shl;
    int32_t *plan;
    void *gdn_ws;
    float *cv_edge; /* tl_gpu_gemm_conv1d's scratch (NULL without GDN layers) */

    /* batch metadata: device and pinned host copies of the same layout */
    int32_t *d_meta, *h_meta;
    size_t meta_ints;
    cudaEvent_t
        meta_ev; /* recorded after each metadata upload: h_meta may be rewritten once it fired */

    /* sampling */
    tl_sample_params *d_params, *h_params;
    uint64_t *d_keys, *h_keys;
    tl_sample_out *d_out, *h_out;
    int32_t *d_counts; /* [max_seqs][n_vocab] penalty counts per slot (gpu.h) */
    uint32_t *d_cbits; /* [max_seqs][TL_GPU_COUNT_WORDS(n_vocab)]: where they may be set */
    int32_t *d_nprompt, *h_nprompt; /* [max_seqs] the slots' prompt lengths (-1: not yet known) */
    int32_t *d_rowslot, *h_rowslot; /* [max_out] the slot of each logits row */
    float *d_sscratch;
    /* token restrictions per output row (tulip.h; staged only for the rows that use them):
     * bias pairs [max_out][TL_MAX_LOGIT_BIAS], allow bitsets [max_out][allow_words], and the
     * restricted logits [max_out][n_vocab] the sampler draws those rows from */
    int32_t *d_bias_ids, *h_bias_ids;
    float *d_bias_vals, *h_bias_vals;
    uint32_t *d_allow, *h_allow;
    size_t allow_words;
    float *d_rlogits;

    cudaStream_t stream;
    cudaGraphExec_t graph[CB_MAX_GRAPH_B + 1];
    int graphs_off; /* TL_CUDA_NO_GRAPH=1 or TL_CUDA_SYNC=1 */
    int tc_pdl;     /* the batched tensor-core path's stream pdl (gpu.h; TL_CUDA_TC_PDL, 2) */
    int pf_pdl;     /* a prefill chunk's layers' stream pdl (TL_CUDA_PF_PDL, default 1) */
    int gdn_cols;   /* decode kernels: GDN step as gdn_cols + the gated norm (TL_GDN_COLS=1) */
    int mix;        /* long chunks share micro-batches with the short entries (batch_plan.h
                       tl_mb_begin_mixed): the tensor-core path on, tc_min <= CB_PF_MIN, and not
                       TL_CUDA_NO_MIX=1 */
    int tc_min;     /* micro-batches of at least this many tokens (not one long chunk) run on the
                       tensor-core decode path (TL_CUDA_TC_MIN; 0: never) */
    int sh_max;     /* micro-batches of at most this many tokens run the shared expert inside the
                       grouped MoE GEMMs, longer ones as two dense GEMMs (TL_MOE_SHARED_GROUPED;
                       default: every one, be->max_tok) */
    int router_min; /* micro-batches of at least this many tokens on the GEMM paths compute the
                       router with the tensor-core GEMM, else the GEMV (TL_CUDA_ROUTER_GEMM_MIN;
                       0: never) */
    int pdl_off;    /* TL_CUDA_NO_PDL=1: decode kernels launched without programmatic
                       dependence */
    tl_gpu_attn_opts attn; /* TL_CUDA_ATTN_NO_TC, TL_CUDA_ATTN_MIN_CHUNK */
    tl_gpu_prof *prof;     /* non-NULL while the per-kernel profiler is on (cuda_bench.cu) */
    float *gemm_ws;        /* split-K partials of the dense GEMMs (k_gemm.cu), for the stream */
    size_t gemm_ws_bytes;
} cuda_be;

/* The launch context of the backend's stream: decode kernels with PDL (pdl 1 or 2: gpu.h's
 * tl_gpu_stream; unless TL_CUDA_NO_PDL=1), everything else without; the profiler attached when it
 * is on. */
static inline tl_gpu_stream cb_stream(const cuda_be *be, int pdl) {
    tl_gpu_stream s = {(void *)be->stream, be->pdl_off ? 0 : pdl, be->prof, be->gemm_ws,
                       be->gemm_ws_bytes};
    return s;
}

/* cuda_forward.cu */
int cb_forward(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen);
/* After a failed call: 1 if the CUDA context is broken by a sticky error (the backend is then
 * lost), 0 if the error was not sticky and the device still works. */
int cb_device_broken(cuda_be *be);
int cb_bind(const cuda_be *be); /* makes be->device the calling thread's current device */
/* The device views of the step metadata (tl_gpu_seqs over d_meta). */
tl_gpu_seqs cb_seqs(const cuda_be *be, int n_tok, int n_seg);
/* cuda_prefix.cu: the prefix cache's storage (before the KV pool), its metadata (after), the
 * backend ops on b, and freeing. */
int cb_pc_alloc_storage(cuda_be *be, const tl_cuda_params *p, char *err, size_t errlen);
int cb_pc_alloc_meta(cuda_be *be, char *err, size_t errlen);
void cb_pc_attach(cuda_be *be, tl_backend *b);
void cb_pc_free(cuda_be *be);
size_t cb_pc_page_bytes(const cuda_be *be);
size_t cb_pc_snap_bytes(const cuda_be *be);
/* The slot's GDN conv and recurrent state <-> buf (cb_pc_snap_bytes: [n_gdn][recurrent], then
 * [n_gdn][conv]), device to device on the backend's stream; to_buf picks the direction. */
int cb_state_copy(cuda_be *be, int slot, char *buf, int to_buf);
/* cuda_spec.cu: speculative decoding (docs/architecture.md §3.6). cb_spec_alloc at open (after
 * the activations, before the KV pool), cb_spec_free at close, cb_spec_attach sets b's ops. */
int cb_spec_alloc(cuda_be *be, char *err, size_t errlen);
void cb_spec_free(cuda_be *be);
void cb_spec_attach(cuda_be *be, tl_backend *b);
/* In a forward: before the micro-batches (verify snapshots, penalty counts rebuilt), after each
 * micro-batch (all-logits rows, the head's rows, the hiddens kept), after the step's final
 * synchronize (verify logits to the host) and when the page reservation failed. */
int cb_spec_begin(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen);
int cb_spec_micro(cuda_be *be, const tl_fwd_entry *e, const void *segs, int n_seg, int tc);
int cb_spec_end(cuda_be *be, const tl_fwd_entry *e, int n);
void cb_spec_unreserve(cuda_be *be, const tl_fwd_entry *e, int n);
/* A slot reset (n_tok 0) or loaded from the prefix cache (n_tok tokens, no head rows). */
void cb_spec_slot(cuda_be *be, int slot, int n_tok);
/* Prefix cache and the head (docs/architecture.md §3.6): a snapshot's hidden of its last
 * position, saved from the slot's ring (after a step) or restored into it (a load: the slot
 * then drafts); the micro-batch's rows of in-step snapshot points. */
int cb_spec_snap_save(cuda_be *be, int slot, int snap, int n_tok);
int cb_spec_snap_load(cuda_be *be, int slot, int snap, int n_tok);
int cb_spec_snap_rows(cuda_be *be, const tl_fwd_entry *e, const void *segs, int n_seg);
size_t cb_pc_hid_off(const cuda_be *be);
/* Pages for slot[i] up to len[i] positions (all or nothing) and their page-table entries
 * uploaded (cuda_forward.cu). */
int cb_kv_grow(cuda_be *be, const int *slot, const int *len, int n, char *err, size_t errlen);
/* The views of a metadata block in the layout of the step's (d_meta / h_meta). */
tl_mb_meta cb_meta_at(const cuda_be *be, int32_t *base);
/* The whole forward (the rollback's recompute calls it). */
int cb_forward_impl(cuda_be *be, const tl_fwd_entry *e, int n, char *err, size_t errlen);
/* The MTP head's block over T rows (metadata: device views dm, hiddens sp->hid[src_rows]); full
 * 0: K and V only; and the final norm + LM head over n rows (cuda_forward.cu). */
int cb_mtp_block(cuda_be *be, const tl_mb_meta *dm, int T, int n_seg, int full, int tc, int n_split,
                 const int32_t *src_rows);
int cb_lm_head(cuda_be *be, float *logits, float *xo, const float *x, const float *norm_w, int n,
               int tc);
/* cuda_weights.cu: the model's weights onto the device (from m, or random from p's seed). */
int cb_weights_load(cuda_be *be, const tl_model *m, const tl_cuda_params *p, char *err,
                    size_t errlen);
void cb_weights_free(cuda_be *be);
/* cuda_bench.cu: device bytes of the uploaded weights. */
size_t cb_weight_bytes(const cuda_be *be);
/* 4 when every part is MLX affine 4-bit, group 64, rows a multiple of 8; else 16. */
int cb_parts_bits(const tl_mat *const *parts, int n_parts);

#endif
