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
#include "parallel/dist.h"
#include "parallel/dist_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "experts/budget.h"
#include "kv/kv.h"
#include "model/model.h"

enum { CMD_STEP = 1, CMD_KV_FREE = 2, CMD_STOP = 3 };
enum { MAX_RANKS = DIST_MAX_RANKS };

typedef struct {
  uint64_t id;
  model_kv *kv;
} kv_entry;

struct dist_ctx {
  MPI_Comm comm;
  int rank, size;
  mole_parallel mode;
  bool overlap;
  bool nap;  // in-pass waits nap (under a CPU quota) instead of spinning
  bool nbc;  // some rank naps: non-blocking collectives on every rank (they do not match blocking ones)
  double seq_w[MAX_RANKS];       // sequence share of each rank (hmp)
  int64_t voc0[MAX_RANKS + 1];   // vocabulary rows of each rank
  mole_model *m;
  dist_counts counts;
  // worker: the root's KV caches, by id
  kv_entry *kvs;
  int64_t n_kvs, cap_kvs;
  // buffers
  float *tmp;  // ring receive buffer / logits staging
  float *stage;  // exchange: the other ranks' parts of this rank's rows [N][rows]
  size_t stage_cap;
  size_t tmp_cap;
  int64_t *msg;
  size_t msg_cap;
};

static bool g_inited;
static int g_rank, g_size = 1;

// A worker waiting for the root's next step (a server between requests can
// leave it there for minutes) must not spin at full speed as MPI's own waits
// do: it waits on a non-blocking broadcast with MPI_Testall, spinning for the
// first WAIT_SPIN_US, then sleeping between tests, 10 us at first and twice
// as long each time up to max_nap_us. Within a forward pass the ranks keep
// MPI's spinning waits: sleeping there added latency when ranks share cores
// (decode at N = 4 on 2 cores: 6.5 -> 11.3 ms per token in bench/dist.sh).
// Except under a CPU quota (a cgroup giving the process fewer cores than
// threads, or MOLE_DIST_WAIT=nap): there a spinning wait spends the quota
// the next block needs, and the rank is then throttled while the others
// wait for it, so its in-pass waits nap from the start (d->nap).
enum { WAIT_SPIN_US = 100, WAIT_NAP_PASS_US = DIST_NAP_PASS_US, WAIT_NAP_IDLE_US = DIST_NAP_IDLE_US };

static void wait_spin_nap(MPI_Request *rq, int n, int spin_us, int max_nap_us) {
  int done = 0;
  MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
  if (done) return;
  const double t0 = MPI_Wtime();
  long nap_us = 10;
  while (!done) {
    if (MPI_Wtime() - t0 > spin_us * 1e-6) {
      const struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, NULL);
      nap_us = MOLE_MIN(2 * nap_us, (long)max_nap_us);
    }
    MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
  }
}

void dist_wait_for(MPI_Request *rq, int n, int max_nap_us) { wait_spin_nap(rq, n, WAIT_SPIN_US, max_nap_us); }

// In-pass waits: MPI's spinning wait, or naps under a CPU quota.
static void pass_wait(const dist_ctx *d, MPI_Request *rq, int n) {
  if (d->nap)
    wait_spin_nap(rq, n, 0, WAIT_NAP_PASS_US);
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

// Open MPI's TCP transport sends a message over its eager limit (64 KiB by
// default) by rendezvous, which moves only inside MPI calls: on a slow link
// a prompt's all-reduce or ring step then waited for it (bench/dist.sh, 100
// Mbit/s, N = 2: tp prompt 11.7 -> 6.6 ms per token, and hmp with uneven
// token shares 8.7 -> 6.7, with the limit at 4 MiB). Raised here unless the
// user set them (mpirun --mca ..., or OMPI_MCA_* in the environment).
static void tcp_defaults(void) {
  setenv("OMPI_MCA_btl_tcp_eager_limit", "4194304", 0);
  setenv("OMPI_MCA_btl_tcp_rndv_eager_limit", "4194304", 0);
  setenv("OMPI_MCA_btl_tcp_max_send_size", "4194304", 0);
}

mole_status mole_dist_init(int *argc, char ***argv) {
  if (g_inited) return MOLE_OK;
  tcp_defaults();
  int prov = 0;
  // serialized: the server calls MPI from its engine thread, one thread at a time
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
    return mole_errorf(MOLE_ERR_INTERNAL, "MPI_Init_thread failed");
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_inited = true;
  // the naps of dist_wait_for: woken within a microsecond, not the default 50
  // (threads made later, the server's engine thread, inherit it)
  if (g_size > 1) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  if (g_size > MAX_RANKS) return mole_errorf(MOLE_ERR_ARG, "mpirun -np %d: at most %d processes", g_size, MAX_RANKS);
  return MOLE_OK;
}

void mole_dist_finalize(void) {
  if (g_inited) MPI_Finalize();
  g_inited = false;
}

bool dist_inited(void) { return g_inited; }

int dist_default_threads(void) {
  MPI_Comm node;
  int here = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &here);
    MPI_Comm_free(&node);
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return (int)MOLE_MAX(1, (cores > 0 ? cores : 1) / here);
}
int mole_dist_rank(void) { return g_rank; }
int mole_dist_size(void) { return g_size; }

static void *grow(void *p, size_t *cap, size_t need) {
  if (need <= *cap) return p;
  void *q = mole_realloc(p, need);
  MOLE_ASSERT(q);  // activation buffers of a few MiB; out of memory here is fatal
  *cap = need;
  return q;
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
    d->tmp = grow(d->tmp, &d->tmp_cap, (size_t)MOLE_MAX(cnt[r], 1) * sizeof(float));
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
  d->tmp = grow(d->tmp, &d->tmp_cap, (size_t)MOLE_MAX(maxc, 1) * sizeof(float));
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
    nap_us = MOLE_MIN(2 * nap_us, (long)WAIT_NAP_PASS_US);
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
  d->stage = grow(d->stage, &d->stage_cap, (size_t)MOLE_MAX((int64_t)N * cnt[r], 1) * sizeof(float));
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
  if (d->rank == 0) all = d->tmp = grow(d->tmp, &d->tmp_cap, (size_t)MOLE_MAX(tot, 1) * sizeof(float));
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

static void bcast_i64(dist_ctx *d, int64_t *buf, int64_t n, int max_nap_us) {
  MPI_Request rq;
  MPI_Ibcast(buf, (int)n, MPI_INT64_T, 0, d->comm, &rq);
  dist_wait_for(&rq, 1, max_nap_us);
}

// The batch as int64s: cmd, n_segs, then per sequence: kv id, its n_ctx,
// type, n_past, n, logits (0 none, 1 last, 2 all), then every token.
static mole_status step(void *v, const model_seg *segs, int64_t n_segs) {
  dist_ctx *d = v;
  int64_t len = 2 + 6 * n_segs;
  for (int64_t i = 0; i < n_segs; i++) len += segs[i].n;
  d->msg = grow(d->msg, &d->msg_cap, (size_t)len * sizeof(int64_t));
  int64_t *p = d->msg;
  *p++ = CMD_STEP;
  *p++ = n_segs;
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    *p++ = (int64_t)g->kv->id;
    *p++ = g->kv->n_ctx;
    *p++ = g->kv->type;
    *p++ = g->n_past;
    *p++ = g->n;
    *p++ = g->logits ? (g->all_logits ? 2 : 1) : 0;
  }
  for (int64_t i = 0; i < n_segs; i++)
    for (int64_t t = 0; t < segs[i].n; t++) *p++ = segs[i].tokens[t];
  bcast_i64(d, &len, 1, WAIT_NAP_PASS_US);
  bcast_i64(d, d->msg, len, WAIT_NAP_PASS_US);
  d->counts.step_bytes += (len + 1) * 8 * (d->size - 1);
  return MOLE_OK;
}

static void send_cmd(dist_ctx *d, int64_t cmd, int64_t arg) {
  int64_t len = 2, msg[2] = {cmd, arg};
  bcast_i64(d, &len, 1, WAIT_NAP_PASS_US);
  bcast_i64(d, msg, 2, WAIT_NAP_PASS_US);
}

static void kv_release(void *v, uint64_t id) { send_cmd(v, CMD_KV_FREE, (int64_t)id); }

static void dist_free(dist_ctx *d);

// the model is being freed: the root stops the workers; the context goes with it
static void close_hook(void *v) {
  dist_ctx *d = v;
  if (d->rank == 0) send_cmd(d, CMD_STOP, 0);
  dist_free(d);
}

// ---- shards -----------------------------------------------------------------------------

// Cuts n into the ranks' parts by weight, every cut a multiple of unit (the
// last part takes the remainder): bounds[0..size].
static void cut(int64_t n, int64_t unit, const double *w, int size, int64_t *bounds) {
  const int64_t units = n / unit;
  double tot = 0, acc = 0;
  for (int r = 0; r < size; r++) tot += w[r];
  bounds[0] = 0;
  for (int r = 0; r < size; r++) {
    acc += w[r];
    bounds[r + 1] = r == size - 1 ? n : unit * (int64_t)floor((double)units * acc / tot + 0.5);
    bounds[r + 1] = MOLE_MAX(bounds[r + 1], bounds[r]);
  }
}

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
static void make_shard(const gguf_file *f, const model_hparams *hp, const dist_weights *w, int size, int rank,
                       model_shard *sh, int64_t *voc0) {
  int64_t b[MAX_RANKS + 1];
  // whole KV heads, the output projection's columns on its blocks
  const int64_t blk_o = max_block(f, "attn_output.weight"), cols = hp->n_head / hp->n_head_kv * hp->head_dim_v;
  const int64_t uh = blk_o / gcd64(blk_o, cols);
  cut(hp->n_head_kv, MOLE_MAX(uh, 1), w->heads, size, b);
  sh->kvh0 = b[rank], sh->kvh1 = b[rank + 1];
  const int64_t fb = MOLE_MAX(max_block(f, "ffn_down.weight"), 16);
  cut(hp->n_ff, fb, w->ffn, size, b);
  sh->ff0 = b[rank], sh->ff1 = b[rank + 1];
  const int64_t feb = MOLE_MAX(max_block(f, "ffn_down_exps.weight"), 16);
  cut(hp->n_ff_exp, feb, w->ffn, size, b);
  sh->fe0 = b[rank], sh->fe1 = b[rank + 1];
  const int64_t fsb = MOLE_MAX(max_block(f, "ffn_down_shexp.weight"), 16);
  cut(hp->n_ff_shexp, fsb, w->ffn, size, b);
  sh->fs0 = b[rank], sh->fs1 = b[rank + 1];
  cut(hp->n_vocab, 16, w->vocab, size, voc0);
  sh->voc0 = voc0[rank], sh->voc1 = voc0[rank + 1];
  sh->ex0 = 0, sh->ex1 = hp->n_expert;  // every routed expert (its columns)
  sh->given = true;  // an empty range is a range, not "the whole"
}

mole_status mole_dist_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  *out = NULL;
  if (!g_inited) return mole_errorf(MOLE_ERR_ARG, "--parallel: mole was not started by mpirun (mole_dist_init)");
  mole_model_params p = *params;
  if (p.n_threads < 0 || p.n_threads > 1024)
    return mole_errorf(MOLE_ERR_ARG, "threads: %d is out of range (0 = the cores shared by the processes here)", p.n_threads);
  if (p.n_threads == 0) p.n_threads = dist_default_threads();
  if (p.disagg_attn > 0 || p.disagg_expert > 0) return disagg_model_load(path, &p, out);
  bool nap = false;
  mole_status st = wait_mode(p.n_threads, &nap);
  if (st) return st;
  dist_weights w;
  for (int r = 0; r < g_size; r++) w.heads[r] = w.ffn[r] = w.seq[r] = w.vocab[r] = 1.0;
  st = p.plan ? read_plan(p.plan, g_size, &w, &p.parallel) : MOLE_OK;  // its mode unless --parallel says
  if (st) return st;
  if (p.parallel == MOLE_PARALLEL_NONE) p.parallel = MOLE_PARALLEL_HMP;
  // the shard needs the hparams and the tensor types: a first look at the file
  mole_model *probe;
  model_shard whole = {0};
  mole_model_params pp = p;
  pp.use_mmap = true;
  pp.n_threads = 1;
  pp.offload.expert_budget = 0;
  if ((st = model_load(path, &pp, &whole, &probe))) return st;
  model_shard sh = {0};
  dist_ctx *d = mole_calloc(1, sizeof *d);
  if (!d) {
    model_free(probe);
    return mole_errorf(MOLE_ERR_NOMEM, "out of memory");
  }
  make_shard(probe->gguf, &probe->hp, &w, g_size, g_rank, &sh, d->voc0);
  model_free(probe);
  if ((st = model_load(path, &p, &sh, out))) {
    mole_free(d);
    return st;
  }
  mole_model *m = *out;
  d->comm = MPI_COMM_WORLD;
  d->rank = g_rank;
  d->size = g_size;
  d->mode = p.parallel;
  d->overlap = !p.no_overlap;
  d->nap = nap;
  int any = nap;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, d->comm);
  d->nbc = any;
  d->m = m;
  for (int r = 0; r < g_size; r++) d->seq_w[r] = w.seq[r];
  m->comm = (model_comm){.ctx = d,
                         .rank = g_rank,
                         .size = g_size,
                         .hmp = p.parallel == MOLE_PARALLEL_HMP,
                         .root_vocab = d->voc0[1] - d->voc0[0] == d->voc0[g_size],
                         .token_split = token_split,
                         .allreduce = allreduce,
                         .allgather = allgather,
                         .reduce_scatter = reduce_scatter,
                         .exchange = exchange,
                         .gather_logits = gather_logits,
                         .step = step,
                         .kv_release = kv_release,
                         .close = close_hook};
  return MOLE_OK;
}

// ---- the other ranks ----------------------------------------------------------------------

static model_kv *worker_kv(dist_ctx *d, uint64_t id, int64_t n_ctx, quant_type type, mole_status *st) {
  for (int64_t i = 0; i < d->n_kvs; i++)
    if (d->kvs[i].id == id) return d->kvs[i].kv;
  if (d->n_kvs == d->cap_kvs) {
    const int64_t cap = MOLE_MAX(2 * d->cap_kvs, 8);
    kv_entry *k = mole_realloc(d->kvs, (size_t)cap * sizeof *k);
    if (!k) {
      *st = mole_errorf(MOLE_ERR_NOMEM, "worker: out of memory");
      return NULL;
    }
    d->kvs = k;
    d->cap_kvs = cap;
  }
  const model_hparams *hp = &d->m->hp;
  model_kv *kv;
  if ((*st = kv_new(hp->n_layer, n_ctx, d->m->loc.n_head_kv * hp->head_dim, d->m->loc.n_head_kv * hp->head_dim_v, type,
                    &kv)))
    return NULL;
  d->kvs[d->n_kvs++] = (kv_entry){id, kv};
  return kv;
}

mole_status mole_dist_worker(mole_model *m) {
  if (m->comm.worker && m->comm.rank != 0) return m->comm.worker(m->comm.ctx);
  dist_ctx *d = m->comm.ctx;
  if (!d || d->rank == 0) return mole_errorf(MOLE_ERR_ARG, "mole_dist_worker: not a worker rank of a sharded model");
  model_scratch *s = NULL;
  int64_t s_batch = 0, s_ctx = 0;
  model_seg *segs = NULL;
  size_t segs_cap = 0;
  int32_t *toks = NULL;
  size_t toks_cap = 0;
  mole_status st = MOLE_OK;
  static float sink;  // logits land on the root only: any non-NULL pointer marks a sequence that wants them
  for (;;) {
    int64_t len;
    bcast_i64(d, &len, 1, WAIT_NAP_IDLE_US);  // between steps: may be idle for long
    d->msg = grow(d->msg, &d->msg_cap, (size_t)len * sizeof(int64_t));
    bcast_i64(d, d->msg, len, WAIT_NAP_PASS_US);
    const int64_t *p = d->msg;
    if (p[0] == CMD_STOP) break;
    if (p[0] == CMD_KV_FREE) {
      for (int64_t i = 0; i < d->n_kvs; i++)
        if (d->kvs[i].id == (uint64_t)p[1]) {
          kv_free(d->kvs[i].kv);
          d->kvs[i] = d->kvs[--d->n_kvs];
          break;
        }
      continue;
    }
    const int64_t n_segs = p[1];
    segs = grow(segs, &segs_cap, (size_t)n_segs * sizeof *segs);
    int64_t n = 0, ctx = 0;
    for (int64_t i = 0; i < n_segs; i++) n += p[2 + 6 * i + 4], ctx = MOLE_MAX(ctx, p[2 + 6 * i + 1]);
    toks = grow(toks, &toks_cap, (size_t)n * sizeof *toks);
    const int64_t *tp = p + 2 + 6 * n_segs;
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)tp[i];
    for (int64_t i = 0, t = 0; i < n_segs && !st; i++) {
      const int64_t *q = p + 2 + 6 * i;
      model_kv *kv = worker_kv(d, (uint64_t)q[0], q[1], (quant_type)q[2], &st);
      segs[i] = (model_seg){kv, toks + t, q[4], q[3], q[5] ? &sink : NULL, q[5] == 2};
      t += q[4];
    }
    if (!st && (n > s_batch || ctx > s_ctx)) {  // a scratch for the largest batch seen
      model_scratch_free(s);
      s_batch = MOLE_MAX(n, s_batch);
      s_ctx = MOLE_MAX(ctx, s_ctx);
      st = model_scratch_new(m, s_batch, s_ctx, &s);
    }
    if (!st) st = model_forward_batch(m, s, segs, n_segs);
    if (st) break;  // the root will stall on the collectives: say why and stop
  }
  if (st) fprintf(stderr, "mole: rank %d: %s\n", d->rank, mole_last_error());
  model_scratch_free(s);
  mole_free(segs);
  mole_free(toks);
  for (int64_t i = 0; i < d->n_kvs; i++) kv_free(d->kvs[i].kv);
  d->n_kvs = 0;
  return st;
}

static void dist_free(dist_ctx *d) {
  if (!d) return;
  for (int64_t i = 0; i < d->n_kvs; i++) kv_free(d->kvs[i].kv);
  mole_free(d->kvs);
  mole_free(d->tmp);
  mole_free(d->stage);
  mole_free(d->msg);
  mole_free(d);
}

void mole_dist_get_counts(const mole_model *m, mole_dist_counts *out) {
  const dist_ctx *d = m->comm.ctx;
  memset(out, 0, sizeof *out);
  if (d && !m->comm.forward) *out = d->counts;
}
