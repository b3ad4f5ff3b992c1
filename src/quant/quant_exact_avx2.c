// quant_exact_avx2: AVX2 (+FMA, F16C) twins of quant_exact_ref.c's orders,
// so CPUs without AVX-512 (most desktops and laptops) compute llama.cpp's
// results bit for bit too. The orders with 8 float lanes map one to one on
// a 256-bit register; the 16-lane ones take two. Integer sums are exact:
// maddubs on unsigned codes (q4/q5/q6 codes, |w| through the sign trick)
// against activations in [-127, 127] (what the q8_0 / q8_K quantizers make)
// never saturate its int16 pairs. The bf16 orders run the reference.
#include "quant/quant_avx2.h"

// ---- helpers ----------------------------------------------------------------------------

static inline __m256i ld32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// ---- integer orders -----------------------------------------------------------------------

// Q8_0 / Q4_0_L8: lane l += (dw*dx) * sum of bytes 4l..4l+3, fma per block, hsum8
static float dot_l8(bool q4, int64_t k, const void *vw, const void *vx) {
  const blk_q8_0 *x = vx;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; b++) {
    __m256i is;
    float dw;
    if (q4) {
      const blk_q4_0 *wb = &((const blk_q4_0 *)vw)[b];
      is = dot_ss(_mm256_sub_epi8(nibbles(wb->qs), _mm256_set1_epi8(8)), ld32(x[b].qs));
      dw = f16(wb->d);
    } else {
      const blk_q8_0 *wb = &((const blk_q8_0 *)vw)[b];
      is = dot_ss(ld32(wb->qs), ld32(x[b].qs));
      dw = f16(wb->d);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * f16(x[b].d)), _mm256_cvtepi32_ps(is), acc);
  }
  return hsum8(acc);
}

// the totals of eight lane vectors (p[i]: 8 partial sums), lane i = sum of p[i]
static inline __m256i hsum8x8(const __m256i p[8]) {
  const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
  const __m256i q0 = _mm256_hadd_epi32(h01, h23), q1 = _mm256_hadd_epi32(h45, h67);
  // q0 = [p0 p1 p2 p3 (lanes 0-3) | p0 p1 p2 p3 (lanes 4-7)], q1 likewise for p4..p7
  const __m128i t0 = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
  const __m128i t1 = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
  return _mm256_set_m128i(t1, t0);
}

// Q4_0_C1 over R rows x T tokens (R * T == 8): each (row, token) pair's
// fma chain in one lane, pair p = t * R + r; its integer sums reduced eight at
// a time. Y[j][i] for rows w[0..R), tokens x[0..T).
static inline __attribute__((always_inline)) void c1_pairs(const int R, const int T, int64_t k,
                                                           const blk_q4_0 *const *w, const blk_q8_0 *const *x,
                                                           float *Y, int64_t ldy, int64_t i, int64_t j) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones8 = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < k / 32; b++) {
    __m256i xv[2], p[8];
    for (int t = 0; t < T; t++) xv[t] = ld32(x[t][b].qs);
    for (int r = 0; r < R; r++) {
      const __m256i c = nibbles(w[r][b].qs);
      for (int t = 0; t < T; t++) p[t * R + r] = dot_us(c, xv[t]);
    }
    // lane p = t * R + r: the row's scale times the token's, 8 * sum x of the token
    __m128i dh;
    if (R == 8)
      dh = _mm_setr_epi16((short)w[0][b].d, (short)w[1][b].d, (short)w[2][b].d, (short)w[3][b].d, (short)w[4][b].d,
                          (short)w[5][b].d, (short)w[6][b].d, (short)w[7][b].d);
    else
      dh = _mm_setr_epi16((short)w[0][b].d, (short)w[1][b].d, (short)w[2][b].d, (short)w[3][b].d, (short)w[0][b].d,
                          (short)w[1][b].d, (short)w[2][b].d, (short)w[3][b].d);
    const int sx0 = 8 * hsum8i(dot_us(ones8, xv[0]));
    const float dx0 = f16(x[0][b].d);
    __m256 dxv;
    __m256i off;
    if (T == 1) {
      dxv = _mm256_set1_ps(dx0);
      off = _mm256_set1_epi32(sx0);
    } else {
      dxv = _mm256_set_m128(_mm_set1_ps(f16(x[1][b].d)), _mm_set1_ps(dx0));
      off = _mm256_set_m128i(_mm_set1_epi32(8 * hsum8i(dot_us(ones8, xv[1]))), _mm_set1_epi32(sx0));
    }
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(dh), dxv);
    // sum(q - 8) x = sum q x - 8 sum x
    const __m256i is = _mm256_sub_epi32(hsum8x8(p), off);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), d, acc);
  }
  float a[8];
  _mm256_storeu_ps(a, acc);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < R; r++) Y[(j + t) * ldy + i + r] = a[t * R + r];
}

static float dot_q4_0_c1(int64_t k, const void *vw, const void *vx) {
  const blk_q4_0 *w = vw;
  const blk_q8_0 *x = vx;
  float acc = 0;  // Q4_0_C1: acc = fma(isum, dw*dx, acc) per block
  for (int64_t b = 0; b < k / 32; b++) {
    const __m256i xv = ld32(x[b].qs);
    const int is = hsum8i(_mm256_sub_epi32(dot_us(nibbles(w[b].qs), xv), _mm256_slli_epi32(dot_us(_mm256_set1_epi8(1), xv), 3)));
    acc = fma1((float)is, f16(w[b].d) * f16(x[b].d), acc);
  }
  return acc;
}

// the 32 codes of sub-block s of a q4_K / q5_K block
static inline __m256i k4_codes(const uint8_t *qs, const uint8_t *qh, int s) {
  const __m256i q = ld32(qs + 32 * (s / 2));
  __m256i c = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
  if (qh) {  // bit s of qh[e] is bit 4 of element e
    const __m256i h = _mm256_and_si256(_mm256_srl_epi16(ld32(qh), _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
    c = _mm256_or_si256(c, _mm256_slli_epi16(h, 4));
  }
  return c;
}

// Q4_K_K8 / Q5_K_K8: vec_dot_q4_K/q5_K_q8_K of one row with T tokens
// (T <= 4; the row's codes decoded once for all of them)
static inline __attribute__((always_inline)) void k8_tokens(bool q5, const int T, int64_t k, const void *vw,
                                                            const blk_q8_K *const *x, float *out) {
  __m256 acc[4];
  __m128 accm[4];
  float summs[4] = {0};
  for (int t = 0; t < T; t++) {
    acc[t] = _mm256_setzero_ps();
    accm[t] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < k / QK_K; b++) {
    const blk_q4_K *w4 = &((const blk_q4_K *)vw)[b];
    const blk_q5_K *w5 = &((const blk_q5_K *)vw)[b];
    const uint8_t *qs = q5 ? w5->qs : w4->qs;
    uint64_t sc, mn;
    qi_k4_scales(q5 ? w5->scales : w4->scales, &sc, &mn);
    const float dw = f16(q5 ? w5->d : w4->d), dmw = f16(q5 ? w5->dmin : w4->dmin);
    const __m128i mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
    __m256i lane[4];
    for (int t = 0; t < T; t++) {
      // mins: lane i of m4 = mn[2i] * bsum32(2i) + mn[2i+1] * bsum32(2i+1) (exact ints)
      const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x[t][b].bsums),
                                        _mm_loadu_si128((const __m128i *)(x[t][b].bsums + 8)));
      const __m128i m4 = _mm_madd_epi16(mn16, bs);
      const float dmin = -x[t][b].d * dmw;
      if (q5) {
        __m128i u = _mm_add_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
        u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1));
        summs[t] = fma1(dmin, (float)_mm_cvtsi128_si32(u), summs[t]);
      } else {
        accm[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m4), accm[t]);
      }
      lane[t] = _mm256_setzero_si256();
    }
    for (int s = 0; s < 8; s++) {  // int16 pairs (<= 2 * 31 * 127) times the scale, summed in int32: exact
      const __m256i c = k4_codes(qs, q5 ? w5->qh : NULL, s);
      const __m256i scv = _mm256_set1_epi16((short)((sc >> (8 * s)) & 0xff));
#pragma GCC unroll 4
      for (int t = 0; t < T; t++)
        lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(_mm256_maddubs_epi16(c, ld32(x[t][b].qs + 32 * s)), scv));
    }
    for (int t = 0; t < T; t++)
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[t][b].d * dw), _mm256_cvtepi32_ps(lane[t]), acc[t]);
  }
  for (int t = 0; t < T; t++) {
    const float h = hsum8(acc[t]);
    if (q5) {
      out[t] = h + summs[t];
    } else {
      const __m128 s2 = _mm_add_ps(accm[t], _mm_movehl_ps(accm[t], accm[t]));  // hsum4: (a0+a2) + (a1+a3)
      out[t] = h + _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
    }
  }
}

static float dot_k8(bool q5, int64_t k, const void *vw, const void *vx) {
  const blk_q8_K *x[1] = {vx};
  float s;
  k8_tokens(q5, 1, k, vw, x, &s);
  return s;
}

// Q4_K_V256 / V64 (the repack kernels): `step` sub-block pairs per fma; R rows at once
static inline __attribute__((always_inline)) void q4k_rows(const int R, int step, int64_t k,
                                                           const blk_q4_K *const *w, const blk_q8_K *x,
                                                           float *out) {
  float acc[4] = {0}, accm[4] = {0};
  for (int64_t b = 0; b < k / QK_K; b++) {
    int32_t bs[8];  // sums of the activations per sub-block
    for (int s = 0; s < 8; s++) bs[s] = x[b].bsums[2 * s] + x[b].bsums[2 * s + 1];
    for (int r = 0; r < R; r++) {
      uint8_t sc[8], mn[8];
      for (int s = 0; s < 8; s++) qi_scale_min_k4(s, w[r][b].scales, &sc[s], &mn[s]);
      int32_t isum[8];
      for (int s = 0; s < 8; s++) isum[s] = hsum8i(dot_us(k4_codes(w[r][b].qs, NULL, s), ld32(x[b].qs + 32 * s)));
      qi_q4k_repack_block(step, sc, mn, isum, bs, f16(w[r][b].d) * x[b].d, f16(w[r][b].dmin) * x[b].d, &acc[r],
                          &accm[r]);
    }
  }
  for (int r = 0; r < R; r++) out[r] = acc[r] - accm[r];
}

static float dot_q4k_repack(int step, int64_t k, const void *vw, const void *vx) {
  const blk_q4_K *w[1] = {vw};
  float s;
  q4k_rows(1, step, k, w, vx, &s);
  return s;
}

// Q6_K_K8: vec_dot_q6_K_q8_K of one row with T tokens (T <= 4; the codes
// decoded once for all). 32 elements (j, c) a register, in element order:
// lanes 0..3 take scale 8j+2c, lanes 4..7 scale 8j+2c+1.
static inline __attribute__((always_inline)) void q6k_tokens(const int T, int64_t k, const blk_q6_K *w,
                                                             const blk_q8_K *const *x, float *out) {
  __m256 acc[4];
  for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < k / QK_K; b++) {
    __m256i lane[4];
    for (int t = 0; t < T; t++) lane[t] = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
      const __m256i h = ld32(w[b].qh + 32 * j);
      for (int c = 0; c < 4; c++) {
        const __m256i l = ld32(w[b].ql + 64 * j + 32 * (c & 1));
        const __m256i lo = _mm256_and_si256(c >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c)), m3);
        const __m256i code = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        // int16 pairs (<= 2 * 63 * 127) times the scale (elements 0..15: 8j+2c, 16..31: 8j+2c+1)
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(w[b].scales[8 * j + 2 * c + 1]),
                                             _mm_set1_epi16(w[b].scales[8 * j + 2 * c]));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
          lane[t] = _mm256_add_epi32(
              lane[t], _mm256_madd_epi16(_mm256_maddubs_epi16(code, ld32(x[t][b].qs + 128 * j + 32 * c)), scv));
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
    const float dw = f16(w[b].d);
    for (int t = 0; t < T; t++) {
      // lane l -= 32 * (bsums[2l] * scales[2l] + bsums[2l+1] * scales[2l+1])
      const __m256i corr = _mm256_madd_epi16(ld32(x[t][b].bsums), sc16);
      const __m256i ln = _mm256_sub_epi32(lane[t], _mm256_slli_epi32(corr, 5));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[t][b].d * dw), _mm256_cvtepi32_ps(ln), acc[t]);
    }
  }
  for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
}

static float dot_q6k(int64_t k, const void *vw, const void *vx) {
  const blk_q8_K *x[1] = {vx};
  float s;
  q6k_tokens(1, k, vw, x, &s);
  return s;
}

// ---- float orders --------------------------------------------------------------------------

static inline __m256 ld8(bool half, const void *p, int64_t i) {
  if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
  return _mm256_loadu_ps((const float *)p + i);
}

// hsum16 of lanes lo (0..7), hi (8..15): a_i + a_{i+8}, then hsum8
static inline float hs16(__m256 lo, __m256 hi) { return hsum8(_mm256_add_ps(lo, hi)); }

// F32_T16 / F16_T16: 16 lanes, fma per 16 elements (k % 16 == 0)
static float dot_t16(bool half, int64_t k, const void *w, const void *x) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; c += 16) {
    a0 = _mm256_fmadd_ps(ld8(half, w, c), ld8(half, x, c), a0);
    a1 = _mm256_fmadd_ps(ld8(half, w, c + 8), ld8(half, x, c + 8), a1);
  }
  return hs16(a0, a1);
}

// F32_VEC / F16_VEC: 4 x 16 lanes per 64, s0 + s2, s1 + s3, their sum,
// hsum16; the tails as the reference
static float dot_v(bool half, int64_t k, const void *w, const void *x) {
  __m256 s[4][2];
  for (int j = 0; j < 4; j++) s[j][0] = s[j][1] = _mm256_setzero_ps();
  const int64_t np = k & ~(int64_t)63;
  for (int64_t c = 0; c < np; c += 64)
    for (int j = 0; j < 4; j++)
      for (int h = 0; h < 2; h++) {
        const int64_t e = c + 16 * j + 8 * h;
        s[j][h] = _mm256_fmadd_ps(ld8(half, w, e), ld8(half, x, e), s[j][h]);
      }
  __m256 t[2];
  for (int h = 0; h < 2; h++) t[h] = _mm256_add_ps(_mm256_add_ps(s[0][h], s[2][h]), _mm256_add_ps(s[1][h], s[3][h]));
  const float head = hs16(t[0], t[1]);
  if (half) {
    const uint16_t *wh = w, *xh = x;
    double sum = (double)head;
    for (int64_t i = np; i < k; i++) {
      const float p = f16(wh[i]) * f16(xh[i]);
      sum = sum + (double)p;
    }
    return (float)sum;
  }
  const float *wf = w, *xf = x;
  float sum = head;
  const int64_t r = k - np;
  const int64_t vec_end = np + (r & ~(int64_t)15) + ((r & 15) >= 8 ? 8 : 0);
  int64_t i = np;
  for (; i < vec_end; i++) {
    const float p = wf[i] * xf[i];
    sum = sum + p;
  }
  for (; i < k; i++) sum = fma1(wf[i], xf[i], sum);
  return sum;
}

// ---- R16 groups (quant_r16.c's layout): lane = row, activations broadcast --------------
// A 16-row group block is read as two halves of eight rows (the first and the
// second 32 bytes of each 64-byte piece); no horizontal sums.

static inline __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// q4_0, order C1, tokens j .. j+T-1 (T <= 2) of rows r0 .. r0+15
static inline __attribute__((always_inline)) void r16_q4_0(const int T, const uint8_t *g, int64_t nb, const void *X,
                                                           size_t xstride, int64_t j, float *Y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(15), ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
  __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
  const blk_q8_0 *x[2];
  for (int t = 0; t < T; t++) x[t] = (const blk_q8_0 *)((const char *)X + (size_t)(j + t) * xstride);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *gb = g + (size_t)b * 288;
    __m256i s[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()},
                       {_mm256_setzero_si256(), _mm256_setzero_si256()}};
    for (int c = 0; c < 4; c++)
      for (int h = 0; h < 2; h++) {
        const __m256i v = ld32(gb + 32 + 64 * c + 32 * h);
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int t = 0; t < T; t++) {  // int16 sums: 8 pairs of |15 * 127| * 2 at most
          const __m256i a = _mm256_maddubs_epi16(lo, bcast4(x[t][b].qs + 4 * c));
          s[t][h] = _mm256_add_epi16(s[t][h], _mm256_add_epi16(a, _mm256_maddubs_epi16(hi, bcast4(x[t][b].qs + 16 + 4 * c))));
        }
      }
    const __m256 dw[2] = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb)),
                          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16)))};
    for (int t = 0; t < T; t++) {
      const __m256i off = _mm256_set1_epi32(8 * hsum8i(dot_us(ones8, ld32(x[t][b].qs))));
      const __m256 dx = _mm256_set1_ps(f16(x[t][b].d));
      for (int h = 0; h < 2; h++) {
        const __m256i is = _mm256_sub_epi32(_mm256_madd_epi16(s[t][h], ones16), off);
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw[h], dx), acc[t][h]);
      }
    }
  }
  for (int t = 0; t < T; t++) {
    _mm256_storeu_ps(Y + (j + t) * ldy, acc[t][0]);
    _mm256_storeu_ps(Y + (j + t) * ldy + 8, acc[t][1]);
  }
}

// q4_K, orders V256 (v64 false) and V64, tokens x[0..T) (T <= 4): the 6-bit
// scales and mins of eight rows decoded lane-wise from the three dwords of
// their 12 bytes, once per block for all the tokens; y[t][16]
static void r16_q4k(bool v64, const uint8_t *g, int64_t nb, const blk_q8_K *const *x, int T, float *y) {
  const __m256i m4 = _mm256_set1_epi8(15), m6 = _mm256_set1_epi32(63);
  const __m256i m4d = _mm256_set1_epi32(15), m2d = _mm256_set1_epi32(3);
  for (int h = 0; h < 2; h++) {
    __m256 acc[4], accm[4];
    for (int t = 0; t < T; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t *gb = g + (size_t)b * 2304;
      const __m256i u0 = ld32(gb + 64 + 32 * h), u1 = ld32(gb + 128 + 32 * h), u2 = ld32(gb + 192 + 32 * h);
      __m256i sc2[8], mn[8];  // sc2: the scale in both int16 halves of the lane (a madd operand)
      for (int s4 = 0; s4 < 4; s4++) {
        const __m128i sh = _mm_cvtsi32_si128(8 * s4), sh6 = _mm_cvtsi32_si128(8 * s4 + 6), sh4 = _mm_cvtsi32_si128(8 * s4 + 4);
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi32(u0, sh), m6);
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(u2, sh), m4d),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(u0, sh6), m2d), 4));
        sc2[s4] = _mm256_or_si256(lo, _mm256_slli_epi32(lo, 16));
        sc2[s4 + 4] = _mm256_or_si256(hi, _mm256_slli_epi32(hi, 16));
        mn[s4] = _mm256_and_si256(_mm256_srl_epi32(u1, sh), m6);
        mn[s4 + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(u2, sh4), m4d),
                                     _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(u1, sh6), m2d), 4));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
      const __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h)));
      for (int t = 0; t < T; t++) {
        __m256i isc[4];  // sub-block pair q: sc[2q] * isum[2q] + sc[2q+1] * isum[2q+1]
        for (int q = 0; q < 4; q++) {
          __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
          for (int e = 0; e < 8; e++) {  // int16 sums: 8 pairs of |15 * 127| * 2 at most
            const __m256i v = ld32(gb + 256 + 512 * q + 64 * e + 32 * h);
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(v, m4), bcast4(x[t][b].qs + 64 * q + 4 * e)));
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                           bcast4(x[t][b].qs + 64 * q + 32 + 4 * e)));
          }
          isc[q] = _mm256_add_epi32(_mm256_madd_epi16(lo, sc2[2 * q]), _mm256_madd_epi16(hi, sc2[2 * q + 1]));
        }
        const __m256 xd = _mm256_set1_ps(x[t][b].d);
        const __m256 ds = _mm256_mul_ps(dw, xd), dm = _mm256_mul_ps(dmw, xd);
        const int step = v64 ? 1 : 4;
        for (int p0 = 0; p0 < 4; p0 += step) {
          __m256i is = _mm256_setzero_si256(), im = _mm256_setzero_si256();
          for (int q = p0; q < p0 + step; q++) {
            is = _mm256_add_epi32(is, isc[q]);
            for (int s = 2 * q; s < 2 * q + 2; s++)
              im = _mm256_add_epi32(im, _mm256_mullo_epi32(mn[s], _mm256_set1_epi32(x[t][b].bsums[2 * s] + x[t][b].bsums[2 * s + 1])));
          }
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), ds, acc[t]);
          accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), dm, accm[t]);
        }
      }
    }
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y + 16 * t + 8 * h, _mm256_sub_ps(acc[t], accm[t]));
  }
}

// the orders of q4_0 and q4_K (the table's rows of the other R16 types have no group kernel here)
void quant_exact_tile_r16_avx2(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                               float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  MOLE_ASSERT(i0 % 16 == 0 && i1 <= n_rows / 16 * 16);
  MOLE_ASSERT(o == QX_Q4_0_C1 || o == QX_Q4_K_V256 || o == QX_Q4_K_V64);
  const size_t rb = quant_row_size(t, k);
  const int64_t nb = k / (o == QX_Q4_0_C1 ? 32 : QK_K);
  float y16[16], y64[64];
  for (int64_t r0 = i0; r0 < i1; r0 += 16) {
    const uint8_t *g = (const uint8_t *)W + (size_t)r0 * rb;
    const bool part = i1 - r0 < 16;  // a tile that ends inside the group
    for (int64_t j = j0; j < j1;) {
      if (o == QX_Q4_0_C1) {
        const int T = j1 - j >= 2 ? 2 : 1;
        if (part) {
          r16_q4_0(1, g, nb, X, xstride, j, y16, 0);
          memcpy(Y + j * ldy + r0, y16, (size_t)(i1 - r0) * sizeof(float));
          j++;
          continue;
        }
        if (T == 2)
          r16_q4_0(2, g, nb, X, xstride, j, Y + r0, ldy);
        else
          r16_q4_0(1, g, nb, X, xstride, j, Y + r0, ldy);
        j += T;
      } else {
        const int T = (int)MOLE_MIN(j1 - j, (int64_t)4);
        const blk_q8_K *x[4];
        for (int u = 0; u < T; u++) x[u] = (const blk_q8_K *)((const char *)X + (size_t)(j + u) * xstride);
        r16_q4k(o == QX_Q4_K_V64, g, nb, x, T, y64);
        for (int u = 0; u < T; u++) memcpy(Y + (j + u) * ldy + r0, y64 + 16 * u, (size_t)(MOLE_MIN(i1 - r0, 16)) * sizeof(float));
        j += T;
      }
    }
  }
}

// Q8_0 on 2 rows x 4 tokens: each pair's 8 lanes as dot_l8's, the weights'
// sign-trick operands and the activations loaded once for the tile
static void l8_2x4(int64_t k, const blk_q8_0 *const *w, const blk_q8_0 *const *x, float *Y, int64_t ldy, int64_t i,
                   int64_t j) {
  __m256 acc[2][4];
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < 4; t++) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < k / 32; b++) {
    const __m256i w0 = ld32(w[0][b].qs), w1 = ld32(w[1][b].qs);
    const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
    const float d0 = f16(w[0][b].d), d1 = f16(w[1][b].d);
    for (int t = 0; t < 4; t++) {
      const __m256i xv = ld32(x[t][b].qs);
      const float dx = f16(x[t][b].d);
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xv, w0)), ones16);
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xv, w1)), ones16);
      acc[0][t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * dx), _mm256_cvtepi32_ps(p0), acc[0][t]);
      acc[1][t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * dx), _mm256_cvtepi32_ps(p1), acc[1][t]);
    }
  }
  for (int t = 0; t < 4; t++)
    for (int r = 0; r < 2; r++) Y[(j + t) * ldy + i + r] = hsum8(acc[r][t]);
}

// ---- entry points --------------------------------------------------------------------------

static void quant_exact_dot_avx2(qx_order o, int64_t k, float *s, const void *w, const void *x) {
  switch (o) {
    case QX_Q8_0: *s = dot_l8(false, k, w, x); return;
    case QX_Q4_0_L8: *s = dot_l8(true, k, w, x); return;
    case QX_Q4_0_C1: *s = dot_q4_0_c1(k, w, x); return;
    case QX_Q4_K_K8: *s = dot_k8(false, k, w, x); return;
    case QX_Q5_K_K8: *s = dot_k8(true, k, w, x); return;
    case QX_Q4_K_V256: *s = dot_q4k_repack(4, k, w, x); return;
    case QX_Q4_K_V64: *s = dot_q4k_repack(1, k, w, x); return;
    case QX_Q6_K_K8: *s = dot_q6k(k, w, x); return;
    case QX_F32_VEC: *s = dot_v(false, k, w, x); return;
    case QX_F16_VEC: *s = dot_v(true, k, w, x); return;
    case QX_F32_T16: *s = dot_t16(false, k, w, x); return;
    case QX_F16_T16: *s = dot_t16(true, k, w, x); return;
    default: quant_exact_dot_ref(o, k, s, w, x); return;
  }
}

// the one-token vec_dots (quant_avx2.h)
QX_VEC_DOTS(avx2, quant_exact_dot_avx2)

void quant_exact_tile_avx2(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const char *wb = W, *xb = X;
  int64_t i = i0;
  if (o == QX_Q8_0 && j1 - j0 >= 4) {  // several tokens: 2 x 4 tiles, the rest below
    const int64_t jt = j0 + (j1 - j0) / 4 * 4;
    int64_t r = i0;
    for (; r + 2 <= i1; r += 2) {
      const blk_q8_0 *w[2] = {(const blk_q8_0 *)(wb + (size_t)r * wstride), (const blk_q8_0 *)(wb + (size_t)(r + 1) * wstride)};
      for (int64_t j = j0; j < jt; j += 4) {
        const blk_q8_0 *x[4];
        for (int t = 0; t < 4; t++) x[t] = (const blk_q8_0 *)(xb + (size_t)(j + t) * xstride);
        l8_2x4(k, w, x, Y, ldy, r, j);
      }
    }
    for (; r < i1; r++)  // an odd last row
      for (int64_t j = j0; j < jt; j++)
        quant_exact_dot_avx2(o, k, &Y[j * ldy + r], wb + (size_t)r * wstride, xb + (size_t)j * xstride);
    j0 = jt;  // the last tokens (fewer than 4): one row at a time
  }
  if ((o == QX_Q4_K_K8 || o == QX_Q5_K_K8 || o == QX_Q6_K_K8) && j1 - j0 >= 4) {  // a row's codes decoded once for 4 tokens
    const int64_t jt = j0 + (j1 - j0) / 4 * 4;
    for (int64_t r = i0; r < i1; r++)
      for (int64_t j = j0; j < jt; j += 4) {
        const blk_q8_K *x[4];
        float out[4];
        for (int u = 0; u < 4; u++) x[u] = (const blk_q8_K *)(xb + (size_t)(j + u) * xstride);
        if (o == QX_Q6_K_K8)
          q6k_tokens(4, k, (const blk_q6_K *)(wb + (size_t)r * wstride), x, out);
        else if (o == QX_Q5_K_K8)  // constant arguments: the token loops unroll into registers
          k8_tokens(true, 4, k, wb + (size_t)r * wstride, x, out);
        else
          k8_tokens(false, 4, k, wb + (size_t)r * wstride, x, out);
        for (int u = 0; u < 4; u++) Y[(j + u) * ldy + r] = out[u];
      }
    j0 = jt;
  }
  if (o == QX_Q4_0_C1) {  // eight (row, token) chains at once: 8 rows x 1 token, or 4 x 2
    for (; i + 8 <= i1; i += 8) {
      const blk_q4_0 *w[8];
      for (int r = 0; r < 8; r++) w[r] = (const blk_q4_0 *)(wb + (size_t)(i + r) * wstride);
      int64_t j = j0;
      for (; j + 2 <= j1; j += 2)
        for (int h = 0; h < 2; h++) {
          const blk_q8_0 *x[2] = {(const blk_q8_0 *)(xb + (size_t)j * xstride),
                                  (const blk_q8_0 *)(xb + (size_t)(j + 1) * xstride)};
          c1_pairs(4, 2, k, w + 4 * h, x, Y, ldy, i + 4 * h, j);
        }
      for (; j < j1; j++) {
        const blk_q8_0 *x[1] = {(const blk_q8_0 *)(xb + (size_t)j * xstride)};
        c1_pairs(8, 1, k, w, x, Y, ldy, i, j);
      }
    }
  }
  // q4_K's repack orders (one fma chain a row): four rows side by side
  if (o == QX_Q4_K_V256 || o == QX_Q4_K_V64) {
    for (; i + 4 <= i1; i += 4) {
      const void *w[4];
      for (int r = 0; r < 4; r++) w[r] = wb + (size_t)(i + r) * wstride;
      for (int64_t j = j0; j < j1; j++) {
        const void *x = xb + (size_t)j * xstride;
        float out[4];
        q4k_rows(4, o == QX_Q4_K_V256 ? 4 : 1, k, (const blk_q4_K *const *)w, x, out);
        for (int r = 0; r < 4; r++) Y[j * ldy + i + r] = out[r];
      }
    }
  }
  for (; i < i1; i++) {  // a weight row stays in cache for every token
    const char *w = wb + (size_t)i * wstride;
    for (int64_t j = j0; j < j1; j++) quant_exact_dot_avx2(o, k, &Y[j * ldy + i], w, xb + (size_t)j * xstride);
  }
}
