// quant_ref: the scalar reference kernels of every type (quant_ref.c; the
// one-token vec_dots of the types with llama.cpp orders come from
// quant_exact_ref.c). They define the numerics: every SIMD twin is tested
// against them, and a SIMD level's table points at them for what it does not
// speed up. Signatures: quant.h's quant_to_float_fn, quant_from_float_fn,
// quant_vec_dot_fn.
#ifndef MOLE_QUANT_REF_H
#define MOLE_QUANT_REF_H

#include "quant/quant_exact.h"
#include "quant/quant_internal.h"

#define QI_REF_TYPES(X) \
  X(f32) X(f16) X(bf16) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q8_1) X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K) X(q8_K)

#define QI_DECL_CONV(t)                                                                \
  void quant_to_float_##t##_ref(const void *restrict x, float *restrict y, int64_t n); \
  void quant_from_float_##t##_ref(const float *restrict x, void *restrict y, int64_t n);
QI_REF_TYPES(QI_DECL_CONV)
#undef QI_DECL_CONV

// the types without llama.cpp orders (quant_ref.c)
#define QI_DECL_DOT(t) \
  void quant_vec_dot_##t##_ref(int64_t n, float *restrict s, const void *restrict x, const void *restrict y);
QI_DECL_DOT(q4_1) QI_DECL_DOT(q5_0) QI_DECL_DOT(q5_1) QI_DECL_DOT(q2_K) QI_DECL_DOT(q3_K)
#undef QI_DECL_DOT

// the types with orders: their one-token order (quant_exact_ref.c)
QX_VEC_DOTS_DECL(ref)

#endif
