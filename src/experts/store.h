// experts/store: where each expert's matrices lie in the model file, in each
// precision, and how to read one expert into a cache slot with O_DIRECT.
//
// Two layouts (docs/FORMAT.md):
//  - packed (`mole pack`): one 4 KiB-aligned region per (layer, expert,
//    precision) holding gate, up and down together: one read per expert;
//  - plain GGUF: the three slices of the expert in the ffn_{gate,up,down}_exps
//    tensors, high precision only; each read is a 4 KiB-aligned superset of
//    the slice and the view points inside it.
#ifndef MOLE_EXPERTS_STORE_H
#define MOLE_EXPERTS_STORE_H

#include "experts/experts.h"

#define EXPERTS_PACK_VERSION 1
// metadata keys of a packed file
#define EXPERTS_PACK_KEY_VERSION "mole.pack.version"
// the dictionary of compressed (tq1_dict) experts: i8 tensor, 3 bytes an entry (quant_tq.h)
#define EXPERTS_TQ_BOOK "mole.tq.dictionary"

enum { EXPERTS_PREC_N = 2 };  // high, low

// One read: file bytes [file_off, file_off + len) into slot bytes
// [buf_off, buf_off + len); all multiples of 4 KiB.
typedef struct experts_extent {
  uint64_t file_off, len, buf_off;
} experts_extent;

// One precision of one layer: the types and bytes of gate, up and down, and
// (packed) where they lie inside an expert's region.
typedef struct experts_layout {
  quant_type type[3];
  uint64_t bytes[3];    // bytes read for the matrix: from its first row to the end of its last
  uint64_t offsets[3];  // packed: inside the region
  uint64_t region;      // packed: region bytes (a multiple of 4 KiB)
  uint64_t stride[3];   // bytes from one row to the next (a shard's column slice keeps the file's rows)
} experts_layout;

typedef struct experts_store {
  const gguf_file *f;
  bool packed, has_low;
  int64_t n_layer, n_expert;
  int64_t ne0[3], ne1[3];                  // shape of gate, up, down (this process's share)
  experts_layout *layout[EXPERTS_PREC_N];  // [n_layer]
  uint64_t *mat_off[EXPERTS_PREC_N];       // [n_layer][n_expert][3] file offsets of the matrices
  size_t slot_bytes[EXPERTS_PREC_N];       // a cache slot for one expert (aligned extents)
  uint64_t total_bytes[EXPERTS_PREC_N];    // every expert's matrices
  uint64_t file_bytes;                     // bytes of the file holding experts (regions or stacks)
  uint64_t region_lo, region_hi;           // file range holding every expert (madvise)
  struct tq_book *book;                    // the dictionary of QT_TQ1 matrices (mole compress), else NULL
} experts_store;

// Whether f is a packed expert store (has mole.pack.version).
bool experts_store_is_packed(const gguf_file *f);
// The model's dimensions a packed file must match.
typedef struct experts_dims {
  int64_t n_layer, n_expert, n_embd, n_ff;  // n_ff: an expert's FFN width
} experts_dims;

// For the model loader on a packed file: shape and high-precision type of a
// layer's expert stacks, from the mole.pack.* metadata, checked against the
// model's dimensions and the region tensors of that layer. data is NULL: the
// experts are reached only through the provider.
mole_status experts_store_describe(const gguf_file *f, const char *path, const experts_dims *d, int64_t layer,
                                   quant_matrix *gate, quant_matrix *up, quant_matrix *down);

// Page-cache hints for the mapping of f. Before the loader touches it (and
// only when f has expert tensors): MADV_RANDOM, so that faulting a norm vector does not read megabytes of
// experts around it into the page cache. Once the provider has decided:
// resident, back to normal read-around; tiered, MADV_WILLNEED on each
// non-expert tensor (the experts are only read with O_DIRECT).
void experts_store_advise_load(const gguf_file *f);
void experts_store_advise_mode(const gguf_file *f, bool tiered);

mole_status experts_store_open(experts_store *s, const experts_config *cfg);
void experts_store_free(experts_store *s);
// The reads that bring (layer, e) in precision p into a slot (1..3 extents)
// and where each matrix lands in the slot (mat_buf[3]). Returns the count.
int experts_store_extents(const experts_store *s, int p, int64_t layer, int64_t e, experts_extent ext[3],
                          size_t mat_buf[3]);
// The three matrices of a layer's expert in precision p as 2-D tensors at
// base + off[j] (the mapping: gguf_base; a slot: its buffer with mat_buf;
// the weights image: r16[j] says which are QL_R16 there; NULL: none).
void experts_store_views(const experts_store *s, int p, int64_t layer, const void *base, const uint64_t off[3],
                         const uint8_t *r16, quant_matrix out[3]);
// Compressed (blob) matrices of (layer, e) in precision p, as views: checks
// each blob (quant_tq.h) so that no kernel runs on a malformed one; MOLE_OK
// at once for other types. Errors name the file, layer, expert and matrix.
mole_status experts_store_check(const experts_store *s, int p, int64_t layer, int64_t e, const quant_matrix v[3]);
// Reads the layout of one layer in precision p of a packed file.
// MOLE_ERR_NOT_FOUND without a message when the file has
// no such precision.
mole_status experts_store_read_layout(const gguf_file *f, const char *path, int p, int64_t n_layer, int64_t layer,
                                      int64_t n_embd, int64_t n_ff, experts_layout *out);

#endif
