// AVX-512 twins of the element-wise ops (scalar references in ops.c).
#include <immintrin.h>
#include <math.h>

#include "model/ops.h"

static inline __m512 expf_poly(__m512 x) {
  const __m512 shift = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
  const __m512 n = _mm512_sub_ps(z, shift);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
  const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
  const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, u, lo), u,
                                   _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 r = _mm512_scalef_ps(p, n);
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
  if (!big) return r;
  const __mmask16 neg = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512 sat = _mm512_mask_blend_ps(neg, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, r, sat);
}

void ops_swiglu_avx512(float *y, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = expf_poly(_mm512_sub_ps(_mm512_setzero_ps(), x));
    const __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
  }
  for (; i < n; i++) y[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

void ops_axpy_avx512(float *restrict o, const float *restrict v, float w, int64_t n) {
  const __m512 wv = _mm512_set1_ps(w);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(o + i), _mm512_mul_ps(wv, _mm512_loadu_ps(v + i))));
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(o + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, o + i),
                                                  _mm512_mul_ps(wv, _mm512_maskz_loadu_ps(k, v + i))));
  }
}

void ops_pv_avx512(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d) {
  for (int64_t c = 0; c < d; c += 64) {  // 4 registers of o at a time, each i's product added in turn
    const int64_t w = d - c < 64 ? d - c : 64;
    __mmask16 k[4];
    __m512 a[4];
    for (int r = 0; r < 4; r++) {
      const int64_t left = w - 16 * r;
      k[r] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
      a[r] = _mm512_maskz_loadu_ps(k[r], o + c + 16 * r);
    }
    for (int64_t i = 0; i < n; i++) {
      const __m512 pi = _mm512_set1_ps(p[i]);
      const float *v = V + i * d + c;
      for (int r = 0; r < 4; r++)
        a[r] = _mm512_add_ps(a[r], _mm512_mul_ps(pi, _mm512_maskz_loadu_ps(k[r], v + 16 * r)));
    }
    for (int r = 0; r < 4; r++) _mm512_mask_storeu_ps(o + c + 16 * r, k[r], a[r]);
  }
}
