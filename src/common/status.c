/* Status strings and the error-message helper. */
#include <stdarg.h>
#include <stdio.h>
#include "common/status.h"

const char *tl_status_str(int st) {
    switch (st) {
    case TL_OK:
        return "ok";
    case TL_ERR_INVALID:
        return "invalid argument";
    case TL_ERR_NOMEM:
        return "out of memory";
    case TL_ERR_IO:
        return "i/o error";
    case TL_ERR_FORMAT:
        return "bad file format";
    case TL_ERR_UNSUPPORTED:
        return "unsupported";
    case TL_ERR_CONTEXT_FULL:
        return "context full";
    case TL_ERR_BUSY:
        return "busy";
    case TL_ERR_CANCELLED:
        return "cancelled";
    case TL_ERR_CUDA:
        return "cuda error";
    case TL_ERR_DEVICE_LOST:
        return "device lost";
    case TL_ERR_INTERNAL:
        return "internal error";
    }
    return "unknown status";
}

int tl_errf(char *err, size_t errlen, int st, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}
