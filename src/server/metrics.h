/* Prometheus metrics of the server: counters and histograms updated from any thread (one mutex;
 * a few updates per token), rendered as Prometheus text 0.0.4 for GET /metrics. Two families:
 * tulip's own (tulip_*), and the series vLLM exports (vllm:*, labels model_name and engine="0",
 * vLLM's names, label sets and bucket boundaries) so that dashboards built for vLLM work
 * unchanged (docs/architecture.md §6.7). */
#ifndef TL_SERVER_METRICS_H
#define TL_SERVER_METRICS_H

#include "tulip.h"

typedef struct tl_metrics tl_metrics;

/* Gauges sampled at render time (from the scheduler and the engine). */
typedef struct tl_metrics_gauges {
    int queued, running, sessions, max_seqs;
    long kv_tokens, kv_capacity;
    long kv_pages_total, kv_pages_free; /* the KV pool (tulip.h tl_kv_stats) */
    int kv_page_tokens;
    /* the prefix cache (tulip.h tl_prefix_stats; pc_on 0: no series) */
    int pc_on;
    long long pc_queries, pc_hits, pc_hit_tokens, pc_evictions, pc_snap_bytes, pc_bytes_used,
        pc_bytes_total;
    /* speculative decoding (tulip.h tl_spec_stats; spec_on 0: no series) */
    int spec_on, spec_k; /* spec_k: draft tokens a step, the positions of accepted_pos */
    long long spec_drafts, spec_drafted, spec_accepted, spec_accepted_pos[TL_MAX_SPEC];
} tl_metrics_gauges;

tl_metrics *tl_metrics_new(void);
void tl_metrics_free(tl_metrics *m);
/* The model_name label of the vllm:* series (the first served name) and the context length that
 * bounds the token-count histograms' buckets (vLLM's 1-2-5 series up to max_model_len). Call
 * before the first render; until then the label is empty and the bound 1. */
void tl_metrics_set_model(tl_metrics *m, const char *name, long max_model_len);

/* One HTTP response: endpoint label ("chat", "completions", "models", ...) and status code. */
void tl_metrics_request(tl_metrics *m, const char *endpoint, int http_status);
void tl_metrics_prompt_tokens(tl_metrics *m, long n);
/* One generated token; first: dt is the time to first token, else the inter-token latency. */
void tl_metrics_token(tl_metrics *m, int first, double dt);
/* A job ended with a tl_finish reason. */
void tl_metrics_finish(tl_metrics *m, int finish);
/* A running sequence was preempted (its KV pages freed, to be recomputed). */
void tl_metrics_preempt(tl_metrics *m);
/* Prefix cache lookups: prompt tokens looked up and tokens found cached (vllm:prefix_cache_*).
 * Fed by the scheduler at each first admission (sched.c prefix_load). */
void tl_metrics_prefix_cache(tl_metrics *m, long queries, long hits);

/* vLLM's finish reasons (vllm:request_success_total{finished_reason}). */
typedef enum tl_metrics_reason {
    TL_MREASON_STOP = 0,
    TL_MREASON_LENGTH,
    TL_MREASON_ABORT,
    TL_MREASON_ERROR,
    TL_MREASON_COUNT
} tl_metrics_reason;
const char *tl_metrics_reason_name(int reason);

/* One generation request that reached the engine, at its end. Times in seconds; a phase that did
 * not happen (never admitted, no token) is negative and not observed. */
typedef struct tl_metrics_req {
    int reason; /* tl_metrics_reason */
    long n_prompt, n_gen;
    double e2e, queue, prefill, decode, inference;
} tl_metrics_req;
void tl_metrics_request_done(tl_metrics *m, const tl_metrics_req *r);

/* Totals for the periodic stats line: prompt and generated tokens, requests finished. */
void tl_metrics_totals(tl_metrics *m, unsigned long long *prompt, unsigned long long *gen,
                       unsigned long long *requests);

/* Prometheus text (malloc'd, caller frees), or NULL when out of memory. */
char *tl_metrics_render(tl_metrics *m, const tl_metrics_gauges *g);

#endif
