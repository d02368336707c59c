/* Constrained decoding in the server (see constrain.h): request fields -> tl_grammar_spec ->
 * grammar, and the per-job state the engine thread drives (mask before a sample, accept after).
 *
 * Request fields (chat completions and completions; the Responses API's text.format arrives
 * here as response_format, responses.c):
 *   response_format {"type":"text"} | {"type":"json_object"} |
 *                   {"type":"json_schema","json_schema":{"name","schema","strict","description"}}
 *   structured_outputs {"json": schema | JSON text, "regex": str, "choice": [str],
 *                       "json_object": true}   (exactly one member)
 *   guided_json (schema | JSON text), guided_regex, guided_choice   (vLLM's older names)
 * At most one of them. Tool calls: tool_choice "required" / a named function, or tools marked
 * "strict": true under tool_choice "auto" (constrained from "<tool_call>" on). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/constrain.h"
#include "tokenizer/bpe.h"

/* Masks a job's cache keeps (19 KB each for the 151K vocabulary): the string interiors and
 * structural positions a document revisits (docs/architecture.md §9 "Mask"). */
#define TL_CON_MASKS 8

struct tl_con {
    const tl_con_ctx *ctx;
    tl_grammar *g;
    tl_grammar_state *st;
    tl_grammar_cache *cache; /* interned states, memoized transitions, recent masks */
    uint32_t *mask;
    int wait_think;  /* free until </think> */
    int32_t trigger; /* then free until this token (-1: none) */
    int active;
};

/* ====== Server-wide context. ====== */

int tl_con_ctx_init(tl_con_ctx *c, const struct tl_tokenizer *tok, int n_rows,
                    const int32_t *end_ids, int n_end, int think_end_id, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    int st = tl_grammar_vocab_from_tokenizer(tok, &c->vocab);
    if (st) return tl_errf(err, errlen, st, "building the grammar vocabulary failed");
    c->tok = tok;
    int n = tl_tokenizer_n_vocab(tok) > n_rows ? tl_tokenizer_n_vocab(tok) : n_rows;
    c->n_words = (n + 31) / 32;
    c->n_end = n_end < 4 ? n_end : 4;
    for (int i = 0; i < c->n_end; i++) c->end_ids[i] = end_ids[i];
    c->tool_open = tl_token_id(tok, "<tool_call>");
    c->tool_close = tl_token_id(tok, "</tool_call>");
    c->think_end_id = think_end_id;
    return 0;
}

void tl_con_ctx_free(tl_con_ctx *c) {
    tl_grammar_vocab_free(c->vocab);
    c->vocab = NULL;
}

/* ====== Request -> spec. ====== */

static const char *const fields[] = {"response_format", "structured_outputs", "guided_json",
                                     "guided_regex",    "guided_choice",      NULL};

int tl_con_is_field(const char *k) {
    for (const char *const *f = fields; *f; f++)
        if (!strcmp(*f, k)) return 1;
    return 0;
}

typedef struct req_spec {
    tl_grammar_spec sp;
    json_t *owned; /* a schema parsed from JSON text */
    const char *field;
} req_spec;

/* A schema given as an object, or as JSON text (vLLM accepts both). */
static int schema_value(req_spec *rs, json_t *v, const char *field, tl_oai_error *e) {
    if (json_is_string(v)) {
        rs->owned = json_loads(json_string_value(v), 0, NULL);
        v = rs->owned;
    }
    if (!json_is_object(v) && !json_is_boolean(v))
        return tl_oai_fail(e, TL_ERR_INVALID, field, "'%s' must be a JSON schema (an object)",
                           field);
    rs->sp.kind = TL_GRAMMAR_SCHEMA;
    rs->sp.schema = v;
    return 0;
}

static int parse_response_format(req_spec *rs, json_t *v, tl_oai_error *e) {
    const char *t = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !t)
        return tl_oai_fail(e, TL_ERR_INVALID, "response_format.type",
                           "'response_format' must be an object with a string 'type'");
    if (!strcmp(t, "text")) return 0;
    rs->field = "response_format";
    if (!strcmp(t, "json_object")) {
        rs->sp.kind = TL_GRAMMAR_JSON_OBJECT;
        return 1;
    }
    if (strcmp(t, "json_schema"))
        return tl_oai_fail(e, TL_ERR_UNSUPPORTED, "response_format.type",
                           "'response_format' type '%s' is not supported (text, json_object, "
                           "json_schema)",
                           t);
    json_t *js = json_object_get(v, "json_schema"), *s = json_object_get(js, "schema");
    if (!json_is_object(js) || !s)
        return tl_oai_fail(e, TL_ERR_INVALID, "response_format.json_schema.schema",
                           "'response_format' json_schema needs 'json_schema': {'name', "
                           "'schema'}");
    int st = schema_value(rs, s, "response_format.json_schema.schema", e);
    return st ? st : 1;
}

static int parse_structured(req_spec *rs, json_t *v, tl_oai_error *e) {
    if (!json_is_object(v) || json_object_size(v) != 1)
        return tl_oai_fail(e, TL_ERR_INVALID, "structured_outputs",
                           "'structured_outputs' must be an object with exactly one of json, "
                           "regex, choice, json_object");
    const char *k = json_object_iter_key(json_object_iter(v));
    json_t *x = json_object_iter_value(json_object_iter(v));
    rs->field = "structured_outputs";
    if (!strcmp(k, "json")) return schema_value(rs, x, "structured_outputs.json", e) ?: 1;
    if (!strcmp(k, "json_object") && json_is_true(x)) {
        rs->sp.kind = TL_GRAMMAR_JSON_OBJECT;
        return 1;
    }
    if (!strcmp(k, "regex") && json_is_string(x)) {
        rs->sp.kind = TL_GRAMMAR_REGEX;
        rs->sp.regex = json_string_value(x);
        return 1;
    }
    if (!strcmp(k, "choice")) {
        rs->sp.kind = TL_GRAMMAR_CHOICE;
        rs->sp.choices = x;
        return 1;
    }
    return tl_oai_fail(e, TL_ERR_UNSUPPORTED, "structured_outputs",
                       "'structured_outputs.%s' is not supported (json, regex, choice, "
                       "json_object)",
                       k);
}

/* The one output constraint field of the request, into rs. 1 = found, 0 = none, < 0 = error. */
static int output_spec(const tl_oai_req *r, req_spec *rs, tl_oai_error *e) {
    int found = 0, st = 0;
    for (const char *const *f = fields; *f && st >= 0; f++) {
        json_t *v = json_object_get(r->root, *f);
        if (!v || json_is_null(v)) continue;
        if (found)
            return tl_oai_fail(e, TL_ERR_INVALID, *f,
                               "'%s' cannot be combined with '%s' (one output constraint)", *f,
                               rs->field);
        if (!strcmp(*f, "response_format")) {
            st = parse_response_format(rs, v, e);
        } else if (!strcmp(*f, "structured_outputs")) {
            st = parse_structured(rs, v, e);
        } else if (!strcmp(*f, "guided_json")) {
            rs->field = *f;
            st = schema_value(rs, v, *f, e) ?: 1;
        } else if (!strcmp(*f, "guided_regex")) {
            if (!json_is_string(v))
                return tl_oai_fail(e, TL_ERR_INVALID, *f, "'%s' must be a string", *f);
            rs->field = *f;
            rs->sp.kind = TL_GRAMMAR_REGEX;
            rs->sp.regex = json_string_value(v);
            st = 1;
        } else {
            rs->field = *f;
            rs->sp.kind = TL_GRAMMAR_CHOICE;
            rs->sp.choices = v;
            st = 1;
        }
        found |= st > 0;
    }
    return st < 0 ? st : found;
}

static int any_strict(const tl_oai_req *r) {
    for (size_t i = 0; i < json_array_size(r->tools); i++)
        if (json_is_true(json_object_get(json_object_get(json_array_get(r->tools, i), "function"),
                                         "strict")))
            return 1;
    return 0;
}

/* ====== Request -> tl_con. ====== */

static int con_new(const tl_con_ctx *ctx, tl_grammar *g, tl_con **out) {
    tl_con *c = calloc(1, sizeof *c);
    if (!c) return TL_ERR_NOMEM;
    c->ctx = ctx;
    c->g = g;
    c->trigger = -1;
    c->mask = calloc((size_t)ctx->n_words, sizeof(uint32_t));
    int st = c->mask ? tl_grammar_state_new(g, &c->st) : TL_ERR_NOMEM;
    if (!st) st = tl_grammar_cache_new(g, ctx->vocab, TL_CON_MASKS, &c->cache);
    if (st) {
        tl_con_free(c);
        return st;
    }
    *out = c;
    return 0;
}

/* The tool-call spec of the request: 1 (forced or strict), 0 (none). */
static int tool_spec(const tl_oai_req *r, tl_grammar_spec *sp, int *trigger) {
    *trigger = 0;
    if (r->kind != TL_OAI_CHAT || !r->n_tools || r->tool_choice == TL_TOOL_NONE) return 0;
    int forced = r->tool_choice == TL_TOOL_REQUIRED || r->tool_choice == TL_TOOL_NAMED;
    if (!forced && !any_strict(r)) return 0;
    *sp = (tl_grammar_spec){.kind = TL_GRAMMAR_TOOL_CALLS,
                            .tools = r->tools,
                            .tool_name = r->tool_choice == TL_TOOL_NAMED ? r->tool_name : NULL,
                            .parallel = r->parallel_tool_calls,
                            .lenient = forced,
                            .prefix = forced && r->enable_thinking ? "\n\n" : NULL};
    *trigger = !forced;
    return 1;
}

int tl_con_from_request(const tl_con_ctx *ctx, const tl_oai_req *r, tl_con **out, tl_oai_error *e) {
    *out = NULL;
    req_spec rs = {0};
    int has_out = output_spec(r, &rs, e), trigger = 0;
    if (has_out < 0) {
        json_decref(rs.owned);
        return has_out;
    }
    tl_grammar_spec tsp;
    int has_tool = tool_spec(r, &tsp, &trigger);
    if (has_out && has_tool) {
        json_decref(rs.owned);
        return tl_oai_fail(e, TL_ERR_INVALID, rs.field,
                           "'%s' cannot be combined with a forced or strict tool call", rs.field);
    }
    if (!has_out && !has_tool) return 0;
    if (!ctx || !ctx->vocab) {
        json_decref(rs.owned);
        return tl_oai_fail(e, TL_ERR_UNSUPPORTED, has_out ? rs.field : "tools",
                           "constrained decoding is not available on this server");
    }
    if (has_out) rs.sp.prefix = r->kind == TL_OAI_CHAT && r->enable_thinking ? "\n\n" : NULL;
    tl_grammar *g = NULL;
    char err[400] = "";
    int st = tl_grammar_compile(has_out ? &rs.sp : &tsp, &g, err, sizeof err);
    json_decref(rs.owned);
    if (!st && err[0]) /* a forced call to a tool that is not strict, relaxed (toolcall.c) */
        fprintf(stderr, "tulip: forced tool call: %s\n", err);
    if (st)
        return tl_oai_fail(e,
                           st == TL_ERR_NOMEM     ? st
                           : st == TL_ERR_INVALID ? st
                                                  : TL_ERR_UNSUPPORTED,
                           has_out ? rs.field : "tools", "%s", err);
    st = con_new(ctx, g, out);
    if (st) {
        tl_grammar_free(g);
        return tl_oai_fail(e, st, NULL, "out of memory");
    }
    (*out)->wait_think = r->kind == TL_OAI_CHAT && r->enable_thinking && ctx->think_end_id >= 0;
    (*out)->trigger = trigger ? ctx->tool_open : -1;
    (*out)->active = !(*out)->wait_think && (*out)->trigger < 0;
    return 0;
}

void tl_con_free(tl_con *c) {
    if (!c) return;
    tl_grammar_cache_free(c->cache);
    tl_grammar_state_free(c->st);
    tl_grammar_free(c->g);
    free(c->mask);
    free(c);
}

int tl_con_active(const tl_con *c) { return c && c->active; }

/* ====== Engine thread. ====== */

static int is_end(const tl_con_ctx *x, int32_t t) {
    for (int i = 0; i < x->n_end; i++)
        if (x->end_ids[i] == t) return 1;
    return 0;
}

/* The bytes a token adds to the document: its text; "<tool_call>"/"</tool_call>" too although
 * they are added tokens; NULL for any other added token (never inside the grammar). */
static const char *token_bytes(const tl_con *c, int32_t t, size_t *n) {
    const tl_con_ctx *x = c->ctx;
    if (t != x->tool_open && t != x->tool_close && tl_token_is_added(x->tok, t)) return NULL;
    return tl_token_str(x->tok, t, n);
}

/* Sets the bits of "<tool_call>"/"</tool_call>" when their text is accepted within max_dist. */
static int add_tool_tokens(tl_con *c, int max_dist) {
    const int32_t ids[2] = {c->ctx->tool_open, c->ctx->tool_close};
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        const char *s = ids[i] >= 0 ? tl_token_str(c->ctx->tok, ids[i], &n) : NULL;
        if (!s) continue;
        tl_grammar_state *k;
        int st = tl_grammar_state_clone(c->st, &k);
        if (st) return st;
        if (!tl_grammar_accept_bytes(k, (const uint8_t *)s, n) &&
            (max_dist < 0 || tl_grammar_distance(k) <= max_dist))
            c->mask[ids[i] >> 5] |= 1u << (ids[i] & 31);
        tl_grammar_state_free(k);
    }
    return 0;
}

static int mask_empty(const tl_con *c) {
    for (int i = 0; i < c->ctx->n_words; i++)
        if (c->mask[i]) return 0;
    return 1;
}

/* End ids past the tokenizer's vocabulary (a model config whose eos ids the tokenizer lacks, e.g.
 * random weights with the Qwen3.6 ids served with an older tokenizer): the grammar's mask covers
 * the tokenizer's ids only, so they are set here, where the document is complete (the mask
 * spans the model's rows: tl_con_ctx_init). Without them a complete document left nothing to
 * sample before max_tokens. */
static void add_far_ends(tl_con *c) {
    int nv = tl_tokenizer_n_vocab(c->ctx->tok), done = tl_grammar_is_complete(c->st);
    for (int i = 0; i < c->ctx->n_end; i++) {
        int32_t t = c->ctx->end_ids[i];
        if (t < nv || t >= c->ctx->n_words * 32) continue;
        if (done) /* set, or cleared: the grammar's mask does not write these words' bits */
            c->mask[t >> 5] |= 1u << (t & 31);
        else
            c->mask[t >> 5] &= ~(1u << (t & 31));
    }
}

static int compute(tl_con *c, int max_dist) {
    int st = tl_grammar_mask_cached(c->cache, c->st, c->ctx->end_ids, (size_t)c->ctx->n_end,
                                    max_dist, c->mask);
    if (!st) add_far_ends(c);
    return st ? st : add_tool_tokens(c, max_dist);
}

int tl_con_mask(tl_con *c, int remaining, const uint32_t **mask, char *err, size_t errlen) {
    *mask = NULL;
    if (!c->active) return 0;
    int st;
    if (remaining == 1 && tl_grammar_is_complete(c->st)) { /* only an end token fits */
        memset(c->mask, 0, (size_t)c->ctx->n_words * sizeof(uint32_t));
        for (int i = 0; i < c->ctx->n_end; i++)
            c->mask[c->ctx->end_ids[i] >> 5] |= 1u << (c->ctx->end_ids[i] & 31);
        *mask = c->mask;
        return 0;
    }
    /* a bound only while the document can still be completed in time; else it is cut at the
     * limit ("length") like any output */
    st = compute(c, remaining >= 2 ? remaining - 2 : -1);
    if (!st && remaining >= 2 && mask_empty(c)) st = compute(c, -1);
    if (st) return tl_errf(err, errlen, st, "computing the constrained-decoding mask failed");
    if (mask_empty(c))
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "constrained decoding: no token of the vocabulary continues the output");
    *mask = c->mask;
    return 0;
}

int tl_con_accept(tl_con *c, int32_t t, char *err, size_t errlen) {
    if (!c->active) {
        if (c->wait_think) {
            if (t == c->ctx->think_end_id) {
                c->wait_think = 0;
                c->active = c->trigger < 0;
            }
            return 0;
        }
        if (t != c->trigger) return 0;
        c->active = 1; /* the trigger token is the grammar's first piece: fed below */
    }
    if (is_end(c->ctx, t)) {
        if (tl_grammar_is_complete(c->st)) return 0;
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "constrained decoding: end of sequence before the output is complete");
    }
    size_t n = 0;
    const char *s = token_bytes(c, t, &n);
    if (!s || tl_grammar_accept_bytes(c->st, (const uint8_t *)s, n))
        return tl_errf(err, errlen, TL_ERR_INTERNAL,
                       "constrained decoding: token %d is outside the grammar (the sampler did "
                       "not apply the mask)",
                       t);
    return 0;
}
