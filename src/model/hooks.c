// The hooks other commands set on a model (model.h): mole train-retain's on
// every attention layer (the attention block calls hooks_attn before and
// after RoPE) and mole compress's on the routed experts of every MoE layer
// (the MoE block calls hooks_moe after the routing). Unset: nothing happens.
#include "model/blocks.h"

void hooks_attn(const mole_model *m, const model_scratch *s, int64_t il, int64_t n, bool roped) {
  if (m->attn_hook) m->attn_hook(m->attn_hook_ctx, il, n, s->q, s->k, s->v, roped);
}

bool hooks_moe(const mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  return m->moe_hook && m->moe_hook(m->moe_hook_ctx, il, n, s->xn, s->sel, s->selw, s->y);
}
