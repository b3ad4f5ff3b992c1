// mole inspect: what a GGUF file holds — header, metadata (long arrays
// abbreviated) and the tensor table.
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

enum {
  ARR_SHOWN = 8,     // array elements printed before "..."
  STR_SHOWN = 160,   // bytes of a string value printed
};

static const char *k_help =
    "usage: mole inspect FILE\n"
    "Prints a GGUF file's version, alignment, metadata (long arrays abbreviated)\n"
    "and its tensors: name, type, shape, offset in the data section, size.\n";

// s[0..n) with control bytes, quotes and backslashes escaped, at most max
// input bytes, into out (always nul-terminated).
static void escape(char *out, size_t cap, const char *s, uint64_t n, uint64_t max) {
  size_t k = 0;
  for (uint64_t i = 0; i < n && i < max && k + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *e = NULL;
    switch (c) {
      case '\n': e = "\\n"; break;
      case '\r': e = "\\r"; break;
      case '\t': e = "\\t"; break;
      case '"': e = "\\\""; break;
      case '\\': e = "\\\\"; break;
      default: break;
    }
    if (e) {
      k += (size_t)snprintf(out + k, cap - k, "%s", e);
    } else if (c < 0x20 || c == 0x7f) {
      k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    } else {
      out[k++] = (char)c;
    }
  }
  out[k] = '\0';
}

static void print_str(const char *s, uint64_t n, uint64_t max) {
  char buf[4 * STR_SHOWN + 8];
  escape(buf, sizeof buf, s, n, max);
  printf("\"%s\"", buf);
  if (n > max) printf("... (%" PRIu64 " bytes)", n);
}

static void print_elem(gguf_type t, const void *p) {
  switch (t) {
    case GGUF_T_UINT8: printf("%u", *(const uint8_t *)p); break;
    case GGUF_T_INT8: printf("%d", *(const int8_t *)p); break;
    case GGUF_T_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", stdout); break;
    case GGUF_T_UINT16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); break; }
    case GGUF_T_INT16: { int16_t v; memcpy(&v, p, 2); printf("%d", v); break; }
    case GGUF_T_UINT32: { uint32_t v; memcpy(&v, p, 4); printf("%u", v); break; }
    case GGUF_T_INT32: { int32_t v; memcpy(&v, p, 4); printf("%d", v); break; }
    case GGUF_T_UINT64: { uint64_t v; memcpy(&v, p, 8); printf("%" PRIu64, v); break; }
    case GGUF_T_INT64: { int64_t v; memcpy(&v, p, 8); printf("%" PRId64, v); break; }
    case GGUF_T_FLOAT32: { float v; memcpy(&v, p, 4); printf("%.9g", v); break; }
    case GGUF_T_FLOAT64: { double v; memcpy(&v, p, 8); printf("%.17g", v); break; }
    default: fputs("?", stdout);
  }
}

static void print_kv(const gguf_file *f, int64_t i) {
  gguf_type t = gguf_kv_type(f, i), et = gguf_kv_arr_type(f, i);
  uint64_t n = gguf_kv_arr_n(f, i);
  char tname[48];
  if (t == GGUF_T_ARRAY)
    snprintf(tname, sizeof tname, "[%s; %" PRIu64 "]", gguf_type_name(et), n);
  else
    snprintf(tname, sizeof tname, "%s", gguf_type_name(t));
  char key[4 * 128 + 8];
  const char *k = gguf_kv_key(f, i);
  escape(key, sizeof key, k, strlen(k), 128);
  printf("  %-44s %-16s ", key, tname);
  if (t != GGUF_T_ARRAY) {
    if (t == GGUF_T_STRING) {
      uint64_t len;
      const char *s = gguf_kv_str(f, i, 0, &len);
      print_str(s, len, STR_SHOWN);
    } else {
      print_elem(t, gguf_kv_data(f, i));
    }
    putchar('\n');
    return;
  }
  putchar('[');
  const uint8_t *data = gguf_kv_data(f, i);
  for (uint64_t j = 0; j < n && j < ARR_SHOWN; j++) {
    if (j) fputs(", ", stdout);
    if (et == GGUF_T_STRING) {
      uint64_t len;
      const char *s = gguf_kv_str(f, i, j, &len);
      print_str(s, len, 40);
    } else {
      print_elem(et, data + j * gguf_type_size(et));
    }
  }
  if (n > ARR_SHOWN) printf(", ... %" PRIu64 " more", n - ARR_SHOWN);
  puts("]");
}

static void print_tensors(const gguf_file *f) {
  int64_t nt = gguf_n_tensors(f);
  uint64_t total = 0;
  for (int64_t i = 0; i < nt; i++) total += gguf_tensor_at(f, i)->size;
  printf("tensors: %" PRId64 " (%" PRIu64 " bytes of data)\n", nt, total);
  if (nt == 0) return;
  printf("  %5s  %-40s %-8s %-24s %12s %12s\n", "#", "name", "type", "shape", "offset", "size");
  for (int64_t i = 0; i < nt; i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    char shape[96];
    int k = 0;
    for (uint32_t d = 0; d < t->n_dims && k < (int)sizeof shape; d++)
      k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%" PRId64, d ? " x " : "", t->ne[d]);
    char name[4 * 128 + 8];
    escape(name, sizeof name, t->name, strlen(t->name), 128);
    printf("  %5" PRId64 "  %-40s %-8s %-24s %12" PRIu64 " %12zu\n", i, name, quant_type_name(t->type), shape,
           t->offset, t->size);
  }
}

int cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(k_help, stdout);
      return 0;
    }
    if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "mole inspect: unknown flag '%s' (see mole inspect --help)\n", argv[i]);
      return 2;
    }
    if (path) {
      fprintf(stderr, "mole inspect: one FILE expected, got '%s' and '%s'\n", path, argv[i]);
      return 2;
    }
    path = argv[i];
  }
  if (!path) {
    fputs(k_help, stderr);
    return 2;
  }
  gguf_file *f;
  mole_status st = gguf_open(path, &f);
  if (st) {
    fprintf(stderr, "mole inspect: %s: %s\n", mole_status_str(st), mole_last_error());
    return 1;
  }
  printf("file: %s\n", path);
  printf("version: %u\n", gguf_version(f));
  printf("size: %zu bytes\n", gguf_size(f));
  printf("alignment: %" PRIu64 "\n", gguf_alignment(f));
  printf("data offset: %" PRIu64 "\n", gguf_data_offset(f));
  printf("metadata: %" PRId64 " keys\n", gguf_n_kv(f));
  for (int64_t i = 0; i < gguf_n_kv(f); i++) print_kv(f, i);
  print_tensors(f);
  gguf_close(f);
  return fflush(stdout) == 0 ? 0 : 1;
}
