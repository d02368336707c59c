/* Generated tokens -> OpenAI deltas (src/server/gen.c) with the tiny tokenizer: stop strings
 * split across tokens and never leaked, the earliest of several stop strings wins, a partial
 * match released at the end, reasoning/content split and reasoning-token count, tool-call
 * deltas, parallel_tool_calls=false, and completions text. The expected strings are the inputs
 * cut by hand, not output of the code under test. */
#include <jansson.h>
#include "server/gen.h"
#include "server/sched.h"
#include "server/openai.h"
#include "t_check.h"

#define TOKENIZER "tests/data/tiny-tokenizer/tokenizer.json"

static tl_tokenizer *tok;
static tl_oai_defaults defs;
static tl_oai_opts opts = {.model_name = "tiny", .defaults = &defs};

typedef struct out {
    char reasoning[512], content[512], text[512], args[512], name[64];
    int n_tool_starts, max_index, stopped;
} out;

static void cat(char *dst, size_t cap, const char *s) { strncat(dst, s, cap - strlen(dst) - 1); }

static void absorb(out *o, json_t *deltas) {
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        json_t *v;
        if ((v = json_object_get(d, "reasoning_content")))
            cat(o->reasoning, 512, json_string_value(v));
        if ((v = json_object_get(d, "content"))) cat(o->content, 512, json_string_value(v));
        if ((v = json_object_get(d, "text"))) cat(o->text, 512, json_string_value(v));
        json_t *tcs = json_object_get(d, "tool_calls");
        if (tcs) {
            json_t *tc = json_array_get(tcs, 0), *fn = json_object_get(tc, "function");
            int idx = (int)json_integer_value(json_object_get(tc, "index"));
            if (idx > o->max_index) o->max_index = idx;
            if (json_object_get(fn, "name")) {
                o->n_tool_starts++;
                snprintf(o->name, sizeof o->name, "%s",
                         json_string_value(json_object_get(fn, "name")));
            }
            cat(o->args, 512, json_string_value(json_object_get(fn, "arguments")));
        }
    }
    json_decref(deltas);
}

/* Runs text (tokenized, one token per push) through a tl_gen for the request body. */
static void run(const char *body, tl_oai_kind kind, const char *text, out *o, tl_gen *keep) {
    memset(o, 0, sizeof *o);
    tl_oai_req r;
    tl_oai_error e;
    int st = tl_oai_parse(&r, kind, body, strlen(body), &opts, 320, &e);
    CHECK_EQ_INT(st, 0);
    if (st) {
        fprintf(stderr, "%s\n", e.msg);
        return;
    }
    tl_gen g;
    tl_gen_init(&g, &r, tok, tl_token_id(tok, "</think>"), 42);
    tl_tok_ids ids = {0};
    CHECK(tl_tokenize(tok, text, strlen(text), 0, &ids) > 0);
    for (size_t i = 0; i < ids.n && !o->stopped; i++) {
        tl_sample_out ev = {.token = ids.ids[i]};
        o->stopped = tl_gen_push(&g, &ev);
        absorb(o, tl_gen_take_deltas(&g)); /* deltas after every token: the streaming case */
    }
    tl_gen_end(&g);
    absorb(o, tl_gen_take_deltas(&g));
    tl_tok_ids_free(&ids);
    if (keep)
        *keep = g;
    else
        tl_gen_free(&g);
    tl_oai_req_free(&r);
}

#define NOTHINK "\"chat_template_kwargs\":{\"enable_thinking\":false}"
#define MSG     "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"

static void test_stop_strings(void) {
    out o;
    run("{" MSG "," NOTHINK ",\"stop\":\"STOP\"}", TL_OAI_CHAT, "Hello STOP world", &o, NULL);
    CHECK_STR(o.content, "Hello ");
    CHECK_EQ_INT(o.stopped, 1);
    /* the earliest match wins, whichever stop string it is */
    run("{" MSG "," NOTHINK ",\"stop\":[\"world\",\"lo\"]}", TL_OAI_CHAT, "Hello world", &o, NULL);
    CHECK_STR(o.content, "Hel");
    /* a prefix of a stop string that never completes is released at the end */
    run("{" MSG "," NOTHINK ",\"stop\":[\"abcd\"]}", TL_OAI_CHAT, "xx abc", &o, NULL);
    CHECK_STR(o.content, "xx abc");
    CHECK_EQ_INT(o.stopped, 0);
    /* overlapping candidates: "aab" inside "aaab" */
    run("{" MSG "," NOTHINK ",\"stop\":[\"aab\"]}", TL_OAI_CHAT, "1aaab2", &o, NULL);
    CHECK_STR(o.content, "1a");
    /* a stop string that is a multi-byte character split across byte tokens */
    run("{" MSG "," NOTHINK ",\"stop\":[\"\xc3\xa9\"]}", TL_OAI_CHAT, "caf\xc3\xa9 au lait", &o,
        NULL);
    CHECK_STR(o.content, "caf");
    /* at the very start: nothing at all */
    run("{" MSG "," NOTHINK ",\"stop\":[\"He\"]}", TL_OAI_CHAT, "Hello", &o, NULL);
    CHECK_STR(o.content, "");
    CHECK_EQ_INT(o.stopped, 1);
}

static void test_reasoning_and_usage(void) {
    out o;
    tl_gen g;
    run("{" MSG "}", TL_OAI_CHAT, "I think</think>\n\nThe answer", &o, &g);
    CHECK_STR(o.reasoning, "I think");
    CHECK_STR(o.content, "The answer");
    tl_tok_ids a = {0}, b = {0};
    tl_tokenize(tok, "I think</think>", 15, 0, &a);
    tl_tokenize(tok, "I think</think>\n\nThe answer", 27, 0, &b);
    CHECK_EQ_INT(g.n_reasoning, (int)a.n);
    CHECK_EQ_INT(g.n_completion, (int)b.n);
    CHECK_STR(tl_gen_finish_reason(&g, TL_FIN_STOP), "stop");
    tl_tok_ids_free(&a);
    tl_tok_ids_free(&b);
    tl_gen_free(&g);
    /* a stop string inside the reasoning also ends the output */
    run("{" MSG ",\"stop\":\"nk\"}", TL_OAI_CHAT, "I think</think>\n\nThe answer", &o, NULL);
    CHECK_STR(o.reasoning, "I thi");
    CHECK_STR(o.content, "");
}

#define TOOLS                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"    \
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]"
#define CALL(city)                                                                                 \
    "<tool_call>\n<function=get_weather>\n<parameter=city>\n" city "\n</parameter>\n</function>\n" \
    "</tool_call>"

static void test_tool_calls(void) {
    out o;
    tl_gen g;
    run("{" MSG "," NOTHINK "," TOOLS "}", TL_OAI_CHAT, CALL("Paris"), &o, &g);
    CHECK_EQ_INT(o.n_tool_starts, 1);
    CHECK_STR(o.name, "get_weather");
    json_t *a = json_loads(o.args, 0, NULL);
    CHECK_STR(json_string_value(json_object_get(a, "city")), "Paris");
    json_decref(a);
    CHECK_STR(tl_gen_finish_reason(&g, TL_FIN_STOP), "tool_calls");
    CHECK_STR(tl_gen_finish_reason(&g, TL_FIN_LENGTH), "length");
    tl_gen_free(&g);

    run("{" MSG "," NOTHINK "," TOOLS ",\"parallel_tool_calls\":false}", TL_OAI_CHAT,
        CALL("Paris") "\n" CALL("Rome"), &o, &g);
    CHECK_EQ_INT(o.n_tool_starts, 1);
    CHECK_EQ_INT(o.max_index, 0);
    json_t *m = tl_gen_message(&g);
    CHECK_EQ_INT(json_array_size(json_object_get(m, "tool_calls")), 1);
    json_decref(m);
    tl_gen_free(&g);

    /* tool_choice none: the same text is content */
    run("{" MSG "," NOTHINK "," TOOLS ",\"tool_choice\":\"none\"}", TL_OAI_CHAT, CALL("Paris"), &o,
        NULL);
    CHECK_EQ_INT(o.n_tool_starts, 0);
    CHECK_STR(o.content, CALL("Paris"));
}

static void test_completion_text(void) {
    out o;
    run("{\"prompt\":\"x\",\"stop\":[\"\\n\\n\"]}", TL_OAI_COMPLETION, "one\ntwo\n\nthree", &o,
        NULL);
    CHECK_STR(o.text, "one\ntwo");
    /* special tokens are not text */
    run("{\"prompt\":\"x\"}", TL_OAI_COMPLETION, "a<|im_end|>b", &o, NULL);
    CHECK_STR(o.text, "ab");
}

int main(void) {
    tl_oai_defaults_init(&defs);
    char err[256];
    if (tl_tokenizer_load(TOKENIZER, &tok, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    T_RUN(test_stop_strings);
    T_RUN(test_reasoning_and_usage);
    T_RUN(test_tool_calls);
    T_RUN(test_completion_text);
    tl_tokenizer_free(tok);
    return t_summary();
}
