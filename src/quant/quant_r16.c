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
//   q5_K (2816 B): d, dmin, scales as q4_K | then for l 0..7, in the order the kernel reads them, at
//                  256 + 320l: qh bytes 4l..4l+3 at + 4L (the fifth bits of elements 4l..4l+3 of all 8
//                  sub-blocks), qs bytes 32j+4l..32j+4l+3 at + 64 + 64j + 4L (j 0..3)
//   q6_K (3360 B): d[16] at 2L | scales bytes 4u..4u+3 at 32 + 64u + 4L (u 0..3) | the 6-bit codes
//                  unpacked to bytes, 4 at a time: for g = 8(l/4) + 4j + l%4 (j 0..1, l 0..7: the
//                  order the kernel reads them) three registers
//                  A, B, C at 288 + 192g + 64w + 4L + t (w 0..2, t 0..3) with the codes of elements
//                  128j + 32w + 4l + t in their low 6 bits and, 2 bits in each, the code of
//                  element 128j + 96 + 4l + t in their top bits (A bits 0-1, B 2-3, C 4-5): each
//                  register is one dpbusd operand after an and, the fourth after three shifts
// Rows past the last full group keep the GGUF row layout, at the offsets they
// have there (a group takes exactly the bytes of its 16 rows).
#include <string.h>

#include "quant/quant_table.h"

bool quant_r16_supported(quant_type t, int64_t n_rows) {
  const quant_r16_need r = (unsigned)t < QT_COUNT ? quant_table_ref[t].r16 : QR16_NONE;
  return r != QR16_NONE && n_rows >= 16 && (r != QR16_ROWS8 || n_rows % 8 == 0);
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
    case QT_Q5_K:  // d, dmin, scales as q4_K; qh[32] then qs[128] in the block
      if (o < 16) return r16_pos(QT_Q4_K, L, o, flip);
      if (o < 48) return 256 + 320 * ((o - 16) / 4) + 4 * (size_t)L + (o - 16) % 4;
      o -= 48;
      return 256 + 320 * ((o % 32) / 4) + 64 + 64 * (o / 32) + 4 * (size_t)L + o % 4;
    default: MOLE_ASSERT(!"r16_pos: type without an R16 layout");
  }
}

// q6_K: the code (0..63) of element E of a block, and setting it
static int q6k_get(const blk_q6_K *b, int E) {
  const int j = E / 128, c = (E % 128) / 32, e = E % 32;
  const uint8_t l = b->ql[64 * j + e + 32 * (c & 1)];
  return (c >= 2 ? l >> 4 : l & 15) | ((b->qh[32 * j + e] >> (2 * c)) & 3) << 4;
}
static void q6k_set(blk_q6_K *b, int E, int code) {
  const int j = E / 128, c = (E % 128) / 32, e = E % 32;
  uint8_t *l = &b->ql[64 * j + e + 32 * (c & 1)], *h = &b->qh[32 * j + e];
  *l = c >= 2 ? (uint8_t)((*l & 0x0f) | (code & 15) << 4) : (uint8_t)((*l & 0xf0) | (code & 15));
  *h = (uint8_t)((*h & ~(3 << (2 * c))) | ((code >> 4) & 3) << (2 * c));
}

// q6_K group block <-> row L's block
static void q6k_to_r16(const blk_q6_K *b, int L, uint8_t *gb) {
  memcpy(gb + 2 * L, &b->d, 2);
  for (int u = 0; u < 4; u++) memcpy(gb + 32 + 64 * u + 4 * L, b->scales + 4 * u, 4);
  uint8_t code[QK_K];
  for (int E = 0; E < QK_K; E++) code[E] = (uint8_t)q6k_get(b, E);
  for (int g = 0; g < 16; g++) {
    const int l = 4 * (g / 8) + g % 4, j = (g / 4) % 2;
    for (int t = 0; t < 4; t++) {
      const int e0 = 128 * j + 4 * l + t, c3 = code[e0 + 96];
      for (int w = 0; w < 3; w++)
        gb[288 + 192 * g + 64 * w + 4 * L + t] = (uint8_t)(code[e0 + 32 * w] | ((c3 >> (2 * w)) & 3) << 6);
    }
  }
}
static void q6k_from_r16(const uint8_t *gb, int L, blk_q6_K *b) {
  memcpy(&b->d, gb + 2 * L, 2);
  for (int u = 0; u < 4; u++) memcpy(b->scales + 4 * u, gb + 32 + 64 * u + 4 * L, 4);
  for (int g = 0; g < 16; g++) {
    const int l = 4 * (g / 8) + g % 4, j = (g / 4) % 2;
    for (int t = 0; t < 4; t++) {
      const int e0 = 128 * j + 4 * l + t;
      int c3 = 0;
      for (int w = 0; w < 3; w++) {
        const uint8_t v = gb[288 + 192 * g + 64 * w + 4 * L + t];
        q6k_set(b, e0 + 32 * w, v & 63);
        c3 |= (v >> 6) << (2 * w);
      }
      q6k_set(b, e0 + 96, c3);
    }
  }
}

// One group block from block b of 16 rows: the same permutation as r16_pos
// in the 2- and 4-byte pieces it moves (load-time speed), q6_K through its
// codes.
static void pack_gb(quant_type t, const uint8_t *const blk[16], uint8_t *gb) {
  for (int L = 0; L < 16; L++) {
    const uint8_t *b = blk[L];
    memcpy(gb + 2 * L, b, 2);
    switch (t) {
      case QT_Q4_0:
        for (int c = 0; c < 4; c++) memcpy(gb + 32 + 64 * c + 4 * L, b + 2 + 4 * c, 4);
        break;
      case QT_Q8_0:
        for (int w = 0; w < 4; w++) {
          uint64_t v;
          memcpy(&v, b + 2 + 8 * w, 8);
          v ^= 0x8080808080808080ull;
          memcpy(gb + 32 + 32 * L + 8 * w, &v, 8);
        }
        break;
      case QT_Q4_K:
        memcpy(gb + 32 + 2 * L, b + 2, 2);
        for (int u = 0; u < 3; u++) memcpy(gb + 64 + 64 * u + 4 * L, b + 4 + 4 * u, 4);
        for (int q = 0; q < 4; q++)
          for (int w = 0; w < 8; w++) memcpy(gb + 256 + 512 * q + 64 * w + 4 * L, b + 16 + 32 * q + 4 * w, 4);
        break;
      case QT_Q5_K:
        memcpy(gb + 32 + 2 * L, b + 2, 2);
        for (int u = 0; u < 3; u++) memcpy(gb + 64 + 64 * u + 4 * L, b + 4 + 4 * u, 4);
        for (int l = 0; l < 8; l++) {
          memcpy(gb + 256 + 320 * l + 4 * L, b + 16 + 4 * l, 4);
          for (int j = 0; j < 4; j++) memcpy(gb + 256 + 320 * l + 64 + 64 * j + 4 * L, b + 48 + 32 * j + 4 * l, 4);
        }
        break;
      case QT_Q6_K: q6k_to_r16((const blk_q6_K *)b, L, gb); break;
      default: MOLE_ASSERT(!"pack_gb: type without an R16 layout");
    }
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
      const uint8_t *blk[16];
      for (int L = 0; L < 16; L++) blk[L] = rows + (size_t)L * rb + (size_t)b * ts;
      pack_gb(t, blk, out + (size_t)b * 16 * ts);
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
    if (t == QT_Q6_K) {
      q6k_from_r16(gb, L, (blk_q6_K *)blk);
      continue;
    }
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
  uint8_t *row = quant_scratch_hold(rb);
  for (int64_t i = i0; i < i1; i++) {
    quant_r16_row(t, W, k, n_rows, i, row);
    for (int64_t j = j0; j < j1; j++) quant_exact_dot_ref(o, k, &Y[j * ldy + i], row, (const char *)X + (size_t)j * xstride);
  }
  quant_scratch_hold(0);
}
