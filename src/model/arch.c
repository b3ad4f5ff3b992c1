// The architectures mole runs, one description each. A new architecture is
// one entry here, plus at most one new block (an ATTN_/FFN_ kind in model.h
// with its file, its entry in forward.c's block tables and its tensors in
// load.c's bind_layer) or one new routing function (route.c). Layers that
// differ within a model (leading dense layers, sliding-window layers) are
// arch_layer_plan's choice by layer index and hyperparameters.
//
// Router semantics follow llama.cpp's build_moe_ffn calls per architecture:
// llama (Mixtral) and qwen3moe renormalise the chosen weights, qwen2moe and
// olmoe use the softmax probabilities as they are.
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

#include "model/route.h"

static const arch_desc k_archs[] = {
    // Llama 1/2/3, Mistral (dense); Mixtral (ffn_gate_inp, ffn_*_exps)
    {.name = "llama", .norm_topk = true, .attn = ATTN_GQA, .route = "softmax_topk"},
    // Qwen1.5-MoE, Qwen2-57B-A14B: q/k/v biases, a shared expert with a sigmoid gate
    {.name = "qwen2moe", .rope_neox = true, .needs_experts = true, .attn = ATTN_GQA, .qkv_bias = true,
     .route = "softmax_topk", .shexp = true},
    // Qwen3-30B-A3B, Qwen3-235B-A22B: q/k RMS norm per head
    {.name = "qwen3moe", .rope_neox = true, .norm_topk = true, .needs_experts = true, .attn = ATTN_GQA,
     .qk_norm = QK_NORM_HEAD, .route = "softmax_topk"},
    // OLMoE-1B-7B: q/k RMS norm over the whole projection
    {.name = "olmoe", .rope_neox = true, .needs_experts = true, .attn = ATTN_GQA, .qk_norm = QK_NORM_FULL,
     .route = "softmax_topk"},
};

const arch_desc *arch_find(const char *name) {
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (strcmp(k_archs[i].name, name) == 0) return &k_archs[i];
  return NULL;
}

void arch_list(char *buf, size_t size) {
  size_t o = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0] && o < size; i++) {
    const int w = snprintf(buf + o, size - o, "%s%s", i ? ", " : "", k_archs[i].name);
    o += w > 0 ? (size_t)w : 0;
  }
}

void arch_layer_plan(const arch_desc *ad, const model_hparams *hp, int64_t il, model_layer_plan *out) {
  (void)il;  // every layer of these architectures is alike
  *out = (model_layer_plan){.attn = ad->attn, .qk_norm = ad->qk_norm, .qkv_bias = ad->qkv_bias};
  if (hp->n_expert > 0) {
    out->ffn = FFN_MOE;
    out->route = route_find(ad->route);
    MOLE_ASSERT(out->route);  // every description names a routing function of route.c
    out->shexp = ad->shexp;
  } else {
    out->ffn = FFN_DENSE;
  }
}
