/* tulip serve, process level: open the HTTP socket first (every route but /version answers 503
 * while the model loads), load the engine and tokenizer on a loader thread, compare the
 * checkpoint's chat template with tulip's, start the engine thread, then mark the server ready.
 * Wait for SIGINT/SIGTERM (printing a stats line every --log-stats-interval seconds while busy),
 * then drain: /health answers 503 {"status":"draining"} at once and every new request 503 (the
 * socket stays open, so a balancer's health check sees the drain rather than a refused
 * connection), running streams finish for up to --drain-timeout seconds, the rest are cancelled,
 * everything is closed, exit 0. A signal during the load exits at once (nothing to drain). A
 * device error that made the engine unusable ends the process with status 1 so a supervisor
 * restarts it.
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
#include "server/reqlog.h"
#include "server/constrain.h"
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

/* ====== The chat template check (docs/architecture.md §6.7). ======
 *
 * tulip renders Qwen3.6's chat template in C (src/tokenizer/chat.c); a checkpoint carrying another
 * template would be rendered wrongly. The checkpoint's template (chat_template.jinja, else
 * tokenizer_config.json's "chat_template": a string, or the entry named "default" of a list) is
 * normalised (CRLF -> LF, trailing blanks and newlines at the end removed) and its 64-bit FNV-1a
 * hash compared with the templates known to render as chat.c does. */

static const uint64_t known_templates[] = {
    0x8ae3a8bc6e68f114ull, /* Qwen3.6-35B-A3B's chat_template.jinja (7764 bytes) */
};

static uint64_t template_hash(const char *t, size_t n) {
    while (n && (t[n - 1] == '\n' || t[n - 1] == ' ' || t[n - 1] == '\t' || t[n - 1] == '\r')) n--;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '\r' && i + 1 < n && t[i + 1] == '\n') continue; /* CRLF -> LF */
        h = (h ^ (unsigned char)t[i]) * 0x100000001b3ull;
    }
    return h;
}

/* The checkpoint's template text (malloc'd) and where it came from, or NULL when it has none.
 * A tokenizer_config.json that is not JSON, or a template of the wrong type, is reported. */
static char *checkpoint_template(const char *dir, char *src, size_t srclen, size_t *len) {
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (tl_read_file(path, &text, len, NULL, 0) == 0) {
        snprintf(src, srclen, "%s", path);
        return text;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (tl_read_file(path, &text, len, NULL, 0)) return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, *len, 0, &je), *t = json_object_get(root, "chat_template");
    free(text);
    text = NULL;
    if (json_is_array(t)) { /* [{"name": "default", "template": "..."}, ...] */
        size_t i;
        json_t *e, *found = NULL;
        json_array_foreach(t, i, e) {
            if (json_is_string(json_object_get(e, "name")) &&
                !strcmp(json_string_value(json_object_get(e, "name")), "default"))
                found = json_object_get(e, "template");
        }
        t = found;
    }
    if (json_is_string(t)) {
        *len = json_string_length(t);
        text = xmalloc(*len + 1);
        memcpy(text, json_string_value(t), *len + 1);
        snprintf(src, srclen, "%s (chat_template)", path);
    } else if (!root || t || json_object_get(root, "chat_template")) {
        /* unreadable JSON or a template of another shape: say so rather than ignore it */
        text = xmalloc(1);
        *text = '\0';
        *len = 0;
        snprintf(src, srclen, "%s (%s)", path,
                 root ? "chat_template is neither a string nor a list with a \"default\" entry"
                      : "not valid JSON");
    }
    json_decref(root);
    return text;
}

/* Sets s->template_check and reports a difference on stderr. Returns 0, or 1 when
 * --strict-template refuses the difference (err says why). */
static int check_template(tl_server *s, char *err, size_t errlen) {
    if (!s->p.model_path) return 0;
    char src[4300];
    size_t n = 0;
    char *t = checkpoint_template(s->p.model_path, src, sizeof src, &n);
    if (!t) {
        atomic_store(&s->template_check, TL_TEMPLATE_ABSENT);
        return 0;
    }
    uint64_t h = template_hash(t, n);
    free(t);
    for (size_t i = 0; i < sizeof known_templates / sizeof known_templates[0]; i++)
        if (h == known_templates[i]) {
            atomic_store(&s->template_check, TL_TEMPLATE_MATCH);
            return 0;
        }
    atomic_store(&s->template_check, TL_TEMPLATE_DIFFERS);
    snprintf(
        err, errlen,
        "the checkpoint's chat template (%.600s, hash %016llx) differs from the Qwen3.6 template "
        "tulip renders (src/tokenizer/chat.c); prompts are rendered with tulip's, which may "
        "not be what this checkpoint expects",
        src, (unsigned long long)h);
    if (s->p.strict_template) return 1;
    fprintf(stderr, "tulip serve: WARNING: %s (--strict-template refuses to start)\n", err);
    return 0;
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
        .state_bf16 = s->p.state_bf16,
        .device = s->p.device,
        .prefix_cache_bytes =
            s->p.no_prefix_cache ? -1 : (long long)(s->p.prefix_cache_gb * 1073741824.0),
        .spec_tokens = s->p.spec_tokens};
    int st = tl_engine_open(&s->eng, &ep, err, errlen);
    if (st) return st;
    if (tl_engine_backend(s->eng) == TL_BACKEND_CUDA && !s->p.no_warmup)
        st = tl_engine_warm_up(s->eng, err, errlen);
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
    int32_t eos[4];
    int n_eos = c->n_eos < 4 ? c->n_eos : 4;
    for (int i = 0; i < n_eos; i++) eos[i] = c->eos_ids[i];
    return tl_con_ctx_init(&s->con, s->tok, c->n_vocab, eos, n_eos, s->think_end_id, err, errlen);
}

/* --served-model-name "a,b": the names (trimmed, empty ones skipped); else the model
 * directory's base name, or the production model's name for random weights. */
static void set_names(tl_server *s) {
    if (s->p.model_name) {
        snprintf(s->names_buf, sizeof s->names_buf, "%s", s->p.model_name);
        for (char *tok = strtok(s->names_buf, ","); tok; tok = strtok(NULL, ",")) {
            while (*tok == ' ') tok++;
            size_t n = strlen(tok);
            while (n && tok[n - 1] == ' ') tok[--n] = '\0';
            if (n && s->n_model_names < TL_SERVER_MAX_NAMES)
                s->model_names[s->n_model_names++] = tok;
        }
    }
    if (!s->n_model_names && s->p.model_path) {
        snprintf(s->names_buf, sizeof s->names_buf, "%s", s->p.model_path);
        size_t n = strlen(s->names_buf);
        while (n > 1 && s->names_buf[n - 1] == '/') s->names_buf[--n] = 0;
        s->model_names[s->n_model_names++] = basename(s->names_buf);
    } else if (!s->n_model_names) {
        s->model_names[s->n_model_names++] = "qwen3.6-35b-a3b";
    }
    snprintf(s->model_name, sizeof s->model_name, "%s", s->model_names[0]);
}

int tl_server_model_known(const tl_server *s, const char *name) {
    for (int i = 0; i < s->n_model_names; i++)
        if (!strcmp(name, s->model_names[i])) return 1;
    return s->p.model_path && !strcmp(name, s->p.model_path);
}

/* The loader thread: everything that needs the model. load_rc: 1 ready, -1 failed (load_err). */
static atomic_int load_rc;
static char load_err[1024];

static void *loader(void *arg) {
    tl_server *s = arg;
    const char *d = getenv("TL_TEST_LOAD_DELAY_MS"); /* tests: a load slow enough to observe */
    for (long ms = d ? atol(d) : 0; ms > 0 && !atomic_load(&s->draining); ms -= 10) usleep(10000);
    char *err = load_err;
    size_t errlen = sizeof load_err;
    int rc = open_all(s, err, errlen) || check_template(s, err, errlen);
    if (!rc) {
        load_defaults(s);
        s->oai = (tl_oai_opts){.model_name = s->model_name,
                               .model_path = s->p.model_path,
                               .aliases = s->model_names + 1,
                               .n_aliases = s->n_model_names - 1,
                               .test_mode = s->p.test_mode,
                               .defaults = &s->defaults};
        if (s->p.default_ctk &&
            !(s->oai.default_ctk = tl_oai_default_ctk(s->p.default_ctk, err, errlen)))
            rc = 1;
    }
    if (!rc) {
        tl_metrics_set_model(s->metrics, s->model_name, s->max_ctx);
        tl_sched_params sp = {.max_queue = s->p.max_queue,
                              .step_tokens = s->p.step_tokens,
                              .gather_us = s->p.gather_us,
                              .snap_every = s->p.snap_every};
        rc = tl_sched_create(&s->sched, s->eng, &sp, s->metrics, err, errlen) != 0;
    }
    atomic_store(&load_rc, rc ? -1 : 1);
    return NULL;
}

/* The periodic stats line: every interval while anything ran or waited since the last one. */
typedef struct stats_state {
    double t_last;
    unsigned long long prompt, gen, req;
} stats_state;

static void stats_tick(tl_server *s, stats_state *st) {
    double now = tl_time_s(), iv = s->p.stats_interval_s ? s->p.stats_interval_s : 10;
    if (iv < 0 || now - st->t_last < iv) return;
    unsigned long long p, g, r;
    tl_metrics_totals(s->metrics, &p, &g, &r);
    int queued, running, sessions;
    long kv_tokens;
    tl_sched_stats(s->sched, &queued, &running, &sessions, &kv_tokens);
    tl_kv_stats kv;
    tl_sched_kv_stats(s->sched, &kv);
    if (p != st->prompt || g != st->gen || r != st->req || running || queued)
        tl_reqlog_stats_line(
            s, now - st->t_last, p - st->prompt, g - st->gen, r - st->req, running, queued,
            kv.pages_total ? (double)(kv.pages_total - kv.pages_free) / (double)kv.pages_total
                           : 0.0);
    *st = (stats_state){now, p, g, r};
}

/* The model is loaded: say so and open the routes. */
static void announce(tl_server *s) {
    const tl_config *c = tl_engine_config(s->eng);
    printf("tulip serve: model %s (%s, %d layers, vocab %d), backend %s, %d sequences x %d "
           "tokens%s\n",
           s->model_name, s->p.model_path ? s->p.model_path : "random weights", c->n_layer,
           c->n_vocab, backend_name(tl_engine_backend(s->eng)), tl_engine_max_seqs(s->eng),
           s->max_ctx, s->p.test_mode ? ", TEST MODE (tulip_test_script honoured)" : "");
    atomic_store(&s->ready, 1);
    printf("tulip serve: listening on http://%s:%d%s\n", s->p.host, tl_http_port(s),
           s->p.api_key ? " (API key required)" : "");
    fflush(stdout);
}

/* The parameters' defaults (tl_server_params: 0 means the default). */
static void server_defaults(tl_server *s) {
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (!s->p.max_queue) s->p.max_queue = 64;
    if (s->p.max_queue < 0) s->p.max_queue = 0;
    if (!s->p.step_tokens) s->p.step_tokens = 2048;
    if (!s->p.max_body) s->p.max_body = 8u << 20;
    if (!s->p.max_conns) s->p.max_conns = 512;
    if (s->p.drain_s <= 0) s->p.drain_s = 10;
    if (s->p.idle_timeout_s <= 0) s->p.idle_timeout_s = 300;
    if (s->p.keepalive_s <= 0) s->p.keepalive_s = 5;
}

/* Waits for a signal (its number in *sig), for the engine to be lost (*sig 0), or first for the
 * load to end (then announces the server). A signal during the load exits the process at once
 * (nothing runs yet; the load cannot be interrupted). Returns -1 if the load failed, else 0. */
static int server_wait(tl_server *s, const sigset_t *set, pthread_t lt, int *sig) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    stats_state stats = {tl_time_s(), 0, 0, 0};
    int loading = 1;
    for (;;) {
        *sig = sigtimedwait(set, NULL, &ts);
        if (*sig > 0) break;
        if (loading && atomic_load(&load_rc)) {
            pthread_join(lt, NULL);
            loading = 0;
            if (atomic_load(&load_rc) < 0) {
                fprintf(stderr, "tulip serve: %s\n", load_err);
                return -1;
            }
            announce(s);
            stats.t_last = tl_time_s();
        }
        if (loading) continue;
        if (tl_sched_lost(s->sched)) break;
        stats_tick(s, &stats);
    }
    if (loading) {
        atomic_store(&s->draining, 1);
        tl_http_stop(s);
        fprintf(stderr, "tulip serve: %s while loading: exiting\n",
                *sig == SIGINT ? "SIGINT" : "SIGTERM");
        fflush(NULL);
        _exit(0);
    }
    return 0;
}

/* After a signal: drain (503 to new requests, running ones finish within drain_s), then stop.
 * After a lost engine: stop at once. Returns the exit status (0, or 1 when the engine was lost). */
static int server_drain(tl_server *s, int sig) {
    int lost = tl_sched_lost(s->sched);
    if (sig > 0)
        fprintf(stderr, "tulip serve: %s: draining (up to %.0f s for running requests)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", s->p.drain_s);
    else
        fprintf(stderr, "tulip serve: the engine failed; exiting so a supervisor can restart\n");
    atomic_store(&s->draining, 1);
    if (lost) tl_http_quiesce(s); /* draining keeps answering 503 (docs/architecture.md §6.4) */
    tl_sched_shutdown(s->sched, lost ? 0 : s->p.drain_s);
    /* Every job has ended; give the connection threads a moment to put the last bytes (final
     * chunk, error frame, [DONE]) on the wire before the daemon closes the sockets. */
    for (int i = 0; i < 250 && atomic_load(&s->n_active) > 0; i++) usleep(20000);
    tl_http_stop(s);
    fprintf(stderr, "tulip serve: stopped\n");
    return lost ? 1 : 0;
}

int tl_server_run(const tl_server_params *p) {
    tl_server *s = xcalloc(1, sizeof *s);
    s->p = *p;
    server_defaults(s);
    s->created = (long)time(NULL);
    set_names(s);

    /* Block the shutdown signals before any thread exists, so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    json_object_seed(0);

    char err[1024] = "";
    int rc = 1, sig = 0;
    pthread_t lt;
    s->t0 = tl_time_s();
    pthread_mutex_init(&s->trace_mu, NULL);
    if (s->p.trace_path && !(s->trace = fopen(s->p.trace_path, "a"))) {
        fprintf(stderr, "tulip serve: --trace %s: %s\n", s->p.trace_path, strerror(errno));
        goto out;
    }
    s->metrics = tl_metrics_new();
    tl_metrics_set_model(s->metrics, s->model_name, 1);
    if (tl_http_start(s, err, sizeof err)) {
        fprintf(stderr, "tulip serve: %s\n", err);
        goto out;
    }
    printf("tulip serve: loading the model; http://%s:%d answers 503 until it is ready\n",
           s->p.host, tl_http_port(s));
    fflush(stdout);
    atomic_store(&load_rc, 0);
    if (pthread_create(&lt, NULL, loader, s)) {
        fprintf(stderr, "tulip serve: cannot start the loader thread\n");
        goto out;
    }
    if (server_wait(s, &set, lt, &sig) == 0) rc = server_drain(s, sig);

out:
    tl_http_stop(s);
    tl_sched_free(s->sched);
    tl_metrics_free(s->metrics);
    if (s->trace) fclose(s->trace);
    tl_con_ctx_free(&s->con);
    if (s->tok) tl_tokenizer_free(s->tok);
    if (s->eng) tl_engine_close(s->eng);
    json_decref(s->oai.default_ctk);
    free(s);
    return rc;
}
