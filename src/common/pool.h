/* A persistent CPU worker pool for data-parallel loops (CPU reference matmuls, MoE tokens).
 * tl_pool_for runs fn(ctx, i) for i in [0, n) across the workers and the caller, and returns when
 * all are done. Calls from several threads at once are serialised. */
#ifndef TL_POOL_H
#define TL_POOL_H

/* Sets the number of threads used by later calls (0 = all cores). */
void tl_pool_set_threads(int n);
int tl_pool_threads(void);
void tl_pool_for(int n, void (*fn)(void *ctx, int i), void *ctx);

#endif
