/* The endpoints: /v1/chat/completions, /v1/completions (streaming and not), /v1/models, /health,
 * /metrics. A generation request is parsed and validated (openai.c), rendered with the chat
 * template and tokenized, checked against the context and the KV pool, then queued as one tl_job
 * per choice (`n` x prompts, docs/api.md §6); this thread then reads the jobs' tokens through one
 * tl_gen each (text, stop strings, reasoning, tool calls) and writes the response or SSE chunks.
 * The client socket is watched for a hang-up all along, so a client that leaves cancels its job
 * within one engine step.
 *
 * Runs on libmicrohttpd's connection threads; shares only the tl_server (read-only after
 * startup), the scheduler (thread-safe) and the tokenizer (thread-safe). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "model/config.h"
#include "server/gen.h"
#include "server/metrics.h"
#include "server/sched.h"
#include "server/server.h"
#include "server/sse.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat.h"

#define EV_BATCH 64

/* ====== Trace (--trace FILE). ====== */

/* Appends {"t","id","event","data"} as one line; data is stolen (a JSON value or NULL). */
static void trace(tl_server *s, const char *id, const char *event, json_t *data) {
    if (!s->trace) {
        json_decref(data);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "t", json_real(tl_time_s() - s->t0));
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "event", json_string(event));
    if (data) json_object_set_new(o, "data", data);
    char *line = tl_oai_dump(o);
    pthread_mutex_lock(&s->trace_mu);
    fprintf(s->trace, "%s\n", line);
    fflush(s->trace);
    pthread_mutex_unlock(&s->trace_mu);
    free(line);
}

/* ====== Small replies. ====== */

static void reply_json(tl_reply *out, int status, json_t *v) {
    memset(out, 0, sizeof *out);
    out->status = status;
    out->content_type = "application/json";
    out->body = tl_oai_dump(v);
    out->body_len = strlen(out->body);
}

void tl_api_error(tl_reply *out, const tl_oai_error *e) {
    memset(out, 0, sizeof *out);
    out->status = e->http;
    out->content_type = "application/json";
    out->body = tl_oai_error_json(e);
    out->body_len = strlen(out->body);
}

/* One model object (every served name is one, vLLM's listing of --served-model-name). */
static json_t *model_obj(tl_server *s, const char *name) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("tulip"));
    json_object_set_new(m, "max_model_len", json_integer(s->max_ctx));
    return m;
}

void tl_api_models(tl_server *s, const char *id, tl_reply *out) {
    if (id && !tl_server_model_known(s, id)) {
        tl_oai_error e;
        tl_oai_fail(&e, TL_ERR_INVALID, "model", "the model '%s' does not exist", id);
        e.http = 404;
        e.code = "model_not_found";
        tl_api_error(out, &e);
        return;
    }
    if (id) {
        reply_json(out, 200, model_obj(s, id));
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < s->n_model_names; i++)
        json_array_append_new(data, model_obj(s, s->model_names[i]));
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    reply_json(out, 200, o);
}

void tl_api_health(tl_server *s, tl_reply *out) {
    int lost = tl_sched_lost(s->sched), draining = atomic_load(&s->draining);
    json_t *o = json_object();
    json_object_set_new(o, "status",
                        json_string(lost       ? "device lost"
                                    : draining ? "draining"
                                               : "ok"));
    reply_json(out, lost || draining ? 503 : 200, o);
}

void tl_api_metrics(tl_server *s, tl_reply *out) {
    tl_metrics_gauges g = {.max_seqs = tl_engine_max_seqs(s->eng)};
    tl_sched_stats(s->sched, &g.queued, &g.running, &g.sessions, &g.kv_tokens);
    tl_kv_stats kv;
    tl_sched_kv_stats(s->sched, &kv);
    g.kv_pages_total = kv.pages_total;
    g.kv_pages_free = kv.pages_free;
    g.kv_page_tokens = kv.page_tokens;
    g.kv_capacity = kv.pages_total * kv.page_tokens;
    tl_prefix_stats ps;
    tl_sched_prefix_stats(s->sched, &ps);
    g.pc_on = s->prefix_cache;
    g.pc_queries = ps.queries, g.pc_hits = ps.hits, g.pc_hit_tokens = ps.hit_tokens;
    g.pc_evictions = ps.evictions, g.pc_snap_bytes = ps.snap_bytes;
    g.pc_bytes_used = ps.bytes_used, g.pc_bytes_total = ps.bytes_total;
    tl_spec_stats ss;
    tl_sched_spec_stats(s->sched, &ss);
    g.spec_on = tl_engine_spec_tokens(s->eng) > 0;
    g.spec_drafts = ss.drafts, g.spec_drafted = ss.drafted, g.spec_accepted = ss.accepted;
    g.spec_k = tl_engine_spec_tokens(s->eng);
    for (int i = 0; i < g.spec_k && i < TL_MAX_SPEC; i++)
        g.spec_accepted_pos[i] = ss.accepted_pos[i];
    char *text = tl_metrics_render(s->metrics, &g);
    if (!text) {
        tl_oai_error e;
        tl_oai_fail(&e, TL_ERR_NOMEM, NULL, "out of memory rendering the metrics");
        tl_api_error(out, &e);
        return;
    }
    memset(out, 0, sizeof *out);
    out->status = 200;
    out->content_type = "text/plain; version=0.0.4";
    out->body = text;
    out->body_len = strlen(out->body);
}

/* ====== Request -> job. ====== */

/* The normalised messages as the chat template takes them. Every string of a tl_oai_req is valid
 * UTF-8 already (jansson checked the body; contents are concatenations of its strings), so
 * json_string_nocheck skips jansson's check, a pass over every byte of a long conversation. */
static json_t *messages_json(const tl_oai_req *r) {
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    json_t *arr = json_array();
    for (int i = 0; i < r->n_msgs; i++) {
        const tl_oai_msg *m = &r->msgs[i];
        json_t *o = json_object();
        json_object_set_new(o, "role", json_string_nocheck(roles[m->role]));
        json_object_set_new(o, "content", json_string_nocheck(m->content));
        if (m->reasoning_content)
            json_object_set_new(o, "reasoning_content", json_string_nocheck(m->reasoning_content));
        if (m->name) json_object_set_new(o, "name", json_string_nocheck(m->name));
        if (m->tool_call_id)
            json_object_set_new(o, "tool_call_id", json_string_nocheck(m->tool_call_id));
        if (m->n_tool_calls) {
            json_t *tcs = json_array();
            for (int k = 0; k < m->n_tool_calls; k++) {
                json_t *tc = json_object(), *fn = json_object();
                if (m->tool_calls[k].id)
                    json_object_set_new(tc, "id", json_string_nocheck(m->tool_calls[k].id));
                json_object_set_new(tc, "type", json_string_nocheck("function"));
                json_object_set_new(fn, "name", json_string_nocheck(m->tool_calls[k].name));
                json_object_set_new(fn, "arguments",
                                    json_string_nocheck(m->tool_calls[k].arguments));
                json_object_set_new(tc, "function", fn);
                json_array_append_new(tcs, tc);
            }
            json_object_set_new(o, "tool_calls", tcs);
        }
        json_array_append_new(arr, o);
    }
    return arr;
}

static int tokenize_into(tl_server *s, const char *text, size_t len, tl_job *j, tl_oai_error *e) {
    tl_tok_ids ids = {0};
    int n = tl_tokenize(s->tok, text, len, 0, &ids);
    if (n < 0) {
        tl_tok_ids_free(&ids);
        return tl_oai_fail(e, n, NULL, "tokenizer failed: %s", tl_status_str(n));
    }
    j->prompt = ids.ids;
    j->n_prompt = (int)ids.n;
    return 0;
}

/* Tokens that force a tool call once the reasoning is over (tool_choice required or named):
 * the model then only chooses the name (required) or the arguments (named). */
static int force_tokens(tl_server *s, const tl_oai_req *r, tl_job *j, tl_oai_error *e) {
    if (r->tool_choice != TL_TOOL_REQUIRED && r->tool_choice != TL_TOOL_NAMED) return 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s<tool_call>\n<function=%s%s", r->enable_thinking ? "\n\n" : "",
             r->tool_choice == TL_TOOL_NAMED ? r->tool_name : "",
             r->tool_choice == TL_TOOL_NAMED ? ">\n" : "");
    tl_tok_ids ids = {0};
    int n = tl_tokenize(s->tok, buf, strlen(buf), 0, &ids);
    if (n < 0) {
        tl_tok_ids_free(&ids);
        return tl_oai_fail(e, n, NULL, "tokenizer failed: %s", tl_status_str(n));
    }
    j->force = ids.ids;
    j->n_force = (int)ids.n;
    return 0;
}

/* A malloc'd copy of n elements of size sz (NULL for none); TL_ERR_NOMEM when it fails. */
static int dup_arr(const void *src, size_t n, size_t sz, void *out, tl_oai_error *e) {
    void *p = NULL;
    if (src && n) {
        p = malloc(n * sz);
        if (!p) return tl_oai_fail(e, TL_ERR_NOMEM, NULL, "out of memory copying the request");
        memcpy(p, src, n * sz);
    }
    memcpy(out, &p, sizeof p);
    return 0;
}

/* The request's sampling, limits and token restrictions into j (copies: the request's choices
 * each own theirs). */
static int job_params(const tl_oai_req *r, tl_job *j, tl_oai_error *e) {
    j->sample = r->sample;
    if (dup_arr(r->bias_ids, (size_t)r->n_bias, sizeof(int32_t), &j->bias_ids, e) ||
        dup_arr(r->bias_vals, (size_t)r->n_bias, sizeof(float), &j->bias_vals, e) ||
        dup_arr(r->stop_ids, (size_t)r->n_stop_ids, sizeof(int32_t), &j->stop_ids, e) ||
        dup_arr(r->script, (size_t)r->n_script, sizeof(int32_t), &j->script, e))
        return e->status;
    j->sample.bias_ids = j->bias_ids, j->sample.bias_vals = j->bias_vals;
    j->n_stop_ids = r->n_stop_ids;
    j->n_script = r->n_script;
    j->min_tokens = r->min_tokens;
    j->cache_salt = r->cache_salt ? xstrdup(r->cache_salt) : NULL;
    j->max_tokens = r->max_tokens;
    j->ignore_eos = r->ignore_eos;
    j->fail_after = r->fail_after;
    j->fail_lost = r->fail_lost;
    return 0;
}

/* Builds the job for a validated request: prompt ids (completions: of prompt number `prompt`),
 * sampling, limits. */
static int make_job(tl_server *s, const char *id, tl_oai_req *r, int prompt, tl_job **out,
                    tl_oai_error *e) {
    tl_job *j = tl_job_new();
    if (!j) return tl_oai_fail(e, TL_ERR_INTERNAL, NULL, "cannot create an event fd");
    int st = 0;
    if (r->kind == TL_OAI_CHAT) {
        json_t *msgs = messages_json(r);
        tl_chat_opts co;
        tl_chat_opts_default(&co);
        co.enable_thinking = r->enable_thinking;
        co.preserve_thinking = r->preserve_thinking;
        char *text = NULL, err[256] = "";
        size_t len = 0;
        const json_t *tools = r->tool_choice == TL_TOOL_NONE ? NULL : r->tools;
        st = tl_chat_render(msgs, tools, &co, &text, &len, err, sizeof err);
        if (st) {
            tl_oai_fail(e, st == TL_ERR_NOMEM ? st : TL_ERR_INVALID, "messages", "%s", err);
        } else {
            st = tokenize_into(s, text, len, j, e);
            trace(s, id, "prompt", json_stringn(text, len));
            if (!st && s->prefix_cache) /* the end of the last complete message */
                j->snap_at =
                    tl_chat_snap_point(s->tok, &co, text, len, j->prompt, (size_t)j->n_prompt);
            free(text);
        }
        json_decref(msgs);
        if (!st && !r->script) st = tl_con_from_request(&s->con, r, &j->con, e);
        if (!st && !j->con) st = force_tokens(s, r, j, e);
        j->think_end_id = r->enable_thinking ? s->think_end_id : -1;
        j->in_think = r->enable_thinking;
    } else if (r->prompts[prompt].text) {
        st = tokenize_into(s, r->prompts[prompt].text, strlen(r->prompts[prompt].text), j, e);
    } else {
        const tl_oai_prompt *p = &r->prompts[prompt];
        for (int i = 0; i < p->n_ids && !st; i++)
            if (p->ids[i] >= s->n_vocab)
                st = tl_oai_fail(e, TL_ERR_INVALID, "prompt", "token id %d is not below %d",
                                 p->ids[i], s->n_vocab);
        if (!st) st = dup_arr(p->ids, (size_t)p->n_ids, sizeof(int32_t), &j->prompt, e);
        if (!st) j->n_prompt = p->n_ids;
    }
    if (!st && r->kind == TL_OAI_COMPLETION && !r->script)
        st = tl_con_from_request(&s->con, r, &j->con, e);
    if (!st && j->n_prompt == 0) st = tl_oai_fail(e, TL_ERR_INVALID, NULL, "the prompt is empty");
    if (!st && (j->n_prompt >= s->max_ctx ||
                (r->max_tokens > 0 && (long)j->n_prompt + r->max_tokens > s->max_ctx))) {
        st = tl_oai_fail(e, TL_ERR_CONTEXT_FULL, r->kind == TL_OAI_CHAT ? "messages" : "prompt",
                         "this model's maximum context length is %d tokens; the prompt has %d "
                         "tokens%s",
                         s->max_ctx, j->n_prompt,
                         j->n_prompt < s->max_ctx ? " and max_tokens asks for more than the rest"
                                                  : "");
        e->n_prompt = j->n_prompt;
        e->n_ctx = s->max_ctx;
    }
    long seq = tl_sched_seq_tokens(s->sched); /* below max_ctx when the KV pool is smaller */
    if (!st && j->n_prompt >= seq) {
        st = tl_oai_fail(e, TL_ERR_CONTEXT_FULL, r->kind == TL_OAI_CHAT ? "messages" : "prompt",
                         "the prompt has %d tokens; with its first generated token it does not "
                         "fit in the whole KV cache pool of this server (%ld tokens)",
                         j->n_prompt, seq);
        e->n_prompt = j->n_prompt;
        e->n_ctx = seq;
    }
    if (!st) st = job_params(r, j, e);
    if (st) {
        tl_job_unref(j);
        return st;
    }
    *out = j;
    return 0;
}

/* Another choice of the same prompt as j0 (n > 1): the same prompt ids and forcing, its own
 * constraint state and copies of the restrictions. */
static int clone_job(tl_server *s, const tl_oai_req *r, const tl_job *j0, tl_job **out,
                     tl_oai_error *e) {
    tl_job *j = tl_job_new();
    if (!j) return tl_oai_fail(e, TL_ERR_INTERNAL, NULL, "cannot create an event fd");
    int st = dup_arr(j0->prompt, (size_t)j0->n_prompt, sizeof(int32_t), &j->prompt, e);
    j->n_prompt = j0->n_prompt;
    j->snap_at = j0->snap_at;
    j->think_end_id = j0->think_end_id;
    j->in_think = j0->in_think;
    if (!st) st = dup_arr(j0->force, (size_t)j0->n_force, sizeof(int32_t), &j->force, e);
    j->n_force = j0->n_force;
    if (!st && j0->con) st = tl_con_from_request(&s->con, r, &j->con, e);
    if (!st) st = job_params(r, j, e);
    if (st) {
        tl_job_unref(j);
        return st;
    }
    *out = j;
    return 0;
}

uint64_t tl_api_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = (uint64_t)time(NULL);
    return x;
}

/* Queues a built job; on failure fills e, drops the job and returns the status. */
static int submit(tl_server *s, const char *id, tl_job *j, tl_oai_error *e) {
    char err[256] = "";
    int st = tl_sched_submit(s->sched, j, err, sizeof err);
    if (st) {
        tl_oai_fail(e, st, NULL, "%s", err);
        if (st == TL_ERR_CANCELLED) e->http = 503, e->type = "server_error";
        tl_job_unref(j);
        return st;
    }
    tl_metrics_prompt_tokens(s->metrics, j->n_prompt);
    tl_server_note_job(s, j); /* the request's log line and vLLM metrics (reqlog.c) */
    trace(s, id, "queued", json_integer(j->n_prompt));
    return 0;
}

/* Parses, builds and queues one job (the chat path of the Anthropic and Responses APIs, which
 * have no `n`). On failure fills e and returns its status. */
static int start(tl_server *s, const char *id, tl_oai_kind kind, const char *body, size_t len,
                 tl_oai_req *r, tl_job **j, tl_oai_error *e) {
    if (s->trace) trace(s, id, "request", json_stringn(body, len));
    int st = tl_oai_parse(r, kind, body, len, &s->oai, s->n_vocab, e);
    if (st) return st;
    if (r->n != 1 || r->n_prompts > 1)
        st = tl_oai_fail(e, TL_ERR_UNSUPPORTED, "n", "several choices are not supported here");
    if (!st) st = make_job(s, id, r, 0, j, e);
    if (!st) st = submit(s, id, *j, e);
    if (st) {
        *j = NULL;
        tl_oai_req_free(r);
    }
    return st;
}

/* ====== Several choices (docs/api.md §6). ======
 * A request becomes prompts x n jobs, choice k = prompt * n + i, each read through its own
 * tl_gen. With a seed, choice k samples from seed + k (tl_rng_seed); without, each its own
 * random seed. */

typedef struct req_choice {
    tl_job *job;
    tl_gen gen;
    int fin;       /* TL_FIN_NONE while it runs, then its tl_finish (a matched stop string: STOP) */
    int out_noted; /* its first output chunk was queued (tl_job_note_output, once) */
} req_choice;

static void choices_free(req_choice *c, int nc) {
    for (int k = 0; c && k < nc; k++) {
        if (c[k].job) {
            tl_job_cancel(c[k].job); /* no-op when it already ended */
            tl_job_unref(c[k].job);
        }
        if (c[k].gen.dt) tl_gen_free(&c[k].gen);
    }
    free(c);
}

/* Every choice's job, built before any is queued (a bad prompt queues nothing). Identical
 * completions prompts (n > 1) snapshot one token before their end, so the others restore all
 * but that token from the prefix cache (docs/architecture.md §4.1). */
static int build_choices(tl_server *s, const char *id, tl_oai_req *r, req_choice *c, int nc,
                         tl_oai_error *e) {
    int n = r->n, st = 0;
    for (int k = 0; k < nc && !st; k++) {
        tl_job **j = &c[k].job;
        st = k % n ? clone_job(s, r, c[k - k % n].job, j, e) : make_job(s, id, r, k / n, j, e);
        if (st) break;
        if (n > 1 && s->prefix_cache && r->kind == TL_OAI_COMPLETION)
            (*j)->snap_at = (*j)->n_prompt - 1;
        (*j)->sample.seed = r->has_seed ? r->sample.seed + (uint64_t)k
                            : k         ? tl_api_seed()
                                        : r->sample.seed;
    }
    return st;
}

/* Each choice's output state, over r where it stays for the whole request (a tl_gen borrows
 * the request's stop strings). */
static void init_gens(tl_server *s, const tl_oai_req *r, req_choice *c, int nc) {
    for (int k = 0; k < nc; k++) {
        tl_gen_init(&c[k].gen, r, s->tok, s->think_end_id, tl_api_seed());
        if (r->kind == TL_OAI_COMPLETION && r->echo)
            tl_gen_echo(&c[k].gen, r->prompts[k / r->n].text);
    }
}

/* Parses, builds and queues every choice of the request. On failure fills e, frees r and
 * returns its status (nothing stays queued). */
static int start_all(tl_server *s, const char *id, tl_oai_kind kind, const char *body, size_t len,
                     tl_oai_req *r, req_choice **out, int *n_out, tl_oai_error *e) {
    if (s->trace) trace(s, id, "request", json_stringn(body, len));
    int st = tl_oai_parse(r, kind, body, len, &s->oai, s->n_vocab, e);
    if (st) return st;
    int nc = r->n * (kind == TL_OAI_COMPLETION ? r->n_prompts : 1);
    req_choice *c = xcalloc((size_t)nc, sizeof *c); /* nc <= TL_OAI_MAX_CHOICES */
    st = build_choices(s, id, r, c, nc, e);
    for (int k = 0; k < nc && !st; k++) {
        st = submit(s, id, c[k].job, e);
        if (st) c[k].job = NULL; /* submit dropped it; the queued ones are cancelled below */
    }
    if (st) {
        choices_free(c, nc);
        tl_oai_req_free(r);
        return st;
    }
    *out = c;
    *n_out = nc;
    return 0;
}

int tl_api_start_chat(tl_server *s, const char *id, const char *body, size_t len, tl_oai_req *r,
                      tl_job **j, tl_oai_error *e) {
    return start(s, id, TL_OAI_CHAT, body, len, r, j, e);
}

int tl_api_count_chat(tl_server *s, const char *body, size_t len, int *n, tl_oai_error *e) {
    tl_oai_req r;
    tl_job *j = NULL;
    int st = tl_oai_parse(&r, TL_OAI_CHAT, body, len, &s->oai, s->n_vocab, e);
    if (st) return st;
    st = make_job(s, "count", &r, 0, &j, e);
    if (!st) *n = j->n_prompt;
    if (j) tl_job_unref(j);
    tl_oai_req_free(&r);
    return st;
}

void tl_api_job_error(const tl_job *j, tl_oai_error *e) {
    int st = j->err_status ? j->err_status : TL_ERR_INTERNAL;
    tl_oai_fail(e, st, NULL, "generation failed: %s%s%s", tl_status_str(st), j->err[0] ? ": " : "",
                j->err);
}

/* Chat messages and deltas carry the reasoning under both names: reasoning_content
 * (DeepSeek's, read by the Vercel AI SDK, OpenCode, Open WebUI, LiteLLM) and reasoning (vLLM's
 * since late 2025, OpenRouter's); docs/api.md §2 has the sources. */
static json_t *reasoning_alias(json_t *m) {
    json_t *rc = m ? json_object_get(m, "reasoning_content") : NULL;
    if (rc) json_object_set(m, "reasoning", rc);
    return m;
}

/* ====== Non-streaming. ====== */

/* Reads the job to its end into g. Returns the tl_finish, or -1 when the client went away. */
int tl_api_drain_job(tl_job *j, tl_gen *g, int fd) {
    tl_sample_out ev[EV_BATCH];
    for (;;) {
        int fin, n = tl_job_take(j, ev, EV_BATCH, &fin);
        for (int i = 0; i < n; i++)
            if (tl_gen_push(g, &ev[i])) {
                tl_job_cancel(j);
                return TL_FIN_STOP;
            }
        if (fin) return fin;
        if (n == EV_BATCH) continue;
        if (tl_job_wait(j, fd, 1000) < 0) {
            tl_job_cancel(j);
            return -1;
        }
    }
}

/* The error a failed (or shutdown-cancelled) job gives its request. */
static void fin_error(const tl_job *j, int fin, tl_oai_error *e) {
    if (fin == TL_FIN_ERROR) {
        tl_api_job_error(j, e);
        return;
    }
    tl_oai_fail(e, TL_ERR_CANCELLED, NULL, "the request was cancelled (shutdown)");
    e->http = 503, e->type = "server_error";
}

/* Usage of the whole request: each distinct prompt counted once (with the cached tokens its
 * first choice restored), completion tokens summed over the choices (docs/api.md §6). */
static tl_oai_usage choices_usage(const req_choice *c, int nc, int n) {
    tl_oai_usage u = {0};
    for (int k = 0; k < nc; k++) {
        if (k % n == 0)
            u.prompt_tokens += c[k].job->n_prompt, u.cached_tokens += c[k].job->n_cached;
        u.completion_tokens += c[k].gen.n_completion;
        u.reasoning_tokens += c[k].gen.n_reasoning;
    }
    return u;
}

/* One finished choice of a non-streaming response. */
static json_t *choice_json(req_choice *c, int k, int chat) {
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(k));
    if (chat)
        json_object_set_new(o, "message", reasoning_alias(tl_gen_message(&c->gen)));
    else
        json_object_set_new(o, "text",
                            json_stringn(c->gen.text.p ? c->gen.text.p : "", c->gen.text.n));
    json_t *lp = tl_gen_take_logprobs(&c->gen);
    json_object_set_new(o, "logprobs", lp ? lp : json_null());
    json_object_set_new(o, "finish_reason", json_string(tl_gen_finish_reason(&c->gen, c->fin)));
    return o;
}

/* Reads every choice to its end (in order: the others keep generating meanwhile) and replies.
 * A failed choice fails the request and cancels the rest; returns -1 when the client left. */
static int run_blocking(tl_server *s, const char *id, tl_oai_req *r, req_choice *c, int nc, int fd,
                        tl_reply *out) {
    for (int k = 0; k < nc; k++) {
        int fin = tl_api_drain_job(c[k].job, &c[k].gen, fd);
        if (fin < 0) {
            trace(s, id, "client gone", NULL);
            return -1; /* choices_free cancels the others */
        }
        if (fin == TL_FIN_ERROR || fin == TL_FIN_CANCELLED) {
            tl_oai_error e;
            fin_error(c[k].job, fin, &e);
            tl_api_error(out, &e);
            trace(s, id, "error", json_string(out->body));
            return 0;
        }
        c[k].fin = fin;
        tl_gen_end(&c[k].gen);
    }
    int chat = r->kind == TL_OAI_CHAT;
    tl_oai_usage u = choices_usage(c, nc, r->n);
    json_t *resp = tl_oai_envelope(id, chat ? "chat.completion" : "text_completion",
                                   (long)time(NULL), s->model_name, NULL, tl_oai_usage_json(&u));
    json_t *arr = json_object_get(resp, "choices");
    for (int k = 0; k < nc; k++) json_array_append_new(arr, choice_json(&c[k], k, chat));
    reply_json(out, 200, resp);
    trace(s, id, "response", json_string(out->body));
    return 0;
}

/* ====== Streaming. ====== */

struct tl_stream {
    tl_server *s;
    tl_oai_req req;
    req_choice *c;
    int nc, n_done;
    int fd;
    char id[64];
    long created;
    int started, done;
    tl_sbuf out;
};

static void stream_frame(struct tl_stream *st, const char *json) {
    tl_sse_data(&st->out, json);
    trace(st->s, st->id, "chunk", json_string(json));
}

/* One chunk of choice k (chunks of different choices interleave, as OpenAI's do). */
static void put_chunk(struct tl_stream *st, int k, json_t *delta, json_t *lp, const char *finish) {
    int chat = st->req.kind == TL_OAI_CHAT;
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(k));
    if (chat) {
        json_object_set_new(choice, "delta", delta ? reasoning_alias(delta) : json_object());
    } else {
        json_t *t = delta ? json_object_get(delta, "text") : NULL;
        json_object_set_new(choice, "text", t ? json_incref(t) : json_string(""));
        json_decref(delta);
    }
    json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *env = tl_oai_envelope(st->id, chat ? "chat.completion.chunk" : "text_completion",
                                  st->created, st->s->model_name, choice, NULL);
    char *txt = tl_oai_dump(env);
    stream_frame(st, txt);
    free(txt);
}

/* Turns choice k's deltas produced so far into chunks; pending logprobs ride on the last one. */
static void flush_deltas(struct tl_stream *st, int k) {
    tl_gen *g = &st->c[k].gen;
    json_t *ds = tl_gen_take_deltas(g);
    size_t n = json_array_size(ds);
    if (n && !st->c[k].out_noted) {
        tl_job_note_output(st->c[k].job);
        st->c[k].out_noted = 1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *lp = i + 1 == n ? tl_gen_take_logprobs(g) : NULL;
        put_chunk(st, k, json_incref(json_array_get(ds, i)), lp, NULL);
    }
    json_decref(ds);
}

/* The whole stream fails: one error event, the other choices cancelled, no [DONE]. */
static void stream_fail(struct tl_stream *st, int k, int fin) {
    tl_oai_error e;
    fin_error(st->c[k].job, fin, &e);
    char *txt = tl_oai_error_json(&e);
    stream_frame(st, txt);
    free(txt);
    for (int i = 0; i < st->nc; i++) tl_job_cancel(st->c[i].job);
    st->done = 1;
}

/* Choice k ended with fin: its last chunk; after the last choice the usage chunk and [DONE]. */
static void choice_finish(struct tl_stream *st, int k, int fin) {
    if (fin == TL_FIN_ERROR || fin == TL_FIN_CANCELLED) {
        stream_fail(st, k, fin);
        return;
    }
    req_choice *c = &st->c[k];
    c->fin = fin;
    tl_gen_end(&c->gen);
    flush_deltas(st, k);
    put_chunk(st, k, NULL, tl_gen_take_logprobs(&c->gen), tl_gen_finish_reason(&c->gen, fin));
    if (++st->n_done < st->nc) return;
    if (st->req.include_usage) {
        tl_oai_usage u = choices_usage(st->c, st->nc, st->req.n);
        json_t *env = tl_oai_envelope(
            st->id, st->req.kind == TL_OAI_CHAT ? "chat.completion.chunk" : "text_completion",
            st->created, st->s->model_name, NULL, tl_oai_usage_json(&u));
        char *txt = tl_oai_dump(env);
        stream_frame(st, txt);
        free(txt);
    }
    tl_sse_done(&st->out);
    st->done = 1;
}

/* Takes the pending events of every running choice into chunks. Returns 1 if any came. */
static int stream_poll_choices(struct tl_stream *st) {
    tl_sample_out ev[EV_BATCH];
    int any = 0;
    for (int k = 0; k < st->nc && !st->done; k++) {
        req_choice *c = &st->c[k];
        if (c->fin) continue;
        int fin, n = tl_job_take(c->job, ev, EV_BATCH, &fin), stopped = 0;
        any |= n > 0;
        for (int i = 0; i < n && !stopped; i++) stopped = tl_gen_push(&c->gen, &ev[i]);
        if (stopped) {
            tl_job_cancel(c->job);
            choice_finish(st, k, TL_FIN_STOP);
            continue;
        }
        flush_deltas(st, k);
        if (fin) choice_finish(st, k, fin);
    }
    return any;
}

/* Waits up to timeout_ms for an event of any running choice, watching the client socket.
 * Returns 1 (something to read), 0 (timeout) or -1 (the client went away). */
static int stream_wait(struct tl_stream *st, int timeout_ms) {
    struct pollfd p[TL_OAI_MAX_CHOICES + 1];
    int m = 0;
    for (int k = 0; k < st->nc; k++)
        if (!st->c[k].fin) p[m++] = (struct pollfd){.fd = st->c[k].job->efd, .events = POLLIN};
    p[m] = (struct pollfd){.fd = st->fd, .events = POLLRDHUP};
    int r = poll(p, (nfds_t)m + (st->fd >= 0), timeout_ms);
    if (r < 0) return errno == EINTR ? 0 : -1;
    if (st->fd >= 0 && (p[m].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return -1;
    int got = 0;
    for (int i = 0; i < m; i++)
        if (p[i].revents & POLLIN) {
            uint64_t v;
            ssize_t rd = read(p[i].fd, &v, sizeof v);
            (void)rd;
            got = 1;
        }
    return got;
}

long tl_stream_read(struct tl_stream *st, char *buf, size_t max) {
    for (;;) {
        if (tl_sbuf_unread(&st->out)) return (long)tl_sbuf_read(&st->out, buf, max);
        if (st->done) return -1;
        if (!st->started) {
            st->started = 1;
            for (int k = 0; k < st->nc && st->req.kind == TL_OAI_CHAT; k++) {
                json_t *d = json_object();
                json_object_set_new(d, "role", json_string("assistant"));
                json_object_set_new(d, "content", json_string(""));
                put_chunk(st, k, d, NULL, NULL);
            }
            continue;
        }
        if (stream_poll_choices(st) || st->done || tl_sbuf_unread(&st->out)) continue;
        int w = stream_wait(st, (int)(st->s->p.keepalive_s * 1000));
        if (w < 0) {
            for (int k = 0; k < st->nc; k++) tl_job_cancel(st->c[k].job);
            trace(st->s, st->id, "client gone", NULL);
            return -2;
        }
        if (w == 0) tl_sse_comment(&st->out, "keepalive");
    }
}

void tl_stream_free(struct tl_stream *st) {
    if (!st) return;
    choices_free(st->c, st->nc); /* cancels the jobs still running */
    tl_oai_req_free(&st->req);
    tl_sbuf_free(&st->out);
    free(st);
}

/* ====== Entry points. ====== */

static int generate(tl_server *s, tl_oai_kind kind, const char *body, size_t len, int fd,
                    tl_reply *out) {
    tl_oai_req r;
    req_choice *c = NULL;
    int nc = 0;
    tl_oai_error e;
    char id[64];
    tl_oai_make_id(id, sizeof id, kind == TL_OAI_CHAT ? "chatcmpl-" : "cmpl-");
    if (start_all(s, id, kind, body, len, &r, &c, &nc, &e)) {
        tl_api_error(out, &e);
        trace(s, id, "error", json_string(out->body));
        return 0;
    }
    if (!r.stream) {
        init_gens(s, &r, c, nc);
        int rc = run_blocking(s, id, &r, c, nc, fd, out);
        choices_free(c, nc);
        tl_oai_req_free(&r);
        return rc;
    }
    struct tl_stream *st = xcalloc(1, sizeof *st);
    st->s = s;
    st->req = r;
    st->c = c;
    st->nc = nc;
    init_gens(s, &st->req, c, nc);
    st->fd = fd;
    st->created = (long)time(NULL);
    snprintf(st->id, sizeof st->id, "%s", id);
    memset(out, 0, sizeof *out);
    out->status = 200;
    out->stream = st;
    return 0;
}

int tl_api_chat(tl_server *s, const char *body, size_t len, int fd, tl_reply *out) {
    return generate(s, TL_OAI_CHAT, body, len, fd, out);
}

int tl_api_completions(tl_server *s, const char *body, size_t len, int fd, tl_reply *out) {
    return generate(s, TL_OAI_COMPLETION, body, len, fd, out);
}
