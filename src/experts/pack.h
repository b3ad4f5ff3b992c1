// experts/pack: rewrites a GGUF MoE model as a packed expert store
// (`mole pack`, docs/FORMAT.md): every non-expert tensor and metadata key as
// it was, and each expert of each layer as one 4 KiB-aligned region per
// precision (gate, up, down together) re-quantized from the source tensors.
#ifndef MOLE_EXPERTS_PACK_H
#define MOLE_EXPERTS_PACK_H

#include <stdio.h>

#include "base/base.h"

typedef struct experts_pack_params {
  int high;       // quant type of the high-precision copies; -1 = each matrix's source type (exact copy)
  int low;        // quant type of the low-precision copies; -1 = none
  int n_threads;  // 0 = all cores
} experts_pack_params;

// Writes `out` from `in`. Progress lines go to log (may be NULL). Errors name
// the file and the tensor or key, or the type that does not fit a shape.
mole_status experts_pack(const char *in, const char *out, const experts_pack_params *p, FILE *log);

#endif
