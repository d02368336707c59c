/* Subcommands of the tulip binary; each lives in its own file under src/cli (or src/server for
 * serve) and returns the process exit status. Shared option helpers are here too. */
#ifndef TL_CLI_H
#define TL_CLI_H

int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_prompt(int argc, char **argv);

#endif
