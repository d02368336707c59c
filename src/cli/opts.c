/* The subcommands' option parser and help printer (opts.h): a tl_opt table -> getopt_long's
 * option list, typed and range-checked values, usage errors that name the option (exit 2), and
 * the generated --help. */
#include "cli/opts.h"
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "tulip.h"

const tl_opt_choice tl_cli_backend_choices[] = {
    {"cpu", TL_BACKEND_CPU}, {"cuda", TL_BACKEND_CUDA}, {"auto", TL_BACKEND_AUTO}, {NULL, 0}};
const tl_opt_choice tl_cli_state_dtypes[] = {{"fp32", 0}, {"bf16", 1}, {NULL, 0}};

#define LONG_VAL_BASE 0x100 /* getopt_long's val for opts[i] given by its long name: base + i */
#define HELP_COL      32    /* the column option help starts at */

int tl_cli_usage_error(const tl_cli_cmd *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tulip %s: ", c->name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(tulip %s --help lists its options)\n", c->name);
    return 2;
}

/* "--name" or "-n": how the user can spell the option, for messages. */
static const char *opt_spelling(const tl_opt *o, char *buf, size_t n) {
    if (o->name)
        snprintf(buf, n, "--%s", o->name);
    else
        snprintf(buf, n, "-%c", o->short_name);
    return buf;
}

static int bad_value(const tl_cli_cmd *c, const tl_opt *o, const char *v, const char *want) {
    char sp[64];
    return tl_cli_usage_error(c, "bad value '%s' for %s: expected %s", v,
                              opt_spelling(o, sp, sizeof sp), want);
}

/* What a numeric option accepts, in words: "an integer from 0 to 65535", "a number >= 0". */
static const char *want_text(const tl_opt *o, char *buf, size_t n) {
    int integer = o->kind == TL_OPTK_INT || o->kind == TL_OPTK_LONG;
    const char *what = integer ? "an integer" : "a number";
    if (o->kind == TL_OPTK_U64)
        snprintf(buf, n, "an integer from 0 to 18446744073709551615");
    else if (o->hi >= TL_OPT_NOMAX)
        snprintf(buf, n, "%s >= %g", what, o->lo);
    else
        snprintf(buf, n, "%s from %g to %g", what, o->lo, o->hi);
    return buf;
}

static int set_integer(const tl_cli_cmd *c, const tl_opt *o, const char *v) {
    char *end, want[96];
    errno = 0;
    long x = strtol(v, &end, 10);
    int bad = end == v || *end || errno || (double)x < o->lo || (double)x > o->hi;
    if (o->kind == TL_OPTK_INT) {
        bad |= x < -2147483647L - 1 || x > 2147483647L;
        if (!bad) *(int *)o->dst = (int)x;
    } else if (!bad) {
        *(long *)o->dst = x;
    }
    return bad ? bad_value(c, o, v, want_text(o, want, sizeof want)) : 0;
}

static int set_real(const tl_cli_cmd *c, const tl_opt *o, const char *v) {
    char *end, want[96];
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < o->lo || x > o->hi)
        return bad_value(c, o, v, want_text(o, want, sizeof want));
    if (o->kind == TL_OPTK_FLOAT)
        *(float *)o->dst = (float)x;
    else
        *(double *)o->dst = x;
    return 0;
}

static int set_u64(const tl_cli_cmd *c, const tl_opt *o, const char *v) {
    char *end, want[96];
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno || strchr(v, '-'))
        return bad_value(c, o, v, want_text(o, want, sizeof want));
    *(uint64_t *)o->dst = (uint64_t)x;
    return 0;
}

static int set_choice(const tl_cli_cmd *c, const tl_opt *o, const char *v) {
    char want[256];
    size_t k = (size_t)snprintf(want, sizeof want, "one of");
    for (const tl_opt_choice *ch = o->choices; ch->name; ch++) {
        if (!strcmp(v, ch->name)) {
            *(int *)o->dst = ch->value;
            return 0;
        }
        if (k < sizeof want) k += (size_t)snprintf(want + k, sizeof want - k, " %s", ch->name);
    }
    return bad_value(c, o, v, want);
}

static int set_value(const tl_cli_cmd *c, const tl_opt *o, const char *v) {
    switch (o->kind) {
    case TL_OPTK_FLAG:
        *(int *)o->dst = 1;
        return 0;
    case TL_OPTK_STR:
        *(const char **)o->dst = v;
        return 0;
    case TL_OPTK_INT:
    case TL_OPTK_LONG:
        return set_integer(c, o, v);
    case TL_OPTK_FLOAT:
    case TL_OPTK_DOUBLE:
        return set_real(c, o, v);
    case TL_OPTK_U64:
        return set_u64(c, o, v);
    case TL_OPTK_CHOICE:
        return set_choice(c, o, v);
    }
    return 2;
}

/* getopt_long's tables for c: shorts ("+:" = stop at the first non-option, report a missing
 * value as ':'), longs (val = LONG_VAL_BASE + index; "help" = 'h'). */
static void build_getopt(const tl_cli_cmd *c, char *shorts, struct option *longs) {
    int k = 0, n = 0;
    shorts[k++] = '+', shorts[k++] = ':';
    for (int i = 0; i < c->n_opts; i++) {
        const tl_opt *o = &c->opts[i];
        int has_arg = o->kind == TL_OPTK_FLAG ? no_argument : required_argument;
        if (o->short_name) {
            shorts[k++] = (char)o->short_name;
            if (has_arg) shorts[k++] = ':';
        }
        if (o->name) longs[n++] = (struct option){o->name, has_arg, NULL, LONG_VAL_BASE + i};
    }
    shorts[k++] = 'h', shorts[k] = 0;
    longs[n++] = (struct option){"help", no_argument, NULL, 'h'};
    longs[n] = (struct option){NULL, 0, NULL, 0};
}

/* The index of the option getopt_long returned as ch, or -1 (for 'h', help). */
static int opt_index(const tl_cli_cmd *c, int ch) {
    if (ch >= LONG_VAL_BASE) return ch - LONG_VAL_BASE;
    for (int i = 0; i < c->n_opts; i++)
        if (c->opts[i].short_name == ch) return i;
    return -1;
}

/* A usage error getopt_long reported ('?' or ':'); arg is the argument it was looking at. */
static int getopt_error(const tl_cli_cmd *c, int ch, const char *arg) {
    char sp[64];
    int i = optopt ? opt_index(c, optopt) : -1;
    const char *name = i >= 0 ? opt_spelling(&c->opts[i], sp, sizeof sp) : NULL;
    if (ch == ':' && name)
        return tl_cli_usage_error(c, "%s needs a value (%s %s)", name, name,
                                  c->opts[i].metavar ? c->opts[i].metavar : "VALUE");
    if (name && optopt >= LONG_VAL_BASE)
        return tl_cli_usage_error(c, "%s takes no value (in '%s')", name, arg);
    if (optopt == 'h' && ch == '?') return tl_cli_usage_error(c, "--help takes no value");
    if (optopt && optopt < LONG_VAL_BASE)
        return tl_cli_usage_error(c, "unknown option '-%c'", optopt);
    size_t len = strcspn(arg, "=");
    return tl_cli_usage_error(c, "unknown option '%.*s'", (int)len, arg);
}

/* getopt_long accepts unambiguous abbreviations of long names; tulip does not (a later option
 * would change what a script's abbreviation means). arg is what the user typed. */
static int check_not_abbreviated(const tl_cli_cmd *c, const char *name, const char *arg) {
    size_t len = strcspn(arg + 2, "=");
    if (strlen(name) == len && !strncmp(arg + 2, name, len)) return 0;
    return tl_cli_usage_error(c, "unknown option '%.*s' (did you mean --%s?)", (int)len + 2, arg,
                              name);
}

int tl_cli_parse(tl_cli_cmd *c, int argc, char **argv) {
    char shorts[3 * TL_CLI_MAX_OPTS + 8];
    struct option longs[TL_CLI_MAX_OPTS + 2];
    TL_ASSERT(c->n_opts <= TL_CLI_MAX_OPTS);
    build_getopt(c, shorts, longs);
    c->given = 0;
    opterr = 0;
    optind = 0; /* glibc: start over (argv[0] is the subcommand) */
    for (;;) {
        int at = optind ? optind : 1, li = -1;
        optopt = 0;
        int ch = getopt_long(argc, argv, shorts, longs, &li);
        if (ch == -1) break;
        if (ch == '?' || ch == ':') return getopt_error(c, ch, at < argc ? argv[at] : "");
        if (li >= 0 && check_not_abbreviated(c, longs[li].name, argv[at])) return 2;
        int i = opt_index(c, ch);
        if (i < 0) {
            tl_cli_print_help(c, stdout);
            return 0;
        }
        if (set_value(c, &c->opts[i], optarg)) return 2;
        c->given |= (uint64_t)1 << i;
    }
    if (optind < argc) return tl_cli_usage_error(c, "unexpected argument '%s'", argv[optind]);
    return TL_CLI_CONTINUE;
}

int tl_cli_given(const tl_cli_cmd *c, const void *dst) {
    for (int i = 0; i < c->n_opts; i++)
        if (c->opts[i].dst == dst && (c->given >> i & 1)) return 1;
    return 0;
}

/* One help line: "  -m, --model DIR" padded to HELP_COL, then the help text (a name too long for
 * the column gets a line of its own). */
static void print_opt(FILE *f, const char *sh, const char *lng, const char *meta,
                      const char *help) {
    char left[128];
    int n = snprintf(left, sizeof left, "  %s%s%s%s%s%s", sh ? sh : "    ", sh && lng ? ", " : "",
                     lng ? "--" : "", lng ? lng : "", meta ? " " : "", meta ? meta : "");
    if (n >= HELP_COL - 1)
        fprintf(f, "%s\n%*s", left, HELP_COL, "");
    else
        fprintf(f, "%-*s", HELP_COL, left);
    fprintf(f, "%s\n", help);
}

void tl_cli_print_help(const tl_cli_cmd *c, FILE *f) {
    fprintf(f, "usage: tulip %s %s\n", c->name, c->synopsis);
    if (c->about) fprintf(f, "%s", c->about);
    fprintf(f, "\noptions:\n");
    for (int i = 0; i < c->n_opts; i++) {
        const tl_opt *o = &c->opts[i];
        char sh[4] = "";
        if (o->short_name) snprintf(sh, sizeof sh, "-%c", o->short_name);
        print_opt(f, o->short_name ? sh : NULL, o->name, o->metavar, o->help);
    }
    print_opt(f, "-h", "help", NULL, "print this help and exit");
    if (c->notes) fprintf(f, "\n%s", c->notes);
    fprintf(f, "\nenvironment (TL_* switches read by this command):\n");
    tl_cli_print_env(f, c->id);
}
