// mole cachesim: replays a routing trace (--trace-routing) through the expert
// cache with a budget and policy, to compare policies without the model.
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole cachesim --trace FILE --budget B [--cache-policy P|all] [--cache-weights W] [--prefetch] [--json]\n"
    "Replays a routing trace written by --trace-routing through the expert cache and prints\n"
    "hit rates and bytes read per token.\n"
    "  --trace FILE        the trace (required)\n"
    "  --budget B          RAM for experts: 512MiB, 2GiB, 40% (of what holding every expert takes) (required)\n"
    "  --cache-policy P    lru|lfu|lhu|fld|hobbit|belady (alias opt), or all (default: all)\n"
    "  --cache-weights W   hobbit's w_lru,w_lfu,w_lhu,w_fld (sum 1)\n"
    "  --prefetch          replay the predictor's prefetches (P records); belady ignores them\n"
    "  --json              one JSON object per policy\n"
    "belady is the offline optimum (MIN): it reads the trace's future and evicts the copy\n"
    "requested again farthest ahead, under the same pins and precision rules as the others.\n"
    "It loads on demand only, and its 'bound' caps the hits and hit rate of every policy\n"
    "without prefetch: exact with one precision; with two sharing the budget, MIN is a\n"
    "heuristic there and the bound a relaxation (any precision resident counts, max slots).\n";

// prefetch: the row replayed the P records; no_prefetch: --prefetch was asked, and this policy ignores it
static void print_result(const mole_cachesim_result *r, bool prefetch, bool no_prefetch, bool json) {
  const float *w = r->weights;
  const double nt = (double)CLI_MAX(r->tokens, 1);
  const int64_t hits = r->hits_high + r->hits_low, req = hits + r->misses_high + r->misses_low;
  const double hr = req ? (double)hits / (double)req : 0;
  const int64_t rh = r->hits_high + r->misses_high, rl = r->hits_low + r->misses_low;
  if (json) {
    printf("{\"policy\": \"%s\", \"weights\": [%g, %g, %g, %g], \"budget\": %lld, \"slots_high\": %lld, \"slots_low\": %lld, "
           "\"prefetch\": %s, \"steps\": %lld, \"tokens\": %lld, \"requests\": %lld, \"hit_rate\": %.4f, "
           "\"hits_high\": %lld, \"misses_high\": %lld, \"hits_low\": %lld, \"misses_low\": %lld, \"prefetch_hits\": %lld, "
           "\"prefetches\": %lld, \"prefetch_unused\": %lld, \"bytes_read\": %lld, \"bytes_per_token\": %.1f",
           r->policy, (double)w[0], (double)w[1], (double)w[2], (double)w[3], (long long)r->budget,
           (long long)r->slots_high, (long long)r->slots_low, prefetch ? "true" : "false", (long long)r->steps,
           (long long)r->tokens, (long long)req, hr, (long long)r->hits_high, (long long)r->misses_high,
           (long long)r->hits_low, (long long)r->misses_low, (long long)r->prefetch_hits, (long long)r->prefetches,
           (long long)r->prefetch_unused, (long long)r->bytes_read, (double)r->bytes_read / nt);
    if (r->bound_requests)
      printf(", \"bound_hits\": %lld, \"bound_requests\": %lld, \"bound_hit_rate\": %.4f, \"bound_exact\": %s",
             (long long)r->bound_hits, (long long)r->bound_requests, (double)r->bound_hits / (double)r->bound_requests,
             r->bound_exact ? "true" : "false");
    printf("}\n");
    return;
  }
  char a[32];
  printf("%-7s hit rate %6.2f%%  high %6.2f%% of %lld", r->policy, 100.0 * hr,
         rh ? 100.0 * (double)r->hits_high / (double)rh : 0, (long long)rh);
  if (r->slots_low) printf("  low %6.2f%% of %lld", rl ? 100.0 * (double)r->hits_low / (double)rl : 0, (long long)rl);
  printf("  misses/token %.2f  read/token %s", (double)(r->misses_high + r->misses_low) / nt,
         mole_format_bytes(a, sizeof a, (double)r->bytes_read / nt));
  if (prefetch) printf("  prefetched %lld (%lld unused)", (long long)r->prefetches, (long long)r->prefetch_unused);
  if (no_prefetch) printf("  demand loads only");
  if (r->bound_requests)
    printf("  bound %.2f%% (%s)", 100.0 * (double)r->bound_hits / (double)r->bound_requests,
           r->bound_exact ? "exact" : "relaxed");
  printf("\n");
}

int cmd_cachesim(int argc, char **argv) {
  const char *trace = NULL, *policy = "all";
  bool have_budget = false, prefetch = false, json = false, have_w = false;
  mole_cachesim_params sp = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "--trace")) {
      if (!(trace = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--budget") || !strcmp(a, "--expert-budget")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if (mole_parse_budget(v, &sp.budget, &sp.budget_frac) || sp.budget < 0 || (sp.budget == 0 && sp.budget_frac == 0))
        return cli_usage_error("cachesim", "%s: '%s' is not a budget (e.g. 512MiB, 2GiB, 40%%)", a, v);
      have_budget = true;
    } else if (!strcmp(a, "--cache-policy")) {
      if (!(policy = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--cache-weights")) {
      // the model flags' parser validates the list
      cli_model_opts mo = {0};
      if (cli_model_flag(argc, argv, &i, &mo) < 0) return 2;
      memcpy(sp.weights, mo.cache_weights, sizeof sp.weights);
      have_w = true;
    } else if (!strcmp(a, "--prefetch")) {
      prefetch = true;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else {
      return cli_usage_error("cachesim", "unknown flag '%s'", a);
    }
  }
  if (!trace) return cli_usage_error("cachesim", "--trace FILE is required");
  if (!have_budget) return cli_usage_error("cachesim", "--budget is required");
  sp.prefetch = prefetch;
  const bool all = !strcmp(policy, "all");
  if (all && have_w) return cli_usage_error("cachesim", "--cache-weights needs --cache-policy hobbit");
  int rc = 0;
  for (int64_t p = 0; mole_cache_policy_at(p) && rc == 0; p++) {
    sp.policy = all ? mole_cache_policy_at(p) : policy;
    if (mole_cache_policy_parse(sp.policy, sp.weights, true, NULL, NULL))
      return cli_usage_error("cachesim", "--cache-policy/--cache-weights: %s", mole_last_error());
    mole_cachesim_result r;
    mole_status st = mole_cachesim(trace, &sp, &r);
    if (st) return cli_error("cachesim", st);
    if (p == 0 && !json) {
      char a[32];
      printf("trace: %lld layers, %lld experts (%lld used), %lld steps, %lld tokens; budget %s: %lld high",
             (long long)r.n_layer, (long long)r.n_expert, (long long)r.n_used, (long long)r.steps, (long long)r.tokens,
             mole_format_bytes(a, sizeof a, (double)r.budget), (long long)r.slots_high);
      if (r.slots_low) printf(" + %lld low", (long long)r.slots_low);
      printf(" slots\n");
    }
    print_result(&r, prefetch && !r.offline, prefetch && r.offline, json);
    if (!all) break;
  }
  return rc;
}
