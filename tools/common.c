#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  fprintf(stderr, "mole %s: ", cmd);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see mole %s --help)\n", cmd);
  return 2;
}

int cli_output_clash(const char *cmd, const char *out_flag, const char *out, const char *in_flag, const char *in) {
  if (!mole_same_file(out, in)) return 0;
  return cli_usage_error(cmd, "%s %s and %s %s are the same file; writing it would destroy that input", out_flag, out,
                         in_flag, in);
}

int cli_error(const char *cmd, mole_status st) {
  fprintf(stderr, "mole %s: %s: %s\n", cmd, mole_status_str(st), mole_last_error());
  return 1;
}

const char *cli_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "mole %s: flag %s needs a value\n", argv[0], argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

int cli_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) {
    fprintf(stderr, "mole: %s: '%s' is not an integer\n", flag, s);
    return -1;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "mole: %s: %lld is out of range [%lld, %lld]\n", flag, v, (long long)lo, (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || v != v) {
    fprintf(stderr, "mole: %s: '%s' is not a number\n", flag, s);
    return -1;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "mole: %s: %g is out of range [%g, %g]\n", flag, v, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_tokens(const char *flag, const char *s, int32_t **out, int64_t *n) {
  int64_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  if (!ids) return -1;
  int64_t k = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p || (*end && *end != ',') || v < 0 || v > INT32_MAX) {
      fprintf(stderr, "mole: %s: element %lld of '%s' is not a token id\n", flag, (long long)k, s);
      free(ids);
      return -1;
    }
    ids[k++] = (int32_t)v;
    p = *end ? end + 1 : end;
  }
  if (k == 0) {
    fprintf(stderr, "mole: %s: no token ids given\n", flag);
    free(ids);
    return -1;
  }
  *out = ids;
  *n = k;
  return 0;
}

// The expert offloading flags of cli_model_flag.
static int cli_offload_flag(int argc, char **argv, int *i, cli_model_opts *o) {
  const char *a = argv[*i], *v;
  double d;
  if (!strcmp(a, "--expert-budget")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (mole_parse_budget(v, &o->expert_budget, &o->expert_budget_frac)) {
      fprintf(stderr, "mole: --expert-budget: %s\n", mole_last_error());
      return -1;
    }
    o->has_budget = true;
  } else if (!strcmp(a, "--cache-policy")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (mole_cache_policy_parse(v, NULL, false, NULL, NULL)) {
      fprintf(stderr, "mole: --cache-policy: '%s' is not lru, lfu, lhu, fld or hobbit\n", v);
      return -1;
    }
    o->cache_policy = v;
  } else if (!strcmp(a, "--cache-weights")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    const char *p = v;
    for (int k = 0; k < 4; k++) {
      char *end;
      errno = 0;
      double x = strtod(p, &end);
      if (errno || end == p || !(x >= 0 && x <= 1) || (k < 3 && *end != ',') || (k == 3 && *end)) {
        fprintf(stderr, "mole: --cache-weights: '%s' is not four numbers in [0, 1] (w_lru,w_lfu,w_lhu,w_fld)\n", v);
        return -1;
      }
      o->cache_weights[k] = (float)x;
      p = end + 1;
    }
    const float *w = o->cache_weights;
    const double sum = (double)w[0] + w[1] + w[2] + w[3];
    if (sum < 0.999 || sum > 1.001) {
      fprintf(stderr, "mole: --cache-weights: '%s' sums to %g, expected 1\n", v, sum);
      return -1;
    }
    o->has_weights = true;
  } else if (!strcmp(a, "--io")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (strcmp(v, "uring") && strcmp(v, "pread")) {
      fprintf(stderr, "mole: --io: '%s' is not uring or pread\n", v);
      return -1;
    }
    o->io = v;
  } else if (!strcmp(a, "--t1") || !strcmp(a, "--t2")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_f64(a, v, 0, 1, &d)) return -1;
    if (a[3] == '1') {
      o->t1 = (float)d;
      o->has_t1 = true;
    } else {
      o->t2 = (float)d;
      o->has_t2 = true;
    }
  } else if (!strcmp(a, "--prefetch-depth")) {
    int64_t x;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(v, "auto")) x = -1;
    else if (cli_parse_i64(a, v, -1, 4, &x)) return -1;
    o->prefetch_depth = (int)x;
    o->has_prefetch = true;
  } else if (!strcmp(a, "--trace-routing")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    o->trace_routing = v;
  } else {
    return 0;
  }
  return 1;
}

int cli_model_flag(int argc, char **argv, int *i, cli_model_opts *o) {
  const char *a = argv[*i], *v;
  int64_t x;
  if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    o->model = v;
  } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, 1024, &x)) return -1;
    o->threads = (int)x;
  } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, (int64_t)1 << 24, &o->ctx)) return -1;
  } else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, 65536, &o->batch)) return -1;
  } else if (!strcmp(a, "--kv-type")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(v, "f16")) o->kv_type = MOLE_KV_F16;
    else if (!strcmp(v, "f32")) o->kv_type = MOLE_KV_F32;
    else {
      fprintf(stderr, "mole: --kv-type: '%s' is not f16 or f32\n", v);
      return -1;
    }
  } else if (!strcmp(a, "--kv-budget")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, (int64_t)1 << 24, &o->kv_budget)) return -1;
  } else if (!strcmp(a, "--kv-recent")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, (int64_t)1 << 24, &o->kv_recent)) return -1;
    o->has_kv_recent = true;
  } else if (!strcmp(a, "--kv-sinks")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, (int64_t)1 << 24, &o->kv_sinks)) return -1;
    o->has_kv_sinks = true;
  } else if (!strcmp(a, "--kv-policy")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    static const char *const names[] = {"full", "streaming", "h2o", "locret"};
    int k = 0;
    while (k < 4 && strcmp(v, names[k])) k++;
    if (k == 4) {
      fprintf(stderr, "mole: --kv-policy: '%s' is not full, streaming, h2o or locret\n", v);
      return -1;
    }
    o->kv_policy = (mole_kv_policy)(MOLE_KV_POLICY_FULL + k);
  } else if (!strcmp(a, "--kv-decay")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_f64(a, v, 0, 1e6, &o->kv_decay)) return -1;
    o->has_kv_decay = true;
  } else if (!strcmp(a, "--retain")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    o->kv_retain = v;
  } else if (!strcmp(a, "--mmap")) {
    o->use_mmap = true;
  } else if (!strcmp(a, "--parallel")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(v, "tp")) o->parallel = MOLE_PARALLEL_TP;
    else if (!strcmp(v, "hmp")) o->parallel = MOLE_PARALLEL_HMP;
    else {
      fprintf(stderr, "mole: --parallel: '%s' is not hmp or tp\n", v);
      return -1;
    }
  } else if (!strcmp(a, "--plan")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    o->plan = v;
  } else if (!strcmp(a, "--no-overlap")) {
    o->no_overlap = true;
  } else if (!strcmp(a, "--disagg")) {
    if (!(v = cli_value(argc, argv, i))) return -1;
    int na = 0, ne = 0, used = 0;
    if (!strcmp(v, "colocated")) {
      o->disagg_coloc = true;
    } else if (sscanf(v, "attn=%d,expert=%d%n", &na, &ne, &used) == 2 && v[used] == 0 && na >= 1 && ne >= 1 &&
               na <= 64 && ne <= 64) {
      o->disagg_attn = na;
      o->disagg_expert = ne;
    } else {
      fprintf(stderr, "mole: --disagg: '%s' is not attn=A,expert=E (A, E in 1..64) or colocated\n", v);
      return -1;
    }
  } else if (!strcmp(a, "--micro-batches")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 1, 16, &o->micro_batches)) return -1;
  } else if (!strcmp(a, "--no-ping-pong")) {
    o->no_ping_pong = true;
  } else {
    return cli_offload_flag(argc, argv, i, o);
  }
  return 1;
}

int cli_load_model(const cli_model_opts *o, mole_model **m) {
  *m = NULL;
  if (!o->model) return cli_usage_error("", "no model given (-m FILE)");
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = o->threads;
  mp.use_mmap = o->use_mmap;
  mole_offload_params *off = &mp.offload;
  if (o->has_budget) {
    off->expert_budget = o->expert_budget;
    off->expert_budget_frac = o->expert_budget_frac;
  }
  if (o->cache_policy) off->cache_policy = o->cache_policy;
  if (o->has_weights) memcpy(off->cache_weights, o->cache_weights, sizeof off->cache_weights);
  if (o->io) off->io = o->io;
  if (o->has_t1) off->t1 = o->t1;
  if (o->has_t2) off->t2 = o->t2;
  // one threshold alone: keep t1 <= t2 (--t1 0 means "only the top-1 in high")
  if (o->has_t1 && !o->has_t2 && off->t2 < off->t1) off->t2 = off->t1;
  if (o->has_t2 && !o->has_t1 && off->t1 > off->t2) off->t1 = off->t2;
  if (o->has_prefetch) off->prefetch_depth = o->prefetch_depth;
  if (o->trace_routing) off->trace_routing = o->trace_routing;
  off->session_ctx = o->ctx;  // so `auto` leaves room for this session
  off->session_batch = o->batch;
  off->session_count = o->sessions;
  off->session_kv_type = o->kv_type;
  const bool disagg = o->disagg_attn > 0 || o->disagg_coloc;
  const bool dist = mole_dist_size() > 1 || o->parallel != MOLE_PARALLEL_NONE || o->plan || disagg;
  if (dist && mole_dist_size() < 2) {
    fprintf(stderr, "mole: --parallel/--plan/--disagg: run under mpirun with 2 or more processes (mpirun -np N mole ...)\n");
    return 2;
  }
  if (!disagg && (o->micro_batches || o->no_ping_pong))
    return cli_usage_error("", "--micro-batches and --no-ping-pong go with --disagg");
  mp.parallel = o->parallel;
  mp.plan = o->plan;
  mp.no_overlap = o->no_overlap;
  mp.disagg_attn = o->disagg_coloc ? mole_dist_size() : o->disagg_attn;
  mp.disagg_expert = o->disagg_coloc ? mole_dist_size() : o->disagg_expert;
  mp.micro_batches = (int)o->micro_batches;
  mp.no_ping_pong = o->no_ping_pong;
  mole_status st = dist ? mole_dist_model_load(o->model, &mp, m) : mole_model_load(o->model, &mp, m);
  if (st) return cli_error("load", st);
  if (dist && mole_dist_rank() != 0) {
    // this rank computes its share of rank 0's passes until rank 0 frees the
    // model; then the process ends here (the command's own work is rank 0's)
    st = mole_dist_worker(*m);
    if (st) cli_error("worker", st);
    mole_model_free(*m);
    mole_dist_finalize();
    exit(st ? 1 : 0);
  }
  return 0;
}

mole_session_params cli_session_params(const cli_model_opts *o) {
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = o->ctx;
  sp.n_batch = o->batch;
  sp.kv_type = o->kv_type;
  sp.kv_budget = o->kv_budget;
  if (o->has_kv_recent) sp.kv_recent = o->kv_recent;
  if (o->has_kv_sinks) sp.kv_sinks = o->kv_sinks;
  sp.kv_policy = o->kv_policy;
  sp.kv_retain = o->kv_retain;
  if (o->has_kv_decay) sp.kv_decay = (float)o->kv_decay;
  return sp;
}

int cli_open(const cli_model_opts *o, mole_model **m, mole_session **s) {
  *s = NULL;
  int rc = cli_load_model(o, m);
  if (rc) return rc;
  const mole_session_params sp = cli_session_params(o);
  mole_status st = mole_session_new(*m, &sp, s);
  if (st) {
    mole_model_free(*m);
    *m = NULL;
    return cli_error("session", st);
  }
  return 0;
}

void cli_print_kv(const mole_session *s, FILE *f) {
  mole_kv_info k;
  mole_session_kv_info(s, &k);
  char decay[48] = "";
  if (k.decay > 0) snprintf(decay, sizeof decay, ", decay %g", (double)k.decay);
  if (k.budget > 0)
    fprintf(f, "kv cache: %s, budget %lld (recent %lld, sinks %lld%s), %lld of %lld slots in use after %lld positions, "
               "%lld entries evicted, %.2f MiB resident\n",
            k.policy, (long long)k.budget, (long long)k.recent, (long long)k.sinks, decay, (long long)k.used,
            (long long)k.capacity, (long long)k.n_past, (long long)k.evicted, (double)k.bytes / (1024.0 * 1024.0));
  else
    fprintf(f, "kv cache: full, %lld of %lld positions in use, %.2f MiB resident\n", (long long)k.used,
            (long long)k.capacity, (double)k.bytes / (1024.0 * 1024.0));
}
