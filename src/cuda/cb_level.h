/* The kernels' level switches (A/B levers): an environment variable read once as an integer
 * clamped to 0..max (dflt when unset), which tests and tools set with cb_level_set. Host code of
 * the CUDA backend; shared with the host emulator (dev/emu). */
#ifndef TL_CB_LEVEL_H
#define TL_CB_LEVEL_H

#include <stdlib.h>

/* One static cb_level per switch, v = -1 until first read. */
typedef struct cb_level {
    const char *name;
    int dflt, max, v;
} cb_level;

static inline int cb_level_clamp(const cb_level *l, int v) {
    return v < 0 ? 0 : v > l->max ? l->max : v;
}
static inline int cb_level_get(cb_level *l) {
    if (l->v < 0) {
        const char *e = getenv(l->name);
        l->v = e && *e ? cb_level_clamp(l, atoi(e)) : l->dflt;
    }
    return l->v;
}
/* Sets the level (clamped); returns the previous one. */
static inline int cb_level_set(cb_level *l, int v) {
    int old = cb_level_get(l);
    l->v = cb_level_clamp(l, v);
    return old;
}

#endif
