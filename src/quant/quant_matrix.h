// quant/quant_matrix: a typed view of a weight matrix (or a stack of them)
// somewhere in memory: the file mapping, the weights image, an expert cache
// slot. The model binds its tensors as these (model_tensor), the expert
// provider hands its experts out as these.
#ifndef MOLE_QUANT_MATRIX_H
#define MOLE_QUANT_MATRIX_H

#include "quant/quant.h"

// Up to 3 dims, rows of ne0 elements. A shard's column slice keeps the
// file's rows: its rows are ne0 elements row_bytes apart (more than ne0
// elements take).
typedef struct quant_matrix {
  const void *data;  // NULL = absent (optional tensors)
  quant_type type;
  int64_t ne0, ne1, ne2;  // [ne2][ne1][ne0]
  size_t row_bytes;       // bytes from one row to the next
  size_t mat_bytes;       // bytes of one [ne1][ne0] matrix (experts: stride between experts)
  quant_layout layout;    // QL_ROWS as in the file, or QL_R16 (repacked at load, each matrix on its own)
  const void *book;       // QT_TQ1 (compressed experts): the file's dictionary (tq_book)
} quant_matrix;

#endif
