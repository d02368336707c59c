/* Per-request records of the HTTP layer: the request id (X-Request-Id, or a generated one), the
 * generation job the endpoint queued, and at the end one log line and vLLM's request-level
 * metrics (docs/architecture.md §6.7). A record lives in http.c's per-connection state; while an
 * endpoint runs, it is the connection thread's current record, so that the endpoint files need
 * only tl_server_note_job at the one place jobs are queued (api.c). */
#ifndef TL_SERVER_REQLOG_H
#define TL_SERVER_REQLOG_H

#include "server/server.h"

#define TL_REQ_ID_MAX 128

typedef struct tl_reqlog {
    char id[TL_REQ_ID_MAX + 1];
    const char *route;  /* endpoint label */
    int log;            /* a generation route: log one line at the end */
    struct tl_job *job; /* one reference, or NULL (nothing queued) */
    double t0;          /* when the request's headers arrived */
    int status;         /* the HTTP status sent, 0 if none */
} tl_reqlog;

/* 1 if v is a usable request id: 1..TL_REQ_ID_MAX characters of [A-Za-z0-9._:-]. */
int tl_reqlog_id_valid(const char *v);
/* Starts a record: id from the header (already validated) or a new "req-<random>" one. */
void tl_reqlog_begin(tl_reqlog *r, const char *route, int log, const char *hdr_id);
/* The current record of this thread (NULL: none) while an endpoint handler runs. */
void tl_reqlog_set_current(tl_reqlog *r);
/* Ends a record: waits (briefly) for its job's end, records the vLLM request metrics, prints the
 * log line (--log-format), drops the job. completed: the response went out whole. */
void tl_reqlog_end(tl_server *s, tl_reqlog *r, int completed);

/* The periodic stats line (server.c calls it every --log-stats-interval seconds). */
void tl_reqlog_stats_line(tl_server *s, double dt, unsigned long long d_prompt,
                          unsigned long long d_gen, unsigned long long d_req, int running,
                          int queued, double kv_usage);

#endif
