// base: errors, allocator accounting, thread pool splitting.
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "testutil.h"

static void test_errorf(void **st) {
  (void)st;
  mole_status s = mole_errorf(MOLE_ERR_FORMAT, "x.gguf: offset %d: bad", 8);
  assert_int_equal(s, MOLE_ERR_FORMAT);
  assert_string_equal(mole_last_error(), "x.gguf: offset 8: bad");
  mole_error_prefix(s, "load: ");
  assert_string_equal(mole_last_error(), "load: x.gguf: offset 8: bad");
}

static void test_alloc(void **st) {
  (void)st;
  size_t before = mole_mem_current();
  char *p = mole_malloc(1000);
  assert_non_null(p);
  assert_int_equal(mole_mem_current(), before + 1000);
  p = mole_realloc(p, 5000);
  assert_int_equal(mole_mem_current(), before + 5000);
  mole_free(p);
  assert_int_equal(mole_mem_current(), before);
  void *a = mole_aligned_alloc(64, 100);
  assert_int_equal((uintptr_t)a % 64, 0);
  memset(a, 1, 100);
  mole_aligned_free(a);
  assert_int_equal(mole_mem_current(), before);
}

typedef struct {
  int64_t n;
  int *hits;
} split_ctx;

static void split_job(void *ctx, int ith, int nth) {
  split_ctx *c = ctx;
  int64_t r0, r1;
  mole_split(c->n, ith, nth, &r0, &r1);
  for (int64_t i = r0; i < r1; i++) c->hits[i]++;
}

static void test_pool(void **st) {
  (void)st;
  for (int nth = 1; nth <= 4; nth++) {
    mole_pool *p;
    assert_int_equal(mole_pool_init(nth, &p), MOLE_OK);
    int hits[37] = {0};
    split_ctx c = {37, hits};
    for (int rep = 0; rep < 100; rep++) mole_pool_run(p, split_job, &c);
    for (int i = 0; i < 37; i++) assert_int_equal(hits[i], 100);
    mole_pool_free(p);
  }
  mole_pool *p;
  assert_int_equal(mole_pool_init(0, &p), MOLE_ERR_ARG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errorf),
      cmocka_unit_test(test_alloc),
      cmocka_unit_test(test_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
