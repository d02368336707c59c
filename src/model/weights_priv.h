/* What tl_model.priv holds: the open files, the name hash, and everything the loader allocated.
 * Only the loader, `tulip info` and `tulip quantize` look inside. */
#ifndef TL_WEIGHTS_PRIV_H
#define TL_WEIGHTS_PRIV_H

#include <stddef.h>
#include "model/st.h"

typedef struct tl_model_priv {
    char *dir;
    char *index_path; /* model.safetensors.index.json when sharded, else NULL */
    tl_st_file *files;
    int n_files;
    int *tfile; /* [n_tensors] file index of each directory entry */
    int *hash;  /* open addressing over names, -1 = empty */
    size_t hcap;
    void **allocs; /* f32 vectors and expert view arrays */
    size_t n_allocs, cap_allocs;
    int n_skipped; /* vision tensors left out of the directory */
    size_t skipped_bytes;
    double norm_mean; /* mean of the stored RMSNorm1p weights (offset check) */
    char prefix[32];  /* name prefix of the language model */
    void *quant_json; /* config.json "quantization" object (json_t *), NULL when absent */
} tl_model_priv;

/* Bytes of one packed row of `cols` values at `bits` bits (U32 words). */
static inline size_t shape_w_row(int cols, int bits) {
    return (size_t)cols * (size_t)bits / 32 * 4;
}

#endif
