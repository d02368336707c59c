/* OpenAI request validation (every bad-input class of issue 5 part 3 that is decided before the
 * engine), the status -> HTTP table, error bodies, response/usage JSON, SSE framing and the
 * Prometheus rendering. */
#include <jansson.h>
#include "common/util.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/sse.h"
#include "t_check.h"

static tl_oai_defaults defs;
static tl_oai_opts opts;

static void setup(int test_mode) {
    tl_oai_defaults_init(&defs);
    opts = (tl_oai_opts){.model_name = "tiny",
                         .model_path = "tests/data/tiny-a",
                         .test_mode = test_mode,
                         .defaults = &defs};
}

/* Parses body as a chat (or completion) request; returns the status, e filled on failure. */
static int parse(tl_oai_kind kind, const char *body, tl_oai_req *r, tl_oai_error *e) {
    memset(e, 0, sizeof *e);
    return tl_oai_parse(r, kind, body, strlen(body), &opts, 320, e);
}

/* Expects a failure with status st, HTTP code http, and param (NULL: don't care). */
static void expect_fail(tl_oai_kind kind, const char *body, int st, int http, const char *param) {
    tl_oai_req r;
    tl_oai_error e;
    int got = parse(kind, body, &r, &e);
    if (got != st || e.http != http || (param && strcmp(e.param, param))) {
        fprintf(stderr, "body %s: got status %d http %d param '%s' msg '%s', want %d %d '%s'\n",
                body, got, e.http, e.param, e.msg, st, http, param ? param : "*");
        CHECK(0);
    }
    if (got == 0) tl_oai_req_free(&r);
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_chat_minimal_defaults(void) {
    setup(0);
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG "}", &r, &e), 0);
    CHECK_EQ_INT(r.n_msgs, 1);
    CHECK_EQ_INT(r.msgs[0].role, TL_ROLE_USER);
    CHECK_STR(r.msgs[0].content, "hi");
    CHECK_EQ_INT(r.stream, 0);
    CHECK_EQ_INT(r.max_tokens, -1);
    CHECK_EQ_INT(r.enable_thinking, 1);
    /* thinking-mode defaults of the model card (docs/model.md §6) */
    CHECK_CLOSE(r.sample.temperature, 1.0, 0, 0);
    CHECK_CLOSE(r.sample.top_p, 0.95, 1e-6, 0);
    CHECK_EQ_INT(r.sample.top_k, 20);
    CHECK_CLOSE(r.sample.presence_penalty, 1.5, 0, 0);
    tl_oai_req_free(&r);

    CHECK_EQ_INT(parse(TL_OAI_CHAT,
                       "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", &r, &e),
                 0);
    CHECK_EQ_INT(r.enable_thinking, 0);
    CHECK_CLOSE(r.sample.temperature, 0.7, 1e-6, 0);
    CHECK_CLOSE(r.sample.top_p, 0.8, 1e-6, 0);
    tl_oai_req_free(&r);
}

static void test_chat_all_fields(void) {
    setup(0);
    tl_oai_req r;
    tl_oai_error e;
    const char *body =
        "{\"model\":\"tiny\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}],"
        "\"refusal\":null},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"42\"}],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":7,"
        "\"max_completion_tokens\":9,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,"
        "\"seed\":123,\"stop\":[\"x\",\"yz\"],\"logprobs\":true,\"top_logprobs\":3,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":{\"type\":\"function\","
        "\"function\":{\"name\":\"f\"}},\"parallel_tool_calls\":false,\"n\":1,\"user\":\"u\","
        "\"chat_template_kwargs\":{\"preserve_thinking\":true},\"ignore_eos\":true,"
        "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{},\"store\":false}";
    CHECK_EQ_INT(parse(TL_OAI_CHAT, body, &r, &e), 0);
    if (e.msg[0]) fprintf(stderr, "%s\n", e.msg);
    CHECK_EQ_INT(r.n_msgs, 4);
    CHECK_EQ_INT(r.msgs[0].role, TL_ROLE_SYSTEM);
    CHECK_STR(r.msgs[1].content, "ab");
    CHECK_EQ_INT(r.msgs[2].n_tool_calls, 1);
    CHECK_STR(r.msgs[2].tool_calls[0].name, "f");
    CHECK_STR(r.msgs[2].tool_calls[0].arguments, "{\"x\":1}");
    CHECK_STR(r.msgs[2].content, "");
    CHECK_STR(r.msgs[3].tool_call_id, "call_1");
    CHECK_EQ_INT(r.stream, 1);
    CHECK_EQ_INT(r.include_usage, 1);
    CHECK_EQ_INT(r.max_tokens, 9);
    CHECK_CLOSE(r.sample.temperature, 0, 0, 0);
    CHECK_EQ_INT(r.sample.top_k, 0);
    CHECK_CLOSE(r.sample.frequency_penalty, -0.5, 1e-6, 0);
    CHECK_EQ_INT(r.has_seed, 1);
    CHECK_EQ_INT((long long)r.sample.seed, 123);
    CHECK_EQ_INT(r.n_stop, 2);
    CHECK_STR(r.stop[1], "yz");
    CHECK_EQ_INT(r.logprobs, 1);
    CHECK_EQ_INT(r.sample.n_logprobs, 3);
    CHECK_EQ_INT(r.n_tools, 1);
    CHECK_EQ_INT(r.tool_choice, TL_TOOL_NAMED);
    CHECK_STR(r.tool_name, "f");
    CHECK_EQ_INT(r.parallel_tool_calls, 0);
    CHECK_EQ_INT(r.preserve_thinking, 1);
    CHECK_EQ_INT(r.ignore_eos, 1);
    tl_oai_req_free(&r);
}

static void test_chat_bad_input(void) {
    setup(0);
    /* malformed JSON, not an object, duplicate keys */
    expect_fail(TL_OAI_CHAT, "{\"messages\":[", TL_ERR_INVALID, 400, "");
    expect_fail(TL_OAI_CHAT, "", TL_ERR_INVALID, 400, "");
    expect_fail(TL_OAI_CHAT, "[1,2]", TL_ERR_INVALID, 400, "");
    expect_fail(TL_OAI_CHAT, "{" MSG "," MSG "}", TL_ERR_INVALID, 400, "");
    /* messages: missing, wrong type, empty, bad entries */
    expect_fail(TL_OAI_CHAT, "{}", TL_ERR_INVALID, 400, "messages");
    expect_fail(TL_OAI_CHAT, "{\"messages\":\"hi\"}", TL_ERR_INVALID, 400, "messages");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[]}", TL_ERR_INVALID, 400, "messages");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[1]}", TL_ERR_INVALID, 400, "messages[0]");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", TL_ERR_INVALID, 400,
                "messages[0].role");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
                TL_ERR_INVALID, 400, "messages[0].role");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", TL_ERR_INVALID, 400,
                "messages[0].role");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", TL_ERR_INVALID, 400,
                "messages[0].content");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", TL_ERR_INVALID,
                400, "messages[0].content");
    expect_fail(TL_OAI_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                "\"image_url\":{\"url\":\"x\"}}]}]}",
                TL_ERR_UNSUPPORTED, 400, "messages[0].content[0].type");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
                TL_ERR_INVALID, 400, "messages[0].tool_call_id");
    expect_fail(TL_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"foo\":1}]}",
                TL_ERR_UNSUPPORTED, 400, "messages[0].foo");
    expect_fail(TL_OAI_CHAT,
                "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
                "\"function\":{\"name\":\"f\",\"arguments\":\"not json\"}}]}]}",
                TL_ERR_INVALID, 400, "messages[0].tool_calls[0].function.arguments");
    /* wrong types and ranges */
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"temperature\":\"hot\"}", TL_ERR_INVALID, 400,
                "temperature");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"temperature\":3}", TL_ERR_INVALID, 400, "temperature");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"top_p\":0}", TL_ERR_INVALID, 400, "top_p");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"max_tokens\":1.5}", TL_ERR_INVALID, 400, "max_tokens");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"max_tokens\":0}", TL_ERR_INVALID, 400, "max_tokens");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"stream\":1}", TL_ERR_INVALID, 400, "stream");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"seed\":\"1\"}", TL_ERR_INVALID, 400, "seed");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"stop\":[\"\"]}", TL_ERR_INVALID, 400, "stop");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"stop\":5}", TL_ERR_INVALID, 400, "stop");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"top_logprobs\":2}", TL_ERR_INVALID, 400, "top_logprobs");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"top_logprobs\":21,\"logprobs\":true}", TL_ERR_INVALID, 400,
                "top_logprobs");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"stream_options\":{\"include_usage\":true}}",
                TL_ERR_INVALID, 400, "stream_options");
    /* unsupported fields: named, never ignored */
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"n\":17}", TL_ERR_INVALID, 400, "n");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"audio\":{}}", TL_ERR_UNSUPPORTED, 400, "audio");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"verbosity\":\"low\"}", TL_ERR_UNSUPPORTED, 400,
                "verbosity");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"prediction\":{}}", TL_ERR_UNSUPPORTED, 400, "prediction");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"spaces_between_special_tokens\":false}",
                TL_ERR_UNSUPPORTED, 400, "spaces_between_special_tokens");
    expect_fail(TL_OAI_CHAT,
                "{" MSG ",\"stream\":true,\"stream_options\":{"
                "\"continuous_usage_stats\":true}}",
                TL_ERR_UNSUPPORTED, 400, "stream_options.continuous_usage_stats");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"frobnicate\":true}", TL_ERR_UNSUPPORTED, 400,
                "frobnicate");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"prompt\":\"x\"}", TL_ERR_UNSUPPORTED, 400, "prompt");
    /* response_format / structured_outputs / guided_* are read by constrain.c (test_structured.py);
     * vLLM's guided_grammar is not supported */
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"guided_grammar\":\"root ::= x\"}", TL_ERR_UNSUPPORTED, 400,
                "guided_grammar");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"chat_template_kwargs\":{\"x\":1}}", TL_ERR_UNSUPPORTED,
                400, "chat_template_kwargs.x");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"tools\":[{\"type\":\"retrieval\"}]}", TL_ERR_UNSUPPORTED,
                400, "tools[0].type");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"tulip_test_script\":[1,2]}", TL_ERR_UNSUPPORTED, 400,
                "tulip_test_script");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"tulip_test_fail_lost\":true}", TL_ERR_UNSUPPORTED, 400,
                "tulip_test_fail_lost");
    /* tools and tool_choice consistency */
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"tool_choice\":\"required\"}", TL_ERR_INVALID, 400,
                "tool_choice");
    expect_fail(TL_OAI_CHAT,
                "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
                TL_ERR_INVALID, 400, "tool_choice");
    expect_fail(TL_OAI_CHAT,
                "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
                TL_ERR_INVALID, 400, "tools[0].function.name");
    /* unknown model: 404 model_not_found */
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{\"model\":\"gpt-9\"," MSG "}", &r, &e), TL_ERR_INVALID);
    CHECK_EQ_INT(e.http, 404);
    CHECK_STR(e.code, "model_not_found");
    /* the model path is accepted as a name too */
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{\"model\":\"tests/data/tiny-a\"," MSG "}", &r, &e), 0);
    tl_oai_req_free(&r);
}

/* Issue 15: fields accepted and ignored, reasoning_effort, reasoning in history, logit_bias,
 * the vLLM extensions, and their bad values named. */
static void test_issue15_fields(void) {
    setup(0);
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT,
                       "{" MSG ",\"user\":\"u\",\"metadata\":{\"a\":\"b\"},\"store\":true,"
                       "\"service_tier\":\"auto\",\"parallel_tool_calls\":false,"
                       "\"prompt_cache_key\":\"k\",\"safety_identifier\":\"s\",\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}}",
                       &r, &e),
                 0);
    CHECK_EQ_INT(r.include_usage, 1);
    CHECK_EQ_INT(r.skip_special, 1);
    tl_oai_req_free(&r);
    /* reasoning_effort: none/minimal off, the others on; chat_template_kwargs wins */
    const char *eff[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    for (int i = 0; i < 6; i++) {
        char body[256];
        snprintf(body, sizeof body, "{" MSG ",\"reasoning_effort\":\"%s\"}", eff[i]);
        CHECK_EQ_INT(parse(TL_OAI_CHAT, body, &r, &e), 0);
        CHECK_EQ_INT(r.enable_thinking, i >= 2);
        tl_oai_req_free(&r);
    }
    CHECK_EQ_INT(parse(TL_OAI_CHAT,
                       "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":true},"
                       "\"reasoning_effort\":\"none\"}",
                       &r, &e),
                 0);
    CHECK_EQ_INT(r.enable_thinking, 1);
    tl_oai_req_free(&r);
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"reasoning_effort\":\"max\"}", TL_ERR_INVALID, 400,
                "reasoning_effort");
    /* history: reasoning as well as reasoning_content (which wins when both are sent) */
    CHECK_EQ_INT(parse(TL_OAI_CHAT,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
                       "\"assistant\",\"content\":\"a\",\"reasoning\":\"r1\"},{\"role\":"
                       "\"assistant\",\"content\":\"b\",\"reasoning\":\"x\","
                       "\"reasoning_content\":\"r2\"},{\"role\":\"user\",\"content\":\"q\"}]}",
                       &r, &e),
                 0);
    CHECK_STR(r.msgs[1].reasoning_content, "r1");
    CHECK_STR(r.msgs[2].reasoning_content, "r2");
    tl_oai_req_free(&r);
    /* logit_bias and the vLLM fields reach the request */
    CHECK_EQ_INT(parse(TL_OAI_CHAT,
                       "{" MSG ",\"logit_bias\":{\"7\":100,\"300\":-100,\"0\":0.5},"
                       "\"min_tokens\":4,\"stop_token_ids\":[5,9],"
                       "\"include_stop_str_in_output\":true,\"skip_special_tokens\":false}",
                       &r, &e),
                 0);
    CHECK_EQ_INT(r.sample.n_bias, 3);
    CHECK(r.sample.bias_ids == r.bias_ids && r.sample.bias_vals == r.bias_vals);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        seen |= (r.bias_ids[i] == 7 && r.bias_vals[i] == 100.0f) << 0;
        seen |= (r.bias_ids[i] == 300 && r.bias_vals[i] == -100.0f) << 1;
        seen |= (r.bias_ids[i] == 0 && r.bias_vals[i] == 0.5f) << 2;
    }
    CHECK_EQ_INT(seen, 7);
    CHECK_EQ_INT(r.min_tokens, 4);
    CHECK_EQ_INT(r.n_stop_ids, 2);
    CHECK_EQ_INT(r.stop_ids[1], 9);
    CHECK_EQ_INT(r.include_stop, 1);
    CHECK_EQ_INT(r.skip_special, 0);
    tl_oai_req_free(&r);
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"logit_bias\":{\"7\":101}}", TL_ERR_INVALID, 400,
                "logit_bias.7");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"logit_bias\":{\"320\":1}}", TL_ERR_INVALID, 400,
                "logit_bias.320");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"logit_bias\":{\"x\":1}}", TL_ERR_INVALID, 400,
                "logit_bias.x");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"logit_bias\":{\"-1\":1}}", TL_ERR_INVALID, 400,
                "logit_bias.-1");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"logit_bias\":[1]}", TL_ERR_INVALID, 400, "logit_bias");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"min_tokens\":-1}", TL_ERR_INVALID, 400, "min_tokens");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"stop_token_ids\":[320]}", TL_ERR_INVALID, 400,
                "stop_token_ids");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"metadata\":\"x\"}", TL_ERR_INVALID, 400, "metadata");
    /* 1025 bias entries: over TL_MAX_LOGIT_BIAS */
    char *big = xmalloc(20000), *p = big;
    p += sprintf(p, "{" MSG ",\"logit_bias\":{");
    for (int i = 0; i <= TL_MAX_LOGIT_BIAS; i++) p += sprintf(p, "%s\"%d\":1", i ? "," : "", i);
    sprintf(p, "}}");
    tl_oai_req rb;
    tl_oai_error eb;
    memset(&eb, 0, sizeof eb);
    CHECK_EQ_INT(tl_oai_parse(&rb, TL_OAI_CHAT, big, strlen(big), &opts, 4096, &eb),
                 TL_ERR_INVALID);
    CHECK_STR(eb.param, "logit_bias");
    free(big);
    /* completions: echo with a text prompt */
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true}", &r, &e), 0);
    CHECK_EQ_INT(r.echo, 1);
    tl_oai_req_free(&r);
}

/* --default-chat-template-kwargs: applied first, the request overrides key by key. */
static void test_default_ctk(void) {
    setup(0);
    char err[256];
    json_t *d = tl_oai_default_ctk("{\"enable_thinking\":false}", err, sizeof err);
    CHECK(d != NULL);
    opts.default_ctk = d;
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG "}", &r, &e), 0);
    CHECK_EQ_INT(r.enable_thinking, 0);
    CHECK_CLOSE(r.sample.temperature, 0.7, 1e-6, 0); /* the non-thinking defaults follow */
    tl_oai_req_free(&r);
    CHECK_EQ_INT(
        parse(TL_OAI_CHAT, "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":true}}", &r, &e),
        0);
    CHECK_EQ_INT(r.enable_thinking, 1);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG ",\"enable_thinking\":true}", &r, &e), 0);
    CHECK_EQ_INT(r.enable_thinking, 1);
    tl_oai_req_free(&r);
    opts.default_ctk = NULL;
    json_decref(d);
    CHECK(tl_oai_default_ctk("{\"x\":1}", err, sizeof err) == NULL);
    CHECK(strstr(err, "x") != NULL);
    CHECK(tl_oai_default_ctk("[1]", err, sizeof err) == NULL);
    CHECK(tl_oai_default_ctk("{\"enable_thinking\":1}", err, sizeof err) == NULL);
}

static void test_test_script_only_in_test_mode(void) {
    setup(1);
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG ",\"tulip_test_script\":[1,2,3]}", &r, &e), 0);
    CHECK_EQ_INT(r.n_script, 3);
    CHECK_EQ_INT(r.script[2], 3);
    tl_oai_req_free(&r);
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"tulip_test_script\":[320]}", TL_ERR_INVALID, 400,
                "tulip_test_script");
}

/* n and several prompts (docs/api.md §6): limits, order, echo per prompt. */
static void test_n_and_prompts(void) {
    setup(0);
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG "}", &r, &e), 0);
    CHECK_EQ_INT(r.n, 1);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG ",\"n\":16}", &r, &e), 0);
    CHECK_EQ_INT(r.n, TL_OAI_MAX_N);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_CHAT, "{" MSG ",\"n\":null}", &r, &e), 0);
    CHECK_EQ_INT(r.n, 1);
    tl_oai_req_free(&r);
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"n\":0}", TL_ERR_INVALID, 400, "n");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"n\":17}", TL_ERR_INVALID, 400, "n");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"n\":2.5}", TL_ERR_INVALID, 400, "n");
    expect_fail(TL_OAI_CHAT, "{" MSG ",\"n\":\"2\"}", TL_ERR_INVALID, 400, "n");
    /* several prompts: strings and token-id arrays, in order */
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":[\"a\",[7,8,9],\"bc\"],\"n\":3}", &r, &e),
                 0);
    CHECK_EQ_INT(r.n_prompts, 3);
    CHECK_EQ_INT(r.n, 3);
    CHECK_STR(r.prompts[0].text, "a");
    CHECK(r.prompts[1].text == NULL);
    CHECK_EQ_INT(r.prompts[1].n_ids, 3);
    CHECK_EQ_INT(r.prompts[1].ids[2], 9);
    CHECK_STR(r.prompts[2].text, "bc");
    CHECK_STR(r.prompt_text, "a"); /* the first prompt's aliases */
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":[\"x\",\"y\"],\"echo\":true}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_EQ_INT(r.echo, 1);
    tl_oai_req_free(&r);
    /* 64 prompts x 2 = 128 choices is the most; 65 prompts, or 9 x 16, is refused */
    char body[1024];
    int p = snprintf(body, sizeof body, "{\"n\":2,\"prompt\":[");
    for (int i = 0; i < TL_OAI_MAX_PROMPTS; i++)
        p += snprintf(body + p, sizeof body - (size_t)p, "%s\"a\"", i ? "," : "");
    snprintf(body + p, sizeof body - (size_t)p, "]}");
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, body, &r, &e), 0);
    CHECK_EQ_INT(r.n_prompts, 64);
    tl_oai_req_free(&r);
    p = snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i <= TL_OAI_MAX_PROMPTS; i++)
        p += snprintf(body + p, sizeof body - (size_t)p, "%s\"a\"", i ? "," : "");
    snprintf(body + p, sizeof body - (size_t)p, "]}");
    expect_fail(TL_OAI_COMPLETION, body, TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION,
                "{\"n\":16,\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}",
                TL_ERR_INVALID, 400, "n");
    /* each prompt is validated, named by its position */
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[\"a\",\"\"]}", TL_ERR_INVALID, 400, "prompt[1]");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[\"a\",[1,999]]}", TL_ERR_INVALID, 400,
                "prompt[1]");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[\"a\",5]}", TL_ERR_INVALID, 400, "prompt[1]");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[[1],{}]}", TL_ERR_INVALID, 400, "prompt[1]");
    /* echo needs text prompts; best_of stays 1 */
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[\"a\",[1,2]],\"echo\":true}", TL_ERR_UNSUPPORTED,
                400, "echo");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":\"a\",\"best_of\":2,\"n\":2}", TL_ERR_UNSUPPORTED,
                400, "best_of");
}

static void test_completion_prompts(void) {
    setup(0);
    tl_oai_req r;
    tl_oai_error e;
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":\"abc\"}", &r, &e), 0);
    CHECK_STR(r.prompt_text, "abc");
    CHECK_EQ_INT(r.max_tokens, 16); /* OpenAI's default for completions */
    CHECK_EQ_INT(r.sample.top_k, 20);
    CHECK_CLOSE(r.sample.presence_penalty, 0, 0, 0);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":[5,6,7],\"logprobs\":2}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompt_ids, 3);
    CHECK_EQ_INT(r.prompt_ids[1], 6);
    CHECK_EQ_INT(r.top_logprobs, 2);
    CHECK_EQ_INT(r.logprobs, 1);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":[[9,8]]}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompt_ids, 2);
    tl_oai_req_free(&r);
    CHECK_EQ_INT(parse(TL_OAI_COMPLETION, "{\"prompt\":[\"one\"]}", &r, &e), 0);
    CHECK_STR(r.prompt_text, "one");
    tl_oai_req_free(&r);
    expect_fail(TL_OAI_COMPLETION, "{}", TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":\"\"}", TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[1,-2]}", TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[1,320]}", TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":{}}", TL_ERR_INVALID, 400, "prompt");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":[1,2],\"echo\":true}", TL_ERR_UNSUPPORTED, 400,
                "echo");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":\"a\",\"suffix\":\"b\"}", TL_ERR_UNSUPPORTED, 400,
                "suffix");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":\"a\",\"messages\":[]}", TL_ERR_UNSUPPORTED, 400,
                "messages");
    expect_fail(TL_OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", TL_ERR_INVALID, 400,
                "logprobs");
}

static void test_error_table_and_body(void) {
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_INVALID), 400);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_UNSUPPORTED), 400);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_CONTEXT_FULL), 400);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_BUSY), 429);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_NOMEM), 500);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_INTERNAL), 500);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_CUDA), 500);
    CHECK_EQ_INT(tl_oai_http_status(TL_ERR_DEVICE_LOST), 503);

    tl_oai_error e;
    tl_oai_fail(&e, TL_ERR_CONTEXT_FULL, "messages", "too long: %d", 9);
    e.n_prompt = 9;
    e.n_ctx = 8;
    char *s = tl_oai_error_json(&e);
    json_t *j = json_loads(s, 0, NULL);
    json_t *er = json_object_get(j, "error");
    CHECK_STR(json_string_value(json_object_get(er, "message")), "too long: 9");
    CHECK_STR(json_string_value(json_object_get(er, "type")), "invalid_request_error");
    CHECK_STR(json_string_value(json_object_get(er, "param")), "messages");
    CHECK_STR(json_string_value(json_object_get(er, "code")), "context_length_exceeded");
    CHECK_EQ_INT(json_integer_value(json_object_get(er, "n_prompt_tokens")), 9);
    CHECK_EQ_INT(json_integer_value(json_object_get(er, "n_ctx")), 8);
    json_decref(j);
    free(s);

    tl_oai_fail(&e, TL_ERR_BUSY, NULL, "busy");
    s = tl_oai_error_json(&e);
    j = json_loads(s, 0, NULL);
    er = json_object_get(j, "error");
    CHECK_STR(json_string_value(json_object_get(er, "type")), "rate_limit_error");
    CHECK(json_is_null(json_object_get(er, "param")));
    CHECK(json_is_null(json_object_get(er, "code")));
    json_decref(j);
    free(s);
}

static void test_response_json(void) {
    tl_oai_usage u = {10, 5, 3, 4};
    json_t *env = tl_oai_envelope("chatcmpl-x", "chat.completion", 1700000000, "tiny",
                                  json_object(), tl_oai_usage_json(&u));
    char *s = tl_oai_dump(env);
    json_t *j = json_loads(s, 0, NULL);
    CHECK_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
    CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 1);
    json_t *us = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(us, "total_tokens")), 15);
    CHECK_EQ_INT(json_integer_value(json_object_get(
                     json_object_get(us, "completion_tokens_details"), "reasoning_tokens")),
                 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(us, "prompt_tokens_details"),
                                                    "cached_tokens")),
                 4);
    json_decref(j);
    free(s);

    /* logprobs: a token that is half a UTF-8 character still gives valid JSON + its bytes */
    tl_oai_lp lp = {.text = "\xE2\x82",
                    .text_len = 2,
                    .logprob = -0.5f,
                    .n_top = 1,
                    .top_text = {"a"},
                    .top_len = {1},
                    .top_logprob = {-0.25f}};
    json_t *c = tl_oai_chat_logprobs_json(&lp, 1);
    json_t *t0 = json_array_get(json_object_get(c, "content"), 0);
    CHECK(json_is_string(json_object_get(t0, "token")));
    CHECK_EQ_INT(json_array_size(json_object_get(t0, "bytes")), 2);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(t0, "bytes"), 0)), 0xE2);
    CHECK_CLOSE(json_real_value(json_object_get(t0, "logprob")), -0.5, 1e-6, 0);
    json_decref(c);
}

static void test_sse_framing(void) {
    tl_sbuf b = {0};
    tl_sse_data(&b, "{\"a\":1}");
    tl_sse_comment(&b, "keepalive");
    tl_sse_done(&b);
    char out[128];
    size_t n = tl_sbuf_read(&b, out, 5);
    CHECK_EQ_INT(n, 5);
    n += tl_sbuf_read(&b, out + n, sizeof out - n - 1);
    out[n] = 0;
    CHECK_STR(out, "data: {\"a\":1}\n\n: keepalive\n\ndata: [DONE]\n\n");
    CHECK_EQ_INT(tl_sbuf_unread(&b), 0);
    tl_sbuf_free(&b);
}

static void test_metrics_render(void) {
    tl_metrics *m = tl_metrics_new();
    tl_metrics_request(m, "chat", 200);
    tl_metrics_request(m, "chat", 200);
    tl_metrics_request(m, "chat", 400);
    tl_metrics_prompt_tokens(m, 12);
    tl_metrics_token(m, 1, 0.3);
    tl_metrics_token(m, 0, 0.004);
    tl_metrics_finish(m, 1);
    tl_metrics_gauges g = {.queued = 2,
                           .running = 1,
                           .sessions = 1,
                           .max_seqs = 4,
                           .kv_tokens = 100,
                           .kv_capacity = 400};
    char *s = tl_metrics_render(m, &g);
    CHECK(strstr(s, "tulip_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"));
    CHECK(strstr(s, "tulip_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"));
    CHECK(strstr(s, "tulip_prompt_tokens_total 12\n"));
    CHECK(strstr(s, "tulip_generation_tokens_total 2\n"));
    CHECK(strstr(s, "tulip_time_to_first_token_seconds_bucket{le=\"0.25\"} 0\n"));
    CHECK(strstr(s, "tulip_time_to_first_token_seconds_bucket{le=\"0.5\"} 1\n"));
    CHECK(strstr(s, "tulip_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"));
    CHECK(strstr(s, "tulip_inter_token_latency_seconds_count 1\n"));
    CHECK(strstr(s, "tulip_sequences_finished_total{reason=\"stop\"} 1\n"));
    CHECK(strstr(s, "tulip_queue_depth 2\n"));
    CHECK(strstr(s, "tulip_sessions_active 1\n"));
    CHECK(strstr(s, "tulip_kv_usage_ratio 0.250000\n"));
    free(s);
    tl_metrics_free(m);
}

int main(void) {
    T_RUN(test_chat_minimal_defaults);
    T_RUN(test_chat_all_fields);
    T_RUN(test_chat_bad_input);
    T_RUN(test_issue15_fields);
    T_RUN(test_default_ctk);
    T_RUN(test_test_script_only_in_test_mode);
    T_RUN(test_completion_prompts);
    T_RUN(test_n_and_prompts);
    T_RUN(test_error_table_and_body);
    T_RUN(test_response_json);
    T_RUN(test_sse_framing);
    T_RUN(test_metrics_render);
    return t_summary();
}
