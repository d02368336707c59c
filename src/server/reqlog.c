/* Per-request records: ids, the request log line, vLLM's request-level metrics, and the periodic
 * stats line (see reqlog.h). Log lines go to stderr, one write each: text
 * ("tulip: request ID ...") or, with --log-format json, one JSON object per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/util.h"
#include "server/metrics.h"
#include "server/reqlog.h"
#include "server/sched.h"

static _Thread_local tl_reqlog *cur;

void tl_reqlog_set_current(tl_reqlog *r) { cur = r; }

/* Called where a job is queued (api.c): the current request owns a reference to it. */
void tl_server_note_job(tl_server *s, struct tl_job *j) {
    if (!cur || cur->job || !j) return;
    tl_job_ref(j);
    cur->job = j;
}

int tl_reqlog_id_valid(const char *v) {
    size_t n = 0;
    for (; v[n]; n++) {
        char c = v[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok || n >= TL_REQ_ID_MAX) return 0;
    }
    return n > 0;
}

void tl_reqlog_begin(tl_reqlog *r, const char *route, int log, const char *hdr_id) {
    memset(r, 0, sizeof *r);
    r->route = route;
    r->log = log;
    r->t0 = tl_time_s();
    if (hdr_id)
        snprintf(r->id, sizeof r->id, "%s", hdr_id);
    else
        tl_oai_make_id(r->id, sizeof r->id, "req-");
}

/* UTC wall-clock time, ISO 8601 with milliseconds. */
static void iso_now(char *out, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* One line to stderr in one write. */
static void emit(const char *line) {
    size_t n = strlen(line);
    char *buf = malloc(n + 2);
    if (!buf) return;
    memcpy(buf, line, n);
    buf[n] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, n + 1);
    (void)w;
    free(buf);
}

static void emit_json(json_t *o) {
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (t) emit(t);
    free(t);
}

/* What the job tells at the end, read under its lock once it finished (or 2 s passed: then it
 * was cancelled and the engine has not yet reached it; what it had done so far is reported). */
typedef struct job_end {
    int fin;
    long n_prompt, n_gen;
    double t_submit, t_admit, t_first, t_last, t_out;
} job_end;

static void read_job(tl_job *j, job_end *e) {
    for (int i = 0; i < 400; i++) {
        pthread_mutex_lock(&j->mu);
        int fin = j->finished;
        pthread_mutex_unlock(&j->mu);
        if (fin) break;
        usleep(5000);
    }
    pthread_mutex_lock(&j->mu);
    e->fin = j->finished;
    e->n_prompt = j->n_prompt;
    e->n_gen = j->n_gen;
    e->t_submit = j->t_submit;
    /* t_admit is the engine thread's; it happens-before finished, read under the lock */
    e->t_admit = j->finished ? j->t_admit : 0;
    e->t_first = j->t_first;
    e->t_last = j->t_last;
    e->t_out = j->t_out;
    pthread_mutex_unlock(&j->mu);
}

/* vLLM's finish reason of a job. A job the reader cancelled after a complete response stopped at
 * a stop string: "stop", as vLLM reports it; cancelled otherwise (client gone, shutdown):
 * "abort". */
static int reason_of(const tl_server *s, const job_end *e, int completed, int status) {
    switch (e->fin) {
    case TL_FIN_STOP:
        return TL_MREASON_STOP;
    case TL_FIN_LENGTH:
        return TL_MREASON_LENGTH;
    case TL_FIN_ERROR:
        return TL_MREASON_ERROR;
    default:
        return completed && status < 400 && !atomic_load(&s->draining) ? TL_MREASON_STOP
                                                                       : TL_MREASON_ABORT;
    }
}

static void log_request(tl_server *s, const tl_reqlog *r, const job_end *e, const char *finish,
                        double dur) {
    double ttft = e && e->t_first > 0 ? e->t_first - e->t_submit : -1;
    /* prep: headers to the engine's queue (body, parse, template, tokenizer); first_out: queue to
     * the first output chunk handed to the socket (ttft plus the reader's delivery) */
    double prep = e && e->t_submit > 0 ? e->t_submit - r->t0 : -1;
    double out = e && e->t_out > 0 ? e->t_out - e->t_submit : -1;
    long np = e ? e->n_prompt : 0, ng = e ? e->n_gen : 0;
    if (s->p.log_json) {
        char ts[40];
        iso_now(ts, sizeof ts);
        json_t *o = json_object();
        json_object_set_new(o, "time", json_string(ts));
        json_object_set_new(o, "event", json_string("request"));
        json_object_set_new(o, "id", json_string(r->id));
        json_object_set_new(o, "route", json_string(r->route));
        json_object_set_new(o, "status", json_integer(r->status));
        json_object_set_new(o, "prompt_tokens", json_integer(np));
        json_object_set_new(o, "generation_tokens", json_integer(ng));
        json_object_set_new(o, "ttft_s", ttft >= 0 ? json_real(ttft) : json_null());
        json_object_set_new(o, "prep_s", prep >= 0 ? json_real(prep) : json_null());
        json_object_set_new(o, "first_out_s", out >= 0 ? json_real(out) : json_null());
        json_object_set_new(o, "duration_s", json_real(dur));
        json_object_set_new(o, "finish_reason", finish ? json_string(finish) : json_null());
        emit_json(o);
        return;
    }
    char line[512], tt[32] = "-", tp[32] = "-", to[32] = "-";
    if (ttft >= 0) snprintf(tt, sizeof tt, "%.4fs", ttft);
    if (prep >= 0) snprintf(tp, sizeof tp, "%.4fs", prep);
    if (out >= 0) snprintf(to, sizeof to, "%.4fs", out);
    snprintf(line, sizeof line,
             "tulip: request %s %s status=%d prompt_tokens=%ld generation_tokens=%ld ttft=%s "
             "prep=%s first_out=%s duration=%.3fs finish=%s",
             r->id, r->route, r->status, np, ng, tt, tp, to, dur, finish ? finish : "-");
    emit(line);
}

void tl_reqlog_end(tl_server *s, tl_reqlog *r, int completed) {
    double now = tl_time_s();
    job_end e = {0};
    const char *finish = NULL;
    if (r->job) {
        read_job(r->job, &e);
        now = tl_time_s();
        int reason = reason_of(s, &e, completed, r->status);
        finish = tl_metrics_reason_name(reason);
        int admitted = e.t_admit > 0, first = e.t_first > 0;
        tl_metrics_req mr = {
            .reason = reason,
            .n_prompt = e.n_prompt,
            .n_gen = e.n_gen,
            .e2e = now - e.t_submit,
            .queue = admitted ? e.t_admit - e.t_submit : -1,
            .prefill = admitted && first ? e.t_first - e.t_admit : -1,
            .decode = first ? e.t_last - e.t_first : -1,
            .inference = admitted && first ? e.t_last - e.t_admit : -1,
        };
        tl_metrics_request_done(s->metrics, &mr);
        tl_job_unref(r->job);
        r->job = NULL;
    }
    if (r->log) log_request(s, r, finish ? &e : NULL, finish, now - r->t0);
}

void tl_reqlog_stats_line(tl_server *s, double dt, unsigned long long d_prompt,
                          unsigned long long d_gen, unsigned long long d_req, int running,
                          int queued, double kv_usage) {
    double pt = dt > 0 ? (double)d_prompt / dt : 0, gt = dt > 0 ? (double)d_gen / dt : 0;
    if (s->p.log_json) {
        char ts[40];
        iso_now(ts, sizeof ts);
        json_t *o = json_object();
        json_object_set_new(o, "time", json_string(ts));
        json_object_set_new(o, "event", json_string("stats"));
        json_object_set_new(o, "running", json_integer(running));
        json_object_set_new(o, "waiting", json_integer(queued));
        json_object_set_new(o, "kv_cache_usage", json_real(kv_usage));
        json_object_set_new(o, "prompt_tokens_per_s", json_real(pt));
        json_object_set_new(o, "generation_tokens_per_s", json_real(gt));
        json_object_set_new(o, "requests_finished", json_integer((json_int_t)d_req));
        json_object_set_new(o, "interval_s", json_real(dt));
        emit_json(o);
        return;
    }
    char line[300];
    snprintf(line, sizeof line,
             "tulip: stats running=%d waiting=%d kv_cache_usage=%.1f%% prompt=%.1f tok/s "
             "generation=%.1f tok/s requests_finished=%llu (last %.0f s)",
             running, queued, 100 * kv_usage, pt, gt, d_req, dt);
    emit(line);
}
