/* The Responses -> chat completions request conversion (src/server/responses.c): each Responses
 * request is compared with the chat body it stands for, written out by hand from the two APIs'
 * documentation, and every refused field gets a 400 that names it. */
#include <jansson.h>
#include <string.h>
#include "server/responses.h"
#include "t_check.h"

/* Converts body and compares with want (both JSON texts). */
static void expect_chat(const char *body, const char *want) {
    json_t *b = json_loads(body, 0, NULL), *w = json_loads(want, 0, NULL);
    CHECK(b && w);
    tl_oai_error e = {0};
    json_t *got = tl_resp_to_chat(b, &e);
    if (!got || !json_equal(got, w)) {
        char *g = got ? json_dumps(got, JSON_SORT_KEYS) : NULL;
        fprintf(stderr, "body %s\n got %s (%s)\nwant %s\n", body, g ? g : "NULL", e.msg, want);
        free(g);
        CHECK(0);
    }
    json_decref(got);
    json_decref(b);
    json_decref(w);
}

static void expect_fail(const char *body, int http, const char *param) {
    json_t *b = json_loads(body, 0, NULL);
    CHECK(b);
    tl_oai_error e = {0};
    json_t *got = tl_resp_to_chat(b, &e);
    if (got || e.http != http || strcmp(e.param, param)) {
        fprintf(stderr, "body %s: got http %d param '%s' (%s), want %d '%s'\n", body, e.http,
                e.param, e.msg, http, param);
        CHECK(0);
    }
    json_decref(got);
    json_decref(b);
}

static void test_text_and_settings(void) {
    expect_chat("{\"model\":\"m\",\"input\":\"Hi\",\"instructions\":\"Be brief.\","
                "\"max_output_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"stream\":true,"
                "\"store\":false,\"metadata\":{\"a\":\"b\"},\"include\":[],\"user\":\"u\"}",
                "{\"model\":\"m\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
                "\"stream\":true,\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                "{\"role\":\"user\",\"content\":\"Hi\"}]}");
    expect_chat("{\"input\":\"Hi\",\"reasoning\":{\"effort\":\"minimal\",\"summary\":\"auto\"}}",
                "{\"chat_template_kwargs\":{\"enable_thinking\":false},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    expect_chat("{\"input\":\"Hi\",\"reasoning\":{\"effort\":\"low\"}}",
                "{\"chat_template_kwargs\":{\"enable_thinking\":true},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
}

static void test_items(void) {
    expect_chat(
        "{\"instructions\":\"I\",\"input\":["
        "{\"role\":\"developer\",\"content\":\"D\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
        "\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"think\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":"
        "\"input_text\",\"text\":\"r2\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"done\","
        "\"annotations\":[]}]}]}",
        "{\"messages\":[{\"role\":\"system\",\"content\":\"I\\n\\nD\"},"
        "{\"role\":\"user\",\"content\":\"ab\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}"
        ","
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r1\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"r2\"},"
        "{\"role\":\"assistant\",\"content\":\"done\"}]}");
}

static void test_tools(void) {
    expect_chat("{\"input\":\"Hi\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
                "\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
                "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
                "\"parallel_tool_calls\":false}",
                "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                "\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
                "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                "\"parallel_tool_calls\":false,"
                "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    expect_chat("{\"input\":\"Hi\",\"tool_choice\":\"required\"}",
                "{\"tool_choice\":\"required\",\"messages\":[{\"role\":\"user\",\"content\":"
                "\"Hi\"}]}");
}

static void test_refused(void) {
    expect_fail("{\"input\":\"Hi\",\"previous_response_id\":\"resp_1\"}", 400,
                "previous_response_id");
    expect_fail("{\"input\":\"Hi\",\"store\":true}", 400, "store");
    expect_fail("{\"input\":\"Hi\",\"background\":true}", 400, "background");
    expect_fail("{\"input\":\"Hi\",\"truncation\":\"auto\"}", 400, "truncation");
    expect_fail("{\"input\":\"Hi\",\"text\":{\"format\":{\"type\":\"grammar\"}}}", 400,
                "text.format");
    expect_fail("{\"input\":\"Hi\",\"tools\":[{\"type\":\"file_search\"}]}", 400, "tools[0].type");
    expect_fail("{\"input\":\"Hi\",\"tool_choice\":{\"type\":\"web_search_preview\"}}", 400,
                "tool_choice");
    expect_fail("{\"input\":[{\"role\":\"user\",\"content\":\"a\",\"extra\":1}]}", 400,
                "input[0].extra");
    expect_fail("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}", 400,
                "input[0].arguments");
    expect_fail("{\"input\":[]}", 400, "input");
    expect_fail("{\"input\":[{\"type\":7}]}", 400, "input[0].type");
    expect_fail("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", 400, "input[0].type");
    expect_fail("{\"input\":5}", 400, "input");
    expect_fail("{\"input\":\"Hi\",\"instructions\":5}", 400, "instructions");
    expect_fail("{\"input\":\"Hi\",\"seed\":5}", 400, "seed");
}

int main(void) {
    T_RUN(test_text_and_settings);
    T_RUN(test_items);
    T_RUN(test_tools);
    T_RUN(test_refused);
    return t_summary();
}
