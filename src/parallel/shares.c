// shares: proportional shares under memory caps, and cuts of a range on a
// granularity (shares.h).
#include "parallel/shares.h"

#include <math.h>

mole_status shares_fit(const double *speed, const double *mem, const double *fixed, int n, double shardable,
                       double *w, bool *fits) {
  *fits = false;
  if (n < 1 || n > SHARES_MAX_RANKS)
    return mole_errorf(MOLE_ERR_ARG, "shares: %d processes (1..%d)", n, (int)SHARES_MAX_RANKS);
  if (!(shardable > 0) || !isfinite(shardable))
    return mole_errorf(MOLE_ERR_ARG, "shares: %g shardable bytes (must be > 0)", shardable);
  double total_speed = 0;
  for (int r = 0; r < n; r++) {
    const double fig[3] = {speed[r], mem[r], fixed[r]};
    const char *names[3] = {"speed", "memory", "fixed bytes"};
    for (int k = 0; k < 3; k++)
      if (!(fig[k] >= 0) || !isfinite(fig[k]))
        return mole_errorf(MOLE_ERR_ARG, "shares: rank %d's %s is %g (must be >= 0)", r, names[k], fig[k]);
    total_speed += speed[r];
    w[r] = 0;
  }
  if (!(total_speed > 0) || !isfinite(total_speed))
    return mole_errorf(MOLE_ERR_ARG, "shares: every rank's speed is 0 (or they overflow)");
  bool capped[SHARES_MAX_RANKS] = {false};
  // each round caps at least one rank more, or ends
  for (int it = 0; it <= n; it++) {
    double free_speed = 0, free_share = 1;
    for (int r = 0; r < n; r++)
      if (capped[r]) free_share -= w[r];
      else free_speed += speed[r];
    for (int r = 0; r < n; r++)
      if (!capped[r]) w[r] = free_speed > 0 ? MOLE_MAX(free_share, 0) * speed[r] / free_speed : 0;
    bool moved = false;
    for (int r = 0; r < n; r++) {
      if (capped[r] || mem[r] == 0) continue;
      const double cap = (0.9 * mem[r] - fixed[r]) / shardable;
      if (w[r] > cap) {
        w[r] = MOLE_MAX(cap, 0);
        capped[r] = moved = true;
      }
    }
    if (!moved) break;
  }
  double tot = 0;
  for (int r = 0; r < n; r++) tot += w[r];
  *fits = tot > 0.999;
  return MOLE_OK;
}

mole_status shares_cut(int64_t n, int64_t unit, const double *w, int size, int64_t *bounds) {
  if (n < 0) return mole_errorf(MOLE_ERR_ARG, "shares: cutting %lld items", (long long)n);
  if (unit < 1) return mole_errorf(MOLE_ERR_ARG, "shares: a unit of %lld items (must be >= 1)", (long long)unit);
  if (size < 1 || size > SHARES_MAX_RANKS)
    return mole_errorf(MOLE_ERR_ARG, "shares: %d parts (1..%d)", size, (int)SHARES_MAX_RANKS);
  double tot = 0;
  int last = -1;  // the last rank with a weight
  for (int r = 0; r < size; r++) {
    if (!(w[r] >= 0) || !(w[r] <= 1e9))
      return mole_errorf(MOLE_ERR_ARG, "shares: rank %d's weight is %g (must be 0..1e9)", r, w[r]);
    tot += w[r];
    if (w[r] > 0) last = r;
  }
  if (last < 0) return mole_errorf(MOLE_ERR_ARG, "shares: every rank's weight is 0");
  const int64_t units = n / unit;
  double acc = 0;
  bounds[0] = 0;
  for (int r = 0; r < size; r++) {
    acc += w[r];
    const int64_t b = r >= last ? n : unit * (int64_t)floor((double)units * acc / tot + 0.5);
    bounds[r + 1] = MOLE_MIN(MOLE_MAX(b, bounds[r]), n);
  }
  return MOLE_OK;
}
