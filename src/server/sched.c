/* The engine thread (see sched.h): admission from a bounded FIFO, one batched step at a time,
 * token events out to each job, sessions freed the step a job ends.
 *
 * Owns: the engine (between create and destroy), every tl_session, the queue. Never touches text:
 * detokenizing, stop strings and parsing happen in the reader threads, which cancel a job when
 * they have seen enough. Invariant: a job is in exactly one of {queue, running[], finished};
 * only this thread moves it, under s->mu for the queue. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "model/config.h"
#include "server/metrics.h"
#include "server/sched.h"

/* ====== Jobs. ====== */

tl_job *tl_job_new(void) {
    tl_job *j = xcalloc(1, sizeof *j);
    j->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (j->efd < 0) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancel, 0);
    j->think_end_id = -1;
    j->force_pos = -1;
    return j;
}

void tl_job_ref(tl_job *j) { atomic_fetch_add(&j->refs, 1); }

void tl_job_unref(tl_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    close(j->efd);
    pthread_mutex_destroy(&j->mu);
    free(j->prompt);
    free(j->script);
    free(j->force);
    free(j->ev);
    free(j);
}

static void job_wake(tl_job *j) {
    uint64_t one = 1;
    ssize_t w = write(j->efd, &one, sizeof one);
    (void)w; /* EAGAIN only when the counter is saturated: the reader is awake anyway */
}

void tl_job_cancel(tl_job *j) { atomic_store(&j->cancel, 1); }

int tl_job_wait(tl_job *j, int sockfd, int timeout_ms) {
    pthread_mutex_lock(&j->mu);
    int ready = j->n_ev > 0 || j->finished;
    pthread_mutex_unlock(&j->mu);
    if (ready) return 1;
    struct pollfd p[2] = {{.fd = j->efd, .events = POLLIN}, {.fd = sockfd, .events = POLLRDHUP}};
    int r = poll(p, sockfd >= 0 ? 2 : 1, timeout_ms);
    if (r < 0) return errno == EINTR ? 0 : -1;
    if (sockfd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return -1;
    if (p[0].revents & POLLIN) {
        uint64_t v;
        ssize_t rd = read(j->efd, &v, sizeof v);
        (void)rd;
        return 1;
    }
    return 0;
}

int tl_job_take(tl_job *j, tl_sample_out *out, int max, int *finished) {
    pthread_mutex_lock(&j->mu);
    int n = TL_MIN(max, j->n_ev);
    if (n > 0) {
        memcpy(out, j->ev, (size_t)n * sizeof *out);
        memmove(j->ev, j->ev + n, (size_t)(j->n_ev - n) * sizeof *out);
        j->n_ev -= n;
    }
    *finished = j->n_ev == 0 ? j->finished : TL_FIN_NONE;
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* ====== Scheduler state. ====== */

struct tl_sched {
    tl_engine *eng;
    tl_sched_params p;
    struct tl_metrics *m;
    int max_seqs, max_ctx;
    int eos[4], n_eos;
    pthread_t thread;
    int joined;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    tl_job *q_head, *q_tail;
    int n_queued;
    int accepting;
    int stop; /* 1: cancel everything and exit */
    int lost;
    int n_running; /* mirrors the engine thread's count for stats */
    int n_sessions;
    long kv_tokens;

    /* engine thread only */
    tl_job **running;        /* [max_seqs]: admitted jobs, oldest first */
    int n_live;              /* of running[] */
    tl_batch_entry *entries; /* [max_seqs]: the step's batch, at most one entry per job */
    tl_job **entry_job;      /* [max_seqs]: the job of each entry */
    tl_sample_out *outs;     /* [max_seqs]: the step's samples */
};

static void job_finish(tl_sched *s, tl_job *j, int fin, int st, const char *msg) {
    if (j->sess) {
        int rc = tl_session_close(j->sess);
        j->sess = NULL;
        if (rc) /* the engine keeps that slot out of use until a reset of it succeeds */
            fprintf(stderr, "tulip: clearing a finished sequence's state failed: %s\n",
                    tl_status_str(rc));
    }
    pthread_mutex_lock(&j->mu);
    j->finished = fin;
    j->err_status = st;
    if (msg) snprintf(j->err, sizeof j->err, "%s", msg);
    pthread_mutex_unlock(&j->mu);
    job_wake(j);
    if (s->m) tl_metrics_finish(s->m, fin);
}

/* Finishes a job that is no longer in any list and drops the engine's reference. */
static void job_release(tl_sched *s, tl_job *j, int fin, int st, const char *msg) {
    job_finish(s, j, fin, st, msg);
    tl_job_unref(j);
}

/* Appends one event; returns 0 or TL_ERR_NOMEM. */
static int job_push(tl_job *j, const tl_sample_out *o, double now) {
    pthread_mutex_lock(&j->mu);
    if (j->n_ev == j->cap_ev) {
        int cap = j->cap_ev ? j->cap_ev * 2 : 16;
        tl_sample_out *nev = realloc(j->ev, (size_t)cap * sizeof *nev);
        if (!nev) {
            pthread_mutex_unlock(&j->mu);
            return TL_ERR_NOMEM;
        }
        j->ev = nev;
        j->cap_ev = cap;
    }
    j->ev[j->n_ev++] = *o;
    j->n_gen++;
    if (!j->t_first) j->t_first = now;
    j->t_last = now;
    pthread_mutex_unlock(&j->mu);
    job_wake(j);
    return 0;
}

static int is_eos(const tl_sched *s, int32_t t) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == t) return 1;
    return 0;
}

/* ====== After a sample; stats. ====== */

/* Samples of one job after a step: script/forced override, event, stop conditions. Returns 1
 * when the job ended (it stays in running[] until the sweep). */
static int job_after_sample(tl_sched *s, tl_job *j, tl_sample_out *o, double now) {
    int n_gen = j->n_gen, script_end = 0;
    if (o->token < 0 && !j->script) { /* this sequence's logits were NaN/Inf (tulip.h) */
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INTERNAL,
                   "the model produced non-finite logits (NaN or infinity) for this request");
        return 1;
    }
    if (j->script) {
        memset(o, 0, sizeof *o);
        script_end = n_gen >= j->n_script;
        o->token = script_end ? s->eos[0] : j->script[n_gen];
    } else if (j->force_pos >= 0 && j->force_pos < j->n_force) {
        int32_t t = j->force[j->force_pos++];
        if (o->token != t) {
            o->logprob = 0;
            o->n_top = 0;
        }
        o->token = t;
    }
    if (j->think_end_id >= 0 && o->token == j->think_end_id && j->force && j->force_pos < 0)
        j->force_pos = 0;
    double prev = n_gen == 0 ? j->t_submit : j->t_last;
    if (job_push(j, o, now)) {
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_NOMEM, "out of memory");
        return 1;
    }
    if (s->m) tl_metrics_token(s->m, n_gen == 0, now - prev);
    n_gen++;
    if (j->fail_after > 0 && n_gen >= j->fail_after && !j->fail_lost) {
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INTERNAL, "injected failure (tulip_test_fail_after)");
        return 1;
    }
    if (script_end || (!j->ignore_eos && is_eos(s, o->token))) {
        job_finish(s, j, TL_FIN_STOP, 0, NULL);
        return 1;
    }
    /* the sequence now holds n_past + 1 tokens (this one is emitted, not yet fed back): at
     * max_ctx it is full, and this token was the last one */
    if ((j->max_tokens > 0 && n_gen >= j->max_tokens) ||
        tl_session_n_past(j->sess) + 1 >= s->max_ctx) {
        job_finish(s, j, TL_FIN_LENGTH, 0, NULL);
        return 1;
    }
    j->next_tok = o->token;
    return 0;
}

/* Mirrors the engine thread's counts for tl_sched_stats. */
static void publish_stats(tl_sched *s) {
    long kv = 0;
    int n_sess = 0;
    for (int i = 0; i < s->n_live; i++) {
        if (!s->running[i]->sess) continue;
        n_sess++;
        kv += tl_session_n_past(s->running[i]->sess);
    }
    pthread_mutex_lock(&s->mu);
    s->n_running = s->n_live;
    s->n_sessions = n_sess;
    s->kv_tokens = kv;
    pthread_mutex_unlock(&s->mu);
}

/* ====== The step loop: admit, start, build the batch, run it, deliver, sweep. ====== */

/* Drops cancelled jobs from the queue (they never got a session). Called with s->mu held. */
static void queue_reap(tl_sched *s, tl_job **reaped, int *n_reaped, int max) {
    tl_job **pp = &s->q_head, *prev = NULL;
    while (*pp && *n_reaped < max) {
        tl_job *j = *pp;
        if (atomic_load(&j->cancel) || s->stop) {
            *pp = j->next;
            if (s->q_tail == j) s->q_tail = prev;
            s->n_queued--;
            reaped[(*n_reaped)++] = j;
        } else {
            prev = j;
            pp = &j->next;
        }
    }
}

typedef enum { ADMIT_STEP, ADMIT_AGAIN, ADMIT_EXIT } admit_result;

/* 1. Admission: waits for work, reaps cancelled queued jobs, moves queued jobs into free running
 * places (FIFO). *stop: shutting down (everything running is cancelled next). */
static admit_result admit(tl_sched *s, int *stop) {
    tl_job *reaped[64];
    int n_reaped = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->q_head && s->n_live == 0) pthread_cond_wait(&s->cv, &s->mu);
    *stop = s->stop;
    queue_reap(s, reaped, &n_reaped, 64);
    while (!*stop && !s->lost && s->n_live < s->max_seqs && s->q_head) {
        tl_job *j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        j->next = NULL;
        s->running[s->n_live++] = j;
    }
    int empty = !s->q_head; /* only this thread takes from the queue; none join when stopping */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_reaped; i++) job_release(s, reaped[i], TL_FIN_CANCELLED, 0, NULL);
    if (*stop && s->n_live == 0) return empty ? ADMIT_EXIT : ADMIT_AGAIN;
    return ADMIT_STEP;
}

/* A lost device: the server takes no more work (tl_sched_lost; it exits and is restarted). */
static void set_lost(tl_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->lost = 1;
    s->accepting = 0;
    pthread_mutex_unlock(&s->mu);
}

/* A session for a newly admitted job, or the job ends (its prompt leaves no room for a token, or
 * no slot could be had). Returns 1 when the job can run. */
static int job_start(tl_sched *s, tl_job *j, double now) {
    char err[256];
    if (j->n_prompt <= 0 || j->n_prompt >= s->max_ctx) {
        snprintf(err, sizeof err,
                 "a prompt of %d tokens leaves no room for a token in the context of %d",
                 j->n_prompt, s->max_ctx);
        job_release(s, j, TL_FIN_ERROR, j->n_prompt <= 0 ? TL_ERR_INVALID : TL_ERR_CONTEXT_FULL,
                    err);
        return 0;
    }
    /* checked here too, so that one job's bad parameters never fail the whole step */
    int st = tl_sample_params_check(&j->sample, err, sizeof err);
    if (st) {
        job_release(s, j, TL_FIN_ERROR, st, err);
        return 0;
    }
    st = tl_session_open(s->eng, &j->sess, err, sizeof err);
    if (st) {
        j->sess = NULL;
        if (st == TL_ERR_DEVICE_LOST) { /* no slot could be reset: the device is gone */
            fprintf(stderr, "tulip: opening a session failed: %s\n", err);
            set_lost(s);
        }
        job_release(s, j, TL_FIN_ERROR, st, err);
        return 0;
    }
    j->t_admit = now;
    if (j->force && !j->in_think) j->force_pos = 0;
    return 1;
}

/* 2. Cancellations (all of them when stopping) and sessions for the newly admitted. */
static void start_jobs(tl_sched *s, int stop) {
    double now = tl_time_s();
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (atomic_load(&j->cancel) || stop) {
            job_release(s, j, TL_FIN_CANCELLED, 0, NULL);
            continue;
        }
        if (!j->sess && !job_start(s, j, now)) continue;
        s->running[k++] = j;
    }
    s->n_live = k;
}

/* 3. The batch: one decode token per running sequence, then prefill chunks of the others, oldest
 * first, within the step's token budget (at least one chunk moves). Returns the entry count. */
static int build_batch(tl_sched *s) {
    int n = 0, budget = s->p.step_tokens, prefill_moved = 0;
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (j->n_fed < j->n_prompt) continue;
        s->entries[n] = (tl_batch_entry){
            .sess = j->sess, .tokens = &j->next_tok, .n_tok = 1, .sample = &j->sample};
        s->entry_job[n++] = j;
        budget--;
    }
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (j->n_fed >= j->n_prompt) continue;
        if (budget <= 0 && prefill_moved) break;
        int chunk = TL_MIN(j->n_prompt - j->n_fed, TL_MAX(budget, 32));
        int last = j->n_fed + chunk == j->n_prompt;
        s->entries[n] = (tl_batch_entry){.sess = j->sess,
                                         .tokens = j->prompt + j->n_fed,
                                         .n_tok = chunk,
                                         .sample = last ? &j->sample : NULL};
        s->entry_job[n++] = j;
        budget -= chunk;
        prefill_moved = 1;
    }
    for (int i = 0; i < n; i++)
        if (s->entries[i].sample) s->entries[i].out = &s->outs[i];
    return n;
}

/* 4. One forward (or the test mode's injected device loss). */
static int run_batch(tl_sched *s, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        tl_job *j = s->entry_job[i];
        if (j->fail_lost && j->fail_after > 0 && j->n_gen >= j->fail_after)
            return tl_errf(err, errlen, TL_ERR_DEVICE_LOST,
                           "injected device loss (tulip_test_fail_lost)");
    }
    return tl_engine_step(s->eng, s->entries, n, err, errlen);
}

/* Fails every running job (device lost or a batch-wide error). */
static void fail_all(tl_sched *s, int st, const char *msg) {
    for (int i = 0; i < s->n_live; i++) job_release(s, s->running[i], TL_FIN_ERROR, st, msg);
    s->n_live = 0;
}

/* The engine's KV pool ran out (no session changed, tulip.h; lengths are checked before each
 * step, so it is not one sequence's context): the longest sequence ends ("length"). */
static void end_longest(tl_sched *s, const char *err) {
    int victim = 0;
    for (int i = 1; i < s->n_live; i++)
        if (tl_session_n_past(s->running[i]->sess) > tl_session_n_past(s->running[victim]->sess))
            victim = i;
    fprintf(stderr, "tulip: %s; ending the longest sequence\n", err);
    job_release(s, s->running[victim], TL_FIN_LENGTH, 0, NULL);
    memmove(&s->running[victim], &s->running[victim + 1],
            (size_t)(s->n_live - victim - 1) * sizeof *s->running);
    s->n_live--;
}

/* 5a. A failed step: a lost device stops the server taking work; a full KV pool ends one
 * sequence; anything else fails the batch's jobs. */
static void step_failed(tl_sched *s, int st, const char *err) {
    if (st == TL_ERR_CONTEXT_FULL && s->n_live > 0) {
        end_longest(s, err);
        return;
    }
    fprintf(stderr, "tulip: engine step failed: %s: %s\n", tl_status_str(st), err);
    if (st == TL_ERR_DEVICE_LOST || st == TL_ERR_CUDA) {
        set_lost(s);
        st = TL_ERR_DEVICE_LOST;
    }
    fail_all(s, st, err);
}

/* 5b. Prompt progress, events, and the ends they bring. */
static void deliver(tl_sched *s, int n) {
    double now = tl_time_s();
    for (int i = 0; i < n; i++) {
        tl_job *j = s->entry_job[i];
        if (s->entries[i].tokens != &j->next_tok) j->n_fed += s->entries[i].n_tok;
        if (s->entries[i].sample) job_after_sample(s, j, &s->outs[i], now);
    }
}

/* 6. Jobs that ended leave running[]. */
static void sweep(tl_sched *s) {
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (j->finished)
            tl_job_unref(j); /* written by this thread: no lock needed */
        else
            s->running[k++] = j;
    }
    s->n_live = k;
}

static void *engine_main(void *arg) {
    tl_sched *s = arg;
    char err[256];
    for (;;) {
        int stop;
        admit_result a = admit(s, &stop);
        if (a == ADMIT_EXIT) break;
        if (a == ADMIT_AGAIN) continue;
        start_jobs(s, stop);
        int n = build_batch(s);
        publish_stats(s);
        if (n == 0) continue;
        int st = run_batch(s, n, err, sizeof err);
        if (st)
            step_failed(s, st, err);
        else
            deliver(s, n);
        sweep(s);
        publish_stats(s);
    }
    s->n_live = 0;
    publish_stats(s);
    return NULL;
}

/* ====== Public API. ====== */

int tl_sched_create(tl_sched **out, tl_engine *e, const tl_sched_params *p, struct tl_metrics *m,
                    char *err, size_t errlen) {
    tl_sched *s = xcalloc(1, sizeof *s);
    s->eng = e;
    s->p = *p;
    if (s->p.step_tokens <= 0) s->p.step_tokens = 512;
    if (s->p.max_queue < 0) s->p.max_queue = 0;
    s->m = m;
    s->max_seqs = tl_engine_max_seqs(e);
    s->max_ctx = tl_engine_max_ctx(e);
    const tl_config *c = tl_engine_config(e);
    s->n_eos = TL_MIN(c->n_eos, 4);
    for (int i = 0; i < s->n_eos; i++) s->eos[i] = c->eos_ids[i];
    if (s->n_eos == 0) {
        free(s);
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "the model config names no end-of-sequence token");
    }
    s->running = xcalloc((size_t)s->max_seqs, sizeof *s->running);
    s->entries = xcalloc((size_t)s->max_seqs, sizeof *s->entries);
    s->entry_job = xcalloc((size_t)s->max_seqs, sizeof *s->entry_job);
    s->outs = xcalloc((size_t)s->max_seqs, sizeof *s->outs);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->accepting = 1;
    if (pthread_create(&s->thread, NULL, engine_main, s)) {
        free(s->running);
        free(s->entries);
        free(s->entry_job);
        free(s->outs);
        free(s);
        return tl_errf(err, errlen, TL_ERR_INTERNAL, "cannot start the engine thread");
    }
    *out = s;
    return 0;
}

int tl_sched_submit(tl_sched *s, tl_job *j, char *err, size_t errlen) {
    pthread_mutex_lock(&s->mu);
    int st = 0;
    if (s->lost)
        st =
            tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the engine failed; the server is restarting");
    else if (!s->accepting)
        st = tl_errf(err, errlen, TL_ERR_CANCELLED, "the server is shutting down");
    else if (s->n_queued >= s->p.max_queue && s->n_running + s->n_queued >= s->max_seqs)
        st = tl_errf(err, errlen, TL_ERR_BUSY,
                     "the server is busy (%d requests waiting); retry later", s->n_queued);
    if (st) {
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    tl_job_ref(j);
    j->t_submit = tl_time_s();
    j->next = NULL;
    if (s->q_tail)
        s->q_tail->next = j;
    else
        s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void tl_sched_shutdown(tl_sched *s, double grace_s) {
    if (!s || s->joined) return;
    pthread_mutex_lock(&s->mu);
    s->accepting = 0;
    pthread_mutex_unlock(&s->mu);
    double t_end = tl_time_s() + grace_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = s->q_head || s->n_running;
        pthread_mutex_unlock(&s->mu);
        if (!busy || tl_time_s() >= t_end) break;
        usleep(20000);
    }
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->joined = 1;
}

void tl_sched_free(tl_sched *s) {
    if (!s) return;
    tl_sched_shutdown(s, 0);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->running);
    free(s->entries);
    free(s->entry_job);
    free(s->outs);
    free(s);
}

int tl_sched_lost(const tl_sched *s) {
    tl_sched *m = (tl_sched *)s;
    pthread_mutex_lock(&m->mu);
    int l = m->lost;
    pthread_mutex_unlock(&m->mu);
    return l;
}

void tl_sched_stats(tl_sched *s, int *queued, int *running, int *sessions, long *kv_tokens) {
    pthread_mutex_lock(&s->mu);
    if (queued) *queued = s->n_queued;
    if (running) *running = s->n_running;
    if (sessions) *sessions = s->n_sessions;
    if (kv_tokens) *kv_tokens = s->kv_tokens;
    pthread_mutex_unlock(&s->mu);
}
