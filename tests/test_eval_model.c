// The trained evaluation model (eval-model/, made by scripts/train): the GGUF
// export loads as what it claims to be, and its logits match the trainer's own
// PyTorch forward pass (eval-model/logits.f32: float64 over the weights exactly
// as the file stores them, eval-model/tokens.txt: BOS and a sentence). mole's
// Q8_0 matmuls quantize activations to 8 bits as llama.cpp's do, so the match is
// close, not exact: every row within 2% of its largest logit, the same argmax.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mole.h"
#include "testutil.h"

static int32_t *read_tokens(int64_t *n) {
  char *txt = tu_read_file(tu_path("eval-model/tokens.txt"), NULL);
  assert_non_null(txt);
  int32_t *t = malloc(4096 * sizeof *t);
  *n = 0;
  for (char *p = txt; *p && *n < 4096;) {
    char *q;
    long v = strtol(p, &q, 10);
    if (q == p) {
      p++;
      continue;
    }
    t[(*n)++] = (int32_t)v;
    p = q;
  }
  free(txt);
  return t;
}

static mole_model *load(void) {
  mole_model *m = NULL;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 2;
  if (mole_model_load(tu_path("eval-model/" EVAL_MODEL_FILE), &mp, &m)) fail_msg("load: %s", mole_last_error());
  return m;
}

// worst |mole - ref| / max|ref| over the rows; every row must pick the same argmax
static double compare(const float *lg, const float *ref, int64_t n, int64_t V) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *a = lg + i * V, *b = ref + i * V;
    int64_t ia = 0, ib = 0;
    double mx = 0, d = 0;
    for (int64_t j = 0; j < V; j++) {
      if (!isfinite(a[j])) fail_msg("row %lld: logit %lld is %g", (long long)i, (long long)j, (double)a[j]);
      mx = fmax(mx, fabs(b[j]));
      d = fmax(d, fabs((double)a[j] - b[j]));
      if (a[j] > a[ia]) ia = j;
      if (b[j] > b[ib]) ib = j;
    }
    if (ia != ib) fail_msg("row %lld: argmax %lld, the trainer's %lld", (long long)i, (long long)ia, (long long)ib);
    worst = fmax(worst, d / mx);
  }
  return worst;
}

static void test_logits_match_trainer(void **state) {
  (void)state;
  mole_model *m = load();
  const int64_t V = mole_model_n_vocab(m);
  assert_int_equal(V, 4096);
  int64_t n;
  int32_t *toks = read_tokens(&n);
  assert_true(n >= 8);
  size_t bytes;
  float *ref = tu_read_file(tu_path("eval-model/logits.f32"), &bytes);
  assert_non_null(ref);
  assert_int_equal(bytes, (size_t)n * (size_t)V * sizeof(float));
  float *lg = malloc(bytes);
  mole_session *s;
  assert_int_equal(mole_session_new(m, NULL, &s), MOLE_OK);
  // the whole sequence in one batch, then one token at a time (the decode path)
  if (mole_session_eval(s, toks, n, lg, true)) fail_msg("eval: %s", mole_last_error());
  const double batch = compare(lg, ref, n, V);
  mole_session_reset(s);
  for (int64_t i = 0; i < n; i++)
    if (mole_session_eval(s, toks + i, 1, lg + i * V, false)) fail_msg("decode: %s", mole_last_error());
  const double one = compare(lg, ref, n, V);
  printf("eval model vs trainer: worst row error %.2e of the row's largest logit (batch), %.2e (one by one)\n", batch, one);
  assert_true(batch < 0.02);
  assert_true(one < 0.02);
  mole_session_free(s);
  free(lg);
  free(ref);
  free(toks);
  mole_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_logits_match_trainer)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
