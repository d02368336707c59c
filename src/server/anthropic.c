/* Anthropic Messages API (see anthropic.h): request conversion into an OpenAI chat request,
 * generated deltas -> content blocks and SSE events, errors in Anthropic's shape, and the
 * /v1/messages and /v1/messages/count_tokens endpoints. The job is built and queued by api.c
 * (tl_api_start_chat) from the converted body, so validation, the chat template, tool parsing
 * and stop strings are the OpenAI path's; this file reads the job through its own tl_gen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "server/anthropic.h"
#include "server/gen.h"
#include "server/sched.h"
#include "server/sse.h"

#define EV_BATCH 64

/* ====== Errors. ====== */

const char *tl_ant_error_type(int http) {
    switch (http) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "overloaded_error";
    default:
        return http >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *tl_ant_error_json(const tl_oai_error *e) {
    char msg[700];
    if (e->param[0] && !strstr(e->msg, e->param))
        snprintf(msg, sizeof msg, "%s: %s", e->param, e->msg);
    else
        snprintf(msg, sizeof msg, "%s", e->msg);
    json_t *err = json_object(), *o = json_object();
    json_object_set_new(err, "type", json_string(tl_ant_error_type(e->http)));
    json_object_set_new(err, "message", json_string(msg));
    json_object_set_new(o, "type", json_string("error"));
    json_object_set_new(o, "error", err);
    return tl_oai_dump(o);
}

void tl_ant_error_reply(tl_reply *out, const tl_oai_error *e) {
    memset(out, 0, sizeof *out);
    out->status = e->http;
    out->content_type = "application/json";
    out->body = tl_ant_error_json(e);
    out->body_len = strlen(out->body);
}

/* ====== Request conversion. ====== */

static int bad_type(tl_oai_error *e, const char *name, const char *what) {
    return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' must be %s", name, what);
}

static int refuse(tl_oai_error *e, const char *name) {
    return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name, "'%s' is not supported by this server", name);
}

/* Keys of a block other than those listed (and cache_control, accepted and ignored) are
 * refused. keys: NULL-terminated. */
static int check_keys(json_t *o, const char *pname, const char *const *keys, tl_oai_error *e) {
    const char *k;
    json_t *v;
    char name[128];
    json_object_foreach(o, k, v) {
        int ok = !strcmp(k, "cache_control");
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) {
            snprintf(name, sizeof name, "%s.%s", pname, k);
            return refuse(e, name);
        }
    }
    return 0;
}

static json_t *text_part(json_t *text) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("text"));
    json_object_set(p, "text", text);
    return p;
}

/* A string, or text blocks -> OpenAI text parts (new array) in *out. */
static int text_blocks(json_t *c, const char *pname, json_t **out, tl_oai_error *e) {
    static const char *const keys[] = {"type", "text", "citations", NULL};
    char name[192];
    if (json_is_string(c)) {
        *out = json_array();
        json_array_append_new(*out, text_part(c));
        return 0;
    }
    if (!json_is_array(c)) return bad_type(e, pname, "a string or an array of text blocks");
    json_t *arr = json_array(), *b;
    size_t i;
    json_array_foreach(c, i, b) {
        snprintf(name, sizeof name, "%s[%zu]", pname, i);
        json_t *ty = json_object_get(b, "type"), *tx = json_object_get(b, "text");
        int st = !json_is_object(b) ? bad_type(e, name, "an object")
                 : !json_is_string(ty) || strcmp(json_string_value(ty), "text")
                     ? tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                                   "'%s': only text blocks are supported here", name)
                 : !json_is_string(tx) ? bad_type(e, name, "a text block with a string 'text'")
                                       : check_keys(b, name, keys, e);
        if (st) {
            json_decref(arr);
            return st;
        }
        json_array_append_new(arr, text_part(tx));
    }
    *out = arr;
    return 0;
}

/* One tool_use block -> an OpenAI tool call. */
static int tool_use(json_t *b, const char *pname, json_t *calls, tl_oai_error *e) {
    static const char *const keys[] = {"type", "id", "name", "input", "caller", NULL};
    json_t *id = json_object_get(b, "id"), *nm = json_object_get(b, "name");
    json_t *in = json_object_get(b, "input");
    if (!json_is_string(id) || !json_is_string(nm) || !json_is_object(in))
        return bad_type(e, pname, "a tool_use block with string 'id', 'name' and object 'input'");
    if (check_keys(b, pname, keys, e)) return e->status;
    json_t *fn = json_object(), *tc = json_object();
    json_object_set(fn, "name", nm);
    char *args = tl_oai_dump(json_incref(in));
    json_object_set_new(fn, "arguments", json_string(args));
    free(args);
    json_object_set(tc, "id", id);
    json_object_set_new(tc, "type", json_string("function"));
    json_object_set_new(tc, "function", fn);
    json_array_append_new(calls, tc);
    return 0;
}

/* One tool_result block -> an OpenAI tool message appended to msgs. */
static int tool_result(json_t *b, const char *pname, json_t *msgs, tl_oai_error *e) {
    static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", NULL};
    char name[160];
    json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
    if (!json_is_string(id)) {
        snprintf(name, sizeof name, "%s.tool_use_id", pname);
        return bad_type(e, name, "a string");
    }
    if (check_keys(b, pname, keys, e)) return e->status;
    json_t *parts = NULL;
    snprintf(name, sizeof name, "%s.content", pname);
    if (c && text_blocks(c, name, &parts, e)) return e->status;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("tool"));
    json_object_set(m, "tool_call_id", id);
    json_object_set_new(m, "content", parts ? parts : json_string(""));
    json_array_append_new(msgs, m);
    return 0;
}

/* The blocks of one message. Text goes to parts; assistant thinking to reasoning; tool_use to
 * calls (assistant); tool_result to msgs as tool messages (user). */
static int msg_blocks(json_t *c, const char *pname, int asst, json_t *msgs, json_t *parts,
                      tl_buf *reasoning, json_t *calls, tl_oai_error *e) {
    static const char *const tkeys[] = {"type", "text", "citations", NULL};
    static const char *const thkeys[] = {"type", "thinking", "signature", NULL};
    char name[128];
    json_t *b;
    size_t i;
    json_array_foreach(c, i, b) {
        snprintf(name, sizeof name, "%s[%zu]", pname, i);
        json_t *ty = json_object_get(b, "type");
        if (!json_is_object(b) || !json_is_string(ty))
            return bad_type(e, name, "a content block with a string 'type'");
        const char *t = json_string_value(ty);
        int st = 0;
        if (!strcmp(t, "text")) {
            json_t *tx = json_object_get(b, "text");
            if (!json_is_string(tx)) return bad_type(e, name, "a text block with a string 'text'");
            st = check_keys(b, name, tkeys, e);
            if (!st) json_array_append_new(parts, text_part(tx));
        } else if (asst && !strcmp(t, "thinking")) {
            json_t *th = json_object_get(b, "thinking");
            if (!json_is_string(th)) return bad_type(e, name, "a thinking block with 'thinking'");
            st = check_keys(b, name, thkeys, e);
            if (!st) tl_buf_append(reasoning, json_string_value(th), json_string_length(th));
        } else if (asst && !strcmp(t, "redacted_thinking")) {
            continue; /* opaque: nothing to render */
        } else if (asst && !strcmp(t, "tool_use")) {
            st = tool_use(b, name, calls, e);
        } else if (!asst && !strcmp(t, "tool_result")) {
            st = tool_result(b, name, msgs, e);
        } else {
            return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                               "'%s': content block type '%s' is not supported in %s messages",
                               name, t, asst ? "assistant" : "user");
        }
        if (st) return st;
    }
    return 0;
}

/* One Anthropic message -> one or more OpenAI messages appended to msgs. */
static int convert_msg(json_t *m, size_t idx, json_t *msgs, tl_oai_error *e) {
    static const char *const keys[] = {"role", "content", NULL};
    char name[96];
    snprintf(name, sizeof name, "messages[%zu]", idx);
    json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
    const char *r = json_is_string(role) ? json_string_value(role) : "";
    int asst = !strcmp(r, "assistant");
    if (!json_is_object(m)) return bad_type(e, name, "an object");
    if (!asst && strcmp(r, "user")) {
        snprintf(name, sizeof name, "messages[%zu].role", idx);
        return bad_type(e, name, "\"user\" or \"assistant\"");
    }
    if (check_keys(m, name, keys, e)) return e->status;
    json_t *out = json_object();
    json_object_set_new(out, "role", json_string(r));
    if (json_is_string(c)) {
        json_object_set(out, "content", c);
        json_array_append_new(msgs, out);
        return 0;
    }
    snprintf(name, sizeof name, "messages[%zu].content", idx);
    if (!json_is_array(c)) {
        json_decref(out);
        return bad_type(e, name, "a string or an array of content blocks");
    }
    json_t *parts = json_array(), *calls = json_array();
    tl_buf reasoning = {0};
    int st = msg_blocks(c, name, asst, msgs, parts, &reasoning, calls, e);
    if (!st && reasoning.n)
        json_object_set_new(out, "reasoning_content", json_stringn(reasoning.p, reasoning.n));
    if (json_array_size(calls)) json_object_set(out, "tool_calls", calls);
    json_object_set(out, "content", parts);
    /* a user message of tool results only becomes the tool messages alone */
    if (!st && (asst || json_array_size(parts) || !json_array_size(c)))
        json_array_append(msgs, out);
    json_decref(out);
    json_decref(parts);
    json_decref(calls);
    tl_buf_free(&reasoning);
    return st;
}

static int convert_tools(json_t *v, json_t *o, tl_oai_error *e) {
    static const char *const keys[] = {"type",         "name",   "description",
                                       "input_schema", "strict", NULL};
    char name[64];
    if (!json_is_array(v)) return bad_type(e, "tools", "an array");
    json_t *arr = json_array(), *t;
    size_t i;
    json_array_foreach(v, i, t) {
        snprintf(name, sizeof name, "tools[%zu]", i);
        json_t *ty = json_object_get(t, "type"), *nm = json_object_get(t, "name");
        json_t *sc = json_object_get(t, "input_schema");
        int st = 0;
        if (!json_is_object(t) || !json_is_string(nm) || !json_is_object(sc))
            st = bad_type(e, name, "a tool with a string 'name' and an object 'input_schema'");
        else if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "custom")))
            st = tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                             "'%s': only client tools (type \"custom\") are supported", name);
        else
            st = check_keys(t, name, keys, e);
        if (st) {
            json_decref(arr);
            return st;
        }
        json_t *fn = json_object(), *w = json_object();
        json_object_set(fn, "name", nm);
        json_t *d = json_object_get(t, "description");
        if (d) json_object_set(fn, "description", d);
        json_object_set(fn, "parameters", sc);
        json_object_set_new(w, "type", json_string("function"));
        json_object_set_new(w, "function", fn);
        json_array_append_new(arr, w);
    }
    json_object_set_new(o, "tools", arr);
    return 0;
}

static int convert_tool_choice(json_t *v, json_t *o, tl_oai_error *e) {
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    json_t *ty = json_object_get(v, "type"), *dp = json_object_get(v, "disable_parallel_tool_use");
    const char *t = json_is_string(ty) ? json_string_value(ty) : "";
    if (!json_is_object(v) || check_keys(v, "tool_choice", keys, e))
        return json_is_object(v) ? e->status : bad_type(e, "tool_choice", "an object");
    if (dp && !json_is_boolean(dp))
        return bad_type(e, "tool_choice.disable_parallel_tool_use", "a boolean");
    if (json_is_true(dp)) json_object_set_new(o, "parallel_tool_calls", json_false());
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        json_object_set_new(o, "tool_choice", json_string(t));
    } else if (!strcmp(t, "any")) {
        json_object_set_new(o, "tool_choice", json_string("required"));
    } else if (!strcmp(t, "tool")) {
        json_t *nm = json_object_get(v, "name");
        if (!json_is_string(nm)) return bad_type(e, "tool_choice.name", "a string");
        json_t *tc = json_object(), *fn = json_object();
        json_object_set(fn, "name", nm);
        json_object_set_new(tc, "type", json_string("function"));
        json_object_set_new(tc, "function", fn);
        json_object_set_new(o, "tool_choice", tc);
    } else {
        return bad_type(e, "tool_choice.type", "\"auto\", \"any\", \"tool\" or \"none\"");
    }
    return 0;
}

/* thinking {"type":"enabled","budget_tokens":N} / {"type":"disabled"} / {"type":"adaptive"} /
 * {"type":"between_tools"}. The budget is not enforced (the model ends its reasoning itself;
 * max_tokens bounds all); display "omitted" (thinking hidden) is refused. */
static int convert_thinking(json_t *v, int *on, tl_oai_error *e) {
    static const char *const keys[] = {"type", "budget_tokens", "display", NULL};
    json_t *ty = json_object_get(v, "type"), *bt = json_object_get(v, "budget_tokens");
    const char *t = json_is_string(ty) ? json_string_value(ty) : "";
    if (!json_is_object(v)) return bad_type(e, "thinking", "an object");
    if (check_keys(v, "thinking", keys, e)) return e->status;
    json_t *dp = json_object_get(v, "display");
    if (bt && (!json_is_integer(bt) || json_integer_value(bt) < 1))
        return bad_type(e, "thinking.budget_tokens", "a positive integer");
    if (dp && !json_is_null(dp) &&
        (!json_is_string(dp) || strcmp(json_string_value(dp), "summarized")))
        return refuse(e, "thinking.display");
    if (!strcmp(t, "enabled") || !strcmp(t, "adaptive") || !strcmp(t, "between_tools"))
        *on = 1;
    else if (!strcmp(t, "disabled"))
        *on = 0;
    else
        return bad_type(e, "thinking.type",
                        "\"enabled\", \"adaptive\", \"between_tools\" or \"disabled\"");
    return 0;
}

static int convert_system(json_t *v, json_t *msgs, tl_oai_error *e) {
    json_t *parts;
    if (text_blocks(v, "system", &parts, e)) return e->status;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("system"));
    json_object_set_new(m, "content", parts);
    json_array_append_new(msgs, m);
    return 0;
}

/* Top-level fields other than messages/system/tools/tool_choice/thinking. */
static int convert_field(const char *k, json_t *v, int count_only, json_t *o, tl_oai_error *e) {
    static const char *const same[] = {"model", "max_tokens", "stream", "temperature",
                                       "top_p", "top_k",      NULL};
    static const char *const ignored[] = {"metadata",        "service_tier",  "cache_control",
                                          "diagnostics",     "inference_geo", "speed",
                                          "user_profile_id", "workspace_id",  NULL};
    for (int i = 0; same[i]; i++)
        if (!strcmp(k, same[i]) && (i == 0 || !count_only)) {
            json_object_set(o, k, v);
            return 0;
        }
    for (int i = 0; ignored[i]; i++)
        if (!strcmp(k, ignored[i])) return 0;
    if (!strcmp(k, "stop_sequences") && !count_only) {
        if (!json_is_array(v)) return bad_type(e, k, "an array of strings");
        if (json_array_size(v)) json_object_set(o, "stop", v);
        return 0;
    }
    if (!strcmp(k, "output_config")) { /* effort: a hint, ignored; format: refused */
        static const char *const keys[] = {"effort", NULL};
        if (json_is_null(v)) return 0;
        if (!json_is_object(v)) return bad_type(e, k, "an object");
        json_t *f = json_object_get(v, "format");
        if (f && !json_is_null(f)) return refuse(e, "output_config.format");
        json_object_del(v, "format");
        return check_keys(v, k, keys, e);
    }
    if (!strcmp(k, "cache_salt")) { /* vLLM's field: validated by openai.c as in chat */
        json_object_set(o, k, v);
        return 0;
    }
    if (!strncmp(k, "tulip_test_", 11)) { /* openai.c honours them only in --test-mode */
        json_object_set(o, k, v);
        return 0;
    }
    return refuse(e, k);
}

int tl_ant_to_oai(json_t *in, int count_only, json_t **out, tl_oai_error *e) {
    *out = NULL;
    if (!json_is_object(in)) return bad_type(e, "body", "a JSON object");
    json_t *msgs = json_object_get(in, "messages");
    if (!json_is_string(json_object_get(in, "model"))) return bad_type(e, "model", "a string");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return bad_type(e, "messages", "a non-empty array");
    json_t *mt = json_object_get(in, "max_tokens");
    if (!count_only && (!mt || json_is_null(mt)))
        return tl_oai_fail(e, TL_ERR_INVALID, "max_tokens", "'max_tokens' is required");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (json_is_string(json_object_get(last, "role")) &&
        !strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return tl_oai_fail(e, TL_ERR_UNSUPPORTED, "messages",
                           "'messages': a final assistant message (a prefill to continue) is not "
                           "supported; end with a user message");
    json_t *o = json_object(), *om = json_array(), *v;
    int st = 0, think = 0;
    const char *k;
    if ((v = json_object_get(in, "system"))) st = convert_system(v, om, e);
    size_t i;
    json_array_foreach(msgs, i, v) if (!st) st = convert_msg(v, i, om, e);
    json_object_foreach(in, k, v) {
        if (st) break;
        if (!strcmp(k, "messages") || !strcmp(k, "system")) continue;
        if (!strcmp(k, "tools"))
            st = convert_tools(v, o, e);
        else if (!strcmp(k, "tool_choice"))
            st = convert_tool_choice(v, o, e);
        else if (!strcmp(k, "thinking"))
            st = convert_thinking(v, &think, e);
        else
            st = convert_field(k, v, count_only, o, e);
    }
    json_object_set_new(o, "messages", om);
    json_t *kw = json_object();
    json_object_set_new(kw, "enable_thinking", json_boolean(think));
    json_object_set_new(o, "chat_template_kwargs", kw);
    if (st) {
        json_decref(o);
        return st;
    }
    *out = o;
    return 0;
}

/* ====== Output conversion. ====== */

static json_t *block(const char *type, const char *key, json_t *val) {
    json_t *b = json_object();
    json_object_set_new(b, "type", json_string(type));
    if (key) json_object_set_new(b, key, val);
    return b;
}

/* Tool-call arguments text -> the input object ({} when it is not a JSON object). */
static json_t *parse_input(const char *args) {
    json_t *v = args ? json_loads(args, 0, NULL) : NULL;
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

json_t *tl_ant_blocks(const json_t *msg) {
    json_t *arr = json_array(), *v = json_object_get(msg, "reasoning_content");
    if (json_is_string(v) && json_string_length(v)) {
        json_t *b = block("thinking", "thinking", json_incref(v));
        json_object_set_new(b, "signature", json_string(""));
        json_array_append_new(arr, b);
    }
    v = json_object_get(msg, "content");
    if (json_is_string(v) && json_string_length(v))
        json_array_append_new(arr, block("text", "text", json_incref(v)));
    json_t *tc;
    size_t i;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_t *b = block("tool_use", "id", json_incref(json_object_get(tc, "id")));
        json_object_set(b, "name", json_object_get(fn, "name"));
        json_object_set_new(b, "input",
                            parse_input(json_string_value(json_object_get(fn, "arguments"))));
        json_array_append_new(arr, b);
    }
    return arr;
}

const char *tl_ant_stop_reason(const char *finish_reason, int stop_seq) {
    if (stop_seq) return "stop_sequence";
    if (!strcmp(finish_reason, "length")) return "max_tokens";
    if (!strcmp(finish_reason, "tool_calls")) return "tool_use";
    return "end_turn";
}

/* Anthropic counts prompt tokens read from the cache apart: input_tokens are the others. */
static json_t *usage_json(int in, int cached, int out) {
    json_t *u = json_object();
    json_object_set_new(u, "input_tokens", json_integer(in - cached));
    json_object_set_new(u, "output_tokens", json_integer(out));
    json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    json_object_set_new(u, "cache_read_input_tokens", json_integer(cached));
    return u;
}

/* {"id","type":"message","role","model","content","stop_reason","stop_sequence","usage"} */
static json_t *message_json(const char *id, const char *model, json_t *content,
                            const char *stop_reason, const char *stop_seq, json_t *usage) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "model", json_string(model));
    json_object_set_new(m, "content", content);
    json_object_set_new(m, "stop_reason", stop_reason ? json_string(stop_reason) : json_null());
    json_object_set_new(m, "stop_sequence", stop_seq ? json_string(stop_seq) : json_null());
    json_object_set_new(m, "usage", usage);
    return m;
}

/* ====== Endpoints: request -> job. ====== */

/* Parses the Anthropic body into the OpenAI chat body text (malloc'd) in *oai. */
static int convert_body(const char *body, size_t len, int count_only, char **oai, tl_oai_error *e) {
    json_error_t je;
    json_t *in = json_loadb(body, len, 0, &je);
    if (!in) return tl_oai_fail(e, TL_ERR_INVALID, NULL, "the body is not valid JSON: %s", je.text);
    json_t *o;
    int st = tl_ant_to_oai(in, count_only, &o, e);
    json_decref(in);
    if (st) return st;
    *oai = tl_oai_dump(o);
    return 0;
}

void tl_ant_count_tokens(tl_server *s, const char *body, size_t len, tl_reply *out) {
    tl_oai_error e;
    char *oai = NULL;
    int n = 0;
    if (convert_body(body, len, 1, &oai, &e) || tl_api_count_chat(s, oai, strlen(oai), &n, &e)) {
        free(oai);
        tl_ant_error_reply(out, &e);
        return;
    }
    free(oai);
    json_t *o = json_object();
    json_object_set_new(o, "input_tokens", json_integer(n));
    memset(out, 0, sizeof *out);
    out->status = 200;
    out->content_type = "application/json";
    out->body = tl_oai_dump(o);
    out->body_len = strlen(out->body);
}

static void job_failure(const tl_job *j, int fin, tl_oai_error *e) {
    if (fin == TL_FIN_CANCELLED) {
        tl_oai_fail(e, TL_ERR_CANCELLED, NULL, "the request was cancelled (shutdown)");
        e->http = 503;
        return;
    }
    tl_api_job_error(j, e);
}

static const char *stop_seq(const tl_gen *g) { return g->stopped ? g->stop[g->stop_index] : NULL; }

static int run_blocking(tl_server *s, const char *id, tl_oai_req *r, tl_job *j, int fd,
                        tl_reply *out) {
    tl_gen g;
    tl_gen_init(&g, r, s->tok, s->think_end_id, tl_api_seed());
    int fin = tl_api_drain_job(j, &g, fd);
    if (fin < 0) {
        tl_gen_free(&g);
        return -1;
    }
    if (fin == TL_FIN_ERROR || fin == TL_FIN_CANCELLED) {
        tl_oai_error e;
        job_failure(j, fin, &e);
        tl_ant_error_reply(out, &e);
        tl_gen_free(&g);
        return 0;
    }
    tl_gen_end(&g);
    json_t *msg = tl_gen_message(&g);
    json_t *m = message_json(id, s->model_name, tl_ant_blocks(msg),
                             tl_ant_stop_reason(tl_gen_finish_reason(&g, fin), g.stopped),
                             stop_seq(&g), usage_json(j->n_prompt, j->n_cached, g.n_completion));
    json_decref(msg);
    memset(out, 0, sizeof *out);
    out->status = 200;
    out->content_type = "application/json";
    out->body = tl_oai_dump(m);
    out->body_len = strlen(out->body);
    tl_gen_free(&g);
    return 0;
}

/* ====== Streaming. ====== */

typedef enum blk { BLK_NONE = 0, BLK_THINKING, BLK_TEXT, BLK_TOOL } blk;

struct tl_ant_stream {
    tl_server *s;
    tl_oai_req req;
    tl_job *job;
    tl_gen gen;
    int fd;
    char id[64];
    int started, done;
    blk open;  /* the content block being streamed */
    int index; /* its index (-1 before the first) */
    int tool;  /* tool call index of an open tool_use block */
    tl_sbuf out;
};

static void event(struct tl_ant_stream *st, const char *name, json_t *data) {
    json_object_set_new(data, "type", json_string(name));
    char *txt = tl_oai_dump(data);
    tl_sbuf_put(&st->out, "event: ", 7);
    tl_sbuf_put(&st->out, name, strlen(name));
    tl_sbuf_put(&st->out, "\n", 1);
    tl_sse_data(&st->out, txt);
    free(txt);
}

static void close_block(struct tl_ant_stream *st) {
    if (st->open == BLK_NONE) return;
    json_t *d = json_object();
    json_object_set_new(d, "index", json_integer(st->index));
    event(st, "content_block_stop", d);
    st->open = BLK_NONE;
}

/* Opens a block of kind k (cb: its content_block object, stolen) unless it is open already. */
static void open_block(struct tl_ant_stream *st, blk k, json_t *cb) {
    if (st->open == k && k != BLK_TOOL) {
        json_decref(cb);
        return;
    }
    close_block(st);
    st->open = k;
    st->index++;
    json_t *d = json_object();
    json_object_set_new(d, "index", json_integer(st->index));
    json_object_set_new(d, "content_block", cb);
    event(st, "content_block_start", d);
}

static void block_delta(struct tl_ant_stream *st, const char *type, const char *key, json_t *v) {
    json_t *d = json_object(), *dd = block(type, key, v);
    json_object_set_new(d, "index", json_integer(st->index));
    json_object_set_new(d, "delta", dd);
    event(st, "content_block_delta", d);
}

static void tool_delta(struct tl_ant_stream *st, json_t *tc) {
    json_t *fn = json_object_get(tc, "function");
    json_t *id = json_object_get(tc, "id"), *args = json_object_get(fn, "arguments");
    if (id) {
        json_t *cb = block("tool_use", "id", json_incref(id));
        json_object_set(cb, "name", json_object_get(fn, "name"));
        json_object_set_new(cb, "input", json_object());
        open_block(st, BLK_TOOL, cb);
    }
    if (st->open == BLK_TOOL && json_string_length(args))
        block_delta(st, "input_json_delta", "partial_json", json_incref(args));
}

/* The gen's OpenAI deltas -> block events. */
static void flush_deltas(struct tl_ant_stream *st) {
    json_t *ds = tl_gen_take_deltas(&st->gen), *d, *v;
    size_t i, k;
    json_array_foreach(ds, i, d) {
        if ((v = json_object_get(d, "reasoning_content")) && json_string_length(v)) {
            json_t *cb = block("thinking", "thinking", json_string(""));
            json_object_set_new(cb, "signature", json_string(""));
            open_block(st, BLK_THINKING, cb);
            block_delta(st, "thinking_delta", "thinking", json_incref(v));
        } else if ((v = json_object_get(d, "content")) && json_string_length(v)) {
            open_block(st, BLK_TEXT, block("text", "text", json_string("")));
            block_delta(st, "text_delta", "text", json_incref(v));
        } else if ((v = json_object_get(d, "tool_calls"))) {
            json_t *tc;
            json_array_foreach(v, k, tc) tool_delta(st, tc);
        }
    }
    json_decref(ds);
}

static void stream_finish(struct tl_ant_stream *st, int fin) {
    st->done = 1;
    if (fin == TL_FIN_ERROR || fin == TL_FIN_CANCELLED) {
        tl_oai_error e;
        job_failure(st->job, fin, &e);
        char *txt = tl_ant_error_json(&e);
        tl_sbuf_put(&st->out, "event: error\n", 13);
        tl_sse_data(&st->out, txt);
        free(txt);
        return;
    }
    tl_gen_end(&st->gen);
    flush_deltas(st);
    close_block(st);
    const tl_gen *g = &st->gen;
    const char *seq = stop_seq(g);
    json_t *d = json_object(), *delta = json_object();
    json_object_set_new(delta, "stop_reason",
                        json_string(tl_ant_stop_reason(tl_gen_finish_reason(g, fin), g->stopped)));
    json_object_set_new(delta, "stop_sequence", seq ? json_string(seq) : json_null());
    json_object_set_new(d, "delta", delta);
    json_object_set_new(d, "usage",
                        usage_json(st->job->n_prompt, st->job->n_cached, g->n_completion));
    event(st, "message_delta", d);
    event(st, "message_stop", json_object());
}

static void stream_start(struct tl_ant_stream *st) {
    st->started = 1;
    json_t *d = json_object();
    json_object_set_new(d, "message",
                        message_json(st->id, st->s->model_name, json_array(), NULL, NULL,
                                     usage_json(st->job->n_prompt, 0, 0)));
    event(st, "message_start", d);
    event(st, "ping", json_object());
}

long tl_ant_stream_read(struct tl_ant_stream *st, char *buf, size_t max) {
    tl_sample_out ev[EV_BATCH];
    for (;;) {
        if (tl_sbuf_unread(&st->out)) return (long)tl_sbuf_read(&st->out, buf, max);
        if (st->done) return -1;
        if (!st->started) {
            stream_start(st);
            continue;
        }
        int fin, n = tl_job_take(st->job, ev, EV_BATCH, &fin), stopped = 0;
        for (int i = 0; i < n && !stopped; i++) stopped = tl_gen_push(&st->gen, &ev[i]);
        if (stopped) {
            tl_job_cancel(st->job);
            stream_finish(st, TL_FIN_STOP);
            continue;
        }
        flush_deltas(st);
        if (fin) {
            stream_finish(st, fin);
            continue;
        }
        if (n) continue;
        int w = tl_job_wait(st->job, st->fd, (int)(st->s->p.keepalive_s * 1000));
        if (w < 0) {
            tl_job_cancel(st->job);
            return -2;
        }
        if (w == 0) event(st, "ping", json_object());
    }
}

void tl_ant_stream_free(struct tl_ant_stream *st) {
    if (!st) return;
    tl_job_cancel(st->job);
    tl_job_unref(st->job);
    tl_gen_free(&st->gen);
    tl_oai_req_free(&st->req);
    tl_sbuf_free(&st->out);
    free(st);
}

int tl_ant_messages(tl_server *s, const char *body, size_t len, int fd, tl_reply *out) {
    tl_oai_req r;
    tl_job *j = NULL;
    tl_oai_error e;
    char id[64], *oai = NULL;
    tl_oai_make_id(id, sizeof id, "msg_");
    if (convert_body(body, len, 0, &oai, &e) ||
        tl_api_start_chat(s, id, oai, strlen(oai), &r, &j, &e)) {
        free(oai);
        tl_ant_error_reply(out, &e);
        return 0;
    }
    free(oai);
    if (!r.stream) {
        int rc = run_blocking(s, id, &r, j, fd, out);
        tl_job_unref(j);
        tl_oai_req_free(&r);
        return rc;
    }
    struct tl_ant_stream *st = xcalloc(1, sizeof *st);
    st->s = s;
    st->req = r;
    st->job = j;
    st->fd = fd;
    st->index = -1;
    snprintf(st->id, sizeof st->id, "%s", id);
    tl_gen_init(&st->gen, &st->req, s->tok, s->think_end_id, tl_api_seed());
    memset(out, 0, sizeof *out);
    out->status = 200;
    out->ant_stream = st;
    return 0;
}
