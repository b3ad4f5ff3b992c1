// gguf: the GGUF v3 writer. Metadata and tensor infos are collected first;
// `begin` writes the header, `write` streams tensor data (inserting the
// alignment padding itself) and `finish` checks every byte arrived. Output
// goes through one large buffer with write(2); big chunks bypass it.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant_types.h"

enum { WBUF_BYTES = 8 << 20 };

typedef struct {
  char *key;
  gguf_type type;
  gguf_type arr_type;  // element type of an ARRAY; == type for a scalar
  uint64_t n;          // elements (1 for a scalar)
  void *data;          // numeric/bool bytes (n * element size)
  char **strs;         // [n] for strings
  uint64_t *lens;      // [n]
  void *block;         // the one allocation behind data or strs/lens
} wkv;

typedef struct {
  char *name;
  uint32_t type;
  uint32_t n_dims;
  int64_t ne[GGUF_MAX_DIMS];
  uint64_t size;    // bytes
  uint64_t offset;  // in the data section, assigned by begin
} wtensor;

struct gguf_writer {
  uint64_t alignment;
  wkv *kvs;
  int64_t n_kv, cap_kv;
  wtensor *tensors;
  int64_t n_tensors, cap_tensors;
  char **tname_slots;  // open-addressing set of tensor names
  uint64_t tname_mask;
  // output state (after begin)
  char *path;
  int fd;
  uint8_t *buf;
  size_t buf_len;
  uint64_t pos;        // bytes emitted so far (file offset)
  uint64_t data_start; // file offset of the data section
  int64_t cur;         // tensor being written
  uint64_t cur_done;   // bytes of it written
  uint64_t left;       // tensor bytes still expected in all
  bool begun, finished, failed;
};

mole_status gguf_writer_new(gguf_writer **out) {
  gguf_writer *w = mole_calloc(1, sizeof *w);
  if (!w) return mole_errorf(MOLE_ERR_NOMEM, "gguf writer: out of memory");
  w->alignment = GGUF_DEFAULT_ALIGNMENT;
  w->fd = -1;
  *out = w;
  return MOLE_OK;
}

static void wkv_clear(wkv *kv) {
  mole_free(kv->key);
  mole_free(kv->block);
  memset(kv, 0, sizeof *kv);
}

void gguf_writer_free(gguf_writer *w) {
  if (!w) return;
  for (int64_t i = 0; i < w->n_kv; i++) wkv_clear(&w->kvs[i]);
  for (int64_t i = 0; i < w->n_tensors; i++) mole_free(w->tensors[i].name);
  mole_free(w->kvs);
  mole_free(w->tensors);
  mole_free(w->tname_slots);
  if (w->fd >= 0) close(w->fd);
  mole_free(w->buf);
  mole_free(w->path);
  mole_free(w);
}

static bool is_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

void gguf_writer_set_alignment(gguf_writer *w, uint64_t align) {
  MOLE_ASSERT(!w->begun && is_pow2(align) && align <= UINT32_MAX);
  w->alignment = align;
}

static int64_t find_key(const gguf_writer *w, const char *key) {
  for (int64_t i = 0; i < w->n_kv; i++)
    if (strcmp(w->kvs[i].key, key) == 0) return i;
  return -1;
}

static mole_status nomem(const char *what) { return mole_errorf(MOLE_ERR_NOMEM, "gguf writer: %s: out of memory", what); }

// Stores key = value (replacing an existing key in place). Numeric/bool
// values: n elements at data; strings: strs[n] with lens (NULL: strlen).
static mole_status put_kv(gguf_writer *w, const char *key, gguf_type type, gguf_type arr_type, uint64_t n,
                          const void *data, const char *const *strs, const uint64_t *lens) {
  MOLE_ASSERT(!w->begun);
  if (!key || !*key) return mole_errorf(MOLE_ERR_ARG, "gguf writer: empty key");
  if ((unsigned)arr_type >= GGUF_T_COUNT || arr_type == GGUF_T_ARRAY)
    return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': bad element type %d", key, (int)arr_type);
  wkv kv = {.type = type, .arr_type = arr_type, .n = n};
  if (arr_type == GGUF_T_STRING) {
    uint64_t total = 0;
    for (uint64_t j = 0; j < n; j++) {
      if (!strs[j]) return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': string %" PRIu64 " is NULL", key, j);
      total += (lens ? lens[j] : strlen(strs[j])) + 1;
    }
    if (n > SIZE_MAX / 32) return nomem(key);
    char *block = mole_malloc((size_t)n * (sizeof(char *) + sizeof(uint64_t)) + (size_t)total);
    if (!block) return nomem(key);
    kv.block = block;
    kv.strs = (char **)block;
    kv.lens = (uint64_t *)(block + (size_t)n * sizeof(char *));
    char *chars = block + (size_t)n * (sizeof(char *) + sizeof(uint64_t));
    for (uint64_t j = 0; j < n; j++) {
      uint64_t len = lens ? lens[j] : strlen(strs[j]);
      memcpy(chars, strs[j], (size_t)len);
      chars[len] = '\0';
      kv.strs[j] = chars;
      kv.lens[j] = len;
      chars += len + 1;
    }
  } else {
    size_t es = gguf_type_size(arr_type);
    if (n > SIZE_MAX / es) return nomem(key);
    if (arr_type == GGUF_T_BOOL)
      for (uint64_t j = 0; j < n; j++)
        if (((const uint8_t *)data)[j] > 1)
          return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': bool element %" PRIu64 " is %u (must be 0 or 1)",
                             key, j, ((const uint8_t *)data)[j]);
    if (!(kv.block = mole_malloc((size_t)n * es))) return nomem(key);
    if (n) memcpy(kv.block, data, (size_t)n * es);
    kv.data = kv.block;
  }
  if (strcmp(key, "general.alignment") == 0) {
    uint32_t a = 0;
    if (type == GGUF_T_UINT32) memcpy(&a, kv.data, 4);
    if (type != GGUF_T_UINT32 || !is_pow2(a)) {
      mole_free(kv.block);
      return mole_errorf(MOLE_ERR_ARG, "gguf writer: key 'general.alignment' must be a u32 power of two");
    }
    w->alignment = a;
  }
  int64_t i = find_key(w, key);
  if (i >= 0) {
    kv.key = w->kvs[i].key;
    w->kvs[i].key = NULL;
    wkv_clear(&w->kvs[i]);
    w->kvs[i] = kv;
    return MOLE_OK;
  }
  if (!(kv.key = mole_strdup(key))) {
    mole_free(kv.block);
    return nomem(key);
  }
  if (w->n_kv == w->cap_kv) {
    int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
    wkv *nk = mole_realloc(w->kvs, (size_t)cap * sizeof *nk);
    if (!nk) {
      mole_free(kv.key);
      mole_free(kv.block);
      return nomem(key);
    }
    w->kvs = nk;
    w->cap_kv = cap;
  }
  w->kvs[w->n_kv++] = kv;
  return MOLE_OK;
}

mole_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
  return put_kv(w, key, GGUF_T_UINT32, GGUF_T_UINT32, 1, &v, NULL, NULL);
}
mole_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
  return put_kv(w, key, GGUF_T_INT32, GGUF_T_INT32, 1, &v, NULL, NULL);
}
mole_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) {
  return put_kv(w, key, GGUF_T_UINT64, GGUF_T_UINT64, 1, &v, NULL, NULL);
}
mole_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
  return put_kv(w, key, GGUF_T_FLOAT32, GGUF_T_FLOAT32, 1, &v, NULL, NULL);
}
mole_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) {
  uint8_t b = v ? 1 : 0;
  return put_kv(w, key, GGUF_T_BOOL, GGUF_T_BOOL, 1, &b, NULL, NULL);
}
mole_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
  if (!v) return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': NULL string", key ? key : "");
  return put_kv(w, key, GGUF_T_STRING, GGUF_T_STRING, 1, NULL, &v, NULL);
}

mole_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type, const void *data, uint64_t n) {
  if ((unsigned)elem_type >= GGUF_T_COUNT || elem_type == GGUF_T_STRING || elem_type == GGUF_T_ARRAY)
    return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': element type %d is not numeric or bool",
                       key ? key : "", (int)elem_type);
  if (n && !data) return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': NULL data", key ? key : "");
  return put_kv(w, key, GGUF_T_ARRAY, elem_type, n, data, NULL, NULL);
}

mole_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
  if (n && !strs) return mole_errorf(MOLE_ERR_ARG, "gguf writer: key '%s': NULL strings", key ? key : "");
  return put_kv(w, key, GGUF_T_ARRAY, GGUF_T_STRING, n, NULL, strs, NULL);
}

mole_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i) {
  const char *key = gguf_kv_key(src, i);
  gguf_type type = gguf_kv_type(src, i), et = gguf_kv_arr_type(src, i);
  uint64_t n = gguf_kv_arr_n(src, i);
  if (et != GGUF_T_STRING) return put_kv(w, key, type, et, n, gguf_kv_data(src, i), NULL, NULL);
  if (n > SIZE_MAX / 16) return nomem(key);
  const char **strs = mole_malloc((size_t)(n ? n : 1) * sizeof *strs);
  uint64_t *lens = mole_malloc((size_t)(n ? n : 1) * sizeof *lens);
  mole_status st;
  if (!strs || !lens) {
    st = nomem(key);
  } else {
    for (uint64_t j = 0; j < n; j++) strs[j] = gguf_kv_str(src, i, j, &lens[j]);
    st = put_kv(w, key, type, et, n, NULL, strs, lens);
  }
  mole_free(strs);
  mole_free(lens);
  return st;
}

// ---- tensors -------------------------------------------------------------

static uint64_t hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

static char **tname_slot(const gguf_writer *w, const char *name) {
  uint64_t h = hash_str(name) & w->tname_mask;
  while (w->tname_slots[h] && strcmp(w->tname_slots[h], name) != 0) h = (h + 1) & w->tname_mask;
  return &w->tname_slots[h];
}

// Keeps the name set at most half full.
static bool tname_reserve(gguf_writer *w, int64_t n) {
  uint64_t cap = w->tname_slots ? w->tname_mask + 1 : 0;
  if (cap >= 2 * (uint64_t)n) return true;
  uint64_t ncap = cap ? 2 * cap : 64;
  while (ncap < 2 * (uint64_t)n) ncap *= 2;
  char **slots = mole_calloc(ncap, sizeof *slots);
  if (!slots) return false;
  mole_free(w->tname_slots);
  w->tname_slots = slots;
  w->tname_mask = ncap - 1;
  for (int64_t i = 0; i < w->n_tensors; i++) *tname_slot(w, w->tensors[i].name) = w->tensors[i].name;
  return true;
}

mole_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                   const int64_t *ne, int64_t *idx) {
  MOLE_ASSERT(!w->begun);
  if (!name || !*name) return mole_errorf(MOLE_ERR_ARG, "gguf writer: empty tensor name");
  if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
    return mole_errorf(MOLE_ERR_ARG, "gguf writer: tensor '%s': n_dims %u out of range (1..%d)", name, n_dims,
                       GGUF_MAX_DIMS);
  if (!quant_type_known(type))
    return mole_errorf(MOLE_ERR_ARG, "gguf writer: tensor '%s': type %u is not a known tensor type", name, type);
  wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
  int64_t nel = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    if (ne[d] <= 0)
      return mole_errorf(MOLE_ERR_ARG, "gguf writer: tensor '%s': ne[%u] = %" PRId64 " must be positive", name, d,
                         ne[d]);
    if (__builtin_mul_overflow(nel, ne[d], &nel))
      return mole_errorf(MOLE_ERR_ARG, "gguf writer: tensor '%s': element count overflows int64", name);
    t.ne[d] = ne[d];
  }
  int64_t blck = quant_blck_size(type);
  if (t.ne[0] % blck != 0)
    return mole_errorf(MOLE_ERR_ARG,
                       "gguf writer: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the block size %" PRId64
                       " of %s",
                       name, t.ne[0], blck, quant_type_name(type));
  if (__builtin_mul_overflow((uint64_t)(nel / blck), (uint64_t)quant_type_size(type), &t.size))
    return mole_errorf(MOLE_ERR_ARG, "gguf writer: tensor '%s': byte size overflows", name);
  if (!tname_reserve(w, w->n_tensors + 1)) return nomem(name);
  char **slot = tname_slot(w, name);
  if (*slot) return mole_errorf(MOLE_ERR_ARG, "gguf writer: duplicate tensor name '%s'", name);
  if (w->n_tensors == w->cap_tensors) {
    int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
    wtensor *nt = mole_realloc(w->tensors, (size_t)cap * sizeof *nt);
    if (!nt) return nomem(name);
    w->tensors = nt;
    w->cap_tensors = cap;
  }
  if (!(t.name = mole_strdup(name))) return nomem(name);
  *slot = t.name;
  if (idx) *idx = w->n_tensors;
  w->tensors[w->n_tensors++] = t;
  return MOLE_OK;
}

// ---- output ----------------------------------------------------------------

static mole_status io_fail(gguf_writer *w, const char *what, int err) {
  w->failed = true;
  return mole_errorf(MOLE_ERR_IO, "%s: %s: %s", w->path, what, strerror(err));
}

static mole_status write_all(gguf_writer *w, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = write(w->fd, b, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return io_fail(w, "write", errno);
    }
    if (k == 0) return io_fail(w, "write", EIO);
    b += k;
    n -= (size_t)k;
  }
  return MOLE_OK;
}

static mole_status flush(gguf_writer *w) {
  mole_status st = write_all(w, w->buf, w->buf_len);
  w->buf_len = 0;
  return st;
}

static mole_status out(gguf_writer *w, const void *p, size_t n) {
  mole_status st = MOLE_OK;
  w->pos += n;
  if (w->buf_len + n <= WBUF_BYTES) {
    memcpy(w->buf + w->buf_len, p, n);
    w->buf_len += n;
    return MOLE_OK;
  }
  if ((st = flush(w))) return st;
  if (n >= WBUF_BYTES / 2) return write_all(w, p, n);
  memcpy(w->buf, p, n);
  w->buf_len = n;
  return MOLE_OK;
}

static mole_status out_zeros(gguf_writer *w, uint64_t n) {
  static const uint8_t zeros[4096];
  mole_status st = MOLE_OK;
  while (n > 0 && !st) {
    size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
    st = out(w, zeros, k);
    n -= k;
  }
  return st;
}

static mole_status out_u32(gguf_writer *w, uint32_t v) { return out(w, &v, 4); }
static mole_status out_u64(gguf_writer *w, uint64_t v) { return out(w, &v, 8); }

static mole_status out_str(gguf_writer *w, const char *s, uint64_t len) {
  mole_status st = out_u64(w, len);
  return st ? st : out(w, s, (size_t)len);
}

static uint64_t pad_to(uint64_t x, uint64_t align) { return (align - x % align) % align; }

static mole_status out_kv(gguf_writer *w, const wkv *kv) {
  mole_status st = out_str(w, kv->key, strlen(kv->key));
  if (!st) st = out_u32(w, (uint32_t)kv->type);
  if (!st && kv->type == GGUF_T_ARRAY) {
    st = out_u32(w, (uint32_t)kv->arr_type);
    if (!st) st = out_u64(w, kv->n);
  }
  if (st) return st;
  if (kv->arr_type == GGUF_T_STRING) {
    for (uint64_t j = 0; j < kv->n && !st; j++) st = out_str(w, kv->strs[j], kv->lens[j]);
    return st;
  }
  return out(w, kv->data, (size_t)kv->n * gguf_type_size(kv->arr_type));
}

mole_status gguf_writer_begin(gguf_writer *w, const char *path) {
  MOLE_ASSERT(!w->begun && path);
  // general.alignment says what the layout uses.
  int64_t ai = find_key(w, "general.alignment");
  if (ai >= 0) {
    uint32_t a = (uint32_t)w->alignment;
    memcpy(w->kvs[ai].data, &a, 4);
  } else if (w->alignment != GGUF_DEFAULT_ALIGNMENT) {
    mole_status st = gguf_writer_set_u32(w, "general.alignment", (uint32_t)w->alignment);
    if (st) return st;
  }
  uint64_t off = 0;
  w->left = 0;
  for (int64_t i = 0; i < w->n_tensors; i++) {
    wtensor *t = &w->tensors[i];
    t->offset = off + pad_to(off, w->alignment);
    if (__builtin_add_overflow(t->offset, t->size, &off) || __builtin_add_overflow(w->left, t->size, &w->left))
      return mole_errorf(MOLE_ERR_ARG, "%s: tensor data size overflows", path);
  }
  if (!(w->path = mole_strdup(path)) || !(w->buf = mole_malloc(WBUF_BYTES))) return nomem(path);
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) return io_fail(w, "cannot create", errno);
  w->begun = true;
  mole_status st = out(w, "GGUF", 4);
  if (!st) st = out_u32(w, 3);
  if (!st) st = out_u64(w, (uint64_t)w->n_tensors);
  if (!st) st = out_u64(w, (uint64_t)w->n_kv);
  for (int64_t i = 0; i < w->n_kv && !st; i++) st = out_kv(w, &w->kvs[i]);
  for (int64_t i = 0; i < w->n_tensors && !st; i++) {
    const wtensor *t = &w->tensors[i];
    st = out_str(w, t->name, strlen(t->name));
    if (!st) st = out_u32(w, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims && !st; d++) st = out_u64(w, (uint64_t)t->ne[d]);
    if (!st) st = out_u32(w, t->type);
    if (!st) st = out_u64(w, t->offset);
  }
  if (!st) st = out_zeros(w, pad_to(w->pos, w->alignment));
  w->data_start = w->pos;
  w->cur = 0;
  w->cur_done = 0;
  return st;
}

mole_status gguf_writer_write(gguf_writer *w, const void *data, size_t n) {
  MOLE_ASSERT(w->begun && !w->finished);
  if (w->failed) return mole_errorf(MOLE_ERR_IO, "%s: write after an earlier error", w->path);
  if (n > w->left)
    return mole_errorf(MOLE_ERR_ARG, "%s: writing %zu bytes, but only %" PRIu64 " bytes of tensor data remain",
                       w->path, n, w->left);
  const uint8_t *p = data;
  while (n > 0) {
    MOLE_ASSERT(w->cur < w->n_tensors);
    const wtensor *t = &w->tensors[w->cur];
    uint64_t take = MOLE_MIN((uint64_t)n, t->size - w->cur_done);
    mole_status st = out(w, p, (size_t)take);
    if (st) return st;
    p += take;
    n -= (size_t)take;
    w->left -= take;
    w->cur_done += take;
    if (w->cur_done == t->size) {  // pad so the next tensor (or the end) is aligned
      if ((st = out_zeros(w, pad_to(w->pos - w->data_start, w->alignment)))) return st;
      w->cur++;
      w->cur_done = 0;
    }
  }
  return MOLE_OK;
}

mole_status gguf_writer_finish(gguf_writer *w) {
  MOLE_ASSERT(w->begun && !w->finished);
  if (w->failed) return mole_errorf(MOLE_ERR_IO, "%s: finish after an earlier error", w->path);
  if (w->cur < w->n_tensors) {
    const wtensor *t = &w->tensors[w->cur];
    return mole_errorf(MOLE_ERR_ARG, "%s: tensor[%" PRId64 "] '%s': %" PRIu64 " of %" PRIu64 " bytes written",
                       w->path, w->cur, t->name, w->cur_done, t->size);
  }
  mole_status st = flush(w);
  if (st) return st;
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0) return io_fail(w, "close", errno);
  w->finished = true;
  return MOLE_OK;
}
