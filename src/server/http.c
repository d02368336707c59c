/* libmicrohttpd glue: thread-per-connection daemon, routing, bounded request bodies, the API-key
 * check, and SSE streams through a content-reader callback that blocks in the connection's own
 * thread (api.c's reader polls the client socket while it waits for tokens).
 *
 * Never parses JSON or touches the engine: endpoints live in api.c. Per connection it keeps one
 * tl_conn (body buffer, route) from the first handler call to the completion callback. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "server/anthropic.h"
#include "server/metrics.h"
#include "server/responses.h"
#include "server/server.h"

typedef enum route {
    R_NONE = 0,
    R_CHAT,
    R_COMPLETIONS,
    R_MODELS,
    R_HEALTH,
    R_METRICS,
    R_MODEL, /* /v1/models/{id} */
    R_MESSAGES,
    R_COUNT_TOKENS,
    R_RESPONSES,
} route;

static const char *route_label[] = {"other",        "chat",     "completions", "models",
                                    "health",       "metrics",  "models",      "messages",
                                    "count_tokens", "responses"};

typedef struct tl_conn {
    route r;
    tl_buf body;
    int too_big;
    int responded;
    int active; /* counted in s->n_active until the request completes */
} tl_conn;

/* ====== Replies. ====== */

static enum MHD_Result queue_reply(struct MHD_Connection *c, tl_server *s, route r, tl_reply *rep);

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    long n = tl_stream_read(cls, buf, max);
    if (n == -1) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return (ssize_t)n;
}

static void stream_free_cb(void *cls) { tl_stream_free(cls); }

/* A reader's result as libmicrohttpd wants it (-1: the end, other negatives: an error). */
static ssize_t mhd_read_result(long n) {
    if (n == -1) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return (ssize_t)n;
}
static ssize_t ant_stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    return mhd_read_result(tl_ant_stream_read(cls, buf, max));
}
static ssize_t ops_stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    return mhd_read_result((*(const tl_stream_ops *const *)cls)->read(cls, buf, max));
}

static void ant_stream_free_cb(void *cls) { tl_ant_stream_free(cls); }
static void ops_stream_free_cb(void *cls) { (*(const tl_stream_ops *const *)cls)->free(cls); }

static enum MHD_Result queue_reply(struct MHD_Connection *c, tl_server *s, route r, tl_reply *rep) {
    struct MHD_Response *resp = NULL;
    if (rep->ant_stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, ant_stream_cb,
                                                 rep->ant_stream, ant_stream_free_cb);
        if (!resp) {
            tl_ant_stream_free(rep->ant_stream);
            return MHD_NO;
        }
    } else if (rep->stream || rep->ops_stream) {
        resp = rep->stream
                   ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_cb,
                                                       rep->stream, stream_free_cb)
                   : MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, ops_stream_cb,
                                                       rep->ops_stream, ops_stream_free_cb);
        if (!resp) {
            if (rep->stream)
                tl_stream_free(rep->stream);
            else
                ops_stream_free_cb(rep->ops_stream);
            return MHD_NO;
        }
    }
    if (rep->stream || rep->ant_stream || rep->ops_stream) {
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(rep->body_len, rep->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(rep->body);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type",
                                rep->content_type ? rep->content_type : "application/json");
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)rep->status, resp);
    MHD_destroy_response(resp);
    tl_metrics_request(s->metrics, route_label[r], rep->status);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, tl_server *s, route r, int st,
                                   int http, const char *type, const char *code, const char *fmt,
                                   ...) __attribute__((format(printf, 8, 9)));
static enum MHD_Result reply_error(struct MHD_Connection *c, tl_server *s, route r, int st,
                                   int http, const char *type, const char *code, const char *fmt,
                                   ...) {
    tl_oai_error e = {.status = st, .http = http, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    tl_reply rep;
    if (r == R_MESSAGES || r == R_COUNT_TOKENS)
        tl_ant_error_reply(&rep, &e);
    else
        tl_api_error(&rep, &e);
    return queue_reply(c, s, r, &rep);
}

/* ====== Routing and auth. ====== */

static route find_route(const char *url, const char *method, int *bad_method) {
    static const struct {
        const char *path, *method;
        route r;
    } tab[] = {
        {"/v1/chat/completions", "POST", R_CHAT},
        {"/v1/completions", "POST", R_COMPLETIONS},
        {"/v1/models", "GET", R_MODELS},
        {"/health", "GET", R_HEALTH},
        {"/metrics", "GET", R_METRICS},
        {"/v1/messages", "POST", R_MESSAGES},
        {"/v1/messages/count_tokens", "POST", R_COUNT_TOKENS},
        {"/v1/responses", "POST", R_RESPONSES},
    };
    *bad_method = 0;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        if (!strcmp(method, "GET")) return R_MODEL;
        *bad_method = 1;
        return R_NONE;
    }
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (strcmp(url, tab[i].path)) continue;
        if (!strcmp(method, tab[i].method)) return tab[i].r;
        *bad_method = 1;
        return R_NONE;
    }
    return R_NONE;
}

/* Constant-time comparison of the bearer token (or an x-api-key header, as Anthropic's clients
 * send it) with the key. */
static int auth_ok(const tl_server *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
    } else if (x) {
        h = x;
    } else {
        return 0;
    }
    size_t n = strlen(h), m = strlen(s->p.api_key);
    unsigned char diff = n != m;
    for (size_t i = 0; i < n && i < m; i++) diff |= (unsigned char)(h[i] ^ s->p.api_key[i]);
    return diff == 0;
}

/* ====== The access handler. ====== */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls) {
    tl_server *s = cls;
    tl_conn *cn = *con_cls;
    if (!cn) {
        /* First call: headers only. Reject what we can before reading a body. */
        cn = xcalloc(1, sizeof *cn);
        *con_cls = cn;
        int bad_method = 0;
        cn->r = find_route(url, method, &bad_method);
        if (cn->r == R_NONE) {
            cn->responded = 1;
            if (bad_method)
                return reply_error(c, s, R_NONE, TL_ERR_INVALID, 405, "invalid_request_error", NULL,
                                   "method %s is not allowed on %s", method, url);
            return reply_error(c, s, R_NONE, TL_ERR_INVALID, 404, "invalid_request_error", NULL,
                               "no such endpoint: %s %s", method, url);
        }
        if (cn->r != R_HEALTH && cn->r != R_METRICS && !auth_ok(s, c)) {
            cn->responded = 1;
            return reply_error(c, s, cn->r, TL_ERR_INVALID, 401, "invalid_request_error",
                               "invalid_api_key",
                               "missing or invalid API key (send 'Authorization: Bearer KEY')");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) {
            cn->responded = 1;
            return reply_error(c, s, cn->r, TL_ERR_INVALID, 413, "invalid_request_error", NULL,
                               "request body of %s bytes is over the limit of %zu bytes", cl,
                               s->p.max_body);
        }
        return MHD_YES;
    }
    if (*data_size) {
        /* Body bytes (Content-Length or chunked). Over the limit: keep reading, drop them. */
        if (!cn->too_big && !cn->responded) {
            if (cn->body.n + *data_size > s->p.max_body)
                cn->too_big = 1;
            else /* out of memory: the buffer's sticky error, answered below */
                tl_buf_append(&cn->body, data, *data_size);
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (cn->responded) return MHD_YES;
    cn->responded = 1;
    if (cn->too_big)
        return reply_error(c, s, cn->r, TL_ERR_INVALID, 413, "invalid_request_error", NULL,
                           "request body is over the limit of %zu bytes", s->p.max_body);
    if (cn->body.err)
        return reply_error(c, s, cn->r, TL_ERR_NOMEM, 500, "server_error", NULL,
                           "out of memory reading the request body");
    if (atomic_load(&s->draining) && cn->r != R_METRICS && cn->r != R_HEALTH)
        return reply_error(c, s, cn->r, TL_ERR_CANCELLED, 503, "server_error", NULL,
                           "the server is shutting down");

    tl_reply rep = {0};
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    switch (cn->r) {
    case R_CHAT:
    case R_COMPLETIONS:
    case R_RESPONSES: {
        const char *body = cn->body.p ? cn->body.p : "";
        cn->active = 1;
        atomic_fetch_add(&s->n_active, 1);
        int gone = cn->r == R_CHAT        ? tl_api_chat(s, body, cn->body.n, fd, &rep)
                   : cn->r == R_RESPONSES ? tl_api_responses(s, body, cn->body.n, fd, &rep)
                                          : tl_api_completions(s, body, cn->body.n, fd, &rep);
        if (gone) {
            tl_metrics_request(s->metrics, route_label[cn->r], 499); /* nginx: client closed */
            return MHD_NO;
        }
        break;
    }
    case R_MESSAGES: {
        cn->active = 1;
        atomic_fetch_add(&s->n_active, 1);
        if (tl_ant_messages(s, cn->body.p ? cn->body.p : "", cn->body.n, fd, &rep)) {
            tl_metrics_request(s->metrics, route_label[cn->r], 499);
            return MHD_NO;
        }
        break;
    }
    case R_COUNT_TOKENS:
        tl_ant_count_tokens(s, cn->body.p ? cn->body.p : "", cn->body.n, &rep);
        break;
    case R_MODELS:
        tl_api_models(s, NULL, &rep);
        break;
    case R_MODEL:
        tl_api_models(s, url + 11, &rep);
        break;
    case R_HEALTH:
        tl_api_health(s, &rep);
        break;
    case R_METRICS:
        tl_api_metrics(s, &rep);
        break;
    default:
        return MHD_NO;
    }
    return queue_reply(c, s, cn->r, &rep);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    tl_server *s = cls;
    tl_conn *cn = *con_cls;
    if (!cn) return;
    if (cn->active) atomic_fetch_sub(&s->n_active, 1);
    tl_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

/* ====== Daemon. ====== */

int tl_http_start(tl_server *s, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->p.port);
    int rc = getaddrinfo(s->p.host, port, &hints, &ai);
    if (rc)
        return tl_errf(err, errlen, TL_ERR_INVALID, "--host %s: %s (give a numeric address)",
                       s->p.host, gai_strerror(rc));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)s->p.max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)s->p.idle_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return tl_errf(err, errlen, TL_ERR_IO,
                       "cannot listen on %s:%d (port in use? try --port 0 for any free port)",
                       s->p.host, s->p.port);
    return 0;
}

int tl_http_port(tl_server *s) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : s->p.port;
}

void tl_http_quiesce(tl_server *s) {
    if (!s->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void tl_http_stop(tl_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
