// Routing trace: writing it during a run and replaying it through the
// provider's slot rules (tier.c) for mole cachesim.
#include "experts/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "experts/tier.h"

#define TRACE_MAGIC "mole-trace"
#define TRACE_VERSION 1
// Bounds on what a trace may claim (far above any real model, low enough that
// no count or budget computed from them overflows int64): bytes of one expert
// copy, tokens in one step.
#define TRACE_SLOT_MAX ((long long)1 << 36)
#define TRACE_STEP_MAX ((long long)1 << 24)

mole_status experts_trace_begin(const char *path, const experts_trace_header *h, FILE **out) {
  FILE *f = fopen(path, "w");
  if (!f) return mole_errorf(MOLE_ERR_IO, "%s: cannot create the routing trace: %s", path, strerror(errno));
  fprintf(f, "%s %d layers %lld experts %lld used %lld slot_high %lld slot_low %lld low %d align %lld\n", TRACE_MAGIC,
          TRACE_VERSION, (long long)h->n_layer, (long long)h->n_expert, (long long)h->n_used,
          (long long)h->slot_bytes[0], (long long)h->slot_bytes[1], h->low_in_use ? 1 : 0, (long long)h->align);
  *out = f;
  return MOLE_OK;
}

void experts_trace_write_step(FILE *f, int64_t step, int64_t n_tokens) {
  fprintf(f, "s %lld %lld\n", (long long)step, (long long)n_tokens);
}

void experts_trace_write_layer(FILE *f, int64_t layer, int64_t n_expert, const int64_t *cnt, int64_t skips) {
  fprintf(f, "L %lld", (long long)layer);
  for (int64_t g = 0; g < 2 * n_expert; g++)
    if (cnt[g]) fprintf(f, " %lld:%c:%lld", (long long)(g / 2), g % 2 ? 'l' : 'h', (long long)cnt[g]);
  fprintf(f, " skip %lld\n", (long long)skips);
}

void experts_trace_write_pred(FILE *f, int64_t layer, const experts_request *req, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || req[i].layer != req[i - 1].layer) fprintf(f, "%sP %lld %lld", i ? "\n" : "", (long long)layer, (long long)req[i].layer);
    fprintf(f, " %d:%c", req[i].expert, req[i].prec == EXPERT_LOW ? 'l' : 'h');
  }
  if (n) fputc('\n', f);
}

mole_status experts_trace_end(FILE *f, const char *path) {
  const bool bad = ferror(f) != 0;
  if (fclose(f) != 0 || bad) return mole_errorf(MOLE_ERR_IO, "%s: writing the routing trace failed", path);
  return MOLE_OK;
}

// ---- replay --------------------------------------------------------------------------
//
// belady (MIN) replays with the same rules as the other policies (the same
// pins, waves, shared arena and the same reading of a request: a low request
// is served by a cached high copy and counts as a high hit; without one it
// is a low request, a hit only on a cached low copy, a miss loads a low
// copy). Only the victim differs: the slot whose copies' next request lies
// farthest ahead (never-again first). A request is one entry of an L record;
// a high copy's next request is the next request of its expert in either
// precision (it serves both), a low copy's the next low one (never while the
// high copy is cached: requests take that one; cache.c). A first pass
// over the trace finds them (next_any, next_low): O(requests) memory, and
// the replay stays O(requests * slots) like the other policies. As a group
// of the layer is served (tier.h's serve hook) its copies' next requests
// move past its entries.
//
// With one precision in use this is the exact offline optimum under the
// simulator's rules: the pins of a layer's wave are fixed by the trace alone
// (a wave holds the next n_slots experts of the layer, in expert order,
// whatever the policy), and MIN choosing among the unpinned copies stays
// optimal (Belady's exchange argument carries over to pins that depend on
// the trace alone; test_experts_cache checks it against an exhaustive search
// of every eviction choice). Its hits bound every policy's.
//
// With two precisions sharing one arena (variable-size copies that evict
// what their bytes overlap, and a low request served by either copy) the
// offline optimum is a hard packing problem and MIN is only a strong
// replay, which may lose to another policy. The bound is then a
// relaxation: every resident copy lies in disjoint bytes of the arena, so at
// most max(slots high, slots low) experts are resident in any precision; a
// request is a hit only if its expert is resident in some precision; and a
// copy is loaded only when its expert is requested. So every policy's hits
// are at most the hits of MIN with that many slots, no pins, on the stream
// of experts requested (a request repeating the one before it in its L
// record, which the replay serves from the same pinned copy or counts as a
// low request that a relaxed hit already covers, is dropped).

// A prefetch of a P record, waiting for the plan of the layer it was made at.
typedef struct sim_pf {
  int64_t layer, target, expert;
  int p;
} sim_pf;

typedef struct sim {
  tier t;
  experts_sim_result *r;
  const char *path;
  int64_t line;
  bool in_step;
  int64_t step_tokens;  // tokens of the current s record (bounds an L record's counts)
  int64_t *grp;         // [2*n_expert] tokens of each (expert, precision) group of an L record, as served
  int64_t *planned;     // [2*n_expert] its entries as the trace gives them (each at most once)
  int64_t *grp_ent;     // [2*n_expert][2] the entries (request indices) each group serves, -1: none
  sim_pf *pf;           // the P records since the last L record
  int64_t n_pf, cap_pf;
  // belady
  bool scan;            // first pass: only collect the requests
  int64_t n_ent, cap_ent;  // requests (L record entries) of the trace
  int32_t *ent_key;     // [n_ent] layer*n_expert + expert
  uint8_t *ent_flags;   // [n_ent] ENT_LOW: low in the trace; ENT_FIRST: first of its L record
  int64_t *next_any;    // [n_ent] index of the next request of that expert, either precision (n_ent: none)
  int64_t *next_low;    // [n_ent] of the next low request of that expert
  int64_t *nxt[2];      // [2][n_layer*n_expert] next request a high / low copy serves, as the replay goes
  int64_t pos;          // requests replayed so far
} sim;

enum { ENT_LOW = 1, ENT_FIRST = 2 };

static mole_status bad_line(const sim *s, const char *what) {
  return mole_errorf(MOLE_ERR_FORMAT, "%s: line %lld: %s", s->path, (long long)s->line, what);
}

// The tier's hooks: a read lands at once; belady's look-ahead moves past the
// entries a group serves (idempotent: a waiting group is served again).
static void sim_read(void *ctx, int p, int64_t slot, int64_t layer, int64_t e, bool prefetch) {
  (void)layer, (void)e, (void)prefetch;
  sim *s = ctx;
  s->r->c.bytes_read += s->r->h.slot_bytes[p];
  s->r->c.reads++;
  tier_landed(&s->t, p, slot);
}

static void sim_serve(void *ctx, int64_t layer, int64_t e, int p) {
  sim *s = ctx;
  const int64_t k = layer * s->t.c.n_expert + e;
  for (int i = 0; i < 2; i++) {
    const int64_t j = s->grp_ent[(2 * e + p) * 2 + i];
    if (j < 0) continue;
    MOLE_ASSERT(j < s->n_ent && s->ent_key[j] == k);
    s->nxt[0][k] = s->next_any[j];
    if (s->ent_flags[j] & ENT_LOW) s->nxt[1][k] = s->next_low[j];
  }
}

// First pass of belady: one more request.
static mole_status scan_request(sim *s, int64_t key, bool low, bool first) {
  if (s->n_ent == s->cap_ent) {
    const int64_t cap = MOLE_MAX(1024, 2 * s->cap_ent);
    int32_t *k = mole_realloc(s->ent_key, (size_t)cap * sizeof *k);
    if (k) s->ent_key = k;
    uint8_t *f = mole_realloc(s->ent_flags, (size_t)cap * sizeof *f);
    if (f) s->ent_flags = f;
    if (!k || !f) return mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory for %lld requests", (long long)cap);
    s->cap_ent = cap;
  }
  s->ent_key[s->n_ent] = (int32_t)key;
  s->ent_flags[s->n_ent++] = (uint8_t)((low ? ENT_LOW : 0) | (first ? ENT_FIRST : 0));
  return MOLE_OK;
}

// After the first pass: each request's next one of the same expert (either
// precision) and the next low one, and where each copy's first is.
static mole_status belady_prepare(sim *s) {
  const int64_t n = s->n_ent, LX = s->t.c.n_layer * s->t.c.n_expert;
  s->next_any = mole_malloc((size_t)MOLE_MAX(n, 1) * sizeof *s->next_any);
  s->next_low = mole_malloc((size_t)MOLE_MAX(n, 1) * sizeof *s->next_low);
  for (int q = 0; q < 2; q++) s->nxt[q] = mole_malloc((size_t)LX * sizeof *s->nxt[q]);
  if (!s->next_any || !s->next_low || !s->nxt[0] || !s->nxt[1])
    return mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory for %lld requests", (long long)n);
  for (int64_t k = 0; k < LX; k++) s->nxt[0][k] = s->nxt[1][k] = n;
  for (int64_t i = n - 1; i >= 0; i--) {  // nxt: the first request after i, going back
    const int32_t k = s->ent_key[i];
    s->next_any[i] = s->nxt[0][k];
    s->next_low[i] = s->nxt[1][k];
    s->nxt[0][k] = i;
    if (s->ent_flags[i] & ENT_LOW) s->nxt[1][k] = i;
  }
  s->t.c.next_use[0] = s->nxt[0];
  s->t.c.next_use[1] = s->nxt[1];
  return MOLE_OK;
}

// Request i repeats the one before it in its L record.
static bool belady_repeat(const sim *s, int64_t i) {
  return !(s->ent_flags[i] & ENT_FIRST) && s->ent_key[i] == s->ent_key[i - 1];
}

typedef struct heap_ent {
  int64_t pos;  // next request
  int32_t key;
} heap_ent;

static void heap_push(heap_ent *h, int64_t *n, heap_ent x) {
  int64_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2].pos < x.pos) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = x;
}

static heap_ent heap_pop(heap_ent *h, int64_t *n) {
  const heap_ent top = h[0], x = h[--*n];
  int64_t i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1].pos > h[c].pos) c++;
    if (h[c].pos <= x.pos) break;
    h[i] = h[c];
    i = c;
  }
  if (*n > 0) h[i] = x;
  return top;
}

// The relaxed bound of two precisions (see above): MIN with `cap` slots and
// no pins on the experts requested, repeats dropped. O(n log n): a max-heap
// of next requests, stale entries skipped when popped.
static mole_status belady_relaxed(const sim *s, int64_t cap, int64_t *hits, int64_t *n_req) {
  const int64_t n = s->n_ent, LX = s->t.c.n_layer * s->t.c.n_expert;
  heap_ent *h = mole_malloc((size_t)MOLE_MAX(n, 1) * sizeof *h);
  int64_t *cur = mole_malloc((size_t)LX * sizeof *cur);  // next request of a resident expert, -1 when not
  if (!h || !cur) {
    mole_free(h);
    mole_free(cur);
    return mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory for %lld requests", (long long)n);
  }
  for (int64_t k = 0; k < LX; k++) cur[k] = -1;
  int64_t nh = 0, resident = 0;
  *hits = *n_req = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i > 0 && belady_repeat(s, i)) continue;
    const int32_t k = s->ent_key[i];
    int64_t nx = s->next_any[i];
    while (nx < n && belady_repeat(s, nx)) nx = s->next_any[nx];  // a repeat is the request right after
    ++*n_req;
    if (cur[k] >= 0) {
      ++*hits;
    } else if (resident == cap) {
      for (;;) {
        const heap_ent v = heap_pop(h, &nh);
        if (cur[v.key] == v.pos) {
          cur[v.key] = -1;
          break;
        }
      }
    } else {
      resident++;
    }
    cur[k] = nx;
    heap_push(h, &nh, (heap_ent){nx, k});
  }
  mole_free(h);
  mole_free(cur);
  return MOLE_OK;
}

// "L layer e:p:n ... skip S": the layer's plan, its prefetches, then its
// groups as the forward pass computes them.
static mole_status sim_layer(sim *s, char *rest) {
  tier *t = &s->t;
  const int64_t X = t->c.n_expert;
  char *save = NULL, *tok = strtok_r(rest, " \n", &save);
  char *end;
  if (!tok) return bad_line(s, "L record without a layer");
  const long long layer = strtoll(tok, &end, 10);
  if (*end || layer < 0 || layer >= t->c.n_layer) return bad_line(s, "bad layer number");
  memset(s->grp, 0, (size_t)(2 * X) * sizeof *s->grp);
  memset(s->planned, 0, (size_t)(2 * X) * sizeof *s->planned);
  for (int64_t g = 0; g < 4 * X; g++) s->grp_ent[g] = -1;
  int64_t n_req = 0;
  while ((tok = strtok_r(NULL, " \n", &save))) {
    if (!strcmp(tok, "skip")) {
      tok = strtok_r(NULL, " \n", &save);
      if (!tok) return bad_line(s, "'skip' without a count");
      const long long sk = strtoll(tok, &end, 10);
      if (*end || sk < 0 || sk > s->step_tokens * s->r->h.n_used)
        return bad_line(s, "bad skip count (a whole number up to the step's tokens times experts used)");
      if (!s->scan) s->r->c.skips += sk;
      break;
    }
    long long e, n;
    char pc;
    if (sscanf(tok, "%lld:%c:%lld", &e, &pc, &n) != 3 || e < 0 || e >= X || (pc != 'h' && pc != 'l') || n <= 0)
      return bad_line(s, "expected EXPERT:h|l:TOKENS");
    if (n > s->step_tokens) return bad_line(s, "an expert with more tokens than its step has");
    const int p = pc == 'l';
    if (s->planned[2 * e + p]) return bad_line(s, "an expert twice in one precision");
    s->planned[2 * e + p] = n;
    if (s->scan) {
      mole_status st = scan_request(s, layer * X + e, p, n_req == 0);
      if (st) return st;
      n_req++;
      continue;
    }
    const int64_t g = 2 * e + tier_serve_prec(t, layer, e, (expert_prec)p);
    s->grp[g] += n;
    s->grp_ent[2 * g + (s->grp_ent[2 * g] >= 0)] = s->pos + n_req++;
  }
  if (s->scan) return MOLE_OK;
  tier_begin_layer(t, layer, s->grp);
  for (int64_t i = 0; i < s->n_pf; i++)
    if (s->pf[i].layer == layer) tier_prefetch(t, layer, s->pf[i].target, s->pf[i].expert, (expert_prec)s->pf[i].p);
  s->n_pf = 0;
  // the groups without a slot take those of the computed ones (waves)
  while (tier_waiting(t) > 0) {
    for (int64_t g = 0; g < 2 * X; g++)
      if (t->gstate[g] == TIER_PINNED) tier_release(t, layer, g / 2, (int)(g % 2));
    if (!tier_refill(t)) {
      int p = 0;
      for (int64_t g = 2 * X - 1; g >= 0; g--)
        if (t->gstate[g] == TIER_WAITING) p = (int)(g % 2);
      return mole_errorf(MOLE_ERR_ARG, "%s: line %lld: the budget's %lld %s-precision slots cannot hold one of layer %lld's experts",
                         s->path, (long long)s->line, (long long)t->c.n_slots[p], p ? "low" : "high", layer);
    }
  }
  tier_layer_done(t, layer);
  s->pos += n_req;
  return MOLE_OK;
}

// "P layer target e:p ...": prefetches for the plan of `layer`.
static mole_status sim_pred(sim *s, char *rest) {
  const experts_cache *c = &s->t.c;
  long long layer, target;
  int used;
  if (sscanf(rest, "%lld %lld%n", &layer, &target, &used) != 2 || layer < 0 || target <= layer || target >= c->n_layer)
    return bad_line(s, "expected P LAYER TARGET ...");
  char *save = NULL;
  for (char *tok = strtok_r(rest + used, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
    long long e;
    char pc;
    if (sscanf(tok, "%lld:%c", &e, &pc) != 2 || e < 0 || e >= c->n_expert || (pc != 'h' && pc != 'l'))
      return bad_line(s, "expected EXPERT:h|l");
    if (s->n_pf == s->cap_pf) {
      const int64_t cap = MOLE_MAX(64, 2 * s->cap_pf);
      sim_pf *pf = mole_realloc(s->pf, (size_t)cap * sizeof *pf);
      if (!pf) return mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory for %lld prefetches", (long long)cap);
      s->pf = pf;
      s->cap_pf = cap;
    }
    s->pf[s->n_pf++] = (sim_pf){layer, target, e, pc == 'l'};
  }
  return MOLE_OK;
}

static mole_status read_header(sim *s, const char *line, experts_trace_header *h) {
  int ver, low, used = 0;
  long long L, X, K, sh, sl, align = 1;
  if (sscanf(line, TRACE_MAGIC " %d layers %lld experts %lld used %lld slot_high %lld slot_low %lld low %d%n", &ver, &L,
             &X, &K, &sh, &sl, &low, &used) != 7)
    return bad_line(s, "not a mole routing trace (expected a 'mole-trace 1 ...' header)");
  if (ver != TRACE_VERSION) return bad_line(s, "unsupported trace version");
  int more = 0;
  if (sscanf(line + used, " align %lld%n", &align, &more) == 1) used += more;
  if (L < 1 || L > 4096 || X < 1 || X > 4096 || K < 1 || K > X || sh <= 0 || sh > TRACE_SLOT_MAX || sl < 0 ||
      sl > TRACE_SLOT_MAX || align < 1 || align > TRACE_SLOT_MAX)
    return bad_line(s, "header values out of range");
  // a low tier needs its slots' size
  *h = (experts_trace_header){L, X, K, {sh, sl}, low != 0 && sl > 0, align};
  return MOLE_OK;
}

// The header: the budget, the slots, the tier.
static mole_status sim_setup(sim *s, const char *line, const experts_sim_params *p) {
  experts_sim_result *out = s->r;
  mole_status st = read_header(s, line, &out->h);
  if (st) return st;
  const experts_trace_header *h = &out->h;
  out->budget = p->budget > 0 ? p->budget
                              : tier_budget_of(p->budget_frac, h->n_layer, h->n_expert, h->slot_bytes, h->low_in_use);
  // the provider's pools for this budget (experts.c open_tiered)
  const tier_params tp = {h->n_layer, h->n_expert, h->n_used, {h->slot_bytes[0], h->slot_bytes[1]}, h->low_in_use,
                          out->budget, h->align, p->policy, {p->weights[0], p->weights[1], p->weights[2], p->weights[3]}};
  const tier_hooks hooks = {s, sim_read, NULL, NULL, p->policy == EXPERTS_POLICY_BELADY ? sim_serve : NULL};
  int64_t arena;
  if (!tier_pools(&tp, &arena, out->slots))
    return mole_errorf(MOLE_ERR_ARG, "--budget %lld bytes holds %lld high-precision slots of %lld bytes; a token needs %lld",
                       (long long)out->budget, (long long)out->slots[0], (long long)h->slot_bytes[0], (long long)h->n_used);
  if ((st = tier_init(&s->t, &tp, &hooks, &out->c))) return st;
  s->grp = mole_calloc((size_t)(2 * h->n_expert), sizeof *s->grp);
  s->planned = mole_calloc((size_t)(2 * h->n_expert), sizeof *s->planned);
  s->grp_ent = mole_calloc((size_t)(4 * h->n_expert), sizeof *s->grp_ent);
  if (!s->grp || !s->planned || !s->grp_ent) return mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory");
  return MOLE_OK;
}

// The records after the header: a replay, or (s->scan) belady's first pass.
static mole_status sim_records(sim *s, FILE *f, char **line, size_t *cap, bool prefetch) {
  mole_status st = MOLE_OK;
  bool in_step = false;
  experts_sim_result *out = s->r;
  while (!st && getline(line, cap, f) > 0) {
    const char *l = *line;
    s->line++;
    if (l[0] == '#' || l[0] == '\n') continue;
    if (l[0] == 's' && l[1] == ' ') {
      long long step, n;
      if (sscanf(l + 2, "%lld %lld", &step, &n) != 2 || n <= 0) return bad_line(s, "expected s STEP TOKENS");
      if (n > TRACE_STEP_MAX) return bad_line(s, "more tokens in a step than a trace can hold");
      in_step = true;
      s->step_tokens = n;
      if (s->scan) continue;
      if (s->in_step) tier_step_done(&s->t);
      tier_begin_step(&s->t, n);
      s->in_step = true;
      s->n_pf = 0;
      out->steps++;
      out->tokens += n;
    } else if (l[0] == 'L' && l[1] == ' ' && in_step) {
      st = sim_layer(s, *line + 2);
    } else if (l[0] == 'P' && l[1] == ' ' && in_step) {
      if (prefetch && !s->scan) st = sim_pred(s, *line + 2);
    } else {
      st = bad_line(s, "expected an s, L or P record");
    }
  }
  if (!st && s->in_step) {
    tier_step_done(&s->t);  // the last step's unused prefetches count
    s->in_step = false;
  }
  return st;
}

mole_status experts_cachesim(const char *path, const experts_sim_params *p, experts_sim_result *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "r");
  if (!f) return mole_errorf(MOLE_ERR_IO, "%s: cannot open the trace: %s", path, strerror(errno));
  sim s = {.r = out, .path = path};
  char *line = NULL;
  size_t cap = 0;
  mole_status st = MOLE_OK;
  bool have_header = false;
  while (!have_header && getline(&line, &cap, f) > 0) {
    s.line++;
    if (line[0] == '#' || line[0] == '\n') continue;
    have_header = true;
    st = sim_setup(&s, line, p);
  }
  if (!st && !have_header) st = mole_errorf(MOLE_ERR_FORMAT, "%s: empty trace", path);
  const bool belady = p->policy == EXPERTS_POLICY_BELADY;
  if (!st && belady) {
    // first pass: the requests, and when each comes again
    const int64_t line0 = s.line;
    const off_t data = ftello(f);
    s.scan = true;
    st = sim_records(&s, f, &line, &cap, false);
    s.scan = false;
    if (!st) st = belady_prepare(&s);
    if (!st && fseeko(f, data, SEEK_SET) != 0)
      st = mole_errorf(MOLE_ERR_IO, "%s: cannot read the trace twice: %s", path, strerror(errno));
    s.line = line0;
  }
  if (!st) st = sim_records(&s, f, &line, &cap, p->prefetch && !belady);
  if (!st && belady) {
    MOLE_ASSERT(s.pos == s.n_ent);
    out->bound_exact = out->slots[1] == 0;
    if (out->bound_exact) {
      out->bound_hits = out->c.hits[0] + out->c.hits[1];
      out->bound_requests = out->bound_hits + out->c.misses[0] + out->c.misses[1];
    } else {
      st = belady_relaxed(&s, MOLE_MAX(out->slots[0], out->slots[1]), &out->bound_hits, &out->bound_requests);
    }
  }
  free(line);  // getline's buffer
  fclose(f);
  tier_free(&s.t);
  mole_free(s.grp);
  mole_free(s.planned);
  mole_free(s.grp_ent);
  mole_free(s.pf);
  mole_free(s.ent_key);
  mole_free(s.ent_flags);
  mole_free(s.next_any);
  mole_free(s.next_low);
  mole_free(s.nxt[0]);
  mole_free(s.nxt[1]);
  return st;
}
