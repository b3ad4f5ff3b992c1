// libFuzzer target: a compressed expert matrix from a hostile file. The input
// is a compact dictionary and a tq1_dict blob (quant_tq.h): tq_book_new must
// reject a bad dictionary, tq1_check a bad blob, and whatever passes both must
// run through the kernels and the row decoder inside its bytes (ASan checks),
// the SIMD kernels giving the reference's bits (narrow and wide books alike).
// Layout: u8 n_rows-1, u8 k/2-1, u16 dictionary entries n, 3n bytes of
// dictionary, then the blob.
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "quant/quant_tq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  const int64_t n_rows = (int64_t)data[0] + 1, k = 2 * ((int64_t)data[1] + 1);
  const int64_t n = (int64_t)(data[2] | data[3] << 8);
  data += 4;
  size -= 4;
  if ((size_t)(3 * n) > size) return 0;
  tq_book *b = NULL;
  if (tq_book_new(data, n, &b) != MOLE_OK) return 0;
  data += 3 * n;
  size -= (size_t)(3 * n);
  // the blob in its own allocation, so that ASan sees any read past its end
  uint8_t *blob = malloc(size ? size : 1);
  if (size) memcpy(blob, data, size);
  char err[160];
  // the kernels' scratch (k <= 512 here)
  if (tq1_check(b, blob, size, n_rows, k, err, sizeof err) && mole_scratch_reserve(quant_scratch_bytes(k)) == MOLE_OK) {
    float *x = calloc((size_t)(k * 2), sizeof *x), *yr = calloc((size_t)(n_rows * 2), sizeof *yr),
          *ys = calloc((size_t)(n_rows * 2), sizeof *ys);
    for (int64_t i = 0; i < 2 * k; i++) x[i] = (float)((i * 37) % 11) - 5.0f;
    // one token (the decode kernels) and two (the batched ones): the SIMD
    // kernels must give the reference's bits
    for (int64_t nt = 1; nt <= 2; nt++) {
      quant_tq1_gemm_ref(b, blob, n_rows, x, (size_t)k * sizeof *x, yr, n_rows, 0, n_rows, nt, k);
      quant_tq1_gemm(b, blob, n_rows, x, (size_t)k * sizeof *x, ys, n_rows, 0, n_rows, nt, k);
      if (memcmp(yr, ys, (size_t)(nt * n_rows) * sizeof *yr)) abort();
    }
    for (int64_t r = 0; r < n_rows; r++) tq1_row_to_float(b, blob, n_rows, k, r, x);
    free(x);
    free(yr);
    free(ys);
  }
  free(blob);
  tq_book_free(b);
  return 0;
}
