/* libFuzzer target for the output parser (src/tokenizer/parse.c): any bytes, fed in pieces cut
 * at fuzzer-chosen points, must rebuild exactly the whole-text result from the events, with
 * every emitted string valid UTF-8 and every arguments string a JSON object. Crashes, leaks and
 * sanitizer reports are failures too.
 *   input = [flags][cut seed][text...]; flags bit 0: thinking, bit 1: parse tools,
 *   bit 2: with a tool schema. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat.h"
#include "tokenizer/parse.h"
#include "t_utf8.h"

static const char *SCHEMA = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
                            "\"type\":\"object\",\"properties\":{"
                            "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{"
                            "\"type\":\"number\"},\"b\":{\"type\":"
                            "\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},"
                            "\"u\":{\"type\":[\"null\",\"integer\"]}}}}}]";

typedef struct {
    tl_buf r, c, args[64];
    int n_calls;
} acc;

static void take(acc *a, const tl_parse_event *ev, int n) {
    for (int i = 0; i < n; i++) {
        if (!utf8_ok(ev[i].text, ev[i].len)) abort();
        switch (ev[i].kind) {
        case TL_PARSE_REASONING:
            tl_buf_append(&a->r, ev[i].text, ev[i].len);
            break;
        case TL_PARSE_CONTENT:
            tl_buf_append(&a->c, ev[i].text, ev[i].len);
            break;
        case TL_PARSE_TOOL_START:
            if (ev[i].index != a->n_calls) abort();
            if (a->n_calls < 64) tl_buf_append(&a->args[a->n_calls], "", 0);
            a->n_calls++;
            break;
        case TL_PARSE_TOOL_ARGS:
            if (ev[i].index != a->n_calls - 1) abort();
            if (ev[i].index < 64) tl_buf_append(&a->args[ev[i].index], ev[i].text, ev[i].len);
            break;
        case TL_PARSE_TOOL_END:
            if (ev[i].index != a->n_calls - 1) abort();
            break;
        }
    }
}

static int buf_eq(const tl_buf *b, const char *s, size_t n) {
    return b->n == n && (n == 0 || !memcmp(b->p, s, n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *schema;
    if (!schema) schema = json_loads(SCHEMA, 0, NULL);
    if (size < 2) return 0;
    uint8_t flags = data[0];
    uint64_t seed = data[1] * 0x9e3779b97f4a7c15ull + 1;
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    tl_parse_opts o;
    tl_parse_opts_default(&o);
    o.thinking = flags & 1;
    o.parse_tools = (flags >> 1) & 1;
    o.tools = (flags & 4) ? schema : NULL;
    o.id_seed = 7;

    tl_parse_result whole;
    tl_parse_text(text, n, &o, &whole);
    if (!utf8_ok(whole.reasoning, whole.reasoning_len) ||
        !utf8_ok(whole.content, whole.content_len))
        abort();
    for (int i = 0; i < whole.n_calls; i++) {
        json_t *v = json_loads(whole.calls[i].arguments, JSON_ALLOW_NUL, NULL);
        if (!json_is_object(v)) abort();
        json_decref(v);
    }

    tl_parser *p = tl_parser_new(&o);
    acc a = {0};
    const tl_parse_event *ev;
    size_t pos = 0;
    while (pos < n) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        size_t k = 1 + (size_t)(seed % 9);
        if (k > n - pos) k = n - pos;
        int m = tl_parser_feed(p, text + pos, k, &ev);
        take(&a, ev, m);
        pos += k;
    }
    int m = tl_parser_finish(p, &ev);
    take(&a, ev, m);
    if (!buf_eq(&a.r, whole.reasoning, whole.reasoning_len) ||
        !buf_eq(&a.c, whole.content, whole.content_len) || a.n_calls != whole.n_calls)
        abort();
    for (int i = 0; i < a.n_calls && i < 64; i++)
        if (strcmp(a.args[i].p, whole.calls[i].arguments)) abort();
    tl_buf_free(&a.r);
    tl_buf_free(&a.c);
    for (int i = 0; i < 64; i++) tl_buf_free(&a.args[i]);
    tl_parser_free(p);
    tl_parse_result_free(&whole);
    return 0;
}
