// Row splitting between the processes that share a model (Galaxy's hybrid
// parallelism, src/parallel/ fills in model_comm): the blocks call these at
// their collectives. With one process every hook is a plain call on all the
// rows. hmp: connective steps (norms, residual adds) on this process's token
// rows, the matmuls on every row, gathered before (column-parallel Q/K/V,
// gate/up) and reduce-scattered after (row-parallel wo, down), tile by tile
// as rows arrive; tp: every row everywhere, the row-parallel parts all-reduced.
#include <math.h>
#include <string.h>

#include "model/blocks.h"

// Its share of the batch (hmp), else all of the rows.
void rows_own(const mole_model *m, int64_t n, int64_t *t0, int64_t *t1) {
  if (m->comm.hmp) {
    m->comm.token_split(m->comm.ctx, n, m->comm.rank, t0, t1);
  } else {
    *t0 = 0;
    *t1 = n;
  }
}

// xn of every token: this process's rows gathered with the others' (hmp),
// compute(a, b) run on the rows as they come; else compute on all of them.
void rows_gather(mole_model *m, model_scratch *s, int64_t n, model_rows_fn compute, void *user) {
  if (m->comm.hmp) {
    m->comm.allgather(m->comm.ctx, s->xn, n, m->hp.n_embd, compute, user);
    return;
  }
  if (compute) compute(user, 0, n);
}

// y over the processes: the sum of the row-parallel matmul's parts, made by
// fill(a, b); with hmp only this process's rows are summed here.
void rows_reduce(mole_model *m, model_scratch *s, int64_t n, model_rows_fn fill, void *user) {
  const int64_t E = m->hp.n_embd;
  if (m->comm.hmp) {
    m->comm.reduce_scatter(m->comm.ctx, s->y, n, E, fill, user);
    return;
  }
  if (fill) fill(user, 0, n);
  if (m->comm.allreduce) m->comm.allreduce(m->comm.ctx, s->y, n * E, false);
}

// The sequences' ends clipped to token rows [a, b), counted from a, into
// s->sub_ends; returns how many.
static int64_t rows_clip_ends(model_scratch *s, int64_t a, int64_t b) {
  int64_t k = 0;
  for (int64_t i = 0; i < s->n_seg; i++) {
    const int64_t e = MOLE_MIN(s->seg_ends[i], b);
    if (e > a && (k == 0 || e - a > s->sub_ends[k - 1])) s->sub_ends[k++] = e - a;
  }
  return k;
}

// mm_of over token rows [a, b) only: x and y offset by a.
ops_mm rows_mm(model_scratch *s, const model_tensor *w, const void *x, size_t xstride, int64_t a, int64_t b, float *y,
               int64_t ldy) {
  const int64_t k = rows_clip_ends(s, a, b);
  return (ops_mm){w, 0, (const char *)x + (size_t)a * xstride, xstride, b - a, y + a * ldy, ldy, false, k, s->sub_ends};
}

// A per-token block's middle run on token rows [a, b) only: xn, y and sh
// seen from row a, the sequences' ends clipped to the rows, for the hmp
// exchange, which runs it on rows as they arrive.
typedef struct {
  mole_model *m;
  model_scratch *s;
  int64_t il;
  model_block_fn fn;
  mole_status st;
} rows_exchange_job;

static void rows_exchange_part(void *user, int64_t a, int64_t b) {
  rows_exchange_job *j = user;
  model_scratch *s = j->s;
  if (j->st || b <= a) return;
  const int64_t E = j->m->hp.n_embd;
  float *xn = s->xn, *y = s->y, *sh = s->sh;
  int64_t *ends = s->seg_ends, n_seg = s->n_seg;
  s->n_seg = rows_clip_ends(s, a, b);  // (the block's matmuls must not overwrite sub_ends: no rows_mm in it)
  s->seg_ends = s->sub_ends;
  s->xn += a * E;
  s->y += a * E;
  if (sh) s->sh += a * E;
  j->st = j->fn(j->m, s, j->il, b - a);
  s->xn = xn;
  s->y = y;
  s->sh = sh;
  s->seg_ends = ends;
  s->n_seg = n_seg;
}

mole_status rows_exchange(mole_model *m, model_scratch *s, int64_t il, int64_t n, model_block_fn fn) {
  rows_exchange_job j = {m, s, il, fn, MOLE_OK};
  m->comm.exchange(m->comm.ctx, s->xn, s->y, n, m->hp.n_embd, rows_exchange_part, &j);
  return j.st;
}

// RMS norm of x over the whole projection when a process holds only part of
// it (olmoe's q/k norm under tensor parallelism): the sum of squares of
// every process's part.
void rows_norm_full(mole_model *m, float *x, const float *w, int64_t n_local, int64_t n_global) {
  double sum = 0.0;
  for (int64_t i = 0; i < n_local; i++) sum += (double)(x[i] * x[i]);
  if (m->comm.allreduce) m->comm.allreduce(m->comm.ctx, &sum, 1, true);
  const float scale = 1.0f / sqrtf((float)(sum / (double)n_global) + m->hp.rms_eps);
  for (int64_t i = 0; i < n_local; i++) x[i] = (x[i] * scale) * w[i];
}

// Every token's final x where rows are split between processes (hmp), for
// the logits.
void rows_share_x(mole_model *m, model_scratch *s, int64_t n) {
  if (!m->comm.hmp) return;
  const int64_t E = m->hp.n_embd;
  int64_t t0, t1;
  rows_own(m, n, &t0, &t1);
  memcpy(s->xn + t0 * E, s->x + t0 * E, (size_t)((t1 - t0) * E) * sizeof(float));
  m->comm.allgather(m->comm.ctx, s->xn, n, E, NULL, NULL);
  memcpy(s->x, s->xn, (size_t)(n * E) * sizeof(float));
}
