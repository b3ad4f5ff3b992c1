// dist: one model over several processes on Open MPI (Galaxy's hybrid
// tensor + sequence parallelism, arXiv 2405.17245, and Megatron tensor
// parallelism as the baseline).
//
// Every rank maps the same GGUF and loads only its shard (model_shard): its
// KV heads, its columns of every FFN and expert, its vocabulary rows. The
// root (rank 0) runs the program: before each forward pass it broadcasts the
// batch (which KV caches, positions, tokens), and the other ranks, in
// mole_dist_worker, run the same pass on their shards. Within a pass the
// ranks exchange activations through model_comm:
//   tp   every rank holds every token's residual; after each block the
//        row-parallel matmul's parts are summed with an all-reduce;
//   hmp  norms and residual adds run on each rank's share of the tokens;
//        an all-gather brings every token's normed input to each rank
//        before a block, a reduce-scatter brings each rank its tokens' sums
//        after it. With overlap (the default) both run as rings of
//        non-blocking point-to-point messages, and the matmuls next to them
//        (Q/K/V and gate/up before, wo and down after) run tile by tile,
//        one rank's tokens at a time, while the next tile is on the wire.
//        A MoE layer's FFN (routing, experts and their sum: all per token)
//        runs in an exchange instead: its own rows first while the others'
//        arrive, then each other rank's rows as they land, chunk by chunk,
//        every chunk's part of the sums sent back at once.
// Bytes sent are counted per collective (mole_dist_print_stats).
//
// Errors: a rank that fails while loading, or while making room for a pass
// (its KV cache, scratch and buffers are all sized before the pass starts),
// tells the others in a collective step (parallel_agree) where they already
// wait for each other: at the end of the load, and after the root's batch
// when that batch is larger in some way than any before (every rank knows
// the same batches, so every rank knows when the step comes; other passes
// allocate nothing and skip it). Every rank then returns that error: the
// workers leave mole_dist_worker with it, and the root's passes fail with it
// from then on. A worker whose pass fails inside it (the others are already
// in the pass's collectives and cannot hear of it) ends the job with
// MPI_Abort after printing why.
#include <cjson/cJSON.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "experts/budget.h"
#include "kv/kv.h"
#include "model/model.h"
#include "parallel/disagg.h"
#include "parallel/parallel.h"
#include "parallel/shares.h"

enum { CMD_STEP = 1, CMD_KV_FREE = 2, CMD_STOP = 3 };
enum { MAX_RANKS = PARALLEL_MAX_RANKS };

typedef struct {
  uint64_t id;
  model_kv *kv;  // a worker's cache of that sequence (NULL on the root, whose cache is the session's)
} kv_entry;

// What a pass allocates grows with these (every rank knows them from the
// batch): the largest of each so far, on every rank alike.
typedef struct {
  int64_t n_segs, n, ctx, n_out;  // sequences, tokens, the largest n_ctx, rows of logits
} pass_shape;

typedef struct dist_ctx {
  MPI_Comm comm;
  parallel_chan ch;  // the root's batches and commands
  int rank, size;
  mole_parallel mode;
  bool overlap;
  bool nap;  // in-pass waits nap (under a CPU quota) instead of spinning
  bool nbc;  // some rank naps: non-blocking collectives on every rank (they do not match blocking ones)
  bool fault;  // MOLE_TEST_FAIL_RANK names this rank: its first pass fails
  double seq_w[MAX_RANKS];       // sequence share of each rank (hmp)
  int64_t voc0[MAX_RANKS + 1];   // vocabulary rows of each rank
  mole_model *m;
  mole_dist_counts counts;
  pass_shape room;  // the largest batch every rank has made room for
  // the KV caches the workers hold, by the root's id (on the root: the ids)
  kv_entry *kvs;
  int64_t n_kvs;
  size_t kvs_cap;
  // a worker's pass: the sequences, their tokens, a scratch for the largest batch
  model_seg *segs;
  size_t segs_cap;
  int32_t *toks;
  size_t toks_cap;
  model_scratch *s;
  // buffers
  float *tmp;  // ring receive buffer / logits staging
  size_t tmp_cap;
  float *stage;  // exchange: the other ranks' parts of this rank's rows [N][rows]
  size_t stage_cap;
} dist_ctx;

// Within a forward pass the ranks keep MPI's spinning waits: sleeping there
// added latency when ranks share cores (decode at N = 4 on 2 cores: 6.5 ->
// 11.3 ms per token in bench/dist.sh). Except under a CPU quota (a cgroup
// giving the process fewer cores than threads, or MOLE_DIST_WAIT=nap): there
// a spinning wait spends the quota the next block needs, and the rank is then
// throttled while the others wait for it, so its in-pass waits nap from the
// start (d->nap).
static void pass_wait(const dist_ctx *d, MPI_Request *rq, int n) {
  if (d->nap)
    parallel_wait_naps(rq, n, PARALLEL_NAP_PASS_US);
  else
    MPI_Waitall(n, rq, MPI_STATUSES_IGNORE);
}

// MOLE_DIST_WAIT=spin|nap|auto (auto: nap under a CPU quota of fewer cores
// than threads).
static mole_status wait_mode(int n_threads, bool *nap) {
  const char *e = getenv("MOLE_DIST_WAIT");
  if (!e || !*e || !strcmp(e, "auto")) {
    const double quota = experts_cpu_quota(NULL);
    *nap = quota > 0 && quota < n_threads;
    return MOLE_OK;
  }
  if (strcmp(e, "spin") && strcmp(e, "nap"))
    return mole_errorf(MOLE_ERR_ARG, "MOLE_DIST_WAIT=%s: expected spin, nap or auto", e);
  *nap = !strcmp(e, "nap");
  return MOLE_OK;
}

// ---- hooks --------------------------------------------------------------------------

static void token_split(void *v, int64_t n, int rank, int64_t *t0, int64_t *t1) {
  const dist_ctx *d = v;
  double tot = 0, acc = 0;
  for (int r = 0; r < d->size; r++) tot += d->seq_w[r];
  for (int r = 0; r < rank; r++) acc += d->seq_w[r];
  *t0 = (int64_t)floor((double)n * acc / tot + 0.5);
  *t1 = (int64_t)floor((double)n * (acc + d->seq_w[rank]) / tot + 0.5);
  if (rank == d->size - 1) *t1 = n;
}

static void allreduce(void *v, void *buf, int64_t n, bool f64) {
  dist_ctx *d = v;
  if (d->nbc) {
    MPI_Request rq;
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, d->comm, &rq);
    pass_wait(d, &rq, 1);
  } else {
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, d->comm);
  }
  // a ring all-reduce sends 2 (N-1)/N of the buffer from each rank
  d->counts.allreduce_bytes += 2 * (d->size - 1) * n * (f64 ? 8 : 4) / d->size;
  d->counts.allreduce_calls++;
}

static void blocks(dist_ctx *d, int64_t n, int64_t row, int *cnt, int *dsp) {
  for (int r = 0; r < d->size; r++) {
    int64_t t0, t1;
    token_split(d, n, r, &t0, &t1);
    cnt[r] = (int)((t1 - t0) * row);
    dsp[r] = (int)(t0 * row);
  }
}

static void allgather(void *v, float *x, int64_t n, int64_t row, model_rows_fn on_rows, void *user) {
  dist_ctx *d = v;
  int cnt[MAX_RANKS] = {0}, dsp[MAX_RANKS] = {0};
  blocks(d, n, row, cnt, dsp);
  const int N = d->size, r = d->rank;
  d->counts.allgather_calls++;
  d->counts.allgather_bytes += (int64_t)cnt[r] * 4 * (N - 1);
  // fewer tokens than ranks (decode): nothing to overlap, some ranks have no
  // rows, and a ring would pass the owner's row through N-1 hops in turn
  if (!d->overlap || !on_rows || n < N) {
    if (d->nbc) {
      MPI_Request rq;
      MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x, cnt, dsp, MPI_FLOAT, d->comm, &rq);
      pass_wait(d, &rq, 1);
    } else {
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x, cnt, dsp, MPI_FLOAT, d->comm);
    }
    if (on_rows) on_rows(user, 0, n);
    return;
  }
  // ring: at step s this rank holds block (r - s) and passes it on, while
  // its rows are computed on; block (r - s - 1) arrives meanwhile
  for (int s = 0; s < N; s++) {
    const int b = ((r - s) % N + N) % N, nb = ((r - s - 1) % N + N) % N;
    MPI_Request rq[2];
    int nrq = 0;
    if (s < N - 1) {
      MPI_Isend(x + dsp[b], cnt[b], MPI_FLOAT, (r + 1) % N, 100 + s, d->comm, &rq[nrq++]);
      MPI_Irecv(x + dsp[nb], cnt[nb], MPI_FLOAT, (r - 1 + N) % N, 100 + s, d->comm, &rq[nrq++]);
    }
    if (cnt[b] > 0) on_rows(user, dsp[b] / row, (dsp[b] + cnt[b]) / row);
    pass_wait(d, rq, nrq);
  }
}

static void reduce_scatter(void *v, float *y, int64_t n, int64_t row, model_rows_fn make_rows, void *user) {
  dist_ctx *d = v;
  int cnt[MAX_RANKS] = {0}, dsp[MAX_RANKS] = {0};
  blocks(d, n, row, cnt, dsp);
  const int N = d->size, r = d->rank;
  d->counts.reduce_scatter_calls++;
  d->counts.reduce_scatter_bytes += (n * row - cnt[r]) * 4;
  if (!d->overlap || !make_rows || n < N) {  // (as allgather)
    if (make_rows) make_rows(user, 0, n);
    // in place: this rank's block of the sums into its place
    MOLE_ASSERT((size_t)cnt[r] * sizeof(float) <= d->tmp_cap);  // room made before the pass (pass_room)
    if (d->nbc) {
      MPI_Request rq;
      MPI_Ireduce_scatter(y, d->tmp, cnt, MPI_FLOAT, MPI_SUM, d->comm, &rq);
      pass_wait(d, &rq, 1);
    } else {
      MPI_Reduce_scatter(y, d->tmp, cnt, MPI_FLOAT, MPI_SUM, d->comm);
    }
    memcpy(y + dsp[r], d->tmp, (size_t)cnt[r] * sizeof(float));
    return;
  }
  // ring: the running sum of block k starts at rank k + 1 and ends at rank
  // k; each rank computes its part of the block just before adding to it
  int64_t maxc = 0;
  for (int k = 0; k < N; k++) maxc = MOLE_MAX(maxc, (int64_t)cnt[k]);
  MOLE_ASSERT((size_t)maxc * sizeof(float) <= d->tmp_cap);
  MPI_Request sq = MPI_REQUEST_NULL;
  int k = ((r - 1) % N + N) % N;
  if (cnt[k] > 0) make_rows(user, dsp[k] / row, (dsp[k] + cnt[k]) / row);
  MPI_Isend(y + dsp[k], cnt[k], MPI_FLOAT, (r + 1) % N, 200, d->comm, &sq);
  for (int s = 1; s < N; s++) {
    k = ((r - s - 1) % N + N) % N;
    MPI_Request rq;
    MPI_Irecv(d->tmp, cnt[k], MPI_FLOAT, (r - 1 + N) % N, 200 + s - 1, d->comm, &rq);
    if (cnt[k] > 0) make_rows(user, dsp[k] / row, (dsp[k] + cnt[k]) / row);
    pass_wait(d, &rq, 1);
    float *yk = y + dsp[k];
    for (int i = 0; i < cnt[k]; i++) yk[i] += d->tmp[i];
    pass_wait(d, &sq, 1);
    if (s < N - 1) MPI_Isend(yk, cnt[k], MPI_FLOAT, (r + 1) % N, 200 + s, d->comm, &sq);
  }
}

// ---- exchange: all-gather, per-token compute, reduce-scatter in one ------------------

enum { XCH_CHUNKS = 4, TAG_XG = 300, TAG_YS = 400 };

// Rows [*a, *b) of chunk c of a block of `rows` rows cut in nchunks(rows).
static int nchunks(int64_t rows) { return (int)MOLE_MIN((int64_t)XCH_CHUNKS, rows); }
static void chunk(int64_t rows, int c, int64_t *a, int64_t *b) {
  const int C = nchunks(rows);
  *a = rows * c / C;
  *b = rows * (c + 1) / C;
}

// Index of a request of rq[n] that completed (MPI_Waitany, or napping under a quota).
static int wait_any(const dist_ctx *d, MPI_Request *rq, int n) {
  int idx = MPI_UNDEFINED;
  if (!d->nap) {
    MPI_Waitany(n, rq, &idx, MPI_STATUS_IGNORE);
    return idx;
  }
  int flag = 0;
  long nap_us = 10;
  for (;;) {
    MPI_Testany(n, rq, &idx, &flag, MPI_STATUS_IGNORE);
    if (flag) return idx;
    const struct timespec ts = {0, nap_us * 1000};
    nanosleep(&ts, NULL);
    nap_us = MOLE_MIN(2 * nap_us, (long)PARALLEL_NAP_PASS_US);
  }
}

// Every rank's rows of x to every rank, compute(a, b) on them, and the sum
// over ranks of y's own rows here (a MoE layer under hmp: routing, experts
// and their weighted sum are all per token, so any rows can be computed as
// soon as they are here). With overlap: this rank's rows first while the
// others' arrive; then each other rank's rows as they land, chunk by chunk,
// each chunk's part of the sums sent to that rank at once, so both
// directions of the link carry data while the rest is computed. The same
// bytes as a ring all-gather + reduce-scatter ((N-1) blocks each way per
// rank), sent directly; the parts are summed in rank order, so the result
// does not depend on the order they arrived in. Fewer tokens than ranks
// (decode): plain collectives, since sent directly the owner's one row would
// leave its link N-1 times instead of once in a ring.
static void exchange(void *v, float *x, float *y, int64_t n, int64_t row, model_rows_fn compute, void *user) {
  dist_ctx *d = v;
  if (!d->overlap || n < d->size) {
    allgather(v, x, n, row, NULL, NULL);
    compute(user, 0, n);
    reduce_scatter(v, y, n, row, NULL, NULL);
    return;
  }
  int cnt[MAX_RANKS] = {0}, dsp[MAX_RANKS] = {0};
  blocks(d, n, row, cnt, dsp);
  const int N = d->size, r = d->rank;
  d->counts.allgather_calls++;
  d->counts.allgather_bytes += (int64_t)cnt[r] * 4 * (N - 1);
  d->counts.reduce_scatter_calls++;
  d->counts.reduce_scatter_bytes += (n * row - cnt[r]) * 4;
  const int64_t mine = cnt[r] / row;
  MOLE_ASSERT((size_t)N * (size_t)cnt[r] * sizeof(float) <= d->stage_cap);
  MPI_Request xr[MAX_RANKS], yr[MAX_RANKS * XCH_CHUNKS], sq[MAX_RANKS * (XCH_CHUNKS + 1)];
  int ny = 0, ns = 0, left = 0;
  for (int k = 0; k < N; k++) {
    xr[k] = MPI_REQUEST_NULL;
    if (k == r) continue;
    if (cnt[k] > 0) {
      MPI_Irecv(x + dsp[k], cnt[k], MPI_FLOAT, k, TAG_XG, d->comm, &xr[k]);
      left++;
    }
    if (cnt[r] > 0) MPI_Isend(x + dsp[r], cnt[r], MPI_FLOAT, k, TAG_XG, d->comm, &sq[ns++]);
    // k's part of the sums of this rank's rows (every rank has one, rows or not)
    for (int c = 0; c < nchunks(mine); c++) {
      int64_t a, b;
      chunk(mine, c, &a, &b);
      MPI_Irecv(d->stage + (size_t)k * cnt[r] + a * row, (int)((b - a) * row), MPI_FLOAT, k, TAG_YS + c, d->comm, &yr[ny++]);
    }
  }
  if (mine > 0) compute(user, dsp[r] / row, (dsp[r] + cnt[r]) / row);
  while (left-- > 0) {
    const int k = wait_any(d, xr, N);
    const int64_t rows = cnt[k] / row, k0 = dsp[k] / row;
    for (int c = 0; c < nchunks(rows); c++) {
      int64_t a, b;
      chunk(rows, c, &a, &b);
      compute(user, k0 + a, k0 + b);
      MPI_Isend(y + (k0 + a) * row, (int)((b - a) * row), MPI_FLOAT, k, TAG_YS + c, d->comm, &sq[ns++]);
    }
  }
  pass_wait(d, yr, ny);
  pass_wait(d, sq, ns);
  float *yo = y + dsp[r];
  for (int64_t i = 0; i < cnt[r]; i++) {
    float acc = 0.0f;
    for (int k = 0; k < N; k++) acc += k == r ? yo[i] : d->stage[(size_t)k * cnt[r] + i];
    yo[i] = acc;
  }
}

static void gather_logits(void *v, const float *local, int64_t n, int64_t v_local, float *out) {
  dist_ctx *d = v;
  int cnt[MAX_RANKS] = {0}, dsp[MAX_RANKS] = {0};
  int64_t tot = 0;
  for (int r = 0; r < d->size; r++) {
    cnt[r] = (int)(n * (d->voc0[r + 1] - d->voc0[r]));
    dsp[r] = (int)tot;
    tot += cnt[r];
  }
  MOLE_ASSERT(cnt[d->rank] == n * v_local);
  d->counts.logits_bytes += d->rank ? (int64_t)cnt[d->rank] * 4 : 0;
  float *all = NULL;
  if (d->rank == 0) {
    MOLE_ASSERT((size_t)tot * sizeof(float) <= d->tmp_cap);
    all = d->tmp;
  }
  if (d->nbc) {
    MPI_Request rq;
    MPI_Igatherv(local, cnt[d->rank], MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, 0, d->comm, &rq);
    pass_wait(d, &rq, 1);
  } else {
    MPI_Gatherv(local, cnt[d->rank], MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, 0, d->comm);
  }
  if (d->rank != 0) return;
  const int64_t V = d->voc0[d->size];
  for (int r = 0; r < d->size; r++) {
    const int64_t vl = d->voc0[r + 1] - d->voc0[r];
    for (int64_t t = 0; t < n; t++) memcpy(out + t * V + d->voc0[r], all + dsp[r] + t * vl, (size_t)vl * sizeof(float));
  }
}

// ---- the batch, and room for it ---------------------------------------------------

static kv_entry *kv_find(dist_ctx *d, uint64_t id) {
  for (int64_t i = 0; i < d->n_kvs; i++)
    if (d->kvs[i].id == id) return &d->kvs[i];
  return NULL;
}

// A sequence new to the workers: a worker makes its KV cache (its heads), the
// root notes the id.
static mole_status kv_add(dist_ctx *d, uint64_t id, int64_t n_ctx, quant_type type) {
  mole_status st = MOLE_OK;
  d->kvs = parallel_grow(d->kvs, &d->kvs_cap, (size_t)(d->n_kvs + 1) * sizeof *d->kvs, "the KV cache table", &st);
  if (st) return st;
  model_kv *kv = NULL;
  const model_hparams *hp = &d->m->hp;
  const int64_t hkv = d->m->loc.n_head_kv;
  if (d->rank && (st = kv_new(hp->n_layer, n_ctx, hkv * hp->head_dim, hkv * hp->head_dim_v, type, &kv))) return st;
  d->kvs[d->n_kvs++] = (kv_entry){id, kv};
  return MOLE_OK;
}

// A sequence gone (the same on every rank): false when it never ran a pass.
static bool kv_drop(dist_ctx *d, uint64_t id) {
  kv_entry *e = kv_find(d, id);
  if (!e) return false;
  kv_free(e->kv);
  *e = d->kvs[--d->n_kvs];
  return true;
}

static pass_shape shape_of(const int64_t *p) {
  pass_shape sh = {p[1], 0, 0, 0};
  for (int64_t i = 0; i < sh.n_segs; i++) {
    const int64_t *q = parallel_batch_seg(p, i);
    sh.n += q[PARALLEL_SEG_N];
    sh.ctx = MOLE_MAX(sh.ctx, q[PARALLEL_SEG_CTX]);
    sh.n_out += q[PARALLEL_SEG_LOGITS] == 2 ? q[PARALLEL_SEG_N] : q[PARALLEL_SEG_LOGITS] == 1;
  }
  return sh;
}

// The buffers of the collectives for batches up to r on this rank.
static mole_status buffers_room(dist_ctx *d, const pass_shape *r) {
  const mole_model *m = d->m;
  const int64_t E = m->hp.n_embd;
  size_t tmp = 1, stage = 1;  // floats
  if (m->comm.hmp) {
    // a rank's rows of up to r->n tokens (token_split): its share, and one
    // more for the rounding, whatever the batch
    double tot = 0, most = 0;
    for (int k = 0; k < d->size; k++) tot += d->seq_w[k], most = MOLE_MAX(most, d->seq_w[k]);
    const int64_t rows_most = MOLE_MIN(r->n, (int64_t)ceil((double)r->n * most / tot) + 1);
    const int64_t rows_mine = MOLE_MIN(r->n, (int64_t)ceil((double)r->n * d->seq_w[d->rank] / tot) + 1);
    tmp = (size_t)(rows_most * E);  // reduce-scatter: a block of the ring, or this rank's sums
    if (d->overlap && m->hp.n_expert > 0) stage = (size_t)d->size * (size_t)(rows_mine * E);  // exchange
  }
  if (d->rank == 0 && !m->comm.root_vocab) tmp = MOLE_MAX(tmp, (size_t)(r->n_out * m->hp.n_vocab));  // gather_logits
  mole_status st = MOLE_OK;
  d->tmp = parallel_grow(d->tmp, &d->tmp_cap, tmp * sizeof(float), "the collectives' buffer", &st);
  d->stage = parallel_grow(d->stage, &d->stage_cap, stage * sizeof(float), "the MoE exchange's buffer", &st);
  return st;
}

// Room for the batch in d->ch.msg (every rank calls it with the same batch).
// One larger in some way than any before, or with a sequence new to the
// workers, gets room on every rank (a worker: the new sequences' KV caches,
// its scratch, its tables; every rank: the collectives' buffers), and the
// ranks agree on the outcome; any other batch has room already.
static mole_status pass_room(dist_ctx *d) {
  const int64_t *p = d->ch.msg;
  const pass_shape sh = shape_of(p);
  bool fresh = false;
  for (int64_t i = 0; i < sh.n_segs && !fresh; i++) fresh = !kv_find(d, (uint64_t)parallel_batch_seg(p, i)[PARALLEL_SEG_ID]);
  pass_shape r = d->room;
  if (!fresh && sh.n_segs <= r.n_segs && sh.n <= r.n && sh.ctx <= r.ctx && sh.n_out <= r.n_out) return MOLE_OK;
  r.n_segs = MOLE_MAX(r.n_segs, sh.n_segs);
  r.n = MOLE_MAX(r.n, sh.n);
  r.ctx = MOLE_MAX(r.ctx, sh.ctx);
  r.n_out = MOLE_MAX(r.n_out, sh.n_out);
  mole_status st = MOLE_OK;
  if (d->fault) {
    d->fault = false;
    st = mole_errorf(MOLE_ERR_NOMEM, "out of memory (injected: MOLE_TEST_FAIL_RANK=%d)", d->rank);
  }
  for (int64_t i = 0; i < sh.n_segs && !st; i++) {
    const int64_t *q = parallel_batch_seg(p, i);
    if (!kv_find(d, (uint64_t)q[PARALLEL_SEG_ID])) st = kv_add(d, (uint64_t)q[PARALLEL_SEG_ID], q[PARALLEL_SEG_CTX], (quant_type)q[PARALLEL_SEG_TYPE]);
  }
  if (!st) st = buffers_room(d, &r);
  if (!st && d->rank) {
    d->segs = parallel_grow(d->segs, &d->segs_cap, (size_t)r.n_segs * sizeof *d->segs, "the batch's sequences", &st);
    d->toks = parallel_grow(d->toks, &d->toks_cap, (size_t)r.n * sizeof *d->toks, "the batch's tokens", &st);
    if (!st && (!d->s || r.n > d->room.n || r.ctx > d->room.ctx)) {  // a scratch for the largest batch
      model_scratch_free(d->s);
      d->s = NULL;
      st = model_scratch_new(d->m, r.n, r.ctx, &d->s);
    }
  }
  if ((st = parallel_agree(d->comm, st))) return st;
  d->room = r;
  return MOLE_OK;
}

static mole_status step(void *v, const model_seg *segs, int64_t n_segs) {
  dist_ctx *d = v;
  const int64_t len = parallel_batch_len(segs, n_segs);
  mole_status st = parallel_chan_reserve(&d->ch, len);
  if (st) return st;  // nothing sent: the workers wait on
  parallel_batch_write(d->ch.msg, CMD_STEP, segs, n_segs, NULL);
  if ((st = parallel_chan_send(&d->ch, len))) return st;
  if ((st = pass_room(d))) return parallel_chan_stop(&d->ch, st);
  d->counts.step_bytes += (len + 1) * 8 * (d->size - 1);
  return MOLE_OK;
}

// A command: within the room every rank has from the start, so nothing can
// fail but a stop that came before (then nothing is sent).
static void send_cmd(dist_ctx *d, int64_t cmd, int64_t arg) {
  d->ch.msg[0] = cmd;
  d->ch.msg[1] = arg;
  (void)parallel_chan_send(&d->ch, 2);
}

static void kv_release(void *v, uint64_t id) {
  dist_ctx *d = v;
  if (kv_drop(d, id)) send_cmd(d, CMD_KV_FREE, (int64_t)id);  // else no worker has it
}

static void dist_free(dist_ctx *d);

// the model is being freed: the root stops the workers; the context goes with it
// The root's pass failed after step(): the workers wait in its collectives.
static void pass_failed(void *ctx) { parallel_abort(((dist_ctx *)ctx)->comm, "a forward pass"); }

static void close_hook(void *v) {
  dist_ctx *d = v;
  if (d->rank == 0) send_cmd(d, CMD_STOP, 0);
  dist_free(d);
}

// ---- shards -----------------------------------------------------------------------------

// The largest quantization block of the tensors named *suffix in f (the
// columns a row-parallel shard cuts must fall on them).
static int64_t max_block(const gguf_file *f, const char *suffix) {
  int64_t b = 1;
  const size_t ls = strlen(suffix);
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    const size_t ln = strlen(t->name);
    if (ln >= ls && !strcmp(t->name + ln - ls, suffix)) b = MOLE_MAX(b, quant_blck_size(t->type));
  }
  return b;
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

typedef struct {
  double heads[MAX_RANKS], ffn[MAX_RANKS], seq[MAX_RANKS], vocab[MAX_RANKS];
} dist_weights;

static mole_status read_plan(const char *path, int size, dist_weights *w, mole_parallel *mode) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return mole_errorf(MOLE_ERR_IO, "--plan %s: cannot open", path);
  char buf[1 << 16];
  const size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  cJSON *root = cJSON_Parse(buf);
  mole_status st = MOLE_OK;
  const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "ranks");
  if (!root || !cJSON_IsArray(ranks))
    st = mole_errorf(MOLE_ERR_FORMAT, "--plan %s: not a plan (a JSON object with a 'ranks' array; see mole plan)", path);
  else if (cJSON_GetArraySize(ranks) != size)
    st = mole_errorf(MOLE_ERR_ARG, "--plan %s: a plan for %d processes, run with %d", path, cJSON_GetArraySize(ranks),
                     size);
  const cJSON *md = root ? cJSON_GetObjectItemCaseSensitive(root, "mode") : NULL;
  if (!st && md && (!cJSON_IsString(md) || (strcmp(md->valuestring, "tp") && strcmp(md->valuestring, "hmp"))))
    st = mole_errorf(MOLE_ERR_FORMAT, "--plan %s: mode must be \"hmp\" or \"tp\"", path);
  if (!st && md && *mode == MOLE_PARALLEL_NONE)
    *mode = !strcmp(md->valuestring, "tp") ? MOLE_PARALLEL_TP : MOLE_PARALLEL_HMP;
  for (int r = 0; r < size && !st; r++) {
    const cJSON *e = cJSON_GetArrayItem(ranks, r);
    const char *keys[4] = {"heads", "ffn", "seq", "vocab"};
    double *dst[4] = {&w->heads[r], &w->ffn[r], &w->seq[r], &w->vocab[r]};
    for (int k = 0; k < 4 && !st; k++) {
      const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, keys[k]);
      if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > 1e9)
        st = mole_errorf(MOLE_ERR_FORMAT, "--plan %s: ranks[%d].%s must be a share >= 0", path, r, keys[k]);
      else
        *dst[k] = x->valuedouble;
    }
  }
  // each kind of work is cut in proportion to its shares: they cannot all be 0
  const char *keys[4] = {"heads", "ffn", "seq", "vocab"};
  const double *col[4] = {w->heads, w->ffn, w->seq, w->vocab};
  for (int k = 0; k < 4 && !st; k++) {
    double tot = 0;
    for (int r = 0; r < size; r++) tot += col[k][r];
    if (!(tot > 0)) st = mole_errorf(MOLE_ERR_FORMAT, "--plan %s: every rank's %s share is 0", path, keys[k]);
  }
  cJSON_Delete(root);
  return st;
}

// This rank's shard from the shares.
static mole_status make_shard(const gguf_file *f, const model_hparams *hp, const dist_weights *w, int size, int rank,
                              model_shard *sh, int64_t *voc0) {
  int64_t b[MAX_RANKS + 1];
  // whole KV heads, the output projection's columns on its blocks
  const int64_t blk_o = max_block(f, "attn_output.weight"), cols = hp->n_head / hp->n_head_kv * hp->head_dim_v;
  const int64_t uh = blk_o / gcd64(blk_o, cols);
  mole_status st = shares_cut(hp->n_head_kv, MOLE_MAX(uh, 1), w->heads, size, b);
  sh->kvh0 = b[rank], sh->kvh1 = b[rank + 1];
  const int64_t fb = MOLE_MAX(max_block(f, "ffn_down.weight"), 16);
  if (!st) st = shares_cut(hp->n_ff, fb, w->ffn, size, b);
  sh->ff0 = b[rank], sh->ff1 = b[rank + 1];
  const int64_t feb = MOLE_MAX(max_block(f, "ffn_down_exps.weight"), 16);
  if (!st) st = shares_cut(hp->n_ff_exp, feb, w->ffn, size, b);
  sh->fe0 = b[rank], sh->fe1 = b[rank + 1];
  const int64_t fsb = MOLE_MAX(max_block(f, "ffn_down_shexp.weight"), 16);
  if (!st) st = shares_cut(hp->n_ff_shexp, fsb, w->ffn, size, b);
  sh->fs0 = b[rank], sh->fs1 = b[rank + 1];
  if (!st) st = shares_cut(hp->n_vocab, 16, w->vocab, size, voc0);
  sh->voc0 = voc0[rank], sh->voc1 = voc0[rank + 1];
  sh->ex0 = 0, sh->ex1 = hp->n_expert;  // every routed expert (its columns)
  sh->given = true;  // an empty range is a range, not "the whole"
  return st;
}

// The shard of this rank (the hparams and tensor types from a first look at
// the file), then the model with it: *d and *out, both NULL on failure.
static mole_status load_shard(const char *path, const mole_model_params *p, const dist_weights *w, dist_ctx **d,
                              mole_model **out) {
  const int rank = mole_dist_rank(), size = mole_dist_size();
  mole_model *probe;
  model_shard whole = {0};
  mole_model_params pp = *p;
  pp.use_mmap = true;
  pp.n_threads = 1;
  pp.offload.expert_budget = 0;
  mole_status st = model_load(path, &pp, &whole, &probe);
  if (st) return st;
  model_shard sh = {0};
  *d = mole_calloc(1, sizeof **d);
  if (!*d) st = mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", path);
  if (!st) st = make_shard(probe->gguf, &probe->hp, w, size, rank, &sh, (*d)->voc0);
  model_free(probe);
  if (!st) st = parallel_chan_init(&(*d)->ch, MPI_COMM_WORLD);
  if (!st) st = model_load(path, p, &sh, out);
  if (st) {
    dist_free(*d);
    *d = NULL;
  }
  return st;
}

// A load's first collective is parallel_agree, reached by every rank
// whatever failed before it, so that a rank that cannot read the file, the
// plan or find the memory makes every rank return its error.
mole_status mole_dist_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  *out = NULL;
  if (!parallel_inited()) return mole_errorf(MOLE_ERR_ARG, "--parallel: mole was not started by mpirun (mole_dist_init)");
  const int threads = parallel_default_threads();  // (a collective: on every rank, before anything can fail)
  const int rank = mole_dist_rank(), size = mole_dist_size();
  mole_model_params p = *params;
  mole_status st = MOLE_OK;
  if (p.n_threads < 0 || p.n_threads > 1024)
    st = mole_errorf(MOLE_ERR_ARG, "threads: %d is out of range (0 = the cores shared by the processes here)", p.n_threads);
  else if (p.n_threads == 0)
    p.n_threads = threads;
  if (!st && (p.disagg_attn > 0 || p.disagg_expert > 0)) return disagg_model_load(path, &p, out);
  bool nap = false;
  if (!st) st = wait_mode(p.n_threads, &nap);
  dist_weights w;
  for (int r = 0; r < size; r++) w.heads[r] = w.ffn[r] = w.seq[r] = w.vocab[r] = 1.0;
  if (!st && p.plan) st = read_plan(p.plan, size, &w, &p.parallel);  // its mode unless --parallel says
  if (p.parallel == MOLE_PARALLEL_NONE) p.parallel = MOLE_PARALLEL_HMP;
  dist_ctx *d = NULL;
  if (!st) st = load_shard(path, &p, &w, &d, out);
  if ((st = parallel_agree(MPI_COMM_WORLD, st))) {
    model_free(*out);
    *out = NULL;
    dist_free(d);
    return st;
  }
  mole_model *m = *out;
  d->comm = MPI_COMM_WORLD;
  d->rank = rank;
  d->size = size;
  d->mode = p.parallel;
  d->overlap = !p.no_overlap;
  d->nap = nap;
  d->fault = parallel_test_fault();
  int any = nap;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, d->comm);
  d->nbc = any;
  d->m = m;
  for (int r = 0; r < size; r++) d->seq_w[r] = w.seq[r];
  m->comm = (model_comm){.ctx = d,
                         .rank = rank,
                         .size = size,
                         .hmp = p.parallel == MOLE_PARALLEL_HMP,
                         .root_vocab = d->voc0[1] - d->voc0[0] == d->voc0[size],
                         .token_split = token_split,
                         .allreduce = allreduce,
                         .allgather = allgather,
                         .reduce_scatter = reduce_scatter,
                         .exchange = exchange,
                         .gather_logits = gather_logits,
                         .step = step,
                         .kv_release = kv_release,
                         .pass_failed = pass_failed,
                         .close = close_hook};
  return MOLE_OK;
}

// ---- the other ranks ----------------------------------------------------------------------

mole_status mole_dist_worker(mole_model *m) {
  if (m->comm.worker && m->comm.rank != 0) return m->comm.worker(m->comm.ctx);
  dist_ctx *d = m->comm.ctx;
  if (!d || d->rank == 0) return mole_errorf(MOLE_ERR_ARG, "mole_dist_worker: not a worker rank of a sharded model");
  static float sink;  // logits land on the root only: any non-NULL pointer marks a sequence that wants them
  for (;;) {
    int64_t len;
    mole_status st = parallel_chan_recv(&d->ch, &len);
    if (st) return st;
    const int64_t *p = d->ch.msg;
    if (p[0] == CMD_STOP) return MOLE_OK;
    if (p[0] == CMD_KV_FREE) {
      kv_drop(d, (uint64_t)p[1]);
      continue;
    }
    if ((st = pass_room(d))) return st;
    const int64_t n_segs = p[1], *tp = parallel_batch_tokens(p);
    for (int64_t i = 0, t = 0; i < n_segs; i++) {
      const int64_t *q = parallel_batch_seg(p, i);
      for (int64_t k = 0; k < q[PARALLEL_SEG_N]; k++) d->toks[t + k] = (int32_t)tp[t + k];
      d->segs[i] = (model_seg){kv_find(d, (uint64_t)q[PARALLEL_SEG_ID])->kv, d->toks + t, q[PARALLEL_SEG_N], q[PARALLEL_SEG_PAST],
                               q[PARALLEL_SEG_LOGITS] ? &sink : NULL, q[PARALLEL_SEG_LOGITS] == 2};
      t += q[PARALLEL_SEG_N];
    }
    // (the other ranks are inside this pass's collectives, waiting for this one's part)
    if (model_forward_batch(m, d->s, d->segs, n_segs)) parallel_abort(d->comm, "a forward pass");
  }
}

static void dist_free(dist_ctx *d) {
  if (!d) return;
  for (int64_t i = 0; i < d->n_kvs; i++) kv_free(d->kvs[i].kv);
  mole_free(d->kvs);
  mole_free(d->segs);
  mole_free(d->toks);
  model_scratch_free(d->s);
  mole_free(d->tmp);
  mole_free(d->stage);
  parallel_chan_free(&d->ch);
  mole_free(d);
}

void mole_dist_get_counts(const mole_model *m, mole_dist_counts *out) {
  const dist_ctx *d = m->comm.ctx;
  memset(out, 0, sizeof *out);
  if (d && !m->comm.forward) *out = d->counts;
}
