// model ops: every ISA level's swiglu, axpy and p.V (AVX-512, NEON twins)
// equal their scalar references bit for bit at awkward sizes, and the level
// follows src/quant's; the polynomial exp is accurate; rope keeps norms.
#include <math.h>
#include <string.h>

#include "model/ops.h"
#include "testutil.h"

static void test_expf_poly(void **st) {
  (void)st;
  for (float x = -100.0f; x < 88.0f; x += 0.173f) {
    const float e = ops_expf_poly_ref(x), r = expf(x);
    assert_true(fabsf(e - r) <= 4e-7f * r + 1e-38f);
  }
  assert_true(ops_expf_poly_ref(-200.0f) == 0.0f);
  assert_true(isinf(ops_expf_poly_ref(200.0f)));
}

// the levels this CPU runs
static int top_level(void) { return quant_force_isa(99); }

// The kernels in use are those of quant's level, which MOLE_ISA and
// quant_force_isa set: AVX2 has no twins of its own (the references).
static void test_levels(void **st) {
  (void)st;
  assert_null(ops_kernels_at(QUANT_ISA_TOP + 1));
  assert_ptr_equal(ops_kernels_at(QUANT_ISA_SCALAR)->axpy, ops_axpy_ref);
#if defined(__aarch64__)
  assert_ptr_equal(ops_kernels_at(QUANT_ISA_NEON)->pv, ops_pv_neon);
#else
  assert_ptr_equal(ops_kernels_at(QUANT_ISA_AVX2)->swiglu, ops_swiglu_ref);
  assert_ptr_equal(ops_kernels_at(QUANT_ISA_AVX512)->swiglu, ops_swiglu_avx512);
#endif
  for (int lvl = 0; lvl <= top_level(); lvl++) {
    quant_force_isa(lvl);
    assert_int_equal(quant_level(), lvl);
  }
  quant_force_isa(99);
}

static void test_swiglu_simd_vs_ref(void **st) {
  (void)st;
  uint64_t rs = 7;
  const int64_t sizes[] = {1, 15, 16, 17, 31, 33, 96, 1408, 3583};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const int64_t n = sizes[k];
    float g[4096], u[4096], a[4096], b[4096];
    for (int64_t i = 0; i < n; i++) {
      g[i] = tu_rand_uniform(&rs, -30, 30);
      u[i] = tu_rand_uniform(&rs, -3, 3);
    }
    ops_swiglu_ref(a, g, u, n);
    for (int lvl = 0; lvl <= top_level(); lvl++) {
      ops_kernels_at(lvl)->swiglu(b, g, u, n);
      assert_memory_equal(a, b, (size_t)n * sizeof(float));
    }
    for (int64_t i = 0; i < n; i++) {
      const float want = g[i] / (1.0f + expf(-g[i])) * u[i];
      assert_true(fabsf(a[i] - want) <= 1e-6f * fabsf(want) + 1e-30f);
    }
  }
}

static void test_axpy_simd_vs_ref(void **st) {
  (void)st;
  uint64_t rs = 11;
  const int64_t sizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 128, 1023, 1025};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const int64_t n = sizes[k];
    float v[1040], a[1040], b[1040];
    for (int64_t i = 0; i < 1040; i++) {
      v[i] = tu_rand_uniform(&rs, -5, 5);
      a[i] = b[i] = tu_rand_uniform(&rs, -5, 5);
    }
    const float w = tu_rand_uniform(&rs, -2, 2);
    for (int lvl = 0; lvl <= top_level(); lvl++) {  // each level's, then the one in use
      ops_axpy_ref(a, v, w, n);
      ops_kernels_at(lvl)->axpy(b, v, w, n);
      assert_memory_equal(a, b, sizeof a);  // past n untouched too
      quant_force_isa(lvl);
      ops_axpy(b, v, w, n);
      ops_axpy_ref(a, v, w, n);
      assert_memory_equal(a, b, sizeof a);
    }
    quant_force_isa(99);
  }
}

// p.V over a tile of keys: every level's kernel and the dispatch give the bits
// of one ops_axpy_ref per key, at awkward widths (masked tails) and lengths
static void test_pv_simd_vs_ref(void **st) {
  (void)st;
  uint64_t rs = 13;
  const int64_t ds[] = {1, 15, 16, 17, 63, 64, 65, 128, 130}, ns[] = {0, 1, 2, 7, 32, 33};
  for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int64_t d = ds[di], n = ns[ni];
      float V[33 * 130], p[33], a[140], b[140], c[140];
      for (int64_t i = 0; i < 33 * 130; i++) V[i] = tu_rand_uniform(&rs, -3, 3);
      for (int64_t i = 0; i < 33; i++) p[i] = tu_rand_uniform(&rs, 0, 1);
      for (int64_t i = 0; i < 140; i++) a[i] = b[i] = c[i] = tu_rand_uniform(&rs, -1, 1);
      for (int64_t i = 0; i < n; i++) ops_axpy_ref(a, V + i * d, p[i], d);
      ops_pv_ref(b, p, V, n, d);
      assert_memory_equal(a, b, sizeof a);
      ops_pv(c, p, V, n, d);
      assert_memory_equal(a, c, sizeof a);  // past d untouched too
      for (int lvl = 0; lvl <= top_level(); lvl++) {
        for (int64_t i = 0; i < 140; i++) c[i] = b[i];
        for (int64_t i = 0; i < n; i++) ops_axpy_ref(b, V + i * d, p[i], d);
        ops_kernels_at(lvl)->pv(c, p, V, n, d);
        assert_memory_equal(b, c, sizeof b);
      }
    }
}

static void test_hsum16(void **st) {
  (void)st;
  float a[16];
  for (int i = 0; i < 16; i++) a[i] = (float)(i + 1);
  assert_true(ops_hsum16(a) == 136.0f);
}

static void test_rope_norm(void **st) {
  (void)st;
  model_hparams hp = {.n_rot = 16, .rope_base = 10000.0f, .rope_freq_scale = 1.0f};
  for (int neox = 0; neox < 2; neox++) {
    hp.rope_neox = neox;
    float x[2 * 16], y[2 * 16];
    uint64_t rs = 3;
    for (int i = 0; i < 32; i++) x[i] = y[i] = tu_rand_uniform(&rs, -1, 1);
    ops_rope(y, 2, 16, 37, &hp, NULL);
    double nx = 0, ny = 0;
    for (int i = 0; i < 32; i++) nx += x[i] * x[i], ny += y[i] * y[i];
    assert_true(fabs(nx - ny) < 1e-5 * nx);
    memcpy(y, x, sizeof y);
    ops_rope(y, 2, 16, 0, &hp, NULL);  // position 0 is the identity
    assert_memory_equal(x, y, sizeof y);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expf_poly),
      cmocka_unit_test(test_levels),
      cmocka_unit_test(test_swiglu_simd_vs_ref),
      cmocka_unit_test(test_axpy_simd_vs_ref),
      cmocka_unit_test(test_pv_simd_vs_ref),
      cmocka_unit_test(test_hsum16),
      cmocka_unit_test(test_rope_norm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
