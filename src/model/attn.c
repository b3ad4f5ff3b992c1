// The attention block (ATTN_GQA): grouped-query attention, multi-head when
// n_head_kv = n_head, with optional q/k/v/o biases, q/k RMS norms (per head
// or over the whole projection, the layer plan's qk_norm) and RoPE (NORM or
// NEOX, hp->rope_neox). On the batch's n tokens, this process's heads:
//
//   xn [n][n_embd]          = rmsnorm(x) . attn_norm
//   q  [n][n_head*head_dim] = xn . wq^T (+ bq), k, v likewise   (rows_gather: tiles as rows arrive)
//   q, k                    = qk_norm(q, k)
//   (train-retain hook; locret scores of the new entries)
//   q, k                    = rope(q, k, position)
//   (train-retain hook)     -> k, v appended to each sequence's KV cache
//   att [n][n_head*head_dim_v] = softmax(q.K^T * scale, causal) . V   (attn_f32.c / attn_f16.c; h2o sums)
//   y  [n][n_embd]          = att . wo^T (+ bo), summed over processes   (rows_reduce)
//   x += y
#include <string.h>

#include "kv/kv.h"
#include "model/blocks.h"

// Rows [a, b) of xn through the layer's projections, around a collective.
typedef struct {
  mole_model *m;
  model_scratch *s;
  const model_layer *ly;
} attn_rows_job;

// q, k, v of token rows [a, b).
static void attn_qkv_rows(void *user, int64_t a, int64_t b) {
  attn_rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const model_layer *ly = j->ly;
  const int64_t E = m->hp.n_embd, q_dim = m->loc.n_head * m->hp.head_dim, k_dim = m->loc.n_head_kv * m->hp.head_dim,
                v_dim = m->loc.n_head_kv * m->hp.head_dim_v;
  // converted once when the types agree
  char *xq = (char *)s->xq + (size_t)a * s->q_row, *xk = xq, *xv = xq;
  convert_for(m, s, &ly->wq, s->xn + a * E, E, b - a, E, xq);
  if (ops_vec_type(&ly->wk) != ops_vec_type(&ly->wq)) {
    xk = (char *)s->hq + (size_t)a * s->q_row;
    convert_for(m, s, &ly->wk, s->xn + a * E, E, b - a, E, xk);
  }
  MOLE_ASSERT(ops_vec_type(&ly->wv) == ops_vec_type(&ly->wq) || ops_vec_type(&ly->wv) == ops_vec_type(&ly->wk));
  if (ops_vec_type(&ly->wv) != ops_vec_type(&ly->wq)) xv = xk;
  // rows relative to the tile: rows_mm offsets x and y by a
  ops_mm t3[3] = {rows_mm(s, &ly->wq, xq - (size_t)a * s->q_row, s->q_row, a, b, s->q, q_dim),
                  rows_mm(s, &ly->wk, xk - (size_t)a * s->q_row, s->q_row, a, b, s->k, k_dim),
                  rows_mm(s, &ly->wv, xv - (size_t)a * s->q_row, s->q_row, a, b, s->v, v_dim)};
  ops_mm_run(m->pool, t3, 3);
}

// This process's heads' part of y = att . wo^T for token rows [a, b).
static void attn_wo_rows(void *user, int64_t a, int64_t b) {
  attn_rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const int64_t E = m->hp.n_embd, o_dim = m->loc.n_head * m->hp.head_dim_v;
  convert_for(m, s, &j->ly->wo, s->att + a * o_dim, o_dim, b - a, o_dim, (char *)s->xq + (size_t)a * s->q_row);
  ops_mm t1 = rows_mm(s, &j->ly->wo, s->xq, s->q_row, a, b, s->y, E);
  ops_mm_run(m->pool, &t1, 1);
}

// Biases and the q/k norm of every token's q, k, v.
static void attn_qk_prep(mole_model *m, model_scratch *s, const model_layer *ly, int64_t n) {
  const model_hparams *hp = &m->hp;
  const int64_t NH = m->loc.n_head, NKV = m->loc.n_head_kv, hd = hp->head_dim;
  const int64_t q_dim = NH * hd, k_dim = NKV * hd, v_dim = NKV * hp->head_dim_v;
  const bool split = m->loc.n_head < hp->n_head;  // a process holds part of the heads
  for (int64_t t = 0; t < n; t++) {
    float *q = s->q + t * q_dim, *k = s->k + t * k_dim, *v = s->v + t * v_dim;
    if (ly->bq) for (int64_t i = 0; i < q_dim; i++) q[i] += ly->bq[i];
    if (ly->bk) for (int64_t i = 0; i < k_dim; i++) k[i] += ly->bk[i];
    if (ly->bv) for (int64_t i = 0; i < v_dim; i++) v[i] += ly->bv[i];
    switch (ly->plan.qk_norm) {
      case QK_NORM_FULL:
        if (split) {
          rows_norm_full(m, q, ly->q_norm, q_dim, hp->n_head * hd);
          rows_norm_full(m, k, ly->k_norm, k_dim, hp->n_head_kv * hd);
        } else {
          ops_rmsnorm(q, q, ly->q_norm, q_dim, hp->rms_eps);
          ops_rmsnorm(k, k, ly->k_norm, k_dim, hp->rms_eps);
        }
        break;
      case QK_NORM_HEAD:
        for (int64_t h = 0; h < NH; h++) ops_rmsnorm(q + h * hd, q + h * hd, ly->q_norm, hd, hp->rms_eps);
        for (int64_t h = 0; h < NKV; h++) ops_rmsnorm(k + h * hd, k + h * hd, ly->k_norm, hd, hp->rms_eps);
        break;
      case QK_NORM_NONE:
        break;
    }
  }
}

mole_status attn_block(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t NH = m->loc.n_head, NKV = m->loc.n_head_kv;  // this process's heads
  const int64_t E = hp->n_embd, hd = hp->head_dim, q_dim = NH * hd, k_dim = NKV * hd, v_dim = NKV * hp->head_dim_v;
  // xn = attn_norm(x) on this process's rows
  int64_t t0, t1;
  rows_own(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, ly->attn_norm, E, hp->rms_eps);
  // Q, K, V: this process's heads of every token
  attn_rows_job rj = {m, s, ly};
  rows_gather(m, s, n, attn_qkv_rows, &rj);
  attn_qk_prep(m, s, ly, n);
  hooks_attn(m, s, il, n, false);
  kvpolicy_locret_score(m, s, il);
  for (int64_t t = 0; t < n; t++) {
    float *q = s->q + t * q_dim, *k = s->k + t * k_dim;
    ops_rope(q, NH, hd, s->tok_pos[t], hp, m->rope_freqs);
    ops_rope(k, NKV, hd, s->tok_pos[t], hp, m->rope_freqs);
  }
  hooks_attn(m, s, il, n, true);
  // k, v appended to each token's own sequence's cache
  for (int64_t i = 0, a = 0; i < s->n_seg; a = s->seg_ends[i++])
    for (int64_t t = a; t < s->seg_ends[i]; t++)
      kv_store(s->tok_kv[t], il, s->tok_nkv[t] - 1, s->tok_pos[t], s->k + t * k_dim, s->v + t * v_dim,
               kvpolicy_locret_row(s, t, a, NKV));
  // the attention blocks in one run, or in rounds whose h2o sums fit
  for (int64_t r0 = 0, r1; r0 < s->n_blk; r0 = r1) {
    r1 = kvpolicy_h2o_round(s, NKV, r0);
    attn_job aj = {m, s, il, n, s->any_h2o, r0, r1};
    mole_pool_run(m->pool, s->tok_kv[0]->type == QT_F16 ? attn_worker_f16 : attn_worker_f32, &aj);
    if (s->any_h2o) kvpolicy_h2o_add(s, il, NKV, r0, r1);
  }
  // the output projection: this process's heads' part, summed over processes
  rows_reduce(m, s, n, attn_wo_rows, &rj);
  for (int64_t t = t0; t < t1; t++) {
    float *x = s->x + t * E, *y = s->y + t * E;
    if (ly->bo) for (int64_t i = 0; i < E; i++) y[i] += ly->bo[i];
    for (int64_t i = 0; i < E; i++) x[i] += y[i];
  }
  return MOLE_OK;
}
