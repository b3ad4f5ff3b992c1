// quant_avx512.h: inline helpers shared by the AVX-512 files (include only
// from *_avx512.c: they need the AVX-512 BW/VL/VNNI compile flags).
#ifndef MOLE_QUANT_AVX512_H
#define MOLE_QUANT_AVX512_H

#include <immintrin.h>

#include "quant/quant_internal.h"

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

// full unroll of the small constant loops of register tiles (gcc and clang)
#define QI_UNROLL _Pragma("GCC unroll 8")

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// 4 x 16 bytes at p, p + stride, ... as the 4 lanes of a register.
static inline __m512i load4x128(const void *p, size_t stride) {
  const char *c = p;
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)c));
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + stride)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 2 * stride)), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 3 * stride)), 3);
}

// Four 32-byte rows at p, p + stride, ...: first halves in *a, second in *b
// (lane layout).
static inline void load4x256(const void *p, size_t stride, __m512i *a, __m512i *b) {
  const char *c = p;
  __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)c)),
                                   _mm256_loadu_si256((const __m256i *)(c + stride)), 1);
  __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(c + 2 * stride))),
                                   _mm256_loadu_si256((const __m256i *)(c + 3 * stride)), 1);
  *a = _mm512_shuffle_i64x2(z01, z23, 0x88);
  *b = _mm512_shuffle_i64x2(z01, z23, 0xDD);
}

// The f16 at p + i*stride (i = 0..3) as floats in lanes 4i..4i+3. Reads only
// [p, p + 3*stride + 2). stride: even, <= 42.
static inline __m512 f16x4(const void *p, int stride) {
  int nw = (3 * stride + 2) / 2, s = stride / 2;
  __m512i lo = nw >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << nw) - 1), p);
  __m512i hi = nw > 32 ? _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << (nw - 32)) - 1), (const char *)p + 64)
                       : _mm512_setzero_si512();
  const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3 * s, 3 * s, 3 * s, 3 * s,
                                       2 * s, 2 * s, 2 * s, 2 * s, s, s, s, s, 0, 0, 0, 0);
  __m512i h = nw > 32 ? _mm512_permutex2var_epi16(lo, idx, hi) : _mm512_permutexvar_epi16(idx, lo);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
}

static inline __m512i dot2(__m512i a, __m512i ya, __m512i b, __m512i yb) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), a, ya), b, yb);
}

// High bits of four q5 blocks as byte masks for the low and high halves.
static inline void q5_masks(const uint8_t *qh0, size_t stride, __mmask64 *mlo, __mmask64 *mhi) {
  uint64_t lo = 0, hi = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t h;
    memcpy(&h, qh0 + i * stride, 4);
    lo |= (uint64_t)(h & 0xffff) << (16 * i);
    hi |= (uint64_t)(h >> 16) << (16 * i);
  }
  *mlo = _cvtu64_mask64(lo);
  *mhi = _cvtu64_mask64(hi);
}

// bytes 0..31 = a, bytes 32..63 = b
static inline __m512i bytes2(uint8_t a, uint8_t b) {
  return _mm512_inserti64x4(_mm512_set1_epi8((char)a), _mm256_set1_epi8((char)b), 1);
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
#endif
