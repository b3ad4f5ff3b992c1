// The attention kernel over an f16 KV cache (attn_job, blocks.h): causal,
// every token over its own sequence's cache, as attn_f32.c's.
#include <string.h>

#include "kv/kv.h"
#include "model/blocks.h"

// One work item is (KV head g, block of up to att_tb tokens of one
// sequence: s->att_blk). The scores of all the block's query rows (tokens x
// heads of the group) against the keys are one f16 matmul (queries rounded
// to f16, as ggml does); each value row is converted once per block and
// added into every query's output with its probability rounded to f16.
void attn_worker_f16(void *ctx, int ith, int nth) {
  const attn_job *j = ctx;
  const model_hparams *hp = &j->m->hp;
  model_scratch *s = j->s;
  const int64_t hd = hp->head_dim, hdv = hp->head_dim_v, group = hp->n_head / hp->n_head_kv, TB = s->att_tb;
  const int64_t n_blk = j->blk1 - j->blk0, ldq = j->m->loc.n_head * hd, ldo = j->m->loc.n_head * hdv;
  const quant_traits *f16t = quant_traits_of(QT_F16);
  float *S = s->att_s + (size_t)ith * (size_t)(TB * group * s->n_ctx);
  uint16_t *Q = s->att_q + (size_t)ith * (size_t)(TB * group * hd);
  float *vr = s->vacc + (size_t)ith * (size_t)(ATT_VT * hdv);
  uint16_t *p16 = s->att_p16 + (size_t)ith * (size_t)s->n_ctx;
  int64_t p0, p1;
  mole_split(j->m->loc.n_head_kv * n_blk, ith, nth, &p0, &p1);
  for (int64_t p = p0; p < p1; p++) {
    const int64_t g = p / n_blk, b = j->blk0 + p % n_blk, t0 = s->att_blk[2 * b], t1 = s->att_blk[2 * b + 1];
    const model_kv *kv = s->tok_kv[t0];
    const int64_t rows = (t1 - t0) * group, n_kv = s->tok_nkv[t1 - 1];  // keys any row of the block sees
    float *h2o = j->h2o ? kvpolicy_h2o_sums(s, b, g, n_kv) : NULL;
    MOLE_ASSERT(t1 - t0 <= TB);
    for (int64_t t = t0; t < t1; t++)
      for (int64_t h = 0; h < group; h++)
        f16t->from_float(s->q + t * ldq + (g * group + h) * hd, Q + ((t - t0) * group + h) * hd, hd);
    quant_gemm(QT_F16, (const char *)kv_k_row(kv, j->layer, 0) + (size_t)g * (size_t)hd * 2, kv->k_row, Q,
               (size_t)hd * 2, S, s->n_ctx, 0, n_kv, rows, hd);
    for (int64_t r = 0; r < rows; r++) {
      const int64_t t = t0 + r / group, len = s->tok_nkv[t];
      float *sc = S + r * s->n_ctx;
      ops_softmax(sc, len, hp->attn_scale);
      f16t->from_float(sc, p16, len);  // probabilities rounded to f16 (a row at a time: the SIMD twins)
      f16t->to_float(p16, sc, len);
      if (h2o)
        for (int64_t i = 0; i < len; i++) h2o[i] += sc[i];
      memset(s->att + t * ldo + (g * group + r % group) * hdv, 0, (size_t)hdv * sizeof(float));
    }
    // p.V a tile of ATT_VT keys at a time: each query row's output adds the
    // tile's value rows in key order (as one axpy per key would)
    for (int64_t i0 = 0; i0 < n_kv; i0 += ATT_VT) {
      const int64_t i1 = MOLE_MIN(i0 + ATT_VT, n_kv);
      for (int64_t i = i0; i < i1; i++)
        f16t->to_float((const uint16_t *)kv_v_row(kv, j->layer, i) + g * hdv, vr + (i - i0) * hdv, hdv);
      for (int64_t r = 0; r < rows; r++) {
        const int64_t t = t0 + r / group, lim = MOLE_MIN(i1, s->tok_nkv[t]);  // causal
        if (lim > i0)
          ops_pv(s->att + t * ldo + (g * group + r % group) * hdv, S + r * s->n_ctx + i0, vr, lim - i0, hdv);
      }
    }
  }
}
