// quant internals: block layouts (byte-compatible with ggml/GGUF), small
// scalar helpers and the kernel scratch, shared by every ISA level's files
// (nothing here dispatches).
//
// Value of element j of a block, per type (d, m, dmin as f16 unless noted):
//   q4_0: d * (q - 8), q = qs[j%16] >> 4*(j/16) & 15
//   q4_1: d * q + m
//   q5_0: d * (q - 16), q = q4 | bit j of qh << 4
//   q5_1: d * q + m
//   q8_0: d * qs[j];  q8_1: same, s = d * sum(qs) (f16)
//   q2_K: d * (sc & 15) * q - dmin * (sc >> 4), 16 groups of 16, q 2 bits
//   q3_K: d * (sc - 32) * (q - 4 * !hbit), 16 groups of 16, 6-bit sc packed
//   q4_K: d * sc * q - dmin * m, 8 groups of 32, 6-bit sc/m packed in 12 bytes
//   q5_K: as q4_K with a 5th bit in qh
//   q6_K: d * sc * (q - 32), 16 groups of 16, int8 sc
//   q8_K: d (f32) * qs[j], bsums[g] = sum of qs in group g of 16
#ifndef MOLE_QUANT_INTERNAL_H
#define MOLE_QUANT_INTERNAL_H

#include <string.h>

#include "quant/quant.h"

#define QK4_0 32
#define QK8_0 32
#define QK_K 256

typedef struct {
  uint16_t d;
  uint8_t qs[16];
} blk_q4_0;
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 block");

typedef struct {
  uint16_t d, m;
  uint8_t qs[16];
} blk_q4_1;
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1 block");

typedef struct {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
} blk_q5_0;
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0 block");

typedef struct {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
} blk_q5_1;
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1 block");

typedef struct {
  uint16_t d;
  int8_t qs[32];
} blk_q8_0;
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 block");

typedef struct {
  uint16_t d, s;
  int8_t qs[32];
} blk_q8_1;
_Static_assert(sizeof(blk_q8_1) == 36, "q8_1 block");

typedef struct {
  uint8_t scales[16];  // low nibble scale, high nibble min
  uint8_t qs[64];
  uint16_t d, dmin;
} blk_q2_K;
_Static_assert(sizeof(blk_q2_K) == 84, "q2_K block");

typedef struct {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
} blk_q3_K;
_Static_assert(sizeof(blk_q3_K) == 110, "q3_K block");

typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
} blk_q4_K;
_Static_assert(sizeof(blk_q4_K) == 144, "q4_K block");

typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
} blk_q5_K;
_Static_assert(sizeof(blk_q5_K) == 176, "q5_K block");

typedef struct {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
} blk_q6_K;
_Static_assert(sizeof(blk_q6_K) == 210, "q6_K block");

typedef struct {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
} blk_q8_K;
_Static_assert(sizeof(blk_q8_K) == 292, "q8_K block");

// ---- scalar helpers -------------------------------------------------------

static inline float qi_f16(uint16_t h) { return quant_f16_to_f32(h); }
static inline uint16_t qi_to_f16(float f) { return quant_f32_to_f16(f); }

// 6-bit scale and min of group j (0..7) of a q4_K/q5_K block.
static inline void qi_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 16 signed 6-bit scales (-32..31) of a q3_K block.
static inline void qi_scales_q3k(const uint8_t *s12, int8_t out[16]) {
  for (int j = 0; j < 16; j++) {
    int lo = j < 8 ? (s12[j] & 0xF) : (s12[j - 8] >> 4);
    int hi = (s12[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

// 8 scales and 8 mins of a q4_K/q5_K block as bytes of two words.
static inline void qi_k4_scales(const uint8_t *p, uint64_t *sc, uint64_t *mn) {
  uint32_t u[3];
  memcpy(u, p, 12);
  uint32_t s_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
  uint32_t s_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  *sc = s_lo | (uint64_t)s_hi << 32;
  *mn = m_lo | (uint64_t)m_hi << 32;
}

// One q4_K block in llama.cpp's repack order (quant_exact.h: Q4_K_V256 with
// step 4, V64 with step 1), shared by the scalar reference and its twins:
// for each run of `step` sub-block pairs, acc += (sum sc*isum) * ds and
// accm += (sum mn*bsum) * dm, fused. isum[s]: the sub-block's integer dot,
// bs[s]: the sum of its activations. The caller's result is acc - accm.
static inline void qi_q4k_repack_block(int step, const uint8_t sc[8], const uint8_t mn[8], const int32_t isum[8],
                                       const int32_t bs[8], float ds, float dm, float *acc, float *accm) {
  for (int p0 = 0; p0 < 4; p0 += step) {
    int32_t is = 0, im = 0;
    for (int s = 2 * p0; s < 2 * (p0 + step); s++) {
      is += sc[s] * isum[s];
      im += mn[s] * bs[s];
    }
    *acc = __builtin_fmaf((float)is, ds, *acc);
    *accm = __builtin_fmaf((float)im, dm, *accm);
  }
}

// ---- kernel scratch ------------------------------------------------------------
// This thread's kernel scratch (mole_scratch, base/pool.h), reserved ahead
// at quant_scratch_bytes: a request beyond it is a broken invariant.
// quant_scratch(n): n bytes, 64-byte aligned, valid until the next call on
// this thread. A layout conversion around a kernel (an R16 group back in
// rows) holds n bytes with quant_scratch_hold(n), below what quant_scratch
// hands out, until quant_scratch_hold(0).
void *quant_scratch(size_t n);
void *quant_scratch_hold(size_t n);

#endif
