/* The engine thread (see sched.h): admission from a bounded FIFO within the free KV pages, one
 * batched step at a time, preemption by recompute when the pool runs short, token events out to
 * each job, sessions freed the step a job ends.
 *
 * Owns: the engine (between create and destroy), every tl_session, the queue. Never touches text:
 * detokenizing, stop strings and parsing happen in the reader threads, which cancel a job when
 * they have seen enough. Invariant: a job is in exactly one of {queue, running[], finished};
 * only this thread moves it, under s->mu for the queue. Every running job arrived before every
 * queued one (admission takes the head, preemption gives back the newest running job to the
 * head), so running[] is in arrival order and its last job is the one that yields. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "model/config.h"
#include "server/constrain.h"
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
    free(j->bias_ids);
    free(j->bias_vals);
    free(j->stop_ids);
    free(j->min_allow);
    free(j->min_and);
    tl_con_free(j->con);
    free(j->cache_salt);
    free(j->seq);
    free(j->ev);
    free(j);
}

static void job_wake(tl_job *j) {
    uint64_t one = 1;
    ssize_t w = write(j->efd, &one, sizeof one);
    (void)w; /* EAGAIN only when the counter is saturated: the reader is awake anyway */
}

void tl_job_cancel(tl_job *j) { atomic_store(&j->cancel, 1); }

void tl_job_note_output(tl_job *j) {
    pthread_mutex_lock(&j->mu);
    if (!j->t_out) j->t_out = tl_time_s();
    pthread_mutex_unlock(&j->mu);
}

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
    int max_seqs, max_ctx, n_vocab;
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
    int n_jobs;    /* submitted and not yet finished, queued or running: what a drain waits for */
    int admit_delay_us; /* tests (TL_TEST_ADMIT_DELAY_MS): a pause after a job leaves the queue */
    int sweep_delay_us; /* tests (TL_TEST_SWEEP_DELAY_MS): a pause between delivery and sweep */
    long n_arrived;     /* jobs ever queued (wait_work's gathering) */
    int n_sessions;
    long kv_tokens;
    tl_kv_stats kv_pub;     /* the pool as of the last step */
    tl_prefix_stats pc_pub; /* the prefix cache as of the last step */
    tl_spec_stats spec_pub; /* speculative decoding counters as of the last step */

    /* fixed at create */
    tl_kv_stats kv0; /* the pool when idle (its sizes do not change) */
    long seq_tokens; /* most tokens of one sequence: min(max_ctx, KV positions of the pool) */

    /* engine thread only */
    int pc_on;        /* the engine has a prefix cache */
    int spec_k;       /* draft tokens per step of speculative decoding (0: off, §3.6) */
    tl_kv_stats kv;   /* the pool now (refreshed at each step and preemption) */
    int admit_hold;   /* a step found the pool shorter than planned: admit nothing more until a
                         running job ends */
    tl_job **running; /* [max_seqs]: admitted jobs, oldest first */
    int n_live;       /* of running[] */
    tl_batch_entry *entries; /* [max_seqs]: the step's batch, at most one entry per job */
    tl_job **entry_job;      /* [max_seqs]: the job of each entry */
    tl_sample_out *outs;     /* [max_seqs][1 + spec_k]: the step's samples */
};

static void snap_save(tl_sched *s, tl_job *j, int last);

static void job_finish(tl_sched *s, tl_job *j, int fin, int st, const char *msg) {
    if (j->sess && (fin == TL_FIN_STOP || fin == TL_FIN_LENGTH)) snap_save(s, j, 1); /* §4.1 */
    if (j->sess) {
        int rc = tl_session_close(j->sess);
        j->sess = NULL;
        if (rc) /* the engine keeps that slot out of use until a reset of it succeeds */
            fprintf(stderr, "tulip: clearing a finished sequence's state failed: %s\n",
                    tl_status_str(rc));
    }
    pthread_mutex_lock(&j->mu);
    int first = !j->finished;
    j->finished = fin;
    j->err_status = st;
    if (msg) snprintf(j->err, sizeof j->err, "%s", msg);
    pthread_mutex_unlock(&j->mu);
    if (first) {
        pthread_mutex_lock(&s->mu);
        s->n_jobs--;
        pthread_mutex_unlock(&s->mu);
    }
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

/* Appends t to the job's sequence (what a preemption recomputes). 0 or TL_ERR_NOMEM. */
static int seq_push(tl_job *j, int32_t t) {
    if (j->n_seq == j->cap_seq) {
        int cap = TL_MAX(2 * j->cap_seq, j->n_seq + 64);
        int32_t *ns = realloc(j->seq, sizeof(int32_t) * (size_t)cap);
        if (!ns) return TL_ERR_NOMEM;
        j->seq = ns;
        j->cap_seq = cap;
    }
    j->seq[j->n_seq++] = t;
    return 0;
}

/* Samples of one job after a step: script/forced override, event, stop conditions. Returns 1
 * when the job ended (it stays in running[] until the sweep). */
static int job_after_sample(tl_sched *s, tl_job *j, tl_sample_out *o, double now) {
    int n_gen = j->n_gen, script_end = 0;
    if (j->con_failed) { /* job_mask: this step's mask could not be computed */
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INTERNAL, j->con_err);
        return 1;
    }
    if (o->token == TL_TOKEN_NONE_ALLOWED && !j->script) { /* allow/bias left nothing */
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INVALID,
                   "the token restrictions (logit_bias, min_tokens) left no token to sample");
        return 1;
    }
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
    char err[256];
    if (j->con && tl_con_accept(j->con, o->token, err, sizeof err)) {
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INTERNAL, err);
        return 1;
    }
    double prev = n_gen == 0 ? j->t_submit : j->t_last;
    if (job_push(j, o, now) || seq_push(j, o->token)) {
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_NOMEM, "out of memory");
        return 1;
    }
    if (s->m) tl_metrics_token(s->m, n_gen == 0, now - prev);
    n_gen++;
    if (j->fail_after > 0 && n_gen >= j->fail_after && !j->fail_lost) {
        job_finish(s, j, TL_FIN_ERROR, TL_ERR_INTERNAL, "injected failure (tulip_test_fail_after)");
        return 1;
    }
    int stop_id = 0;
    for (int i = 0; i < j->n_stop_ids; i++) stop_id |= o->token == j->stop_ids[i];
    if (script_end || stop_id || (!j->ignore_eos && is_eos(s, o->token))) {
        job_finish(s, j, TL_FIN_STOP, 0, NULL);
        return 1;
    }
    /* the sequence now holds n_past + 1 tokens (this one is emitted, not yet fed back): at the
     * sequence limit (the context, or the whole KV pool) it is full, and this token was the last */
    if ((j->max_tokens > 0 && n_gen >= j->max_tokens) ||
        tl_session_n_past(j->sess) + 1 >= s->seq_tokens) {
        job_finish(s, j, TL_FIN_LENGTH, 0, NULL);
        return 1;
    }
    j->next_tok = o->token;
    return 0;
}

/* ====== Prefix cache (docs/architecture.md §4.1, §6.1). ====== */

static int is_decoding(const tl_job *j);

/* Snapshots the job's session where it stands; a failure only costs the snapshot. last: the
 * session is closed next (its partial page goes to the cache instead of being copied). */
static void snap_save(tl_sched *s, tl_job *j, int last) {
    if (!s->pc_on || !j->sess) return;
    char err[256];
    int rc = last ? tl_session_prefix_save_last(j->sess, j->cache_salt, err, sizeof err)
                  : tl_session_prefix_save(j->sess, j->cache_salt, err, sizeof err);
    if (rc < 0) fprintf(stderr, "tulip: prefix cache snapshot failed: %s\n", err);
}

/* The first snapshot point of j's prefill after `from`: the end of its last complete message,
 * every snap_every tokens, or the end of what it prefills (n_target). */
static int next_snap_point(const tl_sched *s, const tl_job *j, int from) {
    int p = j->n_target;
    if (j->snap_at > from && j->snap_at < p) p = j->snap_at;
    int every = (from / s->p.snap_every + 1) * s->p.snap_every;
    return TL_MIN(p, every);
}

/* The tokens of the prefill of a and the prompt of b have in common. */
static int shared_prefix(const tl_job *a, const tl_job *b) {
    int n = TL_MIN(a->n_target, b->n_prompt), i = 0;
    while (i < n && a->seq[i] == b->prompt[i]) i++;
    return i;
}

static int same_salt(const tl_job *a, const tl_job *b) {
    return !strcmp(a->cache_salt ? a->cache_salt : "", b->cache_salt ? b->cache_salt : "");
}

/* Should queued job j wait for a running job still prefilling a prefix they share, until it has
 * snapshotted it (concurrent sharers: the first computes, the others reuse)? Yes when a running
 * job of the same salt will take a snapshot at a point p with n_fed < p <= the shared prefix
 * (and p < j's prompt: j must compute at least one token). */
static int wait_for_sharer(const tl_sched *s, const tl_job *j) {
    if (!s->pc_on || j->n_preempt) return 0;
    for (int i = 0; i < s->n_live; i++) {
        const tl_job *r = s->running[i];
        if (is_decoding(r) || r->finished || !same_salt(r, j)) continue;
        int shared = TL_MIN(shared_prefix(r, j), j->n_prompt - 1);
        if (next_snap_point(s, r, r->n_fed) <= shared) return 1;
    }
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
    tl_kv_stats ks;
    tl_engine_kv_stats(s->eng, &ks);
    tl_prefix_stats ps;
    tl_engine_prefix_stats(s->eng, &ps);
    tl_spec_stats ss;
    tl_engine_spec_stats(s->eng, &ss);
    pthread_mutex_lock(&s->mu);
    s->pc_pub = ps;
    s->spec_pub = ss;
    s->n_running = s->n_live;
    s->n_sessions = n_sess;
    s->kv_tokens = kv;
    s->kv_pub = ks;
    pthread_mutex_unlock(&s->mu);
}

/* ====== The step loop: wait, cancel, plan (and preempt), admit, run, deliver, sweep. ====== */

/* Drops cancelled jobs from the queue (they hold no session). Called with s->mu held. */
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

typedef enum { WAIT_STEP, WAIT_AGAIN, WAIT_EXIT } wait_result;

/* The idle engine's gathering (tl_sched_params.gather_us): returns once no job has arrived for
 * gather_us, or 8 x gather_us after the call, or when stopping. Called with s->mu held; s->cv
 * runs on CLOCK_MONOTONIC, tl_time_s's clock. */
static void gather_arrivals(tl_sched *s) {
    double t_end = tl_time_s() + 8e-6 * s->p.gather_us;
    for (;;) {
        long seen = s->n_arrived;
        double until = TL_MIN(tl_time_s() + 1e-6 * s->p.gather_us, t_end);
        struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
        while (!s->stop && s->n_arrived == seen &&
               pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {
        }
        if (s->stop || s->n_arrived == seen) return; /* stopping, or a quiet gap */
    }
}

/* 1. Waits for work and reaps cancelled queued jobs. *stop: shutting down (everything running
 * is cancelled next). */
static wait_result wait_work(tl_sched *s, int *stop) {
    tl_job *reaped[64];
    int n_reaped = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->q_head && s->n_live == 0) pthread_cond_wait(&s->cv, &s->mu);
    if (s->n_live == 0 && s->q_head && s->p.gather_us > 0) gather_arrivals(s);
    *stop = s->stop;
    queue_reap(s, reaped, &n_reaped, 64);
    int empty = !s->q_head; /* only this thread takes from the queue; none join when stopping */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_reaped; i++) job_release(s, reaped[i], TL_FIN_CANCELLED, 0, NULL);
    if (*stop && s->n_live == 0) return empty ? WAIT_EXIT : WAIT_AGAIN;
    return WAIT_STEP;
}

/* A lost device: the server takes no more work (tl_sched_lost; it exits and is restarted). */
static void set_lost(tl_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->lost = 1;
    s->accepting = 0;
    pthread_mutex_unlock(&s->mu);
}

/* 2. Cancelled running jobs end (all of them when stopping). */
static void cancel_running(tl_sched *s, int stop) {
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (atomic_load(&j->cancel) || stop)
            job_release(s, j, TL_FIN_CANCELLED, 0, NULL);
        else
            s->running[k++] = j;
    }
    s->n_live = k;
}

static int is_decoding(const tl_job *j) { return j->n_fed >= j->n_target; }

/* Pages a job that holds none needs to start: its tokens to prefill and the first one after
 * them. Within the sequence limit: a prompt was checked at submit, and a job under way ends
 * when its tokens reach the limit, so it is never preempted holding more than limit - 1. */
static long start_pages(const tl_sched *s, const tl_job *j) {
    return tl_kv_pages_to_grow(&s->kv, 0, j->n_target + 1);
}

/* Gives running[idx] back to the head of the queue: its sampler state is saved and its session
 * closed (its KV pages go back to the pool); it will prefill its prompt and everything it
 * generated again, then go on sampling where it stopped. Its reader notices nothing but the
 * wait. */
static void preempt(tl_sched *s, int idx) {
    tl_job *j = s->running[idx];
    snap_save(s, j, 1); /* readmitted, it restores this instead of recomputing (§4.1) */
    tl_session_save(j->sess, &j->snap);
    int rc = tl_session_close(j->sess);
    j->sess = NULL;
    if (rc)
        fprintf(stderr, "tulip: clearing a preempted sequence's state failed: %s\n",
                tl_status_str(rc));
    j->n_fed = 0;
    j->n_target = j->n_seq;
    j->n_plan = 0;
    j->n_preempt++;
    memmove(&s->running[idx], &s->running[idx + 1],
            (size_t)(s->n_live - idx - 1) * sizeof *s->running);
    s->n_live--;
    pthread_mutex_lock(&s->mu);
    j->next = s->q_head;
    s->q_head = j;
    if (!s->q_tail) s->q_tail = j;
    s->n_queued++;
    pthread_mutex_unlock(&s->mu);
    if (s->m) tl_metrics_preempt(s->m);
    tl_engine_kv_stats(s->eng, &s->kv);
}

/* The step's token budget, shared by the prefill chunks oldest first (decode tokens come off it
 * first): a chunk takes at least 32 tokens (or the rest of its prompt) and at least one moves. */
typedef struct step_plan {
    int budget, moved;
    long free; /* pages free once the planned tokens are in */
} step_plan;

/* A chunk holds at most one snapshot point inside it, taken inside the step (snap_inside), and
 * ends at the one after it at the latest (saved after the step: deliver). Except: when the rest
 * of the prompt fits in this step and its points are an interval one and then the end of the last
 * message, the interval point gives way (not taken) and the chunk runs to the prompt's end with
 * the message end inside: one step instead of a second one for the generation prompt's few
 * tokens (~8 ms on the H100, BENCHMARKS.md session 12). The message end is what the next turn
 * reuses; the interval point lay among this turn's new tokens, which other requests rarely
 * share. */
static int chunk_tokens(const tl_sched *s, const tl_job *j, const step_plan *sp) {
    if (sp->budget <= 0 && sp->moved) return 0;
    int end = j->n_target, cap = TL_MAX(sp->budget, 32);
    if (s->pc_on) {
        int p = next_snap_point(s, j, j->n_fed);
        end = p < j->n_target ? next_snap_point(s, j, p) : p;
        if (end == j->snap_at && p != j->snap_at && j->n_target - j->n_fed <= cap)
            end = j->n_target;
    }
    return TL_MIN(end - j->n_fed, cap);
}

/* The snapshot point inside j's planned chunk (tl_batch_entry.snap_at), or 0: the first point
 * inside it, or the end of the last message when chunk_tokens let an interval point give way. */
static int snap_inside(const tl_sched *s, const tl_job *j) {
    if (!s->pc_on) return 0;
    int p = next_snap_point(s, j, j->n_fed), end = j->n_fed + j->n_plan;
    if (p >= end) return 0;
    return j->snap_at > p && j->snap_at < end ? j->snap_at : p;
}

/* Draft tokens a decoding job may have verified this step (docs/architecture.md §3.6): none for
 * jobs whose tokens are decided outside the sampler (test scripts, forced tool calls), that are
 * constrained (a grammar's mask holds for one position) or still under min_tokens; at most what
 * max_tokens leaves after this step's sample, short enough that every emitted token stays below
 * the sequence limit (so job_after_sample's length check, made with the step's final length,
 * cannot end a job early), and within the free pages (its pages taken from sp). */
static int spec_budget(tl_sched *s, tl_job *j, long past, step_plan *sp) {
    if (!s->spec_k || j->script || j->force || j->con || j->n_gen < j->min_tokens) return 0;
    long k = s->spec_k;
    if (j->max_tokens > 0) k = TL_MIN(k, j->max_tokens - j->n_gen - 1);
    k = TL_MIN(k, s->seq_tokens - past - 3);
    while (k > 0 && tl_kv_pages_to_grow(&s->kv, past + 1, past + 1 + k) > sp->free) k--;
    if (k <= 0) return 0;
    sp->free -= tl_kv_pages_to_grow(&s->kv, past + 1, past + 1 + k);
    return (int)k;
}

/* Plans running[i]'s tokens of this step within the free pages: a prefill chunk shrinks to the
 * pages left; when not even one token fits, the newest running job is preempted, until this one
 * fits or is itself the newest and yields. Returns 0 when it was preempted (running[i] is now
 * the next job). A job alone that cannot grow is at the pool's limit: it ends ("length"). */
static int plan_job(tl_sched *s, int i, step_plan *sp) {
    tl_job *j = s->running[i];
    int dec = is_decoding(j), want = dec ? 1 : chunk_tokens(s, j, sp);
    long past = tl_session_n_past(j->sess), need;
    j->n_plan = 0;
    if (want == 0) return 1;
    while ((need = tl_kv_pages_to_grow(&s->kv, past, past + want)) > sp->free) {
        long room = (TL_CEIL_DIV(past, s->kv.page_tokens) + sp->free) * s->kv.page_tokens - past;
        if (!dec && room > 0) {
            want = (int)room;
            continue;
        }
        if (s->n_live == 1) {
            fprintf(stderr, "tulip: a sequence of %ld tokens alone cannot grow in the KV pool\n",
                    past);
            job_finish(s, j, TL_FIN_LENGTH, 0, NULL);
            return 1; /* swept after the step */
        }
        long before = s->kv.pages_free;
        preempt(s, s->n_live - 1);
        if (s->n_live == i) return 0; /* it was this one */
        sp->free += s->kv.pages_free - before;
    }
    sp->free -= need;
    j->n_plan = want;
    if (!dec) sp->budget -= want, sp->moved = 1;
    j->n_spec = dec ? spec_budget(s, j, past, sp) : 0;
    return 1;
}

/* 3. This step's tokens of the running jobs, oldest first, preempting as the pool requires. */
static void plan_running(tl_sched *s, step_plan *sp) {
    int n_dec = 0;
    for (int i = 0; i < s->n_live; i++) n_dec += is_decoding(s->running[i]);
    *sp = (step_plan){.budget = s->p.step_tokens - n_dec, .free = s->kv.pages_free};
    for (int i = 0; i < s->n_live;)
        if (plan_job(s, i, sp)) i++;
}

/* A session for a job being admitted (the first time: its sequence starts as the prompt; after
 * a preemption: restored to where it stopped), or the job ends (bad parameters, no slot).
 * Returns 1 when the job can run. */
static int prefix_load(tl_sched *s, tl_job *j, char *err, size_t errlen);

static int job_start(tl_sched *s, tl_job *j, double now) {
    char err[256];
    /* checked here too, so that one job's bad parameters never fail the whole step */
    int st = tl_sample_params_check(&j->sample, err, sizeof err);
    if (!st && !j->seq) {
        j->seq = malloc(sizeof(int32_t) * (size_t)j->n_prompt);
        if (!j->seq) st = tl_errf(err, sizeof err, TL_ERR_NOMEM, "out of memory");
        if (!st) memcpy(j->seq, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
        j->n_seq = j->cap_seq = j->n_prompt;
        j->t_admit = now;
        if (j->force && !j->in_think) j->force_pos = 0;
    }
    if (st) {
        job_release(s, j, TL_FIN_ERROR, st, err);
        return 0;
    }
    st = tl_session_open(s->eng, &j->sess, err, sizeof err);
    if (!st && j->n_preempt) st = tl_session_restore(j->sess, &j->snap);
    j->n_fed = 0;
    if (!st) st = prefix_load(s, j, err, sizeof err);
    if (st) {
        if (st == TL_ERR_DEVICE_LOST) { /* no slot could be reset: the device is gone */
            fprintf(stderr, "tulip: opening a session failed: %s\n", err);
            set_lost(s);
        }
        job_release(s, j, TL_FIN_ERROR, st, err);
        return 0;
    }
    return 1;
}

/* The longest cached prefix of the job's tokens (at least one is left to compute): the session
 * starts there. A backend failure resets the session and the job computes everything. */
static int prefix_load(tl_sched *s, tl_job *j, char *err, size_t errlen) {
    if (!s->pc_on) return 0;
    int got = tl_session_prefix_load(j->sess, j->cache_salt, j->seq, j->n_target, j->n_target - 1,
                                     err, errlen);
    if (got < 0) {
        fprintf(stderr, "tulip: prefix cache load failed (computing the prompt): %s\n", err);
        int rc = tl_session_reset(j->sess);
        if (rc)
            return tl_errf(err, errlen, rc, "resetting a session failed: %s", tl_status_str(rc));
        if (j->n_preempt) tl_session_restore(j->sess, &j->snap);
        got = 0;
    }
    j->n_fed = got;
    if (!j->n_preempt) {
        j->n_cached = got;
        if (s->m) tl_metrics_prefix_cache(s->m, j->n_target, got); /* vllm:prefix_cache_* */
    }
    return 0;
}

/* 4. Admission, FIFO: the queue's head starts when a slot is free and its tokens and first token
 * fit in the pages left after this step's plan and the rest of the prompts being prefilled;
 * otherwise it and everything behind it wait (also after a step the pool could not hold, until a
 * running job ends). With nothing running it starts regardless: the pool is as free as it gets
 * (a slot whose reset failed may hold pages until its next reset, at the session's open), and a
 * prompt that can never fit was refused at submit. Its first chunk joins this step. */
static void admit(tl_sched *s, int stop, step_plan *sp) {
    long avail = sp->free;
    for (int i = 0; i < s->n_live; i++) {
        const tl_job *j = s->running[i];
        if (!is_decoding(j) && !j->finished)
            avail -= tl_kv_pages_to_grow(&s->kv, tl_session_n_past(j->sess) + j->n_plan,
                                         j->n_target + 1);
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        tl_job *j = s->q_head;
        long need = j ? start_pages(s, j) : 0;
        if (!j || stop || s->lost || s->n_live >= s->max_seqs ||
            (s->n_live && (need > avail || s->admit_hold || wait_for_sharer(s, j)))) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        j->next = NULL;
        pthread_mutex_unlock(&s->mu);
        if (s->admit_delay_us) usleep((useconds_t)s->admit_delay_us);
        /* its own admission time: one taken before the loop could precede the submission of a
         * job queued while earlier ones started (a prefix load takes a while), and a negative
         * queue time drops the request from /metrics' queue and prefill histograms */
        if (!job_start(s, j, tl_time_s())) continue;
        avail -= need;
        s->running[s->n_live++] = j;
        j->n_plan = chunk_tokens(s, j, sp); /* n_fed: the tokens restored from the cache */
        sp->free -= tl_kv_pages_to_grow(&s->kv, 0, j->n_fed + j->n_plan);
        if (j->n_plan) sp->budget -= j->n_plan, sp->moved = 1;
    }
}

/* The sampling parameters of j's next token: with EOS and the stop ids banned while fewer than
 * min_tokens are out (the ban bitset is built once, at the first such step; a grammar's mask of
 * this step, job_mask below, is intersected with it in min_and). */
static const tl_sample_params *job_sample(tl_sched *s, tl_job *j) {
    if (j->n_gen >= j->min_tokens) return &j->sample;
    int V = s->n_vocab, W = (V + 31) / 32;
    if (!j->min_allow) {
        j->min_allow = xmalloc(sizeof(uint32_t) * (size_t)W); /* bookkeeping: n_vocab bits */
        memset(j->min_allow, 0xff, sizeof(uint32_t) * (size_t)W);
        for (int i = 0; i < s->n_eos + j->n_stop_ids; i++) {
            int t = i < s->n_eos ? s->eos[i] : j->stop_ids[i - s->n_eos];
            if (t >= 0 && t < V) j->min_allow[t / 32] &= ~(1u << (t % 32));
        }
    }
    j->sample_min = j->sample;
    j->sample_min.allow = j->min_allow;
    return &j->sample_min;
}

/* 5a. A constrained job's allowed-token mask of this step (tl_batch_entry.prepare): called by the
 * engine while the forward runs, so the grammar's work overlaps the GPU's; written into the
 * parameters the entry points to (and ANDed with the min_tokens ban). A mask that cannot be
 * computed leaves the token unrestricted and marks the job, which ends with the error once the
 * step is over (job_after_sample). */
static void job_mask(void *ctx) {
    tl_job *j = ctx;
    const uint32_t *m = NULL;
    int left = j->max_tokens > 0 ? j->max_tokens - j->n_gen : 0;
    if (tl_con_mask(j->con, left, &m, j->con_err, sizeof j->con_err)) j->con_failed = 1, m = NULL;
    j->sample.allow = m;
    if (j->n_gen >= j->min_tokens) return;
    j->sample_min.allow = j->min_allow;
    if (m) { /* constrained: grammar mask AND the min_tokens ban */
        int W = j->con_words;
        if (!j->min_and) j->min_and = xmalloc(sizeof(uint32_t) * (size_t)W);
        for (int w = 0; w < W; w++) j->min_and[w] = m[w] & j->min_allow[w];
        j->sample_min.allow = j->min_and;
    }
}

/* 5b. The batch from the plan: one decode token per decoding job, then the prefill chunks, oldest
 * first; the last chunk of a sequence asks for a sample. Returns the entry count. */
static int build_batch(tl_sched *s) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < s->n_live; i++) {
            tl_job *j = s->running[i];
            if (!j->n_plan || j->finished || is_decoding(j) != (pass == 0)) continue;
            if (pass == 0)
                s->entries[n] = (tl_batch_entry){.sess = j->sess,
                                                 .tokens = &j->next_tok,
                                                 .n_tok = 1,
                                                 .sample = job_sample(s, j),
                                                 .spec_max = j->n_spec};
            else
                s->entries[n] = (tl_batch_entry){
                    .sess = j->sess,
                    .tokens = j->seq + j->n_fed,
                    .n_tok = j->n_plan,
                    .sample = j->n_fed + j->n_plan == j->n_target ? job_sample(s, j) : NULL,
                    .snap_at = snap_inside(s, j),
                    .snap_salt = j->cache_salt};
            s->entry_job[n++] = j;
        }
    }
    for (int i = 0; i < n; i++) {
        tl_job *j = s->entry_job[i];
        if (!s->entries[i].sample) continue;
        s->entries[i].out = &s->outs[(size_t)i * (1 + s->spec_k)];
        if (j->con) {               /* the mask comes during the forward: job_mask */
            j->sample.allow = NULL; /* job_sample left sample_min's at the min_tokens ban */
            j->con_words = (s->n_vocab + 31) / 32;
            s->entries[i].prepare = job_mask, s->entries[i].prepare_ctx = j;
        }
    }
    return n;
}

/* 6. One forward (or the test mode's injected device loss). */
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

/* 7a. A failed step: a lost device stops the server taking work; a KV pool that ran out
 * although the plan said the pages were there (no session changed, tulip.h) preempts the newest
 * sequence, or, alone, ends it at the pool's limit; anything else fails the batch's jobs. */
static void step_failed(tl_sched *s, int st, const char *err) {
    if (st == TL_ERR_CONTEXT_FULL && s->n_live > 1) {
        fprintf(stderr, "tulip: %s; preempting the newest sequence\n", err);
        preempt(s, s->n_live - 1);
        s->admit_hold = 1;
        return;
    }
    if (st == TL_ERR_CONTEXT_FULL && s->n_live == 1) {
        fprintf(stderr, "tulip: %s; a sequence alone fills the KV pool\n", err);
        job_release(s, s->running[0], TL_FIN_LENGTH, 0, NULL);
        s->n_live = 0;
        return;
    }
    fprintf(stderr, "tulip: engine step failed: %s: %s\n", tl_status_str(st), err);
    if (st == TL_ERR_DEVICE_LOST || st == TL_ERR_CUDA) {
        set_lost(s);
        st = TL_ERR_DEVICE_LOST;
    }
    fail_all(s, st, err);
}

/* 7b. Prompt progress, events, and the ends they bring. */
static void deliver(tl_sched *s, int n) {
    double now = tl_time_s();
    for (int i = 0; i < n; i++) {
        tl_job *j = s->entry_job[i];
        if (s->entries[i].tokens != &j->next_tok) {
            j->n_fed += s->entries[i].n_tok;
            if (s->pc_on && j->n_fed == next_snap_point(s, j, j->n_fed - 1)) snap_save(s, j, 0);
        }
        /* with speculation a step may emit several tokens (§3.6); a job that ends on one
         * drops the rest (its session closes) */
        for (int k = 0; s->entries[i].sample && k < s->entries[i].n_out; k++)
            if (job_after_sample(s, j, &s->entries[i].out[k], now)) break;
    }
}

/* 8. Jobs that ended leave running[]. */
static void sweep(tl_sched *s) {
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        tl_job *j = s->running[i];
        if (j->finished) {
            tl_job_unref(j); /* written by this thread: no lock needed */
            s->admit_hold = 0;
        } else
            s->running[k++] = j;
    }
    s->n_live = k;
}

static void *engine_main(void *arg) {
    tl_sched *s = arg;
    char err[256];
    for (;;) {
        int stop;
        wait_result w = wait_work(s, &stop);
        if (w == WAIT_EXIT) break;
        if (w == WAIT_AGAIN) continue;
        cancel_running(s, stop);
        tl_engine_kv_stats(s->eng, &s->kv);
        step_plan sp;
        plan_running(s, &sp);
        admit(s, stop, &sp);
        int n = build_batch(s);
        publish_stats(s);
        if (n > 0) {
            int st = run_batch(s, n, err, sizeof err);
            if (st)
                step_failed(s, st, err);
            else
                deliver(s, n);
        }
        if (s->sweep_delay_us) usleep((useconds_t)s->sweep_delay_us);
        sweep(s);
        publish_stats(s);
    }
    s->n_live = 0;
    publish_stats(s);
    return NULL;
}

/* ====== Public API. ====== */

/* A test pause from the environment: name's milliseconds (0 .. 10,000) in microseconds. */
static int test_delay_us(const char *name) {
    const char *v = getenv(name);
    return v ? 1000 * TL_MAX(0, TL_MIN(atoi(v), 10000)) : 0;
}

int tl_sched_create(tl_sched **out, tl_engine *e, const tl_sched_params *p, struct tl_metrics *m,
                    char *err, size_t errlen) {
    tl_sched *s = xcalloc(1, sizeof *s);
    s->eng = e;
    s->p = *p;
    if (s->p.step_tokens <= 0) s->p.step_tokens = 512;
    if (s->p.max_queue < 0) s->p.max_queue = 0;
    if (s->p.snap_every <= 0) s->p.snap_every = 4096;
    s->admit_delay_us = test_delay_us("TL_TEST_ADMIT_DELAY_MS");
    s->sweep_delay_us = test_delay_us("TL_TEST_SWEEP_DELAY_MS");
    s->pc_on = tl_engine_prefix_enabled(e);
    s->spec_k = tl_engine_spec_tokens(e);
    s->m = m;
    s->max_seqs = tl_engine_max_seqs(e);
    s->max_ctx = tl_engine_max_ctx(e);
    s->n_vocab = tl_engine_config(e)->n_vocab;
    tl_engine_kv_stats(e, &s->kv0); /* the engine thread does not run yet */
    s->kv_pub = s->kv = s->kv0;
    s->seq_tokens = TL_MIN((long)s->max_ctx,
                           TL_MIN(s->kv0.pages_total, s->kv0.pages_per_seq) * s->kv0.page_tokens);
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
    s->outs = xcalloc((size_t)s->max_seqs * (1 + s->spec_k), sizeof *s->outs);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca; /* gather_arrivals' deadlines are tl_time_s's */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
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

/* A prompt that could never run: empty, or it and one generated token exceed the sequence limit
 * (the context, or the whole KV pool). */
static int check_prompt(const tl_sched *s, const tl_job *j, char *err, size_t errlen) {
    if (j->n_prompt <= 0) return tl_errf(err, errlen, TL_ERR_INVALID, "the prompt is empty");
    if (j->n_prompt < s->seq_tokens) return 0;
    if (s->seq_tokens == s->max_ctx)
        return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                       "a prompt of %d tokens leaves no room for a token in the context of %d",
                       j->n_prompt, s->max_ctx);
    return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                   "a prompt of %d tokens and its first generated token need %ld KV cache pages "
                   "of %d tokens; the whole pool has %ld (%ld tokens)",
                   j->n_prompt, tl_kv_pages_to_grow(&s->kv0, 0, j->n_prompt + 1),
                   s->kv0.page_tokens, s->kv0.pages_total, s->kv0.pages_total * s->kv0.page_tokens);
}

int tl_sched_submit(tl_sched *s, tl_job *j, char *err, size_t errlen) {
    int st = check_prompt(s, j, err, errlen);
    if (st) return st;
    pthread_mutex_lock(&s->mu);
    if (s->lost)
        st =
            tl_errf(err, errlen, TL_ERR_DEVICE_LOST, "the engine failed; the server is restarting");
    else if (!s->accepting)
        st = tl_errf(err, errlen, TL_ERR_CANCELLED, "the server is shutting down");
    /* busy: the queue is full and no slot is free for what it holds. n_jobs, not the published
     * n_running + n_queued: a stream that has finished leaves n_jobs at once, while n_running
     * counts it until the step's sweep; when many streams end in one step (a wave of equal
     * requests), their clients' next requests arrived in that window and got 429s with slots
     * free (256 clients on the GPU: 63 errors in 15 s, BENCHMARKS.md 2026-12-06). */
    else if (s->n_queued >= s->p.max_queue && s->n_jobs >= s->max_seqs)
        st = tl_errf(err, errlen, TL_ERR_BUSY,
                     "the server is busy (%d requests waiting); retry later", s->n_queued);
    if (st) {
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    tl_job_ref(j);
    j->t_submit = tl_time_s();
    j->n_target = j->n_prompt;
    j->next = NULL;
    if (s->q_tail)
        s->q_tail->next = j;
    else
        s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    s->n_jobs++;
    s->n_arrived++;
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
        /* not q_head || n_running: a job the engine thread has taken from the queue but not yet
         * counted as running (n_running is published after the step is planned) is in neither */
        int busy = s->n_jobs > 0;
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

void tl_sched_prefix_stats(tl_sched *s, tl_prefix_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->pc_pub;
    pthread_mutex_unlock(&s->mu);
}

void tl_sched_spec_stats(tl_sched *s, tl_spec_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->spec_pub;
    pthread_mutex_unlock(&s->mu);
}

void tl_sched_kv_stats(tl_sched *s, tl_kv_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->kv_pub;
    pthread_mutex_unlock(&s->mu);
}

long tl_sched_seq_tokens(const tl_sched *s) { return s->seq_tokens; }
