/* Private to the tokenizer's files: the tl_tokenizer object and what its parts share.
 *   bpe.c        the object's tables (vocabulary and merge hashes, added-token tries), BPE,
 *                the encoding pipeline, NFC, decoding;
 *   bpe_load.c   tokenizer.json (or GGUF-style arrays) -> tl_tokenizer, and tl_tokenizer_free;
 *   bpe_regex.c  the pre-tokenizer regex: HF's Oniguruma patterns rewritten for PCRE2;
 *   bpe_seg.c    the segment cache (ids of long text between added tokens);
 *   tokjson.c    the tokenizer.json scanner (tokjson.h).
 * Everything but the two caches is immutable after load (see bpe.c). */
#ifndef TL_BPE_PRIV_H
#define TL_BPE_PRIV_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "tokenizer/bpe.h"

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
    int lead;          /* the first byte of every token when they all share one, else -1 */
    int n_tokens;
} trie;

typedef struct {
    const char *s;
    size_t n;
    int32_t id;
} trie_item;

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

/* Segment cache (bpe_seg.c): text between added tokens of at least SEG_MIN_LEN bytes -> its ids,
 * least recently used evicted beyond `budget` bytes (entry headers + ids + key bytes; the bucket
 * table, budget / 128 bytes, comes on top). SEG_MIN_LEN: measured on agent conversations of
 * 12K-32K tokens, a lower limit gains nothing more, and a limit of 128 (512) leaves 20% (75%)
 * more time in tl_tokenize on a cache hit. */
#define SEG_MIN_LEN        64
#define SEG_BUDGET_DEFAULT ((size_t)64 << 20)

typedef struct seg_entry seg_entry;

typedef struct {
    pthread_mutex_t lock;
    seg_entry **bucket; /* n_bucket chains; NULL until the first insert */
    size_t n_bucket;    /* a power of two, from the budget */
    seg_entry *newest, *oldest;
    size_t bytes, entries, budget; /* budget 0: off */
    uint64_t hits, misses, evictions;
} seg_cache;

struct tl_tokenizer {
    int n_vocab;
    /* id -> decoded bytes: arena + offsets (off[id] .. off[id + 1]); holes have length 0,
     * flags 0 and present[id] = 0. */
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
    seg_cache seg;
};

/* 1 if cp is in one of the n sorted, disjoint ranges r[i][0]..r[i][1] (binary search; the
 * Unicode tables of bpe.c and bpe_regex.c). */
static inline int bpe_in_ranges(const uint32_t (*r)[2], int n, uint32_t cp) {
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

/* ---- bpe.c: the tables ---- */

uint64_t bpe_hash_bytes(const void *data, size_t n);
/* Makes room for extra more ids in v: 0 or TL_ERR_NOMEM. */
int bpe_ids_reserve(tl_tok_ids *v, size_t extra);
/* Adds vocabulary token id to the raw-bytes hash (t->vhash sized by the caller); the first
 * token with given bytes keeps them. */
void bpe_vocab_insert(tl_tokenizer *t, int32_t id);
/* Adds merge (a, b) -> new_id at rank (t->mkey/mval sized and emptied by the caller); a later
 * duplicate overwrites an earlier one, as HF's HashMap does. */
void bpe_merge_insert(tl_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
/* Builds a trie of n items (a later duplicate content wins). 0 or TL_ERR_NOMEM. */
int bpe_trie_build(trie *t, const trie_item *items, size_t n);
void bpe_trie_free(trie *t);

/* ---- bpe_regex.c ---- */

/* The Split regex used when the pre-tokenizer is ByteLevel alone (GPT-2's), and Qwen3.5's (the
 * default of tl_tokenizer_load_arrays). */
extern const char BPE_GPT2_REGEX[];
extern const char BPE_QWEN35_REGEX[];
/* Compiles HF pattern pat (literal: a plain string) into t->re and, when the pattern has classes
 * that PCRE2's older Unicode tables lack members of, t->re_compat. Errors name the problem. */
int bpe_regex_compile(tl_tokenizer *t, const char *pat, int literal, char *err, size_t errlen);
/* 1 if valid UTF-8 s has a code point that only re_compat classifies as HF does. */
int bpe_regex_needs_compat(const uint8_t *s, size_t n);

/* ---- bpe_seg.c ---- */

void bpe_seg_init(seg_cache *c, size_t budget);
void bpe_seg_free(seg_cache *c);
/* Empties the cache and sets its budget (0: off). */
void bpe_seg_set_budget(seg_cache *c, size_t budget);
void bpe_seg_stats(seg_cache *c, tl_tok_seg_stats *out);
/* Appends the ids cached for n bytes s encoded with flags (h = bpe_hash_bytes(s, n)) to out:
 * 1 on a hit, 0 on a miss (out unchanged), TL_ERR_NOMEM. */
int bpe_seg_lookup(seg_cache *c, uint64_t h, const uint8_t *s, size_t n, unsigned flags,
                   tl_tok_ids *out);
/* Caches ids[0, n_ids) as the encoding of (s, n, flags) unless it would take more than an eighth
 * of the budget or memory runs out (then nothing happens); copies both. */
void bpe_seg_insert(seg_cache *c, uint64_t h, const uint8_t *s, size_t n, unsigned flags,
                    const int32_t *ids, size_t n_ids);

#endif
