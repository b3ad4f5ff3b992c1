// The expert provider's front: opening (resident or tiered, the budget),
// the precision plan, get/pin/unpin, prefetches, and the step bookkeeping.
// The slot rules are tier.c, the cache's bookkeeping cache.c, reads io.c,
// the file layout store.c, the predictor predict.c, statistics stats.c.
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "experts/budget.h"
#include "experts/experts_internal.h"
#include "experts/trace.h"

static const char *const k_prec[2] = {"high", "low"};

bool experts_has_low(const experts *x) { return x->store.has_low; }

// ---- opening --------------------------------------------------------------------
// Bytes a slot of precision p takes in the arena: slots start on
// read-aligned offsets (the sizes already are multiples).
static int64_t slot_span(const experts_store *st, int p) {
  const int64_t a = EXPERTS_IO_ALIGN;
  return ((int64_t)st->slot_bytes[p] + a - 1) / a * a;
}

static void slot_spans(const experts_store *st, int64_t out[2]) {
  for (int p = 0; p < 2; p++) out[p] = slot_span(st, p);
}

// Picks resident or tiered and the budget from --expert-budget.
static mole_status choose_budget(experts *x, const experts_config *cfg) {
  const mole_offload_params *o = &x->o;
  const experts_store *st = &x->store;
  int64_t span[2];
  slot_spans(st, span);
  const int64_t experts_bytes = (int64_t)st->total_bytes[0] + (x->low_in_use ? (int64_t)st->total_bytes[1] : 0);
  char a[32], b[32], c[32], d[32];
  if (o->expert_budget_frac > 0) {
    x->tiered = true;
    x->budget = tier_budget_of(o->expert_budget_frac, x->n_layer, x->n_expert, span, x->low_in_use);
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
  // the mapped weights every token reads (the caller's cold bytes, token
  // embeddings read a row per token, need not stay resident); the rest of
  // the process, and the predictor's routers in f32
  const int64_t non_expert = (int64_t)gguf_size(x->gguf) - (int64_t)st->file_bytes - cfg->cold_bytes;
  const int64_t head = cfg->headroom + x->n_layer * x->n_expert * cfg->n_embd * 4;
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
  const int64_t floor = tier_min_budget(x->n_used, span, x->low_in_use);
  if (x->budget < floor) {
    mole_log(MOLE_LOG_WARN, "only %s is left for experts under %s; using the least a token needs (%s: %lld experts%s)",
             experts_fmt_bytes(a, sizeof a, (double)MOLE_MAX(x->budget, 0)), mi.source,
             experts_fmt_bytes(b, sizeof b, (double)floor), (long long)x->n_used,
             x->low_in_use ? " in each precision" : "");
    x->budget = floor;
  }
  return MOLE_OK;
}

// ---- reads ---------------------------------------------------------------------------
void experts_reap(experts *x, bool wait) {
  const int n = experts_io_reap(x->io, wait, x->done, (int)x->max_io);
  for (int i = 0; i < n; i++) {
    const int p = (int)(x->done[i].tag >> 32);
    const int64_t s = (int64_t)(x->done[i].tag & 0xffffffffu);
    experts_slot *sl = &x->tier.c.slots[p][s];
    MOLE_ASSERT(sl->state == EXPERTS_SLOT_LOADING && sl->io_pending > 0);
    if (x->done[i].err && !sl->io_err) sl->io_err = x->done[i].err;
    if (--sl->io_pending == 0) tier_landed(&x->tier, p, s);
  }
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

// The tier's hooks: start the reads of (layer, e) in precision p into slot s
// (prefetches in the background); wait for one; hurry a prefetch now needed.
static void hook_read(void *ctx, int p, int64_t s, int64_t layer, int64_t e, bool prefetch) {
  experts *x = ctx;
  experts_extent ext[3];
  size_t mb[3];
  const int n = experts_store_extents(&x->store, p, layer, e, ext, mb);
  char *buf = x->arena + experts_cache_offset(&x->tier.c, p, s);
  int64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    mole_status st = experts_io_read(x->io, buf + ext[i].buf_off, (size_t)ext[i].len, ext[i].file_off,
                                     (uint64_t)tier_tag(p, s), prefetch);
    MOLE_ASSERT(st == MOLE_OK);  // max_io covers three reads per slot
    bytes += (int64_t)ext[i].len;
  }
  experts_slot *sl = &x->tier.c.slots[p][s];
  sl->io_pending = n;
  sl->checked = false;
  x->step.bytes_read += bytes;
  x->step.reads++;
  if (!prefetch) x->step.demand_bytes += bytes;
}

static void hook_wait(void *ctx) {
  experts *x = ctx;
  stall_begin(x);
  experts_reap(x, true);
  stall_end(x);
}

static void hook_need(void *ctx, int p, int64_t s) {
  experts *x = ctx;
  experts_io_promote(x->io, (uint64_t)tier_tag(p, s));
}

static mole_status open_tiered(experts *x) {
  const experts_store *st = &x->store;
  tier_params tp = {x->n_layer, x->n_expert, x->n_used, {0, 0}, x->low_in_use, x->budget, EXPERTS_IO_ALIGN, x->policy,
                    {0}};
  slot_spans(st, tp.slot_bytes);
  memcpy(tp.weights, x->weights, sizeof tp.weights);
  const tier_hooks hooks = {x, hook_read, hook_wait, hook_need, NULL};
  char a[32], b[32], c[32], d[32];
  mole_status s = tier_init(&x->tier, &tp, &hooks, &x->step);
  if (s == MOLE_ERR_ARG) {
    const int64_t sb[2] = {(int64_t)st->slot_bytes[0], (int64_t)st->slot_bytes[1]};
    return mole_errorf(MOLE_ERR_ARG,
                       "--expert-budget %s is too small: a token pins %lld experts per layer at once, each %s in high "
                       "precision%s%s%s; give at least %s",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)x->n_used,
                       experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[0]), x->low_in_use ? " (+" : "",
                       x->low_in_use ? experts_fmt_bytes(c, sizeof c, (double)st->slot_bytes[1]) : "",
                       x->low_in_use ? " in low)" : "",
                       experts_fmt_bytes(d, sizeof d, (double)tier_min_budget(x->n_used, sb, x->low_in_use)));
  }
  if (s) return s;
  x->arena = mole_aligned_alloc(EXPERTS_IO_ALIGN, (size_t)x->tier.arena);
  if (!x->arena)
    return mole_errorf(MOLE_ERR_NOMEM, "--expert-budget %s: cannot allocate the expert cache (%s)",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget),
                       experts_fmt_bytes(b, sizeof b, (double)x->tier.arena));
  x->max_io = 3 * (x->tier.c.n_slots[0] + x->tier.c.n_slots[1]) + 8;
  x->done = mole_calloc((size_t)x->max_io, sizeof *x->done);
  if (!x->done) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  return experts_io_open(gguf_path(x->gguf), x->o.io, x->max_io, &x->io);
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
        quant_matrix v[3];
        experts_store_views(st, p, l, gguf_base(x->gguf), st->mat_off[p] + (l * st->n_expert + e) * 3, NULL, v);
        mole_status s = experts_store_check(st, p, l, e, v);
        if (s) return s;
      }
  }
  return MOLE_OK;
}

static bool hook_cached(void *ctx, int64_t layer, int64_t e, expert_prec p) {
  return tier_cached(&((experts *)ctx)->tier, layer, e, p);
}

// The predictor, when prefetching is on (tiered) or predictions are traced.
static mole_status open_predictor(experts *x, const experts_config *cfg) {
  if (x->depth_cfg == 0 || x->n_layer < 2 || (!x->tiered && !x->trace)) return MOLE_OK;
  const experts_predictor_config pc = {
      x->n_layer, x->n_expert, x->n_used, cfg->n_embd, x->depth_cfg,
      x->tiered ? x->tier.c.n_slots[0] : x->n_layer * x->n_expert, x->tiered, x->t1, x->t2, x->low_in_use,
      cfg->routers, cfg->pool, x->tiered ? hook_cached : NULL, x};
  x->pf = mole_malloc((size_t)(EXPERTS_MAX_DEPTH * x->n_used) * sizeof *x->pf);
  if (!x->pf) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory for the predictor");
  return experts_predictor_new(&pc, &x->pred);
}

mole_status experts_open(const experts_config *cfg, experts **out) {
  *out = NULL;
  const mole_offload_params *o = &cfg->offload;
  MOLE_ASSERT(cfg->n_layer > 0 && cfg->n_expert > 0 && cfg->n_expert_used > 0 && cfg->n_expert_used <= cfg->n_expert);
  MOLE_ASSERT(cfg->ex0 >= 0 && cfg->ex0 <= cfg->ex1 && cfg->ex1 <= cfg->n_expert);
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
  if (cfg->n_expert_used < 1 || cfg->n_expert_used > MOLE_MIN(cfg->n_expert, (int64_t)EXPERTS_MAX_USED))
    return mole_errorf(MOLE_ERR_ARG, "experts: %lld experts per token of %lld (at most %d)",
                       (long long)cfg->n_expert_used, (long long)cfg->n_expert, EXPERTS_MAX_USED);
  experts *x = mole_calloc(1, sizeof *x);
  if (!x) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  x->gguf = cfg->gguf;
  x->n_layer = cfg->n_layer;
  x->n_expert = cfg->n_expert;
  x->n_used = cfg->n_expert_used;
  x->ex0 = cfg->ex0;
  x->ex1 = cfg->ex1;
  x->o = *o;
  x->t1 = o->t1;
  x->t2 = o->t2;
  x->depth_cfg = o->prefetch_depth;
  x->pf_layer = -1;
  mole_status st = experts_policy_parse(o->cache_policy, o->cache_weights, &x->policy, x->weights);
  if (st) {
    mole_error_prefix(st, "%s", o->cache_weights[0] || o->cache_weights[1] || o->cache_weights[2] || o->cache_weights[3]
                                    ? "--cache-policy/--cache-weights: " : "--cache-policy: ");
    goto fail;
  }
  if ((st = experts_store_open(&x->store, cfg))) goto fail;
  x->low_in_use = x->store.has_low && x->t2 > x->t1;
  const int64_t X = x->n_expert;
  x->grp = mole_calloc((size_t)(2 * X), sizeof *x->grp);
  x->planned = mole_calloc((size_t)(2 * X), sizeof *x->planned);
  if (!x->grp || !x->planned) {
    st = mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
    goto fail;
  }
  if ((st = choose_budget(x, cfg))) goto fail;
  if (x->tiered && (st = open_tiered(x))) goto fail;
  if (!x->tiered && (st = check_resident(x))) goto fail;
  experts_store_advise_mode(x->gguf, x->tiered);
  if (o->trace_routing) {
    experts_trace_header h = {x->n_layer, X, x->n_used, {0, 0}, x->low_in_use, EXPERTS_IO_ALIGN};
    slot_spans(&x->store, h.slot_bytes);
    if ((st = experts_trace_begin(o->trace_routing, &h, &x->trace))) {
      mole_error_prefix(st, "--trace-routing: ");
      goto fail;
    }
  }
  if ((st = open_predictor(x, cfg))) goto fail;
  *out = x;
  return MOLE_OK;
fail:
  experts_close(x);
  return st;
}

void experts_close(experts *x) {
  if (!x) return;
  experts_io_close(x->io);  // waits for reads into the arenas
  if (x->trace) experts_trace_end(x->trace, x->o.trace_routing);
  experts_predictor_free(x->pred);
  mole_free(x->pf);
  tier_free(&x->tier);
  mole_aligned_free(x->arena);
  experts_store_free(&x->store);
  mole_free(x->done);
  mole_free(x->image_r16);
  mole_free(x->image_off);
  mole_free(x->grp);
  mole_free(x->planned);
  mole_free(x);
}

// The error of an acquire that found no slot.
static mole_status no_slot_error(experts *x, int64_t layer, int64_t e, int p) {
  char a[32], b[32], d[32];
  const experts_store *st = &x->store;
  const tier *t = &x->tier;
  if (t->n_pins > 0)
    return mole_errorf(MOLE_ERR_NOMEM,
                       "--expert-budget %s holds %lld %s-precision experts (%s each) and %lld of layer %lld's are pinned: "
                       "no slot for expert %lld until computed ones are released",
                       experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)t->c.n_slots[p], k_prec[p],
                       experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[p]), (long long)t->n_pins,
                       (long long)layer, (long long)e);
  const int64_t sb[2] = {(int64_t)st->slot_bytes[0], (int64_t)st->slot_bytes[1]};
  return mole_errorf(MOLE_ERR_NOMEM,
                     "--expert-budget %s holds %lld %s-precision experts (%s each), but no slot could be freed for "
                     "expert %lld of layer %lld even with nothing of the layer pinned; raise --expert-budget to at "
                     "least %s",
                     experts_fmt_bytes(a, sizeof a, (double)x->budget), (long long)t->c.n_slots[p], k_prec[p],
                     experts_fmt_bytes(b, sizeof b, (double)st->slot_bytes[p]), (long long)e, (long long)layer,
                     experts_fmt_bytes(d, sizeof d, (double)tier_min_budget(x->n_used, sb, x->low_in_use)));
}

// ---- the interface ---------------------------------------------------------------------
// Opens a step of n tokens (the first plan or predict of a forward call).
static void begin_step(experts *x, int64_t n) {
  x->step_open = true;
  if (x->tiered) tier_begin_step(&x->tier, n);
  if (x->trace) experts_trace_write_step(x->trace, x->n_steps, n);
}

// Starts the prefetches the last prediction asked for, if it was made for
// this layer: after the layer's demand reads (io.c issues them behind those).
static void prefetch_start(experts *x, int64_t layer) {
  bool any = false;
  for (int64_t i = 0; i < x->n_pf && !any; i++) any = x->pf[i].prefetch;
  if (x->pf_layer == layer && any) {
    experts_reap(x, false);
    for (int64_t i = 0; i < x->n_pf; i++)
      if (x->pf[i].prefetch) tier_prefetch(&x->tier, layer, x->pf[i].layer, x->pf[i].expert, (expert_prec)x->pf[i].prec);
  }
  x->n_pf = 0;
}

void experts_plan(experts *x, int64_t layer, int64_t n, int64_t k, const int32_t *sel, const float *w, uint8_t *prec) {
  const int64_t X = x->n_expert;
  if (!x->step_open) begin_step(x, n);
  if (x->tiered) experts_reap(x, false);
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
      expert_prec p = experts_prec_of(x->t1, x->t2, x->low_in_use, u);
      prec[t * k + j] = (uint8_t)p;
      if (p == EXPERT_SKIP) {
        skips++;
        continue;
      }
      x->planned[2 * e + p]++;
      if (x->tiered) p = tier_serve_prec(&x->tier, layer, e, p);
      prec[t * k + j] = (uint8_t)p;
      x->grp[2 * e + p]++;
    }
  }
  x->step.skips += skips;
  if (n == 1 && x->pred) experts_predictor_score(x->pred, layer, sel, k, &x->step);
  if (x->trace) experts_trace_write_layer(x->trace, layer, X, x->planned, skips);
  if (!x->tiered) {
    for (int64_t g = 0; g < 2 * X; g++) x->step.hits[g % 2] += x->grp[g] > 0;
    x->n_pf = 0;
    return;
  }
  // every read this layer needs that slots can be had for, then the prefetches
  tier_begin_layer(&x->tier, layer, x->grp);
  prefetch_start(x, layer);
  experts_io_submit(x->io);
}

experts_avail experts_ready(experts *x, int64_t layer, int32_t e, expert_prec p) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  if (!x->tiered) return EXPERTS_READY;
  tier *t = &x->tier;
  // slots were released: start the reads of the groups still without one
  if (layer == t->layer_now && t->refill && tier_refill(t)) experts_io_submit(x->io);
  const int64_t s = tier_find(t, p, layer, e);
  if (s < 0 || !t->c.slots[p][s].pinned) return EXPERTS_NO_SLOT;
  const experts_slot *sl = &t->c.slots[p][s];
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
  const uint8_t *base = gguf_base(x->gguf);
  for (int p = 0; p < (x->low_in_use ? 2 : 1); p++)
    for (int64_t l = 0; l < L; l++) {
      for (int j = 0; j < 3; j++)  // as the image decides when it packs them
        x->image_r16[(p * L + l) * 3 + j] = quant_r16_preferred(st->layout[p][l].type[j], st->ne1[j]);
      for (int64_t e = x->ex0; e < x->ex1; e++)  // the experts this process holds
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
  MOLE_ASSERT(layer >= 0 && layer < x->n_layer && e >= 0 && e < x->n_expert);
  MOLE_ASSERT(e >= x->ex0 && e < x->ex1);  // held by this process
  MOLE_ASSERT(p == EXPERT_HIGH || x->store.has_low);
  const experts_store *st = &x->store;
  quant_matrix v[3];
  if (!x->tiered) {
    const int64_t k = (layer * st->n_expert + e) * 3;
    if (x->image) {
      const uint64_t *off = x->image_off + (size_t)p * (size_t)(st->n_layer * st->n_expert * 3) + k;
      experts_store_views(st, p, layer, x->image, off, x->image_r16 + (p * st->n_layer + layer) * 3, v);
    } else {
      experts_store_views(st, p, layer, gguf_base(x->gguf), st->mat_off[p] + k, NULL, v);
    }
  } else {
    tier *t = &x->tier;
    int64_t s = tier_find(t, p, layer, e);
    if (s < 0 || !t->c.slots[p][s].pinned) {
      if (tier_acquire(t, layer, e, p) != MOLE_OK) return no_slot_error(x, layer, e, p);
      experts_io_submit(x->io);
      s = tier_find(t, p, layer, e);
    }
    experts_slot *sl = &t->c.slots[p][s];
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
                         gguf_path(x->gguf), e, (long long)layer, k_prec[p], (unsigned long long)ext[0].file_off,
                         strerror(sl->io_err));
    const uint64_t off[3] = {mb[0], mb[1], mb[2]};
    experts_store_views(st, p, layer, x->arena + experts_cache_offset(&t->c, p, s), off, NULL, v);
    if (!sl->checked) {  // compressed matrices are checked once per read before a kernel runs on them
      mole_status cs = experts_store_check(st, p, layer, e, v);
      if (cs) return cs;
      sl->checked = true;
    }
  }
  out->gate = v[0];
  out->up = v[1];
  out->down = v[2];
  return MOLE_OK;
}

void experts_release(experts *x, int64_t layer, int32_t e, expert_prec p) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  if (x->tiered) tier_release(&x->tier, layer, e, p);
}

void experts_layer_done(experts *x, int64_t layer) {
  if (x->tiered) tier_layer_done(&x->tier, layer);
}

void experts_predict(experts *x, int64_t layer, const float *h) {
  if (!x->pred) return;
  if (!x->step_open) {  // the forward pass predicts for one token only
    begin_step(x, 1);
    experts_predictor_token(x->pred, x->n_tokens, &x->last);
  }
  x->n_pf = experts_predictor_run(x->pred, layer, h, x->pf);
  x->pf_layer = layer;
  if (x->trace) experts_trace_write_pred(x->trace, layer, x->pf, x->n_pf);
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
  if (x->tiered) tier_step_done(&x->tier);
  counts_add(&x->total, &x->step);
  x->last = x->step;
  memset(&x->step, 0, sizeof x->step);
  x->n_steps++;
  x->n_tokens += n_tokens;
  x->step_open = false;
}

void experts_reset_sequence(experts *x) {
  if (x->tiered) tier_reset_sequence(&x->tier);
  if (x->pred) experts_predictor_reset(x->pred);
}
