// model: architectures (hparams, weights bound to GGUF tensors, the blocks
// each layer runs) and the forward pass. Internal header; the public face is
// include/mole.h. The files: arch.c (the descriptions), load.c (metadata,
// tensor binding), forward.c (the step loop) over the blocks of blocks.h.
#ifndef MOLE_MODEL_H
#define MOLE_MODEL_H

#include "base/base.h"
#include "base/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/quant_matrix.h"

typedef struct model_hparams {
  int64_t n_vocab;
  int64_t n_ctx_train;
  int64_t n_embd;
  int64_t n_layer;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim;      // key/query length per head
  int64_t head_dim_v;    // value length per head
  int64_t n_rot;         // rotated dims per head (<= head_dim)
  int64_t n_ff;          // dense FFN width (0 when every layer is MoE)
  int64_t n_expert;      // 0 = dense
  int64_t n_expert_used;
  int64_t n_ff_exp;      // expert FFN width
  int64_t n_ff_shexp;    // shared expert FFN width (qwen2moe)
  float rms_eps;
  float rope_base;
  float rope_freq_scale;  // 1/linear scaling factor
  float attn_scale;       // 1/sqrt(head_dim) unless the file says otherwise
  float expert_weights_scale;  // 0 or 1 = none
  bool rope_neox;         // rotate (x[i], x[i+n_rot/2]) instead of (x[2i], x[2i+1])
  bool norm_topk;         // renormalise the chosen experts' weights to sum 1
} model_hparams;

// What one layer runs, chosen by its architecture's description (arch.c)
// when the model loads; the step loop (forward.c) calls the blocks it names
// and load.c binds the tensors they read.
typedef enum {
  ATTN_GQA = 0,  // grouped-query (or multi-head) attention over the KV cache (attn.c)
  ATTN_COUNT
} model_attn_kind;
typedef enum {
  FFN_DENSE = 0,  // gated MLP, silu(gate) * up -> down (ffn_dense.c)
  FFN_MOE,        // router -> routing function -> routed experts (+ shared expert) (ffn_moe.c)
  FFN_COUNT
} model_ffn_kind;
typedef enum {
  QK_NORM_NONE = 0,
  QK_NORM_HEAD,  // RMS norm of q and k per head (qwen3moe)
  QK_NORM_FULL   // RMS norm over the whole q / k projection (olmoe)
} model_qk_norm;
typedef struct model_route model_route;  // a routing function (route.h)
typedef struct model_layer_plan {
  model_attn_kind attn;
  model_qk_norm qk_norm;     // attention: the q/k norm
  bool qkv_bias;             // attention: attn_q/k/v.bias required (optional otherwise, used when present)
  model_ffn_kind ffn;
  const model_route *route;  // FFN_MOE: the routing function
  bool shexp;                // FFN_MOE: a shared expert scaled by a sigmoid gate (qwen2moe)
} model_layer_plan;

// A weight as stored in the file (quant/quant_matrix.h).
typedef quant_matrix model_tensor;

typedef struct model_layer {
  model_layer_plan plan;    // its blocks
  const float *attn_norm;   // [n_embd]
  model_tensor wq;          // [n_head*head_dim][n_embd]
  model_tensor wk;          // [n_head_kv*head_dim][n_embd]
  model_tensor wv;          // [n_head_kv*head_dim_v][n_embd]
  model_tensor wo;          // [n_embd][n_head*head_dim_v]
  const float *bq, *bk, *bv, *bo;  // optional biases
  const float *q_norm;      // [head_dim] (per head) or [n_head*head_dim] (full)
  const float *k_norm;      // [head_dim] or [n_head_kv*head_dim]
  const float *ffn_norm;    // [n_embd]
  // dense FFN
  model_tensor ffn_gate;    // [n_ff][n_embd]
  model_tensor ffn_up;      // [n_ff][n_embd]
  model_tensor ffn_down;    // [n_embd][n_ff]
  // MoE
  model_tensor gate_inp;    // [n_expert][n_embd] router
  model_tensor gate_exps;   // [n_expert][n_ff_exp][n_embd]
  model_tensor up_exps;     // [n_expert][n_ff_exp][n_embd]
  model_tensor down_exps;   // [n_expert][n_embd][n_ff_exp]
  // shared expert (qwen2moe)
  const float *gate_inp_shexp;  // [n_embd]
  model_tensor gate_shexp;  // [n_ff_shexp][n_embd]
  model_tensor up_shexp;    // [n_ff_shexp][n_embd]
  model_tensor down_shexp;  // [n_embd][n_ff_shexp]
} model_layer;

// The share of the model this process computes when several run it together
// (tensor parallelism, src/parallel/): whole KV heads with their query heads,
// and ranges of the dense FFN's columns, of every routed expert's FFN
// columns, of the shared expert's, and of the output's vocabulary rows.
// Column-parallel matrices (wq, wk, wv, gate, up, output) keep their rows of
// the share, row-parallel ones (wo, down) the matching columns of every row;
// the rest is replicated. Without `given`, ends of 0 mean the whole range.
typedef struct model_shard {
  bool given;  // the ranges as they are (a share may be empty)
  int64_t kvh0, kvh1;
  int64_t ff0, ff1;
  int64_t fe0, fe1;
  int64_t fs0, fs1;
  int64_t voc0, voc1;
  int64_t ex0, ex1;  // the routed experts held (disaggregated: an expert rank's, none on an attention rank)
} model_shard;

// The dimensions of this process's share (the whole model's when unsharded).
typedef struct model_local {
  int64_t n_head, n_head_kv;  // heads computed here
  int64_t n_ff, n_ff_exp, n_ff_shexp;  // FFN columns computed here
  int64_t n_vocab;            // output rows computed here
} model_local;

// How the processes that share a model (src/parallel/ fills it in) exchange
// activations; all hooks NULL for one process. Rows are token rows of `row`
// floats. `on_rows(user, a, b)` computes rows [a, b) of a matmul around a
// collective: with overlap the collective runs as a ring and calls it tile
// by tile while the next tile is on the wire; without, once for all rows.
typedef void (*model_rows_fn)(void *user, int64_t a, int64_t b);
typedef struct model_seg model_seg;
typedef struct model_scratch model_scratch;
typedef struct model_comm {
  void *ctx;
  int rank, size;
  bool hmp;  // norms and residual adds split by tokens (Galaxy); else replicated (Megatron)
  bool root_vocab;  // the root holds every vocabulary row: it computes the logits alone, the others none
  // rows [*t0, *t1) of a batch of n tokens that process `rank` holds (hmp)
  void (*token_split)(void *ctx, int64_t n, int rank, int64_t *t0, int64_t *t1);
  // sum over the processes, in place (f32 or f64 elements)
  void (*allreduce)(void *ctx, void *buf, int64_t n, bool f64);
  // hmp: every process's own rows of x [n][row] to every process; on_rows
  // (may be NULL) computes on each process's rows as they arrive
  void (*allgather)(void *ctx, float *x, int64_t n, int64_t row, model_rows_fn on_rows, void *user);
  // hmp: the sum over processes of y's own rows lands here; make_rows fills
  // rows of y (this process's part of the sum) just before they are sent
  void (*reduce_scatter)(void *ctx, float *y, int64_t n, int64_t row, model_rows_fn make_rows, void *user);
  // hmp: the three above in one, for blocks whose every step is per token
  // (a MoE layer): every process's own rows of x to every process,
  // compute(user, a, b) fills rows [a, b) of y (this process's part of the
  // sum) from rows [a, b) of x, and the sum over processes of y's own rows
  // lands here. With overlap compute runs on this process's rows first, then
  // on each other process's as they arrive, chunk by chunk, every chunk's
  // part sent to its owner at once; without, once between a plain
  // all-gather and reduce-scatter. NULL: not available.
  void (*exchange)(void *ctx, float *x, float *y, int64_t n, int64_t row, model_rows_fn compute, void *user);
  // every process's vocabulary slice of n rows of logits [n][v_local] to the
  // root's out [n][n_vocab] (NULL elsewhere)
  void (*gather_logits)(void *ctx, const float *local, int64_t n, int64_t v_local, float *out);
  // root: the batch all processes are about to run (broadcast)
  mole_status (*step)(void *ctx, const model_seg *segs, int64_t n_segs);
  // root: a KV cache is gone (the others free theirs); the model is closing
  void (*kv_release)(void *ctx, uint64_t kv_id);
  // root: this pass failed after step() had started it everywhere; the others
  // wait inside its collectives and cannot learn it, so the job ends (with
  // the error printed); NULL: nothing to do
  void (*pass_failed)(void *ctx);
  // root: runs the whole pass in place of model_forward_batch (disaggregated
  // attention and experts, src/parallel/disagg.c); NULL: the pass runs here
  mole_status (*forward)(void *ctx, model_scratch *s, const model_seg *segs, int64_t n_segs);
  // the other ranks' loop (mole_dist_worker); NULL: dist.c's
  mole_status (*worker)(void *ctx);
  void (*close)(void *ctx);
} model_comm;

// A hook on the routed experts of every MoE layer (mole compress's
// calibration, src/compress/): called with the layer's FFN input rows xn
// [n][n_embd] and the routing (sel, w [n][n_expert_used]); returns true when
// it has written the routed experts' weighted output y [n][n_embd] itself,
// false to let the provider's experts compute it.
typedef bool (*model_moe_hook)(void *ctx, int64_t layer, int64_t n, const float *xn, const int32_t *sel,
                               const float *w, float *y);

// A hook on every attention layer (mole train-retain): called twice per layer
// with this pass's n token rows, q [n][n_head*head_dim], k [n][n_head_kv*
// head_dim], v [n][n_head_kv*head_dim_v]: before RoPE (roped false) and after
// (roped true, just before the keys are cached).
typedef void (*model_attn_hook)(void *ctx, int64_t layer, int64_t n, const float *q, const float *k, const float *v,
                                bool roped);

struct mole_model {
  gguf_file *gguf;
  model_comm comm;         // several processes (src/parallel/); zeroed for one
  model_hparams hp;
  model_shard shard;       // resolved (no 0 ends) after load
  model_local loc;
  char arch_name[32];
  model_tensor tok_embd;   // [n_vocab][n_embd]
  const float *output_norm;  // [n_embd]
  model_tensor output;     // [n_vocab][n_embd] (tok_embd when tied)
  const float *rope_freqs; // optional [n_rot/2] frequency divisors
  model_layer *layers;     // [n_layer]
  float *f32_store;        // norms/biases converted to f32 (owned)
  mole_pool *pool;
  int n_threads;
  mole_offload_params offload;
  struct experts *experts;  // expert provider (experts/experts.h); NULL for dense models
  model_moe_hook moe_hook;  // NULL but while compressing
  void *moe_hook_ctx;
  model_attn_hook attn_hook;  // NULL but while training retaining heads
  void *attn_hook_ctx;
  uint8_t *image;          // weights image (image.c), NULL with use_mmap
  size_t image_size;       // its reserved span (a mirror of the file)
  int64_t image_bytes;     // the bytes copied into it
};

// Loads hparams and binds every tensor, validating names, shapes and types.
// shard: this process's share (NULL: the whole model).
mole_status model_load(const char *path, const mole_model_params *p, const model_shard *shard, mole_model **out);

// The weights image (image.c): the weights every step reads copied into
// anonymous memory on huge pages, R16 where supported, at image + file
// offset; the model's tensors (and the resident expert views) repointed.
mole_status model_image_build(mole_model *m);
void model_image_free(mole_model *m);
void model_free(mole_model *m);

// ---- forward ------------------------------------------------------------
typedef struct model_kv model_kv;   // KV cache (kv/kv.h)

// Scratch for up to n_batch tokens, sized once (no allocation per step).
mole_status model_scratch_new(const mole_model *m, int64_t n_batch, int64_t n_ctx, model_scratch **out);
void model_scratch_free(model_scratch *s);
// The floats one round of h2o sums may take (default H2O_ROUND_FLOATS in
// blocks.h; at least one attention block's are always allowed): tests make
// it small to run a pass's attention blocks in several rounds.
void model_scratch_set_h2o_round(model_scratch *s, int64_t floats);
// What model_scratch_new allocates for that shape, in bytes.
int64_t model_scratch_bytes(const mole_model *m, int64_t n_batch, int64_t n_ctx);
// A session's context and prefill chunk with the defaults filled in (<= 0:
// min(train ctx, 4096) and 512; the chunk never exceeds the context).
void model_session_shape(const mole_model *m, int64_t *n_ctx, int64_t *n_batch);

// One sequence's share of a forward batch: n tokens at positions n_past..
// appended to its own KV cache. logits: NULL, or [n][n_vocab] when
// all_logits, else [n_vocab] for the last token.
struct model_seg {
  model_kv *kv;
  const int32_t *tokens;
  int64_t n, n_past;
  float *logits;
  bool all_logits;
};
// Several sequences in one pass (their tokens together at most n_batch):
// the matmuls run once over all of them, routed experts are grouped across
// them (each fetched once), each token attends to its own sequence. Every
// sequence's logits are those it gets alone (each matmul follows the order
// of a mul_mat of that sequence's tokens).
mole_status model_forward_batch(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);

// The same pass step by step, for a MoE model whose routed experts run
// elsewhere (src/parallel/disagg.c): begin (the batch's tables, embeddings);
// for every layer, attn (attention, the FFN norm, the router: out points at
// the n rows xn [n][n_embd] and their k choices sel, w [n][k]), then ffn_end
// with each choice's unweighted expert output, row idx[t*k + c] of out
// (rows `stride` floats apart; -1: skipped), which adds them with the router's weights, the
// shared expert and the residual; end (KV commits, logits). The logits are
// model_forward_batch's bit for bit when the outputs are.
typedef struct model_moe_rows {
  int64_t n, k;
  const float *xn;
  const int32_t *sel;
  const float *w;
} model_moe_rows;
mole_status model_step_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);
void model_step_attn(mole_model *m, model_scratch *s, int64_t il, model_moe_rows *out);
void model_step_ffn_end(mole_model *m, model_scratch *s, int64_t il, const float *out, const int64_t *idx,
                        int64_t stride);
mole_status model_step_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);
// The other side: layer il's routed experts on n rows xn[r] [n_embd], one
// choice each (expert sel[r], router weight w[r], which the offload plan
// reads): out[r] [n_embd] each row's unweighted output, done[r] false where
// the plan skipped it. s holds at least n tokens.
mole_status model_experts_rows(mole_model *m, model_scratch *s, int64_t il, int64_t n, const float *const *xn,
                               const int32_t *sel, const float *w, float *const *out, uint8_t *done);

// Runs n tokens at positions n_past.. (n <= n_batch), appending to kv.
// logits: [n][n_vocab] when all_logits, else [n_vocab] for the last token; may be NULL.
mole_status model_forward(mole_model *m, model_kv *kv, model_scratch *s, const int32_t *tokens, int64_t n,
                          int64_t n_past, float *logits, bool all_logits);

#endif
