// The provider's state, shared by its files: experts.c (open, plan, get),
// predict.c (predictor and prefetch), stats.c (statistics).
#ifndef MOLE_EXPERTS_INTERNAL_H
#define MOLE_EXPERTS_INTERNAL_H

#include <stdio.h>

#include "experts/cache.h"
#include "experts/experts.h"
#include "experts/io.h"
#include "experts/store.h"

struct experts {
  mole_model *m;
  float t1, t2;
  bool tiered;
  bool low_in_use;             // low copies exist and T2 > T1
  experts_store store;
  const uint8_t *image;        // resident: the model's weights image holding the experts (NULL: the mapping)
  uint64_t *image_off;         // [2][n_layer][n_expert][3] their places in it
  uint8_t *image_r16;          // [2][n_layer][3] whether that matrix is QL_R16 there
  experts_policy policy;
  float weights[4];
  // tiered mode
  int64_t budget;
  experts_cache cache;
  experts_io *io;
  char *arena;                 // both pools' slots (experts_cache_offset)
  int64_t *pins;               // [2*n_expert] slots pinned by the current layer: p*2^32 + slot
  int64_t n_pins;
  int64_t soft_cap[2];         // most slots prefetches may hold per pool
  int64_t n_loading[2];        // slots being read per pool
  experts_io_done *done;       // [io requests]
  int64_t max_io;
  int64_t stall_t0;            // the current wait for reads: start (us) and bytes delivered then
  uint64_t stall_b0;
  int64_t layer_now;           // the layer planned last (-1 after experts_layer_done)
  uint8_t *gstate;             // [2*n_expert] its groups (2*expert + precision): GRP_*
  bool refill;                 // slots were released: start the reads of groups still without one
  // plan scratch
  int64_t *tok_cnt;            // [n_expert] tokens routed to each expert in this layer
  int64_t *high_cnt;           // [n_expert] of those in high precision
  int64_t *grp;                // [2*n_expert] tokens per (expert, precision) after the cache preference
  int64_t *planned;            // [2*n_expert] tokens per (expert, precision) as T1/T2 chose (trace)
  // predictor
  int depth_cfg;               // --prefetch-depth (-1 adaptive)
  int depth;                   // in use
  float *routers;              // [n_layer][n_expert][n_embd] every router in f32 (stacked gates)
  float *pred_logits;          // [EXPERTS_MAX_DEPTH*n_expert]
  int32_t *pred;               // [n_layer][EXPERTS_MAX_DEPTH][n_used] experts predicted for a layer, by distance
  bool *pred_valid;            // [n_layer][EXPERTS_MAX_DEPTH]
  bool *pred_uncached;         // [n_layer][EXPERTS_MAX_DEPTH][n_used] not in RAM when predicted
  double pf_useful;            // moving average: a predicted expert not in RAM was then used
  double *pf_useful_at;        // [EXPERTS_MAX_DEPTH][n_used] the same per distance and rank of the prediction
  int64_t *pf_useful_n;        // [EXPERTS_MAX_DEPTH][n_used] samples behind each
  // adaptive prefetch (predict.c): rounds of a few decode tokens with and
  // without prefetching, then many with whichever was faster
  bool pf_on;                  // prefetching in the current phase
  int pf_wins;                 // consecutive probes prefetching won (on from the second)
  int pf_phase;                // PF_PROBE_ON, PF_PROBE_AFTER, PF_PROBE_OFF, PF_RUN
  int64_t pf_left;             // decode tokens left in the phase
  int64_t pf_run;              // tokens of the next run phase: doubles while probes agree
  int64_t pf_t_token;          // when the current decode token began (us; 0 = none yet)
  int64_t pf_tokens_then;      // n_tokens at that time (the next token must follow it)
  double pf_samp[2][16];       // decode token times (us) in this round's probe: [without, with and after]
  double pf_bytes[2], pf_stall[2];  // the same tokens' bytes read and time waiting for reads (sums)
  int64_t pf_n[2];             // tokens measured
  int64_t pf_tokens_on;        // decode tokens run with prefetch on (statistics)
  int64_t *pf_pending;         // [EXPERTS_MAX_DEPTH*n_used] prefetches to start after the plan: (target, e, p)
  int64_t n_pf_pending;
  int64_t pf_layer;            // the layer whose plan starts them
  // statistics
  bool step_open;
  int64_t n_steps, n_tokens;
  experts_counts total, step, last;
  int64_t pred_correct_at[EXPERTS_MAX_DEPTH], pred_total_at[EXPERTS_MAX_DEPTH];
  // routing trace
  FILE *trace;
};

// The state of a (expert, precision) group of the layer being computed.
enum { GRP_NONE = 0, GRP_WAITING_SLOT, GRP_PINNED, GRP_RELEASED };

// predict.c
mole_status experts_predict_init(experts *x);
void experts_predict_free(experts *x);
// Checks the predictions made for `layer` against its routing (sel [k]).
void experts_predict_score(experts *x, int64_t layer, const int32_t *sel, int64_t k);
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
// Starts the prefetches predict() queued for after this layer's demand reads.
void experts_prefetch_start(experts *x, int64_t layer);
// Releases the soft pins of prefetched copies for `layer` (-1: all).
void experts_prefetch_release(experts *x, int64_t layer);

// experts.c, for predict.c: starts reading (layer, e) in precision p into a
// slot chosen with layer_now as the current layer; soft = a prefetch (soft
// pin, else no pin). MOLE_ERR_NOMEM (no message) when no slot can be freed.
mole_status experts_load(experts *x, int p, int64_t layer, int64_t e, int64_t layer_now, bool soft);
// Opens a step of n tokens (the first plan or predict of a forward call).
void experts_begin_step(experts *x, int64_t n);
// Collects finished reads; blocks for one when wait.
void experts_reap(experts *x, bool wait);
// The precision T1/T2 give a choice of unimportance u (HIGH when low copies are not in use).
expert_prec experts_prec_of(const experts *x, float u);

#endif
