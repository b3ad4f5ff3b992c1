// The step loop: a batch of tokens (one or several sequences) through the
// model, top to bottom. Each layer runs the blocks its plan names (arch.c
// chose them when the model loaded); the blocks live in their own files
// (blocks.h lists them) and call the offload, row-splitting, KV-policy and
// hook code at named points.
//
//   tokens [n]      -> embed                                 x [n][n_embd]
//   for each layer il:
//     attention:  x += wo . attn(rope(q, k), kv)(norm(x))    attn.c
//     FFN:        x += ffn(norm(x))                          ffn_dense.c or ffn_moe.c
//   KV commits (eviction if bounded)
//   -> final norm -> output projection       logits [n_out][n_vocab]   logits.c
#include "kv/kv.h"
#include "model/blocks.h"

// The blocks by the kind a layer's plan names.
static const model_block_fn k_attn_blocks[ATTN_COUNT] = {
    [ATTN_GQA] = attn_block,
};
static const model_block_fn k_ffn_blocks[FFN_COUNT] = {
    [FFN_DENSE] = ffn_dense_block,
    [FFN_MOE] = ffn_moe_block,
};

mole_status forward_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
  mole_status st = batch_setup(m, s, segs, n_segs, &s->n_out);
  if (st) return st;
  // x [n][E]: each token's row of token_embd [V][E] as f32
  const quant_traits *et = quant_traits_of(m->tok_embd.type);
  for (int64_t i = 0, t = 0; i < n_segs; i++)
    for (int64_t j = 0; j < segs[i].n; j++, t++) {
      const int32_t tok = segs[i].tokens[j];
      const char *row = (const char *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes;
      if (m->tok_embd.layout == QL_R16) {  // shared with the output projection, repacked
        quant_r16_row(m->tok_embd.type, m->tok_embd.data, E, V, tok, s->xq);
        row = s->xq;
      }
      et->to_float(row, s->x + t * E, E);
    }
  return MOLE_OK;
}

mole_status forward_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  for (int64_t i = 0; i < n_segs; i++) kv_commit(segs[i].kv, segs[i].n);  // eviction, if bounded
  if (s->n_out == 0) return MOLE_OK;
  return logits_compute(m, s, segs, n_segs);
}

mole_status model_forward_batch(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  // disaggregated serving: the root runs the pass in steps (src/parallel/disagg.c, step.c)
  if (m->comm.forward && m->comm.rank == 0) return m->comm.forward(m->comm.ctx, s, segs, n_segs);
  mole_status st = forward_begin(m, s, segs, n_segs);  // x [n][n_embd]
  if (st) return st;
  // several processes: the others learn the batch
  if (m->comm.step && m->comm.rank == 0 && (st = m->comm.step(m->comm.ctx, segs, n_segs))) return st;
  const int64_t n = s->seg_ends[s->n_seg - 1];
  for (int64_t il = 0; il < m->hp.n_layer && !st; il++) {
    const model_layer_plan *lp = &m->layers[il].plan;
    if (!(st = k_attn_blocks[lp->attn](m, s, il, n)))  // x += attention(attn_norm(x))
      st = k_ffn_blocks[lp->ffn](m, s, il, n);        // x += ffn(ffn_norm(x))
  }
  if (!st && m->experts) experts_step_done(m->experts, n);  // the provider's per-step accounting
  if (!st) st = forward_end(m, s, segs, n_segs);            // KV commits; logits
  // the other processes are inside this pass (a failed expert read, no memory for the logits)
  if (st && m->comm.pass_failed && m->comm.rank == 0) m->comm.pass_failed(m->comm.ctx);
  return st;
}

mole_status model_forward(mole_model *m, model_kv *kv, model_scratch *s, const int32_t *tokens, int64_t n,
                          int64_t n_past, float *logits, bool all_logits) {
  if (n <= 0) return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens", (long long)n);
  const model_seg seg = {kv, tokens, n, n_past, logits, all_logits};
  return model_forward_batch(m, s, &seg, 1);
}
