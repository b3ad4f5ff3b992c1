// The batch's tables: a forward pass's sequences (model_seg) as per-token
// rows of the scratch (position, KV cache, slots attended to), attention
// blocks, the tokens whose logits are wanted; every sequence checked against
// its KV cache, every token against the vocabulary.
#include "kv/kv.h"
#include "model/blocks.h"

mole_status batch_setup(const mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs, int64_t *n_out) {
  const int64_t V = m->hp.n_vocab, TB = s->att_tb;
  int64_t n = 0, no = 0;
  s->n_seg = s->n_out_seg = s->n_blk = 0;
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    if (g->n <= 0 || n + g->n > s->n_batch)
      return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens in all but the batch holds 1..%lld", (long long)(n + g->n),
                         (long long)s->n_batch);
    if (g->kv->type != segs[0].kv->type)
      return mole_errorf(MOLE_ERR_ARG, "forward: the sequences of one batch need one KV cache type");
    for (int64_t j = 0; j < i; j++)
      if (segs[j].kv == g->kv) return mole_errorf(MOLE_ERR_ARG, "forward: a sequence appears twice in one batch");
    model_kv *kv = g->kv;
    if (kv->budget > 0) {  // bounded: slots after the entries kept, positions go on
      if (g->n > kv->max_pass)
        return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens of one sequence in a pass; its bounded KV cache takes %lld",
                           (long long)g->n, (long long)kv->max_pass);
      if (g->n_past != kv->n_pos)
        return mole_errorf(MOLE_ERR_ARG, "forward: position %lld but the bounded KV cache is at %lld",
                           (long long)g->n_past, (long long)kv->n_pos);
      if (kv->n_used + g->n > kv->n_ctx || g->n_past + g->n > INT32_MAX)
        return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens do not fit the bounded KV cache (%lld + %lld slots)",
                           (long long)g->n, (long long)kv->budget, (long long)(kv->n_ctx - kv->budget));
    } else {
      if (g->n_past < 0 || g->n_past + g->n > kv->n_ctx)
        return mole_errorf(MOLE_ERR_ARG, "context full: %lld + %lld tokens exceed the context of %lld",
                           (long long)g->n_past, (long long)g->n, (long long)kv->n_ctx);
      kv->n_used = kv->n_pos = g->n_past;  // slot = position
    }
    for (int64_t t = 0; t < g->n; t++) {
      if (g->tokens[t] < 0 || g->tokens[t] >= V)
        return mole_errorf(MOLE_ERR_ARG, "token %d at index %lld is out of the vocabulary (0..%lld)", g->tokens[t],
                           (long long)t, (long long)V - 1);
      s->tok_pos[n + t] = g->n_past + t;
      s->tok_nkv[n + t] = g->kv->n_used + t + 1;
      s->tok_kv[n + t] = g->kv;
      s->tok_segn[n + t] = g->n;
    }
    for (int64_t t0 = 0; t0 < g->n; t0 += TB) {  // attention blocks of up to TB tokens, one sequence each
      s->att_blk[2 * s->n_blk] = n + t0;
      s->att_blk[2 * s->n_blk++ + 1] = n + MOLE_MIN(t0 + TB, g->n);
    }
    if (g->logits) {
      for (int64_t t = g->all_logits ? 0 : g->n - 1; t < g->n; t++) s->out_tok[no++] = n + t;
      s->out_ends[s->n_out_seg++] = no;
    }
    n += g->n;
    s->seg_ends[s->n_seg++] = n;
  }
  if (n == 0) return mole_errorf(MOLE_ERR_ARG, "forward: no tokens");
  mole_status st = kvpolicy_reserve(m, s);
  if (st) return st;
  *n_out = no;
  return MOLE_OK;
}

