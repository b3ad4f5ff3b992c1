// quant: tensor types and their kernels. Each ISA level has one kernel
// table, a row per type id (quant_table.h); the level is chosen once at
// start-up from CPUID / HWCAP (MOLE_ISA may pick a lower one), and the
// element-wise ops of src/model follow the same level (quant_level).
#ifndef MOLE_QUANT_H
#define MOLE_QUANT_H

#include "base/base.h"
#include "quant/quant_types.h"

// x: one row of this type; y: one row of `vec_dot_type`; n: elements.
typedef void (*quant_to_float_fn)(const void *restrict x, float *restrict y, int64_t n);
typedef void (*quant_from_float_fn)(const float *restrict x, void *restrict y, int64_t n);
typedef void (*quant_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict x, const void *restrict y);

typedef struct quant_traits {
  const char *name;          // "q4_0" (lower case, as in file type names)
  int64_t blck_size;         // elements per block
  size_t type_size;          // bytes per block
  bool is_quantized;
  quant_type vec_dot_type;   // what activations are converted to for vec_dot
  quant_to_float_fn to_float;      // dequantize n elements (n % blck_size == 0)
  quant_from_float_fn from_float;  // quantize n elements (as llama.cpp does)
  quant_vec_dot_fn vec_dot;        // s = dot(x, y), in llama.cpp's one-token order where the type has
                                   // orders (quant_exact.h); NULL when not a weight type
} quant_traits;

// ISA levels per architecture, each with a complete kernel table
// (quant_table.h) and every one giving the scalar reference's bits where the
// type follows llama.cpp's summation orders (quant_exact.h).
#if defined(__aarch64__)
enum { QUANT_ISA_SCALAR = 0, QUANT_ISA_NEON = 1, QUANT_ISA_TOP = 1 };
#define QUANT_ISA_NAMES "neon, scalar"
#else
enum { QUANT_ISA_SCALAR = 0, QUANT_ISA_AVX2 = 1, QUANT_ISA_AVX512 = 2, QUANT_ISA_TOP = 2 };
#define QUANT_ISA_NAMES "avx512, avx2, scalar"
#endif

void quant_init(void);                      // idempotent; picks the level from CPUID / HWCAP and MOLE_ISA
const char *quant_isa_name(void);           // "avx512vnni", "avx2", "neon-dotprod", "scalar"
int quant_level(void);                      // the ISA level in use (QUANT_ISA_*)
// The level of a name MOLE_ISA takes (QUANT_ISA_NAMES); -1 otherwise.
// quant_init honours MOLE_ISA (lower levels only).
int quant_isa_from_name(const char *name);
const char *quant_isa_level_name(int level);  // the MOLE_ISA name of a level
int quant_cpu_isa(void);  // the best level this CPU has
// Force the ISA level (tests): the kernels of src/quant and src/model's ops
// both. Returns the level set (clamped to what the CPU has).
int quant_force_isa(int level);
const quant_traits *quant_traits_of(quant_type t);   // the level in use; NULL when unknown
const quant_traits *quant_traits_ref(quant_type t);  // the scalar reference level's
bool quant_type_supported(uint32_t t);               // has to_float (and vec_dot)

// Weight layouts. QL_ROWS: the GGUF's rows one after another. QL_R16: rows
// in groups of 16, interleaved block by block so that decode kernels stream
// one contiguous region with one 4-byte piece of every row per register lane
// (the layout per type: quant_r16.c); the last n_rows % 16 rows stay as in
// QL_ROWS. A group takes exactly the bytes of its 16 rows, so a matrix keeps
// its size and every row range starting on a group keeps its offset.
typedef enum { QL_ROWS = 0, QL_R16 = 1 } quant_layout;

// Whether a matrix of n_rows rows of type t can be stored as QL_R16 (its
// table row's r16: q8_0, q5_K, q6_K; q4_0 and q4_K when n_rows % 8 == 0 as
// in llama.cpp's repack).
bool quant_r16_supported(quant_type t, int64_t n_rows);
// quant_r16_supported and the level in use has group kernels for it (other
// levels convert rows back on every call: correct, slow).
bool quant_r16_preferred(quant_type t, int64_t n_rows);
// Writes groups [g0, g1) of a QL_ROWS matrix src (n_rows rows of k elements)
// into dst as QL_R16 at the same offsets; the call with g1 == n_rows / 16
// also copies the tail rows. Threads may pack disjoint group ranges.
void quant_r16_pack(quant_type t, const void *src, void *dst, int64_t k, int64_t n_rows, int64_t g0, int64_t g1);
// Row `row` (or rows [r0, r1)) of a QL_R16 matrix back in GGUF row layout.
void quant_r16_row(quant_type t, const void *W, int64_t k, int64_t n_rows, int64_t row, void *dst);
void quant_r16_rows(quant_type t, const void *W, int64_t k, int64_t n_rows, int64_t r0, int64_t r1, void *dst);

// What llama.cpp op a matmul stands for: its CPU kernels' summation order
// depends on it (quant_exact.h).
typedef struct quant_op {
  int64_t n_rows;           // rows of the whole weight matrix (ne1); 0: a multiple of 8
  bool expert;              // one expert's share of a mul_mat_id (per-token orders)
  // Several sequences' tokens in one matmul: token j belongs to segment i when
  // seg_ends[i-1] <= j < seg_ends[i] and gets the order it would have in a
  // mul_mat of that segment's tokens alone (n_seg 0: one segment of n_tok).
  int64_t n_seg;
  const int64_t *seg_ends;  // [n_seg] cumulative token counts
  const void *book;         // QT_TQ1: the model's dictionary (tq_book, quant_tq.h)
} quant_op;

// Y[j][i] = dot(W row i, X row j) for i in [i0, i1), j in [0, n_tok).
// W: rows of `wt` with row stride wstride bytes; X: rows already converted to
// vec_dot_type of wt, stride xstride bytes; Y: float rows of stride ldy floats.
void quant_gemm(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
// quant_gemm as one op of llama.cpp's CPU backend, bit for bit at every level
// where the type has its orders (quant_exact.h): n_tok is all the
// tokens of a dense mul_mat (expert false) or the tokens routed to one expert
// of a mul_mat_id (expert true); n_rows is the weight's full row count (ne1).
// quant_gemm(...) is quant_gemm_op on QL_ROWS with op {0}: dense, rows % 8 == 0.
// With QL_R16, op->n_rows is the matrix's row count and i0 starts a group
// unless it lies in the tail (threads split such matrices on multiples of 16).
// The kernels use this thread's scratch (quant_scratch_bytes).
void quant_gemm_op(quant_type wt, quant_layout lay, const void *W, size_t wstride, const void *X, size_t xstride,
                   float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, const quant_op *op);

// Scratch the kernels of one thread need for any matmul of rows up to max_k
// elements, whatever the type, layout, level and token count: what
// mole_pool_reserve (base/pool.h) must give every thread that runs them.
size_t quant_scratch_bytes(int64_t max_k);

// scalar conversions
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
