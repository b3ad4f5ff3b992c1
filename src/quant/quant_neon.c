// NEON (ARM64) row conversions and activation quantizers, the same bits as
// the scalar references (tests/test_quant.c). The dot products run
// llama.cpp's orders through quant_exact_neon.c.
#include <string.h>

#include "quant/quant_neon.h"

void quant_to_float_f16_neon(const void *restrict x, float *restrict y, int64_t n) {
  const uint16_t *h = x;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h + i));
    vst1q_f32(y + i, vcvt_f32_f16(vget_low_f16(v)));
    vst1q_f32(y + i + 4, vcvt_high_f32_f16(v));
  }
  for (; i < n; i++) y[i] = quant_f16_to_f32(h[i]);
}

void quant_to_float_q8_0_neon(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q8_0 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    const float32x4_t d = vdupq_n_f32(qi_f16(x[b].d));
    for (int c = 0; c < 32; c += 8) {
      const int16x8_t q = vmovl_s8(vld1_s8(x[b].qs + c));
      vst1q_f32(y + c, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)))));
      vst1q_f32(y + c + 4, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(q))));
    }
  }
}

void quant_to_float_q4_0_neon(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q4_0 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    const float32x4_t d = vdupq_n_f32(qi_f16(x[b].d));
    const uint8x16_t q = vld1q_u8(x[b].qs);
    const int8x16_t half[2] = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8)),
                               vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8))};
    for (int hh = 0; hh < 2; hh++) {
      const int16x8_t a = vmovl_s8(vget_low_s8(half[hh])), c = vmovl_high_s8(half[hh]);
      float *o = y + 16 * hh;
      vst1q_f32(o, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(a)))));
      vst1q_f32(o + 4, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(a))));
      vst1q_f32(o + 8, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(c)))));
      vst1q_f32(o + 12, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(c))));
    }
  }
}

// ---- activation quantizers (quant_ref.c's, lane for lane) -----------------------------

// round half to even of four products, narrowed to int8 (|v| <= 127 here)
static inline int8x8_t narrow8(int32x4_t a, int32x4_t b) { return vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))); }

// q8_0: d = amax/127, q = nearest(x * (127/amax))
void quant_from_float_q8_0_neon(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_0 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float32x4_t v[8], m = vdupq_n_f32(0);
    for (int i = 0; i < 8; i++) {
      v[i] = vld1q_f32(x + 4 * i);
      m = vmaxq_f32(m, vabsq_f32(v[i]));
    }
    const float amax = vmaxvq_f32(m);
    const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.0f;
    y[b].d = qi_to_f16(d);
    const float32x4_t iv = vdupq_n_f32(id);
    for (int i = 0; i < 8; i += 2) {
      const int32x4_t q0 = vcvtnq_s32_f32(vmulq_f32(v[i], iv)), q1 = vcvtnq_s32_f32(vmulq_f32(v[i + 1], iv));
      vst1_s8(y[b].qs + 4 * i, narrow8(q0, q1));
    }
  }
}

// q8_K: the signed value of largest magnitude (the first of equal ones)
// sets iscale = -127/mx; q = min(127, nearest(iscale * x)); sums per 16
void quant_from_float_q8_K_neon(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_K *y = vy;
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    float32x4_t m = vdupq_n_f32(0);
    for (int i = 0; i < QK_K; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    const float amax = vmaxvq_f32(m);
    if (amax == 0) {
      memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    float mx = 0;
    for (int i = 0; i < QK_K; i++)
      if (__builtin_fabsf(x[i]) == amax) {
        mx = x[i];
        break;
      }
    const float iscale = -127.f / mx;
    const float32x4_t is = vdupq_n_f32(iscale);
    const int32x4_t top = vdupq_n_s32(127);
    for (int g = 0; g < 16; g++) {
      int32x4_t q[4];
      for (int i = 0; i < 4; i++) q[i] = vminq_s32(top, vcvtnq_s32_f32(vmulq_f32(is, vld1q_f32(x + 16 * g + 4 * i))));
      const int8x16_t v = vcombine_s8(narrow8(q[0], q[1]), narrow8(q[2], q[3]));
      vst1q_s8(y[b].qs + 16 * g, v);
      y[b].bsums[g] = (int16_t)vaddlvq_s8(v);
    }
    y[b].d = 1 / iscale;
  }
}
