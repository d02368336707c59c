/* tulip chat: interactive multi-turn chat on one engine session, through the same template,
 * tokenizer and output parser as the server. Each turn re-renders the whole conversation (the
 * template drops old reasoning, so the prompt is not a pure extension of the last one) and
 * prefills it into the reset session; the answer streams as it is generated, reasoning dimmed
 * (or hidden with --hide-thinking), tool calls are not offered. Commands: /reset, /exit. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"
#include "common/util.h"
#include "model/config.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat.h"
#include "tokenizer/parse.h"
#include "tulip.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) { interrupted = 1; }

static void chat_usage(void) {
    fprintf(stderr,
            "usage: tulip chat --model DIR [options]\n"
            "  --tokenizer PATH       tokenizer.json (default: the one in the model directory)\n"
            "  --system TEXT          system message\n"
            "  --no-thinking          enable_thinking=false (answer directly)\n"
            "  --hide-thinking        think, but do not print the reasoning\n"
            "  -n N                   max tokens per answer (default: up to the context)\n"
            "  --temperature T --top-k K --top-p P --min-p P --presence-penalty X --seed S\n"
            "                         (default: the model card's values for the mode)\n"
            "  --ctx N                context tokens (default 8192)\n"
            "  --backend cpu|cuda|auto   --threads N   --allow-test-shape\n"
            "In the chat: /reset starts over, /exit (or end of input) quits; Ctrl-C stops an "
            "answer.\n");
}

typedef struct chat_state {
    tl_engine *eng;
    tl_session *sess;
    tl_tokenizer *tok;
    json_t *msgs;
    tl_chat_opts co;
    tl_sample_params sp;
    int max_tokens, hide_thinking, color;
} chat_state;

static void print_events(const chat_state *c, const tl_parse_event *ev, int n, int *in_reason) {
    for (int i = 0; i < n; i++) {
        if (ev[i].kind == TL_PARSE_REASONING) {
            if (c->hide_thinking) continue;
            if (!*in_reason && c->color) fputs("\x1b[2m", stdout);
            *in_reason = 1;
            fwrite(ev[i].text, 1, ev[i].len, stdout);
        } else if (ev[i].kind == TL_PARSE_CONTENT) {
            if (*in_reason) {
                if (c->color) fputs("\x1b[0m", stdout);
                fputs("\n", stdout);
                *in_reason = 0;
            }
            fwrite(ev[i].text, 1, ev[i].len, stdout);
        }
    }
    fflush(stdout);
}

/* One assistant turn: render, prefill, sample until a stop token or the limit. Appends the
 * answer (content + reasoning_content) to the history. Returns 0 or a negative status. */
static int chat_turn(chat_state *c) {
    char *text = NULL, err[512];
    size_t len = 0;
    if (tl_chat_render(c->msgs, NULL, &c->co, &text, &len, err, sizeof err)) {
        fprintf(stderr, "tulip chat: template: %s\n", err);
        return TL_ERR_INVALID;
    }
    tl_tok_ids ids = {0};
    int rc = tl_tokenize(c->tok, text, len, 0, &ids);
    free(text);
    int max_ctx = tl_engine_max_ctx(c->eng);
    if (rc < 0 || ids.n == 0 || (int)ids.n >= max_ctx) {
        fprintf(stderr,
                "tulip chat: the conversation (%zu tokens) does not fit the context (%d); "
                "/reset to start over\n",
                ids.n, max_ctx);
        tl_tok_ids_free(&ids);
        return TL_ERR_CONTEXT_FULL;
    }
    const tl_config *cfg = tl_engine_config(c->eng);
    tl_session_reset(c->sess);
    tl_parse_opts po;
    tl_parse_opts_default(&po);
    po.thinking = c->co.enable_thinking;
    po.parse_tools = 0;
    tl_parser *p = tl_parser_new(&po);
    tl_detok_stream *ds;
    if (tl_detok_stream_create(c->tok, TL_DETOK_SKIP_SPECIAL, &ds)) TL_ASSERT(!"detok stream");
    tl_sample_out out;
    tl_batch_entry be = {
        .sess = c->sess, .tokens = ids.ids, .n_tok = (int)ids.n, .sample = &c->sp, .out = &out};
    int in_reason = 0, n_gen = 0;
    const tl_parse_event *ev;
    interrupted = 0;
    for (;;) {
        rc = tl_engine_step(c->eng, &be, 1, err, sizeof err);
        if (rc) {
            fprintf(stderr, "\ntulip chat: %s\n", err);
            break;
        }
        n_gen++;
        int eos = 0;
        for (int i = 0; i < cfg->n_eos; i++) eos |= out.token == cfg->eos_ids[i];
        if (eos) break;
        const char *piece;
        size_t plen;
        if (!tl_detok_stream_push(ds, out.token, &piece, &plen) && plen) {
            int k = tl_parser_feed(p, piece, plen, &ev);
            print_events(c, ev, k, &in_reason);
        }
        if (interrupted || (c->max_tokens > 0 && n_gen >= c->max_tokens) ||
            tl_session_n_past(c->sess) + 1 >= max_ctx)
            break;
        be.tokens = &out.token;
        be.n_tok = 1;
    }
    const char *piece;
    size_t plen;
    if (!tl_detok_stream_flush(ds, &piece, &plen) && plen) {
        int k = tl_parser_feed(p, piece, plen, &ev);
        print_events(c, ev, k, &in_reason);
    }
    int k = tl_parser_finish(p, &ev);
    print_events(c, ev, k, &in_reason);
    if (in_reason && c->color) fputs("\x1b[0m", stdout);
    fputs("\n", stdout);
    fflush(stdout);
    const tl_parse_result *r = tl_parser_result(p);
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", json_stringn(r->content, r->content_len));
    if (r->reasoning_len)
        json_object_set_new(m, "reasoning_content", json_stringn(r->reasoning, r->reasoning_len));
    json_array_append_new(c->msgs, m);
    tl_parser_free(p);
    tl_detok_stream_free(ds);
    tl_tok_ids_free(&ids);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    tl_engine_params ep = {.backend = TL_BACKEND_AUTO, .max_seqs = 1, .max_ctx = 8192};
    chat_state c = {0};
    const char *tok_path = NULL, *system = NULL;
    int no_think = 0, t_set = 0, k_set = 0, p_set = 0, pp_set = 0;
    float temp = 0, top_p = 0, pres = 0;
    int top_k = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_usage();
            return 0;
        } else if (OPT("--model") || OPT("-m"))
            ep.model_path = v;
        else if (OPT("--tokenizer"))
            tok_path = v;
        else if (OPT("--system"))
            system = v;
        else if (OPT("-n"))
            c.max_tokens = atoi(v);
        else if (OPT("--temperature"))
            temp = strtof(v, NULL), t_set = 1;
        else if (OPT("--top-k"))
            top_k = atoi(v), k_set = 1;
        else if (OPT("--top-p"))
            top_p = strtof(v, NULL), p_set = 1;
        else if (OPT("--min-p"))
            c.sp.min_p = strtof(v, NULL);
        else if (OPT("--presence-penalty"))
            pres = strtof(v, NULL), pp_set = 1;
        else if (OPT("--seed"))
            c.sp.seed = strtoull(v, NULL, 10);
        else if (OPT("--ctx"))
            ep.max_ctx = atoi(v);
        else if (OPT("--threads"))
            ep.n_threads = atoi(v);
        else if (OPT("--backend")) {
            if (!strcmp(v, "cpu"))
                ep.backend = TL_BACKEND_CPU;
            else if (!strcmp(v, "cuda"))
                ep.backend = TL_BACKEND_CUDA;
            else
                ep.backend = TL_BACKEND_AUTO;
        } else if (!strcmp(a, "--no-thinking"))
            no_think = 1;
        else if (!strcmp(a, "--hide-thinking"))
            c.hide_thinking = 1;
        else if (!strcmp(a, "--allow-test-shape"))
            ep.allow_test_shape = 1;
        else {
            fprintf(stderr, "tulip chat: unknown or incomplete option '%s'\n\n", a);
            chat_usage();
            return 2;
        }
#undef OPT
    }
    if (!ep.model_path) {
        chat_usage();
        return 2;
    }
    /* MODEL.md section 6 defaults for the mode, each overridable. */
    c.sp.temperature = t_set ? temp : no_think ? 0.7f : 1.0f;
    c.sp.top_p = p_set ? top_p : no_think ? 0.8f : 0.95f;
    c.sp.top_k = k_set ? top_k : 20;
    c.sp.presence_penalty = pp_set ? pres : 1.5f;
    c.sp.repetition_penalty = 1.0f;
    if (!c.sp.seed) c.sp.seed = (uint64_t)tl_time_s() * 1000003u;
    c.color = isatty(1);

    char err[1024];
    char path[4096];
    if (!tok_path) {
        snprintf(path, sizeof path, "%s/tokenizer.json", ep.model_path);
        tok_path = path;
    }
    if (tl_tokenizer_load(tok_path, &c.tok, err, sizeof err)) {
        fprintf(stderr, "tulip chat: %s\n", err);
        return 1;
    }
    if (tl_engine_open(&c.eng, &ep, err, sizeof err)) {
        fprintf(stderr, "tulip chat: %s\n", err);
        tl_tokenizer_free(c.tok);
        return 1;
    }
    if (tl_session_open(c.eng, &c.sess, err, sizeof err)) {
        fprintf(stderr, "tulip chat: %s\n", err);
        tl_engine_close(c.eng);
        tl_tokenizer_free(c.tok);
        return 1;
    }
    tl_chat_opts_default(&c.co);
    c.co.enable_thinking = !no_think;
    c.msgs = json_array();
    if (system)
        json_array_append_new(c.msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);

    int interactive = isatty(0);
    if (interactive) fprintf(stderr, "tulip chat: /reset to start over, /exit or Ctrl-D to quit\n");
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (interactive) {
            fputs(c.color ? "\x1b[1m> \x1b[0m" : "> ", stdout);
            fflush(stdout);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            size_t keep = system ? 1 : 0;
            while (json_array_size(c.msgs) > keep) json_array_remove(c.msgs, keep);
            continue;
        }
        json_t *um = json_pack("{s:s,s:s}", "role", "user", "content", line);
        if (!um) {
            fprintf(stderr, "tulip chat: the input is not valid UTF-8\n");
            continue;
        }
        json_array_append_new(c.msgs, um);
        if (chat_turn(&c) == TL_ERR_CONTEXT_FULL)
            json_array_remove(c.msgs, json_array_size(c.msgs) - 1);
    }
    free(line);
    json_decref(c.msgs);
    tl_session_close(c.sess);
    tl_engine_close(c.eng);
    tl_tokenizer_free(c.tok);
    return 0;
}
