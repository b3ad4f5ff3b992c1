// dist internals shared by dist.c (tensor/sequence parallelism) and
// disagg.c (disaggregated attention and experts).
#ifndef MOLE_DIST_INTERNAL_H
#define MOLE_DIST_INTERNAL_H

#include <mpi.h>

#include "base/base.h"

enum { DIST_MAX_RANKS = 64 };
// The naps of dist_wait_for: within a pass, and between passes (idle).
enum { DIST_NAP_PASS_US = 40, DIST_NAP_IDLE_US = 1000 };

bool dist_inited(void);
// Threads per process when none are asked for: the cores of this machine
// shared by the processes on it.
int dist_default_threads(void);
// Waits for the requests, spinning briefly, then napping up to max_nap_us
// between tests (a rank left waiting for minutes must not hold a core).
void dist_wait_for(MPI_Request *rq, int n, int max_nap_us);

// disagg.c: mole_dist_model_load's path when params ask for it.
mole_status disagg_model_load(const char *path, const mole_model_params *params, mole_model **out);

#endif
