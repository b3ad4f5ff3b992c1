// quant_types: the tensor type ids (the GGUF/ggml ids, plus mole's own blob
// types) and the block geometry of every id a GGUF file may name, whether
// the engine computes with it or not (quant_types.c). This is all the GGUF
// reader and writer need; the kernels are behind quant.h.
#ifndef MOLE_QUANT_TYPES_H
#define MOLE_QUANT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  QT_F32 = 0,
  QT_F16 = 1,
  QT_Q4_0 = 2,
  QT_Q4_1 = 3,
  QT_Q5_0 = 6,
  QT_Q5_1 = 7,
  QT_Q8_0 = 8,
  QT_Q8_1 = 9,
  QT_Q2_K = 10,
  QT_Q3_K = 11,
  QT_Q4_K = 12,
  QT_Q5_K = 13,
  QT_Q6_K = 14,
  QT_Q8_K = 15,
  QT_BF16 = 30,
  // mole's compressed expert matrices (quant_tq.h): one blob per matrix, not
  // blocks; never a GGUF tensor's type (files store them as I8 bytes)
  QT_TQ1 = 40,  // ternary, dictionary-coded
  QT_TQ2 = 41,  // 2-bit, per-row grid
  QT_COUNT = 42,  // ids below this may be known to the tables
} quant_type;

// Compressed expert matrices (quant_tq.h): blobs, not rows of blocks.
static inline bool quant_is_blob(int t) { return t == QT_TQ1 || t == QT_TQ2; }

// Geometry of any known type id, computable or not.
bool quant_type_known(uint32_t t);
int64_t quant_blck_size(uint32_t t);                 // 0 when unknown
size_t quant_type_size(uint32_t t);                  // bytes per block, 0 when unknown
const char *quant_type_name(uint32_t t);             // "q4_0" or "type#N"
int quant_type_from_name(const char *name);          // -1 when unknown
// Bytes of a row of n elements; 0 if n is not a multiple of the block size.
size_t quant_row_size(quant_type t, int64_t n);

#endif
