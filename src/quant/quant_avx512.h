// quant_avx512: the AVX-512 (F/BW/VL/DQ + VNNI + BF16) level: inline helpers
// of its files and the kernels one of them defines for another (its table,
// quant_table_avx512.c). Include only from *_avx512.c files (they are
// compiled with the AVX-512 flags).
#ifndef MOLE_QUANT_AVX512_H
#define MOLE_QUANT_AVX512_H

#include "quant/quant_ref.h"
#include "quant/quant_tq.h"
#include "quant/quant_x86.h"

// full unroll of the small constant loops of register tiles (gcc and clang)
#define QI_UNROLL _Pragma("GCC unroll 8")

// the first r (< 16) lanes
static inline __mmask16 tail16(int64_t r) { return _cvtu32_mask16((1u << r) - 1); }

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


// quant_avx512.c (quant_x86.h)
QI_X86_KERNELS(avx512)

// quant_gemm_avx512.c: the tiled matmul of those types (quant_table.h's gemm)
bool quant_gemm_avx512(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                       int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

// quant_exact_avx512.c: llama.cpp's orders (the one-token vec_dots, the tiles,
// R16 groups)
QX_VEC_DOTS_DECL(avx512)
void quant_exact_tile_avx512(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                             int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
void quant_exact_tile_r16_avx512(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X,
                                 size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                                 int64_t k);

// quant_tq_avx512.c
void quant_tq1_gemm_avx512(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
void quant_tq2_gemm_avx512(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

#endif
