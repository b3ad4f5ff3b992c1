// Routing functions of MoE layers: a layer's router logits -> each token's
// experts and their weights. route.c says what a new one needs.
#ifndef MOLE_ROUTE_H
#define MOLE_ROUTE_H

#include "model/model.h"

// n tokens' router logits [n][n_expert] (the function may overwrite them)
// -> sel [n][n_expert_used] the chosen experts, in the order their outputs
// are added, and w [n][n_expert_used] the final weights they are added with.
typedef void (*model_route_fn)(const model_hparams *hp, const model_layer *ly, int64_t n, float *logits, int32_t *sel,
                               float *w);

struct model_route {
  const char *name;  // what an architecture's description (arch.c) names it by
  model_route_fn fn;
};

// The routing function called `name`, or NULL when there is none.
const model_route *route_find(const char *name);

#endif
