/* tulip bench: the benchmark protocol of docs/developing.md §6, through the path the server runs
 * (tl_engine_open, sessions, tl_engine_step, as src/server/sched.c drives them). For each prompt
 * length L: prefill tok/s of one prompt (L tokens / time to its first sampled token), then --batch
 * B sequences each prefilled to L decode --gen tokens together, one tl_engine_step per step (EOS
 * ignored): aggregate decode tok/s (B x steps / time) and ms per step; the median of --repeats
 * runs; the means over the lengths. --context P puts P untimed tokens before each prompt (a turn
 * after a cached prefix) and --prefill-together times the B prompts in one step (requests
 * admitted at once). Sampling is the server's default for a request that names
 * nothing (the model card's, or the checkpoint's generation_config.json), or argmax with --greedy.
 * On the CUDA backend also achieved GB/s and % of the measured HBM bandwidth for decode at batch 1
 * (bytes a step must move, from the uploaded weights: tl_cuda_decode_bytes), TFLOP/s for prefill,
 * and the --ops / --prof / --prof-prefill tables and the --profile-range bracket (one prefill
 * or one decode step for ncu: bench/prefill_profile.sh). --random-weights builds the full-size
 * model on the GPU from a seed, so it runs where no checkpoint exists; a test-shape checkpoint also
 * runs on the CPU backend (how CI tests this file). The phases: parse options -> open (engine,
 * sampling settings, sessions) -> each length (repeats of prefill + batched decode, medians) ->
 * report. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "model/config.h"
#include "model/shape.h"
#include "server/openai.h"
#include "tulip.h"

#define BENCH_MAX_LEN     16
#define BENCH_MAX_REPEATS 16
#define BENCH_MAX_CTX     (1 << 28) /* a length or --gen beyond this is a typo */
#define BENCH_MAX_BATCH   1024      /* the CUDA backend's slot limit (CB_MAX_SEQS) */

typedef struct bench_opts {
    int random, bits, gen, repeats, json, prof, allow_test, ops, greedy, batch, max_seqs;
    int context;    /* tokens each sequence holds before its timed prompt (--context) */
    int together;   /* --prefill-together: the B prompts in one timed step */
    int no_warmup;  /* --no-warmup: the first timed prefill pays the one-time costs */
    int state_bf16; /* --state-dtype bf16 */
    int backend, threads, prof_prefill, range, spec; /* range: 0, BENCH_RANGE_PREFILL or _DECODE */
    uint64_t seed;
    const char *model_dir, *lengths_arg;
    int lengths[BENCH_MAX_LEN], n_len, max_len;
} bench_opts;

static const tl_opt_choice bench_bits[] = {{"4", 4}, {"16", 16}, {NULL, 0}};
enum { BENCH_RANGE_PREFILL = 1, BENCH_RANGE_DECODE = 2 };
static const tl_opt_choice bench_ranges[] = {
    {"prefill", BENCH_RANGE_PREFILL}, {"decode", BENCH_RANGE_DECODE}, {NULL, 0}};

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

/* Checks between options, after parsing. 0 or a usage error (2). */
static int bench_check_opts(const tl_cli_cmd *cmd, const bench_opts *o) {
    if (!o->random && !o->model_dir)
        return tl_cli_usage_error(cmd, "--random-weights or --model DIR is required");
    if (o->random && o->model_dir)
        return tl_cli_usage_error(cmd, "give --random-weights or --model DIR, not both");
    if (o->max_seqs && o->batch > o->max_seqs)
        return tl_cli_usage_error(cmd,
                                  "--batch %d needs %d sequence slots, but --max-seqs is %d "
                                  "(--max-seqs must be at least --batch)",
                                  o->batch, o->batch, o->max_seqs);
    if (o->range == BENCH_RANGE_DECODE && o->gen < 3)
        return tl_cli_usage_error(cmd, "--profile-range decode brackets the third decode step: "
                                       "--gen must be at least 3");
    const char *cuda_only = o->random         ? "--random-weights"
                            : o->ops          ? "--ops"
                            : o->prof         ? "--prof"
                            : o->prof_prefill ? "--prof-prefill"
                                              : "--profile-range";
    int wants_cuda = o->random || o->ops || o->prof || o->prof_prefill || o->range;
#ifdef TL_NO_CUDA
    if (wants_cuda)
        return tl_cli_usage_error(cmd,
                                  "%s needs the CUDA backend, and this build has no CUDA "
                                  "backend (make cuda)",
                                  cuda_only);
#endif
    if (wants_cuda && o->backend == TL_BACKEND_CPU)
        return tl_cli_usage_error(cmd, "%s needs the CUDA backend, not --backend cpu", cuda_only);
    return 0;
}

/* Options -> o. Returns TL_CLI_CONTINUE or the exit status. */
static int bench_parse(bench_opts *o, int argc, char **argv) {
    tl_opt opts[] = {
        TL_OPT_FLAG("random-weights", 0, &o->random,
                    "no checkpoint: the full-size model built on the GPU from --seed"),
        TL_OPT_CHOICE("bits", 0, &o->bits, "4|16", bench_bits,
                      "random weights: 4-bit (default) or bf16"),
        TL_OPT_CHOICE("state-dtype", 0, &o->state_bf16, "fp32|bf16", tl_cli_state_dtypes,
                      "Gated DeltaNet state precision (default fp32)"),
        TL_OPT_U64("seed", 0, &o->seed, "N",
                   "random weights, prompts and sampling seed (default 1)"),
        TL_CLI_OPT_MODEL(&o->model_dir, 0),
        TL_OPT_STR("lengths", 0, &o->lengths_arg, "L,L,...",
                   "prompt lengths, K = 1024 (default 256,512,...,131072: 10 powers of 2)"),
        TL_OPT_INT("context", 0, &o->context, "P", 0, BENCH_MAX_CTX,
                   "tokens each sequence holds before its timed prompt, prefilled untimed: the "
                   "prompt's prefill then attends to them, as a turn after a cached prefix does "
                   "(default 0)"),
        TL_OPT_FLAG("prefill-together", 0, &o->together,
                    "the --batch prompts in one timed step, as requests admitted at once (prefill "
                    "tok/s: all their tokens / that step's time); default: one after another, the "
                    "first timed"),
        TL_OPT_INT("gen", 0, &o->gen, "N", 1, BENCH_MAX_CTX,
                   "decode steps timed at each length (default 128)"),
        TL_OPT_INT("batch", 0, &o->batch, "B", 1, BENCH_MAX_BATCH,
                   "sequences decoding together, each at context L (default 1)"),
        TL_OPT_INT("max-seqs", 0, &o->max_seqs, "N", 0, BENCH_MAX_BATCH,
                   "sequence slots the engine opens (default: --batch)"),
        TL_OPT_INT("speculative-tokens", 0, &o->spec, "K", 0, TL_MAX_SPEC,
                   "MTP draft tokens verified per step (default 0: off)"),
        TL_OPT_FLAG("no-warmup", 0, &o->no_warmup,
                    "CUDA: no warm-up sequences before the timed ones (the first prefill then "
                    "pays the kernels' first launches)"),
        TL_OPT_FLAG("greedy", 0, &o->greedy,
                    "argmax, no penalties (default: the server's default sampling)"),
        TL_OPT_INT("repeats", 0, &o->repeats, "N", 1, BENCH_MAX_REPEATS,
                   "runs per length; the median counts (default 3)"),
        TL_OPT_FLAG("json", 0, &o->json, "one JSON object instead of the markdown table"),
        TL_OPT_FLAG("prof", 0, &o->prof, "per-kernel table of one decode step at the first length"),
        TL_OPT_FLAG("prof-prefill", 0, &o->prof_prefill,
                    "per-kernel table (CUDA events) of the first prefill at the first length"),
        TL_OPT_CHOICE("profile-range", 0, &o->range, "prefill|decode", bench_ranges,
                      "cudaProfilerStart/Stop around the first prefill, or the third decode step, "
                      "at the first length (ncu --profile-from-start off)"),
        TL_OPT_FLAG("ops", 0, &o->ops,
                    "time each decode op in place (back-to-back graph) at the first length"),
        TL_CLI_OPT_BACKEND(&o->backend),
        TL_CLI_OPT_THREADS(&o->threads),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&o->allow_test),
    };
    tl_cli_cmd cmd = {
        .name = "bench",
        .id = TL_CMD_BENCH,
        .synopsis = "--random-weights [--bits 4|16] [--seed N] | --model DIR [options]",
        .about = "Prefill and decode speed per prompt length, through the engine step the server "
                 "runs,\nwith the server's default sampling (--greedy: argmax) and --batch B "
                 "sequences\ndecoding together.\n",
        .opts = opts,
        .n_opts = TL_CLI_NOPTS(opts)};
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (bench_parse_lengths(&cmd, o) || bench_check_opts(&cmd, o)) return 2;
    return TL_CLI_CONTINUE;
}

static void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4, o->gen = 128, o->repeats = 3, o->seed = 1, o->batch = 1;
    o->backend = TL_BACKEND_AUTO;
    o->lengths_arg = "256,512,1024,2048,4096,8192,16384,32768,65536,131072";
}

/* ====== The CUDA backend's bench hooks. A build without CUDA never opens that backend, so there
 * they are unreachable (bench_state.cuda is never set). ====== */

#ifndef TL_NO_CUDA
#include "cuda/gpu.h"
static double hook_hbm_bw(void) { return tl_gpu_measure_bw((size_t)2 << 30); }
static double hook_weight_bytes(const tl_backend *b) { return (double)tl_cuda_weight_bytes(b); }
static double hook_decode_bytes(const tl_backend *b, int kv) { return tl_cuda_decode_bytes(b, kv); }
static void hook_prof_enable(tl_backend *b) { tl_cuda_prof_enable(b, 1); }
static void hook_prof_report(tl_backend *b, FILE *f) { tl_cuda_prof_report(b, f); }
static int hook_ops(tl_backend *b, FILE *f) { return tl_cuda_bench_ops(b, f); }
static int hook_range(int on) { return tl_gpu_profiler_range(on); }
#else
#define NO_CUDA_HOOK tl_assert_fail(__FILE__, __LINE__, "a CUDA bench hook in a build without CUDA")
static double hook_hbm_bw(void) { NO_CUDA_HOOK; }
static double hook_weight_bytes(const tl_backend *b) { NO_CUDA_HOOK; }
static double hook_decode_bytes(const tl_backend *b, int kv) { NO_CUDA_HOOK; }
static void hook_prof_enable(tl_backend *b) { NO_CUDA_HOOK; }
static void hook_prof_report(tl_backend *b, FILE *f) { NO_CUDA_HOOK; }
static int hook_ops(tl_backend *b, FILE *f) { NO_CUDA_HOOK; }
static int hook_range(int on) { NO_CUDA_HOOK; }
#endif

/* ====== State, helpers. ====== */

typedef struct bench_state {
    bench_opts o;
    tl_engine *e;
    tl_backend *b; /* the engine's backend: the CUDA hooks take it */
    int cuda;      /* the engine runs on the CUDA backend */
    const tl_config *cfg;
    double hbm; /* measured HBM copy bandwidth, bytes/s (CUDA only) */
    tl_sample_params sp;
    const char *sp_source; /* where sp comes from, for the header */
    int32_t *prompt;       /* [max(max_len, context)]: one sequence's prompt at a time */
    int32_t *prompts;      /* --prefill-together: [batch][max_len], else NULL */
    /* [batch] each: the sessions, their sampling (sp with one seed each), the step's entries,
     * samples and next tokens */
    tl_session **sess;
    tl_sample_params *seq_sp;
    tl_batch_entry *ent;
    tl_sample_out *out; /* [batch][1 + TL_MAX_SPEC] */
    int32_t *tok;
    int *made, *idx; /* [batch]: tokens generated in this decode, the step's sequence per entry */
    long long steps; /* timed decode steps of the last bench_decode */
    /* the last bench_decode's step of the --ops / --prof / --profile-range tables (eager,
     * bracketed, then the tables' own runs): its time and tokens, left out of decode tok/s */
    double untimed_s;
    long long untimed_tok;
    double pre_tps[BENCH_MAX_LEN], gen_tps[BENCH_MAX_LEN], ms_step[BENCH_MAX_LEN],
        gbps[BENCH_MAX_LEN], tflops[BENCH_MAX_LEN];          /* gbps: NAN where not known */
    double acc_rate[BENCH_MAX_LEN], per_step[BENCH_MAX_LEN]; /* speculation: accepted/drafted,
                                                                tokens per step and sequence */
    double spec_ms[BENCH_MAX_LEN][3]; /* ms per speculating step: drafts, forward, acceptance */
    double acc_pos[BENCH_MAX_LEN][TL_MAX_SPEC]; /* draft i accepted / steps that drafted it */
    char err[1024];
} bench_state;

/* FLOPs of a prefill of L tokens after P in context (matmuls over active weights + causal
 * attention over the P + L positions). */
static double prefill_flops(const tl_config *c, int L, int P) {
    double D = c->n_embd, hd = c->head_dim, per_tok = 0, n_attn = 0;
    for (int il = 0; il < c->n_layer; il++) {
        if (c->layer_kind[il] == TL_LAYER_ATTN) /* query + gate, k, v; output */
            per_tok += D * (c->n_head * 2 * hd + 2 * c->n_head_kv * hd) + D * c->n_head * hd;
        else
            per_tok +=
                D * (tl_config_gdn_conv_dim(c) + tl_config_gdn_val_dim(c) + 2.0 * c->gdn_n_v_head) +
                D * tl_config_gdn_val_dim(c);
        per_tok += D * (c->n_expert + 1) + c->n_expert_used * 3.0 * D * c->n_ff_expert +
                   3.0 * D * c->n_ff_shared;
        n_attn += c->layer_kind[il] == TL_LAYER_ATTN;
    }
    double pairs = (double)L * (L + 1) / 2 + (double)L * P; /* query-key pairs */
    double attn = n_attn * 4.0 * c->n_head * hd * pairs;    /* QK and PV */
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

/* Sequence i's prompt of L random ids into dst: one stream per sequence (different
 * prompts route to different experts, as different users' do); sequence 0's is the same at every
 * length and batch size. ctx 1: its --context tokens instead (another stream). */
static void bench_fill_prompt(const bench_state *bs, int32_t *dst, int i, int L, int ctx) {
    uint64_t rs = (bs->o.seed ^ (ctx ? 0x5eed : 0xabcdef)) + (uint64_t)i * 0x632BE59BD9B4E019ull;
    int n_tok_valid = TL_MIN(bs->cfg->n_vocab, TL_N_VOCAB_TOKENS);
    for (int t = 0; t < L; t++) dst[t] = (int32_t)(bench_rng(&rs) % (uint64_t)n_tok_valid);
}

/* ====== Opening: engine, sampling settings, sessions. ====== */

/* The line on stderr once the engine is open: the weights, the backend, the HBM bandwidth. */
static void bench_say_ready(bench_state *bs, double t_open) {
    const bench_opts *o = &bs->o;
    if (!bs->cuda) {
        fprintf(stderr, "tulip bench: checkpoint on the %s backend, ready in %.1f s\n", bs->b->name,
                t_open);
        return;
    }
    const char *kind = !o->random ? "checkpoint" : o->bits == 4 ? "random 4-bit" : "random bf16";
    bs->hbm = hook_hbm_bw();
    fprintf(stderr,
            "tulip bench: %s weights %.2f GB on the CUDA backend, ready in %.1f s; measured HBM "
            "copy %.0f GB/s\n",
            kind, hook_weight_bytes(bs->b) / 1e9, t_open, bs->hbm / 1e9);
}

/* The engine the server would open for this model, with B slots of the longest length + --gen.
 * Returns 0 or the exit status. */
static int bench_open_engine(bench_state *bs) {
    const bench_opts *o = &bs->o;
    /* the context, the prompt, --gen fed tokens, the last sample */
    int need_ctx = o->context + o->max_len + o->gen + 1;
    int slots = o->max_seqs ? o->max_seqs : o->batch;
    tl_engine_params ep = {.model_path = o->model_dir,
                           .backend = (tl_backend_kind)o->backend,
                           .allow_test_shape = o->allow_test,
                           .n_threads = o->threads,
                           .max_seqs = slots,
                           .max_ctx = need_ctx,
                           /* 0: a pool of every slot full (both backends cap it there), so
                            * each sequence gets whole pages of need_ctx tokens */
                           .kv_tokens = 0,
                           .random_weights = o->random,
                           .seed = o->seed,
                           .weight_bits = o->bits,
                           .state_bf16 = o->state_bf16,
                           .prefix_cache_bytes = -1, /* one prompt each: nothing to reuse */
                           .spec_tokens = o->spec};
    double t_open = tl_time_s();
    if (tl_engine_open(&bs->e, &ep, bs->err, sizeof bs->err)) {
        fprintf(stderr, "tulip bench: %s\n", bs->err);
        return 1;
    }
    t_open = tl_time_s() - t_open;
    bs->b = tl_engine_backend_impl(bs->e);
    bs->cuda = tl_engine_backend(bs->e) == TL_BACKEND_CUDA;
    /* as tulip serve does before its first request */
    if (bs->cuda && !o->no_warmup && tl_engine_warm_up(bs->e, bs->err, sizeof bs->err)) {
        fprintf(stderr, "tulip bench: warm-up: %s\n", bs->err);
        return 1;
    }
    bs->cfg = tl_engine_config(bs->e);
    if (tl_engine_max_ctx(bs->e) < need_ctx) { /* the engine caps it at max_position_embeddings */
        fprintf(stderr,
                "tulip bench: --lengths up to %d with --gen %d%s need a context of %d tokens; "
                "this model allows %d\n",
                o->max_len, o->gen, o->context ? " and --context" : "", need_ctx,
                tl_engine_max_ctx(bs->e));
        return 2;
    }
    if ((o->ops || o->prof || o->prof_prefill || o->range) && !bs->cuda) {
        fprintf(stderr,
                "tulip bench: --ops, --prof, --prof-prefill and --profile-range need the CUDA "
                "backend; this run is on %s\n",
                bs->b->name);
        return 2;
    }
    bench_say_ready(bs, t_open);
    return 0;
}

/* The sampling settings: --greedy, else what the server uses for a chat request that names
 * none (thinking on, its default): tl_oai_defaults_init, with generation_config.json over it as
 * `tulip serve` reads it (src/server/server.c). Seeds: --seed + the sequence's index. */
static void bench_sampling(bench_state *bs) {
    tl_sample_params *sp = &bs->sp;
    memset(sp, 0, sizeof *sp);
    if (bs->o.greedy) {
        sp->top_p = 1.0f, sp->repetition_penalty = 1.0f;
        bs->sp_source = "greedy (--greedy: argmax, no penalties)";
        return;
    }
    tl_oai_defaults d;
    tl_oai_defaults_init(&d);
    bs->sp_source = "the server's defaults (the model card's)";
    if (bs->o.model_dir) {
        char *path = tl_path_join(bs->o.model_dir, "generation_config.json"), *text = NULL;
        size_t len;
        if (tl_read_file(path, &text, &len, NULL, 0) == 0) {
            if (tl_oai_defaults_from_genconfig(&d, text))
                fprintf(stderr, "tulip bench: %s is not valid JSON; using the model card's\n",
                        path);
            else
                bs->sp_source = "the server's defaults (the checkpoint's generation_config.json)";
            free(text);
        }
        free(path);
    }
    *sp = d.thinking;
}

/* "temperature 1, top-k 20, ..." for the header. */
static void bench_sampling_text(const tl_sample_params *p, char *buf, size_t n) {
    snprintf(buf, n,
             "temperature %g, top-k %d, top-p %g, min-p %g, presence penalty %g, frequency "
             "penalty %g, repetition penalty %g",
             p->temperature, p->top_k, p->top_p, p->min_p, p->presence_penalty,
             p->frequency_penalty, p->repetition_penalty);
}

/* B sessions and their per-step arrays. Returns 0 or the exit status. */
static int bench_open_sessions(bench_state *bs) {
    int B = bs->o.batch;
    bs->prompt = xmalloc(sizeof(int32_t) * (size_t)TL_MAX(bs->o.max_len, bs->o.context));
    if (bs->o.together) bs->prompts = xmalloc(sizeof(int32_t) * (size_t)B * bs->o.max_len);
    bs->sess = xcalloc(B, sizeof *bs->sess);
    bs->seq_sp = xcalloc(B, sizeof *bs->seq_sp);
    bs->ent = xcalloc(B, sizeof *bs->ent);
    bs->out = xcalloc((size_t)B * (1 + TL_MAX_SPEC), sizeof *bs->out);
    bs->tok = xcalloc(B, sizeof *bs->tok);
    bs->made = xcalloc(B, sizeof *bs->made);
    bs->idx = xcalloc(B, sizeof *bs->idx);
    for (int i = 0; i < B; i++) {
        bs->seq_sp[i] = bs->sp;
        bs->seq_sp[i].seed = bs->o.seed + (uint64_t)i;
        if (tl_session_open(bs->e, &bs->sess[i], bs->err, sizeof bs->err)) {
            fprintf(stderr, "tulip bench: sequence %d of %d: %s\n", i, B, bs->err);
            return 1;
        }
    }
    return 0;
}

static void bench_close(bench_state *bs) {
    for (int i = 0; bs->sess && i < bs->o.batch; i++) tl_session_close(bs->sess[i]);
    tl_engine_close(bs->e);
    free(bs->prompt), free(bs->prompts), free(bs->sess), free(bs->seq_sp), free(bs->ent),
        free(bs->out);
    free(bs->tok), free(bs->made), free(bs->idx);
}

/* ====== Measuring. ====== */

/* --ops and --prof: the tables of one decode step at context ctx, printed right after it. */
static int bench_step_tables(bench_state *bs, int ctx) {
    if (bs->o.ops) {
        printf("\nper-op time of one decode token at context %d (each op %s):\n\n", ctx,
               "captured 40 times back to back in a graph, best of 5 replays");
        if (hook_ops(bs->b, stdout)) {
            fprintf(stderr, "tulip bench: --ops failed\n");
            return 1;
        }
        printf("\n");
    }
    if (bs->o.prof) {
        printf("\nper-kernel time of one eager decode step of %d sequences at context %d (graph "
               "off while profiling):\n\n",
               bs->o.batch, ctx);
        hook_prof_report(bs->b, stdout);
        printf("\n");
    }
    return 0;
}

/* One tl_engine_step over the first n entries, which are sequences first .. first+n-1; each
 * sampled token becomes its sequence's next input. what/at name the step in an error. Returns 0
 * or 1 (after printing the error). */
static int bench_step(bench_state *bs, int n, int first, const char *what, int at) {
    if (tl_engine_step(bs->e, bs->ent, n, bs->err, sizeof bs->err)) {
        fprintf(stderr, "tulip bench: %s at %d: %s\n", what, at, bs->err);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (bs->out[i].token < 0) {
            fprintf(stderr, "tulip bench: %s at %d: sequence %d has non-finite logits\n", what, at,
                    first + i);
            return 1;
        }
        bs->tok[first + i] = bs->out[i].token;
    }
    return 0;
}

/* --profile-range: cudaProfilerStart (on) or Stop around one step. Returns 0 or 1. */
static int bench_range(int on) {
    if (!hook_range(on)) return 0;
    fprintf(stderr, "tulip bench: --profile-range: cudaProfiler%s failed\n", on ? "Start" : "Stop");
    return 1;
}

/* Entry k of the step: sequence i fed n ids at tokens, sampling its next token into out[k]. */
static void bench_entry(bench_state *bs, int k, int i, const int32_t *tokens, int n) {
    bs->ent[k] = (tl_batch_entry){.sess = bs->sess[i],
                                  .tokens = tokens,
                                  .n_tok = n,
                                  .sample = &bs->seq_sp[i],
                                  .out = &bs->out[k]};
}

/* Sequence i emptied and, with --context, fed its context tokens (untimed). Returns 0 or 1. */
static int bench_seq_start(bench_state *bs, int i) {
    int st = tl_session_reset(bs->sess[i]);
    if (st) {
        fprintf(stderr, "tulip bench: resetting sequence %d failed: %s\n", i, tl_status_str(st));
        return 1;
    }
    if (!bs->o.context) return 0;
    bench_fill_prompt(bs, bs->prompt, i, bs->o.context, 1);
    bench_entry(bs, 0, i, bs->prompt, bs->o.context);
    return bench_step(bs, 1, i, "context", bs->o.context);
}

/* The timed prefill step of the n entries set up, the first being sequence i0's: *secs its time;
 * first: the run's first prefill, the one --prof-prefill and --profile-range look at (the timing
 * of that repeat includes their cost). Returns 0 or 1. */
static int bench_timed_prefill(bench_state *bs, int n, int i0, int L, double *secs, int first) {
    int prof = first && bs->o.prof_prefill, range = first && bs->o.range == BENCH_RANGE_PREFILL;
    if (prof) hook_prof_enable(bs->b);
    if (range && bench_range(1)) return 1;
    double t0 = tl_time_s();
    if (bench_step(bs, n, i0, "prefill", L)) return 1;
    *secs = tl_time_s() - t0;
    if (range && bench_range(0)) return 1;
    if (prof) {
        printf("\nper-kernel time of one eager prefill of %d x %d tokens (CUDA events after each "
               "launch; graph off while profiling):\n\n",
               n, L);
        hook_prof_report(bs->b, stdout);
        printf("\n");
    }
    return 0;
}

/* Sequence i from empty (or from its --context tokens) through its prompt of L tokens, as the
 * server's last prefill chunk does: one entry that samples the first token; *secs is the time
 * of that step alone. Returns 0 or 1. */
static int bench_prefill(bench_state *bs, int i, int L, double *secs, int first) {
    if (bench_seq_start(bs, i)) return 1;
    bench_fill_prompt(bs, bs->prompt, i, L, 0);
    bench_entry(bs, 0, i, bs->prompt, L);
    return bench_timed_prefill(bs, 1, i, L, secs, first);
}

/* --prefill-together: every sequence emptied (and fed its context), then all B prompts of L
 * tokens in one timed step, as requests admitted at once share one: *secs is that step's time,
 * every request's time to its first token. Returns 0 or 1. */
static int bench_prefill_together(bench_state *bs, int L, double *secs, int first) {
    int B = bs->o.batch;
    for (int i = 0; i < B; i++)
        if (bench_seq_start(bs, i)) return 1;
    for (int i = 0; i < B; i++) {
        int32_t *p = bs->prompts + (size_t)i * bs->o.max_len;
        bench_fill_prompt(bs, p, i, L, 0);
        bench_entry(bs, i, i, p, L);
    }
    return bench_timed_prefill(bs, B, 0, L, secs, first);
}

/* Every sequence decodes --gen tokens, all together, as sched.c's build_batch makes the steps:
 * one token a step, or with --speculative-tokens up to 1 + K (never past --gen); a sequence that
 * is done leaves the batch. The tables of --ops / --prof (and --profile-range decode) come from
 * the third step of the first run, which is left out of the timing with its tokens (the tables
 * run inside it: 0.8-2.6 ms a step on the H100 when they were counted). Returns 0 or 1. */
static int bench_decode(bench_state *bs, int L, int tables) {
    int B = bs->o.batch, W = 1 + TL_MAX_SPEC;
    for (int i = 0; i < B; i++) bs->made[i] = 0;
    bs->steps = 0, bs->untimed_s = 0.0, bs->untimed_tok = 0;
    for (int s = 0;; s++) {
        int n = 0;
        for (int i = 0; i < B; i++) {
            if (bs->made[i] >= bs->o.gen) continue;
            bs->ent[n] = (tl_batch_entry){.sess = bs->sess[i],
                                          .tokens = &bs->tok[i],
                                          .n_tok = 1,
                                          .sample = &bs->seq_sp[i],
                                          .out = &bs->out[(size_t)i * W],
                                          .spec_max = bs->o.gen - bs->made[i] - 1};
            bs->idx[n++] = i;
        }
        if (!n) return 0;
        int here =
            tables && s == 2 && (bs->o.ops || bs->o.prof || bs->o.range == BENCH_RANGE_DECODE);
        int range = here && bs->o.range == BENCH_RANGE_DECODE;
        double tu = here ? tl_time_s() : 0.0;
        if (here && bs->o.prof) hook_prof_enable(bs->b);
        if (range && bench_range(1)) return 1;
        if (tl_engine_step(bs->e, bs->ent, n, bs->err, sizeof bs->err)) {
            fprintf(stderr, "tulip bench: decode at %d: %s\n", L + s, bs->err);
            return 1;
        }
        if (range && bench_range(0)) return 1;
        long long made = 0;
        for (int k = 0; k < n; k++) {
            int i = bs->idx[k];
            const tl_sample_out *o = bs->ent[k].out;
            for (int j = 0; j < bs->ent[k].n_out; j++)
                if (o[j].token < 0) {
                    fprintf(stderr,
                            "tulip bench: decode at %d: sequence %d has non-finite logits\n", L + s,
                            i);
                    return 1;
                }
            bs->made[i] += bs->ent[k].n_out;
            made += bs->ent[k].n_out;
            bs->tok[i] = o[bs->ent[k].n_out - 1].token;
        }
        if (here && bench_step_tables(bs, L + s)) return 1;
        if (here) /* the tables' step is not timed */
            bs->untimed_s += tl_time_s() - tu, bs->untimed_tok += made;
        else
            bs->steps++;
    }
}

/* Repeat r at the li-th length: sequence 0's prefill (timed), the others' (untimed), or all of
 * them in one timed step (--prefill-together), then the batched decode; prefill tok/s in *pre
 * (all the timed step's tokens), aggregate decode tok/s in *dec. Returns 0 or 1. */
static int bench_repeat(bench_state *bs, int li, int r, double *pre, double *dec) {
    int L = bs->o.lengths[li];
    double t_pre = 0, t_other;
    int first = li == 0 && r == 0, n_pre = bs->o.together ? bs->o.batch : 1;
    if (bs->o.together) {
        if (bench_prefill_together(bs, L, &t_pre, first)) return 1;
    } else {
        for (int i = 0; i < bs->o.batch; i++)
            if (bench_prefill(bs, i, L, i ? &t_other : &t_pre, first && i == 0)) return 1;
    }
    double t0 = tl_time_s();
    if (bench_decode(bs, L, first)) return 1;
    double t1 = tl_time_s();
    *pre = (double)n_pre * L / t_pre;
    *dec = ((double)bs->o.batch * bs->o.gen - bs->untimed_tok) / (t1 - t0 - bs->untimed_s);
    return 0;
}

/* The li-th length: the medians over the repeats, ms per step, GB/s of decode (batch 1 on the
 * CUDA backend only: tl_cuda_decode_bytes counts one token's weights and state; what a step of B
 * tokens reads depends on how the kernels share expert reads, which nothing here measures),
 * TFLOP/s of prefill. */
static int bench_length(bench_state *bs, int li) {
    int L = bs->o.lengths[li], gen = bs->o.gen, reps = bs->o.repeats, B = bs->o.batch;
    double pr[BENCH_MAX_REPEATS], gr[BENCH_MAX_REPEATS];
    tl_spec_stats s0, s1;
    tl_engine_spec_stats(bs->e, &s0);
    long long steps = 0, made = 0; /* timed steps and their tokens */
    for (int r = 0; r < reps; r++) {
        if (bench_repeat(bs, li, r, &pr[r], &gr[r])) return 1;
        steps += bs->steps, made += (long long)B * gen - bs->untimed_tok;
    }
    tl_engine_spec_stats(bs->e, &s1);
    bs->pre_tps[li] = median(pr, reps);
    bs->gen_tps[li] = median(gr, reps);
    /* a step makes B x per_step tokens (per_step 1 without speculation) */
    bs->acc_rate[li] = s1.drafted > s0.drafted
                           ? (double)(s1.accepted - s0.accepted) / (double)(s1.drafted - s0.drafted)
                           : NAN;
    for (int i = 0; i < TL_MAX_SPEC; i++) {
        long long nd = s1.drafted_pos[i] - s0.drafted_pos[i];
        bs->acc_pos[li][i] = nd > 0 ? (double)(s1.accepted_pos[i] - s0.accepted_pos[i]) / nd : NAN;
    }
    bs->per_step[li] = (double)made / (double)TL_MAX(steps, 1) / B;
    bs->ms_step[li] = 1000.0 * B * bs->per_step[li] / bs->gen_tps[li];
    bs->gbps[li] = bs->cuda && B == 1
                       ? hook_decode_bytes(bs->b, bs->o.context + L + gen / 2) * bs->gen_tps[li]
                       : NAN;
    bs->tflops[li] = prefill_flops(bs->cfg, L, bs->o.context) / (L / bs->pre_tps[li]) / 1e12;
    fprintf(stderr,
            "tulip bench: %6d: prefill %9.1f tok/s, decode %7.1f tok/s (batch %d, %.3f ms/step)\n",
            L, bs->pre_tps[li], bs->gen_tps[li], B, bs->ms_step[li]);
    int K = tl_engine_spec_tokens(bs->e);
    if (!K) return 0;
    fprintf(stderr,
            "tulip bench: %6d: speculation: %.1f%% of drafts accepted, %.2f tokens per step; "
            "accepted by draft position:",
            L, 100 * bs->acc_rate[li], bs->per_step[li]);
    for (int i = 0; i < K; i++) fprintf(stderr, " %d: %.1f%%", i + 1, 100 * bs->acc_pos[li][i]);
    fprintf(stderr, "\n");
    double ms = 1000.0 / (double)TL_MAX(s1.drafts - s0.drafts, 1);
    bs->spec_ms[li][0] = ms * (s1.s_draft - s0.s_draft + s1.s_draft_host - s0.s_draft_host);
    bs->spec_ms[li][1] = ms * (s1.s_forward - s0.s_forward);
    bs->spec_ms[li][2] = ms * (s1.s_accept - s0.s_accept);
    fprintf(stderr,
            "tulip bench: %6d: per speculating sequence-step: draft %.3f ms (backend) + %.3f ms "
            "(host laws), forward %.3f ms, acceptance %.3f ms\n",
            L, ms * (s1.s_draft - s0.s_draft), ms * (s1.s_draft_host - s0.s_draft_host),
            bs->spec_ms[li][1], bs->spec_ms[li][2]);
    return 0;
}

/* ====== Reporting. ====== */

/* x with fmt, or null (JSON) / nothing (table) when it is not known. */
static void put_num(const char *fmt, double x, int json) {
    if (isfinite(x))
        printf(fmt, x);
    else if (json)
        printf("null");
}

static void bench_report_json(const bench_state *bs, double mp, double mg) {
    const bench_opts *o = &bs->o;
    const tl_sample_params *p = &bs->sp;
    printf("{\"backend\": \"%s\", \"batch\": %d, \"greedy\": %s, \"sampling\": {\"temperature\": "
           "%g, \"top_k\": %d, \"top_p\": %g, \"min_p\": %g, \"presence_penalty\": %g, "
           "\"frequency_penalty\": %g, \"repetition_penalty\": %g}, \"gpu_hbm_gbps\": ",
           bs->b->name, o->batch, o->greedy ? "true" : "false", p->temperature, p->top_k, p->top_p,
           p->min_p, p->presence_penalty, p->frequency_penalty, p->repetition_penalty);
    put_num("%.1f", bs->cuda ? bs->hbm / 1e9 : NAN, 1);
    printf(", \"bits\": %d, \"weights_gb\": ", o->bits);
    put_num("%.3f", bs->cuda ? hook_weight_bytes(bs->b) / 1e9 : NAN, 1);
    printf(", \"gen\": %d, \"repeats\": %d, \"context\": %d, \"prefill_together\": %s, \"rows\": [",
           o->gen, o->repeats, o->context, o->together ? "true" : "false");
    for (int i = 0; i < o->n_len; i++) {
        printf("%s{\"ctx\": %d, \"prefill_tps\": %.1f, \"prefill_tflops\": %.2f, \"gen_tps\": "
               "%.1f, \"gen_ms_per_step\": %.3f, \"gen_gbps\": ",
               i ? ", " : "", o->lengths[i], bs->pre_tps[i], bs->tflops[i], bs->gen_tps[i],
               bs->ms_step[i]);
        put_num("%.1f", bs->gbps[i] / 1e9, 1);
        printf(", \"gen_pct_peak\": ");
        put_num("%.1f", 100.0 * bs->gbps[i] / bs->hbm, 1);
        if (tl_engine_spec_tokens(bs->e)) {
            printf(", \"spec_acceptance\": ");
            put_num("%.4f", bs->acc_rate[i], 1);
            printf(", \"spec_tokens_per_step\": %.3f, \"spec_ms_draft\": %.3f, "
                   "\"spec_ms_forward\": %.3f, \"spec_ms_accept\": %.3f, "
                   "\"spec_acceptance_per_pos\": [",
                   bs->per_step[i], bs->spec_ms[i][0], bs->spec_ms[i][1], bs->spec_ms[i][2]);
            for (int j = 0; j < tl_engine_spec_tokens(bs->e); j++) {
                printf("%s", j ? ", " : "");
                put_num("%.4f", bs->acc_pos[i][j], 1);
            }
            printf("]");
        }
        printf("}");
    }
    printf("], \"speculative_tokens\": %d, \"mean_prefill_tps\": %.1f, \"mean_gen_tps\": %.1f}\n",
           tl_engine_spec_tokens(bs->e), mp, mg);
}

/* The markdown table: at batch 1 the columns BENCHMARKS.md has always had; at batch B the decode
 * columns are the aggregate of the B sequences, GB/s is left empty (bench_length) and a last
 * column gives the time of one step. A line above says what ran. */
static void bench_report_table(const bench_state *bs, double mp, double mg) {
    const bench_opts *o = &bs->o;
    char samp[256], hbm[32] = "no GPU";
    bench_sampling_text(&bs->sp, samp, sizeof samp);
    int K = tl_engine_spec_tokens(bs->e);
    printf("batch %d on the %s backend, %d decode %s", o->batch, bs->b->name, o->gen,
           K ? "tokens per sequence" : "steps");
    if (o->context) /* ctx then counts the prompt only */
        printf(", each prompt after %d tokens of context (prefilled untimed)", o->context);
    if (o->together) printf(", the %d prompts prefilled together in one timed step", o->batch);
    if (K) { /* one line: the table's caption */
        printf(" (speculative decoding, %d MTP draft tokens a step; drafts accepted / tokens per "
               "step and sequence:",
               K);
        for (int i = 0; i < o->n_len; i++)
            printf("%s %d: %.1f%% / %.2f", i ? "," : "", o->lengths[i], 100 * bs->acc_rate[i],
                   bs->per_step[i]);
        printf(")");
    }
    printf("; sampling: %s: %s\n\n", bs->sp_source, samp);
    if (bs->cuda) snprintf(hbm, sizeof hbm, "%.0f GB/s", bs->hbm / 1e9);
    printf("| ctx | prefill tok/s | prefill TFLOP/s | decode tok/s | decode GB/s | %% of HBM (%s) |"
           "%s\n",
           hbm, o->batch > 1 || K ? " decode ms/step |" : "");
    printf("|---:|---:|---:|---:|---:|---:|%s\n", o->batch > 1 || K ? "---:|" : "");
    double ms = 0;
    for (int i = 0; i < o->n_len; i++) {
        printf("| %d | %.1f | %.1f | %.1f | ", o->lengths[i], bs->pre_tps[i], bs->tflops[i],
               bs->gen_tps[i]);
        put_num("%.0f ", bs->gbps[i] / 1e9, 0);
        printf("| ");
        put_num("%.1f%% ", 100.0 * bs->gbps[i] / bs->hbm, 0);
        printf("|");
        if (o->batch > 1 || K) printf(" %.3f |", bs->ms_step[i]);
        printf("\n");
        ms += bs->ms_step[i] / o->n_len;
    }
    printf("| mean | %.1f | | %.1f | | |", mp, mg);
    if (o->batch > 1 || K) printf(" %.3f |", ms);
    printf("\n");
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
    bench_state bs;
    memset(&bs, 0, sizeof bs);
    bench_opts_default(&bs.o);
    int rc = bench_parse(&bs.o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    rc = bench_open_engine(&bs);
    if (!rc) {
        bench_sampling(&bs);
        rc = bench_open_sessions(&bs);
    }
    for (int li = 0; li < bs.o.n_len && !rc; li++) rc = bench_length(&bs, li);
    if (!rc) bench_report(&bs);
    bench_close(&bs);
    return rc;
}
