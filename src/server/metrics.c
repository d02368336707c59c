/* Server metrics (see metrics.h). Fixed-size tables: a bounded set of (endpoint, status) pairs
 * and fixed histogram buckets, so updates never allocate.
 *
 * The vllm:* series follow vLLM's v1 PrometheusStatLogger (vllm/v1/metrics/loggers.py): the same
 * names, the labels model_name (the served name) and engine ("0": one engine), the same bucket
 * boundaries; request_success_total carries finished_reason (stop, length, abort, error) and
 * every reason is rendered from the start, as vLLM pre-creates them. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/util.h"
#include "server/metrics.h"
#include "server/sched.h"

#define MAX_PAIRS   64
#define MAX_BUCKETS 32

static const double ttft_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1,   0.25,   0.5,   1,    2.5,   5};
/* vLLM's boundaries (loggers.py): time to first token; inter-token latency (also its
 * time_per_output_token); every request-level time (e2e, queue, prefill, decode, inference). */
static const double v_ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                       0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                       20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double v_itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double v_req_bounds[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                      5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                      60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define NB(a) (int)(sizeof a / sizeof a[0])

typedef struct hist {
    const double *bounds;
    int nb;
    unsigned long long bucket[MAX_BUCKETS + 1]; /* per bucket; cumulated at render time */
    unsigned long long count;
    double sum;
} hist;

enum { V_TTFT, V_ITL, V_E2E, V_QUEUE, V_PREFILL, V_DECODE, V_INFER, V_PROMPT, V_GEN, V_COUNT };

static const struct {
    const char *name, *help;
} v_hist_info[V_COUNT] = {
    {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."},
    {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."},
    {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."},
    {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."},
    {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."},
    {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."},
    {"vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request."},
    {"vllm:request_prompt_tokens", "Number of prefill tokens processed."},
    {"vllm:request_generation_tokens", "Number of generation tokens processed."},
};

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
    /* vLLM's series */
    char model[256];                /* model_name label value, escaped */
    double tok_bounds[MAX_BUCKETS]; /* 1-2-5 up to max_model_len */
    hist v[V_COUNT];
    unsigned long long success[TL_MREASON_COUNT];
    unsigned long long prefix_queries, prefix_hits;
    unsigned long long requests_done;
};

static void hist_init(hist *h, const double *bounds, int nb) {
    TL_ASSERT(nb <= MAX_BUCKETS);
    h->bounds = bounds;
    h->nb = nb;
}

/* vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... while <= max. */
static int buckets_125(double *out, long max) {
    static const int mant[3] = {1, 2, 5};
    int n = 0;
    for (double e = 1; n < MAX_BUCKETS; e *= 10)
        for (int i = 0; i < 3 && n < MAX_BUCKETS; i++) {
            if (mant[i] * e > (double)max) return n;
            out[n++] = mant[i] * e;
        }
    return n;
}

tl_metrics *tl_metrics_new(void) {
    tl_metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, ttft_bounds, NB(ttft_bounds));
    hist_init(&m->itl, itl_bounds, NB(itl_bounds));
    hist_init(&m->v[V_TTFT], v_ttft_bounds, NB(v_ttft_bounds));
    hist_init(&m->v[V_ITL], v_itl_bounds, NB(v_itl_bounds));
    for (int i = V_E2E; i <= V_INFER; i++) hist_init(&m->v[i], v_req_bounds, NB(v_req_bounds));
    tl_metrics_set_model(m, "", 1);
    return m;
}

void tl_metrics_set_model(tl_metrics *m, const char *name, long max_model_len) {
    pthread_mutex_lock(&m->mu);
    /* a label value escapes backslash, double quote and newline (Prometheus text format) */
    size_t o = 0;
    for (const char *p = name; *p && o + 3 < sizeof m->model; p++) {
        if (*p == '\\' || *p == '"') m->model[o++] = '\\';
        if (*p == '\n') {
            m->model[o++] = '\\';
            m->model[o++] = 'n';
            continue;
        }
        m->model[o++] = *p;
    }
    m->model[o] = '\0';
    int n = buckets_125(m->tok_bounds, max_model_len < 1 ? 1 : max_model_len);
    hist_init(&m->v[V_PROMPT], m->tok_bounds, n);
    hist_init(&m->v[V_GEN], m->tok_bounds, n);
    pthread_mutex_unlock(&m->mu);
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

static void hist_add(hist *h, double v) {
    int i = 0;
    while (i < h->nb && v > h->bounds[i]) i++;
    h->bucket[i]++; /* i == nb: only in +Inf */
    h->count++;
    h->sum += v;
}

void tl_metrics_token(tl_metrics *m, int first, double dt) {
    pthread_mutex_lock(&m->mu);
    m->gen_tokens++;
    hist_add(first ? &m->ttft : &m->itl, dt);
    hist_add(first ? &m->v[V_TTFT] : &m->v[V_ITL], dt);
    pthread_mutex_unlock(&m->mu);
}

void tl_metrics_prefix_cache(tl_metrics *m, long queries, long hits) {
    pthread_mutex_lock(&m->mu);
    m->prefix_queries += (unsigned long long)queries;
    m->prefix_hits += (unsigned long long)hits;
    pthread_mutex_unlock(&m->mu);
}

const char *tl_metrics_reason_name(int reason) {
    static const char *names[TL_MREASON_COUNT] = {"stop", "length", "abort", "error"};
    return reason >= 0 && reason < TL_MREASON_COUNT ? names[reason] : "error";
}

void tl_metrics_request_done(tl_metrics *m, const tl_metrics_req *r) {
    const double t[] = {[V_E2E] = r->e2e,
                        [V_QUEUE] = r->queue,
                        [V_PREFILL] = r->prefill,
                        [V_DECODE] = r->decode,
                        [V_INFER] = r->inference};
    pthread_mutex_lock(&m->mu);
    int reason = r->reason >= 0 && r->reason < TL_MREASON_COUNT ? r->reason : TL_MREASON_ERROR;
    m->success[reason]++;
    m->requests_done++;
    for (int i = V_E2E; i <= V_INFER; i++)
        if (t[i] >= 0) hist_add(&m->v[i], t[i]);
    hist_add(&m->v[V_PROMPT], (double)r->n_prompt);
    hist_add(&m->v[V_GEN], (double)r->n_gen);
    pthread_mutex_unlock(&m->mu);
}

void tl_metrics_totals(tl_metrics *m, unsigned long long *prompt, unsigned long long *gen,
                       unsigned long long *requests) {
    pthread_mutex_lock(&m->mu);
    *prompt = m->prompt_tokens;
    *gen = m->gen_tokens;
    *requests = m->requests_done;
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

/* A histogram; lab is the labels before le ("" for none, else 'a="x",'). */
static void render_hist(tl_buf *b, const char *name, const char *help, const hist *h,
                        const char *lab) {
    tl_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += h->bucket[i];
        tl_buf_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, lab, h->bounds[i], cum);
    }
    size_t n = strlen(lab);
    /* the labels without their trailing comma, for _sum and _count */
    tl_buf_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n%s_sum%s%.*s%s %.6f\n%s_count%s%.*s%s %llu\n",
                  name, lab, h->count, name, n ? "{" : "", (int)(n ? n - 1 : 0), lab, n ? "}" : "",
                  h->sum, name, n ? "{" : "", (int)(n ? n - 1 : 0), lab, n ? "}" : "", h->count);
}

/* The vllm:* series (under m->mu). */
static void render_vllm(tl_buf *b, tl_metrics *m, const tl_metrics_gauges *g) {
    char lab[300];
    snprintf(lab, sizeof lab, "model_name=\"%s\",engine=\"0\"", m->model);
    double kv = g->kv_pages_total > 0
                    ? (double)(g->kv_pages_total - g->kv_pages_free) / (double)g->kv_pages_total
                    : 0.0;
    tl_buf_printf(b,
                  "# HELP vllm:num_requests_running Number of requests in model execution "
                  "batches.\n# TYPE vllm:num_requests_running gauge\n"
                  "vllm:num_requests_running{%s} %d\n"
                  "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                  "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{%s} %d\n"
                  "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                  "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{%s} %.6f\n",
                  lab, g->running, lab, g->queued, lab, kv);
    /* The Gateway API inference extension's endpoint picker reads these two as well (its vLLM
     * defaults; docs/deploy.md): the KV page size and count for its prefix-cache scorer, and
     * the LoRA state (tulip serves no adapters: none loaded, none waiting, at most 0). */
    tl_buf_printf(b,
                  "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                  "# TYPE vllm:cache_config_info gauge\n"
                  "vllm:cache_config_info{%s,block_size=\"%d\",num_gpu_blocks=\"%ld\","
                  "enable_prefix_caching=\"%s\"} 1\n"
                  "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
                  "# TYPE vllm:lora_requests_info gauge\n"
                  "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\","
                  "waiting_lora_adapters=\"\"} %.1f\n",
                  lab, g->kv_page_tokens, g->kv_pages_total, g->pc_on ? "True" : "False",
                  (double)time(NULL));
    static const struct {
        const char *name, *help;
    } ctr[] = {
        {"vllm:prompt_tokens_total", "Number of prefill tokens processed."},
        {"vllm:generation_tokens_total", "Number of generation tokens processed."},
        {"vllm:num_preemptions_total", "Cumulative number of preemption from the engine."},
        {"vllm:prefix_cache_queries_total",
         "Prefix cache queries, in terms of number of queried tokens."},
        {"vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."},
    };
    const unsigned long long val[] = {m->prompt_tokens, m->gen_tokens, m->preemptions,
                                      m->prefix_queries, m->prefix_hits};
    for (size_t i = 0; i < sizeof ctr / sizeof ctr[0]; i++)
        tl_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s{%s} %llu\n", ctr[i].name, ctr[i].help,
                      ctr[i].name, ctr[i].name, lab, val[i]);
    tl_buf_printf(b, "# HELP vllm:request_success_total Count of successfully processed "
                     "requests.\n# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < TL_MREASON_COUNT; i++)
        tl_buf_printf(b, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lab,
                      tl_metrics_reason_name(i), m->success[i]);
    if (g->spec_on) /* vLLM's spec_decode counters (docs/architecture.md §3.6) */
        tl_buf_printf(
            b,
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
            "vllm:spec_decode_num_drafts_total{%s} %lld\n"
            "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n"
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            "vllm:spec_decode_num_draft_tokens_total{%s} %lld\n"
            "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            "vllm:spec_decode_num_accepted_tokens_total{%s} %lld\n",
            lab, g->spec_drafts, lab, g->spec_drafted, lab, g->spec_accepted);
    if (g->spec_on) {
        tl_buf_printf(b, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted "
                         "tokens per draft token position.\n"
                         "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
        for (int i = 0; i < g->spec_k && i < TL_MAX_SPEC; i++)
            tl_buf_printf(b,
                          "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} "
                          "%lld\n",
                          lab, i, g->spec_accepted_pos[i]);
    }
    char hlab[320];
    snprintf(hlab, sizeof hlab, "%s,", lab);
    for (int i = 0; i < V_COUNT; i++)
        render_hist(b, v_hist_info[i].name, v_hist_info[i].help, &m->v[i], hlab);
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
                &m->ttft, "");
    render_hist(&b, "tulip_inter_token_latency_seconds", "Time between consecutive tokens.",
                &m->itl, "");
    render_vllm(&b, m, g);
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
            "# HELP tulip_prefix_cache_used_bytes Snapshot and cached KV page bytes in use.\n"
            "# TYPE tulip_prefix_cache_used_bytes gauge\ntulip_prefix_cache_used_bytes %lld\n"
            "# HELP tulip_prefix_cache_capacity_bytes Snapshot budget plus the KV pool it shares.\n"
            "# TYPE tulip_prefix_cache_capacity_bytes gauge\ntulip_prefix_cache_capacity_bytes "
            "%lld\n",
            g->pc_queries, g->pc_hits, g->pc_hit_tokens, g->pc_evictions, g->pc_snap_bytes,
            g->pc_bytes_used, g->pc_bytes_total);
    return tl_buf_take(&b, NULL); /* NULL when memory ran out */
}
