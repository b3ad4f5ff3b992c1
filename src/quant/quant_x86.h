// quant_x86: inline helpers of every x86-64 SIMD level (AVX2 + FMA + F16C
// and up), one definition each for the AVX2 and AVX-512 files. Include only
// from files compiled with at least the AVX2 flags (quant_avx2.h,
// quant_avx512.h include it).
#ifndef MOLE_QUANT_X86_H
#define MOLE_QUANT_X86_H

#include <immintrin.h>
#include <string.h>

#include "quant/quant_internal.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)): llama.cpp's hsum_float_8
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline int hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// one fused multiply-add, rounded once (no compiler contraction question)
static inline float fma1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// Software prefetch of weight rows streamed from DRAM: the loops are long
// enough that the out-of-order window alone keeps too few lines in flight.
#ifndef QI_PF_DIST
#define QI_PF_DIST 4096
#endif
// always_inline: gcc may otherwise judge a function of prefetches pure and drop it
static inline __attribute__((always_inline)) void qi_prefetch(const void *p, size_t bytes) {
  const char *c = (const char *)p + QI_PF_DIST;
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

// 16 nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31)
static inline __m256i nibbles(const uint8_t *p) {
  __m128i q = _mm_loadu_si128((const __m128i *)p);
  const __m128i m4 = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

// The 16 scales + 32 (0..63) of a q3_K block as bytes.
static inline __m128i q3k_scales(const uint8_t *s12) {
  uint32_t a[3];
  memcpy(a, s12, 12);
  const __m128i av = _mm_setr_epi32((int)a[0], (int)a[1], (int)a[0], (int)a[1]);
  const __m128i tv = _mm_set1_epi32((int)a[2]);
  __m128i lo = _mm_and_si128(_mm_srlv_epi32(av, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(15));
  __m128i hi = _mm_and_si128(_mm_srlv_epi32(tv, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}

// What both x86 levels define in their main file (quant_avx2.c,
// quant_avx512.c): f16/bf16 row conversions, the activation quantizers, the
// dots of the weight types without llama.cpp orders.
#define QI_X86_DOT(t, isa) \
  void quant_vec_dot_##t##_##isa(int64_t n, float *restrict s, const void *restrict x, const void *restrict y);
#define QI_X86_KERNELS(isa)                                                               \
  void quant_to_float_f16_##isa(const void *restrict x, float *restrict y, int64_t n);    \
  void quant_from_float_f16_##isa(const float *restrict x, void *restrict y, int64_t n);  \
  void quant_to_float_bf16_##isa(const void *restrict x, float *restrict y, int64_t n);   \
  void quant_from_float_bf16_##isa(const float *restrict x, void *restrict y, int64_t n); \
  void quant_from_float_q8_0_##isa(const float *restrict x, void *restrict y, int64_t n); \
  void quant_from_float_q8_1_##isa(const float *restrict x, void *restrict y, int64_t n); \
  void quant_from_float_q8_K_##isa(const float *restrict x, void *restrict y, int64_t n); \
  QI_X86_DOT(q4_1, isa) QI_X86_DOT(q5_0, isa) QI_X86_DOT(q5_1, isa) QI_X86_DOT(q2_K, isa) QI_X86_DOT(q3_K, isa)

#endif
