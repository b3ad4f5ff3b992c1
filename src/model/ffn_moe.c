// The MoE FFN block (FFN_MOE) on the batch's n tokens:
//
//   xn [n][n_embd]             = rmsnorm(x) . ffn_norm       (moe_pre; hmp: every process's rows gathered)
//   logits [n][n_expert]       = xn . gate_inp^T              (moe_route)
//   sel, w [n][n_expert_used]  = the layer's routing function (route.c)
//   (compress hook: may compute the routed experts' sum itself)
//   each choice's expert FFN   = down . (silu(gate . xn) * (up . xn)), grouped by
//                                (expert, precision), weights from the expert provider (offload.c)
//   y [n][n_embd]              = sum of the choices' outputs * w, in the router's order (moe_combine)
//   y += shared expert(xn) * sigmoid(gate_inp_shexp . xn)       (the plan's shexp)
//   y summed over processes; x += y                             (moe_post)
// With hmp and an exchange (rows.c), the middle runs on every process's
// rows as they arrive instead. The step API (step.c) runs the pieces apart.
#include <math.h>
#include <string.h>

#include "model/blocks.h"
#include "model/route.h"
#include "quant/quant_exact.h"

// The FFN's input: this process's rows normed, every token's where rows are
// split (a MoE layer's routing groups all tokens: no tiles).
void moe_pre(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd;
  int64_t t0, t1;
  rows_own(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, m->layers[il].ffn_norm, E, hp->rms_eps);
  rows_gather(m, s, n, NULL, NULL);
}

// Router logits of the n rows of s->xn into s->router [n][n_expert], then
// the layer's routing function: s->sel, s->selw [n][n_expert_used].
void moe_route(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_layer *ly = &m->layers[il];
  const int64_t E = m->hp.n_embd, X = m->hp.n_expert;
  convert_for(m, s, &ly->gate_inp, s->xn, E, n, E, s->xq);
  ops_mm tr = mm_of(s, &ly->gate_inp, s->xq, s->q_row, n, s->router, X);
  ops_mm_run(m->pool, &tr, 1);
  ly->plan.route->fn(&m->hp, ly, n, s->router, s->sel, s->selw);
}

// Computes the groups gs[0..ng) of a routed layer, whose weights are in
// s->views: gate and up of every group as one batch of tasks, swiglu, then
// down as another batch. Each group's result depends only on its own slots,
// so computing the groups in any sets gives the same bits. s->hq keeps the
// layer's input rows converted for up to two vector types (conv_t, converted
// on first use, kept for the layer's later sets); a group's slots in s->xq get
// its tokens' rows, which its hidden rows converted for down replace once
// gate and up are done.
void moe_compute_groups(mole_model *m, model_scratch *s, int64_t n, const int64_t *gs, int64_t ng,
                        quant_type conv_t[2]) {
  const int64_t E = m->hp.n_embd, F = m->loc.n_ff_exp;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const quant_type vt = ops_vec_type(&s->views[g].gate);
    MOLE_ASSERT(vt == ops_vec_type(&s->views[g].up));
    int c = conv_t[0] == vt ? 0 : conv_t[1] == vt ? 1 : conv_t[0] == QT_COUNT ? 0 : 1;
    if (conv_t[c] != vt) {
      MOLE_ASSERT(conv_t[c] == QT_COUNT);
      conv_t[c] = vt;
      ops_convert_rows(m->pool, vt, s->xn, E, n, E, c == 0 ? s->hq : (char *)s->hq + (size_t)n * s->q_row, s->q_row);
    }
    const char *src = c == 0 ? s->hq : (char *)s->hq + (size_t)n * s->q_row;
    const size_t rb = quant_row_size(vt, E);
    for (int64_t a = s->grp_off[g]; a < s->grp_off[g] + s->grp_cnt[g]; a++)
      memcpy((char *)s->xq + (size_t)a * s->q_row, src + (size_t)s->slot_tok[a] * s->q_row, rb);
  }
  int64_t nt = 0;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const size_t o = (size_t)s->grp_off[g];
    s->tasks[nt++] = mm_expert(&s->views[g].gate, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_g + o * (size_t)F, F);
    s->tasks[nt++] = mm_expert(&s->views[g].up, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_u + o * (size_t)F, F);
  }
  ops_mm_run(m->pool, s->tasks, nt);
  nt = 0;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const size_t o = (size_t)s->grp_off[g];
    for (int64_t a = s->grp_off[g]; a < s->grp_off[g] + s->grp_cnt[g]; a++)
      ops_swiglu(s->ff_g + a * F, s->ff_g + a * F, s->ff_u + a * F, F);
    convert_for(m, s, &s->views[g].down, s->ff_g + o * (size_t)F, F, s->grp_cnt[g], F,
                (char *)s->xq + o * s->q_row);
    s->tasks[nt++] = mm_expert(&s->views[g].down, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_o + o * (size_t)E, E);
  }
  ops_mm_run(m->pool, s->tasks, nt);
}


// y [n][E] = the choices' outputs (rows idx[t*K + k] of out, -1: skipped)
// weighted by the router, added in the router's order as llama.cpp adds the
// expert views.
void moe_combine(const mole_model *m, model_scratch *s, int64_t n, const float *out, const int64_t *idx,
                 int64_t stride) {
  const int64_t E = m->hp.n_embd, K = m->hp.n_expert_used;
  for (int64_t t = 0; t < n; t++) {
    float *y = s->y + t * E;
    memset(y, 0, (size_t)E * sizeof *y);
    for (int64_t k = 0; k < K; k++) {
      const int64_t r = idx[t * K + k];
      if (r >= 0) ops_axpy(y, out + r * stride, s->selw[t * K + k], E);
    }
  }
}

// The routed experts' sum in y [n][E].
static mole_status moe_routed(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  moe_route(m, s, il, n);
  if (hooks_moe(m, s, il, n)) return MOLE_OK;
  if (n == 1) experts_predict(m->experts, il, s->xn);  // the provider prefetches the next layers' likely experts
  mole_status st = offload_experts(m, s, il, n, m->hp.n_expert_used);
  if (st) return st;
  moe_combine(m, s, n, s->ff_o, s->tok_slot, m->hp.n_embd);
  return MOLE_OK;
}

// After the routed experts' sum is in y [n][E]: the shared expert's part added.
static void moe_shared(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t E = hp->n_embd;
  if (!ly->plan.shexp) return;
  // shared expert, scaled by sigmoid(w . x), as llama.cpp's qwen2moe graph
  // computes it: w . x a mul_mat of a one-row f32 matrix (ggml_vec_dot_f32's
  // order whatever the batch), the sigmoid as silu(g) / g
  float *sh = s->sh;  // [n][E]
  ffn_dense_run(m, s, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, n, m->loc.n_ff_shexp, sh);
  for (int64_t t = 0; t < n; t++) {
    const float *xn = s->xn + t * E;
    float g;
    quant_exact_dot_ref(QX_F32_VEC, E, &g, ly->gate_inp_shexp, xn);
    g = g != 0.0f ? (g / (1.0f + expf(-g))) / g : 0.5f;  // (0/0 would be NaN there)
    float *y = s->y + t * E;
    for (int64_t i = 0; i < E; i++) y[i] += sh[t * E + i] * g;
  }
}

// After the routed experts' sum is in y: the shared expert, the sum over
// processes, the residual add.
void moe_post(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const int64_t E = m->hp.n_embd;
  moe_shared(m, s, il, n);
  rows_reduce(m, s, n, NULL, NULL);
  int64_t t0, t1;
  rows_own(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++)
    for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
}

// Everything between the norm and the sum over processes, every step per
// token: what the hmp exchange runs on rows as they arrive.
static mole_status moe_middle(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  mole_status st = moe_routed(m, s, il, n);
  if (!st) moe_shared(m, s, il, n);
  return st;
}

mole_status ffn_moe_block(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd;
  if (m->comm.hmp && m->comm.exchange) {
    // this process's rows normed; every token's FFN computed as its rows
    // arrive, the sums of this process's rows back here
    int64_t t0, t1;
    rows_own(m, n, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, m->layers[il].ffn_norm, E, hp->rms_eps);
    mole_status st = rows_exchange(m, s, il, n, moe_middle);
    if (st) return st;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
    return MOLE_OK;
  }
  moe_pre(m, s, il, n);
  mole_status st = moe_routed(m, s, il, n);
  if (st) return st;
  moe_post(m, s, il, n);
  return MOLE_OK;
}
