/* Prometheus metrics of the server: counters and histograms updated from any thread (one mutex;
 * a few updates per token), rendered as Prometheus text 0.0.4 for GET /metrics. */
#ifndef TL_SERVER_METRICS_H
#define TL_SERVER_METRICS_H

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
} tl_metrics_gauges;

tl_metrics *tl_metrics_new(void);
void tl_metrics_free(tl_metrics *m);

/* One HTTP response: endpoint label ("chat", "completions", "models", ...) and status code. */
void tl_metrics_request(tl_metrics *m, const char *endpoint, int http_status);
void tl_metrics_prompt_tokens(tl_metrics *m, long n);
/* One generated token; first: dt is the time to first token, else the inter-token latency. */
void tl_metrics_token(tl_metrics *m, int first, double dt);
/* A job ended with a tl_finish reason. */
void tl_metrics_finish(tl_metrics *m, int finish);
/* A running sequence was preempted (its KV pages freed, to be recomputed). */
void tl_metrics_preempt(tl_metrics *m);

/* Prometheus text (malloc'd, caller frees), or NULL when out of memory. */
char *tl_metrics_render(tl_metrics *m, const tl_metrics_gauges *g);

#endif
