/* The tokenizer's segment cache (src/tokenizer/bpe_seg.c) on the tiny tokenizer: with the cache
 * on, tl_tokenize gives the ids of the same tokenizer with the cache off (whose encoder
 * test_bpe.c and tests/py/test_tokenizer.py check against HF), on random texts that repeat long
 * segments between added tokens, with both flag settings, from many threads at once, and while
 * a small budget evicts. Segments are 100 bytes or more (the cache takes 64 and up). Run from
 * the repository root. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "t_check.h"
#include "tulip.h"
#include "tokenizer/bpe.h"

#define TINY "tests/data/tiny-tokenizer/tokenizer.json"

static unsigned long long rng = 0xD1B54A32D192ED03ull;

static uint32_t rnd(uint32_t n) { return (uint32_t)(t_rng_next(&rng) >> 11) % n; }

/* The tiny tokenizer; norm_special: <|im_end|> marked normalized, so it is matched inside the
 * text between raw added tokens and TL_TOKENIZE_SPLIT_SPECIAL changes that text's ids. */
static tl_tokenizer *load_tiny(int norm_special, size_t budget) {
    json_error_t je;
    json_t *root = json_load_file(TINY, 0, &je);
    CHECK(root != NULL);
    if (!root) exit(1);
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
        if (norm_special && !strcmp(json_string_value(json_object_get(a, "content")), "<|im_end|>"))
            json_object_set_new(a, "normalized", json_true());
    }
    char *text = json_dumps(root, 0), err[256] = "";
    tl_tokenizer *t = NULL;
    int st = tl_tokenizer_load_json(text, strlen(text), &t, err, sizeof err);
    CHECK_EQ_INT(st, 0);
    if (st) {
        fprintf(stderr, "load: %s\n", err);
        exit(1);
    }
    free(text);
    json_decref(root);
    tl_tokenizer_set_seg_cache(t, budget);
    return t;
}

/* Random text of at least min bytes: words, spaces, newlines, NFC-sensitive and other non-ASCII
 * characters, an invalid byte now and then and, with special, <|im_end|> (a raw added token
 * unless the tokenizer was loaded with norm_special). */
static char *random_segment(size_t min, int special, size_t *len) {
    static const char *const words[] = {"the",
                                        "cat",
                                        " and",
                                        "  ",
                                        "\n",
                                        "\n\n",
                                        "\t",
                                        "123",
                                        "'ll",
                                        "e\xcc\x81",
                                        "\xc3\xa9",
                                        "\xe4\xb8\xad\xe6\x96\x87",
                                        "\xf0\x9f\x91\x8d",
                                        "\xe3\x80\x80",
                                        "<|im_end|>",
                                        "\xff",
                                        "don't",
                                        "x=1;",
                                        "{\"a\": [1]}"};
    size_t cap = min + 64, n = 0;
    char *s = malloc(cap);
    while (n < min) {
        const char *w = words[rnd(sizeof words / sizeof words[0])];
        if (!special && !strcmp(w, "<|im_end|>")) continue;
        size_t wl = strlen(w);
        memcpy(s + n, w, wl);
        n += wl;
        if (rnd(2)) s[n++] = ' ';
    }
    *len = n;
    return s;
}

#define N_SEG 16

typedef struct {
    char *s[N_SEG];
    size_t n[N_SEG];
} seg_pool;

static void pool_make(seg_pool *p) {
    for (int i = 0; i < N_SEG; i++) p->s[i] = random_segment(100 + rnd(1500), 1, &p->n[i]);
}

static void pool_free(seg_pool *p) {
    for (int i = 0; i < N_SEG; i++) free(p->s[i]);
}

/* A text of pool segments and short pieces between raw added tokens, in buf (cap 64 KB). */
static size_t random_text(const seg_pool *p, char *buf) {
    static const char *const added[] = {"<|im_start|>", "<think>", "</think>", "<tool_call>",
                                        "<|endoftext|>"};
    static const char *const shorts[] = {"user\n", "assistant\n", "\n", "", " x "};
    size_t n = 0, parts = 1 + rnd(8);
    for (size_t k = 0; k < parts; k++) {
        const char *s;
        size_t l;
        if (rnd(3)) {
            int i = (int)rnd(N_SEG);
            s = p->s[i], l = p->n[i];
        } else {
            s = shorts[rnd(5)], l = strlen(s);
        }
        memcpy(buf + n, s, l);
        n += l;
        if (rnd(4)) {
            const char *a = added[rnd(5)];
            memcpy(buf + n, a, strlen(a));
            n += strlen(a);
        }
    }
    return n;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (!na || !memcmp(a, b, na * sizeof *a));
}

/* Each text encoded by the cached tokenizer twice (a miss, then mostly hits) after 3 ids already
 * in the output, and once with the cache off. */
static void check_texts(tl_tokenizer *cached, tl_tokenizer *plain, const seg_pool *p, int n_text) {
    char *buf = malloc(1 << 16);
    tl_tok_ids want = {0}, got = {0};
    int n_bad = 0;
    for (int it = 0; it < n_text; it++) {
        size_t n = random_text(p, buf);
        unsigned flags = rnd(2) ? TL_TOKENIZE_SPLIT_SPECIAL : 0;
        want.n = 0;
        int nw = tl_tokenize(plain, buf, n, flags, &want);
        for (int r = 0; r < 2; r++) {
            got.n = 0;
            tl_tokenize(plain, "abc", 3, 0, &got);
            size_t before = got.n;
            int ng = tl_tokenize(cached, buf, n, flags, &got);
            n_bad += ng != nw || !same_ids(got.ids + before, got.n - before, want.ids, want.n);
        }
    }
    CHECK_EQ_INT(n_bad, 0);
    tl_tok_ids_free(&want);
    tl_tok_ids_free(&got);
    free(buf);
}

static void test_seg_cache_matches_uncached(void) {
    for (int norm = 0; norm < 2; norm++) {
        tl_tokenizer *cached = load_tiny(norm, (size_t)64 << 20), *plain = load_tiny(norm, 0);
        seg_pool p;
        pool_make(&p);
        check_texts(cached, plain, &p, 300);
        tl_tok_seg_stats st, off;
        tl_tokenizer_seg_cache_stats(cached, &st);
        tl_tokenizer_seg_cache_stats(plain, &off);
        CHECK(st.hits > 300 && st.entries >= N_SEG && st.bytes <= st.budget && !st.evictions);
        CHECK(off.entries == 0 && off.hits == 0 && off.misses == 0);
        pool_free(&p);
        tl_tokenizer_free(cached);
        tl_tokenizer_free(plain);
    }
}

typedef struct {
    tl_tokenizer *tok;
    char *text[8];
    size_t len[8];
    unsigned flags[8];
    tl_tok_ids want[8];
    int ok;
} thread_job;

static void *encode_thread(void *arg) {
    thread_job *j = arg;
    tl_tok_ids ids = {0};
    j->ok = 1;
    for (int r = 0; r < 40; r++) {
        for (int i = 0; i < 8; i++) {
            ids.n = 0;
            int n = tl_tokenize(j->tok, j->text[i], j->len[i], j->flags[i], &ids);
            if (n < 0 || !same_ids(ids.ids, ids.n, j->want[i].ids, j->want[i].n)) j->ok = 0;
        }
    }
    tl_tok_ids_free(&ids);
    return NULL;
}

/* Four threads encode overlapping texts (shared segments) on one tokenizer: with room for all
 * (hits race with inserts of the same segment) and with 32 KB (evictions race with hits). */
static void test_seg_cache_threads(void) {
    tl_tokenizer *plain = load_tiny(1, 0);
    seg_pool p;
    pool_make(&p);
    thread_job jobs[4];
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 8; i++) {
            jobs[t].text[i] = malloc(1 << 16);
            jobs[t].len[i] = random_text(&p, jobs[t].text[i]);
            jobs[t].flags[i] = rnd(2) ? TL_TOKENIZE_SPLIT_SPECIAL : 0;
            memset(&jobs[t].want[i], 0, sizeof jobs[t].want[i]);
            tl_tokenize(plain, jobs[t].text[i], jobs[t].len[i], jobs[t].flags[i], &jobs[t].want[i]);
        }
    }
    size_t budgets[2] = {(size_t)64 << 20, 32 << 10};
    for (int b = 0; b < 2; b++) {
        tl_tokenizer *cached = load_tiny(1, budgets[b]);
        pthread_t th[4];
        for (int t = 0; t < 4; t++) {
            jobs[t].tok = cached;
            pthread_create(&th[t], NULL, encode_thread, &jobs[t]);
        }
        for (int t = 0; t < 4; t++) {
            pthread_join(th[t], NULL);
            CHECK(jobs[t].ok);
        }
        tl_tok_seg_stats st;
        tl_tokenizer_seg_cache_stats(cached, &st);
        CHECK(st.hits > 0 && st.bytes <= st.budget);
        CHECK(b == 0 ? st.evictions == 0 : st.evictions > 0);
        tl_tokenizer_free(cached);
    }
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 8; i++) {
            free(jobs[t].text[i]);
            tl_tok_ids_free(&jobs[t].want[i]);
        }
    pool_free(&p);
    tl_tokenizer_free(plain);
}

/* Encodes one segment (no added token inside: one lookup) and returns how the stats moved:
 * 1 hit, 0 miss. */
static int encode_one(tl_tokenizer *t, const char *s, size_t n) {
    tl_tok_seg_stats a, b;
    tl_tok_ids ids = {0};
    tl_tokenizer_seg_cache_stats(t, &a);
    CHECK(tl_tokenize(t, s, n, 0, &ids) > 0);
    tl_tokenizer_seg_cache_stats(t, &b);
    tl_tok_ids_free(&ids);
    CHECK_EQ_INT(b.hits + b.misses, a.hits + a.misses + 1);
    return b.hits > a.hits;
}

/* A 64 KB budget: the least recently used segment goes first (a segment read again is kept),
 * the bytes never exceed the budget, and a segment taking more than an eighth of the budget is
 * not cached. */
static void test_seg_cache_evicts_lru(void) {
    tl_tokenizer *t = load_tiny(0, 64 << 10);
    char *seg[256];
    size_t len[256];
    int n = 0, e0 = 0;
    tl_tok_seg_stats st = {0};
    for (int phase = 0; phase < 2; phase++) {
        /* phase 0 fills until seg[0, e0) are evicted; then seg[e0], the oldest left, is read
         * again, so phase 1's evictions take seg[e0 + 1], ... and spare it */
        if (phase) {
            e0 = (int)st.evictions;
            CHECK(encode_one(t, seg[e0], len[e0]));
        }
        uint64_t before = st.evictions;
        while (st.evictions == before && n < 256) {
            seg[n] = random_segment(300 + rnd(300), 0, &len[n]);
            CHECK(!encode_one(t, seg[n], len[n]));
            n++;
            tl_tokenizer_seg_cache_stats(t, &st);
            CHECK(st.bytes <= st.budget);
        }
    }
    CHECK(n > 20 && n < 256 && (int)st.evictions < n / 4);
    CHECK(encode_one(t, seg[e0], len[e0]));
    CHECK(encode_one(t, seg[n - 1], len[n - 1]));
    CHECK(!encode_one(t, seg[e0 + 1], len[e0 + 1]));
    CHECK(!encode_one(t, seg[0], len[0]));
    size_t big_len;
    char *big = random_segment(9 << 10, 0, &big_len);
    CHECK(!encode_one(t, big, big_len));
    CHECK(!encode_one(t, big, big_len));
    tl_tokenizer_set_seg_cache(t, 0);
    tl_tokenizer_seg_cache_stats(t, &st);
    CHECK(st.entries == 0 && st.bytes == 0 && st.budget == 0);
    free(big);
    for (int i = 0; i < n; i++) free(seg[i]);
    tl_tokenizer_free(t);
}

int main(void) {
    T_RUN(test_seg_cache_matches_uncached);
    T_RUN(test_seg_cache_threads);
    T_RUN(test_seg_cache_evicts_lru);
    return t_summary();
}
