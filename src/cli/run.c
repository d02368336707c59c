/* tulip run: generate from one prompt. Prompt as token ids (--prompt-ids 1,2,3) prints ids;
 * as text (-p) it is rendered through the chat template, tokenized, and the answer streamed as
 * text. Options mirror the server's sampling fields. */
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

static void run_usage(void) {
    fprintf(
        stderr,
        "usage: tulip run --model DIR (--prompt-ids 1,2,3 | -p TEXT) [options]\n"
        "  -n N                  tokens to generate (default 64)\n"
        "  --temperature T       0 = greedy (default 0 for --prompt-ids)\n"
        "  --top-k K --top-p P --min-p P --seed S\n"
        "  --presence-penalty X --frequency-penalty X --repetition-penalty X\n"
        "  --print-ids           print generated ids on one line, separated by spaces\n"
        "  -p TEXT               a user message: rendered with the chat template, answer streamed\n"
        "  --system TEXT         a system message before it   --no-thinking   --raw (no template)\n"
        "  --tokenizer PATH      tokenizer.json (default: the one in the model directory)\n"
        "  --ignore-eos          do not stop at the model's stop tokens\n"
        "  --dump-logits FILE    write the f32 logits of every step (prefill last + each decode)\n"
        "  --backend cpu|cuda|auto   --threads N   --ctx N   --allow-test-shape\n");
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

int cmd_run(int argc, char **argv) {
    tl_engine_params ep = {0};
    tl_sample_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    const char *ids_arg = NULL, *text = NULL, *dump = NULL, *system = NULL, *tok_path = NULL;
    int n_gen = 64, print_ids = 0, ignore_eos = 0, no_think = 0, raw = 0, temp_set = 0;
    ep.backend = TL_BACKEND_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                                                      \
    do {                                                                                           \
        if (!v) {                                                                                  \
            fprintf(stderr, "tulip run: %s needs a value\n", a);                                   \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
            NEEDV;
            ep.model_path = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            NEEDV;
            ids_arg = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEEDV;
            text = v;
        } else if (!strcmp(a, "-n")) {
            NEEDV;
            n_gen = atoi(v);
        } else if (!strcmp(a, "--temperature")) {
            NEEDV;
            sp.temperature = strtof(v, NULL);
            temp_set = 1;
        } else if (!strcmp(a, "--system")) {
            NEEDV;
            system = v;
        } else if (!strcmp(a, "--tokenizer")) {
            NEEDV;
            tok_path = v;
        } else if (!strcmp(a, "--no-thinking"))
            no_think = 1;
        else if (!strcmp(a, "--raw"))
            raw = 1;
        else if (!strcmp(a, "--top-k")) {
            NEEDV;
            sp.top_k = atoi(v);
        } else if (!strcmp(a, "--top-p")) {
            NEEDV;
            sp.top_p = strtof(v, NULL);
        } else if (!strcmp(a, "--min-p")) {
            NEEDV;
            sp.min_p = strtof(v, NULL);
        } else if (!strcmp(a, "--seed")) {
            NEEDV;
            sp.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--presence-penalty")) {
            NEEDV;
            sp.presence_penalty = strtof(v, NULL);
        } else if (!strcmp(a, "--frequency-penalty")) {
            NEEDV;
            sp.frequency_penalty = strtof(v, NULL);
        } else if (!strcmp(a, "--repetition-penalty")) {
            NEEDV;
            sp.repetition_penalty = strtof(v, NULL);
        } else if (!strcmp(a, "--dump-logits")) {
            NEEDV;
            dump = v;
        } else if (!strcmp(a, "--threads")) {
            NEEDV;
            ep.n_threads = atoi(v);
        } else if (!strcmp(a, "--ctx")) {
            NEEDV;
            ep.max_ctx = atoi(v);
        } else if (!strcmp(a, "--backend")) {
            NEEDV;
            if (!strcmp(v, "cpu"))
                ep.backend = TL_BACKEND_CPU;
            else if (!strcmp(v, "cuda"))
                ep.backend = TL_BACKEND_CUDA;
            else if (!strcmp(v, "auto"))
                ep.backend = TL_BACKEND_AUTO;
            else {
                fprintf(stderr, "tulip run: --backend must be cpu, cuda or auto\n");
                return 2;
            }
        } else if (!strcmp(a, "--print-ids"))
            print_ids = 1;
        else if (!strcmp(a, "--ignore-eos"))
            ignore_eos = 1;
        else if (!strcmp(a, "--allow-test-shape"))
            ep.allow_test_shape = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage();
            return 0;
        } else {
            fprintf(stderr, "tulip run: unknown option '%s'\n", a);
            run_usage();
            return 2;
        }
#undef NEEDV
    }
    if (!ep.model_path || (!ids_arg && !text) || n_gen < 0) {
        run_usage();
        return 2;
    }
    int32_t *prompt = NULL;
    int n_prompt = 0;
    tl_tokenizer *tok = NULL;
    char err[1024];
    if (text) {
        char path[4096];
        if (!tok_path) {
            snprintf(path, sizeof path, "%s/tokenizer.json", ep.model_path);
            tok_path = path;
        }
        if (tl_tokenizer_load(tok_path, &tok, err, sizeof err)) {
            fprintf(stderr, "tulip: %s\n", err);
            return 1;
        }
        char *rendered = NULL;
        size_t rlen = 0;
        if (raw) {
            rendered = xstrdup(text);
            rlen = strlen(text);
        } else {
            json_t *msgs = json_array();
            if (system)
                json_array_append_new(msgs,
                                      json_pack("{s:s,s:s}", "role", "system", "content", system));
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text));
            tl_chat_opts co;
            tl_chat_opts_default(&co);
            co.enable_thinking = !no_think;
            int rc = tl_chat_render(msgs, NULL, &co, &rendered, &rlen, err, sizeof err);
            json_decref(msgs);
            if (rc) {
                fprintf(stderr, "tulip: chat template: %s\n", err);
                tl_tokenizer_free(tok);
                return 1;
            }
        }
        tl_tok_ids ids = {0};
        int rc = tl_tokenize(tok, rendered, rlen, 0, &ids);
        free(rendered);
        if (rc < 0 || ids.n == 0) {
            fprintf(stderr, "tulip: tokenizing the prompt failed\n");
            tl_tok_ids_free(&ids);
            tl_tokenizer_free(tok);
            return 1;
        }
        prompt = ids.ids;
        n_prompt = (int)ids.n;
        if (!temp_set) { /* the model's generation config defaults (MODEL.md §6) */
            sp.temperature = no_think ? 0.7f : 1.0f;
            sp.top_p = no_think ? 0.8f : 0.95f;
            sp.top_k = 20;
        }
    } else if (parse_ids(ids_arg, &prompt, &n_prompt)) {
        fprintf(stderr, "tulip run: --prompt-ids must be a comma-separated list of token ids\n");
        return 2;
    }
    ep.max_seqs = 1;
    if (!ep.max_ctx) ep.max_ctx = n_prompt + n_gen + 1;
    tl_engine *e;
    if (tl_engine_open(&e, &ep, err, sizeof err)) {
        fprintf(stderr, "tulip: %s\n", err);
        free(prompt);
        tl_tokenizer_free(tok);
        return 1;
    }
    tl_detok_stream *ds = NULL;
    if (tok && tl_detok_stream_create(tok, TL_DETOK_SKIP_SPECIAL, &ds)) {
        fprintf(stderr, "tulip: out of memory\n");
        tl_engine_close(e);
        free(prompt);
        tl_tokenizer_free(tok);
        return 1;
    }
    const tl_config *cfg = tl_engine_config(e);
    FILE *df = NULL;
    float *logits = NULL;
    if (dump) {
        df = fopen(dump, "wb");
        if (!df) {
            fprintf(stderr, "tulip run: cannot write %s: %s\n", dump, strerror(errno));
            tl_engine_close(e);
            free(prompt);
            return 1;
        }
        logits = xmalloc(sizeof(float) * cfg->n_vocab);
    }
    tl_session *s;
    int rc = tl_session_open(e, &s, err, sizeof err);
    int status = 0;
    const int32_t *feed = prompt;
    int n_feed = n_prompt;
    int32_t next;
    for (int step = 0; !rc && step < n_gen; step++) {
        tl_sample_out out;
        tl_batch_entry be = {s, feed, n_feed, &sp, &out, logits};
        rc = tl_engine_step(e, &be, 1, err, sizeof err);
        if (rc) break;
        if (df && fwrite(logits, sizeof(float), cfg->n_vocab, df) != (size_t)cfg->n_vocab) {
            snprintf(err, sizeof err, "write error on %s", dump);
            rc = -1;
            break;
        }
        next = out.token;
        if (print_ids) printf(step ? " %d" : "%d", next);
        if (ds) {
            const char *piece;
            size_t plen;
            if (tl_detok_stream_push(ds, next, &piece, &plen) == 0 && plen)
                fwrite(piece, 1, plen, stdout);
        }
        fflush(stdout);
        int stop = 0;
        for (int k = 0; k < cfg->n_eos && !ignore_eos; k++) stop |= next == cfg->eos_ids[k];
        if (stop) break;
        feed = &next;
        n_feed = 1;
    }
    if (ds) {
        const char *piece;
        size_t plen;
        if (tl_detok_stream_flush(ds, &piece, &plen) == 0 && plen) fwrite(piece, 1, plen, stdout);
        tl_detok_stream_free(ds);
    }
    if (print_ids || ds) printf("\n");
    if (rc) {
        fprintf(stderr, "tulip: %s\n", err);
        status = 1;
    }
    if (df) fclose(df);
    free(logits);
    tl_session_close(s);
    tl_engine_close(e);
    free(prompt);
    tl_tokenizer_free(tok);
    return status;
}
