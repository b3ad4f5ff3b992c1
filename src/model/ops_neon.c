// NEON twins of the element-wise ops (ARM64; scalar references in ops.c):
// every lane computes what the reference computes, in the same order, so the
// results are the same bits (tests/test_ops.c).
#include <arm_neon.h>
#include <math.h>

#include "model/ops.h"

// ops_expf_poly_ref on 4 lanes: the same fused steps. The scaling by 2^n is
// one rounding of the exact product, as ldexpf's; |n| > 126 (2^n not a
// normal float) takes the reference per lane.
static inline float32x4_t expf_poly(float32x4_t x) {
  const float32x4_t shift = vdupq_n_f32(0x1.8p23f);
  const float32x4_t z = vfmaq_f32(shift, x, vdupq_n_f32(0x1.715476p+0f));
  const float32x4_t n = vsubq_f32(z, shift);
  const float32x4_t b = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
  const float32x4_t u = vmulq_f32(b, b);
  const float32x4_t lo = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b);
  const float32x4_t hi = vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b);
  const float32x4_t p =
      vfmaq_f32(vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b), vfmaq_f32(lo, hi, u), u);
  if (vmaxvq_f32(vabsq_f32(n)) > 126.0f) {
    float xs[4], r[4];
    vst1q_f32(xs, x);
    for (int i = 0; i < 4; i++) r[i] = ops_expf_poly_ref(xs[i]);
    return vld1q_f32(r);
  }
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

void ops_swiglu_neon(float *y, const float *g, const float *u, int64_t n) {
  const int64_t nb = n & ~(int64_t)15;  // the reference's blocks of 16
  for (int64_t i = 0; i < nb; i += 4) {
    const float32x4_t x = vld1q_f32(g + i);
    const float32x4_t e = expf_poly(vsubq_f32(vdupq_n_f32(0.0f), x));
    const float32x4_t s = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), e));
    vst1q_f32(y + i, vmulq_f32(s, vld1q_f32(u + i)));
  }
  for (int64_t i = nb; i < n; i++) y[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

void ops_axpy_neon(float *restrict o, const float *restrict v, float w, int64_t n) {
  const float32x4_t wv = vdupq_n_f32(w);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(o + i, vaddq_f32(vld1q_f32(o + i), vmulq_f32(wv, vld1q_f32(v + i))));
  for (; i < n; i++) {
    const float p = w * v[i];
    o[i] += p;
  }
}

void ops_pv_neon(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d) {
  int64_t c = 0;
  for (; c + 16 <= d; c += 16) {  // 4 registers of o at a time, each i's product added in turn
    float32x4_t a0 = vld1q_f32(o + c), a1 = vld1q_f32(o + c + 4), a2 = vld1q_f32(o + c + 8),
                a3 = vld1q_f32(o + c + 12);
    for (int64_t i = 0; i < n; i++) {
      const float32x4_t pi = vdupq_n_f32(p[i]);
      const float *v = V + i * d + c;
      a0 = vaddq_f32(a0, vmulq_f32(pi, vld1q_f32(v)));
      a1 = vaddq_f32(a1, vmulq_f32(pi, vld1q_f32(v + 4)));
      a2 = vaddq_f32(a2, vmulq_f32(pi, vld1q_f32(v + 8)));
      a3 = vaddq_f32(a3, vmulq_f32(pi, vld1q_f32(v + 12)));
    }
    vst1q_f32(o + c, a0);
    vst1q_f32(o + c + 4, a1);
    vst1q_f32(o + c + 8, a2);
    vst1q_f32(o + c + 12, a3);
  }
  for (; c < d; c++)
    for (int64_t i = 0; i < n; i++) {
      const float pr = p[i] * V[i * d + c];
      o[c] += pr;
    }
}
