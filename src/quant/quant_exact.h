// quant_exact: matmuls whose every output is bit-identical to what llama.cpp's
// CPU backend (x86 build with AVX-512 F/BW/VL/DQ + VNNI + BF16, llamafile and
// the CPU "repack" buffers on, as llama-cli runs by default) computes for the
// same weights and the same (already converted) activations.
//
// llama.cpp does not use one summation order per weight type: it depends on
// the op and the batch. Per type, the kernel that runs there:
//   q8_0        vec_dot_q8_0_q8_0 / tinyBLAS_Q0 (one order: 8 float lanes,
//               lane l += d * dot(bytes 4l..4l+3) per block, then hsum8)
//   q4_0        repack q4_0_8x8 gemm/gemv when rows % 8 == 0 (one fma per
//               block: acc = fma(isum, dw*dx, acc)); else as q8_0
//   q4_K        repack q4_K_8x8 when rows % 8 == 0: gemm (one fma per 64
//               elements) for the first n - n%4 tokens of a dense mul_mat,
//               gemv (one fma per 256) for the others and for mul_mat_id;
//               else vec_dot_q4_K_q8_K (8 lanes + 4 min lanes)
//   q5_K, q6_K  vec_dot (8 float lanes of int sums, one fma per 256)
//   f32, f16    tinyBLAS (16 lanes, fma per 16) for a dense mul_mat of >= 2
//               tokens when k % 16 == 0 and rows % 4 == 0; else vec_dot
//               (4 x 16 lanes per 64, tail in float fma / double)
//   bf16        tinyBLAS (dpbf16 per 32) likewise when k % 32 == 0; else
//               vec_dot_bf16 (two dpbf16 accumulators, summed in double)
// Activations: q8_0 / q8_K / f16 / bf16 as quant_traits from_float makes them.
#ifndef MOLE_QUANT_EXACT_H
#define MOLE_QUANT_EXACT_H

#include "quant/quant.h"

// One summation order of llama.cpp (see above).
typedef enum {
  QX_NONE = 0,
  QX_Q8_0,        // 8 lanes, fma per block, hsum8 (q8_0; q4_0 without repack)
  QX_Q4_0_L8,     // the same order for q4_0 weights
  QX_Q4_0_C1,     // repack: one fma per block
  QX_Q4_K_K8,     // vec_dot_q4_K_q8_K
  QX_Q4_K_V256,   // repack gemv
  QX_Q4_K_V64,    // repack gemm
  QX_Q5_K_K8,     // vec_dot_q5_K_q8_K
  QX_Q6_K_K8,     // vec_dot_q6_K_q8_K
  QX_F32_VEC,     // ggml_vec_dot_f32
  QX_F32_T16,     // tinyBLAS f32
  QX_F16_VEC,     // ggml_vec_dot_f16 (no AVX512-FP16)
  QX_F16_T16,     // tinyBLAS f16
  QX_BF16_VEC,    // ggml_vec_dot_bf16
  QX_BF16_T32,    // tinyBLAS bf16
  QX_ORDER_COUNT
} qx_order;

typedef quant_op qx_op;  // quant.h

// The order of output (row, token j) of a matmul over n_tok tokens (the whole
// batch of a dense mul_mat, or the tokens routed to one expert); QX_NONE when
// the type has no exact kernel.
qx_order quant_exact_order(quant_type wt, const qx_op *op, int64_t n_tok, int64_t j, int64_t k);

// The kernels of the orders at one ISA level (quant_table.h's rows hold
// them). tile: Y[j][i] for rows [i0, i1) and tokens [j0, j1), all in order o
// (layout as quant_gemm). tile_r16: the same on the groups of a QL_R16
// matrix of n_rows rows of type t, rows [i0, i1) with i0 % 16 == 0 and
// i1 <= 16 * (n_rows / 16) (row stride: the row size). Every level's kernels
// give the scalar references' bits.
typedef void (*qx_tile_fn)(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
typedef void (*qx_tile_r16_fn)(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                               float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// The scalar references (quant_exact_ref.c; the R16 one converts rows back,
// quant_r16.c). dot: s = dot(w, x) in order o, w one weight row, x one
// activation row (its vec_dot_type), k elements.
void quant_exact_dot_ref(qx_order o, int64_t k, float *s, const void *w, const void *x);
void quant_exact_tile_ref(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                          int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
void quant_exact_tile_r16_ref(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                              float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// quant_gemm with llama.cpp's arithmetic for the op, with the kernels of the
// level in use (quant.c): the tokens split by order. Returns false (writes
// nothing) when wt has no exact order. QL_R16 needs op->n_rows (the matrix's
// rows) and wstride = the row size.
bool quant_exact_gemm(quant_type wt, const qx_op *op, quant_layout lay, const void *W, size_t wstride, const void *X,
                      size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

// A type's vec_dot at a level is its one-token order (a mul_mat of one
// token, rows a multiple of 8) through that level's dot: QX_VEC_DOTS(isa,
// dot) defines quant_vec_dot_<type>_<isa> for the types with orders,
// QX_VEC_DOTS_DECL(isa) declares them.
#define QX_ONE_TOKEN_ORDERS(X, isa, dot)                                                                        \
  X(q8_0, QX_Q8_0, isa, dot) X(q4_0, QX_Q4_0_C1, isa, dot) X(q4_K, QX_Q4_K_V256, isa, dot)                     \
  X(q5_K, QX_Q5_K_K8, isa, dot) X(q6_K, QX_Q6_K_K8, isa, dot) X(f32, QX_F32_VEC, isa, dot)                     \
  X(f16, QX_F16_VEC, isa, dot) X(bf16, QX_BF16_VEC, isa, dot)
#define QX_VEC_DOT_SIG(t, isa) \
  void quant_vec_dot_##t##_##isa(int64_t n, float *restrict s, const void *restrict x, const void *restrict y)
#define QX_VEC_DOT_DEF(t, ord, isa, dot) \
  QX_VEC_DOT_SIG(t, isa) { dot(ord, n, s, x, y); }
#define QX_VEC_DOT_DECL(t, ord, isa, dot) QX_VEC_DOT_SIG(t, isa);
#define QX_VEC_DOTS(isa, dot) QX_ONE_TOKEN_ORDERS(QX_VEC_DOT_DEF, isa, dot)
#define QX_VEC_DOTS_DECL(isa) QX_ONE_TOKEN_ORDERS(QX_VEC_DOT_DECL, isa, _)

#endif
