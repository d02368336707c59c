/* tulip prompt: render a chat prompt exactly as the model would see it (src/tokenizer/chat.c).
 *
 *   tulip prompt --messages FILE.json [--tools FILE.json] [--no-thinking] [--preserve-thinking]
 *                [--no-generation-prompt]
 *       prints the prompt with no extra newline; on a template error prints the template's
 *       message to stderr and exits 1. FILE.json is a messages array, or an object with
 *       "messages" (and "tools", used when --tools is not given). "-" reads stdin.
 *
 *   tulip prompt --batch FILE.jsonl
 *       one case per line: {"messages": [...], "tools": [...], "enable_thinking": bool,
 *       "preserve_thinking": bool, "add_generation_prompt": bool} (all but messages optional;
 *       an absent "tools" key means no tools); writes one line per case:
 *       {"prompt": "..."} or {"error": "..."}. For tests that render hundreds of cases.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "common/status.h"
#include "common/util.h"
#include "tokenizer/chat.h"

static json_t *load_json(const char *path, char *err, size_t errlen) {
    json_error_t je;
    json_t *v;
    if (!strcmp(path, "-"))
        v = json_loadf(stdin, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    else
        v = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) tl_errf(err, errlen, TL_ERR_FORMAT, "%s:%d: %s", path, je.line, je.text);
    return v;
}

/* Reads a JSON bool option of a batch case; absent = def. */
static int opt_bool(const json_t *c, const char *key, int def) {
    const json_t *v = json_object_get(c, key);
    return v ? json_is_true(v) : def;
}

static int run_batch(const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "tulip prompt: cannot open %s\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (n == 1 && line[0] == '\n') continue;
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je), *res = json_object();
        char err[512] = "";
        if (!c || !json_is_object(c)) {
            json_object_set_new(res, "error",
                                json_sprintf("bad case line: %s", c ? "not an object" : je.text));
            rc = 1;
        } else {
            tl_chat_opts o;
            tl_chat_opts_default(&o);
            o.enable_thinking = opt_bool(c, "enable_thinking", 1);
            o.preserve_thinking = opt_bool(c, "preserve_thinking", 0);
            o.add_generation_prompt = opt_bool(c, "add_generation_prompt", 1);
            char *out;
            size_t len;
            if (tl_chat_render(json_object_get(c, "messages"), json_object_get(c, "tools"), &o,
                               &out, &len, err, sizeof err) == 0) {
                json_object_set_new(res, "prompt", json_stringn(out, len));
                free(out);
            } else {
                json_object_set_new(res, "error", json_string(err));
            }
        }
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
        json_decref(res);
        json_decref(c);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

typedef struct prompt_opts {
    const char *msgs_path, *tools_path, *batch;
    int no_think, preserve, no_gen_prompt;
} prompt_opts;

/* Options -> o. Returns TL_CLI_CONTINUE or the exit status. */
static int prompt_parse(prompt_opts *o, int argc, char **argv) {
    tl_opt opts[] = {
        TL_OPT_STR("messages", 0, &o->msgs_path, "FILE.json",
                   "a messages array, or an object with \"messages\" (and \"tools\"); - = stdin"),
        TL_OPT_STR("tools", 0, &o->tools_path, "FILE.json", "a tools array (overrides the file's)"),
        TL_OPT_FLAG("no-thinking", 0, &o->no_think, "enable_thinking=false"),
        TL_OPT_FLAG("preserve-thinking", 0, &o->preserve, "keep the reasoning of earlier turns"),
        TL_OPT_FLAG("no-generation-prompt", 0, &o->no_gen_prompt,
                    "no assistant header at the end (add_generation_prompt=false)"),
        TL_OPT_STR("batch", 0, &o->batch, "FILE.jsonl",
                   "one JSON case per line -> one JSON result per line (src/cli/prompt.c)"),
    };
    tl_cli_cmd cmd = {.name = "prompt",
                      .id = TL_CMD_PROMPT,
                      .synopsis = "--messages FILE.json [--tools FILE.json] [--no-thinking]\n"
                                  "                    [--preserve-thinking] "
                                  "[--no-generation-prompt]\n"
                                  "       tulip prompt --batch FILE.jsonl",
                      .about = "Prints the chat prompt exactly as the model sees it, with no "
                               "newline added.\n",
                      .opts = opts,
                      .n_opts = TL_CLI_NOPTS(opts)};
    int rc = tl_cli_parse(&cmd, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    if (!o->batch && !o->msgs_path)
        return tl_cli_usage_error(&cmd, "--messages FILE.json (or --batch FILE.jsonl) is required");
    return TL_CLI_CONTINUE;
}

/* --messages (and --tools) -> the rendered prompt on stdout. Returns the exit status. */
static int render_one(const prompt_opts *po) {
    tl_chat_opts o;
    tl_chat_opts_default(&o);
    o.enable_thinking = !po->no_think;
    o.preserve_thinking = po->preserve;
    o.add_generation_prompt = !po->no_gen_prompt;
    char err[512];
    json_t *msgs = load_json(po->msgs_path, err, sizeof err), *tools = NULL, *file = msgs;
    if (!msgs) {
        fprintf(stderr, "tulip prompt: %s\n", err);
        return 1;
    }
    if (json_is_object(msgs) && json_object_get(msgs, "messages")) {
        tools = json_incref(json_object_get(file, "tools"));
        msgs = json_object_get(file, "messages");
    }
    if (po->tools_path) {
        json_decref(tools);
        tools = load_json(po->tools_path, err, sizeof err);
        if (!tools) {
            fprintf(stderr, "tulip prompt: %s\n", err);
            json_decref(file);
            return 1;
        }
    }
    char *out;
    size_t len;
    int st = tl_chat_render(msgs, tools, &o, &out, &len, err, sizeof err);
    json_decref(tools);
    json_decref(file);
    if (st) {
        fprintf(stderr, "tulip prompt: %s\n", err);
        return 1;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    return 0;
}

int cmd_prompt(int argc, char **argv) {
    prompt_opts o = {0};
    int rc = prompt_parse(&o, argc, argv);
    if (rc != TL_CLI_CONTINUE) return rc;
    return o.batch ? run_batch(o.batch) : render_one(&o);
}
