/* Output parser (src/tokenizer/parse.c): reasoning/content split, Qwen3.6 tool calls with
 * schema typing, malformed input, and the streaming property: feeding the text in any pieces
 * (every single split point, byte by byte, random splits) gives exactly the whole-text result.
 * Expected values are written by hand from the rules in parse.h (arguments in the format of
 * Python's json.dumps, which is what vLLM's qwen3_coder parser returns). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "t_check.h"
#include "tokenizer/chat.h"
#include "tokenizer/parse.h"
#include "t_utf8.h"

#define MAX_CALLS 16

/* What a client reconstructs from the events alone. */
typedef struct acc {
    tl_buf r, c, args[MAX_CALLS];
    char *name[MAX_CALLS], *id[MAX_CALLS];
    int n_calls, ended[MAX_CALLS], bad;
} acc;

static void acc_events(acc *a, const tl_parse_event *ev, int n) {
    for (int i = 0; i < n; i++) {
        const tl_parse_event *e = &ev[i];
        if (!utf8_ok(e->text, e->len) || e->text[e->len] != 0) a->bad++;
        switch (e->kind) {
        case TL_PARSE_REASONING:
            if (a->n_calls || a->c.n) a->bad++; /* reasoning comes first */
            tl_buf_append(&a->r, e->text, e->len);
            break;
        case TL_PARSE_CONTENT:
            tl_buf_append(&a->c, e->text, e->len);
            break;
        case TL_PARSE_TOOL_START:
            if (e->index != a->n_calls || a->n_calls >= MAX_CALLS || !e->id) {
                a->bad++;
                break;
            }
            a->name[a->n_calls] = strdup(e->text);
            a->id[a->n_calls] = strdup(e->id);
            tl_buf_append(&a->args[a->n_calls], "", 0);
            a->n_calls++;
            break;
        case TL_PARSE_TOOL_ARGS:
            if (e->index != a->n_calls - 1 || a->ended[e->index])
                a->bad++;
            else
                tl_buf_append(&a->args[e->index], e->text, e->len);
            break;
        case TL_PARSE_TOOL_END:
            if (e->index != a->n_calls - 1 || a->ended[e->index])
                a->bad++;
            else
                a->ended[e->index] = 1;
            break;
        }
    }
}

static void acc_free(acc *a) {
    tl_buf_free(&a->r);
    tl_buf_free(&a->c);
    for (int i = 0; i < a->n_calls; i++) {
        tl_buf_free(&a->args[i]);
        free(a->name[i]);
        free(a->id[i]);
    }
    memset(a, 0, sizeof *a);
}

static int same_as(const acc *a, const tl_parse_result *w) {
    if (a->bad || a->n_calls != w->n_calls) return 0;
    if (a->r.n != w->reasoning_len || (a->r.n && memcmp(a->r.p, w->reasoning, a->r.n))) return 0;
    if (a->c.n != w->content_len || (a->c.n && memcmp(a->c.p, w->content, a->c.n))) return 0;
    for (int i = 0; i < a->n_calls; i++) {
        if (!a->ended[i] || strcmp(a->name[i], w->calls[i].name) ||
            strcmp(a->id[i], w->calls[i].id) || strcmp(a->args[i].p, w->calls[i].arguments))
            return 0;
    }
    return 1;
}

/* Feeds text cut at the given points; returns whether the events rebuild the whole result. */
static int split_matches(const char *t, size_t n, const tl_parse_opts *o, const size_t *cuts,
                         int ncut, const tl_parse_result *whole) {
    tl_parser *p = tl_parser_new(o);
    acc a = {0};
    const tl_parse_event *ev;
    size_t prev = 0;
    for (int i = 0; i <= ncut; i++) {
        size_t end = i < ncut ? cuts[i] : n;
        int nev = tl_parser_feed(p, t + prev, end - prev, &ev);
        acc_events(&a, ev, nev);
        prev = end;
    }
    int nev = tl_parser_finish(p, &ev);
    acc_events(&a, ev, nev);
    int ok = same_as(&a, whole);
    /* the parser's own accumulation agrees too */
    const tl_parse_result *r = tl_parser_result(p);
    ok = ok && r->n_calls == whole->n_calls && r->content_len == whole->content_len &&
         r->reasoning_len == whole->reasoning_len;
    acc_free(&a);
    tl_parser_free(p);
    return ok;
}

/* Whole text vs: every single split point, byte by byte, and pairs of split points for short
 * texts. Returns the number of mismatching splits. */
static int check_splits(const char *t, const tl_parse_opts *o) {
    size_t n = strlen(t);
    tl_parse_result whole;
    tl_parse_text(t, n, o, &whole);
    int bad = 0;
    for (size_t i = 0; i <= n; i++) bad += !split_matches(t, n, o, &i, 1, &whole);
    size_t *all = calloc(n + 1, sizeof *all);
    for (size_t i = 0; i < n; i++) all[i] = i + 1;
    bad += !split_matches(t, n, o, all, n ? (int)n - 1 : 0, &whole);
    free(all);
    if (n <= 160)
        for (size_t i = 0; i <= n; i++)
            for (size_t j = i; j <= n; j++) {
                size_t c[2] = {i, j};
                bad += !split_matches(t, n, o, c, 2, &whole);
            }
    if (bad) fprintf(stderr, "split mismatch (%d) for: %s\n", bad, t);
    tl_parse_result_free(&whole);
    return bad;
}

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"ratio\":{"
    "\"type\":\"number\"},"
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":\"array\"}"
    ","
    "\"maybe\":{\"type\":[\"null\",\"integer\"]},\"either\":{\"type\":[\"integer\",\"string\"]},"
    "\"anything\":{\"description\":\"no type\"}}}}},"
    "{\"name\":\"flat\",\"parameters\":{\"n\":{\"type\":\"int64\"}}}]";

static tl_parse_opts opts(int thinking, int tools, const json_t *schema) {
    tl_parse_opts o;
    tl_parse_opts_default(&o);
    o.thinking = thinking;
    o.parse_tools = tools;
    o.tools = schema;
    o.id_seed = 42;
    return o;
}

static void parse(const char *t, const tl_parse_opts *o, tl_parse_result *r) {
    tl_parse_text(t, strlen(t), o, r);
}

static void test_reasoning_split(void) {
    tl_parse_opts o = opts(1, 1, NULL);
    tl_parse_result r;
    parse("Let me think.\nOK.\n</think>\n\nThe answer is 4.", &o, &r);
    CHECK_STR(r.reasoning, "Let me think.\nOK.");
    CHECK_STR(r.content, "The answer is 4.");
    CHECK_EQ_INT(r.n_calls, 0);
    tl_parse_result_free(&r);
    parse("still thinking when cut off\n", &o, &r); /* no </think>: all reasoning */
    CHECK_STR(r.reasoning, "still thinking when cut off");
    CHECK_STR(r.content, "");
    tl_parse_result_free(&r);
    parse("\n<think>\n\nreopened</think>x", &o, &r);
    CHECK_STR(r.reasoning, "reopened");
    CHECK_STR(r.content, "x");
    tl_parse_result_free(&r);
    parse("</think>\n\n  direct", &o, &r);
    CHECK_STR(r.reasoning, "");
    CHECK_STR(r.content, "  direct");
    tl_parse_result_free(&r);
    parse("a<think>b</think>c</think>d", &o, &r);
    CHECK_STR(r.reasoning, "a<think>b");
    CHECK_STR(r.content, "c</think>d");
    tl_parse_result_free(&r);
    o = opts(0, 1, NULL); /* thinking off: </think> is text */
    parse("a\n</think>\nb", &o, &r);
    CHECK_STR(r.reasoning, "");
    CHECK_STR(r.content, "a\n</think>\nb");
    tl_parse_result_free(&r);
}

static void test_tool_calls(void) {
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    CHECK(tools != NULL);
    tl_parse_opts o = opts(1, 1, tools);
    tl_parse_result r;
    parse("I need the weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
          "<parameter=city>\nSan "
          "Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
          "</tool_call>\n<tool_call>\n<function=flat>\n<parameter=n>\n-0042\n</parameter>\n</"
          "function>\n"
          "</tool_call>",
          &o, &r);
    CHECK_STR(r.reasoning, "I need the weather.");
    CHECK_STR(r.content, "Let me check.");
    CHECK_EQ_INT(r.n_calls, 2);
    if (r.n_calls == 2) {
        CHECK_STR(r.calls[0].name, "get_weather");
        CHECK_STR(r.calls[0].arguments, "{\"city\": \"San Francisco\", \"days\": 3}");
        CHECK_STR(r.calls[1].name, "flat");
        CHECK_STR(r.calls[1].arguments, "{\"n\": -42}");
        CHECK(!strncmp(r.calls[0].id, "call_", 5) && strlen(r.calls[0].id) == 29);
        CHECK(strcmp(r.calls[0].id, r.calls[1].id) != 0);
    }
    json_t *m = tl_parse_result_message(&r);
    char *s = json_dumps(m, JSON_COMPACT);
    CHECK(strstr(s, "\"role\":\"assistant\",\"content\":\"Let me "
                    "check.\",\"reasoning_content\":\"I need the "
                    "weather.\",\"tool_calls\":[{\"id\":\"call_") != NULL);
    CHECK(
        strstr(s, "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":") !=
        NULL);
    free(s);
    json_decref(m);
    tl_parse_result_free(&r);

    /* typing from the schema */
    const char *typed = "</think><tool_call>\n<function=get_weather>\n"
                        "<parameter=city>\nnull\n</parameter>\n"
                        "<parameter=days>\n 7 \n</parameter>\n"
                        "<parameter=ratio>\n2.50\n</parameter>\n"
                        "<parameter=metric>\nTrue\n</parameter>\n"
                        "<parameter=opts>\n{\"a\":[1,2.0,\"x\"],\"b\":null}\n</parameter>\n"
                        "<parameter=tags>\n[\"t1\", \"t2\"]\n</parameter>\n"
                        "<parameter=maybe>\n5\n</parameter>\n"
                        "<parameter=either>\n5\n</parameter>\n"
                        "<parameter=anything>\n{\"x\": 1}\n</parameter>\n"
                        "<parameter=unknown>\n12\n</parameter>\n"
                        "</function>\n</tool_call>";
    parse(typed, &o, &r);
    CHECK_EQ_INT(r.n_calls, 1);
    if (r.n_calls == 1)
        CHECK_STR(
            r.calls[0].arguments,
            "{\"city\": null, \"days\": 7, \"ratio\": 2.5, \"metric\": true, \"opts\": "
            "{\"a\": [1, 2.0, \"x\"], \"b\": null}, \"tags\": [\"t1\", \"t2\"], \"maybe\": 5, "
            "\"either\": \"5\", \"anything\": \"{\\\"x\\\": 1}\", \"unknown\": \"12\"}");
    tl_parse_result_free(&r);
    CHECK_EQ_INT(check_splits(typed, &o), 0);

    /* values that do not convert stay strings; numbers as vLLM writes them */
    parse("</think><tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
          "<parameter=ratio>\n3.0\n</parameter>\n<parameter=metric>\nyes\n</parameter>\n"
          "<parameter=opts>\n{broken\n</parameter>\n<parameter=tags>\n1e400\n</parameter>\n"
          "<parameter=maybe>\nNULL\n</parameter>\n<parameter=days>\n-9223372036854775808\n</"
          "parameter>\n"
          "<parameter=days>\n9223372036854775808\n</parameter>\n<parameter=ratio>\n1e20\n</"
          "parameter>\n"
          "<parameter=ratio>\n-0.0\n</parameter>\n</function>\n</tool_call>",
          &o, &r);
    if (r.n_calls == 1)
        CHECK_STR(r.calls[0].arguments,
                  "{\"days\": \"three\", \"ratio\": 3, \"metric\": \"yes\", \"opts\": "
                  "\"{broken\", \"tags\": \"1e400\", \"maybe\": null, \"days\": "
                  "-9223372036854775808, \"days\": \"9223372036854775808\", \"ratio\": 1e+20, "
                  "\"ratio\": 0}");
    tl_parse_result_free(&r);

    /* no schema: strings; multi-line values keep inner newlines; escapes */
    o = opts(0, 1, NULL);
    parse("<tool_call>\n<function=run>\n<parameter=code>\ndef f():\n\treturn "
          "\"\\\\\"\n\n</parameter>\n"
          "<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>",
          &o, &r);
    CHECK_EQ_INT(r.n_calls, 1);
    if (r.n_calls == 1)
        CHECK_STR(r.calls[0].arguments,
                  "{\"code\": \"def f():\\n\\treturn \\\"\\\\\\\\\\\"\\n\", \"n\": \"5\"}");
    tl_parse_result_free(&r);
    /* no parameters */
    parse("<tool_call>\n<function=now>\n</function>\n</tool_call>", &o, &r);
    CHECK_EQ_INT(r.n_calls, 1);
    if (r.n_calls == 1) CHECK_STR(r.calls[0].arguments, "{}");
    tl_parse_result_free(&r);
    json_decref(tools);
}

static void test_malformed(void) {
    tl_parse_opts o = opts(0, 1, NULL);
    tl_parse_result r;
    /* a <tool_call> without a valid header is content, byte for byte */
    const char *bad[] = {
        "text <tool_call> more",
        "<tool_call>\n<function=>\n</function></tool_call>",
        "<tool_call>\n<function=a\nb>",
        "<tool_call>\n<func=x>",
        "<tool_call>\n<function=unfinished",
        "<tool_call>",
        "<tool_",
        "x <tool_call><tool_call>\n<function",
        "<tool_call>                                 "
        "                                                 <function=too_much_space>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        parse(bad[i], &o, &r);
        CHECK_STR(r.content, bad[i]);
        CHECK_EQ_INT(r.n_calls, 0);
        tl_parse_result_free(&r);
        CHECK_EQ_INT(check_splits(bad[i], &o), 0);
    }
    /* committed calls that are cut off or sloppy still close, with what was seen */
    parse("<tool_call>\n<function=f>\n<parameter=a>\nhal", &o, &r);
    CHECK_EQ_INT(r.n_calls, 1);
    if (r.n_calls == 1) CHECK_STR(r.calls[0].arguments, "{\"a\": \"hal\"}");
    tl_parse_result_free(&r);
    parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function></tool_call>",
          &o, &r);
    if (r.n_calls == 1) CHECK_STR(r.calls[0].arguments, "{\"a\": \"1\", \"b\": \"2\"}");
    tl_parse_result_free(&r);
    parse("<tool_call>\n<function=f>\njunk<parameter=>x</parameter><parameter=k>v</parameter>\n</"
          "tool_call>"
          "\n\n  "
          "<tool_call><function=g></function>\n<tool_call>\n<function=h>\n</function>\n</"
          "tool_call>\n\n",
          &o, &r);
    CHECK_EQ_INT(r.n_calls, 3);
    CHECK_STR(r.content, "");
    if (r.n_calls == 3) {
        CHECK_STR(r.calls[0].arguments, "{\"k\": \"v\"}");
        CHECK_STR(r.calls[1].name, "g");
        CHECK_STR(r.calls[2].name, "h");
    }
    tl_parse_result_free(&r);
    /* text after a call is content (leading whitespace dropped) */
    parse("Sure.  \n<tool_call>\n<function=f>\n</function>\n</tool_call>\n\nDone, see above. ", &o,
          &r);
    CHECK_STR(r.content, "Sure.Done, see above.");
    tl_parse_result_free(&r);
    /* parse_tools = 0: everything is content */
    o = opts(0, 0, NULL);
    parse(" <tool_call>\n<function=f>\n</function>\n</tool_call> ", &o, &r);
    CHECK_STR(r.content, " <tool_call>\n<function=f>\n</function>\n</tool_call> ");
    CHECK_EQ_INT(r.n_calls, 0);
    tl_parse_result_free(&r);
}

static void test_utf8(void) {
    tl_parse_opts o = opts(0, 1, NULL);
    tl_parse_result r;
    parse("a\xff"
          "b\xe4\xb8"
          "c\xed\xa0\x80"
          "d\xf0\x9f\x98\x80",
          &o, &r);
    CHECK_STR(r.content, "a\xef\xbf\xbd"
                         "b\xef\xbf\xbd"
                         "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                         "d\xf0\x9f\x98\x80");
    tl_parse_result_free(&r);
    parse("\xe4\xb8\xad\xe6", &o, &r); /* incomplete at the end */
    CHECK_STR(r.content, "\xe4\xb8\xad\xef\xbf\xbd");
    tl_parse_result_free(&r);
    CHECK_EQ_INT(check_splits("x\xe4\xb8\xad\xf0\x9f\x98\x80y\xff\xc3", &o), 0);
    CHECK_EQ_INT(
        check_splits("<tool_call>\n<function=\xe5\x90\x8d>\n<parameter=\xc3\xbc>\n\xe4\xb8\xad\n"
                     "</parameter>\n</function>\n</tool_call>",
                     &o),
        0);
}

static void test_every_split(void) {
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    const char *texts[] = {
        "Think.\n</think>\n\nAnswer.",
        "\n\n<think>\nA\n\n</think>\n\n\nB\n",
        "r</think>pre \n<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n</parameter>\n"
        "<parameter=days>\n12\n</parameter>\n</function>\n</"
        "tool_call>\n<tool_call>\n<function=flat>\n"
        "<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
        "</think><tool_call>\n<function=get_weather>\n<parameter=city>\nnul\n</"
        "parameter>\n<parameter=city>"
        "\nNull</parameter></function></tool_call> tail <tool_call> x",
        "</think>a <tool_ b <tool_call>\n<functio c </think> "
        "<tool_call>\n<function=f>\n<parameter=p>\n\n\n"
        "</parameter>\n<parameter=q>\n<parameter=r>x</parameter>",
        "</think>\n<tool_call>\n<function=f>\n<parameter=p>\nv</paramete\n</parameter>\n</"
        "function>\n",
    };
    for (int th = 0; th < 2; th++)
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            tl_parse_opts o = opts(th, 1, tools);
            CHECK_EQ_INT(check_splits(texts[i], &o), 0);
        }
    json_decref(tools);
}

/* Random texts built from tag fragments, whitespace and words; random multi-piece splits. */
static void test_random_splits(void) {
    static const char *frag[] = {
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
        "<think>",
        "</think>",
        ">",
        "\n",
        "\n\n",
        " ",
        "\t",
        "<",
        "</",
        "<tool_",
        "</param",
        "null",
        "42",
        "3.5",
        "true",
        "{\"a\": [1]}",
        "get_weather",
        "city",
        "days",
        "text",
        "\xe4\xb8\xad",
        "\xff",
        "\xf0\x9f",
        "\"\\",
    };
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    unsigned long long seed = 0x9e3779b97f4a7c15ull;
    int bad = 0, n_cases = 3000;
    char text[512];
    for (int c = 0; c < n_cases; c++) {
        size_t n = 0;
        int nf = 1 + (int)(t_rng_next(&seed) % 40);
        for (int k = 0; k < nf; k++) {
            const char *f = frag[t_rng_next(&seed) % (sizeof frag / sizeof frag[0])];
            size_t l = strlen(f);
            if (n + l >= sizeof text) break;
            memcpy(text + n, f, l);
            n += l;
        }
        text[n] = 0;
        tl_parse_opts o = opts((int)(t_rng_next(&seed) & 1), (t_rng_next(&seed) % 4) != 0, tools);
        tl_parse_result whole;
        tl_parse_text(text, n, &o, &whole);
        for (int rep = 0; rep < 4; rep++) {
            size_t cuts[8];
            int ncut = (int)(t_rng_next(&seed) % 8);
            for (int k = 0; k < ncut; k++) cuts[k] = n ? t_rng_next(&seed) % (n + 1) : 0;
            for (int a = 0; a < ncut; a++) /* sort */
                for (int b = a + 1; b < ncut; b++)
                    if (cuts[b] < cuts[a]) {
                        size_t t = cuts[a];
                        cuts[a] = cuts[b];
                        cuts[b] = t;
                    }
            if (!split_matches(text, n, &o, cuts, ncut, &whole)) {
                if (!bad) fprintf(stderr, "random split mismatch: %s\n", text);
                bad++;
            }
        }
        /* results are valid UTF-8 and arguments are valid JSON objects */
        if (!utf8_ok(whole.content, whole.content_len) ||
            !utf8_ok(whole.reasoning, whole.reasoning_len))
            bad++;
        for (int k = 0; k < whole.n_calls; k++) {
            json_t *v = json_loads(whole.calls[k].arguments, JSON_ALLOW_NUL, NULL);
            if (!json_is_object(v)) {
                fprintf(stderr, "arguments not a JSON object: %s\n", whole.calls[k].arguments);
                bad++;
            }
            json_decref(v);
        }
        tl_parse_result_free(&whole);
    }
    CHECK_EQ_INT(bad, 0);
    json_decref(tools);
}

static void test_streaming_holds_tags(void) {
    /* a partial tag is never emitted: feeding "<tool_" or "</thi" yields no text yet */
    tl_parse_opts o = opts(1, 1, NULL);
    tl_parser *p = tl_parser_new(&o);
    const tl_parse_event *ev;
    CHECK_STR(tl_parser_result(p)->content, ""); /* never NULL, even before the first feed */
    int n = tl_parser_feed(p, "reason </thi", 12, &ev);
    CHECK_EQ_INT(n, 1);
    if (n == 1) CHECK_STR(ev[0].text, "reason ");
    n = tl_parser_feed(p, "nk>Hi <tool_", 12, &ev);
    CHECK_EQ_INT(n, 1);
    if (n == 1) {
        CHECK_EQ_INT(ev[0].kind, TL_PARSE_CONTENT);
        CHECK_STR(ev[0].text, "Hi");
    }
    n = tl_parser_feed(p, "call>\n<function=f>\n<parameter=x>\nab", 35, &ev);
    CHECK_EQ_INT(n, 2); /* the start, then the arguments so far merged into one delta */
    if (n == 2) {
        CHECK_EQ_INT(ev[0].kind, TL_PARSE_TOOL_START);
        CHECK_STR(ev[0].text, "f");
        CHECK(ev[0].id && !strncmp(ev[0].id, "call_", 5));
        CHECK_EQ_INT(ev[1].kind, TL_PARSE_TOOL_ARGS);
        CHECK_STR(ev[1].text, "{\"x\": \"ab");
    }
    n = tl_parser_feed(p, "c\n</param", 9, &ev); /* "\n</param" may still end the value */
    CHECK_EQ_INT(n, 1);
    if (n == 1) CHECK_STR(ev[0].text, "c");
    n = tl_parser_finish(p, &ev); /* "\n</param" was value text after all; the call closes */
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK_STR(ev[0].text, "\\n</param\"}");
        CHECK_EQ_INT(ev[1].kind, TL_PARSE_TOOL_END);
    }
    tl_parser_free(p);
}

/* Template and parser are inverses: an assistant message with tool calls rendered by chat.c
 * (the template's own format) parses back into the same content and the same arguments, typed
 * by a schema that matches the values. */
static json_t *rand_value(unsigned long long *seed, const char **type) {
    static const char *words[] = {"Paris",    "multi\nline", " spaced ", "\u4e2d\u6587 \"q\" \\",
                                  "<b>x</b>", "nul",         "a\tb"};
    switch (t_rng_next(seed) % 6) {
    case 0:
        *type = "integer";
        return json_integer((json_int_t)(t_rng_next(seed) % 2000001) - 1000000);
    case 1:
        *type = "number";
        return json_real((double)(t_rng_next(seed) % 100000) / 64.0 + 1.0 / 128);
    case 2:
        *type = "boolean";
        return json_boolean(t_rng_next(seed) & 1);
    case 3:
        *type = "object";
        return json_pack("{s:i,s:[s,f,n]}", "k", 1, "l", "x", 2.5);
    case 4:
        *type = "array";
        return json_pack("[i,s,{s:b}]", 7, "y", "z", 1);
    default:
        *type = "string";
        return json_string(words[t_rng_next(seed) % 7]);
    }
}

static void test_roundtrip_template(void) {
    unsigned long long seed = 12345;
    int bad = 0, n_calls_total = 0;
    for (int c = 0; c < 200; c++) {
        json_t *props = json_object(), *calls = json_array(), *want_args = json_array();
        int nc = 1 + (int)(t_rng_next(&seed) % 3);
        for (int k = 0; k < nc; k++) {
            json_t *args = json_object();
            int np = (int)(t_rng_next(&seed) % 5);
            for (int j = 0; j < np; j++) {
                char key[32];
                const char *type;
                snprintf(key, sizeof key, "p%d_%d", k, j);
                json_object_set_new(args, key, rand_value(&seed, &type));
                json_object_set_new(props, key, json_pack("{s:s}", "type", type));
            }
            json_array_append_new(calls, json_pack("{s:s,s:{s:s,s:O}}", "type", "function",
                                                   "function", "name", "fn", "arguments", args));
            json_array_append(want_args, args);
            json_decref(args);
        }
        const char *content = (t_rng_next(&seed) & 1) ? "Let me check that." : "";
        json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s,s:O}]", "role", "user", "content", "q",
                                 "role", "assistant", "content", content, "tool_calls", calls);
        json_t *tools =
            json_pack("[{s:s,s:{s:s,s:{s:s,s:O}}}]", "type", "function", "function", "name", "fn",
                      "parameters", "type", "object", "properties", props);
        tl_chat_opts co = {0, 0, 0};
        char *prompt = NULL, err[256];
        if (tl_chat_render(msgs, tools, &co, &prompt, NULL, err, sizeof err)) {
            fprintf(stderr, "render failed: %s\n", err);
            bad++;
        } else {
            /* the assistant turn's text, as the model would have generated it */
            const char *a = strstr(prompt, "<|im_start|>assistant\n");
            a = a ? a + strlen("<|im_start|>assistant\n") : prompt;
            const char *th =
                strstr(a, "</think>\n\n"); /* after the last query: an empty think block */
            if (th) a = th + strlen("</think>\n\n");
            const char *z = strstr(a, "<|im_end|>");
            tl_parse_opts o = opts(0, 1, tools);
            tl_parse_result r;
            tl_parse_text(a, z ? (size_t)(z - a) : strlen(a), &o, &r);
            int ok = r.n_calls == nc && !strcmp(r.content, content);
            for (int k = 0; ok && k < nc; k++) {
                json_t *got = json_loads(r.calls[k].arguments, 0, NULL);
                ok = got && json_equal(got, json_array_get(want_args, (size_t)k)) &&
                     !strcmp(r.calls[k].name, "fn");
                if (!ok)
                    fprintf(stderr, "roundtrip: %s\n  vs %s\n", r.calls[k].arguments,
                            json_dumps(json_array_get(want_args, (size_t)k), JSON_COMPACT));
                json_decref(got);
            }
            bad += !ok;
            n_calls_total += r.n_calls;
            tl_parse_result_free(&r);
        }
        free(prompt);
        json_decref(msgs);
        json_decref(tools);
        json_decref(props);
        json_decref(calls);
        json_decref(want_args);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(n_calls_total >= 300);
}

int main(void) {
    T_RUN(test_reasoning_split);
    T_RUN(test_tool_calls);
    T_RUN(test_malformed);
    T_RUN(test_utf8);
    T_RUN(test_every_split);
    T_RUN(test_random_splits);
    T_RUN(test_streaming_holds_tags);
    T_RUN(test_roundtrip_template);
    return t_summary();
}
