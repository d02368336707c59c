/* libFuzzer target: Anthropic Messages request bodies through the conversion (anthropic.c) and
 * then the OpenAI validation it feeds (openai.c, test mode on). Any input must end in either a
 * converted request that openai.c accepts or refuses with an error, or an Anthropic-shaped error
 * ({"type":"error","error":{"type","message"}}) with a 4xx status. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/anthropic.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const tl_oai_error *e) {
    TL_ASSERT(e->http >= 400 && e->msg[0]);
    char *s = tl_ant_error_json(e);
    json_t *j = json_loads(s, 0, NULL), *err = json_object_get(j, "error");
    TL_ASSERT(!strcmp(json_string_value(json_object_get(j, "type")), "error"));
    TL_ASSERT(json_is_string(json_object_get(err, "type")));
    TL_ASSERT(json_is_string(json_object_get(err, "message")));
    json_decref(j);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    json_t *in = json_loadb((const char *)data + 1, size - 1, 0, NULL), *out = NULL;
    if (!in) return 0;
    tl_oai_error e = {0};
    int st = tl_ant_to_oai(in, data[0] & 1, &out, &e);
    json_decref(in);
    if (st) {
        TL_ASSERT(st < 0 && out == NULL && e.http < 500);
        check_error(&e);
        return 0;
    }
    TL_ASSERT(json_is_array(json_object_get(out, "messages")));
    char *body = tl_oai_dump(out);
    static tl_oai_defaults defs;
    tl_oai_defaults_init(&defs);
    tl_oai_opts o = {.model_name = "tiny", .model_path = "m", .test_mode = 1, .defaults = &defs};
    tl_oai_req r;
    memset(&e, 0, sizeof e);
    if (tl_oai_parse(&r, TL_OAI_CHAT, body, strlen(body), &o, 320, &e) == 0)
        tl_oai_req_free(&r);
    else
        check_error(&e);
    free(body);
    return 0;
}
