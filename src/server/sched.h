/* The engine thread: continuous batching over tl_engine_step. HTTP threads build a tl_job (prompt
 * ids + sampling), submit it to a bounded queue, then read the token events the engine thread
 * appends to the job, waiting on the job's eventfd and on their client socket at once. The
 * engine thread is the only thread that touches the engine and the sessions.
 *
 * KV memory: a queued job is admitted only when its prompt and first token fit in the free KV
 * pages (after this step's growth of the running sequences and the rest of the prompts being
 * prefilled); a running sequence that cannot get a page for its next step is preempted (the
 * newest running one yields first): its session is closed, and it waits at the front of the
 * queue to recompute its prompt and generated tokens, invisibly to its reader
 * (docs/architecture.md §6.1). */
#ifndef TL_SERVER_SCHED_H
#define TL_SERVER_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "tulip.h"

struct tl_metrics;

typedef enum tl_finish {
    TL_FIN_NONE = 0,
    TL_FIN_STOP,      /* end-of-sequence token */
    TL_FIN_LENGTH,    /* max_tokens reached, or the context (or the whole KV pool) is full */
    TL_FIN_CANCELLED, /* the reader cancelled (client gone, stop string matched, shutdown) */
    TL_FIN_ERROR,     /* err_status / err say why */
} tl_finish;

typedef struct tl_job {
    /* Inputs: set by the submitting thread before tl_sched_submit, read-only afterwards. */
    int32_t *prompt; /* owned */
    int n_prompt;
    tl_sample_params sample;
    int max_tokens; /* <= 0: until the context is full */
    int ignore_eos;
    /* Token restrictions (owned; sample.bias_* point into these): logit_bias pairs, and
     * stop_token_ids (a sampled one ends the job with TL_FIN_STOP, even with ignore_eos). Until
     * min_tokens tokens are out, EOS and the stop ids are banned (sample_min, whose allow
     * bitset the engine thread builds at the first step). */
    int32_t *bias_ids;
    float *bias_vals;
    int32_t *stop_ids;
    int n_stop_ids;
    int min_tokens;
    uint32_t *min_allow;
    uint32_t *min_and; /* min_allow AND a grammar's mask of this step (job_sample) */
    tl_sample_params sample_min;
    int32_t *script; /* test mode: emitted instead of sampled tokens, then EOS (owned) */
    int n_script;
    int fail_after; /* test mode: fail with TL_ERR_INTERNAL after this many tokens (0: off) */
    int fail_lost;  /* test mode: instead, the step after that fails as a lost device */
    /* Tokens forced after the reasoning ends (tool_choice required/named): when think_end_id
     * is emitted, or from the start if !in_think, the next n_force tokens are these (owned). */
    int32_t *force;
    int n_force;
    int think_end_id; /* -1: none */
    int in_think;
    struct tl_con *con; /* constrained decoding (server/constrain.h), owned; NULL: none */
    int con_failed;     /* this step's mask could not be computed (con_err says why) */
    int con_words;      /* words of a mask (n_vocab bits) */
    char con_err[256];
    /* Prefix cache (docs/architecture.md §4.1, §6.1): the salt (owned, NULL: none), and where
     * the last complete message before the generation prompt ends (a snapshot point; 0: none). */
    char *cache_salt;
    int snap_at;
    /* Set by the engine thread before the first event (read it after one, or once finished):
     * prompt tokens restored from the prefix cache at the job's first start. */
    int n_cached;

    /* Shared between the engine thread and the reader, under mu. */
    pthread_mutex_t mu;
    tl_sample_out *ev; /* events not yet taken by the reader */
    int n_ev, cap_ev;
    int finished; /* a tl_finish once the engine thread is done with the job */
    int err_status;
    char err[256];
    int n_gen; /* tokens emitted so far */
    double t_submit, t_admit, t_first, t_last;
    double t_out; /* the reader queued its first output chunk for the socket (streams; 0: not) */
    int efd;      /* eventfd: written on every new event and at the end */
    atomic_int cancel;
    atomic_int refs;

    /* Engine-thread private. */
    tl_session *sess;
    int32_t *seq; /* the prompt, then every emitted token: what a preempted job recomputes
                     (NULL until the job first starts) */
    int n_seq, cap_seq;
    int n_target;         /* tokens of seq to prefill before decoding: n_prompt, or after a
                             preemption n_seq */
    int n_fed;            /* tokens of seq consumed by the current session (prefill) */
    int n_plan;           /* tokens this step (0: none) */
    int n_spec;           /* draft tokens it may have verified this step (docs/architecture.md
                             §3.6; 0: none) */
    int32_t next_tok;     /* decode input of the next step */
    int force_pos;        /* next forced token; -1: forcing not active */
    tl_session_snap snap; /* the sampler's state while preempted */
    int n_preempt;        /* times preempted; may be read once the job has finished */
    struct tl_job *next;
} tl_job;

/* A new job with one reference (the caller's). Returns NULL when no eventfd can be made. */
tl_job *tl_job_new(void);
void tl_job_ref(tl_job *j);
void tl_job_unref(tl_job *j);
/* Asks the engine thread to stop the job; it finishes as TL_FIN_CANCELLED within one step. */
void tl_job_cancel(tl_job *j);
/* The reader queued the job's first output chunk for the client now (the request log's
 * first_out); the reader calls it once, later calls change nothing. */
void tl_job_note_output(tl_job *j);

/* Waits up to timeout_ms for new events or the end of the job, while watching sockfd (if >= 0)
 * for a hang-up. Returns 1 (something to read), 0 (timeout) or -1 (the client went away). */
int tl_job_wait(tl_job *j, int sockfd, int timeout_ms);

/* Moves up to max pending events into out (oldest first) and returns how many; *finished gets
 * the finish reason (TL_FIN_NONE while running). Finished is reported only once every event has
 * been taken. */
int tl_job_take(tl_job *j, tl_sample_out *out, int max, int *finished);

typedef struct tl_sched_params {
    int max_queue;   /* waiting jobs beyond this answer TL_ERR_BUSY (429) */
    int step_tokens; /* token budget of one step: decode tokens + prefill chunk(s) */
    int snap_every;  /* prefix cache snapshot every this many prompt tokens (0: 4096) */
    /* An idle engine (nothing running) that gets a request waits until no other request has
     * arrived for gather_us microseconds (at most 8 x gather_us in all) before its first step,
     * so that requests sent together share it instead of all but the first waiting for a whole
     * prefill step. 0: start at once (the default until measured on the GPU: on the CPU backend
     * a shared step costs its tokens' sum, so gathering raised the mean TTFT there). */
    int gather_us;
} tl_sched_params;

typedef struct tl_sched tl_sched;

/* Starts the engine thread on e (which it then owns until tl_sched_destroy). */
int tl_sched_create(tl_sched **out, tl_engine *e, const tl_sched_params *p, struct tl_metrics *m,
                    char *err, size_t errlen);
/* Queues a job (takes a reference). TL_ERR_INVALID: empty prompt; TL_ERR_CONTEXT_FULL: the
 * prompt and one generated token do not fit in the context or in the whole KV pool (it could
 * never run); TL_ERR_BUSY: queue full; TL_ERR_DEVICE_LOST: the engine failed; TL_ERR_CANCELLED:
 * shutting down. err says which. */
int tl_sched_submit(tl_sched *s, tl_job *j, char *err, size_t errlen);
/* Stops accepting jobs, lets running ones finish for up to grace_s seconds, cancels the rest,
 * joins the engine thread. The engine stays open (the caller closes it). Submitting afterwards
 * is safe (TL_ERR_CANCELLED) until tl_sched_free. */
void tl_sched_shutdown(tl_sched *s, double grace_s);
void tl_sched_free(tl_sched *s);
/* 1 once a device error made the engine unusable. */
int tl_sched_lost(const tl_sched *s);
/* Snapshot: waiting jobs, running jobs, live sessions, tokens held in KV by live sessions. */
void tl_sched_stats(tl_sched *s, int *queued, int *running, int *sessions, long *kv_tokens);
/* The prefix cache as of the last step (tulip.h tl_prefix_stats; zeros without one). */
void tl_sched_prefix_stats(tl_sched *s, tl_prefix_stats *out);
/* Speculative decoding counters as of the last step (tulip.h tl_spec_stats). */
void tl_sched_spec_stats(tl_sched *s, tl_spec_stats *out);
/* The KV pool as of the last step (tulip.h tl_kv_stats). */
void tl_sched_kv_stats(tl_sched *s, tl_kv_stats *out);
/* The most tokens one sequence can hold: the context, or the whole KV pool when that is less. A
 * prompt must leave room for one more (tl_sched_submit). Fixed at create. */
long tl_sched_seq_tokens(const tl_sched *s);

#endif
