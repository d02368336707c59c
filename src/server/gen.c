/* Generated tokens -> OpenAI output for one request (see gen.h).
 *
 * Order of the stages, per token: usage counts -> detokenizer (special tokens dropped, UTF-8
 * held until complete) -> stop matcher (a stop string is searched in held+new text; the longest
 * suffix that is a prefix of some stop string is held back, so a stop string split across tokens
 * is still caught and never leaks) -> parser (chat) or plain text (completions) -> deltas. */
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/gen.h"
#include "server/sched.h"

void tl_gen_init(tl_gen *g, const tl_oai_req *r, const tl_tokenizer *tok, int think_end_id,
                 uint64_t id_seed) {
    memset(g, 0, sizeof *g);
    g->chat = r->kind == TL_OAI_CHAT;
    g->tok = tok;
    if (tl_detok_stream_create(tok, r->skip_special ? TL_DETOK_SKIP_SPECIAL : 0, &g->dt))
        TL_ASSERT(!"detok stream");
    g->include_stop = r->include_stop;
    g->parallel_tool_calls = r->parallel_tool_calls;
    g->think_end_id = g->chat && r->enable_thinking ? think_end_id : -1;
    g->in_think = g->think_end_id >= 0;
    if (g->chat) {
        tl_parse_opts o;
        tl_parse_opts_default(&o);
        o.thinking = r->enable_thinking;
        o.parse_tools = r->n_tools > 0 && r->tool_choice != TL_TOOL_NONE;
        o.tools = r->tools;
        o.id_seed = id_seed;
        g->parser = tl_parser_new(&o);
    }
    g->stop = r->stop;
    g->n_stop = r->n_stop;
    for (int i = 0; i < r->n_stop; i++)
        g->max_stop_len = TL_MAX(g->max_stop_len, strlen(r->stop[i]));
    g->want_logprobs = r->logprobs;
    g->deltas = json_array();
}

void tl_gen_echo(tl_gen *g, const char *prompt) {
    size_t n = strlen(prompt);
    xbuf_append(&g->text, prompt, n);
    json_t *d = json_object();
    json_object_set_new(d, "text", json_stringn(prompt, n));
    json_array_append_new(g->deltas, d);
    g->lp_offset = (int)n;
}

void tl_gen_free(tl_gen *g) {
    tl_detok_stream_free(g->dt);
    if (g->parser) tl_parser_free(g->parser);
    tl_buf_free(&g->held);
    free(g->lps);
    tl_buf_free(&g->text);
    json_decref(g->deltas);
    memset(g, 0, sizeof *g);
}

/* ====== Output of text that passed the stop matcher. ====== */

static void add_delta(tl_gen *g, const char *key, const char *s, size_t n) {
    json_t *d = json_object();
    json_object_set_new(d, key, json_stringn(s, n));
    json_array_append_new(g->deltas, d);
}

static void emit_events(tl_gen *g, const tl_parse_event *ev, int n) {
    for (int i = 0; i < n; i++) {
        const tl_parse_event *e = &ev[i];
        if (e->kind == TL_PARSE_REASONING) {
            add_delta(g, "reasoning_content", e->text, e->len);
        } else if (e->kind == TL_PARSE_CONTENT) {
            add_delta(g, "content", e->text, e->len);
        } else if (e->kind == TL_PARSE_TOOL_START || e->kind == TL_PARSE_TOOL_ARGS) {
            if (!g->parallel_tool_calls && e->index > 0) continue;
            json_t *fn = json_object(), *tc = json_object();
            json_object_set_new(tc, "index", json_integer(e->index));
            if (e->kind == TL_PARSE_TOOL_START) {
                g->n_calls++;
                json_object_set_new(tc, "id", json_string(e->id));
                json_object_set_new(tc, "type", json_string("function"));
                json_object_set_new(fn, "name", json_stringn(e->text, e->len));
                json_object_set_new(fn, "arguments", json_string(""));
            } else {
                json_object_set_new(fn, "arguments", json_stringn(e->text, e->len));
            }
            json_object_set_new(tc, "function", fn);
            json_t *arr = json_array(), *d = json_object();
            json_array_append_new(arr, tc);
            json_object_set_new(d, "tool_calls", arr);
            json_array_append_new(g->deltas, d);
        }
    }
}

static void emit_text(tl_gen *g, const char *s, size_t n) {
    if (n == 0) return;
    if (g->chat) {
        const tl_parse_event *ev;
        int k = tl_parser_feed(g->parser, s, n, &ev);
        emit_events(g, ev, k);
        return;
    }
    xbuf_append(&g->text, s, n); /* no error path here: dies like xrealloc */
    add_delta(g, "text", s, n);
}

/* ====== Stop strings. ====== */

/* Longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t partial_stop_len(const tl_gen *g, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t L = strlen(g->stop[i]);
        for (size_t k = TL_MIN(n, L - 1); k > best; k--)
            if (!memcmp(s + n - k, g->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Appends text to the held buffer and emits what can no longer be part of a stop string.
 * Returns 1 when a stop string matched. */
static int stop_filter(tl_gen *g, const char *s, size_t n) {
    if (n == 0) return 0;
    if (g->n_stop == 0) {
        emit_text(g, s, n);
        return 0;
    }
    tl_buf *h = &g->held;
    xbuf_append(h, s, n);
    /* The earliest match among all stop strings wins. */
    size_t cut = (size_t)-1;
    for (int i = 0; i < g->n_stop; i++) {
        const char *p = memmem(h->p, h->n, g->stop[i], strlen(g->stop[i]));
        if (p && (size_t)(p - h->p) < cut) cut = (size_t)(p - h->p), g->stop_index = i;
    }
    if (cut != (size_t)-1) {
        emit_text(g, h->p, cut + (g->include_stop ? strlen(g->stop[g->stop_index]) : 0));
        tl_buf_truncate(h, 0);
        g->stopped = 1;
        return 1;
    }
    size_t keep = partial_stop_len(g, h->p, h->n);
    emit_text(g, h->p, h->n - keep);
    memmove(h->p, h->p + h->n - keep, keep);
    tl_buf_truncate(h, keep);
    return 0;
}

/* ====== Public. ====== */

static void add_lp(tl_gen *g, const tl_sample_out *ev) {
    if (g->n_lps == g->cap_lps) {
        g->cap_lps = g->cap_lps ? g->cap_lps * 2 : 16;
        g->lps = xrealloc(g->lps, (size_t)g->cap_lps * sizeof *g->lps);
    }
    tl_oai_lp *l = &g->lps[g->n_lps++];
    size_t len = 0;
    const char *s = tl_token_str(g->tok, ev->token, &len);
    l->text_len = (int)TL_MIN(len, sizeof l->text);
    if (s) memcpy(l->text, s, (size_t)l->text_len);
    l->logprob = ev->logprob;
    l->n_top = TL_MIN(ev->n_top, TL_MAX_LOGPROBS);
    for (int i = 0; i < l->n_top; i++) {
        s = tl_token_str(g->tok, ev->top_ids[i], &len);
        l->top_len[i] = s ? (int)TL_MIN(len, sizeof l->top_text[i]) : 0;
        if (s) memcpy(l->top_text[i], s, (size_t)l->top_len[i]);
        l->top_logprob[i] = ev->top_logprobs[i];
    }
}

int tl_gen_push(tl_gen *g, const tl_sample_out *ev) {
    if (g->stopped) return 1;
    g->n_completion++;
    if (g->in_think) {
        g->n_reasoning++;
        if (ev->token == g->think_end_id) g->in_think = 0;
    }
    if (g->want_logprobs) add_lp(g, ev);
    const char *s;
    size_t n;
    if (tl_detok_stream_push(g->dt, ev->token, &s, &n)) return 0; /* id outside the vocabulary */
    return stop_filter(g, s, n);
}

void tl_gen_end(tl_gen *g) {
    if (!g->stopped) {
        const char *s;
        size_t n;
        if (!tl_detok_stream_flush(g->dt, &s, &n) && n) stop_filter(g, s, n);
        if (!g->stopped && g->held.n) emit_text(g, g->held.p, g->held.n);
        tl_buf_truncate(&g->held, 0);
    }
    if (g->chat) {
        const tl_parse_event *ev;
        int k = tl_parser_finish(g->parser, &ev);
        emit_events(g, ev, k);
    }
}

json_t *tl_gen_take_deltas(tl_gen *g) {
    json_t *d = g->deltas;
    g->deltas = json_array();
    return d;
}

json_t *tl_gen_take_logprobs(tl_gen *g) {
    if (!g->want_logprobs) return NULL;
    json_t *j = g->chat ? tl_oai_chat_logprobs_json(g->lps, g->n_lps)
                        : tl_oai_completion_logprobs_json(g->lps, g->n_lps, g->lp_offset);
    for (int i = 0; i < g->n_lps; i++) g->lp_offset += g->lps[i].text_len;
    g->n_lps = 0;
    return j;
}

const char *tl_gen_finish_reason(const tl_gen *g, int fin) {
    if (g->stopped) return "stop";
    if (fin == TL_FIN_LENGTH) return "length";
    return g->n_calls ? "tool_calls" : "stop";
}

json_t *tl_gen_message(const tl_gen *g) {
    tl_parse_result r = *tl_parser_result(g->parser);
    if (!g->parallel_tool_calls && r.n_calls > 1) r.n_calls = 1;
    return tl_parse_result_message(&r);
}
