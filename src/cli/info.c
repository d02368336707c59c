/* tulip info --model DIR [--allow-test-shape]: what a checkpoint contains — format, dimensions,
 * layer kinds, tensor count, bytes by tensor group and by dtype, quantization, and whether the
 * config is the production shape this engine's GPU kernels are built for (naming the first field
 * that differs). Exit status 1 on a load error, or on a non-production shape without
 * --allow-test-shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/util.h"
#include "model/weights.h"
#include "model/weights_priv.h"

enum {
    G_EMBD,
    G_LMHEAD,
    G_ATTN,
    G_GDN,
    G_ROUTER,
    G_EXPERTS,
    G_SHARED,
    G_NORMS,
    G_MTP,
    G_OTHER,
    G_COUNT
};
static const char *group_name[G_COUNT] = {
    "embedding", "lm_head",       "attention", "deltanet", "router",
    "experts",   "shared expert", "norms",     "mtp",      "other",
};

static int classify(const char *n) {
    if (!strncmp(n, "mtp.", 4)) return G_MTP;
    if (strstr(n, "embed_tokens")) return G_EMBD;
    if (strstr(n, "lm_head")) return G_LMHEAD;
    if (strstr(n, ".mlp.experts.") || strstr(n, ".mlp.switch_mlp.")) return G_EXPERTS;
    if (strstr(n, ".mlp.shared_expert")) return G_SHARED;
    if (strstr(n, ".mlp.gate.")) return G_ROUTER;
    if (strstr(n, ".linear_attn.")) return G_GDN;
    if (strstr(n, "norm.weight") || strstr(n, "layernorm")) return G_NORMS;
    if (strstr(n, ".self_attn.")) return G_ATTN;
    return G_OTHER;
}

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) bytes /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

static void count_bits(const tl_mat *m, int *nb) {
    if (m->w) nb[m->bits == 8 ? 2 : m->bits == 4 ? 1 : 0]++;
}

/* format, files, dimensions, layer kinds */
static void info_header(const tl_model *m, const char *dir, double t_load) {
    const tl_config *c = &m->cfg;
    const tl_model_priv *p = m->priv;
    printf("model        %s\n", dir);
    printf("format       %s\n", m->format == TL_CKPT_HF
                                    ? "HF safetensors (zero-centred norms, +1 applied at load)"
                                    : "MLX safetensors (norms stored offset)");
    if (c->quant_bits)
        printf(
            "quantization affine, %d-bit, group %d (per-module overrides honoured from shapes)\n",
            c->quant_bits, c->quant_group);
    printf("files        %d safetensors file%s%s (prefix \"%s\"), opened in %.3f s\n", p->n_files,
           p->n_files == 1 ? "" : "s", p->index_path ? " via model.safetensors.index.json" : "",
           p->prefix, t_load);
    printf("dims         hidden %d, layers %d, vocab %d, max_pos %d, rms_eps %g\n", c->n_embd,
           c->n_layer, c->n_vocab, c->max_pos, (double)c->rms_eps);
    printf("attention    heads %d, kv heads %d, head_dim %d, rotary dims %d, rope_theta %g\n",
           c->n_head, c->n_head_kv, c->head_dim, c->n_rot, (double)c->rope_theta);
    printf(
        "deltanet     k heads %d, v heads %d, k dim %d, v dim %d, conv kernel %d (conv dim %d)\n",
        c->gdn_n_k_head, c->gdn_n_v_head, c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv_k,
        tl_config_gdn_conv_dim(c));
    printf("moe          experts %d, top-%d, expert ff %d, shared ff %d\n", c->n_expert,
           c->n_expert_used, c->n_ff_expert, c->n_ff_shared);
    printf("other        tied embeddings %s, mtp layers %d, eos ids",
           c->tie_embeddings ? "yes" : "no", c->mtp_n_layer);
    for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
    printf("\n");
    printf("mtp          %s\n",
           m->has_mtp ? "head bound (mtp.fc, mtp.layers.0, norms): --speculative-tokens available"
                      : "no MTP head in the checkpoint: speculative decoding off");
    int n_attn = 0;
    for (int i = 0; i < c->n_layer; i++) n_attn += c->layer_kind[i] == TL_LAYER_ATTN;
    printf("layer kinds  %d linear_attention (L), %d full_attention (A): ", c->n_layer - n_attn,
           n_attn);
    for (int i = 0; i < c->n_layer; i++) putchar(c->layer_kind[i] == TL_LAYER_ATTN ? 'A' : 'L');
    printf("\n");
}

/* Bytes by tensor group (into gbytes[G_COUNT]) and by dtype over the directory; the total. */
static double info_bytes(const tl_model *m, double *gbytes) {
    const tl_model_priv *p = m->priv;
    double dbytes[TL_DT_COUNT] = {0}, total = 0;
    int gcount[G_COUNT] = {0}, dcount[TL_DT_COUNT] = {0};
    char b1[32], b2[32];
    for (int i = 0; i < m->n_tensors; i++) {
        const tl_tensor *t = &m->tensors[i];
        int g = classify(t->name);
        gbytes[g] += (double)t->nbytes;
        gcount[g]++;
        dbytes[t->dtype] += (double)t->nbytes;
        dcount[t->dtype]++;
        total += (double)t->nbytes;
    }
    human(b1, sizeof b1, total);
    printf("tensors      %d (%s)", m->n_tensors, b1);
    if (p->n_skipped) {
        human(b2, sizeof b2, (double)p->skipped_bytes);
        printf("; %d vision tensors skipped (%s)", p->n_skipped, b2);
    }
    printf("\nbytes by group:\n");
    for (int g = 0; g < G_COUNT; g++) {
        if (!gcount[g]) continue;
        human(b1, sizeof b1, gbytes[g]);
        printf("  %-14s %6d tensors %12s  %5.1f%%\n", group_name[g], gcount[g], b1,
               total > 0 ? 100.0 * gbytes[g] / total : 0.0);
    }
    printf("dtypes:");
    for (int d = 0; d < TL_DT_COUNT; d++) {
        if (!dcount[d]) continue;
        human(b1, sizeof b1, dbytes[d]);
        printf("  %s x%d (%s)", tl_dtype_name((tl_dtype)d), dcount[d], b1);
    }
    printf("\n");
    return total;
}

/* Weight bits of the bound linears, and the stored norm weights' average. */
static void info_linears(const tl_model *m) {
    const tl_config *c = &m->cfg;
    int nb[3] = {0};
    count_bits(&m->tok_embd, nb);
    count_bits(&m->output, nb);
    for (int il = 0; il < c->n_layer; il++) {
        const tl_layer *L = &m->layers[il];
        const tl_mat *ms[] = {&L->attn_q,  &L->attn_k, &L->attn_v,  &L->attn_o,     &L->gdn_qkv,
                              &L->gdn_z,   &L->gdn_b,  &L->gdn_a,   &L->gdn_out,    &L->moe_router,
                              &L->sh_gate, &L->sh_up,  &L->sh_down, &L->sh_gate_inp};
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) count_bits(ms[k], nb);
        for (int e = 0; e < c->n_expert; e++) {
            count_bits(&L->exp_gate[e], nb);
            count_bits(&L->exp_up[e], nb);
            count_bits(&L->exp_down[e], nb);
        }
    }
    printf("linears      %d float, %d 4-bit, %d 8-bit (experts counted one per expert)\n", nb[0],
           nb[1], nb[2]);
    const tl_model_priv *p = m->priv;
    printf("norm weights stored RMSNorm1p weights average %.4f (%s)\n", p->norm_mean,
           m->format == TL_CKPT_HF ? "HF: zero-centred, expected near 0"
                                   : "MLX: offset, expected near 1");
}

/* Decode reads per token: everything but the unchosen experts, one embedding row, no mtp. */
static void info_decode_reads(const tl_config *c, const double *gbytes, double total) {
    char b1[32];
    double active = total - gbytes[G_EMBD] - gbytes[G_MTP] - gbytes[G_EXPERTS] +
                    gbytes[G_EXPERTS] * c->n_expert_used / c->n_expert +
                    gbytes[G_EMBD] / c->n_vocab;
    human(b1, sizeof b1, active);
    printf("decode reads ~%s of weights per token (top-%d of %d experts, 1 embedding row)\n", b1,
           c->n_expert_used, c->n_expert);
}

/* Whether the shape is production; the exit status (1: not, without --allow-test-shape). */
static int info_shape(const tl_config *c, int allow_test) {
    char err[1024];
    int st = tl_config_check_production(c, err, sizeof err);
    if (!st)
        printf("shape        production (Qwen3.6-35B-A3B): the GPU kernels can run it\n");
    else
        printf("shape        NOT production: %s%s\n", err,
               allow_test ? " (accepted: --allow-test-shape; CPU reference only)"
                          : "\n             (pass --allow-test-shape to accept a test model)");
    return st && !allow_test ? 1 : 0;
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    int allow_test = 0;
    tl_opt opts[] = {
        TL_CLI_OPT_MODEL(&dir, 0),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&allow_test),
    };
    tl_cli_cmd cmd = {.name = "info",
                      .id = TL_CMD_INFO,
                      .synopsis = "--model DIR [--allow-test-shape]",
                      .about = "What a checkpoint contains; exit status 1 if it is not the "
                               "production shape\n(unless --allow-test-shape) or does not load.\n",
                      .opts = opts,
                      .n_opts = TL_CLI_NOPTS(opts)};
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!dir) return tl_cli_usage_error(&cmd, "--model DIR is required");
    char err[1024];
    tl_model *m = NULL;
    double t0 = tl_time_s();
    if (tl_model_open(&m, dir, err, sizeof err)) {
        fprintf(stderr, "tulip info: %s\n", err);
        return 1;
    }
    info_header(m, dir, tl_time_s() - t0);
    double gbytes[G_COUNT] = {0};
    double total = info_bytes(m, gbytes);
    info_linears(m);
    info_decode_reads(&m->cfg, gbytes, total);
    rc = info_shape(&m->cfg, allow_test);
    tl_model_close(m);
    return rc;
}
