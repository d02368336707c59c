/* safetensors: header parsing with every bound checked, mmap, and a small writer.
 *
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

/* ---- parsing ---- */

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

int tl_st_parse(tl_st_file *f, const void *buf, size_t size, const char *path, char *err,
                size_t errlen) {
    memset(f, 0, sizeof *f);
    const uint8_t *b = buf;
    if (size < 8)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > size - 8)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes): "
                       "truncated or not a safetensors file",
                       path, (unsigned long long)hlen, size);
    if (hlen > TL_ST_MAX_HEADER)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: header length %llu is above the %u limit",
                       path, (unsigned long long)hlen, TL_ST_MAX_HEADER);
    if (hlen < 2)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: header length %llu: empty header", path,
                       (unsigned long long)hlen);
    f->data = b + 8 + hlen;
    f->data_size = size - 8 - (size_t)hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON header at byte %d: %s", path,
                       je.position + 8, je.text);
    int st = TL_OK;
    tl_tensor **order = NULL;
    if (!json_is_object(root)) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }
    size_t n = json_object_size(root), names_len = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) names_len += strlen(key) + 1;
    f->tensors = xcalloc(n ? n : 1, sizeof *f->tensors);
    f->names = xmalloc(names_len + 1);
    size_t npos = 0;
    int nt = 0, misaligned = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        tl_tensor *t = &f->tensors[nt];
        if (!json_is_object(val)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: tensor '%s': expected an object", path,
                         key);
            goto fail;
        }
        json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape");
        json_t *off = json_object_get(val, "data_offsets");
        if (!json_is_string(dt)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': dtype: missing or not a string", path, key);
            goto fail;
        }
        if (tl_dtype_parse(json_string_value(dt), &t->dtype)) {
            st = tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                         "%s: tensor '%s': dtype \"%.32s\" is not supported", path, key,
                         json_string_value(dt));
            goto fail;
        }
        if (!json_is_array(sh) || json_array_size(sh) > TL_MAX_DIMS) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': shape: expected a list of at most %d dims", path, key,
                         TL_MAX_DIMS);
            goto fail;
        }
        t->ndim = (int)json_array_size(sh);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t dim;
            if (json_u64(json_array_get(sh, (size_t)d), INT64_MAX, &dim)) {
                st = tl_errf(err, errlen, TL_ERR_FORMAT,
                             "%s: tensor '%s': shape[%d]: expected a non-negative integer", path,
                             key, d);
                goto fail;
            }
            t->shape[d] = (int64_t)dim;
            if (__builtin_mul_overflow(numel, dim, &numel)) {
                st = tl_errf(err, errlen, TL_ERR_FORMAT,
                             "%s: tensor '%s': shape: element count overflows", path, key);
                goto fail;
            }
        }
        uint64_t bytes, beg, end;
        if (__builtin_mul_overflow(numel, (uint64_t)tl_dtype_size(t->dtype), &bytes)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: tensor '%s': shape: byte size overflows",
                         path, key);
            goto fail;
        }
        if (!json_is_array(off) || json_array_size(off) != 2 ||
            json_u64(json_array_get(off, 0), INT64_MAX, &beg) ||
            json_u64(json_array_get(off, 1), INT64_MAX, &end) || beg > end) {
            st = tl_errf(
                err, errlen, TL_ERR_FORMAT,
                "%s: tensor '%s': data_offsets: expected [begin, end] with 0 <= begin <= end", path,
                key);
            goto fail;
        }
        if (end > f->data_size) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] run past the data section "
                         "(%zu bytes): truncated file?",
                         path, key, (unsigned long long)beg, (unsigned long long)end, f->data_size);
            goto fail;
        }
        if (end - beg != bytes) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets span %llu bytes, shape x %s needs %llu",
                         path, key, (unsigned long long)(end - beg), tl_dtype_name(t->dtype),
                         (unsigned long long)bytes);
            goto fail;
        }
        t->data = f->data + beg;
        t->nbytes = (size_t)bytes;
        if (bytes && (uintptr_t)t->data % tl_dtype_size(t->dtype)) misaligned = 1;
        size_t kl = strlen(key);
        memcpy(f->names + npos, key, kl + 1);
        t->name = f->names + npos;
        npos += kl + 1;
        nt++;
    }
    f->n_tensors = nt;

    /* Overlaps: sort by start; each non-empty tensor must end before the next one starts. */
    order = xmalloc((size_t)(nt ? nt : 1) * sizeof *order);
    for (int i = 0; i < nt; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)nt, sizeof *order, cmp_begin);
    const tl_tensor *prev = NULL;
    for (int i = 0; i < nt; i++) {
        const tl_tensor *t = order[i];
        if (!t->nbytes) continue;
        if (prev && (const uint8_t *)prev->data + prev->nbytes > (const uint8_t *)t->data) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets overlap tensor '%s'", path, t->name,
                         prev->name);
            goto fail;
        }
        prev = t;
    }
    free(order);
    json_decref(root);
    /* Writers that do not pad the header (mlx's does not) leave tensors at odd addresses.
     * Consumers read words and floats directly, so such a file gets an aligned private copy:
     * every tensor at a 64-byte boundary of one buffer (costs the file's size in memory and one
     * copy; tl_st_open then releases the mapping). */
    if (misaligned) {
        size_t cap = 64;
        for (int i = 0; i < nt; i++) cap += (f->tensors[i].nbytes + 63) & ~(size_t)63;
        uint8_t *own = aligned_alloc(64, cap);
        if (!own) {
            st = tl_errf(err, errlen, TL_ERR_NOMEM,
                         "%s: out of memory copying %zu bytes of tensor data into alignment", path,
                         cap);
            goto fail_names;
        }
        size_t off = 0;
        for (int i = 0; i < nt; i++) {
            tl_tensor *t = &f->tensors[i];
            if (t->nbytes) memcpy(own + off, t->data, t->nbytes);
            t->data = own + off;
            off += (t->nbytes + 63) & ~(size_t)63;
        }
        f->data = own;
        f->data_size = off;
        f->own = own;
    }
    f->path = xstrdup(path);
    return TL_OK;
fail:
    free(order);
    json_decref(root);
fail_names:
    free(f->tensors);
    free(f->names);
    memset(f, 0, sizeof *f);
    return st;
}

int tl_st_open(tl_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tl_errf(err, errlen, TL_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return tl_errf(err, errlen, TL_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    int st = tl_st_parse(f, map, size, path, err, errlen);
    if (st) {
        munmap(map, size);
        return st;
    }
    if (f->own) { /* the data now lives in the aligned copy */
        munmap(map, size);
        return TL_OK;
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
