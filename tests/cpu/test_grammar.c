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

#define N_CORPUS    (sizeof(g_corpus) / sizeof(g_corpus[0]))
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
            if ((bad < 0 && complete) || !doc_valid(s, d, strlen(d)))
                fprintf(stderr, "schema %zu: policy document %s\n", i, d);
            CHECK(bad >= 0 || !complete);
            CHECK(doc_valid(s, d, strlen(d)));
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    CHECK(n >= 7);
}

static const char *const keys[] = {"a", "b",    "c",    "name", "age", "k", "n",  "p",
                                   "v", "kids", "next", "x",    "y",   "q", "id", "\xc3\xa9\"\\"};
static const char *const strs[] = {"",
                                   "a",
                                   "ab",
                                   "red",
                                   "green",
                                   "x\ny",
                                   "\xe2\x82\xac\t",
                                   "abcde",
                                   "fixed",
                                   "\\/\"",
                                   "\xf0\x9f\x98\x80z"};

static json_t *rand_value(int depth) {
    switch (rnd(depth > 2 ? 6 : 8)) {
    case 0:
        return json_null();
    case 1:
        return json_boolean(rnd(2));
    case 2:
        return json_integer((json_int_t)rnd(2000) - 1000);
    case 3:
        return json_real((double)((int)rnd(20000) - 10000) / 64.0);
    case 4:
    case 5:
        return json_string(strs[rnd(sizeof(strs) / sizeof(strs[0]))]);
    case 6: {
        json_t *a = json_array();
        for (uint32_t i = 0, n = rnd(4); i < n; i++)
            json_array_append_new(a, rand_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (uint32_t i = 0, n = rnd(4); i < n; i++)
            json_object_set_new(o, keys[rnd(sizeof(keys) / sizeof(keys[0]))],
                                rand_value(depth + 1));
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

/* A vocabulary as byte strings, to test against: the tokenizer's (added tokens left out, as
 * tl_grammar_vocab_from_tokenizer does) or a synthetic one. */
typedef struct tvocab {
    int n;
    char **bytes;
    size_t *lens;
    tl_grammar_vocab *v;
} tvocab;

static void tvocab_free(tvocab *t) {
    for (int i = 0; i < t->n; i++) free(t->bytes[i]);
    free(t->bytes);
    free(t->lens);
    tl_grammar_vocab_free(t->v);
}

static void tvocab_alloc(tvocab *t, int n) {
    t->n = n;
    t->bytes = calloc((size_t)n, sizeof(char *));
    t->lens = calloc((size_t)n, sizeof(size_t));
}

static void tvocab_tiny(tvocab *t, tl_tokenizer **tok_out) {
    char err[256];
    tl_tokenizer *tok = NULL;
    CHECK_EQ_INT(
        tl_tokenizer_load("tests/data/tiny-tokenizer/tokenizer.json", &tok, err, sizeof err), 0);
    tvocab_alloc(t, tl_tokenizer_n_vocab(tok));
    for (int i = 0; i < t->n; i++) {
        size_t len;
        const char *b = tl_token_str(tok, i, &len);
        if (!b || tl_token_is_added(tok, i)) continue;
        t->bytes[i] = malloc(len);
        memcpy(t->bytes[i], b, len);
        t->lens[i] = len;
    }
    CHECK_EQ_INT(tl_grammar_vocab_from_tokenizer(tok, &t->v), 0);
    *tok_out = tok;
}

/* All 256 single bytes, then random strings of 2..10 bytes over JSON-heavy bytes, duplicates
 * allowed, and a few holes. */
static void tvocab_synth(tvocab *t, int n) {
    static const char alpha[] =
        "{}[]\":,0123456789.-+eEtruefalsnl\\/abxyz _\xc3\xa9\xe2\x82\xac\xf0\x9f";
    tvocab_alloc(t, n);
    for (int i = 0; i < n; i++) {
        if (i >= 256 && rnd(50) == 0) continue;
        size_t len = i < 256 ? 1 : 2 + rnd(9);
        t->bytes[i] = malloc(len);
        for (size_t k = 0; k < len; k++)
            t->bytes[i][k] = i < 256 ? (char)i : alpha[rnd(sizeof(alpha) - 1)];
        t->lens[i] = len;
    }
    CHECK_EQ_INT(tl_grammar_vocab_new((const char *const *)t->bytes, t->lens, n, &t->v), 0);
}

/* The mask by testing every token from scratch on a clone of st. */
static void brute_mask(const tl_grammar_state *st, const tvocab *t, int32_t end_id, uint32_t *m) {
    memset(m, 0, ((size_t)t->n + 31) / 32 * 4);
    for (int i = 0; i < t->n; i++) {
        if (i == end_id) {
            if (tl_grammar_is_complete(st)) m[i >> 5] |= 1u << (i & 31);
            continue;
        }
        if (!t->bytes[i]) continue;
        tl_grammar_state *c;
        CHECK_EQ_INT(tl_grammar_state_clone(st, &c), 0);
        if (tl_grammar_accept_bytes(c, (const uint8_t *)t->bytes[i], t->lens[i]) == 0)
            m[i >> 5] |= 1u << (i & 31);
        tl_grammar_state_free(c);
    }
}

static int bit(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1; }

/* Picks an allowed token: the end token half the time it is allowed, else with some bias
 * towards tokens that close something, else uniformly. -1 if none is allowed. */
static int pick(const uint32_t *m, const tvocab *t, int32_t end_id) {
    if (end_id >= 0 && bit(m, end_id) && rnd(2)) return end_id;
    int n = 0, nc = 0, ids[t->n], cl[t->n];
    for (int i = 0; i < t->n; i++)
        if (bit(m, i) && i != end_id) {
            ids[n++] = i;
            if (strchr("\"]}", t->bytes[i][t->lens[i] - 1])) cl[nc++] = i;
        }
    if (nc && rnd(3) == 0) return cl[rnd((uint32_t)nc)];
    if (n) return ids[rnd((uint32_t)n)];
    return end_id >= 0 && bit(m, end_id) ? end_id : -1;
}

/* Random walks over one vocabulary: at each step the trie mask must equal the brute-force one
 * (every `check_every` steps); a walk that picks the end token must hold valid JSON. */
static void walks(tvocab *t, int32_t end_id, int n_walks, int check_every, int *n_done,
                  int *n_masks) {
    size_t words = ((size_t)t->n + 31) / 32;
    uint32_t *m = malloc(words * 4), *bm = malloc(words * 4);
    for (size_t i = 0; i < N_CORPUS; i++) {
        json_t *s;
        tl_grammar *g = compile(g_corpus[i].schema, &s);
        for (int w = 0; g && w < n_walks; w++) {
            tl_grammar_state *st;
            CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
            char doc[8192];
            size_t len = 0;
            for (int step = 0; step < 400; step++) {
                CHECK_EQ_INT(tl_grammar_mask(st, t->v, &end_id, 1, m), 0);
                if (step % check_every == 0) {
                    brute_mask(st, t, end_id, bm);
                    CHECK(memcmp(m, bm, words * 4) == 0);
                    ++*n_masks;
                }
                int id = pick(m, t, end_id);
                CHECK(id >=
                      0); /* a live state always has a continuation in a byte-complete vocab */
                if (id < 0) break;
                if (id == end_id) {
                    CHECK(tl_grammar_is_complete(st));
                    if (!doc_valid(s, doc, len))
                        fprintf(stderr, "schema %zu walk: %.*s invalid\n", i, (int)len, doc);
                    CHECK(doc_valid(s, doc, len));
                    ++*n_done;
                    break;
                }
                if (len + t->lens[id] > sizeof(doc)) break;
                CHECK_EQ_INT(
                    tl_grammar_accept_bytes(st, (const uint8_t *)t->bytes[id], t->lens[id]), 0);
                memcpy(doc + len, t->bytes[id], t->lens[id]);
                len += t->lens[id];
            }
            tl_grammar_state_free(st);
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    free(m);
    free(bm);
}

static void test_mask_tiny_tokenizer(void) {
    tvocab t = {0};
    tl_tokenizer *tok;
    tvocab_tiny(&t, &tok);
    int32_t eos = tl_token_id(tok, "<|im_end|>");
    CHECK(eos >= 0);
    int done = 0, masks = 0;
    walks(&t, eos, 20, 1, &done, &masks);
    printf("# tiny tokenizer (%d ids): %d masks checked, %d walks ended in valid JSON\n", t.n,
           masks, done);
    CHECK(done > 20 * (int)N_CORPUS / 2);
    tvocab_free(&t);
    tl_tokenizer_free(tok);
}

static void test_mask_synthetic_vocab(void) {
    tvocab t = {0};
    tvocab_synth(&t, 6000);
    int done = 0, masks = 0;
    walks(&t, 5999, 4, 4, &done, &masks);
    printf("# synthetic vocabulary (6000 ids): %d masks checked, %d walks valid\n", masks, done);
    CHECK(done > 4 * (int)N_CORPUS / 2);
    tvocab_free(&t);
}

static void test_unsupported(void) {
    for (size_t i = 0; i < sizeof(g_unsupported) / sizeof(g_unsupported[0]); i++) {
        json_error_t je;
        json_t *s = json_loads(g_unsupported[i].schema, JSON_DECODE_ANY, &je);
        tl_grammar *g = (tl_grammar *)1;
        char err[256] = "";
        int rc = tl_grammar_from_schema(s, &g, err, sizeof err);
        CHECK_EQ_INT(rc, TL_ERR_UNSUPPORTED);
        CHECK(g == NULL);
        if (!strstr(err, g_unsupported[i].keyword))
            fprintf(stderr, "%s: message \"%s\" lacks %s\n", g_unsupported[i].schema, err,
                    g_unsupported[i].keyword);
        CHECK(strstr(err, g_unsupported[i].keyword) != NULL);
        json_decref(s);
    }
}

static void test_malformed(void) {
    static const char *const bad[] = {"{\"type\":\"strin\"}",
                                      "{\"type\":[]}",
                                      "{\"enum\":[]}",
                                      "{\"type\":\"string\",\"minLength\":-1}",
                                      "[1]",
                                      "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}",
                                      "{\"properties\":{\"a\":false},\"required\":[\"a\"]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *s = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        tl_grammar *g;
        char err[256] = "";
        CHECK_EQ_INT(tl_grammar_from_schema(s, &g, err, sizeof err), TL_ERR_INVALID);
        CHECK(err[0] != 0);
        json_decref(s);
    }
}

/* A clone advances independently; a refused accept_bytes leaves the state as it was. */
static void test_clone_and_atomic(void) {
    tl_grammar *g = compile(g_corpus[15].schema, NULL); /* {name, age} required */
    tl_grammar_state *a, *b;
    CHECK_EQ_INT(tl_grammar_state_new(g, &a), 0);
    const char *p = "{\"name\":\"x\",";
    CHECK_EQ_INT(tl_grammar_accept_bytes(a, (const uint8_t *)p, strlen(p)), 0);
    CHECK_EQ_INT(tl_grammar_state_clone(a, &b), 0);
    CHECK_EQ_INT(tl_grammar_accept_bytes(b, (const uint8_t *)"\"age\":1}", 8), 0);
    CHECK(tl_grammar_is_complete(b));
    CHECK(!tl_grammar_is_complete(a));
    CHECK_EQ_INT(tl_grammar_accept_bytes(a, (const uint8_t *)"\"agx", 4), TL_ERR_INVALID);
    CHECK_EQ_INT(tl_grammar_accept_bytes(a, (const uint8_t *)"\"age\":22}", 9), 0);
    CHECK(tl_grammar_is_complete(a));
    CHECK(!tl_grammar_can_continue(a));
    CHECK_EQ_INT(tl_grammar_accept_byte(a, '}'), TL_ERR_INVALID);
    tl_grammar_state_free(a);
    tl_grammar_state_free(b);
    tl_grammar_free(g);
}

/* Left recursion never loops: a rule that is only itself accepts nothing; with a non-recursive
 * alternative, that alternative is what is accepted. Ambiguous alternatives merge. */
static void test_left_recursion_and_merging(void) {
    tl_grammar *g = compile("{\"$ref\":\"#\"}", NULL);
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    CHECK(!tl_grammar_is_complete(st) && !tl_grammar_can_continue(st));
    tl_grammar_state_free(st);
    tl_grammar_free(g);
    g = compile("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
                "\"$ref\":\"#/$defs/a\"}",
                NULL);
    int complete;
    CHECK_EQ_INT(feed(g, "null", 4, &complete), -1);
    CHECK(complete);
    CHECK_EQ_INT(feed(g, "1", 1, &complete), 0);
    tl_grammar_free(g);
    /* 12 branches that all match any value: each is tracked until the element ends */
    g = compile("{\"type\":\"array\",\"items\":{\"anyOf\":[{},{},{},{},{},{},{},{},{},{},{},{}]}}",
                NULL);
    const char *d = "[[[[1,2],{\"a\":[3]}]]]";
    CHECK_EQ_INT(feed(g, d, strlen(d), &complete), -1);
    CHECK(complete);
    tl_grammar_free(g);
}

int main(void) {
    T_RUN(test_corpus_valid);
    T_RUN(test_corpus_invalid);
    T_RUN(test_corpus_policy);
    T_RUN(test_random_values);
    T_RUN(test_mask_tiny_tokenizer);
    T_RUN(test_mask_synthetic_vocab);
    T_RUN(test_unsupported);
    T_RUN(test_malformed);
    T_RUN(test_clone_and_atomic);
    T_RUN(test_left_recursion_and_merging);
    return t_summary();
}
