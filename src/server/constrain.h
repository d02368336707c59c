/* Constrained decoding in the server (docs/architecture.md §9.1): the request fields that ask
 * for it (response_format, structured_outputs, guided_*, forced or strict tool calls) become a
 * grammar (src/grammar) at request parse, and a tl_con per job that the engine thread asks, each
 * step, for the allowed-token mask of the sequence and tells which token was sampled.
 *
 * Phases of a tl_con: waiting (thinking on: free until "</think>"; strict tools under
 * tool_choice auto: free until "<tool_call>"), then active (the mask applies; the state advances
 * with every token; end-of-sequence tokens are allowed only when the document is complete).
 * With max_tokens, the mask keeps only tokens after which the document can still be completed
 * within the tokens left (each token is at least one byte), so a constrained answer closes
 * before the limit instead of being cut. */
#ifndef TL_SERVER_CONSTRAIN_H
#define TL_SERVER_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "server/openai.h"

struct tl_tokenizer;

/* Server-wide, read-only after tl_con_ctx_init. */
typedef struct tl_con_ctx {
    tl_grammar_vocab *vocab; /* owned: the tokenizer's vocabulary trie */
    const struct tl_tokenizer *tok;
    int n_words;        /* words of a mask: (model rows + 31) / 32 */
    int32_t end_ids[4]; /* end-of-sequence ids (allowed when the document is complete) */
    int n_end;
    int32_t tool_open, tool_close; /* "<tool_call>", "</tool_call>" ids (-1: none) */
    int think_end_id;              /* "</think>" or -1 */
} tl_con_ctx;

int tl_con_ctx_init(tl_con_ctx *c, const struct tl_tokenizer *tok, int n_rows,
                    const int32_t *end_ids, int n_end, int think_end_id, char *err, size_t errlen);
void tl_con_ctx_free(tl_con_ctx *c);

typedef struct tl_con tl_con;

/* 1 if k is a request field this file reads (the parsers leave it alone). */
int tl_con_is_field(const char *k);

/* The constraint the request asks for (*out NULL when none); with thinking on the answer starts
 * after "</think>". On failure e says why (400 naming the field and the keyword). A forced tool
 * call (tool_choice required/named, no strict tool) whose tools cannot be compiled gives no
 * constraint (*out NULL, said on stderr): the caller forces only the call's opening tokens. */
int tl_con_from_request(const tl_con_ctx *ctx, const tl_oai_req *r, tl_con **out, tl_oai_error *e);
void tl_con_free(tl_con *c);

/* Engine thread. The mask for the next sample (NULL while waiting); remaining: tokens the job
 * may still emit including this one (<= 0: no limit). A state with no allowed token fails. */
int tl_con_mask(tl_con *c, int remaining, const uint32_t **mask, char *err, size_t errlen);
/* The sampled (or forced) token t: advances the state, or starts it (trigger). A token the
 * grammar refuses fails (the sampler ignored the mask). */
int tl_con_accept(tl_con *c, int32_t t, char *err, size_t errlen);
/* 1 once the constraint applies. */
int tl_con_active(const tl_con *c);

#endif
