// The forward pass's pieces, shared by the files of src/model/:
//   forward.c    the step loop (embeddings, layers, KV commits, logits)
//   attn.c       attention block (attn_f32.c, attn_f16.c: its kernels)
//   ffn_dense.c  dense FFN block; ffn_moe.c the MoE FFN block (route.c: routing functions)
//   offload.c    routed experts from the expert provider, in waves (HOBBIT)
//   rows.c       row splitting between processes (Galaxy, model_comm)
//   step.c       the step API of disaggregated serving (model_step_*)
//   kvpolicy.c   the KV policies' hooks (h2o sums, locret scores)
//   hooks.c      the compress and train-retain hooks
//   batch.c      the batch's tables; logits.c the output; scratch.c the scratch
// Every block works on the n token rows of the batch in the scratch.
#ifndef MOLE_BLOCKS_H
#define MOLE_BLOCKS_H

#include "experts/experts.h"
#include "model/model.h"
#include "model/ops.h"

enum { ATT_VT = 32 };  // keys per tile of the f16 attention's p.V
// h2o: the attention blocks of a pass run in rounds whose per-block sums fit
// this many floats (a long chunk's blocks would otherwise need blocks x
// KV heads x context floats at once)
enum { H2O_ROUND_FLOATS = 1 << 20 };

struct model_scratch {
  int64_t n_batch, n_ctx, n_assign_max, ff_max;
  size_t q_row;       // bytes of one converted activation row (largest k)
  float *x;           // [n_batch][n_embd] residual stream
  float *xn;          // [n_batch][n_embd] normed input of a block
  float *q;           // [n_batch][n_head*head_dim]
  float *k;           // [n_batch][n_head_kv*head_dim]
  float *v;           // [n_batch][n_head_kv*head_dim_v]
  float *att;         // [n_batch][n_head*head_dim_v]
  float *y;           // [n_batch][n_embd] block output
  float *sh;          // [n_batch][n_embd] shared expert output
  float *scores;      // [nth][n_ctx + 64] attention scores per thread (f32 cache)
  float *vacc;        // [nth][ATT_VT][head_dim_v] value rows as f32 per thread (a tile of keys)
  int64_t att_tb;     // tokens per attention block (f16 cache)
  float *att_s;       // [nth][att_tb*group][n_ctx] scores of a block (f16 cache)
  uint16_t *att_q;    // [nth][att_tb*group][head_dim] f16 queries of a block
  uint16_t *att_p16;  // [nth][n_ctx] one row of probabilities in f16
  void *xq;           // [n_assign_max][q_row] converted activations
  void *hq;           // [n_assign_max][q_row] converted FFN hidden rows
  float *ff_g;        // [n_assign_max][ff_max]
  float *ff_u;        // [n_assign_max][ff_max]
  float *ff_o;        // [n_assign_max][n_embd] expert outputs
  float *router;      // [n_batch][n_expert] logits, then probabilities
  int32_t *sel;       // [n_batch][n_expert_used] chosen experts
  float *selw;        // [n_batch][n_expert_used] their weights
  uint8_t *prec;      // [n_batch][n_expert_used] precision of each choice
  int64_t *grp_cnt;   // [2*n_expert] slots of each (expert, precision) group
  int64_t *grp_off;   // [2*n_expert] first slot of each group
  expert_view *views; // [2*n_expert] weights of each group in use
  int64_t *slot_tok;  // [n_assign_max] token of each assignment slot
  int64_t *tok_slot;  // [n_batch][n_expert_used] slot of each (token, choice)
  int64_t *grp_list;  // [2*n_expert] groups computed together
  uint8_t *grp_state; // [2*n_expert] offload_experts' progress on each group
  ops_mm *tasks;      // [4*n_expert + 4]
  // the batch's sequences (model_forward_batch)
  int64_t n_seg, n_out;
  int64_t *seg_ends;  // [n_batch] cumulative token counts per sequence
  int64_t *tok_pos;   // [n_batch] position of each token
  int64_t *tok_nkv;   // [n_batch] cache slots each token attends to (its own is the last)
  float *h2o;         // [a round's h2o blocks][n_head_kv][their cache's n_ctx] attention each slot received from a block
  int64_t h2o_cap;    // floats at h2o: a round's blocks fit (grown on demand, h2o_round or one block's)
  int64_t h2o_round;  // floats a round may take (H2O_ROUND_FLOATS)
  int64_t *blk_h2o;   // [n_batch] offset of each attention block's sums in h2o in its round; -1: not h2o
  bool any_h2o;       // a sequence of the batch has a bounded h2o cache
  void *retain_tmp;   // kv_retain_tmp_bytes of the pass's largest locret sequence (grown on demand)
  size_t retain_tmp_cap;
  model_kv **tok_kv;  // [n_batch] KV cache of each token's sequence
  int64_t *tok_segn;  // [n_batch] tokens of each token's sequence in this batch
  int64_t n_blk;
  int64_t *att_blk;   // [n_batch][2] attention blocks (f16 cache): first, end token, one sequence each
  int64_t *out_tok;   // [n_batch] tokens whose logits are wanted
  int64_t n_out_seg;
  int64_t *out_ends;  // [n_batch] cumulative counts of those per sequence
  int64_t *sub_ends;  // [n_batch] segment ends within a tile of rows (model_comm overlap)
  float *lg_local;    // [n_batch][local vocab rows] this process's logits slice (sharded output)
};

// A block of layer il on the batch's n tokens: reads the residual stream
// s->x [n][n_embd] and adds its output to it.
typedef mole_status (*model_block_fn)(mole_model *m, model_scratch *s, int64_t il, int64_t n);

// ---- matmul helpers ---------------------------------------------------------
// Converts n rows of `x` (stride ldx, length k) for a matmul with w into dst (rows s->q_row apart).
static inline void convert_for(const mole_model *m, const model_scratch *s, const model_tensor *w, const float *x,
                               int64_t ldx, int64_t n, int64_t k, void *dst) {
  ops_convert_rows(m->pool, ops_vec_type(w), x, ldx, n, k, dst, s->q_row);
}
// A dense matmul over the batch's n tokens (each sequence's tokens in the
// order they would have alone, s->seg_ends).
static inline ops_mm mm_of(const model_scratch *s, const model_tensor *w, const void *x, size_t xstride, int64_t n,
                           float *y, int64_t ldy) {
  return (ops_mm){w, 0, x, xstride, n, y, ldy, false, s->n_seg, s->seg_ends};
}
// One expert's share of a routed matmul (per-token orders).
static inline ops_mm mm_expert(const model_tensor *w, const void *x, size_t xstride, int64_t n, float *y, int64_t ldy) {
  return (ops_mm){w, 0, x, xstride, n, y, ldy, true, 0, NULL};
}

// ---- forward.c: the step's two ends (also the step API's) -------------------
// The batch's tables and its tokens' embeddings in s->x [n][n_embd].
mole_status forward_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);
// The KV caches' commits (eviction, if bounded), then the logits wanted.
mole_status forward_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);

// ---- batch.c ----------------------------------------------------------------
// Fills the scratch's per-token tables from the sequences and checks them;
// *n_out: the tokens whose logits are wanted.
mole_status batch_setup(const mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs, int64_t *n_out);

// ---- logits.c ---------------------------------------------------------------
// Final norm and output projection of the tokens that want logits, into
// each sequence's buffer (the vocabulary slices gathered when sharded).
mole_status logits_compute(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);

// ---- attn.c, attn_f32.c, attn_f16.c -----------------------------------------
mole_status attn_block(mole_model *m, model_scratch *s, int64_t il, int64_t n);
// One run of the attention kernels over attention blocks [blk0, blk1) (one
// h2o round): softmax(q.K^T * scale, causal) . V into s->att.
typedef struct attn_job {
  const mole_model *m;
  model_scratch *s;
  int64_t layer, n;
  bool h2o;            // a sequence of the batch is h2o: blocks add their attention weights into s->h2o
  int64_t blk0, blk1;  // the attention blocks of this run (one round)
} attn_job;
void attn_worker_f32(void *ctx, int ith, int nth);  // f32 cache (pool worker on an attn_job)
void attn_worker_f16(void *ctx, int ith, int nth);  // f16 cache

// ---- ffn_dense.c ------------------------------------------------------------
mole_status ffn_dense_block(mole_model *m, model_scratch *s, int64_t il, int64_t n);
// silu(gate) * up -> down of F columns over the n rows of s->xn, into y [n][n_embd].
void ffn_dense_run(mole_model *m, model_scratch *s, const model_tensor *wg, const model_tensor *wu,
                   const model_tensor *wd, int64_t n, int64_t F, float *y);

// ---- ffn_moe.c --------------------------------------------------------------
mole_status ffn_moe_block(mole_model *m, model_scratch *s, int64_t il, int64_t n);
// The pieces the step API runs on its own: the FFN's input normed (moe_pre),
// the router and its routing function (moe_route: s->sel, s->selw [n][k]),
// the choices' outputs weighted into s->y (moe_combine), the shared expert,
// the sum over processes and the residual (moe_post).
void moe_pre(mole_model *m, model_scratch *s, int64_t il, int64_t n);
void moe_route(mole_model *m, model_scratch *s, int64_t il, int64_t n);
void moe_combine(const mole_model *m, model_scratch *s, int64_t n, const float *out, const int64_t *idx,
                 int64_t stride);
void moe_post(mole_model *m, model_scratch *s, int64_t il, int64_t n);
// The expert FFNs of groups gs[0..ng) whose weights are in s->views (offload.c).
void moe_compute_groups(mole_model *m, model_scratch *s, int64_t n, const int64_t *gs, int64_t ng,
                        quant_type conv_t[2]);

// ---- offload.c --------------------------------------------------------------
// Layer il's routed experts on n rows of s->xn with k choices each (s->sel,
// s->selw [n][k]): the unweighted output of choice i in s->ff_o row
// s->tok_slot[i] (-1: skipped by the plan).
mole_status offload_experts(mole_model *m, model_scratch *s, int64_t il, int64_t n, int64_t k);

// ---- rows.c: row splitting between processes (model_comm) -------------------
// The token rows this process's connective blocks (norms, residuals) hold.
void rows_own(const mole_model *m, int64_t n, int64_t *t0, int64_t *t1);
// xn of every token (hmp: gathered), compute(a, b) run on rows as they come.
void rows_gather(mole_model *m, model_scratch *s, int64_t n, model_rows_fn compute, void *user);
// y summed over the processes, its parts made by fill(a, b).
void rows_reduce(mole_model *m, model_scratch *s, int64_t n, model_rows_fn fill, void *user);
// hmp with an exchange: fn (a per-token block's middle: xn -> y, on the
// rows it is given) run on every process's rows as they arrive; this
// process's rows of y come back summed.
mole_status rows_exchange(mole_model *m, model_scratch *s, int64_t il, int64_t n, model_block_fn fn);
// A matmul over token rows [a, b) only (a tile around a collective).
ops_mm rows_mm(model_scratch *s, const model_tensor *w, const void *x, size_t xstride, int64_t a, int64_t b, float *y,
               int64_t ldy);
// RMS norm of x over a projection of which this process holds n_local of n_global.
void rows_norm_full(mole_model *m, float *x, const float *w, int64_t n_local, int64_t n_global);
// Every token's final x on every process (hmp).
void rows_share_x(mole_model *m, model_scratch *s, int64_t n);

// ---- kvpolicy.c: the KV policies' hooks ------------------------------------
// The h2o sums and the retaining heads' scratch this batch needs (batch_setup).
mole_status kvpolicy_reserve(const mole_model *m, model_scratch *s);
// locret: the new entries of every locret sequence scored by its retaining heads.
void kvpolicy_locret_score(const mole_model *m, model_scratch *s, int64_t il);
// What kv_store keeps beside token t's entry (its sequence's first token a):
// its locret scores [NKV], or NULL.
const float *kvpolicy_locret_row(const model_scratch *s, int64_t t, int64_t a, int64_t NKV);
// h2o: the end of the round of attention blocks starting at r0 whose sums fit.
int64_t kvpolicy_h2o_round(model_scratch *s, int64_t NKV, int64_t r0);
// h2o: the sums of block b for KV head g (zeroed for n_kv keys), or NULL.
float *kvpolicy_h2o_sums(const model_scratch *s, int64_t b, int64_t g, int64_t n_kv);
// h2o: the round's sums added into the caches' scores.
void kvpolicy_h2o_add(model_scratch *s, int64_t il, int64_t NKV, int64_t blk0, int64_t blk1);

// ---- hooks.c: mole compress's and mole train-retain's hooks -----------------
// train-retain: this pass's q, k, v of layer il (before RoPE, then after).
void hooks_attn(const mole_model *m, const model_scratch *s, int64_t il, int64_t n, bool roped);
// compress: true when the hook wrote the routed experts' sum into s->y itself.
bool hooks_moe(const mole_model *m, model_scratch *s, int64_t il, int64_t n);

#endif
