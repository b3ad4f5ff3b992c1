// quant: the dispatcher. It picks the ISA level once (CPUID / HWCAP, then
// MOLE_ISA), hands out that level's kernel table (quant_table.h), and runs
// matmuls through it: llama.cpp's order per output (quant_exact_order), the
// R16 layout, the blob types, the kernel scratch.
#include <pthread.h>
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "quant/quant_table.h"

// ---- the level and its table ----------------------------------------------------

#if defined(__aarch64__)
static int detect_level(void) {
  // NEON is in every ARMv8-A core; the kernels need the dot product (v8.2+)
  const unsigned long hw = getauxval(AT_HWCAP);
  return (hw & HWCAP_ASIMD) && (hw & HWCAP_ASIMDDP) ? QUANT_ISA_NEON : QUANT_ISA_SCALAR;
}

static const quant_row *const k_tables[] = {quant_table_ref, quant_table_neon};
static const char *const g_level_names[] = {"scalar", "neon"};
static const char *const g_isa_names[] = {"scalar", "neon-dotprod"};
#else
static int detect_level(void) {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // F16C has no __builtin_cpu_supports name on every compiler; every CPU with
  // AVX2 has it.
  if (!avx2) return QUANT_ISA_SCALAR;
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
  return avx512 ? QUANT_ISA_AVX512 : QUANT_ISA_AVX2;
}

static const quant_row *const k_tables[] = {quant_table_ref, quant_table_avx2, quant_table_avx512};
static const char *const g_level_names[] = {"scalar", "avx2", "avx512"};
static const char *const g_isa_names[] = {"scalar", "avx2", "avx512vnni"};
#endif
_Static_assert(sizeof k_tables / sizeof k_tables[0] == QUANT_ISA_TOP + 1, "a table per level");

static _Atomic int g_level = QUANT_ISA_SCALAR;  // the level in use (quant_force_isa changes it)
static const quant_row *_Atomic g_table;         // its table
static int g_cpu_level = QUANT_ISA_SCALAR;       // the best level this CPU has
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void use_level(int level) {
  atomic_store(&g_table, k_tables[level]);
  atomic_store(&g_level, level);
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
  use_level(level);
}

void quant_init(void) { pthread_once(&g_once, init_once); }

int quant_force_isa(int level) {
  quant_init();
  level = MOLE_MAX(MOLE_MIN(level, g_cpu_level), (int)QUANT_ISA_SCALAR);
  use_level(level);
  return level;
}

int quant_level(void) {
  quant_init();
  return atomic_load_explicit(&g_level, memory_order_relaxed);
}

int quant_cpu_isa(void) {
  quant_init();
  return g_cpu_level;
}

const char *quant_isa_name(void) { return g_isa_names[quant_level()]; }

const quant_row *quant_table_at(int level) {
  return level >= 0 && level <= QUANT_ISA_TOP ? k_tables[level] : NULL;
}

static const quant_row *row_in(const quant_row *table, quant_type t) {
  return (unsigned)t < QT_COUNT && table[t].tr.name ? &table[t] : NULL;
}

const quant_row *quant_row_of(quant_type t) {
  quant_init();
  return row_in(atomic_load_explicit(&g_table, memory_order_relaxed), t);
}

const quant_traits *quant_traits_of(quant_type t) {
  const quant_row *r = quant_row_of(t);
  return r ? &r->tr : NULL;
}

const quant_traits *quant_traits_ref(quant_type t) {
  const quant_row *r = row_in(quant_table_ref, t);
  return r ? &r->tr : NULL;
}

bool quant_type_supported(uint32_t t) {
  const quant_traits *tr = t < QT_COUNT ? quant_traits_of((quant_type)t) : NULL;
  return tr && tr->to_float && tr->vec_dot;
}

bool quant_r16_preferred(quant_type t, int64_t n_rows) {
  const quant_row *r = quant_row_of(t);
  return quant_r16_supported(t, n_rows) && r && r->tile_r16;
}

// ---- llama.cpp's order per output -------------------------------------------------

qx_order quant_exact_order(quant_type wt, const qx_op *op, int64_t n_tok, int64_t j, int64_t k) {
  const int64_t rows = op->n_rows;
  const bool dense_batch = !op->expert && n_tok >= 2;
  const bool tiny4 = rows % 4 == 0;  // tinyBLAS float kernels need m % 4 == 0
  const bool repack = rows % 8 == 0;  // q4_0_8x8 / q4_K_8x8 need ne1 % 8 == 0
  switch (wt) {
    case QT_Q8_0: return QX_Q8_0;
    case QT_Q4_0: return repack ? QX_Q4_0_C1 : QX_Q4_0_L8;
    case QT_Q4_K:
      if (!repack) return QX_Q4_K_K8;
      return !op->expert && j < n_tok - n_tok % 4 ? QX_Q4_K_V64 : QX_Q4_K_V256;
    case QT_Q5_K: return QX_Q5_K_K8;
    case QT_Q6_K: return QX_Q6_K_K8;
    case QT_F32: return dense_batch && tiny4 && k % 16 == 0 ? QX_F32_T16 : QX_F32_VEC;
    case QT_F16: return dense_batch && tiny4 && k % 16 == 0 ? QX_F16_T16 : QX_F16_VEC;
    case QT_BF16: return dense_batch && tiny4 && k % 32 == 0 ? QX_BF16_T32 : QX_BF16_VEC;
    default: return QX_NONE;
  }
}

// The order of token j of a matmul over n_tok tokens: as in a mul_mat of its
// own segment's tokens (op->seg_ends) when the tokens are several sequences'.
static qx_order token_order(quant_type wt, const qx_op *op, int64_t n_tok, int64_t j, int64_t k) {
  if (op->n_seg == 0) return quant_exact_order(wt, op, n_tok, j, k);
  int64_t lo = 0, hi = op->n_seg - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (j < op->seg_ends[mid]) hi = mid;
    else lo = mid + 1;
  }
  const int64_t start = lo ? op->seg_ends[lo - 1] : 0;
  return quant_exact_order(wt, op, op->seg_ends[lo] - start, j - start, k);
}

// ---- matmul -------------------------------------------------------------------------

// Tokens per call of the tile and blob kernels: what they keep per token in
// scratch is then bounded by the row length alone (quant_scratch_bytes).
// Outputs do not depend on it (each one's order is fixed by the whole op);
// the tiles' panels are decoded once per call, so theirs is long.
enum { TILE_TOKENS = 512, BLOB_TOKENS = 64 };

// A type with orders: the tokens in runs of one order (q4_K: the gemm tokens,
// then the gemv ones), R16 groups [i0, g_end) through the level's group
// kernel, the rows after them (an R16 matrix's tail) through its tile.
static void exact_run(const quant_row *row, quant_type wt, const qx_op *op, int64_t g_end, const void *W,
                      size_t wstride, const void *X, size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1,
                      int64_t n_tok, int64_t k) {
  for (int64_t j0 = 0; j0 < n_tok;) {
    const qx_order o = token_order(wt, op, n_tok, j0, k);
    int64_t j1 = j0 + 1;
    while (j1 < n_tok && j1 - j0 < TILE_TOKENS && token_order(wt, op, n_tok, j1, k) == o) j1++;
    if (g_end > i0) row->tile_r16(o, wt, W, op->n_rows, X, xstride, Y, ldy, i0, g_end, j0, j1, k);
    const int64_t r0 = MOLE_MAX(i0, g_end);
    if (r0 < i1) row->tile(o, W, wstride, X, xstride, Y, ldy, r0, i1, j0, j1, k);
    j0 = j1;
  }
}

// QL_R16 where this level has no group kernel for the type: each group back
// in row layout (held scratch), then the row-layout path.
static void gemm_r16_rows(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                          int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, const quant_op *op) {
  const int64_t n_rows = op->n_rows, tail = n_rows / 16 * 16;
  if (i0 < tail) {
    char *rows = quant_scratch_hold(16 * wstride);
    for (int64_t g0 = i0; g0 < MOLE_MIN(i1, tail); g0 += 16) {
      const int64_t g1 = MOLE_MIN(g0 + 16, i1);
      quant_r16_rows(wt, W, k, n_rows, g0, g1, rows);
      quant_gemm_op(wt, QL_ROWS, rows - (size_t)g0 * wstride, wstride, X, xstride, Y, ldy, g0, g1, n_tok, k, op);
    }
    quant_scratch_hold(0);
  }
  if (i1 > tail) quant_gemm_op(wt, QL_ROWS, W, wstride, X, xstride, Y, ldy, MOLE_MAX(i0, tail), i1, n_tok, k, op);
}

static void blob_run(quant_type wt, const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride,
                     float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const quant_row *row = quant_row_of(wt);
  for (int64_t j0 = 0; j0 < n_tok; j0 += BLOB_TOKENS)
    row->blob_gemm(b, W, n_rows, (const float *)((const char *)X + (size_t)j0 * xstride), xstride, Y + j0 * ldy, ldy,
                   i0, i1, MOLE_MIN((int64_t)BLOB_TOKENS, n_tok - j0), k);
}

void quant_tq1_gemm(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                    int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  blob_run(QT_TQ1, b, W, n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
}

void quant_tq2_gemm(const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y, int64_t ldy, int64_t i0,
                    int64_t i1, int64_t n_tok, int64_t k) {
  blob_run(QT_TQ2, NULL, W, n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
}

bool quant_exact_gemm(quant_type wt, const qx_op *op, quant_layout lay, const void *W, size_t wstride, const void *X,
                      size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const quant_row *row = quant_row_of(wt);
  if (!row || !row->tile) return false;
  quant_gemm_op(wt, lay, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k, op);
  return true;
}

void quant_gemm(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k) {
  const quant_op op = {0};
  quant_gemm_op(wt, QL_ROWS, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k, &op);
}

void quant_gemm_op(quant_type wt, quant_layout lay, const void *W, size_t wstride, const void *X, size_t xstride,
                   float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, const quant_op *op) {
  if (quant_is_blob(wt)) {  // one blob of op->n_rows rows; float activations
    MOLE_ASSERT(lay == QL_ROWS && op->n_rows > 0 && i0 >= 0 && i0 <= i1 && i1 <= op->n_rows && (i0 % 16 == 0 || i1 == op->n_rows));
    MOLE_ASSERT(wt != QT_TQ1 || op->book);
    if (i0 == i1 || n_tok == 0) return;
    blob_run(wt, op->book, W, op->n_rows, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return;
  }
  const quant_row *row = quant_row_of(wt);
  MOLE_ASSERT(row && row->tr.vec_dot);
  MOLE_ASSERT(k % row->tr.blck_size == 0 && i0 >= 0 && i0 <= i1 && n_tok >= 0);
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
    if (row->tile_r16)
      exact_run(row, wt, op, MOLE_MIN(i1, n_rows / 16 * 16), W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
    else
      gemm_r16_rows(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k, op);
    return;
  }
  if (row->tile) {
    exact_run(row, wt, op, i0, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k);
    return;
  }
  if (row->gemm && row->gemm(wt, W, wstride, X, xstride, Y, ldy, i0, i1, n_tok, k)) return;
  // vec_dot loops over 16-row panels: the panel stays in cache across tokens
  const char *w = W, *x = X;
  for (int64_t ib = i0; ib < i1; ib += 16) {
    int64_t ie = MOLE_MIN(ib + 16, i1);
    for (int64_t j = 0; j < n_tok; j++)
      for (int64_t i = ib; i < ie; i++)
        row->tr.vec_dot(k, &Y[j * ldy + i], w + (size_t)i * wstride, x + (size_t)j * xstride);
  }
}

// ---- kernel scratch -------------------------------------------------------------------

static _Thread_local size_t t_held;  // bytes at the bottom held by quant_scratch_hold

size_t quant_scratch_bytes(int64_t max_k) {
  const size_t k = (size_t)MOLE_MAX(max_k, (int64_t)0);
  if (k > SIZE_MAX / 1024) return SIZE_MAX;  // no such matrix fits in memory: the reservation fails
  // held: 16 rows of the R16 type with the most bytes per element (q8_0, 34 per 32)
  const size_t held = 16 * ((k + 31) / 32) * sizeof(blk_q8_0) + 64;
  // kernels: TQ1's are the largest (BLOB_TOKENS tokens: int16 activations,
  // two byte planes, 16 unpacked rows: under 4 bytes per element and token
  // + 16 per element + 10 KiB); AVX-512's tiles keep a quarter byte per
  // element and token of q4_0 token data (TILE_TOKENS tokens: 128 per
  // element), or up to 1 MiB of q8_0's besides 30 bytes per element; the
  // other packings are smaller
  const size_t kern = BLOB_TOKENS * (4 * k + 512) + 32 * k + ((size_t)3 << 19);
  return held + kern;
}

void *quant_scratch_hold(size_t n) {
  if (n == 0) {
    t_held = 0;
    return NULL;
  }
  size_t cap;
  char *p = mole_scratch(&cap);
  n = (n + 63) & ~(size_t)63;
  MOLE_ASSERT(p && n <= cap && "kernel scratch reserved ahead at quant_scratch_bytes (base/pool.h)");
  t_held = n;
  return p;
}

void *quant_scratch(size_t n) {
  size_t cap;
  char *p = mole_scratch(&cap);
  MOLE_ASSERT(p && t_held <= cap && n <= cap - t_held &&
              "kernel scratch reserved ahead at quant_scratch_bytes (base/pool.h)");
  return p + t_held;
}
