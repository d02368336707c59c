/* Status codes: 0 = success, negative tl_status = failure, everywhere (docs/architecture.md §7).
 * Request- and load-time errors also carry a message in a caller buffer (char *err, size_t errlen).
 */
#ifndef TL_STATUS_H
#define TL_STATUS_H

#include <stddef.h>
#include "tulip.h"

/* Formats a message into (err, errlen) and returns st, so callers can write
 * `return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad header", path);`. err may be NULL. */
int tl_errf(char *err, size_t errlen, int st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
