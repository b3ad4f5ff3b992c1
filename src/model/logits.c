// The logits: the final norm and the output projection of the tokens that
// want logits (s->out_tok), each sequence's rows as a mul_mat of its own,
// into each sequence's buffer; a process holding a slice of the
// vocabulary computes its rows and the root gathers them.
#include <string.h>

#include "model/blocks.h"

mole_status logits_compute(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  const model_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd, V = hp->n_vocab, no = s->n_out;
  rows_share_x(m, s, s->seg_ends[s->n_seg - 1]);  // every token's final x where rows are split
  if (m->comm.root_vocab && m->comm.rank != 0) return MOLE_OK;  // no gather: the root has every row
  // the vocabulary projection of the tokens that want logits, each
  // sequence's as a mul_mat of its own
  for (int64_t r = 0; r < no; r++) ops_rmsnorm(s->xn + r * E, s->x + s->out_tok[r] * E, m->output_norm, E, hp->rms_eps);
  convert_for(m, s, &m->output, s->xn, E, no, E, s->xq);
  const int64_t VL = m->loc.n_vocab;
  if (VL < V) {  // this process's vocabulary rows; the root gathers them
    ops_mm to = {&m->output, 0, s->xq, s->q_row, no, s->lg_local, VL, false, s->n_out_seg, s->out_ends};
    ops_mm_run(m->pool, &to, 1);
    float *all = NULL;
    if (m->comm.rank == 0) {
      all = s->ff_g;
      if ((size_t)no * (size_t)V > (size_t)s->n_assign_max * (size_t)s->ff_max) {
        all = mole_malloc((size_t)no * (size_t)V * sizeof(float));  // all logits of a long prompt: rare
        if (!all) return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for %lld rows of logits", (long long)no);
      }
    }
    m->comm.gather_logits(m->comm.ctx, s->lg_local, no, VL, all);
    if (m->comm.rank == 0)
      for (int64_t i = 0, o = 0, r0 = 0; i < n_segs; i++) {
        if (!segs[i].logits) continue;
        const int64_t r1 = s->out_ends[o++];
        memcpy(segs[i].logits, all + r0 * V, (size_t)((r1 - r0) * V) * sizeof(float));
        r0 = r1;
      }
    if (all != s->ff_g) mole_free(all);
    return MOLE_OK;
  }
  float *lg = s->ff_g;  // [no][V] when it fits the scratch, else per sequence straight into its buffer
  const bool staged = (size_t)no * (size_t)V <= (size_t)s->n_assign_max * (size_t)s->ff_max;
  if (staged) {
    ops_mm to = {&m->output, 0, s->xq, s->q_row, no, lg, V, false, s->n_out_seg, s->out_ends};
    ops_mm_run(m->pool, &to, 1);
  }
  for (int64_t i = 0, o = 0, r0 = 0; i < n_segs; i++) {
    if (!segs[i].logits) continue;
    const int64_t r1 = s->out_ends[o++], nr = r1 - r0;
    if (staged) {
      memcpy(segs[i].logits, lg + r0 * V, (size_t)(nr * V) * sizeof(float));
    } else {
      ops_mm to = {&m->output, 0, (char *)s->xq + (size_t)r0 * s->q_row, s->q_row, nr, segs[i].logits, V, false, 0, NULL};
      ops_mm_run(m->pool, &to, 1);
    }
    r0 = r1;
  }
  return MOLE_OK;
}
