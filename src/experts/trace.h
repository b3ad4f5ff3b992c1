// experts/trace: the routing trace (--trace-routing FILE) and its offline
// replay through the cache (`mole cachesim`), so cache policies and budgets
// can be compared without running the model.
//
// The trace is text, one record a line:
//   mole-trace 1 layers L experts X used K slot_high B slot_low B low 0|1 align A
//   s STEP N                 a forward step of N tokens
//   L LAYER e:p:n ... skip S  experts the router chose for LAYER in this step,
//                            with the precision T1/T2 gave (h, l) before any
//                            cache preference, and how many tokens; S choices
//                            skipped
//   P LAYER TARGET e:p ...   experts predicted at LAYER for layer TARGET (before
//                            LAYER's L record: its plan prefetches them)
// The replay drives the provider's slot rules (tier.h) with reads that land
// at once, and computes a layer's groups as the forward pass does when they
// do (every pinned group, released together; then the waiting ones in the
// slots freed). The provider then decides the same wherever every read has
// landed by the time it picks a slot: always for a layer whose groups all
// get a slot at once, without prefetch; prefetches still being read, or a
// layer computed in waves as its reads land, may make it pick others.
#ifndef MOLE_EXPERTS_TRACE_H
#define MOLE_EXPERTS_TRACE_H

#include <stdio.h>

#include "experts/cache.h"
#include "experts/experts.h"
#include "experts/predict.h"

typedef struct experts_trace_header {
  int64_t n_layer, n_expert, n_used;
  int64_t slot_bytes[2];  // bytes read to bring one expert in, per precision
  bool low_in_use;        // the budget is split between the precisions
  int64_t align;          // the cache's arena is a multiple of this (1 when the header does not say)
} experts_trace_header;

mole_status experts_trace_begin(const char *path, const experts_trace_header *h, FILE **out);
void experts_trace_write_step(FILE *f, int64_t step, int64_t n_tokens);
// cnt [2*n_expert]: tokens per (expert, precision)
void experts_trace_write_layer(FILE *f, int64_t layer, int64_t n_expert, const int64_t *cnt, int64_t skips);
// The predictions made at `layer` (req [n], grouped by target layer).
void experts_trace_write_pred(FILE *f, int64_t layer, const experts_request *req, int64_t n);
// Flushes and closes; MOLE_ERR_IO when a write failed.
mole_status experts_trace_end(FILE *f, const char *path);

typedef struct experts_sim_params {
  int64_t budget;       // bytes (0: use budget_frac)
  double budget_frac;   // of what holding every expert takes (both precisions when low is in use)
  experts_policy policy;
  float weights[4];
  bool prefetch;        // replay the P records as prefetches (every policy but belady)
} experts_sim_params;

typedef struct experts_sim_result {
  experts_trace_header h;
  int64_t budget, slots[2];
  int64_t steps, tokens;
  experts_counts c;  // hits, prefetch_hits, misses, skips, bytes_read, reads, prefetches, prefetch_unused
  // belady only: no policy replaying this trace under this budget (without
  // prefetch) has more than bound_hits hits (both precisions together), nor a
  // hit rate above bound_hits / bound_requests. Exact (the belady replay
  // itself) with one precision; a relaxation with two (see trace.c).
  int64_t bound_hits, bound_requests;
  bool bound_exact;
} experts_sim_result;

// Replays the trace at path. Errors name the file and line. belady reads the
// trace twice (the requests first) and ignores p->prefetch.
mole_status experts_cachesim(const char *path, const experts_sim_params *p, experts_sim_result *out);

#endif
