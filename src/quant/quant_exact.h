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

// s = dot(w, x) in order o: w one weight row, x one activation row (its
// vec_dot_type), k elements. Scalar reference and SIMD twin (same bits).
void quant_exact_dot_ref(qx_order o, int64_t k, float *s, const void *w, const void *x);
void quant_exact_dot_avx512(qx_order o, int64_t k, float *s, const void *w, const void *x);

// Y[j][i] for rows [i0, i1) and tokens [j0, j1), all in order o (layout as
// quant_gemm). Scalar and AVX-512 versions.
void quant_exact_tile_ref(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                          int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
void quant_exact_tile_avx512(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                             int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// The same on the groups of a QL_R16 matrix of n_rows rows of type t: rows
// [i0, i1) with i0 % 16 == 0 and i1 <= 16 * (n_rows / 16) (row stride: the
// row size). The reference converts rows back and runs quant_exact_dot_ref.
void quant_exact_tile_r16_ref(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                              float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
void quant_exact_tile_r16_avx512(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X,
                                 size_t xstride, float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                                 int64_t k);

// quant_gemm with llama.cpp's arithmetic for the op: splits the tokens by
// order and runs the best kernel this CPU has (AVX-512, else the scalar
// reference). Returns false (writes nothing) when wt has no exact kernel.
// QL_R16 needs op->n_rows (the matrix's rows) and wstride = the row size.
bool quant_exact_gemm(quant_type wt, const qx_op *op, quant_layout lay, const void *W, size_t wstride, const void *X, size_t xstride,
                      float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

// AVX2 (+FMA, F16C) twins: the same bits on x86-64 without AVX-512.
void quant_exact_dot_avx2(qx_order o, int64_t k, float *s, const void *w, const void *x);
void quant_exact_tile_avx2(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// R16 groups at AVX2: q4_0 (C1) and q4_K (V256, V64) have kernels (the
// others run the reference through quant_exact_tile_r16_ref).
bool quant_exact_r16_avx2(qx_order o);
void quant_exact_tile_r16_avx2(qx_order o, quant_type t, const void *W, int64_t n_rows, const void *X, size_t xstride,
                               float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// NEON (ARMv8.2 dotprod) twins of the same orders: the same bits on ARM64.
// Orders without a NEON kernel run the scalar reference inside them.
void quant_exact_dot_neon(qx_order o, int64_t k, float *s, const void *w, const void *x);
void quant_exact_tile_neon(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);

// The R16 group kernels of QUANT_ISA_EXACT_SIMD (AVX-512 on x86-64; ARM64 has
// none yet, and quant_r16_preferred never says yes there).
#if defined(__aarch64__)
#define quant_exact_tile_r16_simd quant_exact_tile_r16_ref
#else
#define quant_exact_tile_r16_simd quant_exact_tile_r16_avx512
#endif

// The twins of an ISA level (quant.h's QUANT_ISA_*; the scalar references at 0).
typedef void (*qx_dot_fn)(qx_order o, int64_t k, float *s, const void *w, const void *x);
typedef void (*qx_tile_fn)(qx_order o, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                           int64_t ldy, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k);
qx_dot_fn quant_exact_dot_of(int level);
qx_tile_fn quant_exact_tile_of(int level);

// Per-type vec_dot with the one-token order (the n_tok == 1 / expert order,
// rows assumed a multiple of 8) at an ISA level, in the quant_vec_dot_fn
// signature; NULL when the type has none.
quant_vec_dot_fn quant_exact_vec_dot(quant_type wt, int level);


#endif
