// quant_tq: the compressed expert matrices. Dictionary validation (every kind
// of bad compact dictionary), TQ1 encode -> dequantize round trips, tq1_check
// against corrupted blobs, and the gemm kernels: every SIMD level bit-equal to
// the reference at awkward sizes, the reference within the int16 activation
// rounding of a double dot product. TQ2 likewise.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "quant/quant.h"
#include "quant/quant_tq.h"
#include "testutil.h"

// Ternary rows: Gaussian rows with s = max|w|, t = round(w / s * spread):
// spread 1 gives the ~92% zeros of real experts, larger spreads denser rows.
static void make_ternary(uint64_t *st, int8_t *t, float *scale, int64_t n_rows, int64_t k, float spread) {
  float *w = malloc((size_t)k * sizeof(float));
  for (int64_t r = 0; r < n_rows; r++) {
    float m = 0;
    for (int64_t j = 0; j < k; j++) {
      w[j] = tu_gauss(st);
      m = fmaxf(m, fabsf(w[j]));
    }
    const int kind = (int)(tu_rand_u64(st) % 8);
    for (int64_t j = 0; j < k; j++) {
      int v = (int)lrintf(w[j] / m * spread);
      v = v > 1 ? 1 : v < -1 ? -1 : v;
      if (kind == 0) v = 0;                               // an all-zero row
      if (kind == 1) v = (tu_rand_u64(st) & 1) ? 1 : -1;  // a row without zeros
      t[r * k + j] = (int8_t)v;
    }
    scale[r] = m * (0.5f + (float)r / (float)(n_rows + 1));
  }
  free(w);
}

// ---- a small dictionary builder (the real one is compress/codebook.c) ---------------
// Counts every run of pairs (at every even start, up to max_pairs) in a trie
// and keeps the 9 one-pair runs and then the most frequent runs; a run never
// counts more than its prefix, so the choice is prefix-closed, and ties go to
// the shorter run, so parents come before children.

typedef struct {
  int64_t n, cap;
  int64_t *cnt;
  int32_t *child, *parent;
  uint8_t *sym, *depth;
} trie;

static const trie *g_sort_trie;  // qsort has no context argument
static int cmp_idx(const void *a, const void *b) {
  const trie *tr = g_sort_trie;
  const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  const int ri = i < TQ_SYMBOLS, rj = j < TQ_SYMBOLS;
  if (ri != rj) return rj - ri;
  if (tr->cnt[i] != tr->cnt[j]) return tr->cnt[i] > tr->cnt[j] ? -1 : 1;
  if (tr->depth[i] != tr->depth[j]) return tr->depth[i] - tr->depth[j];
  return i - j;
}

static int sym_at(const int8_t *t) { return 3 * (t[0] + 1) + (t[1] + 1); }

// compact dictionary of at most n_max entries (malloc'd) from the rows t.
static uint8_t *build_compact(const int8_t *t, int64_t n_rows, int64_t k, int64_t n_max, int64_t max_nodes,
                              int max_pairs, int64_t *n_out) {
  trie tr = {.cap = max_nodes};
  tr.cnt = calloc((size_t)max_nodes, sizeof(int64_t));
  tr.child = malloc((size_t)max_nodes * TQ_SYMBOLS * sizeof(int32_t));
  tr.parent = malloc((size_t)max_nodes * sizeof(int32_t));
  tr.sym = malloc((size_t)max_nodes);
  tr.depth = malloc((size_t)max_nodes);
  memset(tr.child, 0xff, (size_t)max_nodes * TQ_SYMBOLS * sizeof(int32_t));
  for (int s = 0; s < TQ_SYMBOLS; s++) {
    tr.parent[s] = -1;
    tr.sym[s] = (uint8_t)s;
    tr.depth[s] = 1;
  }
  tr.n = TQ_SYMBOLS;
  for (int64_t r = 0; r < n_rows; r++) {
    const int8_t *row = t + r * k;
    for (int64_t p = 0; p < k; p += 2) {
      int32_t node = sym_at(row + p);
      tr.cnt[node]++;
      for (int64_t q = p + 2; q < k && q < p + 2 * max_pairs; q += 2) {
        const int s = sym_at(row + q);
        int32_t c = tr.child[node * TQ_SYMBOLS + s];
        if (c < 0) {
          if (tr.n == tr.cap) break;
          c = (int32_t)tr.n++;
          tr.child[node * TQ_SYMBOLS + s] = c;
          tr.parent[c] = node;
          tr.sym[c] = (uint8_t)s;
          tr.depth[c] = (uint8_t)(tr.depth[node] + 1);
        }
        tr.cnt[c]++;
        node = c;
      }
    }
  }
  int32_t *idx = malloc((size_t)tr.n * sizeof(int32_t)), *newid = malloc((size_t)tr.n * sizeof(int32_t));
  for (int64_t i = 0; i < tr.n; i++) idx[i] = (int32_t)i;
  g_sort_trie = &tr;
  qsort(idx, (size_t)tr.n, sizeof(int32_t), cmp_idx);
  const int64_t n = tr.n < n_max ? tr.n : n_max;
  uint8_t *compact = malloc((size_t)n * 3);
  for (int64_t i = 0; i < n; i++) newid[idx[i]] = (int32_t)i;
  for (int64_t i = 0; i < n; i++) {
    const int32_t node = idx[i];
    const uint16_t p1 = tr.parent[node] < 0 ? 0 : (uint16_t)(newid[tr.parent[node]] + 1);
    assert_true(tr.parent[node] < 0 || newid[tr.parent[node]] < i);
    memcpy(compact + 3 * i, &p1, 2);
    compact[3 * i + 2] = tr.sym[node];
  }
  free(idx);
  free(newid);
  free(tr.cnt);
  free(tr.child);
  free(tr.parent);
  free(tr.sym);
  free(tr.depth);
  *n_out = n;
  return compact;
}

// The books of the kernel tests, trained on ~90%-zero data plus some dense
// rows, so they have long zero runs, long dense runs and everything else:
// g_wide with runs up to TQ_PAIRS_MAX pairs (512-bit windows), g_win32 up to
// 32 weights (256-bit windows, the masks' kernel), g_narrow up to
// TQ_NARROW_PAIRS (256-bit windows and the packed table, as mole compress makes
// them). g_book is the one in use (g_wide unless a test says otherwise).
static tq_book *g_wide, *g_win32, *g_narrow, *g_book;

static int setup_book(void **state) {
  (void)state;
  quant_init();
  uint64_t st = 77;
  const int64_t rows = 96, k = 1024;
  int8_t *t = malloc((size_t)(rows * k));
  float *sc = malloc((size_t)rows * sizeof(float));
  make_ternary(&st, t, sc, rows, k, 1.0f);
  make_ternary(&st, t + 64 * k, sc, 32, k, 3.0f);
  int64_t n;
  uint8_t *compact = build_compact(t, rows, k, 4000, 1 << 18, TQ_PAIRS_MAX, &n);
  if (tq_book_new(compact, n, &g_wide) != MOLE_OK) return -1;
  free(compact);
  compact = build_compact(t, rows, k, 4000, 1 << 18, TQ_NARROW_PAIRS, &n);
  if (tq_book_new(compact, n, &g_narrow) != MOLE_OK) return -1;
  free(compact);
  compact = build_compact(t, rows, k, 4000, 1 << 18, TQ_WINDOW_WEIGHTS / 2, &n);
  if (tq_book_new(compact, n, &g_win32) != MOLE_OK) return -1;
  free(compact);
  g_book = g_wide;
  free(t);
  free(sc);
  return 0;
}

static int teardown_book(void **state) {
  (void)state;
  tq_book_free(g_wide);
  tq_book_free(g_narrow);
  tq_book_free(g_win32);
  return 0;
}

// ---- dictionary validation ------------------------------------------------------------

static void put(uint8_t *c, int64_t i, int64_t parent, int sym) {
  const uint16_t p1 = (uint16_t)(parent + 1);
  memcpy(c + 3 * i, &p1, 2);
  c[3 * i + 2] = (uint8_t)sym;
}

// The 9 one-pair runs, then a chain of zero pairs of `chain` more entries.
static uint8_t *good_dict(int64_t chain, int64_t *n) {
  *n = TQ_SYMBOLS + chain;
  uint8_t *c = calloc((size_t)*n + 8, 3);
  for (int s = 0; s < TQ_SYMBOLS; s++) put(c, s, -1, s);
  for (int64_t i = 0; i < chain; i++) put(c, TQ_SYMBOLS + i, i == 0 ? TQ_ZERO_PAIR : TQ_SYMBOLS + i - 1, TQ_ZERO_PAIR);
  return c;
}

static void expect_bad(const uint8_t *c, int64_t n, const char *what) {
  tq_book *b = (tq_book *)1;
  assert_int_equal(tq_book_new(c, n, &b), MOLE_ERR_FORMAT);
  assert_null(b);
  const char *msg = mole_last_error();
  if (!strstr(msg, what)) fail_msg("error '%s' lacks '%s'", msg, what);
}

static void test_book_bad(void **state) {
  (void)state;
  int64_t n;
  uint8_t *c = good_dict(10, &n);
  tq_book *b = NULL;
  assert_int_equal(tq_book_new(c, n, &b), MOLE_OK);
  assert_int_equal(b->n, n);
  tq_book_free(b);
  expect_bad(c, 8, "8 entries");
  expect_bad(c, TQ_BOOK_MAX + 1, "65537 entries");
  expect_bad(c, 0, "0 entries");
  expect_bad(c, -5, "-5 entries");
  put(c, 12, 12, 0);  // its own parent
  expect_bad(c, n, "entry 12: parent 12");
  put(c, 12, 15, 0);  // a later parent
  expect_bad(c, n, "entry 12: parent 15");
  put(c, 12, 65534, 0);  // a far parent
  expect_bad(c, n, "entry 12: parent 65534");
  put(c, 12, 11, 9);  // symbol out of range
  expect_bad(c, n, "entry 12: symbol 9");
  put(c, 12, 11, 255);
  expect_bad(c, n, "entry 12: symbol 255");
  put(c, 12, 11, TQ_ZERO_PAIR);
  put(c, 5, -1, 3);  // symbol 3 twice as a one-pair run, symbol 5 missing
  expect_bad(c, n, "entry 5: repeats the run of entry 3");
  put(c, 5, -1, 5);
  put(c, 14, 12, TQ_ZERO_PAIR);  // the run of entry 13 again
  expect_bad(c, n, "entry 14: repeats the run of entry 13");
  free(c);

  // a one-pair run missing (its slot holds a two-pair run)
  c = good_dict(2, &n);
  put(c, 7, TQ_ZERO_PAIR, 1);
  put(c, 8, TQ_ZERO_PAIR, 2);
  expect_bad(c, n, "symbol 7");
  free(c);

  // TQ_PAIRS_MAX pairs pass, one more does not
  c = good_dict(TQ_PAIRS_MAX - 1, &n);
  assert_int_equal(tq_book_new(c, n, &b), MOLE_OK);
  assert_int_equal(b->len[n - 1], 2 * TQ_PAIRS_MAX);
  tq_book_free(b);
  free(c);
  c = good_dict(TQ_PAIRS_MAX, &n);
  expect_bad(c, n, "entry 40: run over 32 pairs");
  free(c);
}

static void test_book_table(void **state) {
  (void)state;
  int64_t n = 13;
  uint8_t *c = calloc((size_t)n, 3);
  for (int s = 0; s < TQ_SYMBOLS; s++) put(c, s, -1, 8 - s);  // roots in reverse order
  put(c, 9, 0, 0);                                            // (+1,+1) (-1,-1)
  put(c, 10, 9, 5);                                           // ... (0,+1)
  put(c, 11, 10, 4);                                          // ... (0,0)
  put(c, 12, 4, 6);                                           // (0,0) (+1,-1)
  tq_book *b;
  assert_int_equal(tq_book_new(c, n, &b), MOLE_OK);
  for (int s = 0; s < TQ_SYMBOLS; s++) assert_int_equal(b->root[s], 8 - s);
  assert_true(b->ent[0].plus == 3 && b->ent[0].minus == 0 && b->len[0] == 2);
  assert_true(b->ent[8].plus == 0 && b->ent[8].minus == 3);
  assert_true(b->ent[2].plus == 1 && b->ent[2].minus == 2);  // symbol 6: t0 +1, t1 -1
  assert_true(b->ent[6].plus == 2 && b->ent[6].minus == 1);  // symbol 2: t0 -1, t1 +1
  assert_true(b->ent[9].plus == 3 && b->ent[9].minus == 12 && b->len[9] == 4);
  assert_true(b->ent[10].plus == (3 | 32) && b->ent[10].minus == 12 && b->len[10] == 6);
  assert_true(b->ent[11].plus == (3 | 32) && b->ent[11].minus == 12 && b->len[11] == 8);
  assert_true(b->ent[12].plus == 4 && b->ent[12].minus == 8 && b->len[12] == 4);
  for (int64_t i = 0; i < n; i++) {  // the kernels' masks: weights of the run that are 0, that are +1
    const uint64_t run = b->len[i] == 64 ? ~0ull : (1ull << b->len[i]) - 1;
    assert_true(b->um[2 * i] == (run & ~(b->ent[i].plus | b->ent[i].minus)));
    assert_true(b->um[2 * i + 1] == b->ent[i].plus);
  }
  assert_true(b->um[2 * 11] == (0xffull & ~(3ull | 32 | 12)));
  assert_int_equal(b->child[9 * TQ_SYMBOLS + 5], 10);
  assert_int_equal(b->child[4 * TQ_SYMBOLS + 6], 12);
  assert_int_equal(b->child[4 * TQ_SYMBOLS + 5], -1);
  tq_book_free(b);
  free(c);
}

// ---- TQ1 encode / dequantize / check --------------------------------------------------

typedef struct {
  int64_t n_rows, k;
  int8_t *t;
  float *scale;
  uint8_t *blob;
  size_t bytes;
} tq1_mat;

static tq1_mat make_tq1(uint64_t *st, int64_t n_rows, int64_t k, float spread) {
  tq1_mat m = {.n_rows = n_rows, .k = k};
  m.t = malloc((size_t)(n_rows * k) + 1);
  m.scale = malloc((size_t)n_rows * sizeof(float) + 4);
  make_ternary(st, m.t, m.scale, n_rows, k, spread);
  m.bytes = tq1_encode(g_book, m.t, m.scale, n_rows, k, NULL, 0);
  m.blob = tu_xalloc(m.bytes);
  assert_int_equal(tq1_encode(g_book, m.t, m.scale, n_rows, k, m.blob, m.bytes), m.bytes);
  char err[200];
  if (!tq1_check(g_book, m.blob, m.bytes, n_rows, k, err, sizeof err)) fail_msg("fresh blob: %s", err);
  return m;
}

static void free_tq1(tq1_mat *m) {
  free(m->t);
  free(m->scale);
  mole_aligned_free(m->blob);
}

static void test_tq1_round_trip(void **state) {
  (void)state;
  uint64_t st = 5;
  const int64_t shapes[][2] = {{1, 2}, {15, 62}, {17, 64}, {33, 130}, {40, 4098}, {3, 0}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int64_t n_rows = shapes[si][0], k = shapes[si][1];
    for (float spread = 1.0f; spread < 4; spread += 2) {
      tq1_mat m = make_tq1(&st, n_rows, k, spread);
      assert_int_equal(tq1_encode(g_book, m.t, m.scale, n_rows, k, m.blob, m.bytes - 1), 0);
      float *y = malloc((size_t)k * sizeof(float) + 4);
      for (int64_t r = 0; r < n_rows; r++) {
        const float s = quant_f16_to_f32(quant_f32_to_f16(m.scale[r]));
        tq1_row_to_float(g_book, m.blob, n_rows, k, r, y);
        for (int64_t j = 0; j < k; j++)
          if (y[j] != s * (float)m.t[r * k + j])
            fail_msg("%lldx%lld row %lld weight %lld", (long long)n_rows, (long long)k, (long long)r, (long long)j);
      }
      free(y);
      free_tq1(&m);
    }
  }
  // bits per weight of realistic rows with this small book: well under 2
  tq1_mat m = make_tq1(&st, 64, 4096, 1.0f);
  const double bpw = 8.0 * (double)(m.bytes - tq1_codes_offset(64)) / (64.0 * 4096.0);
  mole_log(MOLE_LOG_INFO, "tq1: %.3f bits/weight (codes only) with a %lld-entry book", bpw, (long long)g_book->n);
  assert_true(bpw < 1.5);
  free_tq1(&m);
}

static void expect_check_fails(const tq1_mat *m, const uint8_t *blob, size_t bytes, const char *what) {
  char err[256] = "";
  if (tq1_check(g_book, blob, bytes, m->n_rows, m->k, err, sizeof err)) fail_msg("corrupt blob passed (%s)", what);
  assert_true(err[0] != 0);
  (void)tq1_check(g_book, blob, bytes, m->n_rows, m->k, NULL, 0);  // no message buffer
}

static uint16_t code_at(const tq1_mat *m, int64_t c) {
  uint16_t v;
  memcpy(&v, m->blob + tq1_codes_offset(m->n_rows) + 2 * c, 2);
  return v;
}

static void set_code(uint8_t *b, size_t off, int64_t c, uint16_t v) { memcpy(b + off + 2 * c, &v, 2); }
static void set_gidx(uint8_t *b, int64_t g, uint32_t v) { memcpy(b + 4 * g, &v, 4); }

static void test_tq1_check(void **state) {
  (void)state;
  uint64_t st = 9;
  const int64_t R = 37, K = 130, G = 3;
  tq1_mat m = make_tq1(&st, R, K, 1.0f);
  const size_t off = tq1_codes_offset(R);
  const int64_t n_codes = (int64_t)(m.bytes - off) / 2;
  uint8_t *b = malloc(m.bytes + 64);
  memcpy(b, m.blob, m.bytes);
  memset(b + m.bytes, 0, 64);
  assert_true(tq1_check(g_book, b, m.bytes + 64, R, K, NULL, 0));  // padding up to a stride is fine
  // shape or size that does not match
  const int64_t shapes[][2] = {{R, K - 2}, {R, K + 2}, {R - 1, K},        {R + 1, K},           {R, K + 1},
                               {-1, K},    {R, -2},    {R, TQ_K_MAX + 2}, {(int64_t)1 << 40, K}};
  char err[256];
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    assert_false(tq1_check(g_book, m.blob, m.bytes, shapes[i][0], shapes[i][1], err, sizeof err));
  const size_t cuts[] = {m.bytes - 1, m.bytes - 2, m.bytes - 10, off, off - 1, 3, 0};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) expect_check_fails(&m, m.blob, cuts[i], "truncated");
  // codes outside the dictionary
  const int64_t where[] = {0, 1, n_codes / 2, n_codes - 1};
  for (size_t i = 0; i < 4; i++) {
    memcpy(b, m.blob, m.bytes);
    set_code(b, off, where[i], (uint16_t)g_book->n);
    expect_check_fails(&m, b, m.bytes, "code == n");
    set_code(b, off, where[i], 0xffff);
    expect_check_fails(&m, b, m.bytes, "code 0xffff");
    // a code of another length: the row no longer ends where it should
    const uint16_t c0 = code_at(&m, where[i]);
    uint16_t other = 0;
    while (g_book->len[other] == g_book->len[c0]) other++;
    set_code(b, off, where[i], other);
    expect_check_fails(&m, b, m.bytes, "other length");
  }
  // bad group indices
  uint32_t g1, g2;
  memcpy(&g1, m.blob + 4, 4);
  memcpy(&g2, m.blob + 8, 4);
  const struct {
    int64_t g;
    uint32_t v;
  } bad[] = {{0, 1},
             {1, g1 + 1},
             {1, g1 - 1},
             {1, g2 + 1},
             {1, 0xffffffffu},
             {G, (uint32_t)n_codes + 1},
             {G, (uint32_t)n_codes - 1},
             {G, 0xffffffffu},
             {G, 0},
             {2, g1 - 1}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(b, m.blob, m.bytes);
    set_gidx(b, bad[i].g, bad[i].v);
    expect_check_fails(&m, b, m.bytes, "gidx");
  }
  // random corruption: whatever passes the check is safe to run (ASan build)
  float *x = malloc(3 * K * sizeof(float));
  float *y = malloc(3 * R * sizeof(float));
  for (int64_t j = 0; j < 3 * K; j++) x[j] = tu_rand_uniform(&st, -1, 1);
  int passed = 0;
  for (int it = 0; it < 3000; it++) {
    memcpy(b, m.blob, m.bytes);
    const int flips = 1 + (int)(tu_rand_u64(&st) % 3);
    for (int f = 0; f < flips; f++) {
      const size_t at = tu_rand_u64(&st) % 4 ? off + tu_rand_u64(&st) % (m.bytes - off) : tu_rand_u64(&st) % off;
      b[at] ^= (uint8_t)(1u << (tu_rand_u64(&st) % 8));
    }
    if (!tq1_check(g_book, b, m.bytes, R, K, err, sizeof err)) continue;
    passed++;
    for (int lv = 0; lv <= 2; lv++) {
      quant_force_isa(lv);
      quant_tq1_gemm(g_book, b, R, x, K * sizeof(float), y, R, 0, R, 3, K);
    }
    quant_force_isa(99);
  }
  mole_log(MOLE_LOG_INFO, "tq1_check: %d of 3000 corrupted blobs still valid", passed);
  free(x);
  free(y);
  free(b);
  free_tq1(&m);
}

// ---- activations -------------------------------------------------------------------------

static void test_quantize_x(void **state) {
  (void)state;
  int16_t x16[200 + 64];
  float x[200];
  memset(x, 0, sizeof x);
  for (int j = 0; j < 200 + 64; j++) x16[j] = 7;
  assert_true(tq_quantize_x(x, 200, x16) == 0.0f);
  for (int j = 0; j < 200 + 64; j++) assert_int_equal(x16[j], 0);
  uint64_t st = 3;
  for (int j = 0; j < 200; j++) x[j] = tu_rand_uniform(&st, -3, 2);
  x[17] = -4.0f;
  for (int j = 0; j < 200 + 64; j++) x16[j] = 7;
  const float dx = tq_quantize_x(x, 200, x16);
  assert_true(dx == 4.0f / 16383.0f);
  assert_int_equal(x16[17], -16383);
  for (int j = 0; j < 200; j++) {
    assert_true(abs(x16[j]) <= 16383);
    assert_true(fabsf(x[j] - dx * (float)x16[j]) <= 0.5001f * dx);
  }
  for (int j = 200; j < 200 + 64; j++) assert_int_equal(x16[j], 0);
}

// ---- kernels ------------------------------------------------------------------------------

static bool bits_equal(const float *a, const float *b, int64_t n_tok, int64_t ldy, int64_t i0, int64_t i1) {
  for (int64_t j = 0; j < n_tok; j++)
    if (memcmp(a + j * ldy + i0, b + j * ldy + i0, (size_t)(i1 - i0) * sizeof(float))) return false;
  return true;
}

// Y of every level bit-equal to the reference over rows [i0, i1); the
// reference within the activation rounding of a double dot product with the
// dequantized rows. deq(r, y): row r as floats.
typedef void (*gemm_fn)(const void *ctx, const float *X, size_t xs, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                        int64_t n_tok);
typedef void (*deq_fn)(const void *ctx, int64_t r, float *y);

static void check_kernel(const void *ctx, gemm_fn gemm, gemm_fn ref, deq_fn deq, int64_t n_rows, int64_t k,
                         int64_t n_tok, int64_t i0, int64_t i1, uint64_t *st) {
  const int64_t xs = k + 3, ldy = n_rows + 5;  // padded strides
  float *X = tu_xalloc((size_t)(n_tok * xs + 1) * sizeof(float));
  float *Yr = tu_xalloc((size_t)(n_tok * ldy) * sizeof(float)), *Ys = tu_xalloc((size_t)(n_tok * ldy) * sizeof(float));
  for (int64_t j = 0; j < n_tok; j++)
    for (int64_t e = 0; e < k; e++) X[j * xs + e] = j == 1 ? 0.0f : tu_gauss(st) * (j + 1);
  ref(ctx, X, (size_t)xs * sizeof(float), Yr, ldy, i0, i1, n_tok);
  const int maxl = quant_force_isa(99);
  for (int lv = 0; lv <= maxl; lv++) {
    quant_force_isa(lv);
    for (int64_t e = 0; e < n_tok * ldy; e++) Ys[e] = NAN;
    gemm(ctx, X, (size_t)xs * sizeof(float), Ys, ldy, i0, i1, n_tok);
    if (!bits_equal(Yr, Ys, n_tok, ldy, i0, i1))
      fail_msg("level %d differs from ref: %lldx%lld tok %lld rows [%lld,%lld)", lv, (long long)n_rows, (long long)k,
               (long long)n_tok, (long long)i0, (long long)i1);
    for (int64_t j = 0; j < n_tok; j++) {  // rows outside [i0, i1) untouched
      for (int64_t i = 0; i < i0; i++) assert_true(isnan(Ys[j * ldy + i]));
      for (int64_t i = i1; i < ldy; i++) assert_true(isnan(Ys[j * ldy + i]));
    }
  }
  quant_force_isa(maxl);
  float *w = malloc((size_t)k * sizeof(float) + 4);
  for (int64_t i = i0; i < i1; i++) {
    deq(ctx, i, w);
    for (int64_t j = 0; j < n_tok; j++) {
      const float *x = X + j * xs;
      float mx = 0;
      for (int64_t e = 0; e < k; e++) mx = fmaxf(mx, fabsf(x[e]));
      double exact = 0, bound = 0;
      for (int64_t e = 0; e < k; e++) {
        exact += (double)w[e] * x[e];
        bound += fabs((double)w[e]) * (0.5001 * mx / 16383.0 + 1e-6 * fabs(x[e]));
      }
      const double got = Yr[j * ldy + i];
      if (fabs(got - exact) > bound + 1e-6 * fabs(exact) + 1e-30)
        fail_msg("%lldx%lld row %lld tok %lld: %g vs %g (bound %g)", (long long)n_rows, (long long)k, (long long)i,
                 (long long)j, got, exact, bound);
    }
  }
  free(w);
  mole_aligned_free(X);
  mole_aligned_free(Yr);
  mole_aligned_free(Ys);
}

typedef struct {
  const void *blob;
  int64_t n_rows, k;
} mat_ctx;

static void tq1_gemm_c(const void *c, const float *X, size_t xs, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                       int64_t n_tok) {
  const mat_ctx *m = c;
  quant_tq1_gemm(g_book, m->blob, m->n_rows, X, xs, Y, ldy, i0, i1, n_tok, m->k);
}
static void tq1_ref_c(const void *c, const float *X, size_t xs, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                      int64_t n_tok) {
  const mat_ctx *m = c;
  quant_tq1_gemm_ref(g_book, m->blob, m->n_rows, X, xs, Y, ldy, i0, i1, n_tok, m->k);
}
static void tq1_deq_c(const void *c, int64_t r, float *y) {
  const mat_ctx *m = c;
  tq1_row_to_float(g_book, m->blob, m->n_rows, m->k, r, y);
}

static const int64_t k_rows[] = {1, 15, 17, 33, 100};
static const int64_t k_toks[] = {1, 3, 8};

static void tq1_gemm_book(void) {
  uint64_t st = 21;
  const int64_t ks[] = {2, 62, 64, 66, 130, 256, 4096 + 2};
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    for (size_t ri = 0; ri < sizeof k_rows / sizeof k_rows[0]; ri++) {
      const int64_t k = ks[ki], n_rows = k_rows[ri];
      if (tu_asan() && k > 256 && n_rows > 33) continue;
      tq1_mat m = make_tq1(&st, n_rows, k, ri == 2 ? 3.0f : 1.0f);
      const mat_ctx c = {m.blob, n_rows, k};
      for (size_t ti = 0; ti < sizeof k_toks / sizeof k_toks[0]; ti++) {
        check_kernel(&c, tq1_gemm_c, tq1_ref_c, tq1_deq_c, n_rows, k, k_toks[ti], 0, n_rows, &st);
        if (n_rows > 16) check_kernel(&c, tq1_gemm_c, tq1_ref_c, tq1_deq_c, n_rows, k, k_toks[ti], 16, n_rows, &st);
        if (n_rows > 32) check_kernel(&c, tq1_gemm_c, tq1_ref_c, tq1_deq_c, n_rows, k, k_toks[ti], 16, 32, &st);
        if (n_rows > 3) check_kernel(&c, tq1_gemm_c, tq1_ref_c, tq1_deq_c, n_rows, k, k_toks[ti], 3, n_rows, &st);
      }
      free_tq1(&m);
    }
  // more tokens than a batch step, one long row
  tq1_mat m = make_tq1(&st, 20, 14336, 1.0f);
  const mat_ctx c = {m.blob, 20, 14336};
  check_kernel(&c, tq1_gemm_c, tq1_ref_c, tq1_deq_c, 20, 14336, 13, 0, 20, &st);
  free_tq1(&m);
}

static void test_tq1_gemm(void **state) {
  (void)state;
  // the wide book has runs over 32 weights, g_win32 runs of 32 (the masks'
  // 256-bit kernel), the narrow one of at most 30 (the packed table's kernel
  // where the CPU has VBMI): every one-token kernel runs
  assert_true(g_wide->max_len > 32 && !g_wide->um32 && !g_wide->pk);
  assert_true(g_win32->max_len == TQ_WINDOW_WEIGHTS && g_win32->um32 && !g_win32->pk);
  assert_true(g_narrow->max_len == 2 * TQ_NARROW_PAIRS && g_narrow->um32 && g_narrow->pk);
  tq_book *books[3] = {g_wide, g_win32, g_narrow};
  for (int i = 0; i < 3; i++) {
    g_book = books[i];
    tq1_gemm_book();
  }
  g_book = g_wide;
}

// The extremes: a book of one-pair runs only (every code lands in the same
// lanes), rows of k = TQ_K_MAX all +1 or all -1 against x all at its maximum:
// the kernels' sums reach +-16383 * k and must stay exact.
static void test_tq1_extremes(void **state) {
  (void)state;
  int64_t n;
  uint8_t *c = good_dict(0, &n);
  tq_book *b;
  assert_int_equal(tq_book_new(c, n, &b), MOLE_OK);
  free(c);
  const int64_t R = 3, k = TQ_K_MAX;
  int8_t *t = malloc((size_t)(R * k));
  float sc[3] = {1.0f, 0.5f, 2.0f};
  for (int64_t j = 0; j < k; j++) {
    t[j] = 1;
    t[k + j] = -1;
    t[2 * k + j] = (int8_t)(j % 3 - 1);
  }
  const size_t bytes = tq1_encode(b, t, sc, R, k, NULL, 0);
  uint8_t *blob = tu_xalloc(bytes);
  assert_int_equal(tq1_encode(b, t, sc, R, k, blob, bytes), bytes);
  assert_true(tq1_check(b, blob, bytes, R, k, NULL, 0));
  float *X = tu_xalloc(2 * (size_t)k * sizeof(float)), Yr[6], Ys[6];
  for (int64_t j = 0; j < k; j++) {
    X[j] = 1.0f;
    X[k + j] = -3.0f;
  }
  quant_tq1_gemm_ref(b, blob, R, X, (size_t)k * sizeof(float), Yr, R, 0, R, 2, k);
  assert_true(Yr[0] == (float)k && Yr[1] == -0.5f * (float)k && Yr[3] == -3.0f * (float)k);
  const int maxl = quant_force_isa(99);
  for (int lv = 0; lv <= maxl; lv++) {
    quant_force_isa(lv);
    for (int64_t nt = 1; nt <= 2; nt++) {
      quant_tq1_gemm(b, blob, R, X, (size_t)k * sizeof(float), Ys, R, 0, R, nt, k);
      if (memcmp(Yr, Ys, (size_t)(nt * R) * sizeof(float))) fail_msg("level %d, %lld tokens", lv, (long long)nt);
    }
  }
  quant_force_isa(maxl);
  mole_aligned_free(X);
  mole_aligned_free(blob);
  free(t);
  tq_book_free(b);
}

// ---- TQ2 -------------------------------------------------------------------------------------

static void tq2_gemm_c(const void *c, const float *X, size_t xs, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                       int64_t n_tok) {
  const mat_ctx *m = c;
  quant_tq2_gemm(m->blob, m->n_rows, X, xs, Y, ldy, i0, i1, n_tok, m->k);
}
static void tq2_ref_c(const void *c, const float *X, size_t xs, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                      int64_t n_tok) {
  const mat_ctx *m = c;
  quant_tq2_gemm_ref(NULL, m->blob, m->n_rows, X, xs, Y, ldy, i0, i1, n_tok, m->k);
}
static void tq2_deq_c(const void *c, int64_t r, float *y) {
  const mat_ctx *m = c;
  tq2_row_to_float(m->blob, m->n_rows, m->k, r, y);
}

static void test_tq2(void **state) {
  (void)state;
  uint64_t st = 31;
  const int64_t ks[] = {4, 60, 64, 68, 132, 256, 4096 + 4};
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    for (size_t ri = 0; ri < sizeof k_rows / sizeof k_rows[0]; ri++) {
      const int64_t k = ks[ki], n_rows = k_rows[ri];
      uint8_t *q = malloc((size_t)(n_rows * k)), *z = malloc((size_t)n_rows);
      float *sc = malloc((size_t)n_rows * sizeof(float));
      for (int64_t e = 0; e < n_rows * k; e++) q[e] = (uint8_t)(tu_rand_u64(&st) & 3);
      for (int64_t r = 0; r < n_rows; r++) {
        z[r] = (uint8_t)(r % 5 == 4 ? 255 : tu_rand_u64(&st) % 4);
        sc[r] = tu_rand_uniform(&st, 0.001f, 0.1f);
      }
      const size_t bytes = tq2_encode(q, sc, z, n_rows, k, NULL);
      assert_int_equal(bytes, tq2_matrix_bytes(n_rows, k));
      uint8_t *blob = tu_xalloc(bytes);
      assert_int_equal(tq2_encode(q, sc, z, n_rows, k, blob), bytes);
      float *y = malloc((size_t)k * sizeof(float));
      for (int64_t r = 0; r < n_rows; r++) {
        tq2_row_to_float(blob, n_rows, k, r, y);
        const float s = quant_f16_to_f32(quant_f32_to_f16(sc[r]));
        for (int64_t e = 0; e < k; e++) assert_true(y[e] == s * (float)((int)q[r * k + e] - z[r]));
      }
      free(y);
      const mat_ctx c = {blob, n_rows, k};
      for (size_t ti = 0; ti < sizeof k_toks / sizeof k_toks[0]; ti++) {
        check_kernel(&c, tq2_gemm_c, tq2_ref_c, tq2_deq_c, n_rows, k, k_toks[ti], 0, n_rows, &st);
        if (n_rows > 3) check_kernel(&c, tq2_gemm_c, tq2_ref_c, tq2_deq_c, n_rows, k, k_toks[ti], 3, n_rows, &st);
      }
      mole_aligned_free(blob);
      free(q);
      free(z);
      free(sc);
    }
}

// ---- scratch: quant_scratch_bytes covers the blob kernels ------------------------------------
// TQ1 (every book's kernels) and TQ2 at every level, one token and more than a
// kernel call takes, through quant_gemm_op in a pool whose scratch is exactly
// quant_scratch_bytes(k): a kernel asking for more aborts (MOLE_ASSERT).

typedef struct {
  quant_type t;
  const tq_book *book;
  const void *W;
  int64_t rows, k, n_tok;
  const float *X;
  float *Y;
} bound_job;

static void bound_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  const bound_job *j = ctx;
  const quant_op op = {.n_rows = j->rows, .book = j->book};
  quant_gemm_op(j->t, QL_ROWS, j->W, 0, j->X, (size_t)j->k * sizeof(float), j->Y, j->rows, 0, j->rows, j->n_tok, j->k,
                &op);
}

static void test_scratch_bound(void **state) {
  (void)state;
  uint64_t st = 41;
  const int64_t R = 20, k = tu_asan() ? 2048 : 14336, n_tok = 70;
  mole_pool *pool;
  assert_int_equal(mole_pool_init(1, &pool), MOLE_OK);
  assert_int_equal(mole_pool_reserve(pool, quant_scratch_bytes(k)), MOLE_OK);
  float *X = tu_xalloc((size_t)(n_tok * k) * sizeof(float)), *Y = tu_xalloc((size_t)(n_tok * R) * sizeof(float));
  for (int64_t e = 0; e < n_tok * k; e++) X[e] = tu_rand_uniform(&st, -2, 2);
  uint8_t *q = malloc((size_t)(R * k)), z[20];
  float sc[20];
  for (int64_t e = 0; e < R * k; e++) q[e] = (uint8_t)(tu_rand_u64(&st) & 3);
  for (int64_t r = 0; r < R; r++) z[r] = 1, sc[r] = 0.01f;
  uint8_t *tq2 = tu_xalloc(tq2_matrix_bytes(R, k));
  tq2_encode(q, sc, z, R, k, tq2);
  tq_book *books[3] = {g_wide, g_win32, g_narrow};
  const int maxl = quant_force_isa(99);
  for (int i = 0; i < 4; i++) {
    g_book = books[i % 3];
    tq1_mat m = make_tq1(&st, R, k, 1.0f);
    bound_job j = i < 3 ? (bound_job){QT_TQ1, g_book, m.blob, R, k, 1, X, Y} : (bound_job){QT_TQ2, NULL, tq2, R, k, 1, X, Y};
    for (int lv = 0; lv <= maxl; lv++) {
      quant_force_isa(lv);
      for (j.n_tok = 1; j.n_tok <= n_tok; j.n_tok += n_tok - 1) mole_pool_run(pool, bound_worker, &j);
    }
    free_tq1(&m);
  }
  g_book = g_wide;
  quant_force_isa(maxl);
  free(q);
  mole_aligned_free(tq2);
  mole_aligned_free(X);
  mole_aligned_free(Y);
  mole_pool_free(pool);
}

int main(void) {
  if (mole_scratch_reserve((size_t)64 << 20)) return 1;  // the kernels' scratch on this thread
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_book_bad),       cmocka_unit_test(test_book_table), cmocka_unit_test(test_quantize_x),
      cmocka_unit_test(test_tq1_round_trip), cmocka_unit_test(test_tq1_check),  cmocka_unit_test(test_tq1_gemm),
      cmocka_unit_test(test_tq1_extremes),   cmocka_unit_test(test_tq2),        cmocka_unit_test(test_scratch_bound),
  };
  return cmocka_run_group_tests(tests, setup_book, teardown_book);
}
