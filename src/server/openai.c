/* OpenAI request validation and response JSON (see openai.h). Owns the tl_status -> HTTP table.
 *
 * Rule: every field a request may carry is either handled or rejected with a 400 that names it.
 * JSON null counts as "absent" for optional fields, as in OpenAI's API. Strings in a tl_oai_req
 * point into its JSON root, so the request is freed in one place. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "common/status.h"
#include "common/utf8.h"
#include "common/util.h"
#include "server/constrain.h"
#include "server/openai.h"

/* ====== Errors. ====== */

int tl_oai_http_status(int st) {
    switch (st) {
    case TL_OK:
        return 200;
    case TL_ERR_INVALID:
    case TL_ERR_UNSUPPORTED:
    case TL_ERR_CONTEXT_FULL:
    case TL_ERR_FORMAT:
        return 400;
    case TL_ERR_BUSY:
        return 429;
    case TL_ERR_DEVICE_LOST:
        return 503;
    default:
        return 500;
    }
}

int tl_oai_fail(tl_oai_error *e, int st, const char *param, const char *fmt, ...) {
    e->status = st;
    e->http = tl_oai_http_status(st);
    e->type = e->http == 429   ? "rate_limit_error"
              : e->http >= 500 ? "server_error"
                               : "invalid_request_error";
    e->code = st == TL_ERR_UNSUPPORTED    ? "unsupported_parameter"
              : st == TL_ERR_CONTEXT_FULL ? "context_length_exceeded"
                                          : NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return st;
}

char *tl_oai_error_json(const tl_oai_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", json_string(e->msg));
    json_object_set_new(o, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(o, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code ? json_string(e->code) : json_null());
    if (e->code && !strcmp(e->code, "context_length_exceeded")) {
        json_object_set_new(o, "n_prompt_tokens", json_integer(e->n_prompt));
        json_object_set_new(o, "n_ctx", json_integer(e->n_ctx));
    }
    json_t *root = json_object();
    json_object_set_new(root, "error", o);
    return tl_oai_dump(root);
}

/* ====== Field readers. Each returns 0, or fills e and returns a negative status. ====== */

/* snprintf for field names in messages; truncation of an absurdly long name is fine. */
static void fmt_name(char *b, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_name(char *b, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, n, fmt, ap);
    va_end(ap);
}

#define FAIL_TYPE(e, name, what) tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' must be %s", name, what)

static int get_bool(json_t *v, const char *name, int *out, tl_oai_error *e) {
    if (!json_is_boolean(v)) return FAIL_TYPE(e, name, "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int get_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
                   tl_oai_error *e) {
    if (!json_is_integer(v)) return FAIL_TYPE(e, name, "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is %lld, must be in [%lld, %lld]", name,
                           x, lo, hi);
    *out = x;
    return 0;
}

static int get_num(json_t *v, const char *name, double lo, double hi, int lo_open, float *out,
                   tl_oai_error *e) {
    if (!json_is_number(v)) return FAIL_TYPE(e, name, "a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi) || (lo_open && x == lo))
        return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is %g, must be in %c%g, %g]", name, x,
                           lo_open ? '(' : '[', lo, hi);
    *out = (float)x;
    return 0;
}

static int get_str(json_t *v, const char *name, const char **out, tl_oai_error *e) {
    if (!json_is_string(v)) return FAIL_TYPE(e, name, "a string");
    *out = json_string_value(v);
    return 0;
}

/* Token ids: a non-empty array of integers in [0, n_vocab). */
static int get_ids(json_t *v, const char *name, int n_vocab, int max_n, int32_t **out, int *n,
                   tl_oai_error *e) {
    if (!json_is_array(v)) return FAIL_TYPE(e, name, "an array of token ids");
    size_t cnt = json_array_size(v);
    if (cnt == 0) return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is empty", name);
    if ((long)cnt > max_n)
        return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' has %zu tokens, at most %d allowed", name,
                           cnt, max_n);
    int32_t *ids = malloc(cnt * sizeof *ids);
    if (!ids) return tl_oai_fail(e, TL_ERR_NOMEM, NULL, "out of memory");
    for (size_t i = 0; i < cnt; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= n_vocab) {
            free(ids);
            return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s[%zu]' must be a token id in [0, %d)",
                               name, i, n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    *out = ids;
    *n = (int)cnt;
    return 0;
}

/* A field OpenAI defines that we do not implement: accepted only when null or equal to its
 * default, rejected by name otherwise. */
static int unsupported(const char *name, tl_oai_error *e) {
    return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name, "'%s' is not supported by this server", name);
}

/* ====== Defaults. ====== */

void tl_oai_defaults_init(tl_oai_defaults *d) {
    /* docs/model.md §6: the model card's "thinking, general" and "non-thinking, general" rows;
     * completions follow generation_config.json (no presence penalty). */
    tl_sample_params base = {.temperature = 1.0f,
                             .top_k = 20,
                             .top_p = 0.95f,
                             .min_p = 0.0f,
                             .repetition_penalty = 1.0f};
    d->completion = base;
    d->thinking = base;
    d->thinking.presence_penalty = 1.5f;
    d->non_thinking = base;
    d->non_thinking.temperature = 0.7f;
    d->non_thinking.top_p = 0.8f;
    d->non_thinking.presence_penalty = 1.5f;
}

int tl_oai_defaults_from_genconfig(tl_oai_defaults *d, const char *text) {
    json_t *g = json_loads(text, 0, NULL);
    if (!json_is_object(g)) {
        json_decref(g);
        return TL_ERR_FORMAT;
    }
    json_t *v;
    if ((v = json_object_get(g, "temperature")) && json_is_number(v))
        d->thinking.temperature = d->completion.temperature = (float)json_number_value(v);
    if ((v = json_object_get(g, "top_k")) && json_is_integer(v))
        d->thinking.top_k = d->completion.top_k = (int)json_integer_value(v);
    if ((v = json_object_get(g, "top_p")) && json_is_number(v))
        d->thinking.top_p = d->completion.top_p = (float)json_number_value(v);
    json_decref(g);
    return 0;
}

/* ====== Messages. ====== */

static int parse_content(json_t *c, const char *pname, char **out, tl_oai_error *e) {
    char name[96];
    if (json_is_string(c)) {
        *out = xstrdup(json_string_value(c));
        return 0;
    }
    if (!json_is_array(c)) return FAIL_TYPE(e, pname, "a string or an array of content parts");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        fmt_name(name, sizeof name, "%s[%zu]", pname, i);
        if (!json_is_object(part)) return FAIL_TYPE(e, name, "an object");
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_string(ty)) {
            fmt_name(name, sizeof name, "%s[%zu].type", pname, i);
            return FAIL_TYPE(e, name, "a string");
        }
        if (strcmp(json_string_value(ty), "text")) {
            fmt_name(name, sizeof name, "%s[%zu].type", pname, i);
            return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                               "content part type '%s' is not supported (text only)",
                               json_string_value(ty));
        }
        const char *k;
        json_t *kv;
        json_object_foreach(part, k, kv) {
            if (strcmp(k, "type") && strcmp(k, "text")) {
                fmt_name(name, sizeof name, "%s[%zu].%s", pname, i, k);
                return unsupported(name, e);
            }
        }
        if (!json_is_string(tx)) {
            fmt_name(name, sizeof name, "%s[%zu].text", pname, i);
            return FAIL_TYPE(e, name, "a string");
        }
        total += json_string_length(tx);
    }
    char *s = xmalloc(total + 1), *p = s;
    json_array_foreach(c, i, part) {
        json_t *tx = json_object_get(part, "text");
        memcpy(p, json_string_value(tx), json_string_length(tx));
        p += json_string_length(tx);
    }
    *p = 0;
    *out = s;
    return 0;
}

static int parse_tool_calls(json_t *v, const char *pname, tl_oai_msg *m, tl_oai_error *e) {
    char name[128];
    if (!json_is_array(v)) return FAIL_TYPE(e, pname, "an array");
    size_t n = json_array_size(v), i;
    m->tool_calls = xcalloc(n ? n : 1, sizeof *m->tool_calls);
    json_t *tc;
    json_array_foreach(v, i, tc) {
        fmt_name(name, sizeof name, "%s[%zu]", pname, i);
        if (!json_is_object(tc)) return FAIL_TYPE(e, name, "an object");
        tl_oai_tool_call *c = &m->tool_calls[m->n_tool_calls++];
        const char *k;
        json_t *kv;
        json_object_foreach(tc, k, kv) {
            fmt_name(name, sizeof name, "%s[%zu].%s", pname, i, k);
            if (!strcmp(k, "id")) {
                if (get_str(kv, name, &c->id, e)) return e->status;
            } else if (!strcmp(k, "type")) {
                if (!json_is_string(kv) || strcmp(json_string_value(kv), "function"))
                    return FAIL_TYPE(e, name, "\"function\"");
            } else if (!strcmp(k, "function")) {
                if (!json_is_object(kv)) return FAIL_TYPE(e, name, "an object");
                const char *fk;
                json_t *fv;
                json_object_foreach(kv, fk, fv) {
                    fmt_name(name, sizeof name, "%s[%zu].function.%s", pname, i, fk);
                    if (!strcmp(fk, "name")) {
                        if (get_str(fv, name, &c->name, e)) return e->status;
                    } else if (!strcmp(fk, "arguments")) {
                        if (get_str(fv, name, &c->arguments, e)) return e->status;
                        json_t *a = json_loads(c->arguments, JSON_DECODE_ANY, NULL);
                        int ok = json_is_object(a);
                        json_decref(a);
                        if (!ok) return FAIL_TYPE(e, name, "a JSON object encoded as a string");
                    } else {
                        return unsupported(name, e);
                    }
                }
            } else {
                return unsupported(name, e);
            }
        }
        if (!c->name) {
            fmt_name(name, sizeof name, "%s[%zu].function.name", pname, i);
            return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
        }
        if (!c->arguments) c->arguments = "{}";
    }
    return 0;
}

static int parse_message(json_t *mj, int idx, tl_oai_msg *m, tl_oai_error *e) {
    char name[96];
    fmt_name(name, sizeof name, "messages[%d]", idx);
    if (!json_is_object(mj)) return FAIL_TYPE(e, name, "an object");
    json_t *role = json_object_get(mj, "role");
    fmt_name(name, sizeof name, "messages[%d].role", idx);
    if (!role) return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
    if (!json_is_string(role)) return FAIL_TYPE(e, name, "a string");
    const char *r = json_string_value(role);
    if (!strcmp(r, "system") || !strcmp(r, "developer"))
        m->role = TL_ROLE_SYSTEM;
    else if (!strcmp(r, "user"))
        m->role = TL_ROLE_USER;
    else if (!strcmp(r, "assistant"))
        m->role = TL_ROLE_ASSISTANT;
    else if (!strcmp(r, "tool"))
        m->role = TL_ROLE_TOOL;
    else
        return tl_oai_fail(
            e, TL_ERR_INVALID, name,
            "unknown role '%s' (expected system, developer, user, assistant or tool)", r);

    json_t *content = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(mj, k, v) {
        fmt_name(name, sizeof name, "messages[%d].%s", idx, k);
        if (!strcmp(k, "role")) continue;
        if (!strcmp(k, "content")) {
            content = v;
        } else if (!strcmp(k, "name")) {
            if (!json_is_null(v) && get_str(v, name, &m->name, e)) return e->status;
        } else if ((!strcmp(k, "reasoning_content") || !strcmp(k, "reasoning")) &&
                   m->role == TL_ROLE_ASSISTANT) {
            /* "reasoning" is vLLM's and OpenRouter's name for the same text (docs/api.md);
             * reasoning_content wins when both are sent */
            const char *txt = NULL;
            if (!json_is_null(v) && get_str(v, name, &txt, e)) return e->status;
            if (txt && (!m->reasoning_content || !strcmp(k, "reasoning_content")))
                m->reasoning_content = txt;
        } else if (!strcmp(k, "tool_calls") && m->role == TL_ROLE_ASSISTANT) {
            if (!json_is_null(v) && parse_tool_calls(v, name, m, e)) return e->status;
        } else if (!strcmp(k, "tool_call_id") && m->role == TL_ROLE_TOOL) {
            if (get_str(v, name, &m->tool_call_id, e)) return e->status;
        } else if ((!strcmp(k, "refusal") || !strcmp(k, "function_call") || !strcmp(k, "audio") ||
                    !strcmp(k, "annotations")) &&
                   m->role == TL_ROLE_ASSISTANT) {
            /* The official client echoes these back as null when a response message is reused. */
            if (!json_is_null(v)) return unsupported(name, e);
        } else {
            return unsupported(name, e);
        }
    }
    fmt_name(name, sizeof name, "messages[%d].content", idx);
    if (!content || json_is_null(content)) {
        if (m->role != TL_ROLE_ASSISTANT)
            return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required for role '%s'", name, r);
        if (!m->n_tool_calls && !m->reasoning_content)
            return tl_oai_fail(e, TL_ERR_INVALID, name,
                               "'%s' is required when the assistant message has no tool_calls",
                               name);
        m->content = xstrdup("");
    } else if (parse_content(content, name, &m->content, e)) {
        return e->status;
    }
    if (m->role == TL_ROLE_TOOL && !m->tool_call_id) {
        fmt_name(name, sizeof name, "messages[%d].tool_call_id", idx);
        return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required for role 'tool'", name);
    }
    return 0;
}

/* ====== Tools. ====== */

static int valid_fn_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

static int parse_tools(tl_oai_req *r, json_t *v, tl_oai_error *e) {
    char name[96];
    if (!json_is_array(v)) return FAIL_TYPE(e, "tools", "an array");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        fmt_name(name, sizeof name, "tools[%zu]", i);
        if (!json_is_object(t)) return FAIL_TYPE(e, name, "an object");
        json_t *ty = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        fmt_name(name, sizeof name, "tools[%zu].type", i);
        if (!json_is_string(ty)) return FAIL_TYPE(e, name, "a string");
        if (strcmp(json_string_value(ty), "function"))
            return tl_oai_fail(e, TL_ERR_UNSUPPORTED, name,
                               "tool type '%s' is not supported (function only)",
                               json_string_value(ty));
        const char *k;
        json_t *kv;
        json_object_foreach(t, k, kv) {
            if (strcmp(k, "type") && strcmp(k, "function")) {
                fmt_name(name, sizeof name, "tools[%zu].%s", i, k);
                return unsupported(name, e);
            }
        }
        fmt_name(name, sizeof name, "tools[%zu].function", i);
        if (!json_is_object(fn)) return FAIL_TYPE(e, name, "an object");
        json_object_foreach(fn, k, kv) {
            fmt_name(name, sizeof name, "tools[%zu].function.%s", i, k);
            if (!strcmp(k, "name")) {
                if (!json_is_string(kv) || !valid_fn_name(json_string_value(kv)))
                    return FAIL_TYPE(e, name, "a name of 1-64 characters [A-Za-z0-9_.-]");
            } else if (!strcmp(k, "description")) {
                if (!json_is_null(kv) && !json_is_string(kv)) return FAIL_TYPE(e, name, "a string");
            } else if (!strcmp(k, "parameters")) {
                if (!json_is_null(kv) && !json_is_object(kv))
                    return FAIL_TYPE(e, name, "a JSON Schema object");
            } else if (!strcmp(k, "strict")) {
                if (!json_is_null(kv) && !json_is_boolean(kv))
                    return FAIL_TYPE(e, name, "a boolean");
            } else {
                return unsupported(name, e);
            }
        }
        if (!json_object_get(fn, "name")) {
            fmt_name(name, sizeof name, "tools[%zu].function.name", i);
            return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is required", name);
        }
    }
    r->tools = json_array_size(v) ? v : NULL;
    r->n_tools = (int)json_array_size(v);
    return 0;
}

static int has_tool(const tl_oai_req *r, const char *name) {
    for (int i = 0; i < r->n_tools; i++) {
        json_t *fn = json_object_get(json_array_get(r->tools, (size_t)i), "function");
        if (!strcmp(json_string_value(json_object_get(fn, "name")), name)) return 1;
    }
    return 0;
}

static int parse_tool_choice(tl_oai_req *r, json_t *v, tl_oai_error *e) {
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto"))
            r->tool_choice = TL_TOOL_AUTO;
        else if (!strcmp(s, "none"))
            r->tool_choice = TL_TOOL_NONE;
        else if (!strcmp(s, "required"))
            r->tool_choice = TL_TOOL_REQUIRED;
        else
            return tl_oai_fail(e, TL_ERR_INVALID, "tool_choice",
                               "'tool_choice' is '%s', expected none, auto, required or an object",
                               s);
        return 0;
    }
    if (!json_is_object(v)) return FAIL_TYPE(e, "tool_choice", "a string or an object");
    json_t *ty = json_object_get(v, "type"), *fn = json_object_get(v, "function");
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
        return FAIL_TYPE(e, "tool_choice.type", "\"function\"");
    const char *k;
    json_t *kv;
    json_object_foreach(v, k, kv) {
        if (strcmp(k, "type") && strcmp(k, "function")) {
            char name[96];
            fmt_name(name, sizeof name, "tool_choice.%s", k);
            return unsupported(name, e);
        }
    }
    json_t *nm = fn ? json_object_get(fn, "name") : NULL;
    if (!json_is_object(fn) || !json_is_string(nm))
        return FAIL_TYPE(e, "tool_choice.function.name", "a string");
    r->tool_choice = TL_TOOL_NAMED;
    r->tool_name = json_string_value(nm);
    return 0;
}

/* ====== Top-level fields. ====== */

static int parse_stop(tl_oai_req *r, json_t *v, tl_oai_error *e) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0 || json_string_length(v) > TL_OAI_MAX_STOP_LEN)
            return FAIL_TYPE(e, "stop", "a non-empty string of at most 256 bytes");
        r->stop[r->n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v)) return FAIL_TYPE(e, "stop", "a string or an array of strings");
    if (json_array_size(v) > TL_OAI_MAX_STOP)
        return tl_oai_fail(e, TL_ERR_INVALID, "stop", "'stop' has %zu strings, at most %d allowed",
                           json_array_size(v), TL_OAI_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) == 0 ||
            json_string_length(s) > TL_OAI_MAX_STOP_LEN)
            return FAIL_TYPE(e, "stop", "an array of non-empty strings of at most 256 bytes");
        r->stop[r->n_stop++] = json_string_value(s);
    }
    return 0;
}

/* One prompt: a non-empty string or an array of token ids, into pr. name is the field
 * ("prompt" or "prompt[i]"). */
static int parse_one_prompt(tl_oai_prompt *pr, json_t *v, const char *name, int n_vocab,
                            tl_oai_error *e) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return tl_oai_fail(e, TL_ERR_INVALID, name, "'%s' is empty", name);
        pr->text = json_string_value(v);
        return 0;
    }
    if (json_is_array(v)) return get_ids(v, name, n_vocab, 1 << 24, &pr->ids, &pr->n_ids, e);
    return FAIL_TYPE(e, name, "a string or an array of token ids");
}

/* prompt: a string, an array of token ids, or an array of up to TL_OAI_MAX_PROMPTS of those
 * (docs/api.md §3, §6). */
static int parse_prompt(tl_oai_req *r, json_t *v, int n_vocab, tl_oai_error *e) {
    int batch =
        json_is_array(v) && json_array_size(v) > 0 && !json_is_integer(json_array_get(v, 0));
    size_t n = batch ? json_array_size(v) : 1;
    if (n > TL_OAI_MAX_PROMPTS)
        return tl_oai_fail(e, TL_ERR_INVALID, "prompt", "'prompt' has %zu prompts, at most %d", n,
                           TL_OAI_MAX_PROMPTS);
    r->prompts = xcalloc(n, sizeof *r->prompts);
    r->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, batch && n > 1 ? "prompt[%zu]" : "prompt", i);
        json_t *p = batch ? json_array_get(v, i) : v;
        if (batch && !json_is_string(p) && !json_is_array(p))
            return FAIL_TYPE(e, name, "a string or an array of token ids");
        int st = parse_one_prompt(&r->prompts[i], p, name, n_vocab, e);
        if (st) return st;
    }
    r->prompt_text = r->prompts[0].text;
    r->prompt_ids = r->prompts[0].ids;
    r->n_prompt_ids = r->prompts[0].n_ids;
    return 0;
}

static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        s = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return s;
}

/* chat_template_kwargs (the request's, or the server's default): enable_thinking and
 * preserve_thinking; any other key is refused by name. */
static int parse_ctk(tl_oai_req *r, json_t *v, const char *what, int *thinking_set,
                     tl_oai_error *e) {
    const char *ck;
    json_t *cv;
    char name[128];
    json_object_foreach(v, ck, cv) {
        fmt_name(name, sizeof name, "%s.%s", what, ck);
        if (!strcmp(ck, "enable_thinking")) {
            if (get_bool(cv, name, &r->enable_thinking, e)) return e->status;
            *thinking_set = 1;
        } else if (!strcmp(ck, "preserve_thinking")) {
            if (get_bool(cv, name, &r->preserve_thinking, e)) return e->status;
        } else {
            return unsupported(name, e);
        }
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]} (OpenAI), at most TL_MAX_LOGIT_BIAS entries. */
static int parse_logit_bias(tl_oai_req *r, json_t *v, int n_vocab, tl_oai_error *e) {
    if (!json_is_object(v)) return FAIL_TYPE(e, "logit_bias", "an object");
    size_t n = json_object_size(v);
    if (n > TL_MAX_LOGIT_BIAS)
        return tl_oai_fail(e, TL_ERR_INVALID, "logit_bias",
                           "'logit_bias' has %zu entries, at most %d allowed", n,
                           TL_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->bias_ids = malloc(n * sizeof *r->bias_ids);
    r->bias_vals = malloc(n * sizeof *r->bias_vals);
    if (!r->bias_ids || !r->bias_vals) return tl_oai_fail(e, TL_ERR_NOMEM, NULL, "out of memory");
    const char *k;
    json_t *x;
    char name[96];
    json_object_foreach(v, k, x) {
        fmt_name(name, sizeof name, "logit_bias.%s", k);
        char *end = NULL;
        long id = strtol(k, &end, 10);
        if (!*k || *end || k[0] == '-' || k[0] == '+' || k[0] == ' ' || id < 0 || id >= n_vocab)
            return tl_oai_fail(e, TL_ERR_INVALID, name,
                               "'logit_bias' key '%s' must be a token id in [0, %d)", k, n_vocab);
        float b;
        if (get_num(x, name, -100, 100, 0, &b, e)) return e->status;
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias++] = b;
    }
    return 0;
}

json_t *tl_oai_default_ctk(const char *text, char *err, size_t errlen) {
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    if (!json_is_object(v)) {
        snprintf(err, errlen, "not a JSON object%s%s", v ? "" : ": ", v ? "" : je.text);
        json_decref(v);
        return NULL;
    }
    tl_oai_req r;
    tl_oai_error e;
    int set = 0;
    memset(&r, 0, sizeof r);
    if (parse_ctk(&r, v, "--default-chat-template-kwargs", &set, &e)) {
        snprintf(err, errlen, "%s", e.msg);
        json_decref(v);
        return NULL;
    }
    return v;
}

/* Fields that do not change the output: accepted (type-checked loosely) and ignored
 * (docs/api.md). */
static int ignored_field(const char *k, int chat) {
    static const char *const both[] = {"user",
                                       "metadata",
                                       "store",
                                       "service_tier",
                                       "prompt_cache_key",
                                       "safety_identifier",
                                       "prompt_cache_retention",
                                       "request_id",
                                       "priority"};
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++)
        if (!strcmp(k, both[i])) return 1;
    (void)chat;
    return 0;
}

static int ignored_type_ok(const char *k, json_t *v, tl_oai_error *e) {
    if (!strcmp(k, "metadata") && !json_is_object(v)) return FAIL_TYPE(e, k, "an object");
    if (!strcmp(k, "store") && !json_is_boolean(v)) return FAIL_TYPE(e, k, "a boolean");
    if (!strcmp(k, "priority") && !json_is_integer(v)) return FAIL_TYPE(e, k, "an integer");
    if (strcmp(k, "metadata") && strcmp(k, "store") && strcmp(k, "priority") && !json_is_string(v))
        return FAIL_TYPE(e, k, "a string");
    return 0;
}

/* One top-level field. Returns 0, a negative status, or 1 for "not a field of this API". */
static int parse_field(tl_oai_req *r, const char *k, json_t *v, const tl_oai_opts *o, int n_vocab,
                       int *thinking_set, tl_oai_error *e) {
    int chat = r->kind == TL_OAI_CHAT;
    long long x;
    int b;
    tl_sample_params *sp = &r->sample;

    if (!strcmp(k, "model")) return get_str(v, k, &r->model, e);
    if (!strcmp(k, "messages") && chat) return 0; /* parsed after the loop */
    if (!strcmp(k, "prompt") && !chat) return parse_prompt(r, v, n_vocab, e);
    if (!strcmp(k, "stream")) return get_bool(v, k, &r->stream, e);
    if (!strcmp(k, "stream_options")) return 0; /* after the loop: needs stream */
    if (!strcmp(k, "max_tokens") || (!strcmp(k, "max_completion_tokens") && chat)) {
        if (get_int(v, k, 1, 1LL << 30, &x, e)) return e->status;
        if (r->max_tokens < 0 || !strcmp(k, "max_completion_tokens")) r->max_tokens = (int)x;
        return 0;
    }
    if (!strcmp(k, "temperature")) return get_num(v, k, 0, 2, 0, &sp->temperature, e);
    if (!strcmp(k, "top_p")) return get_num(v, k, 0, 1, 1, &sp->top_p, e);
    if (!strcmp(k, "min_p")) return get_num(v, k, 0, 1, 0, &sp->min_p, e);
    if (!strcmp(k, "presence_penalty")) return get_num(v, k, -2, 2, 0, &sp->presence_penalty, e);
    if (!strcmp(k, "frequency_penalty")) return get_num(v, k, -2, 2, 0, &sp->frequency_penalty, e);
    if (!strcmp(k, "repetition_penalty"))
        return get_num(v, k, 0, 10, 1, &sp->repetition_penalty, e);
    if (!strcmp(k, "top_k")) {
        if (get_int(v, k, -1, 1 << 20, &x, e)) return e->status;
        sp->top_k = x <= 0 ? 0 : (int)x; /* -1 and 0 both mean off (vLLM) */
        return 0;
    }
    if (!strcmp(k, "seed")) {
        if (!json_is_integer(v)) return FAIL_TYPE(e, k, "an integer");
        sp->seed = (uint64_t)json_integer_value(v);
        r->has_seed = 1;
        return 0;
    }
    if (!strcmp(k, "stop")) return parse_stop(r, v, e);
    if (!strcmp(k, "n")) { /* several choices: docs/api.md §6 */
        if (get_int(v, k, 1, TL_OAI_MAX_N, &x, e)) return e->status;
        r->n = (int)x;
        return 0;
    }
    if (!strcmp(k, "logprobs")) {
        if (chat) return get_bool(v, k, &r->logprobs, e);
        if (get_int(v, k, 0, TL_MAX_LOGPROBS, &x, e)) return e->status;
        r->logprobs = 1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(k, "top_logprobs") && chat) {
        if (get_int(v, k, 0, TL_MAX_LOGPROBS, &x, e)) return e->status;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(k, "tools") && chat) return parse_tools(r, v, e);
    if (!strcmp(k, "tool_choice") && chat) return 0; /* after the loop: needs tools */
    if (!strcmp(k, "parallel_tool_calls") && chat)
        return get_bool(v, k, &r->parallel_tool_calls, e);
    if (!strcmp(k, "enable_thinking") && chat) {
        if (get_bool(v, k, &b, e)) return e->status;
        if (!*thinking_set) r->enable_thinking = b;
        return 0;
    }
    if (!strcmp(k, "chat_template_kwargs") && chat) {
        if (!json_is_object(v)) return FAIL_TYPE(e, k, "an object");
        return parse_ctk(r, v, "chat_template_kwargs", thinking_set, e);
    }
    if (!strcmp(k, "reasoning_effort") && chat) { /* OpenAI's: "none"/"minimal" = thinking off */
        static const char *const on[] = {"low", "medium", "high", "xhigh"};
        const char *s = "";
        if (get_str(v, k, &s, e)) return e->status;
        int off = !strcmp(s, "none") || !strcmp(s, "minimal"), ok = off;
        for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) ok |= !strcmp(s, on[i]);
        if (!ok)
            return tl_oai_fail(e, TL_ERR_INVALID, k,
                               "'reasoning_effort' is '%s', expected none, minimal, low, medium, "
                               "high or xhigh",
                               s);
        if (!*thinking_set) r->enable_thinking = !off;
        return 0;
    }
    if (!strcmp(k, "ignore_eos")) return get_bool(v, k, &r->ignore_eos, e);
    if (!strcmp(k, "cache_salt")) { /* vLLM's: partitions the prefix cache */
        if (json_is_null(v)) return 0;
        if (get_str(v, k, &r->cache_salt, e)) return e->status;
        if (!r->cache_salt[0] || strlen(r->cache_salt) > 256)
            return tl_oai_fail(e, TL_ERR_INVALID, k, "'cache_salt' must be 1 to 256 bytes");
        return 0;
    }
    if (ignored_field(k, chat)) return ignored_type_ok(k, v, e);
    if (!strcmp(k, "min_tokens")) {
        if (get_int(v, k, 0, 1 << 30, &x, e)) return e->status;
        r->min_tokens = (int)x;
        return 0;
    }
    if (!strcmp(k, "stop_token_ids")) {
        if (json_is_array(v) && json_array_size(v) == 0) return 0;
        return get_ids(v, k, n_vocab, 64, &r->stop_ids, &r->n_stop_ids, e);
    }
    if (!strcmp(k, "include_stop_str_in_output")) return get_bool(v, k, &r->include_stop, e);
    if (!strcmp(k, "skip_special_tokens")) return get_bool(v, k, &r->skip_special, e);
    if (!strcmp(k, "spaces_between_special_tokens")) { /* only the default: no spaces added */
        if (get_bool(v, k, &b, e)) return e->status;
        return b ? 0 : unsupported(k, e);
    }
    if (tl_con_is_field(k)) return 0; /* constrain.c reads them (api.c make_job) */
    if (!strcmp(k, "logit_bias")) return parse_logit_bias(r, v, n_vocab, e);
    if (!strcmp(k, "echo") && !chat) return get_bool(v, k, &r->echo, e);
    if (!strcmp(k, "best_of") && !chat) {
        if (get_int(v, k, 1, 128, &x, e)) return e->status;
        return x != 1 ? unsupported(k, e) : 0;
    }
    if (!strcmp(k, "tulip_test_fail_lost")) {
        if (!o->test_mode) return unsupported(k, e);
        return get_bool(v, k, &r->fail_lost, e);
    }
    if (!strcmp(k, "tulip_test_fail_after")) {
        if (!o->test_mode) return unsupported(k, e);
        if (get_int(v, k, 1, 1 << 20, &x, e)) return e->status;
        r->fail_after = (int)x;
        return 0;
    }
    if (!strcmp(k, "tulip_test_script")) {
        if (!o->test_mode) return unsupported(k, e);
        return get_ids(v, k, n_vocab, TL_OAI_MAX_SCRIPT, &r->script, &r->n_script, e);
    }
    return 1;
}

int tl_oai_parse(tl_oai_req *r, tl_oai_kind kind, const char *body, size_t len,
                 const tl_oai_opts *o, int n_vocab, tl_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->enable_thinking = 1;
    r->parallel_tool_calls = 1;
    r->skip_special = 1;
    r->n = 1;
    r->sample.temperature = r->sample.top_p = r->sample.min_p = -1000;
    r->sample.presence_penalty = r->sample.frequency_penalty = r->sample.repetition_penalty = -1000;
    r->sample.top_k = -1000;

    json_error_t je;
    r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->root)
        return tl_oai_fail(e, TL_ERR_INVALID, NULL, "malformed JSON at line %d column %d: %s",
                           je.line, je.column, je.text);
    if (!json_is_object(r->root)) {
        tl_oai_fail(e, TL_ERR_INVALID, NULL, "the request body must be a JSON object");
        goto err;
    }

    int thinking_set = 0, dflt_set = 0;
    const char *k;
    json_t *v;
    if (kind == TL_OAI_CHAT && o->default_ctk &&
        parse_ctk(r, o->default_ctk, "--default-chat-template-kwargs", &dflt_set, e))
        goto err;
    json_object_foreach(r->root, k, v) {
        if (json_is_null(v)) continue;
        int st = parse_field(r, k, v, o, n_vocab, &thinking_set, e);
        if (st < 0) goto err;
        if (st == 1) {
            unsupported(k, e);
            goto err;
        }
    }

    int known = !r->model || !strcmp(r->model, o->model_name) ||
                (o->model_path && !strcmp(r->model, o->model_path));
    for (int i = 0; i < o->n_aliases && !known; i++) known = !strcmp(r->model, o->aliases[i]);
    if (!known) {
        tl_oai_fail(e, TL_ERR_INVALID, "model",
                    "the model '%s' does not exist (this server serves '%s')", r->model,
                    o->model_name);
        e->http = 404;
        e->code = "model_not_found";
        goto err;
    }

    json_t *so = json_object_get(r->root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!r->stream) {
            tl_oai_fail(e, TL_ERR_INVALID, "stream_options",
                        "'stream_options' is only allowed when 'stream' is true");
            goto err;
        }
        if (!json_is_object(so)) {
            FAIL_TYPE(e, "stream_options", "an object");
            goto err;
        }
        json_object_foreach(so, k, v) {
            char name[96];
            fmt_name(name, sizeof name, "stream_options.%s", k);
            if (!strcmp(k, "include_usage")) {
                if (!json_is_null(v) && get_bool(v, name, &r->include_usage, e)) goto err;
            } else if (!strcmp(k, "continuous_usage_stats")) { /* vLLM: usage in every chunk */
                int b = 0;
                if (!json_is_null(v) && get_bool(v, name, &b, e)) goto err;
                if (b) {
                    unsupported(name, e);
                    goto err;
                }
            } /* other keys (include_obfuscation, ...) shape only the transport: ignored */
        }
    }

    if (kind == TL_OAI_CHAT) {
        json_t *ms = json_object_get(r->root, "messages");
        if (!ms || json_is_null(ms)) {
            tl_oai_fail(e, TL_ERR_INVALID, "messages", "'messages' is required");
            goto err;
        }
        if (!json_is_array(ms)) {
            FAIL_TYPE(e, "messages", "an array");
            goto err;
        }
        if (json_array_size(ms) == 0) {
            tl_oai_fail(e, TL_ERR_INVALID, "messages", "'messages' must not be empty");
            goto err;
        }
        r->msgs = xcalloc(json_array_size(ms), sizeof *r->msgs);
        for (size_t i = 0; i < json_array_size(ms); i++) {
            r->n_msgs++;
            if (parse_message(json_array_get(ms, i), (int)i, &r->msgs[i], e)) goto err;
        }
        json_t *tc = json_object_get(r->root, "tool_choice");
        if (tc && !json_is_null(tc)) {
            if (parse_tool_choice(r, tc, e)) goto err;
            if ((r->tool_choice == TL_TOOL_REQUIRED || r->tool_choice == TL_TOOL_NAMED) &&
                !r->n_tools) {
                tl_oai_fail(e, TL_ERR_INVALID, "tool_choice",
                            "'tool_choice' requires a tool call but 'tools' is empty");
                goto err;
            }
            if (r->tool_choice == TL_TOOL_NAMED && !has_tool(r, r->tool_name)) {
                tl_oai_fail(e, TL_ERR_INVALID, "tool_choice",
                            "'tool_choice' names '%s', which is not in 'tools'", r->tool_name);
                goto err;
            }
        }
        if (r->top_logprobs > 0 && !r->logprobs) {
            tl_oai_fail(e, TL_ERR_INVALID, "top_logprobs",
                        "'top_logprobs' requires 'logprobs' to be true");
            goto err;
        }
    } else if (!r->n_prompts) {
        tl_oai_fail(e, TL_ERR_INVALID, "prompt", "'prompt' is required");
        goto err;
    }

    /* Unset sampling fields take the defaults of the mode. */
    const tl_sample_params *d = kind == TL_OAI_COMPLETION ? &o->defaults->completion
                                : r->enable_thinking      ? &o->defaults->thinking
                                                          : &o->defaults->non_thinking;
    tl_sample_params *sp = &r->sample;
    if (sp->temperature == -1000) sp->temperature = d->temperature;
    if (sp->top_p == -1000) sp->top_p = d->top_p;
    if (sp->min_p == -1000) sp->min_p = d->min_p;
    if (sp->presence_penalty == -1000) sp->presence_penalty = d->presence_penalty;
    if (sp->frequency_penalty == -1000) sp->frequency_penalty = d->frequency_penalty;
    if (sp->repetition_penalty == -1000) sp->repetition_penalty = d->repetition_penalty;
    if (sp->top_k == -1000) sp->top_k = d->top_k;
    if (!r->has_seed) sp->seed = random_seed();
    sp->n_logprobs = r->logprobs ? r->top_logprobs : 0;
    sp->n_bias = r->n_bias, sp->bias_ids = r->bias_ids, sp->bias_vals = r->bias_vals;
    for (int i = 0; i < r->n_prompts; i++)
        if (r->echo && !r->prompts[i].text) {
            tl_oai_fail(e, TL_ERR_UNSUPPORTED, "echo",
                        "'echo' is supported with text prompts (not token ids)");
            goto err;
        }
    if ((long)r->n * TL_MAX(r->n_prompts, 1) > TL_OAI_MAX_CHOICES) {
        tl_oai_fail(e, TL_ERR_INVALID, "n",
                    "%d prompts x n = %d asks for %d choices, at most %d per request", r->n_prompts,
                    r->n, r->n_prompts * r->n, TL_OAI_MAX_CHOICES);
        goto err;
    }
    if (kind == TL_OAI_COMPLETION && r->max_tokens < 0) r->max_tokens = 16; /* OpenAI default */
    return 0;

err:
    tl_oai_req_free(r);
    return e->status;
}

void tl_oai_req_free(tl_oai_req *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].content);
        free(r->msgs[i].tool_calls);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i].ids);
    free(r->prompts);
    free(r->script);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->stop_ids);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

/* ====== Responses. ====== */

char *tl_oai_dump(json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(v);
    if (!s) s = xstrdup("{}");
    return s;
}

json_t *tl_oai_usage_json(const tl_oai_usage *u) {
    json_t *o = json_object();
    json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    json_object_set_new(o, "total_tokens", json_integer(u->prompt_tokens + u->completion_tokens));
    json_t *p = json_object();
    json_object_set_new(p, "cached_tokens", json_integer(u->cached_tokens));
    json_object_set_new(o, "prompt_tokens_details", p);
    json_t *d = json_object();
    json_object_set_new(d, "reasoning_tokens", json_integer(u->reasoning_tokens));
    json_object_set_new(o, "completion_tokens_details", d);
    return o;
}

/* A token's text as a JSON string (invalid UTF-8 replaced by U+FFFD, as OpenAI does) and its
 * raw bytes as an array of integers. */
static json_t *lp_text(const char *s, int n) {
    if (tl_utf8_valid(s, (size_t)n)) return json_stringn(s, (size_t)n);
    char buf[64 * 3 + 1];
    int o = 0;
    for (int i = 0; i < n;) { /* one U+FFFD per invalid byte (not per maximal subpart) */
        size_t len;
        if (tl_utf8_decode(s + i, (size_t)(n - i), NULL, &len) == TL_UTF8_OK) {
            memcpy(buf + o, s + i, len);
            o += (int)len;
            i += (int)len;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    return json_stringn(buf, (size_t)o);
}

static json_t *lp_bytes(const char *s, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

json_t *tl_oai_chat_logprobs_json(const tl_oai_lp *lp, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "token", lp_text(lp[i].text, lp[i].text_len));
        json_object_set_new(t, "logprob", json_real(lp[i].logprob));
        json_object_set_new(t, "bytes", lp_bytes(lp[i].text, lp[i].text_len));
        json_t *tops = json_array();
        for (int j = 0; j < lp[i].n_top; j++) {
            json_t *x = json_object();
            json_object_set_new(x, "token", lp_text(lp[i].top_text[j], lp[i].top_len[j]));
            json_object_set_new(x, "logprob", json_real(lp[i].top_logprob[j]));
            json_object_set_new(x, "bytes", lp_bytes(lp[i].top_text[j], lp[i].top_len[j]));
            json_array_append_new(tops, x);
        }
        json_object_set_new(t, "top_logprobs", tops);
        json_array_append_new(content, t);
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

json_t *tl_oai_completion_logprobs_json(const tl_oai_lp *lp, int n, int text_offset0) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int off = text_offset0;
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, lp_text(lp[i].text, lp[i].text_len));
        json_array_append_new(lps, json_real(lp[i].logprob));
        json_t *d = json_object();
        for (int j = 0; j < lp[i].n_top; j++) {
            json_t *key = lp_text(lp[i].top_text[j], lp[i].top_len[j]);
            json_object_set_new(d, json_string_value(key), json_real(lp[i].top_logprob[j]));
            json_decref(key);
        }
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer(off));
        off += lp[i].text_len;
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

json_t *tl_oai_envelope(const char *id, const char *object, long created, const char *model,
                        json_t *choice, json_t *usage) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(created));
    json_object_set_new(o, "model", json_string(model));
    json_t *choices = json_array();
    if (choice) json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    if (usage) json_object_set_new(o, "usage", usage);
    return o;
}

void tl_oai_make_id(char *out, size_t outlen, const char *prefix) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char rnd[24];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (unsigned char)(rand() & 0xff);
    size_t p = (size_t)snprintf(out, outlen, "%s", prefix);
    for (size_t i = 0; i < sizeof rnd && p + 1 < outlen; i++) out[p++] = al[rnd[i] % 62];
    if (p < outlen) out[p] = 0;
}
