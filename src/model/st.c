/* safetensors: header parsing with every bound checked, mmap, and a small writer.
 *
 * Parsing goes in phases (header length, header JSON, each tensor entry, overlaps, alignment),
 * and a checkpoint directory's shard index is opened here too (tl_st_set_open).
 * A malformed file must produce an error naming the file, the tensor and the field, never a
 * crash: the header is untrusted input (tests/fuzz/fuzz_st.c fuzzes tl_st_parse). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "model/st.h"

/* ---- dtypes ---- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[TL_DT_COUNT] = {
    [TL_DT_F32] = {"F32", 4},         [TL_DT_F16] = {"F16", 2}, [TL_DT_BF16] = {"BF16", 2},
    [TL_DT_U32] = {"U32", 4},         [TL_DT_I32] = {"I32", 4}, [TL_DT_U8] = {"U8", 1},
    [TL_DT_I8] = {"I8", 1},           [TL_DT_I64] = {"I64", 8}, [TL_DT_U16] = {"U16", 2},
    [TL_DT_I16] = {"I16", 2},         [TL_DT_F64] = {"F64", 8}, [TL_DT_BOOL] = {"BOOL", 1},
    [TL_DT_F8_E4M3] = {"F8_E4M3", 1},
};

size_t tl_dtype_size(tl_dtype t) { return (unsigned)t < TL_DT_COUNT ? dtype_info[t].size : 0; }

const char *tl_dtype_name(tl_dtype t) {
    return (unsigned)t < TL_DT_COUNT ? dtype_info[t].name : "?";
}

int tl_dtype_parse(const char *s, tl_dtype *out) {
    for (int i = 0; i < TL_DT_COUNT; i++)
        if (!strcmp(s, dtype_info[i].name)) {
            *out = (tl_dtype)i;
            return 0;
        }
    return -1;
}

float tl_load_elem(const void *data, tl_dtype t, size_t i) {
    const uint8_t *p = data;
    switch (t) {
    case TL_DT_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case TL_DT_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return tl_bf16_to_f32(h);
    }
    case TL_DT_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return tl_f16_to_f32(h);
    }
    default:
        TL_ASSERT(!"tl_load_elem: not a float dtype");
        return 0;
    }
}

/* ---- parsing: header length -> header JSON -> each tensor entry -> overlaps -> alignment ---- */

static int cmp_begin(const void *a, const void *b) {
    const tl_tensor *x = *(tl_tensor *const *)a, *y = *(tl_tensor *const *)b;
    if (x->data != y->data) return (const uint8_t *)x->data < (const uint8_t *)y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Reads a JSON integer in [0, max] into *out; returns 0 or -1. */
static int json_u64(json_t *v, uint64_t max, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > max) return -1;
    *out = (uint64_t)i;
    return 0;
}

typedef struct st_ctx {
    tl_st_file *f;
    const char *path;
    char *err;
    size_t errlen;
    int misaligned; /* some tensor sits at an address not aligned to its element size */
} st_ctx;

/* Phase 1: the 8-byte little-endian header length, checked against the buffer. Sets f->data
 * and f->data_size to the data section. */
static int st_header_len(st_ctx *x, const uint8_t *b, size_t size, uint64_t *hlen_out) {
    if (size < 8)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", x->path,
                       size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > size - 8)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes): "
                       "truncated or not a safetensors file",
                       x->path, (unsigned long long)hlen, size);
    if (hlen > TL_ST_MAX_HEADER)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: header length %llu is above the %u limit", x->path,
                       (unsigned long long)hlen, TL_ST_MAX_HEADER);
    if (hlen < 2)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: header length %llu: empty header",
                       x->path, (unsigned long long)hlen);
    x->f->data = b + 8 + hlen;
    x->f->data_size = size - 8 - (size_t)hlen;
    *hlen_out = hlen;
    return TL_OK;
}

/* Phase 2: the header JSON (an object; duplicate names rejected). */
static int st_header_json(st_ctx *x, const uint8_t *b, uint64_t hlen, json_t **out) {
    json_error_t je;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: bad JSON header at byte %d: %s",
                       x->path, je.position + 8, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: header is not a JSON object",
                       x->path);
    }
    *out = root;
    return TL_OK;
}

/* "dtype" and "shape" of one entry; *bytes = element count x element size. */
static int st_entry_shape(st_ctx *x, const char *key, json_t *val, tl_tensor *t, uint64_t *bytes) {
    json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape");
    if (!json_is_string(dt))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': dtype: missing or not a string", x->path, key);
    if (tl_dtype_parse(json_string_value(dt), &t->dtype))
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                       "%s: tensor '%s': dtype \"%.32s\" is not supported", x->path, key,
                       json_string_value(dt));
    if (!json_is_array(sh) || json_array_size(sh) > TL_MAX_DIMS)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': shape: expected a list of at most %d dims", x->path, key,
                       TL_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim;
        if (json_u64(json_array_get(sh, (size_t)d), INT64_MAX, &dim))
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s': shape[%d]: expected a non-negative integer", x->path,
                           key, d);
        t->shape[d] = (int64_t)dim;
        if (__builtin_mul_overflow(numel, dim, &numel))
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s': shape: element count overflows", x->path, key);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)tl_dtype_size(t->dtype), bytes))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': shape: byte size overflows", x->path, key);
    return TL_OK;
}

/* "data_offsets" of one entry: inside the data section and as long as the shape needs. */
static int st_entry_offsets(st_ctx *x, const char *key, json_t *val, tl_tensor *t, uint64_t bytes) {
    json_t *off = json_object_get(val, "data_offsets");
    uint64_t beg, end;
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        json_u64(json_array_get(off, 0), INT64_MAX, &beg) ||
        json_u64(json_array_get(off, 1), INT64_MAX, &end) || beg > end)
        return tl_errf(
            x->err, x->errlen, TL_ERR_FORMAT,
            "%s: tensor '%s': data_offsets: expected [begin, end] with 0 <= begin <= end", x->path,
            key);
    if (end > x->f->data_size)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the data section "
                       "(%zu bytes): truncated file?",
                       x->path, key, (unsigned long long)beg, (unsigned long long)end,
                       x->f->data_size);
    if (end - beg != bytes)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets span %llu bytes, shape x %s needs %llu",
                       x->path, key, (unsigned long long)(end - beg), tl_dtype_name(t->dtype),
                       (unsigned long long)bytes);
    t->data = x->f->data + beg;
    t->nbytes = (size_t)bytes;
    if (bytes && (uintptr_t)t->data % tl_dtype_size(t->dtype)) x->misaligned = 1;
    return TL_OK;
}

/* Phase 3: every entry but __metadata__, in header order, into f->tensors and f->names. */
static int st_entries(st_ctx *x, json_t *root) {
    tl_st_file *f = x->f;
    size_t n = json_object_size(root), names_len = 0, npos = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) names_len += strlen(key) + 1;
    f->tensors = xcalloc(n ? n : 1, sizeof *f->tensors);
    f->names = xmalloc(names_len + 1);
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        tl_tensor *t = &f->tensors[f->n_tensors];
        uint64_t bytes = 0;
        if (!json_is_object(val))
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: tensor '%s': expected an object",
                           x->path, key);
        int st = st_entry_shape(x, key, val, t, &bytes);
        if (st || (st = st_entry_offsets(x, key, val, t, bytes))) return st;
        size_t kl = strlen(key);
        memcpy(f->names + npos, key, kl + 1);
        t->name = f->names + npos;
        npos += kl + 1;
        f->n_tensors++;
    }
    return TL_OK;
}

/* Phase 4: sorted by start, each non-empty tensor must end before the next one starts. */
static int st_check_overlaps(st_ctx *x) {
    const tl_st_file *f = x->f;
    int nt = f->n_tensors, st = TL_OK;
    const tl_tensor **order = xmalloc((size_t)(nt ? nt : 1) * sizeof *order);
    for (int i = 0; i < nt; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)nt, sizeof *order, cmp_begin);
    const tl_tensor *prev = NULL;
    for (int i = 0; i < nt && !st; i++) {
        const tl_tensor *t = order[i];
        if (!t->nbytes) continue;
        if (prev && (const uint8_t *)prev->data + prev->nbytes > (const uint8_t *)t->data)
            st = tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets overlap tensor '%s'", x->path, t->name,
                         prev->name);
        prev = t;
    }
    free(order);
    return st;
}

/* Phase 5: writers that do not pad the header (mlx's does not) leave tensors at odd addresses.
 * Consumers read words and floats directly, so such a file gets an aligned private copy: every
 * tensor at a 64-byte boundary of one buffer (costs the file's size in memory and one copy;
 * tl_st_open then releases the mapping). */
static int st_align_copy(st_ctx *x) {
    tl_st_file *f = x->f;
    size_t cap = 64, off = 0;
    for (int i = 0; i < f->n_tensors; i++) cap += (f->tensors[i].nbytes + 63) & ~(size_t)63;
    uint8_t *own = aligned_alloc(64, cap);
    if (!own)
        return tl_errf(x->err, x->errlen, TL_ERR_NOMEM,
                       "%s: out of memory copying %zu bytes of tensor data into alignment", x->path,
                       cap);
    for (int i = 0; i < f->n_tensors; i++) {
        tl_tensor *t = &f->tensors[i];
        if (t->nbytes) memcpy(own + off, t->data, t->nbytes);
        t->data = own + off;
        off += (t->nbytes + 63) & ~(size_t)63;
    }
    f->data = own;
    f->data_size = off;
    f->own = own;
    return TL_OK;
}

int tl_st_parse(tl_st_file *f, const void *buf, size_t size, const char *path, char *err,
                size_t errlen) {
    memset(f, 0, sizeof *f);
    st_ctx x = {f, path, err, errlen, 0};
    uint64_t hlen = 0;
    json_t *root = NULL;
    int st = st_header_len(&x, buf, size, &hlen);
    if (!st) st = st_header_json(&x, buf, hlen, &root);
    if (!st) st = st_entries(&x, root);
    if (!st) st = st_check_overlaps(&x);
    json_decref(root);
    if (!st && x.misaligned) st = st_align_copy(&x);
    if (st) {
        free(f->tensors);
        free(f->names);
        memset(f, 0, sizeof *f);
        return st;
    }
    f->path = xstrdup(path);
    return TL_OK;
}

/* Maps a regular file of at least 8 bytes read-only. */
static int st_map(const char *path, void **map, size_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tl_errf(err, errlen, TL_ERR_IO, "%s: not a regular file", path);
    }
    *size = (size_t)sb.st_size;
    if (*size < 8) {
        close(fd);
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", path,
                       *size);
    }
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (*map == MAP_FAILED)
        return tl_errf(err, errlen, TL_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    return TL_OK;
}

int tl_st_open(tl_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    void *map = NULL;
    size_t size = 0;
    int st = st_map(path, &map, &size, err, errlen);
    if (st) return st;
    st = tl_st_parse(f, map, size, path, err, errlen);
    if (st || f->own) { /* failed, or the data now lives in the aligned copy */
        munmap(map, size);
        return st;
    }
    f->map = map;
    f->map_size = size;
    return TL_OK;
}

void tl_st_close(tl_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    free(f->own);
    free(f->tensors);
    free(f->names);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- a checkpoint directory: shard index or one file ---- */

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The index's weight_map (a non-empty object); *root owns it. */
static int index_read(const char *ipath, json_t **root, json_t **wm, char *err, size_t errlen) {
    char *text = NULL;
    int st = tl_read_file(ipath, &text, NULL, err, errlen);
    if (st) return st;
    json_error_t je;
    *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!*root)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON at line %d: %s", ipath, je.line,
                       je.text);
    *wm = json_object_get(*root, "weight_map");
    if (!json_is_object(*wm) || json_object_size(*wm) == 0)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: weight_map: missing, empty or not an object", ipath);
    return TL_OK;
}

/* Opens every shard weight_map names, in first-seen order; each name must be a plain file name
 * in the checkpoint directory. */
static int index_open_shards(tl_st_set *s, const char *dir, json_t *wm, char *err, size_t errlen) {
    const char **shards = xcalloc(json_object_size(wm), sizeof *shards);
    int ns = 0, st = TL_OK;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *name = json_string_value(val);
        if (!name || !*name || strstr(name, "..") || name[0] == '/') {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: weight_map['%s']: expected a file name in the checkpoint directory",
                         s->index_path, key);
            break;
        }
        int seen = 0;
        for (int i = 0; i < ns && !seen; i++) seen = !strcmp(shards[i], name);
        if (!seen) shards[ns++] = name;
    }
    if (!st) s->files = xcalloc((size_t)ns, sizeof *s->files);
    for (int i = 0; i < ns && !st; i++) {
        char *sp = tl_path_join(dir, shards[i]);
        st = tl_st_open(&s->files[i], sp, err, errlen);
        free(sp);
        if (!st) s->n_files++;
    }
    free(shards);
    return st;
}

/* Every tensor weight_map names must be in the file it names. */
static int index_verify(const tl_st_set *s, json_t *wm, char *err, size_t errlen) {
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *name = json_string_value(val);
        size_t ls = strlen(name);
        int found = 0;
        for (int f = 0; f < s->n_files && !found; f++) {
            const char *fp = s->files[f].path;
            size_t lf = strlen(fp);
            if (lf < ls + 1 || strcmp(fp + lf - ls, name) || fp[lf - ls - 1] != '/') continue;
            for (int i = 0; i < s->files[f].n_tensors && !found; i++)
                found = !strcmp(s->files[f].tensors[i].name, key);
            if (!found)
                return tl_errf(err, errlen, TL_ERR_FORMAT,
                               "%s: weight_map says tensor '%s' is in %s, but that file does not "
                               "contain it",
                               s->index_path, key, name);
        }
    }
    return TL_OK;
}

static int open_index(tl_st_set *s, const char *dir, char *err, size_t errlen) {
    json_t *root = NULL, *wm;
    int st = index_read(s->index_path, &root, &wm, err, errlen);
    if (!st) st = index_open_shards(s, dir, wm, err, errlen);
    if (!st) st = index_verify(s, wm, err, errlen);
    json_decref(root);
    return st;
}

int tl_st_set_open(tl_st_set *s, const char *dir, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    char *ipath = tl_path_join(dir, "model.safetensors.index.json");
    if (file_exists(ipath)) {
        s->index_path = ipath;
        int st = open_index(s, dir, err, errlen);
        if (st) tl_st_set_close(s);
        return st;
    }
    free(ipath);
    char *single = tl_path_join(dir, "model.safetensors");
    int st = TL_OK;
    if (!file_exists(single)) {
        st = tl_errf(err, errlen, TL_ERR_IO,
                     "%s: no model.safetensors or model.safetensors.index.json", dir);
    } else {
        s->files = xcalloc(1, sizeof *s->files);
        st = tl_st_open(&s->files[0], single, err, errlen);
        if (!st) s->n_files = 1;
    }
    free(single);
    if (st) tl_st_set_close(s);
    return st;
}

void tl_st_set_close(tl_st_set *s) {
    for (int i = 0; i < s->n_files; i++) tl_st_close(&s->files[i]);
    free(s->files);
    free(s->index_path);
    memset(s, 0, sizeof *s);
}

/* ---- writing ---- */

size_t tl_st_entry_nbytes(const tl_st_entry *e) {
    size_t n = tl_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) n *= (size_t)e->shape[d];
    return n;
}

int tl_st_write_header(FILE *fp, const tl_st_entry *e, int n, const char *path, char *err,
                       size_t errlen) {
    json_t *root = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *t = json_object(), *sh = json_array(), *o = json_array();
        for (int d = 0; d < e[i].ndim; d++) json_array_append_new(sh, json_integer(e[i].shape[d]));
        size_t nb = tl_st_entry_nbytes(&e[i]);
        if (nb && off % tl_dtype_size(e[i].dtype)) {
            json_decref(t);
            json_decref(sh);
            json_decref(o);
            json_decref(root);
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "%s: tensor '%s' would start at a misaligned offset %zu: write larger "
                           "element sizes first",
                           path, e[i].name, off);
        }
        json_array_append_new(o, json_integer((json_int_t)off));
        json_array_append_new(o, json_integer((json_int_t)(off + nb)));
        off += nb;
        json_object_set_new(t, "dtype", json_string(tl_dtype_name(e[i].dtype)));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "data_offsets", o);
        json_object_set_new(root, e[i].name, t);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return tl_errf(err, errlen, TL_ERR_NOMEM, "%s: cannot format header", path);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(text, 1, len, fp) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    free(text);
    if (!ok) return tl_errf(err, errlen, TL_ERR_IO, "%s: write error", path);
    return TL_OK;
}

int tl_st_write(const char *path, const tl_st_entry *e, int n, char *err, size_t errlen) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    int st = tl_st_write_header(fp, e, n, path, err, errlen);
    for (int i = 0; !st && i < n; i++) {
        size_t nb = tl_st_entry_nbytes(&e[i]);
        if (nb && fwrite(e[i].data, 1, nb, fp) != nb)
            st = tl_errf(err, errlen, TL_ERR_IO, "%s: write error", path);
    }
    if (fclose(fp) && !st) st = tl_errf(err, errlen, TL_ERR_IO, "%s: write error", path);
    return st;
}
