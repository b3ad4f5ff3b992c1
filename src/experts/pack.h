// experts/pack: rewrites a GGUF MoE model as a packed expert store
// (`mole pack`, docs/FORMAT.md): every non-expert tensor and metadata key as
// it was, and each expert of each layer as one 4 KiB-aligned region per
// precision (gate, up, down together) re-quantized from the source tensors.
#ifndef MOLE_EXPERTS_PACK_H
#define MOLE_EXPERTS_PACK_H

#include <stdio.h>

#include "base/base.h"

#include "experts/store.h"

// A precision whose regions come ready-made (mole compress, or a compressed
// file given as --low): its layout per layer, and a callback that writes the
// region of (layer, e) into region (zeroed, layout[layer].region bytes).
typedef struct experts_pack_tier {
  const experts_layout *layout;  // [n_layer]
  mole_status (*fill)(void *ctx, int64_t layer, int64_t e, void *region);
  void *ctx;
} experts_pack_tier;

typedef struct experts_pack_params {
  int high;       // quant type of the high-precision copies; -1 = each matrix's source type (exact copy)
  int low;        // quant type of the low-precision copies; -1 = none
  int n_threads;  // 0 = all cores
  const experts_pack_tier *tier[2];  // given: that precision's regions (high, low) instead of high/low types
  const uint8_t *book;               // the dictionary of tq1_dict tiers (3 * book_n bytes), else NULL
  int64_t book_n;
  bool quiet;                        // no progress lines
} experts_pack_params;

// A compressed file (`mole compress`'s output) as a tier: its high regions.
// Checks that its shapes match `in`'s; the tier and dictionary stay valid
// until experts_pack_tier_close.
typedef struct experts_pack_src experts_pack_src;
mole_status experts_pack_tier_open(const char *path, const char *in, experts_pack_src **out);
const experts_pack_tier *experts_pack_src_tier(const experts_pack_src *s);
const uint8_t *experts_pack_src_book(const experts_pack_src *s, int64_t *n);
void experts_pack_tier_close(experts_pack_src *s);

// Writes `out` from `in`. Progress lines go to log (may be NULL). Errors name
// the file and the tensor or key, or the type that does not fit a shape.
mole_status experts_pack(const char *in, const char *out, const experts_pack_params *p, FILE *log);

#endif
