// kv: the KV cache of one sequence. Rows are stored per layer and position,
// keys and values of all KV heads side by side, in f16 (default) or f32.
#ifndef MOLE_KV_H
#define MOLE_KV_H

#include "base/base.h"
#include "quant/quant.h"

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
} model_kv;

mole_status kv_new(int64_t n_layer, int64_t n_ctx, int64_t k_dim, int64_t v_dim, quant_type type, model_kv **out);
void kv_free(model_kv *kv);
size_t kv_bytes(const model_kv *kv);

static inline void *kv_k_row(const model_kv *kv, int64_t layer, int64_t pos) {
  return (char *)kv->k + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->k_row;
}
static inline void *kv_v_row(const model_kv *kv, int64_t layer, int64_t pos) {
  return (char *)kv->v + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->v_row;
}
// Stores k [k_dim] and v [v_dim] (f32) at (layer, pos), converting to the cache type.
void kv_store(model_kv *kv, int64_t layer, int64_t pos, const float *k, const float *v);

#endif
