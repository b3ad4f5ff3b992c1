// The dense FFN block (FFN_DENSE), a gated MLP on the batch's n tokens,
// this process's columns:
//
//   xn [n][n_embd] = rmsnorm(x) . ffn_norm
//   h  [n][n_ff]   = silu(xn . gate^T) * (xn . up^T)   (rows_gather: tiles as rows arrive)
//   y  [n][n_embd] = h . down^T, summed over processes  (rows_reduce)
//   x += y
// ffn_dense_run is the same MLP without the collectives, for MoE blocks'
// shared experts.
#include "model/blocks.h"

// Rows [a, b) of the FFN around a collective.
typedef struct {
  mole_model *m;
  model_scratch *s;
  const model_layer *ly;
  int64_t F;  // its columns here
} ffn_rows_job;

// silu(gate) * up for rows [a, b) into s->ff_g [n][F]
static void ffn_gate_up_rows(void *user, int64_t a, int64_t b) {
  ffn_rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const model_tensor *wg = &j->ly->ffn_gate, *wu = &j->ly->ffn_up;
  const int64_t E = m->hp.n_embd, F = j->F;
  char *xg = (char *)s->xq + (size_t)a * s->q_row, *xu = xg;
  convert_for(m, s, wg, s->xn + a * E, E, b - a, E, xg);
  if (ops_vec_type(wu) != ops_vec_type(wg)) {
    xu = (char *)s->hq + (size_t)a * s->q_row;
    convert_for(m, s, wu, s->xn + a * E, E, b - a, E, xu);
  }
  ops_mm t2[2] = {rows_mm(s, wg, xg - (size_t)a * s->q_row, s->q_row, a, b, s->ff_g, F),
                  rows_mm(s, wu, xu - (size_t)a * s->q_row, s->q_row, a, b, s->ff_u, F)};
  ops_mm_run(m->pool, t2, 2);
  for (int64_t t = a; t < b; t++) ops_swiglu(s->ff_g + t * F, s->ff_g + t * F, s->ff_u + t * F, F);
}

// This process's part of y = h . down^T for rows [a, b).
static void ffn_down_rows(void *user, int64_t a, int64_t b) {
  ffn_rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const int64_t F = j->F;
  convert_for(m, s, &j->ly->ffn_down, s->ff_g + a * F, F, b - a, F, (char *)s->hq + (size_t)a * s->q_row);
  ops_mm t1 = rows_mm(s, &j->ly->ffn_down, s->hq, s->q_row, a, b, s->y, m->hp.n_embd);
  ops_mm_run(m->pool, &t1, 1);
}

mole_status ffn_dense_block(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t E = hp->n_embd;
  int64_t t0, t1;
  rows_own(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, ly->ffn_norm, E, hp->rms_eps);
  // gate and up tile by tile as rows arrive, down tile by tile as they leave
  ffn_rows_job rj = {m, s, ly, m->loc.n_ff};
  rows_gather(m, s, n, ffn_gate_up_rows, &rj);
  rows_reduce(m, s, n, ffn_down_rows, &rj);
  for (int64_t t = t0; t < t1; t++)
    for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
  return MOLE_OK;
}

void ffn_dense_run(mole_model *m, model_scratch *s, const model_tensor *wg, const model_tensor *wu,
                   const model_tensor *wd, int64_t n, int64_t F, float *y) {
  const int64_t E = m->hp.n_embd;
  convert_for(m, s, wg, s->xn, E, n, E, s->xq);
  const void *xu = s->xq;
  if (ops_vec_type(wu) != ops_vec_type(wg)) {
    convert_for(m, s, wu, s->xn, E, n, E, s->hq);
    xu = s->hq;
  }
  ops_mm t2[2] = {mm_of(s, wg, s->xq, s->q_row, n, s->ff_g, F), mm_of(s, wu, xu, s->q_row, n, s->ff_u, F)};
  ops_mm_run(m->pool, t2, 2);
  for (int64_t t = 0; t < n; t++) ops_swiglu(s->ff_g + t * F, s->ff_g + t * F, s->ff_u + t * F, F);
  convert_for(m, s, wd, s->ff_g, F, n, F, s->hq);
  ops_mm t1 = mm_of(s, wd, s->hq, s->q_row, n, y, E);
  ops_mm_run(m->pool, &t1, 1);
}
