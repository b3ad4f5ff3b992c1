// gguf: writer/reader round trip, the conformance files, and malformed files
// built byte by byte (each must be rejected with a message naming the field
// and its offset).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "testutil.h"

// ---- a byte builder for hand-made files -------------------------------------

typedef struct {
  uint8_t *p;
  size_t n, cap;
} bb;

static void bb_bytes(bb *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_bytes(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { bb_bytes(b, &v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_bytes(b, &v, 8); }
static void bb_str(bb *b, const char *s) {
  bb_u64(b, strlen(s));
  bb_bytes(b, s, strlen(s));
}
static void bb_pad(bb *b, size_t align) {
  while (b->n % align) bb_u8(b, 0);
}
// n bytes of a pattern (tensor data, filler)
static void bb_fill(bb *b, size_t n) {
  for (size_t i = 0; i < n; i++) bb_u8(b, (uint8_t)(i * 7 + 1));
}
static void bb_free(bb *b) { free(b->p); }

static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  bb_bytes(b, "GGUF", 4);
  bb_u32(b, version);
  bb_u64(b, n_tensors);
  bb_u64(b, n_kv);
}
static void bb_kv_str(bb *b, const char *key, const char *v) {
  bb_str(b, key);
  bb_u32(b, GGUF_T_STRING);
  bb_str(b, v);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
  bb_str(b, key);
  bb_u32(b, GGUF_T_UINT32);
  bb_u32(b, v);
}
static void bb_tensor(bb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
  bb_str(b, name);
  bb_u32(b, n_dims);
  for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, (uint64_t)ne[d]);
  bb_u32(b, type);
  bb_u64(b, off);
}

// A small valid file that ends exactly at the end of its last tensor, so
// that every truncation is an error. Data: "a" f32 [4,2] (32 bytes) at 0,
// "b" q4_0 [32] (18 bytes) at 32.
static void build_valid(bb *b) {
  bb_header(b, 3, 2, 5);
  bb_kv_str(b, "general.architecture", "llama");
  bb_kv_u32(b, "llama.block_count", 2);
  bb_str(b, "tokenizer.ggml.tokens");
  bb_u32(b, GGUF_T_ARRAY);
  bb_u32(b, GGUF_T_STRING);
  bb_u64(b, 3);
  bb_str(b, "<s>");
  bb_str(b, "");
  bb_str(b, "hello");
  bb_str(b, "llama.per_layer");
  bb_u32(b, GGUF_T_ARRAY);
  bb_u32(b, GGUF_T_INT32);
  bb_u64(b, 2);
  bb_u32(b, 7);
  bb_u32(b, (uint32_t)-3);
  bb_str(b, "general.flag");
  bb_u32(b, GGUF_T_BOOL);
  bb_u8(b, 1);
  bb_tensor(b, "a", 2, (int64_t[]){4, 2}, QT_F32, 0);
  bb_tensor(b, "b", 1, (int64_t[]){32}, QT_Q4_0, 32);
  bb_pad(b, 32);
  bb_fill(b, 32 + 18);
}

// Opens b and expects status st with a message containing each fragment
// (NULL-terminated list) and "bad.gguf: offset <off>: ".
static void expect_bad(const bb *b, mole_status st, long long off, ...) {
  gguf_file *f = NULL;
  mole_status got = gguf_open_buffer(b->p, b->n, "bad.gguf", &f);
  const char *msg = mole_last_error();
  if (got != st) fail_msg("status %d (expected %d): %s", got, st, msg);
  assert_null(f);
  char head[64];
  snprintf(head, sizeof head, "bad.gguf: offset %lld: ", off);
  if (strncmp(msg, head, strlen(head)) != 0) fail_msg("message '%s' does not start with '%s'", msg, head);
  va_list ap;
  va_start(ap, off);
  for (const char *frag; (frag = va_arg(ap, const char *));)
    if (!strstr(msg, frag)) fail_msg("message '%s' lacks '%s'", msg, frag);
  va_end(ap);
}

static void test_valid_and_truncated(void **state) {
  (void)state;
  bb b = {0};
  build_valid(&b);
  gguf_file *f;
  assert_int_equal(gguf_open_buffer(b.p, b.n, "ok.gguf", &f), MOLE_OK);
  assert_int_equal(gguf_n_kv(f), 5);
  assert_int_equal(gguf_n_tensors(f), 2);
  const char *arch;
  assert_int_equal(gguf_get_str(f, "general.architecture", &arch), MOLE_OK);
  assert_string_equal(arch, "llama");
  int64_t v;
  assert_int_equal(gguf_get_int(f, "llama.block_count", &v), MOLE_OK);
  assert_int_equal(v, 2);
  assert_int_equal(gguf_get_arr_int(f, "llama.per_layer", 1, &v), MOLE_OK);
  assert_int_equal(v, -3);
  assert_int_equal(gguf_get_arr_int(f, "llama.per_layer", 2, &v), MOLE_ERR_FORMAT);
  assert_int_equal(gguf_get_arr_int(f, "llama.block_count", 5, &v), MOLE_OK);  // a scalar answers every index
  assert_int_equal(v, 2);
  bool flag;
  assert_int_equal(gguf_get_bool(f, "general.flag", &flag), MOLE_OK);
  assert_true(flag);
  assert_int_equal(gguf_get_int(f, "general.architecture", &v), MOLE_ERR_FORMAT);
  assert_non_null(strstr(mole_last_error(), "general.architecture"));
  assert_int_equal(gguf_get_int(f, "nope", &v), MOLE_ERR_NOT_FOUND);
  assert_non_null(strstr(mole_last_error(), "nope"));
  double d;
  assert_int_equal(gguf_get_float(f, "general.flag", &d), MOLE_ERR_FORMAT);
  int64_t ti = gguf_find_kv(f, "tokenizer.ggml.tokens");
  assert_true(ti >= 0);
  uint64_t len;
  assert_string_equal(gguf_kv_str(f, ti, 1, &len), "");
  assert_int_equal(len, 0);
  assert_string_equal(gguf_kv_str(f, ti, 2, &len), "hello");
  assert_null(gguf_kv_str(f, ti, 3, &len));
  const gguf_tensor *t = gguf_find_tensor(f, "b");
  assert_non_null(t);
  assert_int_equal(t->size, 18);
  assert_int_equal(t->ne[1], 1);
  assert_ptr_equal(t->data, (const uint8_t *)b.p + b.n - 18);
  assert_null(gguf_find_tensor(f, "c"));
  assert_int_equal(gguf_data_offset(f) % 32, 0);
  gguf_close(f);

  for (size_t n = 0; n < b.n; n++) {
    f = NULL;
    mole_status st = gguf_open_buffer(b.p, n, "cut.gguf", &f);
    if (st != MOLE_ERR_FORMAT) fail_msg("truncated at %zu: status %d", n, st);
    assert_null(f);
    const char *msg = mole_last_error();
    if (strncmp(msg, "cut.gguf: offset ", 17) != 0) fail_msg("truncated at %zu: '%s'", n, msg);
    if (!strstr(msg, "truncated") && !strstr(msg, "exceeds the file") && !strstr(msg, "past the end") &&
        !strstr(msg, "cannot fit"))
      fail_msg("truncated at %zu: '%s'", n, msg);
  }
  bb_free(&b);
}

static void test_bad_header(void **state) {
  (void)state;
  bb b = {0};
  bb_bytes(&b, "GGUX", 4);
  bb_u32(&b, 3);
  bb_u64(&b, 0);
  bb_u64(&b, 0);
  expect_bad(&b, MOLE_ERR_FORMAT, 0, "magic", "GGUX", NULL);
  b.n = 0;
  bb_header(&b, 1, 0, 0);
  expect_bad(&b, MOLE_ERR_UNSUPPORTED, 4, "version 1", NULL);
  b.n = 0;
  bb_header(&b, 4, 0, 0);
  expect_bad(&b, MOLE_ERR_UNSUPPORTED, 4, "version 4", NULL);
  b.n = 0;
  bb_header(&b, 0x03000000, 0, 0);
  expect_bad(&b, MOLE_ERR_UNSUPPORTED, 4, "big-endian", NULL);
  b.n = 0;
  bb_header(&b, 3, 0, 1ull << 60);
  bb_kv_u32(&b, "a", 1);
  expect_bad(&b, MOLE_ERR_FORMAT, 16, "kv count 1152921504606846976", "cannot fit", NULL);
  b.n = 0;
  bb_header(&b, 3, UINT64_MAX, 1);
  bb_kv_u32(&b, "a", 1);
  expect_bad(&b, MOLE_ERR_FORMAT, 8, "tensor count 18446744073709551615", NULL);
  b.n = 0;
  bb_header(&b, 2, 0, 0);  // v2 is fine, and an empty file is fine
  gguf_file *f;
  assert_int_equal(gguf_open_buffer(b.p, b.n, "v2.gguf", &f), MOLE_OK);
  assert_int_equal(gguf_version(f), 2);
  gguf_close(f);
  bb_free(&b);
}

static void test_bad_kv(void **state) {
  (void)state;
  bb b = {0};
  bb_header(&b, 3, 0, 2);
  bb_kv_u32(&b, "a", 1);
  size_t at = b.n;
  bb_str(&b, "general.name");
  bb_u32(&b, GGUF_T_STRING);
  size_t len_at = b.n;
  bb_u64(&b, UINT64_MAX);
  bb_fill(&b, 16);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)len_at, "kv[1] 'general.name': string length 18446744073709551615",
             "exceeds the file (16 bytes left)", NULL);

  b.n = at;  // empty key
  bb_str(&b, "");
  bb_u32(&b, GGUF_T_UINT8);
  bb_u8(&b, 0);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)at, "kv[1]", "key is empty", NULL);

  b.n = at;  // duplicate key
  bb_kv_u32(&b, "a", 2);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)at, "kv[1] 'a'", "duplicate key", NULL);

  b.n = at;  // huge key length
  bb_u64(&b, 1ull << 62);
  bb_fill(&b, 12);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)at, "kv[1]", "key length 4611686018427387904", NULL);

  b.n = at;  // value type out of range
  bb_str(&b, "k");
  size_t type_at = b.n;
  bb_u32(&b, 13);
  bb_u32(&b, 0);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)type_at, "kv[1] 'k'", "value type 13", NULL);

  b.n = at;  // bad bool
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_BOOL);
  size_t val_at = b.n;
  bb_u8(&b, 2);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "bool value 2", NULL);

  b.n = at;  // bad bool inside an array
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u32(&b, GGUF_T_BOOL);
  bb_u64(&b, 3);
  val_at = b.n;
  bb_u8(&b, 0);
  bb_u8(&b, 1);
  bb_u8(&b, 255);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at + 2, "kv[1] 'k'", "bool element 2 is 255", NULL);

  b.n = at;  // nested array
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  val_at = b.n;
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u64(&b, 1);
  bb_u32(&b, GGUF_T_UINT8);
  bb_u64(&b, 0);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "nested", NULL);

  b.n = at;  // element type out of range
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  val_at = b.n;
  bb_u32(&b, 99);
  bb_u64(&b, 0);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "element type 99", NULL);

  b.n = at;  // array count whose byte size overflows
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u32(&b, GGUF_T_UINT64);
  val_at = b.n;
  bb_u64(&b, 1ull << 62);
  bb_fill(&b, 64);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "array count 4611686018427387904", "overflows",
             NULL);

  b.n = at;  // array count that exceeds the file
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u32(&b, GGUF_T_FLOAT32);
  val_at = b.n;
  bb_u64(&b, 17);
  bb_fill(&b, 64);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "array count 17", "exceeds the file", NULL);

  b.n = at;  // array of strings with a huge count
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u32(&b, GGUF_T_STRING);
  val_at = b.n;
  bb_u64(&b, UINT64_MAX / 2);
  bb_fill(&b, 64);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "of strings exceeds the file", NULL);

  b.n = at;  // one bad string inside an array
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_ARRAY);
  bb_u32(&b, GGUF_T_STRING);
  bb_u64(&b, 3);
  bb_str(&b, "x");
  val_at = b.n;
  bb_u64(&b, 1000);
  bb_fill(&b, 20);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'k'", "string[1] length 1000", NULL);

  // general.alignment: wrong type, not a power of two, zero
  b.n = at;
  bb_str(&b, "general.alignment");
  type_at = b.n;
  bb_u32(&b, GGUF_T_UINT64);
  bb_u64(&b, 64);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)type_at, "kv[1] 'general.alignment'", "u32", NULL);
  uint32_t bad_align[] = {48, 0, 3};
  for (int k = 0; k < 3; k++) {
    b.n = at;
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_T_UINT32);
    val_at = b.n;
    bb_u32(&b, bad_align[k]);
    char frag[40];
    snprintf(frag, sizeof frag, "alignment %u", bad_align[k]);
    expect_bad(&b, MOLE_ERR_FORMAT, (long long)val_at, "kv[1] 'general.alignment'", frag, "power of two", NULL);
  }

  // a string value with an embedded NUL is fine, and its length is returned
  b.n = at;
  bb_str(&b, "k");
  bb_u32(&b, GGUF_T_STRING);
  bb_u64(&b, 3);
  bb_bytes(&b, "a\0b", 3);
  gguf_file *f;
  assert_int_equal(gguf_open_buffer(b.p, b.n, "nul.gguf", &f), MOLE_OK);
  uint64_t len;
  const char *s = gguf_kv_str(f, 1, 0, &len);
  assert_int_equal(len, 3);
  assert_memory_equal(s, "a\0b", 4);
  gguf_close(f);
  bb_free(&b);
}

// A file with one kv (optional alignment) and the given tensor infos; *info_at
// gets the offset of the last tensor info, data is n_data bytes.
static void build_tensors(bb *b, uint32_t align, int n, const char *const *names, const uint32_t *n_dims,
                          const int64_t (*ne)[4], const uint32_t *types, const uint64_t *offs, size_t n_data,
                          size_t *info_at) {
  bb_header(b, 3, (uint64_t)n, 1);
  bb_kv_u32(b, align ? "general.alignment" : "x", align ? align : 0);
  for (int i = 0; i < n; i++) {
    *info_at = b->n;
    bb_tensor(b, names[i], n_dims[i], ne[i], types[i], offs[i]);
  }
  bb_pad(b, align ? align : 32);
  bb_fill(b, n_data);
}

// One tensor 'w' of n_dims (at most 4 dims written) after a plain kv.
static void build_one(bb *b, uint32_t n_dims, const int64_t *ne, uint32_t type, size_t n_data, size_t *at) {
  b->n = 0;
  bb_header(b, 3, 1, 1);
  bb_kv_u32(b, "x", 0);
  *at = b->n;
  bb_str(b, "w");
  bb_u32(b, n_dims);
  for (uint32_t d = 0; d < n_dims && d < 4; d++) bb_u64(b, (uint64_t)ne[d]);
  bb_u32(b, type);
  bb_u64(b, 0);
  bb_pad(b, 32);
  bb_fill(b, n_data);
}

static void test_bad_tensor(void **state) {
  (void)state;
  bb b = {0};
  size_t at;
  const char *one[] = {"w"};
  const uint64_t off0[] = {0};
  // the info layout: name (8 + 1), n_dims (4), ne (8 each), type (4), offset (8)
  const size_t nd_off = 9, ne_off = 13;
  gguf_file *f;

  build_one(&b, 2, (int64_t[]){64, 2}, QT_F32, 512, &at);
  assert_int_equal(gguf_open_buffer(b.p, b.n, "ok.gguf", &f), MOLE_OK);
  gguf_close(f);

  build_one(&b, 0, (int64_t[]){64}, QT_F32, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + nd_off), "tensor[0] 'w'", "n_dims 0", NULL);
  build_one(&b, 5, (int64_t[]){1, 1, 1, 1}, QT_F32, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + nd_off), "tensor[0] 'w'", "n_dims 5", NULL);
  build_one(&b, 2, (int64_t[]){64, 0}, QT_F32, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off + 8), "tensor[0] 'w'", "ne[1] = 0", NULL);
  build_one(&b, 1, (int64_t[]){-5}, QT_F32, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off), "tensor[0] 'w'", "ne[0] = -5", NULL);
  build_one(&b, 3, (int64_t[]){1ll << 32, 1ll << 20, 1ll << 12}, QT_F32, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off + 16), "tensor[0] 'w'", "ne[2] = 4096", "overflows",
             NULL);
  build_one(&b, 2, (int64_t[]){1ll << 42, 1ll << 20}, QT_F32, 512, &at);  // int64 elements, but the bytes overflow
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off), "tensor[0] 'w'", "overflows", NULL);
  build_one(&b, 1, (int64_t[]){64}, 31, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off + 8), "tensor[0] 'w'", "type 31", NULL);
  build_one(&b, 1, (int64_t[]){64}, 200, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off + 8), "tensor[0] 'w'", "type 200", NULL);
  build_one(&b, 2, (int64_t[]){48, 2}, QT_Q4_0, 512, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off), "tensor[0] 'w'", "ne[0] = 48",
             "not a multiple of the block size 32 of q4_0", NULL);
  build_one(&b, 2, (int64_t[]){64, 2}, QT_F32, 511, &at);  // data one byte short
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + ne_off + 20), "tensor[0] 'w'", "past the end of the file", NULL);

  // misaligned offset (alignment 64), and offset past the end
  const uint32_t nd1[] = {1, 1};
  const int64_t ne1[][4] = {{16}, {16}};
  const uint32_t f32s[] = {QT_F32, QT_F32};
  b.n = 0;
  build_tensors(&b, 64, 1, one, nd1, ne1, f32s, (const uint64_t[]){32}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + 25), "tensor[0] 'w'", "offset 32 is not a multiple of the alignment 64",
             NULL);
  b.n = 0;
  build_tensors(&b, 64, 1, one, nd1, ne1, f32s, (const uint64_t[]){1ull << 62}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + 25), "tensor[0] 'w'", "past the end", NULL);
  b.n = 0;
  build_tensors(&b, 64, 1, one, nd1, ne1, f32s, (const uint64_t[]){UINT64_MAX - 63}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + 25), "tensor[0] 'w'", "past the end", NULL);

  // two tensors: overlapping, duplicate names; a proper pair opens
  const char *two[] = {"p", "q"};
  const int64_t ne2[][4] = {{32}, {32}};  // 128 bytes each
  b.n = 0;
  build_tensors(&b, 64, 2, two, nd1, ne2, f32s, (const uint64_t[]){0, 128}, 256, &at);
  assert_int_equal(gguf_open_buffer(b.p, b.n, "ok.gguf", &f), MOLE_OK);
  assert_int_equal(gguf_alignment(f), 64);
  gguf_close(f);
  b.n = 0;
  build_tensors(&b, 64, 2, two, nd1, ne2, f32s, (const uint64_t[]){0, 64}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at + 25), "tensor[1] 'q'", "overlaps tensor[0] 'p'", NULL);
  b.n = 0;
  build_tensors(&b, 64, 2, two, nd1, ne2, f32s, (const uint64_t[]){64, 0}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)(at - 33 + 25), "tensor[0] 'p'", "overlaps tensor[1] 'q'", NULL);
  const char *dup[] = {"p", "p"};
  b.n = 0;
  build_tensors(&b, 64, 2, dup, nd1, ne2, f32s, (const uint64_t[]){0, 128}, 256, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)at, "tensor[1] 'p'", "duplicate tensor name", NULL);
  const char *empty[] = {""};
  b.n = 0;
  build_tensors(&b, 64, 1, empty, nd1, ne1, f32s, off0, 64, &at);
  expect_bad(&b, MOLE_ERR_FORMAT, (long long)at, "tensor[0]", "name is empty", NULL);
  bb_free(&b);
}

static void test_open_errors(void **state) {
  (void)state;
  gguf_file *f = NULL;
  assert_int_equal(gguf_open("/nonexistent/x.gguf", &f), MOLE_ERR_IO);
  assert_non_null(strstr(mole_last_error(), "/nonexistent/x.gguf"));
  assert_int_equal(gguf_open("/tmp", &f), MOLE_ERR_IO);
  assert_null(f);
}

// ---- writer / reader round trip ---------------------------------------------

static void tmp_path(char *buf, size_t n, const char *tag) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, n, "%s/mole-test-gguf-%d-%s.gguf", dir && *dir ? dir : "/tmp", (int)getpid(), tag);
}

// A source file with a scalar of every type, read back, copied by the writer.
static gguf_file *open_scalars(bb *b) {
  bb_header(b, 3, 0, 11);
  static const struct {
    const char *key;
    gguf_type t;
    uint64_t v;
  } sc[] = {
      {"s.u8", GGUF_T_UINT8, 200},           {"s.i8", GGUF_T_INT8, (uint8_t)-100},
      {"s.u16", GGUF_T_UINT16, 60000},       {"s.i16", GGUF_T_INT16, (uint16_t)-30000},
      {"s.u32", GGUF_T_UINT32, 4000000000u}, {"s.i32", GGUF_T_INT32, (uint32_t)-2000000000},
      {"s.f32", GGUF_T_FLOAT32, 0x3fc00000}, {"s.bool", GGUF_T_BOOL, 0},
      {"s.u64", GGUF_T_UINT64, UINT64_MAX},  {"s.i64", GGUF_T_INT64, (uint64_t)INT64_MIN},
      {"s.f64", GGUF_T_FLOAT64, 0x400921fb54442d18ull},
  };
  for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
    bb_str(b, sc[i].key);
    bb_u32(b, sc[i].t);
    bb_bytes(b, &sc[i].v, gguf_type_size(sc[i].t));
  }
  gguf_file *f;
  assert_int_equal(gguf_open_buffer(b->p, b->n, "scalars.gguf", &f), MOLE_OK);
  return f;
}

typedef struct {
  const char *name;
  uint32_t type, n_dims;
  int64_t ne[4];
} tspec;

static void test_roundtrip(void **state) {
  (void)state;
  bb src_b = {0};
  gguf_file *src = open_scalars(&src_b);
  gguf_writer *w;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  gguf_writer_set_alignment(w, 64);
  assert_int_equal(gguf_writer_set_str(w, "general.architecture", "first"), MOLE_OK);
  for (int64_t i = 0; i < gguf_n_kv(src); i++) assert_int_equal(gguf_writer_copy_kv(w, src, i), MOLE_OK);
  assert_int_equal(gguf_writer_set_u32(w, "w.u32", 7), MOLE_OK);
  assert_int_equal(gguf_writer_set_i32(w, "w.i32", -7), MOLE_OK);
  assert_int_equal(gguf_writer_set_u64(w, "w.u64", 1ull << 40), MOLE_OK);
  assert_int_equal(gguf_writer_set_f32(w, "w.f32", 0.25f), MOLE_OK);
  assert_int_equal(gguf_writer_set_bool(w, "w.bool", true), MOLE_OK);
  const int32_t ints[] = {1, -2, 3, 1 << 30, -5};
  const float floats[] = {0.5f, -1.0f, 3.25f};
  const double f64s[] = {1e300, -2.5};
  const uint8_t bools[] = {1, 0, 1};
  const uint64_t u64s[] = {0, UINT64_MAX};
  const char *strs[] = {"alpha", "", "gamma with space", "\xe2\x96\x81uni"};
  assert_int_equal(gguf_writer_set_arr(w, "a.i32", GGUF_T_INT32, ints, 5), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "a.f32", GGUF_T_FLOAT32, floats, 3), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "a.f64", GGUF_T_FLOAT64, f64s, 2), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "a.bool", GGUF_T_BOOL, bools, 3), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "a.u64", GGUF_T_UINT64, u64s, 2), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "a.empty", GGUF_T_UINT8, NULL, 0), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr_str(w, "a.str", strs, 4), MOLE_OK);
  assert_int_equal(gguf_writer_set_str(w, "general.architecture", "llama"), MOLE_OK);  // replaces in place
  // bad writer arguments
  const uint8_t badb[] = {0, 2};
  assert_int_equal(gguf_writer_set_arr(w, "a.bad", GGUF_T_BOOL, badb, 2), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_set_arr(w, "a.bad", GGUF_T_STRING, strs, 2), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_set_u32(w, "", 1), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 48), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_set_str(w, "general.alignment", "64"), MOLE_ERR_ARG);

  const tspec ts[] = {
      {"t.f32", QT_F32, 2, {7, 3, 1, 1}},      {"t.q4_0", QT_Q4_0, 2, {64, 2, 1, 1}},
      {"t.q8_0", QT_Q8_0, 3, {32, 3, 2, 1}},   {"t.f16", QT_F16, 1, {5, 1, 1, 1}},
      {"t.q4_k", QT_Q4_K, 4, {256, 1, 2, 1}},  {"t.bf16", QT_BF16, 2, {3, 3, 1, 1}},
  };
  const int nt = (int)(sizeof ts / sizeof *ts);
  for (int i = 0; i < nt; i++) {
    int64_t idx;
    assert_int_equal(gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, &idx), MOLE_OK);
    assert_int_equal(idx, i);
  }
  assert_int_equal(gguf_writer_add_tensor(w, "t.f32", QT_F32, 1, (int64_t[]){4}, NULL), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_add_tensor(w, "t.bad", QT_Q4_0, 1, (int64_t[]){48}, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "t.bad"));
  assert_int_equal(gguf_writer_add_tensor(w, "t.bad", 31, 1, (int64_t[]){4}, NULL), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_add_tensor(w, "t.bad", QT_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, NULL), MOLE_ERR_ARG);
  assert_int_equal(gguf_writer_add_tensor(w, "t.bad", QT_F32, 2, (int64_t[]){4, 0}, NULL), MOLE_ERR_ARG);

  // tensor data: reproducible bytes, streamed in awkward chunks
  size_t sizes[16], total = 0;
  for (int i = 0; i < nt; i++) {
    int64_t nel = ts[i].ne[0] * ts[i].ne[1] * ts[i].ne[2] * ts[i].ne[3];
    sizes[i] = (size_t)(nel / quant_blck_size(ts[i].type)) * quant_type_size(ts[i].type);
    total += sizes[i];
  }
  uint8_t *data = malloc(total);
  uint64_t rng = 42;
  for (size_t k = 0; k < total; k++) data[k] = (uint8_t)tu_rand_u64(&rng);
  char path[512];
  tmp_path(path, sizeof path, "rt");
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  const size_t chunks[] = {1, 7, 1000, 3, 64, 129};
  size_t pos = 0;
  for (int c = 0; pos < total; c++) {
    size_t k = MOLE_MIN(chunks[c % 6], total - pos);
    assert_int_equal(gguf_writer_write(w, data + pos, k), MOLE_OK);
    pos += k;
  }
  uint8_t extra = 0;
  assert_int_equal(gguf_writer_write(w, &extra, 1), MOLE_ERR_ARG);  // more than declared
  assert_non_null(strstr(mole_last_error(), path));
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);

  gguf_file *f;
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(gguf_version(f), 3);
  assert_int_equal(gguf_alignment(f), 64);
  assert_int_equal(gguf_data_offset(f) % 64, 0);
  // keys in insertion order; general.alignment appended by begin
  const char *order[] = {"general.architecture", "s.u8", "s.i8", "s.u16", "s.i16", "s.u32", "s.i32",
                         "s.f32", "s.bool", "s.u64", "s.i64", "s.f64", "w.u32", "w.i32",
                         "w.u64", "w.f32", "w.bool", "a.i32", "a.f32", "a.f64", "a.bool",
                         "a.u64", "a.empty", "a.str", "general.alignment"};
  const int64_t nk = (int64_t)(sizeof order / sizeof *order);
  assert_int_equal(gguf_n_kv(f), nk);
  for (int64_t i = 0; i < nk; i++) assert_string_equal(gguf_kv_key(f, i), order[i]);
  const char *s;
  assert_int_equal(gguf_get_str(f, "general.architecture", &s), MOLE_OK);
  assert_string_equal(s, "llama");
  // the copied scalars: same type and bytes as the source
  for (int64_t i = 0; i < gguf_n_kv(src); i++) {
    int64_t j = gguf_find_kv(f, gguf_kv_key(src, i));
    assert_true(j >= 0);
    assert_int_equal(gguf_kv_type(f, j), gguf_kv_type(src, i));
    assert_memory_equal(gguf_kv_data(f, j), gguf_kv_data(src, i), gguf_type_size(gguf_kv_type(src, i)));
  }
  int64_t iv;
  double dv;
  bool bv;
  assert_int_equal(gguf_get_int(f, "s.i16", &iv), MOLE_OK);
  assert_int_equal(iv, -30000);
  assert_int_equal(gguf_get_int(f, "s.i64", &iv), MOLE_OK);
  assert_true(iv == INT64_MIN);
  assert_int_equal(gguf_get_int(f, "s.u64", &iv), MOLE_ERR_FORMAT);  // exceeds int64
  assert_int_equal(gguf_get_float(f, "s.f32", &dv), MOLE_OK);
  assert_true(dv == 1.5);
  assert_int_equal(gguf_get_float(f, "s.f64", &dv), MOLE_OK);
  assert_true(dv == 3.141592653589793);
  assert_int_equal(gguf_get_bool(f, "s.bool", &bv), MOLE_OK);
  assert_false(bv);
  assert_int_equal(gguf_get_int(f, "w.i32", &iv), MOLE_OK);
  assert_int_equal(iv, -7);
  assert_int_equal(gguf_get_int(f, "w.u64", &iv), MOLE_OK);
  assert_int_equal(iv, 1ll << 40);
  assert_int_equal(gguf_get_float(f, "w.f32", &dv), MOLE_OK);
  assert_true(dv == 0.25);
  assert_int_equal(gguf_get_bool(f, "w.bool", &bv), MOLE_OK);
  assert_true(bv);
  assert_int_equal(gguf_get_int(f, "general.alignment", &iv), MOLE_OK);
  assert_int_equal(iv, 64);
  struct {
    const char *key;
    gguf_type t;
    const void *p;
    uint64_t n;
  } arrs[] = {{"a.i32", GGUF_T_INT32, ints, 5},  {"a.f32", GGUF_T_FLOAT32, floats, 3},
              {"a.f64", GGUF_T_FLOAT64, f64s, 2}, {"a.bool", GGUF_T_BOOL, bools, 3},
              {"a.u64", GGUF_T_UINT64, u64s, 2},  {"a.empty", GGUF_T_UINT8, NULL, 0}};
  for (size_t a = 0; a < sizeof arrs / sizeof *arrs; a++) {
    int64_t j = gguf_find_kv(f, arrs[a].key);
    assert_int_equal(gguf_kv_type(f, j), GGUF_T_ARRAY);
    assert_int_equal(gguf_kv_arr_type(f, j), arrs[a].t);
    assert_int_equal(gguf_kv_arr_n(f, j), arrs[a].n);
    if (arrs[a].n) assert_memory_equal(gguf_kv_data(f, j), arrs[a].p, arrs[a].n * gguf_type_size(arrs[a].t));
  }
  for (uint64_t k = 0; k < 5; k++) {
    assert_int_equal(gguf_get_arr_int(f, "a.i32", k, &iv), MOLE_OK);
    assert_int_equal(iv, ints[k]);
  }
  int64_t js = gguf_find_kv(f, "a.str");
  assert_int_equal(gguf_kv_arr_type(f, js), GGUF_T_STRING);
  assert_int_equal(gguf_kv_arr_n(f, js), 4);
  assert_null(gguf_kv_data(f, js));
  for (uint64_t k = 0; k < 4; k++) {
    uint64_t len;
    assert_string_equal(gguf_kv_str(f, js, k, &len), strs[k]);
    assert_int_equal(len, strlen(strs[k]));
  }
  // tensors: geometry, aligned offsets, bytes
  assert_int_equal(gguf_n_tensors(f), nt);
  pos = 0;
  for (int i = 0; i < nt; i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    assert_ptr_equal(gguf_find_tensor(f, ts[i].name), t);
    assert_string_equal(t->name, ts[i].name);
    assert_int_equal(t->type, ts[i].type);
    assert_int_equal(t->n_dims, ts[i].n_dims);
    for (int d = 0; d < 4; d++) assert_int_equal(t->ne[d], ts[i].ne[d]);
    assert_int_equal(t->offset % 64, 0);
    assert_int_equal(t->size, sizes[i]);
    assert_memory_equal(t->data, data + pos, sizes[i]);
    pos += sizes[i];
  }
  gguf_close(f);

  // a second writer: file without tensors; finish with missing data fails
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_add_tensor(w, "x", QT_F32, 1, (int64_t[]){8}, NULL), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_write(w, data, 31), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "'x': 31 of 32 bytes"));
  gguf_writer_free(w);
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_u32(w, "k", 1), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(gguf_n_tensors(f), 0);
  assert_int_equal(gguf_n_kv(f), 1);
  gguf_close(f);
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, "/nonexistent/dir/x.gguf"), MOLE_ERR_IO);
  assert_non_null(strstr(mole_last_error(), "/nonexistent/dir/x.gguf"));
  gguf_writer_free(w);

  unlink(path);
  free(data);
  gguf_close(src);
  bb_free(&src_b);
}

// A 150k-entry vocabulary loads (its time is printed, not asserted: speed
// is for the benchmarks; a quadratic parse would run into ctest's timeout).
static void test_big_vocab(void **state) {
  (void)state;
  enum { N = 150000 };
  char *pool = malloc((size_t)N * 16);
  const char **strs = malloc((size_t)N * sizeof *strs);
  for (int i = 0; i < N; i++) {
    snprintf(pool + (size_t)i * 16, 16, "tok%d", i);
    strs[i] = pool + (size_t)i * 16;
  }
  gguf_writer *w;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, N), MOLE_OK);
  char path[512];
  tmp_path(path, sizeof path, "vocab");
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  int64_t best = INT64_MAX;
  for (int rep = 0; rep < 3; rep++) {
    int64_t t0 = mole_time_us();
    gguf_file *f;
    assert_int_equal(gguf_open(path, &f), MOLE_OK);
    int64_t dt = mole_time_us() - t0;
    best = MOLE_MIN(best, dt);
    uint64_t len;
    assert_int_equal(gguf_kv_arr_n(f, 0), N);
    assert_string_equal(gguf_kv_str(f, 0, N - 1, &len), "tok149999");
    gguf_close(f);
  }
  print_message("150k-entry vocabulary opened in %.2f ms\n", (double)best / 1000.0);
  unlink(path);
  free(strs);
  free(pool);
}

static void test_conformance_files(void **state) {
  (void)state;
  static const struct {
    const char *file, *arch;
    int64_t n_tensors;
    uint64_t n_tokens;
  } fx[] = {
      {"models/llama-dense.gguf", "llama", 21, 512},
      {"models/mixtral.gguf", "llama", 33, 512},
      {"models/mixtral-f16.gguf", "llama", 23, 512},
      {"models/mixtral-bf16.gguf", "llama", 23, 512},
      {"models/mixtral-q8_0.gguf", "llama", 23, 512},
      {"models/mixtral-q4_0.gguf", "llama", 23, 512},
      {"models/mixtral-q4_k_m.gguf", "llama", 23, 512},
      {"models/mixtral-q5_k_m.gguf", "llama", 23, 512},
      {"models/mixtral-q6_k.gguf", "llama", 23, 512},
      {"models/olmoe.gguf", "olmoe", 27, 512},
      {"models/qwen2moe.gguf", "qwen2moe", 37, 512},
      {"models/qwen3moe.gguf", "qwen3moe", 27, 512},
      {"tokenizer/ggml-vocab-deepseek-coder.gguf", "llama", 0, 32256},
      {"tokenizer/ggml-vocab-gpt-2.gguf", "gpt2", 0, 50257},
      {"tokenizer/ggml-vocab-llama-spm.gguf", "llama", 0, 32000},
      {"tokenizer/ggml-vocab-phi-3.gguf", "phi3", 0, 32064},
  };
  for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/conformance/%s", fx[i].file);
    gguf_file *f;
    mole_status st = gguf_open(tu_path(rel), &f);
    if (st) fail_msg("%s: %s", rel, mole_last_error());
    const char *arch;
    assert_int_equal(gguf_get_str(f, "general.architecture", &arch), MOLE_OK);
    assert_string_equal(arch, fx[i].arch);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_tensors(f), fx[i].n_tensors);
    int64_t k = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_true(k >= 0);
    assert_int_equal(gguf_kv_type(f, k), GGUF_T_ARRAY);
    assert_int_equal(gguf_kv_arr_type(f, k), GGUF_T_STRING);
    assert_int_equal(gguf_kv_arr_n(f, k), fx[i].n_tokens);
    if (fx[i].n_tensors > 0) {
      const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
      assert_non_null(t);
      assert_int_equal(t->n_dims, 2);
      assert_int_equal(t->ne[1], 512);
      assert_non_null(gguf_find_tensor(f, "output_norm.weight"));
      int64_t nl;
      char key[128];
      snprintf(key, sizeof key, "%s.block_count", arch);
      assert_int_equal(gguf_get_int(f, key, &nl), MOLE_OK);
      assert_true(nl >= 1);
      uint64_t end = 0;
      for (int64_t j = 0; j < gguf_n_tensors(f); j++) {
        const gguf_tensor *tj = gguf_tensor_at(f, j);
        end = MOLE_MAX(end, gguf_data_offset(f) + tj->offset + tj->size);
      }
      assert_true(end <= gguf_size(f));
      assert_true(end + 32 > gguf_size(f));  // the data reaches the end of the file
    }
    gguf_close(f);
  }
  // the quantized twins carry their types
  gguf_file *f;
  assert_int_equal(gguf_open(tu_path("tests/data/conformance/models/mixtral-q4_0.gguf"), &f), MOLE_OK);
  assert_int_equal(gguf_find_tensor(f, "token_embd.weight")->type, QT_Q4_0);
  gguf_close(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_and_truncated), cmocka_unit_test(test_bad_header),
      cmocka_unit_test(test_bad_kv),              cmocka_unit_test(test_bad_tensor),
      cmocka_unit_test(test_open_errors),         cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_big_vocab),           cmocka_unit_test(test_conformance_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
