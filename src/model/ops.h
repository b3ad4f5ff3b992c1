// ops: the element-wise and row operators of the forward pass, and the
// threaded matmul (rows of each weight split over the pool, ith/nth).
#ifndef MOLE_OPS_H
#define MOLE_OPS_H

#include "model/model.h"

// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]   (sum of squares in double, as ggml)
void ops_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
// RoPE in place on x [n_heads][head_dim] at position pos (first n_rot dims,
// at most OPS_ROPE_MAX_ROT: its table is on the stack; the loader refuses more).
enum { OPS_ROPE_MAX_ROT = 2048 };
void ops_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const model_hparams *hp, const float *freqs);
// y = silu(g) * u, n elements, bit-identical to ggml's AVX-512 build on
// AVX-512 machines (polynomial exp on blocks of 16, libm expf on the tail).
void ops_swiglu(float *y, const float *g, const float *u, int64_t n);
void ops_swiglu_ref(float *y, const float *g, const float *u, int64_t n);
void ops_swiglu_avx512(float *y, const float *g, const float *u, int64_t n);
// o[i] += w * v[i], a rounded product then a rounded sum (no fused
// multiply-add): the SIMD twin gives the scalar reference's bits.
void ops_axpy(float *restrict o, const float *restrict v, float w, int64_t n);
void ops_axpy_ref(float *restrict o, const float *restrict v, float w, int64_t n);
void ops_axpy_avx512(float *restrict o, const float *restrict v, float w, int64_t n);
// o[c] += p[i] * V[i][c] for i = 0..n-1 in turn, c < d (V [n][d]): n axpys
// with o kept in registers, the same bits as ops_axpy row after row.
void ops_pv(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d);
void ops_pv_ref(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d);
void ops_pv_avx512(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d);
float ops_expf_poly_ref(float x);
// NEON twins (ARM64): the same bits as the references
void ops_swiglu_neon(float *y, const float *g, const float *u, int64_t n);
void ops_axpy_neon(float *restrict o, const float *restrict v, float w, int64_t n);
void ops_pv_neon(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d);
// The element-wise kernels of one ISA level: ops_swiglu, ops_axpy and ops_pv
// run those of src/quant's level in use (quant_level: CPUID, MOLE_ISA,
// quant_force_isa), the AVX-512 or NEON twins at those levels, the
// references below them (AVX2 has no twins of its own).
typedef struct ops_kernels {
  void (*swiglu)(float *y, const float *g, const float *u, int64_t n);
  void (*axpy)(float *restrict o, const float *restrict v, float w, int64_t n);
  void (*pv)(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d);
} ops_kernels;
const ops_kernels *ops_kernels_at(int level);  // NULL past QUANT_ISA_TOP
// The k largest of p[0..n) in descending order (ties: the lower index):
// their indices into sel[k] and values into w[k]. k is small (selection).
void ops_topk(const float *p, int64_t n, int64_t k, int32_t *sel, float *w);
// x = softmax(x * scale) in place, n elements: the products and their max
// in float, exp(x - max) with libm's expf summed in double, each times
// 1/sum rounded to float.
void ops_softmax(float *x, int64_t n, float scale);
// Sum of 16 floats in the tree order of _mm512_reduce_add_ps.
float ops_hsum16(const float *a);

// One matmul: Y[j][i] = W[mat] row i . X row j, i over all rows of W.
typedef struct ops_mm {
  const model_tensor *w;
  int64_t mat;       // which matrix of a stacked (expert) tensor
  const void *x;     // n_tok rows in the vec_dot type of w->type
  size_t xstride;    // bytes between rows of x
  int64_t n_tok;
  float *y;          // [n_tok][ldy]
  int64_t ldy;
  bool expert;       // one expert's share of a routed (mul_mat_id) product: the
                     // kernels follow llama.cpp's summation order for that op
  int64_t n_seg;     // > 0: the tokens are several sequences' (quant_op):
  const int64_t *seg_ends;  // [n_seg] cumulative token counts
} ops_mm;

// Runs all matmuls in one fork/join: every thread takes its slice of the
// rows of every task.
void ops_mm_run(mole_pool *pool, const ops_mm *tasks, int64_t n_tasks);
// Reserves the kernel scratch (quant_scratch_bytes) of every thread of
// m->pool for the longest row of m's matrices: at load, so that a failure is
// an error there and the matmuls never allocate.
mole_status ops_mm_reserve(mole_model *m);

// Converts n rows of k floats (stride ldx) to type vt rows at out (stride
// ostride bytes); threaded when large.
void ops_convert_rows(mole_pool *pool, quant_type vt, const float *x, int64_t ldx, int64_t n, int64_t k, void *out,
                      size_t ostride);

// The type activations are converted to before a matmul with w.
static inline quant_type ops_vec_type(const model_tensor *w) { return quant_traits_of(w->type)->vec_dot_type; }

#endif
