/* The small endpoints, in vLLM's request and response shapes: POST /tokenize, POST /detokenize,
 * GET /version (tulip's version, commit, build architecture and the chat template check). (/ping
 * answers as /health; http.c routes it.) Token ids are those of the
 * server's tokenizer; a chat request is rendered with the same template as
 * /v1/chat/completions. Runs on the connection threads; reads only the tl_server and the
 * (thread-safe) tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "server/server.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat.h"

#ifndef TL_VERSION
#define TL_VERSION "0.1.0"
#endif

static void reply_json(tl_reply *out, int status, json_t *v) {
    memset(out, 0, sizeof *out);
    out->status = status;
    out->content_type = "application/json";
    out->body = tl_oai_dump(v);
    out->body_len = strlen(out->body);
}

static void reply_fail(tl_reply *out, int st, const char *param, const char *msg) {
    tl_oai_error e;
    tl_oai_fail(&e, st, param, "%s", msg);
    tl_api_error(out, &e);
}

/* The body as a JSON object, or NULL with *out set to the 400. */
static json_t *load_object(const char *body, size_t len, tl_reply *out) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    char msg[300];
    if (!root) {
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s", je.text);
        reply_fail(out, TL_ERR_INVALID, NULL, msg);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        reply_fail(out, TL_ERR_INVALID, NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

/* 1 if every key of o is in the NULL-terminated list; else the 400 naming the first other. */
static int known_keys(json_t *o, const char *const *keys, tl_reply *out) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) {
            char msg[200];
            snprintf(msg, sizeof msg, "unknown field '%.100s'", k);
            reply_fail(out, TL_ERR_INVALID, k, msg);
            return 0;
        }
    }
    return 1;
}

/* A bool field: default when absent; -1 with the 400 when it is not a bool. */
static int opt_bool(json_t *o, const char *key, int def, tl_reply *out) {
    json_t *v = json_object_get(o, key);
    if (!v) return def;
    if (json_is_boolean(v)) return json_is_true(v);
    char msg[120];
    snprintf(msg, sizeof msg, "'%s' must be a boolean", key);
    reply_fail(out, TL_ERR_INVALID, key, msg);
    return -1;
}

/* The chat template's text for {"messages", "tools"?, "add_generation_prompt"?,
 * "chat_template_kwargs"?: {"enable_thinking"?}}. 0, or the status with *out set. */
static int render_chat(json_t *root, char **text, size_t *len, tl_reply *out) {
    json_t *msgs = json_object_get(root, "messages"), *tools = json_object_get(root, "tools");
    if (!json_is_array(msgs)) {
        reply_fail(out, TL_ERR_INVALID, "messages", "'messages' must be an array");
        return TL_ERR_INVALID;
    }
    if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        reply_fail(out, TL_ERR_INVALID, "tools", "'tools' must be an array");
        return TL_ERR_INVALID;
    }
    tl_chat_opts co;
    tl_chat_opts_default(&co);
    co.add_generation_prompt = opt_bool(root, "add_generation_prompt", 1, out);
    if (co.add_generation_prompt < 0) return TL_ERR_INVALID;
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (kw && !json_is_object(kw)) {
        reply_fail(out, TL_ERR_INVALID, "chat_template_kwargs",
                   "'chat_template_kwargs' must be an object");
        return TL_ERR_INVALID;
    }
    if (kw) {
        co.enable_thinking = opt_bool(kw, "enable_thinking", 1, out);
        if (co.enable_thinking < 0) return TL_ERR_INVALID;
    }
    char err[256] = "";
    int st = tl_chat_render(msgs, json_is_array(tools) && json_array_size(tools) ? tools : NULL,
                            &co, text, len, err, sizeof err);
    if (st) reply_fail(out, st == TL_ERR_NOMEM ? st : TL_ERR_INVALID, "messages", err);
    return st;
}

void tl_api_tokenize(tl_server *s, const char *body, size_t len, tl_reply *out) {
    static const char *const keys[] = {"model",
                                       "prompt",
                                       "messages",
                                       "tools",
                                       "add_generation_prompt",
                                       "add_special_tokens",
                                       "chat_template_kwargs",
                                       NULL};
    json_t *root = load_object(body, len, out);
    if (!root) return;
    json_t *prompt = json_object_get(root, "prompt"), *msgs = json_object_get(root, "messages");
    char *text = NULL;
    size_t n = 0;
    int st = 0;
    if (!known_keys(root, keys, out) || opt_bool(root, "add_special_tokens", 1, out) < 0) {
        st = TL_ERR_INVALID;
    } else if (!prompt == !msgs) {
        reply_fail(out, TL_ERR_INVALID, NULL, "give either 'prompt' (a string) or 'messages'");
        st = TL_ERR_INVALID;
    } else if (prompt) {
        if (!json_is_string(prompt)) {
            reply_fail(out, TL_ERR_INVALID, "prompt", "'prompt' must be a string");
            st = TL_ERR_INVALID;
        } else {
            n = json_string_length(prompt);
            text = malloc(n + 1);
            if (text) memcpy(text, json_string_value(prompt), n + 1);
        }
    } else {
        st = render_chat(root, &text, &n, out);
    }
    json_decref(root);
    if (st) return;
    tl_tok_ids ids = {0};
    st = text ? tl_tokenize(s->tok, text, n, 0, &ids) : TL_ERR_NOMEM;
    free(text);
    if (st < 0) {
        tl_tok_ids_free(&ids);
        reply_fail(out, st, NULL, "the tokenizer failed");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < ids.n; i++) json_array_append_new(arr, json_integer(ids.ids[i]));
    tl_tok_ids_free(&ids);
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)json_array_size(arr)));
    json_object_set_new(o, "max_model_len", json_integer(s->max_ctx));
    json_object_set_new(o, "tokens", arr);
    reply_json(out, 200, o);
}

/* The ids of {"tokens": [...]} into a malloc'd array; NULL with the 400 (or 500) in *out. */
static int32_t *token_ids(tl_server *s, json_t *toks, size_t *n, tl_reply *out) {
    if (!json_is_array(toks)) {
        reply_fail(out, TL_ERR_INVALID, "tokens", "'tokens' must be an array of token ids");
        return NULL;
    }
    *n = json_array_size(toks);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    if (!ids) {
        reply_fail(out, TL_ERR_NOMEM, NULL, "out of memory");
        return NULL;
    }
    int n_vocab = tl_tokenizer_n_vocab(s->tok);
    for (size_t i = 0; i < *n; i++) {
        json_t *v = json_array_get(toks, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= n_vocab || !tl_token_str(s->tok, (int32_t)id, &(size_t){0})) {
            char msg[200], param[48];
            snprintf(msg, sizeof msg, "tokens[%zu] is not a token id of this tokenizer (0..%d)", i,
                     n_vocab - 1);
            snprintf(param, sizeof param, "tokens[%zu]", i);
            reply_fail(out, TL_ERR_INVALID, param, msg);
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)id;
    }
    return ids;
}

void tl_api_detokenize(tl_server *s, const char *body, size_t len, tl_reply *out) {
    static const char *const keys[] = {"model", "tokens", NULL};
    json_t *root = load_object(body, len, out);
    if (!root) return;
    size_t n = 0;
    int32_t *ids =
        known_keys(root, keys, out) ? token_ids(s, json_object_get(root, "tokens"), &n, out) : NULL;
    json_decref(root);
    if (!ids) return;
    char *text = NULL;
    size_t tlen = 0;
    int st = tl_detokenize(s->tok, ids, n, 0, &text, &tlen);
    free(ids);
    if (st < 0) {
        reply_fail(out, st, "tokens", "the tokens cannot be decoded");
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text, tlen));
    free(text);
    reply_json(out, 200, o);
}

void tl_api_version(tl_server *s, tl_reply *out) {
    static const char *tmpl[] = {"unchecked", "absent", "match", "differs"};
    int t = atomic_load(&s->template_check);
    json_t *o = json_object();
    json_object_set_new(o, "version", json_string(s->p.version ? s->p.version : TL_VERSION));
    json_object_set_new(o, "commit", json_string(s->p.commit ? s->p.commit : "unknown"));
    json_object_set_new(o, "arch", json_string(s->p.arch ? s->p.arch : "unknown"));
    json_object_set_new(o, "chat_template", json_string(tmpl[t >= 0 && t < 4 ? t : 0]));
    reply_json(out, 200, o);
}
