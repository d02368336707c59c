/* tulip bench: the benchmark protocol of docs/developing.md §6 on the CUDA backend. Batch 1; for
 * each prompt length: prefill tok/s (prompt tokens / time to the first sampled token) and decode
 * tok/s (128 greedy tokens at that context, EOS ignored); the median of 3 repeats; the means over
 * the lengths; achieved GB/s and % of the measured HBM bandwidth for decode (bytes a step must
 * move, from the uploaded weights: tl_cuda_decode_bytes), and TFLOP/s for prefill. --random-weights
 * builds the full-size model on the GPU from a seed, so it runs where no checkpoint exists.
 * The phases: parse options -> open (model, backend, HBM bandwidth) -> random prompt -> each
 * length (repeats of prefill + decode, medians) -> report (table or JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "model/shape.h"
#include "model/weights.h"

#define BENCH_MAX_LEN     16
#define BENCH_MAX_REPEATS 16
#define BENCH_MAX_CTX     (1 << 28) /* a length or --gen beyond this is a typo */

typedef struct bench_opts {
    int random, bits, gen, repeats, json, prof, allow_test, ops;
    uint64_t seed;
    const char *model_dir, *lengths_arg;
    int lengths[BENCH_MAX_LEN], n_len, max_len;
} bench_opts;

static const tl_opt_choice bench_bits[] = {{"4", 4}, {"16", 16}, {NULL, 0}};

/* --lengths 256,512,4K -> o->lengths (a K suffix multiplies by 1024). 0 or a usage error (2). */
static int bench_parse_lengths(const tl_cli_cmd *cmd, bench_opts *o) {
    char *dup = xstrdup(o->lengths_arg), *save = NULL;
    int bad = 0;
    o->n_len = 0;
    for (char *t = strtok_r(dup, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long x = strtol(t, &end, 10);
        if (end != t && (*end == 'K' || *end == 'k')) x *= 1024, end++;
        bad = end == t || *end || x < 1 || x > BENCH_MAX_CTX || o->n_len == BENCH_MAX_LEN;
        if (!bad) o->lengths[o->n_len++] = (int)x;
    }
    free(dup);
    if (bad || !o->n_len)
        return tl_cli_usage_error(cmd,
                                  "bad value '%s' for --lengths: expected 1 to %d lengths "
                                  "separated by commas, each 1..%d or with a K suffix (4K)",
                                  o->lengths_arg, BENCH_MAX_LEN, BENCH_MAX_CTX);
    o->max_len = 0;
    for (int i = 0; i < o->n_len; i++) o->max_len = TL_MAX(o->max_len, o->lengths[i]);
    return 0;
}

/* Options -> o. Returns TL_CLI_CONTINUE or the exit status. */
static int bench_parse(bench_opts *o, int argc, char **argv) {
    tl_opt opts[] = {
        TL_OPT_FLAG("random-weights", 0, &o->random,
                    "no checkpoint: the full-size model built on the GPU from --seed"),
        TL_OPT_CHOICE("bits", 0, &o->bits, "4|16", bench_bits,
                      "random weights: 4-bit (default) or bf16"),
        TL_OPT_U64("seed", 0, &o->seed, "N", "random weights and prompt seed (default 1)"),
        TL_CLI_OPT_MODEL(&o->model_dir, 0),
        TL_OPT_STR("lengths", 0, &o->lengths_arg, "L,L,...",
                   "prompt lengths, K = 1024 (default 256,512,...,131072: 10 powers of 2)"),
        TL_OPT_INT("gen", 0, &o->gen, "N", 1, BENCH_MAX_CTX,
                   "decode tokens timed at each length (default 128)"),
        TL_OPT_INT("repeats", 0, &o->repeats, "N", 1, BENCH_MAX_REPEATS,
                   "runs per length; the median counts (default 3)"),
        TL_OPT_FLAG("json", 0, &o->json, "one JSON object instead of the markdown table"),
        TL_OPT_FLAG("prof", 0, &o->prof, "per-kernel table of one decode step at the first length"),
        TL_OPT_FLAG("ops", 0, &o->ops,
                    "time each decode op in place (back-to-back graph) at the first length"),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&o->allow_test),
    };
    tl_cli_cmd cmd = {.name = "bench",
                      .id = TL_CMD_BENCH,
                      .synopsis =
                          "--random-weights [--bits 4|16] [--seed N] | --model DIR [options]",
                      .about = "Batch-1 prefill and decode speed on the CUDA backend, per prompt "
                               "length.\n",
                      .opts = opts,
                      .n_opts = TL_CLI_NOPTS(opts)};
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!o->random && !o->model_dir)
        return tl_cli_usage_error(&cmd, "--random-weights or --model DIR is required");
    if (bench_parse_lengths(&cmd, o)) return 2;
    return TL_CLI_CONTINUE;
}

static void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4, o->gen = 128, o->repeats = 3, o->seed = 1;
    o->lengths_arg = "256,512,1024,2048,4096,8192,16384,32768,65536,131072";
}

#ifdef TL_NO_CUDA
int cmd_bench(int argc, char **argv) {
    bench_opts o;
    bench_opts_default(&o);
    int rc = bench_parse(&o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    fprintf(stderr, "tulip bench: this build has no CUDA backend (make cuda)\n");
    return 2;
}
#else
#include "cuda/gpu.h"

typedef struct bench_state {
    bench_opts o;
    tl_model *m;
    tl_config cfg;
    tl_backend *b;
    double hbm; /* measured HBM copy bandwidth, bytes/s */
    int32_t *prompt;
    tl_sample_params sp;
    double pre_tps[BENCH_MAX_LEN], gen_tps[BENCH_MAX_LEN], gbps[BENCH_MAX_LEN],
        tflops[BENCH_MAX_LEN];
} bench_state;

/* FLOPs of a prefill of L tokens (matmuls over active weights + causal attention). */
static double prefill_flops(const tl_config *c, int L) {
    double D = c->n_embd, per_tok = 0;
    for (int il = 0; il < c->n_layer; il++) {
        if (c->layer_kind[il] == TL_LAYER_ATTN)
            per_tok += D * (c->n_head * 512.0 + 2 * c->n_head_kv * 256.0) + D * c->n_head * 256.0;
        else
            per_tok +=
                D * (tl_config_gdn_conv_dim(c) + tl_config_gdn_val_dim(c) + 2.0 * c->gdn_n_v_head) +
                D * tl_config_gdn_val_dim(c);
        per_tok += D * (c->n_expert + 1) + (c->n_expert_used + 1) * 3.0 * D * c->n_ff_expert;
    }
    double n_attn = 0;
    for (int il = 0; il < c->n_layer; il++) n_attn += c->layer_kind[il] == TL_LAYER_ATTN;
    double attn = n_attn * 4.0 * c->n_head * 256.0 * ((double)L * (L + 1) / 2); /* QK and PV */
    return 2.0 * per_tok * L + attn + 2.0 * D * c->n_vocab;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t bench_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The model (--model) or the production shape (--random-weights), the CUDA backend, the HBM
 * bandwidth. Returns 0 or the exit status. */
static int bench_open(bench_state *bs) {
    const char *model_dir = bs->o.model_dir;
    int random = bs->o.random, bits = bs->o.bits, gen = bs->o.gen, max_len = bs->o.max_len;
    uint64_t seed = bs->o.seed;
    char err[512] = "";
    tl_model *m = NULL;
    tl_config cfg;
    tl_config_set_production(&cfg);
    if (model_dir) {
        if (tl_model_open(&m, model_dir, err, sizeof err)) {
            fprintf(stderr, "tulip bench: %s\n", err);
            return 1;
        }
        bs->m = m;
        cfg = m->cfg;
        if (!bs->o.allow_test && tl_config_check_production(&cfg, err, sizeof err)) {
            fprintf(stderr, "tulip bench: %s (--allow-test-shape to accept)\n", err);
            return 1;
        }
    }
    bs->cfg = cfg;
    tl_cuda_params p = {.max_seqs = 1,
                        .max_ctx = max_len + gen + 1,
                        .random_weights = random,
                        .seed = seed,
                        .weight_bits = bits};
    tl_backend *b = NULL;
    double t_open = tl_time_s();
    if (tl_backend_cuda_open(&b, m, &cfg, &p, err, sizeof err)) {
        fprintf(stderr, "tulip bench: %s\n", err);
        return 1;
    }
    bs->b = b;
    t_open = tl_time_s() - t_open;
    double hbm = tl_gpu_measure_bw((size_t)2 << 30);
    fprintf(stderr,
            "tulip bench: %s weights %.2f GB (%s), ready in %.1f s; measured HBM copy %.0f GB/s\n",
            random ? "random" : "checkpoint", tl_cuda_weight_bytes(b) / 1e9,
            bits == 4 ? "4-bit" : "bf16", t_open, hbm / 1e9);
    bs->hbm = hbm;
    return 0;
}

/* A random prompt of the longest length (every length uses its first tokens), greedy sampling. */
static void bench_prompt(bench_state *bs) {
    int max_len = bs->o.max_len;
    bs->prompt = xmalloc(sizeof(int32_t) * (size_t)max_len);
    uint64_t rs = bs->o.seed ^ 0xabcdef;
    int n_tok_valid = TL_MIN(bs->cfg.n_vocab, TL_N_VOCAB_TOKENS);
    for (int i = 0; i < max_len; i++)
        bs->prompt[i] = (int32_t)(bench_rng(&rs) % (uint64_t)n_tok_valid);
    memset(&bs->sp, 0, sizeof bs->sp);
    bs->sp.top_p = 1.0f, bs->sp.repetition_penalty = 1.0f;
}

/* --ops and --prof: the tables of one decode step at context ctx, printed right after it. */
static int bench_step_tables(tl_backend *b, int ctx, int ops, int prof) {
    if (ops) {
        printf("\nper-op time of one decode token at context %d (each op %s):\n\n", ctx,
               "captured 40 times back to back in a graph, best of 5 replays");
        if (tl_cuda_bench_ops(b, stdout)) {
            fprintf(stderr, "tulip bench: --ops failed\n");
            return 1;
        }
        printf("\n");
    }
    if (prof) {
        printf("\nper-kernel time of one eager decode step at context %d (graph off "
               "while profiling):\n\n",
               ctx);
        tl_cuda_prof_report(b, stdout);
        printf("\n");
    }
    return 0;
}

/* Repeat r at the li-th length: the prefill, then --gen decode steps; their tok/s in *pre, *dec.
 * Returns 0 or 1 (after printing the error). */
static int bench_repeat(bench_state *bs, int li, int r, double *pre, double *dec) {
    tl_backend *b = bs->b;
    int L = bs->o.lengths[li], gen = bs->o.gen, prof = bs->o.prof, ops = bs->o.ops;
    char err[512] = "";
    int st = b->reset_slot(b, 0);
    if (st) {
        fprintf(stderr, "tulip bench: resetting the sequence failed: %s\n", tl_status_str(st));
        return 1;
    }
    uint64_t rng = bs->o.seed;
    tl_sample_out so;
    tl_fwd_entry e;
    memset(&e, 0, sizeof e);
    e.slot = 0, e.pos = 0, e.tokens = bs->prompt, e.n_tok = L, e.sample = &bs->sp, e.rng = &rng,
    e.out = &so;
    double t0 = tl_time_s();
    if (b->forward(b, &e, 1, err, sizeof err)) {
        fprintf(stderr, "tulip bench: prefill %d: %s\n", L, err);
        return 1;
    }
    double t1 = tl_time_s();
    int32_t tok = so.token;
    for (int s = 0; s < gen; s++) {
        if (prof && li == 0 && r == 0 && s == 2) tl_cuda_prof_enable(b, 1);
        e.pos = L + s, e.tokens = &tok, e.n_tok = 1;
        if (b->forward(b, &e, 1, err, sizeof err)) {
            fprintf(stderr, "tulip bench: decode at %d: %s\n", L + s, err);
            return 1;
        }
        if (li == 0 && r == 0 && s == 2 && bench_step_tables(b, L + s, ops, prof)) return 1;
        tok = so.token;
    }
    double t2 = tl_time_s();
    *pre = L / (t1 - t0);
    *dec = gen / (t2 - t1);
    return 0;
}

/* The li-th length: the medians over the repeats, GB/s of decode, TFLOP/s of prefill. */
static int bench_length(bench_state *bs, int li) {
    tl_backend *b = bs->b;
    int L = bs->o.lengths[li], gen = bs->o.gen, reps = bs->o.repeats;
    double pr[BENCH_MAX_REPEATS], gr[BENCH_MAX_REPEATS];
    for (int r = 0; r < reps; r++)
        if (bench_repeat(bs, li, r, &pr[r], &gr[r])) return 1;
    bs->pre_tps[li] = median(pr, reps);
    bs->gen_tps[li] = median(gr, reps);
    bs->gbps[li] = tl_cuda_decode_bytes(b, L + gen / 2) * bs->gen_tps[li];
    bs->tflops[li] = prefill_flops(&bs->cfg, L) / (L / bs->pre_tps[li]) / 1e12;
    fprintf(stderr, "tulip bench: %6d: prefill %9.1f tok/s, decode %7.1f tok/s\n", L,
            bs->pre_tps[li], bs->gen_tps[li]);
    return 0;
}

static void bench_report_json(const bench_state *bs, double mp, double mg) {
    const bench_opts *o = &bs->o;
    tl_backend *b = bs->b;
    double hbm = bs->hbm;
    printf("{\"gpu_hbm_gbps\": %.1f, \"bits\": %d, \"weights_gb\": %.3f, \"gen\": %d, "
           "\"repeats\": %d, \"rows\": [",
           hbm / 1e9, o->bits, tl_cuda_weight_bytes(b) / 1e9, o->gen, o->repeats);
    for (int i = 0; i < o->n_len; i++)
        printf("%s{\"ctx\": %d, \"prefill_tps\": %.1f, \"prefill_tflops\": %.2f, "
               "\"gen_tps\": %.1f, \"gen_gbps\": %.1f, \"gen_pct_peak\": %.1f}",
               i ? ", " : "", o->lengths[i], bs->pre_tps[i], bs->tflops[i], bs->gen_tps[i],
               bs->gbps[i] / 1e9, 100.0 * bs->gbps[i] / hbm);
    printf("], \"mean_prefill_tps\": %.1f, \"mean_gen_tps\": %.1f}\n", mp, mg);
}

static void bench_report_table(const bench_state *bs, double mp, double mg) {
    double hbm = bs->hbm;
    printf("| ctx | prefill tok/s | prefill TFLOP/s | decode tok/s | decode GB/s | %% of "
           "HBM (%.0f GB/s) |\n",
           hbm / 1e9);
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < bs->o.n_len; i++)
        printf("| %d | %.1f | %.1f | %.1f | %.0f | %.1f%% |\n", bs->o.lengths[i], bs->pre_tps[i],
               bs->tflops[i], bs->gen_tps[i], bs->gbps[i] / 1e9, 100.0 * bs->gbps[i] / hbm);
    printf("| mean | %.1f | | %.1f | | |\n", mp, mg);
}

/* The means over the lengths, and the table or the JSON on stdout. */
static void bench_report(const bench_state *bs) {
    int n_len = bs->o.n_len;
    double mp = 0, mg = 0;
    for (int i = 0; i < n_len; i++) mp += bs->pre_tps[i], mg += bs->gen_tps[i];
    mp /= n_len, mg /= n_len;
    if (bs->o.json)
        bench_report_json(bs, mp, mg);
    else
        bench_report_table(bs, mp, mg);
}

int cmd_bench(int argc, char **argv) {
    bench_state bs = {0};
    bench_opts_default(&bs.o);
    int rc = bench_parse(&bs.o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    rc = bench_open(&bs);
    if (!rc) {
        bench_prompt(&bs);
        for (int li = 0; li < bs.o.n_len && !rc; li++) rc = bench_length(&bs, li);
        if (!rc) bench_report(&bs);
    }
    free(bs.prompt);
    if (bs.b) bs.b->close(bs.b);
    if (bs.m) tl_model_close(bs.m);
    return rc;
}
#endif
