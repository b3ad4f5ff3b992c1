// Conformance: every model in tests/data/conformance/models reproduces the
// logits llama.cpp computed on it (all sequences, all positions) and its
// greedy continuation, within the tolerances of tests/data/conformance/README.md,
// and bit for bit at every ISA level (ctest runs it as the CPU allows, and with
// MOLE_ISA=avx2 and MOLE_ISA=scalar; the aarch64 build with its NEON kernels).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mole.h"
#include "testutil.h"

typedef enum { TOL_F32, TOL_HALF, TOL_QUANT } tol_class;

typedef struct {
  const char *name;
  tol_class tol;
} model_case;

static const model_case k_cases[] = {
    {"llama-dense", TOL_F32},     {"mixtral", TOL_F32},        {"qwen3moe", TOL_F32},
    {"olmoe", TOL_F32},           {"qwen2moe", TOL_F32},       {"mixtral-f16", TOL_HALF},
    {"mixtral-bf16", TOL_HALF},   {"mixtral-q8_0", TOL_QUANT}, {"mixtral-q4_0", TOL_QUANT},
    {"mixtral-q4_k_m", TOL_QUANT}, {"mixtral-q5_k_m", TOL_QUANT}, {"mixtral-q6_k", TOL_QUANT},
    // n_embd 256 models of the other architectures made by llama-quantize (mole's own fixtures, CREDITS.md)
    {"qwen3moe-q4_k_m", TOL_QUANT}, {"qwen3moe-q8_0", TOL_QUANT}, {"qwen2moe-q4_k_m", TOL_QUANT},
    {"olmoe-q4_k_m", TOL_QUANT},
};

static double tol_of(tol_class t) { return t == TOL_F32 ? 1e-4 : t == TOL_HALF ? 2e-3 : 1e-2; }

static double rel_err(const float *a, const float *ref, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
    r += (double)ref[i] * ref[i];
  }
  return sqrt(d) / sqrt(r);
}

static int64_t argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static double top2_margin(const float *x, int64_t n) {
  int64_t b = argmax(x, n);
  float second = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (i != b && x[i] > second) second = x[i];
  return (double)x[b] - second;
}

// Compares one row; returns the relative error (fails the test when out of tolerance).
static double check_row(const model_case *mc, const char *what, int64_t pos, const float *mine, const float *ref,
                        int64_t V) {
  double e = rel_err(mine, ref, V);
  if (!(e <= tol_of(mc->tol))) fail_msg("%s %s pos %lld: rel err %.3g > %.1g", mc->name, what, (long long)pos, e, tol_of(mc->tol));
  if (mc->tol == TOL_QUANT && top2_margin(ref, V) > 0.05 && argmax(mine, V) != argmax(ref, V))
    fail_msg("%s %s pos %lld: argmax %lld != reference %lld (margin %.3f)", mc->name, what, (long long)pos,
             (long long)argmax(mine, V), (long long)argmax(ref, V), top2_margin(ref, V));
  return e;
}

static int32_t *json_tokens(const cJSON *arr, int64_t *n) {
  *n = cJSON_GetArraySize(arr);
  int32_t *t = malloc((size_t)*n * sizeof *t);
  for (int64_t i = 0; i < *n; i++) t[i] = (int32_t)cJSON_GetArrayItem(arr, (int)i)->valuedouble;
  return t;
}

// use_mmap: computed from the file mapping (GGUF rows) instead of the
// weights image (R16 matrices): both must match the reference.
static void run_case_with(const model_case *mc, bool use_mmap) {
  char rel[512];
  snprintf(rel, sizeof rel, "tests/data/conformance/refs/%s/ref.json", mc->name);
  char *js = tu_read_file(tu_path(rel), NULL);
  assert_non_null(js);
  cJSON *root = cJSON_Parse(js);
  assert_non_null(root);
  snprintf(rel, sizeof rel, "tests/data/conformance/models/%s.gguf", mc->name);
  mole_model *m;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 2;
  mp.use_mmap = use_mmap;
  mole_status st = mole_model_load(tu_path(rel), &mp, &m);
  if (st) fail_msg("load %s: %s", mc->name, mole_last_error());
  const int64_t V = mole_model_n_vocab(m);
  assert_int_equal(V, (int64_t)cJSON_GetObjectItem(root, "n_vocab")->valuedouble);
  mole_session_params sp = mole_session_default_params();
  sp.kv_type = MOLE_KV_F32;
  sp.n_ctx = 512;
  sp.n_batch = 128;  // s300 runs in 3 chunks: exercises chunked prefill too
  mole_session *s;
  assert_int_equal(mole_session_new(m, &sp, &s), MOLE_OK);
  double worst = 0;
  const cJSON *seqs = cJSON_GetObjectItem(root, "sequences"), *seq;
  cJSON_ArrayForEach(seq, seqs) {
    int64_t n;
    int32_t *toks = json_tokens(cJSON_GetObjectItem(seq, "tokens"), &n);
    snprintf(rel, sizeof rel, "tests/data/conformance/refs/%s/%s", mc->name, cJSON_GetObjectItem(seq, "logits")->valuestring);
    size_t bytes;
    float *ref = tu_read_file(tu_path(rel), &bytes);
    assert_non_null(ref);
    assert_int_equal(bytes, (size_t)n * (size_t)V * sizeof(float));
    float *lg = malloc(bytes);
    mole_session_reset(s);
    st = mole_session_eval(s, toks, n, lg, true);
    if (st) fail_msg("eval: %s", mole_last_error());
    for (int64_t i = 0; i < n; i++) {
      double e = check_row(mc, cJSON_GetObjectItem(seq, "name")->valuestring, i, lg + i * V, ref + i * V, V);
      worst = e > worst ? e : worst;
    }
    free(lg);
    free(ref);
    free(toks);
  }
  // greedy: prompt in one batch, then one decode call per token, own argmax
  const cJSON *gr = cJSON_GetObjectItem(root, "greedy");
  int64_t ng, np = 0;
  int32_t *gt = json_tokens(cJSON_GetObjectItem(gr, "tokens"), &ng);
  const char *pname = cJSON_GetObjectItem(gr, "prompt")->valuestring;
  int32_t *prompt = NULL;
  float *pref = NULL;
  cJSON_ArrayForEach(seq, seqs) if (!strcmp(cJSON_GetObjectItem(seq, "name")->valuestring, pname)) {
    prompt = json_tokens(cJSON_GetObjectItem(seq, "tokens"), &np);
    snprintf(rel, sizeof rel, "tests/data/conformance/refs/%s/%s", mc->name, cJSON_GetObjectItem(seq, "logits")->valuestring);
    pref = tu_read_file(tu_path(rel), NULL);
  }
  assert_non_null(prompt);
  snprintf(rel, sizeof rel, "tests/data/conformance/refs/%s/%s", mc->name, cJSON_GetObjectItem(gr, "logits")->valuestring);
  float *gref = tu_read_file(tu_path(rel), NULL);
  assert_non_null(gref);
  float *lg = malloc((size_t)V * sizeof *lg);
  mole_session_reset(s);
  assert_int_equal(mole_session_eval(s, prompt, np, lg, false), MOLE_OK);
  const float *prev_ref = pref + (np - 1) * V;
  for (int64_t g = 0; g < ng; g++) {
    if (top2_margin(prev_ref, V) < 1e-3) break;  // a genuine tie: stop comparing
    int32_t tok = (int32_t)argmax(lg, V);
    if (tok != gt[g]) fail_msg("%s greedy step %lld: token %d != reference %d", mc->name, (long long)g, tok, gt[g]);
    assert_int_equal(mole_session_eval(s, &tok, 1, lg, false), MOLE_OK);
    double e = check_row(mc, "greedy", g, lg, gref + g * V, V);
    worst = e > worst ? e : worst;
    prev_ref = gref + g * V;
  }
  print_message("%-16s %-5s %-12s worst rel err %.3g\n", mc->name, use_mmap ? "mmap" : "image", mole_isa(), worst);
  // at every ISA level (the AVX-512 kernels, their AVX2 and NEON twins, and the
  // scalar reference twins) mole follows llama.cpp's order in every op: the same bits
  if (worst != 0)
    fail_msg("%s: worst rel err %.3g: not bit-identical to llama.cpp with the %s kernels", mc->name, worst, mole_isa());
  free(lg);
  free(gref);
  free(pref);
  free(prompt);
  free(gt);
  mole_session_free(s);
  mole_model_free(m);
  cJSON_Delete(root);
  free(js);
}

// Under an emulator (the aarch64 build under qemu: MOLE_TEST_EMULATED) the
// weights image only: without R16 there both paths compute the same rows, and
// each pass costs minutes.
static void run_case(void **state) {
  run_case_with(*state, false);
  if (!tu_emulated()) run_case_with(*state, true);
}

// The f16 KV cache (the default) stays close to the f32 reference too.
static void kv_f16_close(void **state) {
  (void)state;
  mole_model *m;
  assert_int_equal(mole_model_load(tu_path("tests/data/conformance/models/mixtral.gguf"), NULL, &m), MOLE_OK);
  mole_session *s;
  assert_int_equal(mole_session_new(m, NULL, &s), MOLE_OK);
  size_t bytes;
  float *ref = tu_read_file(tu_path("tests/data/conformance/refs/mixtral/s64.f32"), &bytes);
  char *js = tu_read_file(tu_path("tests/data/conformance/refs/mixtral/ref.json"), NULL);
  cJSON *root = cJSON_Parse(js);
  const cJSON *seq = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "sequences"), 2);
  int64_t n;
  int32_t *toks = json_tokens(cJSON_GetObjectItem(seq, "tokens"), &n);
  const int64_t V = mole_model_n_vocab(m);
  float *lg = malloc(bytes);
  assert_int_equal(mole_session_eval(s, toks, n, lg, true), MOLE_OK);
  for (int64_t i = 0; i < n; i++) assert_true(rel_err(lg + i * V, ref + i * V, V) < 2e-3);
  free(lg);
  free(toks);
  cJSON_Delete(root);
  free(js);
  free(ref);
  mole_session_free(s);
  mole_model_free(m);
}

int main(void) {
  struct CMUnitTest tests[sizeof k_cases / sizeof k_cases[0] + 1];
  size_t n = 0;
  for (; n < sizeof k_cases / sizeof k_cases[0]; n++)
    tests[n] = (struct CMUnitTest){k_cases[n].name, run_case, NULL, NULL, (void *)&k_cases[n]};
  tests[n++] = (struct CMUnitTest){"kv_f16_close", kv_f16_close, NULL, NULL, NULL};
  return _cmocka_run_group_tests("conformance", tests, n, NULL, NULL);
}
