/* Private to the tokenizer: tokenizer.json as the loader sees it (bpe_load.c).
 *
 * The file is mostly model.vocab (an object of ~250K strings) and model.merges (~250K-500K
 * strings or pairs). A DOM for those (jansson: two mallocs per value, a hash insert per key) was
 * 60% of the load time, so tokjson_parse reads the two directly into flat arrays and hands every
 * other value (small) to jansson: `root` holds the top-level keys but "model", `model` the keys
 * of "model" but "vocab" and "merges". tokjson_from_arrays builds the same from GGUF-style
 * arrays. */
#ifndef TL_TOKJSON_H
#define TL_TOKJSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "common/buf.h"
#include "tokenizer/bpe.h"

typedef struct {
    uint32_t off, len; /* key in strs */
    int64_t id;
} vocab_ent;

typedef struct {
    uint32_t a, la, b, lb; /* merge halves in strs */
} merge_ent;

typedef struct {
    const char *p, *start, *end; /* scanner position in the text */
    json_t *root, *model;        /* the other values, parsed by jansson */
    tl_buf strs;                 /* vocab keys and merge halves, each NUL-terminated */
    vocab_ent *vocab;
    size_t n_vocab, cap_vocab;
    merge_ent *merges;
    size_t n_merges, cap_merges;
    int has_vocab, has_merges, depth;
    char *err;
    size_t errlen;
} tokjson;

/* Scans len bytes of JSON text into j (zeroed by the caller, err/errlen set). The whole text
 * must be well-formed JSON with a "model" object holding "vocab"; errors name the byte offset.
 * Free j with tokjson_free in every case. */
int tokjson_parse(tokjson *j, const char *json, size_t len);

/* Fills j (zeroed by the caller, err/errlen set) from arrays as tl_tokenizer_load_arrays takes
 * them, with pre_regex as the Split pattern. Free j with tokjson_free in every case. */
int tokjson_from_arrays(tokjson *j, const tl_tokenizer_arrays *a, const char *pre_regex);

void tokjson_free(tokjson *j);

#endif
