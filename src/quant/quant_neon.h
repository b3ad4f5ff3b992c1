// quant_neon: the NEON level (ARMv8.2 dotprod) of ARM64: the kernels one of
// its files defines for another (its table, quant_table_neon.c). Include only
// from *_neon.c files (they are compiled with the NEON flags).
#ifndef MOLE_QUANT_NEON_H
#define MOLE_QUANT_NEON_H

#include <arm_neon.h>

#include "quant/quant_ref.h"

// quant_neon.c: row conversions and activation quantizers
void quant_to_float_f16_neon(const void *restrict x, float *restrict y, int64_t n);
void quant_to_float_q8_0_neon(const void *restrict x, float *restrict y, int64_t n);
void quant_to_float_q4_0_neon(const void *restrict x, float *restrict y, int64_t n);
void quant_from_float_q8_0_neon(const float *restrict x, void *restrict y, int64_t n);
void quant_from_float_q8_K_neon(const float *restrict x, void *restrict y, int64_t n);

// quant_exact_neon.c: llama.cpp's orders (the one-token vec_dots, the tiles)
QX_VEC_DOTS_DECL(neon)
void quant_exact_tile_neon(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

#endif
