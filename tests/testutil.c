#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

const char *tu_path(const char *rel) {
  static char bufs[8][4096];
  static int slot;
  char *b = bufs[slot++ & 7];
  const char *root = getenv("MOLE_SOURCE_DIR");
  snprintf(b, 4096, "%s/%s", root ? root : ".", rel);
  return b;
}

void *tu_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)(sz > 0 ? sz : 0) + 1);  // NUL-terminated for text files
  if (buf) buf[sz > 0 ? sz : 0] = 0;
  if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf && n) *n = (size_t)sz;
  return buf;
}

uint64_t tu_rand_u64(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

float tu_rand_uniform(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)((tu_rand_u64(s) >> 40) / (double)(1ull << 24));
}

float tu_gauss(uint64_t *s) {
  const float u = tu_rand_uniform(s, 1e-7f, 1.0f), v = tu_rand_uniform(s, 0.0f, 1.0f);
  return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

void *tu_xalloc(size_t n) {
  void *p = mole_aligned_alloc(64, n ? n : 1);
  MOLE_ASSERT(p);
  memset(p, 0, n);
  return p;
}

int tu_asan(void) {
  const char *e = getenv("MOLE_ASAN");
  return e && *e == '1';
}

int tu_emulated(void) {
  const char *e = getenv("MOLE_TEST_EMULATED");
  return e && *e == '1';
}

mole_model *tu_load_fixture(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "tests/data/conformance/models/%s.gguf", name);
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 2;
  mole_model *m;
  if (mole_model_load(tu_path(rel), &mp, &m)) fail_msg("load %s: %s", name, mole_last_error());
  return m;
}
