// quant: the tables of the ISA levels (complete, consistent), reference
// conversions (known values, round trips), every SIMD kernel against its
// scalar twin on random data at awkward sizes at each ISA level this CPU has,
// and the kernel scratch bound.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "quant/quant.h"
#include "quant/quant_internal.h"
#include "quant/quant_table.h"
#include "testutil.h"

static const quant_type k_weight_types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                            QT_Q8_0, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K};
#define N_WEIGHT_TYPES (sizeof k_weight_types / sizeof k_weight_types[0])

static void fill(uint64_t *st, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = tu_rand_uniform(st, lo, hi);
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static int max_level(void) {
  int m = quant_force_isa(99);
  return m;
}

// ---- traits --------------------------------------------------------------------

static void test_traits(void **st) {
  (void)st;
  quant_init();
  for (int t = 0; t < QT_COUNT; t++) {
    const quant_traits *a = quant_traits_of((quant_type)t), *r = quant_traits_ref((quant_type)t);
    assert_true((a == NULL) == (r == NULL));
    if (!a) continue;
    if (quant_is_blob(t)) {  // compressed experts (quant_tq.h): named, float activations, no row conversions
      assert_false(quant_type_known((uint32_t)t));
      assert_string_equal(a->name, quant_type_name((uint32_t)t));
      assert_int_equal(a->vec_dot_type, QT_F32);
      assert_null(a->to_float);
      assert_false(quant_type_supported((uint32_t)t));
      continue;
    }
    assert_true(quant_type_known((uint32_t)t));
    assert_int_equal(a->blck_size, quant_blck_size((uint32_t)t));
    assert_int_equal(a->type_size, quant_type_size((uint32_t)t));
    assert_string_equal(a->name, quant_type_name((uint32_t)t));
    assert_non_null(a->to_float);
    assert_non_null(a->from_float);
  }
  for (size_t i = 0; i < N_WEIGHT_TYPES; i++) assert_true(quant_type_supported(k_weight_types[i]));
  assert_false(quant_type_supported(QT_Q8_K));
  assert_false(quant_type_supported(16));  // iq2_xxs: known geometry, no kernels
  assert_false(quant_type_supported(1000));
  assert_int_equal(quant_traits_of(QT_Q4_0)->vec_dot_type, QT_Q8_0);
  assert_int_equal(quant_traits_of(QT_Q5_0)->vec_dot_type, QT_Q8_0);
  assert_int_equal(quant_traits_of(QT_Q4_1)->vec_dot_type, QT_Q8_1);
  assert_int_equal(quant_traits_of(QT_Q5_1)->vec_dot_type, QT_Q8_1);
  assert_int_equal(quant_traits_of(QT_Q6_K)->vec_dot_type, QT_Q8_K);
  assert_int_equal(quant_traits_of(QT_F16)->vec_dot_type, QT_F16);
  assert_int_equal(quant_traits_of(QT_BF16)->vec_dot_type, QT_BF16);
  assert_int_equal(quant_traits_of(QT_F32)->vec_dot_type, QT_F32);
  assert_true(quant_traits_of(QT_Q4_0)->is_quantized && !quant_traits_of(QT_F16)->is_quantized);
  assert_int_equal(quant_force_isa(0), 0);
  assert_string_equal(quant_isa_name(), "scalar");
  assert_int_equal(quant_level(), 0);
  int m = max_level();
  mole_log(MOLE_LOG_INFO, "quant: best ISA %s", quant_isa_name());
  assert_true(m >= 0 && m <= QUANT_ISA_TOP && quant_level() == m);
  assert_null(quant_table_at(QUANT_ISA_TOP + 1));
}

// Every level's table has a row for each type of the reference's, with the
// same geometry and the same kinds of kernels (a level may only swap in its
// own); the rows in use are the level's.
static void test_tables(void **st) {
  (void)st;
  for (int lvl = 0; lvl <= QUANT_ISA_TOP; lvl++) {
    const quant_row *tab = quant_table_at(lvl);
    for (int t = 0; t < QT_COUNT; t++) {
      const quant_row *a = &tab[t], *r = &quant_table_ref[t];
      const char *what = quant_isa_level_name(lvl);
      if ((a->tr.name == NULL) != (r->tr.name == NULL)) fail_msg("%s: type %d in one table only", what, t);
      if (!r->tr.name) continue;
      assert_string_equal(a->tr.name, r->tr.name);
      if (a->tr.blck_size != r->tr.blck_size || a->tr.type_size != r->tr.type_size ||
          a->tr.is_quantized != r->tr.is_quantized || a->tr.vec_dot_type != r->tr.vec_dot_type || a->r16 != r->r16)
        fail_msg("%s %s: geometry differs from the reference's", what, r->tr.name);
      if ((a->tr.to_float == NULL) != (r->tr.to_float == NULL) || (a->tr.from_float == NULL) != (r->tr.from_float == NULL) ||
          (a->tr.vec_dot == NULL) != (r->tr.vec_dot == NULL) || (a->tile == NULL) != (r->tile == NULL) ||
          (a->blob_gemm == NULL) != (r->blob_gemm == NULL))
        fail_msg("%s %s: kernels missing or extra against the reference's", what, r->tr.name);
      if (a->tile_r16 && (a->r16 == QR16_NONE || !a->tile)) fail_msg("%s %s: R16 kernel without R16 orders", what, r->tr.name);
      if (a->gemm && a->tile) fail_msg("%s %s: a gemm beside the exact tiles", what, r->tr.name);
    }
    if (lvl <= max_level()) {
      quant_force_isa(lvl);
      assert_ptr_equal(quant_traits_of(QT_Q4_0), &tab[QT_Q4_0].tr);
    }
  }
  quant_force_isa(99);
  for (int t = 0; t < QT_COUNT; t++)
    if (quant_table_ref[t].tr.name && !quant_is_blob(t))
      assert_true(quant_table_ref[t].tr.type_size == quant_type_size((uint32_t)t));
}

// ---- f16 / bf16 known values ------------------------------------------------------

static void test_f16_known(void **st) {
  (void)st;
  assert_int_equal(quant_f32_to_f16(0.0f), 0x0000);
  assert_int_equal(quant_f32_to_f16(-0.0f), 0x8000);
  assert_int_equal(quant_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(quant_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(quant_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(quant_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(quant_f32_to_f16(65520.0f), 0x7c00);  // tie rounds to even: inf
  assert_int_equal(quant_f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(quant_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(quant_f32_to_f16(-INFINITY), 0xfc00);
  uint16_t hn = quant_f32_to_f16(NAN);
  assert_true((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
  assert_int_equal(quant_f32_to_f16(0x1p-14f), 0x0400);  // smallest normal
  assert_int_equal(quant_f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  assert_int_equal(quant_f32_to_f16(0x1p-25f), 0x0000);  // tie to even (0)
  assert_int_equal(quant_f32_to_f16(0x1.8p-25f), 0x0001);
  assert_int_equal(quant_f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to even (2)
  assert_int_equal(quant_f32_to_f16(0x1.4p-24f), 0x0001);
  assert_int_equal(quant_f32_to_f16(0x1.ffcp-15f), 0x0400);  // rounds up into normal
  assert_int_equal(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie: even
  assert_int_equal(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: even (up)
  assert_int_equal(quant_f32_to_f16(1.0f + 0x1.01p-11f), 0x3c01);
  assert_int_equal(quant_f32_to_f16(1e-30f), 0x0000);
  assert_int_equal(quant_f32_to_f16(bitsf(1)), 0x0000);  // f32 subnormal
  assert_true(quant_f16_to_f32(0x7c00) == INFINITY);
  assert_true(isnan(quant_f16_to_f32(0x7e00)));
  assert_true(quant_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(quant_f16_to_f32(0x83ff) == -0x1.ff8p-15f);
  assert_true(quant_f16_to_f32(0x3555) == 0x1.554p-2f);
  // every half survives f16 -> f32 -> f16 (NaNs stay NaN)
  for (uint32_t h = 0; h < 65536; h++) {
    float f = quant_f16_to_f32((uint16_t)h);
    uint16_t back = quant_f32_to_f16(f);
    if (isnan(f))
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
    else
      assert_int_equal(back, h);
  }
}

static void test_bf16_known(void **st) {
  (void)st;
  assert_int_equal(quant_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(quant_f32_to_bf16(bitsf(0x3f808000)), 0x3f80);  // tie, even down
  assert_int_equal(quant_f32_to_bf16(bitsf(0x3f818000)), 0x3f82);  // tie, even up
  assert_int_equal(quant_f32_to_bf16(bitsf(0x3f808001)), 0x3f81);
  assert_int_equal(quant_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(quant_f32_to_bf16(-INFINITY), 0xff80);
  assert_int_equal(quant_f32_to_bf16(bitsf(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  assert_int_equal(quant_f32_to_bf16(bitsf(0x7f800001)), 0x7fc0);  // sNaN quieted
  assert_int_equal(quant_f32_to_bf16(bitsf(0x00008000)), 0x0000);  // subnormal tie: even
  assert_int_equal(quant_f32_to_bf16(bitsf(0x00018000)), 0x0002);
  assert_true(quant_bf16_to_f32(0x4049) == bitsf(0x40490000));
  assert_true(quant_bf16_to_f32(0xc000) == -2.0f);
}

// The SIMD row conversions equal the scalar ones bit for bit, specials included.
static void test_float_rows(void **st) {
  (void)st;
  uint64_t s = 7;
  const int64_t n = 65536 + 13;
  float *x = tu_xalloc(n * 4), *a = tu_xalloc(n * 4), *b = tu_xalloc(n * 4);
  uint16_t *ha = tu_xalloc(n * 2), *hb = tu_xalloc(n * 2);
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65520.0f, 65519.99f, 0x1p-25f, 0x1.8p-24f,
                           0x1p-14f, 0x1.ffcp-15f, bitsf(1), bitsf(0x3f808000), bitsf(0x3f818000), 1e-8f, -3e-6f,
                           bitsf(0x7f7fffff), bitsf(0x7f800001), 1.0f + 0x1p-11f};
  for (int64_t i = 0; i < n; i++) {
    uint32_t r = (uint32_t)tu_rand_u64(&s);
    x[i] = (i % 3 == 0) ? bitsf(r) : tu_rand_uniform(&s, -70000.f, 70000.f) * (i % 5 ? 1e-4f : 1.0f);
  }
  memcpy(x, special, sizeof special);
  for (int lvl = 0; lvl <= max_level(); lvl++) {
    quant_force_isa(lvl);
    for (int ti = 0; ti < 2; ti++) {
      quant_type t = ti ? QT_BF16 : QT_F16;
      const quant_traits *A = quant_traits_of(t), *R = quant_traits_ref(t);
      const int64_t lens[] = {n, 1, 15, 17, 31, 33};
      for (size_t li = 0; li < 6; li++) {
        int64_t len = lens[li];
        memset(ha, 0xab, n * 2);
        memset(hb, 0xab, n * 2);
        A->from_float(x, ha, len);
        R->from_float(x, hb, len);
        assert_memory_equal(ha, hb, n * 2);  // also: nothing written past len
      }
      // every bit pattern back to float
      for (int64_t i = 0; i < 65536; i++) ha[i] = (uint16_t)i;
      A->to_float(ha, a, 65536 + 0);
      R->to_float(ha, b, 65536);
      for (int64_t i = 0; i < 65536; i++) {
        if (isnan(b[i]))
          assert_true(isnan(a[i]));
        else
          assert_int_equal(fbits(a[i]), fbits(b[i]));
      }
      A->to_float(ha + 3, a, 21);  // odd length
      R->to_float(ha + 3, b, 21);
      assert_memory_equal(a, b, 21 * 4);
    }
  }
  quant_force_isa(99);
  mole_aligned_free(x);
  mole_aligned_free(a);
  mole_aligned_free(b);
  mole_aligned_free(ha);
  mole_aligned_free(hb);
}

// ---- known blocks ---------------------------------------------------------------------

static void test_known_blocks(void **st) {
  (void)st;
  float y[256];
  blk_q4_0 b4 = {.d = quant_f32_to_f16(0.5f)};
  for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
  quant_traits_ref(QT_Q4_0)->to_float(&b4, y, 32);
  for (int j = 0; j < 16; j++) {
    assert_true(y[j] == (j - 8) * 0.5f);
    assert_true(y[j + 16] == (15 - j - 8) * 0.5f);
  }
  blk_q4_1 b41 = {.d = quant_f32_to_f16(0.25f), .m = quant_f32_to_f16(-1.0f)};
  for (int j = 0; j < 16; j++) b41.qs[j] = (uint8_t)(j | (j << 4));
  quant_traits_ref(QT_Q4_1)->to_float(&b41, y, 32);
  for (int j = 0; j < 32; j++) assert_true(y[j] == (j % 16) * 0.25f - 1.0f);
  blk_q5_0 b5 = {.d = quant_f32_to_f16(2.0f), .qh = {0x0f, 0, 0, 0x80}};  // high bit on 0..3 and 31
  for (int j = 0; j < 16; j++) b5.qs[j] = (uint8_t)(j | (j << 4));
  quant_traits_ref(QT_Q5_0)->to_float(&b5, y, 32);
  for (int j = 0; j < 32; j++) {
    int q = (j % 16) + ((j < 4 || j == 31) ? 16 : 0);
    assert_true(y[j] == (q - 16) * 2.0f);
  }
  blk_q8_0 b8 = {.d = quant_f32_to_f16(0.125f)};
  for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 8 - 127);
  quant_traits_ref(QT_Q8_0)->to_float(&b8, y, 32);
  for (int j = 0; j < 32; j++) assert_true(y[j] == (j * 8 - 127) * 0.125f);

  // q8_0 activation quantizer: amax 127 gives id 1; ties round to even
  float x[32] = {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f, -127};
  blk_q8_0 q;
  quant_traits_ref(QT_Q8_0)->from_float(x, &q, 32);
  const int8_t want[] = {127, 0, 2, 2, 0, -2, -2, 3, -127};
  assert_memory_equal(q.qs, want, sizeof want);
  assert_true(quant_f16_to_f32(q.d) == quant_f16_to_f32(quant_f32_to_f16(1.0f)));
  blk_q8_1 q1;
  quant_traits_ref(QT_Q8_1)->from_float(x, &q1, 32);
  assert_true(quant_f16_to_f32(q1.s) == 3.0f);  // 127+0+2+2+0-2-2+3-127

  // q4_K: group j has scale j+1, min j; d = 1, dmin = 0.5; code = element % 16
  blk_q4_K k4 = {.d = quant_f32_to_f16(1.0f), .dmin = quant_f32_to_f16(0.5f)};
  for (int j = 0; j < 8; j++) {
    int sc = j + 1 + (j >= 4 ? 32 : 0), m = j + (j >= 4 ? 16 : 0);  // exercise the high bits
    if (j < 4) {
      k4.scales[j] = (uint8_t)sc;
      k4.scales[j + 4] = (uint8_t)m;
    } else {
      k4.scales[j + 4] = (uint8_t)((sc & 15) | ((m & 15) << 4));
      k4.scales[j - 4] |= (uint8_t)((sc >> 4) << 6);
      k4.scales[j] |= (uint8_t)((m >> 4) << 6);
    }
  }
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) k4.qs[c * 32 + l] = (uint8_t)((l % 16) | (((l + 1) % 16) << 4));
  quant_traits_ref(QT_Q4_K)->to_float(&k4, y, 256);
  for (int e = 0; e < 256; e++) {
    int g = e / 32, sc = g + 1 + (g >= 4 ? 32 : 0), m = g + (g >= 4 ? 16 : 0);
    int code = (e % 64) < 32 ? (e % 32) % 16 : ((e % 32) + 1) % 16;
    assert_true(y[e] == (float)(sc * code) - 0.5f * m);
  }

  // q6_K: all codes 33 (value +1), scales g-8, d = 0.5
  blk_q6_K k6;
  memset(&k6, 0, sizeof k6);
  k6.d = quant_f32_to_f16(0.5f);
  for (int g = 0; g < 16; g++) k6.scales[g] = (int8_t)(g - 8);
  memset(k6.ql, 0x11, 128);  // low nibbles 1
  memset(k6.qh, 0xaa, 64);   // 2-bit highs = 2 -> code 32 + 1
  quant_traits_ref(QT_Q6_K)->to_float(&k6, y, 256);
  for (int e = 0; e < 256; e++) assert_true(y[e] == 0.5f * (e / 16 - 8));
}

// ---- round trips --------------------------------------------------------------------------

// max |x - dequant(quant(x))| / max|x| for x uniform in [-1, 1]
static float rt_bound(quant_type t) {
  switch (t) {
    case QT_F32: return 0;
    case QT_F16: return 5e-4f;
    case QT_BF16: return 4e-3f;
    case QT_Q8_0: case QT_Q8_1: case QT_Q8_K: return 4.5e-3f;
    case QT_Q6_K: return 0.04f;
    case QT_Q5_0: return 0.07f;  // -amax clamps one step (llama.cpp's quantizer)
    case QT_Q5_1: return 0.04f;
    case QT_Q5_K: return 0.06f;
    case QT_Q4_0: return 0.13f;
    case QT_Q4_1: return 0.08f;
    case QT_Q4_K: return 0.1f;
    case QT_Q3_K: return 0.3f;
    case QT_Q2_K: return 0.45f;
    default: return 0;
  }
}

static void test_round_trip(void **st) {
  (void)st;
  uint64_t s = 1;
  const int64_t n = 256 * 12;
  float *x = tu_xalloc(n * 4), *y = tu_xalloc(n * 4), *z = tu_xalloc(n * 4);
  void *q = tu_xalloc(n * 4), *q2 = tu_xalloc(n * 4);
  fill(&s, x, n, -1, 1);
  memset(x + 256, 0, 256 * 4);  // an all-zero super-block
  for (int64_t i = 512; i < 768; i++) x[i] = 0.01f * x[i] + 3.0f;  // offset, all positive
  for (int t = 0; t < QT_COUNT; t++) {
    const quant_traits *R = quant_traits_ref((quant_type)t);
    if (!R || quant_is_blob(t)) continue;  // blobs: test_tq
    R->from_float(x, q, n);
    R->to_float(q, y, n);
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
      float scale = (i >= 512 && i < 768) ? 3.02f : 1.0f;
      e = fmax(e, fabs(x[i] - y[i]) / scale);
    }
    for (int64_t i = 256; i < 512; i++) assert_true(y[i] == 0.0f);
    if (e > rt_bound((quant_type)t)) fail_msg("%s: round-trip error %g > %g", R->name, e, rt_bound((quant_type)t));
    // the active table dequantizes the same bytes identically
    for (int lvl = 0; lvl <= max_level(); lvl++) {
      quant_force_isa(lvl);
      quant_traits_of((quant_type)t)->to_float(q, z, n);
      assert_memory_equal(y, z, n * 4);
      quant_traits_of((quant_type)t)->from_float(x, q2, n);
      // weight quantizers may differ in method; their output must decode close
      quant_traits_ref((quant_type)t)->to_float(q2, z, n);
      for (int64_t i = 0; i < n; i++) assert_true(fabsf(z[i] - x[i]) <= 3.02f * rt_bound((quant_type)t) + 1e-7f);
    }
    quant_force_isa(99);
  }
  mole_aligned_free(x);
  mole_aligned_free(y);
  mole_aligned_free(z);
  mole_aligned_free(q);
  mole_aligned_free(q2);
}

// ---- activation quantizers: SIMD == ref, byte for byte -----------------------------------

static void test_act_quant(void **st) {
  (void)st;
  uint64_t s = 3;
  const int64_t n = 256 * 9;
  float *x = tu_xalloc(n * 4);
  uint8_t *a = tu_xalloc(n * 2), *b = tu_xalloc(n * 2);
  for (int rep = 0; rep < 20; rep++) {
    fill(&s, x, n, -2, 2);
    if (rep == 1) memset(x + 256, 0, 256 * 4);
    if (rep == 2)
      for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(x[i] * 100)) * 0.5f;  // many ties
    if (rep == 3) x[700] = -50;  // negative extreme
    if (rep == 4) {
      x[300] = 9;
      x[301] = -9;  // equal magnitudes: the first wins
    }
    for (int lvl = 0; lvl <= max_level(); lvl++) {
      quant_force_isa(lvl);
      const quant_type ts[] = {QT_Q8_0, QT_Q8_1, QT_Q8_K};
      for (int i = 0; i < 3; i++) {
        for (int64_t len = quant_blck_size(ts[i]); len <= n; len = len * 3 + quant_blck_size(ts[i])) {
          int64_t m = len - len % quant_blck_size(ts[i]);
          memset(a, 0x5a, n * 2);
          memset(b, 0x5a, n * 2);
          quant_traits_of(ts[i])->from_float(x, a, m);
          quant_traits_ref(ts[i])->from_float(x, b, m);
          assert_memory_equal(a, b, n * 2);
        }
      }
    }
  }
  quant_force_isa(99);
  mole_aligned_free(x);
  mole_aligned_free(a);
  mole_aligned_free(b);
}

// ---- vec_dot: SIMD vs ref at awkward sizes ---------------------------------------------------

typedef struct {
  quant_type t;
  int64_t n;
  void *w, *a;      // weight row, activation row (vec_dot_type)
  double mag;       // sum |w_i a_i| of the dequantized values
  double exact;     // sum w_i a_i of the dequantized values
} dot_case;

static void make_case(dot_case *c, quant_type t, int64_t n, uint64_t *s) {
  const quant_traits *R = quant_traits_ref(t);
  const quant_traits *V = quant_traits_ref(R->vec_dot_type);
  float *x = tu_xalloc(n * 4), *y = tu_xalloc(n * 4), *dx = tu_xalloc(n * 4), *dy = tu_xalloc(n * 4);
  fill(s, x, n, -1, 1);
  fill(s, y, n, -3, 3);
  for (int64_t i = 0; i < n; i += 97) y[i] *= 8;  // outliers
  c->t = t;
  c->n = n;
  c->w = tu_xalloc(quant_row_size(t, n) + 64);
  c->a = tu_xalloc(quant_row_size(R->vec_dot_type, n) + 64);
  R->from_float(x, c->w, n);
  V->from_float(y, c->a, n);
  R->to_float(c->w, dx, n);
  V->to_float(c->a, dy, n);
  c->mag = 0;
  c->exact = 0;
  for (int64_t i = 0; i < n; i++) {
    c->mag += fabs((double)dx[i] * dy[i]);
    c->exact += (double)dx[i] * dy[i];
  }
  mole_aligned_free(x);
  mole_aligned_free(y);
  mole_aligned_free(dx);
  mole_aligned_free(dy);
}

static void free_case(dot_case *c) {
  mole_aligned_free(c->w);
  mole_aligned_free(c->a);
}

static void test_vec_dot(void **st) {
  (void)st;
  uint64_t s = 11;
  const int64_t nblk[] = {1, 3, 4, 7, 8, 37, 64};
  const int64_t nflt[] = {1, 15, 16, 17, 63, 64, 100, 1000, 4096 + 7};
  for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
    quant_type t = k_weight_types[ti];
    int64_t bs = quant_blck_size(t);
    bool k = bs == 256;
    size_t ns = bs == 1 ? 9 : k ? 5 : 7;
    for (size_t si = 0; si < ns; si++) {
      int64_t n = bs == 1 ? nflt[si] : nblk[si] * bs;
      dot_case c;
      make_case(&c, t, n, &s);
      float ref;
      quant_traits_ref(t)->vec_dot(n, &ref, c.w, c.a);
      // q8_1 carries sum(y)*d rounded to f16, which the dequantized dot lacks
      bool q81 = quant_traits_ref(t)->vec_dot_type == QT_Q8_1;
      double tol_exact = (q81 ? 1e-3 : 2e-5) * c.mag + 1e-6;
      if (fabs(ref - c.exact) > tol_exact)
        fail_msg("%s n=%lld: ref %g vs dequantized dot %g", quant_type_name(t), (long long)n, ref, c.exact);
      for (int lvl = 1; lvl <= max_level(); lvl++) {
        quant_force_isa(lvl);
        float got = NAN;
        quant_traits_of(t)->vec_dot(n, &got, c.w, c.a);
        double tol = 1e-5 * c.mag + 1e-6;
        if (!(fabs(got - ref) <= tol))
          fail_msg("%s n=%lld isa %s: %.9g vs ref %.9g (tol %g)", quant_type_name(t), (long long)n,
                   quant_isa_name(), got, ref, tol);
      }
      quant_force_isa(99);
      free_case(&c);
    }
  }
}

// ---- gemm: vs vec_dot ref loops, with edges of every tile -------------------------------------

static void check_gemm(quant_type t, int64_t rows, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, uint64_t *s) {
  const quant_traits *R = quant_traits_ref(t);
  quant_type vt = R->vec_dot_type;
  size_t wstride = quant_row_size(t, k) + 8 * (size_t)quant_type_size(t);  // padded rows
  size_t xstride = quant_row_size(vt, k);
  int64_t ldy = rows + 5;
  char *W = tu_xalloc(wstride * rows), *X = tu_xalloc(xstride * n_tok + 64);
  float *buf = tu_xalloc(k * 4), *Y = tu_xalloc(ldy * n_tok * 4), *ref = tu_xalloc(ldy * n_tok * 4);
  double *mag = tu_xalloc(ldy * n_tok * 8);
  float *dw = tu_xalloc(rows * k * 4), *dx = tu_xalloc(n_tok * k * 4);
  for (int64_t i = 0; i < rows; i++) {
    fill(s, buf, k, -1, 1);
    R->from_float(buf, W + i * wstride, k);
    R->to_float(W + i * wstride, dw + i * k, k);
  }
  for (int64_t j = 0; j < n_tok; j++) {
    fill(s, buf, k, -2, 2);
    quant_traits_ref(vt)->from_float(buf, X + j * xstride, k);
    quant_traits_ref(vt)->to_float(X + j * xstride, dx + j * k, k);
  }
  for (int64_t j = 0; j < n_tok; j++)
    for (int64_t i = 0; i < ldy; i++) {
      ref[j * ldy + i] = -12345.0f;
      if (i >= i0 && i < i1) {
        R->vec_dot(k, &ref[j * ldy + i], W + i * wstride, X + j * xstride);
        double m = 0;
        for (int64_t e = 0; e < k; e++) m += fabs((double)dw[i * k + e] * dx[j * k + e]);
        mag[j * ldy + i] = m;
      }
    }
  for (int lvl = 0; lvl <= max_level(); lvl++) {
    quant_force_isa(lvl);
    for (int64_t e = 0; e < ldy * n_tok; e++) Y[e] = -12345.0f;
    quant_gemm(t, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
    for (int64_t j = 0; j < n_tok; j++)
      for (int64_t i = 0; i < ldy; i++) {
        float g = Y[j * ldy + i], r = ref[j * ldy + i];
        if (i < i0 || i >= i1) {
          if (g != -12345.0f) fail_msg("%s: gemm wrote outside rows [%lld,%lld)", R->name, (long long)i0, (long long)i1);
          continue;
        }
        double tol = 1e-5 * mag[j * ldy + i] + 1e-6;
        if (!(fabs(g - r) <= tol))
          fail_msg("%s isa %s rows %lld tok %lld k %lld: Y[%lld][%lld] %.9g vs %.9g", R->name, quant_isa_name(),
                   (long long)rows, (long long)n_tok, (long long)k, (long long)j, (long long)i, g, r);
      }
  }
  quant_force_isa(99);
  mole_aligned_free(W);
  mole_aligned_free(X);
  mole_aligned_free(buf);
  mole_aligned_free(Y);
  mole_aligned_free(ref);
  mole_aligned_free(mag);
  mole_aligned_free(dw);
  mole_aligned_free(dx);
}

static void test_gemm(void **st) {
  (void)st;
  uint64_t s = 5;
  const int64_t toks[] = {1, 3, 4, 5, 8, 13};
  for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
    quant_type t = k_weight_types[ti];
    int64_t bs = quant_blck_size(t);
    int64_t ks[3];
    if (bs == 256) {
      ks[0] = 256, ks[1] = 768, ks[2] = 256 * 9;
    } else if (bs == 32) {
      ks[0] = 32, ks[1] = 32 * 7, ks[2] = 32 * 37;
    } else {
      ks[0] = 16, ks[1] = 100, ks[2] = 1000;
    }
    for (int ki = 0; ki < 3; ki++)
      for (size_t tj = 0; tj < sizeof toks / sizeof toks[0]; tj++) {
        int64_t nt = toks[tj];
        check_gemm(t, 11, 0, 11, nt, ks[ki], &s);
        if (ki == 1) check_gemm(t, 21, 2, 19, nt, ks[ki], &s);
      }
  }
  // chunks of k whose partial sums add up in Y, with partial last steps
  check_gemm(QT_Q8_0, 9, 0, 9, 6, 32 * 133, &s);
  check_gemm(QT_Q4_1, 5, 0, 5, 3, 32 * 133, &s);
  check_gemm(QT_Q5_0, 6, 1, 6, 5, 32 * 129, &s);
  check_gemm(QT_F16, 6, 1, 6, 5, 2100, &s);
  check_gemm(QT_BF16, 5, 0, 5, 7, 4097, &s);
  check_gemm(QT_F32, 5, 0, 5, 4, 2049, &s);
  check_gemm(QT_Q6_K, 5, 0, 5, 9, 256 * 17, &s);
  if (!tu_asan()) {
    check_gemm(QT_Q4_0, 70, 3, 69, 67, 4096, &s);  // several row/token chunks
    check_gemm(QT_F16, 9, 0, 9, 70, 256, &s);
  }
}

// ---- scratch: quant_scratch_bytes covers every kernel ------------------------------------------
// Every weight type at every level, rows and R16, one token and more than a
// tile call takes (512), in a pool whose scratch is exactly
// quant_scratch_bytes(k): a kernel asking for more aborts (MOLE_ASSERT).

typedef struct {
  quant_type t;
  quant_layout lay;
  const char *W;
  size_t wstride;
  const char *X;
  size_t xstride;
  float *Y;
  int64_t rows, n_tok, k;
} bound_job;

static void bound_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  const bound_job *j = ctx;
  const quant_op op = {.n_rows = j->rows};
  quant_gemm_op(j->t, j->lay, j->W, j->wstride, j->X, j->xstride, j->Y, j->rows, 0, j->rows, j->n_tok, j->k, &op);
}

static void test_scratch_bound(void **st) {
  (void)st;
  uint64_t s = 9;
  const int64_t rows = 32, n_tok = 520, k = tu_asan() ? 1024 : 4096;
  mole_pool *pool;
  assert_int_equal(mole_pool_init(1, &pool), MOLE_OK);
  assert_int_equal(mole_pool_reserve(pool, quant_scratch_bytes(k)), MOLE_OK);
  float *buf = tu_xalloc((size_t)k * sizeof(float)), *Y = tu_xalloc((size_t)(rows * n_tok) * sizeof(float));
  for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
    const quant_type t = k_weight_types[ti];
    const quant_traits *R = quant_traits_ref(t), *V = quant_traits_ref(R->vec_dot_type);
    bound_job j = {.t = t, .wstride = quant_row_size(t, k), .xstride = quant_row_size(R->vec_dot_type, k), .Y = Y,
                   .rows = rows, .n_tok = n_tok, .k = k};
    char *W = tu_xalloc(j.wstride * (size_t)rows), *P = tu_xalloc(j.wstride * (size_t)rows);
    char *X = tu_xalloc(j.xstride * (size_t)n_tok);
    for (int64_t i = 0; i < rows; i++) {
      fill(&s, buf, k, -1, 1);
      R->from_float(buf, W + (size_t)i * j.wstride, k);
    }
    for (int64_t i = 0; i < n_tok; i++) {
      fill(&s, buf, k, -1, 1);
      V->from_float(buf, X + (size_t)i * j.xstride, k);
    }
    const bool r16 = quant_r16_supported(t, rows);
    if (r16) quant_r16_pack(t, W, P, k, rows, 0, rows / 16);
    j.X = X;
    for (int lvl = 0; lvl <= max_level(); lvl++) {
      quant_force_isa(lvl);
      for (int64_t nt = 1; nt <= n_tok; nt += n_tok - 1) {
        j.n_tok = nt;
        j.lay = QL_ROWS, j.W = W;
        mole_pool_run(pool, bound_worker, &j);
        if (!r16) continue;
        j.lay = QL_R16, j.W = P;
        mole_pool_run(pool, bound_worker, &j);
      }
    }
    quant_force_isa(99);
    mole_aligned_free(W);
    mole_aligned_free(P);
    mole_aligned_free(X);
  }
  mole_aligned_free(buf);
  mole_aligned_free(Y);
  mole_pool_free(pool);
}

int main(void) {
  if (mole_scratch_reserve((size_t)64 << 20)) return 1;  // the kernels' scratch on this thread
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_traits),      cmocka_unit_test(test_tables),       cmocka_unit_test(test_f16_known),
      cmocka_unit_test(test_bf16_known),  cmocka_unit_test(test_float_rows),   cmocka_unit_test(test_known_blocks),
      cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_act_quant),    cmocka_unit_test(test_vec_dot),
      cmocka_unit_test(test_gemm),        cmocka_unit_test(test_scratch_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
