/* The Qwen3.6 chat template, written out in C (see chat.h). Comments "Lnn" refer to the lines
 * of the checkpoint's chat_template.jinja (docs/model.md §4.4; the reference tests read a copy
 * from ../shared/data when it is there, docs/developing.md §2). Every `{%-`/`{{-` in the template
 * strips the whitespace before it and trim_blocks eats the newline after each `%}`, so the
 * template's own indentation never reaches the output: only the string literals and values below
 * do.
 *
 * jinja2 semantics that matter here, as HF runs it:
 *   - `x|trim` is Python's str.strip(): Unicode whitespace (py_ws below), not just ASCII;
 *   - `{{ v }}` of a non-string is Python's str(v): None -> "None", True -> "True", 1.0 ->
 *     "1.0", lists/dicts -> their repr;
 *   - `v|tojson` is json.dumps(v, ensure_ascii=False): separators ", " and ": ";
 *   - `obj.attr` on a dict is obj["attr"], on anything else undefined; `'s' in x` is key
 *     membership for dicts, substring for strings, element equality for lists, a TypeError
 *     otherwise; `a + undefined` raises.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "common/status.h"
#include "common/utf8.h"
#include "common/util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat.h"

/* ------------------------------------------------------------------ Python text */

void tl_chat_json_escape(tl_buf *b, const char *s, size_t n) {
    size_t run = 0; /* start of the pending verbatim run */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue; /* the common case: verbatim */
        const char *rep = NULL;
        char tmp[8];
        switch (c) {
        case '"':
            rep = "\\\"";
            break;
        case '\\':
            rep = "\\\\";
            break;
        case '\b':
            rep = "\\b";
            break;
        case '\f':
            rep = "\\f";
            break;
        case '\n':
            rep = "\\n";
            break;
        case '\r':
            rep = "\\r";
            break;
        case '\t':
            rep = "\\t";
            break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                rep = tmp;
            }
        }
        if (!rep) continue;
        tl_buf_append(b, s + run, i - run);
        tl_buf_puts(b, rep);
        run = i + 1;
    }
    tl_buf_append(b, s + run, n - run);
}

/* Python's float repr: the shortest digit string that reads back as x, printed in fixed
 * notation when the decimal exponent is in [-4, 16), else as d.ddde+XX. */
void tl_chat_py_float(tl_buf *b, double x) {
    char tmp[64];
    if (isnan(x)) {
        tl_buf_puts(b, "NaN");
        return;
    }
    if (isinf(x)) {
        tl_buf_puts(b, x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (x == 0) {
        tl_buf_puts(b, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX: collect the digits and the exponent */
    char dig[32];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    int e10 = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--; /* %.*e may pad with zeros */
    dig[nd] = 0;
    int decpt = e10 + 1; /* x = 0.d1d2... * 10^decpt */
    if (neg) tl_buf_append(b, "-", 1);
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            tl_buf_puts(b, "0.");
            for (int i = 0; i < -decpt; i++) tl_buf_append(b, "0", 1);
            tl_buf_append(b, dig, (size_t)nd);
        } else if (decpt >= nd) {
            tl_buf_append(b, dig, (size_t)nd);
            for (int i = nd; i < decpt; i++) tl_buf_append(b, "0", 1);
            tl_buf_puts(b, ".0");
        } else {
            tl_buf_append(b, dig, (size_t)decpt);
            tl_buf_append(b, ".", 1);
            tl_buf_append(b, dig + decpt, (size_t)(nd - decpt));
        }
    } else {
        tl_buf_append(b, dig, 1);
        if (nd > 1) {
            tl_buf_append(b, ".", 1);
            tl_buf_append(b, dig + 1, (size_t)(nd - 1));
        }
        int e = decpt - 1;
        snprintf(tmp, sizeof tmp, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        tl_buf_puts(b, tmp);
    }
}

/* Python's str.isprintable() for one code point, as repr() uses it (utf8proc categories). */
static int py_printable(int32_t c) {
    if (c == ' ') return 1;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

/* Python's repr() of a str (used only inside repr() of lists and dicts). */
static void py_repr_str(tl_buf *b, const char *s, size_t n) {
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    char tmp[16];
    tl_buf_append(b, &q, 1);
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k;
        /* jansson strings are valid UTF-8; be safe anyway */
        if (tl_utf8_decode(s + i, n - i, &c, &k) != TL_UTF8_OK) {
            k = 1;
            c = (unsigned char)s[i];
        }
        if (c == (uint32_t)q || c == '\\') {
            tl_buf_append(b, "\\", 1);
            tl_buf_append(b, s + i, 1);
        } else if (c == '\t') {
            tl_buf_puts(b, "\\t");
        } else if (c == '\n') {
            tl_buf_puts(b, "\\n");
        } else if (c == '\r') {
            tl_buf_puts(b, "\\r");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned)c);
            tl_buf_puts(b, tmp);
        } else if (c < 0x80 || py_printable(c)) {
            tl_buf_append(b, s + i, (size_t)k);
        } else {
            if (c < 0x100)
                snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned)c);
            else if (c < 0x10000)
                snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)c);
            else
                snprintf(tmp, sizeof tmp, "\\U%08x", (unsigned)c);
            tl_buf_puts(b, tmp);
        }
        i += (size_t)k;
    }
    tl_buf_append(b, &q, 1);
}

/* The template prints JSON values in two dialects: `|tojson` (json.dumps, ensure_ascii=False:
 * double quotes, true/false/null) and Python's repr() (quotes as repr picks them,
 * True/False/None, nan/inf). One walker serves both. */
enum { DUMP_JSON, DUMP_PY };

static void dump_value(tl_buf *b, const json_t *v, int py, int top);

/* A string as a literal of the dialect: "json" or Python's 'repr'. */
static void dump_quoted(tl_buf *b, const char *s, size_t n, int py) {
    if (py) {
        py_repr_str(b, s, n);
        return;
    }
    tl_buf_append(b, "\"", 1);
    tl_chat_json_escape(b, s, n);
    tl_buf_append(b, "\"", 1);
}

/* {k: v, ...} or [x, ...]: separators ", " and ": " in both dialects. */
static void dump_container(tl_buf *b, const json_t *v, int py) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        int first = 1;
        tl_buf_append(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) tl_buf_append(b, ", ", 2);
            first = 0;
            dump_quoted(b, k, strlen(k), py);
            tl_buf_append(b, ": ", 2);
            dump_value(b, x, py, 0);
        }
        tl_buf_append(b, "}", 1);
        return;
    }
    tl_buf_append(b, "[", 1);
    for (size_t i = 0; i < json_array_size(v); i++) {
        if (i) tl_buf_append(b, ", ", 2);
        dump_value(b, json_array_get(v, i), py, 0);
    }
    tl_buf_append(b, "]", 1);
}

/* v in the dialect; top (Python only): str(v) rather than repr(v), which differ for strings. */
static void dump_value(tl_buf *b, const json_t *v, int py, int top) {
    static const char *const lit[2][3] = {{"true", "false", "null"}, {"True", "False", "None"}};
    char tmp[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        dump_container(b, v, py);
        break;
    case JSON_STRING:
        if (py && top)
            tl_buf_append(b, json_string_value(v), json_string_length(v));
        else
            dump_quoted(b, json_string_value(v), json_string_length(v), py);
        break;
    case JSON_INTEGER:
        snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(v));
        tl_buf_puts(b, tmp);
        break;
    case JSON_REAL: {
        double x = json_real_value(v);
        if (py && isnan(x))
            tl_buf_puts(b, "nan");
        else if (py && isinf(x))
            tl_buf_puts(b, x > 0 ? "inf" : "-inf");
        else
            tl_chat_py_float(b, x);
        break;
    }
    case JSON_TRUE:
        tl_buf_puts(b, lit[py][0]);
        break;
    case JSON_FALSE:
        tl_buf_puts(b, lit[py][1]);
        break;
    case JSON_NULL:
        tl_buf_puts(b, lit[py][2]);
        break;
    }
}

void tl_chat_json_dump(tl_buf *b, const json_t *v) { dump_value(b, v, DUMP_JSON, 0); }

/* Python's repr() (inside containers) and str() (top level) of a JSON value. */
static void py_repr(tl_buf *b, const json_t *v, int top) { dump_value(b, v, DUMP_PY, top); }

/* Python str.isspace() code points (what str.strip() removes). */
static int py_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The whitespace character starting at s[i] (i < n): its length, or 0 when the character there
 * is not whitespace. An invalid or truncated sequence counts as a non-whitespace byte. */
static size_t ws_at(const char *s, size_t n, size_t i) {
    uint32_t cp;
    size_t k;
    if (tl_utf8_decode(s + i, n - i, &cp, &k) != TL_UTF8_OK) return 0;
    return py_ws((int32_t)cp) ? k : 0;
}

/* The same for the character ending at s[end - 1], where lo < end are both character
 * boundaries of the forward decode of s[0, n). Its lead byte is the nearest byte at or before
 * end - 1 that is not a continuation byte (at most 3 back, not before lo): a valid sequence
 * holds only continuation bytes after its lead, so no character of the forward decode starts
 * before a non-continuation byte and covers it. Anything but one valid character exactly
 * filling [lead, end) means the last character is an invalid byte: not whitespace. */
static size_t ws_before(const char *s, size_t n, size_t lo, size_t end) {
    size_t q = end - 1;
    while (q > lo && end - q < 4 && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
    size_t k = ws_at(s, n, q);
    return k == end - q ? k : 0;
}

void tl_chat_py_strip(const char *s, size_t n, size_t *off, size_t *len) {
    size_t first = 0, end = n, k;
    while (first < n && (k = ws_at(s, n, first))) first += k;
    /* the character at first is not whitespace, so the backward scan stops at it or later */
    while (end > first && (k = ws_before(s, n, first, end))) end -= k;
    *off = first < n ? first : 0;
    *len = end - first;
}

/* ------------------------------------------------------------------ template helpers */

typedef struct span {
    const char *s;
    size_t n;
} span;

static int span_starts(span a, const char *lit) {
    size_t n = strlen(lit);
    return a.n >= n && !memcmp(a.s, lit, n);
}
static int span_ends(span a, const char *lit) {
    size_t n = strlen(lit);
    return a.n >= n && !memcmp(a.s + a.n - n, lit, n);
}
/* First (last = 0) or last (last = 1) occurrence of lit in a, or -1. */
static long span_find(span a, const char *lit, int last) {
    size_t n = strlen(lit);
    long found = -1;
    if (a.n < n) return -1;
    for (size_t i = 0; i + n <= a.n; i++) {
        if (!memcmp(a.s + i, lit, n)) {
            found = (long)i;
            if (!last) break;
        }
    }
    return found;
}

/* `obj.key` on a JSON value: the member if obj is an object holding it, else NULL (undefined). */
static const json_t *attr(const json_t *obj, const char *key) {
    return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

/* `x == 'lit'` for a JSON value (undefined is NULL). */
static int json_eq_str(const json_t *x, const char *lit) {
    return json_is_string(x) && json_string_length(x) == strlen(lit) &&
           !strcmp(json_string_value(x), lit);
}

/* `'key' in item`: for a dict key membership, for a str substring, for a list element
 * equality. Other types raise a TypeError in Python: returns -1. */
static int py_in(const char *key, const json_t *item) {
    switch (json_typeof(item)) {
    case JSON_OBJECT:
        return json_object_get(item, key) != NULL;
    case JSON_STRING: {
        span s = {json_string_value(item), json_string_length(item)};
        return span_find(s, key, 0) >= 0;
    }
    case JSON_ARRAY:
        for (size_t i = 0; i < json_array_size(item); i++)
            if (json_eq_str(json_array_get(item, i), key)) return 1;
        return 0;
    default:
        return -1;
    }
}

static const char *py_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "dict";
    case JSON_ARRAY:
        return "list";
    case JSON_STRING:
        return "str";
    case JSON_INTEGER:
        return "int";
    case JSON_REAL:
        return "float";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    case JSON_NULL:
        return "NoneType";
    }
    return "object";
}

/* Jinja truthiness of a JSON value (undefined = NULL is false). */
static int truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return json_object_size(v) > 0;
    case JSON_ARRAY:
        return json_array_size(v) > 0;
    case JSON_STRING:
        return json_string_length(v) > 0;
    case JSON_INTEGER:
        return json_integer_value(v) != 0;
    case JSON_REAL:
        return json_real_value(v) != 0;
    case JSON_TRUE:
        return 1;
    default:
        return 0;
    }
}

/* L3-L41: macro render_content(content, do_vision_count, is_system_content). Images and
 * videos become placeholders (add_vision_id is never set by us, so no "Picture N: "). */
static int render_content(tl_buf *b, const json_t *content, int is_system, char *err,
                          size_t errlen) {
    if (!content || json_is_null(content)) return 0; /* L36-37 */
    if (json_is_string(content)) {                   /* L4-5 */
        tl_buf_append(b, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content)) /* L6: iterable and not mapping; L38-39 */
        return tl_errf(err, errlen, TL_ERR_INVALID, "Unexpected content type.");
    for (size_t i = 0; i < json_array_size(content); i++) {
        const json_t *item = json_array_get(content, i);
        int has_image = py_in("image", item), has_url = py_in("image_url", item);
        if (has_image < 0) /* `'image' in 5`: TypeError */
            return tl_errf(err, errlen, TL_ERR_INVALID, "argument of type '%s' is not iterable",
                           py_type_name(item));
        if (has_image || has_url || json_eq_str(attr(item, "type"), "image")) { /* L8 */
            if (is_system)
                return tl_errf(err, errlen, TL_ERR_INVALID,
                               "System message cannot contain images.");
            tl_buf_puts(b, "<|vision_start|><|image_pad|><|vision_end|>");             /* L18 */
        } else if (py_in("video", item) || json_eq_str(attr(item, "type"), "video")) { /* L19 */
            if (is_system)
                return tl_errf(err, errlen, TL_ERR_INVALID,
                               "System message cannot contain videos.");
            tl_buf_puts(b, "<|vision_start|><|video_pad|><|vision_end|>"); /* L29 */
        } else if (py_in("text", item)) { /* L30-31: {{ item.text }} is str(item.text) */
            const json_t *t = attr(item, "text");
            if (t) py_repr(b, t, 1);
        } else {
            return tl_errf(err, errlen, TL_ERR_INVALID, "Unexpected item type in content.");
        }
    }
    return 0;
}

/* render_content(...)|trim into a fresh buffer: *out is malloc'd (or NULL when empty). */
static int content_trimmed(const json_t *content, int is_system, tl_buf *tmp, span *out, char *err,
                           size_t errlen) {
    tl_buf_truncate(tmp, 0);
    int st = render_content(tmp, content, is_system, err, errlen);
    if (st) return st;
    size_t off, len;
    tl_chat_py_strip(tmp->p ? tmp->p : "", tmp->n, &off, &len);
    out->s = tmp->p ? tmp->p + off : "";
    out->n = len;
    return 0;
}

static const char TOOLS_PREAMBLE[] =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";

static const char TOOLS_INSTRUCTIONS[] =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
    "specified\n- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function "
    "calls\n</IMPORTANT>";

/* L46-53: the tools block: each tool as JSON on its own line (for a string, each character as
 * a JSON string, as iterating a str gives), then the instructions for calling them. */
static void render_tools(tl_buf *b, const json_t *tools) {
    tl_buf_puts(b, "<|im_start|>system\n"); /* L46 */
    tl_buf_puts(b, TOOLS_PREAMBLE);         /* L47 */
    if (json_is_array(tools)) {
        for (size_t i = 0; i < json_array_size(tools); i++) { /* L48-51 */
            tl_buf_append(b, "\n", 1);
            tl_chat_json_dump(b, json_array_get(tools, i));
        }
    } else {
        const char *s = json_string_value(tools);
        size_t n = json_string_length(tools);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k;
            if (tl_utf8_decode(s + i, n - i, &cp, &k) != TL_UTF8_OK) k = 1;
            tl_buf_puts(b, "\n\"");
            tl_chat_json_escape(b, s + i, (size_t)k);
            tl_buf_puts(b, "\"");
            i += (size_t)k;
        }
    }
    tl_buf_puts(b, "\n</tools>");       /* L52 */
    tl_buf_puts(b, TOOLS_INSTRUCTIONS); /* L53 */
}

/* L45-66: the system turn (with the tools block when tools is a non-empty list). */
static int render_system(tl_buf *b, const json_t *messages, const json_t *tools, tl_buf *tmp,
                         char *err, size_t errlen) {
    const json_t *m0 = json_array_get(messages, 0);
    int sys0 = json_eq_str(attr(m0, "role"), "system");
    span c;
    /* L45: `tools and tools is iterable and tools is not mapping`: a non-empty list, or a
     * non-empty string (iterated character by character, as Python would). */
    int tools_list = tools && json_is_array(tools) && json_array_size(tools) > 0;
    int tools_str = tools && json_is_string(tools) && json_string_length(tools) > 0;
    if (tools_list || tools_str) {
        render_tools(b, tools);
        if (sys0) { /* L54-59 */
            int st = content_trimmed(attr(m0, "content"), 1, tmp, &c, err, errlen);
            if (st) return st;
            if (c.n) {
                tl_buf_puts(b, "\n\n");
                tl_buf_append(b, c.s, c.n);
            }
        }
        tl_buf_puts(b, "<|im_end|>\n"); /* L60 */
    } else if (sys0) {                  /* L62-65 */
        int st = content_trimmed(attr(m0, "content"), 1, tmp, &c, err, errlen);
        if (st) return st;
        tl_buf_puts(b, "<|im_start|>system\n");
        tl_buf_append(b, c.s, c.n);
        tl_buf_puts(b, "<|im_end|>\n");
    }
    return 0;
}

/* L67-80: index of the last user message that is not only a <tool_response>. */
static int last_query_index(const json_t *messages, tl_buf *tmp, long *out, char *err,
                            size_t errlen) {
    size_t n = json_array_size(messages);
    for (size_t k = n; k-- > 0;) {
        const json_t *m = json_array_get(messages, k);
        if (!json_eq_str(attr(m, "role"), "user")) continue;
        span c;
        int st = content_trimmed(attr(m, "content"), 0, tmp, &c, err, errlen);
        if (st) return st;
        if (!(span_starts(c, "<tool_response>") && span_ends(c, "</tool_response>"))) {
            *out = (long)k;
            return 0;
        }
    }
    return tl_errf(err, errlen, TL_ERR_INVALID, "No user query found in messages."); /* L78-80 */
}

/* A tool call's arguments as the template sees them: an object passes through; a JSON string
 * is parsed first (the servers' pre-processing, chat.h). *owned gets a new reference to free. */
static int tool_args(const json_t *a, const json_t **out, json_t **owned, char *err,
                     size_t errlen) {
    *owned = NULL;
    *out = a;
    if (!json_is_string(a)) return 0;
    json_error_t je;
    json_t *v = json_loadb(json_string_value(a), json_string_length(a),
                           JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        return tl_errf(err, errlen, TL_ERR_INVALID, "tool call arguments are not valid JSON: %s",
                       je.text);
    *owned = v;
    *out = v;
    return 0;
}

/* L119-126: one <parameter=K> block per argument (a JSON-string arguments value parsed first). */
static int render_call_args(tl_buf *b, const json_t *args0, char *err, size_t errlen) {
    const json_t *args;
    json_t *owned;
    int st = tool_args(args0, &args, &owned, err, errlen);
    if (st) return st;
    if (!json_is_object(args)) { /* arguments|items on a non-mapping */
        json_decref(owned);
        return tl_errf(err, errlen, TL_ERR_INVALID, "Can only get item pairs from a mapping.");
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)args, k, v) {
        tl_buf_puts(b, "<parameter=");
        tl_buf_puts(b, k);
        tl_buf_puts(b, ">\n");
        /* L122: strings verbatim, everything else tojson */
        if (json_is_string(v))
            tl_buf_append(b, json_string_value(v), json_string_length(v));
        else
            tl_chat_json_dump(b, v);
        tl_buf_puts(b, "\n</parameter>\n");
    }
    json_decref(owned);
    return 0;
}

/* L105-129: the tool calls of one assistant message. */
static int render_tool_calls(tl_buf *b, const json_t *calls, span content, char *err,
                             size_t errlen) {
    /* L105: `tool_calls and tool_calls is iterable and tool_calls is not mapping` */
    if (!truthy(calls) || json_is_object(calls) || !(json_is_array(calls) || json_is_string(calls)))
        return 0;
    if (json_is_string(calls)) /* iterating a str: each character has no .name */
        return tl_errf(err, errlen, TL_ERR_INVALID, "'str object' has no attribute 'name'");
    size_t off, len;
    tl_chat_py_strip(content.s, content.n, &off, &len);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *tc = json_array_get(calls, i);
        const json_t *fn = attr(tc, "function");
        if (json_is_object(tc) && fn) tc = fn; /* L107-109: `function is defined` */
        const json_t *name = attr(tc, "name");
        if (!json_is_string(name)) /* str + undefined / str + non-str raises */
            return tl_errf(err, errlen, TL_ERR_INVALID, "tool call %zu has no string 'name'", i);
        if (i == 0)
            tl_buf_puts(b, len ? "\n\n<tool_call>\n<function="
                               : "<tool_call>\n<function="); /* L110-115 */
        else
            tl_buf_puts(b, "\n<tool_call>\n<function="); /* L117 */
        tl_buf_append(b, json_string_value(name), json_string_length(name));
        tl_buf_puts(b, ">\n");
        const json_t *args = attr(tc, "arguments");
        if (args) { /* L119-126 */
            int st = render_call_args(b, args, err, errlen);
            if (st) return st;
        }
        tl_buf_puts(b, "</function>\n</tool_call>"); /* L127 */
    }
    return 0;
}

/* L89-130: one assistant message; content is its trimmed rendered content. */
static int render_assistant(tl_buf *b, const json_t *m, span content, int with_think, char *err,
                            size_t errlen) {
    span reasoning = {"", 0};
    const json_t *rc = attr(m, "reasoning_content");
    if (json_is_string(rc)) { /* L91-92 */
        reasoning.s = json_string_value(rc);
        reasoning.n = json_string_length(rc);
    } else if (span_find(content, "</think>", 0) >= 0) { /* L94-97 */
        long first = span_find(content, "</think>", 0), last = span_find(content, "</think>", 1);
        span r = {content.s, (size_t)first};
        while (r.n && r.s[r.n - 1] == '\n') r.n--; /* .rstrip('\n') */
        long open = span_find(r, "<think>", 1);    /* .split('<think>')[-1] */
        if (open >= 0) {
            r.s += open + 7;
            r.n -= (size_t)open + 7;
        }
        while (r.n && r.s[0] == '\n') r.s++, r.n--; /* .lstrip('\n') */
        reasoning = r;
        content.s += last + 8; /* content.split('</think>')[-1] */
        content.n -= (size_t)last + 8;
        while (content.n && content.s[0] == '\n') content.s++, content.n--;
    }
    size_t off, len;
    tl_chat_py_strip(reasoning.s, reasoning.n, &off, &len); /* L99 */
    if (with_think) {                                       /* L100-101 */
        tl_buf_puts(b, "<|im_start|>assistant\n<think>\n");
        tl_buf_append(b, reasoning.s + off, len);
        tl_buf_puts(b, "\n</think>\n\n");
    } else { /* L103 */
        tl_buf_puts(b, "<|im_start|>assistant\n");
    }
    tl_buf_append(b, content.s, content.n);
    int st = render_tool_calls(b, attr(m, "tool_calls"), content, err, errlen);
    if (st) return st;
    tl_buf_puts(b, "<|im_end|>\n"); /* L130 */
    return 0;
}

void tl_chat_opts_default(tl_chat_opts *o) {
    o->enable_thinking = 1;
    o->preserve_thinking = 0;
    o->add_generation_prompt = 1;
}

/* L131-142: a tool message; a run of them shares one user turn. */
static void render_tool(tl_buf *b, const json_t *messages, size_t i, span c) {
    /* loop.previtem is undefined for the first message; any earlier message that got here is a
     * non-empty dict, hence truthy */
    if (i > 0 && !json_eq_str(attr(json_array_get(messages, i - 1), "role"), "tool"))
        tl_buf_puts(b, "<|im_start|>user");
    tl_buf_puts(b, "\n<tool_response>\n");
    tl_buf_append(b, c.s, c.n);
    tl_buf_puts(b, "\n</tool_response>");
    if (i + 1 == json_array_size(messages) ||
        !json_eq_str(attr(json_array_get(messages, i + 1), "role"), "tool"))
        tl_buf_puts(b, "<|im_end|>\n");
}

/* L83-144: message i by its role; c is its trimmed rendered content. */
static int render_message(tl_buf *b, const json_t *messages, size_t i, span c, int with_think,
                          char *err, size_t errlen) {
    const json_t *m = json_array_get(messages, i), *role = attr(m, "role");
    if (json_eq_str(role, "system")) { /* L83-86 */
        if (i != 0)
            return tl_errf(err, errlen, TL_ERR_INVALID, "System message must be at the beginning.");
    } else if (json_eq_str(role, "user")) { /* L87-88 */
        tl_buf_puts(b, "<|im_start|>user\n");
        tl_buf_append(b, c.s, c.n);
        tl_buf_puts(b, "<|im_end|>\n");
    } else if (json_eq_str(role, "assistant")) {
        return render_assistant(b, m, c, with_think, err, errlen);
    } else if (json_eq_str(role, "tool")) {
        render_tool(b, messages, i, c);
    } else {
        return tl_errf(err, errlen, TL_ERR_INVALID, "Unexpected message role."); /* L143-144 */
    }
    return 0;
}

/* L45-146: the system turn, then every message (assistant turns after the last user query, or
 * all of them with preserve_thinking, keep their reasoning). */
static int render_messages(tl_buf *b, const json_t *messages, const json_t *tools,
                           const tl_chat_opts *o, tl_buf *tmp, char *err, size_t errlen) {
    long last_query = 0;
    int st = render_system(b, messages, tools, tmp, err, errlen);
    if (!st) st = last_query_index(messages, tmp, &last_query, err, errlen);
    for (size_t i = 0; !st && i < json_array_size(messages); i++) { /* L81-146 */
        span c;
        /* L82: do_vision_count, not system */
        st = content_trimmed(attr(json_array_get(messages, i), "content"), 0, tmp, &c, err, errlen);
        if (!st)
            st = render_message(b, messages, i, c, o->preserve_thinking || (long)i > last_query,
                                err, errlen);
    }
    if (!st && tmp->err) st = tl_errf(err, errlen, tmp->err, "out of memory rendering the chat");
    return st;
}

/* L147-154: what add_generation_prompt appends, after everything else. */
static const char *gen_prompt(const tl_chat_opts *o) {
    return o->enable_thinking ? "<|im_start|>assistant\n<think>\n"
                              : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

size_t tl_chat_gen_prompt_len(const tl_chat_opts *o) {
    tl_chat_opts def;
    if (!o) {
        tl_chat_opts_default(&def);
        o = &def;
    }
    return o->add_generation_prompt ? strlen(gen_prompt(o)) : 0;
}

int tl_chat_snap_point(const tl_tokenizer *tok, const tl_chat_opts *o, const char *text, size_t len,
                       const int32_t *ids, size_t n_ids) {
    size_t n2 = len - tl_chat_gen_prompt_len(o);
    int at = 0;
    if (n2 > 0 && n2 < len) {
        tl_tok_ids p = {0};
        if (tl_tokenize(tok, text, n2, 0, &p) > 0 && p.n < n_ids &&
            !memcmp(p.ids, ids, p.n * sizeof(int32_t)))
            at = (int)p.n;
        tl_tok_ids_free(&p);
    }
    return at;
}

int tl_chat_render(const json_t *messages, const json_t *tools, const tl_chat_opts *o, char **out,
                   size_t *out_len, char *err, size_t errlen) {
    tl_chat_opts def;
    if (!o) {
        tl_chat_opts_default(&def);
        o = &def;
    }
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!messages || json_is_null(messages) ||
        (json_is_array(messages) && json_array_size(messages) == 0))
        return tl_errf(err, errlen, TL_ERR_INVALID, "No messages provided."); /* L42-44 */
    if (!json_is_array(messages))
        return tl_errf(err, errlen, TL_ERR_INVALID, "messages must be a list");
    tl_buf b = {0}, tmp = {0};
    int st = render_messages(&b, messages, tools, o, &tmp, err, errlen);
    tl_buf_free(&tmp);
    if (st) {
        tl_buf_free(&b);
        return st;
    }
    if (o->add_generation_prompt) tl_buf_puts(&b, gen_prompt(o));
    *out = tl_buf_take(&b, out_len);
    if (!*out) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory rendering the chat");
    return 0;
}
