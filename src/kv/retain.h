// kv/retain: Locret's retaining heads. Per layer, a small MLP reads one
// token's concat[Q, K, V] (before RoPE, every head of the layer) and gives one
// score per KV head: how much that token's key/value will matter to later
// queries. The KV cache keeps the best-scored entries when it must evict.
//
//   x      = (concat[q, k, v] - in_mean) * in_scale   // [d_in]
//   h      = silu(w1 . x + b1)                          // [n_hidden]
//   score  = w2 . h + b2                                // [n_head_kv]
//
// Stored in a GGUF side file (general.architecture "mole-retain"), loaded
// next to any model whose attention geometry matches.
#ifndef MOLE_KV_RETAIN_H
#define MOLE_KV_RETAIN_H

#include "base/base.h"

typedef struct kv_retain {
  int64_t n_layer, n_head, n_head_kv, head_dim, head_dim_v, n_hidden;
  int64_t d_in;         // n_head*head_dim + n_head_kv*head_dim + n_head_kv*head_dim_v
  int64_t window;       // the label window it was trained with (informational)
  char model_arch[32];  // the architecture it was trained on (informational)
  float *in_mean;       // [n_layer][d_in]
  float *in_scale;      // [n_layer][d_in]
  float *w1;            // [n_layer][n_hidden][d_in]
  float *b1;            // [n_layer][n_hidden]
  float *w2;            // [n_layer][n_head_kv][n_hidden]
  float *b2;            // [n_layer][n_head_kv]
} kv_retain;

// Zeroed weights, in_scale 1: a head that scores everything 0.
mole_status kv_retain_new(int64_t n_layer, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t head_dim_v,
                          int64_t n_hidden, kv_retain **out);
void kv_retain_free(kv_retain *r);
// Reads and validates a heads file (types, shapes, finite values).
mole_status kv_retain_load(const char *path, kv_retain **out);
// Refuses heads made for another geometry, naming the field that differs.
mole_status kv_retain_check(const kv_retain *r, const char *path, int64_t n_layer, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, int64_t head_dim_v);
mole_status kv_retain_save(const kv_retain *r, const char *path);
// Bytes of scratch kv_retain_score needs for n tokens.
size_t kv_retain_tmp_bytes(const kv_retain *r, int64_t n);
// Scores [n][n_head_kv] (stride ldo) of n tokens of `layer` from their
// pre-RoPE q [n][ldq], k [n][ldk], v [n][ldv].
void kv_retain_score(const kv_retain *r, int64_t layer, int64_t n, const float *q, int64_t ldq, const float *k,
                     int64_t ldk, const float *v, int64_t ldv, float *out, int64_t ldo, float *tmp);
// One token's normalized input x [d_in] (as kv_retain_score computes it).
void kv_retain_input(const kv_retain *r, int64_t layer, const float *q, const float *k, const float *v, float *x);

#endif
