// mole pack: a GGUF MoE model -> a packed expert store (docs/FORMAT.md).
#include "experts/pack.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include "experts/io.h"
#include "experts/store.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

static const char *const k_mat[3] = {"gate", "up", "down"};
enum { PACK_REGION_TYPE = 24 };  // ggml I8: a region is raw bytes

typedef struct pack_ctx {
  gguf_file *f;
  const char *in;
  int64_t n_layer, n_expert, n_embd, n_ff;
  const gguf_tensor **src;  // [n_layer][3] ffn_{gate,up,down}_exps
  experts_layout *lo[2];    // [n_layer] per precision
  const experts_pack_tier *tier[2];  // ready-made precisions (experts_pack_params)
  const uint8_t *book;      // dictionary tensor to write, 3 * book_n bytes
  int64_t book_n;
  int n_prec;
  uint64_t region_max;
} pack_ctx;

static uint64_t align_to(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Rows [r0, r1) of one matrix converted from src type to dst type.
typedef struct convert_job {
  const void *src;
  quant_type st, dt;
  int64_t ne0, n_rows;
  void *dst;
  float *tmp;  // [nth][ne0]
} convert_job;

static void convert_worker(void *ctx, int ith, int nth) {
  const convert_job *j = ctx;
  int64_t r0, r1;
  mole_split(j->n_rows, ith, nth, &r0, &r1);
  const quant_traits *ts = quant_traits_of(j->st), *td = quant_traits_of(j->dt);
  const size_t sr = quant_row_size(j->st, j->ne0), dr = quant_row_size(j->dt, j->ne0);
  float *tmp = j->tmp + (size_t)ith * (size_t)j->ne0;
  for (int64_t r = r0; r < r1; r++) {
    ts->to_float((const char *)j->src + (size_t)r * sr, tmp, j->ne0);
    td->from_float(tmp, (char *)j->dst + (size_t)r * dr, j->ne0);
  }
}

static mole_status check_type(const pack_ctx *c, int t, const char *what, int64_t ne0, const char *tensor) {
  const quant_traits *tr = t >= 0 && t < QT_COUNT ? quant_traits_of((quant_type)t) : NULL;
  if (!tr || !tr->from_float || !tr->vec_dot)
    return mole_errorf(MOLE_ERR_UNSUPPORTED,
                       "pack: %s type %s cannot be written and computed with%s", what, quant_type_name((uint32_t)t),
                       tr && tr->vec_dot ? " (mole has no quantizer for it: make the model in that type with "
                                           "llama-quantize and give the file as --low FILE)" : "");
  if (ne0 % tr->blck_size)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s': rows of %lld are not a multiple of the %s block (%lld)",
                       c->in, tensor, (long long)ne0, quant_type_name((uint32_t)t), (long long)tr->blck_size);
  return MOLE_OK;
}

static mole_status plan_layout(pack_ctx *c, const experts_pack_params *p) {
  const int want[2] = {p->high, p->low};
  c->n_prec = p->low >= 0 || p->tier[1] ? 2 : 1;
  for (int pr = 0; pr < c->n_prec; pr++) {
    c->lo[pr] = mole_calloc((size_t)c->n_layer, sizeof *c->lo[pr]);
    if (!c->lo[pr]) return mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
    for (int64_t l = 0; l < c->n_layer; l++) {
      experts_layout *lo = &c->lo[pr][l];
      if (p->tier[pr]) {  // ready-made regions
        *lo = p->tier[pr]->layout[l];
        c->region_max = MOLE_MAX(c->region_max, lo->region);
        continue;
      }
      uint64_t at = 0;
      for (int j = 0; j < 3; j++) {
        const gguf_tensor *t = c->src[l * 3 + j];
        const int type = want[pr] >= 0 ? want[pr] : (int)t->type;
        mole_status st = check_type(c, type, pr ? "--low" : "--high", t->ne[0], t->name);
        if (st) return st;
        if (!quant_traits_of(t->type) || !quant_traits_of(t->type)->to_float)
          return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which mole cannot read", c->in, t->name,
                             quant_type_name(t->type));
        lo->type[j] = (quant_type)type;
        lo->bytes[j] = quant_row_size(lo->type[j], t->ne[0]) * (uint64_t)t->ne[1];
        lo->offsets[j] = at;
        at = align_to(at + lo->bytes[j], 64);  // each matrix 64-byte aligned inside the region
      }
      lo->region = align_to(at, EXPERTS_IO_ALIGN);
      c->region_max = MOLE_MAX(c->region_max, lo->region);
    }
  }
  return MOLE_OK;
}

static mole_status find_sources(pack_ctx *c) {
  const char *arch;
  mole_status st = gguf_get_str(c->f, "general.architecture", &arch);
  if (st) return mole_error_prefix(st, "%s: ", c->in);
  char key[128];
  snprintf(key, sizeof key, "%s.block_count", arch);
  if ((st = gguf_get_int(c->f, key, &c->n_layer))) return mole_error_prefix(st, "%s: ", c->in);
  if (c->n_layer <= 0 || c->n_layer > 4096)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s = %lld is out of range", c->in, key, (long long)c->n_layer);
  c->src = mole_calloc((size_t)c->n_layer * 3, sizeof *c->src);
  if (!c->src) return mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
  for (int64_t l = 0; l < c->n_layer; l++)
    for (int j = 0; j < 3; j++) {
      char name[96];
      snprintf(name, sizeof name, "blk.%lld.ffn_%s_exps.weight", (long long)l, k_mat[j]);
      const gguf_tensor *t = gguf_find_tensor(c->f, name);
      if (!t)
        return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing tensor '%s' (mole pack needs a MoE model with expert stacks)",
                           c->in, name);
      if (t->n_dims != 3)
        return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s' has %u dims, expected 3", c->in, name, t->n_dims);
      if (l == 0 && j == 0) {
        c->n_embd = t->ne[0];
        c->n_ff = t->ne[1];
        c->n_expert = t->ne[2];
      }
      const int64_t ne0 = j == 2 ? c->n_ff : c->n_embd, ne1 = j == 2 ? c->n_embd : c->n_ff;
      if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != c->n_expert)
        return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                           c->in, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)ne0,
                           (long long)ne1, (long long)c->n_expert);
      c->src[l * 3 + j] = t;
    }
  return MOLE_OK;
}

static bool is_expert_stack(const char *name) {
  return strstr(name, "_exps.weight") && (strstr(name, ".ffn_gate_exps.") || strstr(name, ".ffn_up_exps.") ||
                                          strstr(name, ".ffn_down_exps."));
}

static mole_status set_arr_u64(gguf_writer *w, const char *key, const uint64_t *v, uint64_t n) {
  return gguf_writer_set_arr(w, key, GGUF_T_UINT64, v, n);
}

static mole_status write_metadata(pack_ctx *c, gguf_writer *w) {
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < gguf_n_kv(c->f) && !st; i++) {
    const char *k = gguf_kv_key(c->f, i);
    if (!strcmp(k, "general.alignment") || !strncmp(k, "mole.pack.", 10)) continue;
    st = gguf_writer_copy_kv(w, c->f, i);
  }
  if (st) return st;
  if ((st = gguf_writer_set_u32(w, "general.alignment", EXPERTS_IO_ALIGN))) return st;
  if ((st = gguf_writer_set_u32(w, EXPERTS_PACK_KEY_VERSION, EXPERTS_PACK_VERSION)) ||
      (st = gguf_writer_set_u32(w, "mole.pack.n_layer", (uint32_t)c->n_layer)) ||
      (st = gguf_writer_set_u32(w, "mole.pack.n_expert", (uint32_t)c->n_expert)) ||
      (st = gguf_writer_set_u32(w, "mole.pack.n_embd", (uint32_t)c->n_embd)) ||
      (st = gguf_writer_set_u32(w, "mole.pack.n_ff", (uint32_t)c->n_ff)))
    return st;
  const size_t n3 = (size_t)c->n_layer * 3;
  uint64_t *buf = mole_malloc(n3 * sizeof *buf);
  uint32_t *types = mole_malloc(n3 * sizeof *types);
  if (!buf || !types) st = mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
  for (int pr = 0; pr < c->n_prec && !st; pr++) {
    const char *pn = pr ? "low" : "high";
    char key[96];
    for (size_t i = 0; i < n3; i++) types[i] = (uint32_t)c->lo[pr][i / 3].type[i % 3];
    snprintf(key, sizeof key, "mole.pack.%s.types", pn);
    if ((st = gguf_writer_set_arr(w, key, GGUF_T_UINT32, types, n3))) break;
    for (size_t i = 0; i < n3; i++) buf[i] = c->lo[pr][i / 3].bytes[i % 3];
    snprintf(key, sizeof key, "mole.pack.%s.bytes", pn);
    if ((st = set_arr_u64(w, key, buf, n3))) break;
    for (size_t i = 0; i < n3; i++) buf[i] = c->lo[pr][i / 3].offsets[i % 3];
    snprintf(key, sizeof key, "mole.pack.%s.offsets", pn);
    if ((st = set_arr_u64(w, key, buf, n3))) break;
    for (int64_t l = 0; l < c->n_layer; l++) buf[l] = c->lo[pr][l].region;
    snprintf(key, sizeof key, "mole.pack.%s.region", pn);
    st = set_arr_u64(w, key, buf, (uint64_t)c->n_layer);
  }
  mole_free(buf);
  mole_free(types);
  return st;
}

static mole_status add_tensors(pack_ctx *c, gguf_writer *w) {
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < gguf_n_tensors(c->f) && !st; i++) {
    const gguf_tensor *t = gguf_tensor_at(c->f, i);
    if (!is_expert_stack(t->name)) st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
  }
  if (c->book && !st) {
    const int64_t ne[1] = {3 * c->book_n};
    st = gguf_writer_add_tensor(w, EXPERTS_TQ_BOOK, PACK_REGION_TYPE, 1, ne, NULL);
  }
  // regions: a layer's high copies, then its low copies, as byte matrices [pages][4096]
  for (int64_t l = 0; l < c->n_layer && !st; l++)
    for (int pr = 0; pr < c->n_prec && !st; pr++)
      for (int64_t e = 0; e < c->n_expert && !st; e++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%lld.ffn_exps.%lld.%s", (long long)l, (long long)e, pr ? "low" : "high");
        const int64_t ne[2] = {EXPERTS_IO_ALIGN, (int64_t)(c->lo[pr][l].region / EXPERTS_IO_ALIGN)};
        st = gguf_writer_add_tensor(w, name, PACK_REGION_TYPE, 2, ne, NULL);
      }
  return st;
}

static mole_status write_data(pack_ctx *c, gguf_writer *w, mole_pool *pool, FILE *log) {
  mole_status st = MOLE_OK;
  for (int64_t i = 0; i < gguf_n_tensors(c->f) && !st; i++) {
    const gguf_tensor *t = gguf_tensor_at(c->f, i);
    if (!is_expert_stack(t->name)) st = gguf_writer_write(w, t->data, t->size);
  }
  if (c->book && !st) st = gguf_writer_write(w, c->book, (size_t)(3 * c->book_n));
  if (st) return st;
  const int nth = mole_pool_nth(pool);
  char *region = mole_aligned_alloc(EXPERTS_IO_ALIGN, (size_t)c->region_max);
  float *tmp = mole_malloc((size_t)nth * (size_t)MOLE_MAX(c->n_embd, c->n_ff) * sizeof *tmp);
  if (!region || !tmp) st = mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory for a region of %llu bytes",
                                        (unsigned long long)c->region_max);
  for (int64_t l = 0; l < c->n_layer && !st; l++) {
    for (int pr = 0; pr < c->n_prec && !st; pr++) {
      const experts_layout *lo = &c->lo[pr][l];
      for (int64_t e = 0; e < c->n_expert && !st; e++) {
        memset(region, 0, (size_t)lo->region);
        if (c->tier[pr]) {
          if (!(st = c->tier[pr]->fill(c->tier[pr]->ctx, l, e, region))) st = gguf_writer_write(w, region, (size_t)lo->region);
          continue;
        }
        for (int j = 0; j < 3; j++) {
          const gguf_tensor *t = c->src[l * 3 + j];
          const size_t smat = quant_row_size(t->type, t->ne[0]) * (size_t)t->ne[1];
          const char *src = (const char *)t->data + (size_t)e * smat;
          if (lo->type[j] == t->type) {
            memcpy(region + lo->offsets[j], src, smat);
          } else {
            convert_job job = {src, t->type, lo->type[j], t->ne[0], t->ne[1], region + lo->offsets[j], tmp};
            mole_pool_run(pool, convert_worker, &job);
          }
        }
        st = gguf_writer_write(w, region, (size_t)lo->region);
      }
    }
    if (log && !st) fprintf(log, "\rpack: layer %lld/%lld", (long long)l + 1, (long long)c->n_layer);
  }
  if (log) fprintf(log, "\n");
  mole_aligned_free(region);
  mole_free(tmp);
  return st;
}

mole_status experts_pack(const char *in, const char *out, const experts_pack_params *p, FILE *log) {
  quant_init();
  pack_ctx c = {.in = in, .tier = {p->tier[0], p->tier[1]}, .book = p->book, .book_n = p->book_n};
  if (p->quiet) log = NULL;
  gguf_writer *w = NULL;
  mole_pool *pool = NULL;
  mole_status st = gguf_open(in, &c.f);
  if (st) return st;
  if (experts_store_is_packed(c.f)) {
    st = mole_errorf(MOLE_ERR_ARG, "%s: already a packed expert store (%s is set)", in, EXPERTS_PACK_KEY_VERSION);
    goto done;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if ((st = find_sources(&c)) || (st = plan_layout(&c, p))) goto done;
  if ((st = mole_pool_init(p->n_threads > 0 ? p->n_threads : (int)MOLE_MAX(ncpu, 1), &pool))) goto done;
  if ((st = gguf_writer_new(&w))) goto done;
  gguf_writer_set_alignment(w, EXPERTS_IO_ALIGN);
  if ((st = write_metadata(&c, w)) || (st = add_tensors(&c, w))) goto done;
  if ((st = gguf_writer_begin(w, out))) goto done;
  if ((st = write_data(&c, w, pool, log))) goto done;
  st = gguf_writer_finish(w);
done:
  gguf_writer_free(w);
  mole_pool_free(pool);
  for (int pr = 0; pr < 2; pr++) mole_free(c.lo[pr]);
  mole_free(c.src);
  gguf_close(c.f);
  return st;
}

// ---- a compressed file as a ready-made precision --------------------------------

struct experts_pack_src {
  gguf_file *f;
  const char *path;
  int64_t n_layer, n_expert;
  experts_layout *layout;      // [n_layer] its high precision (a plain model: its stacks' types)
  const gguf_tensor **region;  // [n_layer][n_expert] a packed file's regions, else NULL
  const gguf_tensor **stack;   // [n_layer][3] a plain model's ffn_{gate,up,down}_exps, else NULL
  const uint8_t *book;
  int64_t book_n;
  experts_pack_tier tier;
};

static mole_status src_fill(void *ctx, int64_t layer, int64_t e, void *region) {
  const experts_pack_src *s = ctx;
  if (s->region) {
    memcpy(region, s->region[layer * s->n_expert + e]->data, (size_t)s->layout[layer].region);
    return MOLE_OK;
  }
  const experts_layout *lo = &s->layout[layer];
  for (int j = 0; j < 3; j++) {  // expert e's matrix of each stack, as it is
    const gguf_tensor *t = s->stack[layer * 3 + j];
    memcpy((char *)region + lo->offsets[j], (const char *)t->data + (size_t)e * lo->bytes[j], (size_t)lo->bytes[j]);
  }
  return MOLE_OK;
}

// A plain GGUF of the same model in other tensor types (llama-quantize's
// IQ2_XXS, Q2_K, ... file) as a tier: each expert's matrices copied as they
// are; c holds its stacks (find_sources), checked against the source's shapes.
static mole_status src_plain(experts_pack_src *s, pack_ctx *c, const pack_ctx *in) {
  if (c->n_layer != in->n_layer || c->n_expert != in->n_expert || c->n_embd != in->n_embd || c->n_ff != in->n_ff)
    return mole_errorf(MOLE_ERR_FORMAT,
                       "%s: experts of %lld layers x %lld x [%lld, %lld], but %s has %lld layers x %lld x [%lld, %lld]",
                       s->path, (long long)c->n_layer, (long long)c->n_expert, (long long)c->n_embd,
                       (long long)c->n_ff, in->in, (long long)in->n_layer, (long long)in->n_expert,
                       (long long)in->n_embd, (long long)in->n_ff);
  s->layout = mole_calloc((size_t)s->n_layer, sizeof *s->layout);
  if (!s->layout) return mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
  s->stack = c->src;
  c->src = NULL;
  for (int64_t l = 0; l < s->n_layer; l++) {
    experts_layout *lo = &s->layout[l];
    uint64_t at = 0;
    for (int j = 0; j < 3; j++) {
      const gguf_tensor *t = s->stack[l * 3 + j];
      if (!quant_type_supported(t->type))
        return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which mole cannot compute with",
                           s->path, t->name, quant_type_name(t->type));
      lo->type[j] = t->type;
      lo->bytes[j] = quant_row_size(t->type, t->ne[0]) * (uint64_t)t->ne[1];
      if (lo->bytes[j] * (uint64_t)t->ne[2] > t->size)
        return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s' holds %zu bytes, less than its shape needs", s->path,
                           t->name, t->size);
      lo->offsets[j] = at;
      at = align_to(at + lo->bytes[j], 64);
    }
    lo->region = align_to(at, EXPERTS_IO_ALIGN);
  }
  return MOLE_OK;
}

// A compressed file (mole compress's packed output): its high regions and
// dictionary; c holds the source's stacks.
static mole_status src_packed(experts_pack_src *s, const pack_ctx *c) {
  const char *path = s->path;
  mole_status st = MOLE_OK;
  static const char *const keys[4] = {"mole.pack.n_layer", "mole.pack.n_expert", "mole.pack.n_embd", "mole.pack.n_ff"};
  const int64_t want[4] = {c->n_layer, c->n_expert, c->n_embd, c->n_ff};
  for (int i = 0; i < 4 && !st; i++) {
    int64_t v;
    if ((st = gguf_get_int(s->f, keys[i], &v))) {
      mole_error_prefix(st, "%s: ", path);
    } else if (v != want[i]) {
      st = mole_errorf(MOLE_ERR_FORMAT, "%s: %s = %lld, but %s has %lld", path, keys[i], (long long)v, c->in,
                       (long long)want[i]);
    }
  }
  if (!st) {
    s->layout = mole_calloc((size_t)s->n_layer, sizeof *s->layout);
    s->region = mole_calloc((size_t)(s->n_layer * s->n_expert), sizeof *s->region);
    if (!s->layout || !s->region) st = mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
  }
  bool tq1 = false;
  for (int64_t l = 0; l < s->n_layer && !st; l++) {
    experts_layout *lo = &s->layout[l];
    st = experts_store_read_layout(s->f, path, 0, s->n_layer, l, c->n_embd, c->n_ff, lo);
    for (int j = 0; j < 3 && !st; j++) tq1 = tq1 || lo->type[j] == QT_TQ1;
    for (int64_t e = 0; e < s->n_expert && !st; e++) {
      char name[96];
      snprintf(name, sizeof name, "blk.%lld.ffn_exps.%lld.high", (long long)l, (long long)e);
      const gguf_tensor *t = gguf_find_tensor(s->f, name);
      if (!t || t->size < lo->region)
        st = mole_errorf(MOLE_ERR_FORMAT, "%s: region tensor '%s' is %s", path, name, t ? "too small" : "missing");
      s->region[l * s->n_expert + e] = t;
    }
  }
  if (!st && tq1) {
    const gguf_tensor *t = gguf_find_tensor(s->f, EXPERTS_TQ_BOOK);
    if (!t || t->type != PACK_REGION_TYPE || t->size % 3 || t->size == 0)
      st = mole_errorf(MOLE_ERR_FORMAT, "%s: dictionary tensor '%s' is %s", path, EXPERTS_TQ_BOOK,
                       t ? "not i8 bytes of 3 per entry" : "missing");
    else {
      s->book = t->data;
      s->book_n = (int64_t)(t->size / 3);
    }
  }
  return st;
}

mole_status experts_pack_tier_open(const char *path, const char *in, experts_pack_src **out) {
  *out = NULL;
  experts_pack_src *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "pack: out of memory");
  s->path = path;
  pack_ctx c = {.in = in};
  mole_status st = gguf_open(in, &c.f);
  if (!st) st = find_sources(&c);
  if (!st) st = gguf_open(path, &s->f);
  s->n_layer = c.n_layer;
  s->n_expert = c.n_expert;
  if (!st && experts_store_is_packed(s->f)) {
    st = src_packed(s, &c);
  } else if (!st) {  // a plain model: its expert stacks as they are
    pack_ctx lc = {.f = s->f, .in = path};
    st = find_sources(&lc);
    if (!st) st = src_plain(s, &lc, &c);
    mole_free(lc.src);
  }
  gguf_close(c.f);
  mole_free(c.src);
  s->tier = (experts_pack_tier){s->layout, src_fill, s};
  if (st) {
    experts_pack_tier_close(s);
    return st;
  }
  *out = s;
  return MOLE_OK;
}

const experts_pack_tier *experts_pack_src_tier(const experts_pack_src *s) { return &s->tier; }

const uint8_t *experts_pack_src_book(const experts_pack_src *s, int64_t *n) {
  *n = s->book_n;
  return s->book;
}

void experts_pack_tier_close(experts_pack_src *s) {
  if (!s) return;
  gguf_close(s->f);
  mole_free(s->layout);
  mole_free(s->region);
  mole_free(s->stack);
  mole_free(s);
}
