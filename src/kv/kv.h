// kv: the KV cache of one sequence. Rows are stored per layer and slot,
// keys (after RoPE) and values of all KV heads side by side, in f16 (default)
// or f32.
//
// Unbounded (the default), slot = position. Bounded (kv_set_policy with a
// budget, Locret's setting): after each pass every (layer, KV head) keeps at
// most `budget` entries: the first `sinks` positions, the newest `recent`,
// and the best-scored of the rest; the others are evicted and the survivors
// compacted. Heads keep different tokens but always the same number, so one
// slot count (n_used) serves every layer and head; each slot remembers its
// entry's position (keys are cached after RoPE, so attention needs no
// positions, but the recency rules and the tests do). The new tokens of a pass
// take slots n_used.. in order, so within a pass slot order is causal order.
#ifndef MOLE_KV_H
#define MOLE_KV_H

#include "base/base.h"
#include "quant/quant.h"

struct kv_retain;

// What decides which entries a bounded cache keeps besides sinks and recent:
// streaming: nothing (the newest; StreamingLLM's sinks + window); h2o: the
// attention weight each entry has received so far, summed over the queries
// of its GQA group (Heavy-Hitter Oracle); locret: the retaining heads' score
// of the entry (kv/retain.h), fixed when it is cached, less age * decay (the
// heads predict a pre-softmax score, a log-scale weight: the penalty makes an
// entry's expected weight fall exp(-decay) per position of age; decay 0 is
// the paper's Locret, whose fixed scores let old entries crowd out new ones).
typedef enum { KV_FULL = 0, KV_STREAMING, KV_H2O, KV_LOCRET } kv_policy;
const char *kv_policy_name(kv_policy p);

typedef struct model_kv {
  uint64_t id;       // unique in the process (names the cache to the other processes of a sharded model)
  int64_t n_layer;
  int64_t n_ctx;     // capacity in positions
  int64_t k_dim;     // n_head_kv * head_dim
  int64_t v_dim;     // n_head_kv * head_dim_v
  quant_type type;   // QT_F16 or QT_F32
  size_t k_row;      // bytes of one k row
  size_t v_row;      // bytes of one v row
  void *k;           // [n_layer][n_ctx][k_dim]
  void *v;           // [n_layer][n_ctx][v_dim]
  // bounded caches (kv_set_policy); policy KV_FULL and budget 0 otherwise
  kv_policy policy;
  int64_t budget, recent, sinks;
  int64_t max_pass;   // tokens one pass may add before eviction (retain_out's rows)
  float decay;        // locret: score penalty per position of age
  int64_t n_head_kv, head_dim, head_dim_v;
  int64_t n_used;     // slots in use (every layer and head)
  int64_t n_pos;      // positions cached so far (the next token's position)
  int64_t n_evicted;  // entries evicted, summed over layers and heads
  int32_t *pos;       // [n_layer][n_head_kv][n_ctx] position of each slot's entry
  float *score;       // [n_layer][n_head_kv][n_ctx] h2o: attention received; locret: the heads' score
  const struct kv_retain *retain;  // locret's heads (not owned)
  float *retain_out;  // [max_tokens][n_head_kv] scores of a pass's new tokens
  struct kv_rank *rank;  // [n_ctx] eviction's ordering scratch
  uint8_t *keep;      // [n_ctx]
} model_kv;

mole_status kv_new(int64_t n_layer, int64_t n_ctx, int64_t k_dim, int64_t v_dim, quant_type type, model_kv **out);
void kv_free(model_kv *kv);
// Bytes the cache holds: rows, and a bounded cache's positions and scores.
size_t kv_bytes(const model_kv *kv);

// Makes kv bounded: policy streaming, h2o or locret (with retain, checked
// against the geometry by the caller), budget >= recent + sinks, budget +
// max_tokens <= n_ctx (a pass's tokens are cached before eviction runs).
mole_status kv_set_policy(model_kv *kv, kv_policy policy, int64_t budget, int64_t recent, int64_t sinks, float decay,
                          int64_t n_head_kv, const struct kv_retain *retain, int64_t max_tokens);
// Empties the cache (a new sequence).
void kv_reset(model_kv *kv);
// Records a pass of n tokens at positions n_pos.. in slots n_used.. (their
// rows already stored) and evicts down to the budget if the cache is bounded.
void kv_commit(model_kv *kv, int64_t n);

static inline int32_t *kv_pos_row(const model_kv *kv, int64_t layer, int64_t head) {
  return kv->pos + ((size_t)layer * (size_t)kv->n_head_kv + (size_t)head) * (size_t)kv->n_ctx;
}
static inline float *kv_score_row(const model_kv *kv, int64_t layer, int64_t head) {
  return kv->score + ((size_t)layer * (size_t)kv->n_head_kv + (size_t)head) * (size_t)kv->n_ctx;
}

static inline void *kv_k_row(const model_kv *kv, int64_t layer, int64_t pos) {
  return (char *)kv->k + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->k_row;
}
static inline void *kv_v_row(const model_kv *kv, int64_t layer, int64_t pos) {
  return (char *)kv->v + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->v_row;
}
// Stores the entry of position pos, k [k_dim] and v [v_dim] (f32), at (layer,
// slot), converting to the cache type; a bounded cache also records its
// position and its score per KV head (score [n_head_kv], NULL = 0).
void kv_store(model_kv *kv, int64_t layer, int64_t slot, int64_t pos, const float *k, const float *v,
              const float *score);

#endif
