// engine/compress: `mole compress` (QMoE, arXiv 2310.16795). Runs the model
// on calibration text, captures the inputs routed to every expert, layer by
// layer (each layer sees the outputs of the layers already compressed),
// quantizes every expert matrix with GPTQ on a ternary (or 2-bit) per-row
// grid, builds the 2^16-entry dictionary of ternary pair runs over the whole
// model, and writes a packed expert store (docs/FORMAT.md) whose high
// precision is the compressed experts. Memory stays bounded by one layer's
// capture and one expert's matrices: the ternary matrices wait in a temporary
// file until the dictionary exists.
#ifndef MOLE_ENGINE_COMPRESS_H
#define MOLE_ENGINE_COMPRESS_H

#include <stdio.h>

#include "compress/gptq.h"

typedef struct compress_params {
  const char *calib;      // calibration text (required unless rtn)
  int64_t calib_tokens;   // tokens of it to use (default 16384)
  int64_t seq_len;        // calibration sequences of this many tokens, BOS first (default 512)
  gptq_grid grid;         // ternary (default) or 2-bit
  float damp;             // GPTQ dampening (default 0.1)
  int64_t block;          // GPTQ lazy-batch columns (default 128)
  bool rtn;               // round to nearest on the same grid (no calibration)
  double cap;             // an expert's samples are capped at cap x the mean per expert (default 4)
  float dead_zone;        // ternary: |w| <= dead_zone * s rounds to 0 (default 0.5: to nearest)
  bool act_order;         // GPTQ columns by decreasing H diagonal (--act-order; default off: column order)
  int code_pairs;         // ternary: the longest run a code covers, in pairs (1..TQ_PAIRS_MAX); 0 = auto
                          // (TQ_NARROW_PAIRS unless TQ_PAIRS_MAX saves over 3% of the codes)
  int n_threads;          // 0 = all cores
} compress_params;

typedef struct compress_report {
  int64_t expert_weights;       // weights of every expert matrix
  int64_t payload_bytes;        // their blobs as coded (codes, row index, grids)
  int64_t book_bytes;           // the dictionary (ternary)
  int64_t region_bytes;         // the expert regions in the file (blobs padded to the layer's largest, 4 KiB)
  double bits;                  // (payload + dictionary) * 8 / weights
  double bits_file;             // region bytes + dictionary, per weight
  double zero_frac;             // weights on the grid's zero
  double entropy, pair_entropy; // ternary: order-0 bound per weight, and over pairs
  int64_t book_entries;
  int code_pairs;               // the longest run the dictionary may hold (pairs)
  double wide_saving;           // auto: codes runs of TQ_PAIRS_MAX would save (first selection), else -1
  int64_t matrices, fallbacks;  // matrices quantized; of them RTN because Cholesky failed
  int64_t no_data;              // experts no calibration token reached (RTN)
  double gptq_err;              // the GPTQ objectives summed over matrices
  int64_t calib_tokens;         // calibration tokens run
  double seconds;
  int64_t peak_rss;             // bytes (getrusage)
} compress_report;

compress_params compress_default_params(void);
// Compresses the MoE model `in` (a plain GGUF) into `out`. Progress with ETA
// goes to log (may be NULL). Errors name the file, flag, layer or expert.
mole_status compress_model(const char *in, const char *out, const compress_params *p, FILE *log, compress_report *rep);
void compress_print_report(const compress_report *r, const compress_params *p, FILE *f);

#endif
