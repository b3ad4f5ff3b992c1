// quant_avx512: AVX-512 F/BW/VL/DQ + VNNI + BF16 kernels: vec_dot of the
// weight types without llama.cpp orders (quant_exact_avx512.c has the
// others), the activation quantizers (q8_0, q8_1, q8_K) and f16/bf16 row
// conversions. Twins of the `_ref` kernels in quant_ref.c.
//
// 32-element block types run four blocks per step in "lane layout": 128-bit
// lane i of a register holds 16 bytes of block i, so one VNNI dpbusd of the
// low nibbles against the activations' first halves and one of the high
// nibbles against the second halves leaves block i's dot in lane i.
// Unsigned codes (0..15, 0..31) go in dpbusd's unsigned operand; the offset
// (q5_0: 16) comes back as offset * sum(y).
#include "quant/quant_avx512.h"

// ---- float types ------------------------------------------------------------------

static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

void quant_to_float_f16_avx512(const void *restrict vx, float *restrict y, int64_t n) {
  const uint16_t *x = vx;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, ld_f16(x + i));
  if (i < n) {
    __mmask16 m = tail16(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
  }
}

void quant_from_float_f16_avx512(const float *restrict x, void *restrict vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 m = tail16(n - i);
    _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

static inline __m512 bf16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void quant_to_float_bf16_avx512(const void *restrict vx, float *restrict y, int64_t n) {
  const uint16_t *x = vx;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, bf16_to_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
  if (i < n) {
    __mmask16 m = tail16(n - i);
    _mm512_mask_storeu_ps(y + i, m, bf16_to_ps(_mm256_maskz_loadu_epi16(m, x + i)));
  }
}

// round to nearest even like quant_f32_to_bf16; NaN stays quiet
static inline __m256i ps_to_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  r = _mm512_srli_epi32(r, 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64)));
  return _mm512_cvtepi32_epi16(r);
}

void quant_from_float_bf16_avx512(const float *restrict x, void *restrict vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), ps_to_bf16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 m = tail16(n - i);
    _mm256_mask_storeu_epi16(y + i, m, ps_to_bf16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// ---- activation quantizers -----------------------------------------------------------

static inline __m512i round_i32(__m512 v) {
  return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// One 32-block: codes to qs, returns sum of codes; *d16, *df get the scale.
static inline int quant32(const float *x, int8_t *qs, uint16_t *d16, float *df) {
  __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.0f;
  *d16 = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
  *df = d;
  __m512 vid = _mm512_set1_ps(id);
  __m512i i0 = round_i32(_mm512_mul_ps(v0, vid)), i1 = round_i32(_mm512_mul_ps(v1, vid));
  _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(i1));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

void quant_from_float_q8_0_avx512(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_0 *y = vy;
  float d;
  for (int64_t b = 0; b < n / 32; b++) quant32(x + b * 32, y[b].qs, &y[b].d, &d);
}

void quant_from_float_q8_1_avx512(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_1 *y = vy;
  for (int64_t b = 0; b < n / 32; b++) {
    float d;
    int sum = quant32(x + b * 32, y[b].qs, &y[b].d, &d);
    y[b].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
  }
}

void quant_from_float_q8_K_avx512(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_K *y = vy;
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    __m512 am = _mm512_setzero_ps();
    for (int k = 0; k < 16; k++) am = _mm512_max_ps(am, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)));
    float amax = _mm512_reduce_max_ps(am);
    if (amax == 0) {
      memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    float mx = 0;  // the first element of largest magnitude, with its sign
    for (int k = 0; k < 16; k++) {
      __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (m) {
        mx = x[16 * k + __builtin_ctz(m)];
        break;
      }
    }
    float iscale = -127.f / mx;
    __m512 vs = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; k++) {
      __m512i q = _mm512_min_epi32(round_i32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), vs)), _mm512_set1_epi32(127));
      _mm_storeu_si128((__m128i *)(y[b].qs + 16 * k), _mm512_cvtsepi32_epi8(q));
      y[b].bsums[k] = (int16_t)_mm512_reduce_add_epi32(q);
    }
    y[b].d = 1 / iscale;
  }
}

// ---- 32-element block types x q8_0 / q8_1 ----------------------------------------------

void quant_vec_dot_q5_0_avx512(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_0 *x = vx;
  const blk_q8_0 *y = vy;
  const int64_t nb = n / 32;
  const __m512i m4 = _mm512_set1_epi8(15), k16 = _mm512_set1_epi8(16);
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    qi_prefetch(&x[b], 4 * sizeof *x);
    __m512i q = load4x128(x[b].qs, sizeof(blk_q5_0)), ya, yb;
    load4x256(y[b].qs, sizeof(blk_q8_0), &ya, &yb);
    __mmask64 mlo, mhi;
    q5_masks(x[b].qh, sizeof(blk_q5_0), &mlo, &mhi);
    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    lo = _mm512_mask_add_epi8(lo, mlo, lo, k16);
    hi = _mm512_mask_add_epi8(hi, mhi, hi, k16);
    __m512i si = _mm512_sub_epi32(dot2(lo, ya, hi, yb), dot2(k16, ya, k16, yb));
    __m512 d = _mm512_mul_ps(f16x4(&x[b].d, sizeof(blk_q5_0)), f16x4(&y[b].d, sizeof(blk_q8_0)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), d, acc);
  }
  float sum = _mm512_reduce_add_ps(acc), t = 0;
  if (b < nb) quant_vec_dot_q5_0_ref((nb - b) * 32, &t, x + b, y + b);
  *s = sum + t;
}

void quant_vec_dot_q4_1_avx512(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q4_1 *x = vx;
  const blk_q8_1 *y = vy;
  const int64_t nb = n / 32;
  const __m512i m4 = _mm512_set1_epi8(15);
  __m512 acc = _mm512_setzero_ps(), accm = acc;
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    qi_prefetch(&x[b], 4 * sizeof *x);
    __m512i q = load4x128(x[b].qs, sizeof(blk_q4_1)), ya, yb;
    load4x256(y[b].qs, sizeof(blk_q8_1), &ya, &yb);
    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    __m512 d = _mm512_mul_ps(f16x4(&x[b].d, sizeof(blk_q4_1)), f16x4(&y[b].d, sizeof(blk_q8_1)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2(lo, ya, hi, yb)), d, acc);
    accm = _mm512_fmadd_ps(f16x4(&x[b].m, sizeof(blk_q4_1)), f16x4(&y[b].s, sizeof(blk_q8_1)), accm);
  }
  // each m*s product sits in 4 lanes
  float sum = _mm512_reduce_add_ps(acc) + 0.25f * _mm512_reduce_add_ps(accm), t = 0;
  if (b < nb) quant_vec_dot_q4_1_ref((nb - b) * 32, &t, x + b, y + b);
  *s = sum + t;
}

void quant_vec_dot_q5_1_avx512(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_1 *x = vx;
  const blk_q8_1 *y = vy;
  const int64_t nb = n / 32;
  const __m512i m4 = _mm512_set1_epi8(15), k16 = _mm512_set1_epi8(16);
  __m512 acc = _mm512_setzero_ps(), accm = acc;
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    qi_prefetch(&x[b], 4 * sizeof *x);
    __m512i q = load4x128(x[b].qs, sizeof(blk_q5_1)), ya, yb;
    load4x256(y[b].qs, sizeof(blk_q8_1), &ya, &yb);
    __mmask64 mlo, mhi;
    q5_masks(x[b].qh, sizeof(blk_q5_1), &mlo, &mhi);
    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    lo = _mm512_mask_add_epi8(lo, mlo, lo, k16);
    hi = _mm512_mask_add_epi8(hi, mhi, hi, k16);
    __m512 d = _mm512_mul_ps(f16x4(&x[b].d, sizeof(blk_q5_1)), f16x4(&y[b].d, sizeof(blk_q8_1)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2(lo, ya, hi, yb)), d, acc);
    accm = _mm512_fmadd_ps(f16x4(&x[b].m, sizeof(blk_q5_1)), f16x4(&y[b].s, sizeof(blk_q8_1)), accm);
  }
  float sum = _mm512_reduce_add_ps(acc) + 0.25f * _mm512_reduce_add_ps(accm), t = 0;
  if (b < nb) quant_vec_dot_q5_1_ref((nb - b) * 32, &t, x + b, y + b);
  *s = sum + t;
}

// ---- K-quants x q8_K --------------------------------------------------------------------
// Codes are unsigned bytes in the natural element order; maddubs against the
// activations gives int16 pair sums, and dpwssd multiplies those by the int16
// group scales into int32, so a super-block needs one float conversion.

// Index tables for spread(): 32 int16 lanes, lanes 8L..8L+7 (128-bit lane
// L) take word g[L] of the source.
#define R8(x) x, x, x, x, x, x, x, x
#define SP4(a, b, c, d) {R8(a), R8(b), R8(c), R8(d)}
static const int16_t k_sp_k2[4][32] = {SP4(0, 1, 8, 9), SP4(2, 3, 10, 11), SP4(4, 5, 12, 13), SP4(6, 7, 14, 15)};
#undef SP4
#undef R8

static inline __m512i spread(__m512i src, const int16_t idx[32]) {
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), src);
}

static inline __m512i dot_sc(__m512i acc, __m512i q, __m512i y, __m512i sc) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, y), sc);
}

static inline __m512i ld2x256(const void *a, const void *b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                            _mm256_loadu_si256((const __m256i *)b), 1);
}

// offset * sum over groups of scale * bsum, as int32 lanes in the low half
static inline __m512i group_offset(__m256i sc16, const blk_q8_K *y, int shift) {
  __m256i c = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums));
  return _mm512_zextsi256_si512(_mm256_slli_epi32(c, shift));
}

// q2_K and q3_K: codes (qs >> 2j) & 3 of both 128-halves in one register
// (bytes 0..31: elements 32j.., bytes 32..63: 128+32j..); group scales sc16.
static inline __m512i k2_dot(__m512i acc, const __m512i q[4], const blk_q8_K *y, __m512i sc) {
  QI_UNROLL for (int j = 0; j < 4; j++) {
    __m512i yv = ld2x256(y->qs + 32 * j, y->qs + 128 + 32 * j);
    acc = dot_sc(acc, q[j], yv, spread(sc, k_sp_k2[j]));
  }
  return acc;
}

void quant_vec_dot_q2_K_avx512(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q2_K *x = vx;
  const blk_q8_K *y = vy;
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(15);
  __m512 acc = _mm512_setzero_ps();
  __m256 accm = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / QK_K; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
    __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
    __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    __m512i qs = _mm512_loadu_si512(x[b].qs), q[4];
    QI_UNROLL for (int j = 0; j < 4; j++) q[j] = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), m3);
    __m512i si = k2_dot(_mm512_setzero_si512(), q, &y[b], _mm512_castsi256_si512(sc16));
    __m256i mins = _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)y[b].bsums));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(y[b].d * f16(x[b].d)), acc);
    accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(y[b].d * f16(x[b].dmin)), accm);
  }
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  *s = _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

void quant_vec_dot_q3_K_avx512(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q3_K *x = vx;
  const blk_q8_K *y = vy;
  const __m512i m3 = _mm512_set1_epi8(3), k4 = _mm512_set1_epi8(4);
  const __m512i hb[4] = {bytes2(0x01, 0x10), bytes2(0x02, 0x20), bytes2(0x04, 0x40), bytes2(0x08, 0x80)};
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / QK_K; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales(x[b].scales)), _mm256_set1_epi16(32));
    __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[b].hmask));
    __m512i qs = _mm512_loadu_si512(x[b].qs), q[4];
    QI_UNROLL for (int j = 0; j < 4; j++) {
      q[j] = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), m3);
      q[j] = _mm512_mask_add_epi8(q[j], _mm512_test_epi8_mask(hm, hb[j]), q[j], k4);  // code + 4, 0..7
    }
    __m512i si = _mm512_sub_epi32(_mm512_setzero_si512(), group_offset(sc16, &y[b], 2));
    si = k2_dot(si, q, &y[b], _mm512_castsi256_si512(sc16));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(y[b].d * f16(x[b].d)), acc);
  }
  *s = _mm512_reduce_add_ps(acc);
}
