// quant_avx2: the AVX2 (+ FMA, F16C) level, for x86-64 CPUs without
// AVX-512 VNNI: inline helpers of its files and the kernels one of them
// defines for another (its table, quant_table_avx2.c). Include only from
// *_avx2.c files (they are compiled with the AVX2 flags).
#ifndef MOLE_QUANT_AVX2_H
#define MOLE_QUANT_AVX2_H

#include "quant/quant_ref.h"
#include "quant/quant_tq.h"
#include "quant/quant_x86.h"

// unsigned u8 x signed s8, 32 pairs -> 8 int32 lanes (lane l: bytes 4l..4l+3)
static inline __m256i dot_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// signed x signed (|x| <= 128, |y| <= 127): |x| against sign(y, x)
static inline __m256i dot_ss(__m256i x, __m256i y) { return dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

// quant_avx2.c (quant_x86.h)
QI_X86_KERNELS(avx2)

// quant_exact_avx2.c: llama.cpp's orders (the one-token vec_dots, the tiles;
// R16 groups of q4_0 and q4_K)
QX_VEC_DOTS_DECL(avx2)
void quant_exact_tile_avx2(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
void quant_exact_tile_r16_avx2(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                               float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// quant_tq_avx2.c
void quant_tq1_gemm_avx2(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                         int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

#endif
