// mole bench: prompt processing and generation speed, like llama-bench.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole bench -m FILE [-p N] [-n N] [-t N] [-r N] [--json]\n"
    "Measures prompt processing (pp) and token generation (tg) in tokens/s.\n" CLI_MODEL_HELP
    "  -p, --n-prompt N     prompt tokens, one batch (default: 128; 0 = skip)\n"
    "  -n, --n-gen N        generated tokens, one decode call each (default: 64; 0 = skip)\n"
    "  -r, --reps N         repetitions, the best is reported (default: 3)\n"
    "      --json           one JSON object on stdout\n"
    "      --seqs B         B sequences decoding together (the server's batched path): each gets a\n"
    "                       -p token prompt, then -n passes of one token each; aggregate tokens/s and\n"
    "                       time per output token (with --disagg: every rank's busy and idle time)\n";

static void fill_tokens(int32_t *t, int64_t n, int64_t V) {
  uint64_t s = 1234;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = (int32_t)((s >> 33) % (uint64_t)V);
  }
}

// B sequences through one batcher: prompts one sequence at a time, then ng
// passes of one token per sequence, timed; the best of reps.
static int bench_seqs(mole_model *m, const cli_model_opts *mo, int64_t B, int64_t np, int64_t ng, int64_t reps,
                      bool json) {
  const int64_t V = mole_model_n_vocab(m);
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = np + ng + 2;
  sp.kv_type = mo->kv_type;
  sp.n_threads = mo->threads;
  mole_session **ss = calloc((size_t)B, sizeof *ss);
  int32_t *tk = malloc((size_t)(B * (np + ng + 2)) * sizeof *tk);
  float *lg = malloc((size_t)(B * V) * sizeof *lg);
  mole_batch_item *it = malloc((size_t)B * sizeof *it);
  mole_batcher *b = NULL;
  mole_status st = ss && tk && lg && it ? MOLE_OK : MOLE_ERR_NOMEM;
  if (!st) st = mole_batcher_new(m, CLI_MAX(B, np + 1), sp.n_ctx, &b);
  for (int64_t i = 0; i < B && !st; i++) st = mole_session_new(m, &sp, &ss[i]);
  fill_tokens(tk, B * (np + ng + 2), V);
  enum { MAXR = 64 };
  mole_disagg_rank rk[MAXR], best_rk[MAXR];
  int nrk = 0;
  const bool disagg = mole_disagg_reset_stats(m) == MOLE_OK;
  double best = 0, sum = 0;
  for (int64_t r = 0; r < reps && !st; r++) {
    for (int64_t i = 0; i < B && !st; i++) {  // prompts (and the first token) one sequence at a time
      mole_session_reset(ss[i]);
      const int32_t *t = tk + i * (np + ng + 2);
      mole_batch_item one = {ss[i], t, np + 1, lg, false};
      st = mole_batcher_eval(b, &one, 1);
    }
    if (disagg) mole_disagg_reset_stats(m);
    const int64_t t0 = mole_time_us();
    for (int64_t k = 0; k < ng && !st; k++) {
      for (int64_t i = 0; i < B; i++)
        it[i] = (mole_batch_item){ss[i], tk + i * (np + ng + 2) + np + 1 + k, 1, lg + i * V, false};
      st = mole_batcher_eval(b, it, B);
    }
    const double sec = (double)(mole_time_us() - t0) / 1e6, tps = (double)(B * ng) / sec;
    if (!st && disagg) st = mole_disagg_stats(m, rk, MAXR, &nrk);
    sum += tps;
    if (tps > best) {
      best = tps;
      if (disagg) memcpy(best_rk, rk, sizeof rk);
    }
  }
  int rc = 0;
  if (st) {
    rc = cli_error("bench", st);
  } else if (json) {
    printf("{\"model\": \"%s\", \"threads\": %d, \"seqs\": %lld, \"n_prompt\": %lld, \"n_gen\": %lld, "
           "\"tg_tps\": %.2f, \"tg_tps_mean\": %.2f, \"tpot_ms\": %.3f, \"ranks\": [",
           mo->model, mo->threads, (long long)B, (long long)np, (long long)ng, best, sum / (double)reps,
           1e3 * (double)B / best);
    for (int i = 0; disagg && i < nrk; i++) {
      const mole_disagg_rank *q = &best_rk[i];
      printf("%s{\"attn\": %s, \"expert\": %s, \"passes\": %lld, \"pass_s\": %.4f, \"attn_s\": %.4f, "
             "\"expert_s\": %.4f, \"wait_s\": %.4f, \"bytes_sent\": %lld}",
             i ? ", " : "", q->attn ? "true" : "false", q->expert ? "true" : "false", (long long)q->passes, q->pass_s,
             q->attn_s, q->expert_s, q->wait_s, (long long)q->bytes_sent);
    }
    printf("]}\n");
  } else {
    printf("%lld sequences: %.2f tokens/s in all (mean of %lld: %.2f), %.2f ms per output token\n", (long long)B, best,
           (long long)reps, sum / (double)reps, 1e3 * (double)B / best);
    for (int i = 0; disagg && i < nrk; i++) {
      const mole_disagg_rank *q = &best_rk[i];
      printf("rank %d (%s): busy %.1f%% attention, %.1f%% experts; idle %.1f%% of %.3f s in %lld passes\n", i,
             q->attn && q->expert ? "attention+experts" : q->attn ? "attention" : "experts",
             100 * q->attn_s / q->pass_s, 100 * q->expert_s / q->pass_s, 100 * q->wait_s / q->pass_s, q->pass_s,
             (long long)q->passes);
    }
  }
  mole_batcher_free(b);
  for (int64_t i = 0; ss && i < B; i++) mole_session_free(ss[i]);
  free(ss);
  free(tk);
  free(lg);
  free(it);
  mole_model_free(m);
  return rc;
}


int cmd_bench(int argc, char **argv) {
  cli_model_opts mo = {0};
  int64_t np = 128, ng = 64, reps = 3, nseq = 0;
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
    } else if (!strcmp(a, "--seqs")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1024, &nseq)) return 2;
    } else {
      return cli_usage_error("bench", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("bench", "-m FILE is required");
  if (!mo.ctx) mo.ctx = np + ng + 1;
  if (!mo.batch) mo.batch = np > 0 ? np : 1;
  mole_model *m;
  if (nseq) {
    if (cli_load_model(&mo, &m)) return 1;
    return bench_seqs(m, &mo, nseq, np, ng, reps, json);
  }
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
