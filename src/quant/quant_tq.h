// quant_tq: the compressed expert types of `mole compress` (QMoE, arXiv
// 2310.16795). Neither is a block type: a matrix is one self-describing blob.
//
// TQ1 (QT_TQ1): ternary weights w = s_row * t, t in {-1, 0, +1}, coded with a
// dictionary of up to 2^16 variable-length codewords shared by the whole
// model. A codeword stands for a run of 1..TQ_PAIRS_MAX pairs of weights; a
// pair (t0, t1) is the symbol 3*(t0+1) + (t1+1) (0..8; 4 is the zero pair).
// Every row is coded on its own (codes never cross a row boundary).
//
//   blob of one n_rows x k matrix (k even), little-endian, G = ceil(n_rows/16):
//     u32 gidx[G + 1]   index of the first code of each group of 16 rows;
//                       gidx[0] = 0, gidx[G] = n_codes, non-decreasing
//     u16 scale[n_rows] f16 row scale s_row
//     u16 code[n_codes] codewords, row after row
//   (then zero padding up to the matrix's stride)
//
// The dictionary is stored compactly as n entries of 3 bytes: u16 parent+1
// (0: none) and u8 symbol; entry i's run is parent's run followed by the
// symbol, parent < i. Every one of the 9 one-pair runs must be an entry (so
// any row can be coded). tq_book_new expands it into the decode table.
//
// TQ2 (QT_TQ2): dense 2-bit weights on a per-row grid w = s_row * (q - z_row),
// q in 0..3:
//     u16 scale[n_rows] f16;  u8 zero[n_rows];  zero bytes up to a multiple of 4;
//     then the rows, k/4 bytes each: weight j in bits 2*(j%4) of byte j/4.
//
// Both compute with float activations (vec_dot_type F32): the kernels bring
// each activation row to int16 with one scale (x16 = round(x * 16383 /
// max|x|)) and accumulate exactly in int32, so the SIMD kernels give the
// reference's bits.
#ifndef MOLE_QUANT_TQ_H
#define MOLE_QUANT_TQ_H

#include "quant/quant.h"

// TQ_K_MAX: the longest row the kernels take (their int32 sums stay exact).
enum { TQ_PAIRS_MAX = 32, TQ_BOOK_MAX = 65536, TQ_SYMBOLS = 9, TQ_ZERO_PAIR = 4, TQ_K_MAX = 1 << 17 };
// TQ_WINDOW_WEIGHTS: a book whose runs all fit one 256-bit window ("narrow": at
// most 32 weights a code) decodes each code into one 256-bit window, about
// 1.45x as fast as a 512-bit one on Zen 4 (quant_bench tq).
// TQ_NARROW_PAIRS: the longest run mole compress puts in a dictionary (30
// weights). A book whose runs fit it also gets the packed table `pk`: one
// 64-bit load per code gives both its u bytes and its length, and the
// one-token AVX-512 kernel (with VBMI) takes about 1.2x fewer cycles a code.
enum { TQ_WINDOW_WEIGHTS = 32, TQ_NARROW_PAIRS = 15 };

// One decode-table entry: bit j of plus (minus) set when weight j of the run
// is +1 (-1); len: weights the run covers (2 .. 2*TQ_PAIRS_MAX, even).
typedef struct tq_entry {
  uint64_t plus, minus;
} tq_entry;
_Static_assert(sizeof(tq_entry) == 16, "tq entry");

typedef struct tq_book {
  int64_t n;          // entries
  tq_entry *ent;      // [n] 64-byte aligned
  uint8_t *len;       // [n] weights per entry
  int32_t *child;     // [n][TQ_SYMBOLS] entry extending entry i by a symbol, -1 if none (encoder)
  int32_t root[TQ_SYMBOLS];  // the one-pair entries
  uint64_t *um;       // [n][2] 64-byte aligned, for the SIMD kernels: bit j of um[2i] set when weight j of
                      // entry i's run is 0 (j < len), of um[2i+1] when it is +1
  int max_len;        // weights in the longest run
  uint64_t *um32;     // narrow books (max_len <= TQ_WINDOW_WEIGHTS) only, else NULL: [n] um[2i] | um[2i+1] << 32
  uint64_t *pk;       // books with max_len <= 2 * TQ_NARROW_PAIRS only, else NULL: [n] u_j (1 where weight j
                      // of the run is 0, 2 where +1, else 0) in bits 2j..2j+1, j < 30; len / 2 in bits 60..63
} tq_book;

// Expands a compact dictionary (3*n bytes, see above). Errors (a parent that
// does not come before its child, a symbol > 8, a run over TQ_PAIRS_MAX
// pairs, a missing one-pair run, a repeated run, n out of 9..65536) name the entry.
mole_status tq_book_new(const uint8_t *compact, int64_t n, tq_book **out);
void tq_book_free(tq_book *b);

// Blob geometry. tq1: the fixed part (gidx + scales) and the byte offset of
// the codes; tq2: the whole blob.
size_t tq1_codes_offset(int64_t n_rows);
size_t tq2_matrix_bytes(int64_t n_rows, int64_t k);
// Codes a ternary matrix: t [n_rows][k] in {-1,0,1}, scale [n_rows] (f32,
// stored as f16), greedy longest match per row. dst NULL: returns the bytes
// the blob takes; else writes it (cap bytes) and returns its size (0 when cap
// is short).
size_t tq1_encode(const tq_book *b, const int8_t *t, const float *scale, int64_t n_rows, int64_t k, void *dst,
                  size_t cap);
// Checks a blob of `bytes` bytes against the book and shape: k even and at
// most TQ_K_MAX, gidx in range and non-decreasing, every code < n, every
// row's codes cover exactly k weights (then the kernels are safe on it).
// On failure writes what is wrong (group, row, code index) into err.
bool tq1_check(const tq_book *b, const void *blob, size_t bytes, int64_t n_rows, int64_t k, char *err, size_t errlen);
// Row r of a blob as floats [k] (s_row * t).
void tq1_row_to_float(const tq_book *b, const void *blob, int64_t n_rows, int64_t k, int64_t r, float *y);
size_t tq2_encode(const uint8_t *q, const float *scale, const uint8_t *zero, int64_t n_rows, int64_t k, void *dst);
void tq2_row_to_float(const void *blob, int64_t n_rows, int64_t k, int64_t r, float *y);

// Y[j][i] = row i of W . X row j for rows [i0, i1) (i0 a multiple of 16 or
// i1 == n_rows), tokens [0, n_tok); X: float rows (stride xstride bytes).
// The decode of each code is shared by all tokens (batched prefill). With
// the kernels of the level in use (quant.c); the _ref ones are the scalar
// references of every level's (quant_table.h), TQ2's takes the (absent)
// book as the others do.
void quant_tq1_gemm(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                    int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
void quant_tq2_gemm(const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y, int64_t ldy, int64_t i0,
                    int64_t i1, int64_t n_tok, int64_t k);
void quant_tq1_gemm_ref(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                        int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);
void quant_tq2_gemm_ref(const tq_book *b, const void *W, int64_t n_rows, const float *X, size_t xstride, float *Y,
                        int64_t ldy, int64_t i0, int64_t i1, int64_t n_tok, int64_t k);

// The activation row as int16 with one scale (all kernels use this): x16
// [k + 64] (64 zeros after the row, for over-reads); returns max|x| / 16383
// (0 for an all-zero row).
float tq_quantize_x(const float *x, int64_t k, int16_t *x16);

#endif
