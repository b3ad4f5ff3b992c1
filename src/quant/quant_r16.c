// quant_r16: the R16 weight layout (quant.h) and its scalar reference.
//
// A group of 16 rows is stored block by block: for block b, the b-th blocks
// of the 16 rows ("group block", 16 x type_size bytes) rearranged so that a
// 64-byte register load holds one 4-byte piece of each row (lane L = row L)
// and the 16 scales are one 32-byte load. Decode then streams one contiguous
// region per thread with no gathers or transposes, which is what runs at DRAM
// speed on both Intel and AMD. Per type (offsets within a group block):
//   q4_0 (288 B):  d[16] f16 at 2L | qs bytes 4c..4c+3 of row L at 32 + 64c + 4L (c 0..3)
//   q8_0 (544 B):  d[16] f16 at 2L | the 32 codes of row L, each + 128 (unsigned), at 32 + 32L
//   q4_K (2304 B): d[16] at 2L | dmin[16] at 32 + 2L | scales bytes 4u..4u+3 at 64 + 64u + 4L (u 0..2)
//                  | qs bytes 32q+4t..32q+4t+3 at 256 + 512q + 64t + 4L (q 0..3, t 0..7)
// Rows past the last full group keep the GGUF row layout, at the offsets they
// have there (a group takes exactly the bytes of its 16 rows).
#include <string.h>

#include "quant/quant_exact.h"
#include "quant/quant_internal.h"

bool quant_r16_supported(quant_type t, int64_t n_rows) {
  switch (t) {
    case QT_Q8_0: return n_rows >= 16;
    // the repack orders of llama.cpp (one lane per row) exist only for ne1 % 8 == 0
    case QT_Q4_0: case QT_Q4_K: return n_rows >= 16 && n_rows % 8 == 0;
    default: return false;
  }
}

// Offset within a group block of byte o of row L's block, and whether the
// byte is stored with its sign bit flipped (q8_0 codes).
static size_t r16_pos(quant_type t, int L, size_t o, bool *flip) {
  *flip = false;
  switch (t) {
    case QT_Q4_0:
      if (o < 2) return 2 * (size_t)L + o;
      o -= 2;
      return 32 + 64 * (o / 4) + 4 * (size_t)L + o % 4;
    case QT_Q8_0:
      if (o < 2) return 2 * (size_t)L + o;
      *flip = true;
      return 32 + 32 * (size_t)L + (o - 2);
    case QT_Q4_K:
      if (o < 2) return 2 * (size_t)L + o;
      if (o < 4) return 32 + 2 * (size_t)L + (o - 2);
      if (o < 16) return 64 + 64 * ((o - 4) / 4) + 4 * (size_t)L + (o - 4) % 4;
      o -= 16;
      return 256 + 512 * (o / 32) + 64 * ((o % 32) / 4) + 4 * (size_t)L + o % 4;
    default: MOLE_ASSERT(!"r16_pos: type without an R16 layout");
  }
}

void quant_r16_pack(quant_type t, const void *src, void *dst, int64_t k, int64_t n_rows, int64_t g0, int64_t g1) {
  const size_t ts = quant_type_size(t), rb = quant_row_size(t, k);
  const int64_t nb = k / quant_blck_size(t), ng = n_rows / 16;
  MOLE_ASSERT(quant_r16_supported(t, n_rows) && g0 >= 0 && g0 <= g1 && g1 <= ng);
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t *rows = (const uint8_t *)src + (size_t)g * 16 * rb;
    uint8_t *out = (uint8_t *)dst + (size_t)g * 16 * rb;
    for (int64_t b = 0; b < nb; b++) {
      uint8_t *gb = out + (size_t)b * 16 * ts;
      for (int L = 0; L < 16; L++) {
        const uint8_t *blk = rows + (size_t)L * rb + (size_t)b * ts;
        for (size_t o = 0; o < ts; o++) {
          bool flip;
          const size_t at = r16_pos(t, L, o, &flip);
          gb[at] = flip ? (uint8_t)(blk[o] ^ 0x80) : blk[o];
        }
      }
    }
  }
  if (g1 == ng) {  // the tail rows, as they are
    const size_t tail = (size_t)(n_rows - 16 * ng) * rb;
    memcpy((uint8_t *)dst + (size_t)ng * 16 * rb, (const uint8_t *)src + (size_t)ng * 16 * rb, tail);
  }
}

void quant_r16_row(quant_type t, const void *W, int64_t k, int64_t n_rows, int64_t row, void *dst) {
  const size_t ts = quant_type_size(t), rb = quant_row_size(t, k);
  const int64_t nb = k / quant_blck_size(t), ng = n_rows / 16;
  MOLE_ASSERT(row >= 0 && row < n_rows);
  if (row >= 16 * ng) {
    memcpy(dst, (const uint8_t *)W + (size_t)row * rb, rb);
    return;
  }
  const uint8_t *grp = (const uint8_t *)W + (size_t)(row / 16) * 16 * rb;
  const int L = (int)(row % 16);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *gb = grp + (size_t)b * 16 * ts;
    uint8_t *blk = (uint8_t *)dst + (size_t)b * ts;
    for (size_t o = 0; o < ts; o++) {
      bool flip;
      const size_t at = r16_pos(t, L, o, &flip);
      blk[o] = flip ? (uint8_t)(gb[at] ^ 0x80) : gb[at];
    }
  }
}

void quant_r16_rows(quant_type t, const void *W, int64_t k, int64_t n_rows, int64_t r0, int64_t r1, void *dst) {
  const size_t rb = quant_row_size(t, k);
  for (int64_t r = r0; r < r1; r++) quant_r16_row(t, W, k, n_rows, r, (uint8_t *)dst + (size_t)(r - r0) * rb);
}

// The reference: the rows back in GGUF layout, then the order's scalar dot.
void quant_exact_tile_r16_ref(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                              float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const size_t rb = quant_row_size(t, k);
  uint8_t *row = quant_scratch_slot(1, rb);
  for (int64_t i = i0; i < i1; i++) {
    quant_r16_row(t, W, k, n_rows, i, row);
    for (int64_t j = j0; j < j1; j++) quant_exact_dot_ref(o, k, &Y[j * ldy + i], row, (const char *)X + (size_t)j * xstride);
  }
}
