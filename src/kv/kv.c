#include "kv/kv.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kv/retain.h"

// an eviction candidate: its key (score, or position for streaming), position and slot
typedef struct kv_rank {
  float key;
  int32_t pos;
  int32_t slot;
} kv_rank;

const char *kv_policy_name(kv_policy p) {
  static const char *const names[] = {"full", "streaming", "h2o", "locret"};
  return (unsigned)p < 4 ? names[p] : "?";
}

mole_status kv_new(int64_t n_layer, int64_t n_ctx, int64_t k_dim, int64_t v_dim, quant_type type, model_kv **out) {
  *out = NULL;
  if (type != QT_F16 && type != QT_F32)
    return mole_errorf(MOLE_ERR_ARG, "kv cache type %s: only f16 and f32 are supported", quant_type_name(type));
  if (n_layer <= 0 || n_ctx <= 0 || k_dim < 0 || v_dim < 0)
    return mole_errorf(MOLE_ERR_ARG, "kv cache: bad geometry (layers %lld, ctx %lld)", (long long)n_layer,
                       (long long)n_ctx);
  model_kv *kv = mole_calloc(1, sizeof *kv);
  if (!kv) return mole_errorf(MOLE_ERR_NOMEM, "kv cache: out of memory");
  size_t es = type == QT_F16 ? 2 : 4;
  static atomic_uint_fast64_t next_id = 1;
  kv->id = atomic_fetch_add(&next_id, 1);
  kv->n_layer = n_layer;
  kv->n_ctx = n_ctx;
  kv->k_dim = k_dim;
  kv->v_dim = v_dim;
  kv->type = type;
  kv->k_row = (size_t)k_dim * es;
  kv->v_row = (size_t)v_dim * es;
  size_t cells = (size_t)n_layer * (size_t)n_ctx;
  kv->k = mole_aligned_alloc(64, cells * kv->k_row);
  kv->v = mole_aligned_alloc(64, cells * kv->v_row);
  if (!kv->k || !kv->v) {
    kv_free(kv);
    return mole_errorf(MOLE_ERR_NOMEM, "kv cache: cannot allocate %zu bytes for %lld positions",
                       cells * (kv->k_row + kv->v_row), (long long)n_ctx);
  }
  *out = kv;
  return MOLE_OK;
}

void kv_free(model_kv *kv) {
  if (!kv) return;
  mole_aligned_free(kv->k);
  mole_aligned_free(kv->v);
  mole_free(kv->pos);
  mole_free(kv->score);
  mole_free(kv->retain_out);
  mole_free(kv->rank);
  mole_free(kv->keep);
  mole_free(kv);
}

size_t kv_bytes(const model_kv *kv) {
  size_t b = (size_t)kv->n_layer * (size_t)kv->n_ctx * (kv->k_row + kv->v_row);
  if (kv->budget > 0)
    b += (size_t)kv->n_layer * (size_t)kv->n_head_kv * (size_t)kv->n_ctx * (sizeof *kv->pos + sizeof *kv->score);
  return b;
}

mole_status kv_set_policy(model_kv *kv, kv_policy policy, int64_t budget, int64_t recent, int64_t sinks, float decay,
                          int64_t n_head_kv, const kv_retain *retain, int64_t max_tokens) {
  if (!(decay >= 0.0f && decay <= 1e6f))
    return mole_errorf(MOLE_ERR_ARG, "kv decay %g: expected a number >= 0", (double)decay);
  if (policy != KV_STREAMING && policy != KV_H2O && policy != KV_LOCRET)
    return mole_errorf(MOLE_ERR_ARG, "kv policy %s takes no budget (streaming, h2o or locret do)", kv_policy_name(policy));
  if (budget < 1 || recent < 0 || sinks < 0 || recent + sinks > budget)
    return mole_errorf(MOLE_ERR_ARG,
                       "kv budget %lld is smaller than the entries always kept: %lld recent + %lld sinks",
                       (long long)budget, (long long)recent, (long long)sinks);
  if (max_tokens < 1 || budget + max_tokens > kv->n_ctx || kv->n_ctx > INT32_MAX)
    return mole_errorf(MOLE_ERR_ARG, "kv cache of %lld slots cannot hold a budget of %lld and a pass of %lld tokens",
                       (long long)kv->n_ctx, (long long)budget, (long long)max_tokens);
  if (n_head_kv < 1 || kv->k_dim % n_head_kv || kv->v_dim % n_head_kv)
    return mole_errorf(MOLE_ERR_ARG, "kv cache: %lld KV heads do not divide rows of %lld/%lld", (long long)n_head_kv,
                       (long long)kv->k_dim, (long long)kv->v_dim);
  if ((policy == KV_LOCRET) != (retain != NULL))
    return mole_errorf(MOLE_ERR_ARG, policy == KV_LOCRET ? "kv policy locret needs retaining heads"
                                                         : "retaining heads are used by kv policy locret only");
  if (retain && retain->n_head_kv != n_head_kv)
    return mole_errorf(MOLE_ERR_ARG, "retaining heads score %lld KV heads, the cache has %lld",
                       (long long)retain->n_head_kv, (long long)n_head_kv);
  const size_t cells = (size_t)kv->n_layer * (size_t)n_head_kv * (size_t)kv->n_ctx;
  kv->pos = mole_calloc(cells, sizeof *kv->pos);
  kv->score = mole_calloc(cells, sizeof *kv->score);
  kv->rank = mole_calloc((size_t)kv->n_ctx, sizeof *kv->rank);
  kv->keep = mole_calloc((size_t)kv->n_ctx, 1);
  if (retain) kv->retain_out = mole_calloc((size_t)(max_tokens * n_head_kv), sizeof(float));
  if (!kv->pos || !kv->score || !kv->rank || !kv->keep || (retain && !kv->retain_out))
    return mole_errorf(MOLE_ERR_NOMEM, "kv cache: out of memory for the eviction state of %lld slots",
                       (long long)kv->n_ctx);
  kv->policy = policy;
  kv->budget = budget;
  kv->max_pass = max_tokens;
  kv->recent = recent;
  kv->sinks = sinks;
  kv->decay = policy == KV_LOCRET ? decay : 0.0f;
  kv->n_head_kv = n_head_kv;
  kv->head_dim = kv->k_dim / n_head_kv;
  kv->head_dim_v = kv->v_dim / n_head_kv;
  kv->retain = retain;
  return MOLE_OK;
}

void kv_reset(model_kv *kv) {
  kv->n_used = kv->n_pos = kv->n_evicted = 0;
}

void kv_store(model_kv *kv, int64_t layer, int64_t slot, int64_t pos, const float *k, const float *v,
              const float *score) {
  MOLE_ASSERT(layer >= 0 && layer < kv->n_layer && slot >= 0 && slot < kv->n_ctx && pos >= 0);
  void *kd = kv_k_row(kv, layer, slot), *vd = kv_v_row(kv, layer, slot);
  if (kv->type == QT_F32) {
    memcpy(kd, k, kv->k_row);
    memcpy(vd, v, kv->v_row);
  } else {
    const quant_traits *t = quant_traits_of(QT_F16);
    t->from_float(k, kd, kv->k_dim);
    t->from_float(v, vd, kv->v_dim);
  }
  if (kv->budget > 0)
    for (int64_t g = 0; g < kv->n_head_kv; g++) {
      kv_pos_row(kv, layer, g)[slot] = (int32_t)pos;
      kv_score_row(kv, layer, g)[slot] = score ? score[g] : 0.0f;
    }
}

// better first: higher key, then newer
static int rank_cmp(const void *pa, const void *pb) {
  const kv_rank *a = pa, *b = pb;
  if (a->key != b->key) return a->key > b->key ? -1 : 1;
  return a->pos > b->pos ? -1 : a->pos < b->pos;
}

// Moves slot `from`'s entry of head g into slot `to` (layer l).
static void move_entry(model_kv *kv, int64_t l, int64_t g, int64_t from, int64_t to) {
  const size_t es = kv->type == QT_F16 ? 2 : 4, kb = (size_t)kv->head_dim * es, vb = (size_t)kv->head_dim_v * es;
  memcpy((char *)kv_k_row(kv, l, to) + (size_t)g * kb, (char *)kv_k_row(kv, l, from) + (size_t)g * kb, kb);
  memcpy((char *)kv_v_row(kv, l, to) + (size_t)g * vb, (char *)kv_v_row(kv, l, from) + (size_t)g * vb, vb);
  kv_pos_row(kv, l, g)[to] = kv_pos_row(kv, l, g)[from];
  kv_score_row(kv, l, g)[to] = kv_score_row(kv, l, g)[from];
}

// One (layer, head): keeps sinks, recent and the best-ranked rest, budget in
// all; the kept entries beyond the budget fill the evicted slots below it.
static void evict_head(model_kv *kv, int64_t l, int64_t g) {
  const int64_t n = kv->n_used, B = kv->budget;
  const int32_t *pos = kv_pos_row(kv, l, g);
  const float *score = kv_score_row(kv, l, g);
  kv_rank *rk = kv->rank;
  uint8_t *keep = kv->keep;
  int64_t nc = 0, kept = 0;
  for (int64_t i = 0; i < n; i++) {
    const bool fixed = pos[i] < kv->sinks || pos[i] >= kv->n_pos - kv->recent;
    keep[i] = fixed;
    kept += fixed;
    if (fixed) continue;
    float key = kv->policy == KV_STREAMING ? (float)pos[i] : score[i];
    if (kv->decay > 0.0f) key -= kv->decay * (float)(kv->n_pos - 1 - pos[i]);
    rk[nc++] = (kv_rank){key, pos[i], (int32_t)i};
  }
  MOLE_ASSERT(kept <= B && n - B <= nc);
  const int64_t take = B - kept, drop = nc - take;
  if (drop <= 8) {  // a decode step: drop the worst few by scanning
    for (int64_t d = 0; d < drop; d++) {
      int64_t w = 0;
      for (int64_t i = 1; i < nc - d; i++)
        if (rank_cmp(&rk[i], &rk[w]) > 0) w = i;
      const kv_rank t = rk[w];
      rk[w] = rk[nc - d - 1];
      rk[nc - d - 1] = t;
    }
  } else {
    qsort(rk, (size_t)nc, sizeof *rk, rank_cmp);
  }
  for (int64_t i = 0; i < take; i++) keep[rk[i].slot] = 1;
  // compaction: kept entries in slots >= B move into the evicted slots < B
  int64_t hole = 0;
  for (int64_t i = B; i < n; i++) {
    if (!keep[i]) continue;
    while (keep[hole]) hole++;
    MOLE_ASSERT(hole < B);
    move_entry(kv, l, g, i, hole);
    keep[hole] = 1;
  }
  kv->n_evicted += n - B;
}

void kv_commit(model_kv *kv, int64_t n) {
  kv->n_used += n;
  kv->n_pos += n;
  MOLE_ASSERT(kv->n_used <= kv->n_ctx);
  if (kv->budget <= 0 || kv->n_used <= kv->budget) return;
  for (int64_t l = 0; l < kv->n_layer; l++)
    for (int64_t g = 0; g < kv->n_head_kv; g++) evict_head(kv, l, g);
  kv->n_used = kv->budget;
}
