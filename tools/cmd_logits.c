// mole logits: raw logits of a token sequence, for conformance checks.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"

static const char *k_help =
    "usage: mole logits -m FILE --tokens 1,2,3 -o OUT.f32 [options]\n"
    "Writes float32 logits [n_tokens][n_vocab], row i after tokens[0..i], from an empty cache.\n" CLI_MODEL_HELP
    "      --tokens LIST    comma-separated token ids (required)\n"
    "  -o, --output FILE    output file (required)\n"
    "      --one-by-one     one decode call per token (the KV-cache path) instead of one batch\n";

int cmd_logits(int argc, char **argv) {
  cli_model_opts mo = {0};
  const char *toks = NULL, *outp = NULL;
  bool one = false;
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "--tokens")) {
      if (!(toks = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
      if (!(outp = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--one-by-one")) {
      one = true;
    } else {
      return cli_usage_error("logits", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("logits", "-m FILE is required");
  if (!toks) return cli_usage_error("logits", "--tokens is required");
  if (!outp) return cli_usage_error("logits", "-o OUT is required");
  int32_t *ids;
  int64_t n;
  if (cli_parse_tokens("--tokens", toks, &ids, &n)) return 2;
  mole_model *m;
  mole_session *s;
  if (cli_open(&mo, &m, &s)) {
    free(ids);
    return 1;
  }
  int rc = 0;
  const int64_t V = mole_model_n_vocab(m);
  float *lg = malloc((size_t)n * (size_t)V * sizeof *lg);
  mole_status st = MOLE_OK;
  if (!lg) st = MOLE_ERR_NOMEM;
  else if (one)
    for (int64_t i = 0; i < n && !st; i++) st = mole_session_eval(s, ids + i, 1, lg + i * V, false);
  else
    st = mole_session_eval(s, ids, n, lg, true);
  if (st) {
    rc = cli_error("logits", st);
  } else {
    FILE *f = fopen(outp, "wb");
    if (!f || fwrite(lg, sizeof *lg * (size_t)V, (size_t)n, f) != (size_t)n || fclose(f) != 0) {
      fprintf(stderr, "mole logits: cannot write '%s'\n", outp);
      rc = 1;
    }
  }
  free(lg);
  free(ids);
  mole_session_free(s);
  mole_model_free(m);
  return rc;
}
