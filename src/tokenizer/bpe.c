/* Byte-level BPE tokenizer (Qwen3/3.5/3.6 tokenizer.json), matching HF tokenizers id for id.
 *
 * Owns: the loaded vocabulary (id -> raw bytes, raw bytes -> id), the merge table
 * ((left id, right id) -> (rank, merged id)), the added-token tries, the compiled pre-tokenizer
 * regex and a word cache. Everything but the cache is immutable after load; the cache is guarded
 * by striped mutexes, so concurrent tl_tokenize calls on one tokenizer are safe (each call makes
 * its own PCRE2 match data).
 *
 * Invariant: every piece of text handed to the regex and to BPE is valid UTF-8 (invalid input is
 * repaired first), so PCRE2 runs with its UTF check off. The merge loop is HF's Word::merge_all
 * (heap of (rank, position), stale entries skipped by re-checking the merged id), not a
 * simplified variant, so odd vocabularies give HF's answer too. */
#include "tokenizer/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "common/status.h"
#include "common/util.h"

/* ====== UTF-8 helpers. ======
 * Invalid bytes are replaced by U+FFFD one "maximal subpart" at a time (Unicode 6.0 ch. 3 /
 * WHATWG), which is what Python's bytes.decode(errors="replace") and Rust's
 * String::from_utf8_lossy (HF's decode) both do. */

enum { UTF8_INVALID = 0, UTF8_OK = 1, UTF8_TRUNCATED = -1 };

/* Looks at the character starting at s[0] (n >= 1 bytes available). Returns UTF8_OK with *adv =
 * its length, UTF8_INVALID with *adv = length of the maximal invalid subpart (>= 1), or
 * UTF8_TRUNCATED when the buffer ends inside a so-far valid sequence (*adv = n). */
static int utf8_step(const uint8_t *s, size_t n, size_t *adv) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *adv = 1;
        return UTF8_OK;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *adv = 1;
        return UTF8_INVALID;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *adv = n;
            return UTF8_TRUNCATED;
        }
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *adv = i;
            return UTF8_INVALID;
        }
    }
    *adv = need + 1;
    return UTF8_OK;
}

/* Length of the leading run of s that is valid UTF-8 (whole characters). */
static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    size_t i = 0, adv;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (utf8_step(s + i, n - i, &adv) != UTF8_OK) return i;
        i += adv;
    }
    return n;
}

/* Writes the lossy repair of s into dst (capacity >= 3 * n) and returns the length. */
static size_t utf8_repair(const uint8_t *s, size_t n, uint8_t *dst) {
    size_t i = 0, o = 0, adv;
    while (i < n) {
        if (utf8_step(s + i, n - i, &adv) == UTF8_OK) {
            memcpy(dst + o, s + i, adv);
            o += adv;
        } else {
            dst[o++] = 0xEF, dst[o++] = 0xBF, dst[o++] = 0xBD;
        }
        i += adv;
    }
    return o;
}

static size_t utf8_encode(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ====== Growable byte buffer and id array. ====== */

typedef struct {
    char *p;
    size_t n, cap;
} bbuf;

static int bbuf_reserve(bbuf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return TL_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int bbuf_put(bbuf *b, const void *s, size_t n) {
    if (n == 0) return 0; /* memcpy to a still-NULL buffer is undefined even for 0 bytes */
    if (bbuf_reserve(b, n)) return TL_ERR_NOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

void tl_tok_ids_free(tl_tok_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static int ids_reserve(tl_tok_ids *v, size_t extra) {
    if (v->n + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return TL_ERR_NOMEM;
    v->ids = p;
    v->cap = cap;
    return 0;
}

/* ====== Hashing. ====== */

static uint64_t hash_bytes(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        h = (h ^ (k * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++) k |= (uint64_t)p[i] << (8 * i);
    h = (h ^ (k * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

/* ====== The tokenizer object. ====== */

enum { TOKF_ADDED = 1, TOKF_SPECIAL = 2 };

/* Added-token trie: node 0 is the root; children are found through a sorted edge list per node,
 * except the root which has a 256-entry table (most text positions stop there). */
typedef struct {
    int32_t first_edge, n_edge; /* edges[first_edge .. first_edge + n_edge) */
    int32_t id;                 /* token ending here, or -1 */
} trie_node;

typedef struct {
    uint8_t byte;
    int32_t child;
} trie_edge;

typedef struct {
    trie_node *nodes;
    trie_edge *edges;
    int32_t n_nodes;
    int32_t root[256]; /* child of the root per first byte, or -1 */
    int n_tokens;
} trie;

typedef struct {
    uint32_t rank;
    int32_t new_id;
} merge_val;

#define CACHE_SLOTS                                                                                \
    262144 /* direct-mapped word cache; 64-byte slots = 16 MB, touched lazily;                     \
            * 4096 slots for toy vocabularies (tests, fuzzing) */
#define CACHE_LOCKS   64
#define CACHE_MAX_LEN 26
#define CACHE_MAX_IDS 8

typedef struct {
    uint32_t hash;
    uint8_t len, n_ids; /* len 0 = empty slot */
    char bytes[CACHE_MAX_LEN];
    int32_t ids[CACHE_MAX_IDS];
} cache_slot;

struct tl_tokenizer {
    int n_vocab;
    /* id -> decoded bytes: arena + offsets (off[id] .. off[id + 1]); holes have length 0 and
     * TOKF_HOLE-free flags 0 with has[id] = 0. */
    char *arena;
    uint32_t *off;
    uint8_t *flags;
    uint8_t *present;
    /* raw bytes -> id (byte-level vocabulary entries), open addressing, slot = id + 1 or 0 */
    int32_t *vhash;
    size_t vcap;
    int32_t byte_id[256]; /* id of each single byte's token, -1 if missing */
    int32_t unk_id;
    int fuse_unk, ignore_merges;
    /* merges */
    uint64_t *mkey; /* (left << 32 | right), UINT64_MAX = empty */
    merge_val *mval;
    size_t mcap;
    /* added tokens: matched in the raw text (normalized = false) or after normalization */
    trie added_raw, added_norm;
    int nfc;
    pcre2_code *re, *re_compat; /* re_compat: with HF's extra class members, or NULL */
    int jit, jit_compat;
    /* word cache */
    cache_slot *cache;
    size_t cache_slots; /* a power of two */
    pthread_mutex_t locks[CACHE_LOCKS];
};

static const uint8_t *tok_bytes(const tl_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id];
    return (const uint8_t *)t->arena + t->off[id];
}

static int32_t vocab_find(const tl_tokenizer *t, const void *s, size_t n) {
    if (!t->vcap) return -1;
    size_t mask = t->vcap - 1, i = hash_bytes(s, n) & mask;
    for (;;) {
        int32_t v = t->vhash[i];
        if (!v) return -1;
        size_t l;
        const uint8_t *b = tok_bytes(t, v - 1, &l);
        if (l == n && !memcmp(b, s, n)) return v - 1;
        i = (i + 1) & mask;
    }
}

static void vocab_insert(tl_tokenizer *t, int32_t id) {
    size_t n;
    const uint8_t *s = tok_bytes(t, id, &n);
    size_t mask = t->vcap - 1, i = hash_bytes(s, n) & mask;
    for (;;) {
        int32_t v = t->vhash[i];
        if (!v) {
            t->vhash[i] = id + 1;
            return;
        }
        size_t l;
        const uint8_t *b = tok_bytes(t, v - 1, &l);
        if (l == n && !memcmp(b, s, n)) return; /* first one wins */
        i = (i + 1) & mask;
    }
}

static const merge_val *merge_find(const tl_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->mcap - 1, i = hash_u64(key) & mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == key) return &t->mval[i];
        if (k == UINT64_MAX) return NULL;
        i = (i + 1) & mask;
    }
}

/* Later duplicates overwrite earlier ones: HF collects the merge list into a HashMap. */
static void merge_insert(tl_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->mcap - 1, i = hash_u64(key) & mask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key) i = (i + 1) & mask;
    t->mkey[i] = key;
    t->mval[i].rank = rank;
    t->mval[i].new_id = new_id;
}

/* ====== Byte-level alphabet. ======
 * GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 map to U+0100.. in
 * byte order, so every byte has a visible character. */

static void bytelevel_tables(uint32_t b2u[256], int16_t u2b[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

/* Decodes a vocabulary string from its byte-level form into raw bytes (appended to out).
 * Returns 1 if every character was in the alphabet, 0 if not (then the raw UTF-8 of s was
 * appended instead, which is what HF's ByteLevel decoder does). */
static int bytelevel_decode(const int16_t u2b[324], const char *s, size_t n, bbuf *out) {
    size_t start = out->n;
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (k <= 0 || cp < 0 || cp >= 324 || u2b[cp] < 0) {
            out->n = start;
            bbuf_put(out, s, n);
            return 0;
        }
        uint8_t byte = (uint8_t)u2b[cp];
        bbuf_put(out, &byte, 1);
        i += k;
    }
    return 1;
}

/* ====== Added-token tries. ====== */

typedef struct {
    const char *s;
    size_t n;
    int32_t id;
} trie_item;

/* Trie construction goes through a dense temporary node table (256 children per node; added
 * tokens are few and short), then flattens each node's children into a contiguous edge list. */
typedef struct {
    int32_t child[256];
    int32_t id;
} trie_tmp;

static void trie_free(trie *t) {
    free(t->nodes);
    free(t->edges);
    memset(t, 0, sizeof *t);
}

static int trie_build(trie *t, trie_item *items, size_t n) {
    memset(t, 0, sizeof *t);
    for (int b = 0; b < 256; b++) t->root[b] = -1;
    t->n_tokens = (int)n;
    if (!n) return 0;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total += items[i].n;
    trie_tmp *tmp = malloc(total * sizeof *tmp);
    if (!tmp) return TL_ERR_NOMEM;
    int32_t n_nodes = 1;
    memset(tmp[0].child, 0xff, sizeof tmp[0].child);
    tmp[0].id = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t cur = 0;
        for (size_t k = 0; k < items[i].n; k++) {
            uint8_t b = (uint8_t)items[i].s[k];
            if (tmp[cur].child[b] < 0) {
                memset(tmp[n_nodes].child, 0xff, sizeof tmp[n_nodes].child);
                tmp[n_nodes].id = -1;
                tmp[cur].child[b] = n_nodes++;
            }
            cur = tmp[cur].child[b];
        }
        tmp[cur].id = items[i].id; /* a later duplicate content wins */
    }
    t->nodes = malloc((size_t)n_nodes * sizeof *t->nodes);
    t->edges = malloc((size_t)n_nodes * sizeof *t->edges);
    if (!t->nodes || !t->edges) {
        free(tmp);
        trie_free(t);
        return TL_ERR_NOMEM;
    }
    int32_t n_edges = 0;
    for (int32_t v = 0; v < n_nodes; v++) {
        t->nodes[v].id = tmp[v].id;
        t->nodes[v].first_edge = n_edges;
        t->nodes[v].n_edge = 0;
        for (int b = 0; b < 256; b++) {
            if (tmp[v].child[b] < 0) continue;
            t->edges[n_edges].byte = (uint8_t)b;
            t->edges[n_edges].child = tmp[v].child[b];
            n_edges++;
            t->nodes[v].n_edge++;
        }
    }
    for (int b = 0; b < 256; b++) t->root[b] = tmp[0].child[b];
    t->n_nodes = n_nodes;
    free(tmp);
    return 0;
}

/* Longest token starting at s[0]; returns its id and sets *mlen, or -1. */
static int32_t trie_longest(const trie *t, const uint8_t *s, size_t n, size_t *mlen) {
    int32_t cur = t->root[s[0]], best = -1;
    size_t k = 1;
    while (cur >= 0) {
        if (t->nodes[cur].id >= 0) {
            best = t->nodes[cur].id;
            *mlen = k;
        }
        if (k >= n) break;
        const trie_node *nd = &t->nodes[cur];
        int32_t next = -1;
        for (int32_t e = nd->first_edge; e < nd->first_edge + nd->n_edge; e++) {
            if (t->edges[e].byte == s[k]) {
                next = t->edges[e].child;
                break;
            }
        }
        cur = next;
        k++;
    }
    return best;
}

/* ====== Loading. ====== */

/* Code points HF's Oniguruma (Unicode 16) has in \p{L}, \p{M}, \p{N} that this PCRE2 (10.42,
 * Unicode 14) leaves unassigned; the rewrite adds them to those classes (\p{Z} agrees). Generated
 * and verified by tools/tok_regex_compat.py; rerun it when either library changes. */
/* PCRE2 Unicode 14.0.0; HF tokenizers' Oniguruma adds L: 9272, M: 93, N: 120, Z: 0 */
static const uint32_t HF_EXTRA_L[][2] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x105C0, 0x105F3},
    {0x10D4A, 0x10D65}, {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240},
    {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5},
    {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11BC0, 0x11BE0},
    {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F},
    {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C},
    {0x18CFF, 0x18CFF}, {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0},
    {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF}};
static const uint32_t HF_EXTRA_M[][2] = {
    {0x897, 0x897},     {0xCF3, 0xCF3},     {0xECE, 0xECE},     {0x10D69, 0x10D6D},
    {0x10EFC, 0x10EFF}, {0x11241, 0x11241}, {0x113B8, 0x113C0}, {0x113C2, 0x113C2},
    {0x113C5, 0x113C5}, {0x113C7, 0x113CA}, {0x113CC, 0x113D0}, {0x113D2, 0x113D2},
    {0x113E1, 0x113E2}, {0x11F00, 0x11F01}, {0x11F03, 0x11F03}, {0x11F34, 0x11F3A},
    {0x11F3E, 0x11F42}, {0x11F5A, 0x11F5A}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x1611E, 0x1612F}, {0x1E08F, 0x1E08F}, {0x1E4EC, 0x1E4EF}, {0x1E5EE, 0x1E5EF}};
static const uint32_t HF_EXTRA_N[][2] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9},
                                         {0x11F50, 0x11F59}, {0x16130, 0x16139}, {0x16D70, 0x16D79},
                                         {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1E4F0, 0x1E4F9},
                                         {0x1E5F1, 0x1E5FA}};

/* Appends the extra ranges of Unicode class name (n bytes) as class items, or returns 0 when the
 * class has none. */
static int regex_extra(const char *name, size_t n, bbuf *out) {
    const uint32_t(*r)[2];
    size_t nr;
    if (n == 1 && name[0] == 'L')
        r = HF_EXTRA_L, nr = sizeof HF_EXTRA_L / sizeof *HF_EXTRA_L;
    else if (n == 1 && name[0] == 'M')
        r = HF_EXTRA_M, nr = sizeof HF_EXTRA_M / sizeof *HF_EXTRA_M;
    else if (n == 1 && name[0] == 'N')
        r = HF_EXTRA_N, nr = sizeof HF_EXTRA_N / sizeof *HF_EXTRA_N;
    else
        return 0;
    for (size_t i = 0; i < nr; i++) {
        char item[48];
        int k = snprintf(item, sizeof item, "\\x{%X}-\\x{%X}", r[i][0], r[i][1]);
        bbuf_put(out, item, (size_t)k);
    }
    return 1;
}

/* Rewrites an HF (Oniguruma) pattern for PCRE2 so both engines split alike:
 * - `\s` is Oniguruma's whitespace set, not PCRE2's (measured, DESIGN.md): outside a class it
 *   becomes [\t-\r\x{20}\x{85}\p{Z}], inside a class its members; `\S` outside a class becomes
 *   the negated class;
 * - `\p{L}`, `\p{M}`, `\p{N}` (or `\pL`...) get the code points PCRE2's older Unicode lacks:
 *   [\p{L}...] outside a class, the extra items inside; `\P{..}` becomes [^\p{..}...].
 * `\S` or `\P{L}` inside a class has no PCRE2 spelling and is refused. */
static int regex_rewrite(const char *pat, int compat, int *used_extra, bbuf *out, char *err,
                         size_t errlen) {
    static const char ws[] = "\\t-\\r\\x{20}\\x{85}\\p{Z}";
    int in_class = 0;
    for (size_t i = 0; pat[i]; i++) {
        char c = pat[i];
        if (c == '\\' && (pat[i + 1] == 'p' || pat[i + 1] == 'P') && pat[i + 2]) {
            int neg = pat[i + 1] == 'P';
            const char *name = pat + i + 2, *end = name + 1;
            if (*name == '{') {
                end = strchr(name, '}');
                if (!end)
                    return tl_errf(err, errlen, TL_ERR_FORMAT,
                                   "pre-tokenizer regex: unclosed \\p{");
                name++;
                if (*name == '^') neg = !neg, name++;
                end++;
            }
            size_t nl = (size_t)(end - name) - (pat[i + 2] == '{' ? 1 : 0);
            bbuf item = {0};
            bbuf_put(&item, "\\p{", 3);
            bbuf_put(&item, name, nl);
            bbuf_put(&item, "}", 1);
            int has_extra = compat && regex_extra(name, nl, &item);
            *used_extra |= has_extra;
            if (!has_extra) {
                bbuf_put(out, pat + i, (size_t)(end - (pat + i)));
            } else if (in_class) {
                if (neg) {
                    free(item.p);
                    return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                                   "pre-tokenizer regex: negated \\p inside a character class");
                }
                bbuf_put(out, item.p, item.n);
            } else {
                bbuf_put(out, neg ? "[^" : "[", neg ? 2 : 1);
                bbuf_put(out, item.p, item.n);
                bbuf_put(out, "]", 1);
            }
            free(item.p);
            i = (size_t)(end - pat) - 1;
            continue;
        }
        if (c == '\\' && pat[i + 1]) {
            char d = pat[i + 1];
            if (d == 's') {
                if (!in_class) bbuf_put(out, "[", 1);
                bbuf_put(out, ws, sizeof ws - 1);
                if (!in_class) bbuf_put(out, "]", 1);
            } else if (d == 'S') {
                if (in_class)
                    return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                                   "pre-tokenizer regex: \\S inside a character class");
                bbuf_put(out, "[^", 2);
                bbuf_put(out, ws, sizeof ws - 1);
                bbuf_put(out, "]", 1);
            } else {
                bbuf_put(out, pat + i, 2);
            }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            bbuf_put(out, pat + i, 1);
            /* a ']' right after '[' or '[^' is a literal */
            if (pat[i + 1] == '^') bbuf_put(out, pat + ++i, 1);
            if (pat[i + 1] == ']') bbuf_put(out, pat + ++i, 1);
            continue;
        }
        if (c == '[' && in_class && pat[i + 1] == ':') { /* POSIX class [:alpha:] */
            const char *e = strstr(pat + i + 2, ":]");
            if (e) {
                bbuf_put(out, pat + i, (size_t)(e + 2 - (pat + i)));
                i = (size_t)(e + 1 - pat);
                continue;
            }
        }
        if (c == ']' && in_class) in_class = 0;
        bbuf_put(out, &c, 1);
    }
    return 0;
}

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int regex_build(const char *pat, size_t n, int literal, pcre2_code **re, int *jit, char *err,
                       size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    *re = pcre2_compile((PCRE2_SPTR)(pat ? pat : ""), n, opts, &ec, &eo, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tl_errf(err, errlen, TL_ERR_FORMAT, "pre-tokenizer regex at offset %zu: %s",
                       (size_t)eo, (char *)msg);
    }
    *jit = pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* Two compiled forms: re for text without any of the HF_EXTRA code points (nearly all text:
 * the extra class items cost ~25% of encode speed), re_compat for text with them. */
static int regex_compile(tl_tokenizer *t, const char *pat, int literal, char *err, size_t errlen) {
    if (literal) return regex_build(pat, strlen(pat), 1, &t->re, &t->jit, err, errlen);
    bbuf rw = {0};
    int used = 0;
    int st = regex_rewrite(pat, 0, &used, &rw, err, errlen);
    if (!st) st = regex_build(rw.p, rw.n, 0, &t->re, &t->jit, err, errlen);
    rw.n = 0;
    if (!st) st = regex_rewrite(pat, 1, &used, &rw, err, errlen);
    if (!st && used) st = regex_build(rw.p, rw.n, 0, &t->re_compat, &t->jit_compat, err, errlen);
    free(rw.p);
    return st;
}

/* 1 if valid UTF-8 s holds a code point of the HF_EXTRA tables (all are >= U+0897, so only
 * characters of 3 or 4 bytes are decoded). */
static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid - 1;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

static int needs_compat(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0xE0) continue;
        uint32_t cp;
        if (s[i] < 0xF0 && i + 2 < n) {
            cp = (uint32_t)(s[i] & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 |
                 (s[i + 2] & 0x3F);
            i += 2;
        } else if (i + 3 < n) {
            cp = (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                 (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
            i += 3;
        } else {
            continue;
        }
        if (cp < 0x897) continue;
        if (in_ranges(HF_EXTRA_L, (int)(sizeof HF_EXTRA_L / sizeof *HF_EXTRA_L), cp) ||
            in_ranges(HF_EXTRA_M, (int)(sizeof HF_EXTRA_M / sizeof *HF_EXTRA_M), cp) ||
            in_ranges(HF_EXTRA_N, (int)(sizeof HF_EXTRA_N / sizeof *HF_EXTRA_N), cp))
            return 1;
    }
    return 0;
}

static int is_type(json_t *o, const char *type) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) && !strcmp(json_string_value(ty), type);
}

static const char *type_of(json_t *o) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : "(none)";
}

static int jbool(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static int load_normalizer(tl_tokenizer *t, json_t *n, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    if (is_type(n, "NFC")) {
        t->nfc = 1;
        return 0;
    }
    if (is_type(n, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *e;
        if (!json_is_array(list))
            return tl_errf(err, errlen, TL_ERR_FORMAT, "normalizer Sequence without a list");
        json_array_foreach(list, i, e) {
            if (!is_type(e, "NFC") || t->nfc)
                return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                               "normalizer %s in a Sequence (only one NFC is supported)",
                               type_of(e));
            t->nfc = 1;
        }
        return 0;
    }
    return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "normalizer %s (only NFC is supported)",
                   type_of(n));
}

static int bytelevel_ok(json_t *b, int want_regex, char *err, size_t errlen) {
    if (jbool(b, "add_prefix_space"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "ByteLevel pre-tokenizer with add_prefix_space");
    json_t *ur = json_object_get(b, "use_regex");
    int use_regex = ur ? json_is_true(ur) : 1; /* HF default: true */
    if (use_regex != want_regex)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "ByteLevel pre-tokenizer with use_regex=%s here",
                       use_regex ? "true" : "false");
    return 0;
}

static int load_pretokenizer(tl_tokenizer *t, json_t *p, char *err, size_t errlen) {
    if (!p || json_is_null(p))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "no pre_tokenizer (byte-level BPE needs one)");
    if (is_type(p, "ByteLevel")) {
        int st = bytelevel_ok(p, 1, err, errlen);
        return st ? st : regex_compile(t, GPT2_REGEX, 0, err, errlen);
    }
    if (!is_type(p, "Sequence"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "pre_tokenizer %s", type_of(p));
    json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
        return tl_errf(err, errlen, TL_ERR_FORMAT, "pre_tokenizer Sequence without a list");
    size_t n = json_array_size(list);
    if (n == 1 && is_type(json_array_get(list, 0), "ByteLevel"))
        return load_pretokenizer(t, json_array_get(list, 0), err, errlen);
    if (n != 2 || !is_type(json_array_get(list, 0), "Split") ||
        !is_type(json_array_get(list, 1), "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "pre_tokenizer Sequence other than [Split, ByteLevel]");
    json_t *sp = json_array_get(list, 0);
    int st = bytelevel_ok(json_array_get(list, 1), 0, err, errlen);
    if (st) return st;
    json_t *beh = json_object_get(sp, "behavior");
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "Split behavior %s (only Isolated)",
                       json_is_string(beh) ? json_string_value(beh) : "(none)");
    if (jbool(sp, "invert"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "Split with invert=true");
    json_t *pat = json_object_get(sp, "pattern");
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (json_is_string(rx)) return regex_compile(t, json_string_value(rx), 0, err, errlen);
    if (json_is_string(lit)) return regex_compile(t, json_string_value(lit), 1, err, errlen);
    return tl_errf(err, errlen, TL_ERR_FORMAT, "Split pattern is neither Regex nor String");
}

/* ====== Reading tokenizer.json. ======
 * The file is mostly model.vocab (an object of ~250K strings) and model.merges (~250K-500K
 * strings or pairs). A DOM for those (jansson: two mallocs per value, a hash insert per key) was
 * 60% of the load time, so this scanner reads the two directly into flat arrays and hands every
 * other value (small) to jansson. It checks the whole text is well-formed JSON: errors name the
 * byte offset. */

typedef struct {
    uint32_t off, len; /* key in strs */
    int64_t id;
} vocab_ent;

typedef struct {
    uint32_t a, la, b, lb; /* merge halves in strs */
} merge_ent;

typedef struct {
    const char *p, *start, *end;
    json_t *root, *model; /* the other values, parsed by jansson */
    bbuf strs;            /* vocab keys and merge halves, NUL-terminated */
    vocab_ent *vocab;
    size_t n_vocab, cap_vocab;
    merge_ent *merges;
    size_t n_merges, cap_merges;
    int has_vocab, has_merges, depth;
    char *err;
    size_t errlen;
} tokjson;

static int tj_fail(tokjson *j, const char *what) {
    return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "tokenizer JSON at byte %zu: %s",
                   (size_t)(j->p - j->start), what);
}

static void tj_ws(tokjson *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int tj_expect(tokjson *j, char c) {
    tj_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return tj_fail(j, msg);
    }
    j->p++;
    return 0;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'                 ? c - '0'
                          : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10
                                                               : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* Decodes a JSON string at j->p (the opening quote) and appends its UTF-8 plus a NUL to out;
 * *len = its length without the NUL. Rejects what serde_json and jansson reject (raw control
 * characters, bad escapes, lone surrogates, invalid UTF-8). */
static int tj_string(tokjson *j, bbuf *out, uint32_t *len) {
    tj_ws(j);
    if (j->p >= j->end || *j->p != '"') return tj_fail(j, "expected a string");
    j->p++;
    size_t start = out->n;
    for (;;) {
        const char *q = j->p;
        while (q < j->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20) q++;
        if (q > j->p) {
            if (utf8_valid_len((const uint8_t *)j->p, (size_t)(q - j->p)) != (size_t)(q - j->p))
                return tj_fail(j, "invalid UTF-8 in a string");
            if (bbuf_put(out, j->p, (size_t)(q - j->p))) return TL_ERR_NOMEM;
            j->p = q;
        }
        if (j->p >= j->end) return tj_fail(j, "unterminated string");
        char c = *j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c != '\\') return tj_fail(j, "control character in a string");
        if (j->p + 1 >= j->end) return tj_fail(j, "unterminated string");
        char e = j->p[1], ch = 0;
        j->p += 2;
        switch (e) {
        case '"':
            ch = '"';
            break;
        case '\\':
            ch = '\\';
            break;
        case '/':
            ch = '/';
            break;
        case 'b':
            ch = '\b';
            break;
        case 'f':
            ch = '\f';
            break;
        case 'n':
            ch = '\n';
            break;
        case 'r':
            ch = '\r';
            break;
        case 't':
            ch = '\t';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (j->end - j->p < 4 || hex4(j->p, &cp)) return tj_fail(j, "bad \\u escape");
            j->p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return tj_fail(j, "lone surrogate escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return tj_fail(j, "lone surrogate escape");
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            uint8_t u[4];
            if (bbuf_put(out, u, utf8_encode(cp, u))) return TL_ERR_NOMEM;
            continue;
        }
        default:
            return tj_fail(j, "bad escape");
        }
        if (bbuf_put(out, &ch, 1)) return TL_ERR_NOMEM;
    }
    if (out->n - start > UINT32_MAX / 2) return tj_fail(j, "string too long");
    *len = (uint32_t)(out->n - start);
    return bbuf_put(out, "", 1) ? TL_ERR_NOMEM : 0;
}

/* Skips one JSON value (checking its syntax roughly; jansson re-parses what is kept). */
static int tj_skip(tokjson *j) {
    tj_ws(j);
    if (j->p >= j->end) return tj_fail(j, "unexpected end");
    char c = *j->p;
    if (c == '"') {
        bbuf tmp = {0};
        uint32_t l;
        int st = tj_string(j, &tmp, &l);
        free(tmp.p);
        return st;
    }
    if (c == '{' || c == '[') {
        if (++j->depth > 256) return tj_fail(j, "nested too deeply");
        char close = c == '{' ? '}' : ']';
        j->p++;
        tj_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return 0;
        }
        for (;;) {
            int st;
            if (c == '{') {
                bbuf tmp = {0};
                uint32_t l;
                st = tj_string(j, &tmp, &l);
                free(tmp.p);
                if (st || (st = tj_expect(j, ':'))) return st;
            }
            if ((st = tj_skip(j))) return st;
            tj_ws(j);
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                continue;
            }
            if ((st = tj_expect(j, close))) return st;
            j->depth--;
            return 0;
        }
    }
    const char *q = j->p; /* number, true, false, null */
    while (q < j->end && (isalnum((unsigned char)*q) || *q == '-' || *q == '+' || *q == '.')) q++;
    if (q == j->p) return tj_fail(j, "unexpected character");
    j->p = q;
    return 0;
}

/* Parses the value at j->p with jansson (small values only). */
static int tj_jansson(tokjson *j, json_t **out) {
    tj_ws(j);
    const char *v0 = j->p;
    int st = tj_skip(j);
    if (st) return st;
    json_error_t je;
    *out = json_loadb(v0, (size_t)(j->p - v0), JSON_DECODE_ANY, &je);
    if (!*out) {
        j->p = v0 + (je.position > 0 ? je.position : 0);
        return tj_fail(j, je.text);
    }
    return 0;
}

static int tj_vocab(tokjson *j) {
    int st = tj_expect(j, '{');
    if (st) return st;
    j->has_vocab = 1;
    j->n_vocab = 0;
    tj_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        if (j->n_vocab == j->cap_vocab) {
            size_t cap = j->cap_vocab ? 2 * j->cap_vocab : 1024;
            vocab_ent *v = realloc(j->vocab, cap * sizeof *v);
            if (!v) return TL_ERR_NOMEM;
            j->vocab = v;
            j->cap_vocab = cap;
        }
        vocab_ent *e = &j->vocab[j->n_vocab];
        e->off = (uint32_t)j->strs.n;
        if ((st = tj_string(j, &j->strs, &e->len)) || (st = tj_expect(j, ':'))) return st;
        tj_ws(j);
        const char *q = j->p;
        int64_t v = 0;
        while (q < j->end && *q >= '0' && *q <= '9' && v < (1 << 30)) v = v * 10 + (*q++ - '0');
        if (q == j->p || (q < j->end && (isalnum((unsigned char)*q) || *q == '.' || *q == '-')) ||
            v >= (1 << 30)) {
            char msg[80];
            snprintf(msg, sizeof msg, "vocab entry \"%.40s\" has a bad id", j->strs.p + e->off);
            return tj_fail(j, msg);
        }
        j->p = q;
        e->id = v;
        j->n_vocab++;
        tj_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        return tj_expect(j, '}');
    }
}

static int tj_merges(tokjson *j) {
    int st = tj_expect(j, '[');
    if (st) return st;
    j->has_merges = 1;
    j->n_merges = 0;
    tj_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 0;
    }
    for (;;) {
        if (j->n_merges == j->cap_merges) {
            size_t cap = j->cap_merges ? 2 * j->cap_merges : 1024;
            merge_ent *m = realloc(j->merges, cap * sizeof *m);
            if (!m) return TL_ERR_NOMEM;
            j->merges = m;
            j->cap_merges = cap;
        }
        merge_ent *m = &j->merges[j->n_merges];
        tj_ws(j);
        if (j->p < j->end && *j->p == '[') {
            j->p++;
            m->a = (uint32_t)j->strs.n;
            if ((st = tj_string(j, &j->strs, &m->la)) || (st = tj_expect(j, ','))) return st;
            m->b = (uint32_t)j->strs.n;
            if ((st = tj_string(j, &j->strs, &m->lb)) || (st = tj_expect(j, ']'))) return st;
        } else {
            uint32_t l;
            m->a = (uint32_t)j->strs.n;
            if ((st = tj_string(j, &j->strs, &l))) return st;
            char *s = j->strs.p + m->a, *sp = memchr(s, ' ', l);
            if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - s))) {
                char msg[96];
                snprintf(msg, sizeof msg, "merge %zu \"%.40s\" is not two tokens", j->n_merges, s);
                return tj_fail(j, msg);
            }
            *sp = 0; /* "a b" -> "a\0b\0" */
            m->la = (uint32_t)(sp - s);
            m->b = m->a + m->la + 1;
            m->lb = l - m->la - 1;
        }
        j->n_merges++;
        tj_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        return tj_expect(j, ']');
    }
}

/* Reads an object whose keys go to dst (jansson values), except the ones handled by `special`
 * (returns 1 if it consumed the value, 0 if not, negative on error). */
static int tj_object(tokjson *j, json_t *dst, int (*special)(tokjson *, const char *)) {
    int st = tj_expect(j, '{');
    if (st) return st;
    tj_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    bbuf key = {0};
    for (;;) {
        uint32_t kl;
        key.n = 0;
        if ((st = tj_string(j, &key, &kl)) || (st = tj_expect(j, ':'))) break;
        st = special ? special(j, key.p) : 0;
        if (st < 0) break;
        if (st == 0) {
            json_t *v;
            if ((st = tj_jansson(j, &v))) break;
            json_object_set_new(dst, key.p, v);
        }
        tj_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        st = tj_expect(j, '}');
        break;
    }
    free(key.p);
    return st;
}

static int tj_model_key(tokjson *j, const char *key) {
    if (!strcmp(key, "vocab")) {
        tj_ws(j);
        if (j->p < j->end && *j->p != '{') return tj_fail(j, "model.vocab is not an object");
        int st = tj_vocab(j);
        return st ? st : 1;
    }
    if (!strcmp(key, "merges")) {
        tj_ws(j);
        if (j->p < j->end && *j->p != '[') return tj_fail(j, "model.merges is not a list");
        int st = tj_merges(j);
        return st ? st : 1;
    }
    return 0;
}

static int tj_root_key(tokjson *j, const char *key) {
    if (strcmp(key, "model")) return 0;
    tj_ws(j);
    if (j->p < j->end && *j->p != '{') return tj_fail(j, "\"model\" is not an object");
    if (j->model) return tj_fail(j, "two \"model\" keys");
    j->model = json_object();
    int st = tj_object(j, j->model, tj_model_key);
    return st ? st : 1;
}

static void tj_free(tokjson *j) {
    json_decref(j->root);
    json_decref(j->model);
    free(j->strs.p);
    free(j->vocab);
    free(j->merges);
}

static int tj_parse(tokjson *j, const char *json, size_t len) {
    j->p = j->start = json;
    j->end = json + len;
    tj_ws(j);
    if (j->p >= j->end) return tj_fail(j, "empty file");
    if (*j->p != '{') return tj_fail(j, "top level is not an object");
    j->root = json_object();
    int st = tj_object(j, j->root, tj_root_key);
    if (st) return st;
    tj_ws(j);
    if (j->p != j->end) return tj_fail(j, "text after the end");
    if (!j->model) return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "no \"model\" object");
    if (!j->has_vocab) return tl_errf(j->err, j->errlen, TL_ERR_FORMAT, "model.vocab missing");
    return 0;
}

/* Byte-level vocabulary string -> id over the parsed entries (open addressing, index + 1).
 * A key given twice keeps the later id, as HF's HashMap does. */
typedef struct {
    const tokjson *j;
    uint32_t *slot;
    size_t cap;
} bl_map;

static int bl_map_build(bl_map *m, const tokjson *j) {
    m->j = j;
    m->cap = 16;
    while (m->cap < 2 * j->n_vocab + 16) m->cap *= 2;
    m->slot = calloc(m->cap, sizeof *m->slot);
    if (!m->slot) return TL_ERR_NOMEM;
    for (size_t e = 0; e < j->n_vocab; e++) {
        const char *s = j->strs.p + j->vocab[e].off;
        size_t n = j->vocab[e].len, i = hash_bytes(s, n) & (m->cap - 1);
        for (;;) {
            uint32_t v = m->slot[i];
            if (!v ||
                (j->vocab[v - 1].len == n && !memcmp(j->strs.p + j->vocab[v - 1].off, s, n))) {
                m->slot[i] = (uint32_t)e + 1;
                break;
            }
            i = (i + 1) & (m->cap - 1);
        }
    }
    return 0;
}

static int32_t bl_map_find(const bl_map *m, const char *s, size_t n) {
    size_t i = hash_bytes(s, n) & (m->cap - 1);
    for (;;) {
        uint32_t v = m->slot[i];
        if (!v) return -1;
        const vocab_ent *e = &m->j->vocab[v - 1];
        if (e->len == n && !memcmp(m->j->strs.p + e->off, s, n)) return (int32_t)e->id;
        i = (i + 1) & (m->cap - 1);
    }
}

static int load_merges(tl_tokenizer *t, const tokjson *j, const bl_map *bm, char *err,
                       size_t errlen) {
    size_t n = j->n_merges;
    t->mcap = 16;
    while (t->mcap < 2 * n + 16) t->mcap *= 2;
    t->mkey = malloc(t->mcap * sizeof *t->mkey);
    t->mval = malloc(t->mcap * sizeof *t->mval);
    if (!t->mkey || !t->mval) return TL_ERR_NOMEM;
    memset(t->mkey, 0xff, t->mcap * sizeof *t->mkey);
    bbuf cat = {0};
    int st = 0;
    for (size_t i = 0; i < n; i++) {
        const merge_ent *m = &j->merges[i];
        const char *a = j->strs.p + m->a, *b = j->strs.p + m->b;
        cat.n = 0;
        if (bbuf_put(&cat, a, m->la) || bbuf_put(&cat, b, m->lb)) {
            st = TL_ERR_NOMEM;
            break;
        }
        int32_t ia = bl_map_find(bm, a, m->la), ib = bl_map_find(bm, b, m->lb);
        int32_t in = bl_map_find(bm, cat.p ? cat.p : "", cat.n);
        if (ia < 0 || ib < 0 || in < 0) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "merge %zu (\"%.*s\" \"%.*s\"): %s token not in the vocab", i,
                         (int)TL_MIN(m->la, 40), a, (int)TL_MIN(m->lb, 40), b,
                         ia < 0   ? "left"
                         : ib < 0 ? "right"
                                  : "merged");
            break;
        }
        merge_insert(t, ia, ib, (uint32_t)i, in);
    }
    free(cat.p);
    return st;
}

typedef struct {
    int32_t id;
    const char *content;
    int special, normalized;
} added_def;

static int load_model(tl_tokenizer *t, const tokjson *j, char *err, size_t errlen) {
    json_t *model = j->model, *root = j->root;
    json_t *ty = json_object_get(model, "type");
    if (ty && !is_type(model, "BPE"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "model type %s (only BPE)", type_of(model));
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE dropout");
    if (jbool(model, "byte_fallback"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE byte_fallback");
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(model, keys[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE %s", keys[k]);
    }
    t->ignore_merges = jbool(model, "ignore_merges");
    t->fuse_unk = jbool(model, "fuse_unk");

    /* id space: vocab ids and added-token ids */
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return tl_errf(err, errlen, TL_ERR_FORMAT, "added_tokens is not a list");
    int64_t max_id = -1;
    for (size_t e = 0; e < j->n_vocab; e++)
        if (j->vocab[e].id > max_id) max_id = j->vocab[e].id;
    size_t n_added = json_array_size(added);
    added_def *defs = calloc(n_added ? n_added : 1, sizeof *defs);
    bl_map bm = {0};
    if (!defs) return TL_ERR_NOMEM;
    int st = 0;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 30) || !json_is_string(content)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "added_tokens[%zu] needs an id and a content",
                         i);
            goto done;
        }
        if (jbool(a, "lstrip") || jbool(a, "rstrip") || jbool(a, "single_word")) {
            st = tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                         "added token \"%.40s\" with lstrip/rstrip/single_word",
                         json_string_value(content));
            goto done;
        }
        defs[i].id = (int32_t)json_integer_value(id);
        defs[i].content = json_string_value(content);
        defs[i].special = jbool(a, "special");
        json_t *norm = json_object_get(a, "normalized");
        defs[i].normalized = norm ? json_is_true(norm) : !defs[i].special; /* HF default */
        if (defs[i].id > max_id) max_id = defs[i].id;
    }
    t->n_vocab = (int)(max_id + 1);
    if ((st = bl_map_build(&bm, j))) goto done;

    /* id -> bytes; vstr/vlen: the string each id stands for (the last vocab entry with that id
     * whose key was not given again later, or the added token) */
    uint32_t b2u[256];
    int16_t u2b[324];
    bytelevel_tables(b2u, u2b);
    size_t nv = (size_t)t->n_vocab;
    const char **vstr = calloc(nv ? nv : 1, sizeof *vstr);
    size_t *vlen = calloc(nv ? nv : 1, sizeof *vlen);
    t->off = calloc(nv + 1, sizeof *t->off);
    t->flags = calloc(nv ? nv : 1, 1);
    t->present = calloc(nv ? nv : 1, 1);
    uint8_t *mapped = calloc(nv ? nv : 1, 1);
    if (!vstr || !vlen || !t->off || !t->flags || !t->present || !mapped) {
        free(vstr);
        free(vlen);
        free(mapped);
        st = TL_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < bm.cap; i++) {
        if (!bm.slot[i]) continue;
        const vocab_ent *e = &j->vocab[bm.slot[i] - 1];
        vstr[e->id] = j->strs.p + e->off;
        vlen[e->id] = e->len;
    }
    for (size_t i = 0; i < n_added; i++) {
        vstr[defs[i].id] = defs[i].content;
        vlen[defs[i].id] = strlen(defs[i].content);
        t->flags[defs[i].id] = (uint8_t)(TOKF_ADDED | (defs[i].special ? TOKF_SPECIAL : 0));
    }
    bbuf arena = {0};
    for (size_t id = 0; id < nv; id++) {
        t->off[id] = (uint32_t)arena.n;
        if (!vstr[id]) continue;
        t->present[id] = 1;
        mapped[id] = (uint8_t)bytelevel_decode(u2b, vstr[id], vlen[id], &arena);
        if (arena.n > UINT32_MAX / 2) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "vocabulary too large");
            break;
        }
    }
    t->off[nv] = (uint32_t)arena.n;
    t->arena = arena.p ? arena.p : xmalloc(1);
    free(vstr);
    free(vlen);
    if (st) {
        free(mapped);
        goto done;
    }

    /* raw bytes -> id for vocabulary tokens (added tokens are found through the tries) */
    t->vcap = 16;
    while (t->vcap < 2 * nv + 16) t->vcap *= 2;
    t->vhash = calloc(t->vcap, sizeof *t->vhash);
    if (!t->vhash) {
        free(mapped);
        st = TL_ERR_NOMEM;
        goto done;
    }
    for (int pass = 0; pass < 2; pass++)
        for (size_t id = 0; id < nv; id++)
            if (t->present[id] && !(t->flags[id] & TOKF_ADDED) && mapped[id] == !pass &&
                t->off[id + 1] > t->off[id])
                vocab_insert(t, (int32_t)id);
    free(mapped);
    if ((st = load_merges(t, j, &bm, err, errlen))) goto done;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t ul = utf8_encode(b2u[b], u);
        t->byte_id[b] = bl_map_find(&bm, (const char *)u, ul);
    }
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk))
        t->unk_id = bl_map_find(&bm, json_string_value(unk), json_string_length(unk));

    /* tries; normalized added tokens are matched in NFC text, so their content is NFC'd too */
    trie_item *raw = calloc(n_added + 1, sizeof *raw), *norm = calloc(n_added + 1, sizeof *norm);
    char **owned = calloc(n_added + 1, sizeof *owned);
    size_t nr = 0, nn = 0;
    if (!raw || !norm || !owned) st = TL_ERR_NOMEM;
    for (size_t i = 0; i < n_added && !st; i++) {
        const char *c = defs[i].content;
        size_t cl = strlen(c);
        if (!cl) continue;
        if (defs[i].normalized && t->nfc) {
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t ol = utf8proc_map((const uint8_t *)c, (utf8proc_ssize_t)cl, &o,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (ol < 0) {
                st = tl_errf(err, errlen, TL_ERR_FORMAT, "added token \"%.40s\": bad UTF-8", c);
                break;
            }
            owned[i] = (char *)o;
            norm[nn++] = (trie_item){(char *)o, (size_t)ol, defs[i].id};
        } else if (defs[i].normalized) {
            norm[nn++] = (trie_item){c, cl, defs[i].id};
        } else {
            raw[nr++] = (trie_item){c, cl, defs[i].id};
        }
    }
    if (!st) st = trie_build(&t->added_raw, raw, nr);
    if (!st) st = trie_build(&t->added_norm, norm, nn);
    for (size_t i = 0; owned && i < n_added; i++) free(owned[i]);
    free(owned);
    free(raw);
    free(norm);
done:
    free(bm.slot);
    free(defs);
    return st;
}

static int load_root(tl_tokenizer *t, const tokjson *j, char *err, size_t errlen) {
    json_t *root = j->root;
    /* the normalizer first: load_model NFCs the content of normalized added tokens */
    int st = load_normalizer(t, json_object_get(root, "normalizer"), err, errlen);
    if (!st) st = load_model(t, j, err, errlen);
    if (!st) st = load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), err, errlen);
    if (st) return st;
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && !is_type(dec, "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "decoder %s (only ByteLevel)",
                       type_of(dec));
    json_t *post = json_object_get(root, "post_processor");
    if (post && !json_is_null(post) && !is_type(post, "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "post_processor %s (only ByteLevel or none)", type_of(post));
    return 0;
}

/* Builds the tokenizer from a parsed file (or arrays); frees j in every case. */
static int tokenizer_from_tj(tokjson *j, tl_tokenizer **out, char *err, size_t errlen) {
    tl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tj_free(j);
        return TL_ERR_NOMEM;
    }
    for (int i = 0; i < CACHE_LOCKS; i++) pthread_mutex_init(&t->locks[i], NULL);
    int st = load_root(t, j, err, errlen);
    tj_free(j);
    if (!st) {
        t->cache_slots = t->n_vocab > 4096 ? CACHE_SLOTS : 4096;
        t->cache = calloc(t->cache_slots, sizeof *t->cache);
        if (!t->cache) st = TL_ERR_NOMEM;
    }
    if (st) {
        tl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return 0;
}

int tl_tokenizer_load_json(const char *json, size_t len, tl_tokenizer **out, char *err,
                           size_t errlen) {
    *out = NULL;
    tokjson j = {0};
    j.err = err;
    j.errlen = errlen;
    int st = tj_parse(&j, json, len);
    if (st) {
        tj_free(&j);
        return st;
    }
    return tokenizer_from_tj(&j, out, err, errlen);
}

static const char QWEN35_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *tl_bpe_regex_for_pre(const char *pre) {
    if (!pre) return NULL;
    if (!strcmp(pre, "qwen35")) return QWEN35_REGEX;
    if (!strcmp(pre, "qwen2")) return QWEN2_REGEX;
    return NULL;
}

int tl_tokenizer_load_arrays(const tl_tokenizer_arrays *a, tl_tokenizer **out, char *err,
                             size_t errlen) {
    *out = NULL;
    tokjson j = {0};
    j.err = err;
    j.errlen = errlen;
    j.root = json_object();
    j.model = json_pack("{s:s}", "type", "BPE");
    json_t *added = json_array();
    int st = 0;
    j.has_vocab = j.has_merges = 1;
    j.vocab = malloc((a->n_tokens ? a->n_tokens : 1) * sizeof *j.vocab);
    j.merges = malloc((a->n_merges ? a->n_merges : 1) * sizeof *j.merges);
    if (!j.root || !j.model || !added || !j.vocab || !j.merges || a->n_tokens >= (1u << 30)) {
        json_decref(added);
        tj_free(&j);
        return TL_ERR_NOMEM;
    }
    for (size_t i = 0; i < a->n_tokens && !st; i++) {
        const char *tok = a->tokens[i];
        int32_t ty = a->types ? a->types[i] : 1;
        if (!tok) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "token %zu is missing", i);
        } else if (ty == 3 || ty == 4) {
            json_array_append_new(added,
                                  json_pack("{s:I,s:s,s:b,s:b}", "id", (json_int_t)i, "content",
                                            tok, "special", ty == 3, "normalized", 0));
        } else {
            vocab_ent *e = &j.vocab[j.n_vocab++];
            e->off = (uint32_t)j.strs.n;
            e->len = (uint32_t)strlen(tok);
            e->id = (int64_t)i;
            if (bbuf_put(&j.strs, tok, e->len + 1)) st = TL_ERR_NOMEM;
        }
    }
    for (size_t i = 0; i < a->n_merges && !st; i++) {
        const char *m = a->merges[i], *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || strchr(sp + 1, ' ')) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "merge %zu \"%.40s\" is not two tokens", i,
                         m ? m : "(null)");
            break;
        }
        merge_ent *e = &j.merges[j.n_merges++];
        e->a = (uint32_t)j.strs.n;
        e->la = (uint32_t)(sp - m);
        e->b = e->a + e->la + 1;
        e->lb = (uint32_t)strlen(sp + 1);
        if (bbuf_put(&j.strs, m, e->la + 1 + e->lb + 1))
            st = TL_ERR_NOMEM;
        else
            j.strs.p[e->a + e->la] = 0;
    }
    if (st) {
        json_decref(added);
        tj_free(&j);
        return st;
    }
    const char *rx = a->pre_regex ? a->pre_regex : QWEN35_REGEX;
    json_object_set_new(j.root, "added_tokens", added);
    if (a->nfc) json_object_set_new(j.root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_object_set_new(j.root, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]}", "type",
                                  "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                                  rx, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                                  "add_prefix_space", 0, "use_regex", 0));
    return tokenizer_from_tj(&j, out, err, errlen);
}

int tl_tokenizer_load(const char *path, tl_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    char *file = NULL;
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        file = xmalloc(n);
        snprintf(file, n, "%s/tokenizer.json", path);
    }
    const char *p = file ? file : path;
    char *data;
    size_t len;
    int st = tl_read_file(p, &data, &len, err, errlen);
    if (!st) {
        char sub[200];
        st = tl_tokenizer_load_json(data, len, out, sub, sizeof sub);
        if (st) tl_errf(err, errlen, st, "%s: %s", p, sub);
        free(data);
    }
    free(file);
    return st;
}

void tl_tokenizer_free(tl_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->flags);
    free(t->present);
    free(t->vhash);
    free(t->mkey);
    free(t->mval);
    trie_free(&t->added_raw);
    trie_free(&t->added_norm);
    if (t->re) pcre2_code_free(t->re);
    if (t->re_compat) pcre2_code_free(t->re_compat);
    free(t->cache);
    for (int i = 0; i < CACHE_LOCKS; i++) pthread_mutex_destroy(&t->locks[i]);
    free(t);
}

/* ====== Lookups. ====== */

int tl_tokenizer_n_vocab(const tl_tokenizer *t) { return t->n_vocab; }

int tl_token_id(const tl_tokenizer *t, const char *text) {
    size_t n = strlen(text);
    if (!n) return TL_ERR_INVALID;
    for (int k = 0; k < 2; k++) {
        const trie *tr = k ? &t->added_norm : &t->added_raw;
        size_t ml = 0;
        int32_t id = tr->n_tokens ? trie_longest(tr, (const uint8_t *)text, n, &ml) : -1;
        if (id >= 0 && ml == n) return id;
    }
    int32_t id = vocab_find(t, text, n);
    return id >= 0 ? id : TL_ERR_INVALID;
}

const char *tl_token_str(const tl_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !t->present[id]) {
        *len = 0;
        return NULL;
    }
    return (const char *)tok_bytes(t, id, len);
}

int tl_token_is_special(const tl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_SPECIAL);
}

int tl_token_is_added(const tl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_ADDED);
}

/* ====== BPE on one pre-tokenized piece. ====== */

typedef struct {
    uint32_t rank;
    int32_t pos, new_id;
} heap_ent;

static int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

typedef struct {
    int32_t c, prev, next, len;
} bpe_sym;

#define BPE_STACK 64

/* HF's Word::merge_all on the bytes of one piece; appends the ids to out. */
static int bpe_word(const tl_tokenizer *t, const uint8_t *s, size_t n, tl_tok_ids *out) {
    bpe_sym sym_stack[BPE_STACK];
    heap_ent heap_stack[3 * BPE_STACK];
    bpe_sym *sym = sym_stack;
    heap_ent *heap = heap_stack;
    if (n > BPE_STACK) {
        sym = malloc(n * sizeof *sym);
        heap = malloc(3 * n * sizeof *heap);
        if (!sym || !heap) {
            free(sym);
            free(heap);
            return TL_ERR_NOMEM;
        }
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue; /* HF drops a character with no token and no unk */
            if (t->fuse_unk && ns > 0 && sym[ns - 1].c == t->unk_id) {
                sym[ns - 1].len++;
                continue;
            }
            id = t->unk_id;
        }
        sym[ns] = (bpe_sym){id, ns - 1, ns + 1, 1};
        ns++;
    }
    if (ns) sym[ns - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) {
        const merge_val *m = merge_find(t, sym[i].c, sym[i + 1].c);
        if (m) heap_push(heap, &nh, (heap_ent){m->rank, i, m->new_id});
    }
    /* Each merge pushes at most two entries and removes one symbol, so the heap never holds
     * more than 3n entries. */
    while (nh) {
        heap_ent top = heap_pop(heap, &nh);
        bpe_sym *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t np = cur->next;
        const merge_val *m = merge_find(t, cur->c, sym[np].c);
        if (!m || m->new_id != top.new_id) continue;
        cur->c = top.new_id;
        cur->len += sym[np].len;
        cur->next = sym[np].next;
        sym[np].len = 0;
        if (cur->next >= 0) sym[cur->next].prev = top.pos;
        if (cur->prev >= 0) {
            const merge_val *mp = merge_find(t, sym[cur->prev].c, cur->c);
            if (mp) heap_push(heap, &nh, (heap_ent){mp->rank, cur->prev, mp->new_id});
        }
        if (cur->next >= 0) {
            const merge_val *mn = merge_find(t, cur->c, sym[cur->next].c);
            if (mn) heap_push(heap, &nh, (heap_ent){mn->rank, top.pos, mn->new_id});
        }
    }
    int st = ids_reserve(out, (size_t)ns);
    if (!st)
        for (int32_t i = 0; i < ns; i++)
            if (sym[i].len) out->ids[out->n++] = sym[i].c;
    if (sym != sym_stack) {
        free(sym);
        free(heap);
    }
    return st;
}

/* BPE with the word cache in front. The cache only holds short pieces with few ids; it is
 * direct-mapped (a colliding word evicts the old one) and each slot is read and written under
 * its stripe's mutex. */
static int bpe_piece(const tl_tokenizer *t, const uint8_t *s, size_t n, tl_tok_ids *out) {
    if (n == 1 && t->byte_id[s[0]] >= 0 && !t->ignore_merges) {
        if (ids_reserve(out, 1)) return TL_ERR_NOMEM;
        out->ids[out->n++] = t->byte_id[s[0]];
        return 0;
    }
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, s, n);
        if (id >= 0 && !(t->flags[id] & TOKF_ADDED)) {
            if (ids_reserve(out, 1)) return TL_ERR_NOMEM;
            out->ids[out->n++] = id;
            return 0;
        }
    }
    if (n > CACHE_MAX_LEN) return bpe_word(t, s, n, out);
    uint64_t h = hash_bytes(s, n);
    size_t slot = (size_t)(h & (t->cache_slots - 1));
    pthread_mutex_t *lock = (pthread_mutex_t *)&t->locks[slot % CACHE_LOCKS];
    cache_slot *c = &t->cache[slot];
    pthread_mutex_lock(lock);
    if (c->len == n && c->hash == (uint32_t)(h >> 32) && !memcmp(c->bytes, s, n)) {
        int nid = c->n_ids;
        if (ids_reserve(out, (size_t)nid)) {
            pthread_mutex_unlock(lock);
            return TL_ERR_NOMEM;
        }
        memcpy(out->ids + out->n, c->ids, (size_t)nid * sizeof(int32_t));
        out->n += (size_t)nid;
        pthread_mutex_unlock(lock);
        return 0;
    }
    pthread_mutex_unlock(lock);
    size_t before = out->n;
    int st = bpe_word(t, s, n, out);
    if (st || out->n == before || out->n - before > CACHE_MAX_IDS) return st;
    pthread_mutex_lock(lock);
    c->hash = (uint32_t)(h >> 32);
    c->len = (uint8_t)n;
    c->n_ids = (uint8_t)(out->n - before);
    memcpy(c->bytes, s, n);
    memcpy(c->ids, out->ids + before, (out->n - before) * sizeof(int32_t));
    pthread_mutex_unlock(lock);
    return 0;
}

/* ====== Encoding pipeline. ====== */

typedef struct {
    const tl_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    unsigned flags;
    tl_tok_ids *out;
} enc_ctx;

static int regex_match(enc_ctx *e, const pcre2_code *re, int jit, const uint8_t *s, size_t n,
                       size_t off) {
    int rc;
    for (;;) {
        if (jit)
            rc = pcre2_jit_match(re, s, n, off, 0, e->md, e->mctx);
        else
            rc = pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || e->jstack) return rc;
        /* deep backtracking (very long runs): retry once with a big JIT stack */
        e->mctx = pcre2_match_context_create(NULL);
        e->jstack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
        if (!e->mctx || !e->jstack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
    }
}

/* Splits normalized text with the pre-tokenizer regex (Isolated: matches and the gaps between
 * them are both pieces) and runs BPE on each piece. */
static int encode_pretok(enc_ctx *e, const uint8_t *s, size_t n) {
    const tl_tokenizer *t = e->t;
    const pcre2_code *re = t->re;
    int jit = t->jit;
    if (t->re_compat && needs_compat(s, n)) re = t->re_compat, jit = t->jit_compat;
    size_t last = 0, off = 0;
    while (off < n) {
        int rc = regex_match(e, re, jit, s, n, off);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return rc == PCRE2_ERROR_NOMEMORY ? TL_ERR_NOMEM : TL_ERR_INTERNAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m0 > last) {
            int st = bpe_piece(e->t, s + last, m0 - last, e->out);
            if (st) return st;
        }
        if (m1 > m0) {
            int st = bpe_piece(e->t, s + m0, m1 - m0, e->out);
            if (st) return st;
            off = last = m1;
        } else { /* empty match: splits the gap here; step one character */
            last = m0;
            if (m0 >= n) break;
            size_t adv = 1;
            utf8_step(s + m0, n - m0, &adv);
            off = m0 + adv;
        }
    }
    if (last < n) return bpe_piece(e->t, s + last, n - last, e->out);
    return 0;
}

/* Splits text at added tokens of trie tr (leftmost-longest, HF's Aho-Corasick match kind); the
 * text between them goes to next(). With TL_TOKENIZE_SPLIT_SPECIAL a special token's match is
 * left in the text, as HF does (the search then resumes after it). */
static int split_added(enc_ctx *e, const trie *tr, const uint8_t *s, size_t n,
                       int (*next)(enc_ctx *, const uint8_t *, size_t)) {
    if (!tr->n_tokens) return next(e, s, n);
    size_t gap = 0, i = 0;
    while (i < n) {
        if (tr->root[s[i]] < 0) {
            i++;
            continue;
        }
        size_t ml = 0;
        int32_t id = trie_longest(tr, s + i, n - i, &ml);
        if (id < 0) {
            i++;
            continue;
        }
        if ((e->flags & TL_TOKENIZE_SPLIT_SPECIAL) && (e->t->flags[id] & TOKF_SPECIAL)) {
            i += ml;
            continue;
        }
        if (i > gap) {
            int st = next(e, s + gap, i - gap);
            if (st) return st;
        }
        if (ids_reserve(e->out, 1)) return TL_ERR_NOMEM;
        e->out->ids[e->out->n++] = id;
        i += ml;
        gap = i;
    }
    if (gap < n) return next(e, s + gap, n - gap);
    return 0;
}

static int encode_normalized(enc_ctx *e, const uint8_t *s, size_t n) {
    return split_added(e, &e->t->added_norm, s, n, encode_pretok);
}

/* ====== NFC as HF computes it. ======
 * HF tokenizers' normalization tables predate Unicode 15 (utf8proc's): the marks below are unknown
 * to it, so it treats each as a starter that neither decomposes nor composes, and canonical
 * reordering does not move it. We get the same by cutting the text at those code points and
 * running utf8proc's NFC on the pieces between them. Generated and verified against HF by
 * tools/tok_nfc_compat.py (see notes/2026-12-02-tokenizer.md); rerun it when either library's
 * Unicode version changes. */
/* 111 code points, 39 ranges; utf8proc 15.0.0; 15141 candidates checked */
static const uint32_t HF_NFC_OPAQUE[][2] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E},
    {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
    {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}};

static int nfc_opaque(uint32_t cp) {
    if (cp < HF_NFC_OPAQUE[0][0]) return 0;
    int lo = 0, hi = (int)(sizeof HF_NFC_OPAQUE / sizeof HF_NFC_OPAQUE[0]) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < HF_NFC_OPAQUE[mid][0])
            hi = mid - 1;
        else if (cp > HF_NFC_OPAQUE[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

static int nfc_append(bbuf *b, const uint8_t *s, size_t n) {
    if (!n) return 0;
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t ol =
        utf8proc_map(s, (utf8proc_ssize_t)n, &o, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (ol < 0) return ol == UTF8PROC_ERROR_NOMEM ? TL_ERR_NOMEM : TL_ERR_INTERNAL;
    int st = bbuf_put(b, o, (size_t)ol);
    free(o);
    return st;
}

/* NFC of valid UTF-8 s, appended to b. Only the stretches that can change are given to
 * utf8proc: a character below U+0300 has combining class 0 and is never the second half of a
 * composition, so the text splits before it without changing the result. A stretch is a run of
 * characters >= U+0300 plus the character just before it (a base letter may compose with the
 * run's first mark). Opaque characters (above) end a stretch and are copied as they are. */
static int nfc_hf(const uint8_t *s, size_t n, bbuf *b) {
    size_t i = 0, copied = 0, low = SIZE_MAX; /* low: start of the previous char if < U+0300 */
    while (i < n) {
        if (s[i] < 0xCC) {
            low = i;
            i += s[i] < 0x80 ? 1 : 2;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return TL_ERR_INTERNAL;
        if (nfc_opaque((uint32_t)cp)) {
            low = SIZE_MAX;
            i += (size_t)k;
            continue;
        }
        size_t r = low != SIZE_MAX ? low : i, j = i + (size_t)k;
        while (j < n && s[j] >= 0xCC) {
            k = utf8proc_iterate(s + j, (utf8proc_ssize_t)(n - j), &cp);
            if (k <= 0) return TL_ERR_INTERNAL;
            if (nfc_opaque((uint32_t)cp)) break;
            j += (size_t)k;
        }
        int st = bbuf_put(b, s + copied, r - copied);
        if (st || (st = nfc_append(b, s + r, j - r))) return st;
        copied = i = j;
        low = SIZE_MAX;
    }
    return bbuf_put(b, s + copied, n - copied);
}

/* NFC, skipped when no byte could start a character >= U+0300: every code point below U+0300
 * has combining class 0 and is its own NFC, and nothing before it can compose with it. */
static int encode_gap(enc_ctx *e, const uint8_t *s, size_t n) {
    if (!e->t->nfc) return encode_normalized(e, s, n);
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++;
    if (i == n) return encode_normalized(e, s, n);
    bbuf b = {0};
    int st = nfc_hf(s, n, &b);
    if (!st) st = encode_normalized(e, (const uint8_t *)b.p, b.n);
    free(b.p);
    return st;
}

int tl_tokenize(const tl_tokenizer *t, const char *text, size_t len, unsigned flags,
                tl_tok_ids *out) {
    size_t before = out->n;
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *fixed = NULL;
    if (utf8_valid_len(s, len) != len) {
        fixed = malloc(3 * len);
        if (!fixed) return TL_ERR_NOMEM;
        len = utf8_repair(s, len, fixed);
        s = fixed;
    }
    enc_ctx e = {t, NULL, NULL, NULL, flags, out};
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    int st = e.md ? 0 : TL_ERR_NOMEM;
    if (!st && len) st = split_added(&e, &t->added_raw, s, len, encode_gap);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.mctx) pcre2_match_context_free(e.mctx);
    if (e.jstack) pcre2_jit_stack_free(e.jstack);
    free(fixed);
    if (st) {
        out->n = before;
        return st;
    }
    size_t added = out->n - before;
    return added > INT32_MAX ? TL_ERR_INVALID : (int)added;
}

/* ====== Decoding. ====== */

int tl_detokenize(const tl_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                  size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    bbuf raw = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            free(raw.p);
            return TL_ERR_INVALID;
        }
        if (!t->present[id]) continue;
        if ((flags & TL_DETOK_SKIP_SPECIAL) && (t->flags[id] & TOKF_SPECIAL)) continue;
        size_t l;
        const uint8_t *b = tok_bytes(t, id, &l);
        if (bbuf_put(&raw, b, l)) {
            free(raw.p);
            return TL_ERR_NOMEM;
        }
    }
    char *res = malloc(3 * raw.n + 1);
    if (!res) {
        free(raw.p);
        return TL_ERR_NOMEM;
    }
    size_t rl = raw.n ? utf8_repair((const uint8_t *)raw.p, raw.n, (uint8_t *)res) : 0;
    res[rl] = 0;
    free(raw.p);
    *out = res;
    *out_len = rl;
    return 0;
}

struct tl_detok_stream {
    const tl_tokenizer *t;
    unsigned flags;
    uint8_t pend[4];
    size_t n_pend;
    bbuf in, out;
};

int tl_detok_stream_create(const tl_tokenizer *t, unsigned flags, tl_detok_stream **out) {
    tl_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return TL_ERR_NOMEM;
    s->t = t;
    s->flags = flags;
    *out = s;
    return 0;
}

void tl_detok_stream_free(tl_detok_stream *s) {
    if (!s) return;
    free(s->in.p);
    free(s->out.p);
    free(s);
}

size_t tl_detok_stream_pending(const tl_detok_stream *s) { return s->n_pend; }

/* Emits every character of pend+bytes that is decided: complete characters as they are,
 * invalid subparts as U+FFFD; a truncated (still possibly valid) tail, at most 3 bytes, stays in
 * pend. utf8_step decides from at most 4 bytes and reports TRUNCATED only at the buffer's end,
 * so this gives the same characters as repairing the whole concatenation at once. */
static int stream_feed(tl_detok_stream *s, const uint8_t *b, size_t n) {
    s->in.n = 0;
    s->out.n = 0;
    if (bbuf_put(&s->in, s->pend, s->n_pend) || (n && bbuf_put(&s->in, b, n)) ||
        bbuf_reserve(&s->out, 3 * s->in.n + 1))
        return TL_ERR_NOMEM;
    const uint8_t *in = (const uint8_t *)s->in.p;
    uint8_t *o = (uint8_t *)s->out.p;
    size_t i = 0, on = 0, adv, m = s->in.n;
    s->n_pend = 0;
    while (i < m) {
        int r = utf8_step(in + i, m - i, &adv);
        if (r == UTF8_TRUNCATED) {
            memcpy(s->pend, in + i, m - i);
            s->n_pend = m - i;
            break;
        }
        if (r == UTF8_OK) {
            memcpy(o + on, in + i, adv);
            on += adv;
        } else {
            o[on++] = 0xEF, o[on++] = 0xBF, o[on++] = 0xBD;
        }
        i += adv;
    }
    s->out.n = on;
    o[on] = 0;
    return 0;
}

int tl_detok_stream_push(tl_detok_stream *s, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (id < 0 || id >= s->t->n_vocab) return TL_ERR_INVALID;
    size_t l = 0;
    const uint8_t *b = NULL;
    if (s->t->present[id] &&
        !((s->flags & TL_DETOK_SKIP_SPECIAL) && (s->t->flags[id] & TOKF_SPECIAL)))
        b = tok_bytes(s->t, id, &l);
    int st = stream_feed(s, b, l);
    if (st) return st;
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}

int tl_detok_stream_flush(tl_detok_stream *s, const char **text, size_t *len) {
    if (bbuf_reserve(&s->out, 4)) return TL_ERR_NOMEM;
    s->out.n = 0;
    if (s->n_pend) bbuf_put(&s->out, "\xEF\xBF\xBD", 3);
    s->out.p[s->out.n] = 0;
    s->n_pend = 0;
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}
