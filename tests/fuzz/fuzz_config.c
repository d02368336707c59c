/* libFuzzer target: config.json parsing and the self-consistency checks on arbitrary text. A
 * parse that succeeds must describe a config whose check either passes or names a problem. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (size) memcpy(text, data, size);
    text[size] = 0;
    tl_config c;
    char err[256] = "";
    if (tl_config_parse(&c, text, "config.json", err, sizeof err) == 0) {
        TL_ASSERT(c.n_layer > 0 && c.n_layer <= TL_MAX_LAYERS);
        TL_ASSERT(c.n_eos >= 0 && c.n_eos <= 4);
        if (tl_config_check(&c, err, sizeof err)) TL_ASSERT(err[0]);
        if (tl_config_check_production(&c, err, sizeof err)) TL_ASSERT(err[0]);
    } else {
        TL_ASSERT(err[0]);
    }
    free(text);
    return 0;
}
