// quant_gemm_avx512: the matmul Y[j][i] = dot(W_i, X_j) of the weight types
// without llama.cpp orders (the others run quant_exact_avx512.c's tiles),
// with 4-row x 4-token register tiles of VNNI dot products.
//
// Both operands are repacked (kernel scratch) so that the inner loop is
// only dpbusd + convert + fma:
//  * q5_0 q4_1 q5_1 (activations q8_0/q8_1): steps of 4 blocks in lane
//    layout (see quant_avx512.c). A weight step holds the unsigned codes
//    (low halves, high halves) and the block scales; an activation step holds
//    the codes, scales and either -offset*sum(y) (the int32 accumulator's
//    start, for q5_0) or the q8_1 sums s (for the min types).
//  * q2_K, q3_K (activations q8_K, read in place): a weight super-block is
//    unpacked to 256 unsigned codes in element order, a float scale per group
//    of 16 spread over its lane, and a float "min" per group, so that
//    value = scale * code - min (q3_K puts its offset into the min).
// Weights are packed for 4 rows over a chunk of k that stays in L1 and reused
// by every token; partial sums over k chunks add up in Y.
// One token (decode) of the 32-element types takes a GEMV path: the
// activation row is packed once and each weight row streams through
// registers. q2_K and q3_K with one token return false (vec_dot loops).
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
    case QT_Q5_0: *f = (fam_a){sizeof(blk_q5_0), 16, false, 192}; return true;
    case QT_Q4_1: *f = (fam_a){sizeof(blk_q4_1), 0, true, 256}; return true;
    case QT_Q5_1: *f = (fam_a){sizeof(blk_q5_1), 0, true, 256}; return true;
    default: return false;
  }
}

// One weight step (4 whole blocks at p): codes (low halves, high halves),
// scales, and for the min types the mins in lanes 4i.
static inline __attribute__((always_inline)) void load_w_step(quant_type t, const char *p, __m512i *lo, __m512i *hi,
                                                              __m512 *d, __m512 *m) {
  const __m512i m4 = _mm512_set1_epi8(15), k16 = _mm512_set1_epi8(16);
  *m = _mm512_setzero_ps();
  switch (t) {
    case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: {
      size_t bs = t == QT_Q4_1 ? sizeof(blk_q4_1) : t == QT_Q5_0 ? sizeof(blk_q5_0) : sizeof(blk_q5_1);
      size_t qoff = t == QT_Q4_1 ? 4 : t == QT_Q5_0 ? 6 : 8;
      __m512i q = load4x128(p + qoff, bs);
      *lo = _mm512_and_si512(q, m4);
      *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      if (t == QT_Q5_0 || t == QT_Q5_1) {
        __mmask64 mlo, mhi;
        q5_masks((const uint8_t *)p + qoff - 4, bs, &mlo, &mhi);
        *lo = _mm512_mask_add_epi8(*lo, mlo, *lo, k16);
        *hi = _mm512_mask_add_epi8(*hi, mhi, *hi, k16);
      }
      *d = f16x4(p, (int)bs);
      if (t == QT_Q4_1 || t == QT_Q5_1) *m = _mm512_maskz_mov_ps(0x1111, f16x4(p + 2, (int)bs));
      break;
    }
    default: MOLE_ASSERT(0 && "load_w_step: type");
  }
}

static inline void pack_w_step(quant_type t, const char *p, char *dst) {
  __m512i lo, hi;
  __m512 d, m;
  load_w_step(t, p, &lo, &hi, &d, &m);
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
  __m512 a[TT][TR];
  QI_UNROLL for (int t = 0; t < TT; t++) QI_UNROLL for (int r = 0; r < TR; r++) a[t][r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; s++) {
    const char *ws = wp + s * wsz, *xs = xp + s * A_XSZ;
    QI_UNROLL for (int r = 0; r < TR; r++) {
      const char *w = ws + r * ns * wsz;
      __m512i lo = _mm512_loadu_si512(w), hi = _mm512_loadu_si512(w + 64);
      __m512 d = _mm512_loadu_ps((const float *)(w + 128));
      QI_UNROLL for (int t = 0; t < TT; t++) {
        const char *x = xs + t * xts;
        __m512i i = min ? _mm512_setzero_si512() : _mm512_loadu_si512(x + 192);
        i = _mm512_dpbusd_epi32(i, lo, _mm512_loadu_si512(x));
        i = _mm512_dpbusd_epi32(i, hi, _mm512_loadu_si512(x + 64));
        __m512 dd = _mm512_mul_ps(d, _mm512_loadu_ps((const float *)(x + 128)));
        a[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dd, a[t][r]);
        if (min)
          a[t][r] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)(w + 192)), _mm512_loadu_ps((const float *)(x + 192)),
                                    a[t][r]);
      }
    }
  }
  QI_UNROLL for (int t = 0; t < TT; t++) QI_UNROLL for (int r = 0; r < TR; r++) acc[t][r] = a[t][r];
}

static void __attribute__((noinline)) kern_a_off(const char *wp, const char *xp, size_t xts, int64_t ns,
                                                 __m512 acc[TT][TR]) {
  kern_a(wp, 192, xp, xts, ns, false, acc);
}
static void __attribute__((noinline)) kern_a_min(const char *wp, const char *xp, size_t xts, int64_t ns,
                                                 __m512 acc[TT][TR]) {
  kern_a(wp, 256, xp, xts, ns, true, acc);
}

// One token (decode): the activation row is packed once, each weight row is
// read once and unpacked in registers.
static inline __attribute__((always_inline)) void gemv_a_rows(quant_type wt, const fam_a *f, const char *W,
                                                              size_t wstride, const char *xp, float *Y, int64_t i0,
                                                              int64_t i1, int64_t nb) {
  const int64_t nfull = nb / 4, nsteps = (nb + 3) / 4;
  for (int64_t i = i0; i < i1; i++) {
    const char *row = W + i * wstride;
    __m512 acc = _mm512_setzero_ps(), accm = acc;
    for (int64_t s = 0; s < nsteps; s++) {
      const char *x = xp + s * A_XSZ, *p = row + 4 * s * f->bsz;
      qi_prefetch(p, 4 * f->bsz);
      char tmp[4 * 36];
      if (s == nfull) {  // partial last step: zero blocks
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, p, (size_t)(nb - 4 * s) * f->bsz);
        p = tmp;
      }
      __m512i lo, hi;
      __m512 d, m;
      load_w_step(wt, p, &lo, &hi, &d, &m);
      __m512i si = f->min ? _mm512_setzero_si512() : _mm512_loadu_si512(x + 192);
      si = _mm512_dpbusd_epi32(si, lo, _mm512_loadu_si512(x));
      si = _mm512_dpbusd_epi32(si, hi, _mm512_loadu_si512(x + 64));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(d, _mm512_loadu_ps((const float *)(x + 128))), acc);
      if (f->min) accm = _mm512_fmadd_ps(m, _mm512_loadu_ps((const float *)(x + 192)), accm);
    }
    Y[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc, accm));
  }
}

static void gemv_a(quant_type wt, const fam_a *f, const char *W, size_t wstride, const char *X, float *Y, int64_t i0,
                   int64_t i1, int64_t k) {
  const int64_t nb = k / 32, nsteps = (nb + 3) / 4;
  char *xp = quant_scratch((size_t)nsteps * A_XSZ);
  pack_x_row(f->min, f->off, X, nb, 0, nsteps, xp);
  switch (wt) {  // one instantiation per type: the step decoder is inlined
    case QT_Q5_0: gemv_a_rows(QT_Q5_0, f, W, wstride, xp, Y, i0, i1, nb); break;
    case QT_Q4_1: gemv_a_rows(QT_Q4_1, f, W, wstride, xp, Y, i0, i1, nb); break;
    default: gemv_a_rows(QT_Q5_1, f, W, wstride, xp, Y, i0, i1, nb); break;
  }
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

static inline void put_k(char *dst, __m512i q0, __m512i q1, __m512i q2, __m512i q3, __m512 sc, __m512 mn) {
  static const int32_t idx[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                     {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                     {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                     {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};
  _mm512_storeu_si512(dst, q0);
  _mm512_storeu_si512(dst + 64, q1);
  _mm512_storeu_si512(dst + 128, q2);
  _mm512_storeu_si512(dst + 192, q3);
  QI_UNROLL for (int v = 0; v < 4; v++)
    _mm512_storeu_ps(dst + 256 + 64 * v, _mm512_permutexvar_ps(_mm512_loadu_si512(idx[v]), sc));
  _mm512_storeu_ps(dst + 512, mn);
}

static inline __m512i cat256(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

// q2_K/q3_K codes of vector v (elements 64v..64v+63): half h = v/2, shifts j0, j0+1
static inline __m512i k2_codes(const uint8_t *qs, int v) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (v / 2)));
  int j0 = 2 * (v % 2);
  return cat256(_mm256_and_si256(_mm256_srli_epi16(b, 2 * j0), m3),
                _mm256_and_si256(_mm256_srli_epi16(b, 2 * j0 + 2), m3));
}

static void pack_k_q2(const blk_q2_K *x, char *dst) {
  __m128i b = _mm_loadu_si128((const __m128i *)x->scales);
  const __m128i m4 = _mm_set1_epi8(15);
  __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m4))), _mm512_set1_ps(f16(x->d)));
  __m512 mn = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m4))),
                            _mm512_set1_ps(f16(x->dmin)));
  put_k(dst, k2_codes(x->qs, 0), k2_codes(x->qs, 1), k2_codes(x->qs, 2), k2_codes(x->qs, 3), sc, mn);
}

static void pack_k_q3(const blk_q3_K *x, char *dst) {
  __m512i s = _mm512_sub_epi32(_mm512_cvtepu8_epi32(q3k_scales(x->scales)), _mm512_set1_epi32(32));
  __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(f16(x->d)));
  const __m512i k4 = _mm512_set1_epi8(4);
  const __m512i hb[4] = {bytes2(0x01, 0x02), bytes2(0x04, 0x08), bytes2(0x10, 0x20), bytes2(0x40, 0x80)};
  __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->hmask)), q[4];
  QI_UNROLL for (int v = 0; v < 4; v++) {
    q[v] = k2_codes(x->qs, v);
    q[v] = _mm512_mask_add_epi8(q[v], _mm512_test_epi8_mask(hm, hb[v]), q[v], k4);
  }
  put_k(dst, q[0], q[1], q[2], q[3], sc, _mm512_mul_ps(sc, _mm512_set1_ps(4)));
}

static void pack_k_row(quant_type t, const char *row, int64_t sb0, int64_t nsb, char *dst) {
  for (int64_t b = sb0; b < sb0 + nsb; b++, dst += K_WSZ) {
    switch (t) {
      case QT_Q2_K: pack_k_q2((const blk_q2_K *)row + b, dst); break;
      case QT_Q3_K: pack_k_q3((const blk_q3_K *)row + b, dst); break;
      default: MOLE_ASSERT(0 && "pack_k_row: type");
    }
  }
}

// 4x4 tile over nsb super-blocks; y[t]: the tokens' q8_K blocks of this chunk.
static void __attribute__((noinline)) kern_k(const char *wp, const blk_q8_K *const y[TT], int64_t nsb,
                                             __m512 acc[TT][TR]) {
  __m512 a[TT][TR];
  QI_UNROLL for (int t = 0; t < TT; t++) QI_UNROLL for (int r = 0; r < TR; r++) a[t][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nsb; b++) {
    __m512 bs[TT];
    QI_UNROLL for (int t = 0; t < TT; t++)
      bs[t] = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y[t][b].bsums)));
    QI_UNROLL for (int r = 0; r < TR; r++) {
      const char *w = wp + (r * nsb + b) * K_WSZ;
      __m512i q0 = _mm512_loadu_si512(w), q1 = _mm512_loadu_si512(w + 64);
      __m512i q2 = _mm512_loadu_si512(w + 128), q3 = _mm512_loadu_si512(w + 192);
      const float *sc = (const float *)(w + 256);
      QI_UNROLL for (int t = 0; t < TT; t++) {
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
        a[t][r] = _mm512_fmadd_ps(f, _mm512_set1_ps(y[t][b].d), a[t][r]);
      }
    }
  }
  QI_UNROLL for (int t = 0; t < TT; t++) QI_UNROLL for (int r = 0; r < TR; r++) acc[t][r] = a[t][r];
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
  fam_a f;
  if (fam_a_of(wt, &f)) {
    if (n_tok == 1)
      gemv_a(wt, &f, W, wstride, X, Y, i0, i1, k);
    else
      gemm_a(wt, &f, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return true;
  }
  if (n_tok < 2 || (wt != QT_Q2_K && wt != QT_Q3_K)) return false;  // decode: vec_dot streams each row once
  gemm_k(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
  return true;
}
