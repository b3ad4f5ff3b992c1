// quant_exact_neon: NEON (ARMv8.2 dotprod) twins of quant_exact_ref.c's
// orders, so an ARM64 machine computes llama.cpp's x86 results bit for bit.
// Integer sums are exact whatever instruction forms them (sdot here, VNNI
// there); every float step is the reference's, lane for lane: fma where it
// fuses, the same horizontal-sum trees (done on stored lanes, in scalar).
// The bf16 orders (x86's vdpbf16ps, with its denormal flushing) run the
// reference.
#include <string.h>

#include "quant/quant_neon.h"

// ---- horizontal sums: the reference's trees ----------------------------------------

// ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) of lanes lo = a0..a3, hi = a4..a7
static inline float hsum8v(float32x4_t lo, float32x4_t hi) {
  float r[4];
  vst1q_f32(r, vaddq_f32(lo, hi));
  const float s0 = r[0] + r[2], s1 = r[1] + r[3];
  return s0 + s1;
}

// halves added down to 8 (a_i + a_{i+8}), then hsum8; a = four vectors of 4
static inline float hsum16v(const float32x4_t a[4]) { return hsum8v(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3])); }

// ---- int8 dot products -------------------------------------------------------------------

// lanes l = 0..3: sum of w[4l..4l+3] * x[4l..4l+3]
static inline int32x4_t dot16(int8x16_t w, int8x16_t x) { return vdotq_s32(vdupq_n_s32(0), w, x); }

// the 32 weights of a q4_0 block as int8 (-8..7), elements 0..15 and 16..31
static inline void q4_0_unpack(const blk_q4_0 *b, int8x16_t *lo, int8x16_t *hi) {
  const uint8x16_t q = vld1q_u8(b->qs);
  *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
  *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

// Q8_0 / Q4_0_L8: lane l += (dw*dx) * sum of bytes 4l..4l+3, fma per block, hsum8
static float dot_l8(bool q4, int64_t k, const void *vw, const void *vx) {
  const blk_q8_0 *x = vx;
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
  for (int64_t b = 0; b < k / 32; b++) {
    int8x16_t w0, w1;
    float dw;
    if (q4) {
      const blk_q4_0 *wb = &((const blk_q4_0 *)vw)[b];
      q4_0_unpack(wb, &w0, &w1);
      dw = qi_f16(wb->d);
    } else {
      const blk_q8_0 *wb = &((const blk_q8_0 *)vw)[b];
      w0 = vld1q_s8(wb->qs);
      w1 = vld1q_s8(wb->qs + 16);
      dw = qi_f16(wb->d);
    }
    const float32x4_t d = vdupq_n_f32(dw * qi_f16(x[b].d));
    acc0 = vfmaq_f32(acc0, d, vcvtq_f32_s32(dot16(w0, vld1q_s8(x[b].qs))));
    acc1 = vfmaq_f32(acc1, d, vcvtq_f32_s32(dot16(w1, vld1q_s8(x[b].qs + 16))));
  }
  return hsum8v(acc0, acc1);
}

// Q4_0_C1: acc = fma(isum, dw*dx, acc) per block
static float dot_q4_0_c1(int64_t k, const void *vw, const void *vx) {
  const blk_q4_0 *w = vw;
  const blk_q8_0 *x = vx;
  float acc = 0;
  for (int64_t b = 0; b < k / 32; b++) {
    int8x16_t lo, hi;
    q4_0_unpack(&w[b], &lo, &hi);
    const int32x4_t s = vaddq_s32(dot16(lo, vld1q_s8(x[b].qs)), dot16(hi, vld1q_s8(x[b].qs + 16)));
    const float d = qi_f16(w[b].d) * qi_f16(x[b].d);
    acc = __builtin_fmaf((float)vaddvq_s32(s), d, acc);
  }
  return acc;
}

// Q4_K_K8 / Q5_K_K8: vec_dot_q4_K/q5_K_q8_K. Lane l of sub-block s: its
// elements 4l..4l+3 (lanes 0..3 from the first 16, 4..7 from the second).
static float dot_k8(bool q5, int64_t k, const void *vw, const void *vx) {
  const blk_q8_K *x = vx;
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
  float accm[4] = {0}, summs = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    const blk_q4_K *w4 = &((const blk_q4_K *)vw)[b];
    const blk_q5_K *w5 = &((const blk_q5_K *)vw)[b];
    const uint8_t *sc12 = q5 ? w5->scales : w4->scales, *qs = q5 ? w5->qs : w4->qs;
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) qi_scale_min_k4(s, sc12, &sc[s], &mn[s]);
    const float d = x[b].d * qi_f16(q5 ? w5->d : w4->d);
    const float dmin = -x[b].d * qi_f16(q5 ? w5->dmin : w4->dmin);
    if (q5) {
      int m = 0;
      for (int s = 0; s < 8; s++) m += mn[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
      summs = __builtin_fmaf(dmin, (float)m, summs);
    } else {
      for (int i = 0; i < 4; i++) {
        const int m = mn[2 * i] * (x[b].bsums[4 * i] + x[b].bsums[4 * i + 1]) +
                      mn[2 * i + 1] * (x[b].bsums[4 * i + 2] + x[b].bsums[4 * i + 3]);
        accm[i] = __builtin_fmaf(dmin, (float)m, accm[i]);
      }
    }
    int32x4_t lane0 = vdupq_n_s32(0), lane1 = vdupq_n_s32(0);
    const uint8x16_t qh0 = q5 ? vld1q_u8(w5->qh) : vdupq_n_u8(0), qh1 = q5 ? vld1q_u8(w5->qh + 16) : vdupq_n_u8(0);
    for (int s = 0; s < 8; s++) {
      uint8x16_t c0 = vld1q_u8(qs + 32 * (s / 2)), c1 = vld1q_u8(qs + 32 * (s / 2) + 16);
      if (s % 2) {
        c0 = vshrq_n_u8(c0, 4);
        c1 = vshrq_n_u8(c1, 4);
      } else {
        c0 = vandq_u8(c0, vdupq_n_u8(15));
        c1 = vandq_u8(c1, vdupq_n_u8(15));
      }
      if (q5) {  // bit s of qh[e] is bit 4 of element e
        const int8x16_t sh = vdupq_n_s8((int8_t)-s);
        c0 = vorrq_u8(c0, vshlq_n_u8(vandq_u8(vshlq_u8(qh0, sh), vdupq_n_u8(1)), 4));
        c1 = vorrq_u8(c1, vshlq_n_u8(vandq_u8(vshlq_u8(qh1, sh), vdupq_n_u8(1)), 4));
      }
      const int8_t *xq = x[b].qs + 32 * s;
      lane0 = vmlaq_n_s32(lane0, dot16(vreinterpretq_s8_u8(c0), vld1q_s8(xq)), sc[s]);
      lane1 = vmlaq_n_s32(lane1, dot16(vreinterpretq_s8_u8(c1), vld1q_s8(xq + 16)), sc[s]);
    }
    const float32x4_t dv = vdupq_n_f32(d);
    acc0 = vfmaq_f32(acc0, dv, vcvtq_f32_s32(lane0));
    acc1 = vfmaq_f32(acc1, dv, vcvtq_f32_s32(lane1));
  }
  const float h = hsum8v(acc0, acc1);
  if (q5) return h + summs;
  const float s0 = accm[0] + accm[2], s1 = accm[1] + accm[3];  // hsum4
  return h + (s0 + s1);
}

// Q4_K_V256 / V64 (the repack kernels): `step` sub-block pairs per fma
static float dot_q4k_repack(int step, int64_t k, const void *vw, const void *vx) {
  const blk_q4_K *w = vw;
  const blk_q8_K *x = vx;
  float acc = 0, accm = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) qi_scale_min_k4(s, w[b].scales, &sc[s], &mn[s]);
    int32_t isum[8], bs[8];  // sub-block s: sum of its 32 codes times the activations; of the activations
    for (int p = 0; p < 4; p++) {
      const uint8x16_t q0 = vld1q_u8(w[b].qs + 32 * p), q1 = vld1q_u8(w[b].qs + 32 * p + 16);
      const int8_t *xl = x[b].qs + 64 * p, *xh = xl + 32;
      const int32x4_t lo = vaddq_s32(dot16(vreinterpretq_s8_u8(vandq_u8(q0, vdupq_n_u8(15))), vld1q_s8(xl)),
                                     dot16(vreinterpretq_s8_u8(vandq_u8(q1, vdupq_n_u8(15))), vld1q_s8(xl + 16)));
      const int32x4_t hi = vaddq_s32(dot16(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vld1q_s8(xh)),
                                     dot16(vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), vld1q_s8(xh + 16)));
      isum[2 * p] = vaddvq_s32(lo);
      isum[2 * p + 1] = vaddvq_s32(hi);
    }
    for (int s = 0; s < 8; s++) bs[s] = x[b].bsums[2 * s] + x[b].bsums[2 * s + 1];
    qi_q4k_repack_block(step, sc, mn, isum, bs, qi_f16(w[b].d) * x[b].d, qi_f16(w[b].dmin) * x[b].d, &acc, &accm);
  }
  return acc - accm;
}

// Q6_K_K8: vec_dot_q6_K_q8_K. Codes of 32 elements (j, c) at a time in
// element order; lane l of a 32-element dot holds elements 4l..4l+3.
static float dot_q6k(int64_t k, const void *vw, const void *vx) {
  const blk_q6_K *w = vw;
  const blk_q8_K *x = vx;
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
  for (int64_t b = 0; b < k / QK_K; b++) {
    int32x4_t lane0 = vdupq_n_s32(0), lane1 = vdupq_n_s32(0);
    for (int j = 0; j < 2; j++) {
      const uint8x16_t h0 = vld1q_u8(w[b].qh + 32 * j), h1 = vld1q_u8(w[b].qh + 32 * j + 16);
      for (int c = 0; c < 4; c++) {
        const uint8_t *ql = w[b].ql + 64 * j + 32 * (c & 1);
        uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
        if (c >= 2) {
          l0 = vshrq_n_u8(l0, 4);
          l1 = vshrq_n_u8(l1, 4);
        } else {
          l0 = vandq_u8(l0, vdupq_n_u8(15));
          l1 = vandq_u8(l1, vdupq_n_u8(15));
        }
        const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * c));  // right shift by 2c
        const uint8x16_t c0 = vorrq_u8(l0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, sh), vdupq_n_u8(3)), 4));
        const uint8x16_t c1 = vorrq_u8(l1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, sh), vdupq_n_u8(3)), 4));
        const int8_t *xq = x[b].qs + 128 * j + 32 * c;
        const int32x4_t d0 = dot16(vreinterpretq_s8_u8(c0), vld1q_s8(xq));
        const int32x4_t d1 = dot16(vreinterpretq_s8_u8(c1), vld1q_s8(xq + 16));
        lane0 = vmlaq_n_s32(lane0, d0, w[b].scales[8 * j + 2 * c]);
        lane1 = vmlaq_n_s32(lane1, d1, w[b].scales[8 * j + 2 * c + 1]);
      }
    }
    int32_t lanes[8];
    vst1q_s32(lanes, lane0);
    vst1q_s32(lanes + 4, lane1);
    for (int l = 0; l < 8; l++)
      lanes[l] -= 32 * (x[b].bsums[2 * l] * w[b].scales[2 * l] + x[b].bsums[2 * l + 1] * w[b].scales[2 * l + 1]);
    const float32x4_t d = vdupq_n_f32(x[b].d * qi_f16(w[b].d));
    acc0 = vfmaq_f32(acc0, d, vcvtq_f32_s32(vld1q_s32(lanes)));
    acc1 = vfmaq_f32(acc1, d, vcvtq_f32_s32(vld1q_s32(lanes + 4)));
  }
  return hsum8v(acc0, acc1);
}

// ---- float orders ----------------------------------------------------------------------------

static inline float32x4_t ld4(bool f16, const void *p, int64_t i) {
  if (f16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
  return vld1q_f32((const float *)p + i);
}

// F32_T16 / F16_T16: 16 lanes, fma per 16 elements, hsum16 (k % 16 == 0)
static float dot_t16(bool f16, int64_t k, const void *w, const void *x) {
  float32x4_t a[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
  for (int64_t c = 0; c < k; c += 16)
    for (int r = 0; r < 4; r++) a[r] = vfmaq_f32(a[r], ld4(f16, w, c + 4 * r), ld4(f16, x, c + 4 * r));
  return hsum16v(a);
}

// F32_VEC / F16_VEC: 4 x 16 lanes per 64 (s[j], j = 0..3), s0 + s2, s1 + s3,
// then their sum, hsum16; the tail as the reference
static float dot_v(bool f16, int64_t k, const void *w, const void *x) {
  float32x4_t s[4][4];
  for (int j = 0; j < 4; j++)
    for (int r = 0; r < 4; r++) s[j][r] = vdupq_n_f32(0);
  const int64_t np = k & ~(int64_t)63;
  for (int64_t c = 0; c < np; c += 64)
    for (int j = 0; j < 4; j++)
      for (int r = 0; r < 4; r++) {
        const int64_t e = c + 16 * j + 4 * r;
        s[j][r] = vfmaq_f32(s[j][r], ld4(f16, w, e), ld4(f16, x, e));
      }
  float32x4_t t[4];
  for (int r = 0; r < 4; r++) t[r] = vaddq_f32(vaddq_f32(s[0][r], s[2][r]), vaddq_f32(s[1][r], s[3][r]));
  const float head = hsum16v(t);
  if (f16) {  // products rounded to float, summed in double
    const uint16_t *wh = w, *xh = x;
    double sum = (double)head;
    for (int64_t i = np; i < k; i++) {
      const float p = quant_f16_to_f32(wh[i]) * quant_f16_to_f32(xh[i]);
      sum = sum + (double)p;
    }
    return (float)sum;
  }
  // gcc's vectorized tail of `sumf += x[i]*y[i]`: rounded products of the
  // 16- and 8-element pieces added in order, the last < 8 by fma
  const float *wf = w, *xf = x;
  float sum = head;
  const int64_t r = k - np;
  const int64_t vec_end = np + (r & ~(int64_t)15) + ((r & 15) >= 8 ? 8 : 0);
  int64_t i = np;
  for (; i < vec_end; i++) {
    const float p = wf[i] * xf[i];
    sum = sum + p;
  }
  for (; i < k; i++) sum = __builtin_fmaf(wf[i], xf[i], sum);
  return sum;
}

// ---- entry points ------------------------------------------------------------------------------

static void quant_exact_dot_neon(qx_order o, int64_t k, float *s, const void *w, const void *x) {
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

// the one-token vec_dots (quant_neon.h)
QX_VEC_DOTS(neon, quant_exact_dot_neon)

void quant_exact_tile_neon(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  for (int64_t i = i0; i < i1; i++) {  // a weight row stays in cache for every token
    const char *w = (const char *)W + (size_t)i * wstride;
    for (int64_t j = j0; j < j1; j++) quant_exact_dot_neon(o, k, &Y[j * ldy + i], w, (const char *)X + (size_t)j * xstride);
  }
}
