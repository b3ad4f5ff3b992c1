// train_retain: the MLP loss gradient (SmoothL1 + smoothness, masked)
// against central finite differences; the labels, H2O's accumulated attention
// and the top-k overlap against brute force; AdamW and the schedule; on a tiny
// synth model, training lowers the held-out loss, the heads file loads and
// fits the model's geometry only, runs are byte-identical (same seed, any
// thread count), and bad input gives errors naming the flag.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/train_retain.h"
#include "kv/retain.h"
#include "model/synth.h"
#include "testutil.h"

// ---- the loss gradient ------------------------------------------------------------

enum { GD = 37, GH = 11, GK = 3, GN = 23 };

typedef struct mlp_buf {
  train_retain_mlp w;
  float *mem;
} mlp_buf;

static mlp_buf mlp_new(int64_t D, int64_t H, int64_t K) {
  const int64_t P = H * D + H + K * H + K;
  mlp_buf b = {.mem = tu_xalloc(sizeof(float) * (size_t)P)};
  b.w = (train_retain_mlp){D, H, K, b.mem, b.mem + H * D, b.mem + H * D + H, b.mem + H * D + H + K * H};
  return b;
}

static double loss_of(const train_retain_mlp *w, const float *X, const float *Y, const uint8_t *mask,
                      const uint8_t *next, float smooth, float *tmp) {
  return train_retain_loss(w, X, GN, Y, mask, next, smooth, NULL, NULL, tmp);
}

static void test_loss_gradient(void **state) {
  (void)state;
  uint64_t st = 11;
  mlp_buf w = mlp_new(GD, GH, GK), g = mlp_new(GD, GH, GK);
  const int64_t P = GH * GD + GH + GK * GH + GK;
  for (int64_t i = 0; i < P; i++) w.mem[i] = 0.4f * tu_gauss(&st);
  float *X = tu_xalloc(sizeof(float) * GN * GD), *Y = tu_xalloc(sizeof(float) * GN * GK);
  uint8_t mask[GN * GK], next[GN];
  for (int i = 0; i < GN * GD; i++) X[i] = tu_gauss(&st);
  for (int i = 0; i < GN * GK; i++) {
    Y[i] = 2.0f * tu_gauss(&st);  // residuals on both sides of SmoothL1's |d| = 1
    mask[i] = tu_rand_u64(&st) % 4 != 0;
  }
  for (int i = 0; i < GN; i++) next[i] = tu_rand_u64(&st) % 3 != 0;
  next[GN - 1] = 1;  // past the end: must be ignored
  const float smooth = 0.7f;
  float *tmp = tu_xalloc(sizeof(float) * train_retain_loss_tmp(&w.w, GN));
  train_retain_terms terms = {0};
  const double L0 = train_retain_loss(&w.w, X, GN, Y, mask, next, smooth, &g.w, &terms, tmp);
  assert_true(L0 > 0);
  assert_true(fabs(train_retain_terms_loss(&terms, smooth) - L0) < 1e-12);
  int64_t n_fit = 0, n_sq = 0;
  for (int i = 0; i < GN * GK; i++) n_fit += mask[i];
  for (int i = 0; i + 1 < GN; i++) n_sq += next[i] ? GK : 0;
  assert_int_equal(terms.n_fit, n_fit);
  assert_int_equal(terms.n_sq, n_sq);
  // every parameter against a central difference
  const float h = 2e-3f;
  int bad = 0;
  for (int64_t i = 0; i < P; i++) {
    const float keep = w.mem[i];
    w.mem[i] = keep + h;
    const double lp = loss_of(&w.w, X, Y, mask, next, smooth, tmp);
    w.mem[i] = keep - h;
    const double lm = loss_of(&w.w, X, Y, mask, next, smooth, tmp);
    w.mem[i] = keep;
    const double fd = (lp - lm) / (2.0 * h), an = g.mem[i];
    if (fabs(fd - an) > 2e-4 + 2e-2 * fabs(fd)) {
      if (bad++ < 5) print_error("param %lld: analytic %.6g, finite difference %.6g\n", (long long)i, an, fd);
    }
  }
  assert_int_equal(bad, 0);
  // the smoothness term alone: only the pairs count
  memset(mask, 0, sizeof mask);
  terms = (train_retain_terms){0};
  const double Ls = train_retain_loss(&w.w, X, GN, Y, mask, next, smooth, &g.w, &terms, tmp);
  assert_int_equal(terms.n_fit, 0);
  assert_true(Ls > 0 && fabs(Ls - smooth * terms.sq / (double)terms.n_sq) < 1e-9);
  // nothing labelled, no pairs: zero loss and zero gradient
  memset(next, 0, sizeof next);
  const double Lz = train_retain_loss(&w.w, X, GN, Y, mask, next, smooth, &g.w, NULL, tmp);
  assert_true(Lz == 0.0);
  for (int64_t i = 0; i < P; i++) assert_true(g.mem[i] == 0.0f);
  mole_aligned_free(w.mem);
  mole_aligned_free(g.mem);
  mole_aligned_free(X);
  mole_aligned_free(Y);
  mole_aligned_free(tmp);
}

// ---- labels, H2O, overlap -------------------------------------------------------------

enum { LN = 29, LNH = 6, LNKV = 2, LHD = 5 };

static double dot(const float *a, const float *b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

static void test_labels_brute_force(void **state) {
  (void)state;
  uint64_t st = 7;
  float q[LN * LNH * LHD], k[LN * LNKV * LHD], lab[LN * LNKV], acc[LN * LNKV], tmp[LN];
  for (int i = 0; i < LN * LNH * LHD; i++) q[i] = tu_gauss(&st);
  for (int i = 0; i < LN * LNKV * LHD; i++) k[i] = tu_gauss(&st);
  const float scale = 0.37f;
  const int G = LNH / LNKV;
  const int windows[] = {1, 4, 64};
  for (int wi = 0; wi < 3; wi++) {
    const int W = windows[wi];
    train_retain_labels(q, k, LN, LNH, LNKV, LHD, scale, W, lab);
    for (int j = 0; j < LN; j++)
      for (int g = 0; g < LNKV; g++) {
        double best = -INFINITY;
        for (int i = j + 1; i <= j + W && i < LN; i++)
          for (int hh = g * G; hh < (g + 1) * G; hh++)
            best = fmax(best, scale * dot(q + (i * LNH + hh) * LHD, k + (j * LNKV + g) * LHD, LHD));
        if (j == LN - 1) assert_true(lab[j * LNKV + g] == 0.0f);
        else if (fabs(lab[j * LNKV + g] - best) > 1e-5 * (1 + fabs(best)))
          fail_msg("W %d key %d head %d: label %g, brute force %g", W, j, g, (double)lab[j * LNKV + g], best);
      }
  }
  // H2O: the causal softmax probabilities a key receives, summed over queries and the group's heads
  train_retain_h2o(q, k, LN, LNH, LNKV, LHD, scale, acc, tmp);
  double total = 0;
  for (int j = 0; j < LN; j++)
    for (int g = 0; g < LNKV; g++) {
      double s = 0;
      for (int hh = g * G; hh < (g + 1) * G; hh++)
        for (int i = j; i < LN; i++) {
          double z = 0, mx = -INFINITY, e[LN];
          for (int jj = 0; jj <= i; jj++) {
            e[jj] = scale * dot(q + (i * LNH + hh) * LHD, k + (jj * LNKV + g) * LHD, LHD);
            mx = fmax(mx, e[jj]);
          }
          for (int jj = 0; jj <= i; jj++) z += exp(e[jj] - mx);
          s += exp(e[j] - mx) / z;
        }
      if (fabs(acc[j * LNKV + g] - s) > 1e-4 * (1 + s))
        fail_msg("h2o key %d head %d: %g, brute force %g", j, g, (double)acc[j * LNKV + g], s);
      total += acc[j * LNKV + g];
    }
  assert_true(fabs(total - (double)LN * LNH) < 1e-3);  // every query's probabilities sum to 1
}

static void test_overlap(void **state) {
  (void)state;
  enum { N = 50 };
  float s[N], l[2 * N];
  void *tmp = malloc(train_retain_overlap_tmp(N));
  for (int j = 0; j < N; j++) {
    s[j] = (float)j;            // the later the better
    l[2 * j] = (float)(N - j);  // the earlier the better
    l[2 * j + 1] = 7.0f;        // all tied: the later keys win
  }
  assert_true(train_retain_overlap(s, 1, l, 2, N, 5, tmp) == 0.0);
  assert_true(train_retain_overlap(l, 2, l, 2, N, 5, tmp) == 1.0);
  assert_true(train_retain_overlap(s, 1, l + 1, 2, N, 5, tmp) == 1.0);
  s[0] = 100.0f;  // one of the top 5 now agrees with the earliest-first labels
  assert_true(fabs(train_retain_overlap(s, 1, l, 2, N, 5, tmp) - 0.2) < 1e-12);
  free(tmp);
}

static void test_adamw_schedule(void **state) {
  (void)state;
  // the first AdamW step moves each weight by lr (sign of g) plus the decay
  float w[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.3f, -5.0f, 0.0f}, m[3] = {0}, v[3] = {0};
  train_retain_adamw(w, g, m, v, 3, 1, 0.1f, 0.5f);
  assert_true(fabsf(w[0] - (1.0f - 0.1f * (0.5f + 1.0f))) < 1e-5f);
  assert_true(fabsf(w[1] - (-2.0f - 0.1f * (-1.0f - 1.0f))) < 1e-5f);
  assert_true(fabsf(w[2] - (0.5f - 0.1f * 0.25f)) < 1e-6f);
  // warm-up to the peak, cosine down to 0
  assert_true(fabsf(train_retain_lr(1.0f, 0, 100, 10) - 0.1f) < 1e-6f);
  assert_true(fabsf(train_retain_lr(1.0f, 9, 100, 10) - 1.0f) < 1e-6f);
  assert_true(fabsf(train_retain_lr(1.0f, 10, 100, 10) - 1.0f) < 1e-6f);
  assert_true(fabsf(train_retain_lr(1.0f, 55, 100, 10) - 0.5f) < 1e-6f);
  assert_true(train_retain_lr(1.0f, 100, 100, 10) < 1e-6f);
}

// ---- on a tiny synth model ---------------------------------------------------------------

static char g_model[256], g_data[256];

static int setup(void **state) {
  (void)state;
  snprintf(g_model, sizeof g_model, "/tmp/mole-test-retain-%d.gguf", (int)getpid());
  snprintf(g_data, sizeof g_data, "/tmp/mole-test-retain-%d.txt", (int)getpid());
  synth_params p = synth_default_params();
  p.arch = "mixtral";
  p.n_embd = 64;
  p.n_layer = 2;
  p.n_head = 4;
  p.n_head_kv = 2;
  p.n_expert = 4;
  p.n_expert_used = 2;
  p.n_ff = 64;
  p.n_vocab = 300;
  p.n_ctx = 128;
  p.type = QT_F16;
  p.n_threads = 2;
  if (synth_write(&p, g_model, NULL)) return -1;
  // text: the repository's README (a synth vocabulary spells it mostly byte by byte)
  size_t n = 0;
  char *t = tu_read_file(tu_path("README.md"), &n);
  FILE *f = fopen(g_data, "wb");
  if (!t || !f || fwrite(t, 1, n, f) != n) return -1;
  fclose(f);
  free(t);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_model);
  unlink(g_data);
  return 0;
}

static train_retain_params tiny_params(void) {
  train_retain_params p = train_retain_default_params();
  p.data = g_data;
  p.tokens = 64 * 10;
  p.seq_len = 64;
  p.heldout = 0.2;
  p.window = 8;
  p.hidden = 16;
  p.batch = 64;
  p.epochs = 6;
  p.lr = 3e-3f;
  p.n_threads = 2;
  return p;
}

static void *read_all(const char *path, size_t *n) {
  void *b = tu_read_file(path, n);
  if (!b) fail_msg("cannot read %s", path);
  return b;
}

static void test_train_synth(void **state) {
  (void)state;
  char out[300];
  snprintf(out, sizeof out, "%s.heads", g_model);
  train_retain_params p = tiny_params();
  train_retain_report r;
  mole_status st = train_retain_run(g_model, out, &p, NULL, &r);
  if (st) fail_msg("train-retain: %s", mole_last_error());
  assert_int_equal(r.n_layer, 2);
  assert_int_equal(r.n_seq_train, 8);
  assert_int_equal(r.n_seq_heldout, 2);
  assert_int_equal(r.n_keys, 64 - 8);
  assert_int_equal(r.top_k, 6);
  assert_true(r.heldout_loss[p.epochs] < 0.95 * r.heldout_loss[0]);
  for (int64_t l = 0; l < r.n_layer; l++) assert_true(r.layer_final[l] < r.layer_init[l]);
  assert_true(r.train_loss[p.epochs] < r.train_loss[0]);
  for (int i = 0; i < TR_N_POLICY; i++) assert_true(r.overlap_mean[i] >= 0 && r.overlap_mean[i] <= 1);
  // the report's writers
  char csv[300], json[300];
  snprintf(csv, sizeof csv, "%s.csv", g_model);
  snprintf(json, sizeof json, "%s.json", g_model);
  assert_int_equal(train_retain_write_csv(&r, csv), MOLE_OK);
  assert_int_equal(train_retain_write_json(&r, &p, json), MOLE_OK);
  size_t n;
  char *c = read_all(csv, &n);
  assert_non_null(strstr(c, "epoch,train_loss,heldout_loss,heldout_smoothl1\n0,"));
  free(c);
  c = read_all(json, &n);
  assert_non_null(strstr(c, "\"locret\": {\"mean\": "));
  free(c);
  unlink(csv);
  unlink(json);
  train_retain_report_free(&r);
  // the file: loads, fits this model, not another geometry
  kv_retain *h = NULL;
  if (kv_retain_load(out, &h)) fail_msg("load: %s", mole_last_error());
  assert_int_equal(h->n_hidden, 16);
  assert_int_equal(h->window, 8);
  assert_string_equal(h->model_arch, "llama");
  assert_int_equal(kv_retain_check(h, out, 2, 4, 2, 16, 16), MOLE_OK);
  assert_int_equal(kv_retain_check(h, out, 2, 4, 1, 16, 16), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "KV heads"));
  assert_int_equal(kv_retain_check(h, out, 3, 4, 2, 16, 16), MOLE_ERR_ARG);
  assert_int_equal(kv_retain_check(h, out, 2, 4, 2, 32, 16), MOLE_ERR_ARG);
  for (int64_t i = 0; i < h->n_layer * h->d_in; i++) assert_true(h->in_scale[i] > 0);
  kv_retain_free(h);
  unlink(out);
}

// Same seed: the same bytes, whatever the thread count; another seed: other weights.
static void test_deterministic(void **state) {
  (void)state;
  char a[300], b[300];
  snprintf(a, sizeof a, "%s.a", g_model);
  snprintf(b, sizeof b, "%s.b", g_model);
  train_retain_params p = tiny_params();
  p.epochs = 2;
  train_retain_report r;
  const int threads[3] = {2, 2, 1};
  for (int k = 0; k < 3; k++) {
    p.n_threads = threads[k];
    if (train_retain_run(g_model, k ? b : a, &p, NULL, &r)) fail_msg("train-retain: %s", mole_last_error());
    train_retain_report_free(&r);
    if (!k) continue;
    size_t na, nb;
    void *x = read_all(a, &na), *y = read_all(b, &nb);
    assert_true(na == nb && !memcmp(x, y, na));
    free(x);
    free(y);
  }
  p.seed = 2;
  if (train_retain_run(g_model, b, &p, NULL, &r)) fail_msg("train-retain: %s", mole_last_error());
  train_retain_report_free(&r);
  size_t na, nb;
  void *x = read_all(a, &na), *y = read_all(b, &nb);
  assert_true(na == nb && memcmp(x, y, na));
  free(x);
  free(y);
  unlink(a);
  unlink(b);
}

static void expect_error(const train_retain_params *p, const char *model, mole_status want, const char *needle) {
  train_retain_report r;
  char out[300];
  snprintf(out, sizeof out, "%s.err", g_model);
  const mole_status st = train_retain_run(model, out, p, NULL, &r);
  train_retain_report_free(&r);
  if (st != want || !strstr(mole_last_error(), needle))
    fail_msg("want status %d with '%s', got %d: %s", (int)want, needle, (int)st, mole_last_error());
  assert_int_equal(access(out, F_OK), -1);
}

static void test_errors(void **state) {
  (void)state;
  train_retain_params p = tiny_params();
  p.data = NULL;
  expect_error(&p, g_model, MOLE_ERR_ARG, "--data TEXT is required");
  p = tiny_params();
  p.data = "/nonexistent/text.txt";
  expect_error(&p, g_model, MOLE_ERR_IO, "cannot open '/nonexistent/text.txt'");
  p = tiny_params();
  p.window = 63;
  expect_error(&p, g_model, MOLE_ERR_ARG, "--window 63");
  p = tiny_params();
  p.tokens = 64;
  expect_error(&p, g_model, MOLE_ERR_ARG, "--tokens 64");
  p = tiny_params();
  p.max_mem = 1024;
  expect_error(&p, g_model, MOLE_ERR_ARG, "over --max-mem");
  p = tiny_params();
  p.heldout = 1.5;
  expect_error(&p, g_model, MOLE_ERR_ARG, "--heldout");
  // too little text: says how many tokens it found and needs
  char small[300];
  snprintf(small, sizeof small, "%s.small.txt", g_model);
  FILE *f = fopen(small, "w");
  assert_non_null(f);
  fputs("a few words only", f);
  fclose(f);
  p = tiny_params();
  p.data = small;
  expect_error(&p, g_model, MOLE_ERR_ARG, "tokens; train-retain needs at least 126");
  unlink(small);
  p = tiny_params();
  expect_error(&p, "/nonexistent/model.gguf", MOLE_ERR_IO, "/nonexistent/model.gguf");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_gradient), cmocka_unit_test(test_labels_brute_force),
      cmocka_unit_test(test_overlap),       cmocka_unit_test(test_adamw_schedule),
      cmocka_unit_test(test_train_synth),   cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_errors),
  };
  mole_log_set_level(MOLE_LOG_WARN);
  return cmocka_run_group_tests(tests, setup, teardown);
}
