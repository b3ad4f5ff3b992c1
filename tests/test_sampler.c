// engine/sampler: greedy, top-k, top-p, min-p, temperature, penalties, seeds,
// bad logits, and the stop-string matcher. Distributions are checked with a
// chi-square test (fixed seeds, so the runs are reproducible).
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "testutil.h"

static sampler_params params_plain(void) {
  sampler_params p = sampler_params_default();
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.seed = 1234;
  return p;
}

static sampler *make(const sampler_params *p, int64_t n_vocab) {
  sampler *s = NULL;
  assert_int_equal(sampler_init(p, n_vocab, &s), MOLE_OK);
  assert_non_null(s);
  return s;
}

// softmax(logits / t) in double
static void softmax_t(const float *l, int n, double t, double *p) {
  double mx = -INFINITY, sum = 0;
  for (int i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
  for (int i = 0; i < n; i++) sum += p[i] = exp((l[i] - mx) / t);
  for (int i = 0; i < n; i++) p[i] /= sum;
}

// Draws `draws` tokens, checks every one is allowed (p > 0), and that the
// counts fit p: chi-square below `crit` and every |freq - p| < tol.
static void check_distribution(sampler *s, const float *logits, int n, const double *p, int draws, double crit,
                               double tol) {
  int *count = calloc((size_t)n, sizeof(int));
  for (int d = 0; d < draws; d++) {
    int32_t t = sampler_sample(s, logits);
    assert_true(t >= 0 && t < n);
    if (p[t] == 0.0) fail_msg("token %d has probability 0 but was drawn", t);
    count[t]++;
  }
  double chi2 = 0;
  for (int i = 0; i < n; i++) {
    if (p[i] == 0.0) continue;
    double e = p[i] * draws;
    chi2 += (count[i] - e) * (count[i] - e) / e;
    double f = (double)count[i] / draws;
    if (fabs(f - p[i]) > tol) fail_msg("token %d: frequency %.4f, expected %.4f", i, f, p[i]);
  }
  if (chi2 > crit) fail_msg("chi-square %.2f > %.2f", chi2, crit);
  free(count);
}

// ---- greedy ---------------------------------------------------------------

static void test_greedy(void **st) {
  (void)st;
  sampler_params p = sampler_params_default();  // top-k/p/min-p on: greedy ignores them
  p.temperature = 0.0f;
  p.seed = 7;
  sampler *s = make(&p, 6);
  const float a[6] = {0.1f, 3.0f, -2.0f, 2.9f, 3.0f, 0.0f};  // tie: 1 and 4
  for (int i = 0; i < 10; i++) assert_int_equal(sampler_sample(s, a), 1);
  const float b[6] = {-5.0f, -3.0f, -0.5f, -0.5f, -7.0f, -1.0f};  // all negative, tie 2/3
  assert_int_equal(sampler_sample(s, b), 2);
  const float c[6] = {-INFINITY, NAN, -1e30f, -INFINITY, NAN, -1e31f};
  assert_int_equal(sampler_sample(s, c), 2);
  const float d[6] = {1.0f, INFINITY, 2.0f, NAN, INFINITY, 0.0f};
  assert_int_equal(sampler_sample(s, d), 1);
  sampler_free(s);

  p.temperature = -1.0f;  // negative: greedy too
  s = make(&p, 6);
  assert_int_equal(sampler_sample(s, a), 1);
  sampler_free(s);
}

// ---- top-k ----------------------------------------------------------------

static const float *g_sort_logits;  // for qsort: best logit first, then lower id
static int cmp_by_logit_desc(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  float lx = g_sort_logits[x], ly = g_sort_logits[y];
  if (lx != ly) return lx > ly ? -1 : 1;
  return x < y ? -1 : 1;
}

static int32_t *rank_tokens(const float *l, int n) {
  int32_t *r = malloc((size_t)n * sizeof(int32_t));
  for (int i = 0; i < n; i++) r[i] = i;
  g_sort_logits = l;
  qsort(r, (size_t)n, sizeof(int32_t), cmp_by_logit_desc);
  return r;
}

static void test_top_k(void **st) {
  (void)st;
  // small vocabulary: exact distribution over the top k
  const int n = 12;
  float l[12];
  uint64_t rs = 99;
  for (int i = 0; i < n; i++) l[i] = tu_rand_uniform(&rs, -2.0f, 2.0f);
  int32_t *rank = rank_tokens(l, n);
  sampler_params p = params_plain();
  p.top_k = 4;
  sampler *s = make(&p, n);
  float lk[12];
  for (int i = 0; i < n; i++) lk[i] = -INFINITY;
  for (int i = 0; i < 4; i++) lk[rank[i]] = l[rank[i]];
  double prob[12];
  softmax_t(lk, n, 1.0, prob);
  check_distribution(s, l, n, prob, 20000, 16.27 /* df 3, p=0.001 */, 0.015);
  sampler_free(s);
  free(rank);

  // large vocabulary, small k: never outside the top k, every one of them seen
  const int nv = 50000, k = 10;
  float *big = malloc((size_t)nv * sizeof(float));
  for (int i = 0; i < nv; i++) big[i] = tu_rand_uniform(&rs, -8.0f, 8.0f);
  rank = rank_tokens(big, nv);
  bool *in_top = calloc((size_t)nv, 1);
  for (int i = 0; i < k; i++) in_top[rank[i]] = true;
  p = params_plain();
  p.top_k = k;
  p.temperature = 3.0f;  // flatten so all k show up
  s = make(&p, nv);
  int seen[10] = {0};
  for (int d = 0; d < 3000; d++) {
    int32_t t = sampler_sample(s, big);
    assert_true(t >= 0 && t < nv);
    if (!in_top[t]) fail_msg("draw %d: token %d is not among the top %d", d, t, k);
    for (int i = 0; i < k; i++) seen[i] += rank[i] == t;
  }
  for (int i = 0; i < k; i++) assert_true(seen[i] > 0);
  sampler_free(s);
  free(in_top);
  free(rank);
  free(big);
}

// top-k ties go to the lower id; NaN and -inf logits never count; fewer
// finite logits than k keep them all; the k kept may all come after them.
static void test_top_k_ties(void **st) {
  (void)st;
  enum { NV = 1000 };
  float l[NV];
  sampler_params p = params_plain();
  p.top_k = 5;
  p.temperature = 1000.0f;  // flat: every kept token shows up
  struct {
    int first_finite, n_finite, n_kept;
  } cases[] = {{0, NV, 5}, {7, NV - 7, 5}, {NV - 3, 3, 3}, {NV - 5, 5, 5}, {600, 6, 5}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (int i = 0; i < NV; i++) {
      const bool fin = i >= cases[c].first_finite && i < cases[c].first_finite + cases[c].n_finite;
      l[i] = fin ? 1.0f : (i % 2 ? NAN : -INFINITY);  // all finite ones tied
    }
    sampler *s = make(&p, NV);
    int seen[NV] = {0};
    for (int d = 0; d < 2000; d++) seen[sampler_sample(s, l)]++;
    for (int i = 0; i < NV; i++) {
      const bool kept = i >= cases[c].first_finite && i < cases[c].first_finite + cases[c].n_kept;
      if (kept != (seen[i] > 0)) fail_msg("case %zu: token %d drawn %d times, kept %d", c, i, seen[i], (int)kept);
    }
    sampler_free(s);
  }
}

// top-p and min-p together keep the shorter of their two best-ranked
// prefixes: probabilities .4 .25 .15 .1 .06 .04 (shuffled).
static void test_top_p_with_min_p(void **st) {
  (void)st;
  const int n = 6;
  const double pr[6] = {0.06, 0.25, 0.1, 0.4, 0.04, 0.15};
  float l[6];
  for (int i = 0; i < n; i++) l[i] = (float)log(pr[i]);
  struct {
    float top_p, min_p;
    bool keep[6];
  } cases[] = {
      {0.75f, 0.2f, {0, 1, 0, 1, 0, 1}},  // top-p: .4 .25 .15 (0.8); min-p (>= .08): four; top-p's is shorter
      {0.95f, 0.2f, {0, 1, 1, 1, 0, 1}},  // top-p: five (0.96); min-p: .4 .25 .15 .1; min-p's is shorter
      {0.95f, 0.5f, {0, 1, 0, 1, 0, 0}},  // min-p (>= .2): .4 .25
      {0.5f, 0.01f, {0, 1, 0, 1, 0, 0}},  // top-p: .4 .25 (0.65); min-p keeps all
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sampler_params p = params_plain();
    p.top_p = cases[c].top_p;
    p.min_p = cases[c].min_p;
    p.temperature = 100.0f;  // flat after the cuts: every kept token shows up
    sampler *s = make(&p, n);
    int seen[6] = {0};
    for (int d = 0; d < 3000; d++) seen[sampler_sample(s, l)]++;
    for (int i = 0; i < n; i++)
      if (cases[c].keep[i] != (seen[i] > 0))
        fail_msg("top_p %g min_p %g: token %d (p %.2f) drawn %d times", (double)cases[c].top_p, (double)cases[c].min_p, i,
                 pr[i], seen[i]);
    sampler_free(s);
  }
}

// ---- top-p ----------------------------------------------------------------

static void test_top_p(void **st) {
  (void)st;
  // probabilities .5 .2 .15 .1 .05 (shuffled): p = 0.8 keeps the 3 largest
  // (0.5 + 0.2 < 0.8 <= 0.85)
  const int n = 5;
  const double pr[5] = {0.1, 0.5, 0.05, 0.2, 0.15};
  float l[5];
  for (int i = 0; i < n; i++) l[i] = (float)log(pr[i]);
  sampler_params p = params_plain();
  p.top_p = 0.8f;
  sampler *s = make(&p, n);
  double want[5] = {0, 0.5 / 0.85, 0, 0.2 / 0.85, 0.15 / 0.85};
  check_distribution(s, l, n, want, 20000, 13.82 /* df 2 */, 0.015);
  sampler_free(s);

  // p = 0: only the most likely token
  p.top_p = 0.0f;
  s = make(&p, n);
  for (int d = 0; d < 200; d++) assert_int_equal(sampler_sample(s, l), 1);
  sampler_free(s);

  // large vocabulary, no top-k: the nucleus (hundreds of tokens, found by a
  // full sort here) contains every draw, and the draws spread over it
  const int nv = 30000;
  float *big = malloc((size_t)nv * sizeof(float));
  uint64_t rs = 5;
  for (int i = 0; i < nv; i++) big[i] = tu_rand_uniform(&rs, -6.0f, 6.0f);
  int32_t *rank = rank_tokens(big, nv);
  double *prob = malloc((size_t)nv * sizeof(double));
  softmax_t(big, nv, 1.0, prob);
  const double top_p = 0.9;
  bool *in_nucleus = calloc((size_t)nv, 1);
  double cum = 0;
  int n_nucleus = 0;
  for (int i = 0; i < nv; i++) {
    in_nucleus[rank[i]] = true;
    n_nucleus++;
    cum += prob[rank[i]];
    if (cum >= top_p) break;
  }
  assert_true(n_nucleus > 256);  // a wide nucleus: many partition rounds
  p = params_plain();
  p.top_p = (float)top_p;
  s = make(&p, nv);
  int outside_rank = 0;
  for (int d = 0; d < 2000; d++) {
    int32_t t = sampler_sample(s, big);
    assert_true(t >= 0 && t < nv);
    if (!in_nucleus[t]) fail_msg("draw %d: token %d is outside the %.2f nucleus", d, t, top_p);
    for (int i = n_nucleus - 10; i < n_nucleus; i++) outside_rank += rank[i] == t;
  }
  assert_true(outside_rank > 0);  // the tail of the nucleus is reachable
  sampler_free(s);
  free(in_nucleus);
  free(prob);
  free(rank);
  free(big);
}

// ---- min-p ----------------------------------------------------------------

static void test_min_p(void **st) {
  (void)st;
  // p = .4 .3 .2 .06 .04; min_p 0.2 -> threshold .08: keeps the 3 largest
  const int n = 5;
  const double pr[5] = {0.06, 0.3, 0.4, 0.04, 0.2};
  float l[5];
  for (int i = 0; i < n; i++) l[i] = (float)log(pr[i]);
  sampler_params p = params_plain();
  p.min_p = 0.2f;
  sampler *s = make(&p, n);
  double want[5] = {0, 0.3 / 0.9, 0.4 / 0.9, 0, 0.2 / 0.9};
  check_distribution(s, l, n, want, 20000, 13.82, 0.015);
  sampler_free(s);

  // min_p applies to the untempered distribution: a high temperature does not
  // let token 0 (p = .06 < .08) back in
  p.temperature = 5.0f;
  s = make(&p, n);
  for (int d = 0; d < 5000; d++) {
    int32_t t = sampler_sample(s, l);
    assert_true(t == 1 || t == 2 || t == 4);
  }
  sampler_free(s);
}

// ---- temperature ----------------------------------------------------------

static const float k_logits8[8] = {1.0f, 0.5f, 0.2f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f};

static void test_temperature_one_matches_softmax(void **st) {
  (void)st;
  sampler_params p = params_plain();
  sampler *s = make(&p, 8);
  double prob[8];
  softmax_t(k_logits8, 8, 1.0, prob);
  check_distribution(s, k_logits8, 8, prob, 20000, 24.32 /* df 7, p=0.001 */, 0.012);
  sampler_free(s);
}

static void test_temperature_sharpens(void **st) {
  (void)st;
  sampler_params p = params_plain();
  p.temperature = 0.5f;
  sampler *s = make(&p, 8);
  double prob[8], prob1[8];
  softmax_t(k_logits8, 8, 0.5, prob);
  softmax_t(k_logits8, 8, 1.0, prob1);
  assert_true(prob[4] > prob1[4] + 0.1);  // the test case does sharpen
  check_distribution(s, k_logits8, 8, prob, 20000, 24.32, 0.012);
  sampler_free(s);

  p.temperature = 2.0f;  // and flattens above 1
  s = make(&p, 8);
  softmax_t(k_logits8, 8, 2.0, prob);
  check_distribution(s, k_logits8, 8, prob, 20000, 24.32, 0.012);
  sampler_free(s);
}

// ---- seeds ----------------------------------------------------------------

static void draw_seq(sampler *s, const float *l, int32_t *out, int n) {
  for (int i = 0; i < n; i++) out[i] = sampler_sample(s, l);
}

static void test_seed(void **st) {
  (void)st;
  enum { N = 500 };
  int32_t a[N], b[N], c[N];
  sampler_params p = params_plain();
  p.seed = 42;
  sampler *s1 = make(&p, 8), *s2 = make(&p, 8);
  assert_int_equal(sampler_seed(s1), 42);
  draw_seq(s1, k_logits8, a, N);
  draw_seq(s2, k_logits8, b, N);
  assert_memory_equal(a, b, sizeof(a));
  sampler_reset(s1);  // restarts the stream
  draw_seq(s1, k_logits8, c, N);
  assert_memory_equal(a, c, sizeof(a));
  p.seed = 43;
  sampler *s3 = make(&p, 8);
  draw_seq(s3, k_logits8, c, N);
  int diff = 0;
  for (int i = 0; i < N; i++) diff += a[i] != c[i];
  assert_true(diff > N / 4);
  p.seed = SAMPLER_SEED_RANDOM;
  sampler *s4 = make(&p, 8);
  assert_true(sampler_seed(s4) != SAMPLER_SEED_RANDOM);
  sampler_free(s1);
  sampler_free(s2);
  sampler_free(s3);
  sampler_free(s4);
}

// ---- penalties --------------------------------------------------------------

static void test_penalties(void **st) {
  (void)st;
  sampler_params p = params_plain();
  p.temperature = 0.0f;
  p.repeat_last_n = 4;

  // repeat penalty divides a positive logit: 2.0 / 1.2 = 1.67 < 1.9
  const float pos[4] = {2.0f, 1.9f, 0.0f, -1.0f};
  p.repeat_penalty = 1.2f;
  sampler *s = make(&p, 4);
  assert_int_equal(sampler_sample(s, pos), 0);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, pos), 1);
  // the window: 3 more tokens push token 0 out of the last 4... not yet
  sampler_accept(s, 2);
  sampler_accept(s, 3);
  sampler_accept(s, 3);
  assert_int_equal(sampler_sample(s, pos), 1);
  sampler_accept(s, 2);  // now it is
  assert_int_equal(sampler_sample(s, pos), 0);
  sampler_reset(s);
  assert_int_equal(sampler_sample(s, pos), 0);
  sampler_free(s);

  // ... and multiplies a negative one: -0.5 * 1.5 = -0.75 < -0.6
  const float neg[3] = {-0.5f, -0.6f, -3.0f};
  p.repeat_penalty = 1.5f;
  s = make(&p, 3);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, neg), 1);
  sampler_free(s);

  // presence: 1.0 - 0.5 < 0.8, however often the token was seen
  const float pr[3] = {1.0f, 0.8f, 0.0f};
  p.repeat_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  s = make(&p, 3);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, pr), 1);
  sampler_free(s);

  // frequency: 1.0 - 0.1 * count; once is not enough, three times is
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.1f;
  s = make(&p, 3);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, pr), 0);
  sampler_accept(s, 0);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, pr), 1);
  sampler_free(s);

  // repeat_last_n = 0 turns them off
  p.repeat_last_n = 0;
  p.repeat_penalty = 10.0f;
  s = make(&p, 4);
  sampler_accept(s, 0);
  assert_int_equal(sampler_sample(s, pos), 0);
  sampler_free(s);
}

// ---- robustness ---------------------------------------------------------------

static void test_bad_logits(void **st) {
  (void)st;
  enum { N = 64 };
  float l[N];
  uint64_t rs = 3;
  for (int i = 0; i < N; i++) {
    int r = (int)(tu_rand_u64(&rs) % 4);
    l[i] = r == 0 ? NAN : r == 1 ? -INFINITY : tu_rand_uniform(&rs, -1.0f, 1.0f);
  }
  sampler_params p = params_plain();
  p.top_k = 20;
  p.top_p = 0.95f;
  p.min_p = 0.01f;
  p.repeat_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  sampler *s = make(&p, N);
  float copy[N];
  memcpy(copy, l, sizeof(l));
  for (int d = 0; d < 5000; d++) {
    int32_t t = sampler_sample(s, l);
    assert_true(t >= 0 && t < N);
    if (!isfinite(l[t])) fail_msg("drew token %d with logit %f", t, (double)l[t]);
    sampler_accept(s, t);
  }
  assert_memory_equal(copy, l, sizeof(l));  // the caller's logits are untouched (NaN bits included)
  sampler_free(s);

  // nothing finite: still a valid id
  float none[N];
  for (int i = 0; i < N; i++) none[i] = i % 2 ? NAN : -INFINITY;
  s = make(&p, N);
  assert_int_equal(sampler_sample(s, none), 0);
  // +inf wins every draw
  none[17] = INFINITY;
  for (int d = 0; d < 100; d++) assert_int_equal(sampler_sample(s, none), 17);
  sampler_free(s);
}

static void test_no_alloc_in_sample(void **st) {
  (void)st;
  const int nv = 32000;
  float *l = malloc((size_t)nv * sizeof(float));
  uint64_t rs = 11;
  for (int i = 0; i < nv; i++) l[i] = tu_rand_uniform(&rs, -10.0f, 10.0f);
  sampler_params p = sampler_params_default();
  p.seed = 5;
  p.repeat_penalty = 1.1f;
  sampler *s = make(&p, nv);
  size_t before = mole_mem_current();
  for (int d = 0; d < 200; d++) sampler_accept(s, sampler_sample(s, l));
  assert_int_equal(mole_mem_current(), before);
  sampler_free(s);
  p.top_k = 0;  // top-p over the whole vocabulary too
  s = make(&p, nv);
  before = mole_mem_current();
  for (int d = 0; d < 50; d++) sampler_accept(s, sampler_sample(s, l));
  assert_int_equal(mole_mem_current(), before);
  sampler_free(s);
  free(l);
}

static void test_bad_params(void **st) {
  (void)st;
  sampler *s = (sampler *)1;
  sampler_params p = params_plain();
  assert_int_equal(sampler_init(&p, 0, &s), MOLE_ERR_ARG);
  assert_null(s);
  p.top_p = 1.5f;
  assert_int_equal(sampler_init(&p, 10, &s), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "top_p"));
  p = params_plain();
  p.temperature = NAN;
  assert_int_equal(sampler_init(&p, 10, &s), MOLE_ERR_ARG);
  p = params_plain();
  p.repeat_penalty = 0.0f;
  assert_int_equal(sampler_init(&p, 10, &s), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "repeat_penalty"));
  p = params_plain();
  p.repeat_last_n = -1;
  assert_int_equal(sampler_init(&p, 10, &s), MOLE_ERR_ARG);
  p = params_plain();
  p.min_p = -0.1f;
  assert_int_equal(sampler_init(&p, 10, &s), MOLE_ERR_ARG);
}

// ---- stop strings -----------------------------------------------------------

typedef struct {
  char text[4096];
  size_t len;
} printed;

static void print_emit(printed *o, const stop_match *r) {
  assert_true(o->len + r->n_emit < sizeof(o->text));
  memcpy(o->text + o->len, r->emit, r->n_emit);
  o->len += r->n_emit;
  o->text[o->len] = '\0';
}

static stop_matcher *make_stops(const char *const *stops, int64_t n) {
  stop_matcher *m = NULL;
  assert_int_equal(stop_matcher_init(stops, n, &m), MOLE_OK);
  return m;
}

static void test_stop_full_and_hold(void **st) {
  (void)st;
  const char *stops[] = {"STOP"};
  stop_matcher *m = make_stops(stops, 1);
  stop_match r;
  printed o = {0};

  assert_int_equal(stop_matcher_feed(m, "Hello STOP world", 16, &r), MOLE_OK);
  assert_true(r.matched);
  assert_int_equal(r.stop_index, 0);
  print_emit(&o, &r);
  assert_string_equal(o.text, "Hello ");
  assert_int_equal(stop_matcher_feed(m, "more", 4, &r), MOLE_OK);  // after a match: nothing
  assert_true(r.matched);
  assert_int_equal(r.n_emit, 0);

  stop_matcher_reset(m);
  o.len = 0;
  o.text[0] = '\0';
  assert_int_equal(stop_matcher_feed(m, "Hello ST", 8, &r), MOLE_OK);
  assert_false(r.matched);
  assert_int_equal(r.n_held, 2);  // "ST" may start "STOP"
  print_emit(&o, &r);
  assert_string_equal(o.text, "Hello ");
  assert_int_equal(stop_matcher_feed(m, "O", 1, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 0);
  assert_int_equal(r.n_held, 3);
  assert_int_equal(stop_matcher_feed(m, "P!", 2, &r), MOLE_OK);
  assert_true(r.matched);
  assert_int_equal(r.n_emit, 0);

  // a false alarm is released as soon as it is settled
  stop_matcher_reset(m);
  o.len = 0;
  assert_int_equal(stop_matcher_feed(m, "ST", 2, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 0);
  assert_int_equal(stop_matcher_feed(m, "ART", 3, &r), MOLE_OK);
  assert_int_equal(r.n_held, 0);
  print_emit(&o, &r);
  assert_string_equal(o.text, "START");

  // flush releases what is held at the end of the stream
  stop_matcher_reset(m);
  o.len = 0;
  assert_int_equal(stop_matcher_feed(m, "abc S", 5, &r), MOLE_OK);
  print_emit(&o, &r);
  assert_int_equal(r.n_held, 1);
  stop_matcher_flush(m, &r);
  print_emit(&o, &r);
  assert_string_equal(o.text, "abc S");
  stop_matcher_free(m);
}

static void test_stop_across_pieces(void **st) {
  (void)st;
  const char *stops[] = {"</s>", "<|im_end|>"};
  stop_matcher *m = make_stops(stops, 2);
  const char *pieces[] = {"ab", "c<", "|im", "_e", "nd|>", "rest"};
  printed o = {0};
  stop_match r;
  int matched_at = -1;
  for (int i = 0; i < 6; i++) {
    assert_int_equal(stop_matcher_feed(m, pieces[i], strlen(pieces[i]), &r), MOLE_OK);
    print_emit(&o, &r);
    assert_null(strchr(o.text, '<'));  // no part of the stop string is ever printed
    if (r.matched && matched_at < 0) matched_at = i;
  }
  assert_int_equal(matched_at, 4);
  assert_int_equal(r.stop_index, 1);
  assert_string_equal(o.text, "abc");

  // the earliest stop string wins
  const char *two[] = {"world", "lo w"};
  stop_matcher *m2 = make_stops(two, 2);
  assert_int_equal(stop_matcher_feed(m2, "hello world", 11, &r), MOLE_OK);
  assert_true(r.matched);
  assert_int_equal(r.stop_index, 1);
  assert_int_equal(r.n_emit, 3);
  stop_matcher_free(m2);

  // random splits of a random text: what is printed is exactly the text up
  // to the first stop string, and a partial stop string is never printed
  uint64_t rs = 77;
  for (int trial = 0; trial < 300; trial++) {
    char text[600];
    size_t n = 0;
    while (n < 500) {
      uint64_t x = tu_rand_u64(&rs) % 40;
      if (x == 0 && n + 10 < sizeof(text)) {
        memcpy(text + n, "<|im_end|>", 10);
        n += 10;
      } else if (x < 4 && n + 4 < sizeof(text)) {  // near misses
        memcpy(text + n, x == 1 ? "</" : x == 2 ? "<|im_" : "</s", x == 1 ? 2 : x == 2 ? 5 : 3);
        n += x == 1 ? 2 : x == 2 ? 5 : 3;
      } else {
        text[n++] = "ab<|>/s_em"[x % 10];
      }
    }
    text[n] = '\0';
    const char *f1 = strstr(text, "</s>"), *f2 = strstr(text, "<|im_end|>");
    const char *first = f1 && (!f2 || f1 < f2) ? f1 : f2;
    size_t want = first ? (size_t)(first - text) : n;
    stop_matcher_reset(m);
    o.len = 0;
    bool matched = false;
    for (size_t pos = 0; pos < n && !matched;) {
      size_t k = 1 + tu_rand_u64(&rs) % 7;
      if (k > n - pos) k = n - pos;
      assert_int_equal(stop_matcher_feed(m, text + pos, k, &r), MOLE_OK);
      print_emit(&o, &r);
      assert_true(o.len <= want);
      matched = r.matched;
      pos += k;
    }
    if (!matched) {
      stop_matcher_flush(m, &r);
      print_emit(&o, &r);
    }
    assert_int_equal(matched, first != NULL);
    assert_int_equal(o.len, want);
    assert_memory_equal(o.text, text, want);
  }
  stop_matcher_free(m);
}

static void test_stop_edge_cases(void **st) {
  (void)st;
  stop_match r;
  // no stop strings: everything passes straight through
  stop_matcher *m = make_stops(NULL, 0);
  assert_int_equal(stop_matcher_feed(m, "anything", 8, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 8);
  assert_false(r.matched);
  stop_matcher_free(m);

  // a piece larger than the reserve
  const char *stops[] = {"XYZ"};
  m = make_stops(stops, 1);
  char big[3000];
  memset(big, 'a', sizeof(big));
  big[2990] = 'X';
  big[2991] = 'Y';
  assert_int_equal(stop_matcher_feed(m, big, 2992, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 2990);
  assert_int_equal(r.n_held, 2);
  assert_int_equal(stop_matcher_feed(m, "Z", 1, &r), MOLE_OK);
  assert_true(r.matched);
  assert_int_equal(r.n_emit, 0);
  stop_matcher_free(m);

  const char *bad[] = {"ok", ""};
  m = (stop_matcher *)1;
  assert_int_equal(stop_matcher_init(bad, 2, &m), MOLE_ERR_ARG);
  assert_null(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_top_k),
      cmocka_unit_test(test_top_k_ties),
      cmocka_unit_test(test_top_p_with_min_p),
      cmocka_unit_test(test_top_p),
      cmocka_unit_test(test_min_p),
      cmocka_unit_test(test_temperature_one_matches_softmax),
      cmocka_unit_test(test_temperature_sharpens),
      cmocka_unit_test(test_seed),
      cmocka_unit_test(test_penalties),
      cmocka_unit_test(test_bad_logits),
      cmocka_unit_test(test_no_alloc_in_sample),
      cmocka_unit_test(test_bad_params),
      cmocka_unit_test(test_stop_full_and_hold),
      cmocka_unit_test(test_stop_across_pieces),
      cmocka_unit_test(test_stop_edge_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
