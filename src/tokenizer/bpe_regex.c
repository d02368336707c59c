/* The pre-tokenizer regex. HF tokenizers runs Oniguruma; we run PCRE2 (JIT), so an HF pattern
 * is rewritten until both engines split text alike: `\s` becomes Oniguruma's whitespace set and
 * the Unicode classes \p{L}, \p{M}, \p{N} get the code points PCRE2's older Unicode tables lack.
 * Those extra members cost ~25% of encode speed, so each pattern is compiled twice: t->re
 * without them (nearly all text) and t->re_compat with them, chosen per text by
 * bpe_regex_needs_compat. Also the known Split patterns for GGUF's tokenizer.ggml.pre names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/buf.h"
#include "common/status.h"
#include "common/utf8.h"
#include "tokenizer/bpe_priv.h"

/* ====== Code points PCRE2 classifies differently. ====== */

/* Code points HF's Oniguruma (Unicode 16) has in \p{L}, \p{M}, \p{N} that this PCRE2 (10.42,
 * Unicode 14) leaves unassigned; the rewrite adds them to those classes (\p{Z} agrees). Generated
 * and verified by tools/tok_regex_compat.py; rerun it when either library changes. */
/* PCRE2 Unicode 14.0.0; HF tokenizers' Oniguruma adds L: 9272, M: 93, N: 120, Z: 0 */
static const uint32_t HF_EXTRA_L[][2] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x105C0, 0x105F3},
    {0x10D4A, 0x10D65}, {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240},
    {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5},
    {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11BC0, 0x11BE0},
    {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F},
    {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C},
    {0x18CFF, 0x18CFF}, {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0},
    {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF}};
static const uint32_t HF_EXTRA_M[][2] = {
    {0x897, 0x897},     {0xCF3, 0xCF3},     {0xECE, 0xECE},     {0x10D69, 0x10D6D},
    {0x10EFC, 0x10EFF}, {0x11241, 0x11241}, {0x113B8, 0x113C0}, {0x113C2, 0x113C2},
    {0x113C5, 0x113C5}, {0x113C7, 0x113CA}, {0x113CC, 0x113D0}, {0x113D2, 0x113D2},
    {0x113E1, 0x113E2}, {0x11F00, 0x11F01}, {0x11F03, 0x11F03}, {0x11F34, 0x11F3A},
    {0x11F3E, 0x11F42}, {0x11F5A, 0x11F5A}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x1611E, 0x1612F}, {0x1E08F, 0x1E08F}, {0x1E4EC, 0x1E4EF}, {0x1E5EE, 0x1E5EF}};
static const uint32_t HF_EXTRA_N[][2] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9},
                                         {0x11F50, 0x11F59}, {0x16130, 0x16139}, {0x16D70, 0x16D79},
                                         {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1E4F0, 0x1E4F9},
                                         {0x1E5F1, 0x1E5FA}};

/* Appends the extra ranges of Unicode class name (n bytes) as class items, or returns 0 when the
 * class has none. */
static int regex_extra(const char *name, size_t n, tl_buf *out) {
    const uint32_t(*r)[2];
    size_t nr;
    if (n == 1 && name[0] == 'L')
        r = HF_EXTRA_L, nr = sizeof HF_EXTRA_L / sizeof *HF_EXTRA_L;
    else if (n == 1 && name[0] == 'M')
        r = HF_EXTRA_M, nr = sizeof HF_EXTRA_M / sizeof *HF_EXTRA_M;
    else if (n == 1 && name[0] == 'N')
        r = HF_EXTRA_N, nr = sizeof HF_EXTRA_N / sizeof *HF_EXTRA_N;
    else
        return 0;
    for (size_t i = 0; i < nr; i++) {
        char item[48];
        int k = snprintf(item, sizeof item, "\\x{%X}-\\x{%X}", r[i][0], r[i][1]);
        tl_buf_append(out, item, (size_t)k);
    }
    return 1;
}

/* ====== Rewriting an HF pattern for PCRE2. ======
 * - `\s` is Oniguruma's whitespace set, not PCRE2's (measured, docs/model.md §4.1): outside a class
 * it becomes [\t-\r\x{20}\x{85}\p{Z}], inside a class its members; `\S` outside a class becomes the
 * negated class;
 * - `\p{L}`, `\p{M}`, `\p{N}` (or `\pL`...) get the code points PCRE2's older Unicode lacks:
 *   [\p{L}...] outside a class, the extra items inside; `\P{..}` becomes [^\p{..}...].
 * `\S` or `\P{L}` inside a class has no PCRE2 spelling and is refused. */

typedef struct rw_ctx {
    const char *pat;
    int compat, in_class, *used_extra;
    tl_buf *out;
    char *err;
    size_t errlen;
} rw_ctx;

static const char WS_ITEMS[] = "\\t-\\r\\x{20}\\x{85}\\p{Z}";

/* `\p{..}`, `\pX` or `\P..` at pat[i]; returns the index of its last character, or an error. */
static long rewrite_prop(rw_ctx *x, size_t i) {
    const char *pat = x->pat;
    int neg = pat[i + 1] == 'P';
    const char *name = pat + i + 2, *end = name + 1;
    if (*name == '{') {
        end = strchr(name, '}');
        if (!end)
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "pre-tokenizer regex: unclosed \\p{");
        name++;
        if (*name == '^') neg = !neg, name++;
        end++;
    }
    size_t nl = (size_t)(end - name) - (pat[i + 2] == '{' ? 1 : 0);
    tl_buf item = {0};
    tl_buf_append(&item, "\\p{", 3);
    tl_buf_append(&item, name, nl);
    tl_buf_append(&item, "}", 1);
    int has_extra = x->compat && regex_extra(name, nl, &item), st = item.err;
    *x->used_extra |= has_extra;
    if (!has_extra) {
        tl_buf_append(x->out, pat + i, (size_t)(end - (pat + i)));
    } else if (x->in_class && neg) {
        st = tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                     "pre-tokenizer regex: negated \\p inside a character class");
    } else if (x->in_class) {
        tl_buf_append(x->out, item.p, item.n);
    } else {
        tl_buf_append(x->out, neg ? "[^" : "[", neg ? 2 : 1);
        tl_buf_append(x->out, item.p, item.n);
        tl_buf_append(x->out, "]", 1);
    }
    tl_buf_free(&item);
    return st ? st : (long)(end - pat) - 1;
}

/* A backslash escape other than \p at pat[i] (two characters). */
static int rewrite_escape(rw_ctx *x, size_t i) {
    char d = x->pat[i + 1];
    if (d == 's') {
        if (!x->in_class) tl_buf_append(x->out, "[", 1);
        tl_buf_append(x->out, WS_ITEMS, sizeof WS_ITEMS - 1);
        if (!x->in_class) tl_buf_append(x->out, "]", 1);
    } else if (d == 'S') {
        if (x->in_class)
            return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                           "pre-tokenizer regex: \\S inside a character class");
        tl_buf_append(x->out, "[^", 2);
        tl_buf_append(x->out, WS_ITEMS, sizeof WS_ITEMS - 1);
        tl_buf_append(x->out, "]", 1);
    } else {
        tl_buf_append(x->out, x->pat + i, 2);
    }
    return 0;
}

/* Any other character at pat[i], tracking whether we are inside a [...] class; returns the index
 * of the last character consumed. */
static size_t rewrite_plain(rw_ctx *x, size_t i) {
    const char *pat = x->pat;
    char c = pat[i];
    if (c == '[' && !x->in_class) {
        x->in_class = 1;
        tl_buf_append(x->out, pat + i, 1);
        /* a ']' right after '[' or '[^' is a literal */
        if (pat[i + 1] == '^') tl_buf_append(x->out, pat + ++i, 1);
        if (pat[i + 1] == ']') tl_buf_append(x->out, pat + ++i, 1);
        return i;
    }
    if (c == '[' && x->in_class && pat[i + 1] == ':') { /* POSIX class [:alpha:] */
        const char *e = strstr(pat + i + 2, ":]");
        if (e) {
            tl_buf_append(x->out, pat + i, (size_t)(e + 2 - (pat + i)));
            return (size_t)(e + 1 - pat);
        }
    }
    if (c == ']' && x->in_class) x->in_class = 0;
    tl_buf_append(x->out, &c, 1);
    return i;
}

static int regex_rewrite(const char *pat, int compat, int *used_extra, tl_buf *out, char *err,
                         size_t errlen) {
    rw_ctx x = {pat, compat, 0, used_extra, out, err, errlen};
    for (size_t i = 0; pat[i]; i++) {
        if (pat[i] == '\\' && (pat[i + 1] == 'p' || pat[i + 1] == 'P') && pat[i + 2]) {
            long k = rewrite_prop(&x, i);
            if (k < 0) return (int)k;
            i = (size_t)k;
        } else if (pat[i] == '\\' && pat[i + 1]) {
            int st = rewrite_escape(&x, i);
            if (st) return st;
            i++;
        } else {
            i = rewrite_plain(&x, i);
        }
    }
    return out->err;
}

/* ====== Compiling. ====== */

const char BPE_GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int regex_build(const char *pat, size_t n, int literal, pcre2_code **re, int *jit, char *err,
                       size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    *re = pcre2_compile((PCRE2_SPTR)(pat ? pat : ""), n, opts, &ec, &eo, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tl_errf(err, errlen, TL_ERR_FORMAT, "pre-tokenizer regex at offset %zu: %s",
                       (size_t)eo, (char *)msg);
    }
    *jit = pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

int bpe_regex_compile(tl_tokenizer *t, const char *pat, int literal, char *err, size_t errlen) {
    if (literal) return regex_build(pat, strlen(pat), 1, &t->re, &t->jit, err, errlen);
    tl_buf rw = {0};
    int used = 0;
    int st = regex_rewrite(pat, 0, &used, &rw, err, errlen);
    if (!st) st = regex_build(rw.p, rw.n, 0, &t->re, &t->jit, err, errlen);
    tl_buf_truncate(&rw, 0);
    if (!st) st = regex_rewrite(pat, 1, &used, &rw, err, errlen);
    if (!st && used) st = regex_build(rw.p, rw.n, 0, &t->re_compat, &t->jit_compat, err, errlen);
    tl_buf_free(&rw);
    return st;
}

/* 1 if valid UTF-8 s holds a code point of the HF_EXTRA tables (all are >= U+0897, so only
 * characters of 3 or 4 bytes are decoded). */
int bpe_regex_needs_compat(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0xE0) continue;
        uint32_t cp;
        size_t adv;
        if (tl_utf8_decode(s + i, n - i, &cp, &adv) != TL_UTF8_OK) continue;
        i += adv - 1;
        if (cp < 0x897) continue;
        if (bpe_in_ranges(HF_EXTRA_L, (int)(sizeof HF_EXTRA_L / sizeof *HF_EXTRA_L), cp) ||
            bpe_in_ranges(HF_EXTRA_M, (int)(sizeof HF_EXTRA_M / sizeof *HF_EXTRA_M), cp) ||
            bpe_in_ranges(HF_EXTRA_N, (int)(sizeof HF_EXTRA_N / sizeof *HF_EXTRA_N), cp))
            return 1;
    }
    return 0;
}

/* ====== Known patterns. ====== */

const char BPE_QWEN35_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *tl_bpe_regex_for_pre(const char *pre) {
    if (!pre) return NULL;
    if (!strcmp(pre, "qwen35")) return BPE_QWEN35_REGEX;
    if (!strcmp(pre, "qwen2")) return QWEN2_REGEX;
    return NULL;
}
