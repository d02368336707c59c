/* safetensors files: read via mmap (header checked to the byte) and written (tests, quantize).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {...}}
 * then the data section; offsets are relative to its start. */
#ifndef TL_ST_H
#define TL_ST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "model/weights.h"

#define TL_ST_MAX_HEADER (100u << 20) /* the safetensors reference library's limit */

typedef struct tl_st_file {
    char *path;
    void *map; /* whole-file mapping (NULL when parsed from a caller buffer) */
    size_t map_size;
    const uint8_t *data; /* start of the data section (or of f->own) */
    size_t data_size;
    tl_tensor *tensors; /* in header order; names point into `names` */
    int n_tensors;
    char *names;
    void *own; /* aligned copy of the tensors when the file had misaligned ones, else NULL */
} tl_st_file;

/* Parses a whole safetensors image held in buf[size] (no copy: tensor data points into buf).
 * path is used in messages only. Checks: header length inside the file, JSON syntax, duplicate
 * names, dtype names, non-negative dims, shape product overflow, shape x dtype size == end-begin,
 * offsets inside the data section, no overlapping tensors. When any tensor would sit at an address
 * not aligned to its element size (mlx's writer does not pad the header), every tensor is copied
 * to a 64-byte boundary of a buffer owned by f (f->own; data/data_size then describe it), so a
 * tensor's data is always aligned. */
int tl_st_parse(tl_st_file *f, const void *buf, size_t size, const char *path, char *err,
                size_t errlen);
/* Maps the file read-only and parses it. */
int tl_st_open(tl_st_file *f, const char *path, char *err, size_t errlen);
void tl_st_close(tl_st_file *f);

/* The safetensors files of a checkpoint directory: with dir/model.safetensors.index.json, every
 * shard its weight_map names (first-seen order; each name a plain file in dir, each mapped tensor
 * present in the file named for it), else dir/model.safetensors alone. */
typedef struct tl_st_set {
    tl_st_file *files;
    int n_files;
    char *index_path; /* the index's path, or NULL for a single file */
} tl_st_set;

/* Opens the set; on failure s is left empty (nothing to close). */
int tl_st_set_open(tl_st_set *s, const char *dir, char *err, size_t errlen);
void tl_st_set_close(tl_st_set *s);

/* "BF16" -> TL_DT_BF16; -1 when unknown. */
int tl_dtype_parse(const char *s, tl_dtype *out);

/* One tensor to write. nbytes is derived from shape and dtype. */
typedef struct tl_st_entry {
    const char *name;
    tl_dtype dtype;
    int ndim;
    int64_t shape[TL_MAX_DIMS];
    const void *data; /* for tl_st_write; ignored by tl_st_write_header */
} tl_st_entry;

size_t tl_st_entry_nbytes(const tl_st_entry *e);
/* Writes the length + JSON header (padded to 8 bytes) for entries laid out back to back in the
 * given order; the caller then writes each entry's bytes in that order. */
int tl_st_write_header(FILE *fp, const tl_st_entry *e, int n, const char *path, char *err,
                       size_t errlen);
/* Writes a complete file from entries with data. */
int tl_st_write(const char *path, const tl_st_entry *e, int n, char *err, size_t errlen);

#endif
