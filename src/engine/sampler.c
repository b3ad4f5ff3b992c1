// engine/sampler: penalties -> top_k -> top_p -> min_p -> temperature ->
// sample, on preallocated buffers; and the stop-string matcher.
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <string.h>

struct sampler {
  sampler_params p;
  int64_t n_vocab;
  uint64_t seed;     // the seed in use (drawn when SAMPLER_SEED_RANDOM)
  uint64_t rng[4];   // xoshiro256** state
  float *work;       // [n_vocab] sanitised, penalised logits
  float *weight;     // [n_vocab] exp((logit - max) / T) of the candidates, by position in idx
  int32_t *idx;      // [n_vocab] candidate token ids
  int32_t *count;    // [n_vocab] occurrences of each token in the history window
  uint32_t *stamp;   // [n_vocab] == epoch: penalty already applied this call
  uint32_t epoch;
  int32_t *ring;     // [repeat_last_n] history window, oldest at ring_head
  int32_t ring_len;
  int32_t ring_head;
};

// ---- random numbers: splitmix64 seeding, xoshiro256** stream -------------

static uint64_t sampler_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t sampler_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t sampler_next_u64(sampler *s) {
  uint64_t *r = s->rng;
  uint64_t out = sampler_rotl(r[1] * 5, 7) * 9;
  uint64_t t = r[1] << 17;
  r[2] ^= r[0];
  r[3] ^= r[1];
  r[1] ^= r[2];
  r[0] ^= r[3];
  r[2] ^= t;
  r[3] = sampler_rotl(r[3], 45);
  return out;
}

// uniform in [0, 1) with 53 random bits
static double sampler_next_uniform(sampler *s) { return (double)(sampler_next_u64(s) >> 11) * 0x1.0p-53; }

static void sampler_seed_rng(sampler *s) {
  uint64_t x = s->seed;
  for (int i = 0; i < 4; i++) s->rng[i] = sampler_splitmix64(&x);
}

// ---- params ---------------------------------------------------------------

sampler_params sampler_params_default(void) {
  sampler_params p = {
      .temperature = 0.8f,
      .top_k = 40,
      .top_p = 0.95f,
      .min_p = 0.05f,
      .repeat_penalty = 1.0f,
      .repeat_last_n = 64,
      .presence_penalty = 0.0f,
      .frequency_penalty = 0.0f,
      .seed = SAMPLER_SEED_RANDOM,
  };
  return p;
}

static mole_status sampler_check_params(const sampler_params *p, int64_t n_vocab) {
  if (n_vocab < 1 || n_vocab > INT32_MAX)
    return mole_errorf(MOLE_ERR_ARG, "sampler: n_vocab %lld out of range [1, %d]", (long long)n_vocab,
                       INT32_MAX);
  if (isnan(p->temperature))
    return mole_errorf(MOLE_ERR_ARG, "sampler: temperature is NaN");
  if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
    return mole_errorf(MOLE_ERR_ARG, "sampler: top_p %g must be in [0, 1]", (double)p->top_p);
  if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
    return mole_errorf(MOLE_ERR_ARG, "sampler: min_p %g must be in [0, 1]", (double)p->min_p);
  if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
    return mole_errorf(MOLE_ERR_ARG, "sampler: repeat_penalty %g must be > 0 (1 = off)",
                       (double)p->repeat_penalty);
  if (p->repeat_last_n < 0)
    return mole_errorf(MOLE_ERR_ARG, "sampler: repeat_last_n %d must be >= 0 (0 = off)", (int)p->repeat_last_n);
  if (!isfinite(p->presence_penalty))
    return mole_errorf(MOLE_ERR_ARG, "sampler: presence_penalty is not finite");
  if (!isfinite(p->frequency_penalty))
    return mole_errorf(MOLE_ERR_ARG, "sampler: frequency_penalty is not finite");
  return MOLE_OK;
}

mole_status sampler_init(const sampler_params *p, int64_t n_vocab, sampler **out) {
  MOLE_ASSERT(p != NULL && out != NULL);
  *out = NULL;
  mole_status st = sampler_check_params(p, n_vocab);
  if (st != MOLE_OK) return st;

  sampler *s = mole_calloc(1, sizeof(*s));
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "sampler: out of memory");
  s->p = *p;
  s->n_vocab = n_vocab;
  size_t nv = (size_t)n_vocab;
  s->work = mole_malloc(nv * sizeof(float));
  s->weight = mole_malloc(nv * sizeof(float));
  s->idx = mole_malloc(nv * sizeof(int32_t));
  s->count = mole_calloc(nv, sizeof(int32_t));
  s->stamp = mole_calloc(nv, sizeof(uint32_t));
  if (p->repeat_last_n > 0) s->ring = mole_malloc((size_t)p->repeat_last_n * sizeof(int32_t));
  if (!s->work || !s->weight || !s->idx || !s->count || !s->stamp || (p->repeat_last_n > 0 && !s->ring)) {
    sampler_free(s);
    return mole_errorf(MOLE_ERR_NOMEM, "sampler: out of memory for %lld-token buffers", (long long)n_vocab);
  }
  if (p->seed == SAMPLER_SEED_RANDOM) {
    uint64_t x = (uint64_t)mole_time_us() ^ (uint64_t)(uintptr_t)s;
    s->seed = sampler_splitmix64(&x);
    if (s->seed == SAMPLER_SEED_RANDOM) s->seed = 0;
  } else {
    s->seed = p->seed;
  }
  s->epoch = 1;
  sampler_seed_rng(s);
  *out = s;
  return MOLE_OK;
}

void sampler_free(sampler *s) {
  if (!s) return;
  mole_free(s->work);
  mole_free(s->weight);
  mole_free(s->idx);
  mole_free(s->count);
  mole_free(s->stamp);
  mole_free(s->ring);
  mole_free(s);
}

uint64_t sampler_seed(const sampler *s) { return s->seed; }

void sampler_reset(sampler *s) {
  MOLE_ASSERT(s != NULL);
  for (int32_t i = 0; i < s->ring_len; i++) {
    int32_t t = s->ring[(s->ring_head + i) % s->p.repeat_last_n];
    s->count[t] = 0;
  }
  s->ring_len = 0;
  s->ring_head = 0;
  sampler_seed_rng(s);
}

void sampler_accept(sampler *s, int32_t token) {
  MOLE_ASSERT(s != NULL);
  MOLE_ASSERT(token >= 0 && token < s->n_vocab);
  int32_t n = s->p.repeat_last_n;
  if (n == 0) return;
  if (s->ring_len == n) {  // full: the oldest leaves the window
    int32_t old = s->ring[s->ring_head];
    s->count[old]--;
    s->ring[s->ring_head] = token;
    s->ring_head = (s->ring_head + 1) % n;
  } else {
    s->ring[(s->ring_head + s->ring_len) % n] = token;
    s->ring_len++;
  }
  s->count[token]++;
}

// ---- the chain ------------------------------------------------------------

static void sampler_apply_penalties(sampler *s) {
  const sampler_params *p = &s->p;
  if (s->ring_len == 0) return;
  if (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f) return;
  if (++s->epoch == 0) {  // wrapped: old stamps could collide
    memset(s->stamp, 0, (size_t)s->n_vocab * sizeof(uint32_t));
    s->epoch = 1;
  }
  for (int32_t i = 0; i < s->ring_len; i++) {
    int32_t t = s->ring[(s->ring_head + i) % p->repeat_last_n];
    if (s->stamp[t] == s->epoch) continue;  // once per distinct token
    s->stamp[t] = s->epoch;
    int32_t c = s->count[t];
    MOLE_ASSERT(c > 0 && c <= p->repeat_last_n);
    float v = s->work[t];
    if (v <= 0.0f)
      v *= p->repeat_penalty;
    else
      v /= p->repeat_penalty;
    v -= (float)c * p->frequency_penalty + p->presence_penalty;
    s->work[t] = v > FLT_MAX ? FLT_MAX : v;  // a penalty < 1 may overflow a huge logit
  }
}

// a before b: larger logit first, then lower id (a total order, so selection
// is deterministic)
static inline bool sampler_before(const float *w, int32_t a, int32_t b) {
  return w[a] > w[b] || (w[a] == w[b] && a < b);
}

static inline void sampler_swap(int32_t *x, int64_t i, int64_t j) {
  int32_t t = x[i];
  x[i] = x[j];
  x[j] = t;
}

// Sifts h[i] down a heap of k whose root is the worst by sampler_before.
static void sampler_heap_down(const float *w, int32_t *h, int64_t k, int64_t i) {
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= k) return;
    if (c + 1 < k && sampler_before(w, h[c], h[c + 1])) c++;  // the worse child
    if (!sampler_before(w, h[i], h[c])) return;                // h[i] is worse than both
    sampler_swap(h, i, c);
    i = c;
  }
}

// The k best tokens by sampler_before into idx[0, k), best first: idx[0, k)
// holds k finite candidates, and tokens from..nv-1 follow. One pass keeps the
// k best so far as a heap whose root is the worst of them: a later token must
// beat the root (most fail on the logit alone), then the heap is sorted.
// O(n + m log k) for m replacements.
static void sampler_top_k(const float *w, int32_t *idx, int64_t k, int64_t from, int64_t nv) {
  for (int64_t i = k / 2 - 1; i >= 0; i--) sampler_heap_down(w, idx, k, i);
  float thr = w[idx[0]];  // finite: -inf logits never enter
  for (int64_t t = from; t < nv; t++) {
    if (w[t] <= thr) continue;  // a tie loses too: every id in the heap is lower
    idx[0] = (int32_t)t;
    sampler_heap_down(w, idx, k, 0);
    thr = w[idx[0]];
  }
  for (int64_t m = k - 1; m > 0; m--) {  // the worst to the back, one at a time
    sampler_swap(idx, 0, m);
    sampler_heap_down(w, idx, m, 0);
  }
}

// top-p without sorting: the kept set is the best-ranked prefix (by
// sampler_before) whose softmax mass first reaches p, found by a quickselect
// on mass: partition around a pivot, keep the whole better side if its mass
// falls short, else narrow to it. Expected O(n). Returns how many of
// idx[0, n) are kept (they end up first, in no particular order). The mass
// is that of all n, the search runs over the best-ranked m <= n only (the
// others are cut by min-p); it returns m when the prefix would go past them.
static int64_t sampler_top_p(sampler *s, int64_t n, int64_t m) {
  const float *w = s->work;
  int32_t *idx = s->idx;
  float *mass = s->weight;  // [n_vocab] by token id here; the final draw reuses it by position
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = w[idx[i]] > mx ? w[idx[i]] : mx;
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    int32_t t = idx[i];
    mass[t] = expf(w[t] - mx);
    total += mass[t];
  }
  double need = (double)s->p.top_p * total;  // mass still to collect from ranks >= lo
  n = m;
  int64_t lo = 0, hi = n;                    // the answer's rank is in [lo, hi)
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (sampler_before(w, idx[mid], idx[lo])) sampler_swap(idx, mid, lo);
    if (sampler_before(w, idx[last], idx[lo])) sampler_swap(idx, last, lo);
    if (sampler_before(w, idx[mid], idx[last])) sampler_swap(idx, mid, last);
    int32_t pivot = idx[last];
    int64_t store = lo;
    double above = 0.0;
    for (int64_t i = lo; i < last; i++) {
      if (sampler_before(w, idx[i], pivot)) {
        above += mass[idx[i]];
        sampler_swap(idx, i, store++);
      }
    }
    sampler_swap(idx, store, last);  // the pivot has rank `store`
    if (above >= need && store > lo) {
      hi = store;  // reached before the pivot
    } else {
      need -= above + mass[pivot];
      if (need <= 0.0) return store + 1;  // the pivot crosses p
      lo = store + 1;
    }
  }
  return MOLE_MAX(MOLE_MIN(lo + 1, n), (int64_t)1);
}

static int32_t sampler_argmax(const float *w, int64_t n) {
  int32_t best = 0;
  float bv = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (w[i] > bv) {
      bv = w[i];
      best = (int32_t)i;
    }
  }
  return best;
}

int32_t sampler_sample(sampler *s, const float *logits) {
  MOLE_ASSERT(s != NULL && logits != NULL);
  const sampler_params *p = &s->p;
  const int64_t nv = s->n_vocab;
  float *w = s->work;
  int32_t *idx = s->idx;

  for (int64_t i = 0; i < nv; i++) {  // NaN -> -inf, +inf -> FLT_MAX (branch-free: vectorized)
    const float v = logits[i];
    w[i] = v != v ? -INFINITY : v == INFINITY ? FLT_MAX : v;
  }
  sampler_apply_penalties(s);

  if (!(p->temperature > 0.0f)) return sampler_argmax(w, nv);

  // the candidates: finite logits; with top_k, the first top_k of them seed
  // sampler_top_k's heap and the rest only pass through it
  int64_t n = 0, seen = 0;
  const int64_t cap = p->top_k > 0 ? p->top_k : nv;
  for (; seen < nv && n < cap; seen++)
    if (w[seen] > -INFINITY) idx[n++] = (int32_t)seen;
  if (n == 0) return 0;
  if (p->top_k > 0 && n == p->top_k && seen < nv) sampler_top_k(w, idx, n, seen, nv);

  // min-p keeps the logits within log(min_p) of the best: a best-ranked
  // prefix, as top-p's is, so what both keep is the shorter prefix. The cut
  // comes first (it moves those candidates to the front), so top-p's search
  // runs over them only while its mass still counts every candidate.
  int64_t m = n;
  if (p->min_p > 0.0f && n > 1) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = w[idx[i]] > mx ? w[idx[i]] : mx;
    const float thr = mx + logf(p->min_p);
    m = 0;
    for (int64_t i = 0; i < n; i++)
      if (w[idx[i]] >= thr) sampler_swap(idx, m++, i);
    MOLE_ASSERT(m >= 1);
  }
  n = p->top_p < 1.0f && m > 1 ? sampler_top_p(s, n, m) : m;

  if (n == 1) return idx[0];

  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = w[idx[i]] > mx ? w[idx[i]] : mx;
  const double inv_t = 1.0 / (double)p->temperature;
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    float e = (float)exp(((double)w[idx[i]] - (double)mx) * inv_t);
    s->weight[i] = e;
    sum += e;
  }
  const double u = sampler_next_uniform(s) * sum;
  double cum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    cum += s->weight[i];
    if (u < cum) return idx[i];
  }
  // rounding left u at the very top: the last candidate with any weight
  for (int64_t i = n - 1; i > 0; i--)
    if (s->weight[i] > 0.0f) return idx[i];
  return idx[0];
}

// ---- stop strings ---------------------------------------------------------

struct stop_matcher {
  int64_t n_stops;
  char **stops;     // [n_stops] copies
  size_t *lens;     // [n_stops]
  size_t max_len;
  char *buf;        // [cap] pending text: bytes not yet handed out, then held bytes
  size_t cap;
  size_t len;
  size_t consumed;  // bytes handed out by the last call, dropped at the next
  bool matched;
  int32_t stop_index;
};

#define STOP_PIECE_RESERVE 256

mole_status stop_matcher_init(const char *const *stops, int64_t n_stops, stop_matcher **out) {
  MOLE_ASSERT(out != NULL);
  *out = NULL;
  if (n_stops < 0 || n_stops > INT32_MAX || (n_stops > 0 && !stops))
    return mole_errorf(MOLE_ERR_ARG, "stop strings: bad count %lld", (long long)n_stops);
  for (int64_t i = 0; i < n_stops; i++) {
    if (!stops[i] || !stops[i][0])
      return mole_errorf(MOLE_ERR_ARG, "stop strings: string %lld is empty", (long long)i);
  }
  stop_matcher *m = mole_calloc(1, sizeof(*m));
  if (!m) return mole_errorf(MOLE_ERR_NOMEM, "stop strings: out of memory");
  m->n_stops = n_stops;
  m->stop_index = -1;
  if (n_stops > 0) {
    m->stops = mole_calloc((size_t)n_stops, sizeof(char *));
    m->lens = mole_calloc((size_t)n_stops, sizeof(size_t));
  }
  bool ok = n_stops == 0 || (m->stops && m->lens);
  for (int64_t i = 0; ok && i < n_stops; i++) {
    m->stops[i] = mole_strdup(stops[i]);
    ok = m->stops[i] != NULL;
    if (ok) {
      m->lens[i] = strlen(stops[i]);
      m->max_len = MOLE_MAX(m->max_len, m->lens[i]);
    }
  }
  if (ok) {
    m->cap = m->max_len + STOP_PIECE_RESERVE;
    m->buf = mole_malloc(m->cap);
    ok = m->buf != NULL;
  }
  if (!ok) {
    stop_matcher_free(m);
    return mole_errorf(MOLE_ERR_NOMEM, "stop strings: out of memory");
  }
  *out = m;
  return MOLE_OK;
}

void stop_matcher_free(stop_matcher *m) {
  if (!m) return;
  for (int64_t i = 0; m->stops && i < m->n_stops; i++) mole_free(m->stops[i]);
  mole_free(m->stops);
  mole_free(m->lens);
  mole_free(m->buf);
  mole_free(m);
}

void stop_matcher_reset(stop_matcher *m) {
  MOLE_ASSERT(m != NULL);
  m->len = 0;
  m->consumed = 0;
  m->matched = false;
  m->stop_index = -1;
}

static void stop_matcher_drop_consumed(stop_matcher *m) {
  if (m->consumed == 0) return;
  MOLE_ASSERT(m->consumed <= m->len);
  memmove(m->buf, m->buf + m->consumed, m->len - m->consumed);
  m->len -= m->consumed;
  m->consumed = 0;
}

// first position >= from where needle occurs in hay[0, n), or SIZE_MAX
static size_t stop_find(const char *hay, size_t n, size_t from, const char *needle, size_t nl) {
  if (nl > n) return SIZE_MAX;
  for (size_t i = from; i + nl <= n; i++) {
    if (hay[i] == needle[0] && memcmp(hay + i, needle, nl) == 0) return i;
  }
  return SIZE_MAX;
}

mole_status stop_matcher_feed(stop_matcher *m, const char *piece, size_t n, stop_match *out) {
  MOLE_ASSERT(m != NULL && out != NULL && (piece != NULL || n == 0));
  stop_matcher_drop_consumed(m);
  *out = (stop_match){.matched = m->matched, .stop_index = m->stop_index, .emit = m->buf};
  if (m->matched) return MOLE_OK;

  const size_t old_len = m->len;  // held bytes: no complete stop string among them
  if (n > m->cap - m->len) {
    if (n > SIZE_MAX / 2 - m->len) return mole_errorf(MOLE_ERR_ARG, "stop strings: piece of %zu bytes", n);
    size_t cap = MOLE_MAX(m->cap * 2, m->len + n);
    char *b = mole_realloc(m->buf, cap);
    if (!b) return mole_errorf(MOLE_ERR_NOMEM, "stop strings: out of memory for a %zu-byte piece", n);
    m->buf = b;
    m->cap = cap;
    out->emit = b;
  }
  if (n) memcpy(m->buf + m->len, piece, n);
  m->len += n;

  // the earliest complete stop string (it must end in the new bytes)
  size_t best = SIZE_MAX;
  int32_t which = -1;
  for (int64_t i = 0; i < m->n_stops; i++) {
    size_t ls = m->lens[i];
    size_t from = old_len >= ls ? old_len - ls + 1 : 0;
    size_t pos = stop_find(m->buf, m->len, from, m->stops[i], ls);
    if (pos < best) {
      best = pos;
      which = (int32_t)i;
    }
  }
  if (which >= 0) {
    m->matched = true;
    m->stop_index = which;
    out->matched = true;
    out->stop_index = which;
    out->n_emit = best;
    m->consumed = m->len;  // the stop string and what follows are dropped
    return MOLE_OK;
  }

  // the longest tail that is a proper prefix of some stop string is held back
  size_t hold = 0;
  for (int64_t i = 0; i < m->n_stops; i++) {
    size_t k = MOLE_MIN(m->lens[i] - 1, m->len);
    for (; k > hold; k--) {
      if (memcmp(m->buf + m->len - k, m->stops[i], k) == 0) break;
    }
    hold = MOLE_MAX(hold, k);
  }
  out->n_emit = m->len - hold;
  out->n_held = hold;
  m->consumed = out->n_emit;
  return MOLE_OK;
}

void stop_matcher_flush(stop_matcher *m, stop_match *out) {
  MOLE_ASSERT(m != NULL && out != NULL);
  stop_matcher_drop_consumed(m);
  *out = (stop_match){.matched = m->matched, .stop_index = m->stop_index, .emit = m->buf};
  if (m->matched) return;
  out->n_emit = m->len;
  m->consumed = m->len;
}
