// mole run: generate from a prompt (text or token ids), streaming the text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "common.h"
#include "mole.h"
#include "sampling_flags.h"

static const char *k_help =
    "usage: mole run -m FILE (-p TEXT | -f FILE | --tokens LIST) [options]\n"
    "Generates text from a prompt and streams it to stdout.\n" CLI_MODEL_HELP
    "  -p, --prompt TEXT        prompt text\n"
    "  -f, --file FILE          read the prompt from a file\n"
    "      --tokens LIST        prompt as comma-separated token ids (no BOS added)\n"
    "  -n, --n-predict N        tokens to generate (default: 128)\n" CLI_SAMPLING_HELP
    "      --stop STR           stop when STR is generated (repeatable)\n"
    "      --ignore-eos         keep generating past end-of-generation tokens\n"
    "      --no-bos             do not add the BOS token to a text prompt\n"
    "      --ids                print the generated token ids on one line instead of text\n"
    "      --stats              print speed, time to first token and peak memory at the end (stderr)\n";

typedef struct {
  cli_model_opts mo;
  mole_sampler_params sp;
  const char *prompt, *file, *tokens;
  const char *stops[16];
  int n_stops;
  int64_t n_predict;
  bool ignore_eos, no_bos, ids, stats;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &o->mo);
    if (r == 0) r = cli_sampling_flag(argc, argv, &i, &o->sp);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 1;
    } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
      if (!(o->prompt = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
      if (!(o->file = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--tokens")) {
      if (!(o->tokens = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1 << 24, &o->n_predict)) return 2;
    } else if (!strcmp(a, "--stop")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if (!*v) return cli_usage_error("run", "--stop: empty stop string");
      if (o->n_stops == 16) return cli_usage_error("run", "--stop: at most 16 stop strings");
      o->stops[o->n_stops++] = v;
    } else if (!strcmp(a, "--ignore-eos")) {
      o->ignore_eos = true;
    } else if (!strcmp(a, "--no-bos")) {
      o->no_bos = true;
    } else if (!strcmp(a, "--ids")) {
      o->ids = true;
    } else if (!strcmp(a, "--stats")) {
      o->stats = true;
    } else {
      return cli_usage_error("run", "unknown flag '%s'", a);
    }
  }
  if (!o->mo.model) return cli_usage_error("run", "-m FILE is required");
  if (!!o->prompt + !!o->file + !!o->tokens != 1)
    return cli_usage_error("run", "give exactly one of -p TEXT, -f FILE, --tokens LIST");
  return 0;
}

static char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char *b = malloc(cap);
  size_t k;
  while (b && (k = fread(b + len, 1, cap - len, f)) > 0) {
    len += k;
    if (len == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  }
  fclose(f);
  if (b) *n = len;
  return b;
}

int cmd_run(int argc, char **argv) {
  run_opts o = {.sp = mole_sampler_default_params(), .n_predict = 128};
  int pr = parse(argc, argv, &o);
  if (pr) return pr == 1 ? 0 : pr;
  int rc = 1;
  mole_model *m = NULL;
  mole_session *s = NULL;
  mole_vocab *voc = NULL;
  mole_sampler *smp = NULL;
  mole_stop *sm = NULL;
  int32_t *prompt = NULL, *gen = NULL;
  int64_t np = 0, ng = 0;
  float *lg = NULL;
  char *text = NULL;
  mole_status st;
  if (cli_open(&o.mo, &m, &s)) return 1;
  const int64_t V = mole_model_n_vocab(m);
  // the tokenizer of the loaded model's file
  if ((st = mole_model_vocab(m, &voc))) {
    rc = cli_error("run", st);
    goto done;
  }
  if (o.tokens) {
    if (cli_parse_tokens("--tokens", o.tokens, &prompt, &np)) {
      rc = 2;
      goto done;
    }
  } else {
    size_t len = o.prompt ? strlen(o.prompt) : 0;
    if (o.file && !(text = read_all(o.file, &len))) {
      fprintf(stderr, "mole run: cannot read prompt file '%s'\n", o.file);
      goto done;
    }
    int32_t *ids;
    if ((st = mole_tokenize(voc, o.prompt ? o.prompt : text, len, !o.no_bos, true, &ids, &np))) {
      rc = cli_error("run", st);
      goto done;
    }
    prompt = malloc((size_t)(np > 0 ? np : 1) * sizeof *prompt);
    if (prompt) memcpy(prompt, ids, (size_t)np * sizeof *prompt);
    mole_free(ids);
  }
  if (np == 0) {
    fprintf(stderr, "mole run: the prompt is empty (no tokens)\n");
    goto done;
  }
  for (int64_t i = 0; i < np; i++)
    if (prompt[i] < 0 || prompt[i] >= V) {
      fprintf(stderr, "mole run: prompt token %d at index %lld is outside the vocabulary (0..%lld)\n", prompt[i],
              (long long)i, (long long)V - 1);
      rc = 2;
      goto done;
    }
  if ((st = mole_sampler_new(&o.sp, V, &smp)) || (st = mole_stop_new(o.stops, o.n_stops, &sm))) {
    rc = cli_error("run", st);
    goto done;
  }
  lg = malloc((size_t)V * sizeof *lg);
  gen = malloc((size_t)(o.n_predict + 1) * sizeof *gen);
  if (!lg || !gen) goto done;
  for (int64_t i = 0; i < np; i++) mole_sampler_accept(smp, prompt[i]);  // in range: checked above
  int64_t t0 = mole_time_us();
  if ((st = mole_session_eval(s, prompt, np, lg, false))) {
    rc = cli_error("run", st);
    goto done;
  }
  int64_t t_prompt = mole_time_us() - t0, t_first = 0;
  int64_t t1 = mole_time_us();
  char piece[256];
  mole_stop_result r;
  bool stopped = false;
  for (ng = 0; ng < o.n_predict && !stopped;) {
    int32_t tok = mole_sampler_sample(smp, lg);
    if (ng == 0) t_first = mole_time_us() - t0;
    if (!o.ignore_eos && mole_token_is_eog(voc, tok)) break;
    mole_sampler_accept(smp, tok);
    gen[ng++] = tok;
    if (!o.ids) {
      int64_t pl = mole_token_piece(voc, tok, piece, sizeof piece, false);
      if (pl > (int64_t)sizeof piece) pl = sizeof piece;
      if (pl > 0 && !mole_stop_feed(sm, piece, (size_t)pl, &r)) {
        fwrite(r.emit, 1, r.n_emit, stdout);
        fflush(stdout);
        stopped = r.matched;
      }
    }
    if (stopped || ng == o.n_predict) break;
    if ((st = mole_session_eval(s, &tok, 1, lg, false))) {
      if (st == MOLE_ERR_ARG) {  // context full: stop generating, say why
        fprintf(stderr, "\nmole run: stopped: %s\n", mole_last_error());
        break;
      }
      rc = cli_error("run", st);
      goto done;
    }
  }
  int64_t t_gen = mole_time_us() - t1;
  if (o.ids) {
    for (int64_t i = 0; i < ng; i++) printf(i ? " %d" : "%d", gen[i]);
    printf("\n");
  } else {
    mole_stop_flush(sm, &r);
    fwrite(r.emit, 1, r.n_emit, stdout);
    printf("\n");
  }
  fflush(stdout);
  if (o.stats) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr,
            "\nprompt: %lld tokens in %.3f s (%.2f tokens/s)\n"
            "gen:    %lld tokens in %.3f s (%.2f tokens/s)\n"
            "time to first token: %.3f s\n"
            "peak memory (RSS): %.1f MiB\n",
            (long long)np, (double)t_prompt / 1e6, (double)np * 1e6 / (double)(t_prompt > 0 ? t_prompt : 1),
            (long long)ng, (double)t_gen / 1e6, (double)ng * 1e6 / (double)(t_gen > 0 ? t_gen : 1),
            (double)t_first / 1e6, (double)ru.ru_maxrss / 1024.0);
    cli_print_kv(s, stderr);
    mole_model_print_stats(m, stderr);
  }
  rc = 0;
done:
  free(lg);
  free(gen);
  free(prompt);
  free(text);
  mole_stop_free(sm);
  mole_sampler_free(smp);
  mole_vocab_free(voc);
  mole_session_free(s);
  mole_model_free(m);
  return rc;
}
