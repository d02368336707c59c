/* libmicrohttpd glue: thread-per-connection daemon, routing, bounded request bodies, the API-key
 * check, and SSE streams through a content-reader callback that blocks in the connection's own
 * thread (api.c's reader polls the client socket while it waits for tokens).
 *
 * Checks what HTTP itself decides before a body byte is read: unambiguous body framing (no
 * request smuggling through conflicting Content-Length headers), the method (405 with Allow),
 * the API key, Content-Type: application/json on POST (415), the body limit (413), and CORS
 * (off unless --allowed-origins: preflights, Access-Control-Allow-Origin), and X-Request-Id (a
 * valid one names the request, else 400; absent: one is generated; always echoed). Until the
 * model is loaded every route but /version answers 503 (/health: {"status": "loading"}).
 *
 * Never parses JSON or touches the engine: endpoints live in api.c and extra.c. Per connection it
 * keeps one tl_conn (body buffer, route) from the first handler call to the completion callback. */
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
#include "server/reqlog.h"
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
    R_TOKENIZE,
    R_DETOKENIZE,
    R_VERSION,
    R_PING,
    R_MESSAGES,
    R_COUNT_TOKENS,
    R_RESPONSES,
} route;

static const char *route_label[] = {"other",   "chat",     "completions",  "models",     "health",
                                    "metrics", "models",   "tokenize",     "detokenize", "version",
                                    "ping",    "messages", "count_tokens", "responses"};

/* Methods a route answers (a bit mask) and the Allow header for each mask that occurs. */
enum { M_GET = 1, M_POST = 2, M_HEAD = 4 };

typedef struct tl_conn {
    route r;
    unsigned methods; /* what the route answers (M_*), for 405's Allow */
    tl_buf body;
    int too_big;
    int responded;
    int close;    /* add "Connection: close" (a request whose framing is not trusted) */
    int active;   /* counted in s->n_active until the request completes */
    tl_reqlog rl; /* the request's id, job and log line (reqlog.c) */
} tl_conn;

/* The Allow header for a method mask (OPTIONS too when CORS is on). */
static void allow_str(const tl_server *s, unsigned m, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", m & M_GET ? "GET, " : "", m & M_HEAD ? "HEAD, " : "",
             m & M_POST ? "POST, " : "", s->p.allowed_origins ? "OPTIONS, " : "");
    size_t l = strlen(buf);
    if (l >= 2) buf[l - 2] = '\0'; /* the last ", " */
}

/* ====== CORS (--allowed-origins; off by default). ====== */

/* 1 if origin is in the comma-separated list (or the list is "*"). */
static int origin_allowed(const char *list, const char *origin) {
    if (!list || !origin || !*origin) return 0;
    if (!strcmp(list, "*")) return 1;
    size_t on = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ",");
        size_t m = n;
        while (m && p[m - 1] == ' ') m--;
        if (m && m == on && !strncasecmp(p, origin, m)) return 1;
        p += n;
    }
    return 0;
}

/* Access-Control-Allow-Origin on a response to an allowed origin; nothing otherwise. */
static void cors_headers(struct MHD_Response *resp, tl_server *s, struct MHD_Connection *c) {
    if (!s->p.allowed_origins) return;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    int any = !strcmp(s->p.allowed_origins, "*");
    if (origin && !any) MHD_add_response_header(resp, "Vary", "Origin"); /* for caches */
    if (!origin_allowed(s->p.allowed_origins, origin)) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", any ? "*" : origin);
}

/* ====== Replies. ====== */

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

/* The response of a streaming reply (an SSE stream of api.c, anthropic.c or another endpoint
 * file); NULL when it cannot be made (the stream is freed). */
static struct MHD_Response *stream_response(tl_reply *rep) {
    struct MHD_Response *resp;
    if (rep->ant_stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, ant_stream_cb,
                                                 rep->ant_stream, ant_stream_free_cb);
        if (!resp) tl_ant_stream_free(rep->ant_stream);
    } else if (rep->ops_stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, ops_stream_cb,
                                                 rep->ops_stream, ops_stream_free_cb);
        if (!resp) ops_stream_free_cb(rep->ops_stream);
    } else {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_cb, rep->stream,
                                                 stream_free_cb);
        if (!resp) tl_stream_free(rep->stream);
    }
    return resp;
}

static enum MHD_Result queue_reply(struct MHD_Connection *c, tl_server *s, tl_conn *cn,
                                   tl_reply *rep) {
    struct MHD_Response *resp;
    if (rep->stream || rep->ant_stream || rep->ops_stream) {
        if (!(resp = stream_response(rep))) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(rep->body_len, rep->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(rep->body);
            return MHD_NO;
        }
        if (rep->content_type) MHD_add_response_header(resp, "Content-Type", rep->content_type);
    }
    if (rep->status == 405) {
        char allow[64];
        allow_str(s, cn->methods, allow, sizeof allow);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    }
    /* 503 (loading, draining, device lost): when to try again; a balancer's client may go to
     * another replica at once (docs/deploy.md). */
    if (rep->status == 503)
        MHD_add_response_header(resp, "Retry-After", atomic_load(&s->ready) ? "1" : "5");
    if (cn->close) MHD_add_response_header(resp, "Connection", "close");
    if (cn->rl.id[0]) MHD_add_response_header(resp, "X-Request-Id", cn->rl.id);
    cn->rl.status = rep->status;
    cors_headers(resp, s, c);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)rep->status, resp);
    MHD_destroy_response(resp);
    tl_metrics_request(s->metrics, route_label[cn->r], rep->status);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, tl_server *s, tl_conn *cn, int st,
                                   int http, const char *type, const char *code, const char *fmt,
                                   ...) __attribute__((format(printf, 8, 9)));
static enum MHD_Result reply_error(struct MHD_Connection *c, tl_server *s, tl_conn *cn, int st,
                                   int http, const char *type, const char *code, const char *fmt,
                                   ...) {
    tl_oai_error e = {.status = st, .http = http, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    tl_reply rep;
    if (cn->r == R_MESSAGES || cn->r == R_COUNT_TOKENS)
        tl_ant_error_reply(&rep, &e); /* Anthropic's error shape on its routes */
    else
        tl_api_error(&rep, &e);
    cn->responded = 1;
    return queue_reply(c, s, cn, &rep);
}

/* ====== Routing and auth. ====== */

/* The route of a path and the methods it answers; R_NONE (methods 0) for an unknown path. */
static route find_route(const char *url, unsigned *methods) {
    static const struct {
        const char *path;
        unsigned methods;
        route r;
    } tab[] = {
        {"/v1/chat/completions", M_POST, R_CHAT},
        {"/v1/completions", M_POST, R_COMPLETIONS},
        {"/v1/models", M_GET, R_MODELS},
        {"/health", M_GET | M_HEAD, R_HEALTH},
        {"/metrics", M_GET, R_METRICS},
        {"/tokenize", M_POST, R_TOKENIZE},
        {"/detokenize", M_POST, R_DETOKENIZE},
        {"/version", M_GET, R_VERSION},
        {"/ping", M_GET | M_HEAD, R_PING},
        {"/v1/messages", M_POST, R_MESSAGES},
        {"/v1/messages/count_tokens", M_POST, R_COUNT_TOKENS},
        {"/v1/responses", M_POST, R_RESPONSES},
    };
    *methods = 0;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *methods = M_GET;
        return R_MODEL;
    }
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (strcmp(url, tab[i].path)) continue;
        *methods = tab[i].methods;
        return tab[i].r;
    }
    return R_NONE;
}

/* The routes that queue a generation (one log line each). */
static int is_generation(route r) {
    return r == R_CHAT || r == R_COMPLETIONS || r == R_RESPONSES || r == R_MESSAGES;
}

static unsigned method_bit(const char *m) {
    return !strcmp(m, "GET")    ? M_GET
           : !strcmp(m, "POST") ? M_POST
           : !strcmp(m, "HEAD") ? M_HEAD
                                : 0;
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

/* ====== Framing and content checks (before any body byte is read). ====== */

typedef struct hdr_scan {
    const char *cl; /* the first Content-Length */
    int cl_conflict, cl_bad, te;
} hdr_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    hdr_scan *h = cls;
    if (!key) return MHD_YES;
    if (!strcasecmp(key, "Content-Length")) {
        if (!value || !*value || value[strspn(value, "0123456789")]) h->cl_bad = 1;
        if (h->cl && value && strcmp(h->cl, value)) h->cl_conflict = 1;
        if (!h->cl) h->cl = value;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        h->te = 1;
    }
    return MHD_YES;
}

/* The body's framing is unambiguous: one Content-Length value (repeats must be equal), not
 * together with Transfer-Encoding. Otherwise libmicrohttpd would take the first length and read
 * the rest of the bytes as another request (request smuggling). Returns an error message or
 * NULL. */
static const char *framing_error(struct MHD_Connection *c) {
    hdr_scan h = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &h);
    if (h.cl_conflict) return "conflicting Content-Length headers";
    if (h.cl_bad) return "Content-Length is not a decimal number";
    if (h.cl && h.te) return "Content-Length together with Transfer-Encoding";
    return NULL;
}

/* "application/json", any case, optionally with parameters (charset). */
static int is_json_type(const char *ct) {
    static const char want[] = "application/json";
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, want, sizeof want - 1)) return 0;
    ct += sizeof want - 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == '\0' || *ct == ';';
}

/* An OPTIONS request: a CORS preflight from an allowed origin gets 204 with the
 * Access-Control-Allow-* headers; without --allowed-origins it is a 405, from any other origin
 * a 403. */
static enum MHD_Result preflight(struct MHD_Connection *c, tl_server *s, tl_conn *cn,
                                 const char *url) {
    if (!s->p.allowed_origins)
        return reply_error(c, s, cn, TL_ERR_INVALID, 405, "invalid_request_error", NULL,
                           "method OPTIONS is not allowed on %s (CORS is off: see "
                           "--allowed-origins)",
                           url);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin_allowed(s->p.allowed_origins, origin))
        return reply_error(c, s, cn, TL_ERR_INVALID, 403, "invalid_request_error", NULL,
                           "origin %s is not allowed", origin ? origin : "(none)");
    cn->responded = 1;
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    char allow[64];
    allow_str(s, cn->methods, allow, sizeof allow);
    const char *req_h =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            req_h && *req_h ? req_h : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    cors_headers(resp, s, c);
    enum MHD_Result ret = MHD_queue_response(c, 204, resp);
    MHD_destroy_response(resp);
    tl_metrics_request(s->metrics, route_label[cn->r], 204);
    return ret;
}

/* First call for a request: headers only. Rejects what it can before a body byte is read; a
 * response queued now makes libmicrohttpd skip the body and close the connection. */
static enum MHD_Result on_headers(struct MHD_Connection *c, tl_server *s, tl_conn *cn,
                                  const char *url, const char *method) {
    cn->r = find_route(url, &cn->methods);
    const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    int rid_ok = !rid || tl_reqlog_id_valid(rid);
    tl_reqlog_begin(&cn->rl, route_label[cn->r], is_generation(cn->r), rid_ok ? rid : NULL);
    if (!rid_ok)
        return reply_error(c, s, cn, TL_ERR_INVALID, 400, "invalid_request_error", NULL,
                           "the X-Request-Id header must be 1 to %d characters of A-Z a-z 0-9 "
                           "and . _ : -",
                           TL_REQ_ID_MAX);
    const char *ferr = framing_error(c);
    if (ferr) {
        cn->close = 1;
        return reply_error(c, s, cn, TL_ERR_INVALID, 400, "invalid_request_error", NULL, "%s",
                           ferr);
    }
    if (cn->r == R_NONE)
        return reply_error(c, s, cn, TL_ERR_INVALID, 404, "invalid_request_error", NULL,
                           "no such endpoint: %s %s", method, url);
    if (!strcmp(method, "OPTIONS")) return preflight(c, s, cn, url);
    unsigned m = method_bit(method);
    if (!(cn->methods & m))
        return reply_error(c, s, cn, TL_ERR_INVALID, 405, "invalid_request_error", NULL,
                           "method %s is not allowed on %s", method, url);
    if (cn->r != R_HEALTH && cn->r != R_METRICS && cn->r != R_PING && cn->r != R_VERSION &&
        !auth_ok(s, c))
        return reply_error(c, s, cn, TL_ERR_INVALID, 401, "invalid_request_error",
                           "invalid_api_key",
                           "missing or invalid API key (send 'Authorization: Bearer KEY')");
    if (m == M_POST) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!is_json_type(ct))
            return reply_error(c, s, cn, TL_ERR_INVALID, 415, "invalid_request_error", NULL,
                               "the request body must be 'Content-Type: application/json' "
                               "(got %s)",
                               ct ? ct : "none");
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->p.max_body)
        return reply_error(c, s, cn, TL_ERR_INVALID, 413, "invalid_request_error", NULL,
                           "request body of %s bytes is over the limit of %zu bytes", cl,
                           s->p.max_body);
    return MHD_YES;
}

/* While the model loads: /health and /ping answer 503 {"status": "loading"}, every other route
 * (but /version) 503 with an error body: the engine and tokenizer do not exist yet. */
static enum MHD_Result reply_loading(struct MHD_Connection *c, tl_server *s, tl_conn *cn) {
    if (cn->r != R_HEALTH && cn->r != R_PING)
        return reply_error(c, s, cn, TL_ERR_CANCELLED, 503, "server_error", NULL,
                           "the model is still loading; retry when /health answers 200");
    static const char body[] = "{\"status\": \"loading\"}";
    tl_reply rep = {.status = 503, .content_type = "application/json"};
    rep.body = xmalloc(sizeof body);
    memcpy(rep.body, body, sizeof body);
    rep.body_len = sizeof body - 1;
    return queue_reply(c, s, cn, &rep);
}

/* ====== The access handler. ====== */

/* Calls the route's endpoint and queues its reply. */
static enum MHD_Result dispatch(struct MHD_Connection *c, tl_server *s, tl_conn *cn,
                                const char *url) {
    tl_reply rep = {0};
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    switch (cn->r) {
    case R_CHAT:
    case R_COMPLETIONS:
    case R_RESPONSES:
    case R_MESSAGES: {
        const char *body = cn->body.p ? cn->body.p : "";
        cn->active = 1;
        atomic_fetch_add(&s->n_active, 1);
        int gone = cn->r == R_CHAT        ? tl_api_chat(s, body, cn->body.n, fd, &rep)
                   : cn->r == R_RESPONSES ? tl_api_responses(s, body, cn->body.n, fd, &rep)
                   : cn->r == R_MESSAGES  ? tl_ant_messages(s, body, cn->body.n, fd, &rep)
                                          : tl_api_completions(s, body, cn->body.n, fd, &rep);
        if (gone) {
            tl_metrics_request(s->metrics, route_label[cn->r], 499); /* nginx: client closed */
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
    case R_TOKENIZE:
        tl_api_tokenize(s, cn->body.p ? cn->body.p : "", cn->body.n, &rep);
        break;
    case R_DETOKENIZE:
        tl_api_detokenize(s, cn->body.p ? cn->body.p : "", cn->body.n, &rep);
        break;
    case R_VERSION:
        tl_api_version(s, &rep);
        break;
    case R_PING: /* vLLM's /ping: the same answer as /health */
        tl_api_health(s, &rep);
        break;
    default:
        return MHD_NO;
    }
    return queue_reply(c, s, cn, &rep);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls) {
    tl_server *s = cls;
    tl_conn *cn = *con_cls;
    if (!cn) {
        cn = xcalloc(1, sizeof *cn);
        *con_cls = cn;
        return on_headers(c, s, cn, url, method);
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
        return reply_error(c, s, cn, TL_ERR_INVALID, 413, "invalid_request_error", NULL,
                           "request body is over the limit of %zu bytes", s->p.max_body);
    if (cn->body.err)
        return reply_error(c, s, cn, TL_ERR_NOMEM, 500, "server_error", NULL,
                           "out of memory reading the request body");
    if (atomic_load(&s->draining) && cn->r != R_METRICS && cn->r != R_HEALTH) {
        cn->close = 1; /* a keep-alive client (a balancer) reconnects, to another replica */
        return reply_error(c, s, cn, TL_ERR_CANCELLED, 503, "server_error", NULL,
                           "the server is draining (shutting down): it admits no new requests; "
                           "retry on another replica");
    }
    if (!atomic_load(&s->ready) && cn->r != R_VERSION) return reply_loading(c, s, cn);

    tl_reqlog_set_current(&cn->rl); /* api.c's tl_server_note_job finds it */
    enum MHD_Result ret = dispatch(c, s, cn, url);
    tl_reqlog_set_current(NULL);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    tl_server *s = cls;
    tl_conn *cn = *con_cls;
    if (!cn) return;
    tl_reqlog_end(s, &cn->rl, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (cn->active) atomic_fetch_sub(&s->n_active, 1);
    tl_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

/* ====== Daemon. ====== */

int tl_http_start(tl_server *s, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}; /* an address, or a name to resolve */
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->p.port);
    int rc = getaddrinfo(s->p.host, port, &hints, &ai);
    if (rc)
        return tl_errf(err, errlen, TL_ERR_INVALID, "--host %s: %s", s->p.host, gai_strerror(rc));
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
