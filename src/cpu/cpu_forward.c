/* CPU reference: the whole model (docs/model.md §2.0), layer by layer over a chunk of n tokens.
 * Projections run as matmuls over the chunk; the recurrences (conv, delta rule) and attention
 * run token by token in order, so a prefill of n tokens computes exactly what n single-token
 * steps compute. Owns nothing but the per-sequence state it is handed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/pool.h"
#include "common/status.h"
#include "common/util.h"
#include "cpu/cpu.h"

int cpu_state_init(cpu_state *st, const tl_config *c, int max_ctx) {
    memset(st, 0, sizeof *st);
    st->max_ctx = max_ctx;
    for (int il = 0; il < c->n_layer; il++) {
        if (c->layer_kind[il] == TL_LAYER_ATTN) {
            size_t n = (size_t)max_ctx * c->n_head_kv * c->head_dim;
            st->kv_k[il] = calloc(n, sizeof(float));
            st->kv_v[il] = calloc(n, sizeof(float));
            if (!st->kv_k[il] || !st->kv_v[il]) goto oom;
        } else {
            st->conv[il] =
                calloc((size_t)(c->gdn_conv_k - 1) * tl_config_gdn_conv_dim(c), sizeof(float));
            st->rec[il] =
                calloc((size_t)c->gdn_n_v_head * c->gdn_k_dim * c->gdn_v_dim, sizeof(float));
            if (!st->conv[il] || !st->rec[il]) goto oom;
        }
    }
    return TL_OK;
oom:
    cpu_state_free(st);
    return TL_ERR_NOMEM;
}

void cpu_state_free(cpu_state *st) {
    for (int il = 0; il < TL_MAX_LAYERS; il++) {
        free(st->kv_k[il]);
        free(st->kv_v[il]);
        free(st->conv[il]);
        free(st->rec[il]);
    }
    memset(st, 0, sizeof *st);
}

void cpu_state_reset(cpu_state *st, const tl_config *c) {
    st->n_past = 0;
    for (int il = 0; il < c->n_layer; il++) {
        if (st->conv[il])
            memset(st->conv[il], 0,
                   sizeof(float) * (size_t)(c->gdn_conv_k - 1) * tl_config_gdn_conv_dim(c));
        if (st->rec[il])
            memset(st->rec[il], 0,
                   sizeof(float) * (size_t)c->gdn_n_v_head * c->gdn_k_dim * c->gdn_v_dim);
    }
}

/* Gated DeltaNet mixer over n tokens: u [n, D] -> out [n, D]. */
static void gdn_mixer(const tl_config *c, const tl_layer *L, cpu_state *st, int il, const float *u,
                      float *out, int n) {
    int Hk = c->gdn_n_k_head, Hv = c->gdn_n_v_head, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    int key_dim = Hk * Dk, val_dim = Hv * Dv, conv_dim = 2 * key_dim + val_dim;
    float *qkv = xmalloc(sizeof(float) * (size_t)n * conv_dim);
    float *z = xmalloc(sizeof(float) * (size_t)n * val_dim);
    float *bb = xmalloc(sizeof(float) * (size_t)n * Hv);
    float *aa = xmalloc(sizeof(float) * (size_t)n * Hv);
    float *y = xmalloc(sizeof(float) * (size_t)n * val_dim);
    float *cv = xmalloc(sizeof(float) * conv_dim);
    float *g = xmalloc(sizeof(float) * Hv), *beta = xmalloc(sizeof(float) * Hv);
    cpu_matmul(qkv, &L->gdn_qkv, u, n);
    cpu_matmul(z, &L->gdn_z, u, n);
    cpu_matmul(bb, &L->gdn_b, u, n);
    cpu_matmul(aa, &L->gdn_a, u, n);
    float qscale = 1.0f / sqrtf((float)Dk);
    for (int t = 0; t < n; t++) {
        cpu_conv1d_step(cv, st->conv[il], qkv + (size_t)t * conv_dim, L->gdn_conv, conv_dim,
                        c->gdn_conv_k);
        float *q = cv, *k = cv + key_dim, *v = cv + 2 * key_dim;
        for (int h = 0; h < Hk; h++) {
            cpu_l2norm(q + h * Dk, Dk, 1e-6f);
            cpu_l2norm(k + h * Dk, Dk, 1e-6f);
            for (int d = 0; d < Dk; d++) q[h * Dk + d] *= qscale;
        }
        for (int h = 0; h < Hv; h++) {
            beta[h] = cpu_sigmoid(bb[(size_t)t * Hv + h]);
            g[h] = L->gdn_a_neg[h] * cpu_softplus(aa[(size_t)t * Hv + h] + L->gdn_dt_bias[h]);
        }
        float *o = y + (size_t)t * val_dim;
        cpu_gdn_step(o, st->rec[il], q, k, v, g, beta, Hk, Hv, Dk, Dv);
        for (int h = 0; h < Hv; h++)
            cpu_rmsnorm_gated(o + h * Dv, o + h * Dv, z + (size_t)t * val_dim + h * Dv, L->gdn_norm,
                              Dv, c->rms_eps);
    }
    cpu_matmul(out, &L->gdn_out, y, n);
    free(qkv), free(z), free(bb), free(aa), free(y), free(cv), free(g), free(beta);
}

/* Gated attention mixer over n tokens at positions pos0..: u [n, D] -> out [n, D]; K and V of
 * the new positions are written into the cache kc, vc ([max_ctx, n_head_kv, head_dim]). */
static void attn_mixer(const tl_config *c, const tl_layer *L, float *kc, float *vc, const float *u,
                       float *out, int n, int pos0) {
    int H = c->n_head, Hkv = c->n_head_kv, hd = c->head_dim;
    float *qg = xmalloc(sizeof(float) * (size_t)n * H * hd * 2);
    float *q = xmalloc(sizeof(float) * (size_t)n * H * hd);
    float *k = xmalloc(sizeof(float) * (size_t)n * Hkv * hd);
    float *v = xmalloc(sizeof(float) * (size_t)n * Hkv * hd);
    float *o = xmalloc(sizeof(float) * (size_t)n * H * hd);
    cpu_matmul(qg, &L->attn_q, u, n);
    cpu_matmul(k, &L->attn_k, u, n);
    cpu_matmul(v, &L->attn_v, u, n);
    for (int t = 0; t < n; t++) {
        int pos = pos0 + t;
        for (int h = 0; h < H; h++) {
            float *qh = q + ((size_t)t * H + h) * hd;
            memcpy(qh, qg + ((size_t)t * H + h) * hd * 2, sizeof(float) * hd);
            cpu_rmsnorm(qh, qh, L->attn_q_norm, hd, c->rms_eps);
            cpu_rope_neox(qh, c->n_rot, pos, c->rope_theta);
        }
        for (int h = 0; h < Hkv; h++) {
            float *kh = k + ((size_t)t * Hkv + h) * hd;
            cpu_rmsnorm(kh, kh, L->attn_k_norm, hd, c->rms_eps);
            cpu_rope_neox(kh, c->n_rot, pos, c->rope_theta);
        }
        memcpy(kc + (size_t)pos * Hkv * hd, k + (size_t)t * Hkv * hd, sizeof(float) * Hkv * hd);
        memcpy(vc + (size_t)pos * Hkv * hd, v + (size_t)t * Hkv * hd, sizeof(float) * Hkv * hd);
    }
    cpu_attention(o, q, kc, vc, n, pos0, H, Hkv, hd, 1.0f / sqrtf((float)hd));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const float *gate = qg + ((size_t)t * H + h) * hd * 2 + hd;
            float *oh = o + ((size_t)t * H + h) * hd;
            for (int d = 0; d < hd; d++) oh[d] *= cpu_sigmoid(gate[d]);
        }
    cpu_matmul(out, &L->attn_o, o, n);
    free(qg), free(q), free(k), free(v), free(o);
}

typedef struct {
    const tl_config *c;
    const tl_layer *L;
    const float *u;
    const float *router;
    float *out;
    float *gap; /* [n] per token: see cpu_state.route_gap */
} moe_job;

static void moe_token(void *ctx, int t) {
    moe_job *j = ctx;
    const tl_config *c = j->c;
    const tl_layer *L = j->L;
    int D = c->n_embd, K = c->n_expert_used;
    int ff = TL_MAX(c->n_ff_expert, c->n_ff_shared);
    const float *u = j->u + (size_t)t * D;
    float *out = j->out + (size_t)t * D;
    int ids[TL_N_EXPERT];
    float w[TL_N_EXPERT];
    float *tmp = xmalloc(sizeof(float) * 2 * ff), *y = xmalloc(sizeof(float) * D);
    double *acc = xcalloc(D, sizeof(double));
    const float *lg = j->router + (size_t)t * c->n_expert;
    cpu_moe_route(ids, w, lg, c->n_expert, K);
    float in_min = INFINITY, out_max = -INFINITY;
    for (int e = 0; e < c->n_expert; e++) {
        int chosen = 0;
        for (int i = 0; i < K; i++) chosen |= ids[i] == e;
        if (chosen)
            in_min = fminf(in_min, lg[e]);
        else
            out_max = fmaxf(out_max, lg[e]);
    }
    j->gap[t] = in_min - out_max;
    for (int i = 0; i < K; i++) {
        int e = ids[i];
        cpu_ffn_swiglu(y, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], u, tmp);
        for (int d = 0; d < D; d++) acc[d] += (double)w[i] * y[d];
    }
    cpu_ffn_swiglu(y, &L->sh_gate, &L->sh_up, &L->sh_down, u, tmp);
    float sg;
    cpu_matvec(&sg, &L->sh_gate_inp, u);
    sg = cpu_sigmoid(sg);
    for (int d = 0; d < D; d++) out[d] = (float)acc[d] + sg * y[d];
    free(tmp), free(y), free(acc);
}

/* MoE over n tokens: u [n, D] -> out [n, D]; tokens in parallel. */
static void moe_block(const tl_config *c, const tl_layer *L, const float *u, float *out, int n,
                      float *gap) {
    float *router = xmalloc(sizeof(float) * (size_t)n * c->n_expert);
    float *g = xmalloc(sizeof(float) * (size_t)n);
    cpu_matmul(router, &L->moe_router, u, n);
    moe_job j = {c, L, u, router, out, g};
    tl_pool_for(n, moe_token, &j);
    for (int t = 0; t < n; t++) *gap = fminf(*gap, g[t]);
    free(router), free(g);
}

/* One pre-norm decoder block over x [n, D] in place: mixer (attention into kc/vc, or GDN on
 * st's layer il), then the MoE; u, o are [n, D] scratch. */
static void decoder_block(const tl_config *c, const tl_layer *L, cpu_state *st, int il, float *kc,
                          float *vc, float *x, float *u, float *o, int n, int pos0, float *gap) {
    int D = c->n_embd;
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(u + (size_t)t * D, x + (size_t)t * D, L->attn_norm, D, c->rms_eps);
    if (L->kind == TL_LAYER_GDN)
        gdn_mixer(c, L, st, il, u, o, n);
    else
        attn_mixer(c, L, kc, vc, u, o, n, pos0);
    for (size_t i = 0; i < (size_t)n * D; i++) x[i] += o[i];
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(u + (size_t)t * D, x + (size_t)t * D, L->ffn_norm, D, c->rms_eps);
    moe_block(c, L, u, o, n, gap);
    for (size_t i = 0; i < (size_t)n * D; i++) x[i] += o[i];
}

int cpu_forward(const tl_model *m, cpu_state *st, const int32_t *tokens, int n, float *logits,
                float *all_logits) {
    return cpu_forward_h(m, st, tokens, n, logits, all_logits, NULL);
}

int cpu_forward_h(const tl_model *m, cpu_state *st, const int32_t *tokens, int n, float *logits,
                  float *all_logits, float *hidden) {
    const tl_config *c = &m->cfg;
    int D = c->n_embd;
    if (n <= 0) return TL_ERR_INVALID;
    if (st->n_past + n > st->max_ctx) return TL_ERR_CONTEXT_FULL;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab) return TL_ERR_INVALID;
    st->route_gap = INFINITY;
    float *x = xmalloc(sizeof(float) * (size_t)n * D);
    float *u = xmalloc(sizeof(float) * (size_t)n * D);
    float *o = xmalloc(sizeof(float) * (size_t)n * D);
    for (int t = 0; t < n; t++) cpu_mat_row(x + (size_t)t * D, &m->tok_embd, tokens[t]);
    for (int il = 0; il < c->n_layer; il++)
        decoder_block(c, &m->layers[il], st, il, st->kv_k[il], st->kv_v[il], x, u, o, n, st->n_past,
                      &st->route_gap);
    st->n_past += n;
    int first = all_logits || hidden ? 0 : n - 1;
    for (int t = first; t < n; t++)
        cpu_rmsnorm(u + (size_t)t * D, x + (size_t)t * D, m->out_norm, D, c->rms_eps);
    if (hidden) memcpy(hidden, u, sizeof(float) * (size_t)n * D);
    if (all_logits) {
        cpu_matmul(all_logits, &m->output, u, n);
        if (logits)
            memcpy(logits, all_logits + (size_t)(n - 1) * c->n_vocab, sizeof(float) * c->n_vocab);
    } else if (logits) {
        cpu_matmul(logits, &m->output, u + (size_t)(n - 1) * D, 1);
    }
    free(x), free(u), free(o);
    return TL_OK;
}

/* ====== The MTP head (docs/model.md §3.2). ====== */

int cpu_mtp_state_init(cpu_mtp_state *s, const tl_config *c, int max_ctx) {
    size_t n = (size_t)max_ctx * c->n_head_kv * c->head_dim;
    s->max_ctx = max_ctx;
    s->k = calloc(n, sizeof(float));
    s->v = calloc(n, sizeof(float));
    if (s->k && s->v) return TL_OK;
    cpu_mtp_state_free(s);
    return TL_ERR_NOMEM;
}

void cpu_mtp_state_free(cpu_mtp_state *s) {
    free(s->k);
    free(s->v);
    memset(s, 0, sizeof *s);
}

int cpu_mtp_forward(const tl_model *m, cpu_mtp_state *s, const int32_t *tokens, const float *hidden,
                    int n, int pos0, float *h_out, float *logits, float *all_logits) {
    const tl_config *c = &m->cfg;
    const tl_mtp *x = &m->mtp;
    int D = c->n_embd;
    if (!m->has_mtp || n <= 0 || pos0 < 0) return TL_ERR_INVALID;
    if (pos0 + n > s->max_ctx) return TL_ERR_CONTEXT_FULL;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab) return TL_ERR_INVALID;
    float *cat = xmalloc(sizeof(float) * (size_t)n * 2 * D);
    float *h = xmalloc(sizeof(float) * (size_t)n * D);
    float *u = xmalloc(sizeof(float) * (size_t)n * D);
    float *o = xmalloc(sizeof(float) * (size_t)n * D);
    /* 1-2: [RMSNorm1p(E[token]) | RMSNorm1p(hidden)], embedding first, then fc */
    for (int t = 0; t < n; t++) {
        float *ct = cat + (size_t)t * 2 * D;
        cpu_mat_row(ct, &m->tok_embd, tokens[t]);
        cpu_rmsnorm(ct, ct, x->norm_emb, D, c->rms_eps);
        cpu_rmsnorm(ct + D, hidden + (size_t)t * D, x->norm_hid, D, c->rms_eps);
    }
    cpu_matmul(h, &x->fc, cat, n);
    /* 3: one gated-attention + MoE block with the head's own KV cache */
    float gap = INFINITY;
    decoder_block(c, &x->layer, NULL, 0, s->k, s->v, h, u, o, n, pos0, &gap);
    /* 4: mtp.norm, the trunk's lm_head */
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(u + (size_t)t * D, h + (size_t)t * D, x->norm, D, c->rms_eps);
    if (h_out) memcpy(h_out, u, sizeof(float) * (size_t)n * D);
    if (all_logits) cpu_matmul(all_logits, &m->output, u, n);
    if (logits) cpu_matmul(logits, &m->output, u + (size_t)(n - 1) * D, 1);
    free(cat), free(h), free(u), free(o);
    return TL_OK;
}
