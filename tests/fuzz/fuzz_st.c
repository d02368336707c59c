/* libFuzzer target: the safetensors header parser on arbitrary bytes. It must return a status
 * (never crash, never read outside the buffer); on success every tensor must lie inside it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "model/st.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy so the parser's views point into memory ASan tracks exactly */
    uint8_t *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, data, size);
    tl_st_file f;
    char err[256];
    if (tl_st_parse(&f, buf, size, "fuzz.safetensors", err, sizeof err) == 0) {
        for (int i = 0; i < f.n_tensors; i++) {
            const tl_tensor *t = &f.tensors[i];
            const uint8_t *p = t->data;
            /* inside the buffer, or inside the aligned copy of its data section */
            TL_ASSERT(p >= f.data && p + t->nbytes <= f.data + f.data_size);
            TL_ASSERT(f.own ? f.data == f.own
                            : (f.data >= buf && f.data + f.data_size <= buf + size));
            TL_ASSERT(!t->nbytes || (uintptr_t)p % tl_dtype_size(t->dtype) == 0);
            volatile uint8_t sink = 0;
            if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
            (void)sink;
            TL_ASSERT(strlen(t->name) < size);
        }
        tl_st_close(&f);
    } else {
        TL_ASSERT(strlen(err) > 0);
    }
    free(buf);
    return 0;
}
