/* Chat template (src/tokenizer/chat.c) against renders of the Jinja reference: the expected
 * strings in tests/data/chat/expected.jsonl come from jinja2 set up as Hugging Face does
 * (tools/gen_chat_cases.py + tests/py/chat_ref.py), for the hand-written edge cases and the
 * first random conversations of tests/data/chat/cases.jsonl. The full corpus is compared by
 * tests/py/test_chat.py; this binary runs the same code under ASan+UBSan. The Python-format
 * expectations (float repr, json.dumps) below were printed by CPython 3.11. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "t_check.h"
#include "common/utf8.h"
#include "tokenizer/chat.h"
#include "tulip.h"

#define CASES    "tests/data/chat/cases.jsonl"
#define EXPECTED "tests/data/chat/expected.jsonl"

static json_t *load_lines(const char *path) {
    FILE *f = fopen(path, "rb");
    json_t *arr = json_array();
    if (!f) {
        fprintf(stderr, "cannot open %s (run from the repository root)\n", path);
        return arr;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        if (v)
            json_array_append_new(arr, v);
        else
            fprintf(stderr, "%s: %s\n", path, je.text);
    }
    free(line);
    fclose(f);
    return arr;
}

static int opt(const json_t *c, const char *k, int def) {
    const json_t *v = json_object_get(c, k);
    return v ? json_is_true(v) : def;
}

static void test_corpus_expected(void) {
    json_t *cases = load_lines(CASES), *exp = load_lines(EXPECTED);
    CHECK(json_array_size(cases) >= 100);
    CHECK(json_array_size(exp) >= 100);
    size_t n_same = 0;
    for (size_t i = 0; i < json_array_size(exp); i++) {
        const json_t *e = json_array_get(exp, i), *c = NULL;
        const char *name = json_string_value(json_object_get(e, "name"));
        for (size_t j = 0; j < json_array_size(cases) && !c; j++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(cases, j), "name")), name))
                c = json_array_get(cases, j);
        CHECK(c != NULL);
        if (!c) continue;
        tl_chat_opts o;
        tl_chat_opts_default(&o);
        o.enable_thinking = opt(c, "enable_thinking", 1);
        o.preserve_thinking = opt(c, "preserve_thinking", 0);
        o.add_generation_prompt = opt(c, "add_generation_prompt", 1);
        char *out = NULL, err[512] = "";
        size_t len = 0;
        int st = tl_chat_render(json_object_get(c, "messages"), json_object_get(c, "tools"), &o,
                                &out, &len, err, sizeof err);
        const json_t *want = json_object_get(e, "prompt");
        int same;
        if (want) {
            same = st == 0 && len == json_string_length(want) &&
                   !memcmp(out, json_string_value(want), len);
        } else {
            const json_t *msg = json_object_get(e, "error");
            same = st == TL_ERR_INVALID && out == NULL &&
                   (json_is_null(msg) || !strcmp(err, json_string_value(msg)));
        }
        if (!same) fprintf(stderr, "case %s differs: st=%d err=%s\n", name, st, err);
        n_same += same;
        free(out);
    }
    CHECK_EQ_INT(n_same, json_array_size(exp));
    printf("# %zu cases identical to the jinja2 reference\n", n_same);
    json_decref(cases);
    json_decref(exp);
}

static char *render(const char *msgs_json, const char *tools_json, int think, int preserve, int gen,
                    int *st, char *err, size_t errlen) {
    json_t *m = json_loads(msgs_json, 0, NULL),
           *t = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    tl_chat_opts o = {think, preserve, gen};
    char *out = NULL;
    *st = tl_chat_render(m, t, &o, &out, NULL, err, errlen);
    json_decref(m);
    json_decref(t);
    return out;
}

/* Small cases written out by hand from the template text. */
static void test_shapes(void) {
    char err[256];
    int st;
    char *s =
        render("[{\"role\":\"user\",\"content\":\" Hi \"}]", NULL, 1, 0, 1, &st, err, sizeof err);
    CHECK_STR(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    free(s);
    s = render("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 0, 0, 1, &st, err, sizeof err);
    CHECK_STR(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(s);
    s = render("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 1, 0, 0, &st, err, sizeof err);
    CHECK_STR(s, "<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    /* history before the last query loses its reasoning; after it keeps it */
    s = render("[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\",\"content\":\"a1\","
               "\"reasoning_content\":\"r1\"},{\"role\":\"user\",\"content\":\"q2\"},{\"role\":"
               "\"assistant\","
               "\"content\":\"<think>r2</think>a2\"}]",
               NULL, 1, 0, 0, &st, err, sizeof err);
    CHECK_STR(
        s,
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2"
        "<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
    free(s);
    /* tool call with a JSON-string argument object; tool results merged into one user turn */
    s = render("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
               "\"tool_calls\":"
               "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": "
               "1, \\\"b\\\": \\\"x\\\"}\"}}]},"
               "{\"role\":\"tool\",\"content\":\"r1\"},{\"role\":\"tool\",\"content\":\"r2\"}]",
               NULL, 1, 0, 0, &st, err, sizeof err);
    CHECK_STR(
        s,
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
        "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nx\n</parameter>\n</"
        "function>\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
        "<tool_response>\nr2\n</tool_response><|im_end|>\n");
    free(s);
}

static void test_errors(void) {
    char err[256];
    int st;
    char *s = render("[]", NULL, 1, 0, 1, &st, err, sizeof err);
    CHECK(s == NULL);
    CHECK_EQ_INT(st, TL_ERR_INVALID);
    CHECK_STR(err, "No messages provided.");
    s = render("[{\"role\":\"assistant\",\"content\":\"x\"}]", NULL, 1, 0, 1, &st, err, sizeof err);
    CHECK_STR(err, "No user query found in messages.");
    s = render("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"system\",\"content\":\"s\"}]",
               NULL, 1, 0, 1, &st, err, sizeof err);
    CHECK_STR(err, "System message must be at the beginning.");
    s = render("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"bot\",\"content\":\"s\"}]", NULL,
               1, 0, 1, &st, err, sizeof err);
    CHECK_STR(err, "Unexpected message role.");
    s = render("[{\"role\":\"system\",\"content\":[{\"type\":\"image\"}]},{\"role\":\"user\","
               "\"content\":\"x\"}]",
               NULL, 1, 0, 1, &st, err, sizeof err);
    CHECK_STR(err, "System message cannot contain images.");
    CHECK(s == NULL);
    char *out = (char *)1;
    st = tl_chat_render(NULL, NULL, NULL, &out, NULL, err, sizeof err);
    CHECK_EQ_INT(st, TL_ERR_INVALID);
    CHECK(out == NULL);
}

static void check_float(double x, const char *want) {
    tl_buf b = {0};
    tl_chat_py_float(&b, x);
    CHECK_STR(b.p, want);
    tl_buf_free(&b);
}

static void test_python_formats(void) {
    check_float(1e16, "1e+16");
    check_float(1e15, "1000000000000000.0");
    check_float(0.0001, "0.0001");
    check_float(0.00001, "1e-05");
    check_float(1.5, "1.5");
    check_float(-0.0, "-0.0");
    check_float(0.1, "0.1");
    check_float(1.0 / 3, "0.3333333333333333");
    check_float(5e-324, "5e-324");
    check_float(1.7976931348623157e308, "1.7976931348623157e+308");
    check_float(123456789012345678.0, "1.2345678901234568e+17");
    check_float(2.5e-5, "2.5e-05");
    check_float(100.0, "100.0");
    check_float(1e22, "1e+22");
    check_float(0.1 + 0.2, "0.30000000000000004");
    check_float(-1.25e-10, "-1.25e-10");
    json_t *v = json_loads(
        "{\"a\":[1,\"x\\\"\\\\\\n\\t\\u0001\\u007f\\u00fc\",null,true,{}],\"b\":{},\"c\":[]}", 0,
        NULL);
    tl_buf b = {0};
    tl_chat_json_dump(&b, v);
    CHECK_STR(b.p, "{\"a\": [1, \"x\\\"\\\\\\n\\t\\u0001\x7f\xc3\xbc\", null, true, {}], \"b\": "
                   "{}, \"c\": []}");
    tl_buf_free(&b);
    json_decref(v);
}

/* The server renders once and takes the prompt without the generation prompt as a prefix of the
 * one with it: over the corpus, with thinking on and off, a render without it equals the render
 * with it less tl_chat_gen_prompt_len bytes, which are the template's L147-154 text. */
static void test_gen_prompt_is_suffix(void) {
    json_t *cases = load_lines(CASES);
    size_t n_checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        for (int think = 0; think < 2; think++) {
            tl_chat_opts o;
            tl_chat_opts_default(&o);
            o.enable_thinking = think;
            o.preserve_thinking = opt(c, "preserve_thinking", 0);
            char *with = NULL, *without = NULL, err[512];
            size_t n_with = 0, n_without = 0;
            const json_t *msgs = json_object_get(c, "messages"),
                         *tools = json_object_get(c, "tools");
            int st = tl_chat_render(msgs, tools, &o, &with, &n_with, err, sizeof err);
            o.add_generation_prompt = 0;
            int st2 = tl_chat_render(msgs, tools, &o, &without, &n_without, err, sizeof err);
            CHECK_EQ_INT(st, st2);
            CHECK_EQ_INT(tl_chat_gen_prompt_len(&o), 0);
            o.add_generation_prompt = 1;
            if (!st && !st2) {
                const char *gp = think ? "<|im_start|>assistant\n<think>\n"
                                       : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
                size_t k = tl_chat_gen_prompt_len(&o);
                CHECK_EQ_INT(k, strlen(gp));
                CHECK(n_with == n_without + k && !memcmp(with, without, n_without) &&
                      !memcmp(with + n_without, gp, k));
                n_checked++;
            }
            free(with);
            free(without);
        }
    }
    CHECK(n_checked >= 200);
    json_decref(cases);
}

/* The previous tl_chat_py_strip, kept as the oracle of the current one: it decodes the whole
 * string forward (an invalid byte is a 1-byte non-space character) and keeps the span from the
 * first to the end of the last non-space character. */
static int old_py_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

static void old_py_strip(const char *s, size_t n, size_t *off, size_t *len) {
    size_t i = 0, first = n, end = 0;
    while (i < n) {
        uint32_t cp;
        size_t k;
        int32_t c = tl_utf8_decode(s + i, n - i, &cp, &k) == TL_UTF8_OK ? (int32_t)cp : -1;
        if (c < 0) k = 1;
        if (!old_py_ws(c)) {
            if (first == n) first = i;
            end = i + k;
        }
        i += k;
    }
    *off = first == n ? 0 : first;
    *len = first == n ? 0 : end - first;
}

static unsigned long long strip_rng = 0x9E3779B97F4A7C15ull;

static uint32_t strip_rand(uint32_t n) { return (uint32_t)(t_rng_next(&strip_rng) >> 11) % n; }

/* Strings built from whitespace (ASCII and Unicode), other characters, invalid and truncated
 * sequences; each string and every prefix of it (a cut may truncate a character) through both
 * versions. Hand-checked spans (Python's str.strip) first. */
static void test_py_strip_matches_forward_scan(void) {
    static const char *const pieces[] = {" ",
                                         "\t",
                                         "\n",
                                         "\r",
                                         "\v",
                                         "\f",
                                         "\x1c",
                                         "\x1f",
                                         "\xc2\x85",
                                         "\xc2\xa0",
                                         "\xe1\x9a\x80",
                                         "\xe2\x80\x83",
                                         "\xe2\x80\x8a",
                                         "\xe2\x80\xa8",
                                         "\xe2\x80\xaf",
                                         "\xe3\x80\x80",
                                         "a",
                                         "Z",
                                         "\xc3\xa9",
                                         "\xe4\xb8\xad",
                                         "\xf0\x9f\x98\x80",
                                         "\xe2\x80\x8b" /* U+200B: not space */,
                                         "\x80",
                                         "\xbf",
                                         "\xc0",
                                         "\xc1",
                                         "\xf5",
                                         "\xff",
                                         "\xc2",
                                         "\xe3\x80",
                                         "\xf0\x9f\x98",
                                         "\xed\xa0\x80",
                                         "\xe0\x80\x80",
                                         "\xf4\x90\x80\x80",
                                         "\x80\x80\x80\x80",
                                         "\0"};
    const size_t n_pieces = sizeof pieces / sizeof pieces[0];
    static const struct {
        const char *s;
        size_t off, len;
    } hand[] = {{"", 0, 0},
                {" \t\n", 0, 0},
                {"\xe3\x80\x80 a\xe2\x80\x83"
                 "b \xc2\x85",
                 4, 5},
                {" \xc2", 1, 1},
                {"\xe3\x80 ", 0, 2},
                {"\xc2\xa0x\x80\xe3\x80\x80", 2, 2}};
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        size_t off = 99, len = 99;
        tl_chat_py_strip(hand[i].s, strlen(hand[i].s), &off, &len);
        CHECK_EQ_INT(off, hand[i].off);
        CHECK_EQ_INT(len, hand[i].len);
    }
    char s[96];
    long n_diff = 0;
    for (int it = 0; it < 50000; it++) {
        size_t n = 0, n_piece = strip_rand(12);
        for (size_t k = 0; k < n_piece; k++) {
            /* mostly whitespace pieces (the first 16), so runs at both ends are long */
            const char *p = pieces[strip_rand(3) ? strip_rand(16) : strip_rand(n_pieces)];
            size_t pl = p[0] ? strlen(p) : 1;
            memcpy(s + n, p, pl);
            n += pl;
        }
        for (size_t cut = 0; cut <= n; cut++) {
            size_t o1, l1, o2, l2;
            old_py_strip(s, cut, &o1, &l1);
            tl_chat_py_strip(s, cut, &o2, &l2);
            n_diff += o1 != o2 || l1 != l2;
        }
    }
    CHECK_EQ_INT(n_diff, 0);
}

int main(void) {
    T_RUN(test_corpus_expected);
    T_RUN(test_shapes);
    T_RUN(test_errors);
    T_RUN(test_python_formats);
    T_RUN(test_py_strip_matches_forward_scan);
    T_RUN(test_gen_prompt_is_suffix);
    return t_summary();
}
