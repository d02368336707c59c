/* Tests of the grammar engine (src/grammar): the schema corpus (tests/cpu/grammar_corpus.h)
 * byte by byte, random JSON values against an independent validator (grammar_validate.h), the
 * trie mask against brute force on the tiny tokenizer and a synthetic 6K vocabulary, random
 * walks through the mask that must end in valid JSON, refused keywords, clone and atomicity. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar_corpus.h"
#include "grammar_validate.h"
#include "t_check.h"
#include "tokenizer/bpe.h"

#define N_CORPUS (sizeof(g_corpus) / sizeof(g_corpus[0]))
#define PARSE_FLAGS (JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static tl_grammar *compile(const char *text, json_t **schema_out) {
    json_error_t je;
    json_t *s = json_loads(text, JSON_DECODE_ANY, &je);
    CHECK(s != NULL);
    tl_grammar *g = NULL;
    char err[256];
    int rc = s ? tl_grammar_from_schema(s, &g, err, sizeof err) : -1;
    if (rc) fprintf(stderr, "compile %s: %s\n", text, err);
    CHECK_EQ_INT(rc, 0);
    if (schema_out)
        *schema_out = s;
    else
        json_decref(s);
    return g;
}

/* Feeds doc; returns the index of the first refused byte or -1; *complete at the end. */
static long feed(const tl_grammar *g, const char *doc, size_t n, int *complete) {
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    long bad = -1;
    for (size_t i = 0; i < n && bad < 0; i++)
        if (tl_grammar_accept_byte(st, (uint8_t)doc[i])) bad = (long)i;
    *complete = bad < 0 && tl_grammar_is_complete(st);
    tl_grammar_state_free(st);
    return bad;
}

static int doc_valid(const json_t *schema, const char *doc, size_t n) {
    json_error_t je;
    json_t *x = json_loadb(doc, n, PARSE_FLAGS, &je);
    if (!x) return 0;
    int ok = v_valid(schema, schema, x);
    json_decref(x);
    return ok;
}

static void test_corpus_valid(void) {
    int n = 0;
    for (size_t i = 0; i < N_CORPUS; i++) {
        json_t *s;
        tl_grammar *g = compile(g_corpus[i].schema, &s);
        for (int k = 0; g && g_corpus[i].valid[k]; k++, n++) {
            const char *d = g_corpus[i].valid[k];
            int complete;
            long bad = feed(g, d, strlen(d), &complete);
            if (bad >= 0 || !complete)
                fprintf(stderr, "schema %zu: valid %s refused at %ld\n", i, d, bad);
            CHECK(bad < 0 && complete);
            CHECK(doc_valid(s, d, strlen(d))); /* the test's validator agrees */
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    CHECK(N_CORPUS >= 30);
    printf("# %zu schemas, %d valid documents\n", N_CORPUS, n);
}

static void test_corpus_invalid(void) {
    int n = 0;
    for (size_t i = 0; i < N_CORPUS; i++) {
        json_t *s;
        tl_grammar *g = compile(g_corpus[i].schema, &s);
        for (int k = 0; g && g_corpus[i].invalid[k]; k++, n++) {
            const char *d = g_corpus[i].invalid[k];
            int complete;
            long bad = feed(g, d, strlen(d), &complete);
            if (bad < 0 && complete) fprintf(stderr, "schema %zu: invalid %s accepted\n", i, d);
            CHECK(bad >= 0 || !complete);
            if (doc_valid(s, d, strlen(d))) fprintf(stderr, "validator: %s valid\n", d);
            CHECK(!doc_valid(s, d, strlen(d)));
            if (bad >= 0) { /* every proper prefix before the refused byte is accepted */
                int c2;
                CHECK_EQ_INT(feed(g, d, (size_t)bad, &c2), -1);
            }
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    printf("# %d invalid documents\n", n);
}

/* Documents valid by the specification that the grammar does not produce (whitespace, property
 * order, 1e3 as an integer): the policy is documented; these pin it. */
static void test_corpus_policy(void) {
    int n = 0;
    for (size_t i = 0; i < N_CORPUS; i++) {
        json_t *s;
        tl_grammar *g = compile(g_corpus[i].schema, &s);
        for (int k = 0; g && g_corpus[i].policy[k]; k++, n++) {
            const char *d = g_corpus[i].policy[k];
            int complete;
            long bad = feed(g, d, strlen(d), &complete);
            CHECK(bad >= 0 || !complete);
            CHECK(doc_valid(s, d, strlen(d)));
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    CHECK(n >= 7);
}

static const char *const keys[] = {"a", "b", "c", "name", "age", "k", "n", "p", "v", "kids",
                                   "next", "x", "y", "q", "id", "\xc3\xa9\"\\"};
static const char *const strs[] = {"", "a", "ab", "red", "green", "x\ny", "\xe2\x82\xac\t",
                                   "abcde", "fixed", "\\/\"", "\xf0\x9f\x98\x80z"};

static json_t *rand_value(int depth) {
    switch (rnd(depth > 2 ? 6 : 8)) {
    case 0: return json_null();
    case 1: return json_boolean(rnd(2));
    case 2: return json_integer((json_int_t)rnd(2000) - 1000);
    case 3: return json_real((double)((int)rnd(20000) - 10000) / 64.0);
    case 4:
    case 5: return json_string(strs[rnd(sizeof(strs) / sizeof(strs[0]))]);
    case 6: {
        json_t *a = json_array();
        for (uint32_t i = 0, n = rnd(4); i < n; i++) json_array_append_new(a, rand_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (uint32_t i = 0, n = rnd(4); i < n; i++)
            json_object_set_new(o, keys[rnd(sizeof(keys) / sizeof(keys[0]))], rand_value(depth + 1));
        return o;
    }
    }
}

/* Random values: whatever a grammar accepts validates; the any-value schemas accept all, the
 * json_object grammar exactly the objects. */
static void test_random_values(void) {
    tl_grammar *g[N_CORPUS], *obj;
    json_t *s[N_CORPUS];
    char err[128];
    for (size_t i = 0; i < N_CORPUS; i++) g[i] = compile(g_corpus[i].schema, &s[i]);
    CHECK_EQ_INT(tl_grammar_json_object(&obj, err, sizeof err), 0);
    long accepted = 0;
    for (int it = 0; it < 600; it++) {
        json_t *x = rand_value(0);
        char *d = json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t n = strlen(d);
        int complete;
        for (size_t i = 0; i < N_CORPUS; i++) {
            long bad = feed(g[i], d, n, &complete);
            if (bad < 0 && complete) {
                accepted++;
                if (!doc_valid(s[i], d, n)) fprintf(stderr, "schema %zu accepted %s\n", i, d);
                CHECK(doc_valid(s[i], d, n));
            }
            if (!strcmp(g_corpus[i].schema, "true") || !strcmp(g_corpus[i].schema, "{}"))
                CHECK(bad < 0 && complete);
        }
        long bad = feed(obj, d, n, &complete);
        CHECK_EQ_INT(bad < 0 && complete, json_is_object(x));
        free(d);
        json_decref(x);
    }
    printf("# random values: %ld (value, schema) pairs accepted and validated\n", accepted);
    CHECK(accepted > 1200);
    for (size_t i = 0; i < N_CORPUS; i++) {
        tl_grammar_free(g[i]);
        json_decref(s[i]);
    }
    tl_grammar_free(obj);
}
int main(void) {
    T_RUN(test_corpus_valid);
    T_RUN(test_corpus_invalid);
    T_RUN(test_corpus_policy);
    T_RUN(test_random_values);
    return t_summary();
}
