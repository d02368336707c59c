/* tulip serve: command-line options -> tl_server_params -> tl_server_run (src/server). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "server/server.h"

static const tl_opt_choice serve_bits[] = {{"16", 16}, {"4", 4}, {NULL, 0}};
static const tl_opt_choice serve_log_formats[] = {{"text", 0}, {"json", 1}, {NULL, 0}};

static const char serve_about[] =
    "OpenAI-compatible HTTP server. A count or time of 0 means its default, except\n"
    "--port 0 (any free port) and --queue 0 (no waiting: 429 when the slots are full).\n"
    "The KV pool is sized from the GPU's memory (--gpu-memory-utilization) unless\n"
    "--kv-tokens sets it (the CPU backend has a pool only then); without --ctx the\n"
    "context is the model's maximum when the pool holds one such sequence (CPU:\n"
    "32768 at most). A request waits in the queue until its prompt fits in the free\n"
    "KV pages; when the pool runs short the newest sequence is preempted and\n"
    "recomputed later (its client sees only a pause). --trace logs bodies, rendered\n"
    "prompts, each SSE chunk, responses and errors.\n"
    "The socket opens before the model loads: /health answers 503 {\"status\":\"loading\"}\n"
    "(and every API route 503) until it is ready, and 503 again while draining: on\n"
    "SIGTERM or SIGINT new requests get 503 (Retry-After), running ones finish for up\n"
    "to --drain-timeout seconds, then the process exits 0. One process serves one GPU:\n"
    "--device N picks the N-th device CUDA_VISIBLE_DEVICES leaves visible; run one\n"
    "replica per GPU behind a balancer (docs/deploy.md).\n"
    "One log line per generation request (id, tokens, TTFT, duration, finish reason);\n"
    "an X-Request-Id header (1-128 chars of A-Za-z0-9._:-) names the request and is\n"
    "echoed; otherwise one is generated. The API key may come from --api-key-file or\n"
    "the TULIP_API_KEY environment variable instead of the command line. Prompt prefixes\n"
    "are reused across requests and turns from a prefix cache of state snapshots\n"
    "(--prefix-cache-gb; CPU default 0.25 GiB) and KV pages shared in the KV pool;\n"
    "usage reports the cached tokens.\n"
    "--speculative-tokens K drafts K tokens a step with the checkpoint's MTP head and\n"
    "verifies them in one forward (greedy output unchanged, sampling the same law); off\n"
    "without an MTP head, said at startup.\n";

typedef struct serve_opts {
    tl_server_params p;
    int backend;
    uint64_t max_body;
    const char *key_file;
    char key[1024]; /* the key read from --api-key-file or TULIP_API_KEY */
} serve_opts;

/* The API key from --api-key-file (its first line, surrounding blanks removed) or, when neither
 * that nor --api-key is given, from the TULIP_API_KEY environment variable: either keeps the key
 * out of the process list. Returns TL_CLI_CONTINUE or the exit status. */
static int serve_api_key(serve_opts *o, const tl_cli_cmd *cmd) {
    tl_server_params *p = &o->p;
    const char *src = NULL;
    if (o->key_file) {
        if (p->api_key)
            return tl_cli_usage_error(cmd, "give --api-key or --api-key-file, not both");
        FILE *f = fopen(o->key_file, "r");
        if (!f) {
            fprintf(stderr, "tulip serve: --api-key-file %s: %s\n", o->key_file, strerror(errno));
            return 1;
        }
        if (!fgets(o->key, sizeof o->key, f)) o->key[0] = '\0';
        fclose(f);
        src = o->key_file;
    } else if (!p->api_key && getenv("TULIP_API_KEY")) {
        snprintf(o->key, sizeof o->key, "%s", getenv("TULIP_API_KEY"));
        src = "TULIP_API_KEY";
    } else {
        return TL_CLI_CONTINUE;
    }
    char *k = o->key;
    while (*k == ' ' || *k == '\t') k++;
    size_t n = strcspn(k, "\r\n");
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
    k[n] = '\0';
    if (!*k) {
        fprintf(stderr, "tulip serve: the API key from %s is empty\n", src);
        return 1;
    }
    p->api_key = k;
    return TL_CLI_CONTINUE;
}

/* The checks and conversions after parsing. Returns TL_CLI_CONTINUE or the exit status. */
static int serve_finish(serve_opts *o, const tl_cli_cmd *cmd) {
    tl_server_params *p = &o->p;
    if (!p->model_path && !p->random_weights)
        return tl_cli_usage_error(cmd, "--model DIR is required (or --random-weights)");
    p->backend = (tl_backend_kind)o->backend;
    if (p->backend == TL_BACKEND_CPU && p->device != 0)
        return tl_cli_usage_error(cmd, "--device %d: the CPU backend has no devices (only 0)",
                                  p->device);
    p->max_body = (size_t)o->max_body;
    if (p->default_ctk) { /* checked here so a typo exits 2 before the model loads */
        char err[256];
        json_t *v = tl_oai_default_ctk(p->default_ctk, err, sizeof err);
        if (!v) return tl_cli_usage_error(cmd, "--default-chat-template-kwargs: %s", err);
        json_decref(v);
    }
    if (tl_cli_given(cmd, &p->max_queue) && p->max_queue == 0)
        p->max_queue = -1; /* 0 given: no waiting at all (0 in the params is the default) */
    if (tl_cli_given(cmd, &p->stats_interval_s) && p->stats_interval_s <= 0)
        p->stats_interval_s = -1; /* 0 or -1 given: no stats line */
    p->version = tl_cli_version();
    p->commit = tl_cli_commit();
    p->arch = tl_cli_arch();
    return serve_api_key(o, cmd);
}

/* Options -> o->p. Returns TL_CLI_CONTINUE or the exit status. */
static int serve_parse(serve_opts *o, int argc, char **argv) {
    tl_server_params *p = &o->p;
    tl_opt opts[] = {
        TL_CLI_OPT_MODEL(&p->model_path, 0),
        TL_OPT_STR("tokenizer", 0, &p->tokenizer_path, "PATH",
                   "tokenizer.json (default: the one in --model)"),
        TL_OPT_STR("served-model-name", 0, &p->model_name, "A,B",
                   "model ids clients may send, first = reported (default: DIR's name)"),
        TL_OPT_STR("host", 0, &p->host, "HOST", "address or host name to bind (default 127.0.0.1)"),
        TL_OPT_INT("port", 0, &p->port, "N", 0, 65535,
                   "TCP port (default 8000; 0 = any free port, printed)"),
        TL_OPT_STR("api-key", 0, &p->api_key, "KEY",
                   "require 'Authorization: Bearer KEY' on /v1/* (visible in ps)"),
        TL_OPT_STR("api-key-file", 0, &o->key_file, "FILE",
                   "read the API key from FILE (first line); or set TULIP_API_KEY"),
        TL_OPT_STR("allowed-origins", 0, &p->allowed_origins, "A,B",
                   "CORS: origins browsers may call from, or * (default: off)"),
        TL_OPT_INT("max-seqs", 0, &p->max_seqs, "N", 0, TL_OPT_NOMAX,
                   "concurrent sequences (state slots; default 0: engine's)"),
        TL_OPT_INT("ctx", 0, &p->max_ctx, "N", 0, TL_OPT_NOMAX,
                   "tokens per sequence (default: model max if the KV pool holds it)"),
        TL_OPT_LONG("kv-tokens", 0, &p->kv_tokens, "N", 0, TL_OPT_NOMAX,
                    "KV pool of all sequences in tokens (default: from GPU memory)"),
        /* no metavar: the name alone fills the help's first column */
        TL_OPT_DOUBLE("gpu-memory-utilization", 0, &p->gpu_memory_utilization, NULL, 0, 1,
                      "F: GPU memory share for weights, state and KV (0.9)"),
        TL_OPT_CHOICE("state-dtype", 0, &p->state_bf16, "fp32|bf16", tl_cli_state_dtypes,
                      "CUDA: Gated DeltaNet state precision (default fp32)"),
        TL_OPT_DOUBLE("prefix-cache-gb", 0, &p->prefix_cache_gb, "GB", 0, 1e6,
                      "prefix cache snapshot budget in GiB (default: 1/8 of free GPU memory)"),
        TL_OPT_FLAG("no-warmup", 0, &p->no_warmup,
                    "CUDA: start without warm-up sequences (the first request then pays the "
                    "kernels' first launches)"),
        TL_OPT_FLAG("no-prefix-cache", 0, &p->no_prefix_cache,
                    "do not reuse prompt prefixes across requests"),
        TL_OPT_INT("prefix-snap-every", 0, &p->snap_every, "N", 64, 1 << 30,
                   "prefix cache: a state snapshot every N prompt tokens (default 4096)"),
        TL_OPT_INT("speculative-tokens", 0, &p->spec_tokens, "K", 0, TL_MAX_SPEC,
                   "MTP draft tokens verified per step (0 = off, the default; 1..4)"),
        TL_OPT_INT("queue", 0, &p->max_queue, "N", 0, TL_OPT_NOMAX,
                   "requests that may wait to start (default 64; then 429)"),
        TL_OPT_INT("step-tokens", 0, &p->step_tokens, "N", 0, TL_OPT_NOMAX,
                   "token budget of one engine step (default 2048)"),
        TL_OPT_INT("gather-us", 0, &p->gather_us, "US", 0, 1000000,
                   "idle engine: start once no request arrived for US us (default 0: at once)"),
        TL_OPT_U64("max-body", 0, &o->max_body, "BYTES", "request body limit (default 8388608)"),
        TL_OPT_INT("max-conns", 0, &p->max_conns, "N", 0, TL_OPT_NOMAX,
                   "concurrent HTTP connections (default 512)"),
        TL_OPT_DOUBLE("drain-timeout", 0, &p->drain_s, "S", 0, 1e6,
                      "on SIGINT/SIGTERM, seconds running requests may finish (10)"),
        TL_OPT_INT("idle-timeout", 0, &p->idle_timeout_s, "S", 0, TL_OPT_NOMAX,
                   "close connections idle this long (default 300)"),
        TL_OPT_STR("trace", 0, &p->trace_path, "FILE",
                   "append one JSON line per request event (debugging)"),
        TL_OPT_DOUBLE("keepalive", 0, &p->keepalive_s, "S", 0, 86400,
                      "SSE ': keepalive' comment after S s without tokens (5)"),
        TL_CLI_OPT_BACKEND(&o->backend),
        TL_OPT_INT("device", 0, &p->device, "N", 0, TL_OPT_NOMAX,
                   "CUDA device: N-th of CUDA_VISIBLE_DEVICES' list (default 0)"),
        TL_CLI_OPT_THREADS(&p->n_threads),
        TL_CLI_OPT_ALLOW_TEST_SHAPE(&p->allow_test_shape),
        TL_OPT_FLAG("random-weights", 0, &p->random_weights,
                    "no checkpoint: a full-size model from --seed (benchmarks)"),
        TL_OPT_CHOICE("weight-bits", 0, &p->weight_bits, "16|4", serve_bits,
                      "random weights: bf16 or 4-bit (default 4)"),
        TL_OPT_U64("seed", 0, &p->seed, "N", "random weights seed (default 1)"),
        TL_OPT_STR("default-chat-template-kwargs", 0, &p->default_ctk, "JSON",
                   "default chat_template_kwargs (a request's own override by key)"),
        TL_OPT_CHOICE("log-format", 0, &p->log_json, "text|json", serve_log_formats,
                      "per-request and stats lines on stderr (default text)"),
        TL_OPT_DOUBLE("log-stats-interval", 0, &p->stats_interval_s, "S", -1, 86400,
                      "stats line every S s while busy (10; -1: never)"),
        TL_OPT_FLAG("strict-template", 0, &p->strict_template,
                    "refuse to start if the checkpoint's chat template differs"),
        TL_OPT_FLAG("test-mode", 0, &p->test_mode,
                    "honour the tulip_test_script request field (tests only)"),
    };
    tl_cli_cmd cmd = {
        .name = "serve",
        .id = TL_CMD_SERVE,
        .synopsis = "--model DIR [options]",
        .about = serve_about,
        .opts = opts,
        .n_opts = TL_CLI_NOPTS(opts),
    };
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    return serve_finish(o, &cmd);
}

int cmd_serve(int argc, char **argv) {
    serve_opts o = {.p = {.port = 8000, .weight_bits = 4, .seed = 1}, .backend = TL_BACKEND_AUTO};
    int rc = serve_parse(&o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    return tl_server_run(&o.p);
}
