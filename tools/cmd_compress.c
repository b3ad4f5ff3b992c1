// mole compress: QMoE compression of a MoE model's experts (engine/compress.h).
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole compress IN.gguf -o OUT.gguf --calib TEXT [options]\n"
    "Compresses every expert to under one bit per weight (QMoE): GPTQ on a ternary per-row\n"
    "grid with calibration text, layer by layer (each layer calibrated on the outputs of the\n"
    "layers already compressed), then a 2^16-entry dictionary code of ternary pair runs that\n"
    "the kernels decode inside the matrix-vector product. OUT is a packed expert store\n"
    "(docs/FORMAT.md): run it like any model, or give it to mole pack --low as the low tier.\n"
    "  -o FILE             output (required)\n"
    "  --calib TEXT        calibration text file (required unless --rtn)\n"
    "  --calib-tokens N    calibration tokens (default 16384)\n"
    "  --seq-len N         tokens per calibration sequence, BOS first (default 512)\n"
    "  --bits ternary|2    the grid: ternary {-s, 0, s} (default) or 2-bit s * (q - z)\n"
    "  --damp X            GPTQ dampening, a fraction of mean(diag H) (default 0.1)\n"
    "  --block N           GPTQ lazy-batch columns (default 128)\n"
    "  --rtn               round to nearest on the same grid instead of GPTQ (no calibration)\n"
    "  --act-order         GPTQ's columns by decreasing H diagonal: lower error, slightly fewer\n"
    "                      zeros (more bits) than column order (the default)\n"
    "  --cap X             an expert's calibration inputs are capped at X times the mean (default 4)\n"
    "  --dead-zone X       ternary: |w| <= X * s rounds to 0 (default 0.5, to nearest); larger is\n"
    "                      sparser: fewer bits per weight, more error (GPTQ and --rtn alike)\n"
    "  --code-weights N|auto  ternary: the most weights one code covers (even, 2..64). 30 or fewer\n"
    "                      decodes about 1.8x faster than 64 (one 256-bit window and one table\n"
    "                      entry a code; 32: 1.45x), 64 codes very sparse rows in fewer bits; auto\n"
    "                      (default): 30 unless 64 saves over 3% of the codes (on the dictionary's\n"
    "                      first selection)\n"
    "  -t N                threads (default: all cores)\n";

int cmd_compress(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  bool code_weights = false;  // --code-weights given (ternary only)
  mole_compress_params p = mole_compress_default_params();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t x;
    double d;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "-o")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--calib")) {
      if (!(p.calib = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--calib-tokens")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, (int64_t)1 << 26, &p.calib_tokens)) return 2;
    } else if (!strcmp(a, "--seq-len")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 2, 1 << 20, &p.seq_len)) return 2;
    } else if (!strcmp(a, "--bits")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if (!strcmp(v, "ternary")) p.grid = MOLE_COMPRESS_TERNARY;
      else if (!strcmp(v, "2")) p.grid = MOLE_COMPRESS_2BIT;
      else return cli_usage_error("compress", "--bits '%s': expected ternary or 2", v);
    } else if (!strcmp(a, "--damp")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 1e-6, 10, &d)) return 2;
      p.damp = (float)d;
    } else if (!strcmp(a, "--block")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 65536, &p.block)) return 2;
    } else if (!strcmp(a, "--cap")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 1, 1e6, &p.cap)) return 2;
    } else if (!strcmp(a, "--dead-zone")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0.5, 0.99, &d)) return 2;
      p.dead_zone = (float)d;
    } else if (!strcmp(a, "--code-weights")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      code_weights = true;
      if (!strcmp(v, "auto")) {
        p.code_weights = 0;
      } else {
        if (cli_parse_i64(a, v, 2, MOLE_COMPRESS_CODE_WEIGHTS_MAX, &x)) return 2;
        if (x % 2)
          return cli_usage_error("compress", "--code-weights %lld: must be even (codes cover pairs)", (long long)x);
        p.code_weights = (int)x;
      }
    } else if (!strcmp(a, "--act-order")) {
      p.act_order = true;
    } else if (!strcmp(a, "--rtn")) {
      p.rtn = true;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1024, &x)) return 2;
      p.n_threads = (int)x;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("compress", "unknown flag '%s'", a);
    } else if (!in) {
      in = a;
    } else {
      return cli_usage_error("compress", "more than one input file ('%s' and '%s')", in, a);
    }
  }
  if (!in) return cli_usage_error("compress", "no input model given");
  if (!out) return cli_usage_error("compress", "-o FILE is required");
  if (cli_output_clash("compress", "-o", out, "the input", in) || cli_output_clash("compress", "-o", out, "--calib", p.calib))
    return 2;
  if (!p.rtn && !p.calib) return cli_usage_error("compress", "--calib TEXT is required (or --rtn for round-to-nearest)");
  if (code_weights && p.grid != MOLE_COMPRESS_TERNARY)
    return cli_usage_error("compress", "--code-weights is for the ternary grid's dictionary code, not --bits 2");
  mole_status st = mole_compress(in, out, &p, stderr, stdout);
  if (st) return cli_error("compress", st);
  return 0;
}
