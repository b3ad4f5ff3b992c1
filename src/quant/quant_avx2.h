// Helpers shared by the AVX2 files (quant_avx2.c, quant_exact_avx2.c);
// include only from files compiled with the AVX2 flags.
#ifndef MOLE_QUANT_AVX2_H
#define MOLE_QUANT_AVX2_H

#include <immintrin.h>
#include <stdint.h>

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

// unsigned u8 x signed s8, 32 pairs -> 8 int32 lanes (lane l: bytes 4l..4l+3)
static inline __m256i dot_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// signed x signed (|x| <= 128, |y| <= 127): |x| against sign(y, x)
static inline __m256i dot_ss(__m256i x, __m256i y) { return dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

// 16 nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31)
static inline __m256i nibbles(const uint8_t *p) {
  __m128i q = _mm_loadu_si128((const __m128i *)p);
  const __m128i m4 = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

#endif
