/* Generated tokens -> OpenAI output, for one request, in the reader thread: streaming
 * detokenizer, stop strings (held back while they may still match, never emitted), the
 * reasoning/tool-call parser (chat), usage counts and logprob records. The same object serves
 * streaming (deltas after every push) and non-streaming (the accumulated message at the end). */
#ifndef TL_SERVER_GEN_H
#define TL_SERVER_GEN_H

#include <jansson.h>
#include "common/buf.h"
#include "server/openai.h"
#include "tokenizer/bpe.h"
#include "tokenizer/parse.h"

typedef struct tl_gen {
    int chat;
    const tl_tokenizer *tok;
    tl_detok_stream *dt;
    tl_parser *parser; /* chat only */
    int parallel_tool_calls;
    int think_end_id; /* -1 when thinking is off */
    int in_think;

    const char *const *stop; /* borrowed from the request */
    int n_stop;
    size_t max_stop_len;
    tl_buf held;      /* text held back by the stop matcher */
    int stopped;      /* a stop string matched: no more output */
    int stop_index;   /* which one (the earliest in the text) */
    int include_stop; /* include_stop_str_in_output: the matched stop string is emitted */

    int want_logprobs;
    tl_oai_lp *lps; /* records not yet attached to a chunk (streaming) or all (not) */
    int n_lps, cap_lps;
    int lp_offset; /* completions: text offset of the next record */

    json_t *deltas; /* array of delta objects produced since the last take */
    tl_buf text;    /* completions: all emitted text */
    int n_calls;    /* tool calls started (after the parallel_tool_calls filter) */

    int n_completion; /* tokens generated */
    int n_reasoning;  /* of which reasoning (up to and including </think>) */
} tl_gen;

/* Sets up g for request r. think_end_id: the tokenizer's "</think>" id (or -1). */
void tl_gen_init(tl_gen *g, const tl_oai_req *r, const tl_tokenizer *tok, int think_end_id,
                 uint64_t id_seed);
void tl_gen_free(tl_gen *g);
/* Completions `echo`: the prompt text opens the output (call right after tl_gen_init). */
void tl_gen_echo(tl_gen *g, const char *prompt);

/* One generated token. Returns 1 when a stop string matched (the caller cancels the job and
 * finishes with "stop"), else 0. */
int tl_gen_push(tl_gen *g, const tl_sample_out *ev);
/* End of generation: flushes held text and the parser. */
void tl_gen_end(tl_gen *g);

/* Moves the delta objects produced so far into a new array (caller owns it). Chat deltas are
 * {"reasoning_content"}, {"content"} or {"tool_calls":[...]}; completion deltas {"text"}. */
json_t *tl_gen_take_deltas(tl_gen *g);
/* Logprobs JSON of the pending records for this API (NULL when logprobs are off), clearing
 * them. */
json_t *tl_gen_take_logprobs(tl_gen *g);

/* finish_reason for the job's end: "tool_calls" when a call was made, else "stop"/"length". */
const char *tl_gen_finish_reason(const tl_gen *g, int fin);

/* Non-streaming chat: the assistant message (after tl_gen_end). New reference. */
json_t *tl_gen_message(const tl_gen *g);

#endif
