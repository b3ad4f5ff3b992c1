// quant_tq_avx2: the TQ1 kernel of quant_tq.h with AVX2. Bit-exact twin of
// quant_tq1_gemm_ref (the same int16 activations, an exact integer sum per
// row, the same float formula). The scheme of quant_tq_avx512.c: x16 = 128*H
// + L in two byte planes, a code stands for u_j = t_j + 1 over its run (0
// past its end), a code at weight p adds u . H[p..p+64) and u . L[p..p+64),
// and the row sum of x16 comes off at the end. Without mask registers the
// book's `um` bits become bytes by broadcast, shuffle, and, compare; the dot
// products are vpmaddubsw (u unsigned, planes signed; |pair| <= 512) and
// vpmaddwd into int32. Tokens share each code's u. A narrow book's codes
// (at most 32 weights) take one 32-weight half, not two.
#include "quant/quant_avx2.h"
#include "quant/quant_tq_internal.h"

enum { TQ1_TOK = 4 };  // tokens per pass over the matrix

// The byte planes of one token (lp bytes each, zero from k on); returns sum x16.
static int64_t tq1_planes(const int16_t *x16, int64_t k, int64_t lp, int8_t *H, int8_t *L) {
  int64_t s = 0;
  for (int64_t j = 0; j < k; j++) {
    const int h = ((int)x16[j] + 16384) / 128 - 128;  // floor(x16 / 128)
    H[j] = (int8_t)h;
    L[j] = (int8_t)(x16[j] - 128 * h);
    s += x16[j];
  }
  memset(H + k, 0, (size_t)(lp - k));
  memset(L + k, 0, (size_t)(lp - k));
  return s;
}

// Bytes 0xff where bit i of m is set (i = 0..31).
static inline __m256i tq1_bits(uint32_t m) {
  const __m256i rep =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201ll);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), rep);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

// u of a code, weights 32*half .. 32*half + 31: 1 where 0, 2 where +1, else 0.
static inline __m256i tq1_u(const uint64_t *um, uint32_t code, int half) {
  const __m256i z = tq1_bits((uint32_t)(um[2 * (size_t)code] >> 32 * half));
  const __m256i p = tq1_bits((uint32_t)(um[2 * (size_t)code + 1] >> 32 * half));
  return _mm256_or_si256(_mm256_and_si256(z, _mm256_set1_epi8(1)), _mm256_and_si256(p, _mm256_set1_epi8(2)));
}

// One code at weight p for T tokens (planes of token t at P + 2*t*lp): acc[2t] += u.H, acc[2t+1] += u.L.
// NH: the 32-weight halves a code may reach (1 for a narrow book).
static inline __attribute__((always_inline)) void tq1_code(const uint64_t *um, uint32_t code, const int8_t *P,
                                                           int64_t lp, int64_t p, const int T, const int NH,
                                                           __m256i *acc) {
  const __m256i one = _mm256_set1_epi16(1);
#pragma GCC unroll 2
  for (int half = 0; half < NH; half++) {
    const __m256i u = tq1_u(um, code, half);
#pragma GCC unroll 8
    for (int e = 0; e < 2 * T; e++) {
      const __m256i x = _mm256_loadu_si256((const __m256i *)(P + e * lp + p + 32 * half));
      acc[e] = _mm256_add_epi32(acc[e], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), one));
    }
  }
}

static inline int64_t hsum(__m256i v) {
  const __m256i w = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                     _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  return _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1);
}

// T tokens, one row from code *cp: S[t] = sum u*x16 over the row; moves *cp
// past the row's codes.
static inline __attribute__((always_inline)) void tq1_row(const tq_book *b, const uint8_t *codes, uint64_t *cp,
                                                          uint64_t n_codes, const int8_t *P, int64_t lp, int64_t k,
                                                          const int T, const int NH, int64_t *S) {
  const uint8_t *len = b->len;
  const uint64_t *um = b->um;
  __m256i acc[2 * TQ1_TOK];
  for (int e = 0; e < 2 * T; e++) acc[e] = _mm256_setzero_si256();
  uint64_t c = *cp;
  int64_t p = 0;
  while (c + 4 <= n_codes) {
    uint64_t q;
    memcpy(&q, codes + 2 * c, 8);
    const uint32_t c0 = q & 0xffff, c1 = q >> 16 & 0xffff, c2 = q >> 32 & 0xffff, c3 = q >> 48;
    const int64_t L1 = len[c0], L2 = L1 + len[c1], L3 = L2 + len[c2], L4 = L3 + len[c3];
    if (p + L3 >= k) break;  // code 3 may start the next row
    tq1_code(um, c0, P, lp, p, T, NH, acc);
    tq1_code(um, c1, P, lp, p + L1, T, NH, acc);
    tq1_code(um, c2, P, lp, p + L2, T, NH, acc);
    tq1_code(um, c3, P, lp, p + L3, T, NH, acc);
    p += L4;
    c += 4;
  }
  for (; p < k; c++) {
    const uint32_t code = rd_u16(codes + 2 * c);
    tq1_code(um, code, P, lp, p, T, NH, acc);
    p += len[code];
  }
  *cp = c;
  for (int t = 0; t < T; t++) S[t] = 128 * hsum(acc[2 * t]) + hsum(acc[2 * t + 1]);
}

#define TQ1_ROW(T)                                                                                                 \
  static void tq1_row_##T(const tq_book *b, const uint8_t *codes, uint64_t *cp, uint64_t n_codes, const int8_t *P, \
                          int64_t lp, int64_t k, int64_t *S) {                                                     \
    if (b->um32)                                                                                                   \
      tq1_row(b, codes, cp, n_codes, P, lp, k, T, 1, S);                                                           \
    else                                                                                                           \
      tq1_row(b, codes, cp, n_codes, P, lp, k, T, 2, S);                                                           \
  }
TQ1_ROW(1)
TQ1_ROW(2)
TQ1_ROW(4)

void quant_tq1_gemm_avx2(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                         int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  MOLE_ASSERT(i0 >= 0 && i0 <= i1 && i1 <= n_rows && k % 2 == 0 && k <= TQ_K_MAX);
  if (i0 == i1 || n_tok <= 0) return;
  if (k == 0 || !b->um) {
    quant_tq1_gemm_ref(b, W, n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return;
  }
  const int64_t lp = (k + 64 + 63) / 64 * 64;  // bytes of a plane
  int64_t ldx;
  float *dx;
  void *ext;
  const int16_t *x16 =
      tq_prepare_x(X, xstride, n_tok, k, (size_t)(2 * lp * n_tok) + 8 * (size_t)n_tok, &ldx, &dx, &ext);
  int8_t *P = ext;
  int64_t *sumx = (int64_t *)(P + 2 * lp * n_tok);
  for (int64_t t = 0; t < n_tok; t++) sumx[t] = tq1_planes(x16 + t * ldx, k, lp, P + 2 * t * lp, P + 2 * t * lp + lp);
  const uint8_t *w = W, *codes = w + tq1_codes_offset(n_rows);
  const int64_t G = (n_rows + 15) / 16;
  const uint64_t n_codes = rd_u32(w + 4 * G), c_start = tq1_row_start(b, w, n_rows, k, i0);
  const uint8_t *scales = w + 4 * (G + 1);
  int64_t S[TQ1_TOK];
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t rem = n_tok - t0, T = rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
    const int8_t *Pt = P + 2 * t0 * lp;
    uint64_t c = c_start;
    for (int64_t i = i0; i < i1; i++) {
      if (T == 4)
        tq1_row_4(b, codes, &c, n_codes, Pt, lp, k, S);
      else if (T == 2)
        tq1_row_2(b, codes, &c, n_codes, Pt, lp, k, S);
      else
        tq1_row_1(b, codes, &c, n_codes, Pt, lp, k, S);
      const float s = quant_f16_to_f32(rd_u16(scales + 2 * i));
      for (int64_t t = 0; t < T; t++) Y[(t0 + t) * ldy + i] = tq_out(s, dx[t0 + t], S[t] - sumx[t0 + t]);
    }
    t0 += T;
  }
}
