// quant_exact_avx2: AVX2 (+FMA, F16C) twins of quant_exact_ref.c's orders,
// so CPUs without AVX-512 (most desktops and laptops) compute llama.cpp's
// results bit for bit too. The orders with 8 float lanes map one to one on
// a 256-bit register; the 16-lane ones take two. Integer sums are exact:
// maddubs on unsigned codes (q4/q5/q6 codes, |w| through the sign trick)
// against activations in [-127, 127] (what the q8_0 / q8_K quantizers make)
// never saturate its int16 pairs. The bf16 orders run the reference.
#include <immintrin.h>
#include <string.h>

#include "quant/quant_exact.h"
#include "quant/quant_internal.h"

// ---- helpers ----------------------------------------------------------------------------

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// hsum8: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))
static inline float hs8(__m256 a) {
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));  // s0 = r0 + r2, s1 = r1 + r3
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline int hsi8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

static inline float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// unsigned bytes x signed bytes: lane l = sum of bytes 4l..4l+3
static inline __m256i dot_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// signed x signed: |w| (128 for -128 fits unsigned) against sign(x, w)
static inline __m256i dot_ss(__m256i w, __m256i x) { return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }

static inline __m256i ld32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// 16 bytes of nibbles -> 32 codes 0..15: low nibbles (elements 0..15), then high (16..31)
static inline __m256i nib32(const uint8_t *p) {
  const __m128i q = _mm_loadu_si128((const __m128i *)p), m4 = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

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
      is = dot_ss(_mm256_sub_epi8(nib32(wb->qs), _mm256_set1_epi8(8)), ld32(x[b].qs));
      dw = h2f(wb->d);
    } else {
      const blk_q8_0 *wb = &((const blk_q8_0 *)vw)[b];
      is = dot_ss(ld32(wb->qs), ld32(x[b].qs));
      dw = h2f(wb->d);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(x[b].d)), _mm256_cvtepi32_ps(is), acc);
  }
  return hs8(acc);
}

// Q4_0_C1: acc = fma(isum, dw*dx, acc) per block; R rows at once (their fma
// chains side by side in the lanes of one register)
static inline __attribute__((always_inline)) void c1_rows(const int R, int64_t k, const blk_q4_0 *const *w,
                                                          const blk_q8_0 *x, float *out) {
  __m128 acc = _mm_setzero_ps();
  for (int64_t b = 0; b < k / 32; b++) {
    const __m256i xv = ld32(x[b].qs);
    // sum(q - 8) x = sum q x - 8 sum x: one maddubs on the unsigned codes
    const int sx = hsi8(dot_us(_mm256_set1_epi8(1), xv));
    const float dx = h2f(x[b].d);
    int is[4] = {0};
    float d[4] = {0};
    for (int r = 0; r < R; r++) {
      is[r] = hsi8(dot_us(nib32(w[r][b].qs), xv)) - 8 * sx;
      d[r] = h2f(w[r][b].d) * dx;
    }
    const __m128 isf = _mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)is));
    acc = _mm_fmadd_ps(isf, _mm_loadu_ps(d), acc);
  }
  float a[4];
  _mm_storeu_ps(a, acc);
  for (int r = 0; r < R; r++) out[r] = a[r];
}

static float dot_q4_0_c1(int64_t k, const void *vw, const void *vx) {
  const blk_q4_0 *w[1] = {vw};
  float s;
  c1_rows(1, k, w, vx, &s);
  return s;
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

// Q4_K_K8 / Q5_K_K8: vec_dot_q4_K/q5_K_q8_K
static float dot_k8(bool q5, int64_t k, const void *vw, const void *vx) {
  const blk_q8_K *x = vx;
  __m256 acc = _mm256_setzero_ps();
  float accm[4] = {0}, summs = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    const blk_q4_K *w4 = &((const blk_q4_K *)vw)[b];
    const blk_q5_K *w5 = &((const blk_q5_K *)vw)[b];
    const uint8_t *sc12 = q5 ? w5->scales : w4->scales, *qs = q5 ? w5->qs : w4->qs;
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) qi_scale_min_k4(s, sc12, &sc[s], &mn[s]);
    const float d = x[b].d * h2f(q5 ? w5->d : w4->d);
    const float dmin = -x[b].d * h2f(q5 ? w5->dmin : w4->dmin);
    if (q5) {
      int m = 0;
      for (int s = 0; s < 8; s++) m += mn[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
      summs = fma1(dmin, (float)m, summs);
    } else {
      for (int i = 0; i < 4; i++) {
        const int m = mn[2 * i] * (x[b].bsums[4 * i] + x[b].bsums[4 * i + 1]) +
                      mn[2 * i + 1] * (x[b].bsums[4 * i + 2] + x[b].bsums[4 * i + 3]);
        accm[i] = fma1(dmin, (float)m, accm[i]);
      }
    }
    __m256i lane = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
      const __m256i is = dot_us(k4_codes(qs, q5 ? w5->qh : NULL, s), ld32(x[b].qs + 32 * s));
      lane = _mm256_add_epi32(lane, _mm256_mullo_epi32(is, _mm256_set1_epi32(sc[s])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lane), acc);
  }
  const float h = hs8(acc);
  if (q5) return h + summs;
  const float s0 = accm[0] + accm[2], s1 = accm[1] + accm[3];
  return h + (s0 + s1);
}

// Q4_K_V256 / V64 (the repack kernels): `step` sub-block pairs per fma; R rows at once
static inline __attribute__((always_inline)) void q4k_rows(const int R, int step, int64_t k,
                                                           const blk_q4_K *const *w, const blk_q8_K *x,
                                                           float *out) {
  float acc[4] = {0}, accm[4] = {0};
  for (int64_t b = 0; b < k / QK_K; b++) {
    int bs[8];  // sums of the activations per sub-block
    for (int s = 0; s < 8; s++) bs[s] = x[b].bsums[2 * s] + x[b].bsums[2 * s + 1];
    for (int r = 0; r < R; r++) {
      uint8_t sc[8], mn[8];
      for (int s = 0; s < 8; s++) qi_scale_min_k4(s, w[r][b].scales, &sc[s], &mn[s]);
      int isum[8];
      for (int s = 0; s < 8; s++) isum[s] = hsi8(dot_us(k4_codes(w[r][b].qs, NULL, s), ld32(x[b].qs + 32 * s)));
      const float ds = h2f(w[r][b].d) * x[b].d;
      const float dm = h2f(w[r][b].dmin) * x[b].d;
      for (int p0 = 0; p0 < 4; p0 += step) {
        int is = 0, im = 0;
        for (int s = 2 * p0; s < 2 * (p0 + step); s++) {
          is += sc[s] * isum[s];
          im += mn[s] * bs[s];
        }
        acc[r] = fma1((float)is, ds, acc[r]);
        accm[r] = fma1((float)im, dm, accm[r]);
      }
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

// Q6_K_K8: vec_dot_q6_K_q8_K. 32 elements (j, c) a register, in element
// order: lanes 0..3 take scale 8j+2c, lanes 4..7 scale 8j+2c+1.
static float dot_q6k(int64_t k, const void *vw, const void *vx) {
  const blk_q6_K *w = vw;
  const blk_q8_K *x = vx;
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < k / QK_K; b++) {
    __m256i lane = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
      const __m256i h = ld32(w[b].qh + 32 * j);
      for (int c = 0; c < 4; c++) {
        const __m256i l = ld32(w[b].ql + 64 * j + 32 * (c & 1));
        const __m256i lo = _mm256_and_si256(c >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c)), m3);
        const __m256i code = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        const __m256i is = dot_us(code, ld32(x[b].qs + 128 * j + 32 * c));
        const __m256i scv = _mm256_setr_epi32(w[b].scales[8 * j + 2 * c], w[b].scales[8 * j + 2 * c],
                                              w[b].scales[8 * j + 2 * c], w[b].scales[8 * j + 2 * c],
                                              w[b].scales[8 * j + 2 * c + 1], w[b].scales[8 * j + 2 * c + 1],
                                              w[b].scales[8 * j + 2 * c + 1], w[b].scales[8 * j + 2 * c + 1]);
        lane = _mm256_add_epi32(lane, _mm256_mullo_epi32(is, scv));
      }
    }
    int32_t ls[8];
    _mm256_storeu_si256((__m256i *)ls, lane);
    for (int l = 0; l < 8; l++)
      ls[l] -= 32 * (x[b].bsums[2 * l] * w[b].scales[2 * l] + x[b].bsums[2 * l + 1] * w[b].scales[2 * l + 1]);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[b].d * h2f(w[b].d)), _mm256_cvtepi32_ps(ld32(ls)), acc);
  }
  return hs8(acc);
}

// ---- float orders --------------------------------------------------------------------------

static inline __m256 ld8(bool f16, const void *p, int64_t i) {
  if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
  return _mm256_loadu_ps((const float *)p + i);
}

// hsum16 of lanes lo (0..7), hi (8..15): a_i + a_{i+8}, then hsum8
static inline float hs16(__m256 lo, __m256 hi) { return hs8(_mm256_add_ps(lo, hi)); }

// F32_T16 / F16_T16: 16 lanes, fma per 16 elements (k % 16 == 0)
static float dot_t16(bool f16, int64_t k, const void *w, const void *x) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; c += 16) {
    a0 = _mm256_fmadd_ps(ld8(f16, w, c), ld8(f16, x, c), a0);
    a1 = _mm256_fmadd_ps(ld8(f16, w, c + 8), ld8(f16, x, c + 8), a1);
  }
  return hs16(a0, a1);
}

// F32_VEC / F16_VEC: 4 x 16 lanes per 64, s0 + s2, s1 + s3, their sum,
// hsum16; the tails as the reference
static float dot_v(bool f16, int64_t k, const void *w, const void *x) {
  __m256 s[4][2];
  for (int j = 0; j < 4; j++) s[j][0] = s[j][1] = _mm256_setzero_ps();
  const int64_t np = k & ~(int64_t)63;
  for (int64_t c = 0; c < np; c += 64)
    for (int j = 0; j < 4; j++)
      for (int h = 0; h < 2; h++) {
        const int64_t e = c + 16 * j + 8 * h;
        s[j][h] = _mm256_fmadd_ps(ld8(f16, w, e), ld8(f16, x, e), s[j][h]);
      }
  __m256 t[2];
  for (int h = 0; h < 2; h++) t[h] = _mm256_add_ps(_mm256_add_ps(s[0][h], s[2][h]), _mm256_add_ps(s[1][h], s[3][h]));
  const float head = hs16(t[0], t[1]);
  if (f16) {
    const uint16_t *wh = w, *xh = x;
    double sum = (double)head;
    for (int64_t i = np; i < k; i++) {
      const float p = h2f(wh[i]) * h2f(xh[i]);
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

// ---- entry points --------------------------------------------------------------------------

void quant_exact_dot_avx2(qx_order o, int64_t k, float *s, const void *w, const void *x) {
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

void quant_exact_tile_avx2(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const char *wb = W, *xb = X;
  int64_t i = i0;
  // orders whose rows are one fma chain each: four rows side by side
  if (o == QX_Q4_0_C1 || o == QX_Q4_K_V256 || o == QX_Q4_K_V64) {
    for (; i + 4 <= i1; i += 4) {
      const void *w[4];
      for (int r = 0; r < 4; r++) w[r] = wb + (size_t)(i + r) * wstride;
      for (int64_t j = j0; j < j1; j++) {
        const void *x = xb + (size_t)j * xstride;
        float out[4];
        if (o == QX_Q4_0_C1)
          c1_rows(4, k, (const blk_q4_0 *const *)w, x, out);
        else
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
