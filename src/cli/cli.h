/* Subcommands of the tulip binary; each lives in its own file under src/cli (serve's server in
 * src/server) and returns the process exit status (0 ok, 1 failure, 2 usage error). Their options
 * are tl_opt tables (opts.h); the entries several subcommands share are defined here once, so a
 * name, range and help line mean the same everywhere. */
#ifndef TL_CLI_H
#define TL_CLI_H

#include "cli/opts.h"

int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_prompt(int argc, char **argv);
/* tulip --version (version.c): one line, "tulip VERSION (commit C, ARCH)". */
int cmd_version(int argc, char **argv);
/* What --version prints, for the server's /version: the release, the git commit ("unknown" when
 * built outside git) and "cuda sm_90a" or "cpu only". */
const char *tl_cli_version(void);
const char *tl_cli_commit(void);
const char *tl_cli_arch(void);

#define TL_CLI_OPT_MODEL(d, s)                                                                     \
    TL_OPT_STR("model", s, d, "DIR", "checkpoint directory (config.json + *.safetensors)")
#define TL_CLI_OPT_TOKENIZER(d)                                                                    \
    TL_OPT_STR("tokenizer", 0, d, "PATH",                                                          \
               "tokenizer.json (default: the one in the model directory)")
#define TL_CLI_OPT_BACKEND(d)                                                                      \
    TL_OPT_CHOICE("backend", 0, d, "cpu|cuda|auto", tl_cli_backend_choices,                        \
                  "where the model runs (default auto)")
#define TL_CLI_OPT_THREADS(d)                                                                      \
    TL_OPT_INT("threads", 0, d, "N", 0, 4096, "CPU backend threads (default 0: all cores)")
#define TL_CLI_OPT_ALLOW_TEST_SHAPE(d)                                                             \
    TL_OPT_FLAG("allow-test-shape", 0, d, "accept a model with non-production dimensions (tests)")

/* Sampling: the server's request fields, with the server's ranges (src/server/openai.c). */
#define TL_CLI_OPT_TEMPERATURE(d)                                                                  \
    TL_OPT_FLOAT("temperature", 0, d, "T", 0, 2, "sampling temperature, 0 = greedy")
#define TL_CLI_OPT_TOP_K(d)                                                                        \
    TL_OPT_INT("top-k", 0, d, "K", -1, 1 << 20,                                                    \
               "sample among the K most likely tokens (0, -1: off)")
#define TL_CLI_OPT_TOP_P(d)                                                                        \
    TL_OPT_FLOAT("top-p", 0, d, "P", 0, 1, "sample within probability mass P (1: off)")
#define TL_CLI_OPT_MIN_P(d)                                                                        \
    TL_OPT_FLOAT("min-p", 0, d, "P", 0, 1, "drop tokens below P x the top probability (0: off)")
#define TL_CLI_OPT_PRESENCE(d)                                                                     \
    TL_OPT_FLOAT("presence-penalty", 0, d, "X", -2, 2, "penalty on every token generated so far")
#define TL_CLI_OPT_FREQUENCY(d)                                                                    \
    TL_OPT_FLOAT("frequency-penalty", 0, d, "X", -2, 2,                                            \
                 "penalty per occurrence of a token generated so far")
#define TL_CLI_OPT_REPETITION(d)                                                                   \
    TL_OPT_FLOAT("repetition-penalty", 0, d, "X", 0, 10,                                           \
                 "HF repetition penalty over prompt and output tokens (1: off)")
#define TL_CLI_OPT_SAMPLE_SEED(d) TL_OPT_U64("seed", 0, d, "S", "sampling seed")

#endif
