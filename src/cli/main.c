/* tulip: subcommand dispatch. Each subcommand is defined in its own file; a build that lacks one
 * (weak symbol left NULL) says so instead of failing to link. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"

#pragma weak cmd_info
#pragma weak cmd_run
#pragma weak cmd_chat
#pragma weak cmd_serve
#pragma weak cmd_bench
#pragma weak cmd_quantize
#pragma weak cmd_tokenize
#pragma weak cmd_prompt

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} subcmd;

static void usage(const subcmd *cmds, int n) {
    fprintf(stderr,
            "usage: tulip <command> [options]   (tulip <command> --help for its options)\n"
            "       tulip --version                (version, git commit, CUDA architecture)\n\n");
    for (int i = 0; i < n; i++) fprintf(stderr, "  %-10s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv) {
    const subcmd cmds[] = {
        {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
        {"run", cmd_run, "generate from one prompt"},
        {"chat", cmd_chat, "interactive chat"},
        {"bench", cmd_bench, "prefill/decode benchmark (docs/developing.md §6 protocol)"},
        {"quantize", cmd_quantize, "write a 4-bit MLX-format checkpoint from a BF16 one"},
        {"info", cmd_info, "print what a checkpoint contains"},
        {"tokenize", cmd_tokenize, "text on stdin -> token ids (--decode: ids -> text)"},
        {"prompt", cmd_prompt, "render a chat prompt exactly as the model sees it"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc == 2 &&
        (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")))
        return cmd_version(argc - 1, argv + 1);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(cmds, n);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        if (!cmds[i].fn) {
            fprintf(stderr, "tulip: '%s' is not part of this build\n", cmds[i].name);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "tulip: unknown command '%s'\n\n", argv[1]);
    usage(cmds, n);
    return 2;
}
