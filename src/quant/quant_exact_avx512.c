// quant_exact_avx512: llama.cpp's summation orders (quant_exact.h) with
// AVX-512 VNNI/BF16, bit-identical to the scalar twins in quant_exact_ref.c.
//
// Integer dot products are exact whatever the instruction mix, so only the
// float steps must follow llama.cpp: which partial sums are converted to
// float, which fma / mul / add chain combines them, and the horizontal sums.
//
// Tiles:
//  * q4_0 (one fma per block) and q4_K (repack orders): 16 rows at a time,
//    one row per lane (from GGUF rows transposed in registers, or an R16
//    group as it is: see the panels below), so a block's integer dot lands
//    whole in one lane and one fma serves 16 outputs; up to 4 tokens keep
//    their accumulators in registers, more run against each block's codes
//    with accumulators in scratch;
//  * q8_0 (8 partial lanes per output): 8 rows as 4 pairs, a register holds
//    the 8 lanes of two rows for one token; up to 4 tokens straight from the
//    rows (or the R16 group), more against a panel packed once per call;
//  * q5_K, q6_K, q4_K without repack: 4 rows interleaved per token;
//    float vec_dot orders one output at a time; tinyBLAS orders 4 rows x 4
//    tokens of accumulators, as tinyBLAS itself.
#include <stddef.h>

#include "quant/quant_avx512.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

// gcc's _mm512_reduce_add_ps, written out (clang's builtin may pair differently)
static inline float hs16(__m512 a) {
  return hsum8(_mm256_add_ps(_mm512_extractf32x8_ps(a, 1), _mm512_castps512_ps256(a)));
}
static inline float hs4(__m128 a) {
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// Rows streamed block by block in parallel are too many streams for the
// hardware prefetcher: each row prefetches its own bytes QX_PF ahead, once per
// line (the lines that start inside [lo, hi) of the row).
#ifndef QX_PF
#define QX_PF 8192
#endif
static inline __attribute__((always_inline)) void prefetch_rows(const uint8_t *const *p, int nr, size_t lo, size_t hi) {
  for (size_t o = (lo + 63) & ~(size_t)63; o < hi; o += 64)
    for (int r = 0; r < nr; r++) _mm_prefetch((const char *)p[r] + o + QX_PF, _MM_HINT_T0);
}

// ---- per-output kernels: the one-token orders (vec_dot) and the tiles'
// ---- single rows (the tiles below take the other orders whole) ---------------------

// q8_0: 8 lanes of d * (bytes 4l..4l+3), fma per block
static float dot_l8(int64_t k, const void *vw, const void *vx) {
  const blk_q8_0 *x = vx, *w = vw;
  __m256 acc = _mm256_setzero_ps();
  const __m256i z = _mm256_setzero_si256(), off = _mm256_set1_epi8((char)0x80);
  for (int64_t b = 0; b < k / 32; b++) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
    __m256i wu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)w[b].qs), off);
    // (w + off) . x - off * sum(x), per 4-byte lane: exact
    __m256i corr = _mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, off, xv));
    __m256i is = _mm256_dpbusd_epi32(corr, wu, xv);
    float d = f16(w[b].d) * f16(x[b].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(is), acc);
  }
  return hsum8(acc);
}

static float dot_q4_0_c1(int64_t k, const void *vw, const void *vx) {
  const blk_q4_0 *w = vw;
  const blk_q8_0 *x = vx;
  const __m256i z = _mm256_setzero_si256();
  float acc = 0;
  for (int64_t b = 0; b < k / 32; b++) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
    __m256i corr = _mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, _mm256_set1_epi8(8), xv));
    int is = hsum8i(_mm256_dpbusd_epi32(corr, nibbles(w[b].qs), xv));
    float d = f16(w[b].d) * f16(x[b].d);
    acc = fma1((float)is, d, acc);
  }
  return acc;
}

// codes of sub-blocks 2p, 2p+1 of a q4_K / q5_K block as 64 bytes: the 32
// bytes broadcast to both halves, shifted per half (no shuffle port)
static inline __m512i k4_pair(const uint8_t *qs, const uint8_t *qh, int p) {
  const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * p)));
  const __m512i sh4 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m512i c = _mm512_and_si512(_mm512_srlv_epi16(q, sh4), _mm512_set1_epi8(15));
  if (qh) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i shp = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1);
    c = _mm512_or_si512(c, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, shp), _mm512_set1_epi8(1)), 4));
  }
  return c;
}

// x * s per 32-bit lane for |x| < 2^15 and s in the low 16 bits (high 16
// zero): one vpmaddwd instead of a two-uop vpmulld
static inline __m512i mul16(__m512i x, __m512i s) { return _mm512_madd_epi16(x, s); }

// [s0 x8 | s1 x8] from 32-bit scales in a zmm
static inline __m512i pair_idx(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

// vec_dot_q4_K_q8_K / vec_dot_q5_K_q8_K for R rows at once (interleaved
// for latency), one token
static inline __attribute__((always_inline)) void k8_rows(bool q5, const int R, int64_t k, const uint8_t *const *w,
                                                          const void *vx, float *out) {
  const blk_q8_K *x = vx;
  const size_t bsz = q5 ? sizeof(blk_q5_K) : sizeof(blk_q4_K);
  __m256 acc[4];
  __m128 accm[4];
  float summs[4];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), accm[r] = _mm_setzero_ps(), summs[r] = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    int B[8];
    for (int s = 0; s < 8; s++) B[s] = x[b].bsums[2 * s] + x[b].bsums[2 * s + 1];
    const __m512i xv[4] = {_mm512_loadu_si512(x[b].qs), _mm512_loadu_si512(x[b].qs + 64),
                           _mm512_loadu_si512(x[b].qs + 128), _mm512_loadu_si512(x[b].qs + 192)};
    prefetch_rows(w, R, (size_t)b * bsz, (size_t)(b + 1) * bsz);
    QI_UNROLL for (int r = 0; r < R; r++) {
      const uint8_t *wb = w[r] + (size_t)b * bsz;
      const uint8_t *qs, *qh = NULL, *sc12;
      uint16_t hd, hm;
      if (q5) {
        const blk_q5_K *q = (const blk_q5_K *)wb;
        qs = q->qs, qh = q->qh, sc12 = q->scales, hd = q->d, hm = q->dmin;
      } else {
        const blk_q4_K *q = (const blk_q4_K *)wb;
        qs = q->qs, sc12 = q->scales, hd = q->d, hm = q->dmin;
      }
      uint64_t scw, mnw;
      qi_k4_scales(sc12, &scw, &mnw);
      uint8_t mn[8];
      memcpy(mn, &mnw, 8);
      const float d = x[b].d * f16(hd);
      const float dmin = -x[b].d * f16(hm);
      if (q5) {
        int m = 0;
        for (int s = 0; s < 8; s++) m += mn[s] * B[s];
        summs[r] = fma1(dmin, (float)m, summs[r]);
      } else {
        __m128i m4 = _mm_setr_epi32(mn[0] * B[0] + mn[1] * B[1], mn[2] * B[2] + mn[3] * B[3],
                                    mn[4] * B[4] + mn[5] * B[5], mn[6] * B[6] + mn[7] * B[7]);
        accm[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m4), accm[r]);
      }
      const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)scw)));
      __m512i tot[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      QI_UNROLL for (int p = 0; p < 4; p++) {
        __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k4_pair(qs, qh, p), xv[p]);
        tot[p % 2] = _mm512_add_epi32(tot[p % 2], mul16(is, _mm512_permutexvar_epi32(pair_idx(2 * p, 2 * p + 1), sc)));
      }
      const __m512i t = _mm512_add_epi32(tot[0], tot[1]);
      __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) out[r] = q5 ? hsum8(acc[r]) + summs[r] : hsum8(acc[r]) + hs4(accm[r]);
}

static float dot_k8(bool q5, int64_t k, const void *vw, const void *vx) {
  const uint8_t *w = vw;
  float s;
  if (q5)
    k8_rows(true, 1, k, &w, vx, &s);
  else
    k8_rows(false, 1, k, &w, vx, &s);
  return s;
}

// vec_dot_q6_K_q8_K for R rows at once, one token
static inline __attribute__((always_inline)) void q6k_rows(const int R, int64_t k, const uint8_t *const *vw,
                                                           const void *vx, float *out) {
  const blk_q8_K *x = vx;
  __m256 acc[4];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  const __m512i m4z = _mm512_set1_epi8(15), m3z = _mm512_set1_epi8(3);
  for (int64_t b = 0; b < k / QK_K; b++) {
    const __m512i xv[4] = {_mm512_loadu_si512(x[b].qs), _mm512_loadu_si512(x[b].qs + 64),
                           _mm512_loadu_si512(x[b].qs + 128), _mm512_loadu_si512(x[b].qs + 192)};
    const __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
    prefetch_rows(vw, R, (size_t)b * sizeof(blk_q6_K), (size_t)(b + 1) * sizeof(blk_q6_K));
    QI_UNROLL for (int r = 0; r < R; r++) {
      const blk_q6_K *w = (const blk_q6_K *)vw[r] + b;
      // int8 scales in the low 16 bits of each lane (mul16)
      const __m512i sc = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w->scales)),
                                          _mm512_set1_epi32(0xffff));
      __m512i tot[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      QI_UNROLL for (int j = 0; j < 2; j++) {
        const __m512i L = _mm512_loadu_si512(w->ql + 64 * j);  // chunks 0, 1 low nibbles; 2, 3 high
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qh + 32 * j)));
        QI_UNROLL for (int cp = 0; cp < 2; cp++) {  // chunks c = 2cp, 2cp+1
          const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * cp)), _mm256_set1_epi16((short)(4 * cp + 2)), 1);
          __m512i lo = _mm512_and_si512(cp ? _mm512_srli_epi16(L, 4) : L, m4z);
          __m512i hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, sh), m3z), 4);
          __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_or_si512(lo, hi), xv[2 * j + cp]);
          const int g = 8 * j + 4 * cp;  // scale group of chunk 2cp's first 16
          const __m512i idx = _mm512_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 2, g + 2, g + 2, g + 2,
                                                g + 3, g + 3, g + 3, g + 3);
          tot[cp] = _mm512_add_epi32(tot[cp], mul16(is, _mm512_permutexvar_epi32(idx, sc)));
        }
      }
      const __m512i t = _mm512_add_epi32(tot[0], tot[1]);
      __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
      __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
      lanes = _mm256_sub_epi32(lanes, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
      const float d = x[b].d * f16(w->d);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);
}

static float dot_q6k(int64_t k, const void *vw, const void *vx) {
  const uint8_t *w = vw;
  float s;
  q6k_rows(1, k, &w, vx, &s);
  return s;
}

// q4_K's gemv repack order (V256) for one output, the one-token order (the
// tile below does 16 at once, V64 too)
static float dot_q4k_v256(int64_t k, const void *vw, const void *vx) {
  const blk_q4_K *w = vw;
  const blk_q8_K *x = vx;
  float acc = 0, accm = 0;
  for (int64_t b = 0; b < k / QK_K; b++) {
    uint64_t scw, mnw;
    qi_k4_scales(w[b].scales, &scw, &mnw);
    uint8_t sc[8], mn[8];
    memcpy(sc, &scw, 8);
    memcpy(mn, &mnw, 8);
    int is[8];
    for (int p = 0; p < 4; p++) {
      __m512i v = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k4_pair(w[b].qs, NULL, p),
                                      _mm512_loadu_si512(x[b].qs + 64 * p));
      is[2 * p] = hsum8i(_mm512_castsi512_si256(v));
      is[2 * p + 1] = hsum8i(_mm512_extracti64x4_epi64(v, 1));
    }
    const float ds = f16(w[b].d) * x[b].d, dm = f16(w[b].dmin) * x[b].d;
    int t = 0, m = 0;
    for (int s = 0; s < 8; s++) {
      t += sc[s] * is[s];
      m += mn[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
    }
    acc = fma1((float)t, ds, acc);
    accm = fma1((float)m, dm, accm);
  }
  return acc - accm;
}

static inline __m512 ld_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

// ggml_vec_dot_f32 (see the reference for the tail)
static float dot_vf32(int64_t k, const float *w, const float *x) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  const int64_t np = k & ~(int64_t)63;
  for (int64_t i = 0; i < np; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
  }
  s0 = _mm512_add_ps(s0, s2);
  s1 = _mm512_add_ps(s1, s3);
  float sum = hs16(_mm512_add_ps(s0, s1));
  const int64_t r = k - np, vec_end = np + (r & ~(int64_t)15) + ((r & 15) >= 8 ? 8 : 0);
  int64_t i = np;
  for (; i < vec_end; i++) {
    float p = w[i] * x[i];
    sum = sum + p;
  }
  for (; i < k; i++) sum = fma1(w[i], x[i], sum);
  return sum;
}

static float dot_vf16(int64_t k, const uint16_t *w, const uint16_t *x) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  const int64_t np = k & ~(int64_t)63;
  for (int64_t i = 0; i < np; i += 64) {
    s0 = _mm512_fmadd_ps(ld_h(w + i), ld_h(x + i), s0);
    s1 = _mm512_fmadd_ps(ld_h(w + i + 16), ld_h(x + i + 16), s1);
    s2 = _mm512_fmadd_ps(ld_h(w + i + 32), ld_h(x + i + 32), s2);
    s3 = _mm512_fmadd_ps(ld_h(w + i + 48), ld_h(x + i + 48), s3);
  }
  s0 = _mm512_add_ps(s0, s2);
  s1 = _mm512_add_ps(s1, s3);
  double sum = (double)hs16(_mm512_add_ps(s0, s1));
  for (int64_t i = np; i < k; i++) {
    float p = f16(w[i]) * f16(x[i]);
    sum = sum + (double)p;
  }
  return (float)sum;
}

static inline __m512 dpbf(__m512 acc, const uint16_t *w, const uint16_t *x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(w), (__m512bh)_mm512_loadu_si512(x));
}

static float dot_vbf16(int64_t k, const uint16_t *w, const uint16_t *x) {
  __m512 c1 = _mm512_setzero_ps(), c2 = c1;
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    c1 = dpbf(c1, w + i, x + i);
    c2 = dpbf(c2, w + i + 32, x + i + 32);
  }
  double sum = 0;
  sum = sum + (double)hs16(c1);
  sum = sum + (double)hs16(c2);
  for (; i < k; i++) {
    float p = quant_bf16_to_f32(w[i]) * quant_bf16_to_f32(x[i]);
    sum = sum + (double)p;
  }
  return (float)sum;
}

// the orders whose single outputs come here (quant_exact_tile_avx512 runs
// q4_0's, q4_K's repack orders and the tinyBLAS ones in its tiles)
static void quant_exact_dot_avx512(qx_order o, int64_t k, float *s, const void *w, const void *x) {
  switch (o) {
    case QX_Q8_0: *s = dot_l8(k, w, x); return;
    case QX_Q4_0_C1: *s = dot_q4_0_c1(k, w, x); return;
    case QX_Q4_K_K8: *s = dot_k8(false, k, w, x); return;
    case QX_Q5_K_K8: *s = dot_k8(true, k, w, x); return;
    case QX_Q4_K_V256: *s = dot_q4k_v256(k, w, x); return;
    case QX_Q6_K_K8: *s = dot_q6k(k, w, x); return;
    case QX_F32_VEC: *s = dot_vf32(k, w, x); return;
    case QX_F16_VEC: *s = dot_vf16(k, w, x); return;
    case QX_BF16_VEC: *s = dot_vbf16(k, w, x); return;
    default: MOLE_ASSERT(!"quant_exact_dot_avx512: an order its tiles take whole");
  }
}

// the one-token vec_dots (quant_avx512.h)
QX_VEC_DOTS(avx512, quant_exact_dot_avx512)

// ---- 16-row panels ---------------------------------------------------------------------------
// The lane-per-row orders (q4_0 C1, q4_K repack) take 16 rows at a time from
// one of two sources:
//  * GGUF rows: lane L holds row P(L) = 4*(L%4) + L/4 (a 4x4 transpose of
//    128-bit lanes built from masked broadcasts), scales gathered a block ahead;
//  * an R16 group (quant_r16.c): lane L holds row L and every register is one
//    plain load from one contiguous stream (the decode path at DRAM speed).

// software prefetch of R16 groups from this many tokens per call on (see prefetch_gb)
enum { QX_PF_TOK = 4 };

static inline int perm16(int L) { return 4 * (L % 4) + L / 4; }

// 16 bytes at p[r] + off for 16 rows -> T[c]: lane L = dword c of row P(L)
static inline void tr16x4(const uint8_t *const *p, size_t off, __m512i T[4]) {
  __m512i Z[4];
  // masked broadcasts from memory: load + blend, no shuffle port
  QI_UNROLL for (int g = 0; g < 4; g++) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p[4 * g] + off)));
    v = _mm512_mask_broadcast_i32x4(v, 0x00f0, _mm_loadu_si128((const __m128i *)(p[4 * g + 1] + off)));
    v = _mm512_mask_broadcast_i32x4(v, 0x0f00, _mm_loadu_si128((const __m128i *)(p[4 * g + 2] + off)));
    Z[g] = _mm512_mask_broadcast_i32x4(v, 0xf000, _mm_loadu_si128((const __m128i *)(p[4 * g + 3] + off)));
  }
  __m512i t0 = _mm512_unpacklo_epi32(Z[0], Z[1]), t1 = _mm512_unpackhi_epi32(Z[0], Z[1]);
  __m512i t2 = _mm512_unpacklo_epi32(Z[2], Z[3]), t3 = _mm512_unpackhi_epi32(Z[2], Z[3]);
  T[0] = _mm512_unpacklo_epi64(t0, t2);
  T[1] = _mm512_unpackhi_epi64(t0, t2);
  T[2] = _mm512_unpacklo_epi64(t1, t3);
  T[3] = _mm512_unpackhi_epi64(t1, t3);
}

typedef struct {
  bool r16;
  int nr;                // rows of the panel (<= 16)
  bool pf;               // R16: software prefetch (QX_PF_TOK tokens or more)
  const uint8_t *g;      // R16: the group
  const uint8_t *p[16];  // rows: the 16 rows (the last repeated past the end)
  __m512i offs;          // rows: offsets of row P(L) from p[0], for gathers
} panel16;

static inline panel16 panel_at(bool r16, const void *W, size_t wstride, int64_t r0, int64_t i1, int64_t nt) {
  panel16 pn;
  pn.r16 = r16;
  pn.pf = nt >= QX_PF_TOK;
  pn.nr = (int)MOLE_MIN(16, i1 - r0);
  pn.g = (const uint8_t *)W + (size_t)r0 * wstride;
  int32_t o[16];
  for (int r = 0; r < 16; r++) pn.p[r] = (const uint8_t *)W + (size_t)MOLE_MIN(r0 + r, i1 - 1) * wstride;
  for (int L = 0; L < 16; L++) o[L] = (int32_t)(pn.p[perm16(L)] - pn.p[0]);
  pn.offs = _mm512_loadu_si512(o);
  return pn;
}

// lanes -> rows of y
static inline void panel_store(const panel16 *pn, float *y, __m512 v) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_mask_storeu_ps(y, tail16(pn->nr), pn->r16 ? v : _mm512_permutexvar_ps(idx, v));
}

// the f16 at base + offs[L] as floats in lane L
static inline __m512 gather_f16(const uint8_t *base, __m512i offs) {
  __m512i v = _mm512_i32gather_epi32(offs, base, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}
static inline __m512i gather_u32(const uint8_t *base, __m512i offs) { return _mm512_i32gather_epi32(offs, base, 1); }

// R16 streams one group block after another. With several tokens per call
// (prefill) the compute per byte is high and a software prefetch a little
// ahead of the hardware prefetcher's ramp pays (q4_0 pp +5%); for decode
// (fewer than QX_PF_TOK tokens) it costs: on Zen 4 whole-model decode was
// 3-20% faster without it (q8_0 the most), so decode leaves the stream to
// the hardware prefetcher.
#ifndef QX_PF16
#define QX_PF16 2048
#endif
static inline __attribute__((always_inline)) void prefetch_gb(const uint8_t *gb, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)gb + QX_PF16 + o, _MM_HINT_T0);
}

// Per-call token data for q4_0 x q8_0: the activation block scales as floats
// and -8 * the sums of the activation codes.
typedef struct {
  float *dx;    // [nt][nb]
  int32_t *sx;  // [nt][nb]
} tok_aux;

static tok_aux q8_0_aux(char *scr, const void *X, size_t xstride, int64_t j0, int64_t nt, int64_t nb) {
  tok_aux a = {(float *)scr, (int32_t *)scr + nt * nb};
  for (int64_t j = 0; j < nt; j++) {
    const blk_q8_0 *x = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + j) * xstride);
    for (int64_t b = 0; b < nb; b++) {
      __m256i v = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8),
                                      _mm256_loadu_si256((const __m256i *)x[b].qs));
      a.sx[j * nb + b] = -hsum8i(v);
      a.dx[j * nb + b] = f16(x[b].d);
    }
  }
  return a;
}

// q4_0 block b of a panel: the 8 code registers (V[c]: elements 4c..4c+3,
// V[c+4]: 16+4c..16+4c+3, lane per row) and the row scales. Rows: the scales
// were gathered a block ahead into *dw_next.
static inline __attribute__((always_inline)) __m512 q4_0_block(const panel16 *pn, int64_t b, int64_t nb, __m512i V[8],
                                                               __m512 *dw_next) {
  const __m512i m4 = _mm512_set1_epi8(15);
  __m512i T[4];
  __m512 dw;
  if (pn->r16) {
    const uint8_t *gb = pn->g + (size_t)b * 16 * sizeof(blk_q4_0);
    if (pn->pf) prefetch_gb(gb, 16 * sizeof(blk_q4_0));
    dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    QI_UNROLL for (int c = 0; c < 4; c++) T[c] = _mm512_loadu_si512(gb + 32 + 64 * c);
  } else {
    const size_t bo = (size_t)b * sizeof(blk_q4_0);
    dw = *dw_next;  // gathers issued a block ahead: their latency is long
    if (b + 1 < nb) *dw_next = gather_f16(pn->p[0] + bo + sizeof(blk_q4_0), pn->offs);
    prefetch_rows(pn->p, 16, bo, bo + sizeof(blk_q4_0));
    tr16x4(pn->p, bo + 2, T);
  }
  QI_UNROLL for (int c = 0; c < 4; c++) {
    V[c] = _mm512_and_si512(T[c], m4);
    V[c + 4] = _mm512_and_si512(_mm512_srli_epi32(T[c], 4), m4);
  }
  return dw;
}

// the integer dot of a q4_0 block (V) with token block x, -8 * sum(x) folded
// in: four short dpbusd chains (integer sums: any order is exact)
static inline __attribute__((always_inline)) __m512i q4_0_isum(const __m512i V[8], const blk_q8_0 *x, int32_t sx) {
  const int32_t *xq = (const int32_t *)x->qs;
  __m512i is[4] = {_mm512_set1_epi32(sx), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  QI_UNROLL for (int c = 0; c < 8; c++) {
    int32_t xd;
    memcpy(&xd, xq + c, 4);
    is[c % 4] = _mm512_dpbusd_epi32(is[c % 4], V[c], _mm512_set1_epi32(xd));
  }
  return _mm512_add_epi32(_mm512_add_epi32(is[0], is[1]), _mm512_add_epi32(is[2], is[3]));
}

// Up to 4 tokens against one panel, accumulators in registers (decode).
static inline __attribute__((always_inline)) void c1_direct(const int NT, const panel16 *pn, const void *X,
                                                            size_t xstride, int64_t j0, const tok_aux *ta, int64_t nb,
                                                            __m512 acc[4]) {
  const blk_q8_0 *x[4];
  for (int t = 0; t < NT; t++) x[t] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + t) * xstride);
  __m512 dw_next = pn->r16 ? _mm512_setzero_ps() : gather_f16(pn->p[0], pn->offs);
  for (int64_t b = 0; b < nb; b++) {
    __m512i V[8];
    const __m512 dw = q4_0_block(pn, b, nb, V, &dw_next);
    QI_UNROLL for (int t = 0; t < NT; t++) {
      const __m512i isum = q4_0_isum(V, x[t] + b, ta->sx[t * nb + b]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(ta->dx[t * nb + b])), acc[t]);
    }
  }
}

// Up to 4 tokens against two R16 panels, a block of each in turn (two
// streams: see l8_r16_slots); each row's sums are c1_direct's.
static inline __attribute__((always_inline)) void c1_pair(const int NT, const panel16 *pa, const panel16 *pb,
                                                          const void *X, size_t xstride, int64_t j0, const tok_aux *ta,
                                                          int64_t nb, __m512 acc[2][4]) {
  const blk_q8_0 *x[4];
  for (int t = 0; t < NT; t++) x[t] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + t) * xstride);
  __m512 unused = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    QI_UNROLL for (int s = 0; s < 2; s++) {
      __m512i V[8];
      const __m512 dw = q4_0_block(s ? pb : pa, b, nb, V, &unused);
      QI_UNROLL for (int t = 0; t < NT; t++) {
        const __m512i isum = q4_0_isum(V, x[t] + b, ta->sx[t * nb + b]);
        acc[s][t] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(ta->dx[t * nb + b])), acc[s][t]);
      }
    }
  }
}

// q4_0, one fma per block: 16 rows per panel, tokens 4 at a time with their
// accumulators in registers: the panel (16 rows x k, L1/L2-sized) is read
// from memory for the first 4 and from cache for the others. Each token's
// sum runs over the blocks in the same order whatever its group.
static void tile_q4_0_c1(bool r16, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                         int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const int64_t nb = k / 32, nt = j1 - j0;
  char *scr = quant_scratch((size_t)nt * (size_t)nb * 8);
  const tok_aux ta_all = q8_0_aux(scr, X, xstride, j0, nt, nb);
  if (r16 && nt <= 4) {  // decode: two streams (the halves of [i0, i1))
    const int64_t half = (i1 - i0) / 32 * 16;
    for (int64_t r0 = i0; r0 < i0 + half; r0 += 16) {
      const panel16 pa = panel_at(true, W, wstride, r0, i1, nt), pb = panel_at(true, W, wstride, r0 + half, i1, nt);
      __m512 acc[2][4];
      for (int e = 0; e < 8; e++) acc[e / 4][e % 4] = _mm512_setzero_ps();
      switch (nt) {
        case 1: c1_pair(1, &pa, &pb, X, xstride, j0, &ta_all, nb, acc); break;
        case 2: c1_pair(2, &pa, &pb, X, xstride, j0, &ta_all, nb, acc); break;
        case 3: c1_pair(3, &pa, &pb, X, xstride, j0, &ta_all, nb, acc); break;
        default: c1_pair(4, &pa, &pb, X, xstride, j0, &ta_all, nb, acc); break;
      }
      for (int64_t j = 0; j < nt; j++) {
        panel_store(&pa, Y + (j0 + j) * ldy + r0, acc[0][j]);
        panel_store(&pb, Y + (j0 + j) * ldy + r0 + half, acc[1][j]);
      }
    }
    i0 += 2 * half;
  }
  for (int64_t r0 = i0; r0 < i1; r0 += 16) {
    const panel16 pn = panel_at(r16, W, wstride, r0, i1, nt);
    for (int64_t g = 0; g < nt; g += 4) {
      const int64_t ng = MOLE_MIN(nt - g, (int64_t)4);
      const tok_aux ta = {ta_all.dx + g * nb, ta_all.sx + g * nb};
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      switch (ng) {
        case 1: c1_direct(1, &pn, X, xstride, j0 + g, &ta, nb, acc); break;
        case 2: c1_direct(2, &pn, X, xstride, j0 + g, &ta, nb, acc); break;
        case 3: c1_direct(3, &pn, X, xstride, j0 + g, &ta, nb, acc); break;
        default: c1_direct(4, &pn, X, xstride, j0 + g, &ta, nb, acc); break;
      }
      for (int64_t j = 0; j < ng; j++) panel_store(&pn, Y + (j0 + g + j) * ldy + r0, acc[j]);
    }
  }
}

// q4_K block b of a panel: row scales (d, dmin) and the 6-bit sub-block
// scales and mins of 16 rows decoded lane-wise from the three dwords of the
// packed 12 bytes (lane per row): sc[s] and mp[q] = min[2q] | min[2q+1] << 16.
typedef struct {
  __m512 dw, dmw;
  __m512i s_lo, s_hi, m_lo, m_hi;  // bytes s (s < 4) / s - 4 of the scales and mins
} q4k_scales;

// the 6-bit scales and mins of 16 rows from the three dwords of their 12 bytes
static inline __attribute__((always_inline)) q4k_scales k4_scales_unpack(const __m512i u[3]) {
  q4k_scales s;
  s.dw = s.dmw = _mm512_setzero_ps();
  const __m512i m6 = _mm512_set1_epi8(0x3f), m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
  s.s_lo = _mm512_and_si512(u[0], m6);
  s.m_lo = _mm512_and_si512(u[1], m6);
  s.s_hi = _mm512_or_si512(_mm512_and_si512(u[2], m4),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u[0], 6), m2), 4));
  s.m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u[2], 4), m4),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u[1], 6), m2), 4));
  return s;
}

// from a q4_K / q5_K R16 group block (the same first 256 bytes)
static inline __attribute__((always_inline)) q4k_scales k4_scales_r16(const uint8_t *gb) {
  __m512i u[3];
  for (int i = 0; i < 3; i++) u[i] = _mm512_loadu_si512(gb + 64 + 64 * i);
  q4k_scales s = k4_scales_unpack(u);
  s.dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
  s.dmw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
  return s;
}

static inline __attribute__((always_inline)) q4k_scales q4k_block_scales(const panel16 *pn, int64_t b) {
  if (pn->r16) return k4_scales_r16(pn->g + (size_t)b * 16 * sizeof(blk_q4_K));
  const uint8_t *b0 = pn->p[0] + (size_t)b * sizeof(blk_q4_K);
  __m512i u[3];
  for (int i = 0; i < 3; i++) u[i] = gather_u32(b0 + offsetof(blk_q4_K, scales) + 4 * i, pn->offs);
  q4k_scales s = k4_scales_unpack(u);
  s.dw = gather_f16(b0 + offsetof(blk_q4_K, d), pn->offs);
  s.dmw = gather_f16(b0 + offsetof(blk_q4_K, dmin), pn->offs);
  return s;
}

static inline __m512i byte_of(__m512i w, int i) {
  return _mm512_and_si512(_mm512_srli_epi32(w, 8 * i), _mm512_set1_epi32(0xff));
}

// the 8 code registers of sub-block pair q (T[t]: lane per row, dword t of
// the 32 bytes 32q..32q+31), low nibbles in V[0][t], high in V[1][t]
static inline __attribute__((always_inline)) void q4k_codes(const panel16 *pn, int64_t b, int q, __m512i V[2][8]) {
  __m512i T[8];
  if (pn->r16) {
    const uint8_t *c = pn->g + (size_t)b * 16 * sizeof(blk_q4_K) + 256 + 512 * q;
    QI_UNROLL for (int t = 0; t < 8; t++) T[t] = _mm512_loadu_si512(c + 64 * t);
  } else {
    const size_t bo = (size_t)b * sizeof(blk_q4_K) + offsetof(blk_q4_K, qs) + 32 * q;
    tr16x4(pn->p, bo, T);
    tr16x4(pn->p, bo + 16, T + 4);
  }
  const __m512i m4 = _mm512_set1_epi8(15);
  QI_UNROLL for (int t = 0; t < 8; t++) {
    V[0][t] = _mm512_and_si512(T[t], m4);
    V[1][t] = _mm512_and_si512(_mm512_srli_epi32(T[t], 4), m4);
  }
}

// sum of sc[2q] * dot(sub-block 2q) + sc[2q+1] * dot(2q+1), and of the mins
// against the token's sub-block sums, for one token x (block b)
static inline __attribute__((always_inline)) void q4k_pair(const __m512i V[2][8], __m512i sc0, __m512i sc1, __m512i mq,
                                                           const blk_q8_K *x, int q, __m512i *tq, __m512i *mq_j) {
  const int32_t *xq = (const int32_t *)x->qs + 16 * q;
  __m512i is0 = _mm512_setzero_si512(), is1 = _mm512_setzero_si512();
  QI_UNROLL for (int t = 0; t < 8; t++) {
    int32_t a0, a1;
    memcpy(&a0, xq + t, 4);
    memcpy(&a1, xq + 8 + t, 4);
    is0 = _mm512_dpbusd_epi32(is0, V[0][t], _mm512_set1_epi32(a0));
    is1 = _mm512_dpbusd_epi32(is1, V[1][t], _mm512_set1_epi32(a1));
  }
  *tq = _mm512_add_epi32(_mm512_mullo_epi32(is0, sc0), _mm512_mullo_epi32(is1, sc1));
  const int16_t B0 = (int16_t)(x->bsums[4 * q] + x->bsums[4 * q + 1]);
  const int16_t B1 = (int16_t)(x->bsums[4 * q + 2] + x->bsums[4 * q + 3]);
  const int32_t bp = (int32_t)((uint32_t)(uint16_t)B0 | (uint32_t)(uint16_t)B1 << 16);
  *mq_j = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mq, _mm512_set1_epi32(bp));
}

// q4_K repack orders: 16 rows per panel; V64 (gemm) one fma per sub-block
// pair, V256 (gemv) one per block. Up to 4 tokens in registers; more: every
// token against each pair's codes, accumulators (main, min) in scratch.
static void tile_q4k_repack(bool r16, bool v64, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                            int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const int64_t nb = k / QK_K, nt = j1 - j0;
  char *scr = quant_scratch((size_t)nt * 4 * 64);
  __m512 *acc = (__m512 *)scr, *accm = acc + nt;
  __m512i *tot = (__m512i *)(accm + nt), *mins = tot + nt;
  for (int64_t r0 = i0; r0 < i1; r0 += 16) {
    const panel16 pn = panel_at(r16, W, wstride, r0, i1, nt);
    for (int64_t j = 0; j < nt; j++) acc[j] = accm[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      if (r16) {
        if (pn.pf) prefetch_gb(pn.g + (size_t)b * 16 * sizeof(blk_q4_K), 16 * sizeof(blk_q4_K));
      } else {
        const size_t bo = (size_t)b * sizeof(blk_q4_K);
        prefetch_rows(pn.p, 16, bo, bo + sizeof(blk_q4_K));
      }
      const q4k_scales S = q4k_block_scales(&pn, b);
      for (int64_t j = 0; j < nt; j++) tot[j] = mins[j] = _mm512_setzero_si512();
      QI_UNROLL for (int q = 0; q < 4; q++) {
        __m512i V[2][8];
        q4k_codes(&pn, b, q, V);
        const __m512i sw = q < 2 ? S.s_lo : S.s_hi, mw = q < 2 ? S.m_lo : S.m_hi;
        const __m512i sc0 = byte_of(sw, 2 * (q % 2)), sc1 = byte_of(sw, 2 * (q % 2) + 1);
        const __m512i mq = _mm512_or_si512(byte_of(mw, 2 * (q % 2)), _mm512_slli_epi32(byte_of(mw, 2 * (q % 2) + 1), 16));
        for (int64_t j = 0; j < nt; j++) {
          const blk_q8_K *x = (const blk_q8_K *)((const char *)X + (size_t)(j0 + j) * xstride) + b;
          __m512i tq, mq_j;
          q4k_pair(V, sc0, sc1, mq, x, q, &tq, &mq_j);
          if (v64) {
            const __m512 xd = _mm512_set1_ps(x->d);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tq), _mm512_mul_ps(S.dw, xd), acc[j]);
            accm[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mq_j), _mm512_mul_ps(S.dmw, xd), accm[j]);
          } else {
            tot[j] = _mm512_add_epi32(tot[j], tq);
            mins[j] = _mm512_add_epi32(mins[j], mq_j);
          }
        }
      }
      if (!v64)
        for (int64_t j = 0; j < nt; j++) {
          const __m512 xd = _mm512_set1_ps(((const blk_q8_K *)((const char *)X + (size_t)(j0 + j) * xstride))[b].d);
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[j]), _mm512_mul_ps(S.dw, xd), acc[j]);
          accm[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[j]), _mm512_mul_ps(S.dmw, xd), accm[j]);
        }
    }
    for (int64_t j = 0; j < nt; j++) panel_store(&pn, Y + (j0 + j) * ldy + r0, _mm512_sub_ps(acc[j], accm[j]));
  }
}

// q8_0 (and q4_0 without repack): 8 rows as 4 pairs, 4 tokens. Panel per
// block: 4 registers of unsigned codes [row 2q | row 2q+1], 8 row scales.
// From an R16 group the 8 rows are one half of it, their codes already
// unsigned, 64 bytes per pair.
enum { L8_PB = 4 * 64 + 64 };
// token passes over a pair of R16 groups (tile_l8): up to this many tokens, pairs up to this many bytes (L2)
enum { L8_PASS_TOK = 8, L8_PASS_BYTES = 512 << 10 };

static void l8_aux(bool q4, const blk_q8_0 *x, int64_t nb, int32_t *aux) {
  const __m256i off = q4 ? _mm256_set1_epi8(8) : _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
  for (int64_t b = 0; b < nb; b++) {
    __m256i c = _mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, off, _mm256_loadu_si256((const __m256i *)x[b].qs)));
    _mm256_store_si256((__m256i *)(aux + 40 * b), c);
    const float d = f16(x[b].d);
    memcpy(aux + 40 * b + 8, &d, 4);
  }
}

// 8 rows of a matrix: rows r0.. (the last repeated past the end), or half h
// of the R16 group at g
typedef struct {
  const uint8_t *g;  // R16: the group (NULL: rows)
  int h;
  const uint8_t *p[8];
} panel8;

// the codes of block b as 4 registers of unsigned bytes [row 2q | row 2q+1]
static inline __attribute__((always_inline)) void l8_codes(bool q4, const panel8 *pn, int64_t b, __m512i w[4]) {
  if (pn->g) {
    const uint8_t *c = pn->g + (size_t)b * 16 * sizeof(blk_q8_0) + 32 + 256 * pn->h;
    QI_UNROLL for (int q = 0; q < 4; q++) w[q] = _mm512_loadu_si512(c + 64 * q);
    return;
  }
  const size_t bo = (size_t)b * (q4 ? sizeof(blk_q4_0) : sizeof(blk_q8_0));
  const __m512i off2 = _mm512_set1_epi8((char)0x80);
  QI_UNROLL for (int q = 0; q < 4; q++) {
    if (q4) {
      w[q] = _mm512_inserti64x4(_mm512_castsi256_si512(nibbles(pn->p[2 * q] + bo + 2)), nibbles(pn->p[2 * q + 1] + bo + 2), 1);
    } else {
      __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pn->p[2 * q] + bo + 2)));
      v = _mm512_mask_broadcast_i64x4(v, 0xf0, _mm256_loadu_si256((const __m256i *)(pn->p[2 * q + 1] + bo + 2)));
      w[q] = _mm512_xor_si512(v, off2);
    }
  }
}

// One token group of up to 4 tokens straight from GGUF rows (decode; R16
// groups go through l8_r16_slots): the codes of 8 rows as 4 pairs per block,
// the scales gathered a block ahead. aux[t]: per block of token t, 40 int32:
// the 8 lane corrections -off * sum of the token's bytes, its scale as a
// float, padding (l8_aux)
static inline __attribute__((always_inline)) void l8_direct(bool q4, const int NT, const panel8 *pn,
                                                            const blk_q8_0 *const *x, const int32_t *const *aux,
                                                            int64_t nb, __m512 acc[4][4]) {
  const size_t bsz = q4 ? sizeof(blk_q4_0) : sizeof(blk_q8_0);
  int32_t o[8];
  for (int r = 0; r < 8; r++) o[r] = (int32_t)(pn->p[r] - pn->p[0]);
  const __m256i offs = _mm256_loadu_si256((const __m256i *)o);
  __m256 dw_next = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_i32gather_epi32((const int *)pn->p[0], offs, 1)));
  for (int64_t b = 0; b < nb; b++) {
    const size_t bo = (size_t)b * bsz;
    const __m256 dw = dw_next;
    if (b + 1 < nb)
      dw_next = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_i32gather_epi32((const int *)(pn->p[0] + bo + bsz), offs, 1)));
    prefetch_rows(pn->p, 8, bo, bo + bsz);
    __m512i w[4];
    l8_codes(q4, pn, b, w);
    QI_UNROLL for (int t = 0; t < NT; t++) {
      const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[t][b].qs));
      const __m512i corr = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(aux[t] + 40 * b)));
      const __m512 d8 = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(((const float *)aux[t])[40 * b + 8])));
      QI_UNROLL for (int q = 0; q < 4; q++) {
        __m512i is = _mm512_dpbusd_epi32(corr, w[q], xv);
        acc[q][t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair_idx(2 * q, 2 * q + 1), d8), _mm512_cvtepi32_ps(is),
                                    acc[q][t]);
      }
    }
  }
}

// Decode on whole R16 groups, NS <= 2 slots: slot s is group g[s] against
// token x[s] (aux[s]), both halves of each group block in turn, so a group is
// read front to back once. Two tokens: the same group in both slots. One
// token: a group from each half of the thread's rows, so the kernel reads
// two streams, which keep more of DRAM's bandwidth busy than one (q8_0 1T
// from DRAM 22.5 -> 28.2 GB/s on Zen 4). A row's sum does not depend on the
// slot it is in.
// one_x: every slot has token x[0] (its data is loaded once a block).
static inline __attribute__((always_inline)) void l8_r16_slots(const int NS, const bool one_x, const uint8_t *const *g,
                                                               const blk_q8_0 *const *x, const int32_t *const *aux,
                                                               int64_t nb, __m512 acc[2][4][2]) {
  for (int64_t b = 0; b < nb; b++) {
    __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[0][b].qs));
    __m512i corr = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(aux[0] + 40 * b)));
    __m512 dx = _mm512_set1_ps(((const float *)aux[0])[40 * b + 8]);
    QI_UNROLL for (int s = 0; s < NS; s++) {
      const uint8_t *gb = g[s] + (size_t)b * 16 * sizeof(blk_q8_0);
      if (s > 0 && !one_x) {
        xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[s][b].qs));
        corr = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(aux[s] + 40 * b)));
        dx = _mm512_set1_ps(((const float *)aux[s])[40 * b + 8]);
      }
      const __m512 d16 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb)), dx);
      QI_UNROLL for (int h = 0; h < 2; h++) QI_UNROLL for (int q = 0; q < 4; q++) {
        const __m512i w = _mm512_loadu_si512(gb + 32 + 256 * h + 64 * q);
        const __m512i is = _mm512_dpbusd_epi32(corr, w, xv);
        acc[h][q][s] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair_idx(8 * h + 2 * q, 8 * h + 2 * q + 1), d16),
                                       _mm512_cvtepi32_ps(is), acc[h][q][s]);
      }
    }
  }
}

// y[0..nr) from the accumulators of slot s (token or stream) of an R16 group
static inline void l8_store(const __m512 acc[2][4][2], int s, int nr, float *y) {
  for (int h = 0; h < 2; h++)
    for (int q = 0; q < 4; q++) {
      if (8 * h + 2 * q < nr) y[8 * h + 2 * q] = hsum8(_mm512_castps512_ps256(acc[h][q][s]));
      if (8 * h + 2 * q + 1 < nr) y[8 * h + 2 * q + 1] = hsum8(_mm512_extractf32x8_ps(acc[h][q][s], 1));
    }
}

static void tile_l8(bool r16, bool q4, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                    int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const int64_t nb = k / 32, nt = j1 - j0;
  const size_t bsz = q4 ? sizeof(blk_q4_0) : sizeof(blk_q8_0);
  MOLE_ASSERT(!r16 || (!q4 && i0 % 8 == 0));
  // the tokens' corrections and scales once per call when they fit in L2
  const size_t aux_bytes = (size_t)nt * (size_t)nb * 40 * 4;
  const bool have_aux = nt <= 4 || aux_bytes <= ((size_t)1 << 20);
  char *panel = quant_scratch((size_t)nb * L8_PB + (have_aux ? aux_bytes : 0));
  int32_t *l8x = (int32_t *)(panel + (size_t)nb * L8_PB);
  if (have_aux)
    for (int64_t t = 0; t < nt; t++)
      l8_aux(q4, (const blk_q8_0 *)((const char *)X + (size_t)(j0 + t) * xstride), nb, l8x + (size_t)t * (size_t)nb * 40);
  const __m256i off = q4 ? _mm256_set1_epi8(8) : _mm256_set1_epi8((char)0x80);
  const __m512i off2 = _mm512_broadcast_i64x4(off);
  // Decode and small batches (L8_PASS_TOK tokens or fewer): pairs of groups
  // from the two halves of [i0, i1) read as two streams (see l8_r16_slots),
  // one token at a time: the first token's pass brings the pair in from
  // memory, the others find it in L2. The exact order's float work per token
  // is what bounds q8_0 here, so a token costs the same in its own pass, and
  // the pass keeps the two-stream overlap of memory and compute that one
  // token gets (q8_0 from DRAM, one thread: 2 tokens 14.6 -> 21 GB/s). A
  // pair too long for L2 (k over ~15k) goes a group at a time, two tokens in
  // the slots.
  if (r16 && nt <= L8_PASS_TOK) {
    __m512 acc[2][4][2];
    const blk_q8_0 *x[2];
    const int32_t *aux[2];
    const bool pairs = nt == 1 || 2 * nb * 16 * sizeof(blk_q8_0) <= L8_PASS_BYTES;
    const int64_t half = pairs ? (i1 - i0) / 32 * 16 : 0;
    for (int64_t r0 = i0; r0 < i0 + half; r0 += 16) {
      const uint8_t *g[2] = {(const uint8_t *)W + (size_t)r0 * wstride, (const uint8_t *)W + (size_t)(r0 + half) * wstride};
      for (int64_t t = 0; t < nt; t++) {
        x[0] = x[1] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + t) * xstride);
        aux[0] = aux[1] = l8x + (size_t)t * (size_t)nb * 40;
        for (int e = 0; e < 16; e++) acc[e / 8][e / 2 % 4][e % 2] = _mm512_setzero_ps();
        l8_r16_slots(2, true, g, x, aux, nb, acc);
        l8_store(acc, 0, 16, Y + (j0 + t) * ldy + r0);
        l8_store(acc, 1, 16, Y + (j0 + t) * ldy + r0 + half);
      }
    }
    // the rest a group at a time, two tokens in the slots
    for (int64_t r0 = i0 + 2 * half; r0 < i1; r0 += 16) {
      const uint8_t *g[2] = {(const uint8_t *)W + (size_t)r0 * wstride, (const uint8_t *)W + (size_t)r0 * wstride};
      for (int64_t t = 0; t < nt; t += 2) {
        const int64_t tn = MOLE_MIN(2, nt - t);
        for (int s = 0; s < 2; s++) {
          x[s] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + t + MOLE_MIN(s, tn - 1)) * xstride);
          aux[s] = l8x + (size_t)(t + MOLE_MIN(s, tn - 1)) * (size_t)nb * 40;
        }
        for (int e = 0; e < 16; e++) acc[e / 8][e / 2 % 4][e % 2] = _mm512_setzero_ps();
        if (tn == 2)
          l8_r16_slots(2, false, g, x, aux, nb, acc);
        else
          l8_r16_slots(1, true, g, x, aux, nb, acc);
        for (int64_t s = 0; s < tn; s++) l8_store(acc, (int)s, (int)MOLE_MIN(16, i1 - r0), Y + (j0 + t + s) * ldy + r0);
      }
    }
    return;
  }
  for (int64_t r0 = i0; r0 < i1; r0 += 8) {
    const int nr = (int)MOLE_MIN(8, i1 - r0);
    panel8 pn = {NULL, 0, {NULL}};
    if (r16) {
      pn.g = (const uint8_t *)W + (size_t)(r0 / 16 * 16) * wstride;
      pn.h = (int)(r0 % 16 / 8);
    }
    for (int r = 0; r < 8; r++) pn.p[r] = (const uint8_t *)W + (size_t)MOLE_MIN(r0 + r, i1 - 1) * wstride;
    if (nt <= 4) {  // decode: no panel
      __m512 acc[4][4];
      const blk_q8_0 *x[4];
      const int32_t *aux[4];
      for (int t = 0; t < 4; t++) {
        x[t] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + MOLE_MIN(t, nt - 1)) * xstride);
        aux[t] = l8x + (size_t)MOLE_MIN(t, nt - 1) * (size_t)nb * 40;
        for (int q = 0; q < 4; q++) acc[q][t] = _mm512_setzero_ps();
      }
      switch (nt) {
        case 1: l8_direct(q4, 1, &pn, x, aux, nb, acc); break;
        case 2: l8_direct(q4, 2, &pn, x, aux, nb, acc); break;
        case 3: l8_direct(q4, 3, &pn, x, aux, nb, acc); break;
        default: l8_direct(q4, 4, &pn, x, aux, nb, acc); break;
      }
      for (int t = 0; t < nt; t++) {
        float *y = Y + (j0 + t) * ldy + r0;
        for (int q = 0; q < 4; q++) {
          if (2 * q < nr) y[2 * q] = hsum8(_mm512_castps512_ps256(acc[q][t]));
          if (2 * q + 1 < nr) y[2 * q + 1] = hsum8(_mm512_extractf32x8_ps(acc[q][t], 1));
        }
      }
      continue;
    }
    for (int64_t b = 0; b < nb; b++) {
      char *pb = panel + (size_t)b * L8_PB;
      float dw[8];
      if (r16) {
        const uint8_t *gb = pn.g + (size_t)b * 16 * sizeof(blk_q8_0);
        __m512i w[4];
        l8_codes(false, &pn, b, w);
        for (int q = 0; q < 4; q++) _mm512_store_si512(pb + 64 * q, w[q]);
        _mm256_storeu_ps(dw, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * pn.h))));
      } else {
        for (int r = 0; r < 8; r++) {
          const uint8_t *blk = pn.p[r] + (size_t)b * bsz;
          __m256i c = q4 ? nibbles(blk + 2) : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), off);
          _mm256_store_si256((__m256i *)(pb + 32 * r), c);
          uint16_t h;
          memcpy(&h, blk, 2);
          dw[r] = f16(h);
        }
      }
      memcpy(pb + 256, dw, sizeof dw);
    }
    int64_t j = 0;
    for (; j < nt; j += 4) {
      const int tn = (int)MOLE_MIN(4, nt - j);
      __m512 acc[4][4];
      for (int q = 0; q < 4; q++)
        for (int t = 0; t < 4; t++) acc[q][t] = _mm512_setzero_ps();
      const blk_q8_0 *x[4];
      for (int t = 0; t < 4; t++)
        x[t] = (const blk_q8_0 *)((const char *)X + (size_t)(j0 + j + MOLE_MIN(t, tn - 1)) * xstride);
      for (int64_t b = 0; b < nb; b++) {
        const char *pb = panel + (size_t)b * L8_PB;
        const __m256 dw = _mm256_load_ps((const float *)(pb + 256));
        QI_UNROLL for (int t = 0; t < 4; t++) {
          const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[t][b].qs));
          __m512i corr;
          __m512 d8;
          if (have_aux) {
            const int32_t *a = l8x + ((size_t)(j + MOLE_MIN(t, tn - 1)) * (size_t)nb + (size_t)b) * 40;
            corr = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)a));
            d8 = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(((const float *)a)[8])));
          } else {
            corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), off2, xv));
            d8 = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(f16(x[t][b].d))));
          }
          QI_UNROLL for (int q = 0; q < 4; q++) {
            __m512i is = _mm512_dpbusd_epi32(corr, _mm512_load_si512(pb + 64 * q), xv);
            __m512 d = _mm512_permutexvar_ps(pair_idx(2 * q, 2 * q + 1), d8);
            acc[q][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(is), acc[q][t]);
          }
        }
      }
      for (int t = 0; t < tn; t++) {
        float *y = Y + (j0 + j + t) * ldy + r0;
        for (int q = 0; q < 4; q++) {
          if (2 * q < nr) y[2 * q] = hsum8(_mm512_castps512_ps256(acc[q][t]));
          if (2 * q + 1 < nr) y[2 * q + 1] = hsum8(_mm512_extractf32x8_ps(acc[q][t], 1));
        }
      }
    }
  }
}

// q6_K (vec_dot_q6_K_q8_K: 8 float lanes per row, one fma per block) on R16
// groups: one row per lane, so a row's 8 lanes are 8 registers. Lane l sums
// the elements 4l..4l+3 of every 32 (j 0..1, c 0..3) times their scales; the
// layout (quant_r16.c) stores its codes in the order read here. Tokens two at
// a time (tile_k16), the group's blocks staying in L2 across the pairs.
static inline __m512i q6k_r16_code3(__m512i A, __m512i B, __m512i C) {
  const __m512i m03 = _mm512_set1_epi8(0x03), m0c = _mm512_set1_epi8(0x0c);
  // bits 0-1 from A >> 6, 2-3 from B >> 4, 4-5 from C >> 2 (vpternlog bit selects)
  __m512i hi = _mm512_ternarylogic_epi32(m0c, _mm512_srli_epi32(B, 4), _mm512_srli_epi32(C, 2), 0xca);
  hi = _mm512_ternarylogic_epi32(m03, _mm512_srli_epi32(A, 6), hi, 0xca);
  return _mm512_and_si512(hi, _mm512_set1_epi8(0x3f));
}

// byte `at` of each dword, sign-extended, in its low 16 bits (high 16 zero):
// a vpmaddwd operand
static inline __m512i q6k_sc16(__m512i plane, int at) {
  const __m512i idx = _mm512_set1_epi32((int)(0x80800080u | (uint32_t)at << 8));
  return _mm512_srai_epi16(_mm512_shuffle_epi8(plane, _mm512_add_epi8(idx, _mm512_set4_epi32(12 << 8, 8 << 8, 4 << 8, 0))), 8);
}
// bytes `at`, at + 1 of each dword, sign-extended, as the two int16 halves
static inline __m512i q6k_pair16(__m512i plane, int at) {
  const __m512i idx = _mm512_set1_epi32((int)(0x00800080u | (uint32_t)at << 8 | (uint32_t)(at + 1) << 24));
  return _mm512_srai_epi16(_mm512_shuffle_epi8(plane, _mm512_add_epi8(idx, _mm512_set4_epi32(12 << 8 | 12 << 24, 8 << 8 | 8 << 24, 4 << 8 | 4 << 24, 0))), 8);
}

// T tokens (1 or 2) from jt against one group: the codes and scales of each
// sub-block are unpacked once for both (the per-token float steps are the
// same as one token's, so the bits are too).
static inline __attribute__((always_inline)) void q6k_r16_tokens(const int T, const uint8_t *grp, int64_t nb,
                                                                 const void *X, size_t xstride, int64_t jt, bool pf,
                                                                 int nr, float *Y, int64_t ldy, int64_t r0) {
  const size_t gbs = 16 * sizeof(blk_q6_K);
  const __m512i m6 = _mm512_set1_epi8(0x3f);
  const blk_q8_K *xb[2];
  for (int t = 0; t < T; t++) xb[t] = (const blk_q8_K *)((const char *)X + (size_t)(jt + t) * xstride);
  __m512 acc[2][8];
  for (int t = 0; t < T; t++)
    for (int l = 0; l < 8; l++) acc[t][l] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *gb = grp + (size_t)b * gbs;
    if (pf) prefetch_gb(gb, gbs);
    __m512i sp[4];
    for (int u = 0; u < 4; u++) sp[u] = _mm512_loadu_si512(gb + 32 + 64 * u);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    QI_UNROLL for (int h = 0; h < 2; h++) {  // lanes 4h..4h+3: scales 2c + h of each 16
      __m512i li[2][4];
      QI_UNROLL for (int t = 0; t < T; t++) QI_UNROLL for (int q = 0; q < 4; q++) li[t][q] = _mm512_setzero_si512();
      QI_UNROLL for (int j = 0; j < 2; j++) {
        __m512i sc[4];
        QI_UNROLL for (int c = 0; c < 4; c++) {
          const int sidx = 8 * j + 2 * c + h;
          sc[c] = q6k_sc16(sp[sidx / 4], sidx % 4);
        }
        QI_UNROLL for (int li4 = 0; li4 < 4; li4++) {
          const int l = 4 * h + li4;
          const uint8_t *cg = gb + 288 + 192 * (8 * h + 4 * j + li4);
          const __m512i A = _mm512_loadu_si512(cg), B = _mm512_loadu_si512(cg + 64), C = _mm512_loadu_si512(cg + 128);
          const __m512i R[4] = {_mm512_and_si512(A, m6), _mm512_and_si512(B, m6), _mm512_and_si512(C, m6),
                                q6k_r16_code3(A, B, C)};
          QI_UNROLL for (int t = 0; t < T; t++) {
            const int32_t *xq = (const int32_t *)xb[t][b].qs;
            QI_UNROLL for (int c = 0; c < 4; c++) {
              int32_t xd;
              memcpy(&xd, xq + 32 * j + 8 * c + l, 4);
              const __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), R[c], _mm512_set1_epi32(xd));
              li[t][li4] = _mm512_add_epi32(li[t][li4], _mm512_madd_epi16(is, sc[c]));
            }
          }
        }
      }
      QI_UNROLL for (int t = 0; t < T; t++) {
        const blk_q8_K *x = xb[t] + b;
        const __m512 d = _mm512_mul_ps(_mm512_set1_ps(x->d), dw);
        QI_UNROLL for (int li4 = 0; li4 < 4; li4++) {
          const int l = 4 * h + li4;
          const int32_t bp =
              (int32_t)((uint32_t)(uint16_t)x->bsums[2 * l] | (uint32_t)(uint16_t)x->bsums[2 * l + 1] << 16);
          const __m512i corr =
              _mm512_dpwssd_epi32(_mm512_setzero_si512(), q6k_pair16(sp[l / 2], 2 * (l % 2)), _mm512_set1_epi32(bp));
          const __m512i lane = _mm512_sub_epi32(li[t][li4], _mm512_slli_epi32(corr, 5));
          acc[t][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), acc[t][l]);
        }
      }
    }
  }
  for (int t = 0; t < T; t++) {  // hsum_float_8 per row, lane-wise
    const __m512 s0 = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][4]), _mm512_add_ps(acc[t][2], acc[t][6]));
    const __m512 s1 = _mm512_add_ps(_mm512_add_ps(acc[t][1], acc[t][5]), _mm512_add_ps(acc[t][3], acc[t][7]));
    _mm512_mask_storeu_ps(Y + (jt + t) * ldy + r0, tail16(nr), _mm512_add_ps(s0, s1));
  }
}

// One or two tokens from jt against one R16 group (q6_K, q5_K kernels below).
typedef void k16_tokens_fn(const uint8_t *grp, int64_t nb, const void *X, size_t xstride, int64_t jt, bool pf, int nr,
                           float *Y, int64_t ldy, int64_t r0);
#define K16_TOKENS(name, T)                                                                                        \
  static void name##_##T(const uint8_t *grp, int64_t nb, const void *X, size_t xstride, int64_t jt, bool pf, int nr, \
                         float *Y, int64_t ldy, int64_t r0) {                                                      \
    name(T, grp, nb, X, xstride, jt, pf, nr, Y, ldy, r0);                                                          \
  }
K16_TOKENS(q6k_r16_tokens, 1)
K16_TOKENS(q6k_r16_tokens, 2)

// The groups of [i0, i1), tokens two at a time (one for an odd last).
static void tile_k16(k16_tokens_fn *one, k16_tokens_fn *two, const void *W, size_t rb, const void *X, size_t xstride,
                     float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const int64_t nb = k / QK_K;
  for (int64_t r0 = i0; r0 < i1; r0 += 16) {
    const int nr = (int)MOLE_MIN(16, i1 - r0);
    const uint8_t *grp = (const uint8_t *)W + (size_t)r0 * rb;
    for (int64_t jt = j0; jt < j1; jt += 2) {
      const bool pf = jt == j0 && j1 - j0 >= QX_PF_TOK;
      (jt + 2 <= j1 ? two : one)(grp, nb, X, xstride, jt, pf, nr, Y, ldy, r0);
    }
  }
}

// q5_K (vec_dot_q5_K_q8_K order) from R16 groups, a row per lane, tokens two
// at a time (tile_k16; the group block stays in cache for the next pair). Per super-block:
// lane l (0..7) = sum over the 8 sub-blocks s of sc[s] * dot(codes 4l..4l+3
// of s, the token's bytes there), each code its low nibble (qs) and fifth
// bit (qh, bit s) put together; acc[l] += d * lane; the mins' sum
// sum_s mn[s] * bsum(s) goes into summs with dmin. Integer sums are exact in
// any order; the float steps are the reference's.
// T tokens (1 or 2) from jt against one group: each sub-block's codes and
// the block's scales are unpacked once for both (per-token float steps as
// one token's: the same bits).
static inline __attribute__((always_inline)) void q5k_r16_tokens(const int T, const uint8_t *grp, int64_t nb,
                                                                 const void *X, size_t xstride, int64_t jt, bool pf,
                                                                 int nr, float *Y, int64_t ldy, int64_t r0) {
  const size_t gbs = 16 * sizeof(blk_q5_K);
  const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
  const blk_q8_K *xb[2];
  for (int t = 0; t < T; t++) xb[t] = (const blk_q8_K *)((const char *)X + (size_t)(jt + t) * xstride);
  __m512 acc[2][8], summs[2];
  for (int t = 0; t < T; t++) {
    summs[t] = _mm512_setzero_ps();
    for (int l = 0; l < 8; l++) acc[t][l] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *gb = grp + (size_t)b * gbs;
    if (pf) prefetch_gb(gb, gbs);
    const q4k_scales S = k4_scales_r16(gb);
    __m512i sc[8];
    QI_UNROLL for (int s = 0; s < 8; s++) sc[s] = byte_of(s < 4 ? S.s_lo : S.s_hi, s % 4);
    __m512 d[2];
    QI_UNROLL for (int t = 0; t < T; t++) {
      const blk_q8_K *x = xb[t] + b;
      __m512i mins = _mm512_setzero_si512();
      QI_UNROLL for (int s = 0; s < 8; s++) {
        const int16_t bs = (int16_t)(x->bsums[2 * s] + x->bsums[2 * s + 1]);
        mins = _mm512_add_epi32(mins, _mm512_madd_epi16(byte_of(s < 4 ? S.m_lo : S.m_hi, s % 4), _mm512_set1_epi16(bs)));
      }
      d[t] = _mm512_mul_ps(_mm512_set1_ps(x->d), S.dw);
      const __m512 dmin = _mm512_mul_ps(_mm512_set1_ps(-x->d), S.dmw);
      summs[t] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(mins), summs[t]);
    }
    QI_UNROLL for (int l = 0; l < 8; l++) {
      const uint8_t *gl = gb + 256 + 320 * l;  // qh, then the 4 qs registers of lane l
      const __m512i H = _mm512_loadu_si512(gl);
      __m512i lane[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      QI_UNROLL for (int j = 0; j < 4; j++) {
        const __m512i Q = _mm512_loadu_si512(gl + 64 + 64 * j);
        QI_UNROLL for (int h = 0; h < 2; h++) {
          const int s = 2 * j + h;
          const __m512i lo = _mm512_and_si512(h ? _mm512_srli_epi32(Q, 4) : Q, m4);
          const __m512i hi = _mm512_and_si512(s <= 4 ? _mm512_slli_epi32(H, 4 - s) : _mm512_srli_epi32(H, s - 4), b4);
          const __m512i code = _mm512_or_si512(lo, hi);
          QI_UNROLL for (int t = 0; t < T; t++) {
            int32_t xd;
            memcpy(&xd, (const int32_t *)xb[t][b].qs + 8 * s + l, 4);
            const __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), code, _mm512_set1_epi32(xd));
            lane[t] = _mm512_add_epi32(lane[t], _mm512_madd_epi16(is, sc[s]));
          }
        }
      }
      QI_UNROLL for (int t = 0; t < T; t++) acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(lane[t]), acc[t][l]);
    }
  }
  for (int t = 0; t < T; t++) {  // hsum_float_8 per row, lane-wise, then the mins
    const __m512 s0 = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][4]), _mm512_add_ps(acc[t][2], acc[t][6]));
    const __m512 s1 = _mm512_add_ps(_mm512_add_ps(acc[t][1], acc[t][5]), _mm512_add_ps(acc[t][3], acc[t][7]));
    _mm512_mask_storeu_ps(Y + (jt + t) * ldy + r0, tail16(nr), _mm512_add_ps(_mm512_add_ps(s0, s1), summs[t]));
  }
}

K16_TOKENS(q5k_r16_tokens, 1)
K16_TOKENS(q5k_r16_tokens, 2)

// tinyBLAS orders: 4 rows x 4 tokens of 16-lane accumulators
static void tile_tiny(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                      int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  const int KN = o == QX_BF16_T32 ? 32 : 16;
  for (int64_t r0 = i0; r0 < i1; r0 += 4) {
    const int nr = (int)MOLE_MIN(4, i1 - r0);
    const char *wr[4];
    for (int r = 0; r < 4; r++) wr[r] = (const char *)W + (size_t)(r0 + MOLE_MIN(r, nr - 1)) * wstride;
    for (int64_t j = j0; j < j1; j += 4) {
      const int tn = (int)MOLE_MIN(4, j1 - j);
      const char *xr[4];
      for (int t = 0; t < 4; t++) xr[t] = (const char *)X + (size_t)(j + MOLE_MIN(t, tn - 1)) * xstride;
      __m512 acc[4][4];
      for (int r = 0; r < 4; r++)
        for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
      for (int64_t c = 0; c < k; c += KN) {
        if (o == QX_BF16_T32) {
          __m512i a[4], bx[4];
          for (int r = 0; r < 4; r++) a[r] = _mm512_loadu_si512((const uint16_t *)wr[r] + c);
          for (int t = 0; t < 4; t++) bx[t] = _mm512_loadu_si512((const uint16_t *)xr[t] + c);
          QI_UNROLL for (int r = 0; r < 4; r++) QI_UNROLL for (int t = 0; t < 4; t++)
            acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)a[r], (__m512bh)bx[t]);
        } else {
          const bool h = o == QX_F16_T16;
          __m512 a[4], bx[4];
          for (int r = 0; r < 4; r++)
            a[r] = h ? ld_h((const uint16_t *)wr[r] + c) : _mm512_loadu_ps((const float *)wr[r] + c);
          for (int t = 0; t < 4; t++)
            bx[t] = h ? ld_h((const uint16_t *)xr[t] + c) : _mm512_loadu_ps((const float *)xr[t] + c);
          QI_UNROLL for (int r = 0; r < 4; r++) QI_UNROLL for (int t = 0; t < 4; t++)
            acc[r][t] = _mm512_fmadd_ps(a[r], bx[t], acc[r][t]);
        }
      }
      for (int t = 0; t < tn; t++)
        for (int r = 0; r < nr; r++) Y[(j + t) * ldy + r0 + r] = hs16(acc[r][t]);
    }
  }
}

void quant_exact_tile_avx512(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                             int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k) {
  if (i0 >= i1 || j0 >= j1) return;
  switch (o) {
    case QX_Q4_0_C1: tile_q4_0_c1(false, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q4_K_V256: tile_q4k_repack(false, false, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q4_K_V64: tile_q4k_repack(false, true, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q8_0: tile_l8(false, false, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q4_0_L8: tile_l8(false, true, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_F32_T16: case QX_F16_T16: case QX_BF16_T32:
      tile_tiny(o, W, wstride, X, xstride, Y, ldy, i0, i1, j0, j1, k);
      return;
    case QX_Q4_K_K8: case QX_Q5_K_K8: case QX_Q6_K_K8:
      for (int64_t j = j0; j < j1; j++) {
        const void *x = (const char *)X + (size_t)j * xstride;
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4) {
          const uint8_t *w[4];
          for (int r = 0; r < 4; r++) w[r] = (const uint8_t *)W + (size_t)(i + r) * wstride;
          if (o == QX_Q6_K_K8)
            q6k_rows(4, k, w, x, &Y[j * ldy + i]);
          else if (o == QX_Q5_K_K8)
            k8_rows(true, 4, k, w, x, &Y[j * ldy + i]);
          else
            k8_rows(false, 4, k, w, x, &Y[j * ldy + i]);
        }
        for (; i < i1; i++) quant_exact_dot_avx512(o, k, &Y[j * ldy + i], (const char *)W + (size_t)i * wstride, x);
      }
      return;
    default:
      for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++)
          quant_exact_dot_avx512(o, k, &Y[j * ldy + i], (const char *)W + (size_t)i * wstride,
                                 (const char *)X + (size_t)j * xstride);
  }
}

void quant_exact_tile_r16_avx512(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X,
                                 size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                                 int64_t k) {
  MOLE_ASSERT(i0 % 16 == 0 && i1 <= n_rows / 16 * 16);
  if (i0 >= i1 || j0 >= j1) return;
  const size_t rb = quant_row_size(t, k);
  switch (o) {
    case QX_Q4_0_C1: tile_q4_0_c1(true, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q4_K_V256: tile_q4k_repack(true, false, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q4_K_V64: tile_q4k_repack(true, true, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q8_0: tile_l8(true, false, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q6_K_K8: tile_k16(q6k_r16_tokens_1, q6k_r16_tokens_2, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    case QX_Q5_K_K8: tile_k16(q5k_r16_tokens_1, q5k_r16_tokens_2, W, rb, X, xstride, Y, ldy, i0, i1, j0, j1, k); return;
    default: MOLE_ASSERT(!"quant_exact_tile_r16_avx512: no R16 kernel for this order");
  }
}
