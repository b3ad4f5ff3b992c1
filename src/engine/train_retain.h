// engine/train_retain: `mole train-retain`, the trainer of Locret's retaining
// heads (kv/retain.h; arXiv 2410.01805). The model runs over a text in
// sequences of seq_len tokens with an attention hook that records, per layer
// and token, the pre-RoPE concat[q, k, v] (the heads' input, kept in f16) and
// the label of every KV head g from the post-RoPE q and k:
//
//   label(j, g) = max over j < i <= min(j + W, seq_len - 1) and the query heads h of g's group
//                 of attn_scale * (q_i,h . k_j,g)
//
// (the largest pre-softmax score key j gets from the next W queries; the last
// token of a sequence has no follower and no label). Each layer's MLP is then
// trained on its own (one layer per thread) with
//
//   loss = mean over labelled (token, kv head) of SmoothL1(pred - label; beta 1)
//        + smooth * mean over neighbouring tokens (t, t+1) of a sequence and kv heads of (pred_t - pred_t+1)^2
//
// by hand-written backprop and AdamW, on minibatches of runs of consecutive
// tokens drawn with a seeded RNG; the last sequences are held out. The report
// puts the heads beside StreamingLLM's recency and H2O's accumulated attention
// on the held-out sequences: the overlap of each policy's top 10% of keys with
// the top 10% by label.
#ifndef MOLE_ENGINE_TRAIN_RETAIN_H
#define MOLE_ENGINE_TRAIN_RETAIN_H

#include <stdio.h>

#include "base/base.h"

// The public parameters (include/mole.h): data, tokens, seq_len, heldout,
// window, hidden, smooth, lr, wd, batch, epochs, seed, max_mem, n_threads.
typedef mole_train_retain_params train_retain_params;

// The policies the report compares on held-out sequences.
enum { TR_STREAMING = 0, TR_H2O, TR_LOCRET, TR_RANDOM, TR_N_POLICY };
extern const char *const train_retain_policy_names[TR_N_POLICY];

typedef struct train_retain_report {
  char model_arch[32];
  int64_t n_layer, n_head, n_head_kv, d_in;
  int64_t seq_len, window, hidden, batch;
  int64_t n_seq_train, n_seq_heldout;  // sequences
  int64_t tokens_found;                // tokens the text gave (as far as it was read)
  int64_t epochs, steps;               // steps per layer
  double *train_loss;    // [epochs + 1] mean over layers: [0] over the training set before any step, then
                         // each epoch's loss over its minibatches as they were trained
  double *heldout_loss;  // [epochs + 1] mean over layers, before any step and after each epoch
  double *layer_init;    // [n_layer] held-out loss before any step
  double *layer_final;   // [n_layer] held-out loss at the end
  double *heldout_fit;   // [epochs + 1] the held-out loss's SmoothL1 part (mean over layers)
  double *layer_init_fit, *layer_final_fit;  // [n_layer] the SmoothL1 part before and after
  int64_t n_keys, top_k;              // keys with a full window per (sequence, kv head), and 10% of them
  double *overlap;                    // [TR_N_POLICY][n_layer] top-10% overlap with the labels
  double overlap_mean[TR_N_POLICY];   // over layers
  double random_expected;             // top_k / n_keys: what a random policy gets on average
  double seconds_data, seconds_train, seconds;
  int64_t peak_rss;  // bytes (getrusage)
} train_retain_report;

train_retain_params train_retain_default_params(void);
// Trains retaining heads for `model` on p->data and writes them to `out`
// (kv_retain_save). Progress goes to log (may be NULL). Free the report's
// arrays with train_retain_report_free, also after an error.
mole_status train_retain_run(const char *model, const char *out, const train_retain_params *p, FILE *log,
                             train_retain_report *rep);
void train_retain_report_free(train_retain_report *rep);
void train_retain_print_report(const train_retain_report *r, const train_retain_params *p, FILE *f);
mole_status train_retain_write_json(const train_retain_report *r, const train_retain_params *p, const char *path);
mole_status train_retain_write_csv(const train_retain_report *r, const char *path);
// The loss curve as a PNG through gnuplot; MOLE_ERR_UNSUPPORTED when gnuplot is not installed.
mole_status train_retain_plot(const train_retain_report *r, const char *path);

// ---- the pieces (train_retain_math.c), exposed for the tests ---------------------

// One layer's MLP: pred = w2 . silu(w1 . x + b1) + b2 (x already normalized).
typedef struct train_retain_mlp {
  int64_t d_in, n_hidden, n_out;
  float *w1;  // [n_hidden][d_in]
  float *b1;  // [n_hidden]
  float *w2;  // [n_out][n_hidden]
  float *b2;  // [n_out]
} train_retain_mlp;

// The two terms of the loss as sums, to be added over several calls:
// loss = fit / n_fit + smooth * sq / n_sq (a term with no count is 0).
typedef struct train_retain_terms {
  double fit, sq;
  int64_t n_fit, n_sq;
} train_retain_terms;

double train_retain_terms_loss(const train_retain_terms *t, float smooth);
// Floats of scratch train_retain_loss needs for n rows.
size_t train_retain_loss_tmp(const train_retain_mlp *w, int64_t n);
// The loss of n rows X [n][d_in] with labels Y [n][n_out], mask [n][n_out]
// (0: no label) and next [n] (1: row t+1 is the token after row t in the same
// sequence); with grad (same shapes as w, own storage) its gradient. Adds the
// batch's sums to terms (may be NULL). tmp: train_retain_loss_tmp floats.
double train_retain_loss(const train_retain_mlp *w, const float *X, int64_t n, const float *Y, const uint8_t *mask,
                         const uint8_t *next, float smooth, train_retain_mlp *grad, train_retain_terms *terms,
                         float *tmp);

// Labels of one sequence of n tokens of one layer from its post-RoPE q
// [n][n_head*head_dim] and k [n][n_head_kv*head_dim]: label [n][n_head_kv]
// as above (row n-1 has no follower: 0, to be masked).
void train_retain_labels(const float *q, const float *k, int64_t n, int64_t n_head, int64_t n_head_kv,
                         int64_t head_dim, float scale, int64_t window, float *label);
// H2O's score: the softmax probability each key j receives from the queries
// i >= j of the sequence (causal attention over it), summed over queries and
// the query heads of each KV head: acc [n][n_head_kv]. tmp: n floats.
void train_retain_h2o(const float *q, const float *k, int64_t n, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      float scale, float *acc, float *tmp);
// |top_k(score) & top_k(label)| / top_k over n keys (key j at score[j * ss],
// label[j * ls]; ties go to the later key). tmp: train_retain_overlap_tmp(n) bytes.
size_t train_retain_overlap_tmp(int64_t n);
double train_retain_overlap(const float *score, int64_t ss, const float *label, int64_t ls, int64_t n, int64_t top_k,
                            void *tmp);

// AdamW on n parameters: m, v moments, step t >= 1, decay applied decoupled.
void train_retain_adamw(float *w, const float *g, float *m, float *v, int64_t n, int64_t t, float lr, float wd);
// The learning rate at step t (0-based) of total: linear warm-up over the
// first warm steps, then cosine decay to 0.
float train_retain_lr(float lr, int64_t t, int64_t total, int64_t warm);

#endif
