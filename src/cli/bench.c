/* tulip bench: the DESIGN.md benchmark protocol on the CUDA backend. Batch 1; for each prompt
 * length: prefill tok/s (prompt tokens / time to the first sampled token) and decode tok/s (128
 * greedy tokens at that context, EOS ignored); the median of 3 repeats; the means over the
 * lengths; achieved GB/s and % of the measured HBM bandwidth for decode (bytes a step must move,
 * from the uploaded weights: tl_cuda_decode_bytes), and TFLOP/s for prefill. --random-weights
 * builds the full-size model on the GPU from a seed, so it runs where no checkpoint exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "model/shape.h"
#include "model/weights.h"

#ifdef TL_NO_CUDA
int cmd_bench(int argc, char **argv) {
    fprintf(stderr, "tulip bench: this build has no CUDA backend (make cuda)\n");
    return 2;
}
#else
#include "cuda/gpu.h"

#define BENCH_MAX_LEN 16

static void usage(void) {
    fprintf(stderr,
            "usage: tulip bench --random-weights [--bits 4|16] [--seed N] | --model DIR\n"
            "       [--lengths 256,512,1024,2048,4096,8192,16384,32768,65536,131072]\n"
            "       [--gen 128] [--repeats 3] [--json] [--prof] [--ops] [--allow-test-shape]\n"
            "  --prof   print a per-kernel table of one decode step at the first length\n"
            "  --ops    time each decode op in place (graph of back-to-back launches) at the first "
            "length\n"
            "env: TL_CUDA_SYNC=1 (sync after every kernel), TL_CUDA_NO_GRAPH=1 (eager decode)\n");
}

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

int cmd_bench(int argc, char **argv) {
    int random = 0, bits = 4, gen = 128, repeats = 3, json = 0, prof = 0, allow_test = 0, ops = 0;
    uint64_t seed = 1;
    const char *model_dir = NULL;
    int lengths[BENCH_MAX_LEN] = {256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
    int n_len = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--random-weights"))
            random = 1;
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--prof"))
            prof = 1;
        else if (!strcmp(a, "--ops"))
            ops = 1;
        else if (!strcmp(a, "--allow-test-shape"))
            allow_test = 1;
        else if (!strcmp(a, "--bits") && v)
            bits = atoi(v), i++;
        else if (!strcmp(a, "--gen") && v)
            gen = atoi(v), i++;
        else if (!strcmp(a, "--repeats") && v)
            repeats = atoi(v), i++;
        else if (!strcmp(a, "--seed") && v)
            seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--model") && v)
            model_dir = v, i++;
        else if (!strcmp(a, "--lengths") && v) {
            n_len = 0;
            char *dup = xstrdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && n_len < BENCH_MAX_LEN;
                 t = strtok_r(NULL, ",", &save)) {
                char *end;
                long x = strtol(t, &end, 10);
                if (*end == 'K' || *end == 'k') x *= 1024;
                lengths[n_len++] = (int)x;
            }
            free(dup);
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "tulip bench: unknown or incomplete option '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (!random && !model_dir) {
        usage();
        return 2;
    }
    if ((bits != 4 && bits != 16) || gen < 1 || repeats < 1 || n_len < 1) {
        fprintf(stderr, "tulip bench: --bits must be 4 or 16, --gen/--repeats >= 1\n");
        return 2;
    }
    int max_len = 0;
    for (int i = 0; i < n_len; i++) {
        if (lengths[i] < 1) {
            fprintf(stderr, "tulip bench: bad length %d\n", lengths[i]);
            return 2;
        }
        max_len = TL_MAX(max_len, lengths[i]);
    }
    char err[512] = "";
    tl_model *m = NULL;
    tl_config cfg;
    tl_config_set_production(&cfg);
    if (model_dir) {
        if (tl_model_open(&m, model_dir, err, sizeof err)) {
            fprintf(stderr, "tulip bench: %s\n", err);
            return 1;
        }
        cfg = m->cfg;
        if (!allow_test && tl_config_check_production(&cfg, err, sizeof err)) {
            fprintf(stderr, "tulip bench: %s (--allow-test-shape to accept)\n", err);
            tl_model_close(m);
            return 1;
        }
    }
    tl_cuda_params p = {.max_seqs = 1,
                        .max_ctx = max_len + gen + 1,
                        .random_weights = random,
                        .seed = seed,
                        .weight_bits = bits};
    tl_backend *b = NULL;
    double t_open = tl_time_s();
    if (tl_backend_cuda_open(&b, m, &cfg, &p, err, sizeof err)) {
        fprintf(stderr, "tulip bench: %s\n", err);
        if (m) tl_model_close(m);
        return 1;
    }
    t_open = tl_time_s() - t_open;
    double hbm = tl_gpu_measure_bw((size_t)2 << 30);
    fprintf(stderr,
            "tulip bench: %s weights %.2f GB (%s), ready in %.1f s; measured HBM copy %.0f GB/s\n",
            random ? "random" : "checkpoint", tl_cuda_weight_bytes(b) / 1e9,
            bits == 4 ? "4-bit" : "bf16", t_open, hbm / 1e9);

    int32_t *prompt = xmalloc(sizeof(int32_t) * (size_t)max_len);
    uint64_t rs = seed ^ 0xabcdef;
    int n_tok_valid = TL_MIN(cfg.n_vocab, TL_N_VOCAB_TOKENS);
    for (int i = 0; i < max_len; i++) prompt[i] = (int32_t)(bench_rng(&rs) % (uint64_t)n_tok_valid);
    tl_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.top_p = 1.0f, sp.repetition_penalty = 1.0f;
    double pre_tps[BENCH_MAX_LEN], gen_tps[BENCH_MAX_LEN], gbps[BENCH_MAX_LEN],
        tflops[BENCH_MAX_LEN];
    int rc = 0;
    for (int li = 0; li < n_len && !rc; li++) {
        int L = lengths[li];
        double pr[16], gr[16];
        int reps = TL_MIN(repeats, 16);
        for (int r = 0; r < reps && !rc; r++) {
            b->reset_slot(b, 0);
            uint64_t rng = seed;
            tl_sample_out so;
            tl_fwd_entry e;
            memset(&e, 0, sizeof e);
            e.slot = 0, e.pos = 0, e.tokens = prompt, e.n_tok = L, e.sample = &sp, e.rng = &rng,
            e.out = &so;
            double t0 = tl_time_s();
            if (b->forward(b, &e, 1, err, sizeof err)) {
                fprintf(stderr, "tulip bench: prefill %d: %s\n", L, err);
                rc = 1;
                break;
            }
            double t1 = tl_time_s();
            int32_t tok = so.token;
            for (int s = 0; s < gen; s++) {
                if (prof && li == 0 && r == 0 && s == 2) tl_cuda_prof_enable(b, 1);
                e.pos = L + s, e.tokens = &tok, e.n_tok = 1;
                if (b->forward(b, &e, 1, err, sizeof err)) {
                    fprintf(stderr, "tulip bench: decode at %d: %s\n", L + s, err);
                    rc = 1;
                    break;
                }
                if (ops && li == 0 && r == 0 && s == 2) {
                    printf("\nper-op time of one decode token at context %d (each op %s):\n\n",
                           L + s, "captured 40 times back to back in a graph, best of 5 replays");
                    if (tl_cuda_bench_ops(b, stdout)) {
                        fprintf(stderr, "tulip bench: --ops failed\n");
                        rc = 1;
                        break;
                    }
                    printf("\n");
                }
                if (prof && li == 0 && r == 0 && s == 2) {
                    printf("\nper-kernel time of one eager decode step at context %d (graph off "
                           "while profiling):\n\n",
                           L + s);
                    tl_cuda_prof_report(b, stdout);
                    printf("\n");
                }
                tok = so.token;
            }
            double t2 = tl_time_s();
            pr[r] = L / (t1 - t0);
            gr[r] = gen / (t2 - t1);
        }
        if (rc) break;
        pre_tps[li] = median(pr, reps);
        gen_tps[li] = median(gr, reps);
        gbps[li] = tl_cuda_decode_bytes(b, L + gen / 2) * gen_tps[li];
        tflops[li] = prefill_flops(&cfg, L) / (L / pre_tps[li]) / 1e12;
        fprintf(stderr, "tulip bench: %6d: prefill %9.1f tok/s, decode %7.1f tok/s\n", L,
                pre_tps[li], gen_tps[li]);
    }
    if (!rc) {
        double mp = 0, mg = 0;
        for (int i = 0; i < n_len; i++) mp += pre_tps[i], mg += gen_tps[i];
        mp /= n_len, mg /= n_len;
        if (json) {
            printf("{\"gpu_hbm_gbps\": %.1f, \"bits\": %d, \"weights_gb\": %.3f, \"gen\": %d, "
                   "\"repeats\": %d, \"rows\": [",
                   hbm / 1e9, bits, tl_cuda_weight_bytes(b) / 1e9, gen, repeats);
            for (int i = 0; i < n_len; i++)
                printf("%s{\"ctx\": %d, \"prefill_tps\": %.1f, \"prefill_tflops\": %.2f, "
                       "\"gen_tps\": %.1f, \"gen_gbps\": %.1f, \"gen_pct_peak\": %.1f}",
                       i ? ", " : "", lengths[i], pre_tps[i], tflops[i], gen_tps[i], gbps[i] / 1e9,
                       100.0 * gbps[i] / hbm);
            printf("], \"mean_prefill_tps\": %.1f, \"mean_gen_tps\": %.1f}\n", mp, mg);
        } else {
            printf("| ctx | prefill tok/s | prefill TFLOP/s | decode tok/s | decode GB/s | %% of "
                   "HBM (%.0f GB/s) |\n",
                   hbm / 1e9);
            printf("|---:|---:|---:|---:|---:|---:|\n");
            for (int i = 0; i < n_len; i++)
                printf("| %d | %.1f | %.1f | %.1f | %.0f | %.1f%% |\n", lengths[i], pre_tps[i],
                       tflops[i], gen_tps[i], gbps[i] / 1e9, 100.0 * gbps[i] / hbm);
            printf("| mean | %.1f | | %.1f | | |\n", mp, mg);
        }
    }
    free(prompt);
    b->close(b);
    if (m) tl_model_close(m);
    return rc;
}
#endif
