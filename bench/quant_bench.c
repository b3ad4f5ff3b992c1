// quant_bench: GB/s of vec_dot over a 64 MiB weight matrix (decode: each row
// once per token), 1 and 2 threads; the R16 layout at 1, 2, 4 and 8 tokens;
// GMAC/s of quant_gemm (prefill).
// usage: quant_bench [-c | -m MiB] [type ...]   (default q4_0 q8_0 q4_k q6_k)
//   -c: a 1 MiB matrix (cache resident): kernel throughput without DRAM
//   -m: matrix size (default 64 MiB; the L3 here is 300 MiB, use -m 1024 for DRAM)
// usage: quant_bench tq [-z ZERO_FRACTION] [-q] [-p PAIRS] [-d MiB]: weights/s of the TQ1 fused decode +
//   matmul against q4_0 and q8_0 (rows, and q4_0r / q8_0r: the R16 groups decode
//   uses) at Mixtral expert shapes (14336x4096,
//   4096x14336) and 256x256, 1 and 8 tokens, 1 and 2 threads (tq_bench below);
//   -q: TQ1 alone; -p N: runs of at most N pairs in the dictionary (15: the
//   packed table, 16: a narrow book's masks, 32: wide; default auto, as mole
//   compress); -d MiB: every case
//   cycles through copies of its matrix that take MiB in all (several times the
//   L3: weights from DRAM, as in decode of a real model).
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/pool.h"
#include "compress/codebook.h"
#include "quant/quant.h"
#include "quant/quant_tq.h"

typedef struct {
  const quant_traits *tr;
  const char *W;
  size_t rs;
  const void *x;
  float *y;
  int64_t r0, r1, k, ldy;
  int reps;
  int64_t n_tok;  // gemm mode when > 0
  size_t xs;
  quant_layout lay;  // QL_R16: W holds the matrix repacked
  const tq_book *book;  // TQ1: W is the blob, x float rows (tq mode)
  int copies;           // tq -d: W holds this many copies, wstride bytes apart; rep r reads copy r % copies
  size_t wstride;
  double cpu;  // thread CPU seconds
} job;

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run_job(void *p) {
  job *j = p;
  if (mole_scratch_reserve(quant_scratch_bytes(j->k))) {  // the kernels' scratch of this thread
    fprintf(stderr, "%s\n", mole_last_error());
    exit(1);
  }
  double c0 = cpu_now();
  for (int r = 0; r < j->reps; r++) {
    const char *W = j->W + (j->copies > 1 ? (size_t)(r % j->copies) * j->wstride : 0);
    if (j->book) {
      quant_tq1_gemm(j->book, W, j->ldy, j->x, j->xs, j->y, j->ldy, j->r0, j->r1, j->n_tok, j->k);
    } else if (j->n_tok > 0) {
      const quant_op op = {.n_rows = j->ldy};
      quant_gemm_op(quant_type_from_name(j->tr->name), j->lay, W, j->rs, j->x, j->xs, j->y, j->ldy, j->r0, j->r1,
                    j->n_tok, j->k, &op);
    } else {
      for (int64_t i = j->r0; i < j->r1; i++) j->tr->vec_dot(j->k, &j->y[i], W + (size_t)i * j->rs, j->x);
    }
  }
  j->cpu = cpu_now() - c0;
  return NULL;
}

// Seconds per thread of CPU time (max over threads; best of 5 runs): other
// processes on the machine steal wall time, not CPU time. Wall-clock rates
// are printed too (the honest number for 2 threads on a quiet machine).
static double g_wall;  // wall seconds of the best run
static double run1(job *base, int nth);
static double run(job *base, int nth) {  // best of 5
  double best = 1e30;
  g_wall = 1e30;
  for (int i = 0; i < 5; i++) {
    int64_t w0 = mole_time_us();
    double t = run1(base, nth);
    double w = (mole_time_us() - w0) * 1e-6;
    best = t < best ? t : best;
    g_wall = w < g_wall ? w : g_wall;
  }
  return best;
}

static double run1(job *base, int nth) {
  pthread_t th[8];
  job jobs[8];
  int64_t rows = base->r1;
  for (int t = 0; t < nth; t++) {
    jobs[t] = *base;
    jobs[t].r0 = rows / 16 * t / nth * 16;  // whole 16-row panels (R16 groups)
    jobs[t].r1 = t + 1 == nth ? rows : rows / 16 * (t + 1) / nth * 16;
    pthread_create(&th[t], NULL, run_job, &jobs[t]);
  }
  double cpu = 0;
  for (int t = 0; t < nth; t++) {
    pthread_join(th[t], NULL);
    cpu = cpu > jobs[t].cpu ? cpu : jobs[t].cpu;
  }
  return cpu;
}

static int tq_bench(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "tq") == 0) return tq_bench(argc - 1, argv + 1);
  const char *defs[] = {"q4_0", "q8_0", "q4_k", "q6_k"};
  size_t mat = 64u << 20;
  if (argc > 1 && strcmp(argv[1], "-c") == 0) {
    mat = 1u << 20;
    argc--;
    argv++;
  } else if (argc > 2 && strcmp(argv[1], "-m") == 0) {
    mat = (size_t)atol(argv[2]) << 20;
    argc -= 2;
    argv += 2;
  }
  int nt = argc > 1 ? argc - 1 : 4;
  const char **names = argc > 1 ? (const char **)argv + 1 : defs;
  quant_init();
  printf("isa %s\n", quant_isa_name());
  const int64_t k = 4096;
  for (int ti = 0; ti < nt; ti++) {
    int t = quant_type_from_name(names[ti]);
    const quant_traits *tr = t >= 0 ? quant_traits_of((quant_type)t) : NULL;
    if (!tr || !tr->vec_dot) {
      fprintf(stderr, "unknown weight type %s\n", names[ti]);
      return 1;
    }
    const quant_traits *vt = quant_traits_of(tr->vec_dot_type);
    size_t rs = quant_row_size((quant_type)t, k), xs = quant_row_size(tr->vec_dot_type, k);
    int64_t rows = (int64_t)(mat / rs) / 16 * 16;
    char *W = mole_aligned_alloc(64, rs * rows);
    float *f = mole_malloc(k * sizeof(float));
    uint64_t s = 1;
    for (int64_t i = 0; i < k; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      f[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    // every row different: identical pages could be merged by the host (KSM)
    // and then read from cache
    for (int64_t i = 0; i < rows; i++) {
      for (int64_t e = 0; e < k; e += 97) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        f[e] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
      }
      tr->from_float(f, W + (size_t)i * rs, k);
    }
    const int64_t n_tok = 128;
    char *X = mole_aligned_alloc(64, xs * n_tok);
    for (int64_t j = 0; j < n_tok; j++) vt->from_float(f, X + j * xs, k);
    float *y = mole_aligned_alloc(64, sizeof(float) * rows * n_tok);
    job jb = {.tr = tr, .W = W, .rs = rs, .x = X, .y = y, .r0 = 0, .r1 = rows, .k = k, .reps = mat < (8u << 20) ? 100 : mat > (256u << 20) ? 1 : 4};
    run(&jb, 1);  // warm
    for (int nth = 1; nth <= 2; nth++) {
      double sec = run(&jb, nth);
      double bytes = (double)rs * rows * jb.reps;
      printf("%-5s vec_dot %dT: %6.1f GB/s (wall %6.1f)\n", tr->name, nth, bytes / sec / 1e9, bytes / g_wall / 1e9);
    }
    job jv = jb;  // quant_gemm with one token (decode through the gemm entry)
    jv.n_tok = 1;
    jv.ldy = rows;
    jv.xs = xs;
    for (int nth = 1; nth <= 2; nth++) {
      double sec = run(&jv, nth);
      double bytes = (double)rs * rows * jv.reps;
      printf("%-5s gemv %dT: %6.1f GB/s (wall %6.1f)\n", tr->name, nth, bytes / sec / 1e9, bytes / g_wall / 1e9);
    }
    if (quant_r16_supported((quant_type)t, rows)) {  // the same on the R16 layout
      char *R = mole_aligned_alloc(64, rs * rows);
      quant_r16_pack((quant_type)t, W, R, k, rows, 0, rows / 16);
      job jr = jv;
      jr.W = R;
      jr.lay = QL_R16;
      run(&jr, 1);
      for (int nth = 1; nth <= 2; nth++) {
        double sec = run(&jr, nth);
        double bytes = (double)rs * rows * jr.reps;
        printf("%-5s gemv r16 %dT: %6.1f GB/s (wall %6.1f)\n", tr->name, nth, bytes / sec / 1e9, bytes / g_wall / 1e9);
      }
      for (int64_t n = 2; n <= 8; n *= 2) {  // batched decode (a few sequences): where compute starts to bind
        job jn = jr;
        jn.n_tok = n;
        const double sec = run(&jn, 1), bytes = (double)rs * rows * jn.reps;
        printf("%-5s gemm r16 1T %lld tokens: %6.1f GB/s, %6.1f GMAC/s\n", tr->name, (long long)n, bytes / sec / 1e9,
               (double)rows * k * n * jn.reps / sec / 1e9);
      }
      mole_aligned_free(R);
    }
    // gemm on a 1024-row slice, 128 tokens
    job jg = jb;
    jg.r1 = MOLE_MIN(rows, 1024);
    jg.ldy = jg.r1;
    jg.reps = 2;
    jg.n_tok = n_tok;
    jg.xs = xs;
    run(&jg, 1);
    for (int nth = 1; nth <= 2; nth++) {
      double sec = run(&jg, nth);
      double macs = (double)jg.r1 * n_tok * k * jg.reps;
      printf("%-5s gemm %dT (%lldx%lldx%lld): %6.1f GMAC/s (wall %6.1f)\n", tr->name, nth, (long long)jg.r1,
             (long long)n_tok, (long long)k, macs / sec / 1e9, macs / g_wall / 1e9);
    }
    mole_aligned_free(W);
    mole_aligned_free(X);
    mole_aligned_free(y);
    mole_free(f);
  }
  return 0;
}

// ---- tq mode ---------------------------------------------------------------------------
// Realistic ternary data: Gaussian rows, t = round(w / s) clipped to +-1 with
// s = max|w| (default) or, with -z Z, s chosen from the row's standard
// deviation so that a fraction Z of the weights is 0. The dictionary:
// compress/codebook.c on a sample of rows. q4_0 and q8_0 quantize the same w.

static double g_gauss_spare = 0;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd_u(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return ((g_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float rnd_gauss(void) {
  if (g_gauss_spare != 0) {
    const float r = (float)g_gauss_spare;
    g_gauss_spare = 0;
    return r;
  }
  const double u = rnd_u(), v = rnd_u(), r = sqrt(-2.0 * log(u));
  g_gauss_spare = r * sin(6.283185307179586 * v);
  return (float)(r * cos(6.283185307179586 * v));
}

// inverse of the standard normal CDF (Acklam's approximation, plenty here)
static double norm_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  if (p < 0.02425) {
    const double q = sqrt(-2 * log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - 0.02425) return -norm_quantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

typedef struct {
  int64_t n_rows, k;
  int8_t *t;           // [n_rows][k]
  float *scale;        // [n_rows]
  char *q4, *q8;       // the same rows as q4_0 and q8_0
  int64_t zeros;
} tq_mat;

static bool g_tq_only;  // tq -q: TQ1 alone (no q4_0/q8_0 to compare)
static int g_tq_pairs;  // tq -p N: the dictionary's longest run in pairs (default 0: auto, as mole compress)
static size_t g_tq_dram;  // tq -d MiB: each case's weights in copies of at least this many bytes in all

// Points j at copies of its weights (bytes of them) that take at least
// g_tq_dram bytes in all, so that every rep reads its matrix from DRAM; the
// copies go to *own (free it). Without -d, j is left alone.
static void tq_replicate(job *j, size_t bytes, char **own) {
  *own = NULL;
  if (!g_tq_dram || !j->W) return;
  const size_t stride = (bytes + 4095) & ~(size_t)4095;
  const int n = (int)MOLE_MAX(1, (g_tq_dram + stride - 1) / stride);
  char *w = mole_aligned_alloc(4096, stride * (size_t)n);
  for (int c = 0; c < n; c++) memcpy(w + (size_t)c * stride, j->W, bytes);
  j->W = w;
  j->copies = n;
  j->wstride = stride;
  *own = w;
}

static void tq_gen(tq_mat *m, int64_t n_rows, int64_t k, double zf) {
  m->n_rows = n_rows;
  m->k = k;
  m->t = mole_malloc((size_t)(n_rows * k));
  m->scale = mole_malloc((size_t)n_rows * sizeof(float));
  const size_t r4 = quant_row_size(QT_Q4_0, k), r8 = quant_row_size(QT_Q8_0, k);
  m->q4 = g_tq_only ? NULL : mole_aligned_alloc(64, r4 * n_rows);
  m->q8 = g_tq_only ? NULL : mole_aligned_alloc(64, r8 * n_rows);
  m->zeros = 0;
  float *w = mole_malloc((size_t)k * sizeof(float));
  const double zq = zf > 0 ? 2 * norm_quantile(1 - (1 - zf) / 2) : 0;
  for (int64_t r = 0; r < n_rows; r++) {
    double ss = 0;
    float mx = 0;
    for (int64_t j = 0; j < k; j++) {
      w[j] = rnd_gauss() * 0.02f;
      ss += (double)w[j] * w[j];
      mx = fmaxf(mx, fabsf(w[j]));
    }
    const float s = zf > 0 ? (float)(zq * sqrt(ss / k)) : mx;
    m->scale[r] = s;
    for (int64_t j = 0; j < k; j++) {
      int v = (int)lrintf(w[j] / s);
      v = v > 1 ? 1 : v < -1 ? -1 : v;
      m->t[r * k + j] = (int8_t)v;
      m->zeros += v == 0;
    }
    if (g_tq_only) continue;
    quant_traits_of(QT_Q4_0)->from_float(w, m->q4 + (size_t)r * r4, k);
    quant_traits_of(QT_Q8_0)->from_float(w, m->q8 + (size_t)r * r8, k);
  }
  mole_free(w);
}

static void tq_mat_free(tq_mat *m) {
  mole_free(m->t);
  mole_free(m->scale);
  mole_aligned_free(m->q4);
  mole_aligned_free(m->q8);
}

// The dictionary (compress/codebook.c) from rows of several matrices.
static tq_book *tq_build_book(const int8_t *const *rows, int64_t n_rows, const int64_t *ks, int64_t n_max) {
  cb_builder *cb = NULL;
  uint8_t *compact = NULL;
  int64_t n = 0;
  tq_book *b = NULL;
  mole_status st = cb_builder_new(4 << 20, &cb);
  for (int64_t r = 0; st == MOLE_OK && r < n_rows; r++) cb_builder_add_row(cb, rows[r], ks[r]);
  if (st == MOLE_OK) st = cb_builder_finish(cb, n_max, g_tq_pairs, &compact, &n, NULL);
  if (st == MOLE_OK) st = tq_book_new(compact, n, &b);
  if (st != MOLE_OK) fprintf(stderr, "tq book: %s\n", mole_last_error());
  mole_free(compact);
  cb_builder_free(cb);
  return b;
}

// Core clock in GHz: a chain of dependent adds (one cycle each).
static double core_ghz(void) {
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    const int64_t n = 100000000;
    uint64_t x = 0;
    const double c0 = cpu_now();
    for (int64_t i = 0; i < n; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double g = 4.0 * n / (cpu_now() - c0) / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

static int tq_bench(int argc, char **argv) {
  double zf = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-z") == 0 && i + 1 < argc) zf = atof(argv[++i]);
    if (strcmp(argv[i], "-q") == 0) g_tq_only = true;
    if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) g_tq_pairs = atoi(argv[++i]);
    if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) g_tq_dram = (size_t)atol(argv[++i]) << 20;
  }
  quant_init();
  const double ghz = core_ghz();
  printf("isa %s, core clock ~%.2f GHz, t = round(w/s) with %s\n", quant_isa_name(), ghz,
         zf > 0 ? "s from the row's std" : "s = max|w|");
  if (g_tq_dram)
    printf("weights from DRAM: each case cycles through copies of its matrix, %zu MiB in all\n", g_tq_dram >> 20);
  else
    printf("one copy of each matrix (cache resident when it fits the L3; -d MiB for DRAM)\n");
  const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}, {256, 256}};
  tq_mat mats[3];
  for (int i = 0; i < 3; i++) tq_gen(&mats[i], shapes[i][0], shapes[i][1], zf);
  // dictionary from a sample of rows of the two expert shapes
  const int64_t n_sample = 1024;
  const int8_t **rows = mole_malloc(n_sample * sizeof(*rows));
  int64_t *ks = mole_malloc(n_sample * sizeof(int64_t));
  for (int64_t r = 0; r < n_sample; r++) {
    const tq_mat *m = &mats[r % 2];
    const int64_t rr = (r / 2) * 7 % m->n_rows;
    rows[r] = m->t + rr * m->k;
    ks[r] = m->k;
  }
  tq_book *book = tq_build_book(rows, n_sample, ks, TQ_BOOK_MAX);
  mole_free(rows);
  mole_free(ks);
  if (!book) return 1;
  for (int i = 0; i < 3; i++) {
    tq_mat *m = &mats[i];
    const int64_t R = m->n_rows, k = m->k;
    const size_t bytes = tq1_encode(book, m->t, m->scale, R, k, NULL, 0);
    char *blob = mole_aligned_alloc(64, bytes);
    tq1_encode(book, m->t, m->scale, R, k, blob, bytes);
    char err[128];
    if (!tq1_check(book, blob, bytes, R, k, err, sizeof err)) {
      fprintf(stderr, "tq1_check: %s\n", err);
      return 1;
    }
    const double n_codes = (double)(bytes - tq1_codes_offset(R)) / 2, nw = (double)R * k;
    printf("\n%lldx%lld: %.1f%% zeros, %.3f bits/weight (blob %.2f MiB, q4_0 %.2f MiB), %.1f weights/code\n",
           (long long)R, (long long)k, 100.0 * m->zeros / nw, 8.0 * bytes / nw, bytes / 1048576.0,
           quant_row_size(QT_Q4_0, k) * R / 1048576.0, nw / n_codes);
    const int64_t n_tok_max = 8;
    float *X = mole_aligned_alloc(64, (size_t)(n_tok_max * k) * sizeof(float));
    for (int64_t e = 0; e < n_tok_max * k; e++) X[e] = rnd_gauss();
    const size_t x8s = quant_row_size(QT_Q8_0, k);
    char *X8 = mole_aligned_alloc(64, x8s * n_tok_max);
    for (int64_t j = 0; j < n_tok_max; j++) quant_traits_of(QT_Q8_0)->from_float(X + j * k, X8 + j * x8s, k);
    float *y = mole_aligned_alloc(64, (size_t)(R * n_tok_max) * sizeof(float));
    char *q4r = NULL, *q8r = NULL;
    if (!g_tq_only && quant_r16_preferred(QT_Q4_0, R)) {
      q4r = mole_aligned_alloc(64, quant_row_size(QT_Q4_0, k) * R);
      quant_r16_pack(QT_Q4_0, m->q4, q4r, k, R, 0, R / 16);
    }
    if (!g_tq_only && quant_r16_preferred(QT_Q8_0, R)) {
      q8r = mole_aligned_alloc(64, quant_row_size(QT_Q8_0, k) * R);
      quant_r16_pack(QT_Q8_0, m->q8, q8r, k, R, 0, R / 16);
    }
    const int reps = (int)MOLE_MAX(1, 1.5e9 / nw);
    const int64_t toks[] = {1, 8};
    for (int ti = 0; ti < 2; ti++) {
      const int64_t nt = toks[ti];
      job jt = {.W = blob, .x = X, .xs = (size_t)k * sizeof(float), .y = y, .r1 = R, .k = k, .ldy = R, .reps = reps,
                .n_tok = nt, .book = book, .tr = quant_traits_of(QT_Q4_0)};
      job j4 = {.tr = quant_traits_of(QT_Q4_0), .W = m->q4, .rs = quant_row_size(QT_Q4_0, k), .x = X8, .xs = x8s,
                .y = y, .r1 = R, .k = k, .ldy = R, .reps = reps, .n_tok = nt};
      job j8 = j4;
      j8.tr = quant_traits_of(QT_Q8_0);
      j8.W = m->q8;
      j8.rs = quant_row_size(QT_Q8_0, k);
      job j4r = j4, j8r = j8;  // the layout decode uses (R16 groups), when this ISA has its kernels
      j4r.W = q4r;
      j8r.W = q8r;
      j4r.lay = j8r.lay = QL_R16;
      struct {
        const char *name;
        job *j;
      } cases[] = {{"tq1", &jt}, {"q4_0", &j4}, {"q8_0", &j8}, {"q4_0r", &j4r}, {"q8_0r", &j8r}};
      const size_t wbytes[] = {bytes, quant_row_size(QT_Q4_0, k) * R, quant_row_size(QT_Q8_0, k) * R,
                               quant_row_size(QT_Q4_0, k) * R, quant_row_size(QT_Q8_0, k) * R};
      double gws[5][2] = {{0}};  // wall-clock G weights/s per case and thread count
      for (int c = 0; c < (g_tq_only ? 1 : 5); c++) {
        if (!cases[c].j->W) continue;
        char *own;
        tq_replicate(cases[c].j, wbytes[c], &own);
        run(cases[c].j, 1);  // warm
        for (int nth = 1; nth <= 2; nth++) {
          const double sec = run(cases[c].j, nth), wall = g_wall, w = nw * reps;
          gws[c][nth - 1] = w / wall / 1e9;
          printf("  %-5s n_tok %lld %dT: %7.2f GW/s (wall %7.2f)", cases[c].name, (long long)nt, nth, w / sec / 1e9,
                 w / wall / 1e9);
          if (c == 0) printf("  %5.2f cycles/code", sec * nth * ghz * 1e9 / (n_codes * reps));
          printf("\n");
        }
        mole_aligned_free(own);
      }
      // the ratio: TQ1 against the Q4_0 and Q8_0 layouts decode uses (wall clock, this run)
      for (int c = 3; c < 5; c++)
        if (gws[c][0] > 0)
          printf("  tq1 / %s n_tok %lld: %.2fx (1T), %.2fx (2T)\n", cases[c].name, (long long)nt,
                 gws[0][0] / gws[c][0], gws[0][1] / gws[c][1]);
    }
    mole_aligned_free(X);
    mole_aligned_free(X8);
    mole_aligned_free(y);
    mole_aligned_free(blob);
    mole_aligned_free(q4r);
    mole_aligned_free(q8r);
    tq_mat_free(m);
  }
  tq_book_free(book);
  return 0;
}
