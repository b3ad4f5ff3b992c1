// The expert provider's front: opening (resident or tiered, the budget),
// the precision plan, get/pin/unpin, and the step bookkeeping. The cache's
// bookkeeping is cache.c, reads are io.c, the file layout store.c, the
// predictor predict.c, statistics stats.c.
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "experts/budget.h"
#include "experts/experts_internal.h"
#include "experts/trace.h"

static const char *const k_prec[2] = {"high", "low"};

static int64_t tag_of(int p, int64_t s) { return ((int64_t)p << 32) | s; }

expert_prec experts_prec_of(const experts *x, float u) {
  expert_prec p = u <= x->t1 ? EXPERT_HIGH : u <= x->t2 ? EXPERT_LOW : EXPERT_SKIP;
  if (p == EXPERT_LOW && !x->low_in_use) p = EXPERT_HIGH;
  return p;
}

bool experts_has_low(const experts *x) { return x->store.has_low; }

// ---- opening --------------------------------------------------------------------
// Memory the rest of the process needs besides the experts and the weights
// mapped from the file: the KV cache and scratch of a session of the shape
// the caller said it will use (--ctx, --batch, --kv-type; session_count caches), the predictor's
// routers, and a margin for code, stacks and the allocator.
static int64_t headroom_bytes(const mole_model *m) {
  const model_hparams *hp = &m->hp;
  const mole_offload_params *o = &m->offload;
  int64_t ctx = o->session_ctx, batch = o->session_batch;
  model_session_shape(m, &ctx, &batch);
  const int64_t kv_elt = o->session_kv_type == MOLE_KV_F32 ? 4 : 2;
  const int64_t kv = hp->n_layer * ctx * m->loc.n_head_kv * (hp->head_dim + hp->head_dim_v) * kv_elt *
                   MOLE_MAX(o->session_count, 1);
  const int64_t routers = hp->n_layer * hp->n_expert * hp->n_embd * 4;
  return kv + model_scratch_bytes(m, batch, ctx) + routers + ((int64_t)32 << 20);
}

// Bytes a slot of precision p takes in the arena: slots start on
// read-aligned offsets (the sizes already are multiples).
static int64_t slot_span(const experts_store *st, int p) {
  const int64_t a = EXPERTS_IO_ALIGN;
  return ((int64_t)st->slot_bytes[p] + a - 1) / a * a;
}

// Picks resident or tiered and the budget from --expert-budget.
static mole_status choose_budget(experts *x) {
  const mole_offload_params *o = &x->m->offload;
  const experts_store *st = &x->store;
  const int64_t experts_bytes = (int64_t)st->total_bytes[0] + (x->low_in_use ? (int64_t)st->total_bytes[1] : 0);
  char a[32], b[32], c[32], d[32];
  if (o->expert_budget_frac > 0) {
    x->tiered = true;
    // a fraction of what holding every expert (in each precision in use) takes
    const double all = (double)(st->n_layer * st->n_expert) *
                       (double)(st->slot_bytes[0] + (x->low_in_use ? st->slot_bytes[1] : 0));
    x->budget = (int64_t)(o->expert_budget_frac * all);
    return MOLE_OK;
  }
  if (o->expert_budget > 0) {
    x->tiered = true;
    x->budget = o->expert_budget;
    return MOLE_OK;
  }
  if (o->expert_budget == 0) return MOLE_OK;
  // auto: resident when the whole model fits next to the rest of the process
  experts_mem_info mi;
  experts_mem_probe(NULL, &mi);
  // the mapped weights every token reads; the token embeddings are read a
  // row per token (unless the output projection shares them), so their pages
  // need not stay resident
  const mole_model *m = x->m;
  int64_t non_expert = (int64_t)gguf_size(m->gguf) - (int64_t)st->file_bytes;
  if (m->tok_embd.data != m->output.data) non_expert -= (int64_t)(m->tok_embd.row_bytes * (size_t)m->tok_embd.ne1);
  const int64_t head = headroom_bytes(x->m);
  if (mi.available < 0 || non_expert + experts_bytes + head <= mi.available) return MOLE_OK;
  x->tiered = true;
  x->budget = mi.available - non_expert - head;
  mole_log(MOLE_LOG_INFO, "auto expert budget: %s (%s available per %s; non-expert weights read per token %s, headroom %s)",
           experts_fmt_bytes(a, sizeof a, (double)x->budget), experts_fmt_bytes(b, sizeof b, (double)mi.available),
           mi.source, experts_fmt_bytes(c, sizeof c, (double)non_expert), experts_fmt_bytes(d, sizeof d, (double)head));
  // below what a decode step pins at once (n_expert_used experts in each
  // precision in use; open_tiered rejects less) the run could not proceed:
  // take that and say so. A prompt batch needing more of a layer at once is
  // computed in waves (moe_ffn releases computed groups).
  const int64_t H = slot_span(st, 0), Lo = slot_span(st, 1);
  const int64_t floor = x->m->hp.n_expert_used * (H + (x->low_in_use ? Lo : 0));
  if (x->budget < floor) {
    mole_log(MOLE_LOG_WARN, "only %s is left for experts under %s; using the least a token needs (%s: %lld experts%s)",
             experts_fmt_bytes(a, sizeof a, (double)MOLE_MAX(x->budget, 0)), mi.source,
             experts_fmt_bytes(b, sizeof b, (double)floor), (long long)x->m->hp.n_expert_used,
             x->low_in_use ? " in each precision" : "");
    x->budget = floor;
  }
  return MOLE_OK;
}

static mole_status open_tiered(experts *x) {
  const model_hparams *hp = &x->m->hp;
  const int64_t X = hp->n_expert, L = hp->n_layer, K = hp->n_expert_used;
  const experts_store *st = &x->store;
  const int64_t H = slot_span(st, 0), Lo = slot_span(st, 1);
  // one arena for both precisions: never more than every expert in each takes
  int64_t arena = x->budget / EXPERTS_IO_ALIGN * EXPERTS_IO_ALIGN;
  arena = MOLE_MIN(arena, L * X * (H + (x->low_in_use ? Lo : 0)));
  int64_t n[2];
  experts_cache_split(arena, H, Lo, x->low_in_use, &n[0], &n[1]);
  for (int p = 0; p < 2; p++) n[p] = MOLE_MIN(n[p], L * X);
  if (!x->low_in_use) arena = n[0] * H;
  char a[32], b[32], c[32], d[32];
  // a layer of mixed requests pins K copies in either precision at once
  if (n[0] < K || (x->low_in_use && x->budget / (H + Lo) < K)) {
    const double need = (double)K * (double)(st->slot_bytes[0] + (x->low_in_use ? st->slot_bytes[1] : 0));
    return mole_errorf(MOLE_ERR_ARG,
                       "--expert-budget %s is too small: a token pins %lld experts per layer at once, each %s in high "
                       "precision%s%s%s; give at least %s",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)K,
                       experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[0]), x->low_in_use ? " (+" : "",
                       x->low_in_use ? experts_fmt_bytes(c, sizeof c, (double)st->slot_bytes[1]) : "",
                       x->low_in_use ? " in low)" : "", experts_fmt_bytes(d, sizeof d, need));
  }
  mole_status s = experts_cache_init(&x->cache, L, X, n[0], n[1], x->policy, x->weights);
  if (s) return s;
  experts_cache_share(&x->cache, arena, H, Lo);
  x->arena = mole_aligned_alloc(EXPERTS_IO_ALIGN, (size_t)arena);
  if (!x->arena)
    return mole_errorf(MOLE_ERR_NOMEM, "--expert-budget %s: cannot allocate the expert cache (%s)",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget), experts_fmt_bytes(b, sizeof b, (double)arena));
  for (int p = 0; p < 2; p++) x->soft_cap[p] = n[p] / 2;
  x->max_io = 3 * (n[0] + n[1]) + 8;
  x->done = mole_calloc((size_t)x->max_io, sizeof *x->done);
  x->pins = mole_calloc((size_t)(2 * X), sizeof *x->pins);
  x->gstate = mole_calloc((size_t)(2 * X), sizeof *x->gstate);
  if (!x->done || !x->pins || !x->gstate) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  if ((s = experts_io_open(gguf_path(x->m->gguf), x->m->offload.io, x->max_io, &x->io))) return s;
  return MOLE_OK;
}

// Resident compressed experts are checked once, before any kernel reads them
// (tiered ones after each read: experts_get).
static mole_status check_resident(experts *x) {
  const experts_store *st = &x->store;
  for (int p = 0; p < (st->has_low ? 2 : 1); p++) {
    bool blobs = false;
    for (int64_t l = 0; l < st->n_layer; l++)
      for (int j = 0; j < 3; j++) blobs = blobs || st->layout[p][l].type[j] == QT_TQ1;
    for (int64_t l = 0; blobs && l < st->n_layer; l++)
      for (int64_t e = 0; e < st->n_expert; e++) {
        model_tensor v[3];
        experts_store_views(st, p, l, gguf_base(x->m->gguf), st->mat_off[p] + (l * st->n_expert + e) * 3, NULL, v);
        mole_status s = experts_store_check(st, p, l, e, v);
        if (s) return s;
      }
  }
  return MOLE_OK;
}

mole_status experts_open(mole_model *m, experts **out) {
  *out = NULL;
  const mole_offload_params *o = &m->offload;
  if (!(o->t1 >= 0 && o->t1 <= 1 && o->t2 >= o->t1 && o->t2 <= 1))
    return mole_errorf(MOLE_ERR_ARG, "precision thresholds (--t1, --t2): need 0 <= t1 <= t2 <= 1 (got t1 %g, t2 %g)",
                       (double)o->t1, (double)o->t2);
  if (o->io && strcmp(o->io, "uring") && strcmp(o->io, "pread"))
    return mole_errorf(MOLE_ERR_ARG, "--io '%s': expected uring or pread", o->io);
  if (o->prefetch_depth < -1 || o->prefetch_depth > EXPERTS_MAX_DEPTH)
    return mole_errorf(MOLE_ERR_ARG, "--prefetch-depth %d: expected -1 (adaptive), 0 (off) or 1..%d", o->prefetch_depth,
                       EXPERTS_MAX_DEPTH);
  if (o->expert_budget < -1)
    return mole_errorf(MOLE_ERR_ARG, "--expert-budget %lld: expected bytes, 0 (resident) or -1 (auto)",
                       (long long)o->expert_budget);
  if (!(o->expert_budget_frac >= 0 && o->expert_budget_frac <= 1))
    return mole_errorf(MOLE_ERR_ARG, "--expert-budget: a fraction of %g is outside (0, 100%%]", o->expert_budget_frac);
  experts *x = mole_calloc(1, sizeof *x);
  if (!x) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  x->m = m;
  x->t1 = o->t1;
  x->t2 = o->t2;
  x->depth_cfg = o->prefetch_depth;
  x->layer_now = -1;
  mole_status st = experts_policy_parse(o->cache_policy, o->cache_weights, &x->policy, x->weights);
  if (st) {
    mole_error_prefix(st, "%s", o->cache_weights[0] || o->cache_weights[1] || o->cache_weights[2] || o->cache_weights[3]
                                    ? "--cache-policy/--cache-weights: " : "--cache-policy: ");
    goto fail;
  }
  if ((st = experts_store_open(&x->store, m))) goto fail;
  x->low_in_use = x->store.has_low && x->t2 > x->t1;
  const int64_t X = m->hp.n_expert;
  x->tok_cnt = mole_calloc((size_t)X, sizeof *x->tok_cnt);
  x->high_cnt = mole_calloc((size_t)X, sizeof *x->high_cnt);
  x->grp = mole_calloc((size_t)(2 * X), sizeof *x->grp);
  x->planned = mole_calloc((size_t)(2 * X), sizeof *x->planned);
  if (!x->tok_cnt || !x->high_cnt || !x->grp || !x->planned) {
    st = mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
    goto fail;
  }
  if ((st = choose_budget(x))) goto fail;
  if (x->tiered && (st = open_tiered(x))) goto fail;
  if (!x->tiered && (st = check_resident(x))) goto fail;
  experts_store_advise_mode(m->gguf, x->tiered);
  if (o->trace_routing) {
    experts_trace_header h = {m->hp.n_layer, X, m->hp.n_expert_used,
                              {(int64_t)x->store.slot_bytes[0], (int64_t)x->store.slot_bytes[1]}, x->low_in_use};
    if ((st = experts_trace_begin(o->trace_routing, &h, &x->trace))) {
      mole_error_prefix(st, "--trace-routing: ");
      goto fail;
    }
  }
  if ((st = experts_predict_init(x))) goto fail;
  *out = x;
  return MOLE_OK;
fail:
  experts_close(x);
  return st;
}

void experts_close(experts *x) {
  if (!x) return;
  experts_io_close(x->io);  // waits for reads into the arenas
  if (x->trace) experts_trace_end(x->trace, x->m->offload.trace_routing);
  experts_predict_free(x);
  experts_cache_free(&x->cache);
  mole_aligned_free(x->arena);
  experts_store_free(&x->store);
  mole_free(x->done);
  mole_free(x->image_r16);
  mole_free(x->image_off);
  mole_free(x->pins);
  mole_free(x->gstate);
  mole_free(x->tok_cnt);
  mole_free(x->high_cnt);
  mole_free(x->grp);
  mole_free(x->planned);
  mole_free(x);
}

// ---- reads ---------------------------------------------------------------------------
void experts_reap(experts *x, bool wait) {
  const int n = experts_io_reap(x->io, wait, x->done, (int)x->max_io);
  for (int i = 0; i < n; i++) {
    const int p = (int)(x->done[i].tag >> 32);
    const int64_t s = (int64_t)(x->done[i].tag & 0xffffffffu);
    experts_slot *sl = &x->cache.slots[p][s];
    MOLE_ASSERT(sl->state == EXPERTS_SLOT_LOADING && sl->io_pending > 0);
    if (x->done[i].err && !sl->io_err) sl->io_err = x->done[i].err;
    if (--sl->io_pending == 0) {
      sl->state = EXPERTS_SLOT_READY;
      x->n_loading[p]--;
    }
  }
}

// Whether a slot is being read that will be evictable once it lands (not
// hard-pinned: a prefetch); waiting for a pinned one frees nothing.
static bool loading_unpinned(const experts *x) {
  if (x->n_loading[0] + x->n_loading[1] == 0) return false;
  for (int p = 0; p < 2; p++)
    for (int64_t s = 0; s < x->cache.n_slots[p]; s++) {
      const experts_slot *sl = &x->cache.slots[p][s];
      if (sl->state == EXPERTS_SLOT_LOADING && !sl->pinned) return true;
    }
  return false;
}

// A wait for reads: its time, and the bytes the disk delivered meanwhile.
static void stall_begin(experts *x) {
  experts_reap(x, false);  // completions already there arrived before the wait
  x->stall_t0 = mole_time_us();
  x->stall_b0 = experts_io_bytes_done(x->io);
}
static void stall_end(experts *x) {
  x->step.stall_us += mole_time_us() - x->stall_t0;
  x->step.stall_bytes += (int64_t)(experts_io_bytes_done(x->io) - x->stall_b0);
}

mole_status experts_load(experts *x, int p, int64_t layer, int64_t e, int64_t layer_now, bool soft) {
  experts_cache *c = &x->cache;
  int64_t s = experts_cache_victim(c, p, layer_now, !soft);
  // every evictable slot is still being read (prefetches): wait for them to land
  // (in either precision: the pools share the arena)
  while (s < 0 && !soft && loading_unpinned(x)) {
    stall_begin(x);
    experts_reap(x, true);
    stall_end(x);
    s = experts_cache_victim(c, p, layer_now, true);
  }
  if (s < 0) return MOLE_ERR_NOMEM;
  experts_cache_assign(c, p, s, layer, e);
  experts_slot *sl = &c->slots[p][s];
  experts_extent ext[3];
  size_t mb[3];
  const int n = experts_store_extents(&x->store, p, layer, e, ext, mb);
  char *buf = x->arena + experts_cache_offset(c, p, s);
  int64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    mole_status st = experts_io_read(x->io, buf + ext[i].buf_off, (size_t)ext[i].len, ext[i].file_off, (uint64_t)tag_of(p, s), soft);
    MOLE_ASSERT(st == MOLE_OK);  // max_io covers three reads per slot
    bytes += (int64_t)ext[i].len;
  }
  sl->io_pending = n;
  sl->checked = false;
  x->n_loading[p]++;
  x->step.bytes_read += bytes;
  x->step.reads++;
  if (soft) {
    experts_cache_set_soft(c, p, s, true);
    sl->prefetched = true;
    x->step.prefetches++;
  } else {
    x->step.misses[p]++;
    x->step.demand_bytes += bytes;
  }
  return MOLE_OK;
}

// Makes (layer, e) in precision p resident or on its way, pinned until
// experts_release or experts_layer_done. MOLE_ERR_NOMEM (no message: see
// no_slot_error) when no slot can be freed.
static mole_status acquire(experts *x, int64_t layer, int64_t e, int p) {
  experts_cache *c = &x->cache;
  int64_t s = experts_cache_find(c, p, layer, e);
  if (s >= 0) {
    experts_slot *sl = &c->slots[p][s];
    if (sl->io_err && sl->state == EXPERTS_SLOT_READY && !sl->pinned) {
      experts_cache_drop(c, p, s);  // a failed read: try again
      s = -1;
    }
  }
  if (s >= 0) {
    experts_slot *sl = &c->slots[p][s];
    if (sl->state == EXPERTS_SLOT_LOADING) experts_io_promote(x->io, (uint64_t)tag_of(p, s));  // a prefetch now needed
    if (sl->pinned) {
      if (layer == x->layer_now) x->gstate[2 * e + p] = GRP_PINNED;
      return MOLE_OK;
    }
    x->step.hits[p]++;
    if (sl->prefetched) {
      x->step.prefetch_hits[p]++;
      sl->prefetched = false;
    }
    experts_cache_set_soft(c, p, s, false);
  } else {
    if (experts_load(x, p, layer, e, layer, false) != MOLE_OK) return MOLE_ERR_NOMEM;
    s = experts_cache_find(c, p, layer, e);
  }
  c->slots[p][s].pinned = true;
  MOLE_ASSERT(x->n_pins < 2 * c->n_expert);
  x->pins[x->n_pins++] = tag_of(p, s);
  if (layer == x->layer_now) x->gstate[2 * e + p] = GRP_PINNED;
  return MOLE_OK;
}

// The error of an acquire that found no slot.
static mole_status no_slot_error(experts *x, int64_t layer, int64_t e, int p) {
  char a[32], b[32], d[32];
  const experts_store *st = &x->store;
  const int64_t K = x->m->hp.n_expert_used;
  if (x->n_pins > 0)
    return mole_errorf(MOLE_ERR_NOMEM,
                       "--expert-budget %s holds %lld %s-precision experts (%s each) and %lld of layer %lld's are pinned: "
                       "no slot for expert %lld until computed ones are released",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)x->cache.n_slots[p], k_prec[p],
                       experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[p]), (long long)x->n_pins,
                       (long long)layer, (long long)e);
  const double need = (double)K * (double)(st->slot_bytes[0] + (x->low_in_use ? st->slot_bytes[1] : 0));
  return mole_errorf(MOLE_ERR_NOMEM,
                     "--expert-budget %s holds %lld %s-precision experts (%s each), but no slot could be freed for "
                     "expert %lld of layer %lld even with nothing of the layer pinned; raise --expert-budget to at "
                     "least %s",
                     experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)x->cache.n_slots[p], k_prec[p],
                     experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[p]), (long long)e, (long long)layer,
                     experts_fmt_bytes(d, sizeof d, need));
}

// ---- the interface ---------------------------------------------------------------------
void experts_begin_step(experts *x, int64_t n) {
  x->step_open = true;
  if (x->tiered) experts_cache_begin_step(&x->cache, n);
  if (x->trace) experts_trace_write_step(x->trace, x->n_steps, n);
}

void experts_plan(experts *x, int64_t layer, int64_t n, int64_t k, const int32_t *sel, const float *w, uint8_t *prec) {
  const int64_t X = x->m->hp.n_expert;
  if (!x->step_open) experts_begin_step(x, n);
  if (x->tiered) experts_reap(x, false);
  memset(x->tok_cnt, 0, (size_t)X * sizeof *x->tok_cnt);
  memset(x->high_cnt, 0, (size_t)X * sizeof *x->high_cnt);
  memset(x->grp, 0, (size_t)(2 * X) * sizeof *x->grp);
  memset(x->planned, 0, (size_t)(2 * X) * sizeof *x->planned);
  int64_t skips = 0;
  for (int64_t t = 0; t < n; t++) {
    float sum = 0;
    for (int64_t j = 0; j < k; j++) sum += w[t * k + j];
    // unimportance of choice j: the normalised weight ranked above it
    float above = 0;
    for (int64_t j = 0; j < k; j++) {
      const float u = sum > 0 ? above / sum : 0;
      above += w[t * k + j];
      const int32_t e = sel[t * k + j];
      expert_prec p = experts_prec_of(x, u);
      prec[t * k + j] = (uint8_t)p;
      if (p == EXPERT_SKIP) {
        skips++;
        continue;
      }
      x->planned[2 * e + p]++;
      // a cached (or arriving) high-precision copy beats loading a low one
      if (p == EXPERT_LOW && x->tiered && experts_cache_find(&x->cache, EXPERT_HIGH, layer, e) >= 0) p = EXPERT_HIGH;
      prec[t * k + j] = (uint8_t)p;
      x->tok_cnt[e]++;
      x->high_cnt[e] += p == EXPERT_HIGH;
      x->grp[2 * e + p]++;
    }
  }
  x->step.skips += skips;
  if (n == 1) experts_predict_score(x, layer, sel, k);
  if (x->trace) experts_trace_write_layer(x->trace, layer, X, x->planned, skips);
  if (!x->tiered) {
    for (int64_t g = 0; g < 2 * X; g++) x->step.hits[g % 2] += x->grp[g] > 0;
    return;
  }
  x->layer_now = layer;
  x->refill = false;
  for (int64_t g = 0; g < 2 * X; g++) x->gstate[g] = x->grp[g] ? GRP_WAITING_SLOT : GRP_NONE;
  for (int64_t e = 0; e < X; e++)
    if (x->tok_cnt[e]) experts_cache_touch(&x->cache, layer, e, x->tok_cnt[e], x->high_cnt[e]);
  // start every read this layer needs (that slots can be had for) before
  // waiting for any; the groups without a slot keep GRP_WAITING_SLOT
  for (int64_t g = 0; g < 2 * X; g++)
    if (x->grp[g]) (void)acquire(x, layer, g / 2, (int)(g % 2));
  experts_prefetch_start(x, layer);
  experts_io_submit(x->io);
}

// Slots were released: start the reads of the planned groups still without
// one, in group order, as far as slots can be had.
static void refill(experts *x) {
  x->refill = false;
  bool started = false;
  for (int64_t g = 0; g < 2 * x->m->hp.n_expert; g++)
    if (x->gstate[g] == GRP_WAITING_SLOT) started |= acquire(x, x->layer_now, g / 2, (int)(g % 2)) == MOLE_OK;
  if (started) experts_io_submit(x->io);
}

experts_avail experts_ready(experts *x, int64_t layer, int32_t e, expert_prec p) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  if (!x->tiered) return EXPERTS_READY;
  if (layer == x->layer_now && x->refill) refill(x);
  experts_cache *c = &x->cache;
  const int64_t s = experts_cache_find(c, p, layer, e);
  if (s < 0 || !c->slots[p][s].pinned) return EXPERTS_NO_SLOT;
  const experts_slot *sl = &c->slots[p][s];
  if (sl->state == EXPERTS_SLOT_LOADING) experts_reap(x, false);
  return sl->state == EXPERTS_SLOT_LOADING ? EXPERTS_LOADING : EXPERTS_READY;
}

mole_status experts_resident_matrices(experts *x, experts_image_fn fn, void *ctx) {
  if (x->tiered) return MOLE_OK;
  const experts_store *st = &x->store;
  const int64_t L = st->n_layer, X = st->n_expert;
  x->image_off = mole_calloc((size_t)(2 * L * X * 3), sizeof *x->image_off);
  x->image_r16 = mole_calloc((size_t)(2 * L * 3), 1);
  if (!x->image_off || !x->image_r16) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  const uint8_t *base = gguf_base(x->m->gguf);
  for (int p = 0; p < (x->low_in_use ? 2 : 1); p++)
    for (int64_t l = 0; l < L; l++) {
      for (int j = 0; j < 3; j++)  // as the image decides when it packs them
        x->image_r16[(p * L + l) * 3 + j] = quant_r16_preferred(st->layout[p][l].type[j], st->ne1[j]);
      for (int64_t e = x->m->shard.ex0; e < x->m->shard.ex1; e++)  // the experts this process holds
        for (int j = 0; j < 3; j++) {
          const size_t k = (size_t)((l * X + e) * 3 + j);
          const quant_type t = st->layout[p][l].type[j];
          // a blob is copied as one row of bytes (ggml's i8)
          const bool blob = quant_is_blob(t);
          const int64_t bytes = (int64_t)st->layout[p][l].bytes[j];
          x->image_off[(size_t)p * (size_t)(L * X * 3) + k] =
              blob ? fn(ctx, base + st->mat_off[p][k], (size_t)bytes, (quant_type)24, bytes, 1)
                   : fn(ctx, base + st->mat_off[p][k], st->layout[p][l].stride[j], t, st->ne0[j], st->ne1[j]);
        }
    }
  return MOLE_OK;
}

mole_status experts_use_image(experts *x, const uint8_t *image) {
  if (!x->tiered) x->image = image;
  return MOLE_OK;
}

mole_status experts_get(experts *x, int64_t layer, int32_t e, expert_prec p, expert_view *out) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  MOLE_ASSERT(layer >= 0 && layer < x->m->hp.n_layer && e >= 0 && e < x->m->hp.n_expert);
  MOLE_ASSERT(e >= x->m->shard.ex0 && e < x->m->shard.ex1);  // held by this process
  MOLE_ASSERT(p == EXPERT_HIGH || x->store.has_low);
  const experts_store *st = &x->store;
  model_tensor v[3];
  if (!x->tiered) {
    const int64_t k = (layer * st->n_expert + e) * 3;
    if (x->image) {
      const uint64_t *off = x->image_off + (size_t)p * (size_t)(st->n_layer * st->n_expert * 3) + k;
      experts_store_views(st, p, layer, x->image, off, x->image_r16 + (p * st->n_layer + layer) * 3, v);
    } else {
      experts_store_views(st, p, layer, gguf_base(x->m->gguf), st->mat_off[p] + k, NULL, v);
    }
  } else {
    experts_cache *c = &x->cache;
    int64_t s = experts_cache_find(c, p, layer, e);
    if (s < 0 || !c->slots[p][s].pinned) {
      if (acquire(x, layer, e, p) != MOLE_OK) return no_slot_error(x, layer, e, p);
      experts_io_submit(x->io);
      s = experts_cache_find(c, p, layer, e);
    }
    const experts_slot *sl = &c->slots[p][s];
    if (sl->state == EXPERTS_SLOT_LOADING) {
      stall_begin(x);
      while (sl->state == EXPERTS_SLOT_LOADING) {
        MOLE_ASSERT(experts_io_in_flight(x->io) > 0);
        experts_reap(x, true);
      }
      stall_end(x);
    }
    experts_extent ext[3];
    size_t mb[3];
    experts_store_extents(st, p, layer, e, ext, mb);
    if (sl->io_err)
      return mole_errorf(MOLE_ERR_IO, "%s: reading expert %d of layer %lld (%s precision) at file offset %llu: %s",
                         gguf_path(x->m->gguf), e, (long long)layer, k_prec[p], (unsigned long long)ext[0].file_off,
                         strerror(sl->io_err));
    const uint64_t off[3] = {mb[0], mb[1], mb[2]};
    experts_store_views(st, p, layer, x->arena + experts_cache_offset(c, p, s), off, NULL, v);
    if (!sl->checked) {  // compressed matrices are checked once per read before a kernel runs on them
      mole_status cs = experts_store_check(st, p, layer, e, v);
      if (cs) return cs;
      c->slots[p][s].checked = true;
    }
  }
  out->gate = v[0];
  out->up = v[1];
  out->down = v[2];
  return MOLE_OK;
}

void experts_release(experts *x, int64_t layer, int32_t e, expert_prec p) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  if (!x->tiered) return;
  const int64_t s = experts_cache_find(&x->cache, p, layer, e);
  if (s < 0 || !x->cache.slots[p][s].pinned) return;
  x->cache.slots[p][s].pinned = false;
  const int64_t tag = tag_of(p, s);
  for (int64_t i = 0; i < x->n_pins; i++)
    if (x->pins[i] == tag) {
      x->pins[i] = x->pins[--x->n_pins];
      break;
    }
  if (layer != x->layer_now) return;
  x->gstate[2 * e + p] = GRP_RELEASED;
  for (int64_t g = 0; g < 2 * x->m->hp.n_expert && !x->refill; g++) x->refill = x->gstate[g] == GRP_WAITING_SLOT;
}

void experts_layer_done(experts *x, int64_t layer) {
  if (!x->tiered) return;
  for (int64_t i = 0; i < x->n_pins; i++) {
    const int p = (int)(x->pins[i] >> 32);
    x->cache.slots[p][x->pins[i] & 0xffffffff].pinned = false;
  }
  x->n_pins = 0;
  x->layer_now = -1;
  x->refill = false;
  memset(x->gstate, 0, (size_t)(2 * x->m->hp.n_expert) * sizeof *x->gstate);
  experts_prefetch_release(x, layer);
}

static void counts_add(experts_counts *a, const experts_counts *b) {
  for (int p = 0; p < 2; p++) {
    a->hits[p] += b->hits[p];
    a->prefetch_hits[p] += b->prefetch_hits[p];
    a->misses[p] += b->misses[p];
  }
  a->skips += b->skips;
  a->bytes_read += b->bytes_read;
  a->reads += b->reads;
  a->demand_bytes += b->demand_bytes;
  a->stall_us += b->stall_us;
  a->stall_bytes += b->stall_bytes;
  a->prefetches += b->prefetches;
  a->prefetch_unused += b->prefetch_unused;
  a->pred_correct += b->pred_correct;
  a->pred_total += b->pred_total;
}

void experts_step_done(experts *x, int64_t n_tokens) {
  if (x->tiered) {
    experts_prefetch_release(x, -1);  // predictions do not outlive their token
    experts_cache_end_step(&x->cache);
  }
  counts_add(&x->total, &x->step);
  x->last = x->step;
  memset(&x->step, 0, sizeof x->step);
  x->n_steps++;
  x->n_tokens += n_tokens;
  x->step_open = false;
}

void experts_reset_sequence(experts *x) {
  if (x->tiered) experts_cache_reset_sequence(&x->cache);
  if (x->pred_valid) memset(x->pred_valid, 0, (size_t)(x->m->hp.n_layer * EXPERTS_MAX_DEPTH) * sizeof *x->pred_valid);
}
