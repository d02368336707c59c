/* Tests of the regex subset compiler (src/grammar/regex.c) and the distance to completion
 * (src/grammar/dist.c). Regex: random patterns of the documented subset are built together with
 * their POSIX ERE equivalent; random strings, strings walked through the grammar and their
 * mutations must be accepted by the grammar matcher exactly when glibc's regexec (anchored as
 * ^(...)$, C locale, ASCII strings) matches them. Distance: tl_grammar_distance from random
 * states equals a breadth-first search over all 256 bytes on small grammars. `pattern` (JSON
 * Schema strings, search semantics): json.dumps-style serializations (jansson) of random values
 * are accepted exactly when POSIX finds a match in the value, and every string walked through the
 * grammar decodes (jansson) to a value that POSIX finds a match in. */
#include <jansson.h>
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"
#include "t_check.h"

static uint64_t rng = 0xD1B54A32D192ED03ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* ---- random patterns: the tulip form (t) and the POSIX ERE form (p) built side by side ---- */

typedef struct pat {
    char t[1024], p[2048];
    size_t nt, np;
} pat;

static void put(pat *x, const char *t, const char *p) {
    size_t a = strlen(t), b = strlen(p);
    if (x->nt + a < sizeof x->t) memcpy(x->t + x->nt, t, a + 1), x->nt += a;
    if (x->np + b < sizeof x->p) memcpy(x->p + x->np, p, b + 1), x->np += b;
}

/* The alphabet of the random strings: letters, digits, punctuation, space and control bytes. */
static const char alpha[] = "abcAZ019_.-+* \t\n\r(|";

/* One atom that never matches the empty string. In POSIX, punctuation goes in brackets and \n,
 * \t are the bytes themselves inside brackets; '.' is [^\n] (POSIX '.' also matches \n). */
static int gen_atom(pat *x, int depth);
static void gen_alt(pat *x, int depth, int *nullable);

static void gen_class(pat *x) {
    static const struct {
        const char *t, *p;
    } m[] = {{"a", "a"},     {"b-d", "b-d"},        {"0-3", "0-3"},         {"_", "_"},
             {"\\.", "."},   {"\\-", "-"},          {"\\n", "\n"},          {"\\t", "\t"},
             {"\\d", "0-9"}, {"\\w", "_0-9A-Za-z"}, {"\\s", "\t\n\v\f\r "}, {"Z", "Z"},
             {"\\*", "*"},   {"\\(", "("},          {"\\|", "|"},           {" ", " "}};
    int neg = rnd(3) == 0, n = 1 + (int)rnd(3);
    char pb[256] = "[";
    put(x, neg ? "[^" : "[", "");
    if (neg) strcat(pb, "^");
    /* POSIX: a literal '-' must come last, so it is added after the others */
    int dash = 0;
    for (int i = 0; i < n; i++) {
        int k = (int)rnd(sizeof m / sizeof m[0]);
        put(x, m[k].t, "");
        if (!strcmp(m[k].p, "-"))
            dash = 1;
        else
            strcat(pb, m[k].p);
    }
    if (dash) strcat(pb, "-");
    strcat(pb, "]");
    put(x, "]", pb);
}

/* Returns 1 when the atom (a group) can match the empty string. */
static int gen_atom(pat *x, int depth) {
    static const struct {
        const char *t, *p;
    } lit[] = {{"a", "a"},
               {"b", "b"},
               {"c", "c"},
               {"Z", "Z"},
               {"0", "0"},
               {"9", "9"},
               {"_", "_"},
               {" ", " "},
               {"\\.", "[.]"},
               {"\\+", "[+]"},
               {"\\*", "[*]"},
               {"\\(", "[(]"},
               {"\\|", "[|]"},
               {"-", "-"},
               {"\\n", "[\n]"},
               {"\\t", "[\t]"},
               {".", "[^\n]"},
               {"\\d", "[0-9]"},
               {"\\D", "[^0-9]"},
               {"\\w", "[_0-9A-Za-z]"},
               {"\\W", "[^_0-9A-Za-z]"},
               {"\\s", "[\t\n\v\f\r ]"},
               {"\\S", "[^\t\n\v\f\r ]"}};
    uint32_t k = rnd(10);
    if (k < 2 && depth < 3) {
        int nullable;
        put(x, rnd(2) ? "(" : "(?:", "(");
        gen_alt(x, depth + 1, &nullable);
        put(x, ")", ")");
        return nullable;
    } else if (k < 4) {
        gen_class(x);
    } else {
        int i = (int)rnd(sizeof lit / sizeof lit[0]);
        put(x, lit[i].t, lit[i].p);
    }
    return 0;
}

/* A quantified atom; *nullable when it can match the empty string. The tulip subset refuses a
 * quantifier on a nullable expression, so a group that may be nullable is never quantified. */
static void gen_piece(pat *x, int depth, int *nullable) {
    *nullable = gen_atom(x, depth);
    if (*nullable) return;
    uint32_t q = rnd(9);
    char tb[32], pb[32];
    const char *lazy = rnd(4) == 0 ? "?" : "";
    if (q == 0) {
        snprintf(tb, sizeof tb, "*%s", lazy), put(x, tb, "*"), *nullable = 1;
    } else if (q == 1) {
        snprintf(tb, sizeof tb, "+%s", lazy), put(x, tb, "+");
    } else if (q == 2) {
        snprintf(tb, sizeof tb, "?%s", lazy), put(x, tb, "?"), *nullable = 1;
    } else if (q == 3) {
        int m = (int)rnd(3), n = m + (int)rnd(3);
        snprintf(tb, sizeof tb, "{%d,%d}%s", m, n, lazy);
        snprintf(pb, sizeof pb, "{%d,%d}", m, n);
        put(x, tb, pb), *nullable = m == 0;
    } else if (q == 4) {
        int m = 1 + (int)rnd(3);
        snprintf(tb, sizeof tb, "{%d}", m);
        put(x, tb, tb);
    } else if (q == 5) {
        int m = (int)rnd(3);
        snprintf(tb, sizeof tb, "{%d,}", m);
        put(x, tb, tb), *nullable = m == 0;
    }
}

static void gen_concat(pat *x, int depth, int *nullable) {
    int n = 1 + (int)rnd(4);
    *nullable = 1;
    for (int i = 0; i < n; i++) {
        int nl;
        gen_piece(x, depth, &nl);
        if (!nl) *nullable = 0;
    }
}

static void gen_alt(pat *x, int depth, int *nullable) {
    int n = rnd(3) == 0 ? 2 + (int)rnd(2) : 1;
    *nullable = 0;
    for (int i = 0; i < n; i++) {
        if (i) put(x, "|", "|");
        int nl;
        gen_concat(x, depth, &nl);
        if (nl) *nullable = 1;
    }
}

static tl_grammar *compile_regex(const char *re) {
    tl_grammar_spec sp = {.kind = TL_GRAMMAR_REGEX, .regex = re};
    tl_grammar *g = NULL;
    char err[256];
    int rc = tl_grammar_compile(&sp, &g, err, sizeof err);
    if (rc) fprintf(stderr, "regex %s: %s\n", re, err);
    CHECK_EQ_INT(rc, 0);
    return g;
}

/* 1 when the grammar accepts s[0..n) as a whole document. */
static int g_match(const tl_grammar *g, const char *s, size_t n) {
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    int ok = tl_grammar_accept_bytes(st, (const uint8_t *)s, n) == 0 && tl_grammar_is_complete(st);
    tl_grammar_state_free(st);
    return ok;
}

/* A string walked through g: random accepted bytes of the alphabet, stopping (when complete) at
 * random; length 0 when no complete string came out within 40 bytes. */
static size_t g_walk(const tl_grammar *g, char *out) {
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    size_t n = 0;
    for (; n < 40; n++) {
        if (tl_grammar_is_complete(st) && rnd(4) == 0) break;
        char ok[sizeof alpha];
        int k = 0;
        for (size_t i = 0; i + 1 < sizeof alpha; i++) {
            tl_grammar_state *c;
            CHECK_EQ_INT(tl_grammar_state_clone(st, &c), 0);
            if (!tl_grammar_accept_byte(c, (uint8_t)alpha[i])) ok[k++] = alpha[i];
            tl_grammar_state_free(c);
        }
        if (!k) break;
        out[n] = ok[rnd((uint32_t)k)];
        tl_grammar_accept_byte(st, (uint8_t)out[n]);
    }
    int done = tl_grammar_is_complete(st);
    tl_grammar_state_free(st);
    return done ? n : 0;
}

static int n_cmp, n_match;

static void compare(const tl_grammar *g, const regex_t *re, const pat *x, const char *s, size_t n) {
    char buf[64];
    memcpy(buf, s, n);
    buf[n] = 0;
    int want = regexec(re, buf, 0, NULL, 0) == 0, got = g_match(g, s, n);
    n_cmp++;
    n_match += want;
    if (want != got) {
        fprintf(stderr, "regex /%s/ (POSIX /%s/) on \"", x->t, x->p);
        for (size_t i = 0; i < n; i++) fprintf(stderr, (uint8_t)s[i] < 32 ? "\\x%02x" : "%c", s[i]);
        fprintf(stderr, "\": regexec %d, grammar %d\n", want, got);
    }
    CHECK_EQ_INT(got, want);
}

static void test_regex_vs_posix(void) {
    int n_pat = 0;
    for (int it = 0; it < 600; it++) {
        pat x = {{0}, {0}, 0, 0};
        int nullable;
        gen_alt(&x, 0, &nullable);
        if (x.nt + 1 >= sizeof x.t || x.np + 1 >= sizeof x.p) continue;
        /* a nullable group is left unquantified: every generated pattern is in the subset */
        tl_grammar *g = compile_regex(x.t);
        char anch[2100];
        snprintf(anch, sizeof anch, "^(%s)$", x.p);
        regex_t re;
        int prc = regcomp(&re, anch, REG_EXTENDED | REG_NOSUB);
        if (prc) fprintf(stderr, "regcomp %s failed\n", anch);
        CHECK_EQ_INT(prc, 0);
        if (!g || prc) {
            tl_grammar_free(g);
            if (!prc) regfree(&re);
            continue;
        }
        n_pat++;
        char s[48];
        for (int k = 0; k < 30; k++) { /* random strings */
            size_t n = rnd(9);
            for (size_t i = 0; i < n; i++) s[i] = alpha[rnd(sizeof alpha - 1)];
            compare(g, &re, &x, s, n);
        }
        for (int k = 0; k < 10; k++) { /* walked strings and their one-byte mutations */
            size_t n = g_walk(g, s);
            compare(g, &re, &x, s, n);
            if (n) {
                s[rnd((uint32_t)n)] = alpha[rnd(sizeof alpha - 1)];
                compare(g, &re, &x, s, n);
                compare(g, &re, &x, s, n - 1);
            }
        }
        regfree(&re);
        tl_grammar_free(g);
    }
    fprintf(stderr, "regex: %d patterns, %d comparisons, %d POSIX matches\n", n_pat, n_cmp,
            n_match);
    CHECK(n_pat >= 500);
    CHECK(n_match > n_cmp / 5); /* the walked strings make matches common, not rare */
}

/* Hand-worked cases: the literal-escape and anchor forms, lazy quantifiers, classes. */
static void test_regex_cases(void) {
    static const struct {
        const char *re, *s;
        int ok;
    } c[] = {{"^a+$", "aaa", 1},
             {"^a+$", "", 0},
             {"a{2,3}", "aaaa", 0},
             {"a{2,}?", "aa", 1},
             {"[^a]", "\xc3\xa9", 1},
             {"[a-c]x", "bx", 1},
             {"\\d{3}-\\d{2}", "123-45", 1},
             {"\\d{3}-\\d{2}", "12-345", 0},
             {"(?:ab|cd)+", "abcdab", 1},
             {"(?:ab|cd)+", "abc", 0},
             {".", "\n", 0},
             {"\\.", "x", 0},
             {"é+", "éé", 1}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        tl_grammar *g = compile_regex(c[i].re);
        if (!g) continue;
        int got = g_match(g, c[i].s, strlen(c[i].s));
        if (got != c[i].ok) fprintf(stderr, "case /%s/ \"%s\"\n", c[i].re, c[i].s);
        CHECK_EQ_INT(got, c[i].ok);
        tl_grammar_free(g);
    }
    static const char *const refused[] = {"(a*)*", "a\\1", "(?=a)",   "\\bx", "a^b",
                                          "a++",   "[é]",  "a{1001}", "x$y"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        tl_grammar_spec sp = {.kind = TL_GRAMMAR_REGEX, .regex = refused[i]};
        tl_grammar *g = NULL;
        char err[256] = "";
        int rc = tl_grammar_compile(&sp, &g, err, sizeof err);
        if (rc != TL_ERR_UNSUPPORTED) fprintf(stderr, "refused /%s/: rc %d\n", refused[i], rc);
        CHECK_EQ_INT(rc, TL_ERR_UNSUPPORTED);
        CHECK(g == NULL && err[0]);
        tl_grammar_free(g);
    }
}

/* ---- distance: breadth-first search over bytes, states deduplicated by their stack set ---- */

typedef struct key {
    uint8_t *b;
    size_t n;
} key;

static int cmp_stack(const void *a, const void *b) {
    const key *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->b, y->b, n) : 0;
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* A canonical byte string of s's stack set (the stacks sorted). */
static key state_key(const tl_grammar_state *s) {
    const tl_gstack_set *c = &s->cur;
    key *ks = calloc(c->n_stacks + 1, sizeof(*ks));
    size_t tot = 0;
    for (size_t i = 0; i < c->n_stacks; i++) {
        ks[i].b = (uint8_t *)(c->len[i] ? c->data + c->off[i] : NULL);
        ks[i].n = c->len[i] * sizeof(int32_t);
        tot += ks[i].n + sizeof(uint32_t);
    }
    qsort(ks, c->n_stacks, sizeof(*ks), cmp_stack);
    key k = {malloc(tot + 1), 0};
    for (size_t i = 0; i < c->n_stacks; i++) {
        uint32_t n = (uint32_t)ks[i].n;
        memcpy(k.b + k.n, &n, sizeof n);
        k.n += sizeof n;
        if (n) memcpy(k.b + k.n, ks[i].b, n);
        k.n += n;
    }
    free(ks);
    return k;
}

#define BFS_MAX 3000

/* Fewest bytes completing the document from s, or TL_GRAMMAR_INF when the reachable states run
 * out without a complete one; -1 when more than BFS_MAX states would be needed. */
static int bfs_distance(const tl_grammar_state *s) {
    tl_grammar_state **q = calloc(BFS_MAX, sizeof(*q));
    key *seen = calloc(BFS_MAX, sizeof(*seen));
    int *dist = calloc(BFS_MAX, sizeof(*dist));
    int head = 0, tail = 0, ans = TL_GRAMMAR_INF;
    CHECK_EQ_INT(tl_grammar_state_clone(s, &q[tail]), 0);
    seen[tail] = state_key(q[tail]);
    dist[tail++] = 0;
    while (head < tail) {
        tl_grammar_state *cur = q[head];
        int d = dist[head++];
        if (tl_grammar_is_complete(cur)) {
            ans = d;
            break;
        }
        for (int b = 0; b < 256 && ans != -1; b++) {
            tl_grammar_state *nx;
            CHECK_EQ_INT(tl_grammar_state_clone(cur, &nx), 0);
            if (tl_grammar_accept_byte(nx, (uint8_t)b)) {
                tl_grammar_state_free(nx);
                continue;
            }
            key k = state_key(nx);
            int dup = 0;
            for (int i = 0; i < tail && !dup; i++)
                dup = seen[i].n == k.n && !memcmp(seen[i].b, k.b, k.n);
            if (dup || tail == BFS_MAX) {
                if (!dup) ans = -1;
                free(k.b);
                tl_grammar_state_free(nx);
                continue;
            }
            q[tail] = nx;
            seen[tail] = k;
            dist[tail++] = d + 1;
        }
        if (ans == -1) break;
    }
    for (int i = 0; i < tail; i++) {
        tl_grammar_state_free(q[i]);
        free(seen[i].b);
    }
    free(q);
    free(seen);
    free(dist);
    return ans;
}

/* Random states of g (random accepted bytes from the start): distance equals the search. */
static void check_distances(const tl_grammar *g, const char *what, int n_states, int *n_done) {
    for (int k = 0; k < n_states; k++) {
        tl_grammar_state *st;
        CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
        int steps = (int)rnd(12);
        for (int i = 0; i < steps; i++) {
            uint8_t ok[256];
            int m = 0;
            for (int b = 0; b < 256; b++) {
                tl_grammar_state *c;
                CHECK_EQ_INT(tl_grammar_state_clone(st, &c), 0);
                if (!tl_grammar_accept_byte(c, (uint8_t)b)) ok[m++] = (uint8_t)b;
                tl_grammar_state_free(c);
            }
            if (!m) break;
            tl_grammar_accept_byte(st, ok[rnd((uint32_t)m)]);
        }
        int want = bfs_distance(st);
        if (want >= 0) {
            int got = tl_grammar_distance(st);
            if (got != want) fprintf(stderr, "distance in %s: %d, search %d\n", what, got, want);
            CHECK_EQ_INT(got, want);
            (*n_done)++;
        }
        tl_grammar_state_free(st);
    }
}

static void test_distance_regex(void) {
    int n_done = 0;
    for (int it = 0; it < 80; it++) {
        pat x = {{0}, {0}, 0, 0};
        int nullable;
        gen_alt(&x, 0, &nullable);
        tl_grammar *g = compile_regex(x.t);
        if (g) check_distances(g, x.t, 4, &n_done);
        tl_grammar_free(g);
    }
    fprintf(stderr, "distance (regex): %d states checked\n", n_done);
    CHECK(n_done >= 250);
}

static void test_distance_schema(void) {
    static const char *const schemas[] = {
        "{\"type\":\"string\",\"minLength\":3,\"maxLength\":5}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"bb\":{\"type\":"
        "\"boolean\"}},\"required\":[\"a\",\"bb\"]}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"xy\",null,12]},\"minItems\":2}",
        "{\"anyOf\":[{\"type\":\"number\"},{\"const\":\"hello\"}]}",
        "{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#\"}}}",
    };
    int n_done = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        json_error_t je;
        json_t *s = json_loads(schemas[i], 0, &je);
        CHECK(s != NULL);
        tl_grammar *g = NULL;
        char err[256];
        CHECK_EQ_INT(tl_grammar_from_schema(s, &g, err, sizeof err), 0);
        if (g) check_distances(g, schemas[i], 12, &n_done);
        tl_grammar_free(g);
        json_decref(s);
    }
    fprintf(stderr, "distance (schema): %d states checked\n", n_done);
    CHECK(n_done >= 40);
}

/* ---- JSON Schema `pattern`: a JSON string whose decoded value contains a match ---- */

/* A search pattern: top-level alternatives, each maybe anchored with '^' / '$' (in POSIX ERE
 * anchors also bind per alternative). \s and \S are left out (refused in `pattern`). */
static void gen_search(pat *x) {
    int n = rnd(3) == 0 ? 2 : 1, nl;
    for (int i = 0; i < n; i++) {
        if (i) put(x, "|", "|");
        if (rnd(3) == 0) put(x, "^", "^");
        gen_concat(x, 0, &nl);
        if (rnd(3) == 0) put(x, "$", "$");
    }
}

static tl_grammar *compile_pattern(const char *re, int *refused) {
    json_t *sch = json_pack("{s:s, s:s}", "type", "string", "pattern", re);
    tl_grammar *g = NULL;
    char err[256] = "";
    int rc = tl_grammar_from_schema(sch, &g, err, sizeof err);
    json_decref(sch);
    *refused = rc == TL_ERR_UNSUPPORTED && strstr(err, "pattern") != NULL;
    if (rc && !*refused) fprintf(stderr, "pattern %s: %s\n", re, err);
    CHECK(rc == 0 || *refused);
    return g;
}

/* The byte alphabet of the values: ASCII only (POSIX in the C locale sees bytes), with the
 * characters JSON escapes. */
static const char valpha[] = "abcZ09_.-+*( \t\n\"\\<|";

/* grammar(json.dumps(v)) == POSIX search(v) for value v (n bytes, no NUL). */
static void compare_value(const tl_grammar *g, const regex_t *re, const pat *x, const char *v,
                          size_t n) {
    json_t *js = json_stringn(v, n);
    char *doc = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
    char buf[128];
    memcpy(buf, v, n);
    buf[n] = 0;
    int want = regexec(re, buf, 0, NULL, 0) == 0, got = g_match(g, doc, strlen(doc));
    if (want != got)
        fprintf(stderr, "pattern /%s/ (POSIX /%s/) on %s: %d, grammar %d\n", x->t, x->p, doc, want,
                got);
    CHECK_EQ_INT(got, want);
    n_cmp++;
    n_match += want;
    free(doc);
    json_decref(js);
}

/* A document walked through g over printable ASCII: must be a JSON string (jansson) whose value
 * POSIX finds a match in; returns its decoded bytes in v (length, or -1 when none came out). */
static long walk_value(const tl_grammar *g, const regex_t *re, const pat *x, char *v) {
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    char doc[80];
    size_t n = 0;
    for (; n < 70 && !tl_grammar_is_complete(st); n++) {
        uint8_t ok[96];
        int k = 0;
        for (int b = 0x20; b < 0x7f; b++) {
            tl_grammar_state *c;
            CHECK_EQ_INT(tl_grammar_state_clone(st, &c), 0);
            if (!tl_grammar_accept_byte(c, (uint8_t)b)) ok[k++] = (uint8_t)b;
            tl_grammar_state_free(c);
        }
        if (!k) break;
        /* favour the closing quote so that documents end */
        doc[n] =
            k > 1 && rnd(8) == 0 && memchr(ok, '"', (size_t)k) ? '"' : (char)ok[rnd((uint32_t)k)];
        tl_grammar_accept_byte(st, (uint8_t)doc[n]);
    }
    int done = tl_grammar_is_complete(st);
    tl_grammar_state_free(st);
    if (!done) return -1;
    json_error_t je;
    json_t *js = json_loadb(doc, n, JSON_DECODE_ANY, &je);
    CHECK(js && json_is_string(js));
    if (!js || !json_is_string(js)) {
        fprintf(stderr, "pattern /%s/: walked %.*s is not a JSON string\n", x->t, (int)n, doc);
        json_decref(js);
        return -1;
    }
    size_t len = json_string_length(js);
    if (len > 127) len = 127; /* the walk is at most 70 bytes: never cut */
    memcpy(v, json_string_value(js), len);
    v[len] = 0;
    int m = regexec(re, v, 0, NULL, 0) == 0;
    if (!m)
        fprintf(stderr, "pattern /%s/ (POSIX /%s/): walked %.*s has no match\n", x->t, x->p, (int)n,
                doc);
    CHECK(m);
    json_decref(js);
    return (long)len;
}

static void test_schema_pattern(void) {
    int n_pat = 0, n_walk = 0;
    n_cmp = n_match = 0;
    for (int it = 0; it < 300; it++) {
        pat x = {{0}, {0}, 0, 0};
        gen_search(&x);
        if (strstr(x.t, "\\s") || strstr(x.t, "\\S")) continue;
        int refused;
        tl_grammar *g = compile_pattern(x.t, &refused);
        CHECK(!refused);
        regex_t re;
        CHECK_EQ_INT(regcomp(&re, x.p, REG_EXTENDED | REG_NOSUB), 0);
        if (!g) continue;
        n_pat++;
        int n_dist = 0;
        check_distances(g, x.t, 1, &n_dist);
        char v[128];
        for (int k = 0; k < 30; k++) {
            size_t n = rnd(10);
            for (size_t i = 0; i < n; i++) v[i] = valpha[rnd(sizeof valpha - 1)];
            compare_value(g, &re, &x, v, n);
        }
        for (int k = 0; k < 8; k++) {
            long n = walk_value(g, &re, &x, v);
            if (n < 0) continue;
            n_walk++;
            compare_value(g, &re, &x, v, (size_t)n);
            if (n) { /* a mutation of a matching value */
                v[rnd((uint32_t)n)] = valpha[rnd(sizeof valpha - 1)];
                compare_value(g, &re, &x, v, (size_t)n);
            }
        }
        regfree(&re);
        tl_grammar_free(g);
    }
    fprintf(stderr, "pattern: %d patterns, %d walked values, %d comparisons, %d matches\n", n_pat,
            n_walk, n_cmp, n_match);
    CHECK(n_pat >= 150 && n_walk >= 600);
    CHECK(n_match > n_cmp / 5 && n_match < n_cmp);
}

/* Hand-worked `pattern` cases: the documents are JSON texts. */
static void test_schema_pattern_cases(void) {
    static const struct {
        const char *re, *doc;
        int ok;
    } c[] = {{"a+", "\"xxaay\"", 1},     {"^a+", "\"xa\"", 0},       {"^a+", "\"ab\"", 1},
             {"b$", "\"ab\"", 1},        {"b$", "\"ba\"", 0},        {"^a$|^b$", "\"b\"", 1},
             {"^a$|^b$", "\"ab\"", 0},   {"\"", "\"x\\\"\"", 1},     {"\"", "\"x\"", 0},
             {"a\\nb", "\"a\\nb\"", 1},  {"a.b", "\"a\\nb\"", 0},    {"[<]", "\"<\"", 1},
             {"x", "\"\\u0001x\"", 1},   {"x", "\"\\u0078\"", 0}, /* one canonical form */
             {"^\\d{3}$", "\"123\"", 1}, {"^\\d{3}$", "\"1234\"", 0}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int refused;
        tl_grammar *g = compile_pattern(c[i].re, &refused);
        if (!g) continue;
        int got = g_match(g, c[i].doc, strlen(c[i].doc));
        if (got != c[i].ok) fprintf(stderr, "pattern case /%s/ %s\n", c[i].re, c[i].doc);
        CHECK_EQ_INT(got, c[i].ok);
        tl_grammar_free(g);
    }
    static const char *const refused_pats[] = {"\\s", "[\\S]", "a(?=b)", "(a)\\1", "a^b"};
    for (size_t i = 0; i < sizeof refused_pats / sizeof refused_pats[0]; i++) {
        int refused;
        tl_grammar *g = compile_pattern(refused_pats[i], &refused);
        CHECK(refused && !g);
        tl_grammar_free(g);
    }
}

int main(void) {
    T_RUN(test_regex_cases);
    T_RUN(test_regex_vs_posix);
    T_RUN(test_distance_regex);
    T_RUN(test_distance_schema);
    T_RUN(test_schema_pattern_cases);
    T_RUN(test_schema_pattern);
    return t_summary();
}
