/* libFuzzer target: OpenAI request bodies (chat and completions, test mode on so the extension
 * fields are reachable) through validation. Any input must end in either a valid request whose
 * fields are in range, or an error whose body is an OpenAI-shaped JSON object. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static tl_oai_defaults defs;
    tl_oai_defaults_init(&defs);
    tl_oai_opts o = {.model_name = "tiny", .model_path = "m", .test_mode = 1, .defaults = &defs};
    tl_oai_kind kind = (data[0] & 1) ? TL_OAI_COMPLETION : TL_OAI_CHAT;
    tl_oai_req r;
    tl_oai_error e = {0};
    int st = tl_oai_parse(&r, kind, (const char *)data + 1, size - 1, &o, 320, &e);
    if (st == 0) {
        TL_ASSERT(kind != TL_OAI_CHAT || r.n_msgs > 0);
        TL_ASSERT(kind != TL_OAI_COMPLETION || r.prompt_text || r.n_prompt_ids > 0);
        TL_ASSERT(r.sample.temperature >= 0 && r.sample.temperature <= 2);
        TL_ASSERT(r.sample.top_p > 0 && r.sample.top_p <= 1);
        TL_ASSERT(r.n_stop >= 0 && r.n_stop <= TL_OAI_MAX_STOP);
        TL_ASSERT(r.top_logprobs >= 0 && r.top_logprobs <= TL_MAX_LOGPROBS);
        for (int i = 0; i < r.n_prompt_ids; i++)
            TL_ASSERT(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < 320);
        for (int i = 0; i < r.n_msgs; i++) TL_ASSERT(r.msgs[i].content != NULL);
        tl_oai_req_free(&r);
    } else {
        TL_ASSERT(st < 0 && e.http >= 400 && e.msg[0]);
        char *s = tl_oai_error_json(&e);
        json_t *j = json_loads(s, 0, NULL);
        TL_ASSERT(json_is_object(json_object_get(j, "error")));
        json_decref(j);
        free(s);
    }
    return 0;
}
