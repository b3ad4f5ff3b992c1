// quant_tq_avx512: the TQ1 and TQ2 kernels of quant_tq.h with AVX-512 BW +
// VNNI. Bit-exact twins of quant_tq1_gemm_ref / quant_tq2_gemm_ref: the same
// int16 activations (tq_quantize_x), an exact integer sum per row, and the
// same float formula (tq_out).
//
// TQ1. Each token's x16 is split into two byte planes, x16 = 128*H + L with
// H = x16 >> 7 (signed, -128..127) and L = x16 & 127, and a code stands for
// the byte vector u_j = t_j + 1 over its run, 0 past its end (unsigned, VNNI's
// first operand; two mask moves from the book's `um` masks). A code at weight
// p adds dpbusd(u, H[p..p+64)) and dpbusd(u, L[p..p+64)): the codes of a row
// tile it, so the sums come to sum t*x16 + sum x16 over the row, and the row
// sum of x16 (per token) comes off at the end. The planes have 64 zero bytes
// past k, so a window may run past the row.
//
// One token: per code two mask moves and two unaligned windows into dpbusd,
// four codes a step (their positions are prefix sums of the lengths, off the
// critical path) while the step surely stays in the row, then one code at a
// time to the row's end. A narrow book (runs of at most 32 weights) takes
// 256-bit windows: one 64-bit load gives both masks, and a 256-bit window
// crosses a cache line half as often; on Zen 4 that is 5.2 cycles a code where
// 512-bit windows take 7.5 (quant_bench tq). A book of runs of at most 30
// weights (as mole compress makes them) has the packed table: one 64-bit
// entry gives the code's u (vpmultishiftqb, VBMI) and its length, so the
// length table is not read, and the next step's codes are read a step ahead:
// 4.1-4.4 cycles a code. Several tokens: a block of 16 rows is first
// unpacked into dense u rows (a 64-byte store per code at its position; later
// codes overwrite the zeros past the earlier ones' ends), then every token
// takes aligned dot products with them, k in chunks whose planes stay in L1:
// each code is decoded once for all the tokens (a narrow book's code stores
// 32 bytes).
#include "quant/quant_avx512.h"
#include "quant/quant_tq_internal.h"

// Sum of the 16 int32 lanes in int64.
static inline int64_t reduce64(__m512i v) {
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),
                                                  _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1))));
}

// ---- TQ1 ---------------------------------------------------------------------------------

// Whether this CPU has AVX-512 VBMI (tq1_row_1p's vpmultishiftqb): Zen 4 and
// Ice Lake on do; Cooper Lake, which has the rest of this file's set, does not.
static bool tq1_vbmi(void) { return __builtin_cpu_supports("avx512vbmi"); }

enum { TQ1_BLOCK = 16, TQ1_TOK = 4, TQ1_L1_PLANES = 8192 };

// The byte planes of one token's x16 (lp bytes each, zero from k on);
// returns sum x16.
static int64_t tq1_planes(const int16_t *x16, int64_t k, int64_t lp, int8_t *H, int8_t *L) {
  const __m512i one = _mm512_set1_epi16(1), low = _mm512_set1_epi16(127);
  __m512i s = _mm512_setzero_si512();
  int64_t j = 0;
  for (; j < k; j += 32) {  // x16 is zero from k to k + 64
    const __m512i v = _mm512_loadu_si512(x16 + j);
    s = _mm512_dpwssd_epi32(s, v, one);
    _mm256_store_si256((__m256i *)(H + j), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 7)));
    _mm256_store_si256((__m256i *)(L + j), _mm512_cvtepi16_epi8(_mm512_and_si512(v, low)));
  }
  memset(H + j, 0, (size_t)(lp - j));
  memset(L + j, 0, (size_t)(lp - j));
  return reduce64(s);
}

// 128 * sum(h) + sum(l) in int64 (a lane of h may hold up to 256*k: all of a
// row's one-pair codes land in lane 0).
static inline int64_t tq1_sum(__m512i h, __m512i l) {
  const __m512i h64 = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(h)),
                                       _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(h, 1)));
  const __m512i l64 = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(l)),
                                       _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(l, 1)));
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_slli_epi64(h64, 7), l64));
}

// u of a code: 1 where the run's weight is 0, 2 where +1, else 0.
static inline __m512i tq1_u(const uint64_t *um, uint32_t code) {
  const __mmask64 z = _cvtu64_mask64(um[2 * (size_t)code]), p = _cvtu64_mask64(um[2 * (size_t)code + 1]);
  return _mm512_mask_mov_epi8(_mm512_maskz_mov_epi8(z, _mm512_set1_epi8(1)), p, _mm512_set1_epi8(2));
}

// Four codes from index c as one word (the caller checks c + 4 <= n_codes).
static inline uint64_t tq1_codes4(const uint8_t *codes, uint64_t c) {
  uint64_t q;
  memcpy(&q, codes + 2 * c, 8);
  return q;
}

// One token, one row from code *cp: returns sum u*x16 over the row and moves
// *cp past the row's codes.
static int64_t tq1_row_1(const tq_book *b, const uint8_t *codes, uint64_t *cp, uint64_t n_codes, const int8_t *H,
                         const int8_t *L, int64_t k) {
  const uint8_t *len = b->len;
  const uint64_t *um = b->um;
  __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0, h2 = h0, h3 = h0, l2 = h0, l3 = h0;
  uint64_t c = *cp;
  int64_t p = 0;
  while (c + 4 <= n_codes) {
    const uint64_t q = tq1_codes4(codes, c);
    const uint32_t c0 = q & 0xffff, c1 = q >> 16 & 0xffff, c2 = q >> 32 & 0xffff, c3 = q >> 48;
    const int64_t L1 = len[c0], L2 = L1 + len[c1], L3 = L2 + len[c2], L4 = L3 + len[c3];
    if (p + L3 >= k) break;  // code 3 may start the next row
    const __m512i u0 = tq1_u(um, c0), u1 = tq1_u(um, c1), u2 = tq1_u(um, c2), u3 = tq1_u(um, c3);
    h0 = _mm512_dpbusd_epi32(h0, u0, _mm512_loadu_si512(H + p));
    l0 = _mm512_dpbusd_epi32(l0, u0, _mm512_loadu_si512(L + p));
    h1 = _mm512_dpbusd_epi32(h1, u1, _mm512_loadu_si512(H + p + L1));
    l1 = _mm512_dpbusd_epi32(l1, u1, _mm512_loadu_si512(L + p + L1));
    h2 = _mm512_dpbusd_epi32(h2, u2, _mm512_loadu_si512(H + p + L2));
    l2 = _mm512_dpbusd_epi32(l2, u2, _mm512_loadu_si512(L + p + L2));
    h3 = _mm512_dpbusd_epi32(h3, u3, _mm512_loadu_si512(H + p + L3));
    l3 = _mm512_dpbusd_epi32(l3, u3, _mm512_loadu_si512(L + p + L3));
    p += L4;
    c += 4;
  }
  for (; p < k; c++) {
    const uint32_t code = rd_u16(codes + 2 * c);
    const __m512i u = tq1_u(um, code);
    h0 = _mm512_dpbusd_epi32(h0, u, _mm512_loadu_si512(H + p));
    l0 = _mm512_dpbusd_epi32(l0, u, _mm512_loadu_si512(L + p));
    p += len[code];
  }
  *cp = c;
  return tq1_sum(_mm512_add_epi32(_mm512_add_epi32(h0, h1), _mm512_add_epi32(h2, h3)),
                 _mm512_add_epi32(_mm512_add_epi32(l0, l1), _mm512_add_epi32(l2, l3)));
}

// u of a narrow book's code (32 weights): one 64-bit load holds both masks.
static inline __m256i tq1_u32(const uint64_t *um32, uint32_t code) {
  const __mmask64 m = _cvtu64_mask64(um32[code]);
  return _mm256_mask_mov_epi8(_mm256_maskz_mov_epi8((__mmask32)m, _mm256_set1_epi8(1)),
                              (__mmask32)_kshiftri_mask64(m, 32), _mm256_set1_epi8(2));
}

// tq1_row_1 for a narrow book: 256-bit windows. The next four codes' lengths
// are read at the end of each step, so the loop tests at its top.
static int64_t tq1_row_1n(const tq_book *b, const uint8_t *codes, uint64_t *cp, uint64_t n_codes, const int8_t *H,
                          const int8_t *L, int64_t k) {
  const uint8_t *len = b->len;
  const uint64_t *um32 = b->um32;
  __m256i h0 = _mm256_setzero_si256(), h1 = h0, l0 = h0, l1 = h0, h2 = h0, h3 = h0, l2 = h0, l3 = h0;
  uint64_t c = *cp;
  int64_t p = 0;
  if (c + 4 <= n_codes) {
    uint64_t q = tq1_codes4(codes, c);
    int64_t L1 = len[q & 0xffff], L2 = L1 + len[q >> 16 & 0xffff], L3 = L2 + len[q >> 32 & 0xffff];
    while (p + L3 < k) {  // code 3 may start the next row
      const __m256i u0 = tq1_u32(um32, q & 0xffff), u1 = tq1_u32(um32, q >> 16 & 0xffff);
      const __m256i u2 = tq1_u32(um32, q >> 32 & 0xffff), u3 = tq1_u32(um32, q >> 48);
      h0 = _mm256_dpbusd_epi32(h0, u0, _mm256_loadu_si256((const __m256i *)(H + p)));
      l0 = _mm256_dpbusd_epi32(l0, u0, _mm256_loadu_si256((const __m256i *)(L + p)));
      h1 = _mm256_dpbusd_epi32(h1, u1, _mm256_loadu_si256((const __m256i *)(H + p + L1)));
      l1 = _mm256_dpbusd_epi32(l1, u1, _mm256_loadu_si256((const __m256i *)(L + p + L1)));
      h2 = _mm256_dpbusd_epi32(h2, u2, _mm256_loadu_si256((const __m256i *)(H + p + L2)));
      l2 = _mm256_dpbusd_epi32(l2, u2, _mm256_loadu_si256((const __m256i *)(L + p + L2)));
      h3 = _mm256_dpbusd_epi32(h3, u3, _mm256_loadu_si256((const __m256i *)(H + p + L3)));
      l3 = _mm256_dpbusd_epi32(l3, u3, _mm256_loadu_si256((const __m256i *)(L + p + L3)));
      p += L3 + len[q >> 48];
      c += 4;
      if (c + 4 > n_codes) break;
      q = tq1_codes4(codes, c);
      L1 = len[q & 0xffff];
      L2 = L1 + len[q >> 16 & 0xffff];
      L3 = L2 + len[q >> 32 & 0xffff];
    }
  }
  for (; p < k; c++) {
    const uint32_t code = rd_u16(codes + 2 * c);
    const __m256i u = tq1_u32(um32, code);
    h0 = _mm256_dpbusd_epi32(h0, u, _mm256_loadu_si256((const __m256i *)(H + p)));
    l0 = _mm256_dpbusd_epi32(l0, u, _mm256_loadu_si256((const __m256i *)(L + p)));
    p += len[code];
  }
  *cp = c;
  const __m256i h = _mm256_add_epi32(_mm256_add_epi32(h0, h1), _mm256_add_epi32(h2, h3));
  const __m256i l = _mm256_add_epi32(_mm256_add_epi32(l0, l1), _mm256_add_epi32(l2, l3));
  return tq1_sum(_mm512_zextsi256_si512(h), _mm512_zextsi256_si512(l));
}

// u of a packed entry (a book's pk, runs of at most 30 weights): vpmultishiftqb
// puts bits 2j..2j+7 of the entry in byte j, the mask keeps u_j and clears
// bytes 30 and 31 (where the length sits).
__attribute__((target("avx512vbmi"))) static inline __m256i tq1_upk(uint64_t e, __m256i ctl, __m256i keep) {
  return _mm256_and_si256(_mm256_multishift_epi64_epi8(ctl, _mm256_set1_epi64x((long long)e)), keep);
}

static inline int64_t tq1_pk_len(uint64_t e) { return 2 * (int64_t)(e >> 60); }

// tq1_row_1n for a book with the packed table: one load per code gives its u
// and its length (no length table to miss in L1), and the next four codes
// are read a step ahead, so the entries' loads start early. A step takes four
// codes while the fourth starts in the row; the step where it does not takes
// the ones before it in place, so a row ends without a code-by-code tail
// (that tail is left for the matrix's last codes).
__attribute__((target("avx512vbmi"))) static int64_t tq1_row_1p(const tq_book *b, const uint8_t *codes,
                                                                uint64_t *cp, uint64_t n_codes, const int8_t *H,
                                                                const int8_t *L, int64_t k) {
  const uint64_t *pk = b->pk;
  const __m256i ctl = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40,
                                       42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62);
  const __m256i keep = _mm256_setr_epi8(3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
                                        3, 3, 3, 3, 0, 0);
  __m256i h0 = _mm256_setzero_si256(), h1 = h0, l0 = h0, l1 = h0, h2 = h0, h3 = h0, l2 = h0, l3 = h0;
  uint64_t c = *cp;
  int64_t p = 0;
  if (c + 8 <= n_codes) {
    uint64_t q = tq1_codes4(codes, c);
    while (c + 8 <= n_codes) {
      const uint64_t e0 = pk[q & 0xffff], e1 = pk[q >> 16 & 0xffff], e2 = pk[q >> 32 & 0xffff], e3 = pk[q >> 48];
      const int64_t p1 = p + tq1_pk_len(e0), p2 = p1 + tq1_pk_len(e1), p3 = p2 + tq1_pk_len(e2);
      if (p3 >= k) {  // code 3 starts the next row: the ones before it that start in this one end it
        const uint64_t e[3] = {e0, e1, e2};
        const int64_t at[3] = {p, p1, p2};
        for (int j = 0; j < 3 && at[j] < k; j++, c++) {
          const __m256i u = tq1_upk(e[j], ctl, keep);
          h0 = _mm256_dpbusd_epi32(h0, u, _mm256_loadu_si256((const __m256i *)(H + at[j])));
          l0 = _mm256_dpbusd_epi32(l0, u, _mm256_loadu_si256((const __m256i *)(L + at[j])));
        }
        p = k;
        break;
      }
      c += 4;
      q = tq1_codes4(codes, c);  // the next step's codes (c + 4 <= n_codes)
      const __m256i u0 = tq1_upk(e0, ctl, keep), u1 = tq1_upk(e1, ctl, keep);
      const __m256i u2 = tq1_upk(e2, ctl, keep), u3 = tq1_upk(e3, ctl, keep);
      h0 = _mm256_dpbusd_epi32(h0, u0, _mm256_loadu_si256((const __m256i *)(H + p)));
      l0 = _mm256_dpbusd_epi32(l0, u0, _mm256_loadu_si256((const __m256i *)(L + p)));
      h1 = _mm256_dpbusd_epi32(h1, u1, _mm256_loadu_si256((const __m256i *)(H + p1)));
      l1 = _mm256_dpbusd_epi32(l1, u1, _mm256_loadu_si256((const __m256i *)(L + p1)));
      h2 = _mm256_dpbusd_epi32(h2, u2, _mm256_loadu_si256((const __m256i *)(H + p2)));
      l2 = _mm256_dpbusd_epi32(l2, u2, _mm256_loadu_si256((const __m256i *)(L + p2)));
      h3 = _mm256_dpbusd_epi32(h3, u3, _mm256_loadu_si256((const __m256i *)(H + p3)));
      l3 = _mm256_dpbusd_epi32(l3, u3, _mm256_loadu_si256((const __m256i *)(L + p3)));
      p = p3 + tq1_pk_len(e3);
    }
  }
  for (; p < k; c++) {
    const uint64_t e = pk[rd_u16(codes + 2 * c)];
    const __m256i u = tq1_upk(e, ctl, keep);
    h0 = _mm256_dpbusd_epi32(h0, u, _mm256_loadu_si256((const __m256i *)(H + p)));
    l0 = _mm256_dpbusd_epi32(l0, u, _mm256_loadu_si256((const __m256i *)(L + p)));
    p += tq1_pk_len(e);
  }
  *cp = c;
  const __m256i h = _mm256_add_epi32(_mm256_add_epi32(h0, h1), _mm256_add_epi32(h2, h3));
  const __m256i l = _mm256_add_epi32(_mm256_add_epi32(l0, l1), _mm256_add_epi32(l2, l3));
  return tq1_sum(_mm512_zextsi256_si512(h), _mm512_zextsi256_si512(l));
}

// One row from code c into the dense u row rb (at least k + 64 bytes);
// returns the code after the row. A narrow book's codes store 32 bytes.
static inline __attribute__((always_inline)) uint64_t tq1_unpack(const tq_book *b, const uint8_t *codes, uint64_t c,
                                                                 uint64_t n_codes, int64_t k, uint8_t *rb,
                                                                 const bool narrow) {
  const uint8_t *len = b->len;
  const uint64_t *um = narrow ? b->um32 : b->um;
#define TQ1_PUT(at, code)                                                   \
  do {                                                                      \
    if (narrow)                                                             \
      _mm256_storeu_si256((__m256i *)(rb + (at)), tq1_u32(um, code));       \
    else                                                                    \
      _mm512_storeu_si512(rb + (at), tq1_u(um, code));                      \
  } while (0)
  int64_t p = 0;
  while (c + 4 <= n_codes) {
    const uint64_t q = tq1_codes4(codes, c);
    const uint32_t c0 = q & 0xffff, c1 = q >> 16 & 0xffff, c2 = q >> 32 & 0xffff, c3 = q >> 48;
    const int64_t L1 = len[c0], L2 = L1 + len[c1], L3 = L2 + len[c2], L4 = L3 + len[c3];
    if (p + L3 >= k) break;
    TQ1_PUT(p, c0);
    TQ1_PUT(p + L1, c1);
    TQ1_PUT(p + L2, c2);
    TQ1_PUT(p + L3, c3);
    p += L4;
    c += 4;
  }
  for (; p < k; c++) {
    const uint32_t code = rd_u16(codes + 2 * c);
    TQ1_PUT(p, code);
    p += len[code];
  }
#undef TQ1_PUT
  return c;
}

static uint64_t tq1_unpack_row(const tq_book *b, const uint8_t *codes, uint64_t c, uint64_t n_codes, int64_t k,
                               uint8_t *rb) {
  return b->um32 ? tq1_unpack(b, codes, c, n_codes, k, rb, true) : tq1_unpack(b, codes, c, n_codes, k, rb, false);
}

// Weights [j0, j1) (multiples of 64) of R dense u rows (from rb, stride rbs)
// against T tokens' planes (token t at P + 2*t*lp, H then L), adding to
// acc[r][2*t] (H) and acc[r][2*t+1] (L): each plane load serves R rows.
// Bytes of a u row past k meet zero planes.
static inline __attribute__((always_inline)) void tq1_dot(const uint8_t *rb, size_t rbs, int64_t j0, int64_t j1,
                                                          const int8_t *P, int64_t lp, const int R, const int T,
                                                          __m512i (*acc)[2 * TQ1_TOK]) {
  __m512i a[2][2 * TQ1_TOK];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int e = 0; e < 2 * T; e++) a[r][e] = acc[r][e];
  for (int64_t j = j0; j < j1; j += 64) {
    __m512i u[2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) u[r] = _mm512_load_si512(rb + (size_t)r * rbs + j);
#pragma GCC unroll 8
    for (int e = 0; e < 2 * T; e++) {
      __m512i x = _mm512_load_si512(P + e * lp + j);  // token e/2, plane e%2
      if (R > 1) __asm__("" : "+v"(x));               // one load for both rows, not two folded ones
#pragma GCC unroll 2
      for (int r = 0; r < R; r++) a[r][e] = _mm512_dpbusd_epi32(a[r][e], u[r], x);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int e = 0; e < 2 * T; e++) acc[r][e] = a[r][e];
}

#define TQ1_DOT(R, T)                                                                                               \
  static void tq1_dot_##R##_##T(const uint8_t *rb, size_t rbs, int64_t j0, int64_t j1, const int8_t *P, int64_t lp, \
                                __m512i(*acc)[2 * TQ1_TOK]) {                                                       \
    tq1_dot(rb, rbs, j0, j1, P, lp, R, T, acc);                                                                     \
  }
TQ1_DOT(2, 4)
TQ1_DOT(2, 2)
TQ1_DOT(2, 1)
TQ1_DOT(1, 4)
TQ1_DOT(1, 2)
TQ1_DOT(1, 1)

// Rows [0, nr) of the unpacked block against tokens [t0, t0 + T), T <= 4:
// acc[r][2*(t - t0) + plane].
static void tq1_dot_block(const uint8_t *rb, size_t rbs, int64_t nr, int64_t k64, const int8_t *P, int64_t lp,
                          int64_t T, __m512i (*acc)[2 * TQ1_TOK]) {
  const int64_t kc = MOLE_MAX(64, TQ1_L1_PLANES / (2 * T) / 64 * 64);  // a chunk's planes stay in L1
  memset(acc, 0, (size_t)nr * sizeof acc[0]);
  for (int64_t j0 = 0; j0 < k64; j0 += kc) {
    const int64_t j1 = MOLE_MIN(k64, j0 + kc);
    for (int64_t r = 0; r < nr; r += 2) {
      const uint8_t *u = rb + (size_t)r * rbs;
      if (r + 1 < nr) {
        if (T == 4)
          tq1_dot_2_4(u, rbs, j0, j1, P, lp, acc + r);
        else if (T == 2)
          tq1_dot_2_2(u, rbs, j0, j1, P, lp, acc + r);
        else
          tq1_dot_2_1(u, rbs, j0, j1, P, lp, acc + r);
      } else {
        if (T == 4)
          tq1_dot_1_4(u, rbs, j0, j1, P, lp, acc + r);
        else if (T == 2)
          tq1_dot_1_2(u, rbs, j0, j1, P, lp, acc + r);
        else
          tq1_dot_1_1(u, rbs, j0, j1, P, lp, acc + r);
      }
    }
  }
}

void quant_tq1_gemm_avx512(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  MOLE_ASSERT(i0 >= 0 && i0 <= i1 && i1 <= n_rows && k % 2 == 0 && k <= TQ_K_MAX);
  if (i0 == i1 || n_tok <= 0) return;
  if (k == 0 || !b->um) {
    quant_tq1_gemm_ref(b, W, n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return;
  }
  const int64_t lp = (k + 64 + 63) / 64 * 64, k64 = (k + 63) / 64 * 64;  // bytes of a plane; of the dot
  const size_t planes = (size_t)(2 * lp * n_tok), rbs = (size_t)lp;
  const size_t rbytes = n_tok > 1 ? TQ1_BLOCK * rbs + TQ1_BLOCK * sizeof(__m512i[2 * TQ1_TOK]) : 0;
  int64_t ldx;
  float *dx;
  void *ext;
  const int16_t *x16 = tq_prepare_x(X, xstride, n_tok, k, planes + rbytes + 8 * (size_t)n_tok, &ldx, &dx, &ext);
  int8_t *P = ext;
  uint8_t *rb = (uint8_t *)P + planes;
  __m512i(*acc)[2 * TQ1_TOK] = (__m512i(*)[2 * TQ1_TOK])(rb + TQ1_BLOCK * rbs);
  int64_t *sumx = (int64_t *)(rb + rbytes);
  for (int64_t t = 0; t < n_tok; t++) sumx[t] = tq1_planes(x16 + t * ldx, k, lp, P + 2 * t * lp, P + 2 * t * lp + lp);
  const uint8_t *w = W, *codes = w + tq1_codes_offset(n_rows);
  const int64_t G = (n_rows + 15) / 16;
  const uint64_t n_codes = rd_u32(w + 4 * G);
  const uint8_t *scales = w + 4 * (G + 1);
  uint64_t c = tq1_row_start(b, w, n_rows, k, i0);
  if (n_tok == 1) {
    const bool packed = b->pk && tq1_vbmi();
    for (int64_t i = i0; i < i1; i++) {
      const int64_t S = packed    ? tq1_row_1p(b, codes, &c, n_codes, P, P + lp, k)
                        : b->um32 ? tq1_row_1n(b, codes, &c, n_codes, P, P + lp, k)
                                  : tq1_row_1(b, codes, &c, n_codes, P, P + lp, k);
      Y[i] = tq_out(quant_f16_to_f32(rd_u16(scales + 2 * i)), dx[0], S - sumx[0]);
    }
    return;
  }
  for (int64_t r0 = i0; r0 < i1; r0 += TQ1_BLOCK) {
    const int64_t nr = MOLE_MIN(TQ1_BLOCK, i1 - r0);
    for (int64_t r = 0; r < nr; r++) c = tq1_unpack_row(b, codes, c, n_codes, k, rb + (size_t)r * rbs);
    for (int64_t t0 = 0; t0 < n_tok;) {
      const int64_t rem = n_tok - t0, T = rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
      tq1_dot_block(rb, rbs, nr, k64, P + 2 * t0 * lp, lp, T, acc);
      for (int64_t r = 0; r < nr; r++) {
        const float s = quant_f16_to_f32(rd_u16(scales + 2 * (r0 + r)));
        for (int64_t t = 0; t < T; t++) {
          const int64_t S = tq1_sum(acc[r][2 * t], acc[r][2 * t + 1]);
          Y[(t0 + t) * ldy + r0 + r] = tq_out(s, dx[t0 + t], S - sumx[t0 + t]);
        }
      }
      t0 += T;
    }
  }
}

// ---- TQ2 -------------------------------------------------------------------------------
// 32 weights (8 bytes) to int16 lanes: the bytes broadcast to every 128-bit
// lane, vpshufb puts byte j/4 in the low byte of lane j, a variable shift by
// 2*(j%4) and a mask leave q_j.

static inline __m512i tq2_q32(const uint8_t *row, int64_t nbytes, __m512i shuf, __m512i shift, __m512i three) {
  uint64_t v = 0;
  if (__builtin_expect(nbytes >= 8, 1))
    memcpy(&v, row, 8);
  else
    memcpy(&v, row, (size_t)nbytes);
  const __m512i b = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)v), shuf);
  return _mm512_and_si512(_mm512_srlv_epi16(b, shift), three);
}

// Rows [i0, i1) for T tokens (x16 of token t at x + t*ldx, x16 sums sx[t]).
static inline __attribute__((always_inline)) void tq2_rows(const uint8_t *w, int64_t n_rows, int64_t k, int64_t i0,
                                                           int64_t i1, const int16_t *x, int64_t ldx, const int T,
                                                           const float *dx, const int64_t *sx, float *Y, int64_t ldy) {
  const size_t rb = (size_t)(k + 3) / 4, hdr = (3 * (size_t)n_rows + 3) & ~(size_t)3;
  int8_t ctl[64];
  int16_t shv[32];
  for (int j = 0; j < 64; j++) {
    const int lane = j / 16, m = (j % 16) / 2;  // int16 lane 8*lane + m
    ctl[j] = j % 2 ? (int8_t)0x80 : (int8_t)(2 * lane + m / 4);
  }
  for (int j = 0; j < 32; j++) shv[j] = (int16_t)(2 * (j % 4));
  const __m512i shuf = _mm512_loadu_si512(ctl), shift = _mm512_loadu_si512(shv), three = _mm512_set1_epi16(3);
  for (int64_t i = i0; i < i1; i++) {
    const uint8_t *row = w + hdr + (size_t)i * rb;
    __m512i acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
    for (int64_t e = 0; e < k; e += 32) {
      const __m512i q = tq2_q32(row + e / 4, (int64_t)rb - e / 4, shuf, shift, three);
#pragma GCC unroll 4
      for (int t = 0; t < T; t++) acc[t] = _mm512_dpwssd_epi32(acc[t], q, _mm512_loadu_si512(x + t * ldx + e));
    }
    const float s = quant_f16_to_f32(rd_u16(w + 2 * i));
    const int64_t z = w[2 * n_rows + i];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) Y[t * ldy + i] = tq_out(s, dx[t], reduce64(acc[t]) - z * sx[t]);
  }
}

#define TQ2_ROWS(T)                                                                                               \
  static void tq2_rows_##T(const uint8_t *w, int64_t n_rows, int64_t k, int64_t i0, int64_t i1, const int16_t *x, \
                           int64_t ldx, const float *dx, const int64_t *sx, float *Y, int64_t ldy) {              \
    tq2_rows(w, n_rows, k, i0, i1, x, ldx, T, dx, sx, Y, ldy);                                                    \
  }
TQ2_ROWS(1)
TQ2_ROWS(2)
TQ2_ROWS(4)

void quant_tq2_gemm_avx512(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  (void)b;
  MOLE_ASSERT(i0 >= 0 && i0 <= i1 && i1 <= n_rows && k >= 0 && k <= TQ_K_MAX);
  if (i0 == i1 || n_tok <= 0) return;
  int64_t ldx;
  float *dx;
  void *ext;
  const int16_t *x16 = tq_prepare_x(X, xstride, n_tok, k, 8 * (size_t)n_tok, &ldx, &dx, &ext);
  int64_t *sx = ext;
  const __m512i one = _mm512_set1_epi16(1);
  for (int64_t t = 0; t < n_tok; t++) {  // sum of x16 per token (for the zero points)
    __m512i a = _mm512_setzero_si512();
    for (int64_t e = 0; e < k; e += 32) a = _mm512_dpwssd_epi32(a, _mm512_loadu_si512(x16 + t * ldx + e), one);
    sx[t] = reduce64(a);
  }
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t rem = n_tok - t0, T = rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
    const int16_t *x = x16 + t0 * ldx;
    if (T == 4)
      tq2_rows_4(W, n_rows, k, i0, i1, x, ldx, dx + t0, sx + t0, Y + t0 * ldy, ldy);
    else if (T == 2)
      tq2_rows_2(W, n_rows, k, i0, i1, x, ldx, dx + t0, sx + t0, Y + t0 * ldy, ldy);
    else
      tq2_rows_1(W, n_rows, k, i0, i1, x, ldx, dx + t0, sx + t0, Y + t0 * ldy, ldy);
    t0 += T;
  }
}
