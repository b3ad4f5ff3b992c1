// quant_tq: the compressed expert matrices of quant_tq.h. The book (decode
// table and encoder trie) from its compact dictionary, the TQ1 encoder and
// checker, row dequantization, the activation quantizer shared by every
// kernel and the scalar reference kernels (the levels' tables, quant_table.h,
// hold them and their twins).
//
// Every kernel computes, per row i and token j, the exact integer
//   acc = sum_w t_w * x16_w            (TQ1)
//   acc = sum_w q_w * x16_w - z_i * sum_w x16_w   (TQ2)
// and then y = s_i * (dx_j * (float)acc) (tq_out, quant_tq_internal.h, shared
// with the SIMD files), so every ISA gives the reference's bits.
#include "quant/quant_tq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/quant_internal.h"
#include "quant/quant_tq_internal.h"

// ---- small helpers ------------------------------------------------------------

static inline int64_t tq_groups(int64_t n_rows) { return (n_rows + 15) / 16; }

// ---- book ----------------------------------------------------------------------

void tq_book_free(tq_book *b) {
  if (!b) return;
  mole_aligned_free(b->ent);
  mole_aligned_free(b->um);
  mole_aligned_free(b->um32);
  mole_aligned_free(b->pk);
  mole_free(b->len);
  mole_free(b->child);
  mole_free(b);
}

mole_status tq_book_new(const uint8_t *compact, int64_t n, tq_book **out) {
  *out = NULL;
  if (n < TQ_SYMBOLS || n > TQ_BOOK_MAX)
    return mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: %lld entries (must be %d..%d)", (long long)n, TQ_SYMBOLS,
                       TQ_BOOK_MAX);
  if (!compact) return mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: no data");
  tq_book *b = mole_calloc(1, sizeof *b);
  if (!b) return mole_errorf(MOLE_ERR_NOMEM, "tq dictionary: out of memory");
  b->n = n;
  b->ent = mole_aligned_alloc(64, (size_t)n * sizeof(tq_entry));
  b->len = mole_malloc((size_t)n);
  b->child = mole_malloc((size_t)n * TQ_SYMBOLS * sizeof(int32_t));
  b->um = mole_aligned_alloc(64, (size_t)n * 2 * sizeof(uint64_t));
  if (!b->ent || !b->len || !b->child || !b->um) {
    tq_book_free(b);
    return mole_errorf(MOLE_ERR_NOMEM, "tq dictionary: out of memory for %lld entries", (long long)n);
  }
  memset(b->child, 0xff, (size_t)n * TQ_SYMBOLS * sizeof(int32_t));
  for (int s = 0; s < TQ_SYMBOLS; s++) b->root[s] = -1;
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *e = compact + 3 * i;
    const int64_t parent = (int64_t)rd_u16(e) - 1;
    const int sym = e[2];
    mole_status st = MOLE_OK;
    if (parent >= i)
      st = mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: entry %lld: parent %lld does not come before it", (long long)i,
                       (long long)parent);
    else if (sym >= TQ_SYMBOLS)
      st = mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: entry %lld: symbol %d (must be 0..8)", (long long)i, sym);
    else if (parent >= 0 && b->len[parent] / 2 >= TQ_PAIRS_MAX)
      st = mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: entry %lld: run over %d pairs", (long long)i, TQ_PAIRS_MAX);
    else {
      int32_t *slot = parent >= 0 ? &b->child[parent * TQ_SYMBOLS + sym] : &b->root[sym];
      if (*slot >= 0)
        st = mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: entry %lld: repeats the run of entry %lld", (long long)i,
                         (long long)*slot);
      else
        *slot = (int32_t)i;
    }
    if (st != MOLE_OK) {
      tq_book_free(b);
      return st;
    }
    const int pos = parent >= 0 ? b->len[parent] : 0;  // first weight of the new pair
    tq_entry en = parent >= 0 ? b->ent[parent] : (tq_entry){0, 0};
    const int t0 = sym / 3 - 1, t1 = sym % 3 - 1;
    if (t0 > 0) en.plus |= 1ull << pos;
    if (t0 < 0) en.minus |= 1ull << pos;
    if (t1 > 0) en.plus |= 1ull << (pos + 1);
    if (t1 < 0) en.minus |= 1ull << (pos + 1);
    b->ent[i] = en;
    b->len[i] = (uint8_t)(pos + 2);
    const uint64_t run = pos + 2 == 64 ? ~0ull : (1ull << (pos + 2)) - 1;
    b->um[2 * i] = run & ~(en.plus | en.minus);
    b->um[2 * i + 1] = en.plus;
    b->max_len = MOLE_MAX(b->max_len, pos + 2);
  }
  for (int s = 0; s < TQ_SYMBOLS; s++)
    if (b->root[s] < 0) {
      tq_book_free(b);
      return mole_errorf(MOLE_ERR_FORMAT, "tq dictionary: no entry for the one-pair run of symbol %d (t0 %d, t1 %d)", s,
                         s / 3 - 1, s % 3 - 1);
    }
  if (b->max_len <= TQ_WINDOW_WEIGHTS) {
    b->um32 = mole_aligned_alloc(64, (size_t)n * sizeof(uint64_t));
    if (!b->um32) {
      tq_book_free(b);
      return mole_errorf(MOLE_ERR_NOMEM, "tq dictionary: out of memory for %lld entries", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) b->um32[i] = b->um[2 * i] | b->um[2 * i + 1] << 32;
  }
  if (b->max_len <= 2 * TQ_NARROW_PAIRS) {
    b->pk = mole_aligned_alloc(64, (size_t)n * sizeof(uint64_t));
    if (!b->pk) {
      tq_book_free(b);
      return mole_errorf(MOLE_ERR_NOMEM, "tq dictionary: out of memory for %lld entries", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
      uint64_t v = (uint64_t)(b->len[i] / 2) << 60;
      for (int j = 0; j < b->len[i]; j++) v |= ((b->um[2 * i] >> j & 1) | (b->um[2 * i + 1] >> j & 1) << 1) << 2 * j;
      b->pk[i] = v;
    }
  }
  *out = b;
  return MOLE_OK;
}

// ---- geometry --------------------------------------------------------------------

size_t tq1_codes_offset(int64_t n_rows) {
  MOLE_ASSERT(n_rows >= 0);
  return 4 * (size_t)(tq_groups(n_rows) + 1) + 2 * (size_t)n_rows;
}

static inline size_t tq2_header(int64_t n_rows) { return (3 * (size_t)n_rows + 3) & ~(size_t)3; }
static inline size_t tq2_row_bytes(int64_t k) { return (size_t)(k + 3) / 4; }

size_t tq2_matrix_bytes(int64_t n_rows, int64_t k) {
  MOLE_ASSERT(n_rows >= 0 && k >= 0);
  return tq2_header(n_rows) + (size_t)n_rows * tq2_row_bytes(k);
}

// ---- TQ1 encoder -------------------------------------------------------------------

static inline int tq_sym(const int8_t *t) { return 3 * (t[0] + 1) + (t[1] + 1); }

// Greedy longest match of one row: writes its codes to dst (unless NULL) and
// returns their count.
static int64_t encode_row(const tq_book *b, const int8_t *t, int64_t k, uint8_t *dst) {
  int64_t nc = 0;
  for (int64_t p = 0; p < k;) {
    int32_t e = b->root[tq_sym(t + p)];
    p += 2;
    while (p < k) {
      const int32_t c = b->child[(int64_t)e * TQ_SYMBOLS + tq_sym(t + p)];
      if (c < 0) break;
      e = c;
      p += 2;
    }
    if (dst) {
      const uint16_t v = (uint16_t)e;
      memcpy(dst + 2 * nc, &v, 2);
    }
    nc++;
  }
  return nc;
}

size_t tq1_encode(const tq_book *b, const int8_t *t, const float *scale, int64_t n_rows, int64_t k, void *dst,
                  size_t cap) {
  MOLE_ASSERT(k >= 0 && k % 2 == 0 && n_rows >= 0);
  for (int64_t i = 0; i < n_rows * k; i++) MOLE_ASSERT(t[i] >= -1 && t[i] <= 1);
  const int64_t G = tq_groups(n_rows);
  const size_t off = tq1_codes_offset(n_rows);
  int64_t total = 0;
  for (int64_t r = 0; r < n_rows; r++) total += encode_row(b, t + r * k, k, NULL);
  MOLE_ASSERT(total <= (int64_t)UINT32_MAX);
  const size_t size = off + 2 * (size_t)total;
  if (!dst) return size;
  if (cap < size) return 0;
  uint8_t *o = dst;
  int64_t nc = 0;
  for (int64_t g = 0; g < G; g++) {
    const uint32_t gi = (uint32_t)nc;
    memcpy(o + 4 * g, &gi, 4);
    for (int64_t r = 16 * g; r < MOLE_MIN(16 * g + 16, n_rows); r++)
      nc += encode_row(b, t + r * k, k, o + off + 2 * nc);
  }
  const uint32_t gend = (uint32_t)nc;
  memcpy(o + 4 * G, &gend, 4);
  for (int64_t r = 0; r < n_rows; r++) {
    const uint16_t h = quant_f32_to_f16(scale[r]);
    memcpy(o + 4 * (G + 1) + 2 * r, &h, 2);
  }
  return size;
}

// ---- TQ1 check -----------------------------------------------------------------------

bool tq1_check(const tq_book *b, const void *blob, size_t bytes, int64_t n_rows, int64_t k, char *err, size_t errlen) {
  const uint8_t *w = blob;
  char dummy[8];
  if (!err || errlen == 0) {
    err = dummy;
    errlen = sizeof dummy;
  }
  if (n_rows < 0 || n_rows > INT32_MAX || k < 0 || k % 2 || k > TQ_K_MAX) {
    snprintf(err, errlen, "bad shape %lld x %lld (k must be even and at most %d)", (long long)n_rows, (long long)k,
             TQ_K_MAX);
    return false;
  }
  const int64_t G = tq_groups(n_rows);
  const size_t off = tq1_codes_offset(n_rows);
  if (bytes < off) {
    snprintf(err, errlen, "blob of %zu bytes is shorter than its %zu-byte header", bytes, off);
    return false;
  }
  const uint64_t max_codes = (bytes - off) / 2;
  if (rd_u32(w) != 0) {
    snprintf(err, errlen, "group 0: first code index %u (must be 0)", rd_u32(w));
    return false;
  }
  for (int64_t g = 0; g < G; g++) {
    const uint32_t a = rd_u32(w + 4 * g), e = rd_u32(w + 4 * (g + 1));
    if (e < a) {
      snprintf(err, errlen, "group %lld: code index %u after %u (decreasing)", (long long)(g + 1), e, a);
      return false;
    }
  }
  const uint64_t n_codes = rd_u32(w + 4 * G);
  if (n_codes > max_codes) {
    snprintf(err, errlen, "%llu codes do not fit in the blob (room for %llu)", (unsigned long long)n_codes,
             (unsigned long long)max_codes);
    return false;
  }
  const uint8_t *codes = w + off;
  for (int64_t g = 0; g < G; g++) {
    uint64_t c = rd_u32(w + 4 * g);
    const uint64_t cend = rd_u32(w + 4 * (g + 1));
    for (int64_t r = 16 * g; r < MOLE_MIN(16 * g + 16, n_rows); r++) {
      int64_t p = 0;
      while (p < k) {
        if (c >= cend) {
          snprintf(err, errlen, "group %lld, row %lld: codes end at %lld of %lld weights (code %llu)", (long long)g,
                   (long long)r, (long long)p, (long long)k, (unsigned long long)c);
          return false;
        }
        const uint16_t code = rd_u16(codes + 2 * c);
        if (code >= b->n) {
          snprintf(err, errlen, "group %lld, row %lld, code %llu: %u is not in the dictionary (%lld entries)",
                   (long long)g, (long long)r, (unsigned long long)c, code, (long long)b->n);
          return false;
        }
        p += b->len[code];
        if (p > k) {
          snprintf(err, errlen, "group %lld, row %lld, code %llu: run crosses the row end (%lld > %lld weights)",
                   (long long)g, (long long)r, (unsigned long long)c, (long long)p, (long long)k);
          return false;
        }
        c++;
      }
    }
    if (c != cend) {
      snprintf(err, errlen, "group %lld: rows end at code %llu, next group starts at %llu", (long long)g,
               (unsigned long long)c, (unsigned long long)cend);
      return false;
    }
  }
  return true;
}

// Index of the first code of row r (the blob is trusted: checked at load).
uint64_t tq1_row_start(const tq_book *b, const uint8_t *w, int64_t n_rows, int64_t k, int64_t r) {
  const int64_t g = r / 16;
  const uint8_t *codes = w + tq1_codes_offset(n_rows);
  uint64_t c = rd_u32(w + 4 * g);
  for (int64_t rr = 16 * g; rr < r; rr++)
    for (int64_t p = 0; p < k; c++) p += b->len[rd_u16(codes + 2 * c)];
  return c;
}

static inline float tq1_scale(const uint8_t *w, int64_t n_rows, int64_t r) {
  return quant_f16_to_f32(rd_u16(w + 4 * (tq_groups(n_rows) + 1) + 2 * r));
}

void tq1_row_to_float(const tq_book *b, const void *blob, int64_t n_rows, int64_t k, int64_t r, float *y) {
  MOLE_ASSERT(r >= 0 && r < n_rows && k % 2 == 0);
  const uint8_t *w = blob, *codes = w + tq1_codes_offset(n_rows);
  const float s = tq1_scale(w, n_rows, r);
  uint64_t c = tq1_row_start(b, w, n_rows, k, r);
  for (int64_t p = 0; p < k; c++) {
    const uint16_t code = rd_u16(codes + 2 * c);
    const tq_entry e = b->ent[code];
    const int len = b->len[code];
    for (int j = 0; j < len; j++) {
      const int t = (int)(e.plus >> j & 1) - (int)(e.minus >> j & 1);
      y[p + j] = s * (float)t;
    }
    p += len;
  }
}

// ---- TQ2 -------------------------------------------------------------------------------

size_t tq2_encode(const uint8_t *q, const float *scale, const uint8_t *zero, int64_t n_rows, int64_t k, void *dst) {
  MOLE_ASSERT(n_rows >= 0 && k >= 0);
  const size_t size = tq2_matrix_bytes(n_rows, k);
  if (!dst) return size;
  uint8_t *o = dst;
  memset(o, 0, size);
  for (int64_t r = 0; r < n_rows; r++) {
    const uint16_t h = quant_f32_to_f16(scale[r]);
    memcpy(o + 2 * r, &h, 2);
    o[2 * n_rows + r] = zero[r];
  }
  const size_t rb = tq2_row_bytes(k);
  uint8_t *rows = o + tq2_header(n_rows);
  for (int64_t r = 0; r < n_rows; r++)
    for (int64_t j = 0; j < k; j++) {
      const uint8_t v = q[r * k + j];
      MOLE_ASSERT(v <= 3);
      rows[(size_t)r * rb + (size_t)j / 4] |= (uint8_t)(v << (2 * (j % 4)));
    }
  return size;
}

void tq2_row_to_float(const void *blob, int64_t n_rows, int64_t k, int64_t r, float *y) {
  MOLE_ASSERT(r >= 0 && r < n_rows);
  const uint8_t *w = blob;
  const float s = quant_f16_to_f32(rd_u16(w + 2 * r));
  const int z = w[2 * n_rows + r];
  const uint8_t *row = w + tq2_header(n_rows) + (size_t)r * tq2_row_bytes(k);
  for (int64_t j = 0; j < k; j++) y[j] = s * (float)((row[j / 4] >> (2 * (j % 4)) & 3) - z);
}

// ---- activations -----------------------------------------------------------------------

float tq_quantize_x(const float *x, int64_t k, int16_t *x16) {
  float m = 0;
  for (int64_t j = 0; j < k; j++) {
    const float a = fabsf(x[j]);
    m = a > m ? a : m;  // (NaN never wins)
  }
  memset(x16 + k, 0, 64 * sizeof(int16_t));
  if (!(m > 0)) {
    memset(x16, 0, (size_t)k * sizeof(int16_t));
    return 0;
  }
  const float inv = 16383.0f / m, magic = 12582912.0f;  // 1.5 * 2^23: v + magic - magic rounds v to even
  for (int64_t j = 0; j < k; j++) {
    float v = x[j] * inv;
    v = v > 16383.0f ? 16383.0f : v < -16383.0f ? -16383.0f : v == v ? v : 0.0f;
    x16[j] = (int16_t)((v + magic) - magic);
  }
  return m / 16383.0f;
}

// int16 activations of n_tok rows in the kernel scratch: returns
// x16 with a row stride *ld int16 (a multiple of 32), fills dx[n_tok] and
// hands back `extra` more bytes (64-byte aligned) for the caller in *ext.
int16_t *tq_prepare_x(const float *X, size_t xstride, int64_t n_tok, int64_t k, size_t extra, int64_t *ld, float **dx,
                      void **ext) {
  const int64_t l = (k + 64 + 31) / 32 * 32;
  const size_t xbytes = (size_t)(n_tok * l) * sizeof(int16_t),
               dbytes = ((size_t)n_tok * sizeof(float) + 63) & ~(size_t)63;
  char *s = quant_scratch(xbytes + dbytes + extra);
  int16_t *x16 = (int16_t *)s;
  *dx = (float *)(s + xbytes);
  if (ext) *ext = s + xbytes + dbytes;
  for (int64_t j = 0; j < n_tok; j++)
    (*dx)[j] = tq_quantize_x((const float *)((const char *)X + (size_t)j * xstride), k, x16 + j * l);
  *ld = l;
  return x16;
}

void quant_tq1_gemm_ref(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                        int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  MOLE_ASSERT(i0 >= 0 && i0 <= i1 && i1 <= n_rows && k % 2 == 0 && k <= TQ_K_MAX);
  if (i0 == i1 || n_tok <= 0) return;
  int64_t l;
  float *dx;
  const int16_t *x16 = tq_prepare_x(X, xstride, n_tok, k, 0, &l, &dx, NULL);
  const uint8_t *w = W, *codes = w + tq1_codes_offset(n_rows);
  uint64_t c = tq1_row_start(b, w, n_rows, k, i0);
  for (int64_t i = i0; i < i1; i++) {
    const uint64_t c0 = c;
    const float s = tq1_scale(w, n_rows, i);
    for (int64_t j = 0; j < n_tok; j++) {
      const int16_t *x = x16 + j * l;
      int64_t acc = 0;
      c = c0;
      for (int64_t p = 0; p < k; c++) {
        const uint16_t code = rd_u16(codes + 2 * c);
        for (uint64_t m = b->ent[code].plus; m; m &= m - 1) acc += x[p + __builtin_ctzll(m)];
        for (uint64_t m = b->ent[code].minus; m; m &= m - 1) acc -= x[p + __builtin_ctzll(m)];
        p += b->len[code];
      }
      Y[j * ldy + i] = tq_out(s, dx[j], acc);
    }
  }
}

void quant_tq2_gemm_ref(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                        int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  (void)b;
  MOLE_ASSERT(i0 >= 0 && i0 <= i1 && i1 <= n_rows && k >= 0 && k <= TQ_K_MAX);
  if (i0 == i1 || n_tok <= 0) return;
  int64_t l;
  float *dx;
  const int16_t *x16 = tq_prepare_x(X, xstride, n_tok, k, 0, &l, &dx, NULL);
  const uint8_t *w = W, *rows = w + tq2_header(n_rows);
  const size_t rb = tq2_row_bytes(k);
  for (int64_t j = 0; j < n_tok; j++) {
    const int16_t *x = x16 + j * l;
    int64_t sx = 0;
    for (int64_t e = 0; e < k; e++) sx += x[e];
    for (int64_t i = i0; i < i1; i++) {
      const uint8_t *row = rows + (size_t)i * rb;
      int64_t qx = 0;
      for (int64_t e = 0; e < k; e++) qx += (int64_t)(row[e / 4] >> (2 * (e % 4)) & 3) * x[e];
      const int64_t acc = qx - (int64_t)w[2 * n_rows + i] * sx;
      Y[j * ldy + i] = tq_out(quant_f16_to_f32(rd_u16(w + 2 * i)), dx[j], acc);
    }
  }
}
