/* tulip serve, process level: load the engine and tokenizer, start the engine thread and the
 * HTTP daemon, wait for SIGINT/SIGTERM, then drain: stop accepting, let running streams finish
 * for --drain-timeout seconds, cancel the rest, close everything, exit 0. A device error that
 * made the engine unusable ends the process with status 1 so a supervisor restarts it.
 *
 * Signals are blocked in every thread (the mask is set before any thread starts) and taken
 * synchronously here with sigtimedwait; SIGPIPE is ignored (a client that hangs up is seen as
 * a failed write). */
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "model/config.h"
#include "server/metrics.h"
#include "server/sched.h"
#include "server/server.h"
#include "tokenizer/bpe.h"

static const char *backend_name(tl_backend_kind b) {
    return b == TL_BACKEND_CUDA ? "cuda" : b == TL_BACKEND_CPU ? "cpu" : "auto";
}

/* generation_config.json next to the model, if any, sets the sampling defaults. */
static void load_defaults(tl_server *s) {
    tl_oai_defaults_init(&s->defaults);
    if (!s->p.model_path) return;
    char path[4096], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/generation_config.json", s->p.model_path);
    if (tl_read_file(path, &text, &len, NULL, 0) == 0) {
        if (tl_oai_defaults_from_genconfig(&s->defaults, text))
            fprintf(stderr, "tulip: %s is not valid JSON; using the model card defaults\n", path);
        free(text);
    }
}

static int open_all(tl_server *s, char *err, size_t errlen) {
    tl_engine_params ep = {
        .model_path = s->p.model_path,
        .backend = s->p.backend,
        .allow_test_shape = s->p.allow_test_shape,
        .n_threads = s->p.n_threads,
        .max_seqs = s->p.max_seqs,
        .max_ctx = s->p.max_ctx,
        .kv_tokens = s->p.kv_tokens,
        .gpu_memory_utilization = s->p.gpu_memory_utilization,
        .random_weights = s->p.random_weights,
        .seed = s->p.seed,
        .weight_bits = s->p.weight_bits,
        .prefix_cache_bytes =
            s->p.no_prefix_cache ? -1 : (long long)(s->p.prefix_cache_gb * 1073741824.0)};
    int st = tl_engine_open(&s->eng, &ep, err, errlen);
    if (st) return st;
    const char *tp = s->p.tokenizer_path ? s->p.tokenizer_path : s->p.model_path;
    if (!tp)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "no tokenizer: give --tokenizer PATH (tokenizer.json)");
    st = tl_tokenizer_load(tp, &s->tok, err, errlen);
    if (st) return st;
    const tl_config *c = tl_engine_config(s->eng);
    s->n_vocab = c->n_vocab;
    if (tl_tokenizer_n_vocab(s->tok) > c->n_vocab)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "the tokenizer has %d ids but the model only %d rows: wrong --tokenizer?",
                       tl_tokenizer_n_vocab(s->tok), c->n_vocab);
    s->max_ctx = tl_engine_max_ctx(s->eng);
    int te = tl_token_id(s->tok, "</think>");
    s->think_end_id = te >= 0 ? te : -1;
    s->prefix_cache = tl_engine_prefix_enabled(s->eng);
    return 0;
}

int tl_server_run(const tl_server_params *p) {
    tl_server *s = xcalloc(1, sizeof *s);
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (!s->p.max_queue) s->p.max_queue = 64;
    if (s->p.max_queue < 0) s->p.max_queue = 0;
    if (!s->p.step_tokens) s->p.step_tokens = 2048;
    if (!s->p.max_body) s->p.max_body = 8u << 20;
    if (!s->p.max_conns) s->p.max_conns = 512;
    if (s->p.drain_s <= 0) s->p.drain_s = 10;
    if (s->p.idle_timeout_s <= 0) s->p.idle_timeout_s = 300;
    if (s->p.keepalive_s <= 0) s->p.keepalive_s = 5;
    s->created = (long)time(NULL);
    if (s->p.model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", s->p.model_name);
    } else if (s->p.model_path) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", s->p.model_path);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
        snprintf(s->model_name, sizeof s->model_name, "%s", basename(tmp));
    } else {
        snprintf(s->model_name, sizeof s->model_name, "qwen3.6-35b-a3b");
    }

    /* Block the shutdown signals before any thread exists, so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    json_object_seed(0);

    char err[1024] = "";
    int rc = 1;
    if (open_all(s, err, sizeof err)) {
        fprintf(stderr, "tulip serve: %s\n", err);
        goto out;
    }
    load_defaults(s);
    s->t0 = tl_time_s();
    pthread_mutex_init(&s->trace_mu, NULL);
    if (s->p.trace_path && !(s->trace = fopen(s->p.trace_path, "a"))) {
        fprintf(stderr, "tulip serve: --trace %s: %s\n", s->p.trace_path, strerror(errno));
        goto out;
    }
    s->oai = (tl_oai_opts){.model_name = s->model_name,
                           .model_path = s->p.model_path,
                           .test_mode = s->p.test_mode,
                           .defaults = &s->defaults};
    s->metrics = tl_metrics_new();
    tl_sched_params sp = {.max_queue = s->p.max_queue, .step_tokens = s->p.step_tokens};
    if (tl_sched_create(&s->sched, s->eng, &sp, s->metrics, err, sizeof err)) {
        fprintf(stderr, "tulip serve: %s\n", err);
        goto out;
    }
    if (tl_http_start(s, err, sizeof err)) {
        fprintf(stderr, "tulip serve: %s\n", err);
        goto out;
    }
    const tl_config *c = tl_engine_config(s->eng);
    printf("tulip serve: model %s (%s, %d layers, vocab %d), backend %s, %d sequences x %d "
           "tokens%s\n",
           s->model_name, s->p.model_path ? s->p.model_path : "random weights", c->n_layer,
           c->n_vocab, backend_name(tl_engine_backend(s->eng)), tl_engine_max_seqs(s->eng),
           s->max_ctx, s->p.test_mode ? ", TEST MODE (tulip_test_script honoured)" : "");
    printf("tulip serve: listening on http://%s:%d%s\n", s->p.host, tl_http_port(s),
           s->p.api_key ? " (API key required)" : "");
    fflush(stdout);

    /* Wait for a signal, or for the engine to be lost. */
    int sig = 0;
    struct timespec ts = {0, 200 * 1000 * 1000};
    for (;;) {
        sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0) break;
        if (tl_sched_lost(s->sched)) break;
    }
    int lost = tl_sched_lost(s->sched);
    if (sig > 0)
        fprintf(stderr, "tulip serve: %s: draining (up to %.0f s for running requests)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", s->p.drain_s);
    else
        fprintf(stderr, "tulip serve: the engine failed; exiting so a supervisor can restart\n");
    atomic_store(&s->draining, 1);
    tl_http_quiesce(s);
    tl_sched_shutdown(s->sched, lost ? 0 : s->p.drain_s);
    /* Every job has ended; give the connection threads a moment to put the last bytes (final
     * chunk, error frame, [DONE]) on the wire before the daemon closes the sockets. */
    for (int i = 0; i < 250 && atomic_load(&s->n_active) > 0; i++) usleep(20000);
    tl_http_stop(s);
    rc = lost ? 1 : 0;
    fprintf(stderr, "tulip serve: stopped\n");

out:
    tl_http_stop(s);
    tl_sched_free(s->sched);
    tl_metrics_free(s->metrics);
    if (s->trace) fclose(s->trace);
    if (s->tok) tl_tokenizer_free(s->tok);
    if (s->eng) tl_engine_close(s->eng);
    free(s);
    return rc;
}
