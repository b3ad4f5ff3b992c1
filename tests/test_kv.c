// Bounded KV caches (Locret's setting, src/kv/): with a budget >= the
// context every policy gives the full cache's logits bit for bit; after
// eviction each kept slot holds its own position's key and value (checked on
// layer 0, whose rows do not depend on what the cache kept) and the sinks and
// recent entries; h2o's scores add up to the attention given; locret's are the
// retaining heads' on the pre-RoPE q, k, v; bad settings are refused.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/kv.h"
#include "kv/retain.h"
#include "model/model.h"
#include "mole.h"
#include "testutil.h"

// Random retaining heads for m (small weights: scores of order 1).
static kv_retain *random_heads(const mole_model *m, uint64_t seed) {
  const model_hparams *hp = &m->hp;
  kv_retain *r;
  assert_int_equal(kv_retain_new(hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->head_dim_v, 8, &r), MOLE_OK);
  uint64_t st = seed;
  const size_t L = (size_t)r->n_layer, D = (size_t)r->d_in, H = (size_t)r->n_hidden, K = (size_t)r->n_head_kv;
  for (size_t i = 0; i < L * H * D; i++) r->w1[i] = 0.3f * tu_gauss(&st);
  for (size_t i = 0; i < L * H; i++) r->b1[i] = 0.1f * tu_gauss(&st);
  for (size_t i = 0; i < L * K * H; i++) r->w2[i] = tu_gauss(&st);
  for (size_t i = 0; i < L * K; i++) r->b2[i] = 0.1f * tu_gauss(&st);
  return r;
}

// One sequence through the internal forward: its cache, scratch and position.
typedef struct {
  model_kv *kv;
  model_scratch *s;
  int64_t n_past, batch;
} seq;

static void seq_new(mole_model *m, seq *q, quant_type t, kv_policy pol, int64_t budget, int64_t recent, int64_t sinks,
                    int64_t batch, const kv_retain *r) {
  const model_hparams *hp = &m->hp;
  const int64_t cap = budget > 0 ? budget + batch : 256;
  q->n_past = 0;
  q->batch = batch;
  assert_int_equal(kv_new(hp->n_layer, cap, hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v, t, &q->kv),
                   MOLE_OK);
  if (budget > 0)
    if (kv_set_policy(q->kv, pol, budget, recent, sinks, pol == KV_LOCRET ? 0.1f : 0.0f, hp->n_head_kv, r, batch))
      fail_msg("kv_set_policy: %s", mole_last_error());
  assert_int_equal(model_scratch_new(m, batch, cap, &q->s), MOLE_OK);
}

static void seq_free(seq *q) {
  kv_free(q->kv);
  model_scratch_free(q->s);
}

// n tokens in chunks of q->batch; logits [n][V] of every token
static void seq_eval(mole_model *m, seq *q, const int32_t *toks, int64_t n, float *logits) {
  const int64_t V = m->hp.n_vocab;
  for (int64_t i = 0; i < n; i += q->batch) {
    const int64_t c = MOLE_MIN(q->batch, n - i);
    if (model_forward(m, q->kv, q->s, toks + i, c, q->n_past, logits ? logits + i * V : NULL, true))
      fail_msg("forward at %lld: %s", (long long)q->n_past, mole_last_error());
    q->n_past += c;
  }
}

static int32_t *tokens(int64_t n, int64_t V, uint64_t seed) {
  int32_t *t = malloc((size_t)n * sizeof *t);
  uint64_t st = seed;
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(tu_rand_u64(&st) % (uint64_t)V);
  return t;
}

// A prompt in chunks, then decode steps one token at a time.
enum { N_PROMPT = 40, N_DECODE = 6, N_ALL = N_PROMPT + N_DECODE, CHUNK = 16 };

static void run(mole_model *m, seq *q, const int32_t *t, float *lg) {
  seq_eval(m, q, t, N_PROMPT, lg);
  q->batch = 1;  // decode: one token per pass
  for (int64_t i = N_PROMPT; i < N_ALL; i++) seq_eval(m, q, t + i, 1, lg + i * m->hp.n_vocab);
}

static void budget_covers_context_is_exact(void **state) {
  (void)state;
  const char *models[] = {"mixtral", "qwen3moe", "olmoe", "qwen2moe", "mixtral-q4_0"};
  for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
    mole_model *m = tu_load_fixture(models[mi]);
    const int64_t V = m->hp.n_vocab;
    kv_retain *r = random_heads(m, 7);
    int32_t *t = tokens(N_ALL, V, 11 + mi);
    for (int ti = 0; ti < 2; ti++) {
      const quant_type qt = ti ? QT_F16 : QT_F32;
      float *ref = malloc((size_t)(N_ALL * V) * sizeof(float)), *lg = malloc((size_t)(N_ALL * V) * sizeof(float));
      seq q;
      seq_new(m, &q, qt, KV_FULL, 0, 0, 0, CHUNK, NULL);
      run(m, &q, t, ref);
      seq_free(&q);
      const kv_policy pols[] = {KV_STREAMING, KV_H2O, KV_LOCRET};
      const int64_t budgets[] = {N_ALL, N_ALL + 17};
      for (int pi = 0; pi < 3; pi++)
        for (int bi = 0; bi < 2; bi++) {
          seq_new(m, &q, qt, pols[pi], budgets[bi], 8, 2, CHUNK, pols[pi] == KV_LOCRET ? r : NULL);
          run(m, &q, t, lg);
          assert_int_equal(q.kv->n_evicted, 0);
          if (memcmp(ref, lg, (size_t)(N_ALL * V) * sizeof(float))) {
            size_t i = 0;
            while (ref[i] == lg[i]) i++;
            fail_msg("%s %s %s budget %lld: logit %zu (token %zu) %.9g, full cache %.9g", models[mi],
                     quant_type_name(qt), kv_policy_name(pols[pi]), (long long)budgets[bi], i, i / (size_t)V, lg[i],
                     ref[i]);
          }
          seq_free(&q);
        }
      free(ref);
      free(lg);
    }
    free(t);
    kv_retain_free(r);
    mole_model_free(m);
  }
}

// kv_commit on a cache filled by hand: each (layer, head) keeps its sinks,
// its newest `recent` and the best of the rest by key (streaming: position;
// h2o: score; locret: score - decay * age), ties to the newer, as a brute
// force ranks them; rows move with their positions. n - budget evictions
// both below (scan) and above (sort) the scan's limit.
static void eviction_order(void **state) {
  (void)state;
  const int64_t L = 2, K = 3, hd = 2, B = 7, R = 2, S = 1;
  const kv_policy pols[] = {KV_STREAMING, KV_H2O, KV_LOCRET, KV_LOCRET};
  const float decays[] = {0, 0, 0, 0.3f};
  const int64_t lens[] = {B + 1, B + 5, 40};
  uint64_t rs = 17;
  for (int pi = 0; pi < 4; pi++)
    for (int li = 0; li < 3; li++) {
      const int64_t n = lens[li];
      model_kv *kv;
      assert_int_equal(kv_new(L, n, K * hd, K * hd, QT_F32, &kv), MOLE_OK);
      kv_retain *r = NULL;
      if (pols[pi] == KV_LOCRET) assert_int_equal(kv_retain_new(L, K, K, hd, hd, 1, &r), MOLE_OK);
      assert_int_equal(kv_set_policy(kv, pols[pi], B, R, S, decays[pi], K, r, n - B), MOLE_OK);
      float want_score[2][3][64];
      for (int64_t p = 0; p < n; p++)
        for (int64_t l = 0; l < L; l++) {
          float k[6], v[6], sc[3];
          for (int64_t g = 0; g < K; g++) {
            sc[g] = (float)(tu_rand_u64(&rs) % 5);  // ties on purpose
            want_score[l][g][p] = sc[g];
            for (int64_t d = 0; d < hd; d++) k[g * hd + d] = v[g * hd + d] = (float)(1000 * l + 100 * g + p) + 0.5f * (float)d;
          }
          kv_store(kv, l, p, p, k, v, pols[pi] == KV_STREAMING ? NULL : sc);
        }
      kv_commit(kv, n);
      assert_int_equal(kv->n_used, B);
      for (int64_t l = 0; l < L; l++)
        for (int64_t g = 0; g < K; g++) {
          // brute force: fixed ones, then the best of the rest
          bool want[64] = {0};
          int64_t kept = 0;
          for (int64_t p = 0; p < n; p++)
            if (p < S || p >= n - R) want[p] = true, kept++;
          while (kept < B) {
            int64_t best = -1;
            float bk = 0;
            for (int64_t p = n - 1; p >= 0; p--) {
              if (want[p]) continue;
              float key = pols[pi] == KV_STREAMING ? (float)p : want_score[l][g][p];
              key -= decays[pi] * (float)(n - 1 - p);
              if (best < 0 || key > bk) best = p, bk = key;
            }
            want[best] = true;
            kept++;
          }
          const int32_t *pos = kv_pos_row(kv, l, g);
          for (int64_t i = 0; i < B; i++) {
            if (!want[pos[i]])
              fail_msg("%s decay %g n %lld layer %lld head %lld: kept position %d", kv_policy_name(pols[pi]),
                       (double)decays[pi], (long long)n, (long long)l, (long long)g, pos[i]);
            want[pos[i]] = false;  // each once
            const float *k = (const float *)kv_k_row(kv, l, i) + g * hd, *v = (const float *)kv_v_row(kv, l, i) + g * hd;
            assert_float_equal(k[1], (float)(1000 * l + 100 * g + pos[i]) + 0.5f, 0);
            assert_float_equal(v[0], (float)(1000 * l + 100 * g + pos[i]), 0);
            if (pols[pi] != KV_STREAMING) assert_float_equal(kv_score_row(kv, l, g)[i], want_score[l][g][pos[i]], 0);
          }
        }
      kv_free(kv);
      kv_retain_free(r);
    }
}

// After eviction: every (layer 0, head) slot holds its recorded position's
// key and value as the full cache has them, positions are distinct, the
// sinks and the newest `recent` positions are there; streaming keeps exactly
// the sinks and the newest rest. New tokens after eviction get their true
// positions (their layer-0 keys match the full cache's).
static void eviction_keeps_positions(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("mixtral");
  const model_hparams *hp = &m->hp;
  const int64_t V = hp->n_vocab, B = 12, R = 4, S = 2, N = 50, ND = 5;
  kv_retain *r = random_heads(m, 3);
  int32_t *t = tokens(N + ND, V, 5);
  for (int ti = 0; ti < 2; ti++) {
    const quant_type qt = ti ? QT_F16 : QT_F32;
    seq full;
    seq_new(m, &full, qt, KV_FULL, 0, 0, 0, 8, NULL);
    seq_eval(m, &full, t, N, NULL);
    full.batch = 1;
    for (int64_t i = N; i < N + ND; i++) seq_eval(m, &full, t + i, 1, NULL);
    const kv_policy pols[] = {KV_STREAMING, KV_H2O, KV_LOCRET};
    for (int pi = 0; pi < 3; pi++) {
      seq q;
      seq_new(m, &q, qt, pols[pi], B, R, S, 8, pols[pi] == KV_LOCRET ? r : NULL);
      seq_eval(m, &q, t, N, NULL);
      q.batch = 1;
      for (int64_t i = N; i < N + ND; i++) seq_eval(m, &q, t + i, 1, NULL);
      model_kv *kv = q.kv;
      assert_int_equal(kv->n_used, B);
      assert_int_equal(kv->n_pos, N + ND);
      assert_int_equal(kv->n_evicted, (N + ND - B) * hp->n_layer * hp->n_head_kv);
      const size_t es = qt == QT_F16 ? 2 : 4, kb = (size_t)hp->head_dim * es, vb = (size_t)hp->head_dim_v * es;
      for (int64_t l = 0; l < hp->n_layer; l++)
        for (int64_t g = 0; g < hp->n_head_kv; g++) {
          const int32_t *pos = kv_pos_row(kv, l, g);
          uint8_t seen[64] = {0};
          for (int64_t i = 0; i < B; i++) {
            assert_true(pos[i] >= 0 && pos[i] < N + ND);
            assert_false(seen[pos[i]]);
            seen[pos[i]] = 1;
            if (l > 0) continue;
            const char *k = (const char *)kv_k_row(kv, 0, i) + g * kb, *v = (const char *)kv_v_row(kv, 0, i) + g * vb;
            const char *fk = (const char *)kv_k_row(full.kv, 0, pos[i]) + g * kb;
            const char *fv = (const char *)kv_v_row(full.kv, 0, pos[i]) + g * vb;
            if (memcmp(k, fk, kb) || memcmp(v, fv, vb))
              fail_msg("%s %s head %lld slot %lld: row differs from the full cache's position %d",
                       kv_policy_name(pols[pi]), quant_type_name(qt), (long long)g, (long long)i, pos[i]);
          }
          for (int64_t p = 0; p < S; p++) assert_true(seen[p]);
          for (int64_t p = N + ND - R; p < N + ND; p++) assert_true(seen[p]);
          if (pols[pi] == KV_STREAMING)
            for (int64_t p = N + ND - (B - S); p < N + ND; p++) assert_true(seen[p]);
        }
      seq_free(&q);
    }
    seq_free(&full);
  }
  free(t);
  kv_retain_free(r);
  mole_model_free(m);
}

// h2o: each query row's probabilities sum to 1, so after n tokens (budget
// covering them) a (layer, KV head)'s scores sum to n * its query heads.
static void h2o_scores_sum_to_queries(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("qwen3moe");
  const model_hparams *hp = &m->hp;
  const int64_t group = hp->n_head / hp->n_head_kv;
  int32_t *t = tokens(30, hp->n_vocab, 9);
  for (int ti = 0; ti < 2; ti++) {
    const quant_type qt = ti ? QT_F16 : QT_F32;
    seq q;
    seq_new(m, &q, qt, KV_H2O, 64, 4, 2, 20, NULL);
    seq_eval(m, &q, t, 20, NULL);
    q.batch = 1;
    for (int64_t i = 20; i < 30; i++) seq_eval(m, &q, t + i, 1, NULL);
    for (int64_t l = 0; l < hp->n_layer; l++)
      for (int64_t g = 0; g < hp->n_head_kv; g++) {
        double sum = 0;
        const float *sc = kv_score_row(q.kv, l, g);
        for (int64_t i = 0; i < 30; i++) {
          assert_true(sc[i] >= 0);
          sum += sc[i];
        }
        assert_float_equal(sum, 30.0 * (double)group, ti ? 0.05 : 1e-3);
        // the first entry is seen by every query: the most attention of a row in these models is not
        // guaranteed, but it must have received something from each of the 30 tokens
        assert_true(sc[0] > 0);
      }
    seq_free(&q);
  }
  free(t);
  mole_model_free(m);
}

// locret: each entry's score is the heads' on its pre-RoPE q, k, v.
typedef struct {
  const mole_model *m;
  float *q, *k, *v;  // [layer][n][dim]
  int64_t n;
} capture;

static void capture_hook(void *ctx, int64_t layer, int64_t n, const float *q, const float *k, const float *v,
                         bool roped) {
  capture *c = ctx;
  if (roped) return;
  const model_hparams *hp = &c->m->hp;
  const int64_t qd = hp->n_head * hp->head_dim, kd = hp->n_head_kv * hp->head_dim, vd = hp->n_head_kv * hp->head_dim_v;
  c->n = n;
  memcpy(c->q + layer * n * qd, q, (size_t)(n * qd) * sizeof(float));
  memcpy(c->k + layer * n * kd, k, (size_t)(n * kd) * sizeof(float));
  memcpy(c->v + layer * n * vd, v, (size_t)(n * vd) * sizeof(float));
}

static void locret_scores_are_the_heads(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("mixtral");
  const model_hparams *hp = &m->hp;
  const int64_t n = 24, qd = hp->n_head * hp->head_dim, kd = hp->n_head_kv * hp->head_dim,
                vd = hp->n_head_kv * hp->head_dim_v, K = hp->n_head_kv;
  kv_retain *r = random_heads(m, 1);
  capture c = {m, malloc((size_t)(hp->n_layer * n * qd) * 4), malloc((size_t)(hp->n_layer * n * kd) * 4),
               malloc((size_t)(hp->n_layer * n * vd) * 4), 0};
  m->attn_hook = capture_hook;
  m->attn_hook_ctx = &c;
  int32_t *t = tokens(n, hp->n_vocab, 2);
  seq q;
  seq_new(m, &q, QT_F32, KV_LOCRET, 32, 4, 2, n, r);
  seq_eval(m, &q, t, n, NULL);
  m->attn_hook = NULL;
  assert_int_equal(c.n, n);
  float *want = malloc((size_t)(n * K) * sizeof(float));
  float *tmp = malloc(kv_retain_tmp_bytes(r, n));
  for (int64_t l = 0; l < hp->n_layer; l++) {
    kv_retain_score(r, l, n, c.q + l * n * qd, qd, c.k + l * n * kd, kd, c.v + l * n * vd, vd, want, K, tmp);
    for (int64_t g = 0; g < K; g++)
      for (int64_t i = 0; i < n; i++) assert_float_equal(kv_score_row(q.kv, l, g)[i], want[i * K + g], 0);
  }
  free(want);
  free(tmp);
  free(c.q);
  free(c.k);
  free(c.v);
  free(t);
  seq_free(&q);
  kv_retain_free(r);
  mole_model_free(m);
}

// The public API: a bounded session runs far past its budget and its n_ctx
// in constant memory; bad settings are refused with the reason.
static void expect_refused(mole_model *m, const mole_session_params *sp, const char *needle) {
  mole_session *s = NULL;
  const mole_status st = mole_session_new(m, sp, &s);
  if (st == MOLE_OK) fail_msg("accepted (%d), expected an error with '%s'", st, needle);
  if (!strstr(mole_last_error(), needle)) fail_msg("error '%s' does not say '%s'", mole_last_error(), needle);
  assert_null(s);
}

static void session_api(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("mixtral");
  const int64_t V = mole_model_n_vocab(m);
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = 32;
  sp.n_batch = 8;
  sp.kv_budget = 16;
  mole_session *s;
  assert_int_equal(mole_session_new(m, &sp, &s), MOLE_OK);
  int32_t *t = tokens(300, V, 4);
  float *lg = malloc((size_t)V * sizeof(float));
  assert_int_equal(mole_session_eval(s, t, 290, lg, false), MOLE_OK);
  for (int64_t i = 290; i < 300; i++) assert_int_equal(mole_session_eval(s, t + i, 1, lg, false), MOLE_OK);
  mole_kv_info k;
  mole_session_kv_info(s, &k);
  assert_string_equal(k.policy, "h2o");  // the default with a budget and no heads
  assert_int_equal(k.used, 16);
  assert_int_equal(k.capacity, 24);
  assert_int_equal(k.n_past, 300);
  assert_int_equal(k.recent, 4);
  assert_int_equal(k.sinks, 4);
  assert_int_equal(mole_session_rewind(s, 200), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "evicted"));
  mole_batcher *b;  // batched, a bounded sequence takes at most its n_batch tokens a pass
  assert_int_equal(mole_batcher_new(m, 16, 32, &b), MOLE_OK);
  mole_batch_item it = {s, t + 300 - 9, 9, NULL, false};
  assert_int_equal(mole_batcher_eval(b, &it, 1), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "bounded KV cache takes 8"));
  it.n = 1;
  assert_int_equal(mole_batcher_eval(b, &it, 1), MOLE_OK);
  assert_int_equal(mole_session_n_past(s), 301);
  mole_batcher_free(b);
  // starting over is always possible: after evictions, rewind to 0 empties the
  // cache and the next tokens give a fresh session's logits
  assert_int_equal(mole_session_rewind(s, 0), MOLE_OK);
  mole_session_kv_info(s, &k);
  assert_int_equal(k.n_past, 0);
  assert_int_equal(k.used, 0);
  assert_int_equal(k.evicted, 0);
  float *fresh = malloc((size_t)V * sizeof(float));
  mole_session *f;
  assert_int_equal(mole_session_new(m, &sp, &f), MOLE_OK);
  assert_int_equal(mole_session_eval(f, t, 10, fresh, false), MOLE_OK);
  mole_session_free(f);
  assert_int_equal(mole_session_eval(s, t, 10, lg, false), MOLE_OK);
  assert_memory_equal(lg, fresh, (size_t)V * sizeof(float));
  free(fresh);
  assert_int_equal(mole_session_rewind(s, 5), MOLE_OK);  // nothing evicted yet
  assert_int_equal(mole_session_eval(s, t + 5, 5, lg, false), MOLE_OK);
  mole_session_free(s);

  mole_session_params bad = sp;
  bad.kv_recent = 10;
  bad.kv_sinks = 8;
  expect_refused(m, &bad, "smaller than");
  bad = sp;
  bad.kv_policy = MOLE_KV_POLICY_LOCRET;
  expect_refused(m, &bad, "needs retaining heads");
  bad = sp;
  bad.kv_budget = 0;
  bad.kv_policy = MOLE_KV_POLICY_H2O;
  expect_refused(m, &bad, "needs a kv budget");
  bad = sp;
  bad.kv_policy = MOLE_KV_POLICY_FULL;
  expect_refused(m, &bad, "takes no kv budget");
  bad = sp;
  bad.kv_policy = MOLE_KV_POLICY_STREAMING;
  bad.kv_retain = "x.gguf";
  expect_refused(m, &bad, "locret only");
  // heads files: another model's geometry, a model file, a missing file
  const model_hparams *hp = &m->hp;
  char path[64];
  snprintf(path, sizeof path, "/tmp/mole_test_kv_%d.gguf", (int)getpid());
  const int64_t geo[4][6] = {{hp->n_layer + 1, hp->n_head, hp->n_head_kv, hp->head_dim, hp->head_dim_v, 8},
                             {hp->n_layer, hp->n_head * 2, hp->n_head_kv, hp->head_dim, hp->head_dim_v, 8},
                             {hp->n_layer, hp->n_head, hp->n_head_kv * 2, hp->head_dim, hp->head_dim_v, 8},
                             {hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim * 2, hp->head_dim_v, 8}};
  const char *field[4] = {"layers", "attention heads", "KV heads", "key head size"};
  bad = sp;
  bad.kv_policy = MOLE_KV_POLICY_LOCRET;
  bad.kv_retain = path;
  for (int i = 0; i < 4; i++) {
    kv_retain *r;
    assert_int_equal(kv_retain_new(geo[i][0], geo[i][1], geo[i][2], geo[i][3], geo[i][4], geo[i][5], &r), MOLE_OK);
    assert_int_equal(kv_retain_save(r, path), MOLE_OK);
    kv_retain_free(r);
    expect_refused(m, &bad, "another model");
    expect_refused(m, &bad, field[i]);
  }
  kv_retain *r = random_heads(m, 5);
  assert_int_equal(kv_retain_save(r, path), MOLE_OK);
  kv_retain_free(r);
  bad.kv_policy = MOLE_KV_POLICY_AUTO;  // heads given: locret
  assert_int_equal(mole_session_new(m, &bad, &s), MOLE_OK);
  assert_int_equal(mole_session_eval(s, t, 100, lg, false), MOLE_OK);
  mole_session_kv_info(s, &k);
  assert_string_equal(k.policy, "locret");
  mole_session_free(s);
  unlink(path);
  bad.kv_retain = tu_path("tests/data/conformance/models/mixtral.gguf");
  expect_refused(m, &bad, "not a retaining-heads file");
  bad.kv_retain = "/nonexistent/heads.gguf";
  expect_refused(m, &bad, "heads.gguf");
  free(lg);
  free(t);
  mole_model_free(m);
}

// Bounded caches in one batch (mole_batcher, as the server runs them): every
// sequence's logits equal, bit for bit, those it gets alone with the same
// chunks, for each policy and KV type, while the sequences evict during
// prefill and decode; a prompt chunk beside other sequences' decode steps.
enum { BB_SEQ = 3, BB_DECODE = 18, BB_BATCH = 40, BB_BUDGET = 16 };  // chunks of 40: two attention blocks
static const int64_t k_bb_prompt[BB_SEQ] = {7, 90, 1};

// locret's heads from the file (heads) or loaded once and shared (shared)
static mole_session *bb_session(mole_model *m, mole_kv_policy pol, mole_kv_type kt, const char *heads,
                                const mole_kv_heads *shared) {
  mole_session_params sp = mole_session_default_params();
  sp.kv_type = kt;
  sp.n_batch = BB_BATCH;
  sp.kv_budget = BB_BUDGET;
  sp.kv_recent = 4;
  sp.kv_policy = pol;
  sp.kv_retain = pol == MOLE_KV_POLICY_LOCRET && !shared ? heads : NULL;
  sp.kv_heads = pol == MOLE_KV_POLICY_LOCRET ? shared : NULL;
  mole_session *s;
  if (mole_session_new(m, &sp, &s)) fail_msg("session: %s", mole_last_error());
  return s;
}

static void bb_check(const char *what, int64_t q, int64_t step, const float *a, const float *b, int64_t V) {
  if (memcmp(a, b, (size_t)V * sizeof(float)) != 0) {
    int64_t i = 0;
    while (a[i] == b[i]) i++;
    fail_msg("%s seq %lld step %lld: logit %lld batched %.9g alone %.9g", what, (long long)q, (long long)step,
             (long long)i, (double)a[i], (double)b[i]);
  }
}

static void batched_bounded_equals_alone(void **state) {
  (void)state;
  const char *models[] = {"mixtral", "qwen3moe"};
  for (size_t mi = 0; mi < 2; mi++) {
    mole_model *m = tu_load_fixture(models[mi]);
    const int64_t V = mole_model_n_vocab(m);
    char heads[64];
    snprintf(heads, sizeof heads, "/tmp/mole_test_kv_bb_%d.gguf", (int)getpid());
    kv_retain *r = random_heads(m, 11);
    assert_int_equal(kv_retain_save(r, heads), MOLE_OK);
    kv_retain_free(r);
    mole_kv_heads *shared;
    assert_int_equal(mole_kv_heads_load(NULL, &shared), MOLE_ERR_ARG);
    assert_int_not_equal(mole_kv_heads_load("/nonexistent/h.gguf", &shared), MOLE_OK);
    assert_null(shared);
    assert_int_equal(mole_kv_heads_load(heads, &shared), MOLE_OK);
    int32_t *t[BB_SEQ];
    for (int64_t q = 0; q < BB_SEQ; q++) t[q] = tokens(k_bb_prompt[q] + BB_DECODE, V, 20 + (uint64_t)q);
    const int64_t n_steps = (k_bb_prompt[1] + BB_BATCH - 1) / BB_BATCH + BB_DECODE;  // the longest prompt's chunks, then decode
    const mole_kv_policy pols[] = {MOLE_KV_POLICY_STREAMING, MOLE_KV_POLICY_H2O, MOLE_KV_POLICY_LOCRET};
    const mole_kv_type kts[] = {MOLE_KV_F32, MOLE_KV_F16};
    float *ref = malloc((size_t)(BB_SEQ * n_steps * V) * sizeof(float));
    float *lg = malloc((size_t)(BB_SEQ * V) * sizeof(float));
    for (size_t pi = 0; pi < 3; pi++)
      for (size_t ki = 0; ki < 2; ki++) {
        char what[96];
        snprintf(what, sizeof what, "%s %s %s", models[mi], pi == 0 ? "streaming" : pi == 1 ? "h2o" : "locret",
                 ki == 0 ? "f32" : "f16");
        // step k of sequence q: its k-th prompt chunk, or one decode token after the prompt
        int64_t from[BB_SEQ][64], len[BB_SEQ][64], steps[BB_SEQ];
        for (int64_t q = 0; q < BB_SEQ; q++) {
          steps[q] = 0;
          for (int64_t i = 0; i < k_bb_prompt[q]; i += BB_BATCH, steps[q]++)
            from[q][steps[q]] = i, len[q][steps[q]] = MOLE_MIN(BB_BATCH, k_bb_prompt[q] - i);
          for (int64_t d = 0; d < BB_DECODE; d++, steps[q]++) from[q][steps[q]] = k_bb_prompt[q] + d, len[q][steps[q]] = 1;
        }
        for (int64_t q = 0; q < BB_SEQ; q++) {  // alone
          mole_session *s = bb_session(m, pols[pi], kts[ki], heads, NULL);
          for (int64_t k = 0; k < steps[q]; k++)
            if (mole_session_eval(s, t[q] + from[q][k], len[q][k], ref + (q * n_steps + k) * V, false))
              fail_msg("%s alone: %s", what, mole_last_error());
          mole_kv_info info;
          mole_session_kv_info(s, &info);
          assert_true(info.evicted > 0);  // the test covers eviction
          mole_session_free(s);
        }
        mole_batcher *b;  // together: every sequence's next step in one pass, locret's heads shared
        assert_int_equal(mole_batcher_new(m, BB_SEQ * BB_BATCH, BB_BUDGET + BB_BATCH, &b), MOLE_OK);
        mole_session *s[BB_SEQ];
        for (int64_t q = 0; q < BB_SEQ; q++) s[q] = bb_session(m, pols[pi], kts[ki], heads, shared);
        for (int64_t k = 0; k < n_steps; k++) {
          mole_batch_item it[BB_SEQ];
          int64_t n = 0, who[BB_SEQ];
          for (int64_t q = 0; q < BB_SEQ; q++)
            if (k < steps[q]) {
              who[n] = q;
              it[n++] = (mole_batch_item){s[q], t[q] + from[q][k], len[q][k], lg + q * V, false};
            }
          if (mole_batcher_eval(b, it, n)) fail_msg("%s batched: %s", what, mole_last_error());
          for (int64_t i = 0; i < n; i++)
            bb_check(what, who[i], k, lg + who[i] * V, ref + (who[i] * n_steps + k) * V, V);
        }
        for (int64_t q = 0; q < BB_SEQ; q++) mole_session_free(s[q]);
        mole_batcher_free(b);
      }
    // shared heads: refused with a file as well, or made for another model (the error names the file)
    mole_session_params bad = mole_session_default_params();
    bad.kv_budget = BB_BUDGET;
    bad.kv_heads = shared;
    bad.kv_retain = heads;
    expect_refused(m, &bad, "given twice");
    mole_model *other = tu_load_fixture(mi == 0 ? "qwen3moe" : "mixtral");
    bad.kv_retain = NULL;
    expect_refused(other, &bad, heads);
    mole_model_free(other);
    mole_kv_heads_free(shared);
    unlink(heads);
    for (int64_t q = 0; q < BB_SEQ; q++) free(t[q]);
    free(ref);
    free(lg);
    mole_model_free(m);
  }
}

// h2o's attention blocks in rounds (a long chunk's sums in pieces): the
// same logits and scores, bit for bit, as in one run.
static void h2o_rounds_are_exact(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("mixtral");
  const int64_t V = m->hp.n_vocab, NP = 200, ND = 6, CH = 96;  // chunks of 96: three attention blocks
  int32_t *t = tokens(NP + ND, V, 31);
  for (int ti = 0; ti < 2; ti++) {
    const quant_type qt = ti ? QT_F16 : QT_F32;
    float *lg[2];
    seq q[2];
    for (int r = 0; r < 2; r++) {
      lg[r] = malloc((size_t)((NP + ND) * V) * sizeof(float));
      seq_new(m, &q[r], qt, KV_H2O, 24, 6, 2, CH, NULL);
      if (r) model_scratch_set_h2o_round(q[r].s, 1);  // one block a round
      seq_eval(m, &q[r], t, NP, lg[r]);
      q[r].batch = 1;
      for (int64_t i = NP; i < NP + ND; i++) seq_eval(m, &q[r], t + i, 1, lg[r] + i * V);
    }
    assert_true(q[0].kv->n_evicted > 0);
    assert_memory_equal(lg[0], lg[1], (size_t)((NP + ND) * V) * sizeof(float));
    for (int64_t l = 0; l < m->hp.n_layer; l++)
      for (int64_t g = 0; g < m->hp.n_head_kv; g++)
        assert_memory_equal(kv_score_row(q[0].kv, l, g), kv_score_row(q[1].kv, l, g),
                            (size_t)q[0].kv->n_used * sizeof(float));
    for (int r = 0; r < 2; r++) {
      seq_free(&q[r]);
      free(lg[r]);
    }
  }
  free(t);
  mole_model_free(m);
}

// Hostile heads files: truncated anywhere, bytes flipped, a value not finite:
// an error naming the file, never a crash (ASan in make test).
static void hostile_heads_files(void **state) {
  (void)state;
  mole_model *m = tu_load_fixture("mixtral");
  char path[64];
  snprintf(path, sizeof path, "/tmp/mole_test_kv_h_%d.gguf", (int)getpid());
  kv_retain *r = random_heads(m, 8);
  assert_int_equal(kv_retain_save(r, path), MOLE_OK);
  size_t n = 0;
  unsigned char *good = tu_read_file(path, &n);
  assert_non_null(good);
  kv_retain *back = NULL;
  assert_int_equal(kv_retain_load(path, &back), MOLE_OK);
  assert_memory_equal(back->w1, r->w1, (size_t)(r->n_layer * r->n_hidden * r->d_in) * sizeof(float));
  kv_retain_free(back);
  unsigned char *bad = malloc(n);
  uint64_t rs = 99;
  for (int trial = 0; trial < 300; trial++) {
    size_t len = n;
    memcpy(bad, good, n);
    if (trial < 100) {
      len = (size_t)(tu_rand_u64(&rs) % n);  // truncated
    } else {
      const size_t hdr = n < 4096 ? n : 4096;  // flipped bytes in the header and tensor infos
      for (int k = 0; k < 1 + trial % 4; k++) bad[tu_rand_u64(&rs) % hdr] ^= (unsigned char)(1 + tu_rand_u64(&rs) % 255);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bad, 1, len, f), len);
    fclose(f);
    back = NULL;
    if (kv_retain_load(path, &back) == MOLE_OK) {  // a flip that left it valid (a value, a name's case)
      assert_non_null(back);
      kv_retain_free(back);
    } else {
      assert_null(back);
      assert_non_null(strstr(mole_last_error(), path));
    }
  }
  r->w1[3] = NAN;
  assert_int_equal(kv_retain_save(r, path), MOLE_OK);
  assert_int_not_equal(kv_retain_load(path, &back), MOLE_OK);
  assert_non_null(strstr(mole_last_error(), "not finite"));
  unlink(path);
  free(bad);
  free(good);
  kv_retain_free(r);
  mole_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(eviction_order),
      cmocka_unit_test(budget_covers_context_is_exact), cmocka_unit_test(eviction_keeps_positions),
      cmocka_unit_test(h2o_scores_sum_to_queries),      cmocka_unit_test(locret_scores_are_the_heads),
      cmocka_unit_test(session_api),                    cmocka_unit_test(hostile_heads_files),
      cmocka_unit_test(batched_bounded_equals_alone),  cmocka_unit_test(h2o_rounds_are_exact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
