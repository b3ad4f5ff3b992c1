// The step API (model.h) of disaggregated serving (MegaScale-Infer,
// src/parallel/disagg.c): the pass of model_forward_batch cut where a MoE
// layer's routed experts run, so that attention processes run the rest and
// expert processes the experts. The pieces are the blocks' own (attn.c,
// ffn_moe.c, offload.c), so the logits are model_forward_batch's bit for bit
// when the experts' outputs are.
#include <string.h>

#include "model/blocks.h"

mole_status model_step_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  MOLE_ASSERT(m->hp.n_expert > 0);
  return forward_begin(m, s, segs, n_segs);
}

void model_step_attn(mole_model *m, model_scratch *s, int64_t il, model_moe_rows *out) {
  const int64_t n = s->seg_ends[s->n_seg - 1];
  MOLE_ASSERT(m->layers[il].plan.attn == ATTN_GQA && m->layers[il].plan.ffn == FFN_MOE);
  attn_block(m, s, il, n);
  moe_pre(m, s, il, n);
  moe_route(m, s, il, n);
  *out = (model_moe_rows){n, m->hp.n_expert_used, s->xn, s->sel, s->selw};
}

void model_step_ffn_end(mole_model *m, model_scratch *s, int64_t il, const float *out, const int64_t *idx,
                        int64_t stride) {
  const int64_t n = s->seg_ends[s->n_seg - 1];
  moe_combine(m, s, n, out, idx, stride);
  moe_post(m, s, il, n);
}

mole_status model_step_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  return forward_end(m, s, segs, n_segs);
}

mole_status model_experts_rows(mole_model *m, model_scratch *s, int64_t il, int64_t n, const float *const *xn,
                               const int32_t *sel, const float *w, float *const *out, uint8_t *done) {
  const int64_t E = m->hp.n_embd;
  if (n == 0) return MOLE_OK;
  MOLE_ASSERT(m->experts && n <= s->n_batch);
  for (int64_t r = 0; r < n; r++) memcpy(s->xn + r * E, xn[r], (size_t)E * sizeof(float));
  memcpy(s->sel, sel, (size_t)n * sizeof *sel);
  memcpy(s->selw, w, (size_t)n * sizeof *w);
  mole_status st = offload_experts(m, s, il, n, 1);
  if (st) return st;
  for (int64_t r = 0; r < n; r++) {
    const int64_t slot = s->tok_slot[r];
    done[r] = slot >= 0;
    if (slot >= 0) memcpy(out[r], s->ff_o + slot * E, (size_t)E * sizeof(float));
  }
  return MOLE_OK;
}
