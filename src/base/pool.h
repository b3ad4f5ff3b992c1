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

// Kernel scratch: the matmul kernels (src/quant) pack operands into a buffer
// of their thread's instead of allocating in the decode loop. It is reserved
// ahead, where a failure can be reported: for every thread of a pool (the
// caller, as thread 0, included) with mole_pool_reserve (model load), for a
// thread that calls kernels outside pool jobs (tests, tools) with
// mole_scratch_reserve. Both only grow; neither while a job of the pool runs.
mole_status mole_pool_reserve(mole_pool *p, size_t bytes);
mole_status mole_scratch_reserve(size_t bytes);
// The calling thread's scratch (64-byte aligned, *bytes long): inside a job
// of a pool that reserved one, its thread's; else the thread's own (NULL and
// 0 when none).
void *mole_scratch(size_t *bytes);

// Rows [*r0, *r1) of n for thread ith of nth.
static inline void mole_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
  int64_t per = (n + nth - 1) / nth;
  int64_t a = per * ith;
  int64_t b = a + per;
  *r0 = a < n ? a : n;
  *r1 = b < n ? b : n;
}

#endif
