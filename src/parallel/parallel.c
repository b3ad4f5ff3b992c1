// parallel: the process's place in the mpirun and what dist.c and disagg.c
// both use (parallel.h).
#include "parallel/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "kv/kv.h"

static bool g_inited;
static int g_rank, g_size = 1;

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
  // the naps of parallel_wait_for: woken within a microsecond, not the
  // default 50 (threads made later, the server's engine thread, inherit it)
  if (g_size > 1) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  if (g_size > PARALLEL_MAX_RANKS)
    return mole_errorf(MOLE_ERR_ARG, "mpirun -np %d: at most %d processes", g_size, PARALLEL_MAX_RANKS);
  return MOLE_OK;
}

void mole_dist_finalize(void) {
  if (g_inited) MPI_Finalize();
  g_inited = false;
}

bool parallel_inited(void) { return g_inited; }
int mole_dist_rank(void) { return g_rank; }
int mole_dist_size(void) { return g_size; }

int parallel_default_threads(void) {
  MPI_Comm node;
  int here = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &here);
    MPI_Comm_free(&node);
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return (int)MOLE_MAX(1, (cores > 0 ? cores : 1) / here);
}

// A worker waiting for the root's next step (a server between requests can
// leave it there for minutes) must not spin at full speed as MPI's own waits
// do: it waits on a non-blocking collective with MPI_Testall, spinning for
// the first WAIT_SPIN_US, then sleeping between tests, 10 us at first and
// twice as long each time up to max_nap_us. Within a forward pass the ranks
// keep MPI's spinning waits (dist.c says when they nap instead).
enum { WAIT_SPIN_US = 100 };

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

void parallel_wait_for(MPI_Request *rq, int n, int max_nap_us) { wait_spin_nap(rq, n, WAIT_SPIN_US, max_nap_us); }
void parallel_wait_naps(MPI_Request *rq, int n, int max_nap_us) { wait_spin_nap(rq, n, 0, max_nap_us); }

void *parallel_grow(void *p, size_t *cap, size_t need, const char *what, mole_status *st) {
  if (*st || need <= *cap) return p;
  void *q = mole_realloc(p, need);
  if (!q) {
    *st = mole_errorf(MOLE_ERR_NOMEM, "out of memory for %s (%zu bytes)", what, need);
    return p;
  }
  *cap = need;
  return q;
}

mole_status parallel_agree(MPI_Comm comm, mole_status st) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // the lowest failing rank (size: none)
  int me = st ? rank : size, first = size;
  MPI_Request rq;
  MPI_Iallreduce(&me, &first, 1, MPI_INT, MPI_MIN, comm, &rq);
  parallel_wait_for(&rq, 1, PARALLEL_NAP_PASS_US);
  if (first == size) return MOLE_OK;
  // its status and message to every rank
  struct {
    int32_t status;
    char msg[512];
  } e = {0};
  if (rank == first) {
    e.status = (int32_t)st;
    snprintf(e.msg, sizeof e.msg, "%s", mole_last_error());
  }
  MPI_Ibcast(&e, (int)sizeof e, MPI_BYTE, first, comm, &rq);
  parallel_wait_for(&rq, 1, PARALLEL_NAP_PASS_US);
  e.msg[sizeof e.msg - 1] = 0;
  return mole_errorf((mole_status)e.status, "rank %d: %s", first, e.msg);
}

mole_status parallel_chan_init(parallel_chan *c, MPI_Comm comm) {
  memset(c, 0, sizeof *c);
  c->comm = comm;
  mole_status st = MOLE_OK;
  c->msg = parallel_grow(NULL, &c->cap, PARALLEL_MSG_MIN * sizeof(int64_t), "the batch message", &st);
  c->room = PARALLEL_MSG_MIN;
  return st;
}

void parallel_chan_free(parallel_chan *c) {
  mole_free(c->msg);
  c->msg = NULL;
  c->cap = 0;
}

mole_status parallel_chan_reserve(parallel_chan *c, int64_t len) {
  mole_status st = MOLE_OK;
  c->msg = parallel_grow(c->msg, &c->cap, (size_t)len * sizeof(int64_t), "the batch message", &st);
  return st;
}

static void bcast_i64(parallel_chan *c, int64_t *buf, int64_t n, int max_nap_us) {
  MPI_Request rq;
  MPI_Ibcast(buf, (int)n, MPI_INT64_T, 0, c->comm, &rq);
  parallel_wait_for(&rq, 1, max_nap_us);
}

// Every rank, once the length is known: room for it, agreed when it grew.
static mole_status chan_room(parallel_chan *c, int64_t len) {
  if (len <= c->room) return MOLE_OK;
  mole_status st = parallel_chan_reserve(c, len);
  if ((st = parallel_agree(c->comm, st))) return st;
  c->room = len;
  return MOLE_OK;
}

mole_status parallel_chan_stopped(const parallel_chan *c) {
  if (!c->stopped) return MOLE_OK;
  return mole_errorf(c->why_st, "the other processes stopped after an error: %s", c->why);
}

mole_status parallel_chan_send(parallel_chan *c, int64_t len) {
  mole_status st = parallel_chan_stopped(c);
  if (st) return st;
  MOLE_ASSERT((size_t)len * sizeof(int64_t) <= c->cap);  // parallel_chan_reserve
  bcast_i64(c, &len, 1, PARALLEL_NAP_PASS_US);
  if ((st = chan_room(c, len))) return parallel_chan_stop(c, st);
  bcast_i64(c, c->msg, len, PARALLEL_NAP_PASS_US);
  return MOLE_OK;
}

mole_status parallel_chan_recv(parallel_chan *c, int64_t *len) {
  bcast_i64(c, len, 1, PARALLEL_NAP_IDLE_US);  // between passes: may be idle for long
  mole_status st = chan_room(c, *len);
  if (st) return st;
  bcast_i64(c, c->msg, *len, PARALLEL_NAP_PASS_US);
  return MOLE_OK;
}

mole_status parallel_chan_stop(parallel_chan *c, mole_status st) {
  c->stopped = true;
  c->why_st = st;
  snprintf(c->why, sizeof c->why, "%s", mole_last_error());
  return st;
}

_Noreturn void parallel_abort(MPI_Comm comm, const char *what) {
  fprintf(stderr, "mole: rank %d: %s: %s\n", g_rank, what, mole_last_error());
  fflush(stderr);
  MPI_Abort(comm, 1);
  abort();  // (MPI_Abort ends the process; it is not declared to)
}

int64_t parallel_batch_len(const model_seg *segs, int64_t n_segs) {
  int64_t len = 2 + PARALLEL_SEG_FIELDS * n_segs;
  for (int64_t i = 0; i < n_segs; i++) len += segs[i].n;
  return len;
}

void parallel_batch_write(int64_t *msg, int64_t cmd, const model_seg *segs, int64_t n_segs, const int *owner) {
  int64_t *p = msg;
  *p++ = cmd;
  *p++ = n_segs;
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    p[PARALLEL_SEG_ID] = (int64_t)g->kv->id;
    p[PARALLEL_SEG_CTX] = g->kv->n_ctx;
    p[PARALLEL_SEG_TYPE] = g->kv->type;
    p[PARALLEL_SEG_PAST] = g->n_past;
    p[PARALLEL_SEG_N] = g->n;
    p[PARALLEL_SEG_LOGITS] = g->logits ? (g->all_logits ? 2 : 1) : 0;
    p[PARALLEL_SEG_OWNER] = owner ? owner[i] : 0;
    p += PARALLEL_SEG_FIELDS;
  }
  for (int64_t i = 0; i < n_segs; i++)
    for (int64_t t = 0; t < segs[i].n; t++) *p++ = segs[i].tokens[t];
}

bool parallel_test_fault(void) {
  const char *e = getenv("MOLE_TEST_FAIL_RANK");
  return e && *e && atoi(e) == g_rank;
}
