// quant: the traits tables (scalar reference + active SIMD), CPU dispatch,
// f16/bf16 scalar conversions, the matmul entry point, per-thread scratch.
#include <pthread.h>
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "quant/quant_exact.h"
#include "quant/quant_internal.h"
#include "quant/quant_tq.h"

// ---- f16 / bf16 -------------------------------------------------------------
// Bit-exact with F16C (vcvtps2ph round-to-nearest-even, vcvtph2ps): IEEE
// half precision with subnormals, inf, and NaN quieted.

float quant_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0) {
    float f = (float)m * 0x1p-24f;  // zero or subnormal: exact
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t quant_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffff;
  uint32_t e = ax >> 23;
  if (e == 255) return (uint16_t)(sign | 0x7c00 | (ax & 0x7fffff ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
  if (e >= 143) return (uint16_t)(sign | 0x7c00);  // >= 2^16: overflow
  if (e >= 113) {                                  // normal half
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // carries into exponent / inf
    return (uint16_t)(sign | h);
  }
  if (e < 102) return sign;  // < 2^-25: rounds to zero (ties to even)
  uint32_t mant = (ax & 0x7fffff) | 0x800000;
  uint32_t shift = 126 - e;  // 14..24
  uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t quant_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);  // NaN: keep quiet
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

// ---- traits tables ------------------------------------------------------------

#define REF(t, vdt, isq)                                                                         \
  {                                                                                              \
    .name = #t, .is_quantized = isq, .vec_dot_type = vdt, .to_float = quant_to_float_##t##_ref, \
    .from_float = quant_from_float_##t##_ref                                                     \
  }

static quant_traits g_ref[QT_COUNT] = {
    [QT_F32] = REF(f32, QT_F32, false),    [QT_F16] = REF(f16, QT_F16, false),
    [QT_BF16] = REF(bf16, QT_BF16, false), [QT_Q4_0] = REF(q4_0, QT_Q8_0, true),
    [QT_Q4_1] = REF(q4_1, QT_Q8_1, true),  [QT_Q5_0] = REF(q5_0, QT_Q8_0, true),
    [QT_Q5_1] = REF(q5_1, QT_Q8_1, true),  [QT_Q8_0] = REF(q8_0, QT_Q8_0, true),
    [QT_Q8_1] = REF(q8_1, QT_Q8_1, true),  [QT_Q2_K] = REF(q2_K, QT_Q8_K, true),
    [QT_Q3_K] = REF(q3_K, QT_Q8_K, true),  [QT_Q4_K] = REF(q4_K, QT_Q8_K, true),
    [QT_Q5_K] = REF(q5_K, QT_Q8_K, true),  [QT_Q6_K] = REF(q6_K, QT_Q8_K, true),
    [QT_Q8_K] = REF(q8_K, QT_Q8_K, true),
    // blobs (quant_tq.h): no per-row conversions; quant_gemm_op computes them
    [QT_TQ1] = {.name = "tq1_dict", .is_quantized = true, .vec_dot_type = QT_F32},
    [QT_TQ2] = {.name = "tq2_row", .is_quantized = true, .vec_dot_type = QT_F32},
};
#undef REF

static quant_traits g_active[QT_COUNT];
static bool (*g_gemm)(quant_type, const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,
                      int64_t, int64_t);
static int g_level = -1;     // ISA level in use
static int g_cpu_level = 0;  // best level this CPU has
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void fill_ref(void) {
  // the parts of the reference table that the designated initializers cannot say
#define DOT(t, T) g_ref[T].vec_dot = quant_vec_dot_##t##_ref;
  DOT(f32, QT_F32) DOT(f16, QT_F16) DOT(bf16, QT_BF16) DOT(q4_0, QT_Q4_0) DOT(q4_1, QT_Q4_1) DOT(q5_0, QT_Q5_0)
  DOT(q5_1, QT_Q5_1) DOT(q8_0, QT_Q8_0) DOT(q2_K, QT_Q2_K) DOT(q3_K, QT_Q3_K) DOT(q4_K, QT_Q4_K)
  DOT(q5_K, QT_Q5_K) DOT(q6_K, QT_Q6_K)
#undef DOT
  for (int t = 0; t < QT_COUNT; t++) {
    if (!g_ref[t].name || quant_is_blob(t)) continue;
    g_ref[t].name = quant_type_name((uint32_t)t);  // lower-case canonical spelling
    g_ref[t].blck_size = quant_blck_size((uint32_t)t);
    g_ref[t].type_size = quant_type_size((uint32_t)t);
  }
}

#if defined(__aarch64__)
static int detect_level(void) {
  // NEON is in every ARMv8-A core; the kernels need the dot product (v8.2+)
  const unsigned long hw = getauxval(AT_HWCAP);
  return (hw & HWCAP_ASIMD) && (hw & HWCAP_ASIMDDP) ? QUANT_ISA_NEON : QUANT_ISA_SCALAR;
}

static void load_kernels(int level, quant_kernels *ks) {
  if (level >= QUANT_ISA_NEON) quant_kernels_neon(ks);
}

static const char *const g_level_names[] = {"scalar", "neon"};
static const char *const g_isa_names[] = {"scalar", "neon-dotprod"};
#else
static int detect_level(void) {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // F16C has no __builtin_cpu_supports name on every compiler; every CPU with
  // AVX2 has it.
  if (!avx2) return 0;
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
  return avx512 ? 2 : 1;
}


static void load_kernels(int level, quant_kernels *ks) {
  if (level >= QUANT_ISA_AVX2) quant_kernels_avx2(ks);
  if (level >= QUANT_ISA_AVX512) quant_kernels_avx512(ks);
}

static const char *const g_level_names[] = {"scalar", "avx2", "avx512"};
static const char *const g_isa_names[] = {"scalar", "avx2", "avx512vnni"};
#endif

static void apply_level(int level) {
  quant_kernels ks;
  memset(&ks, 0, sizeof ks);
  load_kernels(level, &ks);
  for (int t = 0; t < QT_COUNT; t++) {
    g_active[t] = g_ref[t];
    if (!g_ref[t].name) continue;
    if (ks.to_float[t]) g_active[t].to_float = ks.to_float[t];
    if (ks.from_float[t]) g_active[t].from_float = ks.from_float[t];
    if (ks.vec_dot[t] && g_ref[t].vec_dot) g_active[t].vec_dot = ks.vec_dot[t];
    // llama.cpp's own summation order (its one-token kernels), at every level:
    // the AVX-512, AVX2 and NEON kernels are twins of the scalar references
    if (g_ref[t].vec_dot && quant_exact_vec_dot((quant_type)t, level))
      g_active[t].vec_dot = quant_exact_vec_dot((quant_type)t, level);
  }
  g_gemm = ks.gemm;
  g_level = level;
}

// Whether the level in use has group kernels for R16 matrices of type t:
// AVX-512 for every R16 type; AVX2 for q4_0 and q4_K (their repack orders;
// the lane-order types stream well from rows there); none on ARM64 yet.
static bool r16_kernels(quant_type t) {
#if defined(__aarch64__)
  (void)t;
  return false;
#else
  return g_level >= QUANT_ISA_AVX512 || (g_level == QUANT_ISA_AVX2 && (t == QT_Q4_0 || t == QT_Q4_K));
#endif
}

bool quant_r16_preferred(quant_type t, int64_t n_rows) {
  quant_init();
  return quant_r16_supported(t, n_rows) && r16_kernels(t);
}

int quant_level(void) {
  quant_init();
  return g_level;
}

int quant_cpu_isa(void) {
  quant_init();
  return g_cpu_level;
}

int quant_isa_from_name(const char *name) {
  for (int i = 0; i <= QUANT_ISA_TOP; i++)
    if (name && !strcmp(name, g_level_names[i])) return i;
  return -1;
}

const char *quant_isa_level_name(int level) {
  return level >= 0 && level <= QUANT_ISA_TOP ? g_level_names[level] : "?";
}

static void init_once(void) {
  fill_ref();
  g_cpu_level = detect_level();
  int level = g_cpu_level;
  // MOLE_ISA=avx512|avx2|scalar (neon|scalar on ARM64): run a lower ISA's kernels on this CPU (tests, measurements)
  const char *env = getenv("MOLE_ISA");
  if (env && *env) {
    const int want = quant_isa_from_name(env);
    if (want < 0)
      mole_log(MOLE_LOG_WARN, "MOLE_ISA='%s' is not one of %s: ignored", env, QUANT_ISA_NAMES);
    else if (want > g_cpu_level)
      mole_log(MOLE_LOG_WARN, "MOLE_ISA=%s: this CPU lacks it, using %s", env, g_level_names[g_cpu_level]);
    else
      level = want;
  }
  apply_level(level);
}

void quant_init(void) { pthread_once(&g_once, init_once); }

int quant_force_isa(int level) {
  quant_init();
  if (level < 0) level = 0;
  if (level > g_cpu_level) level = g_cpu_level;
  apply_level(level);
  return level;
}

const char *quant_isa_name(void) {
  quant_init();
  return g_isa_names[g_level];
}

const quant_traits *quant_traits_of(quant_type t) {
  quant_init();
  if ((unsigned)t >= QT_COUNT || !g_active[t].name) return NULL;
  return &g_active[t];
}

const quant_traits *quant_traits_ref(quant_type t) {
  quant_init();
  if ((unsigned)t >= QT_COUNT || !g_ref[t].name) return NULL;
  return &g_ref[t];
}

bool quant_type_supported(uint32_t t) {
  const quant_traits *tr = t < QT_COUNT ? quant_traits_of((quant_type)t) : NULL;
  return tr && tr->to_float && tr->vec_dot;
}

// ---- matmul ---------------------------------------------------------------------

void quant_gemm(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const quant_op op = {0};
  quant_gemm_op(wt, QL_ROWS, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k, &op);
}

// QL_R16 without an exact kernel at this ISA level: each group back in row
// layout (scratch slot 1), then the row-layout path.
static void gemm_r16_rows(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                          int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, const quant_op *op) {
  const int64_t n_rows = op->n_rows, tail = n_rows / 16 * 16;
  for (int64_t g0 = i0; g0 < MOLE_MIN(i1, tail); g0 += 16) {
    const int64_t g1 = MOLE_MIN(g0 + 16, i1);
    char *rows = quant_scratch_slot(1, 16 * wstride);
    quant_r16_rows(wt, W, k, n_rows, g0, g1, rows);
    quant_gemm_op(wt, QL_ROWS, rows - (size_t)g0 * wstride, wstride, X, xstride, Y, ldy, g0, g1, n_tok, k, op);
  }
  if (i1 > tail) quant_gemm_op(wt, QL_ROWS, W, wstride, X, xstride, Y, ldy, MOLE_MAX(i0, tail), i1, n_tok, k, op);
}

void quant_gemm_op(quant_type wt, quant_layout lay, const void *W, size_t wstride, const void *X, size_t xstride,
                   float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, const quant_op *op) {
  if (quant_is_blob(wt)) {  // one blob of op->n_rows rows; float activations
    MOLE_ASSERT(lay == QL_ROWS && op->n_rows > 0 && i0 >= 0 && i0 <= i1 && i1 <= op->n_rows && (i0 % 16 == 0 || i1 == op->n_rows));
    if (i0 == i1 || n_tok == 0) return;
    if (wt == QT_TQ1) {
      MOLE_ASSERT(op->book);
      quant_tq1_gemm(op->book, W, op->n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
    } else {
      quant_tq2_gemm(W, op->n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
    }
    return;
  }
  const quant_traits *tr = quant_traits_of(wt);
  MOLE_ASSERT(tr && tr->vec_dot);
  MOLE_ASSERT(k % tr->blck_size == 0 && i0 >= 0 && i0 <= i1 && n_tok >= 0);
  MOLE_ASSERT(op->n_seg == 0 || op->seg_ends[op->n_seg - 1] == n_tok);
  if (i0 == i1 || n_tok == 0) return;
  if (k == 0) {  // an empty share of a row-parallel matmul (a process with no columns of it)
    for (int64_t j = 0; j < n_tok; j++) memset(Y + j * ldy + i0, 0, (size_t)(i1 - i0) * sizeof(float));
    return;
  }
  if (lay == QL_R16) {
    const int64_t n_rows = op->n_rows;
    MOLE_ASSERT(quant_r16_supported(wt, n_rows) && wstride == quant_row_size(wt, k) && i1 <= n_rows);
    MOLE_ASSERT(i0 % 16 == 0 || i0 >= n_rows / 16 * 16);
    if (r16_kernels(wt) && quant_exact_gemm(wt, op, lay, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k)) return;
    gemm_r16_rows(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k, op);
    return;
  }
  if (quant_exact_gemm(wt, op, lay, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k)) return;
  if (g_gemm && g_gemm(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k)) return;
  // vec_dot loops over 16-row panels: the panel stays in cache across tokens
  const char *w = W, *x = X;
  for (int64_t ib = i0; ib < i1; ib += 16) {
    int64_t ie = MOLE_MIN(ib + 16, i1);
    for (int64_t j = 0; j < n_tok; j++)
      for (int64_t i = ib; i < ie; i++)
        tr->vec_dot(k, &Y[j * ldy + i], w + (size_t)i * wstride, x + (size_t)j * xstride);
  }
}

// ---- per-thread scratch --------------------------------------------------------
// A cache per thread, outside the mole allocator's accounting (it lives as long
// as the thread, like libc's own caches).

enum { N_SLOTS = 2 };
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
  void *p[N_SLOTS];
  size_t n[N_SLOTS];
} scratch_set;
static _Thread_local scratch_set t_scratch;

static void scratch_free(void *v) {
  scratch_set *s = v;
  for (int i = 0; i < N_SLOTS; i++) free(s->p[i]);
}
static void scratch_key_init(void) { MOLE_ASSERT(pthread_key_create(&g_scratch_key, scratch_free) == 0); }

void *quant_scratch_slot(int slot, size_t n) {
  MOLE_ASSERT(slot >= 0 && slot < N_SLOTS);
  scratch_set *s = &t_scratch;
  if (n <= s->n[slot]) return s->p[slot];
  pthread_once(&g_scratch_once, scratch_key_init);
  free(s->p[slot]);
  size_t cap = (n + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
  void *p = NULL;
  MOLE_ASSERT(posix_memalign(&p, 64, cap) == 0);
  s->p[slot] = p;
  s->n[slot] = cap;
  pthread_setspecific(g_scratch_key, s);
  return p;
}
