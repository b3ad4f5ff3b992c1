// Routing trace: writing it during a run and replaying it through the cache
// (mole cachesim). The replay applies the same rules as the provider: a
// cached high copy is taken instead of loading a low one, a layer's experts
// are pinned while it runs, prefetched copies are soft-pinned until their
// layer runs or the step ends.
#include "experts/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAGIC "mole-trace"
#define TRACE_VERSION 1

mole_status experts_trace_begin(const char *path, const experts_trace_header *h, FILE **out) {
  FILE *f = fopen(path, "w");
  if (!f) return mole_errorf(MOLE_ERR_IO, "%s: cannot create the routing trace: %s", path, strerror(errno));
  fprintf(f, "%s %d layers %lld experts %lld used %lld slot_high %lld slot_low %lld low %d\n", TRACE_MAGIC,
          TRACE_VERSION, (long long)h->n_layer, (long long)h->n_expert, (long long)h->n_used,
          (long long)h->slot_bytes[0], (long long)h->slot_bytes[1], h->low_in_use ? 1 : 0);
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

void experts_trace_write_pred(FILE *f, int64_t layer, int64_t target, int64_t k, const int32_t *sel,
                              const uint8_t *prec) {
  fprintf(f, "P %lld %lld", (long long)layer, (long long)target);
  for (int64_t j = 0; j < k; j++)
    if (prec[j] != EXPERT_SKIP) fprintf(f, " %d:%c", sel[j], prec[j] == EXPERT_LOW ? 'l' : 'h');
  fputc('\n', f);
}

mole_status experts_trace_end(FILE *f, const char *path) {
  const bool bad = ferror(f) != 0;
  if (fclose(f) != 0 || bad) return mole_errorf(MOLE_ERR_IO, "%s: writing the routing trace failed", path);
  return MOLE_OK;
}

// ---- replay --------------------------------------------------------------------------
typedef struct sim {
  experts_cache c;
  experts_sim_result *r;
  int64_t *req;  // [2*n_expert] the requests of one L record
  int64_t soft_cap[2];
  const char *path;
  int64_t line;
} sim;

static mole_status bad_line(const sim *s, const char *what) {
  return mole_errorf(MOLE_ERR_FORMAT, "%s: line %lld: %s", s->path, (long long)s->line, what);
}

// Brings (layer, e, p) in: a hit, or a miss that takes the lowest-priority
// slot; MOLE_ERR_NOMEM (no message) when every slot is pinned.
static mole_status sim_load(sim *s, int p, int64_t layer, int64_t e, int64_t layer_now, bool soft) {
  experts_cache *c = &s->c;
  int64_t slot = experts_cache_find(c, p, layer, e);
  if (slot >= 0) {
    experts_slot *sl = &c->slots[p][slot];
    if (soft) {
      if (!sl->pinned && c->n_soft[p] < s->soft_cap[p]) experts_cache_set_soft(c, p, slot, true);
      return MOLE_OK;
    }
    if (sl->pinned) return MOLE_OK;
    s->r->c.hits[p]++;
    if (sl->prefetched) {
      s->r->c.prefetch_hits[p]++;
      sl->prefetched = false;
    }
    experts_cache_set_soft(c, p, slot, false);
  } else {
    if (soft && c->n_soft[p] >= s->soft_cap[p]) return MOLE_OK;
    slot = experts_cache_victim(c, p, layer_now, !soft);
    if (slot < 0) return soft ? MOLE_OK : MOLE_ERR_NOMEM;  // no message: the caller decides
    experts_cache_assign(c, p, slot, layer, e);
    c->slots[p][slot].state = EXPERTS_SLOT_READY;
    s->r->c.bytes_read += s->r->h.slot_bytes[p];
    s->r->c.reads++;
    if (soft) {
      experts_cache_set_soft(c, p, slot, true);
      c->slots[p][slot].prefetched = true;
      s->r->c.prefetches++;
      return MOLE_OK;
    }
    s->r->c.misses[p]++;
  }
  c->slots[p][slot].pinned = true;
  return MOLE_OK;
}

static void sim_release(sim *s, int64_t layer) {
  experts_cache *c = &s->c;
  for (int p = 0; p < 2; p++)
    for (int64_t i = 0; i < c->n_slots[p] && c->n_soft[p] > 0; i++) {
      experts_slot *sl = &c->slots[p][i];
      if (!sl->soft || (layer >= 0 && sl->layer != layer)) continue;
      experts_cache_set_soft(c, p, i, false);
      if (sl->prefetched) {
        s->r->c.prefetch_unused++;
        sl->prefetched = false;
      }
    }
}

static void sim_unpin(sim *s, int64_t layer, const int64_t *req, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const int p = (int)(req[i] % 2);
    const int64_t slot = experts_cache_find(&s->c, p, layer, req[i] / 2);
    s->c.slots[p][slot].pinned = false;
  }
}

// "L layer e:p:n ... skip S"
static mole_status sim_layer(sim *s, char *rest) {
  experts_cache *c = &s->c;
  const int64_t X = c->n_expert;
  char *save = NULL, *tok = strtok_r(rest, " \n", &save);
  char *end;
  if (!tok) return bad_line(s, "L record without a layer");
  const long long layer = strtoll(tok, &end, 10);
  if (*end || layer < 0 || layer >= c->n_layer) return bad_line(s, "bad layer number");
  int64_t *req = s->req, n_req = 0;
  while ((tok = strtok_r(NULL, " \n", &save))) {
    if (!strcmp(tok, "skip")) {
      tok = strtok_r(NULL, " \n", &save);
      if (!tok) return bad_line(s, "'skip' without a count");
      s->r->c.skips += strtoll(tok, NULL, 10);
      break;
    }
    long long e, n;
    char pc;
    if (sscanf(tok, "%lld:%c:%lld", &e, &pc, &n) != 3 || e < 0 || e >= X || (pc != 'h' && pc != 'l') || n <= 0)
      return bad_line(s, "expected EXPERT:h|l:TOKENS");
    if (n_req == 2 * X) return bad_line(s, "more entries than experts");
    int p = pc == 'l';
    // the low budget may be absent (low copies not in use): high then
    if (p == 1 && c->n_slots[1] == 0) p = 0;
    // a cached high copy beats loading a low one
    if (p == 1 && experts_cache_find(c, 0, layer, e) >= 0) p = 0;
    experts_cache_touch(c, layer, e, n, p == 0 ? n : 0);
    req[n_req++] = e * 2 + p;
  }
  // as the forward pass does: when the layer's experts do not all fit, the
  // ones pinned so far are computed and released (a wave), then the rest
  int64_t wave = 0;  // requests [wave, i) are pinned
  for (int64_t i = 0; i < n_req; i++) {
    const int p = (int)(req[i] % 2);
    mole_status st = sim_load(s, p, layer, req[i] / 2, layer, false);
    if (st == MOLE_ERR_NOMEM && i > wave) {
      sim_unpin(s, layer, req + wave, i - wave);
      wave = i;
      st = sim_load(s, p, layer, req[i] / 2, layer, false);
    }
    if (st == MOLE_ERR_NOMEM)
      return mole_errorf(MOLE_ERR_ARG, "%s: line %lld: the budget's %lld %s-precision slots cannot hold one of layer %lld's experts",
                         s->path, (long long)s->line, (long long)c->n_slots[p], p ? "low" : "high", (long long)layer);
    if (st) return st;
  }
  sim_unpin(s, layer, req + wave, n_req - wave);
  sim_release(s, layer);
  return MOLE_OK;
}

// "P layer target e:p ..."
static mole_status sim_pred(sim *s, char *rest) {
  experts_cache *c = &s->c;
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
    int p = pc == 'l' && c->n_slots[1] > 0;
    if (p == 1 && experts_cache_find(c, 0, target, e) >= 0) continue;
    mole_status st = sim_load(s, p, target, e, layer, true);
    if (st) return st;
  }
  return MOLE_OK;
}

static mole_status read_header(sim *s, const char *line, experts_trace_header *h) {
  int ver, low;
  long long L, X, K, sh, sl;
  if (sscanf(line, TRACE_MAGIC " %d layers %lld experts %lld used %lld slot_high %lld slot_low %lld low %d", &ver, &L,
             &X, &K, &sh, &sl, &low) != 7)
    return bad_line(s, "not a mole routing trace (expected a 'mole-trace 1 ...' header)");
  if (ver != TRACE_VERSION) return bad_line(s, "unsupported trace version");
  if (L < 1 || L > 4096 || X < 1 || X > 4096 || K < 1 || K > X || sh <= 0 || sl < 0)
    return bad_line(s, "header values out of range");
  *h = (experts_trace_header){L, X, K, {sh, sl}, low != 0};
  return MOLE_OK;
}

mole_status experts_cachesim(const char *path, const experts_sim_params *p, experts_sim_result *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "r");
  if (!f) return mole_errorf(MOLE_ERR_IO, "%s: cannot open the trace: %s", path, strerror(errno));
  sim s = {.r = out, .path = path};
  char *line = NULL;
  size_t cap = 0;
  mole_status st = MOLE_OK;
  bool have_header = false, in_step = false;
  while (!st && getline(&line, &cap, f) > 0) {
    s.line++;
    if (line[0] == '#' || line[0] == '\n') continue;
    if (!have_header) {
      if ((st = read_header(&s, line, &out->h))) break;
      have_header = true;
      const experts_trace_header *h = &out->h;
      out->budget = p->budget > 0 ? p->budget
                                  : (int64_t)(p->budget_frac * (double)(h->n_layer * h->n_expert) *
                                              (double)(h->slot_bytes[0] + (h->low_in_use ? h->slot_bytes[1] : 0)));
      // the same shared arena as the provider (experts.c open_tiered)
      const int64_t LX = h->n_layer * h->n_expert, lo_b = h->low_in_use ? h->slot_bytes[1] : 0;
      int64_t arena = MOLE_MIN(out->budget, LX * (h->slot_bytes[0] + lo_b));
      experts_cache_split(arena, h->slot_bytes[0], h->slot_bytes[1], h->low_in_use, &out->slots[0], &out->slots[1]);
      for (int q = 0; q < 2; q++) out->slots[q] = MOLE_MIN(out->slots[q], LX);
      if (!h->low_in_use) arena = out->slots[0] * h->slot_bytes[0];
      if (out->slots[0] < h->n_used || (h->low_in_use && out->budget / (h->slot_bytes[0] + lo_b) < h->n_used)) {
        st = mole_errorf(MOLE_ERR_ARG, "--budget %lld bytes holds %lld high-precision slots of %lld bytes; a token needs %lld",
                         (long long)out->budget, (long long)out->slots[0], (long long)h->slot_bytes[0], (long long)h->n_used);
        break;
      }
      if ((st = experts_cache_init(&s.c, h->n_layer, h->n_expert, out->slots[0], out->slots[1], p->policy, p->weights)))
        break;
      if (out->slots[0] > 0) experts_cache_share(&s.c, arena, h->slot_bytes[0], h->slot_bytes[1]);
      s.soft_cap[0] = out->slots[0] / 2;
      s.soft_cap[1] = out->slots[1] / 2;
      s.req = mole_calloc((size_t)(2 * h->n_expert), sizeof *s.req);
      if (!s.req) st = mole_errorf(MOLE_ERR_NOMEM, "cachesim: out of memory");
      continue;
    }
    if (line[0] == 's' && line[1] == ' ') {
      long long step, n;
      if (sscanf(line + 2, "%lld %lld", &step, &n) != 2 || n <= 0) {
        st = bad_line(&s, "expected s STEP TOKENS");
        break;
      }
      if (in_step) {
        sim_release(&s, -1);
        experts_cache_end_step(&s.c);
      }
      experts_cache_begin_step(&s.c, n);
      in_step = true;
      out->steps++;
      out->tokens += n;
    } else if (line[0] == 'L' && line[1] == ' ' && in_step) {
      st = sim_layer(&s, line + 2);
    } else if (line[0] == 'P' && line[1] == ' ' && in_step) {
      if (p->prefetch) st = sim_pred(&s, line + 2);
    } else {
      st = bad_line(&s, "expected an s, L or P record");
    }
  }
  if (!st && !have_header) st = mole_errorf(MOLE_ERR_FORMAT, "%s: empty trace", path);
  free(line);  // getline's buffer
  fclose(f);
  experts_cache_free(&s.c);
  mole_free(s.req);
  return st;
}
