/* OpenAI wire format: request JSON -> validated tl_oai_req, responses and stream chunks -> JSON,
 * and the one table that maps tl_status to HTTP (docs/architecture.md §7). Pure functions over
 * jansson values: no sockets, no engine, so every case is unit-tested in tests/cpu/test_openai.c.
 */
#ifndef TL_SERVER_OPENAI_H
#define TL_SERVER_OPENAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "tulip.h"

#define TL_OAI_MAX_STOP     16   /* stop strings per request */
#define TL_OAI_MAX_STOP_LEN 256  /* bytes per stop string */
#define TL_OAI_MAX_SCRIPT   4096 /* test-script tokens per request */
#define TL_OAI_MAX_N        16   /* choices per prompt (`n`) */
#define TL_OAI_MAX_PROMPTS  64   /* prompts of one /v1/completions request */
#define TL_OAI_MAX_CHOICES  128  /* prompts x n of one request (each is a tl_job) */

/* A request-level error: the HTTP status, OpenAI type/code, the offending field and a message.
 * Filled by the parsers; rendered by tl_oai_error_json. */
typedef struct tl_oai_error {
    int status;       /* tl_status that caused it */
    int http;         /* HTTP status */
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL or e.g. "unsupported_parameter" */
    char param[96];   /* "" or the field, e.g. "messages[2].role" */
    char msg[512];
    long n_prompt; /* context_length_exceeded only: prompt tokens and the limit */
    long n_ctx;
} tl_oai_error;

/* Fills e for status st (mapping it to HTTP/type/code through the table) and returns st. */
int tl_oai_fail(tl_oai_error *e, int st, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* HTTP status for a tl_status (the docs/architecture.md §7 table). */
int tl_oai_http_status(int st);
/* {"error":{"message","type","param","code"}} as a malloc'd compact JSON string. */
char *tl_oai_error_json(const tl_oai_error *e);

typedef enum tl_oai_kind { TL_OAI_CHAT = 0, TL_OAI_COMPLETION = 1 } tl_oai_kind;

typedef enum tl_oai_tool_choice {
    TL_TOOL_AUTO = 0,
    TL_TOOL_NONE,
    TL_TOOL_REQUIRED,
    TL_TOOL_NAMED,
} tl_oai_tool_choice;

typedef enum tl_oai_role {
    TL_ROLE_SYSTEM = 0,
    TL_ROLE_USER,
    TL_ROLE_ASSISTANT,
    TL_ROLE_TOOL,
} tl_oai_role;

/* One tool call of an assistant message in the history. Strings point into the request JSON. */
typedef struct tl_oai_tool_call {
    const char *id; /* may be NULL */
    const char *name;
    const char *arguments; /* JSON text as the client sent it */
} tl_oai_tool_call;

/* One message, normalised: text parts concatenated, "developer" folded into system. */
typedef struct tl_oai_msg {
    tl_oai_role role;
    char *content;                 /* owned; "" when absent */
    const char *reasoning_content; /* assistant only; NULL when absent */
    tl_oai_tool_call *tool_calls;  /* owned array */
    int n_tool_calls;
    const char *tool_call_id; /* tool only */
    const char *name;
} tl_oai_msg;

/* Sampling defaults (from generation_config.json, else docs/model.md §6). */
typedef struct tl_oai_defaults {
    tl_sample_params thinking;     /* chat with thinking on */
    tl_sample_params non_thinking; /* chat with enable_thinking=false */
    tl_sample_params completion;   /* /v1/completions */
} tl_oai_defaults;

/* What the parser needs to know about the server. */
typedef struct tl_oai_opts {
    const char *model_name;     /* the served name; requests naming another model get 404 */
    const char *model_path;     /* also accepted as a model name */
    const char *const *aliases; /* more accepted names (--served-model-name a,b), n_aliases */
    int n_aliases;
    int test_mode; /* honour the tulip_test_script extension */
    const tl_oai_defaults *defaults;
    /* --default-chat-template-kwargs: a JSON object applied before the request's own
     * chat_template_kwargs (which override it key by key); NULL: none */
    json_t *default_ctk;
} tl_oai_opts;

/* One prompt of a completions request: text (borrowed from the request JSON) or token ids
 * (owned). */
typedef struct tl_oai_prompt {
    const char *text;
    int32_t *ids;
    int n_ids;
} tl_oai_prompt;

/* A validated request. Every const char * points into root, which the request owns. */
typedef struct tl_oai_req {
    tl_oai_kind kind;
    json_t *root;
    const char *model; /* as sent, or NULL */

    /* chat */
    tl_oai_msg *msgs;
    int n_msgs;
    json_t *tools; /* borrowed from root: array of {"type":"function","function":{...}} or NULL */
    int n_tools;
    tl_oai_tool_choice tool_choice;
    const char *tool_name; /* TL_TOOL_NAMED */
    int parallel_tool_calls;
    int enable_thinking;   /* default 1 */
    int preserve_thinking; /* default 0 */

    /* completions: text or token ids, per prompt (docs/api.md §6); prompt_text / prompt_ids
     * are the first prompt's (aliases into prompts[0]) */
    tl_oai_prompt *prompts; /* owned, n_prompts >= 1 */
    int n_prompts;
    const char *prompt_text;
    int32_t *prompt_ids; /* not owned: prompts[0].ids */
    int n_prompt_ids;
    int n; /* choices per prompt, 1..TL_OAI_MAX_N (choice index = prompt * n + i) */

    /* generation */
    int stream;
    int include_usage;
    int max_tokens; /* -1: until the context is full */
    tl_sample_params sample;
    int has_seed;
    const char *stop[TL_OAI_MAX_STOP];
    int n_stop;
    int logprobs;     /* return logprobs of chosen tokens */
    int top_logprobs; /* 0..TL_MAX_LOGPROBS */
    int ignore_eos;
    /* vLLM / llama.cpp extensions and token restrictions (docs/api.md) */
    int32_t *bias_ids; /* logit_bias, owned; at most TL_MAX_LOGIT_BIAS */
    float *bias_vals;
    int n_bias;
    int min_tokens;    /* EOS and stop_token_ids banned until this many tokens */
    int32_t *stop_ids; /* stop_token_ids, owned */
    int n_stop_ids;
    int include_stop; /* include_stop_str_in_output */
    int skip_special; /* skip_special_tokens (default 1) */
    int echo;         /* completions: the prompt comes first in the output */
    int32_t *script;  /* test mode: tokens to emit instead of sampled ones (owned) */
    int n_script;
    int fail_after;         /* test mode: the engine fails the job after this many tokens */
    int fail_lost;          /* test mode: ... as a lost device (the whole engine fails) */
    const char *cache_salt; /* borrowed from root; NULL: none (docs/architecture.md §4.1) */
} tl_oai_req;

/* Parse and validate a /v1/chat/completions or /v1/completions body. On failure e says why
 * (400 with the field named; 404 for an unknown model) and r holds nothing to free. On success
 * free with tl_oai_req_free. n_vocab bounds token ids (prompt ids, script). */
int tl_oai_parse(tl_oai_req *r, tl_oai_kind kind, const char *body, size_t len,
                 const tl_oai_opts *o, int n_vocab, tl_oai_error *e);
void tl_oai_req_free(tl_oai_req *r);
/* --default-chat-template-kwargs JSON: the parsed object (new reference) if it is an object
 * whose keys chat_template_kwargs accepts, else NULL with err saying why. */
json_t *tl_oai_default_ctk(const char *text, char *err, size_t errlen);

/* Defaults when no generation_config.json is found (docs/model.md §6). */
void tl_oai_defaults_init(tl_oai_defaults *d);
/* Overrides temperature/top_k/top_p of the thinking and completion sets from a
 * generation_config.json text; returns 0, or a negative status if the text is not JSON. */
int tl_oai_defaults_from_genconfig(tl_oai_defaults *d, const char *json);

/* ---- responses ---- */

typedef struct tl_oai_usage {
    int prompt_tokens;
    int completion_tokens;
    int reasoning_tokens;
    int cached_tokens; /* prompt tokens served from the prefix cache */
} tl_oai_usage;

/* {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens"},
 * "completion_tokens_details":{...}} */
json_t *tl_oai_usage_json(const tl_oai_usage *u);

/* One logprob record of a generated token, for both APIs. token_text is the token's bytes
 * (may be a partial UTF-8 sequence, hence the "bytes" array in chat). */
typedef struct tl_oai_lp {
    char text[64];
    int text_len;
    float logprob;
    int n_top;
    char top_text[TL_MAX_LOGPROBS][64];
    int top_len[TL_MAX_LOGPROBS];
    float top_logprob[TL_MAX_LOGPROBS];
} tl_oai_lp;

/* Chat logprobs object {"content":[...]} for n records. */
json_t *tl_oai_chat_logprobs_json(const tl_oai_lp *lp, int n);
/* Completions logprobs object {"tokens","token_logprobs","top_logprobs","text_offset"}. */
json_t *tl_oai_completion_logprobs_json(const tl_oai_lp *lp, int n, int text_offset0);

/* Wraps one choice into a response/chunk envelope. object is "chat.completion",
 * "chat.completion.chunk" or "text_completion"; choice is stolen (may be NULL: a chunk with an
 * empty choices list, used for the usage chunk); usage is stolen (may be NULL). */
json_t *tl_oai_envelope(const char *id, const char *object, long created, const char *model,
                        json_t *choice, json_t *usage);

/* Compact JSON text (malloc'd) of v; v is released. */
char *tl_oai_dump(json_t *v);

/* A random id with the given prefix ("chatcmpl-", "cmpl-", "call_"), into out. */
void tl_oai_make_id(char *out, size_t outlen, const char *prefix);

#endif
