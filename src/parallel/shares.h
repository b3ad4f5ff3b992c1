// shares: how the MPI modes divide a model's work among processes (mole
// plan's shares, the cuts of heads, FFN columns, vocabulary rows and experts
// that follow from them). Pure arithmetic without MPI: compiled in every
// build (-DMOLE_MPI=OFF too), tested on its own (tests/test_shares.c).
#ifndef MOLE_SHARES_H
#define MOLE_SHARES_H

#include "base/base.h"

enum { SHARES_MAX_RANKS = 64 };

// Shares w[0..n) of the shardable bytes in proportion to each rank's speed
// (bytes it streams per second), so that all finish a step together. A rank
// whose share would not fit 0.9 of its memory mem[r] after the fixed[r]
// bytes it holds anyway keeps what fits, and the rest goes to the others in
// proportion to their speed (mem[r] == 0: unknown, not capped). *fits: the
// shares sum to 1 (within 1e-3); when false, w is what fits. MOLE_ERR_ARG
// (naming the rank and the figure) for n outside 1..SHARES_MAX_RANKS, a
// speed, memory or fixed figure that is negative or not finite, shardable
// not > 0, or speeds that are all 0.
mole_status shares_fit(const double *speed, const double *mem, const double *fixed, int n, double shardable,
                       double *w, bool *fits);

// Cuts n items into `size` parts in proportion to the weights w, every cut
// a multiple of unit but the last part's end: bounds[0] = 0 <= bounds[1] <=
// ... <= bounds[size] = n, part r being [bounds[r], bounds[r+1]). The
// remainder of n / unit goes to the last rank with a weight > 0 (ranks
// after it get nothing). MOLE_ERR_ARG (naming what) for n < 0, unit < 1,
// size outside 1..SHARES_MAX_RANKS, a weight that is negative or not finite
// or over 1e9, or weights that are all 0.
mole_status shares_cut(int64_t n, int64_t unit, const double *w, int size, int64_t *bounds);

#endif
