// The tiered cache's slot rules (see tier.h): budget and pools, hits and
// misses, pins and waves, prefetches.
#include "experts/tier.h"

#include <string.h>

int64_t tier_budget_of(double frac, int64_t n_layer, int64_t n_expert, const int64_t slot_bytes[2], bool low_in_use) {
  const double all = (double)(n_layer * n_expert) * (double)(slot_bytes[0] + (low_in_use ? slot_bytes[1] : 0));
  return (int64_t)(frac * all);
}

int64_t tier_min_budget(int64_t n_used, const int64_t slot_bytes[2], bool low_in_use) {
  return n_used * (slot_bytes[0] + (low_in_use ? slot_bytes[1] : 0));
}

bool tier_pools(const tier_params *p, int64_t *arena, int64_t n[2]) {
  const int64_t LX = p->n_layer * p->n_expert, H = p->slot_bytes[0], Lo = p->low_in_use ? p->slot_bytes[1] : 0;
  MOLE_ASSERT(H > 0 && p->align > 0 && (!p->low_in_use || Lo > 0));
  int64_t a = p->budget / p->align * p->align;
  a = MOLE_MIN(a, LX * (H + Lo));
  experts_cache_split(a, H, Lo, p->low_in_use, &n[0], &n[1]);
  for (int q = 0; q < 2; q++) n[q] = MOLE_MIN(n[q], LX);
  if (!p->low_in_use) a = n[0] * H;
  *arena = a;
  // a layer of mixed requests pins n_used copies in either precision at once
  return n[0] >= p->n_used && (!p->low_in_use || p->budget / (H + Lo) >= p->n_used);
}

mole_status tier_init(tier *t, const tier_params *p, const tier_hooks *h, experts_counts *counts) {
  memset(t, 0, sizeof *t);
  MOLE_ASSERT(h->read);
  t->hooks = *h;
  t->counts = counts;
  t->low_in_use = p->low_in_use;
  t->layer_now = -1;
  int64_t arena, n[2];
  if (!tier_pools(p, &arena, n)) return MOLE_ERR_ARG;
  t->arena = arena;
  mole_status st = experts_cache_init(&t->c, p->n_layer, p->n_expert, n[0], n[1], p->policy, p->weights);
  if (st) return st;
  experts_cache_share(&t->c, arena, p->slot_bytes[0], p->low_in_use ? p->slot_bytes[1] : 0);
  for (int q = 0; q < 2; q++) t->soft_cap[q] = n[q] / 2;
  t->pins = mole_calloc((size_t)(2 * p->n_expert), sizeof *t->pins);
  t->gstate = mole_calloc((size_t)(2 * p->n_expert), sizeof *t->gstate);
  if (!t->pins || !t->gstate) {
    tier_free(t);
    return mole_errorf(MOLE_ERR_NOMEM, "expert cache: out of memory");
  }
  return MOLE_OK;
}

void tier_free(tier *t) {
  experts_cache_free(&t->c);
  mole_free(t->pins);
  mole_free(t->gstate);
  memset(t, 0, sizeof *t);
}

expert_prec tier_serve_prec(const tier *t, int64_t layer, int64_t e, expert_prec p) {
  if (p == EXPERT_LOW && (!t->low_in_use || tier_find(t, EXPERT_HIGH, layer, e) >= 0)) return EXPERT_HIGH;
  return p;
}

bool tier_cached(const tier *t, int64_t layer, int64_t e, expert_prec p) {
  return tier_find(t, p, layer, e) >= 0 || (p == EXPERT_LOW && tier_find(t, EXPERT_HIGH, layer, e) >= 0);
}

// Whether a slot is being read that will be evictable once it lands (not
// hard-pinned: a prefetch); waiting for a pinned one frees nothing.
static bool loading_unpinned(const tier *t) {
  if (t->n_loading[0] + t->n_loading[1] == 0) return false;
  for (int p = 0; p < 2; p++)
    for (int64_t s = 0; s < t->c.n_slots[p]; s++) {
      const experts_slot *sl = &t->c.slots[p][s];
      if (sl->state == EXPERTS_SLOT_LOADING && !sl->pinned) return true;
    }
  return false;
}

// Gives (layer, e) in precision p a slot the policy frees, chosen with
// layer_now as the layer being computed, and starts its read; -1 when none
// can be freed. A demand read evicts soft-pinned copies too (last), and waits
// for prefetches still being read when every other slot is pinned; a
// prefetch does neither.
static int64_t claim(tier *t, int p, int64_t layer, int64_t e, int64_t layer_now, bool prefetch) {
  experts_cache *c = &t->c;
  int64_t s = experts_cache_victim(c, p, layer_now, !prefetch);
  // (in either precision: the pools share the arena)
  while (s < 0 && !prefetch && t->hooks.wait && loading_unpinned(t)) {
    t->hooks.wait(t->hooks.ctx);
    s = experts_cache_victim(c, p, layer_now, true);
  }
  if (s < 0) return -1;
  experts_cache_assign(c, p, s, layer, e);
  t->n_loading[p]++;
  if (prefetch) {
    experts_cache_set_soft(c, p, s, true);
    c->slots[p][s].prefetched = true;
    t->counts->prefetches++;
  } else {
    t->counts->misses[p]++;
  }
  t->hooks.read(t->hooks.ctx, p, s, layer, e, prefetch);
  return s;
}

void tier_landed(tier *t, int p, int64_t s) {
  experts_slot *sl = &t->c.slots[p][s];
  MOLE_ASSERT(sl->state == EXPERTS_SLOT_LOADING && t->n_loading[p] > 0);
  sl->state = EXPERTS_SLOT_READY;
  t->n_loading[p]--;
}

mole_status tier_acquire(tier *t, int64_t layer, int64_t e, int p) {
  if (t->hooks.serve) t->hooks.serve(t->hooks.ctx, layer, e, p);
  experts_cache *c = &t->c;
  int64_t s = tier_find(t, p, layer, e);
  if (s >= 0) {
    const experts_slot *sl = &c->slots[p][s];
    if (sl->io_err && sl->state == EXPERTS_SLOT_READY && !sl->pinned) {
      experts_cache_drop(c, p, s);  // a failed read: read it again
      s = -1;
    }
  }
  if (s >= 0) {
    experts_slot *sl = &c->slots[p][s];
    if (sl->state == EXPERTS_SLOT_LOADING && t->hooks.need) t->hooks.need(t->hooks.ctx, p, s);
    if (sl->pinned) {
      if (layer == t->layer_now) t->gstate[2 * e + p] = TIER_PINNED;
      return MOLE_OK;
    }
    t->counts->hits[p]++;
    if (sl->prefetched) {
      t->counts->prefetch_hits[p]++;
      sl->prefetched = false;
    }
    experts_cache_set_soft(c, p, s, false);
  } else if ((s = claim(t, p, layer, e, layer, false)) < 0) {
    return MOLE_ERR_NOMEM;
  }
  c->slots[p][s].pinned = true;
  MOLE_ASSERT(t->n_pins < 2 * c->n_expert);
  t->pins[t->n_pins++] = tier_tag(p, s);
  if (layer == t->layer_now) t->gstate[2 * e + p] = TIER_PINNED;
  return MOLE_OK;
}

void tier_begin_step(tier *t, int64_t n) { experts_cache_begin_step(&t->c, n); }

void tier_begin_layer(tier *t, int64_t layer, const int64_t *grp) {
  const int64_t X = t->c.n_expert;
  t->layer_now = layer;
  t->refill = false;
  for (int64_t g = 0; g < 2 * X; g++) t->gstate[g] = grp[g] ? TIER_WAITING : TIER_NONE;
  for (int64_t e = 0; e < X; e++)
    if (grp[2 * e] + grp[2 * e + 1]) experts_cache_touch(&t->c, layer, e, grp[2 * e] + grp[2 * e + 1], grp[2 * e]);
  // every read the layer needs that a slot can be had for, before any wait
  for (int64_t g = 0; g < 2 * X; g++)
    if (grp[g]) (void)tier_acquire(t, layer, g / 2, (int)(g % 2));
}

void tier_prefetch(tier *t, int64_t layer_now, int64_t target, int64_t e, expert_prec p) {
  experts_cache *c = &t->c;
  if (p == EXPERT_LOW && !t->low_in_use) p = EXPERT_HIGH;
  if (p == EXPERT_LOW && tier_find(t, EXPERT_HIGH, target, e) >= 0) return;  // the plan will take the high copy
  const int64_t s = tier_find(t, p, target, e);
  if (s >= 0) {
    // already here: keep it until its layer runs
    if (!c->slots[p][s].pinned && c->n_soft[p] < t->soft_cap[p]) experts_cache_set_soft(c, p, s, true);
    return;
  }
  if (c->n_soft[p] >= t->soft_cap[p]) return;
  (void)claim(t, p, target, e, layer_now, true);  // no free slot: no prefetch
}

void tier_release(tier *t, int64_t layer, int64_t e, int p) {
  const int64_t s = tier_find(t, p, layer, e);
  if (s < 0 || !t->c.slots[p][s].pinned) return;
  t->c.slots[p][s].pinned = false;
  const int64_t tag = tier_tag(p, s);
  for (int64_t i = 0; i < t->n_pins; i++)
    if (t->pins[i] == tag) {
      t->pins[i] = t->pins[--t->n_pins];
      break;
    }
  if (layer != t->layer_now) return;
  t->gstate[2 * e + p] = TIER_RELEASED;
  t->refill = tier_waiting(t) > 0;
}

bool tier_refill(tier *t) {
  t->refill = false;
  bool had = false;
  for (int64_t g = 0; g < 2 * t->c.n_expert; g++)
    if (t->gstate[g] == TIER_WAITING) had |= tier_acquire(t, t->layer_now, g / 2, (int)(g % 2)) == MOLE_OK;
  return had;
}

int64_t tier_waiting(const tier *t) {
  int64_t n = 0;
  for (int64_t g = 0; g < 2 * t->c.n_expert; g++) n += t->gstate[g] == TIER_WAITING;
  return n;
}

// Releases the soft pins of prefetched copies for `layer` (-1: all); a
// prefetched copy released unused counts.
static void release_soft(tier *t, int64_t layer) {
  experts_cache *c = &t->c;
  for (int p = 0; p < 2; p++)
    for (int64_t s = 0; s < c->n_slots[p] && c->n_soft[p] > 0; s++) {
      experts_slot *sl = &c->slots[p][s];
      if (!sl->soft || (layer >= 0 && sl->layer != layer)) continue;
      experts_cache_set_soft(c, p, s, false);
      if (sl->prefetched) {
        t->counts->prefetch_unused++;
        sl->prefetched = false;
      }
    }
}

void tier_layer_done(tier *t, int64_t layer) {
  for (int64_t i = 0; i < t->n_pins; i++) {
    const int p = (int)(t->pins[i] >> 32);
    t->c.slots[p][t->pins[i] & 0xffffffff].pinned = false;
  }
  t->n_pins = 0;
  t->layer_now = -1;
  t->refill = false;
  memset(t->gstate, 0, (size_t)(2 * t->c.n_expert) * sizeof *t->gstate);
  release_soft(t, layer);
}

void tier_step_done(tier *t) {
  release_soft(t, -1);  // predictions do not outlive their token
  experts_cache_end_step(&t->c);
}

void tier_reset_sequence(tier *t) { experts_cache_reset_sequence(&t->c); }
