// gguf: the GGUF v2/v3 reader. The file is mapped read-only; every field is
// bounds-checked against the mapping and validated before anything is
// trusted, and a bad field is reported as "<path>: offset N: <field> <what>".
// Keys, tensor names and string values are copied nul-terminated (a string
// array is one allocation); numeric values are copied to aligned memory;
// tensor data stays in the mapping.
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant_types.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

enum {
  HEADER_BYTES = 24,     // magic, version, tensor count, kv count
  MIN_KV_BYTES = 13,     // key length + 1 key byte + type + 1 value byte
  MIN_TENSOR_BYTES = 33, // name length + 1 name byte + n_dims + ne[0] + type + offset
  NAME_SHOWN = 64,       // key/name bytes quoted in messages
};

static const size_t k_type_size[GGUF_T_COUNT] = {
    [GGUF_T_UINT8] = 1,  [GGUF_T_INT8] = 1,   [GGUF_T_UINT16] = 2, [GGUF_T_INT16] = 2,
    [GGUF_T_UINT32] = 4, [GGUF_T_INT32] = 4,  [GGUF_T_FLOAT32] = 4, [GGUF_T_BOOL] = 1,
    [GGUF_T_STRING] = 0, [GGUF_T_ARRAY] = 0,  [GGUF_T_UINT64] = 8, [GGUF_T_INT64] = 8,
    [GGUF_T_FLOAT64] = 8,
};

static const char *const k_type_name[GGUF_T_COUNT] = {
    [GGUF_T_UINT8] = "u8",   [GGUF_T_INT8] = "i8",     [GGUF_T_UINT16] = "u16",
    [GGUF_T_INT16] = "i16",  [GGUF_T_UINT32] = "u32",  [GGUF_T_INT32] = "i32",
    [GGUF_T_FLOAT32] = "f32", [GGUF_T_BOOL] = "bool",  [GGUF_T_STRING] = "string",
    [GGUF_T_ARRAY] = "array", [GGUF_T_UINT64] = "u64", [GGUF_T_INT64] = "i64",
    [GGUF_T_FLOAT64] = "f64",
};

const char *gguf_type_name(gguf_type t) { return (unsigned)t < GGUF_T_COUNT ? k_type_name[t] : "invalid"; }

size_t gguf_type_size(gguf_type t) { return (unsigned)t < GGUF_T_COUNT ? k_type_size[t] : 0; }

// ---- name index: open addressing over nul-terminated names without NULs ----

typedef struct {
  const char *name;  // NULL: empty slot
  int64_t idx;
} ix_slot;

typedef struct {
  ix_slot *slots;
  uint64_t mask;
} name_index;

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return h;
}

static mole_status ix_init(name_index *ix, int64_t n) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap <<= 1;
  ix->slots = mole_calloc(cap, sizeof *ix->slots);
  ix->mask = cap - 1;
  return ix->slots ? MOLE_OK : MOLE_ERR_NOMEM;
}

// Index of the name s[0..n) (no NUL bytes inside), or -1.
static int64_t ix_find(const name_index *ix, const char *s, size_t n) {
  if (!ix->slots) return -1;
  for (uint64_t h = hash_bytes(s, n) & ix->mask;; h = (h + 1) & ix->mask) {
    const ix_slot *sl = &ix->slots[h];
    if (!sl->name) return -1;
    if (strncmp(sl->name, s, n) == 0 && sl->name[n] == '\0') return sl->idx;
  }
}

static void ix_insert(name_index *ix, const char *name, int64_t idx) {
  uint64_t h = hash_bytes(name, strlen(name)) & ix->mask;
  while (ix->slots[h].name) h = (h + 1) & ix->mask;
  ix->slots[h] = (ix_slot){name, idx};
}

// ---- the file ----------------------------------------------------------

typedef struct gguf_kv {
  char *key;           // nul-terminated copy
  gguf_type type;
  gguf_type arr_type;  // element type of an ARRAY; == type for a scalar
  uint64_t n;          // elements (1 for a scalar)
  void *data;          // numeric/bool elements, 8-byte aligned; NULL for strings
  char **strs;         // [n] nul-terminated copies (string or string array)
  uint64_t *lens;      // [n] byte lengths
  void *block;         // the one allocation behind data or strs/lens
  uint64_t scalar;     // storage of a numeric scalar (data points here)
} gguf_kv;

struct gguf_file {
  char *path;
  const uint8_t *base;  // the mapping or the caller's buffer
  size_t size;
  bool mapped;
  uint32_t version;
  uint64_t alignment;
  uint64_t data_offset;
  int64_t n_kv;
  gguf_kv *kvs;  // [n_kv]
  int64_t n_tensors;
  gguf_tensor *tensors;  // [n_tensors]
  name_index kv_ix, tensor_ix;
};

// ---- the parser: a cursor over the bytes, and the message context -------

typedef struct {
  const uint8_t *p;
  size_t size;
  size_t off;
  const char *path;
  char ctx[NAME_SHOWN + 48];  // "kv[3] 'general.name': "
} rd;

static mole_status rd_fail(rd *r, mole_status st, size_t off, const char *fmt, ...) MOLE_PRINTF(4, 5);

static mole_status rd_fail(rd *r, mole_status st, size_t off, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mole_errorf(st, "%s: offset %zu: %s%s", r->path, off, r->ctx, msg);
}

static size_t rd_left(const rd *r) { return r->size - r->off; }

static mole_status rd_need(rd *r, uint64_t n, const char *what) {
  if (n > rd_left(r))
    return rd_fail(r, MOLE_ERR_FORMAT, r->off, "%s truncated (needs %" PRIu64 " bytes, %zu left)", what, n,
                   rd_left(r));
  return MOLE_OK;
}

static mole_status rd_u32(rd *r, const char *what, uint32_t *v) {
  mole_status st = rd_need(r, 4, what);
  if (st) return st;
  memcpy(v, r->p + r->off, 4);
  r->off += 4;
  return MOLE_OK;
}

static mole_status rd_u64(rd *r, const char *what, uint64_t *v) {
  mole_status st = rd_need(r, 8, what);
  if (st) return st;
  memcpy(v, r->p + r->off, 8);
  r->off += 8;
  return MOLE_OK;
}

// A length-prefixed string: *s points into the buffer (not nul-terminated).
static mole_status rd_str(rd *r, const char *what, const char **s, uint64_t *len) {
  size_t at = r->off;
  char field[48];
  snprintf(field, sizeof field, "%s length", what);
  mole_status st = rd_u64(r, field, len);
  if (st) return st;
  if (*len > rd_left(r))
    return rd_fail(r, MOLE_ERR_FORMAT, at, "%s length %" PRIu64 " exceeds the file (%zu bytes left)", what, *len,
                   rd_left(r));
  *s = (const char *)r->p + r->off;
  r->off += (size_t)*len;
  return MOLE_OK;
}

// A printable rendering of a key/name for messages (at most NAME_SHOWN bytes).
static void show_name(char *out, size_t cap, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && i < NAME_SHOWN && k + 1 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    out[k++] = (c < 0x20 || c == 0x7f || c == '\'') ? '?' : (char)c;
  }
  if (n > NAME_SHOWN && k + 4 < cap) {
    memcpy(out + k, "...", 3);
    k += 3;
  }
  out[k] = '\0';
}

static void rd_set_ctx(rd *r, const char *kind, int64_t i, const char *name, size_t n) {
  if (!name) {
    snprintf(r->ctx, sizeof r->ctx, "%s[%" PRId64 "]: ", kind, i);
    return;
  }
  char shown[NAME_SHOWN + 8];
  show_name(shown, sizeof shown, name, n);
  snprintf(r->ctx, sizeof r->ctx, "%s[%" PRId64 "] '%s': ", kind, i, shown);
}

static char *copy_str(const char *s, size_t n) {
  char *d = mole_malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static mole_status rd_nomem(rd *r) {
  return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory while reading %s", r->path, r->ctx);
}

// n strings: validated in a first pass, then copied into one allocation
// laid out as [char *strs[n]][uint64_t lens[n]][bytes + NUL ...].
static mole_status parse_strings(rd *r, gguf_kv *kv, uint64_t n, bool is_array) {
  size_t start = r->off;
  uint64_t total = 0;
  for (uint64_t j = 0; j < n; j++) {
    size_t at = r->off;
    uint64_t len = 0;
    bool ok = rd_left(r) >= 8;
    if (ok) {
      memcpy(&len, r->p + r->off, 8);
      ok = len <= rd_left(r) - 8;
    }
    if (!ok) {
      char what[48];
      if (is_array)
        snprintf(what, sizeof what, "string[%" PRIu64 "]", j);
      else
        snprintf(what, sizeof what, "string");
      if (rd_left(r) < 8) {
        char field[64];
        snprintf(field, sizeof field, "%s length", what);
        return rd_need(r, 8, field);
      }
      return rd_fail(r, MOLE_ERR_FORMAT, at, "%s length %" PRIu64 " exceeds the file (%zu bytes left)", what,
                     len, rd_left(r) - 8);
    }
    r->off += 8 + (size_t)len;
    total += len + 1;  // bounded by the file size: no overflow
  }
  size_t bytes = (size_t)n * (sizeof(char *) + sizeof(uint64_t)) + (size_t)total;
  char *block = mole_malloc(bytes);
  if (!block) return rd_nomem(r);
  kv->block = block;
  kv->strs = (char **)block;
  kv->lens = (uint64_t *)(block + (size_t)n * sizeof(char *));
  char *chars = block + (size_t)n * (sizeof(char *) + sizeof(uint64_t));
  const uint8_t *p = r->p + start;
  for (uint64_t j = 0; j < n; j++) {
    uint64_t len;
    memcpy(&len, p, 8);
    p += 8;
    memcpy(chars, p, (size_t)len);
    chars[len] = '\0';
    kv->strs[j] = chars;
    kv->lens[j] = len;
    chars += len + 1;
    p += len;
  }
  return MOLE_OK;
}

static mole_status check_bools(rd *r, const uint8_t *v, uint64_t n, size_t at, bool is_array) {
  for (uint64_t j = 0; j < n; j++) {
    if (v[j] > 1) {
      if (is_array)
        return rd_fail(r, MOLE_ERR_FORMAT, at + (size_t)j, "bool element %" PRIu64 " is %u (must be 0 or 1)", j,
                       v[j]);
      return rd_fail(r, MOLE_ERR_FORMAT, at, "bool value %u (must be 0 or 1)", v[j]);
    }
  }
  return MOLE_OK;
}

static mole_status parse_array(rd *r, gguf_kv *kv) {
  size_t at = r->off;
  uint32_t et;
  uint64_t n;
  mole_status st = rd_u32(r, "array element type", &et);
  if (st) return st;
  if (et >= GGUF_T_COUNT)
    return rd_fail(r, MOLE_ERR_FORMAT, at, "array element type %u out of range (0..%d)", et, GGUF_T_COUNT - 1);
  if (et == GGUF_T_ARRAY) return rd_fail(r, MOLE_ERR_FORMAT, at, "array element type: nested arrays are not allowed");
  kv->arr_type = (gguf_type)et;
  at = r->off;
  if ((st = rd_u64(r, "array count", &n))) return st;
  kv->n = n;
  if (et == GGUF_T_STRING) {
    if (n > rd_left(r) / 8)
      return rd_fail(r, MOLE_ERR_FORMAT, at, "array count %" PRIu64 " of strings exceeds the file (%zu bytes left)",
                     n, rd_left(r));
    return parse_strings(r, kv, n, true);
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(n, (uint64_t)k_type_size[et], &bytes))
    return rd_fail(r, MOLE_ERR_FORMAT, at, "array count %" PRIu64 " of %s overflows the byte size", n, k_type_name[et]);
  if (bytes > rd_left(r))
    return rd_fail(r, MOLE_ERR_FORMAT, at,
                   "array count %" PRIu64 " of %s (%" PRIu64 " bytes) exceeds the file (%zu bytes left)", n,
                   k_type_name[et], bytes, rd_left(r));
  if (et == GGUF_T_BOOL && (st = check_bools(r, r->p + r->off, n, r->off, true))) return st;
  kv->block = mole_malloc((size_t)bytes);
  if (!kv->block) return rd_nomem(r);
  memcpy(kv->block, r->p + r->off, (size_t)bytes);
  kv->data = kv->block;
  r->off += (size_t)bytes;
  return MOLE_OK;
}

static mole_status parse_kv(gguf_file *f, rd *r, int64_t i) {
  gguf_kv *kv = &f->kvs[i];
  rd_set_ctx(r, "kv", i, NULL, 0);
  size_t at = r->off;
  const char *key;
  uint64_t klen;
  mole_status st = rd_str(r, "key", &key, &klen);
  if (st) return st;
  if (klen == 0) return rd_fail(r, MOLE_ERR_FORMAT, at, "key is empty");
  rd_set_ctx(r, "kv", i, key, (size_t)klen);
  if (memchr(key, 0, (size_t)klen)) return rd_fail(r, MOLE_ERR_FORMAT, at, "key contains a NUL byte");
  int64_t dup = ix_find(&f->kv_ix, key, (size_t)klen);
  if (dup >= 0) return rd_fail(r, MOLE_ERR_FORMAT, at, "duplicate key (first defined by kv[%" PRId64 "])", dup);
  if (!(kv->key = copy_str(key, (size_t)klen))) return rd_nomem(r);
  ix_insert(&f->kv_ix, kv->key, i);

  size_t type_at = r->off;
  uint32_t t;
  if ((st = rd_u32(r, "value type", &t))) return st;
  if (t >= GGUF_T_COUNT)
    return rd_fail(r, MOLE_ERR_FORMAT, type_at, "value type %u out of range (0..%d)", t, GGUF_T_COUNT - 1);
  kv->type = kv->arr_type = (gguf_type)t;
  kv->n = 1;
  size_t val_at = r->off;
  if (t == GGUF_T_ARRAY) {
    st = parse_array(r, kv);
  } else if (t == GGUF_T_STRING) {
    st = parse_strings(r, kv, 1, false);
  } else {
    char what[32];
    snprintf(what, sizeof what, "%s value", k_type_name[t]);
    if (!(st = rd_need(r, k_type_size[t], what))) {
      memcpy(&kv->scalar, r->p + r->off, k_type_size[t]);
      kv->data = &kv->scalar;
      if (t == GGUF_T_BOOL) st = check_bools(r, r->p + r->off, 1, r->off, false);
      r->off += k_type_size[t];
    }
  }
  if (st) return st;

  if (strcmp(kv->key, "general.alignment") == 0) {
    if (t != GGUF_T_UINT32)
      return rd_fail(r, MOLE_ERR_FORMAT, type_at, "value type %s (general.alignment must be u32)", k_type_name[t]);
    uint32_t a = (uint32_t)kv->scalar;
    if (a == 0 || (a & (a - 1)) != 0)
      return rd_fail(r, MOLE_ERR_FORMAT, val_at, "alignment %u is not a nonzero power of two", a);
    f->alignment = a;
  }
  return MOLE_OK;
}

// Reads tensor info i; *offset_at gets the byte offset of its offset field.
static mole_status parse_tensor_info(gguf_file *f, rd *r, int64_t i, size_t *offset_at) {
  gguf_tensor *t = &f->tensors[i];
  rd_set_ctx(r, "tensor", i, NULL, 0);
  size_t at = r->off;
  const char *name;
  uint64_t nlen;
  mole_status st = rd_str(r, "name", &name, &nlen);
  if (st) return st;
  if (nlen == 0) return rd_fail(r, MOLE_ERR_FORMAT, at, "name is empty");
  rd_set_ctx(r, "tensor", i, name, (size_t)nlen);
  if (memchr(name, 0, (size_t)nlen)) return rd_fail(r, MOLE_ERR_FORMAT, at, "name contains a NUL byte");
  int64_t dup = ix_find(&f->tensor_ix, name, (size_t)nlen);
  if (dup >= 0) return rd_fail(r, MOLE_ERR_FORMAT, at, "duplicate tensor name (first is tensor[%" PRId64 "])", dup);
  char *copy = copy_str(name, (size_t)nlen);
  if (!copy) return rd_nomem(r);
  t->name = copy;
  ix_insert(&f->tensor_ix, copy, i);

  at = r->off;
  uint32_t n_dims;
  if ((st = rd_u32(r, "n_dims", &n_dims))) return st;
  if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
    return rd_fail(r, MOLE_ERR_FORMAT, at, "n_dims %u out of range (1..%d)", n_dims, GGUF_MAX_DIMS);
  t->n_dims = n_dims;
  int64_t nel = 1;
  size_t ne0_at = r->off;
  for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    at = r->off;
    uint64_t v;
    char what[16];
    snprintf(what, sizeof what, "ne[%u]", d);
    if ((st = rd_u64(r, what, &v))) return st;
    int64_t ne = (int64_t)v;
    if (ne <= 0) return rd_fail(r, MOLE_ERR_FORMAT, at, "ne[%u] = %" PRId64 " must be positive", d, ne);
    if (__builtin_mul_overflow(nel, ne, &nel))
      return rd_fail(r, MOLE_ERR_FORMAT, at, "ne[%u] = %" PRId64 ": the element count overflows int64", d, ne);
    t->ne[d] = ne;
  }
  at = r->off;
  uint32_t type;
  if ((st = rd_u32(r, "type", &type))) return st;
  if (!quant_type_known(type)) return rd_fail(r, MOLE_ERR_FORMAT, at, "type %u is not a known tensor type", type);
  t->type = type;
  int64_t blck = quant_blck_size(type);
  if (t->ne[0] % blck != 0)
    return rd_fail(r, MOLE_ERR_FORMAT, ne0_at, "ne[0] = %" PRId64 " is not a multiple of the block size %" PRId64 " of %s",
                   t->ne[0], blck, quant_type_name(type));
  uint64_t row, size;
  if (__builtin_mul_overflow((uint64_t)(t->ne[0] / blck), (uint64_t)quant_type_size(type), &row) ||
      __builtin_mul_overflow(row, (uint64_t)(nel / t->ne[0]), &size) || size > SIZE_MAX)
    return rd_fail(r, MOLE_ERR_FORMAT, ne0_at, "data size of %" PRId64 " %s elements overflows", nel,
                   quant_type_name(type));
  t->size = (size_t)size;
  *offset_at = r->off;
  if ((st = rd_u64(r, "offset", &t->offset))) return st;
  if (t->offset % f->alignment != 0)
    return rd_fail(r, MOLE_ERR_FORMAT, *offset_at, "offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                   t->offset, f->alignment);
  return MOLE_OK;
}

typedef struct {
  uint64_t begin, end;  // absolute byte range in the file
  int64_t idx;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

// Every tensor's data lies inside the file and no two overlap.
static mole_status check_tensor_data(gguf_file *f, rd *r, const size_t *offset_at) {
  if (f->n_tensors == 0) return MOLE_OK;
  span *sp = mole_malloc((size_t)f->n_tensors * sizeof *sp);
  if (!sp) return rd_nomem(r);
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < f->n_tensors && !st; i++) {
    gguf_tensor *t = &f->tensors[i];
    uint64_t b, e;
    if (__builtin_add_overflow(f->data_offset, t->offset, &b) || __builtin_add_overflow(b, (uint64_t)t->size, &e) ||
        e > f->size) {
      rd_set_ctx(r, "tensor", i, t->name, strlen(t->name));
      st = rd_fail(r, MOLE_ERR_FORMAT, offset_at[i],
                   "data at offset %" PRIu64 " (%zu bytes, data section at %" PRIu64
                   ") extends past the end of the file (%zu bytes)",
                   t->offset, t->size, f->data_offset, f->size);
      break;
    }
    sp[i] = (span){b, e, i};
    t->data = f->base + b;
  }
  if (!st) qsort(sp, (size_t)f->n_tensors, sizeof *sp, span_cmp);
  for (int64_t k = 1; k < f->n_tensors && !st; k++) {
    if (sp[k].begin < sp[k - 1].end) {
      const gguf_tensor *t = &f->tensors[sp[k].idx], *prev = &f->tensors[sp[k - 1].idx];
      rd_set_ctx(r, "tensor", sp[k].idx, t->name, strlen(t->name));
      char shown[NAME_SHOWN + 8];
      show_name(shown, sizeof shown, prev->name, strlen(prev->name));
      st = rd_fail(r, MOLE_ERR_FORMAT, offset_at[sp[k].idx],
                   "data at offset %" PRIu64 " overlaps tensor[%" PRId64 "] '%s' (offset %" PRIu64 ", %zu bytes)",
                   t->offset, sp[k - 1].idx, shown, prev->offset, prev->size);
    }
  }
  mole_free(sp);
  return st;
}

static mole_status parse_header(gguf_file *f, rd *r, uint64_t *n_tensors, uint64_t *n_kv) {
  mole_status st = rd_need(r, 4, "magic");
  if (st) return st;
  if (memcmp(r->p, "GGUF", 4) != 0) {
    char shown[8];
    show_name(shown, sizeof shown, (const char *)r->p, 4);
    return rd_fail(r, MOLE_ERR_FORMAT, 0, "magic '%s' (%02x %02x %02x %02x) is not 'GGUF'", shown, r->p[0], r->p[1],
                   r->p[2], r->p[3]);
  }
  r->off = 4;
  uint32_t v;
  if ((st = rd_u32(r, "version", &v))) return st;
  if (v == 1) return rd_fail(r, MOLE_ERR_UNSUPPORTED, 4, "version 1 is not supported (only GGUF v2 and v3 are)");
  if (v == 0) return rd_fail(r, MOLE_ERR_FORMAT, 4, "version 0 is not a GGUF version");
  if ((v & 0xffff) == 0)
    return rd_fail(r, MOLE_ERR_UNSUPPORTED, 4, "version 0x%08x: big-endian GGUF files are not supported", v);
  if (v > 3) return rd_fail(r, MOLE_ERR_UNSUPPORTED, 4, "version %u is not supported (only GGUF v2 and v3 are)", v);
  f->version = v;
  if ((st = rd_u64(r, "tensor count", n_tensors)) || (st = rd_u64(r, "kv count", n_kv))) return st;
  size_t left = rd_left(r);
  if (*n_tensors > left / MIN_TENSOR_BYTES)
    return rd_fail(r, MOLE_ERR_FORMAT, 8, "tensor count %" PRIu64 " cannot fit in the remaining %zu bytes",
                   *n_tensors, left);
  if (*n_kv > left / MIN_KV_BYTES)
    return rd_fail(r, MOLE_ERR_FORMAT, 16, "kv count %" PRIu64 " cannot fit in the remaining %zu bytes", *n_kv, left);
  if (*n_tensors * MIN_TENSOR_BYTES + *n_kv * MIN_KV_BYTES > left)
    return rd_fail(r, MOLE_ERR_FORMAT, 8,
                   "tensor count %" PRIu64 " and kv count %" PRIu64 " cannot fit in the remaining %zu bytes",
                   *n_tensors, *n_kv, left);
  return MOLE_OK;
}

static mole_status parse_file(gguf_file *f) {
  rd r = {.p = f->base, .size = f->size, .path = f->path};
  uint64_t n_tensors, n_kv;
  mole_status st = parse_header(f, &r, &n_tensors, &n_kv);
  if (st) return st;
  f->kvs = mole_calloc((size_t)n_kv ? (size_t)n_kv : 1, sizeof *f->kvs);
  f->tensors = mole_calloc((size_t)n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
  if (!f->kvs || !f->tensors || ix_init(&f->kv_ix, (int64_t)n_kv) || ix_init(&f->tensor_ix, (int64_t)n_tensors))
    return rd_nomem(&r);
  for (uint64_t i = 0; i < n_kv; i++) {
    f->n_kv = (int64_t)i + 1;  // entry i is owned (and freed) from here on
    if ((st = parse_kv(f, &r, (int64_t)i))) return st;
  }
  size_t *offset_at = mole_malloc((size_t)(n_tensors ? n_tensors : 1) * sizeof *offset_at);
  if (!offset_at) return rd_nomem(&r);
  for (uint64_t i = 0; i < n_tensors && !st; i++) {
    f->n_tensors = (int64_t)i + 1;
    st = parse_tensor_info(f, &r, (int64_t)i, &offset_at[i]);
  }
  if (!st) {
    // The data section starts at the next multiple of the alignment; with no
    // tensor data it may lie past the end of the file (vocabulary-only files).
    f->data_offset = ((uint64_t)r.off + f->alignment - 1) / f->alignment * f->alignment;
    r.ctx[0] = '\0';
    st = check_tensor_data(f, &r, offset_at);
  }
  mole_free(offset_at);
  return st;
}

static mole_status file_new(const char *name, gguf_file **out) {
  gguf_file *f = mole_calloc(1, sizeof *f);
  if (!f || !(f->path = mole_strdup(name))) {
    mole_free(f);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", name);
  }
  f->alignment = GGUF_DEFAULT_ALIGNMENT;
  *out = f;
  return MOLE_OK;
}

mole_status gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file **out) {
  MOLE_ASSERT(out && (buf || size == 0));
  *out = NULL;
  gguf_file *f;
  mole_status st = file_new(name ? name : "<buffer>", &f);
  if (st) return st;
  f->base = buf;
  f->size = size;
  if ((st = parse_file(f))) {
    gguf_close(f);
    return st;
  }
  *out = f;
  return MOLE_OK;
}

mole_status gguf_open(const char *path, gguf_file **out) {
  MOLE_ASSERT(path && out);
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mole_errorf(MOLE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return mole_errorf(MOLE_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return mole_errorf(MOLE_ERR_IO, "%s: not a regular file", path);
  }
  gguf_file *f;
  mole_status st = file_new(path, &f);
  if (st) {
    close(fd);
    return st;
  }
  f->size = (size_t)sb.st_size;
  if (f->size > 0) {
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      gguf_close(f);
      return mole_errorf(MOLE_ERR_IO, "%s: cannot map %zu bytes: %s", path, (size_t)sb.st_size, strerror(e));
    }
    f->base = p;
    f->mapped = true;
  }
  close(fd);
  if ((st = parse_file(f))) {
    gguf_close(f);
    return st;
  }
  *out = f;
  return MOLE_OK;
}

void gguf_close(gguf_file *f) {
  if (!f) return;
  for (int64_t i = 0; i < f->n_kv; i++) {
    mole_free(f->kvs[i].key);
    mole_free(f->kvs[i].block);
  }
  for (int64_t i = 0; i < f->n_tensors; i++) mole_free((char *)f->tensors[i].name);
  mole_free(f->kvs);
  mole_free(f->tensors);
  mole_free(f->kv_ix.slots);
  mole_free(f->tensor_ix.slots);
  if (f->mapped) munmap((void *)f->base, f->size);
  mole_free(f->path);
  mole_free(f);
}

const char *gguf_path(const gguf_file *f) { return f->path; }
uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
const void *gguf_base(const gguf_file *f) { return f->base; }
size_t gguf_size(const gguf_file *f) { return f->size; }

// ---- metadata ------------------------------------------------------------

static const gguf_kv *kv_at(const gguf_file *f, int64_t i) {
  MOLE_ASSERT(i >= 0 && i < f->n_kv);
  return &f->kvs[i];
}

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_kv(const gguf_file *f, const char *key) { return ix_find(&f->kv_ix, key, strlen(key)); }

const char *gguf_kv_key(const gguf_file *f, int64_t i) { return kv_at(f, i)->key; }
gguf_type gguf_kv_type(const gguf_file *f, int64_t i) { return kv_at(f, i)->type; }
gguf_type gguf_kv_arr_type(const gguf_file *f, int64_t i) { return kv_at(f, i)->arr_type; }
uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i) { return kv_at(f, i)->n; }
const void *gguf_kv_data(const gguf_file *f, int64_t i) { return kv_at(f, i)->data; }

const char *gguf_kv_str(const gguf_file *f, int64_t i, uint64_t j, uint64_t *len) {
  const gguf_kv *kv = kv_at(f, i);
  if (kv->arr_type != GGUF_T_STRING || j >= kv->n) return NULL;
  if (len) *len = kv->lens[j];
  return kv->strs[j];
}

static bool type_is_int(gguf_type t) {
  return t <= GGUF_T_INT32 || t == GGUF_T_UINT64 || t == GGUF_T_INT64;
}

// Element j of the numeric data of kv as int64 (false if a u64 exceeds it).
static bool elem_int(const gguf_kv *kv, uint64_t j, int64_t *out) {
  const uint8_t *p = (const uint8_t *)kv->data + j * k_type_size[kv->arr_type];
  switch (kv->arr_type) {
    case GGUF_T_UINT8: *out = *p; return true;
    case GGUF_T_INT8: *out = (int8_t)*p; return true;
    case GGUF_T_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_T_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_T_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_T_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_T_INT64: memcpy(out, p, 8); return true;
    case GGUF_T_UINT64: {
      uint64_t v;
      memcpy(&v, p, 8);
      *out = (int64_t)v;
      return v <= (uint64_t)INT64_MAX;
    }
    default: MOLE_ASSERT(!"not an integer type");
  }
  return false;
}

static mole_status find_key(const gguf_file *f, const char *key, const gguf_kv **kv) {
  int64_t i = gguf_find_kv(f, key);
  if (i < 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: key '%s' not found", f->path, key);
  *kv = &f->kvs[i];
  return MOLE_OK;
}

static mole_status wrong_type(const gguf_file *f, const gguf_kv *kv, const char *expected) {
  if (kv->type == GGUF_T_ARRAY)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", f->path, kv->key,
                       k_type_name[kv->arr_type], expected);
  return mole_errorf(MOLE_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", f->path, kv->key,
                     k_type_name[kv->type], expected);
}

mole_status gguf_get_int(const gguf_file *f, const char *key, int64_t *out) {
  const gguf_kv *kv;
  mole_status st = find_key(f, key, &kv);
  if (st) return st;
  if (!type_is_int(kv->type)) return wrong_type(f, kv, "an integer");
  if (!elem_int(kv, 0, out))
    return mole_errorf(MOLE_ERR_FORMAT, "%s: key '%s': value %" PRIu64 " exceeds the int64 range", f->path, key,
                       kv->scalar);
  return MOLE_OK;
}

mole_status gguf_get_float(const gguf_file *f, const char *key, double *out) {
  const gguf_kv *kv;
  mole_status st = find_key(f, key, &kv);
  if (st) return st;
  if (kv->type == GGUF_T_FLOAT32) {
    float v;
    memcpy(&v, kv->data, 4);
    *out = v;
  } else if (kv->type == GGUF_T_FLOAT64) {
    memcpy(out, kv->data, 8);
  } else if (type_is_int(kv->type)) {
    int64_t v;
    if (!elem_int(kv, 0, &v)) return wrong_type(f, kv, "a float");
    *out = (double)v;
  } else {
    return wrong_type(f, kv, "a float");
  }
  return MOLE_OK;
}

mole_status gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
  const gguf_kv *kv;
  mole_status st = find_key(f, key, &kv);
  if (st) return st;
  if (kv->type != GGUF_T_BOOL) return wrong_type(f, kv, "a bool");
  *out = kv->scalar != 0;
  return MOLE_OK;
}

mole_status gguf_get_str(const gguf_file *f, const char *key, const char **out) {
  const gguf_kv *kv;
  mole_status st = find_key(f, key, &kv);
  if (st) return st;
  if (kv->type != GGUF_T_STRING) return wrong_type(f, kv, "a string");
  *out = kv->strs[0];
  return MOLE_OK;
}

// A scalar integer key answers every index (a per-layer value that is the
// same for all layers is often stored once).
mole_status gguf_get_arr_int(const gguf_file *f, const char *key, uint64_t i, int64_t *out) {
  const gguf_kv *kv;
  mole_status st = find_key(f, key, &kv);
  if (st) return st;
  if (!type_is_int(kv->arr_type) || (kv->type != GGUF_T_ARRAY && !type_is_int(kv->type)))
    return wrong_type(f, kv, "an integer array");
  uint64_t j = kv->type == GGUF_T_ARRAY ? i : 0;
  if (j >= kv->n)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: key '%s': index %" PRIu64 " out of range (%" PRIu64 " elements)",
                       f->path, key, i, kv->n);
  if (!elem_int(kv, j, out))
    return mole_errorf(MOLE_ERR_FORMAT, "%s: key '%s': element %" PRIu64 " exceeds the int64 range", f->path, key,
                       j);
  return MOLE_OK;
}

// ---- tensors ---------------------------------------------------------------

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
  MOLE_ASSERT(i >= 0 && i < f->n_tensors);
  return &f->tensors[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
  int64_t i = ix_find(&f->tensor_ix, name, strlen(name));
  return i < 0 ? NULL : &f->tensors[i];
}
