// parallel: what the MPI modes share (parallel.c): this process's place in
// the mpirun, waits that nap, buffers that grow with a status, and the step
// where every rank learns whether all of them succeeded. dist.c (tensor and
// sequence parallelism) and disagg.c (attention and experts apart) sit on
// it; dist.c hands a disaggregated load to disagg.c (disagg.h), never the
// other way. The public face is the mole_dist_* part of include/mole.h.
#ifndef MOLE_PARALLEL_H
#define MOLE_PARALLEL_H

#include <mpi.h>

#include "base/base.h"
#include "model/model.h"

enum { PARALLEL_MAX_RANKS = 64 };
// The naps of parallel_wait_for: within a pass, and between passes (idle).
enum { PARALLEL_NAP_PASS_US = 40, PARALLEL_NAP_IDLE_US = 1000 };

bool parallel_inited(void);
// Threads per process when none are asked for: the cores of this machine
// shared by the processes on it.
int parallel_default_threads(void);

// Waits for the requests, spinning briefly, then napping up to max_nap_us
// between tests (a rank left waiting for minutes must not hold a core).
void parallel_wait_for(MPI_Request *rq, int n, int max_nap_us);
// The same, napping from the start (a rank under a CPU quota).
void parallel_wait_naps(MPI_Request *rq, int n, int max_nap_us);

// p grown to at least need bytes, contents kept, *cap updated: the pointer
// to keep. Out of memory: p unchanged (still the caller's), *st set to
// MOLE_ERR_NOMEM with a message naming what; a call with *st already set
// does nothing, so a run of them needs one check at its end.
void *parallel_grow(void *p, size_t *cap, size_t need, const char *what, mole_status *st);

// Every rank's st in one collective step (non-blocking, waits that nap: it
// matches on every rank whatever kind of collective the rank used before).
// MOLE_OK when all succeeded; otherwise, on every rank, the lowest failing
// rank's status and message, as "rank R: message". Every rank of comm calls
// it at the same point.
mole_status parallel_agree(MPI_Comm comm, mole_status st);

// The root's messages to the other ranks (a batch or a command, as int64s),
// each a broadcast of its length, then of it. A message longer than any
// before first gets room on every rank, and the ranks agree on that (the
// only allocation on the way); shorter ones go straight through. After an
// error stopped the other ranks, the root keeps it: every later send returns
// it, and nothing more is sent.
enum { PARALLEL_MSG_MIN = 64 };  // int64s every rank has room for from the start
typedef struct parallel_chan {
  MPI_Comm comm;
  int64_t *msg;  // [cap / 8]
  size_t cap;
  int64_t room;  // int64s every rank has room for
  bool stopped;  // the root: the other ranks stopped with this error
  mole_status why_st;
  char why[512];
} parallel_chan;
mole_status parallel_chan_init(parallel_chan *c, MPI_Comm comm);
void parallel_chan_free(parallel_chan *c);
// The root: room for a message of len int64s in c->msg (here only).
mole_status parallel_chan_reserve(parallel_chan *c, int64_t len);
// The root: c->msg[0, len) to every rank (MOLE_OK or the agreed error; the
// error that stopped the ranks after one).
mole_status parallel_chan_send(parallel_chan *c, int64_t len);
// The other ranks: the next message into c->msg (*len int64s), waiting for
// it napping (a worker may wait for long between passes).
mole_status parallel_chan_recv(parallel_chan *c, int64_t *len);
// The root: MOLE_OK, or the error that stopped the other ranks.
mole_status parallel_chan_stopped(const parallel_chan *c);
// The root: the ranks stopped with st (an agreed error): kept and returned.
mole_status parallel_chan_stop(parallel_chan *c, mole_status st);

// A rank that fails inside a pass, where the others wait for its part and
// no message can reach them: prints "mole: rank R: what: the last error"
// and ends every process of the job (MPI_Abort).
_Noreturn void parallel_abort(MPI_Comm comm, const char *what);

// A batch as the root sends it (int64s): the command, the number of
// sequences, then PARALLEL_SEG_FIELDS fields per sequence, then every
// sequence's tokens in turn. logits: 0 none, 1 the last token's, 2 all;
// owner: the rank that runs the sequence (disagg.c's attention ranks; 0 in
// dist.c, where every rank runs every sequence).
enum {
  PARALLEL_SEG_ID, PARALLEL_SEG_CTX, PARALLEL_SEG_TYPE, PARALLEL_SEG_PAST, PARALLEL_SEG_N, PARALLEL_SEG_LOGITS,
  PARALLEL_SEG_OWNER, PARALLEL_SEG_FIELDS
};
int64_t parallel_batch_len(const model_seg *segs, int64_t n_segs);
// The batch into msg (parallel_batch_len int64s); owner NULL: all 0.
void parallel_batch_write(int64_t *msg, int64_t cmd, const model_seg *segs, int64_t n_segs, const int *owner);
// Sequence i's fields of a batch; its first token.
static inline const int64_t *parallel_batch_seg(const int64_t *msg, int64_t i) { return msg + 2 + PARALLEL_SEG_FIELDS * i; }
static inline const int64_t *parallel_batch_tokens(const int64_t *msg) { return msg + 2 + PARALLEL_SEG_FIELDS * msg[1]; }

// MOLE_TEST_FAIL_RANK=R (the tests set it): true on rank R, whose first
// forward pass then fails as if out of memory, so that the tests see one
// rank's error reach every rank.
bool parallel_test_fault(void);

#endif
