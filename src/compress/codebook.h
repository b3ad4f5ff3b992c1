// compress/codebook: the 2^16-entry dictionary of ternary pair runs (QMoE):
// counts how often each run of pairs occurs in the ternary rows it is shown,
// and keeps the most frequent runs, prefix-closed (every run's prefix is an
// entry), as the compact dictionary of quant_tq.h.
#ifndef MOLE_COMPRESS_CODEBOOK_H
#define MOLE_COMPRESS_CODEBOOK_H

#include "quant/quant_tq.h"

typedef struct cb_builder cb_builder;

// max_nodes: the counting trie's size cap (memory 48 bytes a node); runs
// that would need more nodes are counted only as far as the trie reaches. The
// builder also keeps the rows it is shown (k/2 bytes a row) to measure and
// refine its selection in cb_builder_finish.
mole_status cb_builder_new(int64_t max_nodes, cb_builder **out);
void cb_builder_free(cb_builder *b);
// Counts the runs of one ternary row t [k] (k even, t in -1..1; runs never
// cross its end). Out of memory for keeping the row: finish reports it.
void cb_builder_add_row(cb_builder *b, const int8_t *t, int64_t k);
// The dictionary of at most n_max entries (<= TQ_BOOK_MAX) in the compact
// form of quant_tq.h: *compact (3 * *n bytes from mole_malloc: mole_free it).
// Deterministic: the same rows in the same order give the same dictionary.
// The selection is refined by re-counting the runs where the greedy parse
// starts its codes; the dictionary with the fewest codes on the rows kept wins.
// max_pairs: the longest run (1..TQ_PAIRS_MAX), or 0 for auto: runs of at
// most TQ_NARROW_PAIRS pairs (30 weights: decoded about 1.8x faster, quant_tq.h)
// unless that spends over 3% more codes than runs of TQ_PAIRS_MAX (compared
// on the first selections). info (may be NULL): what was chosen. Once only.
typedef struct cb_finish_info {
  int pairs;           // the longest run allowed
  double wide_saving;  // auto: fraction of the codes that runs of TQ_PAIRS_MAX save on the first selection
                       // (negative: they spend more); else -1
} cb_finish_info;
mole_status cb_builder_finish(cb_builder *b, int64_t n_max, int max_pairs, uint8_t **compact, int64_t *n,
                              cb_finish_info *info);

// Codes that greedy longest-match coding (as tq1_encode) spends on t
// [n_rows][k] (each row on its own) with the compact dictionary of n entries
// (checked as tq_book_new does): 16 * *codes bits in all.
mole_status cb_count_codes(const uint8_t *compact, int64_t n, const int8_t *t, int64_t n_rows, int64_t k,
                           int64_t *codes);

// Symbol statistics of ternary data, for the report next to the bits achieved.
typedef struct tq_symstats {
  int64_t weights, zeros;   // weights seen, of them 0
  int64_t plus, minus;
  int64_t pairs[TQ_SYMBOLS];
} tq_symstats;
void tq_symstats_add(tq_symstats *s, const int8_t *t, int64_t n);
// Entropy bounds in bits per weight: order 0 over single weights, and over pairs / 2.
double tq_symstats_entropy(const tq_symstats *s);
double tq_symstats_pair_entropy(const tq_symstats *s);

#endif
