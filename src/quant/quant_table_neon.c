// The NEON level's kernel table (quant_table.h): its own kernels where it
// has them, the scalar reference's elsewhere (no R16 group kernels yet, so
// quant_r16_preferred says no on ARM64).
#include "quant/quant_neon.h"
#include "quant/quant_table.h"

#define REF_CONV(t) .tr.to_float = quant_to_float_##t##_ref, .tr.from_float = quant_from_float_##t##_ref
#define EXACT(t) .tr.vec_dot = quant_vec_dot_##t##_neon, .tile = quant_exact_tile_neon
#define PLAIN(t) REF_CONV(t), .tr.vec_dot = quant_vec_dot_##t##_ref

const quant_row quant_table_neon[QT_COUNT] = {
    [QT_F32] = {QI_GEOM_F32, REF_CONV(f32), EXACT(f32)},
    [QT_F16] = {QI_GEOM_F16, .tr.to_float = quant_to_float_f16_neon, .tr.from_float = quant_from_float_f16_ref,
                EXACT(f16)},
    // the bf16 orders (x86's vdpbf16ps, with its denormal flushing) run the reference
    [QT_BF16] = {QI_GEOM_BF16, REF_CONV(bf16), EXACT(bf16)},
    [QT_Q4_0] = {QI_GEOM_Q4_0, .tr.to_float = quant_to_float_q4_0_neon, .tr.from_float = quant_from_float_q4_0_ref,
                 EXACT(q4_0)},
    [QT_Q4_1] = {QI_GEOM_Q4_1, PLAIN(q4_1)},
    [QT_Q5_0] = {QI_GEOM_Q5_0, PLAIN(q5_0)},
    [QT_Q5_1] = {QI_GEOM_Q5_1, PLAIN(q5_1)},
    [QT_Q8_0] = {QI_GEOM_Q8_0, .tr.to_float = quant_to_float_q8_0_neon, .tr.from_float = quant_from_float_q8_0_neon,
                 EXACT(q8_0)},
    [QT_Q8_1] = {QI_GEOM_Q8_1, REF_CONV(q8_1)},
    [QT_Q2_K] = {QI_GEOM_Q2_K, PLAIN(q2_K)},
    [QT_Q3_K] = {QI_GEOM_Q3_K, PLAIN(q3_K)},
    [QT_Q4_K] = {QI_GEOM_Q4_K, REF_CONV(q4_K), EXACT(q4_K)},
    [QT_Q5_K] = {QI_GEOM_Q5_K, REF_CONV(q5_K), EXACT(q5_K)},
    [QT_Q6_K] = {QI_GEOM_Q6_K, REF_CONV(q6_K), EXACT(q6_K)},
    [QT_Q8_K] = {QI_GEOM_Q8_K, .tr.to_float = quant_to_float_q8_K_ref, .tr.from_float = quant_from_float_q8_K_neon},
    [QT_TQ1] = {QI_GEOM_TQ1, .blob_gemm = quant_tq1_gemm_ref},
    [QT_TQ2] = {QI_GEOM_TQ2, .blob_gemm = quant_tq2_gemm_ref},
};
