/* Model output -> reasoning_content / content / tool_calls, incrementally (see parse.h for the
 * exact rules). The parser is a state machine over a buffer of input not yet consumed. Each
 * state looks for the tags it cares about in that buffer; text that cannot be part of a tag is
 * emitted and consumed, and a suffix that could still become a tag (or whitespace whose fate
 * depends on what follows) stays in the buffer until more text or the end arrives. Every
 * decision depends only on the bytes, never on where the pieces were split, which is what
 * makes the streamed result equal the whole-text result. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/buf.h"
#include "common/utf8.h"
#include "common/util.h"
#include "tokenizer/chat.h"
#include "tokenizer/parse.h"

enum {
    ST_REASON_START, /* strip leading "\n", a "<think>" and the "\n"s after it */
    ST_REASON,
    ST_CONTENT,
    ST_BODY,     /* inside <function=...>, between parameters */
    ST_VALUE,    /* inside a parameter value */
    ST_AFTER_FN, /* after </function>, before </tool_call> */
    ST_DONE,
};

enum {
    V_STR = TL_PVAL_STR,
    V_INT = TL_PVAL_INT,
    V_NUM = TL_PVAL_NUM,
    V_BOOL = TL_PVAL_BOOL,
    V_JSON = TL_PVAL_JSON
}; /* how a parameter value is typed */

#define MAX_HEADER_WS 64 /* whitespace allowed between <tool_call> and <function= */

typedef struct ev_rec { /* an event while it is being built: offsets into p->evtext */
    tl_parse_event_kind kind;
    int index;
    size_t text, len, id;
} ev_rec;

typedef struct call_acc {
    tl_buf args;
} call_acc;

struct tl_parser {
    tl_parse_opts o;
    int state;
    int start_step;  /* ST_REASON_START: 0 strip \n + <think>, 1 strip \n after <think> */
    int strip_nl;    /* content: drop leading "\n"s (after </think>) */
    int after_call;  /* content: a call has been seen */
    int seg_started; /* content: something emitted since the last call */
    /* UTF-8 sanitizer: an incomplete sequence carried to the next piece */
    tl_utf8_carry u8;
    /* unconsumed input */
    tl_buf in;
    size_t pos;
    /* the first ws_known bytes of the unconsumed input are a whitespace run that a state held
     * back last time (contains no '<'); ws_next is what the current step leaves for the next */
    size_t ws_known, ws_next;
    /* the call being parsed */
    const json_t *props; /* schema properties of the current function, or NULL */
    int n_params;
    int vtype, v_first, v_quote;
    tl_buf vbuf;
    /* events of the current feed */
    ev_rec *evs;
    int nev, evcap;
    tl_buf evtext;
    tl_parse_event *out;
    int outcap;
    /* accumulated result */
    tl_buf reasoning, content;
    tl_parse_result res;
    call_acc *acc;
    int acccap;
};

/* ------------------------------------------------------------------ small helpers */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

enum { CL_NL, CL_WS }; /* the whitespace a state drops or holds: "\n" only, or any is_ws */

static int in_class(char c, int cls) { return cls == CL_NL ? c == '\n' : is_ws(c); }

/* Length of the run of cls bytes at the start of s[0..n). */
static size_t lead_run(const char *s, size_t n, int cls) {
    size_t i = 0;
    while (i < n && in_class(s[i], cls)) i++;
    return i;
}

/* e less the cls bytes right before it, never below lo. */
static size_t trail_trim(const char *s, size_t e, size_t lo, int cls) {
    while (e > lo && in_class(s[e - 1], cls)) e--;
    return e;
}

/* How much of s[0..e) a state emits now, s[0..k0) being a cls run it held back before: all but
 * the trailing cls run (its fate depends on what follows), or nothing when after k0 there is
 * only that run. */
static size_t emit_end(const char *s, size_t e, size_t k0, int cls) {
    e = trail_trim(s, e, k0, cls);
    return e == k0 ? 0 : e;
}

/* A step's result when it consumed k bytes: k, or -1 (it only changed state) when k is 0. */
static long took(size_t k) { return k ? (long)k : -1; }

/* Earliest full occurrence of any of tags[0..nt) in s[0..n): returns its index (-1 if none),
 * *at its offset. *hold = length of the longest suffix of s that is a proper prefix of a tag
 * (only meaningful when none is found). */
static int find_tags(const char *s, size_t n, const char *const *tags, int nt, size_t *at,
                     size_t *hold) {
    for (const char *q = s; (q = memchr(q, '<', n - (size_t)(q - s))) != NULL; q++) {
        size_t i = (size_t)(q - s);
        for (int t = 0; t < nt; t++) {
            size_t l = strlen(tags[t]);
            if (i + l <= n && !memcmp(s + i, tags[t], l)) {
                *at = i;
                return t;
            }
        }
    }
    *hold = 0;
    size_t start = n > 16 ? n - 16 : 0;
    for (size_t i = start; i < n; i++) {
        if (s[i] != '<') continue;
        for (int t = 0; t < nt; t++) {
            size_t l = strlen(tags[t]);
            if (n - i < l && !memcmp(s + i, tags[t], n - i)) {
                *hold = n - i;
                return -1;
            }
        }
    }
    return -1;
}

static int ci_prefix_of(const char *s, size_t n, const char *word) {
    size_t w = strlen(word);
    if (n > w) return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)s[i]) != word[i]) return 0;
    return 1;
}

static int ci_equal(const char *s, size_t n, const char *word) {
    return n == strlen(word) && ci_prefix_of(s, n, word);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------------ events and the result */

static void acc_put(tl_parser *p, tl_parse_event_kind kind, int index, const char *s, size_t n) {
    if (kind == TL_PARSE_REASONING)
        xbuf_append(&p->reasoning, s, n);
    else if (kind == TL_PARSE_CONTENT)
        xbuf_append(&p->content, s, n);
    else if (kind == TL_PARSE_TOOL_ARGS)
        xbuf_append(&p->acc[index].args, s, n);
}

/* Appends a delta (merged into the previous event when it is the same kind and call). */
static void emit(tl_parser *p, tl_parse_event_kind kind, int index, const char *s, size_t n) {
    if (n == 0 && kind != TL_PARSE_TOOL_END) return;
    acc_put(p, kind, index, s, n);
    if (p->nev > 0) {
        ev_rec *last = &p->evs[p->nev - 1];
        if (last->kind == kind && last->index == index && kind != TL_PARSE_TOOL_START &&
            kind != TL_PARSE_TOOL_END) {
            tl_buf_truncate(&p->evtext, p->evtext.n - 1); /* drop the NUL: the event's text
                                                           * is the tail of evtext */
            xbuf_append(&p->evtext, s, n);
            xbuf_append(&p->evtext, "", 1);
            last->len += n;
            return;
        }
    }
    if (p->nev == p->evcap) {
        p->evcap = p->evcap ? 2 * p->evcap : 16;
        p->evs = xrealloc(p->evs, (size_t)p->evcap * sizeof *p->evs);
    }
    ev_rec *e = &p->evs[p->nev++];
    e->kind = kind;
    e->index = index;
    e->id = 0;
    e->text = p->evtext.n;
    e->len = n;
    xbuf_append(&p->evtext, s, n);
    xbuf_append(&p->evtext, "", 1);
}

static void emit_args_str(tl_parser *p, const char *s) {
    emit(p, TL_PARSE_TOOL_ARGS, p->res.n_calls - 1, s, strlen(s));
}

/* Appends the JSON-escaped body of s[0..n) as an arguments delta. */
static void emit_args_escaped(tl_parser *p, const char *s, size_t n) {
    tl_buf b = {0};
    tl_chat_json_escape(&b, s, n);
    xbuf_check(&b);
    if (b.n) emit(p, TL_PARSE_TOOL_ARGS, p->res.n_calls - 1, b.p, b.n);
    tl_buf_free(&b);
}

static const json_t *tool_props(const json_t *tools, const char *name, size_t n) {
    if (!json_is_array(tools)) return NULL;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t;
        const json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm) || json_string_length(nm) != n ||
            memcmp(json_string_value(nm), name, n))
            continue;
        const json_t *params = json_object_get(fn, "parameters");
        if (!json_is_object(params)) return NULL;
        const json_t *props = json_object_get(params, "properties");
        return json_is_object(props) ? props : params; /* vLLM: properties, else the dict itself */
    }
    return NULL;
}

static void start_call(tl_parser *p, const char *name, size_t n) {
    int idx = p->res.n_calls;
    if (idx == p->acccap) {
        p->acccap = p->acccap ? 2 * p->acccap : 4;
        p->acc = xrealloc(p->acc, (size_t)p->acccap * sizeof *p->acc);
        p->res.calls = xrealloc(p->res.calls, (size_t)p->acccap * sizeof *p->res.calls);
    }
    memset(&p->acc[idx], 0, sizeof p->acc[idx]);
    xbuf_append(&p->acc[idx].args, "", 0);
    char id[32];
    uint64_t x = p->o.id_seed ^ (0x632be59bd9b4e019ull * (uint64_t)(idx + 1)), a = splitmix64(&x),
             b = splitmix64(&x);
    snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)a,
             (unsigned long long)(b >> 32));
    tl_parse_tool_call *c = &p->res.calls[idx];
    c->id = xstrdup(id);
    c->name = xmalloc(n + 1);
    memcpy(c->name, name, n);
    c->name[n] = 0;
    c->arguments = NULL;
    p->res.n_calls++;
    /* the event: text = name, id stored after it in evtext */
    emit(p, TL_PARSE_TOOL_START, idx, name, n); /* never merged */
    ev_rec *e = &p->evs[p->nev - 1];
    e->id = p->evtext.n;
    xbuf_append(&p->evtext, id, strlen(id) + 1);
    p->props = tool_props(p->o.tools, name, n);
    p->n_params = 0;
    p->after_call = 1;
}

static void close_call(tl_parser *p) {
    emit_args_str(p, p->n_params ? "}" : "{}");
    emit(p, TL_PARSE_TOOL_END, p->res.n_calls - 1, "", 0);
    p->seg_started = 0;
    p->state = ST_CONTENT;
}

/* ------------------------------------------------------------------ parameter values */

static int classify_type_name(const char *t) {
    char low[32];
    size_t n = 0;
    while (isspace((unsigned char)*t)) t++;
    for (; *t && n + 1 < sizeof low; t++) low[n++] = (char)tolower((unsigned char)*t);
    while (n && isspace((unsigned char)low[n - 1])) n--;
    low[n] = 0;
    static const char *const strs[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!strcmp(low, strs[i])) return V_STR;
    static const char *const ints[] = {"int", "uint", "long", "short", "unsigned"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (!strncmp(low, ints[i], strlen(ints[i]))) return V_INT;
    if (!strncmp(low, "num", 3) || !strncmp(low, "float", 5)) return V_NUM;
    if (!strcmp(low, "boolean") || !strcmp(low, "bool") || !strcmp(low, "binary")) return V_BOOL;
    return V_JSON;
}

static int param_type(const tl_parser *p, const char *name, size_t n) {
    if (!p->props) return V_STR;
    char key[TL_PARSE_MAX_NAME + 1];
    memcpy(key, name, n);
    key[n] = 0;
    return tl_parse_value_type(json_object_get(p->props, key));
}

int tl_parse_value_type(const json_t *prop) {
    const json_t *t = json_object_get(prop, "type");
    if (json_is_string(t)) return classify_type_name(json_string_value(t));
    if (json_is_array(t)) {
        int first = -1;
        for (size_t i = 0; i < json_array_size(t); i++) {
            const json_t *x = json_array_get(t, i);
            if (!json_is_string(x)) continue;
            int c = classify_type_name(json_string_value(x));
            if (c == V_STR) return V_STR;
            if (first < 0 && strcmp(json_string_value(x), "null")) first = c;
        }
        return first < 0 ? V_JSON : first;
    }
    return V_STR;
}

/* Integer text -> normalised JSON integer in b; 0 if s is not one (or is outside int64). */
static int conv_int(const char *s, size_t n, tl_buf *b) {
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    int neg = 0;
    if (n && (*s == '+' || *s == '-')) neg = *s == '-', s++, n--;
    if (!n) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    while (n > 1 && *s == '0') s++, n--;
    /* int64 only (vLLM's Python ints are unbounded; beyond int64 JSON readers lose or reject them)
     */
    if (n > 19 ||
        (n == 19 && memcmp(s, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0))
        return 0;
    if (neg && !(n == 1 && *s == '0')) xbuf_append(b, "-", 1);
    xbuf_append(b, s, n);
    return 1;
}

/* Number text -> a JSON number as vLLM writes it (integral values as integers). */
static int conv_num(const char *s, size_t n, tl_buf *b) {
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    if (n == 0 || n > 400) return 0;
    size_t i = 0, digits = 0;
    if (s[i] == '+' || s[i] == '-') i++;
    while (i < n && isdigit((unsigned char)s[i])) i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && isdigit((unsigned char)s[i])) i++, digits++;
    }
    if (!digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e0 = i;
        while (i < n && isdigit((unsigned char)s[i])) i++;
        if (i == e0) return 0;
    }
    if (i != n) return 0;
    char tmp[416];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double x = strtod(tmp, NULL);
    if (!isfinite(x)) return 0;
    if (x == trunc(x) &&
        fabs(x) < 9223372036854775808.0) { /* integral: as an integer, within int64 */
        char out[400];
        snprintf(out, sizeof out, "%.0f", x == 0 ? 0.0 : x); /* exact integer of the double */
        xbuf_puts(b, out);
    } else {
        tl_chat_py_float(b, x);
    }
    return 1;
}

/* The typed JSON text of a finished non-string value (string when it does not convert). */
static void emit_typed(tl_parser *p, const char *s, size_t n) {
    tl_buf b = {0};
    int ok = 0;
    if (ci_equal(s, n, "null")) {
        xbuf_puts(&b, "null");
        ok = 1;
    } else if (p->vtype == V_INT) {
        ok = conv_int(s, n, &b);
    } else if (p->vtype == V_NUM) {
        ok = conv_num(s, n, &b);
    } else if (p->vtype == V_BOOL) {
        size_t a = 0, z = n;
        while (a < z && is_ws(s[a])) a++;
        while (z > a && is_ws(s[z - 1])) z--;
        if (ci_equal(s + a, z - a, "true"))
            xbuf_puts(&b, "true"), ok = 1;
        else if (ci_equal(s + a, z - a, "false"))
            xbuf_puts(&b, "false"), ok = 1;
    } else if (p->vtype == V_JSON) {
        json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
        if (v) {
            tl_chat_json_dump(&b, v);
            json_decref(v);
            ok = 1;
        }
    }
    xbuf_check(&b);
    if (ok) {
        emit(p, TL_PARSE_TOOL_ARGS, p->res.n_calls - 1, b.p, b.n);
    } else {
        emit_args_str(p, "\"");
        emit_args_escaped(p, s, n);
        emit_args_str(p, "\"");
    }
    tl_buf_free(&b);
}

/* More text of the current value. String values stream, except while the value so far could
 * still be "null" (which becomes JSON null). */
static void value_add(tl_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (p->vtype == V_STR && p->v_quote) {
        emit_args_escaped(p, s, n);
        return;
    }
    xbuf_append(&p->vbuf, s, n);
    if (p->vtype == V_STR && !ci_prefix_of(p->vbuf.p, p->vbuf.n, "null")) {
        emit_args_str(p, "\"");
        emit_args_escaped(p, p->vbuf.p, p->vbuf.n);
        p->v_quote = 1;
        tl_buf_truncate(&p->vbuf, 0);
    }
}

static void value_end(tl_parser *p) {
    if (p->vtype == V_STR && p->v_quote)
        emit_args_str(p, "\"");
    else
        emit_typed(p, p->vbuf.p ? p->vbuf.p : "", p->vbuf.n);
    tl_buf_truncate(&p->vbuf, 0);
    p->n_params++;
}

/* Adds s[0..e) less one trailing "\n" to the value (a final "\n" is not part of it); returns
 * the bytes added. */
static size_t value_add_trimmed(tl_parser *p, const char *s, size_t e) {
    if (e && s[e - 1] == '\n') e--;
    value_add(p, s, e);
    return e;
}

/* A parameter named name[0..n) starts: its key goes out, its value is typed from the schema. */
static void value_begin(tl_parser *p, const char *name, size_t n) {
    emit_args_str(p, p->n_params ? ", \"" : "{\"");
    emit_args_escaped(p, name, n);
    emit_args_str(p, "\": ");
    p->vtype = param_type(p, name, n);
    p->v_first = 1;
    p->v_quote = 0;
    tl_buf_truncate(&p->vbuf, 0);
    p->state = ST_VALUE;
}

/* ------------------------------------------------------------------ the states */

static const char *const T_THINK_END[] = {"</think>"};
static const char *const T_TOOL_CALL[] = {"<tool_call>"};
static const char *const T_BODY[] = {"<parameter=", "</function>", "</tool_call>"};
static const char *const T_VALUE[] = {"</parameter>", "<parameter=", "</function>", "</tool_call>"};
static const char *const T_AFTER_FN[] = {"</tool_call>", "<tool_call>"};

enum { H_VALID, H_INVALID, H_INCOMPLETE };

/* Bytes allowed in function and parameter names ('>' ends them). */
static int name_byte_ok(char c) { return c != '<' && c != '\n' && c != '\r' && c != 0; }

/* s starts with "<tool_call>": is a complete "<function=NAME>" header next? */
static int header_check(const char *s, size_t n, size_t *name, size_t *name_len, size_t *total) {
    size_t i = 11, ws = 0;
    while (i < n && is_ws(s[i])) {
        if (++ws > MAX_HEADER_WS) return H_INVALID;
        i++;
    }
    static const char fn[] = "<function=";
    for (size_t k = 0; k < 10; k++, i++) {
        if (i >= n) return H_INCOMPLETE;
        if (s[i] != fn[k]) return H_INVALID;
    }
    size_t start = i;
    for (; i < n && s[i] != '>'; i++) {
        if (!name_byte_ok(s[i]) || i - start >= TL_PARSE_MAX_NAME) return H_INVALID;
    }
    if (i >= n) return H_INCOMPLETE;
    if (i == start) return H_INVALID;
    *name = start;
    *name_len = i - start;
    *total = i + 1;
    return H_VALID;
}

/* "<parameter=" at s: is the name complete? (same rules as a function name) */
static int pname_check(const char *s, size_t n, size_t *name_len, size_t *total) {
    size_t i = 11;
    for (; i < n && s[i] != '>'; i++)
        if (!name_byte_ok(s[i]) || i - 11 >= TL_PARSE_MAX_NAME) return H_INVALID;
    if (i >= n) return H_INCOMPLETE;
    if (i == 11) return H_INVALID;
    *name_len = i - 11;
    *total = i + 1;
    return H_VALID;
}

static void content_out(tl_parser *p, const char *s, size_t n) {
    if (!n) return;
    emit(p, TL_PARSE_CONTENT, 0, s, n);
    p->seg_started = 1;
}

/* The per-state steps below all read s[0..n) (the unconsumed input) and return the number of
 * bytes consumed, or -1 if they only changed state, or 0 if they need more input. */

/* ST_REASON_START: drops leading "\n"s, then one "<think>" (a model that reopens it) and the
 * "\n"s after it. */
static long step_reason_start(tl_parser *p, const char *s, size_t n, int eof) {
    size_t i = lead_run(s, n, CL_NL);
    if (i) return (long)i;
    if (n == 0 && !eof) return 0;
    if (p->start_step == 0) {
        if (n >= 7 && !memcmp(s, "<think>", 7)) {
            p->start_step = 1;
            return 7;
        }
        if (!eof && n < 7 && !memcmp(s, "<think>", n)) return 0;
    }
    p->state = ST_REASON;
    return -1;
}

/* ST_REASON: reasoning up to "</think>", less the "\n"s right before it (or the end). */
static long step_reason(tl_parser *p, const char *s, size_t n, int eof) {
    size_t at = 0, hold = 0, k0 = TL_MIN(p->ws_known, n); /* a held run of "\n": no tag in it */
    int t = find_tags(s + k0, n - k0, T_THINK_END, 1, &at, &hold);
    at += k0;
    if (t >= 0) {
        emit(p, TL_PARSE_REASONING, 0, s, emit_end(s, at, k0, CL_NL));
        p->state = ST_CONTENT;
        p->strip_nl = 1;
        return (long)(at + 8);
    }
    size_t safe = eof ? n : n - hold, e = emit_end(s, safe, k0, CL_NL);
    emit(p, TL_PARSE_REASONING, 0, s, e);
    if (eof) {
        p->state = ST_DONE;
        return took(n);
    }
    p->ws_next = safe - e;
    return (long)e;
}

/* ST_CONTENT after "</think>": drops the leading "\n"s of the content. */
static long content_strip_nl(tl_parser *p, const char *s, size_t n, int eof) {
    size_t i = lead_run(s, n, CL_NL);
    if (i) return (long)i;
    if (n == 0 && !eof) return 0;
    p->strip_nl = 0;
    return -1;
}

/* ST_CONTENT without tool parsing: everything is content, verbatim. */
static long content_plain(tl_parser *p, const char *s, size_t n, int eof) {
    emit(p, TL_PARSE_CONTENT, 0, s, n);
    if (!eof) return (long)n;
    p->state = ST_DONE;
    return took(n);
}

/* ST_CONTENT with "<tool_call>" at s + at (s[0..k0) a held whitespace run): a call starts when
 * a complete "<function=NAME>" header follows; the text waits while the header may still
 * come; otherwise the tag is content. Whitespace right before a call is dropped. */
static long content_at_tag(tl_parser *p, const char *s, size_t n, size_t at, size_t k0, int eof) {
    size_t name = 0, name_len = 0, total = 0, e = emit_end(s, at, k0, CL_WS);
    int h = header_check(s + at, n - at, &name, &name_len, &total);
    if (h == H_VALID) {
        content_out(p, s, e);
        start_call(p, s + at + name, name_len);
        p->state = ST_BODY;
        return (long)(at + total);
    }
    if (h == H_INCOMPLETE && !eof) {
        content_out(p, s, e);
        return (long)e;
    }
    content_out(p, s, at + 11); /* not a call: the tag is text */
    return (long)(at + 11);
}

/* ST_CONTENT: text up to the next "<tool_call>"; trailing whitespace waits for what follows. */
static long step_content(tl_parser *p, const char *s, size_t n, int eof) {
    if (p->strip_nl) return content_strip_nl(p, s, n, eof);
    if (!p->o.parse_tools) return content_plain(p, s, n, eof);
    if (p->after_call && !p->seg_started) { /* leading whitespace of a segment after a call */
        size_t i = lead_run(s, n, CL_WS);
        if (i) return (long)i;
    }
    size_t at = 0, hold = 0, k0 = TL_MIN(p->ws_known, n); /* a held whitespace run: no tag */
    int t = find_tags(s + k0, n - k0, T_TOOL_CALL, 1, &at, &hold);
    if (t >= 0) return content_at_tag(p, s, n, at + k0, k0, eof);
    if (eof) { /* after a call, whitespace-only text at the end is dropped */
        content_out(p, s, p->after_call ? trail_trim(s, n, 0, CL_WS) : n);
        p->state = ST_DONE;
        return took(n);
    }
    size_t e = emit_end(s, n - hold, k0, CL_WS);
    content_out(p, s, e);
    p->ws_next = n - hold - e;
    return (long)e;
}

/* ST_BODY at "<parameter=" (s + at): the value starts once the name is complete. */
static long body_param(tl_parser *p, const char *s, size_t n, size_t at, int eof) {
    size_t name_len = 0, total = 0;
    int h = pname_check(s + at, n - at, &name_len, &total);
    if (h == H_INCOMPLETE && !eof) return (long)at;
    if (h != H_VALID) return (long)(at + 11); /* skip a broken "<parameter=" */
    value_begin(p, s + at + 11, name_len);
    return (long)(at + total);
}

/* ST_BODY: between parameters, up to "<parameter=", "</function>" or "</tool_call>". */
static long step_body(tl_parser *p, const char *s, size_t n, int eof) {
    size_t at = 0, hold = 0;
    int t = find_tags(s, n, T_BODY, 3, &at, &hold);
    if (t < 0) {
        if (!eof) return (long)(n - hold); /* text between parameters is ignored */
        close_call(p);
        return took(n);
    }
    if (t == 1) {
        p->state = ST_AFTER_FN;
        return (long)(at + 11);
    }
    if (t == 2) {
        close_call(p);
        return (long)(at + 12);
    }
    return body_param(p, s, n, at, eof);
}

/* ST_VALUE: the value up to "</parameter>" (or, leniently, the next parameter or the call's
 * end), less one leading and one trailing "\n". */
static long step_value(tl_parser *p, const char *s, size_t n, int eof) {
    if (p->v_first) {
        if (n == 0 && !eof) return 0;
        p->v_first = 0;
        return n && s[0] == '\n' ? 1 : -1;
    }
    size_t at = 0, hold = 0;
    int t = find_tags(s, n, T_VALUE, 4, &at, &hold);
    if (t >= 0) {
        value_add_trimmed(p, s, at);
        value_end(p);
        p->state = ST_BODY;
        return t == 0 ? (long)(at + 12) : took(at); /* other tags are the body's to read */
    }
    if (eof) {
        value_add_trimmed(p, s, n);
        value_end(p);
        close_call(p);
        return took(n);
    }
    return (long)value_add_trimmed(p, s, n - hold);
}

/* ST_AFTER_FN: after "</function>", the call ends at "</tool_call>", a new "<tool_call>" (left
 * for the content) or the end of the output. */
static long step_after_fn(tl_parser *p, const char *s, size_t n, int eof) {
    size_t at = 0, hold = 0;
    int t = find_tags(s, n, T_AFTER_FN, 2, &at, &hold);
    if (t < 0 && !eof) return (long)(n - hold);
    close_call(p);
    if (t == 0) return (long)(at + 12);
    return took(t == 1 ? at : n);
}

/* One step of the state machine over s[0..n) (the unconsumed input): the handler of the
 * current state. Returns the number of bytes consumed, or -1 if it only changed state, or 0 if
 * it needs more input (always, once ST_DONE). */
static long step(tl_parser *p, const char *s, size_t n, int eof) {
    typedef long (*step_fn)(tl_parser *, const char *, size_t, int);
    static const step_fn steps[ST_DONE] = {
        [ST_REASON_START] = step_reason_start,
        [ST_REASON] = step_reason,
        [ST_CONTENT] = step_content,
        [ST_BODY] = step_body,
        [ST_VALUE] = step_value,
        [ST_AFTER_FN] = step_after_fn,
    };
    return p->state < ST_DONE ? steps[p->state](p, s, n, eof) : 0;
}

/* ------------------------------------------------------------------ UTF-8 sanitizer */

/* Appends valid UTF-8 to p->in: invalid bytes become U+FFFD (one per maximal invalid
 * subpart, as Python's errors="replace"); an incomplete sequence at the end is kept. */
static void sanitize(tl_parser *p, const unsigned char *s, size_t n) {
    tl_utf8_repair_stream(&p->u8, s, n, &p->in);
    xbuf_check(&p->in);
}

/* ------------------------------------------------------------------ API */

void tl_parse_opts_default(tl_parse_opts *o) {
    memset(o, 0, sizeof *o);
    o->thinking = 1;
    o->parse_tools = 1;
}

tl_parser *tl_parser_new(const tl_parse_opts *opts) {
    tl_parser *p = xcalloc(1, sizeof *p);
    if (opts)
        p->o = *opts;
    else
        tl_parse_opts_default(&p->o);
    p->state = p->o.thinking ? ST_REASON_START : ST_CONTENT;
    xbuf_append(&p->reasoning, "", 0);
    xbuf_append(&p->content, "", 0);
    xbuf_append(&p->in, "", 0);
    p->res.reasoning = p->reasoning.p;
    p->res.content = p->content.p;
    return p;
}

void tl_parser_free(tl_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->res.n_calls; i++) {
        free(p->res.calls[i].id);
        free(p->res.calls[i].name);
        tl_buf_free(&p->acc[i].args);
    }
    free(p->res.calls);
    free(p->acc);
    tl_buf_free(&p->in);
    tl_buf_free(&p->vbuf);
    free(p->evs);
    tl_buf_free(&p->evtext);
    free(p->out);
    tl_buf_free(&p->reasoning);
    tl_buf_free(&p->content);
    free(p);
}

static int run(tl_parser *p, int eof, const tl_parse_event **ev) {
    tl_buf_truncate(&p->evtext, 0); /* the previous call's events end here */
    for (;;) {
        p->ws_next = 0;
        long k = step(p, p->in.p + p->pos, p->in.n - p->pos, eof);
        p->ws_known = p->ws_next;
        if (k > 0)
            p->pos += (size_t)k;
        else if (k == 0)
            break;
        if (p->state == ST_DONE) break;
    }
    /* drop the consumed prefix */
    memmove(p->in.p, p->in.p + p->pos, p->in.n - p->pos + 1);
    p->in.n -= p->pos;
    p->pos = 0;
    /* publish the events */
    if (p->nev > p->outcap) {
        p->outcap = p->nev;
        p->out = xrealloc(p->out, (size_t)p->outcap * sizeof *p->out);
    }
    for (int i = 0; i < p->nev; i++) {
        const ev_rec *r = &p->evs[i];
        p->out[i].kind = r->kind;
        p->out[i].index = r->index;
        p->out[i].text = p->evtext.p + r->text;
        p->out[i].len = r->len;
        p->out[i].id = r->kind == TL_PARSE_TOOL_START ? p->evtext.p + r->id : NULL;
    }
    int n = p->nev;
    p->nev = 0;
    /* refresh the result view */
    p->res.reasoning = p->reasoning.p;
    p->res.reasoning_len = p->reasoning.n;
    p->res.content = p->content.p;
    p->res.content_len = p->content.n;
    for (int i = 0; i < p->res.n_calls; i++) p->res.calls[i].arguments = p->acc[i].args.p;
    *ev = p->out;
    return n;
}

int tl_parser_feed(tl_parser *p, const char *text, size_t len, const tl_parse_event **ev) {
    if (p->state == ST_DONE) {
        *ev = p->out;
        return 0;
    }
    sanitize(p, (const unsigned char *)text, len);
    return run(p, 0, ev);
}

int tl_parser_finish(tl_parser *p, const tl_parse_event **ev) {
    if (p->state == ST_DONE) {
        *ev = p->out;
        return 0;
    }
    tl_utf8_repair_end(&p->u8, &p->in);
    xbuf_check(&p->in);
    return run(p, 1, ev);
}

const tl_parse_result *tl_parser_result(const tl_parser *p) { return &p->res; }

void tl_parse_text(const char *text, size_t len, const tl_parse_opts *opts, tl_parse_result *out) {
    tl_parser *p = tl_parser_new(opts);
    const tl_parse_event *ev;
    tl_parser_feed(p, text, len, &ev);
    tl_parser_finish(p, &ev);
    memset(out, 0, sizeof *out);
    out->reasoning_len = p->reasoning.n;
    out->content = xmalloc(p->content.n + 1);
    memcpy(out->content, p->content.p, p->content.n + 1);
    out->content_len = p->content.n;
    out->reasoning = xmalloc(p->reasoning.n + 1);
    memcpy(out->reasoning, p->reasoning.p, p->reasoning.n + 1);
    out->n_calls = p->res.n_calls;
    out->calls = out->n_calls ? xcalloc((size_t)out->n_calls, sizeof *out->calls) : NULL;
    for (int i = 0; i < out->n_calls; i++) {
        out->calls[i].id = xstrdup(p->res.calls[i].id);
        out->calls[i].name = xstrdup(p->res.calls[i].name);
        out->calls[i].arguments = xstrdup(p->acc[i].args.p);
    }
    tl_parser_free(p);
}

void tl_parse_result_free(tl_parse_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->reasoning);
    free(r->content);
    memset(r, 0, sizeof *r);
}

json_t *tl_parse_result_message(const tl_parse_result *r) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    if (r->content_len || !r->n_calls)
        json_object_set_new(m, "content", json_stringn(r->content, r->content_len));
    else
        json_object_set_new(m, "content", json_null());
    if (r->reasoning_len)
        json_object_set_new(m, "reasoning_content", json_stringn(r->reasoning, r->reasoning_len));
    if (r->n_calls) {
        json_t *calls = json_array();
        for (int i = 0; i < r->n_calls; i++) {
            json_t *c = json_object(), *fn = json_object();
            json_object_set_new(fn, "name", json_string(r->calls[i].name));
            json_object_set_new(fn, "arguments", json_string(r->calls[i].arguments));
            json_object_set_new(c, "id", json_string(r->calls[i].id));
            json_object_set_new(c, "type", json_string("function"));
            json_object_set_new(c, "function", fn);
            json_array_append_new(calls, c);
        }
        json_object_set_new(m, "tool_calls", calls);
    }
    return m;
}
