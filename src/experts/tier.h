// experts/tier: the slot rules of the tiered expert cache, in one place,
// driven by the provider (experts.c: reads from disk that land later) and by
// the replay of a routing trace (trace.c, `mole cachesim`: reads that land at
// once), so that a replay makes the provider's decisions:
//  - the budget: a fraction of every expert's bytes, the least a token needs,
//    and the split of one arena between the high and the low pool (cache.h);
//  - which slot a request of (layer, expert, precision) gets: a copy in RAM
//    or arriving (a hit), else the slot the cache policy evicts (a miss); a
//    cached (or arriving) high copy serves a low request;
//  - hard pins: a layer's groups stay pinned while it is computed; the ones
//    no slot can be had for wait until computed ones are released (waves);
//  - prefetches: soft pins until their layer has run or the step ends, at
//    most half of each pool; a prefetch never evicts a soft-pinned copy and
//    never waits;
//  - a demand request that finds every evictable slot still being read waits
//    for a read to land.
// It counts hits, misses and prefetches; the driver reads and counts bytes.
#ifndef MOLE_EXPERTS_TIER_H
#define MOLE_EXPERTS_TIER_H

#include "experts/cache.h"
#include "experts/experts.h"

typedef struct tier_params {
  int64_t n_layer, n_expert, n_used;
  int64_t slot_bytes[2];  // bytes of a slot per precision (high, low)
  bool low_in_use;        // low copies are requested (T2 > T1): the pools share the arena
  int64_t budget;         // bytes for experts
  int64_t align;          // the arena is a multiple of this (the reads' alignment; 1: any)
  experts_policy policy;
  float weights[4];
} tier_params;

// What the driver does for the tier (ctx is its own).
typedef struct tier_hooks {
  void *ctx;
  // Fill slot s of pool p with (layer, e): the slot is LOADING until the
  // driver calls tier_landed (the replay calls it at once, from here).
  void (*read)(void *ctx, int p, int64_t s, int64_t layer, int64_t e, bool prefetch);
  // Block until at least one read lands (tier_landed). NULL: reads land at once.
  void (*wait)(void *ctx);
  // A copy still being read (a prefetch) is now needed by the layer. May be NULL.
  void (*need)(void *ctx, int p, int64_t s);
  // A request of the current layer for (layer, e) in p is about to be
  // served: belady's replay moves its look-ahead on. May be NULL.
  void (*serve)(void *ctx, int64_t layer, int64_t e, int p);
} tier_hooks;

// The state of an (expert, precision) group of the layer being computed.
enum { TIER_NONE = 0, TIER_WAITING, TIER_PINNED, TIER_RELEASED };

typedef struct tier {
  experts_cache c;          // the copies, their states and the policy's bookkeeping
  tier_hooks hooks;
  experts_counts *counts;   // where hits, prefetch hits, misses, prefetches and unused ones count
  bool low_in_use;
  int64_t arena;            // bytes of the arena both pools overlay
  int64_t soft_cap[2];      // most slots prefetches may hold per pool
  int64_t n_loading[2];     // slots being read per pool
  int64_t *pins;            // [2*n_expert] slots pinned by the current layer: p*2^32 + slot
  int64_t n_pins;
  int64_t layer_now;        // the layer being computed (-1 between layers)
  uint8_t *gstate;          // [2*n_expert] its groups (2*expert + precision): TIER_*
  bool refill;              // slots were released while groups wait for one
} tier;

// A fraction of the bytes holding every expert takes (in each precision in use).
int64_t tier_budget_of(double frac, int64_t n_layer, int64_t n_expert, const int64_t slot_bytes[2], bool low_in_use);
// The least budget a token runs in: n_used experts in each precision in use.
int64_t tier_min_budget(int64_t n_used, const int64_t slot_bytes[2], bool low_in_use);

// The arena (bytes, within the budget) and the slots of each pool: one
// arena overlaid by both (cache.h), never larger than every expert takes.
// Whether that holds what a token pins at once: n_used copies in either
// precision.
bool tier_pools(const tier_params *p, int64_t *arena, int64_t n_slots[2]);
// Sizes the arena and its pools (tier_pools). MOLE_ERR_ARG without a
// message when they cannot hold what a token pins (the caller names its
// flag); MOLE_ERR_NOMEM with one. counts must outlive the tier.
mole_status tier_init(tier *t, const tier_params *p, const tier_hooks *h, experts_counts *counts);
void tier_free(tier *t);

// The tag of slot s of pool p (reads, pins).
static inline int64_t tier_tag(int p, int64_t s) { return ((int64_t)p << 32) | s; }

static inline int64_t tier_find(const tier *t, int p, int64_t layer, int64_t e) {
  return experts_cache_find(&t->c, p, layer, e);
}
// The precision a request of (layer, e) planned p is served in: a cached or
// arriving high copy serves a low request (and low copies out of use: high).
expert_prec tier_serve_prec(const tier *t, int64_t layer, int64_t e, expert_prec p);
// Whether a request of (layer, e) in p would find a copy in RAM or arriving.
bool tier_cached(const tier *t, int64_t layer, int64_t e, expert_prec p);

// A step of n tokens begins / has ended (the end releases every prefetch's soft pin).
void tier_begin_step(tier *t, int64_t n);
void tier_step_done(tier *t);
// Starts layer `layer`: grp [2*n_expert] tokens of each (expert, precision)
// group, as served (tier_serve_prec). Records the uses with the policy, then
// claims a slot for every group in group order as far as slots can be had;
// the others wait (TIER_WAITING) for tier_refill.
void tier_begin_layer(tier *t, int64_t layer, const int64_t *grp);
// Makes (layer, e) in precision p resident or on its way and pins it until
// tier_release or tier_layer_done. MOLE_ERR_NOMEM (no message) when no slot
// can be freed for it.
mole_status tier_acquire(tier *t, int64_t layer, int64_t e, int p);
// A prefetch of (target, e) in p, asked while layer_now is computed: a copy
// already here is soft-pinned (within the cap); else one is read into a slot
// that evicts no pinned or soft-pinned copy; else nothing.
void tier_prefetch(tier *t, int64_t layer_now, int64_t target, int64_t e, expert_prec p);
// The read into slot s of pool p has landed.
void tier_landed(tier *t, int p, int64_t s);
// Unpins one computed group of the current layer (no-op if not pinned).
void tier_release(tier *t, int64_t layer, int64_t e, int p);
// Claims slots for the current layer's waiting groups, in group order, as far
// as slots can be had; whether one was had.
bool tier_refill(tier *t);
// Groups of the current layer still waiting for a slot.
int64_t tier_waiting(const tier *t);
// Ends the layer: unpins what is pinned, releases the soft pins of its prefetches.
void tier_layer_done(tier *t, int64_t layer);
// Forgets the policy's per-sequence counters; the copies stay.
void tier_reset_sequence(tier *t);

#endif
