// quant_bench: GB/s of vec_dot over a 64 MiB weight matrix (decode: each row
// once per token), 1 and 2 threads; GMAC/s of quant_gemm (prefill).
// usage: quant_bench [-c] [type ...]   (default q4_0 q8_0 q4_k q6_k)
//   -c: a 1 MiB matrix (cache resident): kernel throughput without DRAM
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "quant/quant.h"

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
  double cpu;  // thread CPU seconds
} job;

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run_job(void *p) {
  job *j = p;
  double c0 = cpu_now();
  for (int r = 0; r < j->reps; r++) {
    if (j->n_tok > 0) {
      quant_gemm(quant_type_from_name(j->tr->name), j->W, j->rs, j->x, j->xs, j->y, j->ldy, j->r0, j->r1, j->n_tok,
                 j->k);
    } else {
      for (int64_t i = j->r0; i < j->r1; i++) j->tr->vec_dot(j->k, &j->y[i], j->W + (size_t)i * j->rs, j->x);
    }
  }
  j->cpu = cpu_now() - c0;
  return NULL;
}

// Seconds per thread of CPU time (max over threads): other processes on the
// machine steal wall time, not CPU time.
static double run(job *base, int nth) {
  pthread_t th[8];
  job jobs[8];
  int64_t rows = base->r1;
  for (int t = 0; t < nth; t++) {
    jobs[t] = *base;
    jobs[t].r0 = rows * t / nth;
    jobs[t].r1 = rows * (t + 1) / nth;
    pthread_create(&th[t], NULL, run_job, &jobs[t]);
  }
  double cpu = 0;
  for (int t = 0; t < nth; t++) {
    pthread_join(th[t], NULL);
    cpu = cpu > jobs[t].cpu ? cpu : jobs[t].cpu;
  }
  return cpu;
}

int main(int argc, char **argv) {
  const char *defs[] = {"q4_0", "q8_0", "q4_k", "q6_k"};
  size_t mat = 64u << 20;
  if (argc > 1 && strcmp(argv[1], "-c") == 0) {
    mat = 1u << 20;
    argc--;
    argv++;
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
    int64_t rows = (int64_t)(mat / rs);
    char *W = mole_aligned_alloc(64, rs * rows);
    float *f = mole_malloc(k * sizeof(float));
    uint64_t s = 1;
    for (int64_t i = 0; i < k; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      f[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    for (int64_t i = 0; i < rows; i++) tr->from_float(f, W + (size_t)i * rs, k);
    const int64_t n_tok = 128;
    char *X = mole_aligned_alloc(64, xs * n_tok);
    for (int64_t j = 0; j < n_tok; j++) vt->from_float(f, X + j * xs, k);
    float *y = mole_aligned_alloc(64, sizeof(float) * rows * n_tok);
    job jb = {.tr = tr, .W = W, .rs = rs, .x = X, .y = y, .r0 = 0, .r1 = rows, .k = k, .reps = mat < (8u << 20) ? 400 : 10};
    run(&jb, 1);  // warm
    for (int nth = 1; nth <= 2; nth++) {
      double sec = run(&jb, nth);
      printf("%-5s vec_dot %dT: %6.1f GB/s\n", tr->name, nth, (double)rs * rows * jb.reps / sec / 1e9);
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
      printf("%-5s gemm %dT (%lldx%lldx%lld): %6.1f GMAC/s\n", tr->name, nth, (long long)jg.r1, (long long)n_tok, (long long)k,
             macs / sec / 1e9);
    }
    mole_aligned_free(W);
    mole_aligned_free(X);
    mole_aligned_free(y);
    mole_free(f);
  }
  return 0;
}
