// Thread pool: the caller is thread 0; n-1 workers spin briefly, then sleep.
// Work is split by the callee with (ith, nth), ggml style.
#ifndef MOLE_POOL_H
#define MOLE_POOL_H

#include "base/base.h"

typedef void (*mole_pool_fn)(void *ctx, int ith, int nth);
typedef struct mole_pool mole_pool;

mole_status mole_pool_init(int n_threads, mole_pool **out);
void mole_pool_free(mole_pool *p);
int mole_pool_nth(const mole_pool *p);
// Runs fn(ctx, ith, nth) on every thread (the caller is ith 0) and returns
// when all have finished. Not reentrant.
void mole_pool_run(mole_pool *p, mole_pool_fn fn, void *ctx);

// Rows [*r0, *r1) of n for thread ith of nth.
static inline void mole_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
  int64_t per = (n + nth - 1) / nth;
  int64_t a = per * ith;
  int64_t b = a + per;
  *r0 = a < n ? a : n;
  *r1 = b < n ? b : n;
}

#endif
