/* libFuzzer target for the grammar engine (src/grammar): the input is a JSON Schema, a NUL byte,
 * then a document. The schema is compiled (bytes that are not JSON select the json_object
 * grammar); compile must succeed or fail with a message, never crash. The document is then fed
 * byte by byte and must never crash; for the first 4 bytes the mask over the 256 one-byte tokens
 * must allow exactly the bytes accept_byte accepts (checked on a clone); for the first 2 bytes
 * the fast mask (tl_grammar_mask_within, unbounded and bounded by the distance) must equal the
 * reference walk (tl_grammar_mask_ref) on a vocabulary of the 256 bytes and 2-3 byte JSON
 * pieces; else abort. */
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

/* The 256 bytes, then every pair and some triples over a JSON-heavy alphabet. */
#define PIECES  "{}[]\":,01-.eE\\uatrnl \xc3\xa9"
#define N_MULTI 768
static tl_grammar_vocab *multi_vocab;

static void init_multi(void) {
    static char b[N_MULTI][3];
    static const char *p[N_MULTI];
    static size_t l[N_MULTI];
    const char *a = PIECES;
    size_t na = sizeof(PIECES) - 1, k = 0;
    for (; k < 256; k++) b[k][0] = (char)k, l[k] = 1;
    for (size_t i = 0; i < na && k < N_MULTI; i++)
        for (size_t j = 0; j < na && k < N_MULTI; j++, k++)
            b[k][0] = a[i], b[k][1] = a[j], l[k] = 2;
    for (uint32_t x = 12345; k < N_MULTI; k++) {
        for (int i = 0; i < 3; i++) x = x * 1103515245u + 12345u, b[k][i] = a[(x >> 16) % na];
        l[k] = 3;
    }
    for (k = 0; k < N_MULTI; k++) p[k] = b[k];
    if (tl_grammar_vocab_new(p, l, N_MULTI, &multi_vocab)) abort();
}

/* Fast mask == reference mask, unbounded and bounded. */
static void check_fast(const tl_grammar_state *st) {
    static uint32_t f[N_MULTI / 32], r[N_MULTI / 32];
    int bounds[2] = {-1, tl_grammar_distance(st) + 1};
    for (int i = 0; i < 2; i++) {
        int rf = tl_grammar_mask_within(st, multi_vocab, NULL, 0, bounds[i], f);
        int rr = tl_grammar_mask_ref(st, multi_vocab, NULL, 0, bounds[i], r);
        if (rf != rr || (!rf && memcmp(f, r, sizeof f))) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bytes_vocab) init_vocab();
    if (!multi_vocab) init_multi();
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
            if (i < 2) check_fast(st);
            if (tl_grammar_accept_byte(st, doc[i])) break;
        }
        (void)tl_grammar_is_complete(st);
        tl_grammar_state_free(st);
    }
    tl_grammar_free(g);
    return 0;
}
