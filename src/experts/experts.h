// experts: the expert provider. The forward pass asks for the weights of
// (layer, expert, precision) and gets resident views; it never knows whether
// they were mapped from the GGUF (everything resident) or read from disk into
// a RAM budget (tiered cache: the slot rules are tier.h). Also: the precision
// policy (HOBBIT T1/T2), the next-layer predictor and the offload statistics.
// It knows nothing of the model: experts_open gets what it needs from it.
#ifndef MOLE_EXPERTS_H
#define MOLE_EXPERTS_H

#include <stdio.h>

#include "base/base.h"
#include "base/pool.h"
#include "gguf/gguf.h"
#include "quant/quant_matrix.h"

typedef enum { EXPERT_HIGH = 0, EXPERT_LOW = 1, EXPERT_SKIP = 2 } expert_prec;

// The precision policy (HOBBIT's thresholds): a choice whose unimportance u
// (the normalised router weight of the choices ranked above it) is at most t1
// is HIGH, at most t2 LOW, else SKIP; LOW becomes HIGH without low copies in use.
static inline expert_prec experts_prec_of(float t1, float t2, bool low_in_use, float u) {
  const expert_prec p = u <= t1 ? EXPERT_HIGH : u <= t2 ? EXPERT_LOW : EXPERT_SKIP;
  return p == EXPERT_LOW && !low_in_use ? EXPERT_HIGH : p;
}

// The three matrices of one expert in one precision, as 2-D views
// (ne2 = 1, mat_bytes = one matrix). Valid until experts_layer_done().
typedef struct expert_view {
  quant_matrix gate;  // [n_ff_exp][n_embd]
  quant_matrix up;    // [n_ff_exp][n_embd]
  quant_matrix down;  // [n_embd][n_ff_exp]
} expert_view;

typedef struct experts experts;

// What the provider is opened with: the model computes it (the provider
// knows nothing of the model).
typedef struct experts_config {
  const gguf_file *gguf;  // the model file: the experts are mapped from it or read from it
  int64_t n_layer, n_expert, n_expert_used, n_embd;
  int64_t n_ff_exp;       // every expert's FFN width in the file
  // this process's share (src/parallel): FFN columns [ff0, ff0 + n_ff_local) of
  // every expert, and the routed experts [ex0, ex1) it holds
  int64_t ff0, n_ff_local, ex0, ex1;
  // [n_layer][3]: each layer's gate, up and down expert stacks as the loader
  // bound them (the share; a packed store's have data NULL)
  const quant_matrix *stacks;
  const quant_matrix *routers;  // [n_layer] each layer's router [n_expert][n_embd] (the predictor's gates)
  mole_offload_params offload;  // --expert-budget, --cache-policy, ... (the strings must outlive the provider)
  // the auto budget: bytes the rest of the process needs (KV caches, scratch,
  // a margin for code and the allocator), and bytes of the file outside the
  // experts that a step does not read (token embeddings not tied to the output)
  int64_t headroom, cold_bytes;
  mole_pool *pool;              // the predictor's matmul
} experts_config;

// Creates the provider: everything resident (views into the mapping) when
// expert_budget is 0, or auto and the model fits in the memory available
// (MemAvailable, cgroup limit); otherwise a RAM cache of that budget in
// front of the file, read with O_DIRECT. Errors name the parameter
// (--expert-budget, --cache-policy, --cache-weights, --io, --t1/--t2,
// --prefetch-depth, --trace-routing).
mole_status experts_open(const experts_config *cfg, experts **out);
void experts_close(experts *x);

// The weights image (model/image.c): the resident provider calls fn for
// every expert matrix a forward step may read (each expert, each precision
// in use) with its rows (src, stride bytes apart), type and shape; fn
// returns the matrix's place in the image. Nothing happens when tiered.
// experts_use_image: the image is at `image`; the views point there.
typedef size_t (*experts_image_fn)(void *ctx, const void *src, size_t stride, quant_type t, int64_t ne0, int64_t ne1);
mole_status experts_resident_matrices(experts *x, experts_image_fn fn, void *ctx);
mole_status experts_use_image(experts *x, const uint8_t *image);

// Whether a low-precision copy of every expert exists (packed store).
bool experts_has_low(const experts *x);

// Precision of each (token, choice) of a routed layer: sel [n][k] experts in
// descending weight order, w [n][k] their weights; writes prec [n][k]
// (EXPERT_HIGH/LOW/SKIP) from the thresholds T1/T2, preferring a cached high
// copy to loading a low one. With T1 = T2 = 1 (the default) every choice is HIGH.
void experts_plan(experts *x, int64_t layer, int64_t n, int64_t k, const int32_t *sel, const float *w, uint8_t *prec);

// experts_plan starts the reads of every (expert, precision) group the layer
// uses that a slot can be had for; the rest wait until slots are released.
// The forward pass then computes the groups as they land: experts_ready says,
// without waiting, where a planned group stands (it collects finished reads):
// READY (experts_get will not block), LOADING (a read is under way), or
// NO_SLOT (every slot that could take it is pinned by this layer, or no read
// has been started for it yet: experts_get starts one, or experts_release of
// computed groups lets the next experts_ready start it). Resident: always READY.
typedef enum { EXPERTS_READY = 0, EXPERTS_LOADING = 1, EXPERTS_NO_SLOT = 2 } experts_avail;
experts_avail experts_ready(experts *x, int64_t layer, int32_t e, expert_prec p);

// The weights of (layer, e) in precision p (HIGH or LOW); blocks on a miss.
// The view stays valid (pinned) until experts_release(x, layer, e, p) or
// experts_layer_done(x, layer). MOLE_ERR_NOMEM when no slot can be freed for
// it: while other groups of the layer are pinned, release computed ones and
// try again; with nothing of the layer pinned it means the budget is too small.
mole_status experts_get(experts *x, int64_t layer, int32_t e, expert_prec p, expert_view *out);
// Unpins one group of the current layer before the layer ends (its view
// becomes invalid): the caller has computed it and the layer's groups still
// without a slot need the room. The next experts_ready starts their reads.
// No-op when everything is resident or the group is not pinned.
void experts_release(experts *x, int64_t layer, int32_t e, expert_prec p);
// Ends the layer: unpins what is still pinned and releases its prefetches.
void experts_layer_done(experts *x, int64_t layer);

// Predictor (predict.h): gate input h [n_embd] of one token at `layer`,
// before its plan; predicts the experts of layers layer+1 .. layer+depth,
// and the plan of `layer` prefetches the ones worth it (after its own
// reads). No-op when everything is resident (unless predictions are traced).
void experts_predict(experts *x, int64_t layer, const float *h);

// Marks the end of a token (decode step) or of a prefill chunk of n tokens,
// for the per-token statistics; experts_reset_sequence clears the per-sequence
// counters of the cache policy.
void experts_step_done(experts *x, int64_t n_tokens);
void experts_reset_sequence(experts *x);

// ---- statistics -------------------------------------------------------------
// Offload counters of one step or of the whole run. A request is one
// (layer, expert, precision) a layer uses in a step.
typedef struct experts_counts {
  int64_t hits[2];           // requests found in RAM (high, low)
  int64_t prefetch_hits[2];  // of those, the first use of a copy the predictor brought in
  int64_t misses[2];         // requests read from disk on demand
  int64_t skips;             // (token, choice) pairs skipped (unimportance above T2)
  int64_t bytes_read;        // bytes read from disk, demand and prefetch
  int64_t reads;             // experts read from disk
  int64_t demand_bytes;      // bytes of the demand reads
  int64_t stall_us;          // time the forward pass waited for reads
  int64_t stall_bytes;       // bytes the disk delivered meanwhile
  int64_t prefetches;        // experts the predictor started reading
  int64_t prefetch_unused;   // prefetched copies their layer did not use
  int64_t pred_correct;      // predicted experts the router then chose
  int64_t pred_total;        // predicted experts checked
} experts_counts;

enum { EXPERTS_MAX_DEPTH = 4 };  // layers the predictor looks ahead at most
// Experts a token may use at most (the predictor's per-token arrays; the
// loader refuses expert_used_count above it).
enum { EXPERTS_MAX_USED = 64 };

typedef struct experts_stats {
  bool tiered;                // false: every expert resident (mapped)
  const char *io;             // "io_uring", "pread" or "mmap"
  bool direct;                // O_DIRECT reads
  const char *policy;         // cache policy name
  float weights[4];           // w_lru, w_lfu, w_lhu, w_fld in use
  float t1, t2;
  int prefetch_depth;         // layers predicted ahead now (0 = off)
  bool has_low;               // low-precision copies exist
  int64_t budget_bytes;       // tiered: the RAM budget for experts
  int64_t slots[2];           // cache slots per precision
  int64_t slot_bytes[2];      // bytes of one slot
  int64_t resident_bytes;     // expert bytes in RAM now (tiered: filled slots; resident: all)
  int64_t expert_bytes[2];    // every expert of the model per precision
  int64_t tokens, steps;      // tokens and forward calls so far
  experts_counts total;       // the whole run
  experts_counts last;        // the last step (one token when decoding)
  int64_t pred_correct_at[EXPERTS_MAX_DEPTH], pred_total_at[EXPERTS_MAX_DEPTH];  // by distance 1..
  double hit_rate;            // hits / (hits + misses) over both precisions; -1 without requests
  double pred_accuracy;       // pred_correct / pred_total; -1 when nothing was predicted
  double stall_gbps;          // bytes delivered while stalled / stall time (GB/s); -1 without stalls
  double disk_gbps;           // bytes read / time with reads in flight (GB/s); -1 without reads
  double prefetch_useful;     // how often a predicted expert not in RAM was then used (moving average)
  bool prefetch_paused;       // adaptive depth: not prefetching now (too rare a use, or slower when probed)
  int64_t prefetch_on_tokens; // adaptive depth: decode tokens run with prefetching on
} experts_stats;

void experts_get_stats(const experts *x, experts_stats *out);
// Writes the statistics (--stats) to f.
void experts_print_stats(const experts *x, FILE *f);

#endif
