// Helpers shared by the cmocka tests.
#ifndef MOLE_TESTUTIL_H
#define MOLE_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mole.h"

// $MOLE_SOURCE_DIR/rel (static buffer per call slot; copy if kept).
const char *tu_path(const char *rel);
// Whole file into a malloc'd buffer with a NUL after the end (NULL on
// failure); *n gets the size.
void *tu_read_file(const char *path, size_t *n);
// xorshift random numbers for reproducible tests
uint64_t tu_rand_u64(uint64_t *state);
float tu_rand_uniform(uint64_t *state, float lo, float hi);
float tu_gauss(uint64_t *state);  // standard normal (Box-Muller)
// n zeroed bytes, 64-byte aligned (mole_aligned_free); aborts when out of memory.
void *tu_xalloc(size_t n);
// true under the ASan build (MOLE_ASAN=1): tests may pick smaller loads.
int tu_asan(void);
// 1 under an emulator (the aarch64 tests under qemu: MOLE_TEST_EMULATED=1): slower, smaller inputs
int tu_emulated(void);

// llama.cpp's tokenizer vectors (test-tokenizer-0's format): texts split by
// "\n__ggml_vocab_test__\n" in $MOLE_SOURCE_DIR/inp_rel, the ids of each on
// one line of out_rel. Returns how many (*out malloc'd; free with
// tu_vectors_free); fails the test when a file cannot be read.
typedef struct tu_vector {
  const char *text;  // into the .inp buffer (not NUL-terminated)
  size_t len;
  int32_t *ids;
  int64_t n;
} tu_vector;
int tu_vectors_read(const char *inp_rel, const char *out_rel, tu_vector **out);
void tu_vectors_free(tu_vector *v, int n);

// A model of tests/data/conformance/models/ (NAME.gguf) with 2 threads; fails the test when it cannot load.
mole_model *tu_load_fixture(const char *name);

// The trained evaluation model committed in eval-model/ (scripts/train, make eval-model).
#define EVAL_MODEL_FILE "mole-eval-moe-q8_0.gguf"

#endif
