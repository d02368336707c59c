/* tulip serve: the process-level pieces (engine, tokenizer, scheduler, metrics, HTTP daemon) and
 * the request handlers' shared context. http.c is the libmicrohttpd glue, api.c the endpoints,
 * server.c startup and shutdown. */
#ifndef TL_SERVER_SERVER_H
#define TL_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include "server/constrain.h"
#include "server/openai.h"
#include "tulip.h"

typedef struct tl_server_params {
    const char *model_path;
    const char *tokenizer_path;  /* NULL: tokenizer.json in the model directory */
    const char *model_name;      /* "a,b,c": the served name and its aliases (the first is the
                                  * one reported); NULL: the model directory's base name */
    const char *host;            /* default 127.0.0.1 */
    int port;                    /* 0: any free port (printed at startup) */
    const char *api_key;         /* NULL: no auth */
    const char *allowed_origins; /* CORS: "a,b" or "*"; NULL: off (no Access-Control-*) */
    tl_backend_kind backend;
    int device; /* CUDA device ordinal among the visible ones (CUDA_VISIBLE_DEVICES); CPU: 0 */
    int allow_test_shape;
    int n_threads;
    int max_seqs, max_ctx;
    long kv_tokens;          /* KV cache pool in tokens; 0 = tl_engine_params' default */
    int max_queue;           /* waiting requests beyond the running ones; default 64 */
    int step_tokens;         /* engine step token budget; default 2048 */
    int gather_us;           /* idle engine: wait for more arrivals (sched.h); 0 = off (default) */
    int snap_every;          /* prefix cache snapshot every this many prompt tokens; 0 = 4096 */
    size_t max_body;         /* request body limit in bytes; default 8 MiB */
    int max_conns;           /* concurrent connections; default 512 */
    double drain_s;          /* SIGINT/SIGTERM: seconds running streams may finish */
    int idle_timeout_s;      /* close a connection idle this long (default 300) */
    double keepalive_s;      /* SSE comment after this long without a chunk (default 5) */
    const char *trace_path;  /* --trace FILE: requests, rendered prompts, chunks, responses */
    int test_mode;           /* accept the tulip_test_script request extension */
    const char *default_ctk; /* --default-chat-template-kwargs JSON, or NULL */
    int random_weights, weight_bits;
    uint64_t seed;
    /* CUDA without --kv-tokens: the share of GPU memory (tl_engine_params); 0 = 0.9 */
    double gpu_memory_utilization;
    int state_bf16; /* --state-dtype bf16 (tl_engine_params) */
    /* What GET /version reports (the CLI's build; NULL: "unknown"). */
    const char *version, *commit, *arch;
    int log_json;            /* --log-format json: request and stats lines as JSON objects */
    double stats_interval_s; /* periodic stats line every this many seconds; < 0: never; 0: 10 */
    int strict_template;     /* refuse to start when the checkpoint's chat template differs */
    /* Prefix cache (docs/architecture.md §4.1): budget in GiB (0 = the engine's default), or
     * off */
    double prefix_cache_gb;
    int no_prefix_cache;
    int no_warmup;   /* CUDA: skip tl_engine_warm_up at start */
    int spec_tokens; /* speculative decoding draft tokens (docs/architecture.md §3.6; 0: off) */
} tl_server_params;

#define TL_SERVER_MAX_NAMES 16

/* The checkpoint's chat template compared with the one tulip renders (server.c, at load). */
typedef enum tl_template_check {
    TL_TEMPLATE_UNCHECKED = 0, /* still loading, or no model directory (random weights) */
    TL_TEMPLATE_ABSENT,        /* the checkpoint has none: tulip's is used */
    TL_TEMPLATE_MATCH,         /* the same template (after normalising line ends) */
    TL_TEMPLATE_DIFFERS,       /* another template: tulip still renders its own (warned) */
} tl_template_check;

struct tl_tokenizer;
struct tl_sched;
struct tl_job;
struct tl_metrics;
struct MHD_Daemon;

typedef struct tl_server {
    tl_server_params p;
    tl_engine *eng;
    struct tl_tokenizer *tok;
    struct tl_sched *sched;
    struct tl_metrics *metrics;
    tl_oai_defaults defaults;
    tl_oai_opts oai;
    char model_name[256];
    int n_vocab; /* model embedding rows: token ids must be below */
    int max_ctx;
    int think_end_id; /* "</think>" or -1 */
    tl_con_ctx con;   /* constrained decoding: the vocabulary trie, end and tool-call ids */
    int prefix_cache; /* the engine has a prefix cache */
    long created;
    struct MHD_Daemon *daemon;
    atomic_int draining;
    atomic_int ready;    /* 0 while the model loads (every route but /version: 503), then 1 */
    atomic_int n_active; /* generation requests not yet completed on the wire */
    /* --served-model-name: every name a request may give (model_name is the first) */
    const char *model_names[TL_SERVER_MAX_NAMES];
    int n_model_names;
    char names_buf[1024];
    atomic_int template_check; /* tl_template_check: the checkpoint's chat template vs tulip's */
    FILE *trace;               /* --trace: one JSON line per request event, or NULL */
    pthread_mutex_t trace_mu;
    double t0;
} tl_server;

/* Runs the server until SIGINT/SIGTERM (or a lost device). Prints startup errors with a hint and
 * returns the process exit status. */
int tl_server_run(const tl_server_params *p);

/* ---- http.c ---- */
int tl_http_start(tl_server *s, char *err, size_t errlen);
void tl_http_quiesce(tl_server *s); /* stop accepting connections */
void tl_http_stop(tl_server *s);
int tl_http_port(tl_server *s);

/* What an endpoint handler returns to http.c: a whole body, or a stream. */
struct tl_stream;
typedef struct tl_reply {
    int status; /* HTTP status */
    const char *content_type;
    char *body; /* malloc'd; NULL for a stream */
    size_t body_len;
    struct tl_stream *stream;         /* non-NULL: an SSE stream */
    struct tl_ant_stream *ant_stream; /* non-NULL: an Anthropic SSE stream (anthropic.c) */
    void *ops_stream; /* non-NULL: an SSE stream of another endpoint file, first member a
                       * const tl_stream_ops * (responses.c) */
} tl_reply;

/* Reader and destructor of an ops_stream (same contract as tl_stream_read/tl_stream_free). */
typedef struct tl_stream_ops {
    long (*read)(void *st, char *buf, size_t max);
    void (*free)(void *st);
} tl_stream_ops;

/* ---- api.c: endpoints. fd is the client socket (watched for hang-up while waiting). Each
 * fills *out; returns 0, or -1 when the client went away and the connection is to be dropped. */
int tl_api_chat(tl_server *s, const char *body, size_t len, int fd, tl_reply *out);
int tl_api_completions(tl_server *s, const char *body, size_t len, int fd, tl_reply *out);
/* The model list, or (id non-NULL) one model object or a 404. */
void tl_api_models(tl_server *s, const char *id, tl_reply *out);
void tl_api_health(tl_server *s, tl_reply *out);
void tl_api_metrics(tl_server *s, tl_reply *out);
/* ---- extra.c: the small endpoints (vLLM's shapes). ---- */
/* POST /tokenize: {"prompt": str} or {"messages": [...], "add_generation_prompt"?} ->
 * {"count", "max_model_len", "tokens"}. */
void tl_api_tokenize(tl_server *s, const char *body, size_t len, tl_reply *out);
/* POST /detokenize: {"tokens": [ids]} -> {"prompt": str}; an id out of range is a 400. */
void tl_api_detokenize(tl_server *s, const char *body, size_t len, tl_reply *out);
/* GET /version: {"version", "commit", "arch", "chat_template"} (tl_server_params, the check). */
void tl_api_version(tl_server *s, tl_reply *out);

/* An OpenAI-shaped error reply. */
void tl_api_error(tl_reply *out, const tl_oai_error *e);
/* For the other wire formats (anthropic.c, responses.c): parses a chat completions body, builds
 * and queues its job (*j, one reference; on failure fills e and returns its status, r holds
 * nothing then); or only renders and tokenizes it, giving the prompt's token count. */
struct tl_job;
int tl_api_start_chat(tl_server *s, const char *id, const char *body, size_t len, tl_oai_req *r,
                      struct tl_job **j, tl_oai_error *e);
int tl_api_count_chat(tl_server *s, const char *body, size_t len, int *n, tl_oai_error *e);
/* ---- reqlog.c: called where a job is queued (api.c): the HTTP request being handled on this
 * thread keeps a reference, for its log line and vLLM's request metrics at its end. ---- */
void tl_server_note_job(tl_server *s, struct tl_job *j);
/* 1 if name is one of the served names (--served-model-name) or the model path. */
int tl_server_model_known(const tl_server *s, const char *name);

/* Shared by the endpoint files: a random seed for a tl_gen; a job read to its end into g (the
 * tl_finish, or -1 when the client went away; the job is cancelled then); the error of a job
 * that ended with TL_FIN_ERROR. */
struct tl_gen;
uint64_t tl_api_seed(void);
int tl_api_drain_job(struct tl_job *j, struct tl_gen *g, int fd);
void tl_api_job_error(const struct tl_job *j, tl_oai_error *e);

/* Streams: the reader produces up to max bytes; returns the count, 0 never (it blocks), or
 * -1 at the end of the stream, -2 when the client went away. */
long tl_stream_read(struct tl_stream *st, char *buf, size_t max);
void tl_stream_free(struct tl_stream *st);

#endif
