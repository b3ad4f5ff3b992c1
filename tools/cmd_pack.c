// mole pack: rewrites a MoE GGUF as a packed expert store (docs/FORMAT.md).
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole pack IN.gguf -o OUT.gguf [--high TYPE] [--low TYPE|FILE]\n"
    "Writes a packed expert store: the model with every expert of every layer as one\n"
    "4 KiB-aligned region per precision (gate, up, down together), so one expert in one\n"
    "precision is one read. Non-expert tensors and metadata are copied unchanged.\n"
    "  -o FILE        output (required)\n"
    "  --high TYPE    type of the high-precision copies: keep (each matrix's source type,\n"
    "                 an exact copy), q8_0, q6_k, q5_k, q4_k, q5_0, q4_0, f16, ... (default: keep)\n"
    "  --low TYPE|FILE  type of the low-precision copies, or none (default: none), or a\n"
    "                 file whose experts are copied as they are: a compressed model of the\n"
    "                 same source (mole compress: ternary or 2-bit), or the same model in\n"
    "                 other tensor types (llama-quantize's IQ2_XXS, Q2_K, IQ4_XS, ... file:\n"
    "                 the types that need an importance matrix come this way); used for\n"
    "                 experts whose unimportance is in (t1, t2] (--t1, --t2)\n"
    "  -t N           threads (default: all cores)\n";

static int parse_type(const char *flag, const char *v, bool allow_keep, bool allow_none, int *out) {
  if (allow_keep && !strcmp(v, "keep")) {
    *out = -1;
    return 0;
  }
  if (allow_none && !strcmp(v, "none")) {
    *out = -1;
    return 0;
  }
  int t = mole_type_from_name(v);
  if (t < 0 || !mole_type_writable(t)) {
    fprintf(stderr, "mole pack: %s: '%s' is not a type mole can write and compute with (e.g. q8_0, q6_k, q4_k, q4_0%s)\n",
            flag, v, allow_keep ? ", keep" : ", none");
    return -1;
  }
  *out = t;
  return 0;
}

int cmd_pack(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  mole_pack_params p = mole_pack_default_params();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t x;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "-o")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--high")) {
      if (!(v = cli_value(argc, argv, &i)) || parse_type(a, v, true, false, &p.high)) return 2;
    } else if (!strcmp(a, "--low")) {  // the last --low decides
      if (!(v = cli_value(argc, argv, &i))) return 2;
      p.low_file = NULL;
      p.low = -1;
      if (mole_type_from_name(v) < 0 && strcmp(v, "none") && access(v, F_OK) == 0)
        p.low_file = v;  // a compressed model
      else if (parse_type(a, v, false, true, &p.low))
        return 2;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1024, &x)) return 2;
      p.n_threads = (int)x;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("pack", "unknown flag '%s'", a);
    } else if (!in) {
      in = a;
    } else {
      return cli_usage_error("pack", "more than one input file ('%s' and '%s')", in, a);
    }
  }
  if (!in) return cli_usage_error("pack", "no input model given");
  if (!out) return cli_usage_error("pack", "-o FILE is required");
  if (cli_output_clash("pack", "-o", out, "the input", in) || cli_output_clash("pack", "-o", out, "--low", p.low_file))
    return 2;
  mole_status st = mole_pack(in, out, &p, stderr);
  if (st) return cli_error("pack", st);
  return 0;
}
