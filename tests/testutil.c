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

// The .inp buffer stays alive behind vector 0 (text points into it).
int tu_vectors_read(const char *inp_rel, const char *out_rel, tu_vector **out) {
  size_t inp_n = 0, out_n = 0;
  char *inp = tu_read_file(tu_path(inp_rel), &inp_n);
  char *outp = tu_read_file(tu_path(out_rel), &out_n);
  if (!inp || !outp) fail_msg("cannot read %s or %s", inp_rel, out_rel);
  static const char sep[] = "\n__ggml_vocab_test__\n";
  const char *s = inp, *end = inp + inp_n, *line = outp, *out_end = outp + out_n;
  int n = 0, cap = 64;
  tu_vector *v = malloc((size_t)cap * sizeof *v);
  while (v && s < end) {
    const char *e = memmem(s, (size_t)(end - s), sep, sizeof sep - 1);
    if (!e) e = end;
    const char *le = memchr(line, '\n', (size_t)(out_end - line));
    if (!le) le = out_end;
    if (n == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
    if (!v) break;
    tu_vector *t = &v[n++];
    *t = (tu_vector){s, (size_t)(e - s), malloc((size_t)(le - line) * sizeof(int32_t) + sizeof(int32_t)), 0};
    for (const char *p = line; p < le && t->ids;) {
      char *q;
      const long x = strtol(p, &q, 10);
      if (q == p) {
        p++;
        continue;
      }
      t->ids[t->n++] = (int32_t)x;
      p = q;
    }
    s = e + sizeof sep - 1;
    line = le < out_end ? le + 1 : out_end;
  }
  free(outp);
  if (!v || n == 0) fail_msg("%s: no vectors", inp_rel);
  *out = v;
  return n;
}

void tu_vectors_free(tu_vector *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) free(v[i].ids);
  free((void *)v[0].text);  // the .inp buffer
  free(v);
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
