/* libFuzzer target for the grammar engine (src/grammar): the input is a JSON Schema, a NUL byte,
 * then a document. The schema is compiled (bytes that are not JSON select the json_object
 * grammar); compile must succeed or fail with a message, never crash. The document is then fed
 * byte by byte and must never crash; for the first 4 bytes the mask over the 256 one-byte tokens
 * must allow exactly the bytes accept_byte accepts (checked on a clone), else abort. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static tl_grammar_vocab *bytes_vocab;

static void init_vocab(void) {
    static char b[256];
    static const char *p[256];
    static size_t l[256];
    for (int i = 0; i < 256; i++) {
        b[i] = (char)i;
        p[i] = &b[i];
        l[i] = 1;
    }
    if (tl_grammar_vocab_new(p, l, 256, &bytes_vocab)) abort();
}

/* Mask bit b <=> a clone accepts b. */
static void check_mask(const tl_grammar_state *st) {
    uint32_t m[8];
    if (tl_grammar_mask(st, bytes_vocab, NULL, 0, m)) return; /* too many alternatives */
    for (int b = 0; b < 256; b++) {
        tl_grammar_state *c;
        if (tl_grammar_state_clone(st, &c)) abort();
        int ok = tl_grammar_accept_byte(c, (uint8_t)b) == 0;
        if (ok != (int)((m[b >> 5] >> (b & 31)) & 1)) abort();
        tl_grammar_state_free(c);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bytes_vocab) init_vocab();
    const uint8_t *sep = memchr(data, 0, size);
    size_t ns = sep ? (size_t)(sep - data) : size;
    json_t *schema = json_loadb((const char *)data, ns, JSON_DECODE_ANY, NULL);
    tl_grammar *g = NULL;
    char err[256];
    int rc = schema ? tl_grammar_from_schema(schema, &g, err, sizeof err)
                    : tl_grammar_json_object(&g, err, sizeof err);
    json_decref(schema);
    if (rc) {
        if (!err[0] || g) abort(); /* a failure always carries a message */
        return 0;
    }
    tl_grammar_state *st;
    if (tl_grammar_state_new(g, &st) == 0) {
        const uint8_t *doc = sep ? sep + 1 : data + size;
        size_t nd = sep ? size - ns - 1 : 0;
        for (size_t i = 0; i < nd; i++) {
            if (i < 4) check_mask(st);
            if (tl_grammar_accept_byte(st, doc[i])) break;
        }
        (void)tl_grammar_is_complete(st);
        tl_grammar_state_free(st);
    }
    tl_grammar_free(g);
    return 0;
}
