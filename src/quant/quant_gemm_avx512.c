// quant_gemm_avx512: the prefill matmul Y[j][i] = dot(W_i, X_j) with 4-row x
// 4-token register tiles and VNNI, for the integer weight types.
//
// Both operands are repacked (per thread scratch) so that the inner loop is
// only dpbusd + convert + fma:
//  * q4_0 q5_0 q8_0 q4_1 q5_1 (activations q8_0/q8_1): steps of 4 blocks in
//    lane layout (see quant_avx512.c). A weight step holds the unsigned codes
//    (low halves, high halves) and the block scales; an activation step holds
//    the codes, scales and either -offset*sum(y) (the int32 accumulator's
//    start, for the offset types) or the q8_1 sums s (for the min types).
//  * K-quants (activations q8_K, read in place): a weight super-block is
//    unpacked to 256 unsigned codes in element order, a float scale per group
//    of 16 spread over its lane, and a float "min" per group, so that
//    value = scale * code - min (q6_K/q3_K put their offset into the min).
// Weights are packed for 4 rows over a chunk of k that stays in L1 and reused
// by every token; partial sums over k chunks add up in Y.
#include "quant/quant_avx512.h"

enum {
  TR = 4,              // rows per register tile
  TT = 4,              // tokens per register tile
  A_KC = 32,           // 4-block steps per k chunk (4096 elements)
  A_TC = 64,           // tokens per packed activation chunk
  A_XSZ = 256,         // bytes of a packed activation step
  K_KC = 8,            // super-blocks per k chunk
  K_WSZ = 256 + 320,   // codes, 4x16 spread scales, 16 mins
};

// ---- 32-element block types ------------------------------------------------------

typedef struct {
  size_t bsz;    // weight block bytes
  int off;       // code offset (0 for the min types)
  bool min;      // q4_1/q5_1: value = d*q + m
  size_t wsz;    // bytes of a packed weight step
} fam_a;

static bool fam_a_of(quant_type t, fam_a *f) {
  switch (t) {
    case QT_Q4_0: *f = (fam_a){sizeof(blk_q4_0), 8, false, 192}; return true;
    case QT_Q5_0: *f = (fam_a){sizeof(blk_q5_0), 16, false, 192}; return true;
    case QT_Q8_0: *f = (fam_a){sizeof(blk_q8_0), 128, false, 192}; return true;
    case QT_Q4_1: *f = (fam_a){sizeof(blk_q4_1), 0, true, 256}; return true;
    case QT_Q5_1: *f = (fam_a){sizeof(blk_q5_1), 0, true, 256}; return true;
    default: return false;
  }
}

// One weight step (4 whole blocks at p) to dst.
static inline void pack_w_step(quant_type t, const char *p, char *dst) {
  const __m512i m4 = _mm512_set1_epi8(15), k16 = _mm512_set1_epi8(16);
  __m512i lo, hi;
  __m512 d, m = _mm512_setzero_ps();
  switch (t) {
    case QT_Q8_0: {
      const blk_q8_0 *x = (const blk_q8_0 *)p;
      load4x256(x->qs, sizeof *x, &lo, &hi);
      const __m512i k80 = _mm512_set1_epi8((char)0x80);
      lo = _mm512_xor_si512(lo, k80);
      hi = _mm512_xor_si512(hi, k80);
      d = f16x4(&x->d, sizeof *x);
      break;
    }
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: {
      size_t bs = t == QT_Q4_0 ? sizeof(blk_q4_0) : t == QT_Q4_1 ? sizeof(blk_q4_1)
                : t == QT_Q5_0 ? sizeof(blk_q5_0) : sizeof(blk_q5_1);
      size_t qoff = t == QT_Q4_0 ? 2 : t == QT_Q4_1 ? 4 : t == QT_Q5_0 ? 6 : 8;
      __m512i q = load4x128(p + qoff, bs);
      lo = _mm512_and_si512(q, m4);
      hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      if (t == QT_Q5_0 || t == QT_Q5_1) {
        __mmask64 mlo, mhi;
        q5_masks((const uint8_t *)p + qoff - 4, bs, &mlo, &mhi);
        lo = _mm512_mask_add_epi8(lo, mlo, lo, k16);
        hi = _mm512_mask_add_epi8(hi, mhi, hi, k16);
      }
      d = f16x4(p, (int)bs);
      if (t == QT_Q4_1 || t == QT_Q5_1) m = _mm512_maskz_mov_ps(0x1111, f16x4(p + 2, (int)bs));
      break;
    }
    default: MOLE_ASSERT(0 && "pack_w_step: type");
  }
  _mm512_storeu_si512(dst, lo);
  _mm512_storeu_si512(dst + 64, hi);
  _mm512_storeu_ps(dst + 128, d);
  if (t == QT_Q4_1 || t == QT_Q5_1) _mm512_storeu_ps(dst + 192, m);
}

// Steps [s0, s0+ns) of one weight row; a last partial step is padded with
// zero blocks (scale 0).
static void pack_w_row(quant_type t, const fam_a *f, const char *row, int64_t nb, int64_t s0, int64_t ns, char *dst) {
  for (int64_t s = s0; s < s0 + ns; s++, dst += f->wsz) {
    int64_t b = 4 * s;
    if (b + 4 <= nb) {
      pack_w_step(t, row + b * f->bsz, dst);
    } else {
      char tmp[4 * 36];
      memset(tmp, 0, sizeof tmp);
      memcpy(tmp, row + b * f->bsz, (size_t)(nb - b) * f->bsz);
      pack_w_step(t, tmp, dst);
    }
  }
}

static inline void pack_x_step(bool q81, int off, const char *p, char *dst) {
  size_t bs = q81 ? sizeof(blk_q8_1) : sizeof(blk_q8_0);
  __m512i ya, yb;
  load4x256(p + (q81 ? 4 : 2), bs, &ya, &yb);
  _mm512_storeu_si512(dst, ya);
  _mm512_storeu_si512(dst + 64, yb);
  _mm512_storeu_ps(dst + 128, f16x4(p, (int)bs));
  if (q81) {
    _mm512_storeu_ps(dst + 192, f16x4(p + 2, (int)bs));
  } else {
    __m512i k = _mm512_set1_epi8((char)off);
    _mm512_storeu_si512(dst + 192, _mm512_sub_epi32(_mm512_setzero_si512(), dot2(k, ya, k, yb)));
  }
}

static void pack_x_row(bool q81, int off, const char *row, int64_t nb, int64_t s0, int64_t ns, char *dst) {
  size_t bs = q81 ? sizeof(blk_q8_1) : sizeof(blk_q8_0);
  for (int64_t s = s0; s < s0 + ns; s++, dst += A_XSZ) {
    int64_t b = 4 * s;
    if (b + 4 <= nb) {
      pack_x_step(q81, off, row + b * bs, dst);
    } else {
      char tmp[4 * 36];
      memset(tmp, 0, sizeof tmp);
      memcpy(tmp, row + b * bs, (size_t)(nb - b) * bs);
      pack_x_step(q81, off, tmp, dst);
    }
  }
}

static inline void store_tile(__m512 acc[TT][TR], float *Y, int64_t ldy, int64_t i, int64_t j, int nr, int nt,
                              bool add) {
  for (int t = 0; t < nt; t++)
    for (int r = 0; r < nr; r++) {
      float v = _mm512_reduce_add_ps(acc[t][r]);
      float *o = &Y[(j + t) * ldy + i + r];
      *o = add ? *o + v : v;
    }
}

// 4x4 tile over ns packed steps. wp: 4 rows, row stride ns*wsz; xp: 4 tokens,
// token stride xts.
static inline __attribute__((always_inline)) void kern_a(const char *wp, size_t wsz, const char *xp, size_t xts,
                                                         int64_t ns, bool min, __m512 acc[TT][TR]) {
  for (int t = 0; t < TT; t++)
    for (int r = 0; r < TR; r++) acc[t][r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; s++) {
    const char *ws = wp + s * wsz, *xs = xp + s * A_XSZ;
    for (int r = 0; r < TR; r++) {
      const char *w = ws + r * ns * wsz;
      __m512i a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(w + 64);
      __m512 d = _mm512_loadu_ps((const float *)(w + 128));
      for (int t = 0; t < TT; t++) {
        const char *x = xs + t * xts;
        __m512i i = min ? _mm512_setzero_si512() : _mm512_loadu_si512(x + 192);
        i = _mm512_dpbusd_epi32(i, a, _mm512_loadu_si512(x));
        i = _mm512_dpbusd_epi32(i, b, _mm512_loadu_si512(x + 64));
        __m512 dd = _mm512_mul_ps(d, _mm512_loadu_ps((const float *)(x + 128)));
        acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dd, acc[t][r]);
        if (min)
          acc[t][r] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)(w + 192)),
                                      _mm512_loadu_ps((const float *)(x + 192)), acc[t][r]);
      }
    }
  }
}

static void __attribute__((noinline)) kern_a_off(const char *wp, const char *xp, size_t xts, int64_t ns,
                                                 __m512 acc[TT][TR]) {
  kern_a(wp, 192, xp, xts, ns, false, acc);
}
static void __attribute__((noinline)) kern_a_min(const char *wp, const char *xp, size_t xts, int64_t ns,
                                                 __m512 acc[TT][TR]) {
  kern_a(wp, 256, xp, xts, ns, true, acc);
}

static void gemm_a(quant_type wt, const fam_a *f, const char *W, size_t wstride, const char *X, size_t xstride,
                   float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const int64_t nb = k / 32, nsteps = (nb + 3) / 4;
  const bool q81 = f->min;
  const int64_t tc_max = MOLE_MIN(n_tok, (int64_t)A_TC), kc_max = MOLE_MIN(nsteps, (int64_t)A_KC);
  const int64_t tcp = (tc_max + TT - 1) / TT * TT;
  char *xp = quant_scratch((size_t)(tcp * kc_max * A_XSZ + TR * kc_max * f->wsz));
  char *wp = xp + tcp * kc_max * A_XSZ;
  for (int64_t j0 = 0; j0 < n_tok; j0 += A_TC) {
    const int64_t nt = MOLE_MIN((int64_t)A_TC, n_tok - j0);
    for (int64_t s0 = 0; s0 < nsteps; s0 += A_KC) {
      const int64_t ns = MOLE_MIN((int64_t)A_KC, nsteps - s0);
      const size_t xts = (size_t)ns * A_XSZ;
      for (int64_t j = 0; j < nt; j++) pack_x_row(q81, f->off, X + (j0 + j) * xstride, nb, s0, ns, xp + j * xts);
      for (int64_t j = nt; j < (nt + TT - 1) / TT * TT; j++) memcpy(xp + j * xts, xp + (nt - 1) * xts, xts);
      for (int64_t i = i0; i < i1; i += TR) {
        const int nr = (int)MOLE_MIN((int64_t)TR, i1 - i);
        for (int r = 0; r < TR; r++)  // short tiles repeat their last row
          pack_w_row(wt, f, W + (i + MOLE_MIN(r, nr - 1)) * wstride, nb, s0, ns, wp + r * ns * f->wsz);
        for (int64_t j = 0; j < nt; j += TT) {
          __m512 acc[TT][TR];
          if (f->min)
            kern_a_min(wp, xp + j * xts, xts, ns, acc);
          else
            kern_a_off(wp, xp + j * xts, xts, ns, acc);
          store_tile(acc, Y, ldy, i, j0 + j, nr, (int)MOLE_MIN((int64_t)TT, nt - j), s0 > 0);
        }
      }
    }
  }
}

// ---- K-quants ------------------------------------------------------------------------
// Packed super-block: codes[256] | sc[4][16] (lane L of vector v: scale of
// group 4v+L) | mn[16] (float per group).

static inline void put_k(char *dst, __m512i q0, __m512i q1, __m512i q2, __m512i q3, const float sc[16],
                         const float mn[16]) {
  _mm512_storeu_si512(dst, q0);
  _mm512_storeu_si512(dst + 64, q1);
  _mm512_storeu_si512(dst + 128, q2);
  _mm512_storeu_si512(dst + 192, q3);
  __m512 s = _mm512_loadu_ps(sc);
  for (int v = 0; v < 4; v++) {
    const __m512i idx = _mm512_set_epi32(4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 2, 4 * v + 2, 4 * v + 2,
                                         4 * v + 2, 4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v, 4 * v, 4 * v,
                                         4 * v);
    _mm512_storeu_ps(dst + 256 + 64 * v, _mm512_permutexvar_ps(idx, s));
  }
  _mm512_storeu_ps(dst + 512, _mm512_loadu_ps(mn));
}

static inline __m512i cat256(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

static void pack_k_q4(const blk_q4_K *x, char *dst) {
  uint64_t sc8, mn8;
  k4_scales(x->scales, &sc8, &mn8);
  float d = f16(x->d), dm = f16(x->dmin), sc[16], mn[16];
  for (int g = 0; g < 16; g++) {
    sc[g] = d * (float)((sc8 >> (8 * (g / 2))) & 0xff);
    mn[g] = dm * (float)((mn8 >> (8 * (g / 2))) & 0xff);
  }
  const __m256i m4 = _mm256_set1_epi8(15);
  __m512i q[4];
  for (int v = 0; v < 4; v++) {
    __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * v));
    q[v] = cat256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_srli_epi16(b, 4), m4));
  }
  put_k(dst, q[0], q[1], q[2], q[3], sc, mn);
}

static void pack_k_q5(const blk_q5_K *x, char *dst) {
  uint64_t sc8, mn8;
  k4_scales(x->scales, &sc8, &mn8);
  float d = f16(x->d), dm = f16(x->dmin), sc[16], mn[16];
  for (int g = 0; g < 16; g++) {
    sc[g] = d * (float)((sc8 >> (8 * (g / 2))) & 0xff);
    mn[g] = dm * (float)((mn8 >> (8 * (g / 2))) & 0xff);
  }
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m512i k16 = _mm512_set1_epi8(16);
  __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->qh));
  __m512i q[4];
  for (int v = 0; v < 4; v++) {
    __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * v));
    q[v] = cat256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_srli_epi16(b, 4), m4));
    __mmask64 h = _mm512_test_epi8_mask(qh, bytes2((uint8_t)(1 << (2 * v)), (uint8_t)(2 << (2 * v))));
    q[v] = _mm512_mask_add_epi8(q[v], h, q[v], k16);
  }
  put_k(dst, q[0], q[1], q[2], q[3], sc, mn);
}

static void pack_k_q6(const blk_q6_K *x, char *dst) {
  float d = f16(x->d), sc[16], mn[16];
  for (int g = 0; g < 16; g++) {
    sc[g] = d * x->scales[g];
    mn[g] = 32 * sc[g];
  }
  const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
  const __m512i sh_a = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i sh_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  __m512i q[4];
  for (int h = 0; h < 2; h++) {
    __m512i ql = _mm512_loadu_si512(x->ql + 64 * h);
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
    q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_a), m30));
    q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                   _mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), m30));
  }
  put_k(dst, q[0], q[1], q[2], q[3], sc, mn);
}

// q2_K/q3_K codes of vector v (elements 64v..64v+63): half h = v/2, shifts j0, j0+1
static inline __m512i k2_codes(const uint8_t *qs, int v) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (v / 2)));
  int j0 = 2 * (v % 2);
  return cat256(_mm256_and_si256(_mm256_srli_epi16(b, 2 * j0), m3),
                _mm256_and_si256(_mm256_srli_epi16(b, 2 * j0 + 2), m3));
}

static void pack_k_q2(const blk_q2_K *x, char *dst) {
  float d = f16(x->d), dm = f16(x->dmin), sc[16], mn[16];
  for (int g = 0; g < 16; g++) {
    sc[g] = d * (x->scales[g] & 15);
    mn[g] = dm * (x->scales[g] >> 4);
  }
  put_k(dst, k2_codes(x->qs, 0), k2_codes(x->qs, 1), k2_codes(x->qs, 2), k2_codes(x->qs, 3), sc, mn);
}

static void pack_k_q3(const blk_q3_K *x, char *dst) {
  int8_t s8[16];
  qi_scales_q3k(x->scales, s8);
  float d = f16(x->d), sc[16], mn[16];
  for (int g = 0; g < 16; g++) {
    sc[g] = d * s8[g];
    mn[g] = 4 * sc[g];
  }
  const __m512i k4 = _mm512_set1_epi8(4);
  __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->hmask)), q[4];
  for (int v = 0; v < 4; v++) {
    int h = v / 2, j0 = 2 * (v % 2);
    q[v] = k2_codes(x->qs, v);
    __mmask64 m = _mm512_test_epi8_mask(hm, bytes2((uint8_t)(1 << (4 * h + j0)), (uint8_t)(1 << (4 * h + j0 + 1))));
    q[v] = _mm512_mask_add_epi8(q[v], m, q[v], k4);
  }
  put_k(dst, q[0], q[1], q[2], q[3], sc, mn);
}

static void pack_k_row(quant_type t, const char *row, int64_t sb0, int64_t nsb, char *dst) {
  for (int64_t b = sb0; b < sb0 + nsb; b++, dst += K_WSZ) {
    switch (t) {
      case QT_Q4_K: pack_k_q4((const blk_q4_K *)row + b, dst); break;
      case QT_Q5_K: pack_k_q5((const blk_q5_K *)row + b, dst); break;
      case QT_Q6_K: pack_k_q6((const blk_q6_K *)row + b, dst); break;
      case QT_Q2_K: pack_k_q2((const blk_q2_K *)row + b, dst); break;
      case QT_Q3_K: pack_k_q3((const blk_q3_K *)row + b, dst); break;
      default: MOLE_ASSERT(0 && "pack_k_row: type");
    }
  }
}

// 4x4 tile over nsb super-blocks; y[t]: the tokens' q8_K blocks of this chunk.
static void __attribute__((noinline)) kern_k(const char *wp, const blk_q8_K *const y[TT], int64_t nsb,
                                             __m512 acc[TT][TR]) {
  for (int t = 0; t < TT; t++)
    for (int r = 0; r < TR; r++) acc[t][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nsb; b++) {
    __m512 bs[TT], dy[TT];
    for (int t = 0; t < TT; t++) {
      bs[t] = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y[t][b].bsums)));
      dy[t] = _mm512_set1_ps(y[t][b].d);
    }
    for (int r = 0; r < TR; r++) {
      const char *w = wp + (r * nsb + b) * K_WSZ;
      __m512i q0 = _mm512_loadu_si512(w), q1 = _mm512_loadu_si512(w + 64);
      __m512i q2 = _mm512_loadu_si512(w + 128), q3 = _mm512_loadu_si512(w + 192);
      const float *sc = (const float *)(w + 256);
      for (int t = 0; t < TT; t++) {
        const int8_t *yq = y[t][b].qs;
        const __m512i z = _mm512_setzero_si512();
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, q0, _mm512_loadu_si512(yq))),
                                 _mm512_loadu_ps(sc));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, q1, _mm512_loadu_si512(yq + 64))),
                            _mm512_loadu_ps(sc + 16), f);
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, q2, _mm512_loadu_si512(yq + 128))),
                            _mm512_loadu_ps(sc + 32), f);
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, q3, _mm512_loadu_si512(yq + 192))),
                            _mm512_loadu_ps(sc + 48), f);
        f = _mm512_fnmadd_ps(_mm512_loadu_ps(sc + 64), bs[t], f);
        acc[t][r] = _mm512_fmadd_ps(f, dy[t], acc[t][r]);
      }
    }
  }
}

static void gemm_k(quant_type wt, const char *W, size_t wstride, const char *X, size_t xstride, float *Y,
                   int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const int64_t nsb = k / QK_K, kc_max = MOLE_MIN(nsb, (int64_t)K_KC);
  char *wp = quant_scratch((size_t)(TR * kc_max * K_WSZ));
  for (int64_t b0 = 0; b0 < nsb; b0 += K_KC) {
    const int64_t nb = MOLE_MIN((int64_t)K_KC, nsb - b0);
    for (int64_t i = i0; i < i1; i += TR) {
      const int nr = (int)MOLE_MIN((int64_t)TR, i1 - i);
      for (int r = 0; r < TR; r++)
        pack_k_row(wt, W + (i + MOLE_MIN(r, nr - 1)) * wstride, b0, nb, wp + r * nb * K_WSZ);
      for (int64_t j = 0; j < n_tok; j += TT) {
        const int nt = (int)MOLE_MIN((int64_t)TT, n_tok - j);
        const blk_q8_K *y[TT];
        for (int t = 0; t < TT; t++) y[t] = (const blk_q8_K *)(X + (j + MOLE_MIN(t, nt - 1)) * xstride) + b0;
        __m512 acc[TT][TR];
        kern_k(wp, y, nb, acc);
        store_tile(acc, Y, ldy, i, j, nr, nt, b0 > 0);
      }
    }
  }
}

bool quant_gemm_avx512(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                       int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  if (n_tok < 2) return false;  // decode: vec_dot streams the rows once
  fam_a f;
  if (fam_a_of(wt, &f)) {
    gemm_a(wt, &f, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return true;
  }
  switch (wt) {
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_Q2_K: case QT_Q3_K:
      gemm_k(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
      return true;
    default: return false;
  }
}
