// experts: the expert provider. The forward pass asks for the weights of
// (layer, expert, precision) and gets resident views; it never knows whether
// they were mapped from the GGUF (everything resident) or read from disk into
// a RAM budget (tiered cache). Also: the precision policy (HOBBIT T1/T2), the
// next-layer predictor and the offload statistics.
#ifndef MOLE_EXPERTS_H
#define MOLE_EXPERTS_H

#include "model/model.h"

typedef enum { EXPERT_HIGH = 0, EXPERT_LOW = 1, EXPERT_SKIP = 2 } expert_prec;

// The three matrices of one expert in one precision, as 2-D model_tensors
// (ne2 = 1, mat_bytes = one matrix). Valid until experts_layer_done().
typedef struct expert_view {
  model_tensor gate;  // [n_ff_exp][n_embd]
  model_tensor up;    // [n_ff_exp][n_embd]
  model_tensor down;  // [n_embd][n_ff_exp]
} expert_view;

typedef struct experts experts;

// Creates the provider of model m from its offload parameters (m->offload).
mole_status experts_open(mole_model *m, experts **out);
void experts_close(experts *x);

// Whether a low-precision copy of every expert exists (packed store).
bool experts_has_low(const experts *x);

// Precision of each (token, choice) of a routed layer: sel [n][k] experts in
// descending weight order, w [n][k] their weights; writes prec [n][k]
// (EXPERT_HIGH/LOW/SKIP) from the thresholds T1/T2, preferring a cached high
// copy to loading a low one. With T1 = T2 = 1 (the default) every choice is HIGH.
void experts_plan(experts *x, int64_t layer, int64_t n, int64_t k, const int32_t *sel, const float *w, uint8_t *prec);

// The weights of (layer, e) in precision p (HIGH or LOW); blocks on a miss.
// The view stays valid (pinned) until experts_layer_done(x, layer).
mole_status experts_get(experts *x, int64_t layer, int32_t e, expert_prec p, expert_view *out);
void experts_layer_done(experts *x, int64_t layer);

// Predictor: gate input h [n_embd] of one token at `layer`; predicts the
// experts of layers layer+1 .. layer+depth and prefetches them. No-op when
// everything is resident.
void experts_predict(experts *x, int64_t layer, const float *h);

// Marks the end of a token (decode step) or of a prefill chunk of n tokens,
// for the per-token statistics; experts_reset_sequence clears the per-sequence
// counters of the cache policy.
void experts_step_done(experts *x, int64_t n_tokens);
void experts_reset_sequence(experts *x);

// Writes the statistics (--stats) to f.
void experts_print_stats(const experts *x, FILE *f);

#endif
