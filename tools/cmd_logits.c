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
    "      --one-by-one     one decode call per token (the KV-cache path) instead of one batch\n"
    "      --seqs N         N sequences decoded together (the server's batched path): sequence i is the\n"
    "                       list rotated by 3i, its first 1 + (5i mod n/2) tokens one batch, then every\n"
    "                       sequence one token per pass; writes [N][n_tokens][n_vocab]\n";

// N sequences through one mole_batcher: the prompts together in one pass,
// then one token of every sequence per pass.
static mole_status eval_seqs(mole_model *m, const cli_model_opts *mo, const int32_t *ids, int64_t n, int64_t N,
                             float *lg) {
  const int64_t V = mole_model_n_vocab(m);
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = mo->ctx ? mo->ctx : n;
  sp.kv_type = mo->kv_type;
  mole_session **ss = calloc((size_t)N, sizeof *ss);
  int32_t *tk = malloc((size_t)(N * n) * sizeof *tk);
  mole_batch_item *it = malloc((size_t)N * sizeof *it);
  int64_t *np = malloc((size_t)N * sizeof *np);
  mole_batcher *b = NULL;
  mole_status st = ss && tk && it && np ? MOLE_OK : MOLE_ERR_NOMEM;
  if (!st) st = mole_batcher_new(m, N * n, sp.n_ctx, &b);
  for (int64_t i = 0; i < N && !st; i++) {
    st = mole_session_new(m, &sp, &ss[i]);
    for (int64_t t = 0; t < n; t++) tk[i * n + t] = ids[(t + 3 * i) % n];
    const int64_t half = n / 2 > 1 ? n / 2 : 1, p = 1 + (5 * i) % half;
    np[i] = p < n ? p : n;
  }
  for (int64_t i = 0; i < N && !st; i++) it[i] = (mole_batch_item){ss[i], tk + i * n, np[i], lg + i * n * V, true};
  if (!st) st = mole_batcher_eval(b, it, N);
  for (int64_t t = 1; t < n && !st; t++) {
    int64_t k = 0;
    for (int64_t i = 0; i < N; i++) {
      const int64_t p = np[i] + t - 1;
      if (p < n) it[k++] = (mole_batch_item){ss[i], tk + i * n + p, 1, lg + (i * n + p) * V, false};
    }
    if (k) st = mole_batcher_eval(b, it, k);
  }
  mole_batcher_free(b);
  for (int64_t i = 0; ss && i < N; i++) mole_session_free(ss[i]);
  free(ss);
  free(tk);
  free(it);
  free(np);
  return st;
}

int cmd_logits(int argc, char **argv) {
  cli_model_opts mo = {0};
  const char *toks = NULL, *outp = NULL;
  bool one = false;
  int64_t nseq = 0;
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
    } else if (!strcmp(a, "--seqs")) {
      const char *v = cli_value(argc, argv, &i);
      if (!v || cli_parse_i64(a, v, 1, 256, &nseq)) return 2;
    } else {
      return cli_usage_error("logits", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("logits", "-m FILE is required");
  if (!toks) return cli_usage_error("logits", "--tokens is required");
  if (!outp) return cli_usage_error("logits", "-o OUT is required");
  if (cli_output_clash("logits", "-o", outp, "-m", mo.model)) return 2;
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
  const int64_t rows = n * (nseq ? nseq : 1);
  float *lg = malloc((size_t)rows * (size_t)V * sizeof *lg);
  mole_status st = MOLE_OK;
  if (!lg) st = MOLE_ERR_NOMEM;
  else if (nseq)
    st = eval_seqs(m, &mo, ids, n, nseq, lg);
  else if (one)
    for (int64_t i = 0; i < n && !st; i++) st = mole_session_eval(s, ids + i, 1, lg + i * V, false);
  else
    st = mole_session_eval(s, ids, n, lg, true);
  if (st) {
    rc = cli_error("logits", st);
  } else {
    FILE *f = fopen(outp, "wb");
    if (!f || fwrite(lg, sizeof *lg * (size_t)V, (size_t)rows, f) != (size_t)rows || fclose(f) != 0) {
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
