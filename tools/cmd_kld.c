// mole kld: quality of an approximate configuration (mixed precision, skipped
// experts, another quantization) against a reference, as the KL divergence
// and top-1 agreement of the next-token distributions over generated text.
// The reference model generates (sampling with a seed); the test model is fed
// the same tokens in lockstep, one decode step each.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole kld -m FILE [model/offload flags] [--ref FILE] [-n N] [--seed S] [--json]\n"
    "KL divergence KL(ref || test) and top-1 agreement over N generated positions.\n"
    "The test model is -m FILE with the given flags (e.g. --t1 0.2 --t2 0.6, --expert-budget);\n"
    "the reference is --ref FILE (default: the same file), fully resident, high precision.\n" CLI_MODEL_HELP
    "      --ref FILE       reference model (default: -m)\n"
    "  -n, --positions N    positions to compare (default: 2000)\n"
    "      --prompt LIST    starting token ids (default: 1)\n"
    "      --temp T         sampling temperature of the reference's text (default: 1.0)\n"
    "      --seed S         sampling seed (default: 1)\n"
    "      --json           one JSON object on stdout\n";

static void log_softmax(const float *x, double *out, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
  const double ls = log(s) + mx;
  for (int64_t i = 0; i < n; i++) out[i] = (double)x[i] - ls;
}

static int64_t argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int cmd_kld(int argc, char **argv) {
  cli_model_opts mo = {0};
  const char *ref_path = NULL, *prompt = "1";
  int64_t n_pos = 2000, seed = 1;
  double temp = 1.0;
  bool json = false;
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "--ref")) {
      if (!(ref_path = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--positions")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1 << 20, &n_pos)) return 2;
    } else if (!strcmp(a, "--prompt")) {
      if (!(prompt = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--temp")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0, 100, &temp)) return 2;
    } else if (!strcmp(a, "--seed")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, INT64_MAX, &seed)) return 2;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else {
      return cli_usage_error("kld", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("kld", "-m FILE is required");
  int32_t *toks;
  int64_t np;
  if (cli_parse_tokens("--prompt", prompt, &toks, &np)) return 2;
  if (!mo.ctx) mo.ctx = np + n_pos + 1;
  // the reference: the same context/threads, every other setting at its default
  // (all experts, high precision: offloading at T1 = T2 = 1 gives the resident logits)
  cli_model_opts ro = {.model = ref_path ? ref_path : mo.model, .threads = mo.threads, .ctx = mo.ctx,
                       .batch = mo.batch, .kv_type = mo.kv_type};
  int rc = 1;
  mole_model *mt = NULL, *mr = NULL;
  mole_session *st_ = NULL, *sr = NULL;
  mole_sampler *smp = NULL;
  float *lt = NULL, *lr = NULL;
  double *pt = NULL, *pr = NULL, *kls = NULL;
  if (cli_open(&ro, &mr, &sr) || cli_open(&mo, &mt, &st_)) goto done;
  const int64_t V = mole_model_n_vocab(mt);
  if (mole_model_n_vocab(mr) != V) {
    fprintf(stderr, "mole kld: vocabularies differ (%lld vs %lld tokens)\n", (long long)V,
            (long long)mole_model_n_vocab(mr));
    rc = 2;
    goto done;
  }
  mole_sampler_params sp = mole_sampler_default_params();
  sp.temperature = (float)temp;
  sp.top_k = 0;
  sp.top_p = 1;
  sp.min_p = 0;
  sp.seed = (uint64_t)seed;
  mole_status s;
  if ((s = mole_sampler_new(&sp, V, &smp))) {
    rc = cli_error("kld", s);
    goto done;
  }
  lt = malloc((size_t)V * sizeof *lt);
  lr = malloc((size_t)V * sizeof *lr);
  pt = malloc((size_t)V * sizeof *pt);
  pr = malloc((size_t)V * sizeof *pr);
  kls = malloc((size_t)n_pos * sizeof *kls);
  if (!lt || !lr || !pt || !pr || !kls) goto done;
  if ((s = mole_session_eval(sr, toks, np, lr, false)) || (s = mole_session_eval(st_, toks, np, lt, false))) {
    rc = cli_error("kld", s);
    goto done;
  }
  int64_t agree = 0;
  double kl_sum = 0;
  for (int64_t p = 0; p < n_pos; p++) {
    log_softmax(lr, pr, V);
    log_softmax(lt, pt, V);
    double kl = 0;
    for (int64_t i = 0; i < V; i++) kl += exp(pr[i]) * (pr[i] - pt[i]);
    kls[p] = kl > 0 ? kl : 0;
    kl_sum += kls[p];
    agree += argmax(lr, V) == argmax(lt, V);
    if (p + 1 == n_pos) break;
    int32_t tok = mole_sampler_sample(smp, lr);
    if ((s = mole_session_eval(sr, &tok, 1, lr, false)) || (s = mole_session_eval(st_, &tok, 1, lt, false))) {
      rc = cli_error("kld", s);
      goto done;
    }
  }
  qsort(kls, (size_t)n_pos, sizeof *kls, cmp_double);
  const double mean = kl_sum / (double)n_pos, p99 = kls[(int64_t)((double)(n_pos - 1) * 0.99)],
               top1 = (double)agree / (double)n_pos;
  if (json)
    printf("{\"positions\": %lld, \"kld_mean\": %.6g, \"kld_median\": %.6g, \"kld_p99\": %.6g, \"kld_max\": %.6g, "
           "\"top1_agreement\": %.6f}\n",
           (long long)n_pos, mean, kls[n_pos / 2], p99, kls[n_pos - 1], top1);
  else
    printf("positions %lld: KL mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%%\n",
           (long long)n_pos, mean, kls[n_pos / 2], p99, kls[n_pos - 1], 100 * top1);
  rc = 0;
done:
  free(toks);
  free(lt);
  free(lr);
  free(pt);
  free(pr);
  free(kls);
  mole_sampler_free(smp);
  mole_session_free(st_);
  mole_session_free(sr);
  mole_model_free(mt);
  mole_model_free(mr);
  return rc;
}
