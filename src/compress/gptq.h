// compress/gptq: GPTQ (arXiv 2210.17323) on one weight matrix with a
// per-row grid, ternary (QMoE) or 2-bit, and plain round-to-nearest on the
// same grid to compare with.
#ifndef MOLE_COMPRESS_GPTQ_H
#define MOLE_COMPRESS_GPTQ_H

#include "base/base.h"

typedef enum { GPTQ_TERNARY = 0, GPTQ_2BIT = 1 } gptq_grid;

typedef struct gptq_params {
  gptq_grid grid;
  float damp;     // lambda: H += damp * mean(diag H) * I (default 0.1)
  int64_t block;  // columns per lazy batch update (default 128)
  bool rtn;       // round to nearest on the grid, no error feedback (H only for info->err; may be NULL)
  float dead_zone;  // ternary: |w| <= dead_zone * s rounds to 0; 0.5 = to nearest, more = sparser
                    // (fewer bits, more error; GPTQ's feedback makes up part of it)
  bool act_order;   // columns in order of decreasing H diagonal (GPTQ's act order); results in the original order
} gptq_params;

typedef struct gptq_info {
  bool rtn_fallback;  // Cholesky failed even after raising the dampening: RTN used
  float damp_used;    // the dampening that succeeded (p->damp for RTN and the fallback)
  // The GPTQ loss: sum over rows of (w - q) H_d (w - q)^T / n_rows, with
  // H_d = 2 H / n_samples + lambda I the dampened Hessian GPTQ minimizes and w
  // the row with dead columns zeroed (GPTQ: exactly the sum of the per-column
  // losses err^2; RTN and the fallback: computed from H, lambda from p->damp).
  // NAN for RTN without H. The undampened loss is err - lambda |W - Q|^2 / n_rows.
  double err;
  int64_t zeros;      // weights on the grid's zero (ternary: t == 0; 2-bit: q == zero)
} gptq_info;

// Row grids (from the original rows, as GPTQ's quantizer finds them), the
// scale rounded to f16 so that what is stored is what was simulated:
//   ternary: s = max|w_row|, w = s * t, t in {-1, 0, 1}
//   2-bit:   s = (max - min) / 3, z = clamp(round(-min / s), 0, 3), w = s * (q - z),
//            min <= 0 <= max (min and max of the row extended to 0, as GPTQ's)
// q = clamp(round(w / s) + z) (round half to even), on the weights as GPTQ
// has updated them by then.
// A row of zeros gets s = 0 (all t = 0 / q = z).
//
// W [n_rows][k]: the weights; on return the dequantized result (what the
// compressed matrix computes with). H [k][k]: sum of x x^T over n_samples
// calibration inputs of this matrix (full symmetric; destroyed unless rtn,
// worked on in place: no other k x k buffer is allocated). Out:
// q [n_rows][k] (ternary t or 2-bit q), scale [n_rows], zero [n_rows] (2-bit
// only; may be NULL for ternary). Uses LAPACKE (Cholesky) and CBLAS.
// When H is not positive definite, the dampening is raised tenfold up to 3
// times, then the matrix is rounded to nearest (info->rtn_fallback).
// Errors: missing arrays, non-finite weights or Hessian, n_samples <= 0
// without rtn, a row whose scale overflows f16.
mole_status gptq_quantize(const gptq_params *p, float *W, int64_t n_rows, int64_t k, float *H, int64_t n_samples,
                          int8_t *q, float *scale, uint8_t *zero, gptq_info *info);

// H [k][k] += X^T X for X [n][k] (row stride ldx floats); fills both triangles
// (one SYRK and a k x k mirror per call: call it with many rows at once).
void gptq_hessian_add(float *H, const float *X, int64_t n, int64_t k, int64_t ldx);

#endif
