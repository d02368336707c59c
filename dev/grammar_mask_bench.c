/* Cost of the constrained-decoding mask on a real vocabulary (issue 16 item 4; not a test, no
 * assertion): for a few schemas, a random walk through the grammar that computes the mask
 * (tl_grammar_mask, and tl_grammar_mask_within as the server does under max_tokens) before each
 * token, timed per call. Build and run (after make cpu):
 *   cc -O2 -D_GNU_SOURCE -Iinclude -Isrc dev/grammar_mask_bench.c LIBOBJS \
 *      -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lm -pthread -o /tmp/gmb
 * where LIBOBJS are the object files of build/cpu/src except src/cli's.
 *   /tmp/gmb tokenizer.json */
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

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    tl_tokenizer *tok;
    char err[256];
    if (tl_tokenizer_load(argv[1], &tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    double t0 = now();
    tl_grammar_vocab *v;
    if (tl_grammar_vocab_from_tokenizer(tok, &v)) return 1;
    int n = tl_grammar_vocab_size(v);
    printf("vocab %d tokens, trie built in %.1f ms\n", n, (now() - t0) * 1e3);
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4);
    int32_t end = tl_token_id(tok, "<|im_end|>");
    srand(16);
    for (size_t si = 0; si < sizeof schemas / sizeof *schemas; si++) {
        json_t *s = json_loads(schemas[si], 0, NULL);
        tl_grammar *g;
        if (tl_grammar_from_schema(s, &g, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
        for (int bounded = 0; bounded < 2; bounded++) {
            tl_grammar_state *st;
            tl_grammar_state_new(g, &st);
            double tm = 0, worst = 0;
            int steps = 0, allowed = 0;
            for (; steps < 200; steps++) {
                double a = now();
                tl_grammar_mask_within(st, v, &end, 1, bounded ? 400 - steps : -1, mask);
                double d = now() - a;
                tm += d, worst = d > worst ? d : worst;
                int ids[4096], k = 0;
                for (int t = 0; t < n && k < 4096; t++)
                    if (mask[t >> 5] >> (t & 31) & 1) ids[k++] = t;
                allowed += k;
                if (k == 0) break;
                int t = ids[rand() % k];
                if (t == end) break;
                size_t len;
                const char *b = tl_token_str(tok, t, &len);
                if (tl_grammar_accept_bytes(st, (const uint8_t *)b, len)) break;
            }
            printf("schema %zu %s: %d steps, mask %.0f us/token mean, %.0f us worst, %.0f "
                   "allowed tokens mean (capped at 4096)\n",
                   si, bounded ? "bounded (max_tokens)" : "unbounded", steps, tm / steps * 1e6,
                   worst * 1e6, (double)allowed / steps);
            tl_grammar_state_free(st);
        }
        tl_grammar_free(g);
        json_decref(s);
    }
    free(mask);
    tl_grammar_vocab_free(v);
    tl_tokenizer_free(tok);
    return 0;
}
