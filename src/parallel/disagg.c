// parallel/disagg: attention here, experts there (MegaScale-Infer, arXiv
// 2504.02263) on Open MPI.
//
// Roles: ranks [0, A) are attention ranks, the last E ranks expert ranks
// (A + E = the number of processes: disaggregated; A = E = all of them:
// co-located expert parallelism, every rank both). An attention rank holds
// everything but the routed experts (embeddings, attention, norms, routers,
// shared experts, output) and the KV caches of its own sequences; expert
// rank x holds routed experts [X x / E, X (x + 1) / E) of every layer (in
// its weights image, or offloaded under its own budget).
//
// The root (rank 0, an attention rank) runs the program. Before each pass it
// gives every new sequence to the attention rank with the fewest, and
// broadcasts the batch; each attention rank runs its own sequences, split
// into m micro-batches. Per MoE layer and micro-batch, an attention rank
// sends every (token, choice) row [expert id | router weight | x_n] to the
// expert rank of that expert (M-to-N, one message per expert rank, maybe
// empty) and posts the receives of the results; the expert rank waits for
// the rows of that (layer, micro-batch) from all attention ranks, runs each
// of its experts once on all of them, and sends each attention rank its rows
// [computed | y] back (N-to-M); the attention rank adds them with the
// router's weights in the router's order (model_step_ffn_end).
//
// Ping-pong: an attention rank sends micro-batch j of layer l, then runs the
// attention of micro-batch j+1 (of layer l) while the experts compute j;
// it waits for j's results only when it comes back to j for layer l+1.
// Without ping-pong each micro-batch waits for its results at once. Expert
// ranks serve (layer, micro-batch) pairs in order and post the receives of
// the next pair before computing the current one. A co-located rank serves
// expert work whenever its attention side waits.
//
// Every row's expert output does not depend on which other rows share its
// expert (mole's grouped expert matmuls), so the logits equal the single
// process's bit for bit. Sampling stays on the root: the other attention
// ranks send their sequences' logits there.
//
// Errors: every buffer, scratch and KV cache a pass needs is sized when its
// batch arrives (every rank knows every rank's share of it: the owners of
// the sequences, each attention rank's micro-batches), before any rank
// sends a row; then all ranks agree on the outcome (parallel_agree), so a
// rank that cannot make room stops every rank with its error (the root's
// passes fail with it from then on). The same at the end of the load. A
// rank that fails inside a pass (the others wait for its rows, results or
// logits) ends the job with MPI_Abort after printing why.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "experts/experts.h"
#include "kv/kv.h"
#include "model/model.h"
#include "parallel/disagg.h"
#include "parallel/parallel.h"
#include "parallel/shares.h"

enum { CMD_STEP = 1, CMD_KV_FREE, CMD_STOP, CMD_STATS, CMD_RESET };
enum { MB_MAX = 16, TAG_LOGITS = 7, TAG_LAYER = 1000 };
enum { MAXR = PARALLEL_MAX_RANKS };

typedef struct {
  uint64_t id;
  model_kv *kv;  // this rank's cache (workers); NULL on the root (the session's)
  int owner;
} dg_seq;

// One micro-batch on an attention rank, and its layer in flight.
typedef struct {
  model_scratch *s;
  int64_t s_batch, s_ctx;
  int64_t seg0, n_segs, n;  // its sequences: local segments [seg0, seg0 + n_segs), n tokens
  float *send;             // rows [expert | weight | x_n], by expert rank (from res_off)
  size_t send_cap;
  float *res;              // results, by expert rank: rows [computed | y]
  size_t res_cap;
  int64_t res_off[MAXR + 1];
  int64_t *pos, *idx;      // [n*k] result row of each choice; the same or -1 (skipped)
  size_t pos_cap, idx_cap;
  MPI_Request rq[2 * MAXR];
  bool in_flight;
} dg_mb;

typedef struct dg_ctx {
  MPI_Comm comm;
  parallel_chan ch;  // the root's batches and commands
  int rank, size;
  int A, E;            // attention ranks [0, A), expert ranks [size - E, size)
  bool is_attn, is_exp;
  int mb;              // micro-batches per attention rank
  bool ping_pong;
  bool fault;          // MOLE_TEST_FAIL_RANK names this rank: its first pass fails
  mole_model *m;
  int64_t row_in, row_out;  // floats per row sent to / back from the experts
  int64_t ex0[MAXR + 1];    // experts of expert rank x: [ex0[x], ex0[x+1])
  // sequences: the root's owner table; a worker's KV caches
  dg_seq *seqs;
  int64_t n_seqs;
  size_t seqs_cap;
  int64_t seq_count[MAXR];  // root: sequences each attention rank holds
  // this pass
  int *own;  // root: the owner of each sequence of the batch
  size_t own_cap;
  MPI_Request *lrq;  // root: the other attention ranks' logits
  size_t lrq_cap;
  model_seg *lsegs;  // this rank's sequences
  size_t lsegs_cap;
  int32_t *ltoks;
  size_t ltoks_cap;
  float *lg;  // a worker's logits before they go to the root
  size_t lg_cap;
  int64_t *seg_n;  // one attention rank's sequences' tokens (mb_split)
  size_t seg_n_cap;
  int64_t step_tokens;      // tokens of the whole pass (all ranks)
  int64_t tok_of[MAXR];     // tokens of each attention rank this pass
  dg_mb mbs[MB_MAX];
  // expert side
  int64_t x_next, x_total;  // (layer, micro-batch) pairs served, in all this pass
  bool x_posted;
  float *rbuf[2][MAXR];
  size_t rbuf_cap[2][MAXR];
  MPI_Request rrq[MAXR];
  float *sbuf[2][MAXR];
  size_t sbuf_cap[2][MAXR];
  MPI_Request srq[2][MAXR];
  model_scratch *xs;
  int64_t xs_rows;
  const float **xin;
  float **xout;
  int32_t *xsel;
  float *xw;
  uint8_t *xdone;
  size_t x_cap;  // rows of xin, xout, xsel, xw, xdone
  mole_disagg_rank st;
} dg_ctx;

static double now_s(void) { return MPI_Wtime(); }

static int exp_rank(const dg_ctx *d, int x) { return d->size - d->E + x; }

// The expert rank (0..E-1) holding expert e.
static int owner_of(const dg_ctx *d, int32_t e) {
  int x = (int)((int64_t)e * d->E / d->m->hp.n_expert);
  while (e >= d->ex0[x + 1]) x++;
  while (e < d->ex0[x]) x--;
  return x;
}

// The tags of (layer, micro-batch)'s rows to the experts and of their results
// back (distinct: a co-located rank both sends and answers rows).
static int tag_of(int64_t il, int64_t j) { return (int)(TAG_LAYER + 2 * (il * MB_MAX + j)); }
static int tag_back(int64_t il, int64_t j) { return tag_of(il, j) + 1; }

// Waits for the requests; a rank that also serves experts does their work
// meanwhile (serve). Spins briefly, then naps.
static bool expert_try(dg_ctx *d);
static void dg_wait(dg_ctx *d, MPI_Request *rq, int n, bool serve) {
  const double t0 = now_s();
  double worked = 0;
  long nap_us = 0;
  for (;;) {
    int done = 0;
    MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (serve && d->is_exp) {
      const double w0 = now_s();
      if (expert_try(d)) {
        worked += now_s() - w0;
        nap_us = 0;
        continue;
      }
    }
    if (now_s() - t0 - worked > 100e-6) {
      nap_us = nap_us ? MOLE_MIN(2 * nap_us, (long)PARALLEL_NAP_PASS_US) : 10;
      const struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, NULL);
    }
  }
  d->st.wait_s += now_s() - t0 - worked;
}

// ---- the batch --------------------------------------------------------------------

// Attention rank a's micro-batches of the batch p: its sequences in the
// batch's order, whole, about equal tokens each; micro-batch j gets its
// sequences [first[j], first[j+1]) and tok[j] tokens. Every rank can work
// out every attention rank's (the expert side sizes its buffers by them).
static void mb_split(dg_ctx *d, const int64_t *p, int a, int64_t *first, int64_t *tok) {
  int64_t n_a = 0, tot = 0;
  for (int64_t i = 0; i < p[1]; i++)
    if (parallel_batch_seg(p, i)[PARALLEL_SEG_OWNER] == a) tot += d->seg_n[n_a++] = parallel_batch_seg(p, i)[PARALLEL_SEG_N];
  int64_t i = 0, acc = 0;
  for (int j = 0; j < d->mb; j++) {
    first[j] = i;
    tok[j] = 0;
    while (i < n_a && (j == d->mb - 1 || acc + d->seg_n[i] / 2 < tot * (j + 1) / d->mb || tok[j] == 0)) {
      tok[j] += d->seg_n[i];
      acc += d->seg_n[i];
      i++;
    }
  }
  first[d->mb] = i;
}

// ---- expert side ---------------------------------------------------------------

static void post_expert_recvs(dg_ctx *d) {
  const int64_t q = d->x_next, il = q / d->mb, j = q % d->mb, par = q & 1;
  for (int a = 0; a < d->A; a++) {
    // at most every choice of every token of that attention rank
    const int64_t most = d->tok_of[a] * d->m->hp.n_expert_used * d->row_in;
    MOLE_ASSERT((size_t)most * sizeof(float) <= d->rbuf_cap[par][a]);  // pass_prep
    MPI_Irecv(d->rbuf[par][a], (int)most, MPI_FLOAT, a, tag_of(il, j), d->comm, &d->rrq[a]);
  }
  d->x_posted = true;
}

// Serves the next (layer, micro-batch) when all its rows are here: true
// when it did.
static bool expert_try(dg_ctx *d) {
  if (d->x_next >= d->x_total) return false;
  if (!d->x_posted) post_expert_recvs(d);
  MPI_Status stv[MAXR];
  int done = 0;
  MPI_Testall(d->A, d->rrq, &done, stv);
  if (!done) return false;
  const double t0 = now_s();
  const int64_t q = d->x_next, il = q / d->mb, j = q % d->mb, par = q & 1, E = d->m->hp.n_embd;
  int64_t cnt[MAXR], N = 0;
  for (int a = 0; a < d->A; a++) {
    int c = 0;
    MPI_Get_count(&stv[a], MPI_FLOAT, &c);
    cnt[a] = c / d->row_in;
    N += cnt[a];
  }
  // the sends of two pairs ago used these buffers
  MPI_Waitall(d->A, d->srq[par], MPI_STATUSES_IGNORE);
  d->x_next++;
  d->x_posted = false;
  if (d->x_next < d->x_total) post_expert_recvs(d);  // the next pair's rows land while this one computes
  MOLE_ASSERT(N <= d->xs_rows && (size_t)N <= d->x_cap);  // pass_prep
  for (int a = 0, r = 0; a < d->A; a++) {
    MOLE_ASSERT((size_t)(cnt[a] * d->row_out) * sizeof(float) <= d->sbuf_cap[par][a]);
    const float *in = d->rbuf[par][a];
    for (int64_t i = 0; i < cnt[a]; i++, r++) {
      const float *row = in + i * d->row_in;
      memcpy(&d->xsel[r], row, sizeof(int32_t));
      d->xw[r] = row[1];
      d->xin[r] = row + 2;
      d->xout[r] = d->sbuf[par][a] + i * d->row_out + 1;
      MOLE_ASSERT(d->xsel[r] >= d->ex0[d->rank - (d->size - d->E)] && d->xsel[r] < d->ex0[d->rank - (d->size - d->E) + 1]);
    }
  }
  if (model_experts_rows(d->m, d->xs, il, N, d->xin, d->xsel, d->xw, d->xout, d->xdone))
    parallel_abort(d->comm, "the routed experts");  // the attention ranks wait for these results
  for (int a = 0, r = 0; a < d->A; a++) {
    for (int64_t i = 0; i < cnt[a]; i++, r++) {
      float *row = d->sbuf[par][a] + i * d->row_out;
      row[0] = d->xdone[r] ? 1.0f : 0.0f;
      if (!d->xdone[r]) memset(row + 1, 0, (size_t)E * sizeof(float));
    }
    MPI_Isend(d->sbuf[par][a], (int)(cnt[a] * d->row_out), MPI_FLOAT, a, tag_back(il, j), d->comm, &d->srq[par][a]);
    d->st.bytes_sent += cnt[a] * d->row_out * 4;
  }
  d->st.expert_s += now_s() - t0;
  return true;
}

// The rest of this pass's expert work; the time without any is waiting.
static void serve_rest(dg_ctx *d) {
  const double t0 = now_s();
  double worked = 0;
  long nap_us = 0;
  while (d->x_next < d->x_total) {
    const double w0 = now_s();
    if (expert_try(d)) {
      worked += now_s() - w0;
      nap_us = 0;
    } else if (now_s() - t0 - worked > 100e-6) {
      nap_us = nap_us ? MOLE_MIN(2 * nap_us, (long)PARALLEL_NAP_PASS_US) : 10;
      const struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, NULL);
    }
  }
  d->st.wait_s += now_s() - t0 - worked;
}

// ---- attention side --------------------------------------------------------------

// Micro-batch b's rows of layer il to the experts, and the receives of their results.
static void dispatch(dg_ctx *d, dg_mb *b, int64_t il) {
  const int64_t K = d->m->hp.n_expert_used, E = d->m->hp.n_embd;
  const double t0 = now_s();
  model_moe_rows r = {0};
  if (b->n > 0) model_step_attn(d->m, b->s, il, &r);
  MOLE_ASSERT(r.n == b->n);  // pass_prep sized the buffers for b->n tokens
  int64_t cnt[MAXR] = {0}, fill[MAXR] = {0};
  for (int64_t i = 0; i < r.n * K; i++) cnt[owner_of(d, r.sel[i])]++;
  b->res_off[0] = 0;
  for (int x = 0; x < d->E; x++) b->res_off[x + 1] = b->res_off[x] + cnt[x];
  for (int64_t i = 0; i < r.n * K; i++) {
    const int x = owner_of(d, r.sel[i]);
    float *row = b->send + (b->res_off[x] + fill[x]) * d->row_in;
    memcpy(row, &r.sel[i], sizeof(int32_t));
    row[1] = r.w[i];
    memcpy(row + 2, r.xn + (i / K) * E, (size_t)E * sizeof(float));
    b->pos[i] = b->res_off[x] + fill[x]++;
  }
  const int64_t j = b - d->mbs;
  for (int x = 0; x < d->E; x++) {
    MPI_Irecv(b->res + b->res_off[x] * d->row_out, (int)(cnt[x] * d->row_out), MPI_FLOAT, exp_rank(d, x),
              tag_back(il, j), d->comm, &b->rq[x]);
    MPI_Isend(b->send + b->res_off[x] * d->row_in, (int)(cnt[x] * d->row_in), MPI_FLOAT, exp_rank(d, x),
              tag_of(il, j), d->comm, &b->rq[d->E + x]);
    d->st.bytes_sent += cnt[x] * d->row_in * 4;
  }
  b->in_flight = true;
  d->st.attn_s += now_s() - t0;
}

// Micro-batch b's results of layer il added in.
static void finish(dg_ctx *d, dg_mb *b, int64_t il) {
  MOLE_ASSERT(b->in_flight);
  dg_wait(d, b->rq, 2 * d->E, true);
  b->in_flight = false;
  if (b->n == 0) return;
  const double t0 = now_s();
  const int64_t nk = b->n * d->m->hp.n_expert_used;
  for (int64_t i = 0; i < nk; i++) b->idx[i] = b->res[b->pos[i] * d->row_out] != 0.0f ? b->pos[i] : -1;
  model_step_ffn_end(d->m, b->s, il, b->res + 1, b->idx, d->row_out);
  d->st.attn_s += now_s() - t0;
}

// ---- a pass -----------------------------------------------------------------------

// Attention side: micro-batch j of this rank's n_local sequences (d->lsegs),
// sequences [first, first + n_segs) of n tokens: its scratch, its batch
// begun, its buffers for n tokens' choices.
static mole_status mb_prep(dg_ctx *d, dg_mb *b, int64_t first, int64_t n_segs, int64_t n) {
  const int64_t nk = MOLE_MAX(n * d->m->hp.n_expert_used, 1);  // (an empty micro-batch still sends from a buffer)
  b->seg0 = first;
  b->n_segs = n_segs;
  b->n = n;
  mole_status st = MOLE_OK;
  b->send = parallel_grow(b->send, &b->send_cap, (size_t)(nk * d->row_in) * sizeof(float), "rows to the experts", &st);
  b->res = parallel_grow(b->res, &b->res_cap, (size_t)(nk * d->row_out) * sizeof(float), "rows from the experts", &st);
  b->pos = parallel_grow(b->pos, &b->pos_cap, (size_t)nk * sizeof *b->pos, "the rows' places", &st);
  b->idx = parallel_grow(b->idx, &b->idx_cap, (size_t)nk * sizeof *b->idx, "the rows' places", &st);
  if (st || n == 0) return st;
  int64_t ctx = 1;
  for (int64_t i = first; i < first + n_segs; i++) ctx = MOLE_MAX(ctx, d->lsegs[i].kv->n_ctx);
  if (n > b->s_batch || ctx > b->s_ctx) {  // a scratch for the largest batch and context seen
    const int64_t sn = MOLE_MAX(n, b->s_batch), sc = MOLE_MAX(ctx, b->s_ctx);
    model_scratch_free(b->s);
    b->s = NULL;
    b->s_batch = b->s_ctx = 0;
    if ((st = model_scratch_new(d->m, sn, sc, &b->s))) return st;
    b->s_batch = sn;
    b->s_ctx = sc;
  }
  return model_step_begin(d->m, b->s, d->lsegs + first, n_segs);
}

// Expert side: room for up to `rows` rows of one (layer, micro-batch), and
// for the rows each attention rank may send (every choice of its tokens).
static mole_status expert_prep(dg_ctx *d, int64_t rows) {
  const int64_t K = d->m->hp.n_expert_used;
  mole_status st = MOLE_OK;
  for (int par = 0; par < 2; par++)
    for (int a = 0; a < d->A; a++) {
      const size_t most = (size_t)MOLE_MAX(d->tok_of[a] * K, 1);
      d->rbuf[par][a] = parallel_grow(d->rbuf[par][a], &d->rbuf_cap[par][a], most * (size_t)d->row_in * sizeof(float),
                                      "rows from the attention ranks", &st);
      d->sbuf[par][a] = parallel_grow(d->sbuf[par][a], &d->sbuf_cap[par][a], most * (size_t)d->row_out * sizeof(float),
                                      "rows to the attention ranks", &st);
    }
  if (!st && (size_t)rows > d->x_cap) {
    size_t c = d->x_cap * sizeof *d->xin;
    d->xin = parallel_grow(d->xin, &c, (size_t)rows * sizeof *d->xin, "the expert rows", &st);
    c = d->x_cap * sizeof *d->xout;
    d->xout = parallel_grow(d->xout, &c, (size_t)rows * sizeof *d->xout, "the expert rows", &st);
    c = d->x_cap * sizeof *d->xsel;
    d->xsel = parallel_grow(d->xsel, &c, (size_t)rows * sizeof *d->xsel, "the expert rows", &st);
    c = d->x_cap * sizeof *d->xw;
    d->xw = parallel_grow(d->xw, &c, (size_t)rows * sizeof *d->xw, "the expert rows", &st);
    c = d->x_cap * sizeof *d->xdone;
    d->xdone = parallel_grow(d->xdone, &c, (size_t)rows * sizeof *d->xdone, "the expert rows", &st);
    if (!st) d->x_cap = (size_t)rows;
  }
  if (!st && rows > d->xs_rows) {
    model_scratch_free(d->xs);
    d->xs = NULL;
    d->xs_rows = 0;
    if (!(st = model_scratch_new(d->m, rows, 1, &d->xs))) d->xs_rows = rows;
  }
  return st;
}

// Everything this rank needs for the batch in d->ch.msg (its own sequences
// in d->lsegs, n_local of them), before any rank sends a row.
static mole_status pass_prep(dg_ctx *d, int64_t n_local) {
  const int64_t *p = d->ch.msg, n_segs = p[1], K = d->m->hp.n_expert_used;
  mole_status st = MOLE_OK;
  if (d->fault) {
    d->fault = false;
    return mole_errorf(MOLE_ERR_NOMEM, "out of memory (injected: MOLE_TEST_FAIL_RANK=%d)", d->rank);
  }
  d->seg_n = parallel_grow(d->seg_n, &d->seg_n_cap, (size_t)MOLE_MAX(n_segs, 1) * sizeof *d->seg_n, "the batch", &st);
  if (st) return st;
  d->step_tokens = 0;
  for (int a = 0; a < d->A; a++) d->tok_of[a] = 0;
  for (int64_t i = 0; i < n_segs; i++) {
    d->step_tokens += parallel_batch_seg(p, i)[PARALLEL_SEG_N];
    d->tok_of[parallel_batch_seg(p, i)[PARALLEL_SEG_OWNER]] += parallel_batch_seg(p, i)[PARALLEL_SEG_N];
  }
  // every attention rank's micro-batches: this rank's own; the most rows
  // of one (layer, micro-batch) reaching an expert rank
  int64_t first[MB_MAX + 1], tok[MB_MAX], rows[MB_MAX] = {0}, most = 1;
  for (int a = 0; a < d->A; a++) {
    mb_split(d, p, a, first, tok);
    for (int j = 0; j < d->mb; j++) rows[j] += tok[j] * K;
    if (a != d->rank) continue;
    MOLE_ASSERT(first[d->mb] == n_local);
    for (int j = 0; j < d->mb && !st; j++) st = mb_prep(d, &d->mbs[j], first[j], first[j + 1] - first[j], tok[j]);
  }
  for (int j = 0; j < d->mb; j++) most = MOLE_MAX(most, rows[j]);
  if (!st && d->is_exp) st = expert_prep(d, most);
  return st;
}

// This rank's part of a pass: its sequences (if any) through every layer
// in micro-batches, serving expert work as it goes; an expert rank serves
// until every attention rank's last layer is done.
static mole_status pass_run(dg_ctx *d) {
  mole_model *m = d->m;
  const int64_t L = m->hp.n_layer;
  const double t0 = now_s();
  mole_status st = MOLE_OK;
  d->x_next = 0;
  d->x_total = d->is_exp ? L * d->mb : 0;
  d->x_posted = false;
  if (d->is_attn) {
    d->st.tokens += d->tok_of[d->rank];
    for (int64_t il = 0; il < L; il++)
      for (int j = 0; j < d->mb; j++) {
        dg_mb *b = &d->mbs[j];
        if (il > 0 && d->ping_pong) finish(d, b, il - 1);
        dispatch(d, b, il);
        if (!d->ping_pong) finish(d, b, il);
      }
    for (int j = 0; j < d->mb && d->ping_pong; j++) finish(d, &d->mbs[j], L - 1);
    const double t1 = now_s();
    for (int j = 0; j < d->mb && !st; j++) {
      dg_mb *b = &d->mbs[j];
      if (b->n > 0) st = model_step_end(m, b->s, d->lsegs + b->seg0, b->n_segs);
    }
    d->st.attn_s += now_s() - t1;
  }
  serve_rest(d);
  if (d->is_exp) {
    for (int p = 0; p < 2; p++) MPI_Waitall(d->A, d->srq[p], MPI_STATUSES_IGNORE);
    experts_step_done(m->experts, d->step_tokens);
  }
  d->st.passes++;
  d->st.pass_s += now_s() - t0;
  return st;
}

// ---- the root ----------------------------------------------------------------------

static dg_seq *seq_find(dg_ctx *d, uint64_t id) {
  for (int64_t i = 0; i < d->n_seqs; i++)
    if (d->seqs[i].id == id) return &d->seqs[i];
  return NULL;
}

static mole_status seq_add(dg_ctx *d, uint64_t id, int owner, model_kv *kv) {
  mole_status st = MOLE_OK;
  d->seqs = parallel_grow(d->seqs, &d->seqs_cap, (size_t)(d->n_seqs + 1) * sizeof *d->seqs, "the sequence table", &st);
  if (st) return st;
  d->seqs[d->n_seqs++] = (dg_seq){id, kv, owner};
  d->seq_count[owner]++;
  return MOLE_OK;
}

static mole_status send_cmd(dg_ctx *d, int64_t cmd, int64_t arg) {
  d->ch.msg[0] = cmd;  // within the room every rank has from the start
  d->ch.msg[1] = arg;
  return parallel_chan_send(&d->ch, 2);
}

static mole_status root_forward(void *v, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  (void)s;  // each micro-batch has its own
  dg_ctx *d = v;
  const mole_model *m = d->m;
  const int64_t V = m->hp.n_vocab;
  // what batch_setup would refuse, refused here before any rank starts
  int64_t n = 0;
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    if (g->kv->budget > 0)
      return mole_errorf(MOLE_ERR_UNSUPPORTED, "--disagg: a bounded KV cache (--kv-budget) is not supported");
    if (g->n <= 0) return mole_errorf(MOLE_ERR_ARG, "forward: a sequence of %lld tokens", (long long)g->n);
    if (g->n_past < 0 || g->n_past + g->n > g->kv->n_ctx)
      return mole_errorf(MOLE_ERR_ARG, "context full: %lld + %lld tokens exceed the context of %lld",
                         (long long)g->n_past, (long long)g->n, (long long)g->kv->n_ctx);
    if (g->kv->type != segs[0].kv->type)
      return mole_errorf(MOLE_ERR_ARG, "forward: the sequences of one batch need one KV cache type");
    for (int64_t j = 0; j < i; j++)
      if (segs[j].kv == g->kv) return mole_errorf(MOLE_ERR_ARG, "forward: a sequence appears twice in one batch");
    for (int64_t t = 0; t < g->n; t++)
      if (g->tokens[t] < 0 || g->tokens[t] >= V)
        return mole_errorf(MOLE_ERR_ARG, "token %d at index %lld is out of the vocabulary (0..%lld)", g->tokens[t],
                           (long long)t, (long long)V - 1);
    n += g->n;
  }
  if (n == 0) return mole_errorf(MOLE_ERR_ARG, "forward: no tokens");
  // the root's room for the batch: refused (nothing sent, the others wait on) when there is none
  mole_status st = parallel_chan_stopped(&d->ch);
  const int64_t len = parallel_batch_len(segs, n_segs);
  if (!st) st = parallel_chan_reserve(&d->ch, len);
  d->own = parallel_grow(d->own, &d->own_cap, (size_t)n_segs * sizeof *d->own, "the batch's owners", &st);
  d->lrq = parallel_grow(d->lrq, &d->lrq_cap, (size_t)(n_segs + 1) * sizeof *d->lrq, "the logits' requests", &st);
  d->lsegs = parallel_grow(d->lsegs, &d->lsegs_cap, (size_t)n_segs * sizeof *d->lsegs, "the batch", &st);
  for (int64_t i = 0; i < n_segs && !st; i++) {
    const dg_seq *q = seq_find(d, segs[i].kv->id);
    if (q) {
      d->own[i] = q->owner;
      continue;
    }
    int best = 0;  // a new sequence: to the attention rank with the fewest
    for (int a = 1; a < d->A; a++)
      if (d->seq_count[a] < d->seq_count[best]) best = a;
    d->own[i] = best;
    st = seq_add(d, segs[i].kv->id, best, NULL);
  }
  if (st) return st;
  parallel_batch_write(d->ch.msg, CMD_STEP, segs, n_segs, d->own);
  if ((st = parallel_chan_send(&d->ch, len))) return st;
  int64_t n_local = 0;
  for (int64_t i = 0; i < n_segs; i++)
    if (d->own[i] == 0) d->lsegs[n_local++] = segs[i];
  st = pass_prep(d, n_local);
  if ((st = parallel_agree(d->comm, st))) return parallel_chan_stop(&d->ch, st);
  // the other ranks' logits, in each rank's order of its sequences
  int nl = 0;
  for (int64_t i = 0; i < n_segs; i++)
    if (d->own[i] != 0 && segs[i].logits) {
      const int64_t rows = segs[i].all_logits ? segs[i].n : 1;
      MPI_Irecv(segs[i].logits, (int)(rows * V), MPI_FLOAT, d->own[i], TAG_LOGITS, d->comm, &d->lrq[nl++]);
    }
  st = pass_run(d);
  const double t0 = now_s();
  dg_wait(d, d->lrq, nl, false);  // (counted as waiting, and as part of the pass)
  d->st.pass_s += now_s() - t0;
  return st;
}

static void root_kv_release(void *v, uint64_t id) {
  dg_ctx *d = v;
  dg_seq *q = seq_find(d, id);
  if (!q) return;  // never ran a pass
  d->seq_count[q->owner]--;
  *q = d->seqs[--d->n_seqs];
  if (d->A > 1) (void)send_cmd(d, CMD_KV_FREE, (int64_t)id);  // (nothing is sent after a stop)
}

static void dg_free(dg_ctx *d);

static void root_close(void *v) {
  dg_ctx *d = v;
  if (d->rank == 0) (void)send_cmd(d, CMD_STOP, 0);
  dg_free(d);
}

// ---- the other ranks ----------------------------------------------------------------

// An attention worker's part of the batch in d->ch.msg: its sequences (new
// ones get a KV cache here), their tokens, room for their logits.
static mole_status worker_segs(dg_ctx *d, int64_t *n_local) {
  const int64_t *p = d->ch.msg, n_segs = p[1], V = d->m->hp.n_vocab;
  const model_hparams *hp = &d->m->hp;
  int64_t n = 0, n_lg = 0;
  for (int64_t i = 0; i < n_segs; i++) {
    const int64_t *q = parallel_batch_seg(p, i);
    n += q[PARALLEL_SEG_N];
    if (q[PARALLEL_SEG_OWNER] == d->rank) n_lg += q[PARALLEL_SEG_LOGITS] == 2 ? q[PARALLEL_SEG_N] : q[PARALLEL_SEG_LOGITS] == 1;
  }
  mole_status st = MOLE_OK;
  d->lsegs = parallel_grow(d->lsegs, &d->lsegs_cap, (size_t)MOLE_MAX(n_segs, 1) * sizeof *d->lsegs, "the batch", &st);
  d->ltoks = parallel_grow(d->ltoks, &d->ltoks_cap, (size_t)MOLE_MAX(n, 1) * sizeof *d->ltoks, "the batch's tokens", &st);
  d->lg = parallel_grow(d->lg, &d->lg_cap, (size_t)MOLE_MAX(n_lg * V, 1) * sizeof *d->lg, "the logits", &st);
  const int64_t *tp = parallel_batch_tokens(p);
  *n_local = 0;
  for (int64_t i = 0, t = 0, lo = 0; i < n_segs && !st; i++) {
    const int64_t *q = parallel_batch_seg(p, i);
    if (q[PARALLEL_SEG_OWNER] == d->rank) {
      for (int64_t k = 0; k < q[PARALLEL_SEG_N]; k++) d->ltoks[t + k] = (int32_t)tp[k];
      dg_seq *s = seq_find(d, (uint64_t)q[PARALLEL_SEG_ID]);
      model_kv *kv = s ? s->kv : NULL;
      if (!kv && !(st = kv_new(hp->n_layer, q[PARALLEL_SEG_CTX], hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v,
                               (quant_type)q[PARALLEL_SEG_TYPE], &kv))) {
        if ((st = seq_add(d, (uint64_t)q[PARALLEL_SEG_ID], d->rank, kv))) kv_free(kv);
      }
      if (st) break;
      d->lsegs[(*n_local)++] =
          (model_seg){kv, d->ltoks + t, q[PARALLEL_SEG_N], q[PARALLEL_SEG_PAST], q[PARALLEL_SEG_LOGITS] ? d->lg + lo * V : NULL, q[PARALLEL_SEG_LOGITS] == 2};
      lo += q[PARALLEL_SEG_LOGITS] == 2 ? q[PARALLEL_SEG_N] : q[PARALLEL_SEG_LOGITS] == 1;
      t += q[PARALLEL_SEG_N];
    }
    tp += q[PARALLEL_SEG_N];
  }
  return st;
}

static mole_status worker(void *v) {
  dg_ctx *d = v;
  const int64_t V = d->m->hp.n_vocab;
  for (;;) {
    int64_t len;
    mole_status st = parallel_chan_recv(&d->ch, &len);
    if (st) return st;
    const int64_t *p = d->ch.msg;
    if (p[0] == CMD_STOP) return MOLE_OK;
    if (p[0] == CMD_KV_FREE) {
      dg_seq *q = seq_find(d, (uint64_t)p[1]);
      if (q) {
        kv_free(q->kv);
        *q = d->seqs[--d->n_seqs];
      }
      continue;
    }
    if (p[0] == CMD_STATS) {
      MPI_Gather(&d->st, sizeof d->st, MPI_BYTE, NULL, 0, MPI_BYTE, 0, d->comm);
      continue;
    }
    if (p[0] == CMD_RESET) {
      const bool a = d->st.attn, x = d->st.expert;
      memset(&d->st, 0, sizeof d->st);
      d->st.attn = a, d->st.expert = x;
      continue;
    }
    int64_t n_local = 0;
    if (d->is_attn) st = worker_segs(d, &n_local);
    if (!st) st = pass_prep(d, n_local);
    if ((st = parallel_agree(d->comm, st))) return st;
    if (pass_run(d)) parallel_abort(d->comm, "the end of a pass");  // the root waits for this rank's logits
    // this rank's logits to the root, in its order of its sequences
    for (int64_t i = 0; i < n_local; i++) {
      const model_seg *g = &d->lsegs[i];
      if (!g->logits) continue;
      const int64_t rows = g->all_logits ? g->n : 1;
      MPI_Request lr;
      const double t0 = now_s();
      MPI_Isend(g->logits, (int)(rows * V), MPI_FLOAT, 0, TAG_LOGITS, d->comm, &lr);
      parallel_wait_for(&lr, 1, PARALLEL_NAP_PASS_US);
      d->st.pass_s += now_s() - t0;  // the pass ends when the root has them
      d->st.wait_s += now_s() - t0;
      d->st.bytes_sent += rows * V * 4;
    }
  }
}

static void dg_free(dg_ctx *d) {
  if (!d) return;
  for (int64_t i = 0; i < d->n_seqs; i++) kv_free(d->seqs[i].kv);
  mole_free(d->seqs);
  parallel_chan_free(&d->ch);
  mole_free(d->own);
  mole_free(d->lrq);
  mole_free(d->lsegs);
  mole_free(d->ltoks);
  mole_free(d->lg);
  mole_free(d->seg_n);
  for (int j = 0; j < MB_MAX; j++) {
    dg_mb *b = &d->mbs[j];
    model_scratch_free(b->s);
    mole_free(b->send);
    mole_free(b->res);
    mole_free(b->pos);
    mole_free(b->idx);
  }
  for (int p = 0; p < 2; p++)
    for (int a = 0; a < MAXR; a++) {
      mole_free(d->rbuf[p][a]);
      mole_free(d->sbuf[p][a]);
    }
  model_scratch_free(d->xs);
  mole_free(d->xin);
  mole_free(d->xout);
  mole_free(d->xsel);
  mole_free(d->xw);
  mole_free(d->xdone);
  mole_free(d);
}

// ---- statistics ------------------------------------------------------------------

mole_status mole_disagg_stats(mole_model *m, mole_disagg_rank *ranks, int max_ranks, int *n_ranks) {
  if (!m->comm.forward || m->comm.rank != 0)
    return mole_errorf(MOLE_ERR_ARG, "mole_disagg_stats: rank 0 of a disaggregated model (--disagg) only");
  dg_ctx *d = m->comm.ctx;
  if (max_ranks < d->size) return mole_errorf(MOLE_ERR_ARG, "mole_disagg_stats: room for %d ranks, %d run", max_ranks, d->size);
  mole_status st = send_cmd(d, CMD_STATS, 0);
  if (st) return st;
  MPI_Gather(&d->st, sizeof d->st, MPI_BYTE, ranks, sizeof d->st, MPI_BYTE, 0, d->comm);
  *n_ranks = d->size;
  return MOLE_OK;
}

mole_status mole_disagg_reset_stats(mole_model *m) {
  if (!m->comm.forward || m->comm.rank != 0)
    return mole_errorf(MOLE_ERR_ARG, "mole_disagg_reset_stats: rank 0 of a disaggregated model (--disagg) only");
  dg_ctx *d = m->comm.ctx;
  mole_status st = send_cmd(d, CMD_RESET, 0);
  if (st) return st;
  const bool a = d->st.attn, x = d->st.expert;
  memset(&d->st, 0, sizeof d->st);
  d->st.attn = a, d->st.expert = x;
  return MOLE_OK;
}

// ---- load -----------------------------------------------------------------------------

// This rank's context and model (*d, *out; NULL both on failure).
static mole_status dg_load(const char *path, const mole_model_params *params, dg_ctx **dp, mole_model **out) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int A = params->disagg_attn, E = params->disagg_expert;
  const int mb = params->micro_batches > 0 ? params->micro_batches : 2;
  const bool coloc = A == size && E == size;
  if (A < 1 || E < 1 || (A + E != size && !coloc))
    return mole_errorf(MOLE_ERR_ARG,
                       "--disagg attn=%d,expert=%d: mpirun -np %d needs attn + expert = %d (or both = %d: co-located)",
                       A, E, size, size, size);
  if (mb > MB_MAX) return mole_errorf(MOLE_ERR_ARG, "--micro-batches %d: at most %d", mb, MB_MAX);
  if (params->parallel != MOLE_PARALLEL_NONE || params->plan)
    return mole_errorf(MOLE_ERR_ARG, "--disagg: not with --parallel hmp|tp or --plan (another way to split the model)");
  // the hparams first (a mapping, no copy)
  mole_model *probe;
  mole_model_params pp = *params;
  pp.use_mmap = true;
  pp.n_threads = 1;
  pp.offload.expert_budget = 0;
  pp.offload.expert_budget_frac = 0;
  mole_status st = model_load(path, &pp, NULL, &probe);
  if (st) return st;
  const model_hparams hp = probe->hp;
  model_free(probe);
  if (hp.n_expert == 0) return mole_errorf(MOLE_ERR_ARG, "%s: --disagg: a dense model (no routed experts)", path);
  if (E > hp.n_expert)
    return mole_errorf(MOLE_ERR_ARG, "--disagg: %d expert ranks for %lld experts per layer", E, (long long)hp.n_expert);
  int *tub = NULL, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tub, &flag);
  if (flag && tag_back(hp.n_layer, 0) > *tub)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "--disagg: %lld layers need MPI tags up to %d, this MPI has %d",
                       (long long)hp.n_layer, tag_back(hp.n_layer, 0), *tub);
  dg_ctx *d = mole_calloc(1, sizeof *d);
  if (!d) return mole_errorf(MOLE_ERR_NOMEM, "out of memory");
  d->comm = MPI_COMM_WORLD;
  d->rank = rank;
  d->size = size;
  d->A = A;
  d->E = E;
  d->is_attn = rank < A;
  d->is_exp = rank >= size - E;
  d->mb = mb;
  d->ping_pong = !params->no_ping_pong;
  d->row_in = hp.n_embd + 2;
  d->row_out = hp.n_embd + 1;
  double equal[MAXR];
  for (int x = 0; x < E; x++) equal[x] = 1.0;
  st = shares_cut(hp.n_expert, 1, equal, E, d->ex0);  // whole experts, about as many on each expert rank
  d->st.attn = d->is_attn;
  d->st.expert = d->is_exp;
  for (int a = 0; a < MAXR; a++) d->rrq[a] = d->srq[0][a] = d->srq[1][a] = MPI_REQUEST_NULL;
  // this rank's share: the attention side whole or nothing, its experts
  model_shard sh = {.given = true};
  if (d->is_attn) {
    sh.kvh1 = hp.n_head_kv;
    sh.ff1 = hp.n_ff;
    sh.fs1 = hp.n_ff_shexp;
    sh.voc1 = hp.n_vocab;
  }
  sh.fe1 = hp.n_ff_exp;  // whole experts: the ones in [ex0, ex1)
  if (d->is_exp) {
    const int x = rank - (size - E);
    sh.ex0 = d->ex0[x];
    sh.ex1 = d->ex0[x + 1];
  }
  mole_model_params p = *params;
  if (!d->is_exp) {  // no expert weights here: no cache for them either
    p.offload.expert_budget = 0;
    p.offload.expert_budget_frac = 0;
  }
  if (!st) st = parallel_chan_init(&d->ch, MPI_COMM_WORLD);
  if (!st) st = model_load(path, &p, &sh, out);
  if (st) {
    dg_free(d);
    return st;
  }
  *dp = d;
  return MOLE_OK;
}

mole_status disagg_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  *out = NULL;
  dg_ctx *d = NULL;
  // the load's one collective before the model runs: every rank reaches it,
  // whatever failed before (dist.c: mole_dist_model_load)
  mole_status st = parallel_agree(MPI_COMM_WORLD, dg_load(path, params, &d, out));
  if (st) {
    model_free(*out);
    *out = NULL;
    dg_free(d);
    return st;
  }
  mole_model *m = *out;
  d->m = m;
  d->fault = parallel_test_fault();
  m->comm = (model_comm){.ctx = d,
                         .rank = d->rank,
                         .size = d->size,
                         .forward = root_forward,
                         .worker = worker,
                         .kv_release = root_kv_release,
                         .close = root_close};
  return MOLE_OK;
}
