/* libFuzzer target: Responses request bodies through the conversion to a chat body
 * (tl_resp_to_chat) and then the chat validation (tl_oai_parse, test mode on), as
 * POST /v1/responses runs them. Any input must end in a valid chat request with at least one
 * message, or an error with a 4xx status and a message. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/openai.h"
#include "server/responses.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tl_oai_defaults defs;
    tl_oai_defaults_init(&defs);
    tl_oai_opts o = {.model_name = "tiny", .model_path = "m", .test_mode = 1, .defaults = &defs};
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!body) return 0;
    tl_oai_error e = {0};
    json_t *chat = tl_resp_to_chat(body, &e);
    json_decref(body);
    if (!chat) {
        TL_ASSERT(e.status < 0 && e.http >= 400 && e.http < 500 && e.msg[0]);
        return 0;
    }
    TL_ASSERT(json_array_size(json_object_get(chat, "messages")) > 0);
    char *text = tl_oai_dump(chat);
    tl_oai_req r;
    int st = tl_oai_parse(&r, TL_OAI_CHAT, text, strlen(text), &o, 320, &e);
    free(text);
    if (st == 0) {
        TL_ASSERT(r.n_msgs > 0);
        tl_oai_req_free(&r);
    } else {
        TL_ASSERT(st < 0 && e.http >= 400 && e.msg[0]);
    }
    return 0;
}
