// Routing functions: what a MoE layer does with its router's logits to pick
// each token's experts and weight them. The layer's plan (model_layer_plan
// .route) points at one entry of k_routes; ffn_moe.c calls it after the
// router matmul (moe_route) and everything after it (the offload plan, the
// compress hook, the disaggregated step API, the hmp exchange, the weighted
// sum) takes sel and w as they come.
//
// A new routing function needs exactly two things, both in this file:
//   1. one function of type model_route_fn (route.h): it reads n rows of
//      router logits [n][n_expert] (it may overwrite them), and writes for
//      every token sel [n][n_expert_used], the chosen experts in the order
//      their outputs are to be added (ops_topk gives descending weight,
//      lower index on ties), and w [n][n_expert_used], the weights exactly as
//      they multiply the experts' outputs (any renormalisation and scale
//      already applied). Hyperparameters come from hp (n_expert,
//      n_expert_used, norm_topk, expert_weights_scale, or new ones load.c
//      reads), per-layer tensors from ly (a selection bias, say, that
//      load.c binds);
//   2. one entry {name, function} in k_routes.
// An architecture's description (arch.c) then names it in its .route.
// Router biases added to the logits themselves (before routing) are the
// router matmul's business (moe_route in ffn_moe.c), not the routing function's.
#include "model/route.h"

#include <string.h>

#include "model/ops.h"

// softmax over all experts, top-k of the probabilities, optionally
// renormalised to sum 1 (hp->norm_topk: Mixtral, qwen3moe) and scaled
// (hp->expert_weights_scale), as llama.cpp's build_moe_ffn with its softmax
// gating: the exponentials of (logit - max) in float summed in double.
static void route_softmax_topk(const model_hparams *hp, const model_layer *ly, int64_t n, float *logits, int32_t *sel,
                               float *w) {
  (void)ly;  // no per-layer tensors
  const int64_t X = hp->n_expert, K = hp->n_expert_used;
  for (int64_t t = 0; t < n; t++) {
    float *p = logits + t * X;  // [n_expert]: logits, then probabilities
    ops_softmax(p, X, 1.0f);
    int32_t *st = sel + t * K;  // [n_expert_used]
    float *wt = w + t * K;      // [n_expert_used]
    ops_topk(p, X, K, st, wt);
    if (hp->norm_topk) {
      float ws = 0;
      for (int64_t k = 0; k < K; k++) ws += wt[k];
      if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;  // ggml's clamp of the sum (2^-14)
      for (int64_t k = 0; k < K; k++) wt[k] /= ws;
    }
    if (hp->expert_weights_scale != 0 && hp->expert_weights_scale != 1)
      for (int64_t k = 0; k < K; k++) wt[k] *= hp->expert_weights_scale;
  }
}

static const model_route k_routes[] = {
    {"softmax_topk", route_softmax_topk},
};

const model_route *route_find(const char *name) {
  for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
    if (strcmp(k_routes[i].name, name) == 0) return &k_routes[i];
  return NULL;
}
