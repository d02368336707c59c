/* Server metrics (see metrics.h). Fixed-size tables: a bounded set of (endpoint, status) pairs
 * and fixed histogram buckets, so updates never allocate. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/metrics.h"
#include "server/sched.h"

#define MAX_PAIRS 64

static const double ttft_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1,   0.25,   0.5,   1,    2.5,   5};
#define N_TTFT (int)(sizeof ttft_bounds / sizeof ttft_bounds[0])
#define N_ITL  (int)(sizeof itl_bounds / sizeof itl_bounds[0])

typedef struct hist {
    unsigned long long bucket[16]; /* cumulative counts are computed at render time */
    unsigned long long count;
    double sum;
} hist;

struct tl_metrics {
    pthread_mutex_t mu;
    struct {
        char endpoint[16];
        int status;
        unsigned long long n;
    } req[MAX_PAIRS];
    int n_req;
    unsigned long long prompt_tokens, gen_tokens;
    unsigned long long finished[5];
    unsigned long long preemptions;
    hist ttft, itl;
};

tl_metrics *tl_metrics_new(void) {
    tl_metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void tl_metrics_free(tl_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void tl_metrics_request(tl_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i;
    for (i = 0; i < m->n_req; i++)
        if (m->req[i].status == status && !strcmp(m->req[i].endpoint, endpoint)) break;
    if (i == m->n_req && m->n_req < MAX_PAIRS) {
        snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
        m->req[i].status = status;
        m->n_req++;
    }
    if (i < MAX_PAIRS) m->req[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void tl_metrics_prompt_tokens(tl_metrics *m, long n) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (unsigned long long)n;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(hist *h, const double *bounds, int nb, double v) {
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->bucket[i]++; /* i == nb: only in +Inf */
    h->count++;
    h->sum += v;
}

void tl_metrics_token(tl_metrics *m, int first, double dt) {
    pthread_mutex_lock(&m->mu);
    m->gen_tokens++;
    if (first)
        hist_add(&m->ttft, ttft_bounds, N_TTFT, dt);
    else
        hist_add(&m->itl, itl_bounds, N_ITL, dt);
    pthread_mutex_unlock(&m->mu);
}

void tl_metrics_finish(tl_metrics *m, int finish) {
    if (finish < 0 || finish > 4) return;
    pthread_mutex_lock(&m->mu);
    m->finished[finish]++;
    pthread_mutex_unlock(&m->mu);
}

void tl_metrics_preempt(tl_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->preemptions++;
    pthread_mutex_unlock(&m->mu);
}

/* ====== Rendering. ====== */

static void render_hist(tl_buf *b, const char *name, const char *help, const hist *h,
                        const double *bounds, int nb) {
    tl_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h->bucket[i];
        tl_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
    }
    tl_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->count,
                  name, h->sum, name, h->count);
}

char *tl_metrics_render(tl_metrics *m, const tl_metrics_gauges *g) {
    tl_buf b = {0};
    tl_buf_reserve(&b, 4095);
    pthread_mutex_lock(&m->mu);
    tl_buf_printf(&b, "# HELP tulip_requests_total HTTP responses by endpoint and status code.\n"
                      "# TYPE tulip_requests_total counter\n");
    for (int i = 0; i < m->n_req; i++)
        tl_buf_printf(&b, "tulip_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                      m->req[i].endpoint, m->req[i].status, m->req[i].n);
    tl_buf_printf(
        &b,
        "# HELP tulip_prompt_tokens_total Prompt tokens of admitted requests.\n"
        "# TYPE tulip_prompt_tokens_total counter\ntulip_prompt_tokens_total %llu\n"
        "# HELP tulip_generation_tokens_total Generated tokens.\n"
        "# TYPE tulip_generation_tokens_total counter\ntulip_generation_tokens_total %llu\n",
        m->prompt_tokens, m->gen_tokens);
    static const char *reasons[5] = {"none", "stop", "length", "cancelled", "error"};
    tl_buf_printf(&b, "# HELP tulip_sequences_finished_total Sequences ended, by reason.\n"
                      "# TYPE tulip_sequences_finished_total counter\n");
    for (int i = 1; i < 5; i++)
        tl_buf_printf(&b, "tulip_sequences_finished_total{reason=\"%s\"} %llu\n", reasons[i],
                      m->finished[i]);
    tl_buf_printf(&b,
                  "# HELP tulip_num_preemptions_total Running sequences preempted because the KV "
                  "pool ran short (pages freed, recomputed later).\n"
                  "# TYPE tulip_num_preemptions_total counter\ntulip_num_preemptions_total %llu\n",
                  m->preemptions);
    render_hist(&b, "tulip_time_to_first_token_seconds", "Time from queueing to the first token.",
                &m->ttft, ttft_bounds, N_TTFT);
    render_hist(&b, "tulip_inter_token_latency_seconds", "Time between consecutive tokens.",
                &m->itl, itl_bounds, N_ITL);
    pthread_mutex_unlock(&m->mu);
    tl_buf_printf(
        &b,
        "# HELP tulip_queue_depth Requests waiting for a sequence slot.\n"
        "# TYPE tulip_queue_depth gauge\ntulip_queue_depth %d\n"
        "# HELP tulip_running_sequences Sequences being prefilled or decoded.\n"
        "# TYPE tulip_running_sequences gauge\ntulip_running_sequences %d\n"
        "# HELP tulip_sessions_active Sessions holding KV cache and recurrent state.\n"
        "# TYPE tulip_sessions_active gauge\ntulip_sessions_active %d\n"
        "# HELP tulip_state_slots_total Sequence state slots (max concurrent sequences).\n"
        "# TYPE tulip_state_slots_total gauge\ntulip_state_slots_total %d\n"
        "# HELP tulip_state_slots_used_ratio Fraction of state slots in use.\n"
        "# TYPE tulip_state_slots_used_ratio gauge\ntulip_state_slots_used_ratio %.6f\n"
        "# HELP tulip_kv_tokens Tokens held in the KV cache by live sessions.\n"
        "# TYPE tulip_kv_tokens gauge\ntulip_kv_tokens %ld\n"
        "# HELP tulip_kv_usage_ratio KV tokens held / KV capacity.\n"
        "# TYPE tulip_kv_usage_ratio gauge\ntulip_kv_usage_ratio %.6f\n",
        g->queued, g->running, g->sessions, g->max_seqs,
        g->max_seqs ? (double)g->sessions / g->max_seqs : 0.0, g->kv_tokens,
        g->kv_capacity ? (double)g->kv_tokens / (double)g->kv_capacity : 0.0);
    tl_buf_printf(&b,
                  "# HELP tulip_kv_cache_pages_total KV cache pages in the pool.\n"
                  "# TYPE tulip_kv_cache_pages_total gauge\ntulip_kv_cache_pages_total %ld\n"
                  "# HELP tulip_kv_cache_pages_used KV cache pages held by sequences.\n"
                  "# TYPE tulip_kv_cache_pages_used gauge\ntulip_kv_cache_pages_used %ld\n"
                  "# HELP tulip_kv_cache_pages_free KV cache pages no sequence holds.\n"
                  "# TYPE tulip_kv_cache_pages_free gauge\ntulip_kv_cache_pages_free %ld\n"
                  "# HELP tulip_kv_cache_page_tokens Tokens one KV cache page holds.\n"
                  "# TYPE tulip_kv_cache_page_tokens gauge\ntulip_kv_cache_page_tokens %d\n",
                  g->kv_pages_total, g->kv_pages_total - g->kv_pages_free, g->kv_pages_free,
                  g->kv_page_tokens);
    if (g->pc_on) /* docs/architecture.md §4.1 */
        tl_buf_printf(
            &b,
            "# HELP tulip_prefix_cache_queries_total Prefix cache lookups (one per admission).\n"
            "# TYPE tulip_prefix_cache_queries_total counter\ntulip_prefix_cache_queries_total "
            "%lld\n"
            "# HELP tulip_prefix_cache_hits_total Lookups that restored a cached prefix.\n"
            "# TYPE tulip_prefix_cache_hits_total counter\ntulip_prefix_cache_hits_total %lld\n"
            "# HELP tulip_prefix_cache_hit_tokens_total Prompt tokens restored from the cache.\n"
            "# TYPE tulip_prefix_cache_hit_tokens_total counter\n"
            "tulip_prefix_cache_hit_tokens_total %lld\n"
            "# HELP tulip_prefix_cache_evictions_total Snapshots evicted to make room (LRU).\n"
            "# TYPE tulip_prefix_cache_evictions_total counter\n"
            "tulip_prefix_cache_evictions_total %lld\n"
            "# HELP tulip_prefix_cache_snapshot_bytes State snapshot bytes in use.\n"
            "# TYPE tulip_prefix_cache_snapshot_bytes gauge\ntulip_prefix_cache_snapshot_bytes "
            "%lld\n"
            "# HELP tulip_prefix_cache_used_bytes Snapshot and KV page bytes in use.\n"
            "# TYPE tulip_prefix_cache_used_bytes gauge\ntulip_prefix_cache_used_bytes %lld\n"
            "# HELP tulip_prefix_cache_capacity_bytes The prefix cache's budget.\n"
            "# TYPE tulip_prefix_cache_capacity_bytes gauge\ntulip_prefix_cache_capacity_bytes "
            "%lld\n",
            g->pc_queries, g->pc_hits, g->pc_hit_tokens, g->pc_evictions, g->pc_snap_bytes,
            g->pc_bytes_used, g->pc_bytes_total);
    return tl_buf_take(&b, NULL); /* NULL when memory ran out */
}
