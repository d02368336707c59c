/* Cost of the constrained-decoding mask on a real vocabulary (issue 16 item 4; not a test, no
 * assertion): for a few schemas, a random walk through the grammar that computes the mask
 * before each token (unbounded, and bounded as the server does under max_tokens), timed per
 * call, reported per position class: "narrow" (< 1000 tokens allowed: numbers, enums, formats,
 * keys, punctuation) and "wide" (free string interiors, any value). Modes: cached (default: one
 * tl_grammar_cache per walk, 8 masks, as src/server/constrain.c keeps per job), oneshot
 * (tl_grammar_mask_within: memoized walk, no cache kept between tokens) and ref (the reference
 * walk, tl_grammar_mask_ref). The walks are the same in every mode (same seed, same masks).
 * Build and run (after make cpu):
 *   cc -O2 -D_GNU_SOURCE -Iinclude -Isrc dev/grammar_mask_bench.c LIBOBJS \
 *      -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lm -pthread -o /tmp/gmb
 * where LIBOBJS are the object files of build/cpu/src except src/cli's.
 *   /tmp/gmb tokenizer.json [cached|oneshot|ref]   (tokenizer.json uncompressed) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "tokenizer/bpe.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":"
    "[\"name\",\"age\",\"tags\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"}}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"kind\":{\"enum\":[\"a\",\"bb\",\"ccc\"]}},"
    "\"required\":[\"when\",\"id\",\"kind\"]}",
    "{}",
};

typedef struct cls {
    int n;
    double sum, worst;
} cls;

static void add(cls *c, double d) {
    c->n++;
    c->sum += d;
    if (d > c->worst) c->worst = d;
}

static int mode;                 /* 0 cached, 1 oneshot, 2 ref */
static uint64_t n_hits, n_walks; /* cached mode: masks from the LRU, masks walked */

static int mask(tl_grammar_cache *c, const tl_grammar_state *st, const tl_grammar_vocab *v,
                const int32_t *end, int bound, uint32_t *m) {
    if (mode == 0) return tl_grammar_mask_cached(c, st, end, 1, bound, m);
    if (mode == 1) return tl_grammar_mask_within(st, v, end, 1, bound, m);
    return tl_grammar_mask_ref(st, v, end, 1, bound, m);
}

/* One walk of up to 200 tokens; per-class timings added to narrow / wide. */
static void walk(tl_tokenizer *tok, tl_grammar *g, const tl_grammar_vocab *v, int32_t end,
                 int bounded, uint32_t *m, cls *narrow, cls *wide, int *steps_out) {
    int n = tl_grammar_vocab_size(v), steps = 0;
    tl_grammar_state *st;
    tl_grammar_cache *c = NULL;
    tl_grammar_state_new(g, &st);
    if (mode == 0) tl_grammar_cache_new(g, v, 8, &c);
    static int ids[1 << 18];
    for (; steps < 200; steps++) {
        double a = now();
        if (mask(c, st, v, &end, bounded ? 400 - steps : -1, m)) break;
        double d = now() - a;
        int k = 0;
        for (int t = 0; t < n; t++)
            if (m[t >> 5] >> (t & 31) & 1) ids[k++] = t;
        add(k < 1000 ? narrow : wide, d);
        if (k == 0) break;
        int t = ids[rand() % k];
        if (t == end) break;
        size_t len;
        const char *b = tl_token_str(tok, t, &len);
        if (tl_grammar_accept_bytes(st, (const uint8_t *)b, len)) break;
    }
    *steps_out = steps;
    if (c) {
        uint64_t h, w, st_n;
        tl_grammar_cache_stats(c, &h, &w, &st_n);
        n_hits += h;
        n_walks += w;
    }
    tl_grammar_cache_free(c);
    tl_grammar_state_free(st);
}

static void print_cls(const char *name, const cls *c) {
    if (c->n)
        printf("  %-6s %4d masks: %9.1f us mean, %9.1f us worst\n", name, c->n, c->sum / c->n * 1e6,
               c->worst * 1e6);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    mode = argc > 2 && !strcmp(argv[2], "oneshot") ? 1
           : argc > 2 && !strcmp(argv[2], "ref")   ? 2
                                                   : 0;
    tl_tokenizer *tok;
    char err[256];
    if (tl_tokenizer_load(argv[1], &tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    double t0 = now();
    tl_grammar_vocab *v;
    if (tl_grammar_vocab_from_tokenizer(tok, &v)) return 1;
    int n = tl_grammar_vocab_size(v);
    printf("vocab %d tokens, trie built in %.1f ms; mode %s\n", n, (now() - t0) * 1e3,
           mode == 0   ? "cached"
           : mode == 1 ? "oneshot"
                       : "ref");
    uint32_t *m = calloc((size_t)(n + 31) / 32, 4);
    int32_t end = tl_token_id(tok, "<|im_end|>");
    srand(16);
    cls all_narrow = {0}, all_wide = {0};
    for (size_t si = 0; si < sizeof schemas / sizeof *schemas; si++) {
        json_t *s = json_loads(schemas[si], 0, NULL);
        tl_grammar *g;
        if (tl_grammar_from_schema(s, &g, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
        for (int bounded = 0; bounded < 2; bounded++) {
            cls narrow = {0}, wide = {0};
            int steps;
            walk(tok, g, v, end, bounded, m, &narrow, &wide, &steps);
            printf("schema %zu %s: %d steps\n", si, bounded ? "bounded (max_tokens)" : "unbounded",
                   steps);
            print_cls("narrow", &narrow);
            print_cls("wide", &wide);
            for (int i = 0; i < 2; i++) {
                cls *to = i ? &all_wide : &all_narrow, *from = i ? &wide : &narrow;
                to->n += from->n;
                to->sum += from->sum;
                if (from->worst > to->worst) to->worst = from->worst;
            }
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    printf("all schemas:\n");
    print_cls("narrow", &all_narrow);
    print_cls("wide", &all_wide);
    if (mode == 0)
        printf("cache: %llu masks from the LRU, %llu walked\n", (unsigned long long)n_hits,
               (unsigned long long)n_walks);
    free(m);
    tl_grammar_vocab_free(v);
    tl_tokenizer_free(tok);
    return 0;
}
