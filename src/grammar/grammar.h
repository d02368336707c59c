/* Constrained decoding: a JSON Schema compiled to a byte-level grammar, an incremental matcher
 * state per sequence, and the allowed-token mask computed by walking a byte trie of the
 * vocabulary alongside the matcher (docs/architecture.md, "Constrained decoding").
 *
 * Whitespace policy: none. The grammar produces compact JSON (no optional whitespace anywhere,
 * as json.dumps(separators=(",", ":"))). Object properties come in the schema's declaration order.
 *
 * Threading: a tl_grammar and a tl_grammar_vocab are immutable once built and may be shared by
 * many threads; a tl_grammar_state belongs to one thread at a time.
 * Errors: 0 = success, negative tl_status; compile errors name the offending keyword in err. */
#ifndef TL_GRAMMAR_H
#define TL_GRAMMAR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tl_grammar tl_grammar;
typedef struct tl_grammar_state tl_grammar_state;
typedef struct tl_grammar_vocab tl_grammar_vocab;

/* Compiles a JSON Schema (draft 2020-12 subset, see the architecture doc) into *out.
 * A keyword that cannot be honoured gives TL_ERR_UNSUPPORTED with err naming it; a malformed
 * schema TL_ERR_INVALID. On failure *out is NULL. */
int tl_grammar_from_schema(const json_t *schema, tl_grammar **out, char *err, size_t errlen);

/* The grammar of any JSON object ({"type":"json_object"} mode). */
int tl_grammar_json_object(tl_grammar **out, char *err, size_t errlen);

void tl_grammar_free(tl_grammar *g);

/* A fresh matcher at the start of the document. g must outlive the state. */
int tl_grammar_state_new(const tl_grammar *g, tl_grammar_state **out);
void tl_grammar_state_free(tl_grammar_state *s);
/* A copy of s (for speculative checks); *out owned by the caller. */
int tl_grammar_state_clone(const tl_grammar_state *s, tl_grammar_state **out);

/* Feeds one byte / n bytes. 0 if accepted; TL_ERR_INVALID if the grammar rejects it (the state
 * is then unchanged: for accept_bytes, nothing of the n bytes is consumed); TL_ERR_NOMEM. */
int tl_grammar_accept_byte(tl_grammar_state *s, uint8_t b);
int tl_grammar_accept_bytes(tl_grammar_state *s, const uint8_t *p, size_t n);

/* 1 if the bytes so far form a complete document, else 0. */
int tl_grammar_is_complete(const tl_grammar_state *s);
/* 1 if some continuation is still possible (more bytes may be accepted), else 0. */
int tl_grammar_can_continue(const tl_grammar_state *s);

/* The vocabulary as byte strings: bytes[i] (lens[i] bytes) is token i; NULL or length 0 = a
 * token never produced inside the grammar (holes, special and added tokens). The strings are
 * copied into a byte trie. */
int tl_grammar_vocab_new(const char *const *bytes, const size_t *lens, int n_vocab,
                         tl_grammar_vocab **out);
/* The same from a loaded tokenizer: every vocabulary token's bytes; added tokens (special or
 * not: <|im_end|>, <think>, <tool_call>) and holes are left out of the trie. */
struct tl_tokenizer;
int tl_grammar_vocab_from_tokenizer(const struct tl_tokenizer *tok, tl_grammar_vocab **out);
void tl_grammar_vocab_free(tl_grammar_vocab *v);
int tl_grammar_vocab_size(const tl_grammar_vocab *v);

/* The allowed tokens after state s as a bitmap: bit i of mask[i / 32] for token i, mask holds
 * (n_vocab + 31) / 32 words. A vocabulary token is allowed when all its bytes are accepted in
 * sequence; end_ids[0..n_end) (EOS-like ids) are allowed exactly when s is complete. */
int tl_grammar_mask(const tl_grammar_state *s, const tl_grammar_vocab *v, const int32_t *end_ids,
                    size_t n_end, uint32_t *mask);

/* The same, keeping only tokens after which the document can still be completed in at most
 * max_dist bytes (tl_grammar_distance); max_dist < 0: no bound (tl_grammar_mask). */
int tl_grammar_mask_within(const tl_grammar_state *s, const tl_grammar_vocab *v,
                           const int32_t *end_ids, size_t n_end, int max_dist, uint32_t *mask);

/* The reference for the two above: the plain walk of the trie that advances the matcher's stack
 * set over every edge (no memo, no cache; about 100 ms on the 151K Qwen vocabulary inside a free
 * string). Same arguments and result; tests compare the fast masks with it bit for bit. */
int tl_grammar_mask_ref(const tl_grammar_state *s, const tl_grammar_vocab *v,
                        const int32_t *end_ids, size_t n_end, int max_dist, uint32_t *mask);

/* A mask cache for one grammar and one vocabulary (src/grammar/cache.c): matcher states interned
 * by their exact stack set with their byte transitions memoized, and the last n_masks masks
 * (0: none kept) by the state they start from (docs/architecture.md §9 "Mask"). Belongs to one
 * thread at a time (one per constrained sequence); bounded memory (a full state table is
 * emptied at the next call). g and v must outlive it. */
typedef struct tl_grammar_cache tl_grammar_cache;
int tl_grammar_cache_new(const tl_grammar *g, const tl_grammar_vocab *v, int n_masks,
                         tl_grammar_cache **out);
void tl_grammar_cache_free(tl_grammar_cache *c);
/* tl_grammar_mask_within through the cache: the same bits. s must be a state of c's grammar
 * (else TL_ERR_INVALID). */
int tl_grammar_mask_cached(tl_grammar_cache *c, const tl_grammar_state *s, const int32_t *end_ids,
                           size_t n_end, int max_dist, uint32_t *mask);
/* Counters of c since it was made: masks served from the LRU, masks walked, states interned. */
void tl_grammar_cache_stats(const tl_grammar_cache *c, uint64_t *hits, uint64_t *walks,
                            uint64_t *states);

/* The fewest bytes that complete the document from s: 0 when it is complete, 1 << 29 when no
 * finite continuation completes it. */
int tl_grammar_distance(const tl_grammar_state *s);

/* What tl_grammar_compile builds: a document of one kind, after an optional literal prefix. */
typedef enum tl_grammar_kind {
    TL_GRAMMAR_SCHEMA = 0,  /* JSON valid under `schema` (tl_grammar_from_schema) */
    TL_GRAMMAR_JSON_OBJECT, /* any JSON object */
    TL_GRAMMAR_REGEX,       /* a string matching `regex` (the subset of src/grammar/regex.c) */
    TL_GRAMMAR_CHOICE,      /* exactly one of the strings of the array `choices` */
    TL_GRAMMAR_TOOL_CALLS,  /* Qwen3.6 tool calls (src/grammar/toolcall.c) */
} tl_grammar_kind;

typedef struct tl_grammar_spec {
    tl_grammar_kind kind;
    const json_t *schema;  /* SCHEMA */
    const char *regex;     /* REGEX */
    const json_t *choices; /* CHOICE: non-empty array of strings */
    const json_t *tools;   /* TOOL_CALLS: OpenAI tools [{"type":"function","function":{...}}] */
    const char *tool_name; /* TOOL_CALLS: NULL = any of tools, else only this one */
    int parallel;          /* TOOL_CALLS: several calls allowed (else exactly one) */
    int lenient;           /* TOOL_CALLS: a tool that is not strict has the parts of its schema
                              the grammar cannot take relaxed (toolcall.c) instead of failing;
                              err then names the last one relaxed */
    const char *prefix;    /* NULL or literal bytes before the document (e.g. "\n\n") */
} tl_grammar_spec;

/* Compiles a spec. TL_ERR_UNSUPPORTED names what cannot be honoured (a schema keyword, a regex
 * construct, a tool parameter's keyword); TL_ERR_INVALID a malformed input. */
int tl_grammar_compile(const tl_grammar_spec *sp, tl_grammar **out, char *err, size_t errlen);

#endif
