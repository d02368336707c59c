/* libFuzzer target for the tokenizer (src/tokenizer/bpe.c) on the tiny tokenizer: any bytes are
 * encoded (first byte picks the flags) and decoded, and must
 *   - never crash or leak (ASan/UBSan),
 *   - decode to valid UTF-8, the same through the streaming detokenizer as in one call,
 *   - be stable: encode(decode(encode(x))) == encode(x),
 *   - be the same with the segment cache (text seen before comes from it) as without,
 *   - round-trip to NFC(x) for valid UTF-8 without added tokens and with only code points below
 *     U+07FD (where utf8proc's NFC and HF's agree; above, bpe.c emulates HF's older tables).
 * An input starting with '{' is instead a tokenizer.json for tl_tokenizer_load_json (the
 * hand-written scanner for vocab/merges): it must load or fail with a message, never crash; a
 * loaded one must encode and decode. The seed corpus holds the tiny tokenizer.json.
 * Run from the repository root (tests/run.sh does). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/bpe.h"

static tl_tokenizer *tok, *plain; /* plain: the segment cache off */

static int valid_low_utf8(const uint8_t *s, size_t n) {
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)n - i, &cp);
        if (k <= 0 || cp >= 0x7FD || cp == '<') return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        char err[256];
        if (tl_tokenizer_load("tests/data/tiny-tokenizer/tokenizer.json", &tok, err, sizeof err)) {
            fprintf(stderr, "fuzz_bpe: %s (run from the repository root)\n", err);
            abort();
        }
        if (tl_tokenizer_load("tests/data/tiny-tokenizer/tokenizer.json", &plain, err, sizeof err))
            abort();
        tl_tokenizer_set_seg_cache(plain, 0);
    }
    if (size == 0) return 0;
    if (data[0] == '{') {
        char err[256] = "";
        tl_tokenizer *t = NULL;
        int st = tl_tokenizer_load_json((const char *)data, size, &t, err, sizeof err);
        if (st < 0 && (t || !err[0])) abort();
        if (st == 0) {
            tl_tok_ids ids = {0};
            static const char probe[] = "Hello, world! <think> \xc3\xa9\xff";
            if (tl_tokenize(t, probe, sizeof probe - 1, 0, &ids) < 0) abort();
            char *dec;
            size_t dl;
            if (tl_detokenize(t, ids.ids, ids.n, 0, &dec, &dl)) abort();
            free(dec);
            tl_tok_ids_free(&ids);
            tl_tokenizer_free(t);
        }
        return 0;
    }
    unsigned flags = data[0] & 1 ? TL_TOKENIZE_SPLIT_SPECIAL : 0;
    unsigned dflags = data[0] & 2 ? TL_DETOK_SKIP_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    tl_tok_ids ids = {0}, again = {0};
    if (tl_tokenize(tok, text, len, flags, &ids) < 0) abort();
    for (int k = 0; k < 2; k++) { /* the cache filled by the call above, then without it */
        again.n = 0;
        if (tl_tokenize(k ? plain : tok, text, len, flags, &again) < 0) abort();
        if (again.n != ids.n || (ids.n && memcmp(again.ids, ids.ids, ids.n * sizeof(int32_t))))
            abort();
    }
    again.n = 0;
    char *dec;
    size_t dl;
    if (tl_detokenize(tok, ids.ids, ids.n, dflags, &dec, &dl)) abort();
    utf8proc_int32_t cp;
    for (utf8proc_ssize_t i = 0; (size_t)i < dl;) {
        utf8proc_ssize_t k =
            utf8proc_iterate((const uint8_t *)dec + i, (utf8proc_ssize_t)dl - i, &cp);
        if (k <= 0) abort(); /* decode must be valid UTF-8 */
        i += k;
    }

    tl_detok_stream *ds;
    if (tl_detok_stream_create(tok, dflags, &ds)) abort();
    char *sbuf = malloc(dl + 4);
    size_t sl = 0;
    const char *piece;
    size_t pl;
    for (size_t i = 0; i < ids.n; i++) {
        if (tl_detok_stream_push(ds, ids.ids[i], &piece, &pl)) abort();
        if (sl + pl > dl) abort();
        memcpy(sbuf + sl, piece, pl);
        sl += pl;
    }
    if (tl_detok_stream_flush(ds, &piece, &pl) || sl + pl != dl) abort();
    memcpy(sbuf + sl, piece, pl);
    if (memcmp(sbuf, dec, dl)) abort();
    tl_detok_stream_free(ds);
    free(sbuf);

    if (!dflags) {
        if (tl_tokenize(tok, dec, dl, flags, &again) < 0) abort();
        if (again.n != ids.n || (ids.n && memcmp(again.ids, ids.ids, ids.n * sizeof(int32_t))))
            abort();
    }
    if (valid_low_utf8((const uint8_t *)text, len)) {
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nl < 0 || (size_t)nl != dl || memcmp(nfc, dec, dl)) abort();
        free(nfc);
    }
    free(dec);
    tl_tok_ids_free(&ids);
    tl_tok_ids_free(&again);
    return 0;
}
