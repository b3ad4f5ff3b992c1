// The scalar reference level's kernel table (quant_table.h): every type's
// row, complete; the other levels' tables point here for what they do not
// speed up.
#include "quant/quant_ref.h"
#include "quant/quant_table.h"

#define CONV(t) .tr.to_float = quant_to_float_##t##_ref, .tr.from_float = quant_from_float_##t##_ref
// a type with llama.cpp's orders: its one-token vec_dot and the tiles
#define EXACT(t) CONV(t), .tr.vec_dot = quant_vec_dot_##t##_ref, .tile = quant_exact_tile_ref
#define PLAIN(t) CONV(t), .tr.vec_dot = quant_vec_dot_##t##_ref

const quant_row quant_table_ref[QT_COUNT] = {
    [QT_F32] = {QI_GEOM_F32, EXACT(f32)},
    [QT_F16] = {QI_GEOM_F16, EXACT(f16)},
    [QT_BF16] = {QI_GEOM_BF16, EXACT(bf16)},
    [QT_Q4_0] = {QI_GEOM_Q4_0, EXACT(q4_0)},
    [QT_Q4_1] = {QI_GEOM_Q4_1, PLAIN(q4_1)},
    [QT_Q5_0] = {QI_GEOM_Q5_0, PLAIN(q5_0)},
    [QT_Q5_1] = {QI_GEOM_Q5_1, PLAIN(q5_1)},
    [QT_Q8_0] = {QI_GEOM_Q8_0, EXACT(q8_0)},
    [QT_Q8_1] = {QI_GEOM_Q8_1, CONV(q8_1)},
    [QT_Q2_K] = {QI_GEOM_Q2_K, PLAIN(q2_K)},
    [QT_Q3_K] = {QI_GEOM_Q3_K, PLAIN(q3_K)},
    [QT_Q4_K] = {QI_GEOM_Q4_K, EXACT(q4_K)},
    [QT_Q5_K] = {QI_GEOM_Q5_K, EXACT(q5_K)},
    [QT_Q6_K] = {QI_GEOM_Q6_K, EXACT(q6_K)},
    [QT_Q8_K] = {QI_GEOM_Q8_K, CONV(q8_K)},
    [QT_TQ1] = {QI_GEOM_TQ1, .blob_gemm = quant_tq1_gemm_ref},
    [QT_TQ2] = {QI_GEOM_TQ2, .blob_gemm = quant_tq2_gemm_ref},
};
