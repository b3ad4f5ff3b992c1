// parallel/shares: mole plan's shares (speed in proportion, memory caps) and
// the cuts of heads, columns, vocabulary rows and experts on a granularity.
#include <math.h>
#include <string.h>

#include "parallel/shares.h"
#include "testutil.h"

static double sum(const double *w, int n) {
  double s = 0;
  for (int r = 0; r < n; r++) s += w[r];
  return s;
}

// Shares in proportion to speed when memory is no limit (0: unknown, or plenty).
static void test_fit_proportional(void **st) {
  (void)st;
  const double speed[3] = {1, 2, 5}, fixed[3] = {0, 0, 0};
  const double mem_unknown[3] = {0, 0, 0}, mem_plenty[3] = {1e12, 1e12, 1e12};
  const double *mems[2] = {mem_unknown, mem_plenty};
  for (int k = 0; k < 2; k++) {
    double w[3];
    bool fits = false;
    assert_int_equal(shares_fit(speed, mems[k], fixed, 3, 1e9, w, &fits), MOLE_OK);
    assert_true(fits);
    assert_true(fabs(w[0] - 0.125) < 1e-12 && fabs(w[1] - 0.25) < 1e-12 && fabs(w[2] - 0.625) < 1e-12);
    assert_true(fabs(sum(w, 3) - 1) < 1e-12);
  }
  // one rank: all of it; a rank of speed 0 among others: none
  double w[3];
  bool fits = false;
  assert_int_equal(shares_fit(speed, mem_unknown, fixed, 1, 1e9, w, &fits), MOLE_OK);
  assert_true(fits && w[0] == 1.0);
  const double speed0[3] = {3, 0, 1};
  assert_int_equal(shares_fit(speed0, mem_unknown, fixed, 3, 1e9, w, &fits), MOLE_OK);
  assert_true(fits && w[1] == 0 && fabs(w[0] - 0.75) < 1e-12 && fabs(w[2] - 0.25) < 1e-12);
}

// A rank whose share would not fit 0.9 of its memory after its fixed bytes
// keeps what fits; the rest goes to the others by speed, capping them in
// turn; when no one has room left the shares sum to less than 1 and *fits is
// false.
static void test_fit_memory_caps(void **st) {
  (void)st;
  const double shard = 1000, speed[3] = {1, 1, 2}, fixed[3] = {100, 100, 100};
  // rank 2 would get 0.5 (500 bytes) but holds 0.9 * 500 - 100 = 350
  const double mem[3] = {1e6, 1e6, 500};
  double w[3];
  bool fits = false;
  assert_int_equal(shares_fit(speed, mem, fixed, 3, shard, w, &fits), MOLE_OK);
  assert_true(fits);
  assert_true(fabs(w[2] - 0.35) < 1e-12);
  assert_true(fabs(w[0] - 0.325) < 1e-12 && fabs(w[1] - 0.325) < 1e-12);
  assert_true(fabs(sum(w, 3) - 1) < 1e-12);
  // then rank 0 too (0.9 * 400 - 100 = 260): rank 1 takes the rest
  const double mem2[3] = {400, 1e6, 500};
  assert_int_equal(shares_fit(speed, mem2, fixed, 3, shard, w, &fits), MOLE_OK);
  assert_true(fits);
  assert_true(fabs(w[0] - 0.26) < 1e-12 && fabs(w[2] - 0.35) < 1e-12 && fabs(w[1] - 0.39) < 1e-12);
  // nobody has room for the whole: what fits, not a fit
  const double small[3] = {400, 400, 500};
  assert_int_equal(shares_fit(speed, small, fixed, 3, shard, w, &fits), MOLE_OK);
  assert_false(fits);
  assert_true(fabs(sum(w, 3) - 0.87) < 1e-12);
  // fixed bytes alone beyond the memory: a share of 0, never negative
  const double tiny[3] = {100, 1e6, 1e6};
  assert_int_equal(shares_fit(speed, tiny, fixed, 3, shard, w, &fits), MOLE_OK);
  assert_true(fits && w[0] == 0 && fabs(w[1] + w[2] - 1) < 1e-12);
}

// Speeds that are all 0, negative or not finite figures, an empty or
// oversized cluster, nothing to share: errors that name the problem.
static void test_fit_hostile(void **st) {
  (void)st;
  double w[SHARES_MAX_RANKS + 1];
  bool fits = true;
  const double zero[2] = {0, 0}, one[2] = {1, 1};
  assert_int_equal(shares_fit(zero, zero, zero, 2, 1e9, w, &fits), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "every rank's speed is 0"));
  assert_false(fits);
  const double bad[4][2] = {{1, -1}, {1, NAN}, {1, INFINITY}, {1, -INFINITY}};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(shares_fit(bad[k], zero, zero, 2, 1e9, w, &fits), MOLE_ERR_ARG);
    assert_non_null(strstr(mole_last_error(), "rank 1's speed"));
    assert_int_equal(shares_fit(one, bad[k], zero, 2, 1e9, w, &fits), MOLE_ERR_ARG);
    assert_non_null(strstr(mole_last_error(), "rank 1's memory"));
    assert_int_equal(shares_fit(one, zero, bad[k], 2, 1e9, w, &fits), MOLE_ERR_ARG);
    assert_non_null(strstr(mole_last_error(), "rank 1's fixed bytes"));
  }
  const double huge[2] = {1e308, 1e308};  // their sum overflows
  assert_int_equal(shares_fit(huge, zero, zero, 2, 1e9, w, &fits), MOLE_ERR_ARG);
  assert_int_equal(shares_fit(one, zero, zero, 0, 1e9, w, &fits), MOLE_ERR_ARG);
  assert_int_equal(shares_fit(one, zero, zero, -3, 1e9, w, &fits), MOLE_ERR_ARG);
  double many[SHARES_MAX_RANKS + 1] = {0};
  assert_int_equal(shares_fit(many, many, many, SHARES_MAX_RANKS + 1, 1e9, w, &fits), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "processes"));
  const double shard[3] = {0, -1, NAN};
  for (int k = 0; k < 3; k++) {
    assert_int_equal(shares_fit(one, zero, zero, 2, shard[k], w, &fits), MOLE_ERR_ARG);
    assert_non_null(strstr(mole_last_error(), "shardable"));
  }
}

// Every cut on the unit but the end, in order, from 0 to n, each part near
// its weight's share.
static void check_cut(int64_t n, int64_t unit, const double *w, int size) {
  int64_t b[SHARES_MAX_RANKS + 1];
  assert_int_equal(shares_cut(n, unit, w, size, b), MOLE_OK);
  assert_int_equal(b[0], 0);
  assert_int_equal(b[size], n);
  double tot = 0, acc = 0;
  int last = 0;
  for (int r = 0; r < size; r++) {
    tot += w[r];
    if (w[r] > 0) last = r;
  }
  for (int r = 0; r < size; r++) {
    assert_true(b[r] <= b[r + 1]);
    if (b[r + 1] != n) assert_int_equal(b[r + 1] % unit, 0);
    if (w[r] == 0 && r != last) assert_int_equal(b[r + 1], b[r]);  // no weight: nothing
    acc += w[r];
    // within half a unit of the exact cut of n / unit units (the last part also takes the remainder)
    if (r < last) assert_true(fabs((double)b[r + 1] - (double)unit * ((double)(n / unit) * acc / tot)) <= unit / 2.0 + 1e-9);
  }
  for (int r = last + 1; r < size; r++) assert_int_equal(b[r], n);  // after the last weight: nothing
}

static void test_cut_granularity(void **st) {
  (void)st;
  const double eq[4] = {1, 1, 1, 1}, uneven[3] = {3, 1, 0}, first0[3] = {0, 2, 1}, mid0[4] = {1, 0, 0, 1};
  // 32 KV heads in units of 1; 14336 FFN columns on blocks of 256; 32000
  // vocabulary rows by 16; a count that is not a multiple of its unit
  check_cut(32, 1, eq, 4);
  check_cut(14336, 256, uneven, 3);
  check_cut(32000, 16, first0, 3);
  check_cut(1000, 64, mid0, 4);
  check_cut(50257, 16, eq, 4);
  check_cut(7, 32, eq, 4);  // fewer items than a unit: all to the last rank with weight
  check_cut(0, 16, eq, 4);
  int64_t b[5];
  assert_int_equal(shares_cut(14336, 256, uneven, 3, b), MOLE_OK);
  assert_true(b[1] == 10752 && b[2] == 14336 && b[3] == 14336);  // 3:1, the rank of weight 0 gets nothing
  assert_int_equal(shares_cut(1000, 64, mid0, 4, b), MOLE_OK);
  assert_true(b[1] == 512 && b[2] == 512 && b[3] == 512 && b[4] == 1000);  // the remainder to rank 3
  assert_int_equal(shares_cut(9, 1, eq, 4, b), MOLE_OK);  // about equal: 2, 3, 2, 2 (rounded cuts)
  assert_true(b[1] == 2 && b[2] == 5 && b[3] == 7 && b[4] == 9);
  // random weights and sizes: the invariants hold
  uint64_t rng = 7;
  for (int it = 0; it < 2000; it++) {
    const int size = 1 + (int)(tu_rand_u64(&rng) % SHARES_MAX_RANKS);
    double w[SHARES_MAX_RANKS];
    for (int r = 0; r < size; r++) w[r] = tu_rand_u64(&rng) % 3 ? (double)(tu_rand_u64(&rng) % 1000) / 7.0 : 0.0;
    w[tu_rand_u64(&rng) % (uint64_t)size] = 1.0;  // at least one weight
    const int64_t unit = 1 + (int64_t)(tu_rand_u64(&rng) % 300), n = (int64_t)(tu_rand_u64(&rng) % 200000);
    check_cut(n, unit, w, size);
  }
}

static void test_cut_hostile(void **st) {
  (void)st;
  int64_t b[SHARES_MAX_RANKS + 2];
  const double eq[2] = {1, 1}, zero[2] = {0, 0};
  assert_int_equal(shares_cut(100, 16, zero, 2, b), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "every rank's weight is 0"));
  const double bad[4][2] = {{1, -1}, {1, NAN}, {1, INFINITY}, {1, 2e9}};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(shares_cut(100, 16, bad[k], 2, b), MOLE_ERR_ARG);
    assert_non_null(strstr(mole_last_error(), "rank 1's weight"));
  }
  assert_int_equal(shares_cut(-1, 16, eq, 2, b), MOLE_ERR_ARG);
  assert_int_equal(shares_cut(100, 0, eq, 2, b), MOLE_ERR_ARG);
  assert_int_equal(shares_cut(100, -16, eq, 2, b), MOLE_ERR_ARG);
  assert_int_equal(shares_cut(100, 16, eq, 0, b), MOLE_ERR_ARG);
  double many[SHARES_MAX_RANKS + 1];
  for (int r = 0; r <= SHARES_MAX_RANKS; r++) many[r] = 1;
  assert_int_equal(shares_cut(100, 16, many, SHARES_MAX_RANKS + 1, b), MOLE_ERR_ARG);
  // the largest counts: no overflow, still every item once
  check_cut(INT64_MAX / 2, 1 << 20, eq, 2);
  check_cut(INT64_MAX, 1, many, SHARES_MAX_RANKS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit_proportional), cmocka_unit_test(test_fit_memory_caps), cmocka_unit_test(test_fit_hostile),
      cmocka_unit_test(test_cut_granularity),  cmocka_unit_test(test_cut_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
