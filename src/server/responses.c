/* POST /v1/responses (see responses.h): the request conversion, the output items and events, and
 * the endpoint (non-streaming and streaming). Runs on the connection threads like api.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/status.h"
#include "common/util.h"
#include "server/gen.h"
#include "server/responses.h"
#include "server/sched.h"
#include "server/sse.h"

#define EV_BATCH 64

/* ====== Request: Responses body -> chat completions body. ====== */

static void fmt_name(char *b, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_name(char *b, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, n, fmt, ap);
    va_end(ap);
}

static int bad_type(tl_oai_error *e, const char *name, const char *what) {
    return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' must be %s", name, what);
}

static int refuse(tl_oai_error *e, const char *name, const char *why) {
    return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name, "'%s' is not supported%s", name, why);
}

/* Text of a content value: a string, or an array of parts whose type is one of the two given
 * (e.g. input_text/output_text). Returns a new JSON string or NULL with e filled. */
static json_t *parts_text(json_t *c, const char *pname, const char *t1, const char *t2,
                          tl_oai_error *e) {
    char name[128];
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) {
        bad_type(e, pname, "a string or an array of content parts");
        return NULL;
    }
    tl_buf b = {0};
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *ty = json_object_get(p, "type"), *tx = json_object_get(p, "text");
        fmt_name(name, sizeof name, "%s[%zu].type", pname, i);
        if (!json_is_object(p) || !json_is_string(ty)) {
            bad_type(e, name, "a string");
            goto fail;
        }
        const char *t = json_string_value(ty);
        if (strcmp(t, t1) && strcmp(t, t2)) {
            tl_oai_fail(e, TL_ERR_UNSUPPORTED, name, "content part type '%s' is not supported (%s)",
                        t, "text only");
            goto fail;
        }
        fmt_name(name, sizeof name, "%s[%zu].text", pname, i);
        if (!json_is_string(tx)) {
            bad_type(e, name, "a string");
            goto fail;
        }
        xbuf_append(&b, json_string_value(tx), json_string_length(tx));
    }
    json_t *out = json_stringn(b.p ? b.p : "", b.n);
    tl_buf_free(&b);
    return out;
fail:
    tl_buf_free(&b);
    return NULL;
}

/* Conversion state: the chat messages so far, and a reasoning item's text waiting for the
 * assistant turn it belongs to. */
typedef struct conv {
    json_t *msgs;
    json_t *reasoning; /* JSON string or NULL */
} conv;

/* The last message if it is the assistant's, else a new assistant message (taking the pending
 * reasoning). */
static json_t *assistant_msg(conv *c, int reuse_last) {
    json_t *last = json_array_get(c->msgs, json_array_size(c->msgs) - 1);
    if (reuse_last && last &&
        !strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return last;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", json_null());
    if (c->reasoning) json_object_set_new(m, "reasoning_content", c->reasoning);
    c->reasoning = NULL;
    json_array_append_new(c->msgs, m);
    return m;
}

/* Checks that item has only the given keys (NULL-terminated) besides "type". */
static int only_keys(json_t *item, const char *pname, const char *const *keys, tl_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(item, k, v) {
        int ok = !strcmp(k, "type");
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) {
            char name[128];
            fmt_name(name, sizeof name, "%s.%s", pname, k);
            if (json_is_null(v)) continue;
            return refuse(e, name, "");
        }
    }
    return 0;
}

static int req_str(json_t *item, const char *pname, const char *key, json_t **out,
                   tl_oai_error *e) {
    char name[128];
    fmt_name(name, sizeof name, "%s.%s", pname, key);
    json_t *v = json_object_get(item, key);
    if (!v || json_is_null(v))
        return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
    if (!json_is_string(v)) return bad_type(e, name, "a string");
    *out = v;
    return 0;
}

static int conv_message(conv *c, json_t *it, const char *pname, tl_oai_error *e) {
    static const char *const keys[] = {"role", "content", "id", "status", "phase", NULL};
    char name[128];
    if (only_keys(it, pname, keys, e)) return e->status;
    json_t *role;
    if (req_str(it, pname, "role", &role, e)) return e->status;
    const char *r = json_string_value(role);
    int asst = !strcmp(r, "assistant");
    if (!asst && strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer")) {
        fmt_name(name, sizeof name, "%s.role", pname);
        return tl_oai_fail(e, TL_ERR_INVALID, name,
                           "unknown role '%s' (expected user, assistant, system or developer)", r);
    }
    fmt_name(name, sizeof name, "%s.content", pname);
    json_t *cv = json_object_get(it, "content");
    if (!cv) return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
    json_t *text = parts_text(cv, name, "input_text", "output_text", e);
    if (!text) return e->status;
    json_t *m, *first = json_array_get(c->msgs, 0);
    if (asst) {
        m = assistant_msg(c, 0);
    } else if (strcmp(r, "user") && json_array_size(c->msgs) == 1 &&
               !strcmp(json_string_value(json_object_get(first, "role")), "system")) {
        /* system/developer right after the instructions (or another one): one system turn */
        tl_buf b = {0};
        json_t *prev = json_object_get(first, "content");
        xbuf_append(&b, json_string_value(prev), json_string_length(prev));
        xbuf_append(&b, "\n\n", 2);
        xbuf_append(&b, json_string_value(text), json_string_length(text));
        json_object_set_new(first, "content", json_stringn(b.p, b.n));
        tl_buf_free(&b);
        json_decref(text);
        return 0;
    } else {
        json_decref(c->reasoning); /* reasoning not followed by an assistant turn: dropped */
        c->reasoning = NULL;
        m = json_object(); /* developer is the system role of this template */
        json_object_set_new(m, "role", json_string(strcmp(r, "user") ? "system" : "user"));
        json_array_append_new(c->msgs, m);
    }
    json_object_set_new(m, "content", text);
    return 0;
}

static int conv_call(conv *c, json_t *it, const char *pname, tl_oai_error *e) {
    static const char *const keys[] = {"call_id", "name", "arguments", "id", "status", NULL};
    json_t *id, *nm, *args;
    if (only_keys(it, pname, keys, e) || req_str(it, pname, "call_id", &id, e) ||
        req_str(it, pname, "name", &nm, e) || req_str(it, pname, "arguments", &args, e))
        return e->status;
    json_t *m = assistant_msg(c, !c->reasoning);
    json_t *tcs = json_object_get(m, "tool_calls");
    if (!tcs) {
        tcs = json_array();
        json_object_set_new(m, "tool_calls", tcs);
    }
    json_t *tc = json_object(), *fn = json_object();
    json_object_set(tc, "id", id);
    json_object_set_new(tc, "type", json_string("function"));
    json_object_set(fn, "name", nm);
    json_object_set(fn, "arguments", args);
    json_object_set_new(tc, "function", fn);
    json_array_append_new(tcs, tc);
    return 0;
}

static int conv_output(conv *c, json_t *it, const char *pname, tl_oai_error *e) {
    static const char *const keys[] = {"call_id", "output", "id", "status", NULL};
    char name[128];
    json_t *id;
    if (only_keys(it, pname, keys, e) || req_str(it, pname, "call_id", &id, e)) return e->status;
    fmt_name(name, sizeof name, "%s.output", pname);
    json_t *ov = json_object_get(it, "output");
    if (!ov) return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
    json_t *text = parts_text(ov, name, "input_text", "output_text", e);
    if (!text) return e->status;
    json_decref(c->reasoning);
    c->reasoning = NULL;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("tool"));
    json_object_set(m, "tool_call_id", id);
    json_object_set_new(m, "content", text);
    json_array_append_new(c->msgs, m);
    return 0;
}

/* A reasoning item: its reasoning_text content, else its summary, goes with the next assistant
 * turn as reasoning_content. encrypted_content is never produced here and is ignored. */
static int conv_reasoning(conv *c, json_t *it, const char *pname, tl_oai_error *e) {
    static const char *const keys[] = {"id",     "summary", "content", "encrypted_content",
                                       "status", NULL};
    char name[128];
    if (only_keys(it, pname, keys, e)) return e->status;
    json_t *ct = json_object_get(it, "content"), *sm = json_object_get(it, "summary");
    int use_content = json_is_array(ct) && json_array_size(ct);
    fmt_name(name, sizeof name, "%s.%s", pname, use_content ? "content" : "summary");
    json_t *text = NULL;
    if (use_content)
        text = parts_text(ct, name, "reasoning_text", "reasoning_text", e);
    else if (sm && !json_is_null(sm))
        text = parts_text(sm, name, "summary_text", "summary_text", e);
    else
        text = json_string("");
    if (!text) return e->status;
    json_decref(c->reasoning);
    c->reasoning = text;
    return 0;
}

static int conv_input(conv *c, json_t *input, tl_oai_error *e) {
    if (json_is_string(input)) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set(m, "content", input);
        json_array_append_new(c->msgs, m);
        return 0;
    }
    if (!json_is_array(input)) return bad_type(e, "input", "a string or an array of items");
    size_t i;
    json_t *it;
    char name[64];
    json_array_foreach(input, i, it) {
        fmt_name(name, sizeof name, "input[%zu]", i);
        if (!json_is_object(it)) return bad_type(e, name, "an object");
        json_t *ty = json_object_get(it, "type");
        const char *t = json_is_string(ty) ? json_string_value(ty) : NULL;
        int st;
        if ((!ty || json_is_null(ty)) || (t && !strcmp(t, "message")))
            st = conv_message(c, it, name, e);
        else if (t && !strcmp(t, "function_call"))
            st = conv_call(c, it, name, e);
        else if (t && !strcmp(t, "function_call_output"))
            st = conv_output(c, it, name, e);
        else if (t && !strcmp(t, "reasoning"))
            st = conv_reasoning(c, it, name, e);
        else {
            fmt_name(name, sizeof name, "input[%zu].type", i);
            st = !t ? bad_type(e, name, "a string")
                    : tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                                  "input item type '%s' is not supported (message, function_call, "
                                  "function_call_output and reasoning are)",
                                  t);
        }
        if (st) return st;
    }
    if (!json_array_size(c->msgs))
        return tl_oai_fail(e, TL_ERR_INVALID, "input", "'input' has no message");
    return 0;
}

/* Responses function tools {"type","name","description","parameters","strict"} -> chat tools. */
static json_t *conv_tools(json_t *v, tl_oai_error *e) {
    static const char *const keys[] = {"name", "description", "parameters", "strict", NULL};
    char name[64];
    if (!json_is_array(v)) {
        bad_type(e, "tools", "an array");
        return NULL;
    }
    json_t *out = json_array(), *t;
    size_t i;
    json_array_foreach(v, i, t) {
        fmt_name(name, sizeof name, "tools[%zu]", i);
        json_t *ty = json_object_get(t, "type");
        if (!json_is_object(t) || !json_is_string(ty)) {
            bad_type(e, name, "an object with a 'type'");
            goto fail;
        }
        if (strcmp(json_string_value(ty), "function")) {
            fmt_name(name, sizeof name, "tools[%zu].type", i);
            tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                        "tool type '%s' is not supported (function only)", json_string_value(ty));
            goto fail;
        }
        if (only_keys(t, name, keys, e)) goto fail;
        json_t *fn = json_object();
        const char *k;
        json_t *kv;
        json_object_foreach(t, k, kv) if (strcmp(k, "type")) json_object_set(fn, k, kv);
        json_t *ct = json_object();
        json_object_set_new(ct, "type", json_string("function"));
        json_object_set_new(ct, "function", fn);
        json_array_append_new(out, ct);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static json_t *conv_tool_choice(json_t *v, tl_oai_error *e) {
    if (json_is_string(v)) return json_incref(v); /* auto, none, required: checked by chat */
    json_t *ty = json_object_get(v, "type"), *nm = json_object_get(v, "name");
    if (!json_is_object(v) || !json_is_string(ty)) {
        bad_type(e, "tool_choice", "a string or an object with a 'type'");
        return NULL;
    }
    if (strcmp(json_string_value(ty), "function") || json_object_size(v) != 2) {
        tl_oai_fail(e, TL_ERR_UNSUPPORTED, "tool_choice",
                    "'tool_choice' of type '%s' is not supported (auto, none, required or "
                    "{\"type\":\"function\",\"name\":...})",
                    json_string_value(ty));
        return NULL;
    }
    if (!json_is_string(nm)) {
        bad_type(e, "tool_choice.name", "a string");
        return NULL;
    }
    json_t *fn = json_object(), *o = json_object();
    json_object_set(fn, "name", nm);
    json_object_set_new(o, "type", json_string("function"));
    json_object_set_new(o, "function", fn);
    return o;
}

/* reasoning {"effort","summary"} -> chat_template_kwargs.enable_thinking. */
static int conv_reasoning_opt(json_t *v, json_t *chat, tl_oai_error *e) {
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (!json_is_object(v)) return bad_type(e, "reasoning", "an object");
    const char *k;
    json_t *kv;
    json_object_foreach(v, k, kv) {
        char name[64];
        fmt_name(name, sizeof name, "reasoning.%s", k);
        if (json_is_null(kv)) continue;
        if (!strcmp(k, "summary") || !strcmp(k, "generate_summary")) {
            if (!json_is_string(kv)) return bad_type(e, name, "a string");
            continue; /* the reasoning comes back whole, as reasoning_text */
        }
        if (strcmp(k, "effort")) return refuse(e, name, "");
        int found = -1;
        for (int i = 0; i < 6 && json_is_string(kv); i++)
            if (!strcmp(json_string_value(kv), efforts[i])) found = i;
        if (found < 0) return bad_type(e, name, "one of none, minimal, low, medium, high, xhigh");
        json_t *kw = json_object();
        json_object_set_new(kw, "enable_thinking", json_boolean(found >= 2));
        json_object_set_new(chat, "chat_template_kwargs", kw);
    }
    return 0;
}

/* Fields accepted and ignored: they do not change the generated output here. */
static int ignored_field(const char *k) {
    static const char *const names[] = {"metadata",
                                        "user",
                                        "safety_identifier",
                                        "prompt_cache_key",
                                        "prompt_cache_retention",
                                        "service_tier",
                                        "include",
                                        "stream_options"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i])) return 1;
    return 0;
}

/* Fields refused unless they hold their default (false, "disabled", ...). */
static int refused_field(const char *k, json_t *v, tl_oai_error *e) {
    if (!strcmp(k, "previous_response_id") || !strcmp(k, "conversation"))
        return tl_oai_fail(e, TL_ERR_UNSUPPORTED, k,
                           "'%s' is not supported: this server is stateless and stores no "
                           "responses; send the whole conversation in 'input'",
                           k);
    if (!strcmp(k, "store") || !strcmp(k, "background")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean");
        if (json_is_true(v))
            return tl_oai_fail(e, TL_ERR_UNSUPPORTED, k,
                               "'%s': true is not supported: this server is stateless and stores "
                               "no responses (send %s: false)",
                               k, k);
        return 0;
    }
    if (!strcmp(k, "truncation")) {
        if (json_is_string(v) && !strcmp(json_string_value(v), "disabled")) return 0;
        return refuse(e, k, " (only \"disabled\")");
    }
    if (!strcmp(k, "top_logprobs")) {
        if (json_is_integer(v) && json_integer_value(v) == 0) return 0;
        return refuse(e, k, " (only 0)");
    }
    return refuse(e, k, "");
}

/* text: {"format": {"type":"text"} | {"type":"json_object"} | {"type":"json_schema", "name",
 * "schema", "strict", "description"}, "verbosity"} -> chat completions' response_format
 * (server/constrain.c compiles it). */
static int conv_text(json_t *v, json_t *chat, tl_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "text", "an object");
    const char *tk;
    json_t *tv;
    json_object_foreach(v, tk, tv) if (strcmp(tk, "format") && strcmp(tk, "verbosity")) {
        char name[64];
        fmt_name(name, sizeof name, "text.%s", tk);
        return refuse(e, name, "");
    }
    json_t *f = json_object_get(v, "format");
    if (!f || json_is_null(f)) return 0;
    const char *ft = json_is_object(f) ? json_string_value(json_object_get(f, "type")) : NULL;
    if (!ft) return bad_type(e, "text.format", "an object with a string 'type'");
    if (!strcmp(ft, "text")) return 0;
    if (!strcmp(ft, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (strcmp(ft, "json_schema"))
        return refuse(e, "text.format", " (text, json_object or json_schema)");
    json_t *js = json_object();
    const char *fk;
    json_t *fv;
    json_object_foreach(f, fk, fv) if (strcmp(fk, "type")) json_object_set(js, fk, fv);
    json_object_set_new(chat, "response_format",
                        json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

static int conv_field(const char *k, json_t *v, json_t *chat, tl_oai_error *e) {
    static const char *const same[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "stream",
                                       "parallel_tool_calls",
                                       "cache_salt", /* vLLM's; validated as in chat */
                                       "tulip_test_script",
                                       "tulip_test_fail_after",
                                       "tulip_test_fail_lost"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if (!strcmp(k, same[i])) return json_object_set(chat, k, v), 0;
    if (!strcmp(k, "input") || !strcmp(k, "instructions")) return 0; /* by the caller */
    if (!strcmp(k, "max_output_tokens")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return bad_type(e, k, "an integer of at least 1");
        return json_object_set(chat, "max_tokens", v), 0;
    }
    if (!strcmp(k, "tools")) {
        json_t *t = conv_tools(v, e);
        return t ? json_object_set_new(chat, "tools", t), 0 : e->status;
    }
    if (!strcmp(k, "tool_choice")) {
        json_t *t = conv_tool_choice(v, e);
        return t ? json_object_set_new(chat, "tool_choice", t), 0 : e->status;
    }
    if (!strcmp(k, "reasoning")) return conv_reasoning_opt(v, chat, e);
    if (!strcmp(k, "text")) return conv_text(v, chat, e);
    if (ignored_field(k)) return 0;
    return refused_field(k, v, e);
}

json_t *tl_resp_to_chat(json_t *body, tl_oai_error *e) {
    if (!json_is_object(body)) {
        tl_oai_fail(e, TL_ERR_INVALID, NULL, "the request body must be a JSON object");
        return NULL;
    }
    json_t *chat = json_object();
    conv c = {.msgs = json_array()};
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (!json_is_null(v) && conv_field(k, v, chat, e)) goto fail;
    }
    json_t *ins = json_object_get(body, "instructions"), *input = json_object_get(body, "input");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) {
            bad_type(e, "instructions", "a string");
            goto fail;
        }
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("system"));
        json_object_set(m, "content", ins);
        json_array_append_new(c.msgs, m);
    }
    if (!input || json_is_null(input)) {
        tl_oai_fail(e, TL_ERR_INVALID, "input", "'input' is required");
        goto fail;
    }
    if (conv_input(&c, input, e)) goto fail;
    json_decref(c.reasoning);
    json_object_set_new(chat, "messages", c.msgs);
    return chat;
fail:
    json_decref(c.reasoning);
    json_decref(c.msgs);
    json_decref(chat);
    return NULL;
}

/* ====== Output: chat deltas -> output items and response.* events. ====== */

enum { ITEM_NONE = 0, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

typedef struct resp_out {
    tl_sbuf *sse;  /* NULL: no events (non-streaming) */
    int seq;       /* sequence_number of the next event */
    json_t *resp;  /* the response object */
    json_t *items; /* borrowed: resp.output */
    int cur;       /* ITEM_* of the open item (the last of items) */
    int call_index;
    tl_buf text; /* the open item's text, reasoning text or arguments */
} resp_out;

/* Emits one event: ev gets "type" and "sequence_number" and is stolen. */
static void emit(resp_out *o, const char *type, json_t *ev) {
    if (!o->sse) {
        json_decref(ev);
        return;
    }
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer(o->seq++));
    char *txt = tl_oai_dump(ev);
    tl_sbuf_put(o->sse, "event: ", 7);
    tl_sbuf_put(o->sse, type, strlen(type));
    tl_sbuf_put(o->sse, "\n", 1);
    tl_sse_data(o->sse, txt);
    free(txt);
}

static json_t *ev_at(const resp_out *o) { /* {"item_id","output_index"} of the open item */
    size_t n = json_array_size(o->items);
    json_t *ev = json_object();
    json_object_set(ev, "item_id", json_object_get(json_array_get(o->items, n - 1), "id"));
    json_object_set_new(ev, "output_index", json_integer((json_int_t)n - 1));
    return ev;
}

static json_t *text_part(const char *type, const char *s, size_t n) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string(type));
    json_object_set_new(p, "text", json_stringn(s ? s : "", n));
    if (!strcmp(type, "output_text")) json_object_set_new(p, "annotations", json_array());
    return p;
}

static void emit_item(resp_out *o, const char *type, json_t *item) {
    json_t *ev = json_object();
    json_object_set_new(ev, "output_index",
                        json_integer((json_int_t)json_array_size(o->items) - 1));
    json_object_set_new(ev, "item", json_deep_copy(item));
    emit(o, type, ev);
}

static void open_item(resp_out *o, int kind, json_t *delta_call) {
    char id[64];
    json_t *it = json_object();
    tl_oai_make_id(id, sizeof id,
                   kind == ITEM_MESSAGE ? "msg_"
                   : kind == ITEM_CALL  ? "fc_"
                                        : "rs_");
    json_object_set_new(it, "id", json_string(id));
    json_object_set_new(it, "type",
                        json_string(kind == ITEM_MESSAGE ? "message"
                                    : kind == ITEM_CALL  ? "function_call"
                                                         : "reasoning"));
    json_object_set_new(it, "status", json_string("in_progress"));
    if (kind == ITEM_MESSAGE) {
        json_object_set_new(it, "role", json_string("assistant"));
        json_object_set_new(it, "content", json_array());
    } else if (kind == ITEM_REASONING) {
        json_object_set_new(it, "summary", json_array());
        json_object_set_new(it, "content", json_array());
    } else {
        json_t *fn = json_object_get(delta_call, "function");
        json_object_set(it, "call_id", json_object_get(delta_call, "id"));
        json_object_set(it, "name", json_object_get(fn, "name"));
        json_object_set_new(it, "arguments", json_string(""));
        o->call_index = (int)json_integer_value(json_object_get(delta_call, "index"));
    }
    json_array_append_new(o->items, it);
    o->cur = kind;
    tl_buf_truncate(&o->text, 0);
    emit_item(o, "response.output_item.added", it);
    if (kind == ITEM_CALL) return;
    json_t *ev = ev_at(o);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set_new(ev, "part",
                        text_part(kind == ITEM_MESSAGE ? "output_text" : "reasoning_text", "", 0));
    emit(o, "response.content_part.added", ev);
}

static void close_item(resp_out *o, const char *status) {
    if (o->cur == ITEM_NONE) return;
    json_t *it = json_array_get(o->items, json_array_size(o->items) - 1);
    const char *t = o->text.p ? o->text.p : "";
    if (o->cur == ITEM_CALL) {
        json_object_set_new(it, "arguments", json_stringn(t, o->text.n));
        json_t *ev = ev_at(o);
        json_object_set(ev, "name", json_object_get(it, "name"));
        json_object_set_new(ev, "arguments", json_stringn(t, o->text.n));
        emit(o, "response.function_call_arguments.done", ev);
    } else {
        int msg = o->cur == ITEM_MESSAGE;
        json_t *part = text_part(msg ? "output_text" : "reasoning_text", t, o->text.n);
        json_t *ev = ev_at(o);
        json_object_set_new(ev, "content_index", json_integer(0));
        json_object_set_new(ev, "text", json_stringn(t, o->text.n));
        if (msg) json_object_set_new(ev, "logprobs", json_array());
        emit(o, msg ? "response.output_text.done" : "response.reasoning_text.done", ev);
        ev = ev_at(o);
        json_object_set_new(ev, "content_index", json_integer(0));
        json_object_set(ev, "part", part);
        emit(o, "response.content_part.done", ev);
        json_array_append_new(json_object_get(it, "content"), part);
    }
    json_object_set_new(it, "status", json_string(status));
    emit_item(o, "response.output_item.done", it);
    o->cur = ITEM_NONE;
}

/* Text of a reasoning or content delta: opens the item if needed, emits the delta event. */
static void put_text(resp_out *o, int kind, json_t *s) {
    size_t n = json_string_length(s);
    if (n == 0) return;
    if (o->cur != kind) {
        close_item(o, "completed");
        open_item(o, kind, NULL);
    }
    xbuf_append(&o->text, json_string_value(s), n);
    json_t *ev = ev_at(o);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set(ev, "delta", s);
    if (kind == ITEM_MESSAGE) json_object_set_new(ev, "logprobs", json_array());
    emit(o, kind == ITEM_MESSAGE ? "response.output_text.delta" : "response.reasoning_text.delta",
         ev);
}

static void put_call(resp_out *o, json_t *tc) {
    int idx = (int)json_integer_value(json_object_get(tc, "index"));
    if (json_object_get(tc, "id") || o->cur != ITEM_CALL || o->call_index != idx) {
        close_item(o, "completed");
        open_item(o, ITEM_CALL, tc);
    }
    json_t *a = json_object_get(json_object_get(tc, "function"), "arguments");
    if (!json_string_length(a)) return;
    xbuf_append(&o->text, json_string_value(a), json_string_length(a));
    json_t *ev = ev_at(o);
    json_object_set(ev, "delta", a);
    emit(o, "response.function_call_arguments.delta", ev);
}

/* Maps the chat deltas taken from tl_gen ({"reasoning_content"}, {"content"}, {"tool_calls"}). */
static void put_deltas(resp_out *o, json_t *ds) {
    size_t i, k;
    json_t *d, *tc;
    json_array_foreach(ds, i, d) {
        json_t *r = json_object_get(d, "reasoning_content"), *c = json_object_get(d, "content");
        if (r) put_text(o, ITEM_REASONING, r);
        if (c) put_text(o, ITEM_MESSAGE, c);
        json_array_foreach(json_object_get(d, "tool_calls"), k, tc) put_call(o, tc);
    }
    json_decref(ds);
}

/* A float setting as the client wrote it (0.7, not 0.699999988). */
static json_t *real6(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.6g", (double)x);
    return json_real(strtod(b, NULL));
}

/* The response object as it starts: the request's settings, no output yet. */
static json_t *resp_new(const char *id, const char *model, json_t *body, const tl_oai_req *r) {
    json_t *o = json_object(), *v;
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer((json_int_t)time(NULL)));
    json_object_set_new(o, "status", json_string("in_progress"));
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details", json_null());
    v = json_object_get(body, "instructions");
    json_object_set_new(o, "instructions", json_is_string(v) ? json_incref(v) : json_null());
    json_object_set_new(o, "max_output_tokens",
                        r->max_tokens > 0 ? json_integer(r->max_tokens) : json_null());
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "output", json_array());
    json_object_set_new(o, "parallel_tool_calls", json_boolean(r->parallel_tool_calls));
    json_object_set_new(o, "previous_response_id", json_null());
    json_t *rs = json_object();
    v = json_object_get(json_object_get(body, "reasoning"), "effort");
    json_object_set_new(rs, "effort", json_is_string(v) ? json_incref(v) : json_null());
    json_object_set_new(rs, "summary", json_null());
    json_object_set_new(o, "reasoning", rs);
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "temperature", real6(r->sample.temperature));
    json_object_set_new(o, "top_p", real6(r->sample.top_p));
    json_t *fmt = json_object_get(json_object_get(body, "text"), "format"), *text = json_object();
    json_object_set_new(text, "format",
                        json_is_object(fmt) ? json_incref(fmt)
                                            : json_pack("{s:s}", "type", "text"));
    json_object_set_new(o, "text", text);
    v = json_object_get(body, "tool_choice");
    json_object_set_new(o, "tool_choice",
                        v && !json_is_null(v) ? json_incref(v) : json_string("auto"));
    v = json_object_get(body, "tools");
    json_object_set_new(o, "tools", json_is_array(v) ? json_incref(v) : json_array());
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "usage", json_null());
    v = json_object_get(body, "metadata");
    json_object_set_new(o, "metadata", json_is_object(v) ? json_incref(v) : json_object());
    return o;
}

static void resp_usage(resp_out *o, int n_prompt, int n_cached, const tl_gen *g) {
    json_t *u = json_object(), *in = json_object(), *out = json_object();
    json_object_set_new(u, "input_tokens", json_integer(n_prompt));
    json_object_set_new(in, "cached_tokens", json_integer(n_cached));
    json_object_set_new(u, "input_tokens_details", in);
    json_object_set_new(u, "output_tokens", json_integer(g->n_completion));
    json_object_set_new(out, "reasoning_tokens", json_integer(g->n_reasoning));
    json_object_set_new(u, "output_tokens_details", out);
    json_object_set_new(u, "total_tokens", json_integer(n_prompt + g->n_completion));
    json_object_set_new(o->resp, "usage", u);
}

/* The end of generation (fin: TL_FIN_STOP or TL_FIN_LENGTH): closes the open item, sets status
 * and usage, emits response.completed or response.incomplete. */
static void resp_finish(resp_out *o, int fin, int n_prompt, int n_cached, const tl_gen *g) {
    int incomplete = fin == TL_FIN_LENGTH && !g->stopped;
    close_item(o, incomplete ? "incomplete" : "completed");
    json_object_set_new(o->resp, "status", json_string(incomplete ? "incomplete" : "completed"));
    if (incomplete) {
        json_t *d = json_object();
        json_object_set_new(d, "reason", json_string("max_output_tokens"));
        json_object_set_new(o->resp, "incomplete_details", d);
    }
    resp_usage(o, n_prompt, n_cached, g);
    json_t *ev = json_object();
    json_object_set_new(ev, "response", json_deep_copy(o->resp));
    emit(o, incomplete ? "response.incomplete" : "response.completed", ev);
}

/* A failed generation: status "failed" with the error; emits response.failed. */
static void resp_fail(resp_out *o, const tl_oai_error *e) {
    close_item(o, "incomplete");
    json_t *err = json_object();
    json_object_set_new(err, "code", json_string("server_error"));
    json_object_set_new(err, "message", json_string(e->msg));
    json_object_set_new(o->resp, "status", json_string("failed"));
    json_object_set_new(o->resp, "error", err);
    json_t *ev = json_object();
    json_object_set_new(ev, "response", json_deep_copy(o->resp));
    emit(o, "response.failed", ev);
}

/* ====== The endpoint. ====== */

typedef struct resp_stream {
    const tl_stream_ops *ops; /* first: http.c calls through it */
    tl_server *s;
    tl_oai_req req;
    tl_job *job;
    tl_gen gen;
    int fd;
    int started, done;
    resp_out o;
    tl_sbuf sse;
} resp_stream;

static void rs_free(void *p) {
    resp_stream *st = p;
    if (!st) return;
    tl_job_cancel(st->job); /* no-op when it already ended */
    tl_job_unref(st->job);
    tl_gen_free(&st->gen);
    tl_oai_req_free(&st->req);
    json_decref(st->o.resp);
    tl_buf_free(&st->o.text);
    tl_sbuf_free(&st->sse);
    free(st);
}

static void job_failed(resp_stream *st, int fin) {
    tl_oai_error e;
    if (fin == TL_FIN_ERROR) {
        tl_api_job_error(st->job, &e);
    } else {
        tl_oai_fail(&e, TL_ERR_CANCELLED, NULL, "the request was cancelled (shutdown)");
        e.http = 503, e.type = "server_error";
    }
    resp_fail(&st->o, &e);
}

/* Reads what the job has produced; returns the finish (TL_FIN_NONE while running). */
static int pump(resp_stream *st) {
    tl_sample_out ev[EV_BATCH];
    int fin, n = tl_job_take(st->job, ev, EV_BATCH, &fin);
    for (int i = 0; i < n; i++)
        if (tl_gen_push(&st->gen, &ev[i])) {
            tl_job_cancel(st->job);
            fin = TL_FIN_STOP;
            break;
        }
    if (fin == TL_FIN_STOP || fin == TL_FIN_LENGTH) tl_gen_end(&st->gen);
    put_deltas(&st->o, tl_gen_take_deltas(&st->gen));
    if (fin == TL_FIN_STOP || fin == TL_FIN_LENGTH)
        resp_finish(&st->o, fin, st->job->n_prompt, st->job->n_cached, &st->gen);
    else if (fin)
        job_failed(st, fin);
    return fin ? fin : n == EV_BATCH ? -1 : 0; /* -1: more may be ready at once */
}

static long rs_read(void *p, char *buf, size_t max) {
    resp_stream *st = p;
    for (;;) {
        if (tl_sbuf_unread(&st->sse)) return (long)tl_sbuf_read(&st->sse, buf, max);
        if (st->done) return -1;
        if (!st->started) {
            st->started = 1;
            json_t *ev = json_object();
            json_object_set_new(ev, "response", json_deep_copy(st->o.resp));
            emit(&st->o, "response.created", ev);
            ev = json_object();
            json_object_set_new(ev, "response", json_deep_copy(st->o.resp));
            emit(&st->o, "response.in_progress", ev);
            continue;
        }
        int fin = pump(st);
        if (fin > 0) st->done = 1;
        if (fin) continue;
        int w = tl_job_wait(st->job, st->fd, (int)(st->s->p.keepalive_s * 1000));
        if (w < 0) {
            tl_job_cancel(st->job);
            return -2;
        }
        if (w == 0) tl_sse_comment(&st->sse, "keepalive");
    }
}

static const tl_stream_ops rs_ops = {rs_read, rs_free};

static void reply_body(tl_reply *out, int status, json_t *v) {
    memset(out, 0, sizeof *out);
    out->status = status;
    out->content_type = "application/json";
    out->body = tl_oai_dump(v);
    out->body_len = strlen(out->body);
}

/* Non-streaming: runs the job to its end. Returns -1 when the client went away. */
static int run_blocking(resp_stream *st, tl_reply *out) {
    int fin;
    while (!(fin = pump(st)) || fin < 0)
        if (!fin && tl_job_wait(st->job, st->fd, 1000) < 0) {
            tl_job_cancel(st->job);
            return -1;
        }
    const char *status = json_string_value(json_object_get(st->o.resp, "status"));
    if (!strcmp(status, "failed")) {
        tl_oai_error e;
        json_t *err = json_object_get(st->o.resp, "error");
        tl_oai_fail(
            &e, fin == TL_FIN_ERROR && st->job->err_status ? st->job->err_status : TL_ERR_INTERNAL,
            NULL, "%s", json_string_value(json_object_get(err, "message")));
        if (fin == TL_FIN_CANCELLED) e.http = 503, e.type = "server_error";
        tl_api_error(out, &e);
        return 0;
    }
    reply_body(out, 200, st->o.resp);
    st->o.resp = NULL; /* reply_body released it */
    return 0;
}

int tl_api_responses(tl_server *s, const char *body, size_t len, int fd, tl_reply *out) {
    tl_oai_error e;
    json_error_t je;
    char id[64];
    tl_oai_make_id(id, sizeof id, "resp_");
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je), *chat = NULL;
    if (!root) {
        tl_oai_fail(&e, TL_ERR_INVALID, NULL, "malformed JSON at line %d column %d: %s", je.line,
                    je.column, je.text);
        tl_api_error(out, &e);
        return 0;
    }
    resp_stream *st = xcalloc(1, sizeof *st);
    chat = tl_resp_to_chat(root, &e);
    char *cbody = chat ? tl_oai_dump(chat) : NULL;
    if (!cbody || tl_api_start_chat(s, id, cbody, strlen(cbody), &st->req, &st->job, &e)) {
        free(cbody);
        json_decref(root);
        free(st);
        tl_api_error(out, &e);
        return 0;
    }
    free(cbody);
    st->ops = &rs_ops;
    st->s = s;
    st->fd = fd;
    st->o.resp = resp_new(id, s->model_name, root, &st->req);
    st->o.items = json_object_get(st->o.resp, "output");
    json_decref(root);
    tl_gen_init(&st->gen, &st->req, s->tok, s->think_end_id, tl_api_seed());
    if (st->req.stream) {
        st->o.sse = &st->sse;
        memset(out, 0, sizeof *out);
        out->status = 200;
        out->ops_stream = st;
        return 0;
    }
    int rc = run_blocking(st, out);
    rs_free(st);
    return rc;
}
