// The provider's state, shared by its files: experts.c (open, plan, get,
// prefetch) and stats.c (statistics). The slot rules are tier.c's, the
// predictor's state predict.c's.
#ifndef MOLE_EXPERTS_INTERNAL_H
#define MOLE_EXPERTS_INTERNAL_H

#include <stdio.h>

#include "experts/cache.h"
#include "experts/experts.h"
#include "experts/io.h"
#include "experts/predict.h"
#include "experts/store.h"
#include "experts/tier.h"

struct experts {
  const gguf_file *gguf;
  int64_t n_layer, n_expert, n_used;
  int64_t ex0, ex1;            // the routed experts this process holds
  mole_offload_params o;
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
  tier tier;                   // the slots and their rules
  experts_io *io;
  char *arena;                 // both pools' slots (experts_cache_offset)
  experts_io_done *done;       // [io requests]
  int64_t max_io;
  int64_t stall_t0;            // the current wait for reads: start (us) and bytes delivered then
  uint64_t stall_b0;
  // plan scratch
  int64_t *grp;                // [2*n_expert] tokens per (expert, precision) after the cache preference
  int64_t *planned;            // [2*n_expert] tokens per (expert, precision) as T1/T2 chose (trace)
  // predictor (NULL: off)
  experts_predictor *pred;
  int depth_cfg;               // --prefetch-depth (-1 adaptive)
  experts_request *pf;         // [EXPERTS_MAX_DEPTH*n_used] the last prediction's requests
  int64_t n_pf;
  int64_t pf_layer;            // the layer they were made at: its plan prefetches them
  // statistics
  bool step_open;
  int64_t n_steps, n_tokens;
  experts_counts total, step, last;
  // routing trace
  FILE *trace;
};

// Collects finished reads; blocks for one when wait.
void experts_reap(experts *x, bool wait);

#endif
