// The expert cache's bookkeeping and its eviction policies (see cache.h).
#include "experts/cache.h"

#include <math.h>
#include <string.h>
#include <strings.h>

// HOBBIT's multidimensional policy: recency and layer distance matter most
// during decoding; frequency and high-precision use break the rest.
const float k_experts_hobbit_weights[4] = {0.4f, 0.2f, 0.1f, 0.3f};

static const char *const k_names[EXPERTS_POLICY_COUNT] = {"lru", "lfu", "lhu", "fld", "hobbit", "belady"};

const char *experts_policy_name(experts_policy p) {
  return (unsigned)p < EXPERTS_POLICY_COUNT ? k_names[p] : "?";
}

static mole_status policy_parse(const char *name, const float w_in[4], experts_policy *pol, float w_out[4], bool offline) {
  int found = -1;
  if (!name) found = EXPERTS_POLICY_HOBBIT;
  for (int i = 0; name && i < EXPERTS_POLICY_COUNT; i++)
    if (!strcasecmp(name, k_names[i])) found = i;
  if (name && !strcasecmp(name, "opt")) found = EXPERTS_POLICY_BELADY;
  if (found == EXPERTS_POLICY_BELADY && !offline)
    return mole_errorf(MOLE_ERR_ARG, "cache policy '%s' needs the future routing: only mole cachesim replays it", name);
  if (found < 0)
    return mole_errorf(MOLE_ERR_ARG, "cache policy '%s': expected %s", name,
                       offline ? "lru, lfu, lhu, fld, hobbit or belady" : "lru, lfu, lhu, fld or hobbit");
  *pol = (experts_policy)found;
  bool given = false;
  for (int i = 0; i < 4; i++) given = given || (w_in && w_in[i] != 0);
  if (given) {
    if (found != EXPERTS_POLICY_HOBBIT)
      return mole_errorf(MOLE_ERR_ARG, "cache weights apply to the hobbit policy only (the policy is %s)", k_names[found]);
    double sum = 0;
    for (int i = 0; i < 4; i++) {
      if (!(w_in[i] >= 0 && w_in[i] <= 1))
        return mole_errorf(MOLE_ERR_ARG, "cache weights: weight %d is %g, expected a value in [0, 1]", i + 1,
                           (double)w_in[i]);
      sum += w_in[i];
    }
    if (fabs(sum - 1.0) > 1e-3)
      return mole_errorf(MOLE_ERR_ARG, "cache weights %g,%g,%g,%g sum to %g, expected 1", (double)w_in[0],
                         (double)w_in[1], (double)w_in[2], (double)w_in[3], sum);
    memcpy(w_out, w_in, 4 * sizeof *w_out);
    return MOLE_OK;
  }
  memset(w_out, 0, 4 * sizeof *w_out);
  if (found == EXPERTS_POLICY_HOBBIT) memcpy(w_out, k_experts_hobbit_weights, 4 * sizeof *w_out);
  else if (found != EXPERTS_POLICY_BELADY) w_out[found] = 1.0f;
  return MOLE_OK;
}

mole_status experts_policy_parse(const char *name, const float w_in[4], experts_policy *pol, float w_out[4]) {
  return policy_parse(name, w_in, pol, w_out, false);
}

mole_status experts_policy_parse_offline(const char *name, const float w_in[4], experts_policy *pol, float w_out[4]) {
  return policy_parse(name, w_in, pol, w_out, true);
}

mole_status experts_cache_init(experts_cache *c, int64_t n_layer, int64_t n_expert, int64_t n_high, int64_t n_low,
                               experts_policy policy, const float w[4]) {
  memset(c, 0, sizeof *c);
  MOLE_ASSERT(n_layer > 0 && n_expert > 0 && n_high >= 0 && n_low >= 0);
  c->n_layer = n_layer;
  c->n_expert = n_expert;
  c->policy = policy;
  memcpy(c->w, w, sizeof c->w);
  const size_t nk = (size_t)(n_layer * n_expert);
  bool ok = true;
  for (int p = 0; p < 2; p++) {
    c->n_slots[p] = p ? n_low : n_high;
    c->slots[p] = mole_calloc((size_t)MOLE_MAX(c->n_slots[p], 1), sizeof *c->slots[p]);
    c->slot_of[p] = mole_malloc(nk * sizeof *c->slot_of[p]);
    ok = ok && c->slots[p] && c->slot_of[p];
    for (size_t i = 0; ok && i < nk; i++) c->slot_of[p][i] = -1;
    for (int64_t s = 0; ok && s < c->n_slots[p]; s++) c->slots[p][s].layer = c->slots[p][s].expert = -1;
  }
  c->last_use = mole_calloc(nk, sizeof *c->last_use);
  c->uses = mole_calloc(nk, sizeof *c->uses);
  c->uses_high = mole_calloc(nk, sizeof *c->uses_high);
  c->last_low = mole_calloc(nk, sizeof *c->last_low);
  c->uses_low = mole_calloc(nk, sizeof *c->uses_low);
  if (!ok || !c->last_use || !c->uses || !c->uses_high || !c->last_low || !c->uses_low) {
    experts_cache_free(c);
    return mole_errorf(MOLE_ERR_NOMEM, "expert cache: out of memory for %lld experts", (long long)nk);
  }
  return MOLE_OK;
}

void experts_cache_free(experts_cache *c) {
  for (int p = 0; p < 2; p++) {
    mole_free(c->slots[p]);
    mole_free(c->slot_of[p]);
  }
  mole_free(c->last_use);
  mole_free(c->uses);
  mole_free(c->uses_high);
  mole_free(c->last_low);
  mole_free(c->uses_low);
  memset(c, 0, sizeof *c);
}

double experts_cache_priority(const experts_cache *c, int p, int64_t layer, int64_t e, int64_t layer_now) {
  const int64_t k = layer * c->n_expert + e, L = c->n_layer;
  if (c->policy == EXPERTS_POLICY_BELADY) {
    MOLE_ASSERT(c->next_use[p]);
    // a low copy serves nothing while its high copy is cached (that one is taken)
    if (p && c->slot_of[0][k] >= 0) return -(double)INT64_MAX;
    return -(double)c->next_use[p][k];
  }
  const double T = (double)MOLE_MAX(c->t_now, 1);
  const double dist = (double)(((layer - layer_now) % L + L) % L) / (double)L;
  if (p)
    return c->w[0] * (double)c->last_low[k] / T + c->w[1] * (double)c->uses_low[k] / T + c->w[3] * (1.0 - dist);
  return c->w[0] * (double)c->last_use[k] / T + c->w[1] * (double)c->uses[k] / T +
         c->w[2] * (double)c->uses_high[k] / T + c->w[3] * (1.0 - dist);
}

void experts_cache_share(experts_cache *c, int64_t arena, int64_t size_high, int64_t size_low) {
  MOLE_ASSERT(size_high > 0 && c->n_slots[0] * size_high <= arena);
  MOLE_ASSERT(c->n_slots[1] == 0 || (size_low > 0 && c->n_slots[1] * size_low <= arena));
  c->arena_bytes = arena;
  c->slot_size[0] = size_high;
  c->slot_size[1] = size_low;
}

// The slots of the other pool whose bytes overlap slot s of pool p: [*lo, *hi]
// (empty when *lo > *hi).
static void overlap_range(const experts_cache *c, int p, int64_t s, int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = -1;
  const int q = 1 - p;
  if (!c->arena_bytes || c->n_slots[q] == 0) return;
  const int64_t A = c->arena_bytes, H = c->slot_size[0], L = c->slot_size[1];
  if (p == 0) {
    // low slot t covers [A - (t+1)L, A - tL); high slot s covers [sH, sH + H)
    const int64_t top = A - s * H, bottom = A - s * H - H;  // distances from the top
    *lo = bottom > 0 ? bottom / L : 0;
    *hi = (top + L - 1) / L - 1;
  } else {
    const int64_t b = A - (s + 1) * L, e = A - s * L;
    *lo = b / H;
    *hi = (e + H - 1) / H - 1;
  }
  *hi = MOLE_MIN(*hi, c->n_slots[q] - 1);
}

int64_t experts_cache_victim(const experts_cache *c, int p, int64_t layer_now, bool allow_soft) {
  int64_t best = -1;
  double best_pri = 0;
  int64_t best_r = 0;
  for (int64_t s = 0; s < c->n_slots[p]; s++) {
    int64_t lo, hi;
    overlap_range(c, p, s, &lo, &hi);
    // the copies filling s would evict: s itself, then what overlaps it
    bool ok = true, any = false;
    double key = 0;
    int64_t r = 0;
    const int64_t n_over = hi >= lo ? hi - lo + 1 : 0;
    for (int64_t j = 0; ok && j <= n_over; j++) {
      const experts_slot *sl = j == 0 ? &c->slots[p][s] : &c->slots[1 - p][lo + j - 1];
      if (sl->state == EXPERTS_SLOT_EMPTY) continue;
      if (sl->state != EXPERTS_SLOT_READY || sl->pinned || (sl->soft && !allow_soft)) {
        ok = false;
        break;
      }
      const int q = j == 0 ? p : 1 - p;
      const double pri = experts_cache_priority(c, q, sl->layer, sl->expert, layer_now);
      const int64_t ri = (q ? c->last_low : c->last_use)[sl->layer * c->n_expert + sl->expert];
      // soft-pinned slots go last: any unpinned one is evicted first
      const double k = pri + (sl->soft ? 16.0 : 0.0);
      if (!any || k > key + 1e-12 || (fabs(k - key) <= 1e-12 && ri > r)) {
        key = k;
        r = ri;
      }
      any = true;
    }
    if (!ok) continue;
    if (!any) return s;
    if (best < 0 || key < best_pri - 1e-12 || (fabs(key - best_pri) <= 1e-12 && r < best_r)) {
      best = s;
      best_pri = key;
      best_r = r;
    }
  }
  return best;
}

void experts_cache_assign(experts_cache *c, int p, int64_t s, int64_t layer, int64_t e) {
  MOLE_ASSERT(s >= 0 && s < c->n_slots[p]);
  experts_slot *sl = &c->slots[p][s];
  MOLE_ASSERT(!sl->pinned && sl->state != EXPERTS_SLOT_LOADING && sl->io_pending == 0);
  MOLE_ASSERT(c->slot_of[p][layer * c->n_expert + e] < 0);
  int64_t lo, hi;
  overlap_range(c, p, s, &lo, &hi);
  for (int64_t i = lo; i <= hi; i++) {
    const experts_slot *o = &c->slots[1 - p][i];
    if (o->state == EXPERTS_SLOT_EMPTY) continue;
    MOLE_ASSERT(!o->pinned && o->state != EXPERTS_SLOT_LOADING && o->io_pending == 0);
    experts_cache_drop(c, 1 - p, i);
  }
  if (sl->soft) experts_cache_set_soft(c, p, s, false);
  if (sl->layer >= 0) c->slot_of[p][sl->layer * c->n_expert + sl->expert] = -1;
  *sl = (experts_slot){.layer = (int32_t)layer, .expert = (int32_t)e, .state = EXPERTS_SLOT_LOADING};
  c->slot_of[p][layer * c->n_expert + e] = (int32_t)s;
}

void experts_cache_drop(experts_cache *c, int p, int64_t s) {
  experts_slot *sl = &c->slots[p][s];
  MOLE_ASSERT(sl->io_pending == 0);
  if (sl->soft) experts_cache_set_soft(c, p, s, false);
  if (sl->layer >= 0) c->slot_of[p][sl->layer * c->n_expert + sl->expert] = -1;
  *sl = (experts_slot){.layer = -1, .expert = -1};
}

void experts_cache_set_soft(experts_cache *c, int p, int64_t s, bool soft) {
  experts_slot *sl = &c->slots[p][s];
  if (sl->soft == soft) return;
  sl->soft = soft;
  c->n_soft[p] += soft ? 1 : -1;
}

void experts_cache_begin_step(experts_cache *c, int64_t n) { c->t_now = c->t + n; }
void experts_cache_end_step(experts_cache *c) { c->t = c->t_now; }

void experts_cache_touch(experts_cache *c, int64_t layer, int64_t e, int64_t n_tok, int64_t n_high) {
  const int64_t k = layer * c->n_expert + e;
  c->last_use[k] = c->t_now;
  c->uses[k] += n_tok;
  c->uses_high[k] += n_high;
  if (n_tok > n_high) {
    c->last_low[k] = c->t_now;
    c->uses_low[k] += n_tok - n_high;
  }
}

void experts_cache_reset_sequence(experts_cache *c) {
  const size_t nk = (size_t)(c->n_layer * c->n_expert);
  memset(c->last_use, 0, nk * sizeof *c->last_use);
  memset(c->uses, 0, nk * sizeof *c->uses);
  memset(c->uses_high, 0, nk * sizeof *c->uses_high);
  memset(c->last_low, 0, nk * sizeof *c->last_low);
  memset(c->uses_low, 0, nk * sizeof *c->uses_low);
  c->t = c->t_now = 0;
}

void experts_cache_split(int64_t budget, int64_t slot_high, int64_t slot_low, bool low_in_use, int64_t *n_high,
                         int64_t *n_low) {
  MOLE_ASSERT(slot_high > 0);
  if (!low_in_use || slot_low <= 0) {
    *n_high = budget / slot_high;
    *n_low = 0;
    return;
  }
  *n_high = budget / slot_high;
  *n_low = budget / slot_low;
}
