/* The fast mask (src/grammar/cache.c) against the reference walk (tl_grammar_mask_ref): over
 * random grammars (random schemas of the supported subset, the corpus of grammar_corpus.h, any
 * JSON object, regexes, choices, tool calls) and random valid prefixes produced by walking the
 * grammar through its own mask, the cached mask (kept across the walk, as the server does), and
 * the one-shot tl_grammar_mask_within must equal the reference bit for bit, unbounded and under
 * random distance bounds around the state's distance. Vocabularies: the tiny tokenizer, a
 * synthetic JSON-heavy one, one that overflows the cache's state table, and the real Qwen3
 * vocabulary (151,669 tokens) when ../shared/data holds it (TL_SHARED_DIR overrides ../shared;
 * a note says when it is absent). Every sampled token must also be accepted by the matcher. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar_corpus.h"
#include "t_check.h"
#include "tokenizer/bpe.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW_BUILD 1 /* ASan: the reference walk on the real vocabulary is ~10x slower */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW_BUILD 1
#endif
#endif
#ifndef SLOW_BUILD
#define SLOW_BUILD 0
#endif

#define N_CORPUS (sizeof(g_corpus) / sizeof(g_corpus[0]))

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* ====== Random schemas of the supported subset. ====== */

static const char *const keys[] = {"a", "name", "id", "x_y", "tags", "\xc3\xa9t\xc3\xa9", "k"};
static const char *const formats[] = {"date", "time", "date-time", "uuid", "email"};

static json_t *rand_schema(int depth);

static json_t *rand_object(int depth) {
    json_t *o = json_pack("{s:s}", "type", "object"), *props = json_object(), *req = json_array();
    int n = 1 + (int)rnd(3);
    for (int i = 0; i < n; i++) {
        const char *k = keys[rnd(sizeof keys / sizeof *keys)];
        if (json_object_get(props, k)) continue;
        json_object_set_new(props, k, rand_schema(depth + 1));
        if (rnd(2)) json_array_append_new(req, json_string(k));
    }
    json_object_set_new(o, "properties", props);
    json_object_set_new(o, "required", req);
    if (rnd(3) == 0) json_object_set_new(o, "additionalProperties", json_false());
    return o;
}

static json_t *rand_array(int depth) {
    json_t *a = json_pack("{s:s,s:o}", "type", "array", "items", rand_schema(depth + 1));
    if (rnd(2)) json_object_set_new(a, "minItems", json_integer(rnd(2)));
    if (rnd(2)) json_object_set_new(a, "maxItems", json_integer(2 + rnd(3)));
    return a;
}

static json_t *rand_leaf(void) {
    switch (rnd(10)) {
    case 0:
        return json_pack("{s:s}", "type", "integer");
    case 1:
        return json_pack("{s:s}", "type", "number");
    case 2:
        return json_pack("{s:s}", "type", "boolean");
    case 3:
        return json_pack("{s:[s,s]}", "type", "string", "null");
    case 4:
        return json_pack("{s:s,s:s}", "type", "string", "format", formats[rnd(5)]);
    case 5:
        return json_pack("{s:[s,s,i,n]}", "enum", "red", "gr\"een", 42);
    case 6:
        return json_pack("{s:s}", "const", "fixed\\value");
    case 7:
        return json_pack("{s:s,s:i}", "type", "string", "maxLength", 1 + rnd(6));
    case 8:
        return json_pack("{s:s,s:i}", "type", "string", "minLength", 2);
    default:
        return json_pack("{s:s}", "type", "string");
    }
}

static json_t *rand_schema(int depth) {
    uint32_t r = rnd(depth >= 3 ? 10 : 16);
    if (r < 10) return rand_leaf();
    if (r < 12) return rand_object(depth);
    if (r < 14) return rand_array(depth);
    if (r == 14)
        return json_pack("{s:[o,o]}", "anyOf", rand_schema(depth + 1), rand_schema(depth + 1));
    return json_object(); /* any value */
}

/* Grammar number i of the test set: random schemas, then the corpus, then the other kinds. */
static const char *const regexes[] = {"[a-z]+@[a-z]+\\.com", "\\d{3}-\\d{4}", "(ab|c\"d)*e?",
                                      ".{0,12}x", "\\w+( \\w+)*"};
#define N_RANDOM   40
#define N_GRAMMARS (N_RANDOM + N_CORPUS + 1 + 5 + 2)

static tl_grammar *grammar_at(size_t i, char *name, size_t nlen) {
    tl_grammar *g = NULL;
    char err[256] = "";
    int rc;
    if (i < N_RANDOM) {
        json_t *s = rand_schema(0);
        char *t = json_dumps(s, JSON_COMPACT);
        snprintf(name, nlen, "random schema %s", t);
        free(t);
        rc = tl_grammar_from_schema(s, &g, err, sizeof err);
        json_decref(s);
    } else if ((i -= N_RANDOM) < N_CORPUS) {
        snprintf(name, nlen, "corpus schema %s", g_corpus[i].schema);
        json_t *s = json_loads(g_corpus[i].schema, JSON_DECODE_ANY, NULL);
        rc = s ? tl_grammar_from_schema(s, &g, err, sizeof err) : -1;
        json_decref(s);
    } else if ((i -= N_CORPUS) == 0) {
        snprintf(name, nlen, "json_object");
        rc = tl_grammar_json_object(&g, err, sizeof err);
    } else if (i <= 5) {
        snprintf(name, nlen, "regex %s", regexes[i - 1]);
        tl_grammar_spec sp = {.kind = TL_GRAMMAR_REGEX, .regex = regexes[i - 1], .prefix = "\n\n"};
        rc = tl_grammar_compile(&sp, &g, err, sizeof err);
    } else if (i == 6) {
        snprintf(name, nlen, "choice");
        json_t *ch = json_pack("[s,s,s,s]", "yes", "no", "maybe \"so\"", "y\xc3\xa9s");
        tl_grammar_spec sp = {.kind = TL_GRAMMAR_CHOICE, .choices = ch};
        rc = tl_grammar_compile(&sp, &g, err, sizeof err);
        json_decref(ch);
    } else {
        snprintf(name, nlen, "tool calls");
        json_t *tools = json_loads(
            "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
            "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{"
            "\"type\":\"integer\"},\"opts\":{\"type\":\"object\"}},\"required\":[\"city\"]}}},"
            "{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{}}}]",
            0, NULL);
        tl_grammar_spec sp = {.kind = TL_GRAMMAR_TOOL_CALLS, .tools = tools, .parallel = 1};
        rc = tl_grammar_compile(&sp, &g, err, sizeof err);
        json_decref(tools);
    }
    if (rc) fprintf(stderr, "%s: %s\n", name, err);
    CHECK_EQ_INT(rc, 0);
    return g;
}

/* ====== Vocabularies. ====== */

typedef struct vset {
    int n;
    char **bytes;
    size_t *lens;
    tl_grammar_vocab *v;
    int32_t end; /* an end id (-1: none) */
} vset;

static void vset_alloc(vset *t, int n) {
    t->n = n;
    t->bytes = calloc((size_t)n, sizeof(char *));
    t->lens = calloc((size_t)n, sizeof(size_t));
    t->end = -1;
}

static void vset_free(vset *t) {
    for (int i = 0; i < t->n; i++) free(t->bytes[i]);
    free(t->bytes);
    free(t->lens);
    tl_grammar_vocab_free(t->v);
}

static void vset_set(vset *t, int i, const char *b, size_t len) {
    t->bytes[i] = malloc(len);
    memcpy(t->bytes[i], b, len);
    t->lens[i] = len;
}

static void vset_from_tokenizer(vset *t, const tl_tokenizer *tok) {
    vset_alloc(t, tl_tokenizer_n_vocab(tok));
    for (int i = 0; i < t->n; i++) {
        size_t len;
        const char *b = tl_token_str(tok, i, &len);
        if (b && len && !tl_token_is_added(tok, i)) vset_set(t, i, b, len);
    }
    CHECK_EQ_INT(tl_grammar_vocab_from_tokenizer(tok, &t->v), 0);
    t->end = tl_token_id(tok, "<|im_end|>");
    CHECK(t->end >= 0);
}

/* All 256 single bytes, then random strings of 2..10 bytes over JSON-heavy bytes and UTF-8
 * pieces (whole and cut), some holes, the last id the end token. */
static void vset_synth(vset *t, int n) {
    static const char alpha[] = "{}[]\":,0123456789.-+eEtruefalsnl\\/abxyz _<>@"
                                "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    vset_alloc(t, n);
    for (int i = 0; i < n - 1; i++) {
        if (i >= 256 && rnd(50) == 0) continue;
        char b[10];
        size_t len = i < 256 ? 1 : 2 + rnd(9);
        for (size_t k = 0; k < len; k++) b[k] = i < 256 ? (char)i : alpha[rnd(sizeof alpha - 1)];
        vset_set(t, i, b, len);
    }
    t->end = n - 1;
    CHECK_EQ_INT(tl_grammar_vocab_new((const char *const *)t->bytes, t->lens, n, &t->v), 0);
}

static int bit(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1; }

/* ====== The comparison. ====== */

typedef struct tally {
    long masks, bounded, nonempty_bounded, oneshot, steps, walks_done;
} tally;

static int first_diff(const uint32_t *a, const uint32_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (bit(a, i) != bit(b, i)) return i;
    return -1;
}

/* The bound of one check: none, near the state's distance (often cutting tokens), or small. */
static int rand_bound(const tl_grammar_state *st) {
    int d = tl_grammar_distance(st);
    switch (rnd(4)) {
    case 0:
    case 1:
        return -1;
    case 2:
        return d >= (1 << 29) ? (int)rnd(40) : d + (int)rnd(6) - 2;
    default:
        return (int)rnd(30);
    }
}

/* Compares the cached (and sometimes the one-shot) mask with the reference at st. */
static void compare_at(const vset *t, tl_grammar_cache *c, const tl_grammar_state *st, int bound,
                       uint32_t *ref, uint32_t *fast, const char *name, tally *ty) {
    size_t words = ((size_t)t->n + 31) / 32;
    CHECK_EQ_INT(tl_grammar_mask_ref(st, t->v, &t->end, t->end >= 0, bound, ref), 0);
    CHECK_EQ_INT(tl_grammar_mask_cached(c, st, &t->end, t->end >= 0, bound, fast), 0);
    int d = first_diff(ref, fast, t->n);
    if (d >= 0)
        fprintf(stderr, "%s, bound %d: token %d: reference %d, cached %d\n", name, bound, d,
                bit(ref, d), bit(fast, d));
    CHECK(d < 0);
    ty->masks++;
    if (bound >= 0) {
        ty->bounded++;
        for (size_t w = 0; w < words; w++)
            if (ref[w]) {
                ty->nonempty_bounded++;
                break;
            }
    }
    if (rnd(4) == 0) {
        CHECK_EQ_INT(tl_grammar_mask_within(st, t->v, &t->end, t->end >= 0, bound, fast), 0);
        CHECK(memcmp(ref, fast, words * 4) == 0);
        ty->oneshot++;
    }
}

/* Picks an allowed token of m: the end token half the time it is allowed, else sometimes one
 * that closes something or opens a string, else uniformly. -1 if none. */
static int pick(const uint32_t *m, const vset *t) {
    if (t->end >= 0 && bit(m, t->end) && rnd(2)) return t->end;
    int n = 0, nc = 0, *ids = malloc((size_t)t->n * sizeof(int)), *cl = malloc(64 * sizeof(int));
    for (int i = 0; i < t->n; i++)
        if (bit(m, i) && i != t->end && t->bytes[i]) {
            ids[n++] = i;
            if (nc < 64 && strchr("\"]}>", t->bytes[i][t->lens[i] - 1])) cl[nc++] = i;
        }
    int r = nc && rnd(3) == 0               ? cl[rnd((uint32_t)nc)]
            : n                             ? ids[rnd((uint32_t)n)]
            : t->end >= 0 && bit(m, t->end) ? t->end
                                            : -1;
    free(ids);
    free(cl);
    return r;
}

/* One random walk of up to max_steps tokens through g's mask (the cached one, unbounded),
 * comparing with the reference every check_every steps. */
static void walk_one(const vset *t, const tl_grammar *g, tl_grammar_cache *c, int max_steps,
                     int check_every, const char *name, tally *ty) {
    size_t words = ((size_t)t->n + 31) / 32;
    uint32_t *ref = malloc(words * 4), *fast = malloc(words * 4);
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    for (int step = 0; step < max_steps; step++) {
        if (step % check_every == 0) compare_at(t, c, st, rand_bound(st), ref, fast, name, ty);
        CHECK_EQ_INT(tl_grammar_mask_cached(c, st, &t->end, t->end >= 0, -1, fast), 0);
        int id = pick(fast, t);
        if (id < 0 || id == t->end) {
            if (id == t->end) {
                CHECK(tl_grammar_is_complete(st));
                ty->walks_done++;
            }
            break;
        }
        CHECK_EQ_INT(tl_grammar_accept_bytes(st, (const uint8_t *)t->bytes[id], t->lens[id]), 0);
        ty->steps++;
    }
    tl_grammar_state_free(st);
    free(ref);
    free(fast);
}

/* Every grammar of the set, n_walks walks each, a cache per grammar kept across its walks with
 * 0, 1 or 4 masks (each path of tl_grammar_mask_cached). */
static void walk_all(const vset *t, int n_walks, int max_steps, int check_every, tally *ty) {
    for (size_t i = 0; i < N_GRAMMARS; i++) {
        char name[600];
        tl_grammar *g = grammar_at(i, name, sizeof name);
        if (!g) continue;
        tl_grammar_cache *c;
        static const int n_masks[3] = {0, 1, 4};
        CHECK_EQ_INT(tl_grammar_cache_new(g, t->v, n_masks[i % 3], &c), 0);
        for (int w = 0; w < n_walks; w++) walk_one(t, g, c, max_steps, check_every, name, ty);
        tl_grammar_cache_free(c);
        tl_grammar_free(g);
    }
}

static void report(const char *what, const tally *ty) {
    printf("# %s: %ld masks compared (%ld bounded, %ld of them non-empty; %ld one-shot), %ld "
           "tokens walked, %ld walks ended complete\n",
           what, ty->masks, ty->bounded, ty->nonempty_bounded, ty->oneshot, ty->steps,
           ty->walks_done);
}

static void test_tiny_tokenizer(void) {
    char err[256];
    tl_tokenizer *tok = NULL;
    CHECK_EQ_INT(
        tl_tokenizer_load("tests/data/tiny-tokenizer/tokenizer.json", &tok, err, sizeof err), 0);
    if (!tok) return;
    vset t;
    vset_from_tokenizer(&t, tok);
    tally ty = {0};
    walk_all(&t, 6, 120, 1, &ty);
    report("tiny tokenizer", &ty);
    CHECK(ty.masks > 5000 && ty.nonempty_bounded > 500 && ty.walks_done > 100);
    vset_free(&t);
    tl_tokenizer_free(tok);
}

static void test_synthetic_vocab(void) {
    vset t;
    vset_synth(&t, 6000);
    tally ty = {0};
    walk_all(&t, 2, 80, 2, &ty);
    report("synthetic vocabulary (6000 ids)", &ty);
    CHECK(ty.masks > 1000 && ty.nonempty_bounded > 100 && ty.walks_done > 20);
    vset_free(&t);
}

/* A choice of 2000 random 12-letter strings over 8 letters with every 1-4 letter token: the
 * first masks reach more states than a cache interns (2048), so the walk runs past a full
 * table and the next call empties it. */
static void test_state_overflow(void) {
    int n = 8 + 64 + 512 + 4096;
    vset t;
    vset_alloc(&t, n);
    int k = 0;
    for (int len = 1; len <= 4; len++)
        for (int x = 0; x < 1 << (3 * len); x++) {
            char b[4];
            for (int j = 0; j < len; j++) b[j] = (char)('a' + ((x >> (3 * j)) & 7));
            vset_set(&t, k++, b, (size_t)len);
        }
    CHECK_EQ_INT(tl_grammar_vocab_new((const char *const *)t.bytes, t.lens, n, &t.v), 0);
    json_t *ch = json_array();
    for (int i = 0; i < 2000; i++) {
        char s[13];
        for (int j = 0; j < 12; j++) s[j] = (char)('a' + rnd(8));
        s[12] = 0;
        json_array_append_new(ch, json_string(s));
    }
    tl_grammar_spec sp = {.kind = TL_GRAMMAR_CHOICE, .choices = ch};
    tl_grammar *g = NULL;
    char err[256];
    CHECK_EQ_INT(tl_grammar_compile(&sp, &g, err, sizeof err), 0);
    json_decref(ch);
    tl_grammar_cache *c;
    CHECK_EQ_INT(tl_grammar_cache_new(g, t.v, 4, &c), 0);
    tally ty = {0};
    for (int w = 0; w < 6; w++) walk_one(&t, g, c, 8, 1, "choice of 2000", &ty);
    uint64_t hits, walks, states;
    tl_grammar_cache_stats(c, &hits, &walks, &states);
    printf("# state overflow: %ld masks compared, %llu states interned\n", ty.masks,
           (unsigned long long)states);
    CHECK(states > 2048 && ty.masks >= 18);
    tl_grammar_cache_free(c);
    tl_grammar_free(g);
    vset_free(&t);
}

/* ====== The real vocabulary. ====== */

static char *gunzip(const char *path, size_t *len) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 24, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    if (pclose(f) != 0 || !buf || n == 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The schemas of dev/grammar_mask_bench.c plus the any-value one and a tool call: string
 * interiors (the costly masks), numbers, enums, formats, keys. */
static void test_real_vocab(void) {
    const char *dir = getenv("TL_SHARED_DIR") ? getenv("TL_SHARED_DIR") : "../shared";
    char path[1024];
    snprintf(path, sizeof path, "%s/data/qwen3-tokenizer.json.gz", dir);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        printf("# NOTE: %s is absent: the real-vocabulary comparison did not run\n", path);
        return;
    }
    fclose(probe);
    size_t len = 0;
    char *json = gunzip(path, &len), err[256];
    CHECK(json != NULL);
    tl_tokenizer *tok = NULL;
    if (json) CHECK_EQ_INT(tl_tokenizer_load_json(json, len, &tok, err, sizeof err), 0);
    free(json);
    if (!tok) return;
    vset t;
    vset_from_tokenizer(&t, tok);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
        "\"required\":[\"name\",\"age\",\"tags\"]}",
        "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":"
        "\"date-time\"},\"kind\":{\"enum\":[\"a\",\"bb\"]},\"x\":{\"type\":\"number\"}}}",
        "{}",
    };
    int per = SLOW_BUILD ? 2 : 10; /* reference masks per walk: ~0.1 s each (~1 s with ASan) */
    tally ty = {0};
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        json_t *s = json_loads(schemas[i], 0, NULL);
        tl_grammar *g = NULL;
        CHECK_EQ_INT(tl_grammar_from_schema(s, &g, err, sizeof err), 0);
        json_decref(s);
        tl_grammar_cache *c;
        CHECK_EQ_INT(tl_grammar_cache_new(g, t.v, 4, &c), 0);
        for (int w = 0; w < 3; w++) walk_one(&t, g, c, per * 2, 2, schemas[i], &ty);
        tl_grammar_cache_free(c);
        tl_grammar_free(g);
    }
    report("real Qwen3 vocabulary", &ty);
    CHECK(ty.masks >= 9);
    vset_free(&t);
    tl_tokenizer_free(tok);
}

int main(void) {
    T_RUN(test_tiny_tokenizer);
    T_RUN(test_synthetic_vocab);
    T_RUN(test_state_overflow);
    T_RUN(test_real_vocab);
    return t_summary();
}
