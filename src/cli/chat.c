/* tulip chat: interactive multi-turn chat on one engine session, through the same template,
 * tokenizer and output parser as the server. Each turn re-renders the whole conversation (the
 * template drops old reasoning, so the prompt is not a pure extension of the last one) and
 * prefills it into the reset session, from the prefix cache where the previous turn left a
 * snapshot at the end of its last message (docs/architecture.md §4.1: everything before the
 * generation prompt renders the same next turn); the answer streams as it is generated, reasoning
 * dimmed (or hidden with --hide-thinking), tool calls are not offered. Commands: /reset, /exit. The
 * phases: parse options -> open (tokenizer, engine, session) -> read lines, one turn each (prompt
 * -> generate -> record the answer) -> close. */
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

typedef struct chat_state {
    tl_engine_params ep;
    const char *tok_path, *system;
    int no_think, backend;
    tl_engine *eng;
    tl_session *sess;
    tl_tokenizer *tok;
    json_t *msgs;
    tl_chat_opts co;
    tl_sample_params sp;
    int max_tokens, hide_thinking, color;
    int no_cache;         /* --no-prefix-cache */
    int snap_at;          /* this turn's prompt without its generation prompt (tokens) */
    long long n_reused;   /* prompt tokens restored from the prefix cache, all turns */
    long long n_prompted; /* prompt tokens, all turns */
} chat_state;

/* Sampling not given on the command line: the model card's values for the mode
 * (docs/model.md §6); a seed from the clock unless one was given. */
static void chat_sample_defaults(chat_state *c, const tl_cli_cmd *cmd) {
    tl_sample_params *sp = &c->sp;
    if (!tl_cli_given(cmd, &sp->temperature)) sp->temperature = c->no_think ? 0.7f : 1.0f;
    if (!tl_cli_given(cmd, &sp->top_p)) sp->top_p = c->no_think ? 0.8f : 0.95f;
    if (!tl_cli_given(cmd, &sp->top_k)) sp->top_k = 20;
    if (!tl_cli_given(cmd, &sp->presence_penalty)) sp->presence_penalty = 1.5f;
    sp->repetition_penalty = 1.0f;
    if (!sp->seed) sp->seed = (uint64_t)tl_time_s() * 1000003u;
}

/* Options -> c. Returns TL_CLI_CONTINUE or the exit status. */
static int chat_parse(chat_state *c, int argc, char **argv) {
    tl_opt opts[] = {
        TL_CLI_OPT_MODEL(&c->ep.model_path, 'm'),
        TL_CLI_OPT_TOKENIZER(&c->tok_path),
        TL_OPT_STR("system", 0, &c->system, "TEXT", "system message"),
        TL_OPT_FLAG("no-thinking", 0, &c->no_think, "enable_thinking=false (answer directly)"),
        TL_OPT_FLAG("hide-thinking", 0, &c->hide_thinking, "think, but do not print the reasoning"),
        TL_OPT_INT(NULL, 'n', &c->max_tokens, "N", 0, TL_OPT_NOMAX,
                   "max tokens per answer (default 0: up to the context)"),
        TL_CLI_OPT_TEMPERATURE(&c->sp.temperature),
        TL_CLI_OPT_TOP_K(&c->sp.top_k),
        TL_CLI_OPT_TOP_P(&c->sp.top_p),
        TL_CLI_OPT_MIN_P(&c->sp.min_p),
        TL_CLI_OPT_PRESENCE(&c->sp.presence_penalty),
        TL_OPT_U64("seed", 0, &c->sp.seed, "S", "sampling seed (default, or 0: from the clock)"),
        TL_OPT_INT("ctx", 0, &c->ep.max_ctx, "N", 0, TL_OPT_NOMAX, "context tokens (default 8192)"),
        TL_CLI_OPT_BACKEND(&c->backend),
        TL_CLI_OPT_THREADS(&c->ep.n_threads),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&c->ep.allow_test_shape),
        TL_OPT_FLAG("no-prefix-cache", 0, &c->no_cache,
                    "prefill every turn whole (default: reuse the previous turns)"),
    };
    tl_cli_cmd cmd = {
        .name = "chat",
        .id = TL_CMD_CHAT,
        .synopsis = "--model DIR [options]",
        .about = "Interactive chat through the server's template, tokenizer and output parser.\n"
                 "Sampling not given: the model card's values for the mode (temperature 1.0,\n"
                 "top-p 0.95, top-k 20, presence penalty 1.5; 0.7 and 0.8 with --no-thinking).\n",
        .notes = "In the chat: /reset starts over, /exit (or end of input) quits; Ctrl-C stops an "
                 "answer.\n",
        .opts = opts,
        .n_opts = TL_CLI_NOPTS(opts),
    };
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!c->ep.model_path) return tl_cli_usage_error(&cmd, "--model DIR is required");
    c->ep.backend = (tl_backend_kind)c->backend;
    c->ep.prefix_cache_bytes = c->no_cache ? -1 : 0;
    chat_sample_defaults(c, &cmd);
    return TL_CLI_CONTINUE;
}

/* Tokenizer, engine, one session, the history (with the system message). 0 or exit status. */
static int chat_open(chat_state *c) {
    char err[1024], path[4096];
    const char *tok_path = c->tok_path;
    if (!tok_path) {
        snprintf(path, sizeof path, "%s/tokenizer.json", c->ep.model_path);
        tok_path = path;
    }
    if (tl_tokenizer_load(tok_path, &c->tok, err, sizeof err) ||
        tl_engine_open(&c->eng, &c->ep, err, sizeof err) ||
        tl_session_open(c->eng, &c->sess, err, sizeof err)) {
        fprintf(stderr, "tulip chat: %s\n", err);
        return 1;
    }
    tl_chat_opts_default(&c->co);
    c->co.enable_thinking = !c->no_think;
    c->msgs = json_array();
    if (c->system)
        json_array_append_new(c->msgs,
                              json_pack("{s:s,s:s}", "role", "system", "content", c->system));
    c->color = isatty(1);
    return 0;
}

static void chat_close(chat_state *c) {
    json_decref(c->msgs);
    if (c->sess) tl_session_close(c->sess);
    if (c->eng) tl_engine_close(c->eng);
    tl_tokenizer_free(c->tok);
}

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

/* Where this turn's prompt stops being the generation prompt, in tokens (0: not a clean token
 * boundary): the point the next turn shares, snapshotted (docs/architecture.md §4.1). */
static int chat_snap_point(chat_state *c, const char *text, size_t len, const tl_tok_ids *ids) {
    if (!tl_engine_prefix_enabled(c->eng)) return 0;
    return tl_chat_snap_point(c->tok, &c->co, text, len, ids->ids, ids->n);
}

/* The conversation rendered and tokenized into ids; TL_ERR_CONTEXT_FULL when it does not fit. */
static int chat_prompt(chat_state *c, tl_tok_ids *ids) {
    char *text = NULL, err[512];
    size_t len = 0;
    if (tl_chat_render(c->msgs, NULL, &c->co, &text, &len, err, sizeof err)) {
        fprintf(stderr, "tulip chat: template: %s\n", err);
        return TL_ERR_INVALID;
    }
    int rc = tl_tokenize(c->tok, text, len, 0, ids);
    c->snap_at = rc < 0 ? 0 : chat_snap_point(c, text, len, ids);
    free(text);
    int max_ctx = tl_engine_max_ctx(c->eng);
    if (rc < 0 || ids->n == 0 || (int)ids->n >= max_ctx) {
        fprintf(stderr,
                "tulip chat: the conversation (%zu tokens) does not fit the context (%d); "
                "/reset to start over\n",
                ids->n, max_ctx);
        return TL_ERR_CONTEXT_FULL;
    }
    return 0;
}

/* One streamed turn's output state: detokenizer, parser, whether reasoning is being printed. */
typedef struct chat_out {
    tl_detok_stream *ds;
    tl_parser *p;
    int in_reason;
} chat_out;

static void chat_out_text(const chat_state *c, chat_out *o, const char *piece, size_t plen) {
    const tl_parse_event *ev;
    int k = tl_parser_feed(o->p, piece, plen, &ev);
    print_events(c, ev, k, &o->in_reason);
}

/* The prompt's start from the prefix cache, and its part up to the snapshot point prefilled and
 * snapshotted. Returns the tokens the session now holds, or a negative status. */
static int chat_prefix(chat_state *c, const tl_tok_ids *ids) {
    char err[512];
    int n = (int)ids->n;
    int got = tl_session_prefix_load(c->sess, NULL, ids->ids, n, n - 1, err, sizeof err);
    if (got < 0) {
        fprintf(stderr, "tulip chat: prefix cache: %s\n", err);
        got = tl_session_reset(c->sess);
        if (got < 0) return got;
    }
    c->n_reused += got;
    c->n_prompted += n;
    if (c->snap_at > got) {
        tl_batch_entry pre = {.sess = c->sess, .tokens = ids->ids + got, .n_tok = c->snap_at - got};
        int rc = tl_engine_step(c->eng, &pre, 1, err, sizeof err);
        if (rc) {
            fprintf(stderr, "\ntulip chat: %s\n", err);
            return rc;
        }
        got = c->snap_at;
        if (tl_session_prefix_save(c->sess, NULL, err, sizeof err) < 0)
            fprintf(stderr, "tulip chat: prefix cache: %s\n", err);
    }
    return got;
}

/* Prefill the prompt, then sample until a stop token, -n, the context or Ctrl-C. */
static int chat_generate(chat_state *c, const tl_tok_ids *ids, chat_out *o) {
    const tl_config *cfg = tl_engine_config(c->eng);
    int max_ctx = tl_engine_max_ctx(c->eng), n_gen = 0, rc;
    char err[512];
    tl_sample_out out;
    int start = chat_prefix(c, ids);
    if (start < 0) return start;
    tl_batch_entry be = {.sess = c->sess,
                         .tokens = ids->ids + start,
                         .n_tok = (int)ids->n - start,
                         .sample = &c->sp,
                         .out = &out};
    interrupted = 0;
    for (;;) {
        if ((rc = tl_engine_step(c->eng, &be, 1, err, sizeof err))) {
            fprintf(stderr, "\ntulip chat: %s\n", err);
            return rc;
        }
        n_gen++;
        int eos = 0;
        for (int i = 0; i < cfg->n_eos; i++) eos |= out.token == cfg->eos_ids[i];
        if (eos) return 0;
        const char *piece;
        size_t plen;
        if (!tl_detok_stream_push(o->ds, out.token, &piece, &plen) && plen)
            chat_out_text(c, o, piece, plen);
        if (interrupted || (c->max_tokens > 0 && n_gen >= c->max_tokens) ||
            tl_session_n_past(c->sess) + 1 >= max_ctx)
            return 0;
        be.tokens = &out.token;
        be.n_tok = 1;
    }
}

/* The rest of the answer on stdout, and the answer (content + reasoning_content) appended to the
 * history. */
static void chat_record(chat_state *c, chat_out *o) {
    const char *piece;
    size_t plen;
    if (!tl_detok_stream_flush(o->ds, &piece, &plen) && plen) chat_out_text(c, o, piece, plen);
    const tl_parse_event *ev;
    int k = tl_parser_finish(o->p, &ev);
    print_events(c, ev, k, &o->in_reason);
    if (o->in_reason && c->color) fputs("\x1b[0m", stdout);
    fputs("\n", stdout);
    fflush(stdout);
    const tl_parse_result *r = tl_parser_result(o->p);
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", json_stringn(r->content, r->content_len));
    if (r->reasoning_len)
        json_object_set_new(m, "reasoning_content", json_stringn(r->reasoning, r->reasoning_len));
    json_array_append_new(c->msgs, m);
}

/* One assistant turn: render, prefill, sample until a stop token or the limit. Appends the
 * answer to the history. Returns 0 or a negative status. */
static int chat_turn(chat_state *c) {
    tl_tok_ids ids = {0};
    int rc = chat_prompt(c, &ids);
    if (rc) {
        tl_tok_ids_free(&ids);
        return rc;
    }
    tl_session_reset(c->sess);
    tl_parse_opts po;
    tl_parse_opts_default(&po);
    po.thinking = c->co.enable_thinking;
    po.parse_tools = 0;
    chat_out o = {.p = tl_parser_new(&po)};
    if (tl_detok_stream_create(c->tok, TL_DETOK_SKIP_SPECIAL, &o.ds)) TL_ASSERT(!"detok stream");
    rc = chat_generate(c, &ids, &o);
    chat_record(c, &o);
    tl_parser_free(o.p);
    tl_detok_stream_free(o.ds);
    tl_tok_ids_free(&ids);
    return rc;
}

/* Lines from stdin until /exit or end of input: commands, or a user message and its answer. */
static void chat_loop(chat_state *c) {
    int interactive = isatty(0);
    if (interactive) fprintf(stderr, "tulip chat: /reset to start over, /exit or Ctrl-D to quit\n");
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (interactive) {
            fputs(c->color ? "\x1b[1m> \x1b[0m" : "> ", stdout);
            fflush(stdout);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            size_t keep = c->system ? 1 : 0;
            while (json_array_size(c->msgs) > keep) json_array_remove(c->msgs, keep);
            continue;
        }
        json_t *um = json_pack("{s:s,s:s}", "role", "user", "content", line);
        if (!um) {
            fprintf(stderr, "tulip chat: the input is not valid UTF-8\n");
            continue;
        }
        json_array_append_new(c->msgs, um);
        if (chat_turn(c) == TL_ERR_CONTEXT_FULL)
            json_array_remove(c->msgs, json_array_size(c->msgs) - 1);
    }
    free(line);
}

int cmd_chat(int argc, char **argv) {
    chat_state c = {.ep = {.max_seqs = 1, .max_ctx = 8192}, .backend = TL_BACKEND_AUTO};
    int rc = chat_parse(&c, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    rc = chat_open(&c);
    if (!rc) {
        struct sigaction sa = {.sa_handler = on_sigint};
        sigaction(SIGINT, &sa, NULL);
        chat_loop(&c);
    }
    if (!rc && c.n_reused) /* how much of the prompts the prefix cache saved */
        fprintf(stderr, "tulip chat: prefix cache: %lld of %lld prompt tokens reused\n", c.n_reused,
                c.n_prompted);
    chat_close(&c);
    return rc;
}
