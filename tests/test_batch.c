// Several sequences in one forward pass (mole_batcher): every sequence's
// logits equal, bit for bit, those it gets evaluated alone with the same
// token chunks (f32 KV), for every architecture and weight type of the
// conformance models; prefill and decode mixed in one step; bad batches.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mole.h"
#include "testutil.h"

static const char *k_models[] = {"llama-dense", "mixtral",     "qwen3moe",    "olmoe",       "qwen2moe",
                                 "mixtral-f16", "mixtral-bf16", "mixtral-q8_0", "mixtral-q4_0", "mixtral-q4_k_m",
                                 "mixtral-q5_k_m", "mixtral-q6_k"};

enum { N_SEQ = 3, N_STEPS = 4 };
static const int64_t k_prompt_len[N_SEQ] = {7, 16, 1};

static mole_model *load(const char *name, bool use_mmap) {
  char rel[256];
  snprintf(rel, sizeof rel, "tests/data/conformance/models/%s.gguf", name);
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 2;
  mp.use_mmap = use_mmap;
  mole_model *m;
  if (mole_model_load(tu_path(rel), &mp, &m)) fail_msg("load %s: %s", name, mole_last_error());
  return m;
}

static mole_session *new_session(mole_model *m) {
  mole_session_params sp = mole_session_default_params();
  sp.kv_type = MOLE_KV_F32;
  sp.n_ctx = 64;
  mole_session *s;
  assert_int_equal(mole_session_new(m, &sp, &s), MOLE_OK);
  return s;
}

static int32_t tok(int64_t seq, int64_t i, int64_t V) { return (int32_t)((seq * 131 + i * 37 + 5) % V); }

static void check_bits(const char *model, const char *what, int64_t seq, const float *a, const float *b, size_t n) {
  if (memcmp(a, b, n * sizeof(float)) != 0) {
    size_t i = 0;
    while (a[i] == b[i]) i++;
    fail_msg("%s %s seq %lld: logit %zu batched %.9g alone %.9g", model, what, (long long)seq, i, a[i], b[i]);
  }
}

static void batch_equals_alone(const char *name, bool use_mmap) {
  mole_model *m = load(name, use_mmap);
  const int64_t V = mole_model_n_vocab(m);
  int32_t prompts[N_SEQ][16];
  for (int64_t q = 0; q < N_SEQ; q++)
    for (int64_t i = 0; i < k_prompt_len[q]; i++) prompts[q][i] = tok(q, i, V);
  // alone
  float *ref_p[N_SEQ], *ref_d[N_SEQ];
  for (int64_t q = 0; q < N_SEQ; q++) {
    mole_session *s = new_session(m);
    ref_p[q] = malloc((size_t)(k_prompt_len[q] * V) * sizeof(float));
    ref_d[q] = malloc((size_t)(N_STEPS * V) * sizeof(float));
    assert_int_equal(mole_session_eval(s, prompts[q], k_prompt_len[q], ref_p[q], true), MOLE_OK);
    for (int64_t st = 0; st < N_STEPS; st++) {
      const int32_t t = tok(q, 100 + st, V);
      assert_int_equal(mole_session_eval(s, &t, 1, ref_d[q] + st * V, false), MOLE_OK);
    }
    mole_session_free(s);
  }
  // together: the prompts in one pass, then every decode step in one pass
  mole_batcher *b;
  assert_int_equal(mole_batcher_new(m, 32, 64, &b), MOLE_OK);
  mole_session *s[N_SEQ];
  mole_batch_item it[N_SEQ];
  float *lg = malloc((size_t)(16 * V) * sizeof(float) * N_SEQ);
  for (int64_t q = 0; q < N_SEQ; q++) {
    s[q] = new_session(m);
    it[q] = (mole_batch_item){s[q], prompts[q], k_prompt_len[q], lg + q * 16 * V, true};
  }
  if (mole_batcher_eval(b, it, N_SEQ)) fail_msg("%s: %s", name, mole_last_error());
  for (int64_t q = 0; q < N_SEQ; q++) {
    assert_int_equal(mole_session_n_past(s[q]), k_prompt_len[q]);
    check_bits(name, "prompt", q, lg + q * 16 * V, ref_p[q], (size_t)(k_prompt_len[q] * V));
  }
  for (int64_t st = 0; st < N_STEPS; st++) {
    int32_t t[N_SEQ];
    for (int64_t q = 0; q < N_SEQ; q++) {
      t[q] = tok(q, 100 + st, V);
      it[q] = (mole_batch_item){s[q], &t[q], 1, lg + q * V, false};
    }
    assert_int_equal(mole_batcher_eval(b, it, N_SEQ), MOLE_OK);
    for (int64_t q = 0; q < N_SEQ; q++) check_bits(name, "decode", q, lg + q * V, ref_d[q] + st * V, (size_t)V);
  }
  // a prompt prefilled while another sequence decodes, in one pass
  mole_session *late = new_session(m);
  const int32_t t0 = tok(0, 200, V);
  mole_batch_item mix[2] = {{s[0], &t0, 1, lg, false}, {late, prompts[1], k_prompt_len[1], lg + V, true}};
  assert_int_equal(mole_batcher_eval(b, mix, 2), MOLE_OK);
  check_bits(name, "prefill beside decode", 1, lg + V, ref_p[1], (size_t)(k_prompt_len[1] * V));
  mole_session_free(late);
  for (int64_t q = 0; q < N_SEQ; q++) {
    mole_session_free(s[q]);
    free(ref_p[q]);
    free(ref_d[q]);
  }
  free(lg);
  mole_batcher_free(b);
  mole_model_free(m);
}

static void test_batch_equals_alone(void **st) {
  (void)st;
  for (size_t i = 0; i < sizeof k_models / sizeof k_models[0]; i++) batch_equals_alone(k_models[i], false);
  batch_equals_alone("mixtral-q4_k_m", true);  // the GGUF-row kernels too
}

static void test_batch_errors(void **st) {
  (void)st;
  mole_model *m = load("mixtral", false), *m2 = load("olmoe", false);
  mole_batcher *b;
  assert_int_equal(mole_batcher_new(m, 0, 64, &b), MOLE_ERR_ARG);
  assert_int_equal(mole_batcher_new(m, 8, 64, &b), MOLE_OK);
  mole_session *a = new_session(m), *o = new_session(m2);
  const int32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  mole_batch_item twice[2] = {{a, t, 1, NULL, false}, {a, t, 1, NULL, false}};
  assert_int_equal(mole_batcher_eval(b, twice, 2), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "twice"));
  mole_batch_item many = {a, t, 10, NULL, false};
  assert_int_equal(mole_batcher_eval(b, &many, 1), MOLE_ERR_ARG);
  mole_batch_item other = {o, t, 1, NULL, false};
  assert_int_equal(mole_batcher_eval(b, &other, 1), MOLE_ERR_ARG);
  const int32_t bad = 1 << 30;
  mole_batch_item oov = {a, &bad, 1, NULL, false};
  assert_int_equal(mole_batcher_eval(b, &oov, 1), MOLE_ERR_ARG);
  assert_int_equal(mole_session_n_past(a), 0);  // a failed batch moves nothing
  mole_session_free(a);
  mole_session_free(o);
  mole_batcher_free(b);
  mole_model_free(m);
  mole_model_free(m2);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_equals_alone), cmocka_unit_test(test_batch_errors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
