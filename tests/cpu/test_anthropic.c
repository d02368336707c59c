/* Anthropic Messages conversions: request -> the OpenAI chat request (compared with the mapping
 * written out by hand from Anthropic's and OpenAI's API references), refused and ignored fields,
 * generated message -> content blocks, stop reasons and the error shape. */
#include <jansson.h>
#include "server/anthropic.h"
#include "t_check.h"

/* Converts body; on success compares with want (JSON text), else expects failure naming field. */
static void expect(const char *body, int count_only, const char *want, const char *field) {
    json_t *in = json_loads(body, 0, NULL), *out = NULL;
    CHECK(in != NULL);
    tl_oai_error e;
    memset(&e, 0, sizeof e);
    int st = tl_ant_to_oai(in, count_only, &out, &e);
    if (want) {
        json_t *w = json_loads(want, 0, NULL);
        CHECK(w != NULL);
        CHECK_EQ_INT(st, 0);
        if (!json_equal(out, w)) {
            char *got = out ? json_dumps(out, JSON_SORT_KEYS) : NULL;
            fprintf(stderr, "body %s\n got %s\nwant %s\n", body, got ? got : "(null)", want);
            free(got);
            CHECK(0);
        }
        json_decref(w);
    } else {
        CHECK(st < 0);
        CHECK(out == NULL);
        CHECK_EQ_INT(e.http, 400);
        if (!strstr(e.msg, field) && !strstr(e.param, field)) {
            fprintf(stderr, "body %s: error '%s' (param '%s') does not name %s\n", body, e.msg,
                    e.param, field);
            CHECK(0);
        }
    }
    json_decref(out);
    json_decref(in);
}

#define OFF "\"chat_template_kwargs\":{\"enable_thinking\":false}"
#define ON  "\"chat_template_kwargs\":{\"enable_thinking\":true}"

static void test_minimal_and_sampling(void) {
    expect(
        "{\"model\":\"m\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        0,
        "{\"model\":\"m\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
        "," OFF "}",
        NULL);
    expect(
        "{\"model\":\"m\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"stream\":true,"
        "\"stop_sequences\":[\"A\",\"B\"],\"metadata\":{\"user_id\":\"u\"},"
        "\"service_tier\":\"auto\",\"cache_control\":{\"type\":\"ephemeral\"},"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}}",
        0,
        "{\"model\":\"m\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"stream\":true,\"stop\":[\"A\",\"B\"]," ON
        "}",
        NULL);
    /* count_tokens: no max_tokens needed */
    expect("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"thinking\":{\"type\":\"adaptive\"}}",
           1, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," ON "}",
           NULL);
}

static void test_system_and_blocks(void) {
    expect("{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"A\","
           "\"cache_control\":{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"B\"}],"
           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]}]}",
           0,
           "{\"model\":\"m\",\"max_tokens\":1,\"messages\":["
           "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
           "{\"type\":\"text\",\"text\":\"B\"}]},"
           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]}]," OFF "}",
           NULL);
}

static void test_tools_and_history(void) {
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":9,"
        "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"},"
        "\"cache_control\":{\"type\":\"ephemeral\"}}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
        "\"signature\":\"x\"},{\"type\":\"text\",\"text\":\"ok\"},"
        "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{\"a\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"r\"}]},{\"type\":\"text\",\"text\":\"more\"}]}]"
        "}";
    const char *want =
        "{\"model\":\"m\",\"max_tokens\":9,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\"hm\","
        "\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],"
        "\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"a\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":[{\"type\":\"text\",\"text\":\"r\"}"
        "]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]," OFF "}";
    expect(body, 0, want, NULL);
    /* a user turn of tool results only is the tool messages alone; named and none choices */
    expect("{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
           "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
           "\"tool_use_id\":\"t\",\"content\":\"s\"}]}]}",
           0,
           "{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"type\":\"function\",\"function\":{"
           "\"name\":\"f\",\"parameters\":{}}}],"
           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
           "\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"t\",\"content\":"
           "[{\"type\":\"text\",\"text\":\"s\"}]}]," OFF "}",
           NULL);
    expect("{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"none\"},"
           "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
           0,
           "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":\"none\","
           "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," OFF "}",
           NULL);
}

#define U "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"

static void test_refused(void) {
    expect("{\"model\":\"m\"," U "}", 0, NULL, "max_tokens");
    expect("{\"model\":\"m\",\"max_tokens\":null," U "}", 0, NULL, "max_tokens");
    expect("{\"max_tokens\":1," U "}", 0, NULL, "model");
    expect("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", 0, NULL, "messages");
    expect("{\"model\":\"m\",\"max_tokens\":1," U ",\"mcp_servers\":[]}", 0, NULL, "mcp_servers");
    expect("{\"model\":\"m\",\"max_tokens\":1," U ",\"container\":\"c\"}", 0, NULL, "container");
    expect("{\"model\":\"m\",\"max_tokens\":1," U ",\"output_config\":{\"format\":{}}}", 0, NULL,
           "output_config.format");
    expect("{\"model\":\"m\",\"max_tokens\":1," U
           ",\"thinking\":{\"type\":\"enabled\",\"display\":\"omitted\"}}",
           0, NULL, "thinking.display");
    expect("{\"model\":\"m\",\"max_tokens\":1," U ",\"thinking\":{\"type\":\"maybe\"}}", 0, NULL,
           "thinking.type");
    expect("{\"model\":\"m\",\"max_tokens\":1," U ",\"tool_choice\":{\"type\":\"some\"}}", 0, NULL,
           "tool_choice.type");
    expect("{\"model\":\"m\",\"max_tokens\":1," U
           ",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\",\"input_schema\":{}}]}",
           0, NULL, "tools[0]");
    expect("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
           "[{\"type\":\"image\",\"source\":{}}]}]}",
           0, NULL, "image");
    expect("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":"
           "\"x\"}]}",
           0, NULL, "messages[0].role");
    expect("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
           "[{\"type\":\"text\",\"text\":\"a\",\"extra\":1}]}]}",
           0, NULL, "messages[0].content[0].extra");
    expect("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
           "\"x\"},{\"role\":\"assistant\",\"content\":\"The answer is\"}]}",
           0, NULL, "final assistant message");
    /* sampling fields are not count_tokens fields */
    expect("{\"model\":\"m\"," U ",\"temperature\":1}", 1, NULL, "temperature");
}

static void test_blocks_and_stop_reason(void) {
    json_t *msg = json_loads(
        "{\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"t\",\"tool_calls\":"
        "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"a\\\": [1]}\"}},{\"id\":\"d\",\"type\":\"function\",\"function\":{\"name\":\"g\","
        "\"arguments\":\"not json\"}}]}",
        0, NULL);
    json_t *want =
        json_loads("[{\"type\":\"thinking\",\"thinking\":\"r\",\"signature\":\"\"},"
                   "{\"type\":\"text\",\"text\":\"t\"},"
                   "{\"type\":\"tool_use\",\"id\":\"c\",\"name\":\"f\",\"input\":{\"a\":[1]}},"
                   "{\"type\":\"tool_use\",\"id\":\"d\",\"name\":\"g\",\"input\":{}}]",
                   0, NULL);
    json_t *got = tl_ant_blocks(msg);
    CHECK(json_equal(got, want));
    json_decref(got);
    json_decref(want);
    json_decref(msg);
    msg = json_loads("{\"role\":\"assistant\",\"content\":null}", 0, NULL);
    got = tl_ant_blocks(msg);
    CHECK_EQ_INT(json_array_size(got), 0);
    json_decref(got);
    json_decref(msg);
    CHECK_STR(tl_ant_stop_reason("stop", 0), "end_turn");
    CHECK_STR(tl_ant_stop_reason("stop", 1), "stop_sequence");
    CHECK_STR(tl_ant_stop_reason("length", 0), "max_tokens");
    CHECK_STR(tl_ant_stop_reason("tool_calls", 0), "tool_use");
}

static void test_error_shape(void) {
    CHECK_STR(tl_ant_error_type(400), "invalid_request_error");
    CHECK_STR(tl_ant_error_type(401), "authentication_error");
    CHECK_STR(tl_ant_error_type(404), "not_found_error");
    CHECK_STR(tl_ant_error_type(413), "request_too_large");
    CHECK_STR(tl_ant_error_type(429), "rate_limit_error");
    CHECK_STR(tl_ant_error_type(500), "api_error");
    CHECK_STR(tl_ant_error_type(503), "overloaded_error");
    tl_oai_error e = {.http = 400};
    snprintf(e.param, sizeof e.param, "top_k");
    snprintf(e.msg, sizeof e.msg, "must be an integer");
    char *s = tl_ant_error_json(&e);
    CHECK_STR(s, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                 "\"message\":\"top_k: must be an integer\"}}");
    free(s);
}

int main(void) {
    T_RUN(test_minimal_and_sampling);
    T_RUN(test_system_and_blocks);
    T_RUN(test_tools_and_history);
    T_RUN(test_refused);
    T_RUN(test_blocks_and_stop_reason);
    T_RUN(test_error_shape);
    return t_summary();
}
