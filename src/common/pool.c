/* Worker pool: workers are started on first use and sleep on a condition variable between jobs.
 * A job is a range [0, n) handed out one index at a time through an atomic counter, so uneven
 * work (quantized rows, experts) balances itself. */
#include <pthread.h>
#include <stdatomic.h>
#include "common/pool.h"
#include "common/util.h"

#define POOL_MAX 256

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv_job = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_cv_done = PTHREAD_COND_INITIALIZER;
static int pool_want, pool_started;
static unsigned long pool_gen;
static int pool_busy; /* workers still inside the current job */
static void (*job_fn)(void *, int);
static void *job_ctx;
static int job_n;
static atomic_int job_next;
static _Thread_local int pool_inside; /* nested calls run inline */

static void pool_drain(void) {
    pool_inside = 1;
    for (;;) {
        int i = atomic_fetch_add(&job_next, 1);
        if (i >= job_n) break;
        job_fn(job_ctx, i);
    }
    pool_inside = 0;
}

static void *pool_worker(void *arg) {
    unsigned long seen = 0;
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&pool_mu);
        while (pool_gen == seen) pthread_cond_wait(&pool_cv_job, &pool_mu);
        seen = pool_gen;
        pthread_mutex_unlock(&pool_mu);
        pool_drain();
        pthread_mutex_lock(&pool_mu);
        if (--pool_busy == 0) pthread_cond_signal(&pool_cv_done);
        pthread_mutex_unlock(&pool_mu);
    }
    return NULL;
}

void tl_pool_set_threads(int n) {
    pthread_mutex_lock(&pool_lock);
    pool_want = n;
    pthread_mutex_unlock(&pool_lock);
}

int tl_pool_threads(void) {
    int n = pool_want > 0 ? pool_want : tl_n_cpus();
    return n > POOL_MAX ? POOL_MAX : n;
}

void tl_pool_for(int n, void (*fn)(void *ctx, int i), void *ctx) {
    if (n <= 0) return;
    if (pool_inside) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool_lock);
    int nt = tl_pool_threads();
    if (nt <= 1 || n == 1) {
        pthread_mutex_unlock(&pool_lock);
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    while (pool_started < nt - 1) { /* workers are never stopped; the count only grows */
        pthread_t t;
        if (pthread_create(&t, NULL, pool_worker, NULL) != 0) break;
        pthread_detach(t);
        pool_started++;
    }
    pthread_mutex_lock(&pool_mu);
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    atomic_store(&job_next, 0);
    pool_busy = pool_started;
    pool_gen++;
    pthread_cond_broadcast(&pool_cv_job);
    pthread_mutex_unlock(&pool_mu);
    pool_drain();
    pthread_mutex_lock(&pool_mu);
    while (pool_busy > 0) pthread_cond_wait(&pool_cv_done, &pool_mu);
    pthread_mutex_unlock(&pool_mu);
    pthread_mutex_unlock(&pool_lock);
}
