// mole bench: prompt processing and generation speed, like llama-bench.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/base.h"
#include "cli.h"
#include "common.h"

static const char *k_help =
    "usage: mole bench -m FILE [-p N] [-n N] [-t N] [-r N] [--json]\n"
    "Measures prompt processing (pp) and token generation (tg) in tokens/s.\n" CLI_MODEL_HELP
    "  -p, --n-prompt N     prompt tokens, one batch (default: 128; 0 = skip)\n"
    "  -n, --n-gen N        generated tokens, one decode call each (default: 64; 0 = skip)\n"
    "  -r, --reps N         repetitions, the best is reported (default: 3)\n"
    "      --json           one JSON object on stdout\n";

static void fill_tokens(int32_t *t, int64_t n, int64_t V) {
  uint64_t s = 1234;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = (int32_t)((s >> 33) % (uint64_t)V);
  }
}

int cmd_bench(int argc, char **argv) {
  cli_model_opts mo = {0};
  int64_t np = 128, ng = 64, reps = 3;
  bool json = false;
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 65536, &np)) return 2;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 65536, &ng)) return 2;
    } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1000, &reps)) return 2;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else {
      return cli_usage_error("bench", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("bench", "-m FILE is required");
  if (!mo.ctx) mo.ctx = np + ng + 1;
  if (!mo.batch) mo.batch = np > 0 ? np : 1;
  mole_model *m;
  mole_session *s;
  if (cli_open(&mo, &m, &s)) return 1;
  const int64_t V = mole_model_n_vocab(m);
  int32_t *toks = malloc((size_t)(np + ng + 1) * sizeof *toks);
  float *lg = malloc((size_t)V * sizeof *lg);
  fill_tokens(toks, np + ng + 1, V);
  double best_pp = 0, best_tg = 0, sum_pp = 0, sum_tg = 0;
  mole_status st = MOLE_OK;
  // warm-up: touch every weight once
  st = mole_session_eval(s, toks, 1, lg, false);
  for (int64_t r = 0; r < reps && !st; r++) {
    if (np > 0) {
      mole_session_reset(s);
      int64_t t0 = mole_time_us();
      st = mole_session_eval(s, toks, np, lg, false);
      double sec = (double)(mole_time_us() - t0) / 1e6;
      if ((double)np / sec > best_pp) best_pp = (double)np / sec;
      sum_pp += (double)np / sec;
    }
    if (ng > 0 && !st) {
      mole_session_reset(s);
      st = mole_session_eval(s, toks, 1, lg, false);
      int64_t t0 = mole_time_us();
      for (int64_t i = 0; i < ng && !st; i++) st = mole_session_eval(s, toks + 1 + i, 1, lg, false);
      double sec = (double)(mole_time_us() - t0) / 1e6;
      if ((double)ng / sec > best_tg) best_tg = (double)ng / sec;
      sum_tg += (double)ng / sec;
    }
  }
  int rc = 0;
  mole_kv_info kv;
  mole_session_kv_info(s, &kv);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  if (st) {
    rc = cli_error("bench", st);
  } else {
    char desc[256];
    mole_model_describe(m, desc, sizeof desc);
    if (json) {
      printf("{\"model\": \"%s\", \"threads\": %d, \"isa\": \"%s\", \"weights\": \"%s\", \"image_bytes\": %lld, "
             "\"n_prompt\": %lld, \"n_gen\": %lld, \"pp_tps\": %.2f, \"tg_tps\": %.2f, \"pp_tps_mean\": %.2f, "
             "\"tg_tps_mean\": %.2f, \"active_bytes\": %llu, \"peak_rss_bytes\": %lld, \"kv\": {\"policy\": \"%s\", "
             "\"budget\": %lld, \"capacity\": %lld, \"used\": %lld, \"evicted\": %lld, \"bytes\": %lld}, \"offload\": ",
             mo.model, mo.threads, mole_isa(), mo.use_mmap ? "mmap" : "image", (long long)mole_model_image_bytes(m),
             (long long)np, (long long)ng, best_pp, best_tg, sum_pp / (double)reps, sum_tg / (double)reps,
             (unsigned long long)mole_model_active_bytes(m), (long long)ru.ru_maxrss * 1024, kv.policy,
             (long long)kv.budget, (long long)kv.capacity, (long long)kv.used, (long long)kv.evicted, (long long)kv.bytes);
      mole_model_print_stats_json(m, stdout);
      printf("}\n");
    } else {
      printf("model: %s\n", desc);
      printf("weights read per generated token: %.1f MiB\n", (double)mole_model_active_bytes(m) / 1048576.0);
      printf("kernels: %s; weights: %s\n", mole_isa(), mo.use_mmap ? "mapped from the file" : "copied (image)");
      if (np > 0) printf("pp%-5lld %10.2f tokens/s (mean of %lld: %.2f)\n", (long long)np, best_pp, (long long)reps, sum_pp / (double)reps);
      cli_print_kv(s, stdout);
      if (ng > 0) printf("tg%-5lld %10.2f tokens/s (mean of %lld: %.2f)\n", (long long)ng, best_tg, (long long)reps, sum_tg / (double)reps);
    }
  }
  free(toks);
  free(lg);
  mole_session_free(s);
  mole_model_free(m);
  return rc;
}
