// Architecture descriptions: what load.c reads and binds for a
// general.architecture, and which blocks each layer runs.
#ifndef MOLE_ARCH_H
#define MOLE_ARCH_H

#include "model/model.h"

typedef struct arch_desc {
  const char *name;     // general.architecture
  // hyperparameters fixed by the architecture (the rest load.c reads from the file)
  bool rope_neox;       // RoPE NEOX: pairs (i, i + n_rot/2); else NORM: (2i, 2i+1)
  bool norm_topk;       // the routing renormalises the chosen experts' weights
  bool needs_experts;   // '<arch>.expert_count' is required (a MoE-only architecture)
  // the blocks of every layer
  model_attn_kind attn;
  model_qk_norm qk_norm;
  bool qkv_bias;
  const char *route;    // MoE layers' routing function (route.c), by name
  bool shexp;           // MoE layers' shared expert
} arch_desc;

// The description of architecture `name`, or NULL when mole has none.
const arch_desc *arch_find(const char *name);
// The supported names, ", "-separated, for an error message.
void arch_list(char *buf, size_t size);
// Layer il's plan: its attention and FFN blocks, from the description and
// the hyperparameters the file gave (a MoE FFN where it has experts).
void arch_layer_plan(const arch_desc *ad, const model_hparams *hp, int64_t il, model_layer_plan *out);

#endif
