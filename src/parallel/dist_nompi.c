// dist_nompi: the mole_dist_* / mole_disagg_* entry points of a build without
// Open MPI (cmake -DMOLE_MPI=OFF, as the aarch64 cross build under qemu is:
// Debian's arm64 Open MPI cannot be installed beside the host's). One
// process works as usual; asking for several gets an error that says why.
// CMake compiles this file instead of parallel.c, dist.c, dist_plan.c,
// disagg.c and disagg_plan.c when MOLE_MPI is off (shares.c, without MPI,
// is compiled either way).
#include <string.h>

#include "base/base.h"

#define NO_MPI "this mole was built without Open MPI (cmake -DMOLE_MPI=OFF): "

mole_status mole_dist_init(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "mpirun, mole plan and --parallel/--disagg are unavailable");
}

void mole_dist_finalize(void) {}
int mole_dist_rank(void) { return 0; }
int mole_dist_size(void) { return 1; }

mole_status mole_dist_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  (void)params;
  *out = NULL;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "cannot load %s over several processes", path);
}

mole_status mole_dist_worker(mole_model *m) {
  (void)m;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "no worker ranks");
}

mole_status mole_dist_plan(const char *path, const mole_model_params *params, const char *out) {
  (void)params;
  (void)out;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "mole plan needs it (model %s)", path);
}

void mole_dist_get_counts(const mole_model *m, mole_dist_counts *out) {
  (void)m;
  memset(out, 0, sizeof *out);
}

mole_status mole_disagg_stats(mole_model *m, mole_disagg_rank *ranks, int max_ranks, int *n_ranks) {
  (void)m;
  (void)ranks;
  (void)max_ranks;
  *n_ranks = 0;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "no disaggregated ranks");
}

mole_status mole_disagg_reset_stats(mole_model *m) {
  (void)m;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "no disaggregated ranks");
}

mole_status mole_disagg_plan(const char *path, const mole_model_params *params, int64_t max_seqs, int64_t ctx,
                             double max_tpot_ms, const char *out) {
  (void)params;
  (void)max_seqs;
  (void)ctx;
  (void)max_tpot_ms;
  (void)out;
  return mole_errorf(MOLE_ERR_ARG, NO_MPI "mole plan --disagg needs it (model %s)", path);
}
