/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen3/3.5/3.6 family).
 *
 * Pipeline of tl_tokenize, identical to HF tokenizers (the reference, tests/py/test_tokenizer.py):
 *   invalid UTF-8 -> U+FFFD (maximal subparts, as Python's bytes.decode(errors="replace"))
 *   -> added tokens matched whole (leftmost-longest, special and non-special)
 *   -> NFC on the text between them -> Split regex from the file (PCRE2-JIT, `\s` rewritten to
 *   Oniguruma's set) -> ByteLevel bytes -> BPE merges by rank.
 *
 * Threading: a loaded tl_tokenizer is immutable except for two internal caches that are
 * protected by locks (a word cache of short pieces, and a segment cache of long text between
 * added tokens, see tl_tokenize), so every function below may be called from many threads at
 * once on one tokenizer. Neither cache changes a result. A tl_detok_stream belongs to one thread
 * at a time.
 *
 * Errors: 0 / a non-negative value = success, negative tl_status = failure. Load errors carry a
 * message in (err, errlen). */
#ifndef TL_BPE_H
#define TL_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tl_tokenizer tl_tokenizer;

/* Growable id array; tl_tokenize appends to it. Start from {0} and release with
 * tl_tok_ids_free (or free(ids.ids)). */
typedef struct tl_tok_ids {
    int32_t *ids;
    size_t n, cap;
} tl_tok_ids;

void tl_tok_ids_free(tl_tok_ids *v);

/* Loads a tokenizer. path is a tokenizer.json file or a directory that contains one.
 * Supported: model.type BPE (no dropout, no byte_fallback, no unk needed), merges as "a b"
 * strings or [a, b] pairs, ignore_merges, added_tokens without lstrip/rstrip/single_word,
 * normalizer null or NFC (alone or in a Sequence), pre_tokenizer Split(Regex, Isolated) followed
 * by ByteLevel(add_prefix_space=false, use_regex=false), or ByteLevel alone with use_regex=true
 * (GPT-2 regex). Anything else is refused with TL_ERR_UNSUPPORTED and a message naming it.
 * On failure *out is NULL. */
int tl_tokenizer_load(const char *path, tl_tokenizer **out, char *err, size_t errlen);

/* Same from JSON text in memory (len bytes, need not be NUL-terminated). */
int tl_tokenizer_load_json(const char *json, size_t len, tl_tokenizer **out, char *err,
                           size_t errlen);

/* The same vocabulary given as arrays, as a GGUF file stores it (tokenizer.ggml.tokens,
 * .token_type, .merges, .pre). tokens[i] is id i: byte-level strings ("Ġthe") for BPE tokens,
 * the literal content for added ones. types (NULL = all normal) follows GGUF: 3 (control) is an
 * added special token, 4 (user-defined) an added non-special one, anything else a BPE token.
 * llama.cpp's converter marks every "<|...|>" token control, so for a Qwen GGUF <|fim_prefix|>
 * and friends come out special although tokenizer.json says otherwise (only decoding with
 * TL_DETOK_SKIP_SPECIAL and TL_TOKENIZE_SPLIT_SPECIAL see the difference). merges are "a b"
 * strings, rank = index. pre_regex is the Split regex in HF syntax (tl_bpe_regex_for_pre maps a
 * GGUF tokenizer.ggml.pre name), NULL = Qwen3.5's. nfc: 1 to NFC-normalize (Qwen: yes). */
typedef struct tl_tokenizer_arrays {
    const char *const *tokens;
    size_t n_tokens;
    const int32_t *types;
    const char *const *merges;
    size_t n_merges;
    const char *pre_regex;
    int nfc;
} tl_tokenizer_arrays;

int tl_tokenizer_load_arrays(const tl_tokenizer_arrays *a, tl_tokenizer **out, char *err,
                             size_t errlen);

/* The Split regex for a GGUF tokenizer.ggml.pre value ("qwen35", "qwen2"), or NULL if unknown. */
const char *tl_bpe_regex_for_pre(const char *pre);

void tl_tokenizer_free(tl_tokenizer *tok);

/* Size of the id space: largest id (vocab or added token) + 1. Ids below it may be holes
 * (no token); tl_token_str returns NULL for those. The model's embedding may be larger. */
int tl_tokenizer_n_vocab(const tl_tokenizer *tok);

/* Id of a token given as its text: an added token's content ("<|im_end|>", "<think>"), or the
 * raw bytes a vocabulary token stands for (" hello", not the byte-level form "Ġhello").
 * Returns the id (>= 0) or TL_ERR_INVALID when there is no such token. Use this for every
 * special token; never hard-code ids. */
int tl_token_id(const tl_tokenizer *tok, const char *text);

/* The bytes token `id` decodes to (not NUL-terminated; *len set) or NULL for an id out of range
 * or a hole. For a regular token this may be part of a UTF-8 character. Valid while tok lives. */
const char *tl_token_str(const tl_tokenizer *tok, int32_t id, size_t *len);

/* 1 if id is an added token marked "special": true (skipped by TL_DETOK_SKIP_SPECIAL), else 0.
 * <think>, </think>, <tool_call> ... are added but not special in Qwen3.6. */
int tl_token_is_special(const tl_tokenizer *tok, int32_t id);

/* 1 if id is an added token (special or not), else 0. */
int tl_token_is_added(const tl_tokenizer *tok, int32_t id);

enum {
    /* Added tokens marked special are not matched in the text: "<|im_end|>" in user content is
     * tokenized as plain text (HF's split_special_tokens / encode_special_tokens). Non-special
     * added tokens (<think>, <tool_call>) are still matched, as HF does. */
    TL_TOKENIZE_SPLIT_SPECIAL = 1u << 0,
};

/* Encodes len bytes of text (any bytes; NULs allowed) and appends the ids to *out.
 * Invalid UTF-8: each maximal invalid subpart becomes U+FFFD before anything else (the result is
 * HF's encoding of bytes.decode("utf-8", errors="replace"); HF itself refuses such input).
 * Returns the number of ids appended (>= 0), or TL_ERR_NOMEM / TL_ERR_INTERNAL (regex engine
 * failure) with *out unchanged in length. Thread-safe.
 * The ids of each stretch of text of 64 bytes or more between two added tokens are kept in a
 * segment cache (keyed by the exact bytes and flags; least recently used evicted beyond a budget
 * of 64 MiB), so text sent again, as a chat's earlier turns are, is not encoded again. */
int tl_tokenize(const tl_tokenizer *tok, const char *text, size_t len, unsigned flags,
                tl_tok_ids *out);

/* The segment cache's budget in bytes (cached ids, their key text and a small header per entry);
 * setting it empties the cache, 0 turns it off. For tests and `tulip tokenize --bench`, which
 * times the encoder itself. Thread-safe. */
void tl_tokenizer_set_seg_cache(tl_tokenizer *tok, size_t bytes);

typedef struct tl_tok_seg_stats {
    size_t entries, bytes, budget;
    uint64_t hits, misses, evictions; /* lookups of long segments since the last budget change */
} tl_tok_seg_stats;

void tl_tokenizer_seg_cache_stats(const tl_tokenizer *tok, tl_tok_seg_stats *out);

enum {
    TL_DETOK_SKIP_SPECIAL = 1u << 0, /* drop added tokens marked special */
};

/* Decodes ids to text, as HF's decode: the bytes of every token concatenated, then invalid UTF-8
 * replaced by U+FFFD (maximal subparts). Ids that are holes are skipped (as HF does); ids out of
 * [0, n_vocab) give TL_ERR_INVALID. *out is malloc'd, NUL-terminated, *out_len excludes the NUL;
 * caller frees. */
int tl_detokenize(const tl_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char **out,
                  size_t *out_len);

/* Incremental detokenizer for streaming. Feed ids one at a time; each push returns the text that
 * became complete (possibly empty: a token can end inside a UTF-8 character, whose bytes are held
 * back until the character completes or turns out invalid). Concatenating every push plus the
 * final flush gives exactly tl_detokenize of all the ids with the same flags. */
typedef struct tl_detok_stream tl_detok_stream;

int tl_detok_stream_create(const tl_tokenizer *tok, unsigned flags, tl_detok_stream **out);
void tl_detok_stream_free(tl_detok_stream *s);

/* Appends token id. *text and *len receive the newly complete UTF-8 (valid until the next call on
 * s). Returns 0, or TL_ERR_INVALID for an id out of range (nothing emitted, state unchanged),
 * or TL_ERR_NOMEM. */
int tl_detok_stream_push(tl_detok_stream *s, int32_t id, const char **text, size_t *len);

/* Ends the stream: bytes still held back (an unfinished character) come out as U+FFFD. The
 * stream is reset and can be reused. */
int tl_detok_stream_flush(tl_detok_stream *s, const char **text, size_t *len);

/* Bytes currently held back (0..3): nonzero means the text so far ends inside a character. */
size_t tl_detok_stream_pending(const tl_detok_stream *s);

#endif
