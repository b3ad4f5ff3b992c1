// engine/train_retain: mole train-retain (see train_retain.h). The flow:
//   1. the text's first tokens in sequences of seq_len (BOS first), the last
//      ones held out;
//   2. every sequence through the model (f32 KV cache, the whole sequence in
//      one pass) with the attention hook: per layer, the pre-RoPE features in
//      f16, the labels from the post-RoPE q and k, and on held-out sequences
//      H2O's accumulated attention;
//   3. per layer the features' mean and 1/std (the heads' input norm), then
//      the MLPs trained epoch by epoch, layers spread over the threads (each
//      layer alone, with its own RNG: the result does not depend on the
//      thread count), the held-out loss after each epoch;
//   4. the policies' top-10% overlap with the labels on the held-out
//      sequences, and the heads written with kv_retain_save.
#include "engine/train_retain.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/pool.h"
#include "kv/retain.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

enum { TR_RUN = 16 };  // tokens of a minibatch's runs of consecutive tokens (fewer when --batch is smaller)

const char *const train_retain_policy_names[TR_N_POLICY] = {"streaming", "h2o", "locret", "random"};

train_retain_params train_retain_default_params(void) {
  return (train_retain_params){.tokens = 65536, .seq_len = 512, .heldout = 0.1, .window = 64, .hidden = 64,
                               .smooth = 0.01f, .lr = 2e-3f, .wd = 0.01f, .batch = 256, .epochs = 20, .seed = 1,
                               .max_mem = 8.0 * 1073741824.0};
}

// ---- random numbers (splitmix64 streams) ----------------------------------------------

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s) { return (double)((rng_next(s) >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
static float rng_gauss(uint64_t *s) {
  const double u = rng_uniform(s), v = rng_uniform(s);
  return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}
static uint64_t rng_stream(uint64_t seed, uint64_t what, int64_t layer) {
  uint64_t s = seed ^ (what * 0xD1B54A32D192ED03ull);
  s += (uint64_t)layer * 0x8CB92BA72F3D8DD7ull;
  rng_next(&s);
  return s;
}

// ---- the run's state ------------------------------------------------------------------

typedef struct tr_layer {
  train_retain_mlp w;     // the weights: views into the heads' layer
  train_retain_mlp g;     // their gradient (own storage: gbuf)
  float *gbuf, *m, *v;    // [n_param] each: gradient, AdamW moments (order w1, b1, w2, b2)
  uint64_t rng;           // minibatch order
  int64_t step;
  int32_t *order;         // [n_runs] this epoch's order of the training runs
  float *X;               // [rows][d_in] normalized inputs of a minibatch or a sequence
  float *Y;               // [rows][n_head_kv] labels
  uint8_t *mask;          // [rows][n_head_kv]
  uint8_t *next;          // [rows]
  float *raw;             // [d_in] one token's features in f32
  float *tmp;             // train_retain_loss_tmp(rows)
  float *pred;            // [seq_len][n_head_kv] the heads' scores of a held-out sequence
  float *score_tmp;       // kv_retain_tmp_bytes(seq_len)
  float *rnd;             // [seq_len] the random policy's scores
  float *pos;             // [seq_len] the streaming policy's scores (position)
  void *ov_tmp;           // train_retain_overlap_tmp(n_keys)
  train_retain_terms ep;  // this epoch's sums
  train_retain_terms train_init, held;  // the loss's sums over the training / held-out sequences
  double ov[TR_N_POLICY];
} tr_layer;

typedef enum { PH_INIT, PH_EPOCH, PH_OVERLAP } tr_phase;

typedef struct tr_ctx {
  const train_retain_params *p;
  mole_model *m;
  kv_retain *r;
  int64_t L, NH, NKV, hd, hdv, D, K, S, W;
  int64_t nq, nk;                  // offsets of k and v in a feature row
  int64_t n_seq, n_train, n_held;  // sequences: the first n_train are trained on
  int64_t N;                       // n_seq * S token rows per layer
  int64_t seq;                     // the sequence the model is running
  uint16_t *feat;                  // [L][N][D] pre-RoPE concat[q, k, v] (f16)
  float *label;                    // [L][N][K]
  float *h2o;                      // [L][n_held * S][K]
  float *htmp;                     // [S] the hook's H2O scratch
  // training
  int64_t run, per_step, n_runs, steps_epoch, total_steps, warm, rows, n_keys, top_k;
  tr_phase phase;
  tr_layer *ly;  // [L]
} tr_ctx;

// The attention hook: features before RoPE, labels (and H2O) after.
static void attn_hook(void *ctx, int64_t il, int64_t n, const float *q, const float *k, const float *v, bool roped) {
  tr_ctx *c = ctx;
  MOLE_ASSERT(n == c->S && il >= 0 && il < c->L);
  const int64_t row0 = il * c->N + c->seq * c->S;
  if (!roped) {
    const quant_traits *f16 = quant_traits_of(QT_F16);
    const int64_t nv = c->NKV * c->hdv;
    for (int64_t t = 0; t < n; t++) {
      uint16_t *f = c->feat + (row0 + t) * c->D;
      f16->from_float(q + t * c->nq, f, c->nq);
      f16->from_float(k + t * c->nk, f + c->nq, c->nk);
      f16->from_float(v + t * nv, f + c->nq + c->nk, nv);
    }
    return;
  }
  const float scale = c->m->hp.attn_scale;
  train_retain_labels(q, k, n, c->NH, c->NKV, c->hd, scale, c->W, c->label + row0 * c->K);
  if (c->seq >= c->n_train)
    train_retain_h2o(q, k, n, c->NH, c->NKV, c->hd, scale,
                     c->h2o + ((il * c->n_held + c->seq - c->n_train) * c->S) * c->K, c->htmp);
}

// ---- the text --------------------------------------------------------------------------

// Tokens of the text's beginning: read more of it until it gives `want` ids
// or ends (a prefix is cut after its last whitespace: no half word).
static mole_status load_tokens(const char *path, const tok_vocab *voc, int64_t want, int32_t **ids, int64_t *n_ids) {
  *ids = NULL;
  *n_ids = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return mole_errorf(MOLE_ERR_IO, "--data: cannot open '%s': %s", path, strerror(errno));
  size_t cap = (size_t)MOLE_MIN(want * 8 + 65536, (int64_t)TOK_MAX_TEXT), len = 0;
  char *b = NULL;
  mole_status st = MOLE_OK;
  for (;;) {
    char *nb = mole_realloc(b, cap + 1);
    if (!nb) {
      st = mole_errorf(MOLE_ERR_NOMEM, "--data: out of memory reading '%s'", path);
      break;
    }
    b = nb;
    len += fread(b + len, 1, cap - len, f);
    if (ferror(f)) {
      st = mole_errorf(MOLE_ERR_IO, "--data: cannot read '%s'", path);
      break;
    }
    const bool end = len < cap || cap >= TOK_MAX_TEXT;
    size_t use = len;
    if (!end)
      while (use > 0 && b[use - 1] != ' ' && b[use - 1] != '\n') use--;
    if (use == 0) use = len;
    mole_free(*ids);
    *ids = NULL;
    if ((st = tok_encode(voc, b, use, false, false, ids, n_ids))) break;
    if (*n_ids >= want || end) break;
    cap = MOLE_MIN(cap * 2, TOK_MAX_TEXT);
  }
  fclose(f);
  mole_free(b);
  if (st) {
    mole_free(*ids);
    *ids = NULL;
    return st;
  }
  return MOLE_OK;
}

// ---- memory --------------------------------------------------------------------------

static size_t layer_bytes(const tr_ctx *c) {
  const train_retain_mlp w = {c->D, c->p->hidden, c->K, NULL, NULL, NULL, NULL};
  const size_t P = (size_t)(c->p->hidden * (c->D + 1) + c->K * (c->p->hidden + 1));
  return sizeof(float) * (3 * P + (size_t)(c->rows * (c->D + c->K)) + (size_t)c->D + train_retain_loss_tmp(&w, c->rows) +
                          (size_t)(c->S * (c->K + 2)) + (size_t)(c->S * (c->D + c->p->hidden))) +
         (size_t)(c->rows * (c->K + 1)) + sizeof(int32_t) * (size_t)c->n_runs + train_retain_overlap_tmp(c->n_keys);
}

static double estimate_bytes(const tr_ctx *c) {
  const double N = (double)c->N, L = (double)c->L;
  return N * L * (double)c->D * 2.0                                  // features
         + N * L * (double)c->K * 4.0                                // labels
         + (double)(c->n_held * c->S) * L * (double)c->K * 4.0       // H2O
         + L * (double)c->S * (double)(c->nk + c->NKV * c->hdv) * 4  // f32 KV cache
         + (double)model_scratch_bytes(c->m, c->S, c->S)             // forward scratch
         + L * (double)layer_bytes(c)                                // training buffers
         + (double)c->N * 4.0;                                       // token ids
}

static mole_status alloc_layers(tr_ctx *c) {
  c->ly = mole_calloc((size_t)c->L, sizeof *c->ly);
  if (!c->ly) return mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory");
  const int64_t D = c->D, H = c->p->hidden, K = c->K, S = c->S;
  const int64_t P = H * (D + 1) + K * (H + 1);
  for (int64_t l = 0; l < c->L; l++) {
    tr_layer *y = &c->ly[l];
    y->w = (train_retain_mlp){D, H, K, c->r->w1 + l * H * D, c->r->b1 + l * H, c->r->w2 + l * K * H, c->r->b2 + l * K};
    y->gbuf = mole_calloc((size_t)P, sizeof(float));
    y->m = mole_calloc((size_t)P, sizeof(float));
    y->v = mole_calloc((size_t)P, sizeof(float));
    y->order = mole_malloc((size_t)c->n_runs * sizeof(int32_t));
    y->X = mole_malloc((size_t)(c->rows * D) * sizeof(float));
    y->Y = mole_malloc((size_t)(c->rows * K) * sizeof(float));
    y->mask = mole_malloc((size_t)(c->rows * K));
    y->next = mole_malloc((size_t)c->rows);
    y->raw = mole_malloc((size_t)D * sizeof(float));
    y->tmp = mole_malloc(train_retain_loss_tmp(&y->w, c->rows) * sizeof(float));
    y->pred = mole_malloc((size_t)(S * K) * sizeof(float));
    y->score_tmp = mole_malloc(kv_retain_tmp_bytes(c->r, S));
    y->rnd = mole_malloc((size_t)S * sizeof(float));
    y->pos = mole_malloc((size_t)S * sizeof(float));
    y->ov_tmp = mole_malloc(train_retain_overlap_tmp(c->n_keys));
    if (!y->gbuf || !y->m || !y->v || !y->order || !y->X || !y->Y || !y->mask || !y->next || !y->raw || !y->tmp ||
        !y->pred || !y->score_tmp || !y->rnd || !y->pos || !y->ov_tmp)
      return mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory for layer %lld's training buffers", (long long)l);
    y->g = (train_retain_mlp){D, H, K, y->gbuf, y->gbuf + H * D, y->gbuf + H * D + H, y->gbuf + H * D + H + K * H};
    y->rng = rng_stream(c->p->seed, 1, l);
  }
  return MOLE_OK;
}

static void free_layers(tr_ctx *c) {
  if (!c->ly) return;
  for (int64_t l = 0; l < c->L; l++) {
    tr_layer *y = &c->ly[l];
    mole_free(y->gbuf);
    mole_free(y->m);
    mole_free(y->v);
    mole_free(y->order);
    mole_free(y->X);
    mole_free(y->Y);
    mole_free(y->mask);
    mole_free(y->next);
    mole_free(y->raw);
    mole_free(y->tmp);
    mole_free(y->pred);
    mole_free(y->score_tmp);
    mole_free(y->rnd);
    mole_free(y->pos);
    mole_free(y->ov_tmp);
  }
  mole_free(c->ly);
  c->ly = NULL;
}

// ---- the heads' input norm and initial weights -----------------------------------------

// s1, s2: [D] doubles of scratch.
static void init_layer(tr_ctx *c, int64_t l, double *s1, double *s2) {
  const int64_t D = c->D, K = c->K, H = c->p->hidden, NT = c->n_train * c->S;
  const quant_traits *f16 = quant_traits_of(QT_F16);
  tr_layer *y = &c->ly[l];
  memset(s1, 0, (size_t)D * sizeof(double));
  memset(s2, 0, (size_t)D * sizeof(double));
  for (int64_t t = 0; t < NT; t++) {
    f16->to_float(c->feat + (l * c->N + t) * D, y->raw, D);
    for (int64_t i = 0; i < D; i++) {
      s1[i] += y->raw[i];
      s2[i] += (double)y->raw[i] * y->raw[i];
    }
  }
  float *mu = c->r->in_mean + l * D, *sc = c->r->in_scale + l * D;
  double ms = 0;
  for (int64_t i = 0; i < D; i++) {
    const double mean = s1[i] / (double)NT;
    s2[i] = fmax(s2[i] / (double)NT - mean * mean, 0.0);
    mu[i] = (float)mean;
    ms += s2[i];
  }
  const double floor_std = fmax(1e-3 * sqrt(ms / (double)D), 1e-6);  // a constant feature gets a bounded scale
  for (int64_t i = 0; i < D; i++) sc[i] = (float)(1.0 / fmax(sqrt(s2[i]), floor_std));
  // w1 ~ N(0, 1/D), b1 = 0, w2 = 0, b2 = the mean label: the initial heads predict the mean
  uint64_t rs = rng_stream(c->p->seed, 2, l);
  for (int64_t i = 0; i < H * D; i++) y->w.w1[i] = rng_gauss(&rs) / sqrtf((float)D);
  memset(y->w.b1, 0, (size_t)H * sizeof(float));
  memset(y->w.w2, 0, (size_t)(K * H) * sizeof(float));
  for (int64_t g = 0; g < K; g++) {
    double s = 0;
    int64_t cnt = 0;
    for (int64_t t = 0; t < NT; t++)
      if (t % c->S != c->S - 1) {
        s += c->label[(l * c->N + t) * K + g];
        cnt++;
      }
    y->w.b2[g] = cnt ? (float)(s / (double)cnt) : 0.0f;
  }
}

// ---- training ------------------------------------------------------------------------

// Rows [at, at + len) of sequence s of layer l, normalized, into the layer's
// buffers from row r0 on (labels, mask, and next within the run).
static void gather(tr_ctx *c, int64_t l, int64_t s, int64_t at, int64_t len, int64_t r0) {
  const quant_traits *f16 = quant_traits_of(QT_F16);
  tr_layer *y = &c->ly[l];
  const int64_t D = c->D, K = c->K;
  for (int64_t i = 0; i < len; i++) {
    const int64_t t = s * c->S + at + i, r = r0 + i;
    f16->to_float(c->feat + (l * c->N + t) * D, y->raw, D);
    kv_retain_input(c->r, l, y->raw, y->raw + c->nq, y->raw + c->nq + c->nk, y->X + r * D);
    memcpy(y->Y + r * K, c->label + (l * c->N + t) * K, (size_t)K * sizeof(float));
    memset(y->mask + r * K, at + i < c->S - 1, (size_t)K);  // the last token has no follower
    y->next[r] = i + 1 < len;
  }
}

// The loss's sums for layer l's heads over sequences [s0, s1), each in one piece.
static train_retain_terms eval_loss(tr_ctx *c, int64_t l, int64_t s0, int64_t s1) {
  tr_layer *y = &c->ly[l];
  train_retain_terms t = {0};
  for (int64_t s = s0; s < s1; s++) {
    gather(c, l, s, 0, c->S, 0);
    train_retain_loss(&y->w, y->X, c->S, y->Y, y->mask, y->next, c->p->smooth, NULL, &t, y->tmp);
  }
  return t;
}

static void adamw_step(tr_ctx *c, tr_layer *y) {
  const float lr = train_retain_lr(c->p->lr, y->step, c->total_steps, c->warm), wd = c->p->wd;
  const int64_t D = c->D, H = c->p->hidden, K = c->K, t = ++y->step;
  float *m = y->m, *v = y->v;
  train_retain_adamw(y->w.w1, y->g.w1, m, v, H * D, t, lr, wd);
  m += H * D, v += H * D;
  train_retain_adamw(y->w.b1, y->g.b1, m, v, H, t, lr, 0.0f);
  m += H, v += H;
  train_retain_adamw(y->w.w2, y->g.w2, m, v, K * H, t, lr, wd);
  m += K * H, v += K * H;
  train_retain_adamw(y->w.b2, y->g.b2, m, v, K, t, lr, 0.0f);
}

// One epoch of layer l: the training runs in a fresh random order, per_step runs a step.
static void train_epoch(tr_ctx *c, int64_t l) {
  tr_layer *y = &c->ly[l];
  const int64_t per_seq = (c->S + c->run - 1) / c->run;
  for (int64_t i = 0; i < c->n_runs; i++) y->order[i] = (int32_t)i;
  for (int64_t i = c->n_runs - 1; i > 0; i--) {  // Fisher-Yates
    const int64_t j = (int64_t)(rng_next(&y->rng) % (uint64_t)(i + 1));
    const int32_t x = y->order[i];
    y->order[i] = y->order[j];
    y->order[j] = x;
  }
  y->ep = (train_retain_terms){0};
  for (int64_t a = 0; a < c->n_runs; a += c->per_step) {
    int64_t rows = 0;
    for (int64_t b = a; b < MOLE_MIN(a + c->per_step, c->n_runs); b++) {
      const int64_t s = y->order[b] / per_seq, at = (y->order[b] % per_seq) * c->run;
      const int64_t len = MOLE_MIN(c->run, c->S - at);
      gather(c, l, s, at, len, rows);
      rows += len;
    }
    train_retain_loss(&y->w, y->X, rows, y->Y, y->mask, y->next, c->p->smooth, &y->g, &y->ep, y->tmp);
    adamw_step(c, y);
  }
}

// The policies' overlap with the labels on layer l's held-out sequences.
static void overlap_layer(tr_ctx *c, int64_t l) {
  const quant_traits *f16 = quant_traits_of(QT_F16);
  tr_layer *y = &c->ly[l];
  const int64_t S = c->S, K = c->K, D = c->D;
  uint64_t rs = rng_stream(c->p->seed, 3, l);
  for (int64_t j = 0; j < S; j++) y->pos[j] = (float)j;
  double sum[TR_N_POLICY] = {0};
  for (int64_t h = 0; h < c->n_held; h++) {
    const int64_t s = c->n_train + h, t0 = l * c->N + s * S;
    // the heads' scores as the KV cache computes them (kv_retain_score on the raw features)
    float *raw = y->X;  // [S][D]
    for (int64_t t = 0; t < S; t++) f16->to_float(c->feat + (t0 + t) * D, raw + t * D, D);
    kv_retain_score(c->r, l, S, raw, D, raw + c->nq, D, raw + c->nq + c->nk, D, y->pred, K, y->score_tmp);
    const float *lab = c->label + t0 * K, *h2o = c->h2o + (l * c->n_held + h) * S * K;
    for (int64_t g = 0; g < K; g++) {
      for (int64_t j = 0; j < S; j++) y->rnd[j] = (float)rng_uniform(&rs);
      sum[TR_STREAMING] += train_retain_overlap(y->pos, 1, lab + g, K, c->n_keys, c->top_k, y->ov_tmp);
      sum[TR_H2O] += train_retain_overlap(h2o + g, K, lab + g, K, c->n_keys, c->top_k, y->ov_tmp);
      sum[TR_LOCRET] += train_retain_overlap(y->pred + g, K, lab + g, K, c->n_keys, c->top_k, y->ov_tmp);
      sum[TR_RANDOM] += train_retain_overlap(y->rnd, 1, lab + g, K, c->n_keys, c->top_k, y->ov_tmp);
    }
  }
  for (int i = 0; i < TR_N_POLICY; i++) y->ov[i] = sum[i] / (double)(c->n_held * K);
}

static void layers_worker(void *ctx, int ith, int nth) {
  tr_ctx *c = ctx;
  for (int64_t l = ith; l < c->L; l += nth) {
    tr_layer *y = &c->ly[l];
    switch (c->phase) {
      case PH_INIT:
        y->train_init = eval_loss(c, l, 0, c->n_train);
        y->held = eval_loss(c, l, c->n_train, c->n_seq);
        break;
      case PH_EPOCH:
        train_epoch(c, l);
        y->held = eval_loss(c, l, c->n_train, c->n_seq);
        break;
      case PH_OVERLAP:
        overlap_layer(c, l);
        break;
    }
  }
}

// ---- the whole run -------------------------------------------------------------------

static mole_status check_params(const train_retain_params *p) {
  if (!p->data || !*p->data) return mole_errorf(MOLE_ERR_ARG, "--data TEXT is required (the text to train on)");
  if (p->tokens < 4 || p->tokens > ((int64_t)1 << 32))
    return mole_errorf(MOLE_ERR_ARG, "--tokens %lld: need 4..2^32", (long long)p->tokens);
  if (p->seq_len < 4 || p->seq_len > (1 << 20))
    return mole_errorf(MOLE_ERR_ARG, "--seq-len %lld: need 4..1048576", (long long)p->seq_len);
  if (!(p->heldout > 0 && p->heldout < 1))
    return mole_errorf(MOLE_ERR_ARG, "--heldout %g: need a fraction between 0 and 1", p->heldout);
  if (p->window < 1 || p->window > (1 << 20))
    return mole_errorf(MOLE_ERR_ARG, "--window %lld: need 1..1048576", (long long)p->window);
  if (p->hidden < 1 || p->hidden > 65536)
    return mole_errorf(MOLE_ERR_ARG, "--hidden %lld: need 1..65536", (long long)p->hidden);
  if (!(p->smooth >= 0 && p->smooth <= 1e4)) return mole_errorf(MOLE_ERR_ARG, "--smooth %g: need 0..1e4", (double)p->smooth);
  if (!(p->lr > 0 && p->lr <= 10)) return mole_errorf(MOLE_ERR_ARG, "--lr %g: need 0 < lr <= 10", (double)p->lr);
  if (!(p->wd >= 0 && p->wd <= 10)) return mole_errorf(MOLE_ERR_ARG, "--wd %g: need 0..10", (double)p->wd);
  if (p->batch < 1 || p->batch > (1 << 20))
    return mole_errorf(MOLE_ERR_ARG, "--batch %lld: need 1..1048576", (long long)p->batch);
  if (p->epochs < 0 || p->epochs > 1000000) return mole_errorf(MOLE_ERR_ARG, "--epochs %lld: need 0..1000000", (long long)p->epochs);
  if (!(p->max_mem > 0)) return mole_errorf(MOLE_ERR_ARG, "--max-mem %g: need > 0", p->max_mem / 1073741824.0);
  if (p->n_threads < 0 || p->n_threads > 1024) return mole_errorf(MOLE_ERR_ARG, "-t %d: need 0..1024", p->n_threads);
  return MOLE_OK;
}

// The training sequences: the text's first tokens, BOS first.
static mole_status make_sequences(tr_ctx *c, int32_t **toks, int64_t *found) {
  const train_retain_params *p = c->p;
  tok_vocab *voc = NULL;
  int32_t *ids = NULL;
  int64_t n_ids = 0;
  const int64_t S = c->S, want_seq = (p->tokens + S - 1) / S;
  if (want_seq < 2)
    return mole_errorf(MOLE_ERR_ARG, "--tokens %lld: need at least two sequences of --seq-len %lld (%lld tokens)",
                       (long long)p->tokens, (long long)S, (long long)(2 * S));
  mole_status st = tok_load(c->m->gguf, &voc);
  const bool bos = !st && tok_add_bos(voc) && tok_bos(voc) >= 0;
  const int64_t body = bos ? S - 1 : S;
  if (!st) st = load_tokens(p->data, voc, want_seq * body, &ids, &n_ids);
  const int32_t bos_id = st ? -1 : tok_bos(voc);
  tok_free(voc);
  if (st) return st;
  *found = n_ids;
  if (n_ids / body < 2) {
    mole_free(ids);
    return mole_errorf(MOLE_ERR_ARG,
                       "--data '%s' has %lld tokens; train-retain needs at least %lld (two sequences of --seq-len "
                       "%lld: one to train on, one held out)",
                       p->data, (long long)n_ids, (long long)(2 * body), (long long)S);
  }
  c->n_seq = MOLE_MIN(n_ids / body, want_seq);
  c->n_held = MOLE_MIN(MOLE_MAX((int64_t)llround((double)c->n_seq * p->heldout), 1), c->n_seq - 1);
  c->n_train = c->n_seq - c->n_held;
  c->N = c->n_seq * S;
  const int64_t V = c->m->hp.n_vocab;
  *toks = mole_malloc((size_t)c->N * sizeof **toks);
  if (!*toks) {
    mole_free(ids);
    return mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory for %lld tokens (--tokens)", (long long)c->N);
  }
  for (int64_t s = 0; s < c->n_seq; s++) {
    int32_t *t = *toks + s * S;
    if (bos) *t++ = bos_id;
    memcpy(t, ids + s * body, (size_t)body * sizeof *t);
  }
  mole_free(ids);
  for (int64_t i = 0; i < c->N; i++)
    if ((*toks)[i] < 0 || (*toks)[i] >= V)
      return mole_errorf(MOLE_ERR_FORMAT, "--data: token %d is outside the model's vocabulary", (*toks)[i]);
  return MOLE_OK;
}

// Runs every sequence through the model with the hook.
static mole_status run_sequences(tr_ctx *c, const int32_t *toks, FILE *log, bool tty) {
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = c->S;
  sp.n_batch = c->S;  // the hook sees the whole sequence in one pass
  sp.kv_type = MOLE_KV_F16;  // the cache the model runs with (labels come from the hook's f32 q, k)
  sp.n_threads = c->p->n_threads;
  mole_session *sess = NULL;
  mole_status st = mole_session_new(c->m, &sp, &sess);
  if (st) return st;
  const int64_t t0 = mole_time_us();
  c->m->attn_hook = attn_hook;
  c->m->attn_hook_ctx = c;
  for (int64_t s = 0; s < c->n_seq && !st; s++) {
    c->seq = s;
    mole_session_reset(sess);
    st = mole_session_eval(sess, toks + s * c->S, c->S, NULL, false);
    if (st) st = mole_error_prefix(st, "train-retain: sequence %lld: ", (long long)s);
    if (tty) {
      const double el = (double)(mole_time_us() - t0) * 1e-6;
      fprintf(log, "\rtrain-retain: sequence %lld/%lld  %.0f s, ETA %.0f s   ", (long long)s + 1, (long long)c->n_seq,
              el, el / (double)(s + 1) * (double)(c->n_seq - s - 1));
      fflush(log);
    }
  }
  c->m->attn_hook = NULL;
  c->m->attn_hook_ctx = NULL;
  mole_session_free(sess);
  if (log && !st)
    fprintf(log, "%strain-retain: features and labels of %lld sequences (%lld tokens, %lld layers) in %.1f s\n",
            tty ? "\r" : "", (long long)c->n_seq, (long long)c->N, (long long)c->L,
            (double)(mole_time_us() - t0) * 1e-6);
  return st;
}

static double fit_of(const train_retain_terms *t) { return t->n_fit ? t->fit / (double)t->n_fit : 0.0; }

// The mean over layers of the loss (fit: its SmoothL1 part) of the sums at `offset` in each layer.
static double mean_over_layers(const tr_ctx *c, size_t offset, bool fit) {
  double s = 0;
  for (int64_t l = 0; l < c->L; l++) {
    const train_retain_terms *t = (const train_retain_terms *)((const char *)&c->ly[l] + offset);
    s += fit ? fit_of(t) : train_retain_terms_loss(t, c->p->smooth);
  }
  return s / (double)c->L;
}

static mole_status train(tr_ctx *c, train_retain_report *rep, FILE *log, bool tty) {
  const int64_t t0 = mole_time_us();
  double *s12 = mole_malloc(2 * (size_t)c->D * sizeof(double));
  if (!s12) return mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory");
  for (int64_t l = 0; l < c->L; l++) init_layer(c, l, s12, s12 + c->D);
  mole_free(s12);
  // one BLAS thread per layer: the layers already fill the threads
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  c->phase = PH_INIT;
  mole_pool_run(c->m->pool, layers_worker, c);
  for (int64_t l = 0; l < c->L; l++) {
    rep->layer_init[l] = train_retain_terms_loss(&c->ly[l].held, c->p->smooth);
    rep->layer_init_fit[l] = fit_of(&c->ly[l].held);
  }
  rep->train_loss[0] = mean_over_layers(c, offsetof(tr_layer, train_init), false);
  rep->heldout_loss[0] = mean_over_layers(c, offsetof(tr_layer, held), false);
  rep->heldout_fit[0] = mean_over_layers(c, offsetof(tr_layer, held), true);
  if (log)
    fprintf(log, "train-retain: before training  train loss %.4f  held-out %.4f (SmoothL1 %.4f)\n", rep->train_loss[0],
            rep->heldout_loss[0], rep->heldout_fit[0]);
  for (int64_t e = 1; e <= c->p->epochs; e++) {
    c->phase = PH_EPOCH;
    mole_pool_run(c->m->pool, layers_worker, c);
    double tr = 0;
    for (int64_t l = 0; l < c->L; l++) tr += train_retain_terms_loss(&c->ly[l].ep, c->p->smooth);
    rep->train_loss[e] = tr / (double)c->L;
    rep->heldout_loss[e] = mean_over_layers(c, offsetof(tr_layer, held), false);
    rep->heldout_fit[e] = mean_over_layers(c, offsetof(tr_layer, held), true);
    if (log) {
      const double el = (double)(mole_time_us() - t0) * 1e-6;
      fprintf(log, "train-retain: epoch %lld/%lld  train loss %.4f  held-out %.4f (SmoothL1 %.4f)  %.1f s", (long long)e,
              (long long)c->p->epochs, rep->train_loss[e], rep->heldout_loss[e], rep->heldout_fit[e], el);
      if (tty) fprintf(log, ", ETA %.0f s", el / (double)e * (double)(c->p->epochs - e));
      fprintf(log, "\n");
      fflush(log);
    }
  }
  for (int64_t l = 0; l < c->L; l++) {
    rep->layer_final[l] = train_retain_terms_loss(&c->ly[l].held, c->p->smooth);
    rep->layer_final_fit[l] = fit_of(&c->ly[l].held);
  }
  c->phase = PH_OVERLAP;
  mole_pool_run(c->m->pool, layers_worker, c);
  openblas_set_num_threads(blas_threads);
  for (int i = 0; i < TR_N_POLICY; i++) {
    double s = 0;
    for (int64_t l = 0; l < c->L; l++) s += rep->overlap[i * c->L + l] = c->ly[l].ov[i];
    rep->overlap_mean[i] = s / (double)c->L;
  }
  rep->seconds_train = (double)(mole_time_us() - t0) * 1e-6;
  return MOLE_OK;
}

mole_status train_retain_run(const char *model, const char *out, const train_retain_params *p, FILE *log,
                             train_retain_report *rep) {
  memset(rep, 0, sizeof *rep);
  const int64_t t_start = mole_time_us();
  mole_status st = check_params(p);
  if (st) return st;
  const bool tty = log && isatty(fileno(log));
  tr_ctx c = {.p = p};
  int32_t *toks = NULL;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = p->n_threads;
  mp.offload.session_ctx = p->seq_len;
  mp.offload.session_batch = p->seq_len;
  mp.offload.session_kv_type = MOLE_KV_F16;
  if ((st = mole_model_load(model, &mp, &c.m))) return st;
  const model_hparams *hp = &c.m->hp;
  MOLE_ASSERT(c.m->loc.n_head == hp->n_head && c.m->loc.n_head_kv == hp->n_head_kv);
  c.L = hp->n_layer, c.NH = hp->n_head, c.NKV = c.K = hp->n_head_kv, c.hd = hp->head_dim, c.hdv = hp->head_dim_v;
  c.nq = c.NH * c.hd, c.nk = c.NKV * c.hd, c.D = c.nq + c.nk + c.NKV * c.hdv;
  c.S = MOLE_MIN(p->seq_len, hp->n_ctx_train);
  c.W = p->window;
  if (c.S < p->seq_len && log)
    fprintf(log, "train-retain: --seq-len %lld is over the model's train context: %lld\n", (long long)p->seq_len,
            (long long)c.S);
  if (c.W >= c.S - 1) {
    st = mole_errorf(MOLE_ERR_ARG, "--window %lld: must be below the sequence length - 1 (%lld): no key would have a "
                     "full window", (long long)c.W, (long long)(c.S - 1));
    goto done;
  }
  if ((st = make_sequences(&c, &toks, &rep->tokens_found))) goto done;
  if (c.n_seq * c.S < p->tokens && log)
    fprintf(log, "train-retain: '%s' gives %lld tokens: %lld sequences of %lld instead of the %lld tokens of --tokens\n",
            p->data, (long long)rep->tokens_found, (long long)c.n_seq, (long long)c.S, (long long)p->tokens);
  c.run = MOLE_MIN(TR_RUN, p->batch);
  c.per_step = MOLE_MAX(p->batch / c.run, 1);
  c.n_runs = c.n_train * ((c.S + c.run - 1) / c.run);
  c.steps_epoch = (c.n_runs + c.per_step - 1) / c.per_step;
  c.total_steps = c.steps_epoch * p->epochs;
  c.warm = MOLE_MAX(MOLE_MIN(c.total_steps / 20, 100), 1);
  c.rows = MOLE_MAX(c.per_step * c.run, c.S);
  c.n_keys = c.S - c.W;
  c.top_k = MOLE_MAX((int64_t)llround(0.1 * (double)c.n_keys), 1);
  const double need = estimate_bytes(&c);
  if (need > p->max_mem) {
    const bool gib = p->max_mem >= 0.1 * 1073741824.0;
    const double unit = gib ? 1073741824.0 : 1048576.0;
    st = mole_errorf(MOLE_ERR_ARG,
                     "train-retain: --tokens %lld needs about %.2f %s (features, labels, buffers), over --max-mem %.2f "
                     "%s: lower --tokens (or --seq-len, --hidden), or raise --max-mem",
                     (long long)(c.n_seq * c.S), need / unit, gib ? "GiB" : "MiB", p->max_mem / unit, gib ? "GiB" : "MiB");
    goto done;
  }
  if ((st = kv_retain_new(c.L, c.NH, c.NKV, c.hd, c.hdv, p->hidden, &c.r))) goto done;
  c.r->window = c.W;
  snprintf(c.r->model_arch, sizeof c.r->model_arch, "%s", c.m->arch_name);
  c.feat = mole_malloc((size_t)(c.L * c.N * c.D) * sizeof *c.feat);
  c.label = mole_malloc((size_t)(c.L * c.N * c.K) * sizeof *c.label);
  c.h2o = mole_malloc((size_t)(c.L * c.n_held * c.S * c.K) * sizeof *c.h2o);
  c.htmp = mole_malloc((size_t)c.S * sizeof *c.htmp);
  rep->train_loss = mole_calloc((size_t)p->epochs + 1, sizeof(double));
  rep->heldout_loss = mole_calloc((size_t)p->epochs + 1, sizeof(double));
  rep->layer_init = mole_calloc((size_t)c.L, sizeof(double));
  rep->layer_final = mole_calloc((size_t)c.L, sizeof(double));
  rep->heldout_fit = mole_calloc((size_t)p->epochs + 1, sizeof(double));
  rep->layer_init_fit = mole_calloc((size_t)c.L, sizeof(double));
  rep->layer_final_fit = mole_calloc((size_t)c.L, sizeof(double));
  rep->overlap = mole_calloc((size_t)(TR_N_POLICY * c.L), sizeof(double));
  if (!c.feat || !c.label || !c.h2o || !c.htmp || !rep->train_loss || !rep->heldout_loss || !rep->layer_init ||
      !rep->layer_final || !rep->overlap || !rep->heldout_fit || !rep->layer_init_fit || !rep->layer_final_fit) {
    st = mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory for the features of %lld tokens (--tokens)",
                     (long long)c.N);
    goto done;
  }
  snprintf(rep->model_arch, sizeof rep->model_arch, "%s", c.m->arch_name);
  rep->n_layer = c.L, rep->n_head = c.NH, rep->n_head_kv = c.NKV, rep->d_in = c.D;
  rep->seq_len = c.S, rep->window = c.W, rep->hidden = p->hidden, rep->batch = c.per_step * c.run;
  rep->n_seq_train = c.n_train, rep->n_seq_heldout = c.n_held;
  rep->epochs = p->epochs, rep->steps = c.total_steps;
  rep->n_keys = c.n_keys, rep->top_k = c.top_k;
  rep->random_expected = (double)c.top_k / (double)c.n_keys;
  const int64_t t_data = mole_time_us();
  if ((st = run_sequences(&c, toks, log, tty))) goto done;
  rep->seconds_data = (double)(mole_time_us() - t_data) * 1e-6;
  if ((st = alloc_layers(&c))) goto done;
  if ((st = train(&c, rep, log, tty))) goto done;
  if ((st = kv_retain_save(c.r, out))) goto done;
  if (log) fprintf(log, "train-retain: wrote %s\n", out);
done:
  rep->seconds = (double)(mole_time_us() - t_start) * 1e-6;
  struct rusage ru;
  if (!getrusage(RUSAGE_SELF, &ru)) rep->peak_rss = (int64_t)ru.ru_maxrss * 1024;
  free_layers(&c);
  kv_retain_free(c.r);
  mole_model_free(c.m);
  mole_free(toks);
  mole_free(c.feat);
  mole_free(c.label);
  mole_free(c.h2o);
  mole_free(c.htmp);
  return st;
}

void train_retain_report_free(train_retain_report *rep) {
  mole_free(rep->train_loss);
  mole_free(rep->heldout_loss);
  mole_free(rep->layer_init);
  mole_free(rep->layer_final);
  mole_free(rep->overlap);
  mole_free(rep->heldout_fit);
  mole_free(rep->layer_init_fit);
  mole_free(rep->layer_final_fit);
  rep->train_loss = rep->heldout_loss = rep->layer_init = rep->layer_final = rep->overlap = NULL;
  rep->heldout_fit = rep->layer_init_fit = rep->layer_final_fit = NULL;
}

// ---- the report ----------------------------------------------------------------------

void train_retain_print_report(const train_retain_report *r, const train_retain_params *p, FILE *f) {
  const int64_t L = r->n_layer;
  fprintf(f, "model             %s: %lld layers, %lld heads / %lld KV heads; heads' input %lld, hidden %lld\n",
          r->model_arch, (long long)L, (long long)r->n_head, (long long)r->n_head_kv, (long long)r->d_in,
          (long long)r->hidden);
  fprintf(f, "data              %lld training + %lld held-out sequences of %lld tokens; label window %lld\n",
          (long long)r->n_seq_train, (long long)r->n_seq_heldout, (long long)r->seq_len, (long long)r->window);
  fprintf(f, "training          %lld epochs, %lld steps per layer of %lld tokens (lr %g, wd %g, smooth %g, seed %llu)\n",
          (long long)r->epochs, (long long)r->steps, (long long)r->batch, (double)p->lr, (double)p->wd,
          (double)p->smooth, (unsigned long long)p->seed);
  fprintf(f, "held-out loss     %.4f -> %.4f (before training -> after; its SmoothL1 part %.4f -> %.4f)\n",
          r->heldout_loss[0], r->heldout_loss[r->epochs], r->heldout_fit[0], r->heldout_fit[r->epochs]);
  for (int64_t l = 0; l < L; l++)
    fprintf(f, "  layer %-3lld       %.4f -> %.4f (%.4f -> %.4f)\n", (long long)l, r->layer_init[l], r->layer_final[l],
            r->layer_init_fit[l], r->layer_final_fit[l]);
  fprintf(f, "top-10%% overlap with the labels on the held-out sequences (the best %lld of the %lld keys with a full\n"
             "window, per sequence and KV head):\n",
          (long long)r->top_k, (long long)r->n_keys);
  fprintf(f, "  layer   ");
  for (int i = 0; i < TR_N_POLICY; i++) fprintf(f, " %10s", train_retain_policy_names[i]);
  fprintf(f, "\n");
  for (int64_t l = 0; l < L; l++) {
    fprintf(f, "  %-7lld ", (long long)l);
    for (int i = 0; i < TR_N_POLICY; i++) fprintf(f, " %10.4f", r->overlap[i * L + l]);
    fprintf(f, "\n");
  }
  fprintf(f, "  mean    ");
  for (int i = 0; i < TR_N_POLICY; i++) fprintf(f, " %10.4f", r->overlap_mean[i]);
  fprintf(f, "\n  (a random policy gets %.4f on average)\n", r->random_expected);
  fprintf(f, "time              %.1f s (model runs %.1f s, training and evaluation %.1f s)\n", r->seconds,
          r->seconds_data, r->seconds_train);
  fprintf(f, "peak RSS          %.1f MiB\n", (double)r->peak_rss / 1048576.0);
}

static void json_num(FILE *f, double x) {
  if (isfinite(x)) fprintf(f, "%.6g", x);
  else fprintf(f, "null");
}

static void json_arr(FILE *f, const double *x, int64_t n) {
  fprintf(f, "[");
  for (int64_t i = 0; i < n; i++) {
    if (i) fprintf(f, ", ");
    json_num(f, x[i]);
  }
  fprintf(f, "]");
}

// "key": {"mean": m, "layers": [...]},
static void json_mean_layers(FILE *f, const char *key, double mean, const double *layers, int64_t n) {
  fprintf(f, "  \"%s\": {\"mean\": ", key);
  json_num(f, mean);
  fprintf(f, ", \"layers\": ");
  json_arr(f, layers, n);
  fprintf(f, "},\n");
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

mole_status train_retain_write_json(const train_retain_report *r, const train_retain_params *p, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return mole_errorf(MOLE_ERR_IO, "--report: cannot create '%s': %s", path, strerror(errno));
  const int64_t L = r->n_layer;
  fprintf(f, "{\n  \"model_arch\": ");
  json_str(f, r->model_arch);
  fprintf(f, ",\n  \"data\": ");
  json_str(f, p->data);
  fprintf(f,
          ",\n  \"n_layer\": %lld, \"n_head\": %lld, \"n_head_kv\": %lld, \"d_in\": %lld, \"hidden\": %lld,\n"
          "  \"seq_len\": %lld, \"window\": %lld, \"sequences_train\": %lld, \"sequences_heldout\": %lld,\n"
          "  \"epochs\": %lld, \"steps\": %lld, \"batch\": %lld, \"lr\": %g, \"wd\": %g, \"smooth\": %g, \"seed\": %llu,\n",
          (long long)L, (long long)r->n_head, (long long)r->n_head_kv, (long long)r->d_in, (long long)r->hidden,
          (long long)r->seq_len, (long long)r->window, (long long)r->n_seq_train, (long long)r->n_seq_heldout,
          (long long)r->epochs, (long long)r->steps, (long long)r->batch, (double)p->lr, (double)p->wd,
          (double)p->smooth, (unsigned long long)p->seed);
  json_mean_layers(f, "heldout_loss_init", r->heldout_loss[0], r->layer_init, L);
  json_mean_layers(f, "heldout_loss_final", r->heldout_loss[r->epochs], r->layer_final, L);
  json_mean_layers(f, "heldout_smoothl1_init", r->heldout_fit[0], r->layer_init_fit, L);
  json_mean_layers(f, "heldout_smoothl1_final", r->heldout_fit[r->epochs], r->layer_final_fit, L);
  fprintf(f, "  \"curve\": {\"train\": ");
  json_arr(f, r->train_loss, r->epochs + 1);
  fprintf(f, ", \"heldout\": ");
  json_arr(f, r->heldout_loss, r->epochs + 1);
  fprintf(f, ", \"heldout_smoothl1\": ");
  json_arr(f, r->heldout_fit, r->epochs + 1);
  fprintf(f, "},\n  \"overlap\": {\"top_k\": %lld, \"n_keys\": %lld, \"random_expected\": ", (long long)r->top_k,
          (long long)r->n_keys);
  json_num(f, r->random_expected);
  for (int i = 0; i < TR_N_POLICY; i++) {
    fprintf(f, ",\n    \"%s\": {\"mean\": ", train_retain_policy_names[i]);
    json_num(f, r->overlap_mean[i]);
    fprintf(f, ", \"layers\": ");
    json_arr(f, r->overlap + i * L, L);
    fprintf(f, "}");
  }
  fprintf(f, "},\n  \"seconds\": {\"data\": %.3f, \"train\": %.3f, \"total\": %.3f},\n  \"peak_rss\": %lld\n}\n",
          r->seconds_data, r->seconds_train, r->seconds, (long long)r->peak_rss);
  if (fclose(f)) return mole_errorf(MOLE_ERR_IO, "--report: cannot write '%s': %s", path, strerror(errno));
  return MOLE_OK;
}

mole_status train_retain_write_csv(const train_retain_report *r, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return mole_errorf(MOLE_ERR_IO, "--csv: cannot create '%s': %s", path, strerror(errno));
  fprintf(f, "epoch,train_loss,heldout_loss,heldout_smoothl1\n");
  for (int64_t e = 0; e <= r->epochs; e++)
    fprintf(f, "%lld,%.6f,%.6f,%.6f\n", (long long)e, r->train_loss[e], r->heldout_loss[e], r->heldout_fit[e]);
  if (fclose(f)) return mole_errorf(MOLE_ERR_IO, "--csv: cannot write '%s': %s", path, strerror(errno));
  return MOLE_OK;
}

// Whether an executable `name` is on $PATH.
static bool on_path(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return false;
  char buf[4096];
  for (const char *a = path; *a;) {
    const char *b = strchr(a, ':');
    const size_t n = b ? (size_t)(b - a) : strlen(a);
    if (n > 0 && n + strlen(name) + 2 < sizeof buf) {
      snprintf(buf, sizeof buf, "%.*s/%s", (int)n, a, name);
      if (!access(buf, X_OK)) return true;
    }
    if (!b) break;
    a = b + 1;
  }
  return false;
}

// `s` as a gnuplot single-quoted string (a quote doubled, nothing else special).
static void gp_str(FILE *f, const char *s) {
  fputc('\'', f);
  for (; *s; s++) {
    if (*s == '\'') fputc('\'', f);
    fputc(*s, f);
  }
  fputc('\'', f);
}

mole_status train_retain_plot(const train_retain_report *r, const char *path) {
  if (!on_path("gnuplot"))
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "--png: gnuplot is not installed (Debian: gnuplot-nox); no plot written");
  FILE *g = popen("gnuplot", "w");
  if (!g) return mole_errorf(MOLE_ERR_IO, "--png: cannot run gnuplot: %s", strerror(errno));
  fprintf(g, "$loss << EOD\n");
  for (int64_t e = 0; e <= r->epochs; e++)
    fprintf(g, "%lld %.6f %.6f %.6f\n", (long long)e, r->train_loss[e], r->heldout_loss[e], r->heldout_fit[e]);
  fprintf(g, "EOD\nset terminal png size 800,500\nset output ");
  gp_str(g, path);
  fprintf(g,
          "\nset title \"retaining heads (%s, %lld layers, window %lld, hidden %lld): loss, mean over layers\"\n"
          "set xlabel \"epoch\"\nset ylabel \"SmoothL1 + smoothness\"\nset grid\nset key top right\n"
          "plot $loss using 1:2 with linespoints title \"train (epoch 0: before training)\", "
          "$loss using 1:3 with linespoints title \"held-out\", "
          "$loss using 1:4 with linespoints title \"held-out, SmoothL1 part\"\n",
          r->model_arch, (long long)r->n_layer, (long long)r->window, (long long)r->hidden);
  const int rc = pclose(g);
  if (rc != 0) return mole_errorf(MOLE_ERR_IO, "--png: gnuplot failed writing '%s' (status %d)", path, rc);
  return MOLE_OK;
}
