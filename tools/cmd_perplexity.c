// mole perplexity: perplexity of a text file, counted exactly as llama.cpp's
// llama-perplexity counts it, so the two numbers compare directly:
//   - the whole file (less one trailing '\n') is tokenized once, with BOS when
//     the vocabulary adds one, special tokens not parsed;
//   - it needs at least 2*n_ctx tokens; it is cut into floor(n / n_ctx) chunks
//     of n_ctx tokens (--chunks N takes the first N), the rest is dropped;
//   - each chunk is evaluated from an empty cache, its first token replaced by
//     BOS when the vocabulary adds BOS, in pieces of n_batch tokens;
//   - only the second half is scored: the logits at positions
//     first = n_ctx/2 .. n_ctx-2 against the tokens that follow them
//     (n_ctx - first - 1 per chunk), -log softmax in double;
//   - stdout: "[i]PPL," after each chunk (the running estimate), then
//     "Final estimate: PPL = exp(mean) +/- PPL * sqrt(var / (count - 1))".
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole perplexity -m FILE -f TEXT [-c N] [-b N] [--chunks N] [--ref FILE] [options]\n"
    "Perplexity of a text file, counted and chunked as llama.cpp's llama-perplexity does\n"
    "(chunks of -c tokens from an empty cache, BOS first when the vocabulary adds it, the\n"
    "second half of each chunk scored). Running estimates and the final line go to stdout,\n"
    "progress to stderr.\n" CLI_MODEL_HELP
    "  -f, --file FILE      the text (required); needs at least 2 * -c tokens\n"
    "      --chunks N       score only the first N chunks (default: -1, all)\n"
    "      --ref FILE       also compare every scored position with this reference model (same\n"
    "                       vocabulary, same flags but a full KV cache): KL(ref || model) and\n"
    "                       top-1 agreement (--ref FILE of the model itself with --kv-budget:\n"
    "                       the bounded cache against the full one)\n"
    "here -c defaults to 512 as in llama-perplexity (0 = the model's training context),\n"
    "and -b (tokens per forward pass, default 512) is at most -c.\n";

// The file's bytes (*n of them, NUL-terminated); NULL after printing why not.
static char *read_text(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "mole perplexity: -f: cannot open '%s': %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *b = malloc(cap + 1);
  while (b) {
    size_t k = fread(b + len, 1, cap - len, f);
    len += k;
    if (k == 0) break;
    if (len == cap) {
      char *nb = cap < MOLE_TOKENIZE_MAX_TEXT ? realloc(b, 2 * cap + 1) : NULL;
      if (!nb) {
        fprintf(stderr, "mole perplexity: -f: '%s' is too large (more than %zu bytes read)\n", path, len);
        free(b);
        fclose(f);
        return NULL;
      }
      b = nb;
      cap *= 2;
    }
  }
  const bool err = ferror(f);
  const int e = errno;
  fclose(f);
  if (!b) {
    fprintf(stderr, "mole perplexity: -f: out of memory reading '%s'\n", path);
    return NULL;
  }
  if (err) {
    fprintf(stderr, "mole perplexity: -f: cannot read '%s': %s\n", path, strerror(e));
    free(b);
    return NULL;
  }
  b[len] = 0;
  *n = len;
  return b;
}

// -log p(tok) from one row of logits, as llama-perplexity computes it: float
// max and differences, exp in float, the sum and the log in double.
static double nll_of(const float *lg, int64_t V, int32_t tok) {
  float mx = lg[0];
  for (int64_t i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < V; i++) sum += expf(lg[i] - mx);
  return -((double)(lg[tok] - mx) - log(sum));
}

// KL(p || q) of two rows of logits (reference p, model q) in double, and
// whether their argmaxes agree.
static double kl_of(const float *p, const float *q, int64_t V, bool *same) {
  double mp = p[0], mq = q[0];
  int64_t ap = 0, aq = 0;
  for (int64_t i = 1; i < V; i++) {
    if (p[i] > mp) mp = p[i], ap = i;
    if (q[i] > mq) mq = q[i], aq = i;
  }
  double sp = 0, sq = 0;
  for (int64_t i = 0; i < V; i++) {
    sp += exp((double)p[i] - mp);
    sq += exp((double)q[i] - mq);
  }
  const double lp = log(sp) + mp, lq = log(sq) + mq;
  double kl = 0;
  for (int64_t i = 0; i < V; i++) {
    const double a = (double)p[i] - lp;
    kl += exp(a) * (a - ((double)q[i] - lq));
  }
  *same = ap == aq;
  return kl > 0 ? kl : 0;
}

static int too_few(const char *path, int64_t n_tok, int64_t n_ctx) {
  fprintf(stderr,
          "mole perplexity: -f: '%s' tokenizes to only %lld tokens; a context of %lld (-c) needs at least %lld "
          "(2 * -c): give a longer text or a smaller -c\n",
          path, (long long)n_tok, (long long)n_ctx, (long long)(2 * n_ctx));
  return 1;
}

int cmd_perplexity(int argc, char **argv) {
  cli_model_opts mo = {.ctx = -1};  // -1: -c not given
  const char *path = NULL, *ref = NULL;
  int64_t n_chunks_max = -1;
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
      if (!(path = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--ref")) {
      if (!(ref = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--chunks")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, -1, INT32_MAX, &n_chunks_max)) return 2;
      if (n_chunks_max == 0) return cli_usage_error("perplexity", "--chunks: 0 chunks; give -1 (all) or N >= 1");
    } else {
      return cli_usage_error("perplexity", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("perplexity", "-m FILE is required");
  if (!path) return cli_usage_error("perplexity", "-f TEXT is required (the text to score)");
  if (mo.ctx < 0) mo.ctx = 512;
  if (mo.ctx > 0 && mo.ctx < 4)
    return cli_usage_error("perplexity", "-c: %lld is too small: a chunk needs at least 4 tokens (half context, "
                           "half scored)", (long long)mo.ctx);

  int rc = 1;
  char *text = NULL;
  mole_gguf *gf = NULL;
  mole_vocab *voc = NULL;
  int32_t *toks = NULL;
  int64_t n_tok = 0;
  mole_model *m = NULL;
  mole_session *s = NULL, *rs = NULL;
  mole_model *rm = NULL;
  float *lg = NULL, *rlg = NULL;
  mole_status st;
  size_t len = 0;
  if (!(text = read_text(path, &len))) goto done;
  if (len > 0 && text[len - 1] == '\n') len--;  // llama.cpp's -f drops one trailing newline
  // the tokenizer reads the model file's vocabulary
  if ((st = mole_gguf_open(mo.model, &gf)) || (st = mole_gguf_vocab(gf, &voc))) {
    rc = cli_error("perplexity", st);
    goto done;
  }
  mole_vocab_info vi;
  mole_vocab_get_info(voc, &vi);
  if (vi.add_eos) {
    fprintf(stderr, "mole perplexity: '%s': the vocabulary appends EOS to every text; llama-perplexity refuses "
                    "such models and so does this command\n", mo.model);
    goto done;
  }
  if ((st = mole_tokenize(voc, text, len, true, false, &toks, &n_tok))) {
    rc = cli_error("perplexity", st);
    goto done;
  }
  if (mo.ctx > 0 && n_tok < 2 * mo.ctx) {  // before loading the weights: fail fast
    rc = too_few(path, n_tok, mo.ctx);
    goto done;
  }
  if (mo.ctx == 0) {  // the model's training context, as the loader reads it (default 4096)
    const char *arch = NULL;
    char key[128];
    int64_t train = 4096;
    if (!mole_gguf_get_str(gf, "general.architecture", &arch) && arch) {
      snprintf(key, sizeof key, "%s.context_length", arch);
      if (mole_gguf_find_kv(gf, key) >= 0 && (st = mole_gguf_get_int(gf, key, &train))) {
        rc = cli_error("perplexity", st);
        goto done;
      }
    }
    if (train < 4 || train > ((int64_t)1 << 24)) {
      fprintf(stderr, "mole perplexity: '%s': training context %lld is unusable here; give -c N\n", mo.model,
              (long long)train);
      goto done;
    }
    mo.ctx = train;
    if (n_tok < 2 * mo.ctx) {
      rc = too_few(path, n_tok, mo.ctx);
      goto done;
    }
  }
  mole_gguf_close(gf);  // the tokenizer keeps its own copy; the model maps the file again
  gf = NULL;
  const int64_t n_ctx = mo.ctx;
  const int64_t n_batch = mo.batch > 0 ? CLI_MIN(mo.batch, n_ctx) : CLI_MIN(512, n_ctx);
  mo.batch = n_batch;
  if (cli_open(&mo, &m, &s)) goto done;
  const int64_t V = mole_model_n_vocab(m);
  if (ref) {
    cli_model_opts ro = mo;
    ro.model = ref;
    ro.kv_budget = 0;  // the reference keeps its full KV cache
    ro.kv_policy = MOLE_KV_POLICY_AUTO;
    ro.kv_retain = NULL;
    ro.has_kv_recent = ro.has_kv_sinks = false;
    if (cli_open(&ro, &rm, &rs)) goto done;
    if (mole_model_n_vocab(rm) != V) {
      fprintf(stderr, "mole perplexity: --ref '%s' has %lld tokens in its vocabulary, '%s' %lld\n", ref,
              (long long)mole_model_n_vocab(rm), mo.model, (long long)V);
      goto done;
    }
  }
  for (int64_t i = 0; i < n_tok; i++)
    if (toks[i] < 0 || toks[i] >= V) {
      fprintf(stderr, "mole perplexity: token %d at index %lld is outside the model's vocabulary (0..%lld)\n",
              toks[i], (long long)i, (long long)V - 1);
      goto done;
    }
  if (n_ctx > mole_model_n_ctx_train(m))
    fprintf(stderr, "mole perplexity: warning: the model was trained on only %lld context tokens (-c %lld)\n",
            (long long)mole_model_n_ctx_train(m), (long long)n_ctx);
  const bool add_bos = vi.add_bos && vi.bos >= 0;
  const int32_t bos = vi.bos;
  int64_t n_chunk = n_tok / n_ctx;
  if (n_chunks_max > 0 && n_chunks_max < n_chunk) n_chunk = n_chunks_max;
  const int64_t first = n_ctx / 2;
  fprintf(stderr, "mole perplexity: '%s': %lld tokens, %lld chunks of %lld (batch %lld), scoring %lld tokens each\n",
          path, (long long)n_tok, (long long)n_chunk, (long long)n_ctx, (long long)n_batch,
          (long long)(n_ctx - first - 1));
  if (!(lg = malloc((size_t)n_batch * (size_t)V * sizeof *lg)) ||
      (ref && !(rlg = malloc((size_t)n_batch * (size_t)V * sizeof *rlg)))) {
    fprintf(stderr, "mole perplexity: out of memory for the logits of %lld tokens\n", (long long)n_batch);
    goto done;
  }
  double nll = 0, nll2 = 0, kld = 0, kld2 = 0;
  int64_t count = 0, same_top = 0;
  const bool tty = isatty(fileno(stderr));  // progress on one line on a terminal
  const int64_t t_start = mole_time_us();
  for (int64_t c = 0; c < n_chunk; c++) {
    int32_t *chunk = toks + c * n_ctx;
    const int32_t tok0 = chunk[0];
    if (add_bos) chunk[0] = bos;  // evaluated with BOS first; scored against the text
    mole_session_reset(s);
    if (rs) mole_session_reset(rs);
    st = MOLE_OK;
    for (int64_t b0 = 0; b0 < n_ctx && !st; b0 += n_batch) {
      const int64_t nb = CLI_MIN(n_batch, n_ctx - b0);
      const bool scored = b0 + nb > first;  // some row of this piece is a scored position
      st = mole_session_eval(s, chunk + b0, nb, scored ? lg : NULL, true);
      if (!st && rs) st = mole_session_eval(rs, chunk + b0, nb, scored ? rlg : NULL, true);
      if (st || !scored) continue;
      // row p predicts token p + 1; positions first .. n_ctx-2 are scored
      for (int64_t p = CLI_MAX(first, b0); p < b0 + nb && p < n_ctx - 1; p++) {
        const double v = nll_of(lg + (p - b0) * V, V, chunk[p + 1]);
        nll += v;
        nll2 += v * v;
        count++;
        if (rs) {
          bool same;
          const double d = kl_of(rlg + (p - b0) * V, lg + (p - b0) * V, V, &same);
          kld += d;
          kld2 += d * d;
          same_top += same;
        }
      }
    }
    chunk[0] = tok0;
    if (st) {
      rc = cli_error("perplexity", st);
      goto done;
    }
    printf("[%lld]%.4f,", (long long)c + 1, exp(nll / (double)count));
    fflush(stdout);
    const double per = (double)(mole_time_us() - t_start) / 1e6 / (double)(c + 1);
    fprintf(stderr, "%smole perplexity: chunk %lld/%lld, %.2f s per chunk, ETA %.1f s%s", tty ? "\r" : "",
            (long long)c + 1, (long long)n_chunk, per, per * (double)(n_chunk - c - 1), tty ? "" : "\n");
  }
  if (tty) fputc('\n', stderr);
  printf("\n");
  const double mean = nll / (double)count, ppl = exp(mean);
  const double var = nll2 / (double)count - mean * mean;
  if (count > 1 && var > 0) {
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (double)(count - 1)) * ppl);
  } else {
    printf("Final estimate: PPL = %.4f\n", ppl);
    fprintf(stderr, "mole perplexity: no standard error: %lld scored tokens, variance of log(prob) %g\n",
            (long long)count, var);
  }
  if (rs) {
    const double km = kld / (double)count, kv = kld2 / (double)count - km * km;
    printf("KL divergence vs %s: %.6f +/- %.6f, top-1 agreement %.4f%% over %lld positions\n", ref, km,
           count > 1 && kv > 0 ? sqrt(kv / (double)(count - 1)) : 0.0, 100.0 * (double)same_top / (double)count,
           (long long)count);
  }
  if (mo.kv_budget > 0) cli_print_kv(s, stderr);
  fflush(stdout);
  rc = 0;
done:
  free(lg);
  free(rlg);
  mole_session_free(rs);
  mole_model_free(rm);
  mole_free(toks);
  free(text);
  mole_vocab_free(voc);
  mole_gguf_close(gf);
  mole_session_free(s);
  mole_model_free(m);
  return rc;
}
