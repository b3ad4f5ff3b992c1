// membw: memory read bandwidth with N threads, the best of a few access
// patterns (the floor for decode is bytes read per token / this).
// Usage: membw [threads] [MiB] [reps]
//
// The buffer sits on huge pages (as mole's weights image does) and holds
// random bytes (identical pages could be merged by the host and then read
// from cache). Each thread reads its share as 1, 2 or 4 interleaved
// sequential streams: how many streams the hardware prefetchers keep busy
// differs between CPUs, and the floor should be the best this machine can
// do, not one pattern's. Prints GB/s (1e9 bytes per second).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "base/pool.h"

typedef struct {
  const char *buf;
  size_t bytes;
  int streams;
  __m256i acc[64];
} job;

static void reader(void *ctx, int ith, int nth) {
  job *j = ctx;
  const size_t share = j->bytes / (size_t)nth / 4096 * 4096, per = share / (size_t)j->streams / 512 * 512;
  const char *base = j->buf + share * (size_t)ith;
  __m256i a[8];  // AVX2: the same bandwidth as wider loads, and it runs everywhere
  for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_si256();
  for (size_t o = 0; o < per; o += 512)
    for (int s = 0; s < j->streams; s++) {
      const __m256i *q = (const __m256i *)(base + (size_t)s * per + o);
      for (int i = 0; i < 16; i++) a[i % 8] = _mm256_add_epi32(a[i % 8], _mm256_load_si256(q + i));
    }
  for (int i = 1; i < 8; i++) a[0] = _mm256_xor_si256(a[0], a[i]);
  j->acc[ith] = a[0];
}

int main(int argc, char **argv) {
  int nth = argc > 1 ? atoi(argv[1]) : 2;
  int64_t mib = argc > 2 ? atoll(argv[2]) : 1024;
  int reps = argc > 3 ? atoi(argv[3]) : 3;
  if (nth < 1 || nth > 64 || mib < 16 || reps < 1) {
    fprintf(stderr, "usage: membw [threads 1..64] [MiB >= 16] [reps >= 1]\n");
    return 2;
  }
  const size_t bytes = (size_t)mib << 20;
  char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    fprintf(stderr, "membw: cannot map %lld MiB\n", (long long)mib);
    return 1;
  }
  madvise(buf, bytes, MADV_HUGEPAGE);
  uint64_t s = 88172645463325252ull;
  for (size_t i = 0; i < bytes / 8; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    ((uint64_t *)buf)[i] = s;
  }
  mole_pool *pool;
  if (mole_pool_init(nth, &pool)) return 1;
  static job j;
  j.buf = buf;
  j.bytes = bytes;
  double best = 0;
  const int streams[] = {1, 2, 4};
  for (int r = 0; r < reps; r++)
    for (int si = 0; si < 3; si++) {
      j.streams = streams[si];
      const size_t read = bytes / (size_t)nth / 4096 * 4096 / (size_t)j.streams / 512 * 512 * (size_t)j.streams * (size_t)nth;
      int64_t t0 = mole_time_us();
      mole_pool_run(pool, reader, &j);
      double gbs = (double)read / 1e3 / (double)(mole_time_us() - t0);
      if (gbs > best) best = gbs;
    }
  printf("%.2f\n", best);
  mole_pool_free(pool);
  munmap(buf, bytes);
  return 0;
}
