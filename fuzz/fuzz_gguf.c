// libFuzzer target: gguf_open_buffer on arbitrary bytes, then every accessor
// over every kv and tensor (ASan catches any read outside the input).
#include <stdint.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint64_t g_sink;

static void walk_kv(const gguf_file *f, int64_t i) {
  const char *key = gguf_kv_key(f, i);
  g_sink += strlen(key);
  MOLE_ASSERT(gguf_find_kv(f, key) == i);
  gguf_type t = gguf_kv_type(f, i), et = gguf_kv_arr_type(f, i);
  uint64_t n = gguf_kv_arr_n(f, i);
  MOLE_ASSERT(t < GGUF_T_COUNT && et < GGUF_T_COUNT && et != GGUF_T_ARRAY);
  if (et == GGUF_T_STRING) {
    for (uint64_t j = 0; j < n; j++) {
      uint64_t len = 0;
      const char *s = gguf_kv_str(f, i, j, &len);
      MOLE_ASSERT(s && s[len] == '\0');
      if (len) g_sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
    }
    MOLE_ASSERT(gguf_kv_str(f, i, n, NULL) == NULL);
  } else {
    const uint8_t *d = gguf_kv_data(f, i);
    size_t bytes = (size_t)n * gguf_type_size(et);
    if (bytes) g_sink += d[0] + d[bytes - 1];
  }
  int64_t iv;
  double dv;
  bool bv;
  const char *sv;
  g_sink += (uint64_t)gguf_get_int(f, key, &iv) + gguf_get_float(f, key, &dv) + gguf_get_bool(f, key, &bv) +
            gguf_get_str(f, key, &sv) + gguf_get_arr_int(f, key, 0, &iv) + gguf_get_arr_int(f, key, n, &iv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gguf_file *f = NULL;
  if (gguf_open_buffer(data, size, "fuzz.gguf", &f) != MOLE_OK) {
    MOLE_ASSERT(f == NULL);
    return 0;
  }
  MOLE_ASSERT(gguf_version(f) == 2 || gguf_version(f) == 3);
  uint64_t align = gguf_alignment(f);
  MOLE_ASSERT(align && (align & (align - 1)) == 0 && gguf_data_offset(f) % align == 0);
  for (int64_t i = 0; i < gguf_n_kv(f); i++) walk_kv(f, i);
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    MOLE_ASSERT(gguf_find_tensor(f, t->name) == t);
    MOLE_ASSERT(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && t->size > 0);
    MOLE_ASSERT(t->offset % align == 0);
    const uint8_t *p = t->data;
    MOLE_ASSERT(p >= data && (size_t)(p - data) + t->size <= size);
    g_sink += p[0] + p[t->size - 1];
  }
  gguf_close(f);
  return 0;
}
