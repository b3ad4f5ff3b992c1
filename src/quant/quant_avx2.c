// quant_avx2: AVX2 + FMA + F16C kernels (for CPUs without AVX-512 VNNI):
// vec_dot of the weight types without llama.cpp orders (quant_exact_avx2.c
// has the others), the activation quantizers and f16/bf16 row conversions.
// Twins of the `_ref` kernels in quant_ref.c.
//
// Integer dots use maddubs (unsigned x signed bytes -> int16 pairs) and madd
// (int16 pairs -> int32); signed codes go through the sign trick
// (|x| * sign(y, x)). One block (32 elements) per 256-bit register.
#include "quant/quant_avx2.h"

// bit j of qh (32 bits) as 0x10 in byte j
static inline __m256i q5_high(const uint8_t *qh) {
  uint32_t h;
  memcpy(&h, qh, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(16));
}

// ---- float types -------------------------------------------------------------------

static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 ld_bf16(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

void quant_to_float_f16_avx2(const void *restrict vx, float *restrict y, int64_t n) {
  const uint16_t *x = vx;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ld_f16(x + i));
  for (; i < n; i++) y[i] = f16(x[i]);
}

void quant_from_float_f16_avx2(const float *restrict x, void *restrict vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void quant_to_float_bf16_avx2(const void *restrict vx, float *restrict y, int64_t n) {
  const uint16_t *x = vx;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ld_bf16(x + i));
  for (; i < n; i++) y[i] = quant_bf16_to_f32(x[i]);
}

void quant_from_float_bf16_avx2(const float *restrict x, void *restrict vy, int64_t n) {
  uint16_t *y = vy;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    __m256i r = _mm256_add_epi32(
        u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    // NaN (|u| > inf as signed compare; |u| < 2^31) stays quiet
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64)), nan);
    __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)(y + i), p);
  }
  for (; i < n; i++) y[i] = quant_f32_to_bf16(x[i]);
}

// ---- activation quantizers --------------------------------------------------------------

static inline float absmax8(__m256 m) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256 vabs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// 32 int32 (4 registers) -> 32 int8 in order
static inline __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline int quant32(const float *x, int8_t *qs, uint16_t *d16, float *df) {
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    m = _mm256_max_ps(m, vabs(v[k]));
  }
  float amax = absmax8(m);
  float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.0f;
  *d16 = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
  *df = d;
  __m256i q[4];
  for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
  _mm256_storeu_si256((__m256i *)qs, pack32(q[0], q[1], q[2], q[3]));
  return hsum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

void quant_from_float_q8_0_avx2(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_0 *y = vy;
  float d;
  for (int64_t b = 0; b < n / 32; b++) quant32(x + 32 * b, y[b].qs, &y[b].d, &d);
}

void quant_from_float_q8_1_avx2(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_1 *y = vy;
  for (int64_t b = 0; b < n / 32; b++) {
    qi_prefetch(&x[b], sizeof *x);
    float d;
    int sum = quant32(x + 32 * b, y[b].qs, &y[b].d, &d);
    y[b].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
  }
}

void quant_from_float_q8_K_avx2(const float *restrict x, void *restrict vy, int64_t n) {
  blk_q8_K *y = vy;
  for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; k++) m = _mm256_max_ps(m, vabs(_mm256_loadu_ps(x + 8 * k)));
    float amax = absmax8(m);
    if (amax == 0) {
      memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    float mx = 0;
    for (int k = 0; k < 32; k++) {
      int msk = _mm256_movemask_ps(_mm256_cmp_ps(vabs(_mm256_loadu_ps(x + 8 * k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (msk) {
        mx = x[8 * k + __builtin_ctz((unsigned)msk)];
        break;
      }
    }
    float iscale = -127.f / mx;
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i k127 = _mm256_set1_epi32(127);
    for (int k = 0; k < 8; k++) {
      __m256i q[4];
      for (int u = 0; u < 4; u++)
        q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * u), vs)), k127);
      _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * k), pack32(q[0], q[1], q[2], q[3]));
      y[b].bsums[2 * k] = (int16_t)hsum8i(_mm256_add_epi32(q[0], q[1]));
      y[b].bsums[2 * k + 1] = (int16_t)hsum8i(_mm256_add_epi32(q[2], q[3]));
    }
    y[b].d = 1 / iscale;
  }
}

// ---- 32-element block types ----------------------------------------------------------------

void quant_vec_dot_q4_1_avx2(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q4_1 *x = vx;
  const blk_q8_1 *y = vy;
  __m256 acc = _mm256_setzero_ps();
  float sm = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m256i si = dot_us(nibbles(x[b].qs), _mm256_loadu_si256((const __m256i *)y[b].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(f16(x[b].d) * f16(y[b].d)), acc);
    sm += f16(x[b].m) * f16(y[b].s);
  }
  *s = hsum8(acc) + sm;
}

void quant_vec_dot_q5_0_avx2(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_0 *x = vx;
  const blk_q8_0 *y = vy;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles(x[b].qs), q5_high(x[b].qh)), _mm256_set1_epi8(16));
    __m256i si = dot_ss(q, _mm256_loadu_si256((const __m256i *)y[b].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(f16(x[b].d) * f16(y[b].d)), acc);
  }
  *s = hsum8(acc);
}

void quant_vec_dot_q5_1_avx2(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q5_1 *x = vx;
  const blk_q8_1 *y = vy;
  __m256 acc = _mm256_setzero_ps();
  float sm = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m256i q = _mm256_or_si256(nibbles(x[b].qs), q5_high(x[b].qh));
    __m256i si = dot_us(q, _mm256_loadu_si256((const __m256i *)y[b].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(f16(x[b].d) * f16(y[b].d)), acc);
    sm += f16(x[b].m) * f16(y[b].s);
  }
  *s = hsum8(acc) + sm;
}

// ---- K-quants ---------------------------------------------------------------------------------
// 32 codes (unsigned) x 32 activations, int16 pair sums times the int16 scales
// of the two 16-groups (low 128-bit lane, high lane) -> int32.

static inline __m256i dot_sc(__m256i q, const int8_t *y, int s_lo, int s_hi) {
  __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)y));
  return _mm256_madd_epi16(p, _mm256_set_m128i(_mm_set1_epi16((short)s_hi), _mm_set1_epi16((short)s_lo)));
}

static inline float finish_k(__m256 acc, __m256 accm) { return hsum8(acc) - hsum8(accm); }

// sum over groups of scale * bsum (16 groups, int16 scales)
static inline __m256i scale_bsums(__m256i sc16, const blk_q8_K *y) {
  return _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums));
}

void quant_vec_dot_q2_K_avx2(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q2_K *x = vx;
  const blk_q8_K *y = vy;
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  for (int64_t b = 0; b < n / QK_K; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
    __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
    __m256i si = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i qs = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
      for (int j = 0; j < 4; j++) {
        int g = 8 * h + 2 * j;
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3);
        si = _mm256_add_epi32(si, dot_sc(q, y[b].qs + 128 * h + 32 * j, x[b].scales[g] & 15, x[b].scales[g + 1] & 15));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(y[b].d * f16(x[b].d)), acc);
    accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scale_bsums(mn16, &y[b])), _mm256_set1_ps(y[b].d * f16(x[b].dmin)), accm);
  }
  *s = finish_k(acc, accm);
}

void quant_vec_dot_q3_K_avx2(int64_t n, float *restrict s, const void *restrict vx, const void *restrict vy) {
  const blk_q3_K *x = vx;
  const blk_q8_K *y = vy;
  const __m256i m3 = _mm256_set1_epi8(3), k4 = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / QK_K; b++) {
    qi_prefetch(&x[b], sizeof *x);
    __m128i sv = q3k_scales(x[b].scales);
    uint8_t s8[16];
    _mm_storeu_si128((__m128i *)s8, sv);
    __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(sv), _mm256_set1_epi16(32));
    __m256i si = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(scale_bsums(sc16, &y[b]), 2));
    __m256i hm = _mm256_loadu_si256((const __m256i *)x[b].hmask);
    for (int h = 0; h < 2; h++) {
      __m256i qs = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
      for (int j = 0; j < 4; j++) {
        int g = 8 * h + 2 * j;
        __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3);
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), k4));
        si = _mm256_add_epi32(si, dot_sc(q, y[b].qs + 128 * h + 32 * j, s8[g] - 32, s8[g + 1] - 32));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(y[b].d * f16(x[b].d)), acc);
  }
  *s = hsum8(acc);
}
