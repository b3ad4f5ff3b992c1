// The scratch of the forward pass (struct model_scratch, blocks.h): every
// buffer a step uses, sized once for a session's batch and context, so that
// nothing is allocated inside the decode loop.
#include "model/blocks.h"

void model_session_shape(const mole_model *m, int64_t *n_ctx, int64_t *n_batch) {
  if (*n_ctx <= 0) *n_ctx = MOLE_MIN(m->hp.n_ctx_train, 4096);
  if (*n_batch <= 0) *n_batch = 512;
  if (*n_batch > *n_ctx) *n_batch = *n_ctx;
}

// The scratch's buffers: one walk over them either allocates (s != NULL) or
// only adds up their bytes, so the size estimate cannot drift from the code.
static bool scratch_walk(const mole_model *m, int64_t n_batch, int64_t n_ctx, model_scratch *s, int64_t *bytes) {
  const model_hparams *hp = &m->hp;
  const int nth = m->n_threads;
  const model_local *lc = &m->loc;  // this process's share of heads and columns
  const int64_t ff_max = MOLE_MAX(MOLE_MAX(lc->n_ff, lc->n_ff_exp), lc->n_ff_shexp);
  const int64_t kmax = MOLE_MAX(MOLE_MAX(hp->n_embd, ff_max), lc->n_head * hp->head_dim_v);
  const size_t q_row = (size_t)kmax * 4 + 64;  // f32 is the widest activation type
  const int64_t q_dim = lc->n_head * hp->head_dim, kv_dim = lc->n_head_kv * hp->head_dim,
                v_dim = lc->n_head_kv * hp->head_dim_v, o_dim = lc->n_head * hp->head_dim_v;
  const int64_t X = MOLE_MAX(hp->n_expert, 1), U = MOLE_MAX(hp->n_expert_used, 1);
  const int64_t B = n_batch, A = n_batch * U;
  const int64_t group = hp->n_head / hp->n_head_kv, att_tb = MOLE_MAX(64 / group, 1);
  model_scratch dummy;
  model_scratch *t = s ? s : &dummy;
  if (s) {
    s->n_batch = n_batch;
    s->n_ctx = n_ctx;
    s->n_assign_max = A;
    s->ff_max = ff_max;
    s->q_row = q_row;
    s->att_tb = att_tb;
    s->h2o_round = H2O_ROUND_FLOATS;
  }
  int64_t sum = 0;
  bool ok = true;
#define ALLOC(p, n)                                                                      \
  do {                                                                                   \
    const size_t nb_ = (size_t)(n) * sizeof *(t->p);                                     \
    sum += (int64_t)nb_;                                                                 \
    if (s) ok = ok && (s->p = mole_aligned_alloc(64, nb_)) != NULL;                      \
  } while (0)
#define ALLOC_BYTES(p, nb)                                                               \
  do {                                                                                   \
    sum += (int64_t)(nb);                                                                \
    if (s) ok = ok && (s->p = mole_aligned_alloc(64, (size_t)(nb))) != NULL;             \
  } while (0)
  ALLOC(x, B * hp->n_embd);
  ALLOC(xn, B * hp->n_embd);
  ALLOC(q, B * q_dim);
  ALLOC(k, B * kv_dim);
  ALLOC(v, B * v_dim);
  ALLOC(att, B * o_dim);
  ALLOC(y, B * hp->n_embd);
  ALLOC(sh, B * hp->n_embd);
  ALLOC(scores, nth * (n_ctx + 64));
  ALLOC(vacc, nth * ATT_VT * hp->head_dim_v);
  ALLOC(att_s, nth * att_tb * group * n_ctx);
  ALLOC(att_q, nth * att_tb * group * hp->head_dim);
  ALLOC(att_p16, nth * n_ctx);
  ALLOC_BYTES(xq, (size_t)A * q_row);
  ALLOC_BYTES(hq, (size_t)A * q_row);
  ALLOC(ff_g, A * ff_max);
  ALLOC(ff_u, A * ff_max);
  ALLOC(ff_o, A * hp->n_embd);
  ALLOC(router, B * X);
  ALLOC(sel, B * U);
  ALLOC(selw, B * U);
  ALLOC(prec, B * U);
  ALLOC(grp_cnt, 2 * X);
  ALLOC(grp_off, 2 * X);
  ALLOC(views, 2 * X);
  ALLOC(slot_tok, A);
  ALLOC(tok_slot, B * U);
  ALLOC(grp_list, 2 * X);
  ALLOC(grp_state, 2 * X);
  ALLOC(tasks, 4 * X + 4);
  ALLOC(seg_ends, B);
  ALLOC(tok_pos, B);
  ALLOC(tok_nkv, B);
  ALLOC(blk_h2o, B);
  ALLOC(tok_kv, B);
  ALLOC(tok_segn, B);
  ALLOC(att_blk, 2 * B);
  ALLOC(out_tok, B);
  ALLOC(out_ends, B);
  ALLOC(sub_ends, B);
  ALLOC(lg_local, m->loc.n_vocab < hp->n_vocab ? B * m->loc.n_vocab : 1);
#undef ALLOC
#undef ALLOC_BYTES
  if (bytes) *bytes = sum;
  return ok;
}

void model_scratch_set_h2o_round(model_scratch *s, int64_t floats) { s->h2o_round = MOLE_MAX(floats, 1); }

int64_t model_scratch_bytes(const mole_model *m, int64_t n_batch, int64_t n_ctx) {
  int64_t b = 0;
  scratch_walk(m, n_batch, n_ctx, NULL, &b);
  return b;
}

mole_status model_scratch_new(const mole_model *m, int64_t n_batch, int64_t n_ctx, model_scratch **out) {
  *out = NULL;
  model_scratch *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "scratch: out of memory");
  if (!scratch_walk(m, n_batch, n_ctx, s, NULL)) {
    model_scratch_free(s);
    return mole_errorf(MOLE_ERR_NOMEM, "scratch: cannot allocate buffers for a batch of %lld tokens", (long long)n_batch);
  }
  *out = s;
  return MOLE_OK;
}

void model_scratch_free(model_scratch *s) {
  if (!s) return;
  void *bufs[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->y, s->sh, s->scores, s->vacc, s->att_s, s->att_q, s->att_p16, s->xq, s->hq,
                  s->ff_g, s->ff_u, s->ff_o, s->router, s->sel, s->selw, s->prec, s->grp_cnt, s->grp_off, s->views, s->slot_tok,
                  s->tok_slot, s->grp_list, s->grp_state, s->tasks, s->seg_ends, s->tok_pos, s->tok_nkv, s->h2o, s->blk_h2o, s->retain_tmp, s->tok_kv, s->tok_segn,
                  s->att_blk, s->out_tok, s->out_ends, s->sub_ends, s->lg_local};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mole_aligned_free(bufs[i]);
  mole_free(s);
}
