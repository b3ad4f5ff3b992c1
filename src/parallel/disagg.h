// disagg: attention and routed experts on separate processes (disagg.c,
// MegaScale-Infer). dist.c's mole_dist_model_load hands it the loads that
// ask for it (mole_model_params disagg_attn/disagg_expert).
#ifndef MOLE_DISAGG_H
#define MOLE_DISAGG_H

#include "base/base.h"

// Every rank of MPI_COMM_WORLD calls it; every rank gets the same status
// (a rank's failure reaches all, as "rank R: ...").
mole_status disagg_model_load(const char *path, const mole_model_params *params, mole_model **out);

#endif
