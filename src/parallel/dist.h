// dist: one model over several processes (Open MPI). The public face is the
// mole_dist_* part of include/mole.h; dist.c has the design.
#ifndef MOLE_DIST_H
#define MOLE_DIST_H

#include "base/base.h"

typedef struct dist_ctx dist_ctx;
typedef mole_dist_counts dist_counts;

#endif
