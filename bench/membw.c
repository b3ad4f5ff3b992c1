// membw: memory read bandwidth with N threads (the floor for decode is
// bytes read per token / this). Usage: membw [threads] [MiB]
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"

typedef struct {
  const __m256i *buf;
  int64_t n;  // vectors
  __m256i acc[64];
} job;

static void reader(void *ctx, int ith, int nth) {
  job *j = ctx;
  int64_t r0, r1;
  mole_split(j->n / 4, ith, nth, &r0, &r1);
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = r0 * 4; i < r1 * 4; i += 4) {
    a = _mm256_xor_si256(a, _mm256_load_si256(j->buf + i));
    b = _mm256_xor_si256(b, _mm256_load_si256(j->buf + i + 1));
    c = _mm256_xor_si256(c, _mm256_load_si256(j->buf + i + 2));
    d = _mm256_xor_si256(d, _mm256_load_si256(j->buf + i + 3));
  }
  j->acc[ith] = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
}

int main(int argc, char **argv) {
  int nth = argc > 1 ? atoi(argv[1]) : 2;
  int64_t mib = argc > 2 ? atoll(argv[2]) : 1024;
  if (nth < 1 || nth > 64 || mib < 16) {
    fprintf(stderr, "usage: membw [threads 1..64] [MiB >= 16]\n");
    return 2;
  }
  size_t bytes = (size_t)mib << 20;
  void *buf = mole_aligned_alloc(64, bytes);
  if (!buf) return 1;
  // random contents: identical pages could be merged by the host (KSM) and
  // then read from cache
  uint64_t s = 88172645463325252ull;
  for (size_t i = 0; i < bytes / 8; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    ((uint64_t *)buf)[i] = s;
  }
  mole_pool *pool;
  if (mole_pool_init(nth, &pool)) return 1;
  job j = {buf, (int64_t)(bytes / 32), {{0}}};
  double best = 0;
  for (int r = 0; r < 5; r++) {
    int64_t t0 = mole_time_us();
    mole_pool_run(pool, reader, &j);
    double gbs = (double)bytes / 1e3 / (double)(mole_time_us() - t0);
    if (gbs > best) best = gbs;
  }
  printf("%.2f\n", best);
  mole_pool_free(pool);
  mole_aligned_free(buf);
  return 0;
}
