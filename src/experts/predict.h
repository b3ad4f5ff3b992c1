// experts/predict: the next-layer predictor (stacked gates). From a layer's
// gate input it predicts the experts of the next layers, with the precision
// the plan would give them, and says which ones are worth prefetching; the
// provider (experts.c) issues those reads through the tier rules. It keeps
// its own state: the routers in f32, its predictions until they are scored,
// how often each kind of prediction was then used, and (adaptive depth) the
// probes that decide whether prefetching pays.
#ifndef MOLE_EXPERTS_PREDICT_H
#define MOLE_EXPERTS_PREDICT_H

#include "experts/experts.h"

typedef struct experts_predictor experts_predictor;

typedef struct experts_predictor_config {
  int64_t n_layer, n_expert, n_used, n_embd;
  int depth_cfg;        // --prefetch-depth: 1..EXPERTS_MAX_DEPTH, or -1 adaptive
  int64_t slots_high;   // high-precision copies the budget holds (n_layer*n_expert when resident)
  bool tiered;          // reads happen: the adaptive probes time decode tokens
  float t1, t2;         // the precision policy of the predicted experts
  bool low_in_use;
  const quant_matrix *routers;  // [n_layer] each layer's router [n_expert][n_embd]; converted to f32 at creation
  mole_pool *pool;
  // Whether (layer, e) in precision p is in RAM (or arriving) now; NULL: everything is.
  bool (*cached)(void *ctx, int64_t layer, int64_t e, expert_prec p);
  void *ctx;
} experts_predictor_config;

// One predicted expert of a later layer, in the precision the plan would
// give it (HIGH or LOW); prefetch: worth reading ahead now.
typedef struct experts_request {
  int64_t layer;
  int32_t expert;
  uint8_t prec;
  bool prefetch;
} experts_request;

mole_status experts_predictor_new(const experts_predictor_config *cfg, experts_predictor **out);
void experts_predictor_free(experts_predictor *p);

// A decode token begins; n_tokens: tokens run so far, last: the counts of
// the step before (the adaptive probes' token times, bytes and stalls).
void experts_predictor_token(experts_predictor *p, int64_t n_tokens, const experts_counts *last);
// Predicts layers layer+1 .. layer+depth from h [n_embd], one token's gate
// input at `layer`. Writes the predictions that are not skipped into out
// (room for EXPERTS_MAX_DEPTH * n_used), layer by layer in descending weight,
// and returns how many.
int64_t experts_predictor_run(experts_predictor *p, int64_t layer, const float *h, experts_request *out);
// Scores the predictions made for `layer` against its routing (sel [k]),
// adding to step's pred_correct and pred_total.
void experts_predictor_score(experts_predictor *p, int64_t layer, const int32_t *sel, int64_t k, experts_counts *step);
// A new sequence: pending predictions are dropped.
void experts_predictor_reset(experts_predictor *p);

typedef struct experts_predictor_stats {
  int depth;
  double useful;       // how often a predicted expert not in RAM was then used (moving average)
  bool paused;         // adaptive: not prefetching now
  int64_t on_tokens;   // adaptive: decode tokens run with prefetching on
  int64_t correct_at[EXPERTS_MAX_DEPTH], total_at[EXPERTS_MAX_DEPTH];  // by distance 1..
} experts_predictor_stats;
void experts_predictor_get_stats(const experts_predictor *p, experts_predictor_stats *out);

// One side of a prefetch probe: decode token times (us, reordered by the
// call), and the bytes read and time stalled summed over those tokens.
typedef struct experts_probe_side {
  double *us;
  int64_t n;
  double bytes, stall_us;
} experts_probe_side;
// Whether prefetching won a probe: its median token (with the tokens after
// it) is 5% faster than without, and, when decoding without it spent over
// half its time waiting for reads, it read at most 3% more per token.
bool experts_prefetch_won(experts_probe_side *with, experts_probe_side *without);

#endif
