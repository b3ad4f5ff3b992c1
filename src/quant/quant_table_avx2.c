// The AVX2 level's kernel table (quant_table.h): its own kernels where it
// has them, the scalar reference's elsewhere.
#include "quant/quant_avx2.h"
#include "quant/quant_table.h"

#define REF_CONV(t) .tr.to_float = quant_to_float_##t##_ref, .tr.from_float = quant_from_float_##t##_ref
#define EXACT(t) .tr.vec_dot = quant_vec_dot_##t##_avx2, .tile = quant_exact_tile_avx2
#define PLAIN(t) REF_CONV(t), .tr.vec_dot = quant_vec_dot_##t##_avx2

const quant_row quant_table_avx2[QT_COUNT] = {
    [QT_F32] = {QI_GEOM_F32, REF_CONV(f32), EXACT(f32)},
    [QT_F16] = {QI_GEOM_F16, .tr.to_float = quant_to_float_f16_avx2, .tr.from_float = quant_from_float_f16_avx2,
                EXACT(f16)},
    // the bf16 orders (x86's vdpbf16ps, with its denormal flushing) run the reference
    [QT_BF16] = {QI_GEOM_BF16, .tr.to_float = quant_to_float_bf16_avx2, .tr.from_float = quant_from_float_bf16_avx2,
                 EXACT(bf16)},
    [QT_Q4_0] = {QI_GEOM_Q4_0, REF_CONV(q4_0), EXACT(q4_0), .tile_r16 = quant_exact_tile_r16_avx2},
    [QT_Q4_1] = {QI_GEOM_Q4_1, PLAIN(q4_1)},
    [QT_Q5_0] = {QI_GEOM_Q5_0, PLAIN(q5_0)},
    [QT_Q5_1] = {QI_GEOM_Q5_1, PLAIN(q5_1)},
    [QT_Q8_0] = {QI_GEOM_Q8_0, .tr.to_float = quant_to_float_q8_0_ref, .tr.from_float = quant_from_float_q8_0_avx2,
                 EXACT(q8_0)},
    [QT_Q8_1] = {QI_GEOM_Q8_1, .tr.to_float = quant_to_float_q8_1_ref, .tr.from_float = quant_from_float_q8_1_avx2},
    [QT_Q2_K] = {QI_GEOM_Q2_K, PLAIN(q2_K)},
    [QT_Q3_K] = {QI_GEOM_Q3_K, PLAIN(q3_K)},
    [QT_Q4_K] = {QI_GEOM_Q4_K, REF_CONV(q4_K), EXACT(q4_K), .tile_r16 = quant_exact_tile_r16_avx2},
    [QT_Q5_K] = {QI_GEOM_Q5_K, REF_CONV(q5_K), EXACT(q5_K)},
    [QT_Q6_K] = {QI_GEOM_Q6_K, REF_CONV(q6_K), EXACT(q6_K)},
    [QT_Q8_K] = {QI_GEOM_Q8_K, .tr.to_float = quant_to_float_q8_K_ref, .tr.from_float = quant_from_float_q8_K_avx2},
    [QT_TQ1] = {QI_GEOM_TQ1, .blob_gemm = quant_tq1_gemm_avx2},
    [QT_TQ2] = {QI_GEOM_TQ2, .blob_gemm = quant_tq2_gemm_ref},
};
