/* tulip tokenize: text on stdin -> token ids, or ids -> text (--decode), for debugging prompts
 * and for the reference tests (--batch: many strings through one process).
 *
 * Batch protocol, one JSON value per input line, one JSON line out per input line:
 *   encode: "text"  or  {"hex": "616263"} (raw bytes, for invalid UTF-8)  ->  [ids...]
 *   decode: [ids...]  ->  {"text": "...", "stream": "..."} where "stream" is the same ids through
 *           the incremental detokenizer (the tests require both to be equal).
 * A line that fails gives {"error": "..."} and the run continues. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "cli/cli.h"
#include "common/buf.h"
#include "common/status.h"
#include "common/util.h"
#include "tokenizer/bpe.h"

/* All of stdin into b (NUL-terminated, and allocated even when stdin is empty; it may hold NULs
 * of its own). 0, or 1 after saying why. */
static int read_stdin(tl_buf *b) {
    char chunk[1 << 14];
    size_t r;
    tl_buf_reserve(b, sizeof chunk);
    while ((r = fread(chunk, 1, sizeof chunk, stdin)) > 0) tl_buf_append(b, chunk, r);
    if (!b->err) return 0;
    fprintf(stderr, "tulip tokenize: %s reading stdin\n", tl_status_str(b->err));
    return 1;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_error_line(const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

static void batch_encode_line(const tl_tokenizer *tok, json_t *v, unsigned flags) {
    char *bytes = NULL;
    size_t len = 0;
    if (json_is_string(v)) {
        len = json_string_length(v);
        bytes = xmalloc(len + 1);
        memcpy(bytes, json_string_value(v), len);
    } else if (json_is_string(json_object_get(v, "hex"))) {
        const char *h = json_string_value(json_object_get(v, "hex"));
        size_t hl = strlen(h);
        bytes = xmalloc(hl / 2 + 1);
        for (size_t i = 0; i + 1 < hl; i += 2) {
            int a = hexval(h[i]), b = hexval(h[i + 1]);
            if (a < 0 || b < 0) {
                free(bytes);
                put_error_line("bad hex");
                return;
            }
            bytes[len++] = (char)(a * 16 + b);
        }
    } else {
        put_error_line("expected a string or {\"hex\": ...}");
        return;
    }
    tl_tok_ids ids = {0};
    int n = tl_tokenize(tok, bytes, len, flags, &ids);
    free(bytes);
    if (n < 0) {
        put_error_line(tl_status_str(n));
        return;
    }
    putchar('[');
    for (size_t i = 0; i < ids.n; i++) printf(i ? ",%d" : "%d", ids.ids[i]);
    printf("]\n");
    tl_tok_ids_free(&ids);
}

/* ids[0..n) through the incremental detokenizer, the pieces concatenated into out (a failing
 * push ends the pieces; the flush still runs). 0, or non-zero when the stream could not be
 * made or out ran out of memory. */
static int stream_decode(const tl_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                         tl_buf *out) {
    tl_detok_stream *ds;
    if (tl_detok_stream_create(tok, flags, &ds)) return 1;
    const char *piece;
    size_t pl;
    tl_buf_append(out, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (tl_detok_stream_push(ds, ids[i], &piece, &pl)) break;
        tl_buf_append(out, piece, pl);
    }
    if (tl_detok_stream_flush(ds, &piece, &pl) == 0) tl_buf_append(out, piece, pl);
    tl_detok_stream_free(ds);
    return out->err;
}

static void batch_decode_line(const tl_tokenizer *tok, json_t *v, unsigned flags) {
    if (!json_is_array(v)) {
        put_error_line("expected a list of ids");
        return;
    }
    size_t n = json_array_size(v);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
        ids[i] = x < 0 || x > INT32_MAX ? -1 : (int32_t)x;
    }
    char *text;
    size_t tl;
    int st = tl_detokenize(tok, ids, n, flags, &text, &tl);
    if (st) {
        free(ids);
        put_error_line(tl_status_str(st));
        return;
    }
    tl_buf stream = {0};
    int sst = stream_decode(tok, ids, n, flags, &stream);
    json_t *o = json_object();
    json_object_set_new(o, "text", json_stringn(text, tl));
    json_object_set_new(o, "stream", sst ? json_null() : json_stringn(stream.p, stream.n));
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    printf("%s\n", s ? s : "{\"error\":\"output is not UTF-8\"}");
    free(s);
    json_decref(o);
    free(text);
    tl_buf_free(&stream);
    free(ids);
}

/* Benchmark: load time of PATH and single-thread encode speed on FILE, cold then warm word cache
 * (the cache is per tokenizer, so a second pass over the same text is mostly hits). */
static double cpu_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_bench(const char *path, const char *file) {
    char err[512], *data;
    size_t len;
    if (tl_read_file(file, &data, &len, err, sizeof err)) {
        fprintf(stderr, "tulip tokenize: %s\n", err);
        return 1;
    }
    double best_load = 1e9, best_cpu = 1e9;
    tl_tokenizer *tok = NULL;
    for (int r = 0; r < 3; r++) {
        double t0 = tl_time_s(), c0 = cpu_time_s();
        if (tl_tokenizer_load(path, &tok, err, sizeof err)) {
            fprintf(stderr, "tulip tokenize: %s\n", err);
            free(data);
            return 1;
        }
        double dt = tl_time_s() - t0, dc = cpu_time_s() - c0;
        if (dt < best_load) best_load = dt;
        if (dc < best_cpu) best_cpu = dc;
        if (r < 2) tl_tokenizer_free(tok);
    }
    printf("load %s: %.3f s wall, %.3f s cpu (best of 3), %d ids\n", path, best_load, best_cpu,
           tl_tokenizer_n_vocab(tok));
    /* passes 1-3 time the encoder (the segment cache off; the word cache warms up after pass
     * 1), pass 4 the same text again with the segment cache on and filled by one encode */
    tl_tok_seg_stats cs;
    tl_tokenizer_seg_cache_stats(tok, &cs);
    tl_tokenizer_set_seg_cache(tok, 0);
    for (int pass = 0; pass < 4; pass++) {
        tl_tok_ids ids = {0};
        if (pass == 3) {
            tl_tokenizer_set_seg_cache(tok, cs.budget);
            tl_tokenize(tok, data, len, 0, &ids);
            ids.n = 0;
        }
        double t0 = tl_time_s(), c0 = cpu_time_s();
        int n = tl_tokenize(tok, data, len, 0, &ids);
        double dt = tl_time_s() - t0, dc = cpu_time_s() - c0;
        if (n < 0) {
            fprintf(stderr, "tulip tokenize: %s\n", tl_status_str(n));
            tl_tok_ids_free(&ids);
            break;
        }
        printf("encode pass %d%s: %zu bytes -> %d tokens in %.3f s wall = %.1f MB/s (cpu %.3f s "
               "= %.1f MB/s)\n",
               pass + 1, pass == 3 ? " (segment cache hit)" : "", len, n, dt, len / dt / 1e6, dc,
               len / dc / 1e6);
        tl_tok_ids_free(&ids);
    }
    tl_tokenizer_free(tok);
    free(data);
    return 0;
}

static int run_batch(const tl_tokenizer *tok, int decode, unsigned flags) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (n && line[n - 1] == '\n') line[--n] = 0;
        if (!n) continue;
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) {
            put_error_line(je.text);
        } else if (decode) {
            batch_decode_line(tok, v, flags);
        } else {
            batch_encode_line(tok, v, flags);
        }
        json_decref(v);
        fflush(stdout);
    }
    free(line);
    return 0;
}

/* The token ids in text (separated by spaces, commas, newlines or brackets), each appended to
 * ids as one int32_t. 0, or 1 after naming the bad id. */
static int parse_ids(const tl_tokenizer *tok, const char *p, tl_buf *ids) {
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' ||
               *p == ']')
            p++;
        if (!*p) return 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= tl_tokenizer_n_vocab(tok)) {
            fprintf(stderr, "tulip tokenize: bad token id near \"%.20s\" (ids are 0..%d)\n", p,
                    tl_tokenizer_n_vocab(tok) - 1);
            return 1;
        }
        int32_t id = (int32_t)v;
        tl_buf_append(ids, &id, sizeof id);
        p = end;
    }
}

/* ids (int32_t values; malloc'd memory is aligned for them) -> text on stdout. 0, or 1 after
 * saying why. */
static int write_text(const tl_tokenizer *tok, const tl_buf *ids, unsigned flags) {
    char *text;
    size_t tl;
    int st = ids->err ? ids->err
                      : tl_detokenize(tok, (const int32_t *)ids->p, ids->n / sizeof(int32_t), flags,
                                      &text, &tl);
    if (st) {
        fprintf(stderr, "tulip tokenize: %s\n", tl_status_str(st));
        return 1;
    }
    fwrite(text, 1, tl, stdout);
    free(text);
    return 0;
}

/* Ids on stdin -> text on stdout. */
static int run_decode(const tl_tokenizer *tok, unsigned flags) {
    tl_buf in = {0}, ids = {0};
    int rc = read_stdin(&in);
    if (!rc) rc = parse_ids(tok, in.p, &ids);
    if (!rc) rc = write_text(tok, &ids, flags);
    tl_buf_free(&in);
    tl_buf_free(&ids);
    return rc;
}

typedef struct tokenize_opts {
    const char *path, *bench;
    int decode, batch, count, split_special, skip_special;
} tokenize_opts;

/* Options -> o. Returns TL_CLI_CONTINUE or the exit status. */
static int tokenize_parse(tokenize_opts *o, int argc, char **argv) {
    tl_opt opts[] = {
        TL_OPT_STR("tokenizer", 0, &o->path, "PATH",
                   "tokenizer.json, or a checkpoint directory containing one"),
        TL_OPT_FLAG("decode", 0, &o->decode,
                    "ids on stdin (spaces, commas or newlines) -> text on stdout"),
        TL_OPT_FLAG("batch", 0, &o->batch, "one JSON value per line (see src/cli/tokenize.c)"),
        TL_OPT_FLAG("split-special", 0, &o->split_special,
                    "special added tokens in the text are tokenized as plain text"),
        TL_OPT_FLAG("skip-special", 0, &o->skip_special, "--decode drops special tokens"),
        TL_OPT_FLAG("count", 0, &o->count, "print only the number of tokens"),
        TL_OPT_STR("bench", 0, &o->bench, "FILE",
                   "time loading and encoding FILE (one core), report MB/s"),
    };
    tl_cli_cmd cmd = {.name = "tokenize",
                      .id = TL_CMD_TOKENIZE,
                      .synopsis = "--tokenizer PATH [--decode] [--batch] [--split-special] "
                                  "[--skip-special] [--count]",
                      .about = "By default UTF-8 text on stdin -> ids on one line, separated by "
                               "spaces.\n",
                      .opts = opts,
                      .n_opts = TL_CLI_NOPTS(opts)};
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!o->path) return tl_cli_usage_error(&cmd, "--tokenizer PATH is required");
    return TL_CLI_CONTINUE;
}

/* Text on stdin -> ids (or their count) on stdout. */
static int run_encode(const tl_tokenizer *tok, unsigned flags, int count) {
    tl_buf in = {0};
    if (read_stdin(&in)) return 1;
    tl_tok_ids ids = {0};
    int n = tl_tokenize(tok, in.p, in.n, flags, &ids), rc = 0;
    tl_buf_free(&in);
    if (n < 0) {
        fprintf(stderr, "tulip tokenize: %s\n", tl_status_str(n));
        rc = 1;
    } else if (count) {
        printf("%zu\n", ids.n);
    } else {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
    }
    tl_tok_ids_free(&ids);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_opts o = {0};
    int rc = tokenize_parse(&o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    unsigned eflags = o.split_special ? TL_TOKENIZE_SPLIT_SPECIAL : 0;
    unsigned dflags = o.skip_special ? TL_DETOK_SKIP_SPECIAL : 0;
    const char *path = o.path, *bench = o.bench;
    if (bench) return run_bench(path, bench);
    char err[512];
    tl_tokenizer *tok;
    int st = tl_tokenizer_load(path, &tok, err, sizeof err);
    if (st) {
        fprintf(stderr, "tulip tokenize: %s\n", err);
        if (st == TL_ERR_IO)
            fprintf(stderr,
                    "hint: PATH is a tokenizer.json file or a checkpoint directory that has one\n");
        return 1;
    }
    if (o.batch)
        rc = run_batch(tok, o.decode, o.decode ? dflags : eflags);
    else if (o.decode)
        rc = run_decode(tok, dflags);
    else
        rc = run_encode(tok, eflags, o.count);
    tl_tokenizer_free(tok);
    return rc;
}
