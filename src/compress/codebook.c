// compress/codebook: the dictionary of ternary pair runs (QMoE's code).
//
// Counting: every row added is kept as its pair symbols (k/2 bytes) and, for
// every pair position, the runs of 1..TQ_PAIRS_MAX pairs starting there are
// counted in a trie (node cap max_nodes). A node is created only once its
// parent has been seen CB_GATE times, so the one-off long runs that make up
// most of the distinct runs do not fill the trie (a child misses at most
// CB_GATE - 1 of its occurrences). When the trie is full, runs are counted as
// far as the existing nodes reach. A child is only ever counted on the way
// through its parent, so count(child) <= count(parent).
//
// Selection: the 9 one-pair runs, then the most frequent runs no longer than
// the cap finish was given (a shorter cap only drops the trie's deeper
// nodes: a run's count does not depend on the cap), ties broken by
// the shorter run, then by the node's creation order (deterministic: it
// depends only on the rows and their order). With count(child) <=
// count(parent) that order puts every parent before its children, so the top
// of it is prefix-closed and is written in that order (parent < child).
//
// Refinement: counts over all positions measure how often a run occurs, but
// what saves codes is how often it occurs where the greedy longest-match
// parse starts a code (the codes a set of runs spends on a row: the pairs it
// covers divided by the mean match length, and the match length at a start is
// the number of entries that match there). So the rows are parsed with the
// dictionary, the runs are counted again at the code starts only, the top
// runs reselected (topped up to n_max with the first selection's runs, which
// may occur at code starts of rows not seen), and this repeated CB_REFINE
// times; the dictionary with the fewest codes on the rows wins.
#include "compress/codebook.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CB_GATE = 2, CB_REFINE = 3, CB_LANES = 16 };
// auto run length: narrow runs unless their first selection spends over 3% more codes
static const double CB_NARROW_SLACK = 0.03;

typedef struct cb_node {
  int64_t count;
  int32_t child[TQ_SYMBOLS];  // -1: none
  uint8_t sym, depth;         // the last symbol of the run, its length in pairs
} cb_node;
_Static_assert(sizeof(cb_node) == 48, "cb node");

struct cb_builder {
  cb_node *node;  // [cap] node 0 the root, 1..9 the one-pair runs
  int64_t n_nodes, cap, max_nodes;
  uint8_t *sym;        // [n_sym] the pair symbols of the rows added
  int64_t n_sym, sym_cap;
  int64_t *row_end;    // [n_rows] end of each row in sym
  int64_t n_rows, rows_cap;
  int64_t max_row;     // pairs in the longest row
  bool oom;            // an add_row could not keep its row
  int pairs;           // the longest run counted: TQ_PAIRS_MAX while adding rows, then finish's choice
};

static inline int pair_sym(const int8_t *t) { return 3 * (t[0] + 1) + (t[1] + 1); }
static inline bool ternary(int8_t t) { return (uint8_t)(t + 1) <= 2; }

// ---- trie ----------------------------------------------------------------------

static void trie_reset(cb_builder *b) {
  b->n_nodes = 1 + TQ_SYMBOLS;
  for (int64_t i = 0; i < b->n_nodes; i++) {
    cb_node *n = &b->node[i];
    n->count = 0;
    memset(n->child, 0xff, sizeof n->child);
    n->sym = (uint8_t)(i > 0 ? i - 1 : 0);
    n->depth = (uint8_t)(i > 0);
    if (i > 0) b->node[0].child[i - 1] = (int32_t)i;
  }
}

// A new child of node p for symbol s, or -1 when the trie is full.
static int32_t trie_add(cb_builder *b, int32_t p, int s) {
  if (b->n_nodes >= b->max_nodes) return -1;
  if (b->n_nodes == b->cap) {
    int64_t nc = MOLE_MIN(b->cap * 2, b->max_nodes);
    cb_node *nn = mole_realloc(b->node, (size_t)nc * sizeof *nn);
    if (!nn) {
      b->max_nodes = b->n_nodes;  // count with what there is
      return -1;
    }
    b->node = nn;
    b->cap = nc;
  }
  const int32_t c = (int32_t)b->n_nodes++;
  cb_node *n = &b->node[c];
  n->count = 0;
  memset(n->child, 0xff, sizeof n->child);
  n->sym = (uint8_t)s;
  n->depth = (uint8_t)(b->node[p].depth + 1);
  b->node[p].child[s] = c;
  return c;
}

// Counts the runs starting at the pair positions starts [n_starts] (NULL: all
// np positions) of the row s [np]. The walks are pointer chases through a
// trie much larger than the caches, so CB_LANES of them advance in turns,
// each prefetching its next node while the others step.
static void trie_count_runs(cb_builder *b, const uint8_t *s, int64_t np, const int64_t *starts, int64_t n_starts) {
  int64_t pos[CB_LANES], end[CB_LANES];
  int32_t node[CB_LANES];
  int64_t next = 0;
  int active = 0;
  cb_node *nodes = b->node;
  for (int l = 0; l < CB_LANES; l++) {
    node[l] = -1;
    if (next < n_starts) {
      pos[l] = starts ? starts[next] : next;
      next++;
      end[l] = pos[l] + MOLE_MIN(np - pos[l], (int64_t)b->pairs);
      node[l] = (int32_t)(1 + s[pos[l]]);
      active++;
    }
  }
  while (active > 0)
    for (int l = 0; l < CB_LANES; l++) {
      int32_t c = node[l];
      if (c < 0) continue;
      nodes[c].count++;
      int32_t nx = -1;
      if (++pos[l] < end[l]) {
        const int sy = s[pos[l]];
        nx = nodes[c].child[sy];
        if (nx < 0 && nodes[c].count >= CB_GATE) {
          nx = trie_add(b, c, sy);
          nodes = b->node;
        }
      }
      if (nx < 0 && next < n_starts) {  // this walk ends: the lane takes the next start
        pos[l] = starts ? starts[next] : next;
        next++;
        end[l] = pos[l] + MOLE_MIN(np - pos[l], (int64_t)b->pairs);
        nx = (int32_t)(1 + s[pos[l]]);
      }
      if (nx < 0) active--;
      node[l] = nx;
      if (nx >= 0) __builtin_prefetch(&nodes[nx]);
    }
}

// ---- builder -------------------------------------------------------------------

mole_status cb_builder_new(int64_t max_nodes, cb_builder **out) {
  *out = NULL;
  if (max_nodes < 1 + TQ_SYMBOLS || max_nodes > INT32_MAX)
    return mole_errorf(MOLE_ERR_ARG, "codebook: max_nodes %lld (must be %d..%d)", (long long)max_nodes,
                       1 + TQ_SYMBOLS, INT32_MAX);
  cb_builder *b = mole_calloc(1, sizeof *b);
  if (!b) return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory");
  b->max_nodes = max_nodes;
  b->pairs = TQ_PAIRS_MAX;
  b->cap = MOLE_MIN(max_nodes, (int64_t)1 << 16);
  b->node = mole_malloc((size_t)b->cap * sizeof *b->node);
  if (!b->node) {
    mole_free(b);
    return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for the counting trie");
  }
  trie_reset(b);
  *out = b;
  return MOLE_OK;
}

void cb_builder_free(cb_builder *b) {
  if (!b) return;
  mole_free(b->node);
  mole_free(b->sym);
  mole_free(b->row_end);
  mole_free(b);
}

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return true;
  int64_t nc = MOLE_MAX(need, MOLE_MAX(*cap * 2, (int64_t)4096));
  void *np = mole_realloc(*p, (size_t)nc * elem);
  if (!np) return false;
  *p = np;
  *cap = nc;
  return true;
}

void cb_builder_add_row(cb_builder *b, const int8_t *t, int64_t k) {
  MOLE_ASSERT(b && t && k >= 0 && k % 2 == 0);
  const int64_t np = k / 2;
  if (np == 0 || b->oom) return;
  if (!grow((void **)&b->sym, &b->sym_cap, b->n_sym + np, 1) ||
      !grow((void **)&b->row_end, &b->rows_cap, b->n_rows + 1, sizeof(int64_t))) {
    b->oom = true;
    return;
  }
  uint8_t *s = b->sym + b->n_sym;
  for (int64_t i = 0; i < np; i++) {
    MOLE_ASSERT(ternary(t[2 * i]) && ternary(t[2 * i + 1]));
    s[i] = (uint8_t)pair_sym(t + 2 * i);
  }
  b->n_sym += np;
  b->row_end[b->n_rows++] = b->n_sym;
  b->max_row = MOLE_MAX(b->max_row, np);
  trie_count_runs(b, s, np, NULL, np);
}

// ---- selection -----------------------------------------------------------------

// Selection order: count desc, depth asc, node index asc.
typedef struct cb_cand {
  int64_t count;
  int32_t idx;
  uint8_t depth;
} cb_cand;

static int cand_cmp(const void *pa, const void *pb) {
  const cb_cand *a = pa, *b = pb;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  if (a->depth != b->depth) return a->depth < b->depth ? -1 : 1;
  return (a->idx > b->idx) - (a->idx < b->idx);
}

// The need-th largest of v [n] (1-based; need <= n); v reordered.
static int64_t kth_largest(int64_t *v, int64_t n, int64_t need) {
  int64_t lo = 0, hi = n - 1, kk = need - 1;
  while (lo < hi) {
    const int64_t a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi];
    const int64_t piv = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] > piv) i++;
      while (v[j] < piv) j--;
      if (i <= j) {
        const int64_t t = v[i];
        v[i++] = v[j];
        v[j--] = t;
      }
    }
    if (kk <= j)
      hi = j;
    else if (kk >= i)
      lo = i;
    else
      return v[kk];
  }
  return v[kk];
}

// The top n_max runs of the trie (of at most b->pairs pairs) as a compact
// dictionary (3 * *n bytes).
static mole_status trie_select(const cb_builder *b, int64_t n_max, uint8_t **compact, int64_t *n) {
  *compact = NULL;
  *n = 0;
  const int64_t nn = b->n_nodes, first = 1 + TQ_SYMBOLS;
  const int64_t need = MOLE_MIN(n_max - TQ_SYMBOLS, nn - first);
  int64_t *cnt = mole_malloc((size_t)MOLE_MAX(nn - first, 1) * sizeof *cnt);
  int32_t *parent = mole_malloc((size_t)nn * sizeof *parent);
  int32_t *map = mole_malloc((size_t)nn * sizeof *map);
  cb_cand *cand = NULL;
  uint8_t *out = NULL;
  mole_status st = MOLE_OK;
  if (!cnt || !parent || !map) goto oom;
  for (int64_t i = 0; i < nn; i++) {
    map[i] = -1;
    for (int s = 0; s < TQ_SYMBOLS; s++)
      if (b->node[i].child[s] >= 0) parent[b->node[i].child[s]] = (int32_t)i;
  }
  // the threshold count: every run above it is taken, ties at it by (depth, index)
  int64_t thr = INT64_MAX, n_cand = 0, n_cnt = 0;
  for (int64_t i = first; i < nn; i++)
    if (b->node[i].depth <= b->pairs) cnt[n_cnt++] = b->node[i].count;
  const int64_t take = MOLE_MIN(need, n_cnt);
  if (take > 0) {
    thr = kth_largest(cnt, n_cnt, take);
    for (int64_t i = first; i < nn; i++) n_cand += b->node[i].depth <= b->pairs && b->node[i].count >= thr;
  }
  cand = mole_malloc((size_t)MOLE_MAX(n_cand, 1) * sizeof *cand);
  out = mole_malloc((size_t)n_max * 3);  // room for dict_fill
  if (!cand || !out) goto oom;
  n_cand = 0;
  if (take > 0)
    for (int64_t i = first; i < nn; i++)
      if (b->node[i].depth <= b->pairs && b->node[i].count >= thr)
        cand[n_cand++] = (cb_cand){b->node[i].count, (int32_t)i, b->node[i].depth};
  qsort(cand, (size_t)n_cand, sizeof *cand, cand_cmp);
  int64_t m = 0;
  for (int s = 0; s < TQ_SYMBOLS; s++, m++) {
    map[1 + s] = (int32_t)m;
    out[3 * m] = 0;
    out[3 * m + 1] = 0;
    out[3 * m + 2] = (uint8_t)s;
  }
  for (int64_t c = 0; c < n_cand && c < take; c++, m++) {
    const int32_t i = cand[c].idx, pe = map[parent[i]];
    MOLE_ASSERT(pe >= 0);  // count(child) <= count(parent): the order is prefix-closed
    map[i] = (int32_t)m;
    out[3 * m] = (uint8_t)((pe + 1) & 0xff);
    out[3 * m + 1] = (uint8_t)((pe + 1) >> 8);
    out[3 * m + 2] = b->node[i].sym;
  }
  *compact = out;
  *n = m;
  out = NULL;
  goto done;
oom:
  st = mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory selecting from %lld runs", (long long)nn);
done:
  mole_free(cnt);
  mole_free(parent);
  mole_free(map);
  mole_free(cand);
  mole_free(out);
  return st;
}

// ---- greedy parse --------------------------------------------------------------

// The dictionary's trie: child [n][9] (-1: none), root [9]. Checks the
// compact form as tq_book_new does.
static mole_status dict_trie(const uint8_t *compact, int64_t n, int32_t **child_out, int32_t root[TQ_SYMBOLS]) {
  *child_out = NULL;
  if (!compact || n < TQ_SYMBOLS || n > TQ_BOOK_MAX)
    return mole_errorf(MOLE_ERR_ARG, "codebook: %lld entries (must be %d..%d)", (long long)n, TQ_SYMBOLS,
                       TQ_BOOK_MAX);
  int32_t *child = mole_malloc((size_t)n * TQ_SYMBOLS * sizeof *child);
  uint8_t *depth = mole_malloc((size_t)n);
  if (!child || !depth) {
    mole_free(child);
    mole_free(depth);
    return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for %lld entries", (long long)n);
  }
  memset(child, 0xff, (size_t)n * TQ_SYMBOLS * sizeof *child);
  for (int s = 0; s < TQ_SYMBOLS; s++) root[s] = -1;
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < n && st == MOLE_OK; i++) {
    const int64_t p = (int64_t)(compact[3 * i] | (compact[3 * i + 1] << 8)) - 1;
    const int s = compact[3 * i + 2];
    if (p >= i || s >= TQ_SYMBOLS || (p >= 0 && depth[p] >= TQ_PAIRS_MAX)) {
      st = mole_errorf(MOLE_ERR_ARG, "codebook: entry %lld: bad parent %lld or symbol %d", (long long)i, (long long)p,
                       s);
      break;
    }
    int32_t *slot = p >= 0 ? &child[p * TQ_SYMBOLS + s] : &root[s];
    if (*slot >= 0) st = mole_errorf(MOLE_ERR_ARG, "codebook: entry %lld repeats entry %d", (long long)i, *slot);
    *slot = (int32_t)i;
    depth[i] = (uint8_t)(p >= 0 ? depth[p] + 1 : 1);
  }
  for (int s = 0; s < TQ_SYMBOLS && st == MOLE_OK; s++)
    if (root[s] < 0) st = mole_errorf(MOLE_ERR_ARG, "codebook: no entry for the one-pair run %d", s);
  mole_free(depth);
  if (st != MOLE_OK) {
    mole_free(child);
    return st;
  }
  *child_out = child;
  return MOLE_OK;
}

// Greedy longest match over the pair symbols s [np] of one row: the number of
// codes; with starts, the position of each code too.
static int64_t parse_row(const int32_t *child, const int32_t *root, const uint8_t *s, int64_t np, int64_t *starts) {
  int64_t codes = 0;
  for (int64_t p = 0; p < np;) {
    int32_t e = root[s[p]];
    int64_t len = 1;
    while (p + len < np) {
      const int32_t nx = child[(int64_t)e * TQ_SYMBOLS + s[p + len]];
      if (nx < 0) break;
      e = nx;
      len++;
    }
    if (starts) starts[codes] = p;
    codes++;
    p += len;
  }
  return codes;
}

// The codes on all rows kept; with starts (scratch of the longest row),
// counts the runs at the code starts into the trie.
static int64_t parse_rows(cb_builder *b, const int32_t *child, const int32_t *root, int64_t *starts) {
  int64_t codes = 0;
  for (int64_t r = 0, s0 = 0; r < b->n_rows; s0 = b->row_end[r++]) {
    const int64_t np = b->row_end[r] - s0, c = parse_row(child, root, b->sym + s0, np, starts);
    if (starts) trie_count_runs(b, b->sym + s0, np, starts, c);
    codes += c;
  }
  return codes;
}

mole_status cb_count_codes(const uint8_t *compact, int64_t n, const int8_t *t, int64_t n_rows, int64_t k,
                           int64_t *codes) {
  *codes = 0;
  if (k < 0 || k % 2 || n_rows < 0 || (!t && n_rows * k > 0))
    return mole_errorf(MOLE_ERR_ARG, "codebook: bad rows %lld x %lld", (long long)n_rows, (long long)k);
  int32_t *child, root[TQ_SYMBOLS];
  mole_status st = dict_trie(compact, n, &child, root);
  if (st != MOLE_OK) return st;
  uint8_t *s = mole_malloc((size_t)MOLE_MAX(k / 2, 1));
  if (!s) {
    mole_free(child);
    return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for a row of %lld", (long long)k);
  }
  int64_t c = 0;
  for (int64_t r = 0; r < n_rows; r++) {
    const int8_t *tr = t + (size_t)r * k;
    for (int64_t i = 0; i < k / 2; i++) {
      if (!ternary(tr[2 * i]) || !ternary(tr[2 * i + 1])) {
        mole_free(s);
        mole_free(child);
        return mole_errorf(MOLE_ERR_ARG, "codebook: row %lld, weight %lld: %d is not ternary", (long long)r,
                           (long long)(2 * i + !ternary(tr[2 * i])), ternary(tr[2 * i]) ? tr[2 * i + 1] : tr[2 * i]);
      }
      s[i] = (uint8_t)pair_sym(tr + 2 * i);
    }
    c += parse_row(child, root, s, k / 2, NULL);
  }
  mole_free(s);
  mole_free(child);
  *codes = c;
  return MOLE_OK;
}

// ---- finish --------------------------------------------------------------------

// Fills the dictionary d [*n] (room for n_max) up to n_max entries with the
// runs of f [nf] it lacks, in f's order (f prefix-closed with parents first:
// so is the union, and so is any head of f's order).
static mole_status dict_fill(uint8_t *d, int64_t *n, int64_t n_max, const uint8_t *f, int64_t nf) {
  if (*n >= n_max) return MOLE_OK;
  int32_t *child = mole_malloc((size_t)n_max * TQ_SYMBOLS * sizeof *child), root[TQ_SYMBOLS];
  int32_t *map = mole_malloc((size_t)MOLE_MAX(nf, 1) * sizeof *map);
  if (!child || !map) {
    mole_free(child);
    mole_free(map);
    return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for %lld entries", (long long)n_max);
  }
  memset(child, 0xff, (size_t)n_max * TQ_SYMBOLS * sizeof *child);
  for (int s = 0; s < TQ_SYMBOLS; s++) root[s] = -1;
  int64_t m = *n;
  for (int64_t i = 0; i < m; i++) {
    const int64_t p = (int64_t)(d[3 * i] | (d[3 * i + 1] << 8)) - 1;
    *(p >= 0 ? &child[p * TQ_SYMBOLS + d[3 * i + 2]] : &root[d[3 * i + 2]]) = (int32_t)i;
  }
  for (int64_t i = 0; i < nf && m < n_max; i++) {
    const int64_t p = (int64_t)(f[3 * i] | (f[3 * i + 1] << 8)) - 1, mp = p >= 0 ? map[p] : -1;
    const int s = f[3 * i + 2];
    MOLE_ASSERT(p < i && (p < 0 || mp >= 0));
    int32_t *slot = mp >= 0 ? &child[mp * TQ_SYMBOLS + s] : &root[s];
    if (*slot < 0) {
      *slot = (int32_t)m;
      d[3 * m] = (uint8_t)((mp + 1) & 0xff);
      d[3 * m + 1] = (uint8_t)((mp + 1) >> 8);
      d[3 * m + 2] = (uint8_t)s;
      m++;
    }
    map[i] = *slot;
  }
  *n = m;
  mole_free(child);
  mole_free(map);
  return MOLE_OK;
}

// The codes the dictionary spends on the rows kept; with recount, the trie is
// reset and counts the runs at the code starts.
static mole_status dict_codes(cb_builder *b, const uint8_t *compact, int64_t n, bool recount, int64_t *codes) {
  int32_t *child, root[TQ_SYMBOLS];
  mole_status st = dict_trie(compact, n, &child, root);
  if (st != MOLE_OK) return mole_error_prefix(MOLE_ERR_INTERNAL, "codebook: own selection: ");
  int64_t *starts = NULL;
  if (recount) {
    starts = mole_malloc((size_t)MOLE_MAX(b->max_row, 1) * sizeof *starts);
    if (!starts) {
      mole_free(child);
      return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for a row of %lld pairs", (long long)b->max_row);
    }
    trie_reset(b);
  }
  *codes = parse_rows(b, child, root, starts);
  mole_free(starts);
  mole_free(child);
  return MOLE_OK;
}

// The codes of the first selection with runs of at most `pairs` pairs (the
// trie's counts untouched).
static mole_status first_codes(cb_builder *b, int64_t n_max, int pairs, int64_t *codes) {
  b->pairs = pairs;
  uint8_t *d = NULL;
  int64_t nd = 0;
  mole_status st = trie_select(b, n_max, &d, &nd);
  if (st == MOLE_OK) st = dict_codes(b, d, nd, false, codes);
  mole_free(d);
  return st;
}

mole_status cb_builder_finish(cb_builder *b, int64_t n_max, int max_pairs, uint8_t **compact, int64_t *n,
                              cb_finish_info *info) {
  *compact = NULL;
  *n = 0;
  if (info) *info = (cb_finish_info){.pairs = max_pairs, .wide_saving = -1};
  if (n_max < TQ_SYMBOLS || n_max > TQ_BOOK_MAX)
    return mole_errorf(MOLE_ERR_ARG, "codebook: n_max %lld (must be %d..%d)", (long long)n_max, TQ_SYMBOLS,
                       TQ_BOOK_MAX);
  if (max_pairs < 0 || max_pairs > TQ_PAIRS_MAX)
    return mole_errorf(MOLE_ERR_ARG, "codebook: max_pairs %d (must be 1..%d, or 0 for auto)", max_pairs,
                       TQ_PAIRS_MAX);
  if (b->oom)
    return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory keeping the rows (%lld pairs kept)",
                       (long long)b->n_sym);
  mole_status st;
  if (max_pairs == 0) {  // auto: compare the two first selections
    int64_t wide = 0, narrow = 0;
    if (b->n_rows > 0 && ((st = first_codes(b, n_max, TQ_PAIRS_MAX, &wide)) ||
                          (st = first_codes(b, n_max, TQ_NARROW_PAIRS, &narrow))))
      return st;
    max_pairs = (double)narrow <= (1 + CB_NARROW_SLACK) * (double)wide ? TQ_NARROW_PAIRS : TQ_PAIRS_MAX;
    if (info) *info = (cb_finish_info){.pairs = max_pairs, .wide_saving = narrow ? 1 - (double)wide / narrow : 0};
    mole_log(MOLE_LOG_DEBUG, "codebook: first selections: %lld codes with runs of %d pairs, %lld with %d",
             (long long)narrow, TQ_NARROW_PAIRS, (long long)wide, TQ_PAIRS_MAX);
  }
  b->pairs = max_pairs;
  uint8_t *best = NULL, *first = NULL;
  int64_t nbest = 0, best_codes = 0, nfirst = 0;
  st = trie_select(b, n_max, &best, &nbest);
  if (st != MOLE_OK) return st;
  const int64_t t0 = mole_time_us();
  if (b->n_rows > 0) {
    first = mole_malloc((size_t)nbest * 3);
    if (!first) {
      mole_free(best);
      return mole_errorf(MOLE_ERR_NOMEM, "codebook: out of memory for %lld entries", (long long)nbest);
    }
    memcpy(first, best, (size_t)nbest * 3);
    nfirst = nbest;
    st = dict_codes(b, best, nbest, true, &best_codes);
    mole_log(MOLE_LOG_DEBUG, "codebook: %lld entries: %lld codes on %lld pairs", (long long)nbest,
             (long long)best_codes, (long long)b->n_sym);
    for (int it = 0; it < CB_REFINE && st == MOLE_OK; it++) {
      uint8_t *next = NULL;
      int64_t nnext = 0, codes = 0;
      st = trie_select(b, n_max, &next, &nnext);
      // runs never at a code start here may be elsewhere: fill up from the first selection
      if (st == MOLE_OK) st = dict_fill(next, &nnext, n_max, first, nfirst);
      if (st == MOLE_OK) st = dict_codes(b, next, nnext, it + 1 < CB_REFINE, &codes);
      mole_log(MOLE_LOG_DEBUG, "codebook: refinement %d: %lld entries: %lld codes", it + 1, (long long)nnext,
               (long long)codes);
      if (st == MOLE_OK && codes < best_codes) {
        mole_free(best);
        best = next, nbest = nnext, best_codes = codes;
      } else {
        mole_free(next);
      }
    }
  }
  mole_free(first);
  if (st != MOLE_OK) {
    mole_free(best);
    return st;
  }
  mole_log(MOLE_LOG_DEBUG, "codebook: %lld entries, %lld codes for %lld pairs (%.4f bits/weight), refined in %.2f s",
           (long long)nbest, (long long)best_codes, (long long)b->n_sym,
           b->n_sym ? 16.0 * (double)best_codes / (2.0 * (double)b->n_sym) : 0.0, (double)(mole_time_us() - t0) / 1e6);
  *compact = best;
  *n = nbest;
  return MOLE_OK;
}

// ---- symbol statistics ---------------------------------------------------------

void tq_symstats_add(tq_symstats *s, const int8_t *t, int64_t n) {
  int64_t z = 0, pl = 0, mi = 0;
  for (int64_t i = 0; i < n; i++) {
    z += t[i] == 0;
    pl += t[i] > 0;
    mi += t[i] < 0;
  }
  s->weights += n;
  s->zeros += z;
  s->plus += pl;
  s->minus += mi;
  for (int64_t i = 0; i + 1 < n; i += 2) {
    MOLE_ASSERT(ternary(t[i]) && ternary(t[i + 1]));
    s->pairs[pair_sym(t + i)]++;
  }
}

static double plogp(int64_t c, int64_t total) {
  if (c <= 0 || total <= 0) return 0.0;
  const double p = (double)c / (double)total;
  return -p * log2(p);
}

double tq_symstats_entropy(const tq_symstats *s) {
  return plogp(s->zeros, s->weights) + plogp(s->plus, s->weights) + plogp(s->minus, s->weights);
}

double tq_symstats_pair_entropy(const tq_symstats *s) {
  int64_t tot = 0;
  for (int i = 0; i < TQ_SYMBOLS; i++) tot += s->pairs[i];
  double h = 0.0;
  for (int i = 0; i < TQ_SYMBOLS; i++) h += plogp(s->pairs[i], tot);
  return h / 2.0;
}
