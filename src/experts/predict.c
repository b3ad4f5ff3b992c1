// The predictor (predict.h): the routers of layers l+1..l+p applied to layer
// l's gate input in one stacked matmul (every router is kept in f32 as one
// [n_layer][n_expert][n_embd] array, so the rows of layers l+1..l+p are
// contiguous), top-k per predicted layer, the precision the plan would give,
// and which of them to prefetch (the provider reads them). Predictions are
// scored when the predicted layer is routed.
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
#include "experts/predict.h"

#include <math.h>
#include <string.h>

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

struct experts_predictor {
  experts_predictor_config cfg;  // routers NULL after creation
  int depth;                   // layers predicted ahead
  float *routers;              // [n_layer][n_expert][n_embd] every router in f32 (stacked gates)
  float *logits;               // [EXPERTS_MAX_DEPTH*n_expert]
  int32_t *pred;               // [n_layer][EXPERTS_MAX_DEPTH][n_used] experts predicted for a layer, by distance
  bool *valid;                 // [n_layer][EXPERTS_MAX_DEPTH]
  bool *uncached;              // [n_layer][EXPERTS_MAX_DEPTH][n_used] not in RAM when predicted
  double useful;               // moving average: a predicted expert not in RAM was then used
  double *useful_at;           // [EXPERTS_MAX_DEPTH][n_used] the same per distance and rank of the prediction
  int64_t *useful_n;           // [EXPERTS_MAX_DEPTH][n_used] samples behind each
  int64_t correct_at[EXPERTS_MAX_DEPTH], total_at[EXPERTS_MAX_DEPTH];
  // adaptive prefetch: rounds of a few decode tokens with and without
  // prefetching, then many with whichever was faster
  bool on;                     // prefetching in the current phase
  int wins;                    // consecutive probes prefetching won (on from the second)
  int phase;                   // PF_PROBE_ON, PF_PROBE_AFTER, PF_PROBE_OFF, PF_RUN
  int64_t left;                // decode tokens left in the phase
  int64_t run;                 // tokens of the next run phase: doubles while probes agree
  int64_t t_token;             // when the current decode token began (us; 0 = none yet)
  int64_t tokens_then;         // n_tokens at that time (the next token must follow it)
  double samp[2][PF_SAMPLES];  // decode token times (us) in this round's probe: [without, with and after]
  double bytes[2], stall[2];   // the same tokens' bytes read and time waiting for reads (sums)
  int64_t n_samp[2];           // tokens measured
  int64_t tokens_on;           // decode tokens run with prefetch on (statistics)
};

mole_status experts_predictor_new(const experts_predictor_config *cfg, experts_predictor **out) {
  *out = NULL;
  const int64_t L = cfg->n_layer, X = cfg->n_expert, E = cfg->n_embd, K = cfg->n_used;
  MOLE_ASSERT(cfg->depth_cfg == -1 || (cfg->depth_cfg >= 1 && cfg->depth_cfg <= EXPERTS_MAX_DEPTH));
  MOLE_ASSERT(K <= EXPERTS_MAX_USED);  // experts_open and the loader refuse more
  experts_predictor *p = mole_calloc(1, sizeof *p);
  if (!p) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory for the predictor");
  p->cfg = *cfg;
  p->cfg.routers = NULL;
  // adaptive: the layers whose predicted experts fit in a quarter of the
  // high pool, at most 2 (accuracy falls with the distance)
  p->depth = cfg->depth_cfg > 0 ? cfg->depth_cfg : (int)MOLE_MAX(1, MOLE_MIN(2, cfg->slots_high / (4 * K)));
  p->routers = mole_aligned_alloc(64, (size_t)(L * X * E) * sizeof *p->routers);
  p->logits = mole_malloc((size_t)(EXPERTS_MAX_DEPTH * X) * sizeof *p->logits);
  p->pred = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH * K), sizeof *p->pred);
  p->valid = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH), sizeof *p->valid);
  p->uncached = mole_calloc((size_t)(L * EXPERTS_MAX_DEPTH * K), sizeof *p->uncached);
  p->useful = 1.0;  // optimistic until measured
  p->useful_at = mole_calloc((size_t)(EXPERTS_MAX_DEPTH * K), sizeof *p->useful_at);
  p->useful_n = mole_calloc((size_t)(EXPERTS_MAX_DEPTH * K), sizeof *p->useful_n);
  p->on = true;
  p->phase = PF_PROBE_ON;
  p->left = PF_PROBE_TOKENS;
  p->run = PF_RUN_TOKENS / 2;  // an agreeing first probe runs PF_RUN_TOKENS
  void *row = mole_malloc((size_t)E * sizeof(float));  // a row of any type
  if (!p->routers || !p->logits || !p->pred || !p->valid || !p->uncached || !p->useful_at || !p->useful_n || !row) {
    mole_free(row);
    experts_predictor_free(p);
    return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory for the predictor's %lld routers", (long long)L);
  }
  for (int64_t l = 0; l < L; l++) {
    const quant_matrix *g = &cfg->routers[l];
    const quant_traits *tr = quant_traits_of(g->type);
    for (int64_t r = 0; r < X; r++) {
      const void *src = (const char *)g->data + (size_t)r * g->row_bytes;
      if (g->layout == QL_R16) {  // the row back in GGUF layout
        quant_r16_row(g->type, g->data, E, X, r, row);
        src = row;
      }
      tr->to_float(src, p->routers + (l * X + r) * E, E);
    }
  }
  mole_free(row);
  *out = p;
  return MOLE_OK;
}

void experts_predictor_free(experts_predictor *p) {
  if (!p) return;
  mole_aligned_free(p->routers);
  mole_free(p->logits);
  mole_free(p->pred);
  mole_free(p->valid);
  mole_free(p->uncached);
  mole_free(p->useful_at);
  mole_free(p->useful_n);
  mole_free(p);
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
void experts_predictor_token(experts_predictor *p, int64_t n_tokens, const experts_counts *last) {
  if (p->cfg.depth_cfg != -1 || !p->cfg.tiered) return;
  const int64_t now = mole_time_us();
  if (p->t_token > 0 && n_tokens == p->tokens_then + 1) {
    const int side = p->phase == PF_PROBE_OFF ? 0 : 1;
    if (p->phase != PF_RUN && p->n_samp[side] < PF_SAMPLES) {
      p->samp[side][p->n_samp[side]++] = (double)(now - p->t_token);
      p->bytes[side] += (double)last->bytes_read;
      p->stall[side] += (double)last->stall_us;
    }
    p->tokens_on += p->on;
    if (--p->left <= 0) {
      p->left = PF_PROBE_TOKENS;
      if (p->phase == PF_PROBE_ON) {
        p->phase = PF_PROBE_AFTER;
        p->on = false;
      } else if (p->phase == PF_PROBE_AFTER) {
        p->phase = PF_PROBE_OFF;
      } else if (p->phase == PF_PROBE_OFF) {
        experts_probe_side with = {p->samp[1], p->n_samp[1], p->bytes[1], p->stall[1]};
        experts_probe_side without = {p->samp[0], p->n_samp[0], p->bytes[0], p->stall[0]};
        const bool was_on = p->wins >= 2;
        p->wins = experts_prefetch_won(&with, &without) ? p->wins + 1 : 0;
        p->on = p->wins >= 2;
        p->phase = PF_RUN;
        p->run = p->on == was_on ? MOLE_MIN(2 * p->run, PF_RUN_MAX) : PF_RUN_TOKENS;
        p->left = p->run;
        for (int k = 0; k < 2; k++) p->n_samp[k] = 0, p->bytes[k] = p->stall[k] = 0;
      } else {
        p->phase = PF_PROBE_ON;
        p->on = true;
      }
    }
  }
  p->t_token = now;
  p->tokens_then = n_tokens;
}

// The k largest of v [n] in descending order, ties to the lower index.
static void top_k(const float *v, int64_t n, int64_t k, int32_t *sel, float *w) {
  int64_t m = 0;  // kept so far
  for (int64_t e = 0; e < n; e++) {
    int64_t i = m;
    while (i > 0 && v[e] > w[i - 1]) i--;  // after every kept one at least as large
    if (i >= k) continue;
    for (int64_t j = MOLE_MIN(m, k - 1); j > i; j--) {
      sel[j] = sel[j - 1];
      w[j] = w[j - 1];
    }
    sel[i] = (int32_t)e;
    w[i] = v[e];
    m = MOLE_MIN(m + 1, k);
  }
}

int64_t experts_predictor_run(experts_predictor *p, int64_t layer, const float *h, experts_request *out) {
  const experts_predictor_config *c = &p->cfg;
  const int64_t L = c->n_layer, X = c->n_expert, E = c->n_embd, K = c->n_used;
  const int64_t d_max = MOLE_MIN((int64_t)p->depth, L - 1 - layer);
  int64_t n_out = 0;
  if (d_max <= 0) return 0;
  logits_job job = {p->routers + (layer + 1) * X * E, h, p->logits, d_max * X, E};
  if (job.rows * E >= 65536) mole_pool_run(c->pool, logits_worker, &job);
  else logits_worker(&job, 0, 1);
  for (int64_t d = 1; d <= d_max; d++) {
    const int64_t target = layer + d;
    float *lg = p->logits + (d - 1) * X;
    float mx = -INFINITY;
    for (int64_t e = 0; e < X; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int64_t e = 0; e < X; e++) lg[e] = expf(lg[e] - mx);  // unnormalised: only ratios matter below
    int32_t *sel = p->pred + (target * EXPERTS_MAX_DEPTH + d - 1) * K;
    float wsum = 0, w[EXPERTS_MAX_USED];
    top_k(lg, X, K, sel, w);
    for (int64_t k = 0; k < K; k++) wsum += w[k];
    p->valid[target * EXPERTS_MAX_DEPTH + d - 1] = true;
    bool *unc = p->uncached + (target * EXPERTS_MAX_DEPTH + d - 1) * K;
    const double *useful = p->useful_at + (d - 1) * K;
    const int64_t *useful_n = p->useful_n + (d - 1) * K;
    float above = 0;
    for (int64_t k = 0; k < K; k++) {
      const expert_prec pr = experts_prec_of(c->t1, c->t2, c->low_in_use, wsum > 0 ? above / wsum : 0);
      above += w[k];
      unc[k] = false;
      if (pr == EXPERT_SKIP) continue;
      unc[k] = c->cached && !c->cached(c->ctx, target, sel[k], pr);
      const bool want = c->depth_cfg > 0 || (p->on && useful_n[k] >= PF_USEFUL_SAMPLES && useful[k] >= PF_USEFUL_MIN);
      out[n_out++] = (experts_request){target, sel[k], (uint8_t)pr, want};
    }
  }
  return n_out;
}

void experts_predictor_score(experts_predictor *p, int64_t layer, const int32_t *sel, int64_t k, experts_counts *step) {
  for (int d = 0; d < EXPERTS_MAX_DEPTH; d++) {
    bool *v = &p->valid[layer * EXPERTS_MAX_DEPTH + d];
    if (!*v) continue;
    *v = false;
    const int32_t *pr = p->pred + (layer * EXPERTS_MAX_DEPTH + d) * k;
    const bool *unc = p->uncached + (layer * EXPERTS_MAX_DEPTH + d) * k;
    int64_t ok = 0;
    for (int64_t i = 0; i < k; i++) {
      bool used = false;
      for (int64_t j = 0; j < k; j++) used = used || pr[i] == sel[j];
      ok += used;
      if (!unc[i]) continue;
      p->useful += PF_USEFUL_ALPHA * ((used ? 1.0 : 0.0) - p->useful);
      // the mean of the samples so far, a moving average once there are enough
      double *u = &p->useful_at[d * k + i];
      const int64_t nu = ++p->useful_n[d * k + i];
      *u += MOLE_MAX(PF_USEFUL_ALPHA, 1.0 / (double)nu) * ((used ? 1.0 : 0.0) - *u);
    }
    step->pred_correct += ok;
    step->pred_total += k;
    p->correct_at[d] += ok;
    p->total_at[d] += k;
  }
}

void experts_predictor_reset(experts_predictor *p) {
  memset(p->valid, 0, (size_t)(p->cfg.n_layer * EXPERTS_MAX_DEPTH) * sizeof *p->valid);
}

void experts_predictor_get_stats(const experts_predictor *p, experts_predictor_stats *out) {
  memset(out, 0, sizeof *out);
  out->depth = p->depth;
  out->useful = p->useful;
  out->paused = p->cfg.depth_cfg < 0 && !p->on;
  out->on_tokens = p->tokens_on;
  memcpy(out->correct_at, p->correct_at, sizeof out->correct_at);
  memcpy(out->total_at, p->total_at, sizeof out->total_at);
}
