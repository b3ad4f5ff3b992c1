// mole tokenize: the token ids of a text under a model's vocabulary (only the
// GGUF metadata is read; no weights are loaded).
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "cli.h"
#include "mole.h"

static void tokenize_usage(FILE *f) {
  fprintf(f,
          "usage: mole tokenize -m FILE [options] [--] TEXT\n"
          "\n"
          "Prints the token ids of TEXT, space-separated, on one line.\n"
          "TEXT '-' reads all of standard input, byte for byte (trailing newlines included).\n"
          "\n"
          "options:\n"
          "  -m, --model FILE     GGUF file with a vocabulary (required)\n"
          "      --no-bos         do not add BOS/EOS (default: as the vocabulary says)\n"
          "      --parse-special  turn control tokens written in TEXT (<|im_end|>, ...) into\n"
          "                       their ids (default: off, they are tokenized as text)\n"
          "      --pieces         print one token per line: ID 'PIECE' (escaped)\n"
          "  -h, --help           this help\n");
}

static int tokenize_usage_error(const char *msg, const char *arg) {
  fprintf(stderr, "mole tokenize: %s%s%s%s (see mole tokenize --help)\n", msg, arg ? " '" : "", arg ? arg : "",
          arg ? "'" : "");
  return 2;
}

// All of stdin into a malloc'd buffer.
static char *tokenize_read_stdin(size_t *n) {
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (len == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    size_t got = fread(buf + len, 1, cap - len, stdin);
    len += got;
    if (got == 0) {
      if (ferror(stdin)) break;
      *n = len;
      return buf;
    }
  }
  free(buf);
  return NULL;
}

static void tokenize_print_piece(const char *p, int64_t n) {
  putchar('\'');
  for (int64_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c == '\n') fputs("\\n", stdout);
    else if (c == '\t') fputs("\\t", stdout);
    else if (c == '\r') fputs("\\r", stdout);
    else if (c == '\\') fputs("\\\\", stdout);
    else if (c == '\'') fputs("\\'", stdout);
    else if (c < 0x20 || c == 0x7F) printf("\\x%02x", c);
    else putchar(c);  // UTF-8 passes through (a lone byte of a split character too)
  }
  putchar('\'');
}

int cmd_tokenize(int argc, char **argv) {
  const char *model = NULL, *text_arg = NULL;
  bool add_special = true, parse_special = false, pieces = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      tokenize_usage(stdout);
      return 0;
    } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      if (i + 1 >= argc) return tokenize_usage_error("missing value for", a);
      model = argv[++i];
    } else if (!strcmp(a, "--no-bos")) {
      add_special = false;
    } else if (!strcmp(a, "--parse-special")) {
      parse_special = true;
    } else if (!strcmp(a, "--pieces")) {
      pieces = true;
    } else if (!strcmp(a, "--") && i + 1 < argc && !text_arg) {  // a TEXT that starts with '-'
      text_arg = argv[++i];
    } else if (a[0] == '-' && a[1] != 0) {
      return tokenize_usage_error("unknown flag", a);
    } else if (text_arg) {
      return tokenize_usage_error("more than one TEXT (quote it):", a);
    } else {
      text_arg = a;
    }
  }
  if (!model) return tokenize_usage_error("missing -m FILE", NULL);
  if (!text_arg) return tokenize_usage_error("missing TEXT ('-' reads standard input)", NULL);

  char *in = NULL;
  const char *text = text_arg;
  size_t len = strlen(text_arg);
  if (!strcmp(text_arg, "-")) {
    in = tokenize_read_stdin(&len);
    if (!in) {
      fprintf(stderr, "mole tokenize: cannot read standard input\n");
      return 1;
    }
    text = in;
  }
  mole_vocab *v = NULL;
  int32_t *ids = NULL;
  int64_t n = 0;
  mole_status st = mole_vocab_load(model, &v);
  if (st == MOLE_OK) st = mole_tokenize(v, text, len, add_special, parse_special, &ids, &n);
  if (st != MOLE_OK) {
    fprintf(stderr, "mole tokenize: %s\n", mole_last_error());
  } else if (pieces) {
    char buf[256];
    for (int64_t i = 0; i < n; i++) {
      int64_t pn = mole_token_piece(v, ids[i], buf, sizeof buf, true);
      printf("%d ", ids[i]);
      if (pn <= (int64_t)sizeof buf) {
        tokenize_print_piece(buf, pn);
      } else {  // a long piece
        char *big = malloc((size_t)pn);
        if (big) mole_token_piece(v, ids[i], big, (size_t)pn, true);
        tokenize_print_piece(big ? big : "", big ? pn : 0);
        free(big);
      }
      putchar('\n');
    }
  } else {
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
  }
  mole_free(ids);
  mole_vocab_free(v);
  free(in);
  return st == MOLE_OK ? 0 : 1;
}
