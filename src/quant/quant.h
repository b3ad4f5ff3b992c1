// quant: tensor types. One traits table indexed by type id (the GGUF/ggml
// ids), a scalar reference table (`_ref` kernels) and the active table whose
// entries are the best SIMD kernels for this CPU (chosen once from CPUID).
#ifndef MOLE_QUANT_H
#define MOLE_QUANT_H

#include "base/base.h"

typedef enum {
  QT_F32 = 0,
  QT_F16 = 1,
  QT_Q4_0 = 2,
  QT_Q4_1 = 3,
  QT_Q5_0 = 6,
  QT_Q5_1 = 7,
  QT_Q8_0 = 8,
  QT_Q8_1 = 9,
  QT_Q2_K = 10,
  QT_Q3_K = 11,
  QT_Q4_K = 12,
  QT_Q5_K = 13,
  QT_Q6_K = 14,
  QT_Q8_K = 15,
  QT_BF16 = 30,
  QT_COUNT = 40,  // ids below this may be known to the table
} quant_type;

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
  quant_vec_dot_fn vec_dot;        // s = dot(x, y); NULL when not a weight type
} quant_traits;

void quant_init(void);                      // idempotent; picks kernels from CPUID
const char *quant_isa_name(void);           // "avx512vnni", "avx2", "scalar"
// Force the ISA level (tests): 0 scalar, 1 avx2, 2 avx512. Returns the level set
// (clamped to what the CPU has).
int quant_force_isa(int level);
const quant_traits *quant_traits_of(quant_type t);   // NULL when unknown
const quant_traits *quant_traits_ref(quant_type t);  // scalar reference twins
bool quant_type_supported(uint32_t t);               // has to_float (and vec_dot)
// Geometry of any known type id (quant_types.c), computable or not.
bool quant_type_known(uint32_t t);
int64_t quant_blck_size(uint32_t t);                 // 0 when unknown
size_t quant_type_size(uint32_t t);                  // bytes per block, 0 when unknown
const char *quant_type_name(uint32_t t);             // "q4_0" or "type#N"
int quant_type_from_name(const char *name);          // -1 when unknown
// Bytes of a row of n elements; 0 if n is not a multiple of the block size.
size_t quant_row_size(quant_type t, int64_t n);

// Y[j][i] = dot(W row i, X row j) for i in [i0, i1), j in [0, n_tok).
// W: rows of `wt` with row stride wstride bytes; X: rows already converted to
// vec_dot_type of wt, stride xstride bytes; Y: float rows of stride ldy floats.
void quant_gemm(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
// quant_gemm as one op of llama.cpp's CPU backend, bit for bit where the CPU
// has AVX-512 and the type an exact kernel (quant_exact.h): n_tok is all the
// tokens of a dense mul_mat (expert false) or the tokens routed to one expert
// of a mul_mat_id (expert true); n_rows is the weight's full row count (ne1).
// quant_gemm(...) is quant_gemm_op(..., 0, false): dense, rows % 8 == 0.
void quant_gemm_op(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                   int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k, int64_t n_rows, bool expert);

// scalar conversions
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
