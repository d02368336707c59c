/* Tokenizer unit tests (src/tokenizer/bpe.c) on the tiny tokenizer: ids from HF tokenizers
 * (tests/data/tok/tiny_vectors.json, tools/tok_make_vectors.py), invalid UTF-8, added tokens,
 * the streaming detokenizer, concurrent encoding, load errors. The big comparisons against HF on
 * the real Qwen vocabularies are in tests/py/test_tokenizer.py. Run from the repository root. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <utf8proc.h>

#include "t_check.h"
#include "tulip.h"
#include "tokenizer/bpe.h"

#define TINY "tests/data/tiny-tokenizer/tokenizer.json"

static tl_tokenizer *tiny;

static int encode(const char *s, size_t n, unsigned flags, tl_tok_ids *out) {
    out->n = 0;
    return tl_tokenize(tiny, s, n, flags, out);
}

static int ids_equal(const tl_tok_ids *a, const tl_tok_ids *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->ids, b->ids, a->n * sizeof(int32_t)));
}

static void test_bpe_load_tiny(void) {
    char err[256] = "";
    int st = tl_tokenizer_load(TINY, &tiny, err, sizeof err);
    CHECK_EQ_INT(st, 0);
    if (st) {
        fprintf(stderr, "load: %s\n", err);
        exit(1);
    }
    CHECK_EQ_INT(tl_tokenizer_n_vocab(tiny), 320);
    CHECK_EQ_INT(tl_token_id(tiny, "<|endoftext|>"), 287);
    CHECK_EQ_INT(tl_token_id(tiny, "<|im_start|>"), 288);
    CHECK_EQ_INT(tl_token_id(tiny, "<|im_end|>"), 289);
    CHECK_EQ_INT(tl_token_id(tiny, "<tool_call>"), 301);
    CHECK_EQ_INT(tl_token_id(tiny, "</tool_call>"), 302);
    CHECK_EQ_INT(tl_token_id(tiny, "<tool_response>"), 309);
    CHECK_EQ_INT(tl_token_id(tiny, "</tool_response>"), 310);
    CHECK_EQ_INT(tl_token_id(tiny, "<think>"), 311);
    CHECK_EQ_INT(tl_token_id(tiny, "</think>"), 312);
    CHECK_EQ_INT(tl_token_id(tiny, "<|im_end"), TL_ERR_INVALID);
    CHECK_EQ_INT(tl_token_id(tiny, ""), TL_ERR_INVALID);
    CHECK(tl_token_is_special(tiny, 289));
    CHECK(!tl_token_is_special(tiny, 311)); /* <think> is added but not special */
    CHECK(tl_token_is_added(tiny, 311));
    CHECK(!tl_token_is_added(tiny, 65));
    CHECK(!tl_token_is_special(tiny, -1) && !tl_token_is_special(tiny, 320));
}

/* Regular tokens: id <-> raw bytes (not the byte-level "Ġ" form). */
static void test_bpe_token_str(void) {
    size_t n;
    const char *s = tl_token_str(tiny, 32, &n);
    CHECK(s && n == 1 && s[0] == ' ');
    CHECK_EQ_INT(tl_token_id(tiny, " the"), 261);
    s = tl_token_str(tiny, 261, &n);
    CHECK(s && n == 4 && !memcmp(s, " the", 4));
    s = tl_token_str(tiny, 289, &n);
    CHECK(s && n == 10 && !memcmp(s, "<|im_end|>", 10));
    CHECK(tl_token_str(tiny, 320, &n) == NULL && n == 0);
    CHECK(tl_token_str(tiny, -5, &n) == NULL);
    CHECK_EQ_INT(tl_token_id(tiny, "\xff"), 255); /* a lone byte is its own token */
}

static int hexv(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* Every vector: tulip's ids equal HF's, and decode(encode(text)) equals HF-normalized text is
 * covered by the Python tests; here the ids must match exactly. */
static void test_bpe_vectors_match_hf(void) {
    json_error_t je;
    json_t *root = json_load_file("tests/data/tok/tiny_vectors.json", 0, &je);
    CHECK(json_is_array(root));
    if (!root) return;
    size_t i, n_ok = 0;
    json_t *v;
    tl_tok_ids ids = {0};
    json_array_foreach(root, i, v) {
        char *buf;
        size_t len;
        json_t *text = json_object_get(v, "text"), *hex = json_object_get(v, "hex");
        if (json_is_string(text)) {
            len = json_string_length(text);
            buf = malloc(len + 1);
            memcpy(buf, json_string_value(text), len);
        } else {
            const char *h = json_string_value(hex);
            len = strlen(h) / 2;
            buf = malloc(len + 1);
            for (size_t k = 0; k < len; k++)
                buf[k] = (char)(hexv(h[2 * k]) * 16 + hexv(h[2 * k + 1]));
        }
        json_t *want = json_object_get(v, "ids");
        int n = encode(buf, len, 0, &ids);
        int same = n == (int)json_array_size(want);
        for (size_t k = 0; same && k < ids.n; k++)
            same = ids.ids[k] == json_integer_value(json_array_get(want, k));
        if (!same)
            fprintf(stderr, "vector %zu differs (%d ids, HF %zu)\n", i, n, json_array_size(want));
        CHECK(same);
        n_ok += (size_t)same;
        free(buf);
    }
    fprintf(stderr, "# %zu of %zu vectors equal to HF\n", n_ok, json_array_size(root));
    CHECK(n_ok > 200);
    tl_tok_ids_free(&ids);
    json_decref(root);
}

/* Invalid UTF-8: each maximal invalid subpart becomes one U+FFFD before tokenizing. */
static void test_bpe_invalid_utf8(void) {
    static const struct {
        const char *bad, *fixed;
    } cases[] = {
        {"a\xff"
         "b",
         "a\xEF\xBF\xBD"
         "b"},
        {"\xe2\x82", "\xEF\xBF\xBD"}, /* truncated: one subpart */
        {"\xe2\x82x", "\xEF\xBF\xBDx"},
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: 3 */
        {"\xf0\x9f\x98", "\xEF\xBF\xBD"},
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"}, /* overlong */
        {"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\x80\xbf<think>\xc3", "\xEF\xBF\xBD\xEF\xBF\xBD<think>\xEF\xBF\xBD"},
    };
    tl_tok_ids a = {0}, b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(encode(cases[i].bad, strlen(cases[i].bad), 0, &a) > 0);
        CHECK(encode(cases[i].fixed, strlen(cases[i].fixed), 0, &b) > 0);
        CHECK(ids_equal(&a, &b));
    }
    /* NUL bytes are ordinary text */
    CHECK_EQ_INT(encode("a\0b", 3, 0, &a), 3);
    CHECK_EQ_INT(a.ids[1], 0);
    CHECK_EQ_INT(encode("", 0, 0, &a), 0);
    tl_tok_ids_free(&a);
    tl_tok_ids_free(&b);
}

static void test_bpe_added_tokens(void) {
    tl_tok_ids a = {0};
    const char *s = "x<|im_start|>user\n<think>hi</think><|im_end|>";
    CHECK(encode(s, strlen(s), 0, &a) > 0);
    int found_start = 0, found_think = 0, found_end = 0;
    for (size_t i = 0; i < a.n; i++) {
        found_start += a.ids[i] == 288;
        found_think += a.ids[i] == 311 || a.ids[i] == 312;
        found_end += a.ids[i] == 289;
    }
    CHECK(found_start == 1 && found_think == 2 && found_end == 1);
    /* split-special: special tokens become text, non-special added ones stay whole */
    CHECK(encode(s, strlen(s), TL_TOKENIZE_SPLIT_SPECIAL, &a) > 0);
    found_start = found_think = found_end = 0;
    for (size_t i = 0; i < a.n; i++) {
        found_start += a.ids[i] == 288;
        found_think += a.ids[i] == 311 || a.ids[i] == 312;
        found_end += a.ids[i] == 289;
    }
    CHECK(found_start == 0 && found_think == 2 && found_end == 0);
    /* longest match wins and a partial token is text */
    CHECK_EQ_INT(encode("<tool_response>", 15, 0, &a), 1);
    CHECK_EQ_INT(a.ids[0], 309);
    CHECK(encode("<tool_respons", 13, 0, &a) > 1);
    tl_tok_ids_free(&a);
}

static char *detok(const int32_t *ids, size_t n, unsigned flags, size_t *len) {
    char *out = NULL;
    CHECK_EQ_INT(tl_detokenize(tiny, ids, n, flags, &out, len), 0);
    return out;
}

static void test_bpe_detokenize(void) {
    size_t n;
    int32_t ids[] = {288, 104, 105, 289};
    char *s = detok(ids, 4, 0, &n);
    CHECK_STR(s, "<|im_start|>hi<|im_end|>");
    free(s);
    s = detok(ids, 4, TL_DETOK_SKIP_SPECIAL, &n);
    CHECK_STR(s, "hi");
    free(s);
    int32_t think[] = {311, 104, 312};
    s = detok(think, 3, TL_DETOK_SKIP_SPECIAL, &n); /* not special: kept */
    CHECK_STR(s, "<think>h</think>");
    free(s);
    int32_t half[] = {0xC3, 104, 0xE4, 0xB8}; /* lead byte then ASCII; truncated 3-byte char */
    s = detok(half, 4, 0, &n);
    CHECK_STR(s, "\xEF\xBF\xBDh\xEF\xBF\xBD");
    free(s);
    int32_t bad[] = {1, 320};
    char *o = (char *)1;
    CHECK_EQ_INT(tl_detokenize(tiny, bad, 2, 0, &o, &n), TL_ERR_INVALID);
    CHECK(o == NULL);
}

/* The stream emits nothing until a character is complete and, in total, exactly what
 * tl_detokenize gives for the same ids. */
static void test_bpe_detok_stream(void) {
    tl_detok_stream *ds;
    CHECK_EQ_INT(tl_detok_stream_create(tiny, 0, &ds), 0);
    const char *t;
    size_t n;
    const uint8_t euro[] = {0xE2, 0x82, 0xAC}; /* € as three byte tokens */
    CHECK_EQ_INT(tl_detok_stream_push(ds, euro[0], &t, &n), 0);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(tl_detok_stream_pending(ds), 1);
    CHECK_EQ_INT(tl_detok_stream_push(ds, euro[1], &t, &n), 0);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(tl_detok_stream_push(ds, euro[2], &t, &n), 0);
    CHECK(n == 3 && !memcmp(t, "\xE2\x82\xAC", 3));
    CHECK_EQ_INT(tl_detok_stream_pending(ds), 0);
    CHECK_EQ_INT(tl_detok_stream_push(ds, 0xF0, &t, &n), 0); /* unfinished, then a special */
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(tl_detok_stream_push(ds, 289, &t, &n), 0);
    CHECK(n == 13 && !memcmp(t, "\xEF\xBF\xBD<|im_end|>", 13));
    CHECK_EQ_INT(tl_detok_stream_push(ds, 0xE4, &t, &n), 0);
    CHECK_EQ_INT(tl_detok_stream_push(ds, 320, &t, &n), TL_ERR_INVALID);
    CHECK_EQ_INT(tl_detok_stream_flush(ds, &t, &n), 0);
    CHECK(n == 3 && !memcmp(t, "\xEF\xBF\xBD", 3));
    CHECK_EQ_INT(tl_detok_stream_flush(ds, &t, &n), 0);
    CHECK_EQ_INT(n, 0);
    tl_detok_stream_free(ds);

    /* random id sequences: stream == whole, with and without skip-special */
    unsigned long long rng = 42;
    for (int iter = 0; iter < 2000; iter++) {
        int32_t ids[24];
        size_t k = t_rng_next(&rng) % 24;
        for (size_t i = 0; i < k; i++) {
            uint64_t r = t_rng_next(&rng);
            ids[i] = (int32_t)(r % 4 == 0 ? r % 320 : 0x80 + r % 0x80);
            if (r % 7 == 0) ids[i] = (int32_t)(0xC2 + r % 0x33);
        }
        unsigned flags = iter % 2 ? TL_DETOK_SKIP_SPECIAL : 0;
        size_t wl;
        char *want = detok(ids, k, flags, &wl);
        CHECK_EQ_INT(tl_detok_stream_create(tiny, flags, &ds), 0);
        char got[24 * 40];
        size_t gl = 0;
        for (size_t i = 0; i < k; i++) {
            CHECK_EQ_INT(tl_detok_stream_push(ds, ids[i], &t, &n), 0);
            memcpy(got + gl, t, n);
            gl += n;
        }
        tl_detok_stream_flush(ds, &t, &n);
        memcpy(got + gl, t, n);
        gl += n;
        CHECK(gl == wl && !memcmp(got, want, wl));
        free(want);
        tl_detok_stream_free(ds);
    }
}

/* Random valid UTF-8 (code points below U+07FD, where every NFC implementation agrees, plus
 * CJK and emoji) round-trips to its NFC. */
static void test_bpe_roundtrip_nfc(void) {
    unsigned long long rng = 7;
    tl_tok_ids ids = {0};
    for (int iter = 0; iter < 1500; iter++) {
        uint8_t buf[256];
        size_t n = 0;
        int k = (int)(t_rng_next(&rng) % 40);
        for (int i = 0; i < k; i++) {
            uint64_t r = t_rng_next(&rng);
            int32_t cp;
            switch (r % 5) {
            case 0:
                cp = (int32_t)(0x20 + r / 5 % 0x5F);
                break;
            case 1:
                cp = (int32_t)(0x300 + r / 5 % 0x70);
                break; /* combining marks */
            case 2:
                cp = (int32_t)(0x80 + r / 5 % 0x77D);
                break;
            case 3:
                cp = (int32_t)(0x4E00 + r / 5 % 0x200);
                break;
            default:
                cp = (int32_t)(r / 5 % 2 ? 0x1F600 + r / 10 % 0x40
                                         : (uint64_t)(uint8_t) " \t\n\r"[r / 10 % 4]);
            }
            n += (size_t)utf8proc_encode_char(cp, buf + n);
        }
        CHECK(encode((const char *)buf, n, 0, &ids) >= 0);
        size_t dl;
        char *d = detok(ids.ids, ids.n, 0, &dl);
        uint8_t *want = NULL;
        utf8proc_ssize_t wl =
            utf8proc_map(buf, (utf8proc_ssize_t)n, &want, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        CHECK(wl >= 0 && (size_t)wl == dl && (dl == 0 || !memcmp(d, want, dl)));
        free(want);
        free(d);
    }
    tl_tok_ids_free(&ids);
}

/* Very long runs: one pre-token of a megabyte of spaces (deep regex backtracking through the
 * \s+(?!\S) alternative, long BPE words). */
static void test_bpe_long_runs(void) {
    size_t n = 1 << 20;
    char *s = malloc(n + 1);
    memset(s, ' ', n);
    s[n - 1] = 'x';
    tl_tok_ids ids = {0};
    int k = tl_tokenize(tiny, s, n, 0, &ids);
    CHECK(k > 0);
    size_t dl;
    char *d = detok(ids.ids, ids.n, 0, &dl);
    CHECK(dl == n && !memcmp(d, s, n));
    free(d);
    memset(s, 'a', n);
    CHECK(tl_tokenize(tiny, s, n, 0, &ids) > 0);
    tl_tok_ids_free(&ids);
    free(s);
}

typedef struct {
    const char *text;
    tl_tok_ids want;
    int ok;
} thread_job;

static void *encode_thread(void *arg) {
    thread_job *j = arg;
    tl_tok_ids ids = {0};
    j->ok = 1;
    for (int r = 0; r < 300; r++) {
        ids.n = 0;
        if (tl_tokenize(tiny, j->text, strlen(j->text), 0, &ids) < 0 || !ids_equal(&ids, &j->want))
            j->ok = 0;
    }
    tl_tok_ids_free(&ids);
    return NULL;
}

/* Concurrent encodes on one tokenizer give the single-thread answers (the word cache is shared). */
static void test_bpe_threads(void) {
    const char *texts[] = {"the cat and the dog are in the house",
                           "thinking of the others, and of it",
                           "<|im_start|>user\nhello there<|im_end|>", "中文 and English, 123 456!"};
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].text = texts[i];
        memset(&jobs[i].want, 0, sizeof jobs[i].want);
        CHECK(tl_tokenize(tiny, texts[i], strlen(texts[i]), 0, &jobs[i].want) > 0);
    }
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, encode_thread, &jobs[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
        tl_tok_ids_free(&jobs[i].want);
    }
}

static void test_bpe_load_errors(void) {
    static const char *bad[] = {
        "",
        "{",
        "[]",
        "{}",
        "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a\", "
        "7]},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": "
        "true}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": "
        "{\"type\": \"NFKC\"},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": "
        "[{\"id\": 1}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\":"
        " \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"[\\\\S]\"},"
        " \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
        /* the loader's own scanner: trailing text, bad ids, bad escapes, truncation */
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\"}} x",
        "{\"model\": {\"vocab\": {\"a\": 1.5}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\"}}",
        "{\"model\": {\"vocab\": {\"\\ud800\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\"}}",
        "{\"model\": {\"vocab\": {\"\\q\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\"}}",
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\"}}",
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
        "\"ByteLevel\", \"x\": tru}}",
        "{\"model\": {\"vocab\": {\"a\": 0, ",
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"model\": {}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        tl_tokenizer *t = (tl_tokenizer *)1;
        int st = tl_tokenizer_load_json(bad[i], strlen(bad[i]), &t, err, sizeof err);
        CHECK(st < 0);
        CHECK(t == NULL);
        CHECK(err[0] != 0);
        if (st >= 0) fprintf(stderr, "case %zu loaded\n", i);
    }
    char err[256];
    tl_tokenizer *t;
    CHECK_EQ_INT(tl_tokenizer_load("tests/data/does-not-exist.json", &t, err, sizeof err),
                 TL_ERR_IO);
    CHECK(strstr(err, "does-not-exist") != NULL);
    /* a minimal file with the GPT-2 ByteLevel regex loads and encodes */
    const char *ok = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                     "\"merges\": [[\"a\", \"b\"]]},"
                     " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}";
    CHECK_EQ_INT(tl_tokenizer_load_json(ok, strlen(ok), &t, err, sizeof err), 0);
    if (t) {
        tl_tok_ids ids = {0};
        CHECK_EQ_INT(tl_tokenize(t, "abxa", 4, 0, &ids), 2); /* x has no token: dropped, as HF */
        CHECK(ids.n == 2 && ids.ids[0] == 2 && ids.ids[1] == 0);
        tl_tok_ids_free(&ids);
        tl_tokenizer_free(t);
    }
    /* escapes decode; a key given twice keeps its later id (the earlier id is a hole); HF
     * tokenizers gives [2, 3, 4] for "ab b" on this file too */
    const char *esc =
        "{\"model\": {\"vocab\": {\"\\u0061\": 0, \"b\": 1, \"a\\u0062\": 2, \"b\": 4,"
        " \"\\u0120\": 3}, \"merges\": [\"a b\"]},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}";
    CHECK_EQ_INT(tl_tokenizer_load_json(esc, strlen(esc), &t, err, sizeof err), 0);
    if (t) {
        size_t n;
        CHECK_EQ_INT(tl_tokenizer_n_vocab(t), 5);
        CHECK_EQ_INT(tl_token_id(t, "b"), 4);
        CHECK(tl_token_str(t, 1, &n) == NULL);
        CHECK_EQ_INT(tl_token_id(t, " "), 3); /* byte-level U+0120 is the space byte */
        tl_tok_ids ids = {0};
        CHECK_EQ_INT(tl_tokenize(t, "ab b", 4, 0, &ids), 3);
        CHECK(ids.n == 3 && ids.ids[0] == 2 && ids.ids[1] == 3 && ids.ids[2] == 4);
        tl_tok_ids_free(&ids);
        tl_tokenizer_free(t);
    }
}

/* The tiny tokenizer given as GGUF-style arrays loads to the same tokenizer as its JSON. */
static void test_bpe_load_arrays_matches_json(void) {
    json_error_t je;
    json_t *root = json_load_file(TINY, 0, &je);
    CHECK(root != NULL);
    if (!root) return;
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char *tokens[320] = {0};
    int32_t types[320];
    const char *mstr[64];
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        tokens[json_integer_value(v)] = key;
        types[json_integer_value(v)] = 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        tokens[id] = json_string_value(json_object_get(v, "content"));
        types[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
    }
    size_t n_merges = json_array_size(merges);
    CHECK(n_merges <= 64);
    json_array_foreach(merges, i, v) mstr[i] = json_string_value(v);
    const char *rx = json_string_value(json_object_get(
        json_object_get(
            json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers"),
                           0),
            "pattern"),
        "Regex"));
    CHECK_STR(tl_bpe_regex_for_pre("qwen35"), rx);
    CHECK(tl_bpe_regex_for_pre("llama-bpe") == NULL);
    tl_tokenizer_arrays arr = {tokens, 320, types, mstr, n_merges, tl_bpe_regex_for_pre("qwen35"),
                               1};
    tl_tokenizer *t = NULL;
    char err[256];
    CHECK_EQ_INT(tl_tokenizer_load_arrays(&arr, &t, err, sizeof err), 0);
    if (t) {
        CHECK_EQ_INT(tl_tokenizer_n_vocab(t), 320);
        for (int32_t id = 0; id < 320; id++) {
            size_t la, lb;
            const char *sa = tl_token_str(t, id, &la), *sb = tl_token_str(tiny, id, &lb);
            CHECK(sa && sb && la == lb && !memcmp(sa, sb, la));
            CHECK_EQ_INT(tl_token_is_special(t, id), tl_token_is_special(tiny, id));
        }
        const char *texts[] = {"the cat and the dog, thinking",
                               "<|im_start|>user\n<think>é\u0301</think>",
                               "  \t\n\r\n 123 'S 'll 中文 👍🏽 a\xff"
                               "b"};
        tl_tok_ids x = {0}, y = {0};
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            x.n = y.n = 0;
            CHECK(tl_tokenize(t, texts[k], strlen(texts[k]), 0, &x) > 0);
            CHECK(tl_tokenize(tiny, texts[k], strlen(texts[k]), 0, &y) > 0);
            CHECK(ids_equal(&x, &y));
        }
        tl_tok_ids_free(&x);
        tl_tok_ids_free(&y);
        tl_tokenizer_free(t);
    }
    const char *bad_merges[] = {"a"};
    arr.merges = bad_merges;
    arr.n_merges = 1;
    CHECK(tl_tokenizer_load_arrays(&arr, &t, err, sizeof err) == TL_ERR_FORMAT && t == NULL);
    json_decref(root);
}

int main(void) {
    T_RUN(test_bpe_load_tiny);
    T_RUN(test_bpe_token_str);
    T_RUN(test_bpe_vectors_match_hf);
    T_RUN(test_bpe_invalid_utf8);
    T_RUN(test_bpe_added_tokens);
    T_RUN(test_bpe_detokenize);
    T_RUN(test_bpe_detok_stream);
    T_RUN(test_bpe_roundtrip_nfc);
    T_RUN(test_bpe_long_runs);
    T_RUN(test_bpe_threads);
    T_RUN(test_bpe_load_errors);
    T_RUN(test_bpe_load_arrays_matches_json);
    tl_tokenizer_free(tiny);
    return t_summary();
}
