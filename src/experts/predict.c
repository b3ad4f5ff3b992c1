// The predictor: the routers of layers l+1..l+p applied to layer l's gate
// input in one stacked matmul (every router is kept in f32 as one
// [n_layer][n_expert][n_embd] array, so the rows of layers l+1..l+p are
// contiguous), top-k per predicted layer, the precision the plan would give,
// and prefetches of what is not in RAM yet. Predictions are scored when the
// predicted layer is routed.
//
// Prefetching an expert that is not in RAM costs one read and (if unused) an
// eviction; it pays when the prediction is used and the read overlaps
// compute that would otherwise leave the disk idle. When decode is bound by
// the disk, every wrong prefetch lengthens the token, and the gain is capped
// by the compute time it can hide, so whether prefetch pays depends on the
// model's predictability, the budget and the machine. With an adaptive depth
// (-1) the predictor therefore measures it: a round runs PF_PROBE_TOKENS
// decode tokens with prefetch, then without (see pf_adapt), then
// PF_RUN_TOKENS with whichever was faster per token (median token time;
// prefetch must win by 5%), twice as many each time the probe agrees with
// the last one, up to PF_RUN_MAX, and starts again. It also keeps measuring
// how often a predicted expert that was not in RAM is then used, for each
// distance and rank of the prediction (moving averages, also while it does
// not prefetch), and prefetches only the predictions whose kind is used at
// least PF_USEFUL_MIN of the time (on random-weight models the next layer's
// top-1 prediction is used ~88% of the time, its second ~60%: a wrong
// prefetch also evicts a useful expert); a kind is measured PF_USEFUL_SAMPLES
// times before it is prefetched at all. Prefetch reads are background
// requests: io.c issues them only while no demand read waits, a few chunks
// at a time.
#include <math.h>
#include <string.h>

#include "base/pool.h"
#include "experts/experts_internal.h"
#include "model/ops.h"
#include "experts/trace.h"

#define PF_USEFUL_MIN 0.75
#define PF_USEFUL_SAMPLES 8  // a kind of prediction is prefetched once measured this often
#define PF_USEFUL_ALPHA (1.0 / 64)
#define PF_PROBE_TOKENS 5
#define PF_SAMPLES 16  // token times kept per side of a probe (>= 2 * PF_PROBE_TOKENS)
#define PF_ON_MARGIN 0.95  // prefetch must be 5% faster (median token) to be kept: it is the riskier mode
#define PF_BYTES_MARGIN 1.03  // ... and, when decoding mostly waits on the disk, read at most 3% more per token
#define PF_RUN_TOKENS 64
#define PF_RUN_MAX 1024
enum { PF_PROBE_ON, PF_PROBE_AFTER, PF_PROBE_OFF, PF_RUN };

mole_status experts_predict_init(experts *x) {
  const model_hparams *hp = &x->m->hp;
  const int64_t L = hp->n_layer, X = hp->n_expert, E = hp->n_embd, K = hp->n_expert_used;
  x->depth = 0;
  // resident mode predicts only to record the trace (and score it)
  if (x->depth_cfg == 0 || L < 2 || (!x->tiered && !x->trace)) return MOLE_OK;
  if (x->depth_cfg > 0) {
    x->depth = x->depth_cfg;
  } else {
    // adaptive: the layers whose predicted experts fit in a quarter of the
    // high pool, at most 2 (accuracy falls with the distance)
    const int64_t slots = x->tiered ? x->cache.n_slots[0] : L * X;
    x->depth = (int)MOLE_MAX(1, MOLE_MIN(2, slots / (4 * K)));
  }
  x->routers = mole_aligned_alloc(64, (size_t)(L * X * E) * sizeof *x->routers);
  x->pred_logits = mole_malloc((size_t)(EXPERTS_MAX_DEPTH * X) * sizeof *x->pred_logits);
  x->pred = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH * K), sizeof *x->pred);
  x->pred_valid = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH), sizeof *x->pred_valid);
  x->pred_uncached = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH * K), sizeof *x->pred_uncached);
  x->pf_useful = 1.0;  // optimistic until measured
  x->pf_useful_at = mole_calloc((size_t)(EXPERTS_MAX_DEPTH * K), sizeof *x->pf_useful_at);
  x->pf_useful_n = mole_calloc((size_t)(EXPERTS_MAX_DEPTH * K), sizeof *x->pf_useful_n);
  x->pf_on = true;
  x->pf_phase = PF_PROBE_ON;
  x->pf_left = PF_PROBE_TOKENS;
  x->pf_run = PF_RUN_TOKENS / 2;  // an agreeing first probe runs PF_RUN_TOKENS
  x->pf_pending = mole_malloc((size_t)(EXPERTS_MAX_DEPTH * K) * sizeof *x->pf_pending);
  if (!x->routers || !x->pred_logits || !x->pred || !x->pred_valid || !x->pred_uncached || !x->pf_pending ||
      !x->pf_useful_at || !x->pf_useful_n)
    return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory for the predictor's %lld routers", (long long)L);
  void *row = mole_malloc((size_t)E * sizeof(float));  // a row of any type
  if (!row) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory for the predictor");
  for (int64_t l = 0; l < L; l++) {
    const model_tensor *g = &x->m->layers[l].gate_inp;
    const quant_traits *tr = quant_traits_of(g->type);
    for (int64_t r = 0; r < X; r++) {
      const void *src = (const char *)g->data + (size_t)r * g->row_bytes;
      if (g->layout == QL_R16) {  // the row back in GGUF layout
        quant_r16_row(g->type, g->data, E, X, r, row);
        src = row;
      }
      tr->to_float(src, x->routers + (l * X + r) * E, E);
    }
  }
  mole_free(row);
  return MOLE_OK;
}

void experts_predict_free(experts *x) {
  mole_aligned_free(x->routers);
  mole_free(x->pred_logits);
  mole_free(x->pred);
  mole_free(x->pred_valid);
  mole_free(x->pred_uncached);
  mole_free(x->pf_pending);
  mole_free(x->pf_useful_at);
  mole_free(x->pf_useful_n);
}

typedef struct logits_job {
  const float *w;  // [rows][n]
  const float *h;  // [n]
  float *y;        // [rows]
  int64_t rows, n;
} logits_job;

static void logits_worker(void *ctx, int ith, int nth) {
  const logits_job *j = ctx;
  int64_t r0, r1;
  mole_split(j->rows, ith, nth, &r0, &r1);
  const quant_traits *f32 = quant_traits_of(QT_F32);
  for (int64_t r = r0; r < r1; r++) f32->vec_dot(j->n, &j->y[r], j->w + r * j->n, j->h);
}

static double median(double *v, int64_t n) {
  if (n <= 0) return 0;
  for (int64_t i = 1; i < n; i++)  // insertion sort: n <= PF_SAMPLES
    for (int64_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
      const double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool experts_prefetch_won(experts_probe_side *with, experts_probe_side *without) {
  if (with->n == 0 || without->n == 0) return false;
  double t_off = 0;
  for (int64_t i = 0; i < without->n; i++) t_off += without->us[i];
  const double on = median(with->us, with->n), off = median(without->us, without->n);
  mole_log(MOLE_LOG_DEBUG, "prefetch probe: %.1f ms/token with (and after), %.1f without", on / 1e3, off / 1e3);
  // token times are noisy (the disk drifts); bytes are not: while decoding
  // waits on the disk, a prefetch that reads more per token cannot be faster
  const bool disk_bound = without->stall_us > 0.5 * t_off;
  const double b_on = with->bytes / (double)with->n, b_off = without->bytes / (double)without->n;
  return on < PF_ON_MARGIN * off && !(disk_bound && b_on > PF_BYTES_MARGIN * b_off);
}

// Adaptive prefetch: called as each decode token begins; the time since the
// previous one began is that token's, when nothing else ran in between.
// A probe runs PF_PROBE_TOKENS tokens with prefetching, as many after it
// without (they pay for what it did: experts it evicted for predictions that
// went unused), then as many without as the baseline (experts_prefetch_won
// judges). A few tokens' times are noisy, so prefetching is kept only from
// its second win in a row.
static void pf_adapt(experts *x) {
  if (x->depth_cfg != -1 || !x->tiered) return;
  const int64_t now = mole_time_us();
  if (x->pf_t_token > 0 && x->n_tokens == x->pf_tokens_then + 1) {
    const int side = x->pf_phase == PF_PROBE_OFF ? 0 : 1;
    if (x->pf_phase != PF_RUN && x->pf_n[side] < PF_SAMPLES) {
      x->pf_samp[side][x->pf_n[side]++] = (double)(now - x->pf_t_token);
      x->pf_bytes[side] += (double)x->last.bytes_read;
      x->pf_stall[side] += (double)x->last.stall_us;
    }
    x->pf_tokens_on += x->pf_on;
    if (--x->pf_left <= 0) {
      x->pf_left = PF_PROBE_TOKENS;
      if (x->pf_phase == PF_PROBE_ON) {
        x->pf_phase = PF_PROBE_AFTER;
        x->pf_on = false;
      } else if (x->pf_phase == PF_PROBE_AFTER) {
        x->pf_phase = PF_PROBE_OFF;
      } else if (x->pf_phase == PF_PROBE_OFF) {
        experts_probe_side with = {x->pf_samp[1], x->pf_n[1], x->pf_bytes[1], x->pf_stall[1]};
        experts_probe_side without = {x->pf_samp[0], x->pf_n[0], x->pf_bytes[0], x->pf_stall[0]};
        const bool was_on = x->pf_wins >= 2;
        x->pf_wins = experts_prefetch_won(&with, &without) ? x->pf_wins + 1 : 0;
        x->pf_on = x->pf_wins >= 2;
        x->pf_phase = PF_RUN;
        x->pf_run = x->pf_on == was_on ? MOLE_MIN(2 * x->pf_run, PF_RUN_MAX) : PF_RUN_TOKENS;
        x->pf_left = x->pf_run;
        for (int k = 0; k < 2; k++) x->pf_n[k] = 0, x->pf_bytes[k] = x->pf_stall[k] = 0;
      } else {
        x->pf_phase = PF_PROBE_ON;
        x->pf_on = true;
      }
    }
  }
  x->pf_t_token = now;
  x->pf_tokens_then = x->n_tokens;
}

void experts_predict(experts *x, int64_t layer, const float *h) {
  if (x->depth == 0) return;
  if (!x->step_open) {  // the forward pass predicts for one token only
    experts_begin_step(x, 1);
    pf_adapt(x);
  }
  const model_hparams *hp = &x->m->hp;
  const int64_t L = hp->n_layer, X = hp->n_expert, E = hp->n_embd, K = hp->n_expert_used;
  const int64_t d_max = MOLE_MIN((int64_t)x->depth, L - 1 - layer);
  x->n_pf_pending = 0;
  x->pf_layer = layer;
  if (d_max <= 0) return;
  logits_job job = {x->routers + (layer + 1) * X * E, h, x->pred_logits, d_max * X, E};
  if (job.rows * E >= 65536) mole_pool_run(x->m->pool, logits_worker, &job);
  else logits_worker(&job, 0, 1);
  for (int64_t d = 1; d <= d_max; d++) {
    const int64_t target = layer + d;
    float *p = x->pred_logits + (d - 1) * X;
    float mx = -INFINITY;
    for (int64_t e = 0; e < X; e++) mx = p[e] > mx ? p[e] : mx;
    for (int64_t e = 0; e < X; e++) p[e] = expf(p[e] - mx);  // unnormalised: only ratios matter below
    int32_t *sel = x->pred + (target * EXPERTS_MAX_DEPTH + d - 1) * K;
    float wsum = 0, w[64];
    uint8_t prec[64];
    MOLE_ASSERT(K <= 64);
    ops_topk(p, X, K, sel, w);
    for (int64_t k = 0; k < K; k++) wsum += w[k];
    x->pred_valid[target * EXPERTS_MAX_DEPTH + d - 1] = true;
    bool *unc = x->pred_uncached + (target * EXPERTS_MAX_DEPTH + d - 1) * K;
    const double *useful = x->pf_useful_at + (d - 1) * K;
    const int64_t *useful_n = x->pf_useful_n + (d - 1) * K;
    float above = 0;
    for (int64_t k = 0; k < K; k++) {
      const expert_prec pr = experts_prec_of(x, wsum > 0 ? above / wsum : 0);
      above += w[k];
      prec[k] = (uint8_t)pr;
      unc[k] = false;
      if (pr == EXPERT_SKIP || !x->tiered) continue;
      unc[k] = experts_cache_find(&x->cache, pr, target, sel[k]) < 0 &&
               (pr != EXPERT_LOW || experts_cache_find(&x->cache, EXPERT_HIGH, target, sel[k]) < 0);
      if (x->depth_cfg > 0 || (x->pf_on && useful_n[k] >= PF_USEFUL_SAMPLES && useful[k] >= PF_USEFUL_MIN))
        x->pf_pending[x->n_pf_pending++] = (target * X + sel[k]) * 2 + pr;
    }
    if (x->trace) experts_trace_write_pred(x->trace, layer, target, K, sel, prec);
  }
}

void experts_predict_score(experts *x, int64_t layer, const int32_t *sel, int64_t k) {
  if (!x->pred_valid) return;
  for (int d = 0; d < EXPERTS_MAX_DEPTH; d++) {
    bool *v = &x->pred_valid[layer * EXPERTS_MAX_DEPTH + d];
    if (!*v) continue;
    *v = false;
    const int32_t *pr = x->pred + (layer * EXPERTS_MAX_DEPTH + d) * k;
    const bool *unc = x->pred_uncached + (layer * EXPERTS_MAX_DEPTH + d) * k;
    int64_t ok = 0;
    for (int64_t i = 0; i < k; i++) {
      bool used = false;
      for (int64_t j = 0; j < k; j++) used = used || pr[i] == sel[j];
      ok += used;
      if (!unc[i]) continue;
      x->pf_useful += PF_USEFUL_ALPHA * ((used ? 1.0 : 0.0) - x->pf_useful);
      // the mean of the samples so far, a moving average once there are enough
      double *u = &x->pf_useful_at[d * k + i];
      const int64_t nu = ++x->pf_useful_n[d * k + i];
      *u += MOLE_MAX(PF_USEFUL_ALPHA, 1.0 / (double)nu) * ((used ? 1.0 : 0.0) - *u);
    }
    x->step.pred_correct += ok;
    x->step.pred_total += k;
    x->pred_correct_at[d] += ok;
    x->pred_total_at[d] += k;
  }
}

void experts_prefetch_start(experts *x, int64_t layer) {
  if (x->pf_layer != layer || x->n_pf_pending == 0) return;
  const int64_t X = x->m->hp.n_expert;
  experts_cache *c = &x->cache;
  experts_reap(x, false);
  for (int64_t i = 0; i < x->n_pf_pending; i++) {
    const int p = (int)(x->pf_pending[i] % 2);
    const int64_t target = x->pf_pending[i] / 2 / X, e = x->pf_pending[i] / 2 % X;
    if (p == EXPERT_LOW && experts_cache_find(c, EXPERT_HIGH, target, e) >= 0) continue;  // the plan will take it
    const int64_t s = experts_cache_find(c, p, target, e);
    if (s >= 0) {
      // already here: keep it until its layer runs
      if (!c->slots[p][s].pinned && c->n_soft[p] < x->soft_cap[p]) experts_cache_set_soft(c, p, s, true);
      continue;
    }
    if (c->n_soft[p] >= x->soft_cap[p]) continue;
    (void)experts_load(x, p, target, e, layer, true);  // no free slot: no prefetch
  }
  x->n_pf_pending = 0;
}

void experts_prefetch_release(experts *x, int64_t layer) {
  experts_cache *c = &x->cache;
  for (int p = 0; p < 2; p++) {
    if (c->n_soft[p] == 0) continue;
    for (int64_t s = 0; s < c->n_slots[p]; s++) {
      experts_slot *sl = &c->slots[p][s];
      if (!sl->soft || (layer >= 0 && sl->layer != layer)) continue;
      experts_cache_set_soft(c, p, s, false);
      if (sl->prefetched) {
        x->step.prefetch_unused++;
        sl->prefetched = false;
      }
    }
  }
}
