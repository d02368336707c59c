/* The tokenizer.json scanner (see tokjson.h): model.vocab and model.merges straight into flat
 * arrays, every other value through jansson, and the same result built from GGUF-style arrays.
 * It checks the whole text is well-formed JSON (what serde_json and jansson accept); errors name
 * the byte offset. Nothing here knows what the values mean: bpe_load.c does. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/utf8.h"
#include "tokenizer/tokjson.h"

/* ====== Scanning. ====== */

static int tj_fail(tokjson *j, const char *what) {
    return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "tokenizer JSON at byte %zu: %s",
                   (size_t)(j->p - j->start), what);
}

static void tj_ws(tokjson *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int tj_expect(tokjson *j, char c) {
    tj_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return tj_fail(j, msg);
    }
    j->p++;
    return 0;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'                 ? c - '0'
                          : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10
                                                               : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* A \u escape at j->p (after "\u"): four hex digits, or a surrogate pair of two escapes. */
static int tj_unicode(tokjson *j, tl_buf *out) {
    uint32_t cp, lo;
    if (j->end - j->p < 4 || hex4(j->p, &cp)) return tj_fail(j, "bad \\u escape");
    j->p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return tj_fail(j, "lone surrogate escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
            return tj_fail(j, "lone surrogate escape");
        j->p += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    uint8_t u[4];
    return tl_buf_append(out, u, tl_utf8_encode(cp, u));
}

/* The escape at j->p (a backslash); appends what it stands for. */
static int tj_escape(tokjson *j, tl_buf *out) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (j->p + 1 >= j->end) return tj_fail(j, "unterminated string");
    char e = j->p[1];
    j->p += 2;
    const char *k = e ? strchr(from, e) : NULL;
    if (k) return tl_buf_putc(out, to[k - from]);
    if (e == 'u') return tj_unicode(j, out);
    return tj_fail(j, "bad escape");
}

/* Decodes a JSON string at j->p (the opening quote) and appends its UTF-8 plus a NUL to out;
 * *len = its length without the NUL. Rejects what serde_json and jansson reject (raw control
 * characters, bad escapes, lone surrogates, invalid UTF-8). */
static int tj_string(tokjson *j, tl_buf *out, uint32_t *len) {
    tj_ws(j);
    if (j->p >= j->end || *j->p != '"') return tj_fail(j, "expected a string");
    j->p++;
    size_t start = out->n;
    for (;;) {
        const char *q = j->p;
        while (q < j->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20) q++;
        if (q > j->p) {
            if (!tl_utf8_valid(j->p, (size_t)(q - j->p)))
                return tj_fail(j, "invalid UTF-8 in a string");
            if (tl_buf_append(out, j->p, (size_t)(q - j->p))) return TL_ERR_NOMEM;
            j->p = q;
        }
        if (j->p >= j->end) return tj_fail(j, "unterminated string");
        if (*j->p == '"') break;
        if (*j->p != '\\') return tj_fail(j, "control character in a string");
        int st = tj_escape(j, out);
        if (st) return st;
    }
    j->p++;
    if (out->n - start > UINT32_MAX / 2) return tj_fail(j, "string too long");
    *len = (uint32_t)(out->n - start);
    return tl_buf_append(out, "", 1);
}

/* open, then elements read by elem(j, ctx) separated by commas, then close. */
static int tj_seq(tokjson *j, char open, char close, int (*elem)(tokjson *, void *), void *ctx) {
    int st = tj_expect(j, open);
    if (st) return st;
    tj_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        if ((st = elem(j, ctx))) return st;
        tj_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        return tj_expect(j, close);
    }
}

/* A string whose value is not kept. */
static int tj_skip_string(tokjson *j) {
    tl_buf tmp = {0};
    uint32_t l;
    int st = tj_string(j, &tmp, &l);
    tl_buf_free(&tmp);
    return st;
}

static int tj_skip(tokjson *j);
static int tj_skip_elem(tokjson *j, void *ctx) { return tj_skip(j); }

static int tj_skip_member(tokjson *j, void *ctx) {
    int st = tj_skip_string(j);
    if (st || (st = tj_expect(j, ':'))) return st;
    return tj_skip(j);
}

/* Skips one JSON value (checking its syntax roughly; jansson re-parses what is kept). */
static int tj_skip(tokjson *j) {
    tj_ws(j);
    if (j->p >= j->end) return tj_fail(j, "unexpected end");
    char c = *j->p;
    if (c == '"') return tj_skip_string(j);
    if (c == '{' || c == '[') {
        if (++j->depth > 256) return tj_fail(j, "nested too deeply");
        int st = c == '{' ? tj_seq(j, '{', '}', tj_skip_member, NULL)
                          : tj_seq(j, '[', ']', tj_skip_elem, NULL);
        if (!st) j->depth--;
        return st;
    }
    const char *q = j->p; /* number, true, false, null */
    while (q < j->end && (isalnum((unsigned char)*q) || *q == '-' || *q == '+' || *q == '.')) q++;
    if (q == j->p) return tj_fail(j, "unexpected character");
    j->p = q;
    return 0;
}

/* Parses the value at j->p with jansson (small values only). */
static int tj_jansson(tokjson *j, json_t **out) {
    tj_ws(j);
    const char *v0 = j->p;
    int st = tj_skip(j);
    if (st) return st;
    json_error_t je;
    *out = json_loadb(v0, (size_t)(j->p - v0), JSON_DECODE_ANY, &je);
    if (!*out) {
        j->p = v0 + (je.position > 0 ? je.position : 0);
        return tj_fail(j, je.text);
    }
    return 0;
}

/* Room for element n of arr (cap allocated, elem bytes each): the array, moved when it grew, or
 * NULL when out of memory (arr is then unchanged). */
static void *tj_grow(void *arr, size_t n, size_t *cap, size_t elem) {
    if (n < *cap) return arr;
    size_t c = *cap ? 2 * *cap : 1024;
    void *p = realloc(arr, c * elem);
    if (p) *cap = c;
    return p;
}

/* "key": id, one entry of model.vocab. */
static int tj_vocab_entry(tokjson *j, void *ctx) {
    vocab_ent *grown = tj_grow(j->vocab, j->n_vocab, &j->cap_vocab, sizeof *grown);
    if (!grown) return TL_ERR_NOMEM;
    j->vocab = grown;
    vocab_ent *e = &j->vocab[j->n_vocab];
    e->off = (uint32_t)j->strs.n;
    int st = tj_string(j, &j->strs, &e->len);
    if (st || (st = tj_expect(j, ':'))) return st;
    tj_ws(j);
    const char *q = j->p;
    int64_t v = 0;
    while (q < j->end && *q >= '0' && *q <= '9' && v < (1 << 30)) v = v * 10 + (*q++ - '0');
    if (q == j->p || (q < j->end && (isalnum((unsigned char)*q) || *q == '.' || *q == '-')) ||
        v >= (1 << 30)) {
        char msg[80];
        snprintf(msg, sizeof msg, "vocab entry \"%.40s\" has a bad id", j->strs.p + e->off);
        return tj_fail(j, msg);
    }
    j->p = q;
    e->id = v;
    j->n_vocab++;
    return 0;
}

static int tj_vocab(tokjson *j) {
    j->has_vocab = 1;
    j->n_vocab = 0;
    return tj_seq(j, '{', '}', tj_vocab_entry, NULL);
}

/* One merge: ["a", "b"] or "a b". */
static int tj_merge_entry(tokjson *j, void *ctx) {
    merge_ent *grown = tj_grow(j->merges, j->n_merges, &j->cap_merges, sizeof *grown);
    if (!grown) return TL_ERR_NOMEM;
    j->merges = grown;
    merge_ent *m = &j->merges[j->n_merges];
    int st;
    tj_ws(j);
    if (j->p < j->end && *j->p == '[') {
        j->p++;
        m->a = (uint32_t)j->strs.n;
        if ((st = tj_string(j, &j->strs, &m->la)) || (st = tj_expect(j, ','))) return st;
        m->b = (uint32_t)j->strs.n;
        if ((st = tj_string(j, &j->strs, &m->lb)) || (st = tj_expect(j, ']'))) return st;
    } else {
        uint32_t l;
        m->a = (uint32_t)j->strs.n;
        if ((st = tj_string(j, &j->strs, &l))) return st;
        char *s = j->strs.p + m->a, *sp = memchr(s, ' ', l);
        if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - s))) {
            char msg[96];
            snprintf(msg, sizeof msg, "merge %zu \"%.40s\" is not two tokens", j->n_merges, s);
            return tj_fail(j, msg);
        }
        *sp = 0; /* "a b" -> "a\0b\0" */
        m->la = (uint32_t)(sp - s);
        m->b = m->a + m->la + 1;
        m->lb = l - m->la - 1;
    }
    j->n_merges++;
    return 0;
}

static int tj_merges(tokjson *j) {
    j->has_merges = 1;
    j->n_merges = 0;
    return tj_seq(j, '[', ']', tj_merge_entry, NULL);
}

typedef struct {
    json_t *dst;
    int (*special)(tokjson *, const char *);
    tl_buf key;
} tj_obj_ctx;

static int tj_object_member(tokjson *j, void *ctx) {
    tj_obj_ctx *o = ctx;
    uint32_t kl;
    tl_buf_truncate(&o->key, 0);
    int st = tj_string(j, &o->key, &kl);
    if (st || (st = tj_expect(j, ':'))) return st;
    st = o->special ? o->special(j, o->key.p) : 0;
    if (st < 0) return st;
    if (st == 0) {
        json_t *v;
        if ((st = tj_jansson(j, &v))) return st;
        json_object_set_new(o->dst, o->key.p, v);
    }
    return 0;
}

/* Reads an object whose keys go to dst (jansson values), except the ones handled by `special`
 * (returns 1 if it consumed the value, 0 if not, negative on error). */
static int tj_object(tokjson *j, json_t *dst, int (*special)(tokjson *, const char *)) {
    tj_obj_ctx o = {dst, special, {0}};
    int st = tj_seq(j, '{', '}', tj_object_member, &o);
    tl_buf_free(&o.key);
    return st;
}

static int tj_model_key(tokjson *j, const char *key) {
    if (!strcmp(key, "vocab")) {
        tj_ws(j);
        if (j->p < j->end && *j->p != '{') return tj_fail(j, "model.vocab is not an object");
        int st = tj_vocab(j);
        return st ? st : 1;
    }
    if (!strcmp(key, "merges")) {
        tj_ws(j);
        if (j->p < j->end && *j->p != '[') return tj_fail(j, "model.merges is not a list");
        int st = tj_merges(j);
        return st ? st : 1;
    }
    return 0;
}

static int tj_root_key(tokjson *j, const char *key) {
    if (strcmp(key, "model")) return 0;
    tj_ws(j);
    if (j->p < j->end && *j->p != '{') return tj_fail(j, "\"model\" is not an object");
    if (j->model) return tj_fail(j, "two \"model\" keys");
    j->model = json_object();
    int st = tj_object(j, j->model, tj_model_key);
    return st ? st : 1;
}

void tokjson_free(tokjson *j) {
    json_decref(j->root);
    json_decref(j->model);
    tl_buf_free(&j->strs);
    free(j->vocab);
    free(j->merges);
}

int tokjson_parse(tokjson *j, const char *json, size_t len) {
    j->p = j->start = json;
    j->end = json + len;
    tj_ws(j);
    if (j->p >= j->end) return tj_fail(j, "empty file");
    if (*j->p != '{') return tj_fail(j, "top level is not an object");
    j->root = json_object();
    int st = tj_object(j, j->root, tj_root_key);
    if (st) return st;
    tj_ws(j);
    if (j->p != j->end) return tj_fail(j, "text after the end");
    if (!j->model) return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "no \"model\" object");
    if (!j->has_vocab) return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "model.vocab missing");
    return 0;
}

/* ====== From arrays (GGUF). ====== */

/* tokens[i] is id i: added tokens (types 3 and 4) go to an added_tokens list, the rest to the
 * vocabulary. */
static int arrays_tokens(tokjson *j, const tl_tokenizer_arrays *a, json_t *added) {
    for (size_t i = 0; i < a->n_tokens; i++) {
        const char *tok = a->tokens[i];
        int32_t ty = a->types ? a->types[i] : 1;
        if (!tok) return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "token %zu is missing", i);
        if (ty == 3 || ty == 4) {
            json_array_append_new(added,
                                  json_pack("{s:I,s:s,s:b,s:b}", "id", (json_int_t)i, "content",
                                            tok, "special", ty == 3, "normalized", 0));
            continue;
        }
        vocab_ent *e = &j->vocab[j->n_vocab++];
        e->off = (uint32_t)j->strs.n;
        e->len = (uint32_t)strlen(tok);
        e->id = (int64_t)i;
        if (tl_buf_append(&j->strs, tok, e->len + 1)) return TL_ERR_NOMEM;
    }
    return 0;
}

/* merges[i] is "a b" with rank i. */
static int arrays_merges(tokjson *j, const tl_tokenizer_arrays *a) {
    for (size_t i = 0; i < a->n_merges; i++) {
        const char *m = a->merges[i], *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || strchr(sp + 1, ' '))
            return tl_errf(j->err, j->errlen, TL_ERR_FORMAT,
                           "merge %zu \"%.40s\" is not two tokens", i, m ? m : "(null)");
        merge_ent *e = &j->merges[j->n_merges++];
        e->a = (uint32_t)j->strs.n;
        e->la = (uint32_t)(sp - m);
        e->b = e->a + e->la + 1;
        e->lb = (uint32_t)strlen(sp + 1);
        if (tl_buf_append(&j->strs, m, e->la + 1 + e->lb + 1)) return TL_ERR_NOMEM;
        j->strs.p[e->a + e->la] = 0;
    }
    return 0;
}

int tokjson_from_arrays(tokjson *j, const tl_tokenizer_arrays *a, const char *pre_regex) {
    j->root = json_object();
    j->model = json_pack("{s:s}", "type", "BPE");
    json_t *added = json_array();
    j->has_vocab = j->has_merges = 1;
    j->vocab = malloc((a->n_tokens ? a->n_tokens : 1) * sizeof *j->vocab);
    j->merges = malloc((a->n_merges ? a->n_merges : 1) * sizeof *j->merges);
    if (!j->root || !j->model || !added || !j->vocab || !j->merges || a->n_tokens >= (1u << 30)) {
        json_decref(added);
        return TL_ERR_NOMEM;
    }
    int st = arrays_tokens(j, a, added);
    if (!st) st = arrays_merges(j, a);
    if (st) {
        json_decref(added);
        return st;
    }
    json_object_set_new(j->root, "added_tokens", added);
    if (a->nfc) json_object_set_new(j->root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_object_set_new(j->root, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]}", "type",
                                  "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                                  pre_regex, "behavior", "Isolated", "invert", 0, "type",
                                  "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
    return 0;
}
