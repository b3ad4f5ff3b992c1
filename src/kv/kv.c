#include "kv/kv.h"

#include <stdatomic.h>
#include <string.h>

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
  mole_free(kv);
}

size_t kv_bytes(const model_kv *kv) { return (size_t)kv->n_layer * (size_t)kv->n_ctx * (kv->k_row + kv->v_row); }

void kv_store(model_kv *kv, int64_t layer, int64_t pos, const float *k, const float *v) {
  MOLE_ASSERT(layer >= 0 && layer < kv->n_layer && pos >= 0 && pos < kv->n_ctx);
  void *kd = kv_k_row(kv, layer, pos), *vd = kv_v_row(kv, layer, pos);
  if (kv->type == QT_F32) {
    memcpy(kd, k, kv->k_row);
    memcpy(vd, v, kv->v_row);
  } else {
    const quant_traits *t = quant_traits_of(QT_F16);
    t->from_float(k, kd, kv->k_dim);
    t->from_float(v, vd, kv->v_dim);
  }
}
