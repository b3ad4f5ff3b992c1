// The KV policies' hooks in the attention block (src/kv/ keeps the caches
// and evicts; these feed it what only the forward pass sees):
//   h2o     the attention each cache entry receives, summed per attention
//           block and KV head while the kernels run (kvpolicy_h2o_sums), then
//           added into the cache's scores a block at a time (kvpolicy_h2o_add);
//           the blocks run in rounds whose sums fit s->h2o (kvpolicy_h2o_round)
//   locret  the new entries scored by the retaining heads from q, k, v before
//           RoPE (kvpolicy_locret_score), the scores stored with the keys
#include <string.h>

#include "kv/kv.h"
#include "kv/retain.h"
#include "model/blocks.h"

mole_status kvpolicy_reserve(const mole_model *m, model_scratch *s) {
  const int64_t NKV = m->loc.n_head_kv;
  int64_t h2o_len = 0, h2o_blk = 0;
  for (int64_t b = 0; b < s->n_blk; b++) {
    const model_kv *kv = s->tok_kv[s->att_blk[2 * b]];
    if (kv->policy == KV_H2O) {
      h2o_len += NKV * kv->n_ctx;
      h2o_blk = MOLE_MAX(h2o_blk, NKV * kv->n_ctx);
    }
  }
  size_t retain_tmp = 0;
  for (int64_t i = 0, a = 0; i < s->n_seg; a = s->seg_ends[i++]) {
    const model_kv *kv = s->tok_kv[a];
    if (kv->policy == KV_LOCRET) retain_tmp = MOLE_MAX(retain_tmp, kv_retain_tmp_bytes(kv->retain, s->seg_ends[i] - a));
  }
  s->any_h2o = h2o_len > 0;
  // the h2o sums of a round of blocks: all of them, or as many as H2O_ROUND_FLOATS holds (one at least)
  const int64_t h2o_need = MOLE_MIN(h2o_len, MOLE_MAX(h2o_blk, s->h2o_round));
  if (h2o_need > s->h2o_cap) {
    mole_aligned_free(s->h2o);
    s->h2o_cap = 0;
    if (!(s->h2o = mole_aligned_alloc(64, (size_t)h2o_need * sizeof(float))))
      return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for the h2o sums (%lld floats)", (long long)h2o_need);
    s->h2o_cap = h2o_need;
  }
  if (retain_tmp > s->retain_tmp_cap) {  // the retaining heads' scratch, shared by the pass's locret sequences
    mole_aligned_free(s->retain_tmp);
    s->retain_tmp_cap = 0;
    if (!(s->retain_tmp = mole_aligned_alloc(64, retain_tmp)))
      return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for the retaining heads' scratch (%zu bytes)", retain_tmp);
    s->retain_tmp_cap = retain_tmp;
  }
  return MOLE_OK;
}

// A sequence's new entries scored by its retaining heads: kv->retain_out [its n][NKV].
void kvpolicy_locret_score(const mole_model *m, model_scratch *s, int64_t il) {
  const int64_t NKV = m->loc.n_head_kv, q_dim = m->loc.n_head * m->hp.head_dim, k_dim = NKV * m->hp.head_dim,
                v_dim = NKV * m->hp.head_dim_v;
  for (int64_t i = 0, a = 0; i < s->n_seg; a = s->seg_ends[i++]) {
    model_kv *kv = s->tok_kv[a];
    if (kv->policy == KV_LOCRET)
      kv_retain_score(kv->retain, il, s->seg_ends[i] - a, s->q + a * q_dim, q_dim, s->k + a * k_dim, k_dim,
                      s->v + a * v_dim, v_dim, kv->retain_out, NKV, s->retain_tmp);
  }
}

const float *kvpolicy_locret_row(const model_scratch *s, int64_t t, int64_t a, int64_t NKV) {
  const model_kv *kv = s->tok_kv[t];
  return kv->policy == KV_LOCRET ? kv->retain_out + (t - a) * NKV : NULL;
}

// Blocks [r0, r1) whose sums take at most h2o_round floats (h2o_cap, the
// first block always fits: kvpolicy_reserve); each block's offset in s->h2o.
int64_t kvpolicy_h2o_round(model_scratch *s, int64_t NKV, int64_t r0) {
  const int64_t lim = MOLE_MIN(s->h2o_cap, s->h2o_round);
  int64_t used = 0, r1;
  for (r1 = r0; r1 < s->n_blk; r1++) {
    const model_kv *kv = s->tok_kv[s->att_blk[2 * r1]];
    const int64_t need = kv->policy == KV_H2O ? NKV * kv->n_ctx : 0;
    if (r1 > r0 && used + need > lim) break;
    MOLE_ASSERT(used + need <= s->h2o_cap);
    s->blk_h2o[r1] = need ? used : -1;
    used += need;
  }
  return r1;
}

// One work item owns a (block, head) pair, so the sums do not depend on
// threads or on the batch.
float *kvpolicy_h2o_sums(const model_scratch *s, int64_t b, int64_t g, int64_t n_kv) {
  if (s->blk_h2o[b] < 0) return NULL;
  float *a = s->h2o + s->blk_h2o[b] + g * s->tok_kv[s->att_blk[2 * b]]->n_ctx;
  memset(a, 0, (size_t)n_kv * sizeof(float));
  return a;
}

// In block order (so the same whatever the threads or the other sequences
// of the batch).
void kvpolicy_h2o_add(model_scratch *s, int64_t il, int64_t NKV, int64_t blk0, int64_t blk1) {
  for (int64_t b = blk0; b < blk1; b++) {
    if (s->blk_h2o[b] < 0) continue;
    model_kv *kv = s->tok_kv[s->att_blk[2 * b]];
    const int64_t n_kv = s->tok_nkv[s->att_blk[2 * b + 1] - 1];
    for (int64_t g = 0; g < NKV; g++) {
      const float *a = s->h2o + s->blk_h2o[b] + g * kv->n_ctx;
      float *sc = kv_score_row(kv, il, g);
      for (int64_t i = 0; i < n_kv; i++) sc[i] += a[i];
    }
  }
}
