// mole plan: each MPI process's shares of a model (src/parallel/dist_plan.c).
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"

static const char *k_help =
    "usage: mpirun -np N mole plan -m FILE [-o PLAN.json] [--parallel hmp|tp] [-t N]\n"
    "Profiles every process (how fast it streams weights through a matvec and multiplies a\n"
    "batch, the memory it may use: MemAvailable or its cgroup limit, its link to rank 0) and\n"
    "gives each its shares of heads, FFN columns, vocabulary rows and tokens in proportion to\n"
    "its speed, moving share away from a process whose share would not fit its memory.\n"
    "Run the model with the same processes and --plan PLAN.json.\n"
    "  -m FILE          the model\n"
    "  -o FILE          where rank 0 writes the plan (default: stdout)\n"
    "  --parallel M     hmp (default) or tp: whether tokens are shared too\n"
    "  -t N             threads per process (default: the cores shared by the processes)\n"
    "\n"
    "usage: mpirun -np N mole plan --disagg -m FILE [--seqs B] [--ctx C] [--max-tpot-ms X] [-o PLAN.json]\n"
    "Attention and experts on separate processes (MegaScale-Infer): profiles the attention side per\n"
    "batch size, the experts per rows and experts held, and the link, all processes at once; then\n"
    "searches the split (attn=A,expert=E or co-located), micro-batches (1..4, ping-pong or not) and\n"
    "batch size for the most tokens/s per process within the latency bound and every process's\n"
    "memory. Prints the flags to run it with; the JSON has the pick, the profile and every candidate.\n"
    "  --seqs B         the most sequences decoding together (default: 16)\n"
    "  --ctx C          their context (default: 256)\n"
    "  --max-tpot-ms X  the bound on time per output token (default: none)\n";

int cmd_plan(int argc, char **argv) {
  cli_model_opts mo = {0};
  const char *out = NULL;
  bool disagg = false;
  int64_t seqs = 16, ctx = 256;
  double tpot = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(k_help, stdout);
      return 0;
    }
    if (!strcmp(a, "--disagg")) {
      disagg = true;
      continue;
    }
    if (!strcmp(a, "--seqs") || !strcmp(a, "--ctx")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, !strcmp(a, "--seqs") ? 1024 : 1 << 20,
                                                            !strcmp(a, "--seqs") ? &seqs : &ctx))
        return 2;
      continue;
    }
    if (!strcmp(a, "--max-tpot-ms")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0, 1e9, &tpot)) return 2;
      continue;
    }
    if (!strcmp(a, "-o")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
      continue;
    }
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r == 0) return cli_usage_error("plan", "unknown option '%s'", a);
  }
  if (!mo.model) return cli_usage_error("plan", "no model given (-m FILE)");
  if (cli_output_clash("plan", "-o", out, "-m", mo.model)) return 2;
  if (mole_dist_size() < 2) return cli_usage_error("plan", "run it under mpirun with the processes to plan for");
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = mo.threads;
  mp.parallel = mo.parallel;
  mp.use_mmap = mo.use_mmap;
  mole_status st = disagg ? mole_disagg_plan(mo.model, &mp, seqs, ctx, tpot, out) : mole_dist_plan(mo.model, &mp, out);
  if (st) return cli_error("plan", st);
  if (mole_dist_rank() == 0 && out) fprintf(stderr, "mole plan: wrote %s\n", out);
  return 0;
}
