// experts/cache: which (layer, expert) copies the RAM budget holds and which
// one to evict. Pure bookkeeping, no I/O: the slot rules (tier.c) drive it,
// for the provider (experts.c) and the offline simulator (trace.c, `mole
// cachesim`) alike.
//
// Each precision has its own table of fixed-size slots (high- and low-
// precision copies are looked up and counted separately). With
// experts_cache_share the two tables overlay ONE arena of bytes: high slot s
// lies at s*size_high from the bottom, low slot t at (t+1)*size_low below the
// top, so the budget goes to whichever precision is requested (a budget of N
// high slots still holds N high copies when no low copy is requested) and a
// slot is free only when every copy overlapping its bytes, in either
// precision, is gone. Filling a slot evicts every copy it overlaps. Eviction takes
// the lowest HOBBIT priority
//   p = w_lru*R/T + w_lfu*F/T + w_lhu*H/T + w_fld*(1 - ((l_i - l_t + L) mod L)/L)
// R: the token count when the expert was last used, F: tokens routed to it,
// H: of those, in high precision, T: tokens of the sequence so far (this
// step included), l_i: its layer, l_t: the layer being computed, L: layers.
// A slot overlapping several copies costs the highest priority among them.
// Ties go to the least recently used, then the lower slot. Hard-pinned slots
// (in use by the current layer), slots being read and (unless asked) soft-
// pinned ones (prefetched, not used yet) are never evicted.
#ifndef MOLE_EXPERTS_CACHE_H
#define MOLE_EXPERTS_CACHE_H

#include "base/base.h"

typedef enum {
  EXPERTS_POLICY_LRU = 0,
  EXPERTS_POLICY_LFU,
  EXPERTS_POLICY_LHU,
  EXPERTS_POLICY_FLD,
  EXPERTS_POLICY_HOBBIT,
  // Belady's offline optimum (MIN): evicts the copy whose next request lies
  // farthest ahead. It needs the future, so only the simulator (trace.c)
  // runs it: it fills experts_cache.next_use from the trace.
  EXPERTS_POLICY_BELADY,
  EXPERTS_POLICY_COUNT
} experts_policy;

// The weights HOBBIT uses when none are given (w_lru, w_lfu, w_lhu, w_fld).
extern const float k_experts_hobbit_weights[4];

const char *experts_policy_name(experts_policy p);
// Policy by name (NULL = hobbit) and its weights: `w_in` all zero = the
// policy's own; non-zero weights are only valid with hobbit and must be >= 0
// and sum to 1 (+-1e-3). Errors name the policy or the weights.
// belady is refused here: a running model cannot see its future routing.
mole_status experts_policy_parse(const char *name, const float w_in[4], experts_policy *pol, float w_out[4]);
// The same for the offline simulator: belady (alias opt) too, with zero weights.
mole_status experts_policy_parse_offline(const char *name, const float w_in[4], experts_policy *pol, float w_out[4]);

typedef enum { EXPERTS_SLOT_EMPTY = 0, EXPERTS_SLOT_LOADING, EXPERTS_SLOT_READY } experts_slot_state;

typedef struct experts_slot {
  int32_t layer, expert;  // the copy held; -1 when empty
  uint8_t state;          // experts_slot_state
  bool pinned;            // in use by the current layer
  bool soft;              // prefetched and not used yet
  bool prefetched;        // loaded by a prefetch (stats: prefetch hit on first use)
  int32_t io_pending;     // reads in flight (provider)
  int32_t io_err;         // errno of a failed read (provider)
  bool checked;           // compressed (blob) matrices validated since the read (provider)
} experts_slot;

typedef struct experts_cache {
  int64_t n_layer, n_expert;
  experts_policy policy;
  float w[4];
  int64_t n_slots[2];       // per precision (0 high, 1 low)
  experts_slot *slots[2];   // [n_slots[p]]
  int32_t *slot_of[2];      // [n_layer*n_expert] -> slot, -1 when not cached
  // a high copy serves every use of its expert, a low copy only the uses
  // planned low (while no high copy is cached): each precision is accounted
  // with the uses it serves
  int64_t *last_use;        // [n_layer*n_expert] R of the high copy: T when last used (0 = never this sequence)
  int64_t *uses;            // [n_layer*n_expert] F of the high copy: every use
  int64_t *uses_high;       // [n_layer*n_expert] H: uses in high precision
  int64_t *last_low;        // [n_layer*n_expert] R of the low copy: T when last used in low precision
  int64_t *uses_low;        // [n_layer*n_expert] F of the low copy: uses in low precision
  int64_t t;                // tokens of the sequence before this step
  int64_t t_now;            // T: tokens including the step being computed
  int64_t n_soft[2];        // soft-pinned slots per pool
  // shared arena (experts_cache_share): 0 = the pools do not overlap
  int64_t arena_bytes;
  int64_t slot_size[2];
  // belady only (set by the simulator): [2][n_layer*n_expert] the index of the
  // next request the copy of (layer, expert) in each precision will serve
  const int64_t *next_use[2];
} experts_cache;

mole_status experts_cache_init(experts_cache *c, int64_t n_layer, int64_t n_expert, int64_t n_high, int64_t n_low,
                               experts_policy policy, const float w[4]);
void experts_cache_free(experts_cache *c);
// Makes both pools overlay one arena of `arena` bytes (see above); n_high *
// size_high and n_low * size_low must each fit in it. Call before any assign.
void experts_cache_share(experts_cache *c, int64_t arena, int64_t size_high, int64_t size_low);
// Byte offset of slot s of pool p in the shared arena.
static inline int64_t experts_cache_offset(const experts_cache *c, int p, int64_t s) {
  return p ? c->arena_bytes - (s + 1) * c->slot_size[1] : s * c->slot_size[0];
}

// Slot of (layer, e) in pool p, or -1.
static inline int64_t experts_cache_find(const experts_cache *c, int p, int64_t layer, int64_t e) {
  return c->slot_of[p][layer * c->n_expert + e];
}
// HOBBIT's priority of the copy of (layer, e) in precision p while layer_now
// is computed: w_lru*R/T + w_lfu*F/T + w_lhu*H/T + w_fld*(1 - distance/L), with
// R, F of that copy (a low copy's H is 0: it never serves a high use).
// belady: minus the index of the copy's next request (the farthest goes first;
// a low copy whose high copy is cached serves nothing and goes first).
double experts_cache_priority(const experts_cache *c, int p, int64_t layer, int64_t e, int64_t layer_now);
// The slot to fill next in pool p: an empty one, else the lowest-priority
// evictable one (soft-pinned ones too when allow_soft); -1 when none.
int64_t experts_cache_victim(const experts_cache *c, int p, int64_t layer_now, bool allow_soft);
// Gives slot s of pool p to (layer, e) (forgetting what it held, and every
// copy of the other pool its bytes overlap): LOADING.
void experts_cache_assign(experts_cache *c, int p, int64_t s, int64_t layer, int64_t e);
// Empties slot s (a failed read).
void experts_cache_drop(experts_cache *c, int p, int64_t s);
void experts_cache_set_soft(experts_cache *c, int p, int64_t s, bool soft);
// Starts a step of n tokens (T = t + n).
void experts_cache_begin_step(experts_cache *c, int64_t n);
void experts_cache_end_step(experts_cache *c);
// Expert (layer, e) was used by n_tok tokens of this step, n_high of them in
// high precision.
void experts_cache_touch(experts_cache *c, int64_t layer, int64_t e, int64_t n_tok, int64_t n_high);
// Forgets R, F, H and T (a new sequence); the cached copies stay.
void experts_cache_reset_sequence(experts_cache *c);

// Slots per pool for a budget shared by both precisions: budget / slot_high
// high slots, and budget / slot_low low slots when low copies are in use
// (the two overlay the same bytes, experts_cache_share).
void experts_cache_split(int64_t budget, int64_t slot_high, int64_t slot_low, bool low_in_use, int64_t *n_high,
                         int64_t *n_low);

#endif
