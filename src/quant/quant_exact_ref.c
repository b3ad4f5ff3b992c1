// quant_exact_ref: llama.cpp's summation orders as plain scalar C, the
// reference of every level's twins (see quant_exact.h for the orders; which
// order an output takes is the dispatcher's, quant.c).
//
// Every float operation below is written out one at a time: products that
// llama.cpp fuses are fmaf(), others are separate statements, so that no
// compiler contraction changes a rounding.
#include <math.h>
#include <string.h>

#include "quant/quant_ref.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

// ---- horizontal sums as the x86 code computes them ------------------------------------

// hsum_float_8 / tinyBLAS hsum(__m256): ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))
static float hsum8(const float *a) {
  float r[4];
  for (int i = 0; i < 4; i++) r[i] = a[i] + a[i + 4];
  float s0 = r[0] + r[2], s1 = r[1] + r[3];
  return s0 + s1;
}

// gcc's _mm512_reduce_add_ps: halves added down to 8, then hsum8
static float hsum16(const float *a) {
  float t[8];
  for (int i = 0; i < 8; i++) t[i] = a[i] + a[i + 8];
  return hsum8(t);
}

// _mm_movehl_ps + _mm_movehdup_ps: (a0+a2) + (a1+a3)
static float hsum4(const float *a) {
  float s0 = a[0] + a[2], s1 = a[1] + a[3];
  return s0 + s1;
}

// ---- block decoding ----------------------------------------------------------------------

static inline int q4_0_val(const blk_q4_0 *b, int e) {
  return e < 16 ? (b->qs[e] & 15) - 8 : (b->qs[e - 16] >> 4) - 8;
}

// element e of sub-block s (0..7) of a q4_K / q5_K block, 0..15 / 0..31
static inline int q4k_code(const uint8_t *qs, int s, int e) {
  uint8_t v = qs[32 * (s / 2) + e];
  return s % 2 ? v >> 4 : v & 15;
}
static inline int q5k_code(const blk_q5_K *b, int s, int e) {
  return q4k_code(b->qs, s, e) | (((b->qh[e] >> s) & 1) << 4);
}
// element E of a q6_K block, unsigned 0..63
static inline int q6k_code(const blk_q6_K *b, int E) {
  int j = E / 128, c = (E % 128) / 32, e = E % 32;
  uint8_t l = b->ql[64 * j + e + 32 * (c & 1)];
  int lo = c >= 2 ? l >> 4 : l & 15;
  int hi = (b->qh[32 * j + e] >> (2 * c)) & 3;
  return lo | (hi << 4);
}

// sums of the 32-element sub-blocks of a q8_K block
static inline int bsum32(const blk_q8_K *y, int s) { return y->bsums[2 * s] + y->bsums[2 * s + 1]; }

// ---- the orders ------------------------------------------------------------------------------

// Q8_0 / Q4_0_L8: lane l += (dw*dx) * sum of bytes 4l..4l+3, fma per block
static float dot_l8(bool q4, int64_t k, const void *vw, const void *vx) {
  const blk_q8_0 *x = vx;
  float acc[8] = {0};
  for (int64_t b = 0; b < k / 32; b++) {
    float dw = q4 ? qi_f16(((const blk_q4_0 *)vw)[b].d) : qi_f16(((const blk_q8_0 *)vw)[b].d);
    float d = dw * qi_f16(x[b].d);
    for (int l = 0; l < 8; l++) {
      int is = 0;
      for (int t = 4 * l; t < 4 * l + 4; t++) {
        int w = q4 ? q4_0_val(&((const blk_q4_0 *)vw)[b], t) : ((const blk_q8_0 *)vw)[b].qs[t];
        is += w * x[b].qs[t];
      }
      acc[l] = fmaf(d, (float)is, acc[l]);
    }
  }
  return hsum8(acc);
}

// Q4_0_C1: acc = fma(isum, dw*dx, acc) per block
static float dot_q4_0_c1(int64_t k, const void *vw, const void *vx) {
  const blk_q4_0 *w = vw;
  const blk_q8_0 *x = vx;
  float acc = 0;
  for (int64_t b = 0; b < k / 32; b++) {
    int is = 0;
    for (int e = 0; e < 32; e++) is += q4_0_val(&w[b], e) * x[b].qs[e];
    float d = qi_f16(w[b].d) * qi_f16(x[b].d);
    acc = fmaf((float)is, d, acc);
  }
  return acc;
}

// integer dot of sub-block s of a q4_K/q5_K block with the activations
static int k4_isum(const void *wb, bool q5, const int8_t *xq, int s, int e0, int e1) {
  int is = 0;
  for (int e = e0; e < e1; e++) {
    int q = q5 ? q5k_code(wb, s, e) : q4k_code(((const blk_q4_K *)wb)->qs, s, e);
    is += q * xq[32 * s + e];
  }
  return is;
}

// Q4_K_K8 / Q5_K_K8: vec_dot_q4_K/q5_K_q8_K
static float dot_k8(bool q5, int64_t k, const void *vw, const void *vx) {
  const blk_q8_K *x = vx;
  float acc[8] = {0}, accm[4] = {0}, summs = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    const void *wb = q5 ? (const void *)&((const blk_q5_K *)vw)[b] : (const void *)&((const blk_q4_K *)vw)[b];
    const uint8_t *sc12 = q5 ? ((const blk_q5_K *)wb)->scales : ((const blk_q4_K *)wb)->scales;
    uint16_t hd = q5 ? ((const blk_q5_K *)wb)->d : ((const blk_q4_K *)wb)->d;
    uint16_t hm = q5 ? ((const blk_q5_K *)wb)->dmin : ((const blk_q4_K *)wb)->dmin;
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) qi_scale_min_k4(s, sc12, &sc[s], &mn[s]);
    float d = x[b].d * qi_f16(hd);
    float dmin = -x[b].d * qi_f16(hm);
    if (q5) {
      int m = 0;
      for (int s = 0; s < 8; s++) m += mn[s] * bsum32(&x[b], s);
      summs = fmaf(dmin, (float)m, summs);
    } else {
      for (int i = 0; i < 4; i++) {
        int m = mn[2 * i] * bsum32(&x[b], 2 * i) + mn[2 * i + 1] * bsum32(&x[b], 2 * i + 1);
        accm[i] = fmaf(dmin, (float)m, accm[i]);
      }
    }
    for (int l = 0; l < 8; l++) {
      int lane = 0;
      for (int s = 0; s < 8; s++) lane += sc[s] * k4_isum(wb, q5, x[b].qs, s, 4 * l, 4 * l + 4);
      acc[l] = fmaf(d, (float)lane, acc[l]);
    }
  }
  float h = hsum8(acc);
  return q5 ? h + summs : h + hsum4(accm);
}

// Q4_K_V256 / V64: the repack kernels; `step` sub-block pairs per fma (4 or 1)
static float dot_q4k_repack(int step, int64_t k, const void *vw, const void *vx) {
  const blk_q4_K *w = vw;
  const blk_q8_K *x = vx;
  float acc = 0, accm = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) qi_scale_min_k4(s, w[b].scales, &sc[s], &mn[s]);
    int32_t isum[8], bs[8];
    for (int s = 0; s < 8; s++) {
      isum[s] = k4_isum(&w[b], false, x[b].qs, s, 0, 32);
      bs[s] = bsum32(&x[b], s);
    }
    qi_q4k_repack_block(step, sc, mn, isum, bs, qi_f16(w[b].d) * x[b].d, qi_f16(w[b].dmin) * x[b].d, &acc, &accm);
  }
  return acc - accm;
}

// Q6_K_K8: vec_dot_q6_K_q8_K
static float dot_q6k(int64_t k, const void *vw, const void *vx) {
  const blk_q6_K *w = vw;
  const blk_q8_K *x = vx;
  float acc[8] = {0};
  for (int64_t b = 0; b < k / QK_K; b++) {
    float d = x[b].d * qi_f16(w[b].d);
    for (int l = 0; l < 8; l++) {
      int lane = 0;
      for (int j = 0; j < 2; j++)
        for (int c = 0; c < 4; c++) {
          int is = 0;
          for (int t = 0; t < 4; t++) {
            int E = 128 * j + 32 * c + 4 * l + t;
            is += q6k_code(&w[b], E) * x[b].qs[E];
          }
          lane += w[b].scales[8 * j + 2 * c + (l >= 4)] * is;
        }
      lane -= 32 * (x[b].bsums[2 * l] * w[b].scales[2 * l] + x[b].bsums[2 * l + 1] * w[b].scales[2 * l + 1]);
      acc[l] = fmaf(d, (float)lane, acc[l]);
    }
  }
  return hsum8(acc);
}

static inline float ld_f(int t, const void *p, int64_t i) {
  if (t == QT_F32) return ((const float *)p)[i];
  if (t == QT_F16) return quant_f16_to_f32(((const uint16_t *)p)[i]);
  return quant_bf16_to_f32(((const uint16_t *)p)[i]);
}

// F32_T16 / F16_T16: 16 lanes, fma per 16 elements, hsum16 (k % 16 == 0)
static float dot_t16(int t, int64_t k, const void *w, const void *x) {
  float acc[16] = {0};
  for (int64_t c = 0; c < k; c += 16)
    for (int i = 0; i < 16; i++) acc[i] = fmaf(ld_f(t, w, c + i), ld_f(t, x, c + i), acc[i]);
  return hsum16(acc);
}

// F32_VEC: ggml_vec_dot_f32 (AVX-512): 4 x 16 lanes per 64, float tail by fma
static float dot_vf32(int64_t k, const float *w, const float *x) {
  float s[4][16] = {{0}};
  const int64_t np = k & ~(int64_t)63;
  for (int64_t c = 0; c < np; c += 64)
    for (int j = 0; j < 4; j++)
      for (int i = 0; i < 16; i++) s[j][i] = fmaf(w[c + 16 * j + i], x[c + 16 * j + i], s[j][i]);
  for (int i = 0; i < 16; i++) {
    s[0][i] = s[0][i] + s[2][i];
    s[1][i] = s[1][i] + s[3][i];
  }
  for (int i = 0; i < 16; i++) s[0][i] = s[0][i] + s[1][i];
  float sum = hsum16(s[0]);
  // the tail loop `sumf += x[i]*y[i]` as gcc -O3 compiled it: products of
  // 16- then 8-element pieces rounded, added in order; the last < 8 by fma
  int64_t i = np, r = k - np;
  int64_t vec_end = np + (r & ~(int64_t)15) + ((r & 15) >= 8 ? 8 : 0);
  for (; i < vec_end; i++) {
    float p = w[i] * x[i];
    sum = sum + p;
  }
  for (; i < k; i++) sum = fmaf(w[i], x[i], sum);
  return sum;
}

// F16_VEC: ggml_vec_dot_f16 without AVX512-FP16: as f32 in 4 x 16 lanes, the
// reduction and the tail in double
static float dot_vf16(int64_t k, const uint16_t *w, const uint16_t *x) {
  float s[4][16] = {{0}};
  const int64_t np = k & ~(int64_t)63;
  for (int64_t c = 0; c < np; c += 64)
    for (int j = 0; j < 4; j++)
      for (int i = 0; i < 16; i++) {
        int64_t e = c + 16 * j + i;
        s[j][i] = fmaf(quant_f16_to_f32(w[e]), quant_f16_to_f32(x[e]), s[j][i]);
      }
  for (int i = 0; i < 16; i++) {
    s[0][i] = s[0][i] + s[2][i];
    s[1][i] = s[1][i] + s[3][i];
  }
  for (int i = 0; i < 16; i++) s[0][i] = s[0][i] + s[1][i];
  double sum = (double)hsum16(s[0]);
  for (int64_t i = np; i < k; i++) {
    float p = quant_f16_to_f32(w[i]) * quant_f16_to_f32(x[i]);
    sum = sum + (double)p;
  }
  return (float)sum;
}

// vdpbf16ps: fma with denormal inputs read as zero and a denormal result
// flushed to zero, round to nearest even
static inline float daz(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }
static inline float bf_fma(float a, float b, float c) { return daz(fmaf(daz(a), daz(b), daz(c))); }

// one dpbf16 step over 32 elements: lane i += odd pair, then even pair
static void dpbf16(float *acc, const uint16_t *w, const uint16_t *x) {
  for (int i = 0; i < 16; i++) {
    float a = bf_fma(quant_bf16_to_f32(w[2 * i + 1]), quant_bf16_to_f32(x[2 * i + 1]), acc[i]);
    acc[i] = bf_fma(quant_bf16_to_f32(w[2 * i]), quant_bf16_to_f32(x[2 * i]), a);
  }
}

// BF16_T32: tinyBLAS, one dpbf16 accumulator (k % 32 == 0)
static float dot_t32(int64_t k, const uint16_t *w, const uint16_t *x) {
  float acc[16] = {0};
  for (int64_t c = 0; c < k; c += 32) dpbf16(acc, w + c, x + c);
  return hsum16(acc);
}

// BF16_VEC: ggml_vec_dot_bf16 (AVX512-BF16): two accumulators per 64, summed
// in double with the tail
static float dot_vbf16(int64_t k, const uint16_t *w, const uint16_t *x) {
  float c1[16] = {0}, c2[16] = {0};
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    dpbf16(c1, w + i, x + i);
    dpbf16(c2, w + i + 32, x + i + 32);
  }
  double sum = 0;
  sum = sum + (double)hsum16(c1);
  sum = sum + (double)hsum16(c2);
  for (; i < k; i++) {
    float p = quant_bf16_to_f32(w[i]) * quant_bf16_to_f32(x[i]);
    sum = sum + (double)p;
  }
  return (float)sum;
}

void quant_exact_dot_ref(qx_order o, int64_t k, float *s, const void *w, const void *x) {
  switch (o) {
    case QX_Q8_0: *s = dot_l8(false, k, w, x); return;
    case QX_Q4_0_L8: *s = dot_l8(true, k, w, x); return;
    case QX_Q4_0_C1: *s = dot_q4_0_c1(k, w, x); return;
    case QX_Q4_K_K8: *s = dot_k8(false, k, w, x); return;
    case QX_Q5_K_K8: *s = dot_k8(true, k, w, x); return;
    case QX_Q4_K_V256: *s = dot_q4k_repack(4, k, w, x); return;
    case QX_Q4_K_V64: *s = dot_q4k_repack(1, k, w, x); return;
    case QX_Q6_K_K8: *s = dot_q6k(k, w, x); return;
    case QX_F32_VEC: *s = dot_vf32(k, w, x); return;
    case QX_F32_T16: *s = dot_t16(QT_F32, k, w, x); return;
    case QX_F16_VEC: *s = dot_vf16(k, w, x); return;
    case QX_F16_T16: *s = dot_t16(QT_F16, k, w, x); return;
    case QX_BF16_VEC: *s = dot_vbf16(k, w, x); return;
    case QX_BF16_T32: *s = dot_t32(k, w, x); return;
    default: MOLE_ASSERT(!"quant_exact_dot_ref: no such order");
  }
}

void quant_exact_tile_ref(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                          int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  for (int64_t j = j0; j < j1; j++)
    for (int64_t i = i0; i < i1; i++)
      quant_exact_dot_ref(o, k, &Y[j * ldy + i], (const char *)W + (size_t)i * wstride,
                          (const char *)X + (size_t)j * xstride);
}

// The one-token vec_dots of the types with orders (quant_ref.h)
QX_VEC_DOTS(ref, quant_exact_dot_ref)
