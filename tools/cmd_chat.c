// mole chat: an interactive conversation using the model's chat template.
// Each turn re-renders the conversation, keeps the KV cache of the longest
// common token prefix and evaluates only the rest. Ctrl-C stops the answer
// being generated; at the prompt it (or EOF, or /exit) ends the chat.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"
#include "sampling_flags.h"

// the help around the list of templates (not a format: the model flags' text holds a '%')
static const char *k_help_head =
    "usage: mole chat -m FILE [options]\n"
    "Interactive chat with the model's chat template (tokenizer.chat_template).\n"
    "Type a message and Enter; Ctrl-C stops an answer; /exit, Ctrl-D or Ctrl-C at the prompt quits.\n" CLI_MODEL_HELP
    "      --template NAME      chat template, overriding the file's (";
static const char *k_help_tail =
    ")\n"
    "  -s, --system TEXT        system prompt\n"
    "  -n, --n-predict N        longest answer in tokens (default: 512)\n" CLI_SAMPLING_HELP;

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
  (void)sig;
  g_interrupted = 1;
}

typedef struct {
  mole_chat_msg *msgs;
  char **owned;  // contents we allocated
  int64_t n, cap;
} conversation;

static int conv_add(conversation *c, const char *role, const char *content) {
  if (c->n == c->cap) {
    int64_t cap = c->cap ? c->cap * 2 : 16;
    mole_chat_msg *m = realloc(c->msgs, (size_t)cap * sizeof *m);
    char **o = realloc(c->owned, (size_t)cap * sizeof *o);
    if (!m || !o) {
      free(m ? m : c->msgs);
      return -1;
    }
    c->msgs = m;
    c->owned = o;
    c->cap = cap;
  }
  char *dup = strdup(content);
  if (!dup) return -1;
  c->owned[c->n] = dup;
  c->msgs[c->n++] = (mole_chat_msg){role, dup};
  return 0;
}

int cmd_chat(int argc, char **argv) {
  cli_model_opts mo = {0};
  mole_sampler_params sp = mole_sampler_default_params();
  const char *tmpl_name = NULL, *system = NULL;
  int64_t n_predict = 512;
  for (int i = 1; i < argc; i++) {
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r == 0) r = cli_sampling_flag(argc, argv, &i, &sp);
    if (r < 0) return 2;
    if (r) continue;
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help_head, stdout);
      fputs(mole_chat_template_list(), stdout);
      fputs(k_help_tail, stdout);
      return 0;
    } else if (!strcmp(a, "--template")) {
      if (!(tmpl_name = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-s") || !strcmp(a, "--system")) {
      if (!(system = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1 << 24, &n_predict)) return 2;
    } else {
      return cli_usage_error("chat", "unknown flag '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("chat", "-m FILE is required");
  const char *tmpl = NULL;
  if (tmpl_name && !(tmpl = mole_chat_template_from_name(tmpl_name)))
    return cli_usage_error("chat", "--template: unknown template '%s' (known: %s)", tmpl_name, mole_chat_template_list());
  // the template and the vocabulary from the file's metadata, before any weights are loaded
  mole_gguf *gf = NULL;
  mole_status st = mole_gguf_open(mo.model, &gf);
  if (st) return cli_error("chat", st);
  if (!tmpl) {
    const char *t = NULL;
    if (mole_gguf_get_str(gf, "tokenizer.chat_template", &t) != MOLE_OK) {
      fprintf(stderr, "mole chat: %s has no tokenizer.chat_template; choose one with --template NAME (%s)\n",
              mo.model, mole_chat_template_list());
      mole_gguf_close(gf);
      return 2;
    }
    if (!(tmpl = mole_chat_template_detect(t))) {
      fprintf(stderr, "mole chat: the chat template of %s is not one mole recognises; choose one with --template NAME (%s)\n",
              mo.model, mole_chat_template_list());
      mole_gguf_close(gf);
      return 2;
    }
  }
  int rc = 1;
  mole_vocab *voc = NULL;
  mole_model *m = NULL;
  mole_session *s = NULL;
  mole_sampler *smp = NULL;
  conversation conv = {0};
  int32_t *hist = NULL;  // tokens in the KV cache
  int64_t n_hist = 0, hist_cap = 0;
  float *lg = NULL;
  char *line = NULL, *answer = NULL;
  size_t line_cap = 0;
  st = mole_gguf_vocab(gf, &voc);
  mole_gguf_close(gf);  // the vocabulary keeps its own copy; the model maps the file again
  if (st) {
    rc = cli_error("chat", st);
    goto done;
  }
  if (cli_open(&mo, &m, &s)) goto done;
  if ((st = mole_sampler_new(&sp, mole_model_n_vocab(m), &smp))) {
    rc = cli_error("chat", st);
    goto done;
  }
  if (system && conv_add(&conv, "system", system)) goto done;
  lg = malloc((size_t)mole_model_n_vocab(m) * sizeof *lg);
  if (!lg) goto done;
  struct sigaction sa = {0};
  sa.sa_handler = on_sigint;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
  sigaction(SIGINT, &sa, NULL);
  fprintf(stderr, "mole chat: template %s. /exit or Ctrl-D to quit, Ctrl-C stops an answer.\n",
          tmpl);
  for (;;) {
    fputs("\n> ", stdout);
    fflush(stdout);
    g_interrupted = 0;
    errno = 0;
    ssize_t len = getline(&line, &line_cap, stdin);
    if (len < 0) break;  // EOF or Ctrl-C at the prompt
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
    if (!strcmp(line, "/exit")) break;
    if (len == 0) continue;
    if (conv_add(&conv, "user", line)) goto done;
    char *text = NULL;
    if ((st = mole_chat_apply(tmpl, conv.msgs, conv.n, true, &text))) {
      rc = cli_error("chat", st);
      goto done;
    }
    int32_t *ids;
    int64_t n;
    st = mole_tokenize(voc, text, strlen(text), true, true, &ids, &n);
    mole_free(text);
    if (st) {
      rc = cli_error("chat", st);
      goto done;
    }
    // keep the common prefix (at least one token must be evaluated for logits)
    int64_t keep = 0;
    while (keep < n_hist && keep < n - 1 && hist[keep] == ids[keep]) keep++;
    if (n + n_predict > hist_cap) {
      hist_cap = (n + n_predict) * 2;
      int32_t *h = realloc(hist, (size_t)hist_cap * sizeof *h);
      if (!h) {
        mole_free(ids);
        goto done;
      }
      hist = h;
    }
    if (mole_session_rewind(s, keep)) {  // a bounded cache that evicted: start over
      mole_session_reset(s);
      keep = 0;
    }
    memcpy(hist + keep, ids + keep, (size_t)(n - keep) * sizeof *ids);
    st = mole_session_eval(s, ids + keep, n - keep, lg, false);
    mole_free(ids);
    if (st) {
      rc = cli_error("chat", st);
      goto done;
    }
    n_hist = n;
    size_t alen = 0, acap = 256;
    answer = malloc(acap);
    if (!answer) goto done;
    char piece[256];
    for (int64_t g = 0; g < n_predict && !g_interrupted; g++) {
      int32_t tok = mole_sampler_sample(smp, lg);
      if (mole_token_is_eog(voc, tok)) break;
      mole_sampler_accept(smp, tok);
      int64_t pl = mole_token_piece(voc, tok, piece, sizeof piece, false);
      if (pl > (int64_t)sizeof piece) pl = sizeof piece;
      if (pl > 0) {
        fwrite(piece, 1, (size_t)pl, stdout);
        fflush(stdout);
        if (alen + (size_t)pl + 1 > acap) {
          char *na = realloc(answer, acap = (alen + (size_t)pl + 1) * 2);
          if (!na) goto done;
          answer = na;
        }
        memcpy(answer + alen, piece, (size_t)pl);
        alen += (size_t)pl;
      }
      hist[n_hist++] = tok;
      if ((st = mole_session_eval(s, &tok, 1, lg, false))) {
        fprintf(stderr, "\nmole chat: %s\n", mole_last_error());
        break;
      }
    }
    if (g_interrupted) fputs(" [stopped]", stdout);
    answer[alen] = 0;
    if (conv_add(&conv, "assistant", answer)) goto done;
    free(answer);
    answer = NULL;
  }
  fputs("\n", stdout);
  rc = 0;
done:
  for (int64_t i = 0; i < conv.n; i++) free(conv.owned[i]);
  free(conv.msgs);
  free(conv.owned);
  free(hist);
  free(lg);
  free(line);
  free(answer);
  mole_sampler_free(smp);
  mole_vocab_free(voc);
  mole_session_free(s);
  mole_model_free(m);
  return rc;
}
