// quant_exact: the llama.cpp-order kernels. Every level's table (AVX2,
// AVX-512; NEON) against the scalar references bit for bit on random data at
// awkward sizes (every tile edge), the choice of order per op, and golden
// hashes of outputs that llama.cpp's CPU backend computed on the same inputs
// (mul_mat / mul_mat_id through ggml with its repack buffers and llamafile,
// as llama-cli runs).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "quant/quant.h"
#include "quant/quant_exact.h"
#include "quant/quant_internal.h"
#include "quant/quant_table.h"
#include "testutil.h"

// ---- deterministic inputs (integer arithmetic only: the same bits on every
// compiler, so that the golden hashes hold) --------------------------------------------

static uint64_t nx(uint64_t *s) { return tu_rand_u64(s); }

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// activations: +-[0.25, 2) with a few x8 outliers
static float gen_act(uint64_t *s) {
  uint64_t u = nx(s);
  uint32_t e = 125 + (uint32_t)((u >> 40) & 3) + (((u >> 50) & 31) == 0 ? 3 : 0);
  return bitsf((uint32_t)(u >> 63) << 31 | e << 23 | (uint32_t)(u & 0x7fffff));
}

// float weights: +-[1/64, 1/8)
static float gen_wf(uint64_t *s) {
  uint64_t u = nx(s);
  uint32_t e = 121 + (uint32_t)((u >> 40) & 3);
  return bitsf((uint32_t)(u >> 63) << 31 | e << 23 | (uint32_t)(u & 0x7fffff));
}

static uint16_t gen_h(uint64_t *s, int exp) {  // f16 +[2^(exp-15), 2^(exp-14))
  return (uint16_t)(exp << 10 | (nx(s) & 0x3ff));
}

// One weight row of type t, k elements: random codes and scales.
static void gen_wrow(uint64_t *s, quant_type t, int64_t k, void *row) {
  const size_t bytes = quant_row_size(t, k);
  uint8_t *p = row;
  if (t == QT_F32) {
    for (int64_t i = 0; i < k; i++) ((float *)row)[i] = gen_wf(s);
    return;
  }
  if (t == QT_F16) {
    for (int64_t i = 0; i < k; i++) {
      const uint64_t u = nx(s);
      const uint16_t h = gen_h(s, 9 + (int)(u & 3));
      ((uint16_t *)row)[i] = (uint16_t)((u >> 8 & 1) << 15 | h);
    }
    return;
  }
  if (t == QT_BF16) {
    for (int64_t i = 0; i < k; i++) {
      uint32_t u;
      float f = gen_wf(s);
      memcpy(&u, &f, 4);
      ((uint16_t *)row)[i] = (uint16_t)(u >> 16);
    }
    return;
  }
  for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)nx(s);
  const int64_t nb = k / quant_blck_size(t);
  for (int64_t b = 0; b < nb; b++) {
    switch (t) {
      case QT_Q8_0: {
        blk_q8_0 *x = (blk_q8_0 *)row + b;
        x->d = gen_h(s, 7);
        for (int j = 0; j < 32; j++)
          if (x->qs[j] == -128) x->qs[j] = -127;
        break;
      }
      case QT_Q4_0: ((blk_q4_0 *)row)[b].d = gen_h(s, 8); break;
      case QT_Q4_K: ((blk_q4_K *)row)[b].d = gen_h(s, 6), ((blk_q4_K *)row)[b].dmin = gen_h(s, 6); break;
      case QT_Q5_K: ((blk_q5_K *)row)[b].d = gen_h(s, 5), ((blk_q5_K *)row)[b].dmin = gen_h(s, 6); break;
      case QT_Q6_K: ((blk_q6_K *)row)[b].d = gen_h(s, 5); break;
      default: fail_msg("gen_wrow: type %d", (int)t);
    }
  }
}

static quant_type vec_type(quant_type t) { return quant_traits_ref(t)->vec_dot_type; }

// the SIMD levels this CPU runs (AVX2, AVX-512; NEON): each one's twins are checked
static int top_level(void) { return quant_force_isa(99); }

// the row of type t in the table of level lvl
static const quant_row *row_at(int lvl, quant_type t) { return &quant_table_at(lvl)[t]; }

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// ---- order choice ---------------------------------------------------------------------

static void test_orders(void **st) {
  (void)st;
  qx_op dense = {.n_rows = 256, .expert = false}, expert = {.n_rows = 256, .expert = true}, odd = {.n_rows = 12, .expert = false}, none = {.n_rows = 0, .expert = false};
  assert_int_equal(quant_exact_order(QT_Q8_0, &dense, 7, 6, 256), QX_Q8_0);
  assert_int_equal(quant_exact_order(QT_Q4_0, &dense, 7, 6, 256), QX_Q4_0_C1);
  assert_int_equal(quant_exact_order(QT_Q4_0, &odd, 7, 6, 256), QX_Q4_0_L8);
  assert_int_equal(quant_exact_order(QT_Q4_K, &dense, 7, 3, 256), QX_Q4_K_V64);
  assert_int_equal(quant_exact_order(QT_Q4_K, &dense, 7, 4, 256), QX_Q4_K_V256);
  assert_int_equal(quant_exact_order(QT_Q4_K, &dense, 3, 0, 256), QX_Q4_K_V256);
  assert_int_equal(quant_exact_order(QT_Q4_K, &expert, 8, 0, 256), QX_Q4_K_V256);
  assert_int_equal(quant_exact_order(QT_Q4_K, &odd, 8, 0, 256), QX_Q4_K_K8);
  assert_int_equal(quant_exact_order(QT_Q4_K, &none, 8, 0, 256), QX_Q4_K_V64);
  assert_int_equal(quant_exact_order(QT_Q5_K, &dense, 8, 0, 256), QX_Q5_K_K8);
  assert_int_equal(quant_exact_order(QT_Q6_K, &expert, 8, 0, 256), QX_Q6_K_K8);
  assert_int_equal(quant_exact_order(QT_F32, &dense, 2, 0, 256), QX_F32_T16);
  assert_int_equal(quant_exact_order(QT_F32, &dense, 1, 0, 256), QX_F32_VEC);
  assert_int_equal(quant_exact_order(QT_F32, &expert, 5, 0, 256), QX_F32_VEC);
  assert_int_equal(quant_exact_order(QT_F32, &dense, 5, 0, 250), QX_F32_VEC);
  assert_int_equal(quant_exact_order(QT_F32, &(qx_op){.n_rows = 10, .expert = false}, 5, 0, 256), QX_F32_VEC);
  assert_int_equal(quant_exact_order(QT_F16, &odd, 5, 0, 256), QX_F16_T16);
  assert_int_equal(quant_exact_order(QT_BF16, &dense, 5, 0, 48), QX_BF16_VEC);
  assert_int_equal(quant_exact_order(QT_BF16, &dense, 5, 0, 64), QX_BF16_T32);
  assert_int_equal(quant_exact_order(QT_Q4_1, &dense, 5, 0, 64), QX_NONE);
  // a type has tiles at every level exactly when it has orders
  for (int lvl = 0; lvl <= QUANT_ISA_TOP; lvl++)
    for (int t = 0; t < QT_COUNT; t++)
      if ((row_at(lvl, (quant_type)t)->tile != NULL) != (quant_exact_order((quant_type)t, &dense, 1, 0, 256) != QX_NONE))
        fail_msg("level %s, %s: tile and orders disagree", quant_isa_level_name(lvl), quant_type_name((uint32_t)t));
}

// ---- SIMD twins vs references --------------------------------------------------------------

typedef struct {
  qx_order o;
  quant_type t;
} order_type;

static const order_type k_orders[] = {
    {QX_Q8_0, QT_Q8_0},     {QX_Q4_0_L8, QT_Q4_0},   {QX_Q4_0_C1, QT_Q4_0},   {QX_Q4_K_K8, QT_Q4_K},
    {QX_Q4_K_V256, QT_Q4_K}, {QX_Q4_K_V64, QT_Q4_K}, {QX_Q5_K_K8, QT_Q5_K},   {QX_Q6_K_K8, QT_Q6_K},
    {QX_F32_VEC, QT_F32},   {QX_F32_T16, QT_F32},    {QX_F16_VEC, QT_F16},    {QX_F16_T16, QT_F16},
    {QX_BF16_VEC, QT_BF16}, {QX_BF16_T32, QT_BF16},
};
#define N_ORDERS (sizeof k_orders / sizeof k_orders[0])

// k values an order accepts, awkward ones included
static int k_list(qx_order o, int64_t *ks) {
  switch (o) {
    case QX_Q8_0: case QX_Q4_0_L8: case QX_Q4_0_C1:
      ks[0] = 32, ks[1] = 96, ks[2] = 32 * 131;
      return 3;
    case QX_F32_VEC: case QX_F16_VEC: case QX_BF16_VEC: {
      static const int64_t v[] = {1, 7, 8, 15, 16, 17, 24, 31, 63, 64, 65, 100, 127, 129, 2100};
      memcpy(ks, v, sizeof v);
      return (int)(sizeof v / sizeof v[0]);
    }
    case QX_F32_T16: case QX_F16_T16:
      ks[0] = 16, ks[1] = 48, ks[2] = 2064;
      return 3;
    case QX_BF16_T32:
      ks[0] = 32, ks[1] = 96, ks[2] = 4128;
      return 3;
    default:
      ks[0] = 256, ks[1] = 768, ks[2] = 256 * 9;
      return 3;
  }
}

// activation rows of the vec_dot type of t from gen_act floats
static void gen_xrows(uint64_t *s, quant_type t, int64_t k, int64_t n, char *X, size_t xstride) {
  float *f = tu_xalloc((size_t)k * sizeof(float));
  for (int64_t j = 0; j < n; j++) {
    for (int64_t i = 0; i < k; i++) f[i] = gen_act(s);
    quant_traits_ref(vec_type(t))->from_float(f, X + (size_t)j * xstride, k);
  }
  mole_aligned_free(f);
}

// One output in every order at awkward k, each level against the reference:
// the tile of one row and one token (what a level's tile does with a single
// output: its per-output kernel, or its panels with one live lane), and the
// vec_dot of the one-token orders.
static void test_dot_twins(void **st) {
  (void)st;
  if (top_level() == 0) skip();
  uint64_t s = 11;
  const qx_op one = {.n_rows = 0, .expert = false};
  for (size_t oi = 0; oi < N_ORDERS; oi++) {
    const qx_order o = k_orders[oi].o;
    const quant_type t = k_orders[oi].t;
    int64_t ks[16];
    const int nk = k_list(o, ks);
    for (int ki = 0; ki < nk; ki++) {
      const int64_t k = ks[ki];
      char *w = tu_xalloc(quant_row_size(t, k)), *x = tu_xalloc(quant_row_size(vec_type(t), k));
      const bool one_token = quant_exact_order(t, &one, 1, 0, k) == o;
      for (int rep = 0; rep < 4; rep++) {
        gen_wrow(&s, t, k, w);
        gen_xrows(&s, t, k, 1, x, 0);
        float a = -1, b = -2;
        quant_exact_dot_ref(o, k, &a, w, x);
        for (int lvl = 0; lvl <= top_level(); lvl++) {
          row_at(lvl, t)->tile(o, w, 0, x, 0, &b, 1, 0, 1, 0, 1, k);
          if (fbits(a) != fbits(b))
            fail_msg("order %d k %lld: ref %.9g, %s tile %.9g", (int)o, (long long)k, a, quant_isa_level_name(lvl), b);
          if (!one_token) continue;
          row_at(lvl, t)->tr.vec_dot(k, &b, w, x);
          if (fbits(a) != fbits(b))
            fail_msg("order %d k %lld: ref %.9g, %s vec_dot %.9g", (int)o, (long long)k, a, quant_isa_level_name(lvl), b);
        }
      }
      mole_aligned_free(w);
      mole_aligned_free(x);
    }
  }
}

// tiles: rows [i0, i1) of a matrix of `rows`, tokens [j0, j1) of n; nothing
// else written
static void check_tile(uint64_t *s, qx_order o, quant_type t, int64_t k, int64_t rows, int64_t i0, int64_t i1,
                       int64_t n, int64_t j0, int64_t j1) {
  const size_t wstride = quant_row_size(t, k) + 2 * quant_type_size(t), xstride = quant_row_size(vec_type(t), k) + 4;
  const int64_t ldy = rows + 3;
  char *W = tu_xalloc(wstride * (size_t)rows), *X = tu_xalloc(xstride * (size_t)n);
  float *Y0 = tu_xalloc(sizeof(float) * (size_t)(ldy * n)), *Y1 = tu_xalloc(sizeof(float) * (size_t)(ldy * n));
  for (int64_t i = 0; i < rows; i++) gen_wrow(s, t, k, W + (size_t)i * wstride);
  gen_xrows(s, t, k, n, X, xstride);
  for (int64_t e = 0; e < ldy * n; e++) Y0[e] = -7.0f;
  quant_exact_tile_ref(o, W, wstride, X, xstride, Y0, ldy, i0, i1, j0, j1, k);
  for (int lvl = 1; lvl <= top_level(); lvl++) {
  for (int64_t e = 0; e < ldy * n; e++) Y1[e] = -7.0f;
  row_at(lvl, t)->tile(o, W, wstride, X, xstride, Y1, ldy, i0, i1, j0, j1, k);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < ldy; i++) {
      const float a = Y0[j * ldy + i], b = Y1[j * ldy + i];
      const bool in = i >= i0 && i < i1 && j >= j0 && j < j1;
      if (!in && (a != -7.0f || b != -7.0f)) fail_msg("order %d: wrote outside the tile at [%lld][%lld]", (int)o,
                                                      (long long)j, (long long)i);
      if (fbits(a) != fbits(b))
        fail_msg("order %d k %lld rows [%lld,%lld) tok [%lld,%lld): Y[%lld][%lld] ref %.9g %s %.9g", (int)o,
                 (long long)k, (long long)i0, (long long)i1, (long long)j0, (long long)j1, (long long)j, (long long)i,
                 a, quant_isa_level_name(lvl), b);
    }
  }
  mole_aligned_free(W);
  mole_aligned_free(X);
  mole_aligned_free(Y0);
  mole_aligned_free(Y1);
}

static void test_tile_twins(void **st) {
  (void)st;
  if (top_level() == 0) skip();
  uint64_t s = 23;
  for (size_t oi = 0; oi < N_ORDERS; oi++) {
    const qx_order o = k_orders[oi].o;
    const quant_type t = k_orders[oi].t;
    int64_t ks[16];
    k_list(o, ks);
    const int64_t k = ks[1];
    check_tile(&s, o, t, k, 37, 3, 37, 9, 0, 9);  // 34 rows: partial 16/8/4-row tiles
    check_tile(&s, o, t, k, 16, 0, 16, 4, 1, 4);  // exact tiles, a token offset
    check_tile(&s, o, t, k, 5, 1, 2, 1, 0, 1);    // one output
    check_tile(&s, o, t, ks[2], 21, 0, 21, 6, 2, 6);
  }
  // q8_0 with many tokens x blocks: per-token data computed in the loop, not cached
  check_tile(&s, QX_Q8_0, QT_Q8_0, 32 * 131, 9, 0, 9, 60, 0, 60);
}

// quant_exact_gemm: tokens split by order (q4_K: gemm tokens then gemv ones),
// = per-token references
static void test_gemm_split(void **st) {
  (void)st;
  uint64_t s = 5;
  const struct {
    quant_type t;
    int64_t rows, n, k;
    qx_op op;
  } cases[] = {
      {QT_Q4_K, 24, 7, 512, {.n_rows = 24, .expert = false}}, {QT_Q4_K, 24, 6, 256, {.n_rows = 24, .expert = true}}, {QT_Q4_K, 12, 5, 256, {.n_rows = 12, .expert = false}},
      {QT_Q4_0, 20, 5, 64, {.n_rows = 20, .expert = false}},  {QT_BF16, 8, 5, 96, {.n_rows = 8, .expert = false}},   {QT_BF16, 8, 1, 96, {.n_rows = 8, .expert = false}},
      {QT_F32, 9, 3, 80, {.n_rows = 9, .expert = false}},     {QT_F16, 8, 4, 48, {.n_rows = 8, .expert = true}},     {QT_Q6_K, 9, 3, 256, {.n_rows = 0, .expert = false}},
  };
  for (int lvl = 0; lvl <= top_level(); lvl++) {
    quant_force_isa(lvl);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      const quant_type t = cases[c].t;
      const int64_t rows = cases[c].rows, n = cases[c].n, k = cases[c].k;
      const size_t wstride = quant_row_size(t, k), xstride = quant_row_size(vec_type(t), k);
      char *W = tu_xalloc(wstride * (size_t)rows), *X = tu_xalloc(xstride * (size_t)n);
      float *Y = tu_xalloc(sizeof(float) * (size_t)(rows * n));
      for (int64_t i = 0; i < rows; i++) gen_wrow(&s, t, k, W + (size_t)i * wstride);
      gen_xrows(&s, t, k, n, X, xstride);
      assert_true(quant_exact_gemm(t, &cases[c].op, QL_ROWS, W, wstride, X, xstride, Y, rows, 0, rows, n, k));
      for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < rows; i++) {
          float r;
          quant_exact_dot_ref(quant_exact_order(t, &cases[c].op, n, j, k), k, &r, W + (size_t)i * wstride,
                              X + (size_t)j * xstride);
          if (fbits(r) != fbits(Y[j * rows + i]))
            fail_msg("case %zu isa %s: Y[%lld][%lld] %.9g vs ref %.9g", c, quant_isa_name(), (long long)j,
                     (long long)i, Y[j * rows + i], r);
        }
      // per-type vec_dot: the one-token order (rows taken as a multiple of 8)
      const qx_op one = {.n_rows = 0, .expert = false};
      for (int lv = 0; lv <= top_level(); lv++) {
        float a, r;
        row_at(lv, t)->tr.vec_dot(k, &a, W, X);
        quant_exact_dot_ref(quant_exact_order(t, &one, 1, 0, k), k, &r, W, X);
        assert_int_equal(fbits(a), fbits(r));
      }
      mole_aligned_free(W);
      mole_aligned_free(X);
      mole_aligned_free(Y);
    }
  }
  quant_force_isa(99);
}

// ---- the R16 layout ------------------------------------------------------------------------------

static const order_type k_r16[] = {{QX_Q4_0_C1, QT_Q4_0},   {QX_Q8_0, QT_Q8_0},     {QX_Q4_K_V256, QT_Q4_K},
                                   {QX_Q4_K_V64, QT_Q4_K}, {QX_Q6_K_K8, QT_Q6_K}, {QX_Q5_K_K8, QT_Q5_K}};

// A random matrix of `rows` rows in row layout and its R16 copy.
static void gen_r16(uint64_t *s, quant_type t, int64_t k, int64_t rows, char **W, char **R) {
  const size_t rb = quant_row_size(t, k);
  *W = tu_xalloc(rb * (size_t)rows);
  *R = tu_xalloc(rb * (size_t)rows);
  for (int64_t i = 0; i < rows; i++) gen_wrow(s, t, k, *W + (size_t)i * rb);
  // in two calls, as threads would pack it
  const int64_t ng = rows / 16;
  quant_r16_pack(t, *W, *R, k, rows, 0, ng / 2);
  quant_r16_pack(t, *W, *R, k, rows, ng / 2, ng);
}

static void test_r16_layout(void **st) {
  (void)st;
  uint64_t s = 41;
  const quant_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q5_K};
  const int64_t rows_list[] = {16, 24, 40, 64};
  for (size_t ti = 0; ti < 5; ti++)
    for (size_t ri = 0; ri < 4; ri++) {
      const quant_type t = types[ti];
      const int64_t k = t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K ? 512 : 96, rows = rows_list[ri];
      assert_true(quant_r16_supported(t, rows));
      const size_t rb = quant_row_size(t, k);
      char *W, *R;
      gen_r16(&s, t, k, rows, &W, &R);
      char *back = tu_xalloc(rb * (size_t)rows);
      quant_r16_rows(t, R, k, rows, 0, rows, back);
      assert_memory_equal(back, W, rb * (size_t)rows);
      // the same bytes, rearranged: a byte histogram is unchanged except for
      // the q8_0 codes stored + 128
      if (t != QT_Q8_0 && t != QT_Q6_K) {
        int64_t h0[256] = {0}, h1[256] = {0};
        for (size_t i = 0; i < rb * (size_t)rows; i++) h0[(uint8_t)W[i]]++, h1[(uint8_t)R[i]]++;
        assert_memory_equal(h0, h1, sizeof h0);
      }
      // the tail rows keep their offsets
      const int64_t tail = rows / 16 * 16;
      assert_memory_equal(R + (size_t)tail * rb, W + (size_t)tail * rb, (size_t)(rows - tail) * rb);
      mole_aligned_free(W);
      mole_aligned_free(R);
      mole_aligned_free(back);
    }
  // which matrices can be R16: the repack orders need rows % 8 == 0
  assert_true(quant_r16_supported(QT_Q8_0, 17));
  assert_false(quant_r16_supported(QT_Q4_0, 20));
  assert_false(quant_r16_supported(QT_Q4_K, 36));
  assert_false(quant_r16_supported(QT_Q4_0, 8));
  assert_true(quant_r16_supported(QT_Q6_K, 17));
  assert_true(quant_r16_supported(QT_Q5_K, 17));
  assert_false(quant_r16_supported(QT_Q5_K, 15));
  assert_false(quant_r16_supported(QT_Q5_0, 64));
  assert_false(quant_r16_supported(QT_F32, 64));
}

// R16 tiles: the reference and every level's group kernel (AVX-512: every
// R16 type; AVX2: q4_0, q4_K) against the row-layout reference on the same
// weights, every token count of the register paths and beyond, partial
// panels, nothing written outside
static void test_r16_tiles(void **st) {
  (void)st;
  uint64_t s = 43;
  for (size_t oi = 0; oi < sizeof k_r16 / sizeof k_r16[0]; oi++) {
    const qx_order o = k_r16[oi].o;
    const quant_type t = k_r16[oi].t;
    int64_t ks[16];
    k_list(o, ks);
    const int64_t shapes[][4] = {{48, 0, 48, 1}, {48, 16, 48, 2}, {32, 0, 32, 3}, {64, 0, 48, 4}, {32, 0, 24, 5},
                                 {48, 0, 48, 9}, {16, 0, 16, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const int64_t rows = shapes[si][0], i0 = shapes[si][1], i1 = shapes[si][2], n = shapes[si][3];
      const int64_t k = ks[si % 3];
      const size_t rb = quant_row_size(t, k), xstride = quant_row_size(vec_type(t), k) + 4;
      const int64_t ldy = rows + 3;
      char *W, *R, *X = tu_xalloc(xstride * (size_t)n);
      gen_r16(&s, t, k, rows, &W, &R);
      gen_xrows(&s, t, k, n, X, xstride);
      float *Y0 = tu_xalloc(sizeof(float) * (size_t)(ldy * n)), *Y1 = tu_xalloc(sizeof(float) * (size_t)(ldy * n));
      for (int64_t e = 0; e < ldy * n; e++) Y0[e] = -7.0f;
      quant_exact_tile_ref(o, W, rb, X, xstride, Y0, ldy, i0, i1, 0, n, k);
      for (int lvl = -1; lvl <= top_level(); lvl++) {  // -1: the reference
        const qx_tile_r16_fn tile = lvl < 0 ? quant_exact_tile_r16_ref : row_at(lvl, t)->tile_r16;
        if (!tile) continue;
        for (int64_t e = 0; e < ldy * n; e++) Y1[e] = -7.0f;
        tile(o, t, R, rows, X, xstride, Y1, ldy, i0, i1, 0, n, k);
        for (int64_t e = 0; e < ldy * n; e++)
          if (fbits(Y0[e]) != fbits(Y1[e]))
            fail_msg("order %d rows %lld [%lld,%lld) n %lld k %lld: r16 %s Y[%lld][%lld] %.9g vs ref %.9g", (int)o,
                     (long long)rows, (long long)i0, (long long)i1, (long long)n, (long long)k,
                     lvl < 0 ? "ref" : quant_isa_level_name(lvl), (long long)(e / ldy), (long long)(e % ldy), Y1[e],
                     Y0[e]);
      }
      mole_aligned_free(W);
      mole_aligned_free(R);
      mole_aligned_free(X);
      mole_aligned_free(Y0);
      mole_aligned_free(Y1);
    }
  }
}

// quant_gemm_op on an R16 matrix with a tail (rows % 16 == 8) = the same on
// the row layout, at every ISA level (below AVX-512: rows converted back)
static void test_r16_gemm(void **st) {
  (void)st;
  uint64_t s = 47;
  const struct {
    quant_type t;
    int64_t rows, n, k;
    bool expert;
  } cases[] = {{QT_Q4_0, 40, 1, 64, false}, {QT_Q4_0, 40, 7, 64, true}, {QT_Q8_0, 37, 3, 96, false},
               {QT_Q4_K, 24, 7, 512, false}, {QT_Q4_K, 24, 2, 256, true}, {QT_Q8_0, 48, 6, 32, true},
               {QT_Q6_K, 37, 3, 512, false}, {QT_Q6_K, 16, 1, 256, true},
               // one token: q8_0 pairs groups from the two halves of each thread's rows
               {QT_Q8_0, 100, 1, 96, false}, {QT_Q8_0, 64, 1, 32, true}, {QT_Q8_0, 17, 1, 64, false},
               {QT_Q8_0, 80, 2, 64, false}, {QT_Q4_0, 112, 1, 96, false}, {QT_Q4_0, 48, 1, 32, true},
               {QT_Q4_0, 64, 2, 64, true}, {QT_Q4_0, 96, 3, 96, false}, {QT_Q4_0, 80, 4, 32, true},
               // 2-8 tokens: q8_0 passes one token at a time over each pair of groups
               {QT_Q8_0, 112, 5, 64, true}, {QT_Q8_0, 80, 8, 96, false},
               // pairs too long for L2: a group at a time (several tokens), or still paired (one)
               {QT_Q8_0, 48, 3, 16384, false}, {QT_Q8_0, 64, 1, 16384, true}};
  for (int lvl = 0; lvl <= QUANT_ISA_TOP; lvl++) {
    quant_force_isa(lvl);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      const quant_type t = cases[c].t;
      const int64_t rows = cases[c].rows, n = cases[c].n, k = cases[c].k;
      const size_t rb = quant_row_size(t, k), xstride = quant_row_size(vec_type(t), k);
      char *W, *R, *X = tu_xalloc(xstride * (size_t)n);
      gen_r16(&s, t, k, rows, &W, &R);
      gen_xrows(&s, t, k, n, X, xstride);
      float *Y0 = tu_xalloc(sizeof(float) * (size_t)(rows * n)), *Y1 = tu_xalloc(sizeof(float) * (size_t)(rows * n));
      const quant_op op = {.n_rows = rows, .expert = cases[c].expert};
      quant_gemm_op(t, QL_ROWS, W, rb, X, xstride, Y0, rows, 0, rows, n, k, &op);
      // split as two threads would: on a group boundary
      const int64_t mid = rows / 32 * 16;
      quant_gemm_op(t, QL_R16, R, rb, X, xstride, Y1, rows, 0, mid, n, k, &op);
      quant_gemm_op(t, QL_R16, R, rb, X, xstride, Y1, rows, mid, rows, n, k, &op);
      for (int64_t e = 0; e < rows * n; e++)
        if (fbits(Y0[e]) != fbits(Y1[e]))
          fail_msg("case %zu isa %s: Y[%lld] r16 %.9g rows %.9g", c, quant_isa_name(), (long long)e, Y1[e], Y0[e]);
      mole_aligned_free(W);
      mole_aligned_free(R);
      mole_aligned_free(X);
      mole_aligned_free(Y0);
      mole_aligned_free(Y1);
    }
  }
  quant_force_isa(99);
}

// ---- golden: llama.cpp's outputs ------------------------------------------------------------------
// Inputs from the generators above (seed 1000 + case index): weights
// rows x k, then n activation rows of k floats converted with this build's
// from_float. FNV-1a of the output bits, [token][row], as llama.cpp computed
// them (ggml CPU backend, AVX-512 VNNI/BF16 build; f16 from a build without
// AVX512-FP16, the one the conformance references come from).

typedef struct {
  quant_type t;
  int64_t k, rows, n;
  bool expert;
  uint64_t hash;
} golden_case;

static const golden_case k_golden[] = {
#include "test_quant_exact_golden.inc"
};

static uint64_t fnv(const float *y, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = fbits(y[i]);
    for (int b = 0; b < 4; b++) h = (h ^ ((u >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

static void test_golden(void **st) {
  (void)st;
  // the scalar twins, then every SIMD level this CPU runs (AVX2, AVX-512; NEON)
  for (int lvl = 0; lvl <= top_level(); lvl++) {
    quant_force_isa(lvl);
    for (size_t c = 0; c < sizeof k_golden / sizeof k_golden[0]; c++) {
      const golden_case *g = &k_golden[c];
      uint64_t s = 1000 + c;
      const size_t wstride = quant_row_size(g->t, g->k), xstride = quant_row_size(vec_type(g->t), g->k);
      char *W = tu_xalloc(wstride * (size_t)g->rows), *X = tu_xalloc(xstride * (size_t)g->n);
      float *f = tu_xalloc(sizeof(float) * (size_t)g->k), *Y = tu_xalloc(sizeof(float) * (size_t)(g->rows * g->n));
      for (int64_t i = 0; i < g->rows; i++) gen_wrow(&s, g->t, g->k, W + (size_t)i * wstride);
      for (int64_t j = 0; j < g->n; j++) {
        for (int64_t i = 0; i < g->k; i++) f[i] = gen_act(&s);
        quant_traits_of(vec_type(g->t))->from_float(f, X + (size_t)j * xstride, g->k);
      }
      const qx_op op = {.n_rows = g->rows, .expert = g->expert};
      assert_true(quant_exact_gemm(g->t, &op, QL_ROWS, W, wstride, X, xstride, Y, g->rows, 0, g->rows, g->n, g->k));
      for (int64_t e = 0; e < g->rows * g->n; e++) assert_true(isfinite(Y[e]));
      uint64_t h = fnv(Y, g->rows * g->n);
      if (h != g->hash)
        fail_msg("golden %zu (%s k %lld rows %lld n %lld %s) isa %s: hash %016llx, llama.cpp %016llx", c,
                 quant_type_name(g->t), (long long)g->k, (long long)g->rows, (long long)g->n,
                 g->expert ? "mul_mat_id" : "mul_mat", quant_isa_name(), (unsigned long long)h,
                 (unsigned long long)g->hash);
      if (quant_r16_supported(g->t, g->rows)) {  // the same through the R16 layout
        char *R = tu_xalloc(wstride * (size_t)g->rows);
        quant_r16_pack(g->t, W, R, g->k, g->rows, 0, g->rows / 16);
        memset(Y, 0, sizeof(float) * (size_t)(g->rows * g->n));
        assert_true(quant_exact_gemm(g->t, &op, QL_R16, R, wstride, X, xstride, Y, g->rows, 0, g->rows, g->n, g->k));
        h = fnv(Y, g->rows * g->n);
        if (h != g->hash)
          fail_msg("golden %zu (%s, R16) isa %s: hash %016llx, llama.cpp %016llx", c, quant_type_name(g->t),
                   quant_isa_name(), (unsigned long long)h, (unsigned long long)g->hash);
        mole_aligned_free(R);
      }
      mole_aligned_free(W);
      mole_aligned_free(X);
      mole_aligned_free(f);
      mole_aligned_free(Y);
    }
  }
  quant_force_isa(99);
}

int main(void) {
  quant_init();
  if (mole_scratch_reserve((size_t)64 << 20)) return 1;  // the kernels' scratch on this thread
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_orders),     cmocka_unit_test(test_dot_twins), cmocka_unit_test(test_tile_twins),
      cmocka_unit_test(test_gemm_split), cmocka_unit_test(test_r16_layout), cmocka_unit_test(test_r16_tiles),
      cmocka_unit_test(test_r16_gemm),   cmocka_unit_test(test_golden),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
