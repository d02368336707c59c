/* tokenizer.json -> tl_tokenizer (bpe_priv.h): the scanner's result (tokjson.c) is checked and
 * turned into the tables bpe.c encodes with, in the order HF builds them: the normalizer, the
 * model (id space, id -> bytes, bytes -> id, merges, byte tokens, the added-token tries), the
 * pre-tokenizer regex (bpe_regex.c), then the decoder and post-processor are checked. Anything
 * HF does that we do not is refused with TL_ERR_UNSUPPORTED and a message naming it. Also
 * tl_tokenizer_free. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include "common/buf.h"
#include "common/status.h"
#include "common/utf8.h"
#include "common/util.h"
#include "tokenizer/bpe_priv.h"
#include "tokenizer/tokjson.h"

/* ====== Normalizer and pre-tokenizer. ====== */

static int is_type(json_t *o, const char *type) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) && !strcmp(json_string_value(ty), type);
}

static const char *type_of(json_t *o) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : "(none)";
}

static int jbool(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static int load_normalizer(tl_tokenizer *t, json_t *n, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    if (is_type(n, "NFC")) {
        t->nfc = 1;
        return 0;
    }
    if (is_type(n, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *e;
        if (!json_is_array(list))
            return tl_errf(err, errlen, TL_ERR_FORMAT, "normalizer Sequence without a list");
        json_array_foreach(list, i, e) {
            if (!is_type(e, "NFC") || t->nfc)
                return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                               "normalizer %s in a Sequence (only one NFC is supported)",
                               type_of(e));
            t->nfc = 1;
        }
        return 0;
    }
    return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "normalizer %s (only NFC is supported)",
                   type_of(n));
}

static int bytelevel_ok(json_t *b, int want_regex, char *err, size_t errlen) {
    if (jbool(b, "add_prefix_space"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "ByteLevel pre-tokenizer with add_prefix_space");
    json_t *ur = json_object_get(b, "use_regex");
    int use_regex = ur ? json_is_true(ur) : 1; /* HF default: true */
    if (use_regex != want_regex)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "ByteLevel pre-tokenizer with use_regex=%s here",
                       use_regex ? "true" : "false");
    return 0;
}

static int load_pretokenizer(tl_tokenizer *t, json_t *p, char *err, size_t errlen) {
    if (!p || json_is_null(p))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "no pre_tokenizer (byte-level BPE needs one)");
    if (is_type(p, "ByteLevel")) {
        int st = bytelevel_ok(p, 1, err, errlen);
        return st ? st : bpe_regex_compile(t, BPE_GPT2_REGEX, 0, err, errlen);
    }
    if (!is_type(p, "Sequence"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "pre_tokenizer %s", type_of(p));
    json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
        return tl_errf(err, errlen, TL_ERR_FORMAT, "pre_tokenizer Sequence without a list");
    size_t n = json_array_size(list);
    if (n == 1 && is_type(json_array_get(list, 0), "ByteLevel"))
        return load_pretokenizer(t, json_array_get(list, 0), err, errlen);
    if (n != 2 || !is_type(json_array_get(list, 0), "Split") ||
        !is_type(json_array_get(list, 1), "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "pre_tokenizer Sequence other than [Split, ByteLevel]");
    json_t *sp = json_array_get(list, 0);
    int st = bytelevel_ok(json_array_get(list, 1), 0, err, errlen);
    if (st) return st;
    json_t *beh = json_object_get(sp, "behavior");
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "Split behavior %s (only Isolated)",
                       json_is_string(beh) ? json_string_value(beh) : "(none)");
    if (jbool(sp, "invert"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "Split with invert=true");
    json_t *pat = json_object_get(sp, "pattern");
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (json_is_string(rx)) return bpe_regex_compile(t, json_string_value(rx), 0, err, errlen);
    if (json_is_string(lit)) return bpe_regex_compile(t, json_string_value(lit), 1, err, errlen);
    return tl_errf(err, errlen, TL_ERR_FORMAT, "Split pattern is neither Regex nor String");
}

/* ====== Byte-level alphabet. ======
 * GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 map to U+0100.. in
 * byte order, so every byte has a visible character. */

static void bytelevel_tables(uint32_t b2u[256], int16_t u2b[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

/* Decodes a vocabulary string from its byte-level form into raw bytes (appended to out).
 * Returns 1 if every character was in the alphabet, 0 if not (then the raw UTF-8 of s was
 * appended instead, which is what HF's ByteLevel decoder does). */
static int bytelevel_decode(const int16_t u2b[324], const char *s, size_t n, tl_buf *out) {
    size_t start = out->n, i = 0, k;
    while (i < n) {
        uint32_t cp;
        if (tl_utf8_decode(s + i, n - i, &cp, &k) != TL_UTF8_OK || cp >= 324 || u2b[cp] < 0) {
            tl_buf_truncate(out, start);
            tl_buf_append(out, s, n);
            return 0;
        }
        tl_buf_putc(out, (char)u2b[cp]);
        i += k;
    }
    return 1;
}

/* ====== The model. ====== */

/* Byte-level vocabulary string -> id over the parsed entries (open addressing, index + 1).
 * A key given twice keeps the later id, as HF's HashMap does. */
typedef struct {
    const tokjson *j;
    uint32_t *slot;
    size_t cap;
} bl_map;

static int bl_map_build(bl_map *m, const tokjson *j) {
    m->j = j;
    m->cap = 16;
    while (m->cap < 2 * j->n_vocab + 16) m->cap *= 2;
    m->slot = calloc(m->cap, sizeof *m->slot);
    if (!m->slot) return TL_ERR_NOMEM;
    for (size_t e = 0; e < j->n_vocab; e++) {
        const char *s = j->strs.p + j->vocab[e].off;
        size_t n = j->vocab[e].len, i = bpe_hash_bytes(s, n) & (m->cap - 1);
        for (;;) {
            uint32_t v = m->slot[i];
            if (!v ||
                (j->vocab[v - 1].len == n && !memcmp(j->strs.p + j->vocab[v - 1].off, s, n))) {
                m->slot[i] = (uint32_t)e + 1;
                break;
            }
            i = (i + 1) & (m->cap - 1);
        }
    }
    return 0;
}

static int32_t bl_map_find(const bl_map *m, const char *s, size_t n) {
    size_t i = bpe_hash_bytes(s, n) & (m->cap - 1);
    for (;;) {
        uint32_t v = m->slot[i];
        if (!v) return -1;
        const vocab_ent *e = &m->j->vocab[v - 1];
        if (e->len == n && !memcmp(m->j->strs.p + e->off, s, n)) return (int32_t)e->id;
        i = (i + 1) & (m->cap - 1);
    }
}

static int load_merges(tl_tokenizer *t, const tokjson *j, const bl_map *bm, char *err,
                       size_t errlen) {
    size_t n = j->n_merges;
    t->mcap = 16;
    while (t->mcap < 2 * n + 16) t->mcap *= 2;
    t->mkey = malloc(t->mcap * sizeof *t->mkey);
    t->mval = malloc(t->mcap * sizeof *t->mval);
    if (!t->mkey || !t->mval) return TL_ERR_NOMEM;
    memset(t->mkey, 0xff, t->mcap * sizeof *t->mkey);
    tl_buf cat = {0};
    int st = 0;
    for (size_t i = 0; i < n; i++) {
        const merge_ent *m = &j->merges[i];
        const char *a = j->strs.p + m->a, *b = j->strs.p + m->b;
        tl_buf_truncate(&cat, 0);
        if (tl_buf_append(&cat, a, m->la) || tl_buf_append(&cat, b, m->lb)) {
            st = TL_ERR_NOMEM;
            break;
        }
        int32_t ia = bl_map_find(bm, a, m->la), ib = bl_map_find(bm, b, m->lb);
        int32_t in = bl_map_find(bm, cat.p ? cat.p : "", cat.n);
        if (ia < 0 || ib < 0 || in < 0) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "merge %zu (\"%.*s\" \"%.*s\"): %s token not in the vocab", i,
                         (int)TL_MIN(m->la, 40), a, (int)TL_MIN(m->lb, 40), b,
                         ia < 0   ? "left"
                         : ib < 0 ? "right"
                                  : "merged");
            break;
        }
        bpe_merge_insert(t, ia, ib, (uint32_t)i, in);
    }
    tl_buf_free(&cat);
    return st;
}

typedef struct {
    int32_t id;
    const char *content;
    int special, normalized;
} added_def;

/* model.type BPE without dropout, byte_fallback or subword prefix/suffix. */
static int model_options(tl_tokenizer *t, json_t *model, char *err, size_t errlen) {
    json_t *ty = json_object_get(model, "type");
    if (ty && !is_type(model, "BPE"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "model type %s (only BPE)", type_of(model));
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE dropout");
    if (jbool(model, "byte_fallback"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE byte_fallback");
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(model, keys[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "BPE %s", keys[k]);
    }
    t->ignore_merges = jbool(model, "ignore_merges");
    t->fuse_unk = jbool(model, "fuse_unk");
    return 0;
}

/* added_tokens into *defs (malloc'd, *n entries, the caller frees); *max_id grows to cover their
 * ids. */
static int read_added(json_t *root, added_def **defs, size_t *n, int64_t *max_id, char *err,
                      size_t errlen) {
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return tl_errf(err, errlen, TL_ERR_FORMAT, "added_tokens is not a list");
    *n = json_array_size(added);
    added_def *d = *defs = calloc(*n ? *n : 1, sizeof *d);
    if (!d) return TL_ERR_NOMEM;
    for (size_t i = 0; i < *n; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 30) || !json_is_string(content))
            return tl_errf(err, errlen, TL_ERR_FORMAT,
                           "added_tokens[%zu] needs an id and a content", i);
        if (jbool(a, "lstrip") || jbool(a, "rstrip") || jbool(a, "single_word"))
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                           "added token \"%.40s\" with lstrip/rstrip/single_word",
                           json_string_value(content));
        d[i].id = (int32_t)json_integer_value(id);
        d[i].content = json_string_value(content);
        d[i].special = jbool(a, "special");
        json_t *norm = json_object_get(a, "normalized");
        d[i].normalized = norm ? json_is_true(norm) : !d[i].special; /* HF default */
        if (d[i].id > *max_id) *max_id = d[i].id;
    }
    return 0;
}

/* The arena of decoded bytes: vstr[id] (vlen[id] bytes, NULL for a hole) from its byte-level
 * form; mapped[id] = 1 when all of it was in the byte-level alphabet. */
static int build_arena(tl_tokenizer *t, const char **vstr, const size_t *vlen, uint8_t *mapped,
                       char *err, size_t errlen) {
    uint32_t b2u[256];
    int16_t u2b[324];
    bytelevel_tables(b2u, u2b);
    size_t nv = (size_t)t->n_vocab;
    tl_buf arena = {0};
    int st = 0;
    for (size_t id = 0; id < nv; id++) {
        t->off[id] = (uint32_t)arena.n;
        if (!vstr[id]) continue;
        t->present[id] = 1;
        mapped[id] = (uint8_t)bytelevel_decode(u2b, vstr[id], vlen[id], &arena);
        if (arena.n > UINT32_MAX / 2) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "vocabulary too large");
            break;
        }
    }
    t->off[nv] = (uint32_t)arena.n;
    t->arena = tl_buf_take(&arena, NULL);
    return st ? st : t->arena ? 0 : TL_ERR_NOMEM;
}

/* id -> bytes. The string each id stands for is the last vocab entry with that id whose key was
 * not given again later (the one bm keeps), or the added token. */
static int build_id_bytes(tl_tokenizer *t, const tokjson *j, const bl_map *bm,
                          const added_def *defs, size_t n_added, uint8_t *mapped, char *err,
                          size_t errlen) {
    size_t nv = (size_t)t->n_vocab;
    const char **vstr = calloc(nv ? nv : 1, sizeof *vstr);
    size_t *vlen = calloc(nv ? nv : 1, sizeof *vlen);
    t->off = calloc(nv + 1, sizeof *t->off);
    t->flags = calloc(nv ? nv : 1, 1);
    t->present = calloc(nv ? nv : 1, 1);
    int st = vstr && vlen && t->off && t->flags && t->present ? 0 : TL_ERR_NOMEM;
    for (size_t i = 0; !st && i < bm->cap; i++) {
        if (!bm->slot[i]) continue;
        const vocab_ent *e = &j->vocab[bm->slot[i] - 1];
        vstr[e->id] = j->strs.p + e->off;
        vlen[e->id] = e->len;
    }
    for (size_t i = 0; !st && i < n_added; i++) {
        vstr[defs[i].id] = defs[i].content;
        vlen[defs[i].id] = strlen(defs[i].content);
        t->flags[defs[i].id] = (uint8_t)(TOKF_ADDED | (defs[i].special ? TOKF_SPECIAL : 0));
    }
    if (!st) st = build_arena(t, vstr, vlen, mapped, err, errlen);
    free(vstr);
    free(vlen);
    return st;
}

/* Raw bytes -> id for vocabulary tokens (added tokens are found through the tries); tokens whose
 * string was byte-level win over the others with the same bytes. */
static int build_vocab_hash(tl_tokenizer *t, const uint8_t *mapped) {
    size_t nv = (size_t)t->n_vocab;
    t->vcap = 16;
    while (t->vcap < 2 * nv + 16) t->vcap *= 2;
    t->vhash = calloc(t->vcap, sizeof *t->vhash);
    if (!t->vhash) return TL_ERR_NOMEM;
    for (int pass = 0; pass < 2; pass++)
        for (size_t id = 0; id < nv; id++)
            if (t->present[id] && !(t->flags[id] & TOKF_ADDED) && mapped[id] == !pass &&
                t->off[id + 1] > t->off[id])
                bpe_vocab_insert(t, (int32_t)id);
    return 0;
}

/* The token of each single byte, and the unknown token. */
static void byte_tokens(tl_tokenizer *t, const bl_map *bm, json_t *model) {
    uint32_t b2u[256];
    int16_t u2b[324];
    bytelevel_tables(b2u, u2b);
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t ul = tl_utf8_encode(b2u[b], u);
        t->byte_id[b] = bl_map_find(bm, (const char *)u, ul);
    }
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk))
        t->unk_id = bl_map_find(bm, json_string_value(unk), json_string_length(unk));
}

/* The added-token tries; normalized added tokens are matched in NFC text, so their content is
 * NFC'd too. */
static int build_tries(tl_tokenizer *t, const added_def *defs, size_t n_added, char *err,
                       size_t errlen) {
    trie_item *raw = calloc(n_added + 1, sizeof *raw), *norm = calloc(n_added + 1, sizeof *norm);
    char **owned = calloc(n_added + 1, sizeof *owned);
    size_t nr = 0, nn = 0;
    int st = raw && norm && owned ? 0 : TL_ERR_NOMEM;
    for (size_t i = 0; i < n_added && !st; i++) {
        const char *c = defs[i].content;
        size_t cl = strlen(c);
        if (!cl) continue;
        if (defs[i].normalized && t->nfc) {
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t ol = utf8proc_map((const uint8_t *)c, (utf8proc_ssize_t)cl, &o,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (ol < 0) {
                st = tl_errf(err, errlen, TL_ERR_FORMAT, "added token \"%.40s\": bad UTF-8", c);
                break;
            }
            owned[i] = (char *)o;
            norm[nn++] = (trie_item){(char *)o, (size_t)ol, defs[i].id};
        } else {
            trie_item it = {c, cl, defs[i].id};
            if (defs[i].normalized)
                norm[nn++] = it;
            else
                raw[nr++] = it;
        }
    }
    if (!st) st = bpe_trie_build(&t->added_raw, raw, nr);
    if (!st) st = bpe_trie_build(&t->added_norm, norm, nn);
    for (size_t i = 0; owned && i < n_added; i++) free(owned[i]);
    free(owned);
    free(raw);
    free(norm);
    return st;
}

static int load_model(tl_tokenizer *t, const tokjson *j, char *err, size_t errlen) {
    int st = model_options(t, j->model, err, errlen);
    if (st) return st;
    int64_t max_id = -1; /* the id space: vocab ids and added-token ids */
    for (size_t e = 0; e < j->n_vocab; e++)
        if (j->vocab[e].id > max_id) max_id = j->vocab[e].id;
    added_def *defs = NULL;
    size_t n_added = 0;
    bl_map bm = {0};
    uint8_t *mapped = NULL;
    st = read_added(j->root, &defs, &n_added, &max_id, err, errlen);
    if (!st) {
        t->n_vocab = (int)(max_id + 1);
        st = bl_map_build(&bm, j);
    }
    if (!st && !(mapped = calloc(t->n_vocab ? (size_t)t->n_vocab : 1, 1))) st = TL_ERR_NOMEM;
    if (!st) st = build_id_bytes(t, j, &bm, defs, n_added, mapped, err, errlen);
    if (!st) st = build_vocab_hash(t, mapped);
    if (!st) st = load_merges(t, j, &bm, err, errlen);
    if (!st) {
        byte_tokens(t, &bm, j->model);
        st = build_tries(t, defs, n_added, err, errlen);
    }
    free(mapped);
    free(bm.slot);
    free(defs);
    return st;
}

/* ====== Entry points. ====== */

static int load_root(tl_tokenizer *t, const tokjson *j, char *err, size_t errlen) {
    json_t *root = j->root;
    /* the normalizer first: load_model NFCs the content of normalized added tokens */
    int st = load_normalizer(t, json_object_get(root, "normalizer"), err, errlen);
    if (!st) st = load_model(t, j, err, errlen);
    if (!st) st = load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), err, errlen);
    if (st) return st;
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && !is_type(dec, "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "decoder %s (only ByteLevel)",
                       type_of(dec));
    json_t *post = json_object_get(root, "post_processor");
    if (post && !json_is_null(post) && !is_type(post, "ByteLevel"))
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "post_processor %s (only ByteLevel or none)", type_of(post));
    return 0;
}

/* Builds the tokenizer from j unless reading j failed (st); frees j in every case. */
static int tokenizer_from_tj(tokjson *j, int st, tl_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    tl_tokenizer *t = st ? NULL : calloc(1, sizeof *t);
    if (!t) {
        tokjson_free(j);
        return st ? st : TL_ERR_NOMEM;
    }
    for (int i = 0; i < CACHE_LOCKS; i++) pthread_mutex_init(&t->locks[i], NULL);
    bpe_seg_init(&t->seg, SEG_BUDGET_DEFAULT);
    st = load_root(t, j, err, errlen);
    tokjson_free(j);
    if (!st) {
        t->cache_slots = t->n_vocab > 4096 ? CACHE_SLOTS : 4096;
        t->cache = calloc(t->cache_slots, sizeof *t->cache);
        if (!t->cache) st = TL_ERR_NOMEM;
    }
    if (st) {
        tl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return 0;
}

int tl_tokenizer_load_json(const char *json, size_t len, tl_tokenizer **out, char *err,
                           size_t errlen) {
    tokjson j = {.err = err, .errlen = errlen};
    return tokenizer_from_tj(&j, tokjson_parse(&j, json, len), out, err, errlen);
}

int tl_tokenizer_load_arrays(const tl_tokenizer_arrays *a, tl_tokenizer **out, char *err,
                             size_t errlen) {
    tokjson j = {.err = err, .errlen = errlen};
    const char *rx = a->pre_regex ? a->pre_regex : BPE_QWEN35_REGEX;
    return tokenizer_from_tj(&j, tokjson_from_arrays(&j, a, rx), out, err, errlen);
}

int tl_tokenizer_load(const char *path, tl_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    char *file = NULL;
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        file = xmalloc(n);
        snprintf(file, n, "%s/tokenizer.json", path);
    }
    const char *p = file ? file : path;
    char *data;
    size_t len;
    int st = tl_read_file(p, &data, &len, err, errlen);
    if (!st) {
        char sub[200];
        st = tl_tokenizer_load_json(data, len, out, sub, sizeof sub);
        if (st) tl_errf(err, errlen, st, "%s: %s", p, sub);
        free(data);
    }
    free(file);
    return st;
}

void tl_tokenizer_free(tl_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->flags);
    free(t->present);
    free(t->vhash);
    free(t->mkey);
    free(t->mval);
    bpe_trie_free(&t->added_raw);
    bpe_trie_free(&t->added_norm);
    if (t->re) pcre2_code_free(t->re);
    if (t->re_compat) pcre2_code_free(t->re_compat);
    free(t->cache);
    for (int i = 0; i < CACHE_LOCKS; i++) pthread_mutex_destroy(&t->locks[i]);
    bpe_seg_free(&t->seg);
    free(t);
}
