// quant_table: the kernel tables. Each ISA level has one table, a row per
// type id, in its own file: quant_table_ref.c (the scalar reference, every
// architecture), quant_table_avx2.c and quant_table_avx512.c (x86-64),
// quant_table_neon.c (ARM64). quant.c picks the best level this CPU has once
// at start-up (CPUID / HWCAP; MOLE_ISA or quant_force_isa may pick a lower
// one) and every kernel call goes through that level's row of its type.
// A table is complete: what a level does not speed up, its row points at
// the reference kernel. Dependencies run one way: the scalar reference
// (quant_ref.c, quant_exact_ref.c, quant_r16.c, quant_tq.c) dispatches into
// nothing (it takes only its scratch from quant.c); a SIMD file may call the
// reference (tails, rare shapes) and its own level's files, never another
// level's.
//
// What a new tensor type (say q2_K with llama.cpp's order, or iq4_xs) needs:
//  1. quant_types.c: its geometry (every GGUF id already has one);
//     quant_internal.h: its block struct with a _Static_assert on its size;
//     below: a QI_GEOM_<type> line (name, block, bytes, vec_dot_type, R16).
//  2. The scalar reference, in quant_ref.c or a new quant_<type>_ref.c
//     (declared in quant_ref.h): to_float, from_float, and its dot product:
//     - a type whose results must match llama.cpp bit for bit has its
//       summation orders in quant_exact.h: a qx_order per order, the case of
//       quant_exact_order (quant.c) that picks it per op and batch, the case
//       of quant_exact_dot_ref that computes it, and a QX_ONE_TOKEN_ORDERS
//       entry for its vec_dot; its rows' tile is each level's
//       quant_exact_tile_<isa> (AVX2's and NEON's run the reference's dot for
//       an order they have no twin of; AVX-512's tile or dot needs a case);
//     - otherwise a plain quant_vec_dot_<type>_ref (results within float
//       tolerance of each other across levels), and optionally a gemm.
//  3. Per SIMD level whose speed matters, the twins in that level's files
//     (quant_<type>_avx2.c or additions to quant_avx2.c, ..._avx512.c,
//     ..._neon.c, declared in quant_<isa>.h), bit-identical to the
//     reference for exact orders. Scratch they take comes from
//     quant_scratch(), which quant_scratch_bytes must bound.
//  4. One row in each of the four tables (fields not filled stay NULL, which
//     means "none" as described at quant_row).
//  5. Tests: the type in test_quant.c's k_weight_types (its twins against the
//     reference at awkward sizes, the scratch bound; test_tables checks the
//     rows agree) and its orders in test_quant_exact.c's k_orders.
//  An R16 layout (quant_r16.c) comes only with group kernels for it.
#ifndef MOLE_QUANT_TABLE_H
#define MOLE_QUANT_TABLE_H

#include "quant/quant_exact.h"
#include "quant/quant_internal.h"
#include "quant/quant_tq.h"

// Which matrices of a type may be stored as QL_R16 (quant_r16_supported).
typedef enum {
  QR16_NONE = 0,   // no R16 layout
  QR16_ANY = 1,    // 16 rows or more
  QR16_ROWS8 = 2,  // and rows % 8 == 0 (llama.cpp's repack orders exist only then)
} quant_r16_need;

// A tiled matmul of a type without exact orders, as quant_gemm; false when
// it does not take this shape (the caller falls back to vec_dot loops).
typedef bool (*quant_gemm_fn)(quant_type wt, const void *W, size_t wstride, const void *X, size_t xstride, float *Y,
                              int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
// The matmul of a blob type (quant_tq.h): rows [i0, i1) of an n_rows blob
// (i0 a multiple of 16 or i1 == n_rows), float activations; b: the
// dictionary (TQ1; TQ2 has none and ignores it).
typedef void (*quant_blob_gemm_fn)(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride,
                                   float *Y, int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

typedef struct quant_row {
  // name, block size, bytes per block, vec_dot_type; to_float, from_float
  // (NULL for blobs); vec_dot: one weight row against one activation row,
  // in llama.cpp's one-token order where the type has orders (NULL for
  // activation-only types and blobs)
  quant_traits tr;
  quant_r16_need r16;
  // llama.cpp's orders (quant_exact.h): the tile of this level for every
  // order of the type; NULL when the type has none (then gemm or vec_dot)
  qx_tile_fn tile;
  // the same on R16 groups; NULL when this level has no group kernel for the
  // type (quant_r16_preferred says no; R16 matrices are converted back)
  qx_tile_r16_fn tile_r16;
  quant_gemm_fn gemm;            // NULL: vec_dot loops over 16-row panels
  quant_blob_gemm_fn blob_gemm;  // blob types only
} quant_row;

// The geometry part of a row, the same in every table.
#define QI_GEOM(nm, blck, size, quantized, vdt) \
  .tr.name = nm, .tr.blck_size = blck, .tr.type_size = size, .tr.is_quantized = quantized, .tr.vec_dot_type = vdt
#define QI_GEOM_F32 QI_GEOM("f32", 1, sizeof(float), false, QT_F32)
#define QI_GEOM_F16 QI_GEOM("f16", 1, sizeof(uint16_t), false, QT_F16)
#define QI_GEOM_BF16 QI_GEOM("bf16", 1, sizeof(uint16_t), false, QT_BF16)
#define QI_GEOM_Q4_0 QI_GEOM("q4_0", QK4_0, sizeof(blk_q4_0), true, QT_Q8_0), .r16 = QR16_ROWS8
#define QI_GEOM_Q4_1 QI_GEOM("q4_1", QK4_0, sizeof(blk_q4_1), true, QT_Q8_1)
#define QI_GEOM_Q5_0 QI_GEOM("q5_0", QK4_0, sizeof(blk_q5_0), true, QT_Q8_0)
#define QI_GEOM_Q5_1 QI_GEOM("q5_1", QK4_0, sizeof(blk_q5_1), true, QT_Q8_1)
#define QI_GEOM_Q8_0 QI_GEOM("q8_0", QK8_0, sizeof(blk_q8_0), true, QT_Q8_0), .r16 = QR16_ANY
#define QI_GEOM_Q8_1 QI_GEOM("q8_1", QK8_0, sizeof(blk_q8_1), true, QT_Q8_1)
#define QI_GEOM_Q2_K QI_GEOM("q2_k", QK_K, sizeof(blk_q2_K), true, QT_Q8_K)
#define QI_GEOM_Q3_K QI_GEOM("q3_k", QK_K, sizeof(blk_q3_K), true, QT_Q8_K)
#define QI_GEOM_Q4_K QI_GEOM("q4_k", QK_K, sizeof(blk_q4_K), true, QT_Q8_K), .r16 = QR16_ROWS8
#define QI_GEOM_Q5_K QI_GEOM("q5_k", QK_K, sizeof(blk_q5_K), true, QT_Q8_K), .r16 = QR16_ANY
#define QI_GEOM_Q6_K QI_GEOM("q6_k", QK_K, sizeof(blk_q6_K), true, QT_Q8_K), .r16 = QR16_ANY
#define QI_GEOM_Q8_K QI_GEOM("q8_k", QK_K, sizeof(blk_q8_K), true, QT_Q8_K)
// blobs: no blocks; float activations
#define QI_GEOM_TQ1 QI_GEOM("tq1_dict", 0, 0, true, QT_F32)
#define QI_GEOM_TQ2 QI_GEOM("tq2_row", 0, 0, true, QT_F32)

// The tables (rows of ids without kernels are all zero).
extern const quant_row quant_table_ref[QT_COUNT];
#if defined(__aarch64__)
extern const quant_row quant_table_neon[QT_COUNT];
#else
extern const quant_row quant_table_avx2[QT_COUNT];
extern const quant_row quant_table_avx512[QT_COUNT];
#endif

// The table of a level (QUANT_ISA_*), whether this CPU runs it or not
// (tests compare levels); NULL past the top.
const quant_row *quant_table_at(int level);
// The row of t at the level in use; NULL when t has none.
const quant_row *quant_row_of(quant_type t);

#endif
