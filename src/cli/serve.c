/* tulip serve: command-line options -> tl_server_params -> tl_server_run (src/server). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "server/server.h"

static void serve_usage(void) {
    fprintf(stderr,
            "usage: tulip serve --model DIR [options]\n"
            "  --model DIR            checkpoint directory (config.json + *.safetensors)\n"
            "  --tokenizer PATH       tokenizer.json (default: the one in --model)\n"
            "  --served-model-name N  the model id clients send (default: DIR's base name)\n"
            "  --host ADDR            numeric address to bind (default 127.0.0.1)\n"
            "  --port N               TCP port (default 8000; 0 = any free port, printed)\n"
            "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/*\n"
            "  --max-seqs N           concurrent sequences (state slots; default: engine's)\n"
            "  --ctx N                tokens per sequence (default: engine's)\n"
            "  --kv-tokens N          CUDA: KV cache pool shared by all sequences, in tokens\n"
            "                         (default max-seqs x ctx; smaller lets --max-seqs grow, and\n"
            "                         when it runs out the longest sequence ends with 'length')\n"
            "  --queue N              requests that may wait for a slot (default 64; then 429)\n"
            "  --step-tokens N        token budget of one engine step (default 2048)\n"
            "  --max-body BYTES       request body limit (default 8388608)\n"
            "  --max-conns N          concurrent HTTP connections (default 512)\n"
            "  --drain-timeout S      on SIGINT/SIGTERM, seconds running requests may finish (10)\n"
            "  --idle-timeout S       close connections idle this long (default 300)\n"
            "  --trace FILE           append one JSON line per request event (body, rendered\n"
            "                         prompt, each SSE chunk, response, errors) for debugging\n"
            "  --keepalive S          SSE ': keepalive' comment after S s without tokens (5)\n"
            "  --backend auto|cpu|cuda\n"
            "  --threads N            CPU backend threads (default: all cores)\n"
            "  --allow-test-shape     accept a model with non-production dimensions (tests)\n"
            "  --random-weights       no checkpoint: a full-size model from --seed (benchmarks)\n"
            "  --weight-bits 16|4     random weights: bf16 or 4-bit (default 4)\n"
            "  --seed N               random weights seed (default 1)\n"
            "  --test-mode            honour the tulip_test_script request field (tests only)\n");
}

int cmd_serve(int argc, char **argv) {
    tl_server_params p = {.port = 8000, .backend = TL_BACKEND_AUTO, .weight_bits = 4, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage();
            return 0;
        } else if (OPT("--model"))
            p.model_path = v;
        else if (OPT("--tokenizer"))
            p.tokenizer_path = v;
        else if (OPT("--served-model-name"))
            p.model_name = v;
        else if (OPT("--host"))
            p.host = v;
        else if (OPT("--port"))
            p.port = atoi(v);
        else if (OPT("--api-key"))
            p.api_key = v;
        else if (OPT("--max-seqs"))
            p.max_seqs = atoi(v);
        else if (OPT("--ctx"))
            p.max_ctx = atoi(v);
        else if (OPT("--kv-tokens"))
            p.kv_tokens = atol(v);
        else if (OPT("--queue"))
            p.max_queue = atoi(v) > 0 ? atoi(v) : -1;
        else if (OPT("--step-tokens"))
            p.step_tokens = atoi(v);
        else if (OPT("--max-body"))
            p.max_body = (size_t)strtoull(v, NULL, 10);
        else if (OPT("--max-conns"))
            p.max_conns = atoi(v);
        else if (OPT("--drain-timeout"))
            p.drain_s = atof(v);
        else if (OPT("--trace"))
            p.trace_path = v;
        else if (OPT("--keepalive"))
            p.keepalive_s = atof(v);
        else if (OPT("--idle-timeout"))
            p.idle_timeout_s = atoi(v);
        else if (OPT("--threads"))
            p.n_threads = atoi(v);
        else if (OPT("--weight-bits"))
            p.weight_bits = atoi(v);
        else if (OPT("--seed"))
            p.seed = strtoull(v, NULL, 10);
        else if (OPT("--backend")) {
            if (!strcmp(v, "cpu"))
                p.backend = TL_BACKEND_CPU;
            else if (!strcmp(v, "cuda"))
                p.backend = TL_BACKEND_CUDA;
            else if (!strcmp(v, "auto"))
                p.backend = TL_BACKEND_AUTO;
            else {
                fprintf(stderr, "tulip serve: --backend %s: expected auto, cpu or cuda\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--allow-test-shape"))
            p.allow_test_shape = 1;
        else if (!strcmp(a, "--random-weights"))
            p.random_weights = 1;
        else if (!strcmp(a, "--test-mode"))
            p.test_mode = 1;
        else {
            fprintf(stderr, "tulip serve: unknown or incomplete option '%s'\n\n", a);
            serve_usage();
            return 2;
        }
#undef OPT
    }
    if (!p.model_path && !p.random_weights) {
        fprintf(stderr, "tulip serve: --model DIR is required (or --random-weights)\n\n");
        serve_usage();
        return 2;
    }
    if (p.port < 0 || p.port > 65535) {
        fprintf(stderr, "tulip serve: --port %d is not a TCP port\n", p.port);
        return 2;
    }
    return tl_server_run(&p);
}
