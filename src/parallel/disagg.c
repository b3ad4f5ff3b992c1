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
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "parallel/dist.h"
#include "parallel/dist_internal.h"
#include "experts/experts.h"
#include "kv/kv.h"
#include "model/model.h"

enum { CMD_STEP = 1, CMD_KV_FREE, CMD_STOP, CMD_STATS, CMD_RESET };
enum { MB_MAX = 16, TAG_LOGITS = 7, TAG_LAYER = 1000 };
enum { MAXR = DIST_MAX_RANKS };

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
  float *send[MAXR];       // per expert rank: rows [expert | weight | x_n]
  size_t send_cap[MAXR];
  float *res;              // results, by expert rank: rows [computed | y]
  size_t res_cap;
  int64_t res_off[MAXR + 1];
  int64_t *pos, *idx;      // [n*k] result row of each choice; the same or -1 (skipped)
  size_t pos_cap;
  MPI_Request rq[2 * MAXR];
  bool in_flight;
} dg_mb;

typedef struct dg_ctx {
  MPI_Comm comm;
  int rank, size;
  int A, E;            // attention ranks [0, A), expert ranks [size - E, size)
  bool is_attn, is_exp;
  int mb;              // micro-batches per attention rank
  bool ping_pong;
  mole_model *m;
  int64_t row_in, row_out;  // floats per row sent to / back from the experts
  int64_t ex0[MAXR + 1];    // experts of expert rank x: [ex0[x], ex0[x+1])
  // sequences: the root's owner table; a worker's KV caches
  dg_seq *seqs;
  int64_t n_seqs, cap_seqs;
  int64_t seq_count[MAXR];  // root: sequences each attention rank holds
  // this pass
  int64_t *msg;
  size_t msg_cap;
  model_seg *lsegs;  // this rank's sequences
  size_t lsegs_cap;
  int32_t *ltoks;
  size_t ltoks_cap;
  float *lg;  // a worker's logits before they go to the root
  size_t lg_cap;
  int64_t step_tokens;  // tokens of the whole pass (all ranks)
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
  size_t x_cap;
  mole_disagg_rank st;
  bool failed;
} dg_ctx;

static double now_s(void) { return MPI_Wtime(); }

static void *grow(void *p, size_t *cap, size_t need) {
  if (need <= *cap) return p;
  need = need < 2 * *cap ? 2 * *cap : need;
  void *q = mole_realloc(p, need);
  MOLE_ASSERT(q);  // activation buffers of a few MiB; out of memory here is fatal
  *cap = need;
  return q;
}

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
      nap_us = nap_us ? MOLE_MIN(2 * nap_us, (long)DIST_NAP_PASS_US) : 10;
      const struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, NULL);
    }
  }
  d->st.wait_s += now_s() - t0 - worked;
}

// ---- expert side ---------------------------------------------------------------

static void post_expert_recvs(dg_ctx *d) {
  const int64_t q = d->x_next, il = q / d->mb, j = q % d->mb, par = q & 1;
  // at most every token's every choice of the pass from one attention rank
  const size_t need = (size_t)(d->step_tokens * d->m->hp.n_expert_used * d->row_in) * sizeof(float);
  for (int a = 0; a < d->A; a++) {
    d->rbuf[par][a] = grow(d->rbuf[par][a], &d->rbuf_cap[par][a], MOLE_MAX(need, 64));
    MPI_Irecv(d->rbuf[par][a], (int)(need / sizeof(float)), MPI_FLOAT, a, tag_of(il, j), d->comm, &d->rrq[a]);
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
  if (N > d->xs_rows) {
    model_scratch_free(d->xs);
    d->xs = NULL;
    d->xs_rows = MOLE_MAX(N, 2 * d->xs_rows);
    if (model_scratch_new(d->m, d->xs_rows, 1, &d->xs)) {
      fprintf(stderr, "mole: rank %d: %s\n", d->rank, mole_last_error());
      MPI_Abort(d->comm, 1);  // a rank that cannot compute would leave the others waiting forever
    }
  }
  if ((size_t)N > d->x_cap) {
    size_t cap = d->x_cap;
    d->xin = grow(d->xin, &cap, (size_t)N * sizeof *d->xin);
    cap = d->x_cap;
    d->xout = grow(d->xout, &cap, (size_t)N * sizeof *d->xout);
    cap = d->x_cap;
    d->xsel = grow(d->xsel, &cap, (size_t)N * sizeof *d->xsel);
    cap = d->x_cap;
    d->xw = grow(d->xw, &cap, (size_t)N * sizeof *d->xw);
    cap = d->x_cap;
    d->xdone = grow(d->xdone, &cap, (size_t)N);
    d->x_cap = (size_t)N;
  }
  for (int a = 0, r = 0; a < d->A; a++) {
    d->sbuf[par][a] = grow(d->sbuf[par][a], &d->sbuf_cap[par][a], (size_t)MOLE_MAX(cnt[a] * d->row_out, 1) * sizeof(float));
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
  mole_status st = model_experts_rows(d->m, d->xs, il, N, d->xin, d->xsel, d->xw, d->xout, d->xdone);
  if (st) {
    fprintf(stderr, "mole: rank %d: experts of layer %lld: %s\n", d->rank, (long long)il, mole_last_error());
    MPI_Abort(d->comm, 1);
  }
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
      nap_us = nap_us ? MOLE_MIN(2 * nap_us, (long)DIST_NAP_PASS_US) : 10;
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
  int64_t cnt[MAXR] = {0}, fill[MAXR] = {0};
  for (int64_t i = 0; i < r.n * K; i++) cnt[owner_of(d, r.sel[i])]++;
  b->res_off[0] = 0;
  for (int x = 0; x < d->E; x++) {
    b->res_off[x + 1] = b->res_off[x] + cnt[x];
    b->send[x] = grow(b->send[x], &b->send_cap[x], (size_t)MOLE_MAX(cnt[x] * d->row_in, 1) * sizeof(float));
  }
  b->res = grow(b->res, &b->res_cap, (size_t)MOLE_MAX(b->res_off[d->E] * d->row_out, 1) * sizeof(float));
  size_t pc = b->pos_cap;
  b->pos = grow(b->pos, &pc, (size_t)MOLE_MAX(r.n * K, 1) * sizeof(int64_t));
  pc = b->pos_cap;
  b->idx = grow(b->idx, &pc, (size_t)MOLE_MAX(r.n * K, 1) * sizeof(int64_t));
  b->pos_cap = pc;
  for (int64_t i = 0; i < r.n * K; i++) {
    const int x = owner_of(d, r.sel[i]);
    float *row = b->send[x] + fill[x] * d->row_in;
    memcpy(row, &r.sel[i], sizeof(int32_t));
    row[1] = r.w[i];
    memcpy(row + 2, r.xn + (i / K) * E, (size_t)E * sizeof(float));
    b->pos[i] = b->res_off[x] + fill[x]++;
  }
  const int64_t j = b - d->mbs;
  for (int x = 0; x < d->E; x++) {
    MPI_Irecv(b->res + b->res_off[x] * d->row_out, (int)(cnt[x] * d->row_out), MPI_FLOAT, exp_rank(d, x),
              tag_back(il, j), d->comm, &b->rq[x]);
    MPI_Isend(b->send[x], (int)(cnt[x] * d->row_in), MPI_FLOAT, exp_rank(d, x), tag_of(il, j), d->comm,
              &b->rq[d->E + x]);
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

// This rank's part of a pass: its sequences (if any) through every layer
// in micro-batches, serving expert work as it goes; an expert rank serves
// until every attention rank's last layer is done.
static mole_status run_pass(dg_ctx *d, int64_t n_local) {
  mole_model *m = d->m;
  const int64_t L = m->hp.n_layer;
  const double t0 = now_s();
  mole_status st = MOLE_OK;
  d->x_next = 0;
  d->x_total = d->is_exp ? L * d->mb : 0;
  d->x_posted = false;
  if (d->is_attn) {
    // whole sequences to micro-batches, about equal tokens each
    int64_t tot = 0;
    for (int64_t i = 0; i < n_local; i++) tot += d->lsegs[i].n;
    d->st.tokens += tot;
    int64_t i = 0, acc = 0;
    for (int j = 0; j < d->mb; j++) {
      dg_mb *b = &d->mbs[j];
      b->seg0 = i;
      b->n = 0;
      int64_t ctx = 1;
      while (i < n_local && (j == d->mb - 1 || acc + d->lsegs[i].n / 2 < tot * (j + 1) / d->mb || b->n == 0)) {
        b->n += d->lsegs[i].n;
        acc += d->lsegs[i].n;
        ctx = MOLE_MAX(ctx, d->lsegs[i].kv->n_ctx);
        i++;
      }
      b->n_segs = i - b->seg0;
      if (b->n > 0 && (b->n > b->s_batch || ctx > b->s_ctx)) {
        model_scratch_free(b->s);
        b->s = NULL;
        b->s_batch = MOLE_MAX(b->n, b->s_batch);
        b->s_ctx = MOLE_MAX(ctx, b->s_ctx);
        if ((st = model_scratch_new(m, b->s_batch, b->s_ctx, &b->s))) {
          b->s_batch = b->s_ctx = 0;
          break;
        }
      }
      if (b->n > 0 && (st = model_step_begin(m, b->s, d->lsegs + b->seg0, b->n_segs))) break;
    }
    if (st) {  // the others go on waiting for this rank's rows
      fprintf(stderr, "mole: rank %d: %s\n", d->rank, mole_last_error());
      MPI_Abort(d->comm, 1);
    }
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

static dg_seq *seq_add(dg_ctx *d, uint64_t id, int owner) {
  if (d->n_seqs == d->cap_seqs) {
    size_t cap = (size_t)d->cap_seqs * sizeof *d->seqs;
    d->seqs = grow(d->seqs, &cap, (size_t)MOLE_MAX(2 * d->cap_seqs, 8) * sizeof *d->seqs);
    d->cap_seqs = (int64_t)(cap / sizeof *d->seqs);
  }
  dg_seq *q = &d->seqs[d->n_seqs++];
  *q = (dg_seq){id, NULL, owner};
  d->seq_count[owner]++;
  return q;
}

static void bcast_msg(dg_ctx *d, int64_t len, int nap) {
  MPI_Request rq;
  MPI_Ibcast(&len, 1, MPI_INT64_T, 0, d->comm, &rq);
  dist_wait_for(&rq, 1, nap);
  MPI_Ibcast(d->msg, (int)len, MPI_INT64_T, 0, d->comm, &rq);
  dist_wait_for(&rq, 1, nap);
}

static void send_cmd(dg_ctx *d, int64_t cmd, int64_t arg) {
  d->msg = grow(d->msg, &d->msg_cap, 2 * sizeof(int64_t));
  d->msg[0] = cmd;
  d->msg[1] = arg;
  bcast_msg(d, 2, DIST_NAP_PASS_US);
}

// The batch as int64s: cmd, n_segs, then per sequence: kv id, its n_ctx,
// type, n_past, n, logits (0 none, 1 last, 2 all), owner; then every token.
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
  int64_t len = 2 + 7 * n_segs + n;
  d->msg = grow(d->msg, &d->msg_cap, (size_t)len * sizeof(int64_t));
  int64_t *p = d->msg;
  *p++ = CMD_STEP;
  *p++ = n_segs;
  int owner[1024];
  int *own = n_segs <= 1024 ? owner : mole_malloc((size_t)n_segs * sizeof *own);
  if (!own) return mole_errorf(MOLE_ERR_NOMEM, "out of memory");
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    dg_seq *q = seq_find(d, g->kv->id);
    if (!q) {  // a new sequence: to the attention rank with the fewest
      int best = 0;
      for (int a = 1; a < d->A; a++)
        if (d->seq_count[a] < d->seq_count[best]) best = a;
      q = seq_add(d, g->kv->id, best);
    }
    own[i] = q->owner;
    *p++ = (int64_t)g->kv->id;
    *p++ = g->kv->n_ctx;
    *p++ = g->kv->type;
    *p++ = g->n_past;
    *p++ = g->n;
    *p++ = g->logits ? (g->all_logits ? 2 : 1) : 0;
    *p++ = q->owner;
  }
  for (int64_t i = 0; i < n_segs; i++)
    for (int64_t t = 0; t < segs[i].n; t++) *p++ = segs[i].tokens[t];
  bcast_msg(d, len, DIST_NAP_PASS_US);
  // the other ranks' logits, in each rank's order of its sequences
  MPI_Request *lrq = mole_malloc((size_t)(n_segs + 1) * sizeof *lrq);
  int64_t nl = 0, n_local = 0;
  size_t cap = d->lsegs_cap;
  d->lsegs = grow(d->lsegs, &cap, (size_t)n_segs * sizeof *d->lsegs);
  d->lsegs_cap = cap;
  for (int64_t i = 0; i < n_segs && lrq; i++) {
    if (own[i] == 0) {
      d->lsegs[n_local++] = segs[i];
    } else if (segs[i].logits) {
      const int64_t rows = segs[i].all_logits ? segs[i].n : 1;
      MPI_Irecv(segs[i].logits, (int)(rows * V), MPI_FLOAT, own[i], TAG_LOGITS, d->comm, &lrq[nl++]);
    }
  }
  if (own != owner) mole_free(own);
  if (!lrq) return mole_errorf(MOLE_ERR_NOMEM, "out of memory");  // (MPI_Abort would be kinder; never seen)
  d->step_tokens = n;
  mole_status st = run_pass(d, n_local);
  const double t0 = now_s();
  dg_wait(d, lrq, (int)nl, false);  // (counted as waiting, and as part of the pass)
  d->st.pass_s += now_s() - t0;
  mole_free(lrq);
  return st;
}

static void root_kv_release(void *v, uint64_t id) {
  dg_ctx *d = v;
  dg_seq *q = seq_find(d, id);
  if (!q) return;  // never ran a pass
  d->seq_count[q->owner]--;
  *q = d->seqs[--d->n_seqs];
  if (d->A > 1) send_cmd(d, CMD_KV_FREE, (int64_t)id);
}

static void dg_free(dg_ctx *d);

static void root_close(void *v) {
  dg_ctx *d = v;
  if (d->rank == 0) send_cmd(d, CMD_STOP, 0);
  dg_free(d);
}

// ---- the other ranks ----------------------------------------------------------------

static model_kv *worker_kv(dg_ctx *d, uint64_t id, int64_t n_ctx, quant_type type) {
  dg_seq *q = seq_find(d, id);
  if (q) return q->kv;
  const model_hparams *hp = &d->m->hp;
  model_kv *kv;
  if (kv_new(hp->n_layer, n_ctx, hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v, type, &kv)) {
    fprintf(stderr, "mole: rank %d: %s\n", d->rank, mole_last_error());
    MPI_Abort(d->comm, 1);
  }
  seq_add(d, id, d->rank)->kv = kv;
  return kv;
}

static mole_status worker(void *v) {
  dg_ctx *d = v;
  mole_status st = MOLE_OK;
  const int64_t V = d->m->hp.n_vocab;
  for (;;) {
    int64_t len;
    MPI_Request rq;
    MPI_Ibcast(&len, 1, MPI_INT64_T, 0, d->comm, &rq);
    dist_wait_for(&rq, 1, DIST_NAP_IDLE_US);  // between passes: may be idle for long
    d->msg = grow(d->msg, &d->msg_cap, (size_t)len * sizeof(int64_t));
    MPI_Ibcast(d->msg, (int)len, MPI_INT64_T, 0, d->comm, &rq);
    dist_wait_for(&rq, 1, DIST_NAP_PASS_US);
    const int64_t *p = d->msg;
    if (p[0] == CMD_STOP) break;
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
    const int64_t n_segs = p[1];
    const int64_t *tp = p + 2 + 7 * n_segs;
    int64_t n = 0, n_local = 0, n_lg = 0;
    for (int64_t i = 0; i < n_segs; i++) {
      const int64_t *q = p + 2 + 7 * i;
      n += q[4];
      if (q[6] == d->rank) n_lg += q[5] == 2 ? q[4] : q[5] == 1;
    }
    d->step_tokens = n;
    if (d->is_attn) {
      size_t cap = d->lsegs_cap;
      d->lsegs = grow(d->lsegs, &cap, (size_t)MOLE_MAX(n_segs, 1) * sizeof *d->lsegs);
      d->lsegs_cap = cap;
      d->ltoks = grow(d->ltoks, &d->ltoks_cap, (size_t)MOLE_MAX(n, 1) * sizeof *d->ltoks);
      d->lg = grow(d->lg, &d->lg_cap, (size_t)MOLE_MAX(n_lg * V, 1) * sizeof *d->lg);
      for (int64_t i = 0, t = 0, lo = 0; i < n_segs; i++) {
        const int64_t *q = p + 2 + 7 * i;
        if (q[6] == d->rank) {
          for (int64_t k = 0; k < q[4]; k++) d->ltoks[t + k] = (int32_t)tp[k];
          model_kv *kv = worker_kv(d, (uint64_t)q[0], q[1], (quant_type)q[2]);
          d->lsegs[n_local++] = (model_seg){kv, d->ltoks + t, q[4], q[3], q[5] ? d->lg + lo * V : NULL, q[5] == 2};
          lo += q[5] == 2 ? q[4] : q[5] == 1;
          t += q[4];
        }
        tp += q[4];
      }
    }
    if ((st = run_pass(d, n_local))) break;
    // this rank's logits to the root, in its order of its sequences
    for (int64_t i = 0; i < n_local; i++) {
      const model_seg *g = &d->lsegs[i];
      if (!g->logits) continue;
      const int64_t rows = g->all_logits ? g->n : 1;
      MPI_Request lr;
      const double t0 = now_s();
      MPI_Isend(g->logits, (int)(rows * V), MPI_FLOAT, 0, TAG_LOGITS, d->comm, &lr);
      dist_wait_for(&lr, 1, DIST_NAP_PASS_US);
      d->st.pass_s += now_s() - t0;  // the pass ends when the root has them
      d->st.wait_s += now_s() - t0;
      d->st.bytes_sent += rows * V * 4;
    }
  }
  if (st) fprintf(stderr, "mole: rank %d: %s\n", d->rank, mole_last_error());
  return st;
}

static void dg_free(dg_ctx *d) {
  if (!d) return;
  for (int64_t i = 0; i < d->n_seqs; i++) kv_free(d->seqs[i].kv);
  mole_free(d->seqs);
  mole_free(d->msg);
  mole_free(d->lsegs);
  mole_free(d->ltoks);
  mole_free(d->lg);
  for (int j = 0; j < MB_MAX; j++) {
    dg_mb *b = &d->mbs[j];
    model_scratch_free(b->s);
    for (int x = 0; x < MAXR; x++) mole_free(b->send[x]);
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
  send_cmd(d, CMD_STATS, 0);
  MPI_Gather(&d->st, sizeof d->st, MPI_BYTE, ranks, sizeof d->st, MPI_BYTE, 0, d->comm);
  *n_ranks = d->size;
  return MOLE_OK;
}

mole_status mole_disagg_reset_stats(mole_model *m) {
  if (!m->comm.forward || m->comm.rank != 0)
    return mole_errorf(MOLE_ERR_ARG, "mole_disagg_reset_stats: rank 0 of a disaggregated model (--disagg) only");
  dg_ctx *d = m->comm.ctx;
  send_cmd(d, CMD_RESET, 0);
  const bool a = d->st.attn, x = d->st.expert;
  memset(&d->st, 0, sizeof d->st);
  d->st.attn = a, d->st.expert = x;
  return MOLE_OK;
}

// ---- load -----------------------------------------------------------------------------

mole_status disagg_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  *out = NULL;
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
  for (int x = 0; x <= E; x++) d->ex0[x] = hp.n_expert * x / E;
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
  if ((st = model_load(path, &p, &sh, out))) {
    mole_free(d);
    return st;
  }
  mole_model *m = *out;
  d->m = m;
  m->comm = (model_comm){.ctx = d,
                         .rank = rank,
                         .size = size,
                         .forward = root_forward,
                         .worker = worker,
                         .kv_release = root_kv_release,
                         .close = root_close};
  return MOLE_OK;
}
