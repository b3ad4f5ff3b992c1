// batch_bench: decode throughput of B sequences stepping together through
// one mole_batcher (the server's engine without HTTP and prefill): tokens/s
// over all sequences and per sequence, for B = 1, 2, 4, 8, 16 (or only B =
// ONLY, for a profile of that batch).
// usage: batch_bench MODEL [threads] [steps] [ONLY]
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "mole.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: batch_bench MODEL [threads] [steps] [ONLY]\n");
    return 2;
  }
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = argc > 2 ? atoi(argv[2]) : 2;
  const int steps = argc > 3 ? atoi(argv[3]) : 32, only = argc > 4 ? atoi(argv[4]) : 0;
  mole_model *m;
  if (mole_model_load(argv[1], &mp, &m)) {
    fprintf(stderr, "batch_bench: %s\n", mole_last_error());
    return 1;
  }
  const int64_t V = mole_model_n_vocab(m);
  enum { BMAX = 16 };
  mole_batcher *b;
  if (mole_batcher_new(m, BMAX * 8, 256, &b)) return 1;
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = 256;
  mole_session *s[BMAX];
  for (int i = 0; i < BMAX; i++)
    if (mole_session_new(m, &sp, &s[i])) return 1;
  float *lg = malloc(sizeof(float) * (size_t)V * BMAX);
  double one = 0;
  printf("%8s %12s %14s %8s\n", "seqs", "tokens/s", "per sequence", "vs 1");
  for (int B = 1; B <= BMAX; B *= 2) {
    if (only > 0 && B != only) continue;
    int32_t tok[BMAX][8];
    mole_batch_item it[BMAX];
    for (int i = 0; i < B; i++) {  // an 8-token prompt each
      mole_session_reset(s[i]);
      for (int j = 0; j < 8; j++) tok[i][j] = (int32_t)((1 + 977 * i + 131 * j) % V);
      it[i] = (mole_batch_item){s[i], tok[i], 8, lg + (size_t)i * V, false};
    }
    if (mole_batcher_eval(b, it, B)) return 1;
    int64_t t0 = 0;
    for (int st = -2; st < steps; st++) {  // two warm-up steps
      if (st == 0) t0 = mole_time_us();
      for (int i = 0; i < B; i++) {
        tok[i][0] = (int32_t)((7 + 31 * (st + 2) + 101 * i) % V);
        it[i] = (mole_batch_item){s[i], tok[i], 1, lg + (size_t)i * V, false};
      }
      if (mole_batcher_eval(b, it, B)) {
        fprintf(stderr, "batch_bench: %s\n", mole_last_error());
        return 1;
      }
    }
    const double sec = (double)(mole_time_us() - t0) / 1e6, tps = (double)B * steps / sec;
    if (B == 1) one = tps;
    printf("%8d %12.1f %14.1f %7.2fx\n", B, tps, tps / B, tps / one);
    fflush(stdout);
  }
  for (int i = 0; i < BMAX; i++) mole_session_free(s[i]);
  mole_batcher_free(b);
  mole_model_free(m);
  free(lg);
  return 0;
}
