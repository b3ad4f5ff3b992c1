// mole inspect: what a GGUF file holds — header, metadata (long arrays
// abbreviated) and the tensor table.
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mole.h"

enum {
  ARR_SHOWN = 8,     // array elements printed before "..."
  STR_SHOWN = 160,   // bytes of a string value printed
};

static const char *k_help =
    "usage: mole inspect FILE\n"
    "Prints a GGUF file's version, alignment, metadata (long arrays abbreviated)\n"
    "and its tensors: name, type, shape, offset in the data section, size; then\n"
    "its type mix: tensors, bytes, share and bits per weight of each type.\n";

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

static void print_elem(mole_gguf_type t, const void *p) {
  switch (t) {
    case MOLE_GGUF_UINT8: printf("%u", *(const uint8_t *)p); break;
    case MOLE_GGUF_INT8: printf("%d", *(const int8_t *)p); break;
    case MOLE_GGUF_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", stdout); break;
    case MOLE_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); break; }
    case MOLE_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); printf("%d", v); break; }
    case MOLE_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); printf("%u", v); break; }
    case MOLE_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); printf("%d", v); break; }
    case MOLE_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); printf("%" PRIu64, v); break; }
    case MOLE_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); printf("%" PRId64, v); break; }
    case MOLE_GGUF_FLOAT32: { float v; memcpy(&v, p, 4); printf("%.9g", v); break; }
    case MOLE_GGUF_FLOAT64: { double v; memcpy(&v, p, 8); printf("%.17g", v); break; }
    default: fputs("?", stdout);
  }
}

static void print_kv(const mole_gguf *f, int64_t i, const mole_gguf_kv *kv) {
  const mole_gguf_type t = kv->type, et = kv->elem_type;
  const uint64_t n = kv->n;
  char tname[48];
  if (t == MOLE_GGUF_ARRAY)
    snprintf(tname, sizeof tname, "[%s; %" PRIu64 "]", mole_gguf_type_name(et), n);
  else
    snprintf(tname, sizeof tname, "%s", mole_gguf_type_name(t));
  char key[4 * 128 + 8];
  escape(key, sizeof key, kv->key, strlen(kv->key), 128);
  printf("  %-44s %-16s ", key, tname);
  if (t != MOLE_GGUF_ARRAY) {
    if (t == MOLE_GGUF_STRING) {
      uint64_t len;
      const char *s = mole_gguf_kv_str(f, i, 0, &len);
      print_str(s, len, STR_SHOWN);
    } else {
      print_elem(t, kv->data);
    }
    putchar('\n');
    return;
  }
  putchar('[');
  const uint8_t *data = kv->data;
  for (uint64_t j = 0; j < n && j < ARR_SHOWN; j++) {
    if (j) fputs(", ", stdout);
    if (et == MOLE_GGUF_STRING) {
      uint64_t len;
      const char *s = mole_gguf_kv_str(f, i, j, &len);
      print_str(s, len, 40);
    } else {
      print_elem(et, data + j * mole_gguf_type_size(et));
    }
  }
  if (n > ARR_SHOWN) printf(", ... %" PRIu64 " more", n - ARR_SHOWN);
  puts("]");
}

// The file's tensor types: tensors, bytes and bits per weight of each (a
// low-bit file mixes many: llama-quantize's per-role choices, unsloth's UD
// quants), and whether mole can compute with it.
static mole_status print_type_mix(const mole_gguf *f, int64_t nt, uint64_t total) {
  enum { MAX_TYPES = 64 };
  typedef struct { int type; const char *name; int64_t n; uint64_t bytes, elems; } type_share;
  type_share mix[MAX_TYPES];
  int n_mix = 0;
  mole_gguf_tensor t;
  for (int64_t i = 0; i < nt; i++) {
    mole_status st = mole_gguf_tensor_at(f, i, &t);
    if (st) return st;
    int k = 0;
    while (k < n_mix && mix[k].type != t.type) k++;
    if (k == n_mix) {
      if (n_mix == MAX_TYPES) continue;  // (more distinct ids than GGUF has types: not listed)
      mix[n_mix++] = (type_share){t.type, t.type_name, 0, 0, 0};
    }
    uint64_t el = 1;
    for (uint32_t d = 0; d < t.n_dims; d++) el *= (uint64_t)t.ne[d];
    mix[k].n++;
    mix[k].bytes += t.bytes;
    mix[k].elems += el;
  }
  // largest share first
  for (int a = 1; a < n_mix; a++)
    for (int b = a; b > 0 && mix[b].bytes > mix[b - 1].bytes; b--) {
      const type_share x = mix[b];
      mix[b] = mix[b - 1];
      mix[b - 1] = x;
    }
  printf("types: %d\n  %-8s %8s %14s %7s %8s\n", n_mix, "type", "tensors", "bytes", "share", "bits/w");
  for (int k = 0; k < n_mix; k++)
    printf("  %-8s %8" PRId64 " %14" PRIu64 " %6.1f%% %8.3f%s\n", mix[k].name, mix[k].n, mix[k].bytes,
           total ? 100.0 * (double)mix[k].bytes / (double)total : 0.0,
           mix[k].elems ? 8.0 * (double)mix[k].bytes / (double)mix[k].elems : 0.0,
           mole_type_computable(mix[k].type) ? "" : "  (mole cannot compute with it)");
  return MOLE_OK;
}

static mole_status print_tensors(const mole_gguf *f, int64_t nt) {
  uint64_t total = 0;
  mole_gguf_tensor t;
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < nt && !st; i++)
    if (!(st = mole_gguf_tensor_at(f, i, &t))) total += t.bytes;
  if (st) return st;
  printf("tensors: %" PRId64 " (%" PRIu64 " bytes of data)\n", nt, total);
  if (nt == 0) return MOLE_OK;
  printf("  %5s  %-40s %-8s %-24s %12s %12s\n", "#", "name", "type", "shape", "offset", "size");
  for (int64_t i = 0; i < nt; i++) {
    if ((st = mole_gguf_tensor_at(f, i, &t))) return st;
    char shape[96];
    int k = 0;
    for (uint32_t d = 0; d < t.n_dims && k < (int)sizeof shape; d++)
      k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%" PRId64, d ? " x " : "", t.ne[d]);
    char name[4 * 128 + 8];
    escape(name, sizeof name, t.name, strlen(t.name), 128);
    printf("  %5" PRId64 "  %-40s %-8s %-24s %12" PRIu64 " %12zu\n", i, name, t.type_name, shape, t.offset, t.bytes);
  }
  return print_type_mix(f, nt, total);
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
  mole_gguf *f = NULL;
  mole_status st = mole_gguf_open(path, &f);
  if (!st) {
    mole_gguf_info gi;
    mole_gguf_get_info(f, &gi);
    printf("file: %s\n", path);
    printf("version: %u\n", gi.version);
    printf("size: %zu bytes\n", gi.size);
    printf("alignment: %" PRIu64 "\n", gi.alignment);
    printf("data offset: %" PRIu64 "\n", gi.data_offset);
    printf("metadata: %" PRId64 " keys\n", gi.n_kv);
    for (int64_t i = 0; i < gi.n_kv && !st; i++) {
      mole_gguf_kv kv;
      if (!(st = mole_gguf_kv_at(f, i, &kv))) print_kv(f, i, &kv);
    }
    if (!st) st = print_tensors(f, gi.n_tensors);
  }
  mole_gguf_close(f);
  if (st) {
    fprintf(stderr, "mole inspect: %s: %s\n", mole_status_str(st), mole_last_error());
    return 1;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}
