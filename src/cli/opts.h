/* The one option parser of the tulip subcommands. Each subcommand describes its options in a
 * table of tl_opt (built with the TL_OPT_* macros below, pointing at the variables that receive
 * the values) and calls tl_cli_parse, which runs getopt_long over it: `--opt value` and
 * `--opt=value` both work, long names are never abbreviated, typed values are range-checked, and a
 * usage error names the option and the bad value and gives exit status 2. `--help` (and -h) prints
 * the same table, followed by the TL_* environment switches that affect the subcommand (the one
 * list of them is in env.c), so the help cannot drift from what is parsed. */
#ifndef TL_CLI_OPTS_H
#define TL_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

typedef enum {
    TL_OPTK_FLAG,   /* no value: *(int *)dst = 1 */
    TL_OPTK_STR,    /* const char **dst = the argument */
    TL_OPTK_INT,    /* int *, in lo..hi */
    TL_OPTK_LONG,   /* long *, in lo..hi */
    TL_OPTK_FLOAT,  /* float *, finite, in lo..hi */
    TL_OPTK_DOUBLE, /* double *, finite, in lo..hi */
    TL_OPTK_U64,    /* uint64_t *, decimal, 0..2^64-1 */
    TL_OPTK_CHOICE, /* int *: the value of the tl_opt_choice whose name the argument is */
} tl_opt_kind;

typedef struct tl_opt_choice {
    const char *name;
    int value;
} tl_opt_choice; /* lists end with {NULL, 0} */

typedef struct tl_opt {
    const char *name; /* long name without the dashes, or NULL for a short-only option */
    int short_name;   /* 'n' for -n, or 0 */
    tl_opt_kind kind;
    void *dst;
    const char *metavar; /* the value's name in the help ("N", "DIR"); NULL for flags */
    const char *help;    /* one line for --help */
    double lo, hi;       /* numeric range, inclusive */
    const tl_opt_choice *choices;
} tl_opt;

/* Largest numeric bound meaning "no upper limit" (the type's own limit still applies). */
#define TL_OPT_NOMAX 1e300
/* Options one table may hold (the parser tracks which were given in a 64-bit mask). */
#define TL_CLI_MAX_OPTS 64

/* The subcommands, as bits: which of them a TL_* environment switch affects (env.c). */
enum {
    TL_CMD_RUN = 1u << 0,
    TL_CMD_CHAT = 1u << 1,
    TL_CMD_SERVE = 1u << 2,
    TL_CMD_BENCH = 1u << 3,
    TL_CMD_INFO = 1u << 4,
    TL_CMD_QUANTIZE = 1u << 5,
    TL_CMD_TOKENIZE = 1u << 6,
    TL_CMD_PROMPT = 1u << 7,
};

typedef struct tl_cli_cmd {
    const char *name;     /* "run" */
    unsigned id;          /* its TL_CMD_* bit */
    const char *synopsis; /* printed after "usage: tulip NAME " */
    const char *about;    /* lines printed under the usage line, or NULL */
    const char *notes;    /* lines printed after the options, or NULL */
    tl_opt *opts;
    int n_opts;
    uint64_t given; /* set by tl_cli_parse: bit i = opts[i] was on the command line */
} tl_cli_cmd;

/* tl_cli_parse's answer when the subcommand should go on (any other value is the exit status). */
#define TL_CLI_CONTINUE (-1)

/* Parses argv[1..argc-1] (argv[0] is the subcommand's name) into the table's variables. Returns
 * TL_CLI_CONTINUE, or 0 after printing --help to stdout, or 2 after a usage error on stderr. Every
 * argument must be an option; a value out of range or of the wrong type is an error. */
int tl_cli_parse(tl_cli_cmd *c, int argc, char **argv);

/* Whether the option whose dst is `dst` was given on the command line (after tl_cli_parse). */
int tl_cli_given(const tl_cli_cmd *c, const void *dst);

/* Prints "tulip NAME: <message>" and a pointer to --help on stderr; returns 2 (the usage exit
 * status), for checks made after parsing (a required option missing, two that exclude each
 * other). */
int tl_cli_usage_error(const tl_cli_cmd *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The whole help of a subcommand: usage, about, options, notes, environment switches. */
void tl_cli_print_help(const tl_cli_cmd *c, FILE *f);

/* The TL_* environment switches that affect the subcommands in `cmds` (TL_CMD_* bits), one line
 * each (env.c); prints a line saying so when none does. */
void tl_cli_print_env(FILE *f, unsigned cmds);

/* Table entries. dst is type-checked at compile time: a pointer of the wrong type is an error. */
#define TL_OPT_DST_(T, p) ((void *)(1 ? (p) : (T *)0))
#define TL_OPT_FLAG(n, s, d, h)                                                                    \
    { .name = n, .short_name = s, .kind = TL_OPTK_FLAG, .dst = TL_OPT_DST_(int, d), .help = h }
#define TL_OPT_STR(n, s, d, m, h)                                                                  \
    {                                                                                              \
        .name = n, .short_name = s, .kind = TL_OPTK_STR, .dst = TL_OPT_DST_(const char *, d),      \
        .metavar = m, .help = h                                                                    \
    }
#define TL_OPT_NUM_(k, T, n, s, d, m, l, u, h)                                                     \
    {                                                                                              \
        .name = n, .short_name = s, .kind = k, .dst = TL_OPT_DST_(T, d), .metavar = m, .help = h,  \
        .lo = l, .hi = u                                                                           \
    }
#define TL_OPT_INT(n, s, d, m, l, u, h)    TL_OPT_NUM_(TL_OPTK_INT, int, n, s, d, m, l, u, h)
#define TL_OPT_LONG(n, s, d, m, l, u, h)   TL_OPT_NUM_(TL_OPTK_LONG, long, n, s, d, m, l, u, h)
#define TL_OPT_FLOAT(n, s, d, m, l, u, h)  TL_OPT_NUM_(TL_OPTK_FLOAT, float, n, s, d, m, l, u, h)
#define TL_OPT_DOUBLE(n, s, d, m, l, u, h) TL_OPT_NUM_(TL_OPTK_DOUBLE, double, n, s, d, m, l, u, h)
#define TL_OPT_U64(n, s, d, m, h)          TL_OPT_NUM_(TL_OPTK_U64, uint64_t, n, s, d, m, 0, 0, h)
#define TL_OPT_CHOICE(n, s, d, m, ch, h)                                                           \
    {                                                                                              \
        .name = n, .short_name = s, .kind = TL_OPTK_CHOICE, .dst = TL_OPT_DST_(int, d),            \
        .metavar = m, .help = h, .choices = ch                                                     \
    }

/* Shared choice lists. */
extern const tl_opt_choice tl_cli_backend_choices[]; /* cpu, cuda, auto -> TL_BACKEND_* */
extern const tl_opt_choice tl_cli_state_dtypes[];    /* fp32 -> 0, bf16 -> 1 (state_bf16) */

#define TL_CLI_NOPTS(table) ((int)(sizeof(table) / sizeof((table)[0])))

#endif
