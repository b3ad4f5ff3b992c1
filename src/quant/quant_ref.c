// quant_ref: scalar reference kernels of every type (to_float, from_float;
// vec_dot of the types without llama.cpp orders, quant_exact_ref.c has the
// others) and the f16/bf16 conversions. These define the numerics; the SIMD
// kernels are tested against them.
//
// Activation quantizers follow what llama.cpp runs on x86: q8_0/q8_1 scale by
// 127/amax and round half to even (its AVX path), q8_K is its reference
// quantizer (scale -127/max of the signed extreme, bsums per 16).
// Weight quantizers: q4_0..q5_1 are llama.cpp's reference quantizers; the
// K-quants use a simpler (not search-based) but valid scale choice.
#include <math.h>

#include "quant/quant_ref.h"

// ---- f16 / bf16 -------------------------------------------------------------
// Bit-exact with F16C (vcvtps2ph round-to-nearest-even, vcvtph2ps): IEEE
// half precision with subnormals, inf, and NaN quieted.

float quant_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0) {
    float f = (float)m * 0x1p-24f;  // zero or subnormal: exact
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t quant_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffff;
  uint32_t e = ax >> 23;
  if (e == 255) return (uint16_t)(sign | 0x7c00 | (ax & 0x7fffff ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
  if (e >= 143) return (uint16_t)(sign | 0x7c00);  // >= 2^16: overflow
  if (e >= 113) {                                  // normal half
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // carries into exponent / inf
    return (uint16_t)(sign | h);
  }
  if (e < 102) return sign;  // < 2^-25: rounds to zero (ties to even)
  uint32_t mant = (ax & 0x7fffff) | 0x800000;
  uint32_t shift = 126 - e;  // 14..24
  uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t quant_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);  // NaN: keep quiet
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

// ---- helpers -------------------------------------------------------------------

static inline int nearest(float f) { return (int)lrintf(f); }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// ---- float types --------------------------------------------------------------

void quant_to_float_f32_ref(const void *restrict x, float *restrict y, int64_t n) {
  memcpy(y, x, (size_t)n * sizeof(float));
}
void quant_from_float_f32_ref(const float *restrict x, void *restrict y, int64_t n) {
  memcpy(y, x, (size_t)n * sizeof(float));
}

void quant_to_float_f16_ref(const void *restrict x, float *restrict y, int64_t n) {
  const uint16_t *h = x;
  for (int64_t i = 0; i < n; i++) y[i] = quant_f16_to_f32(h[i]);
}
void quant_from_float_f16_ref(const float *restrict x, void *restrict y, int64_t n) {
  uint16_t *h = y;
  for (int64_t i = 0; i < n; i++) h[i] = quant_f32_to_f16(x[i]);
}

void quant_to_float_bf16_ref(const void *restrict x, float *restrict y, int64_t n) {
  const uint16_t *h = x;
  for (int64_t i = 0; i < n; i++) y[i] = quant_bf16_to_f32(h[i]);
}
void quant_from_float_bf16_ref(const float *restrict x, void *restrict y, int64_t n) {
  uint16_t *h = y;
  for (int64_t i = 0; i < n; i++) h[i] = quant_f32_to_bf16(x[i]);
}

// ---- 32-element block types ------------------------------------------------------

static float absmax(const float *x, int n, float *signed_max) {
  float amax = 0, mx = 0;
  for (int j = 0; j < n; j++)
    if (fabsf(x[j]) > amax) {
      amax = fabsf(x[j]);
      mx = x[j];
    }
  if (signed_max) *signed_max = mx;
  return amax;
}

void quant_to_float_q4_0_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q4_0 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d);
    for (int j = 0; j < 16; j++) {
      y[j] = d * ((x[b].qs[j] & 15) - 8);
      y[j + 16] = d * ((x[b].qs[j] >> 4) - 8);
    }
  }
}

void quant_from_float_q4_0_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q4_0 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float mx;
    absmax(x, 32, &mx);
    float d = mx / -8, id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = qi_to_f16(d);
    for (int j = 0; j < 16; j++) {
      int q0 = MOLE_MIN(15, (int8_t)(x[j] * id + 8.5f));
      int q1 = MOLE_MIN(15, (int8_t)(x[j + 16] * id + 8.5f));
      y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

void quant_to_float_q4_1_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q4_1 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d), m = qi_f16(x[b].m);
    for (int j = 0; j < 16; j++) {
      y[j] = d * (x[b].qs[j] & 15) + m;
      y[j + 16] = d * (x[b].qs[j] >> 4) + m;
    }
  }
}

static void minmax(const float *x, int n, float *mn, float *mx) {
  *mn = INFINITY;
  *mx = -INFINITY;
  for (int j = 0; j < n; j++) {
    *mn = fminf(*mn, x[j]);
    *mx = fmaxf(*mx, x[j]);
  }
}

void quant_from_float_q4_1_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q4_1 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    float d = (mx - mn) / 15, id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = qi_to_f16(d);
    y[b].m = qi_to_f16(mn);
    for (int j = 0; j < 16; j++) {
      int q0 = MOLE_MIN(15, (int8_t)((x[j] - mn) * id + 0.5f));
      int q1 = MOLE_MIN(15, (int8_t)((x[j + 16] - mn) * id + 0.5f));
      y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

static inline int q5_at(const uint8_t *qs, uint32_t qh, int j) {
  int lo = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
  return lo | (int)(((qh >> j) & 1) << 4);
}

void quant_to_float_q5_0_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q5_0 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d);
    uint32_t qh;
    memcpy(&qh, x[b].qh, 4);
    for (int j = 0; j < 32; j++) y[j] = d * (q5_at(x[b].qs, qh, j) - 16);
  }
}

void quant_from_float_q5_0_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q5_0 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float mx;
    absmax(x, 32, &mx);
    float d = mx / -16, id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = qi_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
      int q0 = MOLE_MIN(31, (int8_t)(x[j] * id + 16.5f));
      int q1 = MOLE_MIN(31, (int8_t)(x[j + 16] * id + 16.5f));
      y[b].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
      qh |= (uint32_t)((q0 >> 4) & 1) << j;
      qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    memcpy(y[b].qh, &qh, 4);
  }
}

void quant_to_float_q5_1_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q5_1 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d), m = qi_f16(x[b].m);
    uint32_t qh;
    memcpy(&qh, x[b].qh, 4);
    for (int j = 0; j < 32; j++) y[j] = d * q5_at(x[b].qs, qh, j) + m;
  }
}

void quant_from_float_q5_1_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q5_1 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    float d = (mx - mn) / 31, id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = qi_to_f16(d);
    y[b].m = qi_to_f16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
      int q0 = MOLE_MIN(31, (int)((x[j] - mn) * id + 0.5f));
      int q1 = MOLE_MIN(31, (int)((x[j + 16] - mn) * id + 0.5f));
      y[b].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
      qh |= (uint32_t)((q0 >> 4) & 1) << j;
      qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    memcpy(y[b].qh, &qh, 4);
  }
}

void quant_to_float_q8_0_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q8_0 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d);
    for (int j = 0; j < 32; j++) y[j] = d * x[b].qs[j];
  }
}

// q8_0/q8_1 activation quantizer as llama.cpp's x86 path: d = amax/127,
// q = round_half_even(x * (127/amax)). Returns sum(q); *df gets d (f32).
static int quantize_32(const float *x, uint16_t *d16, int8_t *qs, float *df) {
  float amax = absmax(x, 32, NULL);
  float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.0f;
  *d16 = qi_to_f16(d);
  *df = d;
  int sum = 0;
  for (int j = 0; j < 32; j++) {
    qs[j] = (int8_t)nearest(x[j] * id);
    sum += qs[j];
  }
  return sum;
}

void quant_from_float_q8_0_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_0 *y = vy;
  float d;
  for (int64_t b = 0; b < n / 32; b++, x += 32) quantize_32(x, &y[b].d, y[b].qs, &d);
}

void quant_to_float_q8_1_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q8_1 *x = vx;
  for (int64_t b = 0; b < n / 32; b++, y += 32) {
    float d = qi_f16(x[b].d);
    for (int j = 0; j < 32; j++) y[j] = d * x[b].qs[j];
  }
}

void quant_from_float_q8_1_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_1 *y = vy;
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float d;
    int sum = quantize_32(x, &y[b].d, y[b].qs, &d);
    y[b].s = qi_to_f16(d * (float)sum);
  }
}

void quant_vec_dot_q4_1_ref(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q4_1 *x = vx;
  const blk_q8_1 *y = vy;
  float sum = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    int si = 0;
    for (int j = 0; j < 16; j++) si += (x[b].qs[j] & 15) * y[b].qs[j] + (x[b].qs[j] >> 4) * y[b].qs[j + 16];
    sum += (qi_f16(x[b].d) * qi_f16(y[b].d)) * (float)si + qi_f16(x[b].m) * qi_f16(y[b].s);
  }
  *s = sum;
}

void quant_vec_dot_q5_0_ref(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_0 *x = vx;
  const blk_q8_0 *y = vy;
  float sum = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    uint32_t qh;
    memcpy(&qh, x[b].qh, 4);
    int si = 0;
    for (int j = 0; j < 32; j++) si += (q5_at(x[b].qs, qh, j) - 16) * y[b].qs[j];
    sum += (qi_f16(x[b].d) * qi_f16(y[b].d)) * (float)si;
  }
  *s = sum;
}

void quant_vec_dot_q5_1_ref(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_1 *x = vx;
  const blk_q8_1 *y = vy;
  float sum = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    uint32_t qh;
    memcpy(&qh, x[b].qh, 4);
    int si = 0;
    for (int j = 0; j < 32; j++) si += q5_at(x[b].qs, qh, j) * y[b].qs[j];
    sum += (qi_f16(x[b].d) * qi_f16(y[b].d)) * (float)si + qi_f16(x[b].m) * qi_f16(y[b].s);
  }
  *s = sum;
}

// ---- K-quants (256-element super-blocks) -------------------------------------------
// Unpack helpers give each element's integer code and each group's scale/min,
// so that to_float and vec_dot read the layouts in one place.

// q2_K: q[e] in 0..3; group g = e/16
static void unpack_q2_K(const blk_q2_K *b, uint8_t q[256]) {
  for (int e = 0; e < 256; e++) {
    int half = e / 128, j = (e % 128) / 32, l = e % 32;
    q[e] = (b->qs[half * 32 + l] >> (2 * j)) & 3;
  }
}

// q3_K: q[e] in -4..3; sc[g] in -32..31, group g = e/16
static void unpack_q3_K(const blk_q3_K *b, int8_t q[256], int8_t sc[16]) {
  for (int e = 0; e < 256; e++) {
    int half = e / 128, j = (e % 128) / 32, l = e % 32;
    int lo = (b->qs[half * 32 + l] >> (2 * j)) & 3;
    int h = (b->hmask[l] >> (half * 4 + j)) & 1;
    q[e] = (int8_t)(lo - (h ? 0 : 4));
  }
  qi_scales_q3k(b->scales, sc);
}

// q4_K / q5_K: q[e] in 0..15 / 0..31; sc, m per group of 32
static void unpack_q4_K(const blk_q4_K *b, uint8_t q[256], uint8_t sc[8], uint8_t m[8]) {
  for (int e = 0; e < 256; e++) {
    uint8_t v = b->qs[(e / 64) * 32 + e % 32];
    q[e] = (e % 64) < 32 ? (v & 15) : (v >> 4);
  }
  for (int g = 0; g < 8; g++) qi_scale_min_k4(g, b->scales, &sc[g], &m[g]);
}

static void unpack_q5_K(const blk_q5_K *b, uint8_t q[256], uint8_t sc[8], uint8_t m[8]) {
  for (int e = 0; e < 256; e++) {
    uint8_t v = b->qs[(e / 64) * 32 + e % 32];
    int lo = (e % 64) < 32 ? (v & 15) : (v >> 4);
    q[e] = (uint8_t)(lo | (((b->qh[e % 32] >> (e / 32)) & 1) << 4));
  }
  for (int g = 0; g < 8; g++) qi_scale_min_k4(g, b->scales, &sc[g], &m[g]);
}

// q6_K: q[e] in -32..31; group g = e/16 has scales[g]
static void unpack_q6_K(const blk_q6_K *b, int8_t q[256]) {
  for (int e = 0; e < 256; e++) {
    int half = e / 128, j = (e % 128) / 32, l = e % 32;
    uint8_t v = b->ql[half * 64 + (j & 1) * 32 + l];
    int lo = j < 2 ? (v & 15) : (v >> 4);
    int hi = (b->qh[half * 32 + l] >> (2 * j)) & 3;
    q[e] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

void quant_to_float_q2_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q2_K *x = vx;
  uint8_t q[256];
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K) {
    float d = qi_f16(x[b].d), dmin = qi_f16(x[b].dmin);
    unpack_q2_K(&x[b], q);
    for (int e = 0; e < 256; e++) {
      uint8_t s = x[b].scales[e / 16];
      y[e] = d * (s & 15) * q[e] - dmin * (s >> 4);
    }
  }
}

void quant_to_float_q3_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q3_K *x = vx;
  int8_t q[256], sc[16];
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K) {
    float d = qi_f16(x[b].d);
    unpack_q3_K(&x[b], q, sc);
    for (int e = 0; e < 256; e++) y[e] = d * sc[e / 16] * q[e];
  }
}

void quant_to_float_q4_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q4_K *x = vx;
  uint8_t q[256], sc[8], m[8];
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K) {
    float d = qi_f16(x[b].d), dmin = qi_f16(x[b].dmin);
    unpack_q4_K(&x[b], q, sc, m);
    for (int e = 0; e < 256; e++) y[e] = d * sc[e / 32] * q[e] - dmin * m[e / 32];
  }
}

void quant_to_float_q5_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q5_K *x = vx;
  uint8_t q[256], sc[8], m[8];
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K) {
    float d = qi_f16(x[b].d), dmin = qi_f16(x[b].dmin);
    unpack_q5_K(&x[b], q, sc, m);
    for (int e = 0; e < 256; e++) y[e] = d * sc[e / 32] * q[e] - dmin * m[e / 32];
  }
}

void quant_to_float_q6_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q6_K *x = vx;
  int8_t q[256];
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K) {
    float d = qi_f16(x[b].d);
    unpack_q6_K(&x[b], q);
    for (int e = 0; e < 256; e++) y[e] = d * x[b].scales[e / 16] * q[e];
  }
}

void quant_to_float_q8_K_ref(const void *restrict vx, float *restrict y, int64_t n) {
  const blk_q8_K *x = vx;
  for (int64_t b = 0; b < n / QK_K; b++, y += QK_K)
    for (int e = 0; e < 256; e++) y[e] = x[b].d * x[b].qs[e];
}

// Scales and codes of an asymmetric super-block (q2_K, q4_K, q5_K): groups of
// gs elements, codes 0..nmax, group scale/min codes 0..smax. value =
// d*ls*q - dmin*lm. The group scale is rounded up so that no code clips.
static void quant_sb_asym(const float *x, int gs, int nmax, int smax, uint16_t *d16, uint16_t *dmin16, uint8_t *ls,
                          uint8_t *lm, uint8_t q[256]) {
  int ng = 256 / gs;
  float sc[16], mn[16], msc = 0, mmn = 0;
  for (int g = 0; g < ng; g++) {
    float lo, hi;
    minmax(x + g * gs, gs, &lo, &hi);
    lo = fminf(lo, 0.0f);
    sc[g] = (hi - lo) / nmax;
    mn[g] = -lo;
    msc = fmaxf(msc, sc[g]);
    mmn = fmaxf(mmn, mn[g]);
  }
  *d16 = qi_to_f16(msc / smax);
  *dmin16 = qi_to_f16(mmn / smax);
  float df = qi_f16(*d16), dmf = qi_f16(*dmin16);
  for (int g = 0; g < ng; g++) {
    ls[g] = (uint8_t)(df > 0 ? clampi((int)ceilf(sc[g] / df - 1e-3f), 0, smax) : 0);
    lm[g] = (uint8_t)(dmf > 0 ? clampi(nearest(mn[g] / dmf), 0, smax) : 0);
    float dl = df * ls[g], ml = dmf * lm[g];
    for (int e = g * gs; e < (g + 1) * gs; e++) q[e] = (uint8_t)(dl > 0 ? clampi(nearest((x[e] + ml) / dl), 0, nmax) : 0);
  }
}

// Symmetric super-block (q3_K, q6_K): 16 groups of 16, codes -nq..nq-1, group
// scale codes -smax..smax-1; value = d*ls*q.
static void quant_sb_sym(const float *x, int nq, int smax, uint16_t *d16, int ls[16], int8_t q[256]) {
  float sc[16], msc = 0;
  for (int g = 0; g < 16; g++) {
    float mx;
    absmax(x + g * 16, 16, &mx);
    sc[g] = mx / -nq;
    if (fabsf(sc[g]) > fabsf(msc)) msc = sc[g];
  }
  float iscale = msc != 0 ? -smax / msc : 0.0f;
  *d16 = qi_to_f16(iscale != 0 ? 1 / iscale : 0.0f);
  float df = qi_f16(*d16);
  for (int g = 0; g < 16; g++) {
    ls[g] = clampi(nearest(iscale * sc[g]), -smax, smax - 1);
    float dl = df * ls[g];
    for (int e = g * 16; e < g * 16 + 16; e++) q[e] = (int8_t)(dl != 0 ? clampi(nearest(x[e] / dl), -nq, nq - 1) : 0);
  }
}

void quant_from_float_q2_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q2_K *y = vy;
  uint8_t q[256], ls[16], lm[16];
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    quant_sb_asym(x, 16, 3, 15, &y[b].d, &y[b].dmin, ls, lm, q);
    for (int g = 0; g < 16; g++) y[b].scales[g] = (uint8_t)(ls[g] | (lm[g] << 4));
    memset(y[b].qs, 0, 64);
    for (int e = 0; e < 256; e++) y[b].qs[(e / 128) * 32 + e % 32] |= (uint8_t)(q[e] << (2 * ((e % 128) / 32)));
  }
}

void quant_from_float_q3_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q3_K *y = vy;
  int8_t q[256];
  int ls[16];
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    quant_sb_sym(x, 4, 32, &y[b].d, ls, q);
    memset(y[b].scales, 0, 12);
    for (int g = 0; g < 16; g++) {
      int l = ls[g] + 32;
      if (g < 8)
        y[b].scales[g] = (uint8_t)(l & 15);
      else
        y[b].scales[g - 8] |= (uint8_t)((l & 15) << 4);
      y[b].scales[8 + g % 4] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
    }
    memset(y[b].hmask, 0, 32);
    memset(y[b].qs, 0, 64);
    for (int e = 0; e < 256; e++) {
      int u = q[e] + 4;  // 0..7
      if (u > 3) y[b].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
      y[b].qs[(e / 128) * 32 + e % 32] |= (uint8_t)((u & 3) << (2 * ((e % 128) / 32)));
    }
  }
}

static void pack_scales_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t s[12]) {
  memset(s, 0, 12);
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = (uint8_t)((ls[j] & 15) | ((lm[j] & 15) << 4));
      s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
      s[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
  }
}

void quant_from_float_q4_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q4_K *y = vy;
  uint8_t q[256], ls[8], lm[8];
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    quant_sb_asym(x, 32, 15, 63, &y[b].d, &y[b].dmin, ls, lm, q);
    pack_scales_k4(ls, lm, y[b].scales);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) y[b].qs[c * 32 + l] = (uint8_t)(q[c * 64 + l] | (q[c * 64 + 32 + l] << 4));
  }
}

void quant_from_float_q5_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q5_K *y = vy;
  uint8_t q[256], ls[8], lm[8];
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    quant_sb_asym(x, 32, 31, 63, &y[b].d, &y[b].dmin, ls, lm, q);
    pack_scales_k4(ls, lm, y[b].scales);
    memset(y[b].qh, 0, 32);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++)
        y[b].qs[c * 32 + l] = (uint8_t)((q[c * 64 + l] & 15) | ((q[c * 64 + 32 + l] & 15) << 4));
    for (int e = 0; e < 256; e++) y[b].qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
  }
}

void quant_from_float_q6_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q6_K *y = vy;
  int8_t q[256];
  int ls[16];
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    quant_sb_sym(x, 32, 128, &y[b].d, ls, q);
    for (int g = 0; g < 16; g++) y[b].scales[g] = (int8_t)ls[g];
    memset(y[b].ql, 0, 128);
    memset(y[b].qh, 0, 64);
    for (int e = 0; e < 256; e++) {
      int u = q[e] + 32, half = e / 128, j = (e % 128) / 32, l = e % 32;
      y[b].ql[half * 64 + (j & 1) * 32 + l] |= (uint8_t)((u & 15) << (j < 2 ? 0 : 4));
      y[b].qh[half * 32 + l] |= (uint8_t)((u >> 4) << (2 * j));
    }
  }
}

// llama.cpp's q8_K quantizer: scale -127/max of the signed extreme, bsums.
void quant_from_float_q8_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_K *y = vy;
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    float mx;
    float amax = absmax(x, 256, &mx);
    memset(y[b].bsums, 0, sizeof y[b].bsums);
    if (amax == 0) {
      y[b].d = 0;
      memset(y[b].qs, 0, 256);
      continue;
    }
    float iscale = -127.f / mx;
    for (int e = 0; e < 256; e++) {
      y[b].qs[e] = (int8_t)MOLE_MIN(127, nearest(iscale * x[e]));
      y[b].bsums[e / 16] = (int16_t)(y[b].bsums[e / 16] + y[b].qs[e]);
    }
    y[b].d = 1 / iscale;
  }
}

void quant_vec_dot_q2_K_ref(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q2_K *x = vx;
  const blk_q8_K *y = vy;
  uint8_t q[256];
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; b++) {
    unpack_q2_K(&x[b], q);
    int si = 0, sm = 0;
    for (int g = 0; g < 16; g++) {
      int gs = 0;
      for (int e = g * 16; e < g * 16 + 16; e++) gs += q[e] * y[b].qs[e];
      si += (x[b].scales[g] & 15) * gs;
      sm += (x[b].scales[g] >> 4) * y[b].bsums[g];
    }
    sum += (y[b].d * qi_f16(x[b].d)) * (float)si - (y[b].d * qi_f16(x[b].dmin)) * (float)sm;
  }
  *s = sum;
}

void quant_vec_dot_q3_K_ref(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q3_K *x = vx;
  const blk_q8_K *y = vy;
  int8_t q[256], sc[16];
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; b++) {
    unpack_q3_K(&x[b], q, sc);
    int si = 0;
    for (int g = 0; g < 16; g++) {
      int gs = 0;
      for (int e = g * 16; e < g * 16 + 16; e++) gs += q[e] * y[b].qs[e];
      si += sc[g] * gs;
    }
    sum += (y[b].d * qi_f16(x[b].d)) * (float)si;
  }
  *s = sum;
}
