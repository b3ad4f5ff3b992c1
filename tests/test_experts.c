// The expert provider end to end: tiered runs (a budget holding everything,
// a tiny budget through the disk path, io_uring and pread, with and without
// prefetch) give exactly the logits of the fully resident run; so does a
// packed store whose high copies keep the source types; mixed precision uses
// the low copies; budget and parameter errors are clear; the predictor's
// accuracy is reported; the routing trace replays to the provider's counts
// (a run in both precisions, and a run with prefetches and waves whose reads
// land before each decision: cachesim drives the same tier rules); a
// budget below one layer's working set computes a prompt batch in waves and
// still gives the resident logits.
#include <liburing.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "experts/experts_internal.h"
#include "experts/pack.h"
#include "experts/trace.h"
#include "model/model.h"
#include "model/synth.h"
#include "mole.h"
#include "testutil.h"

// The read path asked for io_uring gets it where the kernel has it; under
// qemu-user (the aarch64 tests) there is none, and the pread pool serves.
static const char *uring_or_pread(void) {
  static int have = -1;
  if (have < 0) {
    struct io_uring r;
    have = io_uring_queue_init(4, &r, 0) == 0;
    if (have) io_uring_queue_exit(&r);
  }
  return have ? "io_uring" : "pread";
}

enum { N_PROMPT = 12, N_DECODE = 10, N_TOK = N_PROMPT + N_DECODE };

static char g_plain[256], g_packed[256], g_trace[256];
static int64_t g_vocab;
static float *g_ref;  // [N_TOK][vocab] resident logits

static mole_offload_params offload(int64_t budget) {
  mole_offload_params o = mole_model_default_params().offload;
  o.expert_budget = budget;
  return o;
}

// Logits of n_prompt tokens in one batch (all of them), then n_decode one by
// one. *stats (optional) gets the provider's statistics.
static mole_status run_n(const char *path, const mole_offload_params *o, int n_prompt, int n_decode, float *out,
                         experts_stats *stats) {
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 2;
  mp.offload = *o;
  mole_model *m;
  mole_status st = mole_model_load(path, &mp, &m);
  if (st) return st;
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = 64;
  sp.kv_type = MOLE_KV_F32;
  mole_session *s;
  assert_int_equal(mole_session_new(m, &sp, &s), MOLE_OK);
  const int n_tok = n_prompt + n_decode;
  assert_true(n_tok <= sp.n_ctx);
  int32_t toks[64];
  for (int i = 0; i < n_tok; i++) toks[i] = (int32_t)((i * 37 + 11) % g_vocab);
  st = mole_session_eval(s, toks, n_prompt, out, true);
  for (int i = n_prompt; i < n_tok && !st; i++) st = mole_session_eval(s, toks + i, 1, out + (size_t)i * (size_t)g_vocab, false);
  if (stats) experts_get_stats(m->experts, stats);
  mole_session_free(s);
  mole_model_free(m);
  return st;
}

static mole_status run(const char *path, const mole_offload_params *o, float *out, experts_stats *stats) {
  return run_n(path, o, N_PROMPT, N_DECODE, out, stats);
}

static float *run_ok(const char *path, const mole_offload_params *o, experts_stats *stats) {
  float *lg = malloc(sizeof(float) * N_TOK * (size_t)g_vocab);
  mole_status st = run(path, o, lg, stats);
  if (st) fail_msg("%s: %s", path, mole_last_error());
  return lg;
}

static void expect_same(const float *a, const char *what) {
  if (memcmp(a, g_ref, sizeof(float) * N_TOK * (size_t)g_vocab) != 0) {
    for (size_t i = 0; i < (size_t)N_TOK * (size_t)g_vocab; i++)
      if (a[i] != g_ref[i]) fail_msg("%s: logit %zu is %g, resident %g", what, i, (double)a[i], (double)g_ref[i]);
  }
}

static int setup(void **state) {
  (void)state;
  snprintf(g_plain, sizeof g_plain, "/tmp/mole-test-experts-%d.gguf", (int)getpid());
  snprintf(g_packed, sizeof g_packed, "/tmp/mole-test-experts-%d-packed.gguf", (int)getpid());
  snprintf(g_trace, sizeof g_trace, "/tmp/mole-test-experts-%d.trace", (int)getpid());
  synth_params p = synth_default_params();
  p.n_embd = 256;
  p.n_layer = 4;
  p.n_expert = 8;
  p.n_expert_used = 2;
  p.n_ff = 512;
  p.n_vocab = 512;
  p.n_ctx = 256;
  p.type = QT_Q8_0;
  p.n_threads = 2;
  if (synth_write(&p, g_plain, NULL)) return -1;
  g_vocab = p.n_vocab;
  experts_pack_params pp = {.high = -1, .low = QT_Q4_0, .n_threads = 2};
  if (experts_pack(g_plain, g_packed, &pp, NULL)) return -1;
  g_ref = malloc(sizeof(float) * N_TOK * (size_t)g_vocab);
  mole_offload_params o = offload(0);
  return run(g_plain, &o, g_ref, NULL) == MOLE_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_plain);
  unlink(g_packed);
  unlink(g_trace);
  free(g_ref);
  return 0;
}

static void test_budget_holds_all(void **state) {
  (void)state;
  experts_stats s;
  mole_offload_params o = offload((int64_t)1 << 30);
  float *lg = run_ok(g_plain, &o, &s);
  expect_same(lg, "budget holding every expert");
  assert_true(s.tiered);
  assert_int_equal(s.slots[0], 4 * 8);
  // every expert is read at most once
  assert_true(s.total.reads <= 32 && s.total.misses[0] > 0);
  assert_true(s.hit_rate > 0 && s.hit_rate <= 1);
  free(lg);
  // a fraction: 100% of the experts
  o = offload(0);
  o.expert_budget_frac = 1.0;
  lg = run_ok(g_plain, &o, &s);
  expect_same(lg, "--expert-budget 100%");
  assert_int_equal(s.slots[0], 32);
  free(lg);
}

static void test_disk_path(void **state) {
  (void)state;
  const char *ios[] = {"uring", "pread"};
  for (int i = 0; i < 2; i++)
    for (int depth = 0; depth <= 2; depth += 2) {
      // one layer's experts: every layer's experts are read from disk again
      mole_offload_params o = offload(8 * 420 * 1024);
      o.io = ios[i];
      o.prefetch_depth = depth;
      o.cache_policy = "lru";
      experts_stats s;
      float *lg = run_ok(g_plain, &o, &s);
      char what[64];
      snprintf(what, sizeof what, "tiny budget, io %s, prefetch depth %d", ios[i], depth);
      expect_same(lg, what);
      assert_string_equal(s.io, i == 0 ? uring_or_pread() : "pread");
      assert_true(s.direct);
      assert_int_equal(s.slots[0], 8);
      assert_true(s.total.misses[0] > (N_TOK - N_PROMPT) * 2);
      assert_true(s.total.bytes_read >= s.total.misses[0] * 420 * 1024);
      assert_int_equal(s.tokens, N_TOK);
      if (depth) {
        assert_true(s.total.pred_total > 0);
        assert_true(s.pred_accuracy >= 0 && s.pred_accuracy <= 1);
      }
      free(lg);
    }
}

static void test_packed(void **state) {
  (void)state;
  // high copies keep the source type: the same logits, resident and tiered
  mole_offload_params o = offload(0);
  float *lg = run_ok(g_packed, &o, NULL);
  expect_same(lg, "packed, resident");
  free(lg);
  const char *ios[] = {"uring", "pread"};
  for (int i = 0; i < 2; i++) {
    o = offload(8 * 408 * 1024);
    o.io = ios[i];
    experts_stats s;
    lg = run_ok(g_packed, &o, &s);
    expect_same(lg, "packed, tiny budget");
    assert_true(s.has_low && s.slots[1] == 0);  // t1 = t2: the low copies are not in use
    assert_true(s.total.misses[0] > 0);
    free(lg);
  }
  // mixed precision: only the top-1 choice in high precision
  o = offload(0);
  o.t1 = 0;
  o.t2 = 1;
  experts_stats s;
  float *mixed = run_ok(g_packed, &o, &s);
  assert_true(s.total.hits[1] > 0);
  assert_true(memcmp(mixed, g_ref, sizeof(float) * N_TOK * (size_t)g_vocab) != 0);
  double worst = 0;
  for (size_t i = 0; i < (size_t)N_TOK * (size_t)g_vocab; i++) {
    assert_true(isfinite(mixed[i]));
    worst = fmax(worst, fabs((double)mixed[i] - (double)g_ref[i]));
  }
  assert_true(worst < 1.0);
  // tiered with a budget for everything: both pools, the same plan as resident
  // within a step; low copies are read
  o.expert_budget = (int64_t)1 << 30;
  lg = run_ok(g_packed, &o, &s);
  assert_true(s.slots[1] == 32 && s.total.misses[1] + s.total.hits[1] > 0);
  free(lg);
  // skipping: t2 = 0 keeps only the top-1 expert
  o.t1 = o.t2 = 0;
  o.expert_budget = 0;
  lg = run_ok(g_packed, &o, &s);
  assert_int_equal(s.total.skips, N_TOK * 4);  // one of two choices, every token and layer
  free(lg);
  free(mixed);
}


// High and low copies share one budget: a budget of N high slots keeps N
// high slots when low copies are in use, and a small mixed budget runs.
static void test_shared_budget(void **state) {
  (void)state;
  mole_offload_params o = offload((int64_t)1 << 30);
  o.t1 = 0;
  o.t2 = 1;
  experts_stats s;
  float *lg = run_ok(g_packed, &o, &s);
  const int64_t H = s.slot_bytes[0], L = s.slot_bytes[1];
  assert_true(H > 0 && L > 0 && L < H);
  free(lg);
  const char *ios[] = {"uring", "pread"};
  float *first = NULL;
  for (int i = 0; i < 2; i++) {
    // a layer's experts in both precisions: before, 8 slots of each
    o = offload(8 * (H + L));
    o.t1 = 0;
    o.t2 = 1;
    o.io = ios[i];
    o.cache_policy = "hobbit";
    // no prefetch: whether a prefetched copy has landed when the next layer
    // plans depends on the disk's timing, and so do evictions and the plan's
    // preference for a cached high copy (the plans would differ by chance)
    o.prefetch_depth = 0;
    lg = run_ok(g_packed, &o, &s);
    assert_int_equal(s.slots[0], 8 * (H + L) / H);
    assert_int_equal(s.slots[1], 8 * (H + L) / L);
    assert_true(s.total.misses[0] > 0 && s.total.misses[1] > 0);
    assert_true(s.resident_bytes <= 8 * (H + L));
    double worst = 0;
    for (size_t j = 0; j < (size_t)N_TOK * (size_t)g_vocab; j++) {
      assert_true(isfinite(lg[j]));
      worst = fmax(worst, fabs((double)lg[j] - (double)g_ref[j]));
    }
    assert_true(worst < 1.0);
    // the same plan whichever way it reads
    if (first) assert_memory_equal(first, lg, sizeof(float) * N_TOK * (size_t)g_vocab);
    if (first) free(lg);
    else first = lg;
  }
  free(first);
  // t1 = t2 (no low copy requested): every byte for high copies
  o = offload(8 * H);
  o.t1 = o.t2 = 0.5f;
  lg = run_ok(g_packed, &o, &s);
  assert_int_equal(s.slots[0], 8);
  free(lg);
}

static void test_low_falls_back_to_high(void **state) {
  (void)state;
  // a plain GGUF has no low copies: LOW plans become HIGH, logits unchanged
  mole_offload_params o = offload(8 * 420 * 1024);
  o.t1 = 0;
  o.t2 = 1;
  experts_stats s;
  float *lg = run_ok(g_plain, &o, &s);
  expect_same(lg, "t1 0 t2 1 without low copies");
  assert_false(s.has_low);
  assert_int_equal(s.total.hits[1] + s.total.misses[1], 0);
  free(lg);
}

static void test_plan_prefers_cached_high(void **state) {
  (void)state;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mp.offload.expert_budget = (int64_t)1 << 30;
  mp.offload.t1 = 0;
  mp.offload.t2 = 1;
  mp.offload.prefetch_depth = 0;
  mole_model *m;
  assert_int_equal(mole_model_load(g_packed, &mp, &m), MOLE_OK);
  experts *x = m->experts;
  assert_true(experts_has_low(x));
  int32_t sel[2] = {3, 5};
  float w[2] = {0.7f, 0.3f};
  uint8_t prec[2];
  experts_plan(x, 1, 1, 2, sel, w, prec);
  assert_int_equal(prec[0], EXPERT_HIGH);
  assert_int_equal(prec[1], EXPERT_LOW);  // nothing cached yet: the low copy
  expert_view v;
  assert_int_equal(experts_get(x, 1, 3, EXPERT_HIGH, &v), MOLE_OK);
  assert_int_equal(experts_get(x, 1, 5, EXPERT_LOW, &v), MOLE_OK);
  assert_int_equal(v.gate.type, QT_Q4_0);
  experts_layer_done(x, 1);
  experts_step_done(x, 1);
  // expert 3 now has a high copy in RAM: it wins over loading its low copy
  sel[0] = 5;
  sel[1] = 3;
  experts_plan(x, 1, 1, 2, sel, w, prec);
  assert_int_equal(prec[0], EXPERT_HIGH);
  assert_int_equal(prec[1], EXPERT_HIGH);
  assert_int_equal(experts_get(x, 1, 3, EXPERT_HIGH, &v), MOLE_OK);
  assert_int_equal(v.gate.type, QT_Q8_0);
  experts_layer_done(x, 1);
  experts_step_done(x, 1);
  experts_reset_sequence(x);
  mole_model_free(m);
}

static void expect_load_error(const mole_offload_params *o, mole_status want, const char *needle) {
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mp.offload = *o;
  mole_model *m = NULL;
  mole_status st = mole_model_load(g_plain, &mp, &m);
  if (st != want || !strstr(mole_last_error(), needle))
    fail_msg("status %d, message '%s'; wanted %d with '%s'", st, mole_last_error(), want, needle);
  assert_null(m);
}

static void test_errors(void **state) {
  (void)state;
  mole_offload_params o = offload(300 * 1024);  // less than the two experts of one token
  expect_load_error(&o, MOLE_ERR_ARG, "--expert-budget 300.0 KiB is too small");
  o = offload(0);
  o.cache_policy = "mru";
  expect_load_error(&o, MOLE_ERR_ARG, "--cache-policy: cache policy 'mru'");
  o = offload(0);
  o.cache_weights[0] = 0.9f;
  o.cache_weights[3] = 0.9f;
  expect_load_error(&o, MOLE_ERR_ARG, "sum to 1.8");
  o = offload(0);
  o.t1 = 0.8f;
  o.t2 = 0.2f;
  expect_load_error(&o, MOLE_ERR_ARG, "--t1, --t2");
  o = offload(0);
  o.io = "aio";
  expect_load_error(&o, MOLE_ERR_ARG, "--io 'aio'");
  o = offload(0);
  o.prefetch_depth = 9;
  expect_load_error(&o, MOLE_ERR_ARG, "--prefetch-depth 9");
  o = offload(0);
  o.trace_routing = "/nonexistent-dir/x.trace";
  expect_load_error(&o, MOLE_ERR_IO, "--trace-routing: /nonexistent-dir/x.trace");
  // enough for a token, not for all the experts a prompt uses in a layer:
  // that used to fail; the layer is now computed in waves
  o = offload(3 * 420 * 1024);
  experts_stats s;
  float *lg = run_ok(g_plain, &o, &s);
  expect_same(lg, "a budget of 3 experts");
  assert_int_equal(s.slots[0], 3);
  free(lg);
}

// What a provider gets wrong when a layer must be computed in waves: a group
// asked for while the layer's pinned groups hold every slot fails with a
// message, and is had once one is released.
static void test_release(void **state) {
  (void)state;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mp.offload.expert_budget = 2 * 420 * 1024;
  mp.offload.prefetch_depth = 0;
  mole_model *m;
  assert_int_equal(mole_model_load(g_plain, &mp, &m), MOLE_OK);
  experts *x = m->experts;
  // two tokens using four experts; two slots
  int32_t sel[4] = {1, 2, 3, 4};
  float w[4] = {0.6f, 0.4f, 0.7f, 0.3f};
  uint8_t prec[4];
  experts_plan(x, 0, 2, 2, sel, w, prec);
  // the first two get the slots, the others wait for one
  assert_true(experts_ready(x, 0, 1, EXPERT_HIGH) != EXPERTS_NO_SLOT);
  assert_true(experts_ready(x, 0, 2, EXPERT_HIGH) != EXPERTS_NO_SLOT);
  assert_int_equal(experts_ready(x, 0, 3, EXPERT_HIGH), EXPERTS_NO_SLOT);
  assert_int_equal(experts_ready(x, 0, 4, EXPERT_HIGH), EXPERTS_NO_SLOT);
  expert_view v;
  assert_int_equal(experts_get(x, 0, 3, EXPERT_HIGH, &v), MOLE_ERR_NOMEM);
  assert_non_null(strstr(mole_last_error(), "until computed ones are released"));
  assert_int_equal(experts_get(x, 0, 1, EXPERT_HIGH, &v), MOLE_OK);  // waits for the read
  assert_int_equal(experts_ready(x, 0, 1, EXPERT_HIGH), EXPERTS_READY);
  experts_release(x, 0, 1, EXPERT_HIGH);
  // the next query starts expert 3's read in the freed slot
  assert_true(experts_ready(x, 0, 3, EXPERT_HIGH) != EXPERTS_NO_SLOT);
  assert_int_equal(experts_ready(x, 0, 4, EXPERT_HIGH), EXPERTS_NO_SLOT);
  assert_int_equal(experts_get(x, 0, 3, EXPERT_HIGH, &v), MOLE_OK);
  assert_int_equal(experts_get(x, 0, 2, EXPERT_HIGH, &v), MOLE_OK);
  experts_release(x, 0, 2, EXPERT_HIGH);
  experts_release(x, 0, 3, EXPERT_HIGH);
  assert_int_equal(experts_get(x, 0, 4, EXPERT_HIGH, &v), MOLE_OK);
  experts_layer_done(x, 0);
  experts_step_done(x, 2);
  experts_stats st;
  experts_get_stats(x, &st);
  assert_int_equal(st.total.misses[0], 4);
  mole_model_free(m);
}

// A prompt of 48 tokens in one batch uses every expert of a layer; a budget of
// n_expert_used experts computes each layer in waves (computed groups make
// room for the rest) and gives the resident logits, prompt and decode.
enum { N_WAVE_PROMPT = 48, N_WAVE_DECODE = 4, N_WAVE = N_WAVE_PROMPT + N_WAVE_DECODE };

static void test_waves(void **state) {
  (void)state;
  const size_t n_lg = (size_t)N_WAVE * (size_t)g_vocab;
  float *ref = malloc(sizeof(float) * n_lg), *lg = malloc(sizeof(float) * n_lg);
  mole_offload_params o = offload(0);
  if (run_n(g_plain, &o, N_WAVE_PROMPT, N_WAVE_DECODE, ref, NULL)) fail_msg("resident: %s", mole_last_error());
  const char *ios[] = {"uring", "pread"};
  for (int i = 0; i < 2; i++)
    for (int depth = 0; depth <= 2; depth += 2) {
      o = offload(2 * 420 * 1024);
      o.io = ios[i];
      o.prefetch_depth = depth;
      experts_stats s;
      if (run_n(g_plain, &o, N_WAVE_PROMPT, N_WAVE_DECODE, lg, &s))
        fail_msg("io %s, depth %d: %s", ios[i], depth, mole_last_error());
      assert_int_equal(s.slots[0], 2);
      assert_string_equal(s.io, i == 0 ? uring_or_pread() : "pread");
      assert_int_equal(s.tokens, N_WAVE);
      // every layer of the prompt used more experts than the two slots
      assert_true(s.total.misses[0] >= 4 * 3);
      if (memcmp(lg, ref, sizeof(float) * n_lg) != 0)
        for (size_t j = 0; j < n_lg; j++)
          if (lg[j] != ref[j])
            fail_msg("waves, io %s, depth %d: logit %zu (token %zu) is %g, resident %g", ios[i], depth, j,
                     j / (size_t)g_vocab, (double)lg[j], (double)ref[j]);
    }
  // mixed precision: n_expert_used experts in each precision (the least a
  // token pins). The prompt is planned as the resident run plans it (nothing
  // of a layer is cached yet): the same logits; decode may prefer cached high
  // copies over low ones, so only close.
  o = offload((int64_t)1 << 30);
  o.t1 = 0;
  o.t2 = 1;
  experts_stats s;
  float *tmp = run_ok(g_packed, &o, &s);
  free(tmp);
  const int64_t H = s.slot_bytes[0], L = s.slot_bytes[1];
  o.expert_budget = 0;
  if (run_n(g_packed, &o, N_WAVE_PROMPT, N_WAVE_DECODE, ref, NULL)) fail_msg("resident mixed: %s", mole_last_error());
  for (int i = 0; i < 2; i++) {
    o.expert_budget = 2 * (H + L);
    o.io = ios[i];
    o.prefetch_depth = 0;
    if (run_n(g_packed, &o, N_WAVE_PROMPT, N_WAVE_DECODE, lg, &s)) fail_msg("mixed, io %s: %s", ios[i], mole_last_error());
    assert_true(s.slots[0] >= 2 && s.slots[1] >= 2);
    assert_true(s.total.misses[0] > 0 && s.total.misses[1] > 0);
    assert_memory_equal(lg, ref, sizeof(float) * (size_t)N_WAVE_PROMPT * (size_t)g_vocab);
    double worst = 0;
    for (size_t j = (size_t)N_WAVE_PROMPT * (size_t)g_vocab; j < n_lg; j++) {
      assert_true(isfinite(lg[j]));
      worst = fmax(worst, fabs((double)lg[j] - (double)ref[j]));
    }
    assert_true(worst < 1.0);
  }
  free(ref);
  free(lg);
}

static void test_trace_replay(void **state) {
  (void)state;
  // without prefetch, replaying the trace with the run's budget and policy
  // gives the run's misses exactly
  const char *pols[] = {"lru", "hobbit"};
  for (int i = 0; i < 2; i++) {
    mole_offload_params o = offload(12 * 420 * 1024);
    o.prefetch_depth = 0;
    o.cache_policy = pols[i];
    o.trace_routing = g_trace;
    experts_stats s;
    float *lg = run_ok(g_plain, &o, &s);
    expect_same(lg, "traced run");
    free(lg);
    experts_sim_params sp = {.budget = o.expert_budget};
    assert_int_equal(experts_policy_parse(pols[i], NULL, &sp.policy, sp.weights), MOLE_OK);
    experts_sim_result r;
    if (experts_cachesim(g_trace, &sp, &r)) fail_msg("cachesim: %s", mole_last_error());
    assert_int_equal(r.steps, N_DECODE + 1);
    assert_int_equal(r.tokens, N_TOK);
    assert_int_equal(r.slots[0], s.slots[0]);
    assert_int_equal(r.c.misses[0], s.total.misses[0]);
    assert_int_equal(r.c.hits[0], s.total.hits[0]);
  }
  // a trace with predictions replays with prefetch
  mole_offload_params o = offload(12 * 420 * 1024);
  o.prefetch_depth = 1;
  o.trace_routing = g_trace;
  float *lg = run_ok(g_plain, &o, NULL);
  free(lg);
  experts_sim_params sp = {.budget_frac = 0.5, .prefetch = true};
  assert_int_equal(experts_policy_parse("fld", NULL, &sp.policy, sp.weights), MOLE_OK);
  experts_sim_result r;
  if (experts_cachesim(g_trace, &sp, &r)) fail_msg("cachesim: %s", mole_last_error());
  assert_true(r.c.prefetches > 0);
  assert_int_equal(r.slots[0], 16);
  // a broken trace names the line
  FILE *f = fopen(g_trace, "a");
  fputs("L 0 99:h:1 skip 0\n", f);
  fclose(f);
  assert_int_equal(experts_cachesim(g_trace, &sp, &r), MOLE_ERR_FORMAT);
  assert_non_null(strstr(mole_last_error(), "line"));
}

// ---- the provider and its replay decide the same ------------------------------------
// The provider's counts against cachesim's replay of its trace, as far as
// the two must agree (see trace.h).
static void expect_replayed(const experts_stats *s, const mole_offload_params *o, const char *what) {
  experts_sim_params sp = {.budget = o->expert_budget, .prefetch = true};
  assert_int_equal(experts_policy_parse(o->cache_policy, NULL, &sp.policy, sp.weights), MOLE_OK);
  experts_sim_result r;
  if (experts_cachesim(o->trace_routing, &sp, &r)) fail_msg("%s: cachesim: %s", what, mole_last_error());
  const experts_counts *a = &s->total, *b = &r.c;
  const int64_t got[] = {a->hits[0], a->hits[1], a->misses[0], a->misses[1], a->prefetch_hits[0], a->prefetch_hits[1],
                         a->prefetches, a->prefetch_unused, a->skips, a->reads, a->bytes_read, s->steps, s->tokens,
                         s->slots[0], s->slots[1]};
  const int64_t want[] = {b->hits[0], b->hits[1], b->misses[0], b->misses[1], b->prefetch_hits[0], b->prefetch_hits[1],
                          b->prefetches, b->prefetch_unused, b->skips, b->reads, b->bytes_read, r.steps, r.tokens,
                          r.slots[0], r.slots[1]};
  static const char *const names[] = {"high hits", "low hits", "high misses", "low misses", "high prefetch hits",
                                      "low prefetch hits", "prefetches", "unused prefetches", "skips", "reads",
                                      "bytes read", "steps", "tokens", "high slots", "low slots"};
  for (size_t i = 0; i < sizeof got / sizeof got[0]; i++)
    if (got[i] != want[i])
      fail_msg("%s: %s: the provider counted %lld, its replay %lld", what, names[i], (long long)got[i], (long long)want[i]);
}

// Every read the provider started has landed.
static void drain(experts *x) {
  while (experts_io_in_flight(x->io) > 0) experts_reap(x, true);
}

// One routed layer as the forward pass computes it (moe_experts), with
// every read landed before the provider decides again: the pinned groups,
// then (waves) the waiting ones in the slots of the computed ones. Returns
// the waves after the first.
static int64_t drive_layer(experts *x, int64_t layer, int64_t nk, const int32_t *sel, const uint8_t *prec) {
  enum { G = 16 };  // 2 * n_expert
  uint8_t st[G] = {0};  // 1 pending, 2 computed and pinned, 3 released
  for (int64_t i = 0; i < nk; i++)
    if (prec[i] != EXPERT_SKIP) st[2 * sel[i] + prec[i]] = 1;
  drain(x);
  int64_t waves = 0;
  for (;;) {
    int64_t pending = 0, first = -1;
    for (int g = 0; g < G; g++) {
      if (st[g] != 1) continue;
      if (experts_ready(x, layer, g / 2, (expert_prec)(g % 2)) == EXPERTS_READY) {
        expert_view v;
        assert_int_equal(experts_get(x, layer, g / 2, (expert_prec)(g % 2), &v), MOLE_OK);
        st[g] = 2;
      } else {
        pending++;
        if (first < 0) first = g;
      }
    }
    if (pending == 0) break;
    int64_t held = 0;
    for (int g = 0; g < G; g++)
      if (st[g] == 2) {
        experts_release(x, layer, g / 2, (expert_prec)(g % 2));
        st[g] = 3;
        held++;
      }
    if (held == 0) fail_msg("layer %lld: groups wait for a slot with nothing of the layer pinned", (long long)layer);
    (void)experts_ready(x, layer, (int32_t)(first / 2), (expert_prec)(first % 2));  // starts the waiting groups' reads
    drain(x);
    waves++;
  }
  experts_layer_done(x, layer);
  return waves;
}

// A run of the provider on a routing of its own: prompt steps of 6 tokens
// (random experts: the layers need more slots than the budget has, and are
// computed in waves) and decode steps routed by the model's routers on a
// hidden state that the predictor sees a layer ahead (it predicts right,
// except where the state changes between layers), in both precisions. Its
// trace, replayed by cachesim, gives every count the provider gave.
static void test_replay_parity(void **state) {
  (void)state;
  enum { L = 4, X = 8, K = 2, E = 256, NP = 6, STEPS = 24 };
  const struct {
    const char *policy, *io;
    int depth;
    float t2;
    int budget;  // experts in each precision
  } runs[] = {{"lru", "pread", 1, 0.9f, 3}, {"hobbit", "uring", 2, 0.9f, 3}, {"fld", "uring", 1, 0.9f, 4},
              {"hobbit", "pread", 2, 0.0f, 4}};
  experts_stats s;
  mole_offload_params o = offload((int64_t)1 << 30);
  o.t1 = 0;
  o.t2 = 1;
  free(run_ok(g_packed, &o, &s));
  const int64_t H = s.slot_bytes[0], Lo = s.slot_bytes[1];
  // through the forward pass, without prefetch and with room for any layer's
  // groups at once (every read is waited for before the layer ends): a
  // prompt and decode tokens in both precisions replay exactly
  o = offload(20 * (H + Lo));
  o.t1 = 0;
  o.t2 = 0.9f;
  o.prefetch_depth = 0;
  o.cache_policy = "hobbit";
  o.trace_routing = g_trace;
  free(run_ok(g_packed, &o, &s));
  assert_true(s.total.misses[0] > 0 && s.total.misses[1] > 0 && s.total.hits[0] > 0 && s.total.hits[1] > 0);
  expect_replayed(&s, &o, "a run in both precisions");
  int64_t covered[4] = {0};  // low requests, prefetch hits, waves, skips
  for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
    mole_model_params mp = mole_model_default_params();
    mp.n_threads = 1;
    mp.use_mmap = true;  // the routers in the file's layout
    mp.offload.expert_budget = runs[ri].budget * (H + Lo);
    mp.offload.t1 = 0;
    mp.offload.t2 = runs[ri].t2;
    mp.offload.cache_policy = runs[ri].policy;
    mp.offload.io = runs[ri].io;
    mp.offload.prefetch_depth = runs[ri].depth;
    mp.offload.trace_routing = g_trace;
    mole_model *m;
    assert_int_equal(mole_model_load(g_packed, &mp, &m), MOLE_OK);
    experts *x = m->experts;
    assert_int_equal(m->hp.n_layer, L);
    assert_int_equal(m->hp.n_expert, X);
    assert_int_equal(m->hp.n_embd, E);
    static float router[L][X][E];
    for (int l = 0; l < L; l++) {
      const model_tensor *g = &m->layers[l].gate_inp;
      for (int e = 0; e < X; e++) quant_traits_of(g->type)->to_float((const char *)g->data + (size_t)e * g->row_bytes, router[l][e], E);
    }
    uint64_t rng = 0x7e57 + ri;
    float h[E];
    int32_t sel[NP * K];
    float w[NP * K];
    uint8_t prec[NP * K];
    for (int step = 0; step < STEPS; step++) {
      const int n = step % 6 == 0 ? NP : 1;
      for (int i = 0; i < E; i++) h[i] = tu_gauss(&rng);
      for (int l = 0; l < L; l++) {
        if (n == 1) {
          if (l > 0 && tu_rand_u64(&rng) % 3 == 0)
            for (int i = 0; i < E; i++) h[i] = tu_gauss(&rng);  // the predictor guessed with the old state
          experts_predict(x, l, h);
          // the top two of the router on h, softmax weights
          float lg[X], mx = -INFINITY, sum = 0;
          for (int e = 0; e < X; e++) {
            lg[e] = 0;
            for (int i = 0; i < E; i++) lg[e] += router[l][e][i] * h[i];
            mx = fmaxf(mx, lg[e]);
          }
          for (int e = 0; e < X; e++) sum += lg[e] = expf(lg[e] - mx);
          for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++)
              if ((k == 0 || e != sel[0]) && (best < 0 || lg[e] > lg[best])) best = e;
            sel[k] = best;
            w[k] = lg[best] / sum;
          }
        } else {
          for (int t = 0; t < n; t++) {
            sel[t * K] = (int32_t)(tu_rand_u64(&rng) % X);
            sel[t * K + 1] = (int32_t)((sel[t * K] + 1 + tu_rand_u64(&rng) % (X - 1)) % X);
            w[t * K] = tu_rand_uniform(&rng, 0.5f, 1.0f);
            w[t * K + 1] = tu_rand_uniform(&rng, 0.0f, w[t * K]);
          }
        }
        experts_plan(x, l, n, K, sel, w, prec);
        covered[2] += drive_layer(x, l, n * K, sel, prec);
      }
      experts_step_done(x, n);
    }
    experts_get_stats(x, &s);
    mole_model_free(m);  // closes the trace
    char what[96];
    snprintf(what, sizeof what, "%s, io %s, depth %d, t2 %g, %d experts", runs[ri].policy, runs[ri].io, runs[ri].depth,
             (double)runs[ri].t2, runs[ri].budget);
    expect_replayed(&s, &mp.offload, what);
    covered[0] += s.total.hits[1] + s.total.misses[1];
    covered[1] += s.total.prefetch_hits[0] + s.total.prefetch_hits[1];
    covered[3] += s.total.skips;
  }
  // the runs had low requests, used prefetches, layers in waves and skips
  for (int i = 0; i < 4; i++)
    if (covered[i] == 0) fail_msg("the runs did not cover case %d", i);
}

// The adaptive prefetch (depth -1) probes decode tokens with and without
// prefetching, whatever the timings say afterwards; the logits stay exact.
static void test_adaptive_prefetch(void **state) {
  (void)state;
  enum { NP = 4, ND = 40 };
  float *ref = malloc(sizeof(float) * (NP + ND) * (size_t)g_vocab), *lg = malloc(sizeof(float) * (NP + ND) * (size_t)g_vocab);
  mole_offload_params o = offload(0);
  assert_int_equal(run_n(g_plain, &o, NP, ND, ref, NULL), MOLE_OK);
  o = offload(16 * 420 * 1024);
  assert_int_equal(o.prefetch_depth, -1);
  experts_stats s;
  assert_int_equal(run_n(g_plain, &o, NP, ND, lg, &s), MOLE_OK);
  assert_memory_equal(lg, ref, sizeof(float) * (NP + ND) * (size_t)g_vocab);
  // the first probe: 5 decode tokens with prefetching, 5 without, then a run
  if (s.prefetch_on_tokens < 5 || s.prefetch_on_tokens > ND)
    fail_msg("prefetch on for %lld of %d decode tokens", (long long)s.prefetch_on_tokens, ND);
  assert_true(s.total.pred_total > 0);
  free(ref);
  free(lg);
}

// The probe's verdict: faster by 5% at the median, and not reading more per
// token while decoding waits on the disk.
static void test_prefetch_verdict(void **state) {
  (void)state;
  double on[5], off[5];
  const double base[5] = {50e3, 52e3, 49e3, 90e3, 51e3};  // us; one outlier
  experts_probe_side w, wo;
#define PROBE(scale_on, bytes_on, stall_off)                                      \
  do {                                                                            \
    for (int i = 0; i < 5; i++) on[i] = base[i] * (scale_on), off[i] = base[i];   \
    w = (experts_probe_side){on, 5, 5 * (bytes_on), 0};                           \
    wo = (experts_probe_side){off, 5, 5 * 100e6, (stall_off) * (5 * 50e3)};      \
  } while (0)
  PROBE(0.80, 100e6, 0.8);  // 20% faster, same bytes
  assert_true(experts_prefetch_won(&w, &wo));
  PROBE(0.97, 100e6, 0.8);  // within the margin
  assert_false(experts_prefetch_won(&w, &wo));
  PROBE(0.80, 110e6, 0.8);  // faster on a few tokens, but reads 10% more while disk-bound
  assert_false(experts_prefetch_won(&w, &wo));
  PROBE(0.80, 110e6, 0.2);  // reads more, but decoding was not waiting on the disk
  assert_true(experts_prefetch_won(&w, &wo));
  PROBE(0.80, 100e6, 0.8);
  w.n = 0;  // nothing measured with prefetching
  assert_false(experts_prefetch_won(&w, &wo));
#undef PROBE
}

static void test_stats_text(void **state) {
  (void)state;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mp.offload.expert_budget = 8 * 420 * 1024;
  mole_model *m;
  assert_int_equal(mole_model_load(g_plain, &mp, &m), MOLE_OK);
  mole_session *s;
  assert_int_equal(mole_session_new(m, NULL, &s), MOLE_OK);
  int32_t t[4] = {1, 2, 3, 4};
  for (int i = 0; i < 4; i++) assert_int_equal(mole_session_eval(s, t + i, 1, NULL, false), MOLE_OK);
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  mole_model_print_stats(m, f);
  fclose(f);
  assert_non_null(strstr(buf, "experts: tiered, budget 3.3 MiB: 8 high slots"));
  assert_non_null(strstr(buf, "high precision:"));
  assert_non_null(strstr(buf, "I/O stall"));
  assert_non_null(strstr(buf, "prediction accuracy"));
  free(buf);  // open_memstream's buffer
  mole_session_free(s);
  mole_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_holds_all), cmocka_unit_test(test_disk_path),
      cmocka_unit_test(test_packed),           cmocka_unit_test(test_low_falls_back_to_high),
      cmocka_unit_test(test_shared_budget),
      cmocka_unit_test(test_plan_prefers_cached_high), cmocka_unit_test(test_errors),
      cmocka_unit_test(test_release),          cmocka_unit_test(test_waves),
      cmocka_unit_test(test_trace_replay),     cmocka_unit_test(test_replay_parity),
      cmocka_unit_test(test_stats_text),
      cmocka_unit_test(test_adaptive_prefetch), cmocka_unit_test(test_prefetch_verdict),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
