#include "model/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

void ops_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / (double)n);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void ops_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const model_hparams *hp, const float *freqs) {
  const int64_t n_rot = hp->n_rot;
  if (n_rot == 0) return;
  // cos/sin per pair, as ggml's rope cache: theta_i = pos * base^(-2i/n_rot)
  float cs[OPS_ROPE_MAX_ROT];  // [n_rot/2][2]
  MOLE_ASSERT(n_rot <= OPS_ROPE_MAX_ROT);
  const float theta_scale = powf(hp->rope_base, -2.0f / (float)n_rot);
  float theta = (float)pos;
  for (int64_t i = 0; i < n_rot / 2; i++) {
    const float ff = freqs ? freqs[i] : 1.0f;
    const float t = hp->rope_freq_scale * (theta / ff);
    cs[2 * i] = cosf(t);
    cs[2 * i + 1] = sinf(t);
    theta *= theta_scale;
  }
  for (int64_t h = 0; h < n_heads; h++) {
    float *v = x + h * head_dim;
    for (int64_t i = 0; i < n_rot / 2; i++) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const int64_t a = hp->rope_neox ? i : 2 * i;
      const int64_t b = hp->rope_neox ? i + n_rot / 2 : 2 * i + 1;
      // ggml's rotation of a pair (the same for both modes, only the pair's
      // second index differs) as its x86 build computes it (contracted)
      const float x0 = v[a], x1 = v[b];
      const float p1 = x1 * s, p0 = x1 * c;
      v[a] = fmaf(x0, c, -p1);
      v[b] = fmaf(x0, s, p0);
    }
  }
}

// exp(x) as the polynomial ggml's SIMD paths use (ARM optimized-routines
// style): x = n*ln2 + b, e^b by a degree-5 polynomial, scaled by 2^n.
float ops_expf_poly_ref(float x) {
  const float shift = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, shift);  // x / ln2, rounded to an integer in the low bits
  const float n = z - shift;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));  // x - n*ln2 in two parts
  const float u = b * b;
  const float p = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                       fmaf(0x1.ffffecp-1f, b, 1.0f));
  if (fabsf(n) > 192) return n <= 0 ? 0.0f : INFINITY;
  return ldexpf(p, (int)n);
}

// Blocks of 16 use the polynomial exp (ggml's AVX-512 silu), the tail libm's expf.
void ops_swiglu_ref(float *y, const float *g, const float *u, int64_t n) {
  const int64_t nb = n & ~(int64_t)15;
  for (int64_t i = 0; i < nb; i++) y[i] = (g[i] / (1.0f + ops_expf_poly_ref(0.0f - g[i]))) * u[i];
  for (int64_t i = nb; i < n; i++) y[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

void ops_axpy_ref(float *restrict o, const float *restrict v, float w, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float p = w * v[i];
    o[i] += p;
  }
}

void ops_pv_ref(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; i++) ops_axpy_ref(o, V + i * d, p[i], d);
}

// ---- the kernels of each ISA level ------------------------------------------------

static const ops_kernels k_ref = {ops_swiglu_ref, ops_axpy_ref, ops_pv_ref};
#if defined(__aarch64__)
static const ops_kernels k_neon = {ops_swiglu_neon, ops_axpy_neon, ops_pv_neon};
static const ops_kernels *const k_levels[] = {[QUANT_ISA_SCALAR] = &k_ref, [QUANT_ISA_NEON] = &k_neon};
#else
static const ops_kernels k_avx512 = {ops_swiglu_avx512, ops_axpy_avx512, ops_pv_avx512};
static const ops_kernels *const k_levels[] = {
    [QUANT_ISA_SCALAR] = &k_ref, [QUANT_ISA_AVX2] = &k_ref, [QUANT_ISA_AVX512] = &k_avx512};
#endif
_Static_assert(sizeof k_levels / sizeof k_levels[0] == QUANT_ISA_TOP + 1, "a table per level");

const ops_kernels *ops_kernels_at(int level) {
  return level >= 0 && level <= QUANT_ISA_TOP ? k_levels[level] : NULL;
}

void ops_swiglu(float *y, const float *g, const float *u, int64_t n) { k_levels[quant_level()]->swiglu(y, g, u, n); }

void ops_pv(float *restrict o, const float *restrict p, const float *restrict V, int64_t n, int64_t d) {
  k_levels[quant_level()]->pv(o, p, V, n, d);
}

void ops_axpy(float *restrict o, const float *restrict v, float w, int64_t n) {
  k_levels[quant_level()]->axpy(o, v, w, n);
}

float ops_hsum16(const float *a) {
  float t[8], r[4];
  for (int i = 0; i < 8; i++) t[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; i++) r[i] = t[i] + t[i + 4];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

// Rows are handed out in chunks from one counter shared by all threads
// (guided self-scheduling over the panels of 16 rows of every task of the
// call, one task after another): a claim takes 1/nth of the panels still
// unclaimed, so chunks start large and shrink towards the end. Large chunks
// keep each thread streaming one long run of a matrix (every new run costs
// the hardware prefetcher a ramp: with a fixed 1/(8 nth) of each task, decode
// on a Zen 4 ran ~8% slower than with halves), and the small last ones let
// the thread the memory system serves faster take more instead of waiting
// for the other at the join. A chunk never spans two tasks and is at least 2
// panels (the kernels read a chunk as two streams, and every claim moves the
// counter's cache line between cores: on this VM's cores on two memory
// links, 1/(2 nth) and single panels decoded ~10% slower).
enum { MM_MIN_PANELS = 2 };
enum { MM_MAX_TASKS = 64 };
typedef struct {
  const ops_mm *tasks;
  int64_t n, nth;
  int64_t first[MM_MAX_TASKS + 1];  // first panel of each task; first[n] = all panels
  _Atomic int64_t next;             // first panel not yet claimed
} mm_job;

static void mm_worker(void *ctx, int ith, int nth) {
  (void)ith, (void)nth;
  mm_job *job = ctx;
  const int64_t total = job->first[job->n];
  int64_t t = 0;
  int64_t c = atomic_load_explicit(&job->next, memory_order_relaxed);
  for (;;) {
    if (c >= total) return;
    while (c >= job->first[t + 1]) t++;
    const ops_mm *mm = &job->tasks[t];
    const int64_t want = MOLE_MAX((total - c) / job->nth, (int64_t)MM_MIN_PANELS);
    const int64_t end = MOLE_MIN(c + want, job->first[t + 1]);
    if (!atomic_compare_exchange_weak_explicit(&job->next, &c, end, memory_order_relaxed, memory_order_relaxed))
      continue;  // c now holds the counter's value: claim again from there
    const model_tensor *w = mm->w;
    const int64_t r0 = (c - job->first[t]) * 16, r1 = MOLE_MIN((end - job->first[t]) * 16, w->ne1);
    const char *base = (const char *)w->data + (size_t)mm->mat * w->mat_bytes;
    const quant_op op = {w->ne1, mm->expert, mm->n_seg, mm->seg_ends, w->book};
    quant_gemm_op(w->type, w->layout, base, w->row_bytes, mm->x, mm->xstride, mm->y, mm->ldy, r0, r1, mm->n_tok, w->ne0,
                  &op);
    c = atomic_load_explicit(&job->next, memory_order_relaxed);
  }
}

void ops_mm_run(mole_pool *pool, const ops_mm *tasks, int64_t n_tasks) {
  for (int64_t t0 = 0; t0 < n_tasks; t0 += MM_MAX_TASKS) {
    mm_job job = {.tasks = tasks + t0, .n = MOLE_MIN(n_tasks - t0, (int64_t)MM_MAX_TASKS), .nth = mole_pool_nth(pool)};
    job.first[0] = 0;
    for (int64_t t = 0; t < job.n; t++) {
      const ops_mm *mm = &job.tasks[t];
      job.first[t + 1] = job.first[t] + (mm->n_tok > 0 ? (mm->w->ne1 + 15) / 16 : 0);
    }
    atomic_init(&job.next, 0);
    mole_pool_run(pool, mm_worker, &job);
  }
}

mole_status ops_mm_reserve(mole_model *m) {
  int64_t max_k = 0;
  for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
    const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
    if (t->n_dims >= 2) max_k = MOLE_MAX(max_k, t->ne[0]);
  }
  return mole_pool_reserve(m->pool, quant_scratch_bytes(max_k));
}

typedef struct {
  quant_type vt;
  const float *x;
  int64_t ldx, n, k;
  void *out;
  size_t ostride;
} cv_job;

static void cv_worker(void *ctx, int ith, int nth) {
  const cv_job *j = ctx;
  const quant_traits *tr = quant_traits_of(j->vt);
  int64_t r0, r1;
  mole_split(j->n, ith, nth, &r0, &r1);
  for (int64_t r = r0; r < r1; r++) tr->from_float(j->x + r * j->ldx, (char *)j->out + (size_t)r * j->ostride, j->k);
}

void ops_convert_rows(mole_pool *pool, quant_type vt, const float *x, int64_t ldx, int64_t n, int64_t k, void *out,
                      size_t ostride) {
  cv_job j = {vt, x, ldx, n, k, out, ostride};
  if (n * k < 65536 || n == 1)
    cv_worker(&j, 0, 1);
  else
    mole_pool_run(pool, cv_worker, &j);
}

void ops_topk(const float *p, int64_t n, int64_t k, int32_t *sel, float *w) {
  for (int64_t j = 0; j < k; j++) {
    int32_t best = -1;
    for (int64_t e = 0; e < n; e++) {
      bool taken = false;
      for (int64_t i = 0; i < j; i++) taken = taken || sel[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
    }
    sel[j] = best;
    w[j] = p[best];
  }
}

void ops_softmax(float *x, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    x[i] *= scale;
    mx = x[i] > mx ? x[i] : mx;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = expf(x[i] - mx);
    sum += x[i];
  }
  const float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
