/* tulip run: generate from one prompt. Prompt as token ids (--prompt-ids 1,2,3) prints ids;
 * as text (-p) it is rendered through the chat template, tokenized, and the answer streamed as
 * text. Options mirror the server's sampling fields. The phases: parse options -> prompt tokens
 * -> open engine and session -> generate -> close. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/util.h"
#include "model/config.h"
#include "tulip.h"

#include <jansson.h>
#include "tokenizer/bpe.h"
#include "tokenizer/chat.h"

typedef struct run_opts {
    tl_engine_params ep;
    tl_sample_params sp;
    const char *ids_arg, *text, *dump, *system, *tok_path;
    int n_gen, print_ids, ignore_eos, no_think, raw, backend;
} run_opts;

typedef struct run_state {
    run_opts o;
    int32_t *prompt;
    int n_prompt;
    tl_tokenizer *tok;
    tl_engine *e;
    tl_session *s;
    tl_detok_stream *ds;
    const tl_config *cfg;
    FILE *df;      /* --dump-logits */
    float *logits; /* [n_vocab] when dumping */
    char err[1024];
} run_state;

/* Options -> o. Returns TL_CLI_CONTINUE or the exit status. */
static int run_parse(run_opts *o, int argc, char **argv) {
    tl_opt opts[] = {
        TL_CLI_OPT_MODEL(&o->ep.model_path, 'm'),
        TL_OPT_STR("prompt-ids", 0, &o->ids_arg, "1,2,3", "the prompt as token ids; prints ids"),
        TL_OPT_STR("prompt", 'p', &o->text, "TEXT",
                   "a user message: rendered with the chat template, answer streamed"),
        TL_OPT_INT(NULL, 'n', &o->n_gen, "N", 0, TL_OPT_NOMAX, "tokens to generate (default 64)"),
        TL_CLI_OPT_TEMPERATURE(&o->sp.temperature),
        TL_CLI_OPT_TOP_K(&o->sp.top_k),
        TL_CLI_OPT_TOP_P(&o->sp.top_p),
        TL_CLI_OPT_MIN_P(&o->sp.min_p),
        TL_CLI_OPT_SAMPLE_SEED(&o->sp.seed),
        TL_CLI_OPT_PRESENCE(&o->sp.presence_penalty),
        TL_CLI_OPT_FREQUENCY(&o->sp.frequency_penalty),
        TL_CLI_OPT_REPETITION(&o->sp.repetition_penalty),
        TL_OPT_FLAG("print-ids", 0, &o->print_ids,
                    "print generated ids on one line, separated by spaces"),
        TL_OPT_STR("system", 0, &o->system, "TEXT", "-p: a system message before the user's"),
        TL_OPT_FLAG("no-thinking", 0, &o->no_think, "-p: render with enable_thinking=false"),
        TL_OPT_FLAG("raw", 0, &o->raw, "-p: tokenize TEXT as it is, no chat template"),
        TL_CLI_OPT_TOKENIZER(&o->tok_path),
        TL_OPT_FLAG("ignore-eos", 0, &o->ignore_eos, "do not stop at the model's stop tokens"),
        TL_OPT_STR("dump-logits", 0, &o->dump, "FILE",
                   "write the f32 logits of every step (prefill last + each decode)"),
        TL_OPT_INT("speculative-tokens", 0, &o->ep.spec_tokens, "K", 0, TL_MAX_SPEC,
                   "draft K tokens a step with the checkpoint's MTP head (default 0: off); "
                   "the acceptance goes to stderr"),
        TL_CLI_OPT_BACKEND(&o->backend),
        TL_CLI_OPT_THREADS(&o->ep.n_threads),
        TL_OPT_INT("ctx", 0, &o->ep.max_ctx, "N", 0, TL_OPT_NOMAX,
                   "context tokens (default: prompt + N)"),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&o->ep.allow_test_shape),
    };
    tl_cli_cmd cmd = {
        .name = "run",
        .id = TL_CMD_RUN,
        .synopsis = "--model DIR (--prompt-ids 1,2,3 | -p TEXT) [options]",
        .about = "Generates from one prompt. Sampling defaults: greedy for --prompt-ids; for -p\n"
                 "without --temperature the model card's (temperature 1.0, top-p 0.95, top-k 20;\n"
                 "0.7 and 0.8 with --no-thinking).\n",
        .opts = opts,
        .n_opts = TL_CLI_NOPTS(opts),
    };
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    o->ep.backend = (tl_backend_kind)o->backend;
    if (!o->ep.model_path) return tl_cli_usage_error(&cmd, "--model DIR is required");
    if (!o->ids_arg && !o->text) return tl_cli_usage_error(&cmd, "--prompt-ids or -p is required");
    if (o->ids_arg && o->text) return tl_cli_usage_error(&cmd, "give --prompt-ids or -p, not both");
    if (o->dump && o->ep.spec_tokens)
        return tl_cli_usage_error(&cmd, "--dump-logits writes one step a token: not with "
                                        "--speculative-tokens");
    if (o->text && !tl_cli_given(&cmd, &o->sp.temperature)) {
        /* the model's generation config defaults (docs/model.md §6); given options stay */
        o->sp.temperature = o->no_think ? 0.7f : 1.0f;
        if (!tl_cli_given(&cmd, &o->sp.top_p)) o->sp.top_p = o->no_think ? 0.8f : 0.95f;
        if (!tl_cli_given(&cmd, &o->sp.top_k)) o->sp.top_k = 20;
    }
    return TL_CLI_CONTINUE;
}

static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = xmalloc(sizeof(int32_t) * cap);
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > 0x7fffffff) {
            free(ids);
            return -1;
        }
        if (k == cap) ids = xrealloc(ids, sizeof(int32_t) * (cap *= 2));
        ids[k++] = (int32_t)v;
        s = end;
        while (*s == ',' || *s == ' ') s++;
    }
    *out = ids;
    *n = k;
    return k > 0 ? 0 : -1;
}

/* -p TEXT -> the prompt string the model sees (chat template unless --raw); NULL on error. */
static char *run_render(run_state *r, size_t *len) {
    const run_opts *o = &r->o;
    char *rendered = NULL;
    if (o->raw) {
        *len = strlen(o->text);
        return xstrdup(o->text);
    }
    json_t *msgs = json_array();
    if (o->system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", o->text));
    tl_chat_opts co;
    tl_chat_opts_default(&co);
    co.enable_thinking = !o->no_think;
    int rc = tl_chat_render(msgs, NULL, &co, &rendered, len, r->err, sizeof r->err);
    json_decref(msgs);
    if (rc) {
        fprintf(stderr, "tulip: chat template: %s\n", r->err);
        return NULL;
    }
    return rendered;
}

/* -p TEXT -> r->prompt through the tokenizer (kept in r->tok for the streamed answer). */
static int run_prompt_text(run_state *r) {
    char path[4096];
    const char *tok_path = r->o.tok_path;
    if (!tok_path) {
        snprintf(path, sizeof path, "%s/tokenizer.json", r->o.ep.model_path);
        tok_path = path;
    }
    if (tl_tokenizer_load(tok_path, &r->tok, r->err, sizeof r->err)) {
        fprintf(stderr, "tulip: %s\n", r->err);
        return 1;
    }
    size_t rlen = 0;
    char *rendered = run_render(r, &rlen);
    if (!rendered) return 1;
    tl_tok_ids ids = {0};
    int rc = tl_tokenize(r->tok, rendered, rlen, 0, &ids);
    free(rendered);
    if (rc < 0 || ids.n == 0) {
        fprintf(stderr, "tulip: tokenizing the prompt failed\n");
        tl_tok_ids_free(&ids);
        return 1;
    }
    r->prompt = ids.ids;
    r->n_prompt = (int)ids.n;
    return 0;
}

/* The prompt tokens, from --prompt-ids or -p. Returns 0 or the exit status. */
static int run_prompt(run_state *r) {
    if (r->o.text) return run_prompt_text(r);
    if (parse_ids(r->o.ids_arg, &r->prompt, &r->n_prompt)) {
        fprintf(stderr, "tulip run: --prompt-ids must be a comma-separated list of token ids\n");
        return 2;
    }
    return 0;
}

/* Engine, detokenizer stream (-p), logits file (--dump-logits), session. 0 or exit status. */
static int run_open(run_state *r) {
    tl_engine_params *ep = &r->o.ep;
    ep->max_seqs = 1;
    ep->prefix_cache_bytes = -1;                              /* one prompt: nothing to reuse */
    if (!ep->max_ctx) ep->max_ctx = r->n_prompt + r->o.n_gen; /* the last token is never fed */
    if (tl_engine_open(&r->e, ep, r->err, sizeof r->err)) {
        fprintf(stderr, "tulip: %s\n", r->err);
        return 1;
    }
    if (r->tok && tl_detok_stream_create(r->tok, TL_DETOK_SKIP_SPECIAL, &r->ds)) {
        fprintf(stderr, "tulip: out of memory\n");
        return 1;
    }
    r->cfg = tl_engine_config(r->e);
    if (r->o.dump) {
        r->df = fopen(r->o.dump, "wb");
        if (!r->df) {
            fprintf(stderr, "tulip run: cannot write %s: %s\n", r->o.dump, strerror(errno));
            return 1;
        }
        r->logits = xmalloc(sizeof(float) * r->cfg->n_vocab);
    }
    if (tl_session_open(r->e, &r->s, r->err, sizeof r->err)) {
        fprintf(stderr, "tulip: %s\n", r->err);
        return 1;
    }
    return 0;
}

/* One sampled token to stdout: its id (--print-ids) and/or its text (-p). */
static void run_emit(run_state *r, int step, int32_t tok) {
    if (r->o.print_ids) printf(step ? " %d" : "%d", tok);
    if (r->ds) {
        const char *piece;
        size_t plen;
        if (tl_detok_stream_push(r->ds, tok, &piece, &plen) == 0 && plen)
            fwrite(piece, 1, plen, stdout);
    }
    fflush(stdout);
}

static int run_is_stop(const run_state *r, int32_t tok) {
    for (int k = 0; k < r->cfg->n_eos && !r->o.ignore_eos; k++)
        if (tok == r->cfg->eos_ids[k]) return 1;
    return 0;
}

/* The acceptance of --speculative-tokens, per draft position, on stderr. */
static void run_spec_report(const run_state *r) {
    int K = tl_engine_spec_tokens(r->e);
    tl_spec_stats st;
    if (!K || tl_engine_spec_stats(r->e, &st)) return;
    fprintf(stderr,
            "tulip run: speculation: %lld steps drafted %lld tokens, %lld accepted (%.1f%%)",
            st.drafts, st.drafted, st.accepted,
            100.0 * (double)st.accepted / (double)TL_MAX(st.drafted, 1));
    fprintf(stderr, "; accepted by draft position:");
    for (int i = 0; i < K; i++)
        fprintf(stderr, " %d: %lld/%lld", i + 1, st.accepted_pos[i], st.drafted_pos[i]);
    fprintf(stderr, "\n");
}

/* The prompt, then a step at a time (one token, or with --speculative-tokens 1 + the accepted
 * drafts) until -n tokens or a stop token. 0 or a negative status. */
static int run_generate(run_state *r) {
    const int32_t *feed = r->prompt;
    int n_feed = r->n_prompt, rc = 0, n_vocab = r->cfg->n_vocab, made = 0, stop = 0;
    int32_t next;
    while (made < r->o.n_gen && !stop) {
        tl_sample_out out[1 + TL_MAX_SPEC];
        tl_batch_entry be = {.sess = r->s,
                             .tokens = feed,
                             .n_tok = n_feed,
                             .sample = &r->o.sp,
                             .out = out,
                             .logits = r->logits,
                             .spec_max = r->o.n_gen - made - 1};
        if ((rc = tl_engine_step(r->e, &be, 1, r->err, sizeof r->err))) break;
        if (r->df && fwrite(r->logits, sizeof(float), n_vocab, r->df) != (size_t)n_vocab) {
            snprintf(r->err, sizeof r->err, "write error on %s", r->o.dump);
            rc = -1;
            break;
        }
        for (int j = 0; j < be.n_out && !stop; j++) {
            next = out[j].token;
            if (next < 0) { /* non-finite logits (tulip.h) */
                snprintf(r->err, sizeof r->err,
                         "the model produced non-finite logits (NaN or inf)");
                rc = TL_ERR_INTERNAL;
                break;
            }
            run_emit(r, made++, next);
            stop = run_is_stop(r, next);
        }
        if (rc) break;
        /* the sequence holds n_past + 1 tokens now: at the context it is full (docs: the last
         * token of a sequence is the ctx-th) */
        if (tl_session_n_past(r->s) + 1 >= tl_engine_max_ctx(r->e)) break;
        feed = &next;
        n_feed = 1;
    }
    if (r->ds) {
        const char *piece;
        size_t plen;
        if (tl_detok_stream_flush(r->ds, &piece, &plen) == 0 && plen)
            fwrite(piece, 1, plen, stdout);
    }
    if (r->o.print_ids || r->ds) printf("\n");
    run_spec_report(r);
    return rc;
}

static void run_close(run_state *r) {
    tl_detok_stream_free(r->ds);
    if (r->df) fclose(r->df);
    free(r->logits);
    if (r->s) tl_session_close(r->s);
    if (r->e) tl_engine_close(r->e);
    free(r->prompt);
    tl_tokenizer_free(r->tok);
}

int cmd_run(int argc, char **argv) {
    run_state r = {.o = {.sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1},
                         .n_gen = 64,
                         .backend = TL_BACKEND_AUTO}};
    int status = run_parse(&r.o, argc, argv);
    if (status != TL_CLI_CONTINUE) return status;
    if (!(status = run_prompt(&r)) && !(status = run_open(&r)) && run_generate(&r)) {
        fprintf(stderr, "tulip: %s\n", r.err);
        status = 1;
    }
    run_close(&r);
    return status;
}
