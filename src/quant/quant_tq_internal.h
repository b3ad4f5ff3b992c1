// quant_tq internals shared by quant_tq.c and its SIMD twins: the one output
// formula of every TQ kernel (the same float operations everywhere, so every
// ISA gives the reference's bits), little-endian reads, and the helpers of
// quant_tq.c the kernels call.
#ifndef MOLE_QUANT_TQ_INTERNAL_H
#define MOLE_QUANT_TQ_INTERNAL_H

#include <string.h>

#include "quant/quant_tq.h"

static inline float tq_out(float s, float dx, int64_t acc) { return s * (dx * (float)acc); }

static inline uint32_t rd_u32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint16_t rd_u16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

// The index of the first code of row r (walks the row's group from gidx).
uint64_t tq1_row_start(const tq_book *b, const uint8_t *w, int64_t n_rows, int64_t k, int64_t r);
// The activation rows as int16 (tq_quantize_x) in the kernel scratch with
// `extra` bytes after them: rows ld apart, their scales in *dx, the extra at *ext.
int16_t *tq_prepare_x(const float *X, size_t xstride, int64_t n_tok, int64_t k, size_t extra, int64_t *ld, float **dx,
                      void **ext);

#endif
