// Expert store: the location of every expert matrix in the file (packed or
// plain GGUF) and the aligned reads that bring one expert into a slot.
#include "experts/store.h"
#include "quant/quant_tq.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "experts/io.h"

static const char *const k_prec_name[EXPERTS_PREC_N] = {"high", "low"};

bool experts_store_is_packed(const gguf_file *f) { return gguf_find_kv(f, EXPERTS_PACK_KEY_VERSION) >= 0; }

static mole_status get_key_int(const gguf_file *f, const char *path, const char *key, int64_t *out) {
  if (gguf_find_kv(f, key) < 0)
    return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: packed expert store: missing metadata key '%s'", path, key);
  mole_status st = gguf_get_int(f, key, out);
  return st ? mole_error_prefix(st, "%s: ", path) : MOLE_OK;
}

// Element i of integer array `key`, which must have n elements.
static mole_status get_arr(const gguf_file *f, const char *path, const char *key, uint64_t n, uint64_t i, int64_t *out) {
  int64_t ki = gguf_find_kv(f, key);
  if (ki < 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: packed expert store: missing metadata key '%s'", path, key);
  if (gguf_kv_type(f, ki) != GGUF_T_ARRAY || gguf_kv_arr_n(f, ki) != n)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: packed expert store: '%s' must be an array of %llu integers", path, key,
                       (unsigned long long)n);
  mole_status st = gguf_get_arr_int(f, key, i, out);
  if (st) return mole_error_prefix(st, "%s: ", path);
  if (*out < 0)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: packed expert store: '%s'[%llu] is negative", path, key, (unsigned long long)i);
  return MOLE_OK;
}

mole_status experts_store_read_layout(const gguf_file *f, const char *path, int p, int64_t n_layer, int64_t l,
                                      int64_t n_embd, int64_t n_ff, experts_layout *lo) {
  char kt[96], kb[96], ko[96], kr[96];
  snprintf(kt, sizeof kt, "mole.pack.%s.types", k_prec_name[p]);
  snprintf(kb, sizeof kb, "mole.pack.%s.bytes", k_prec_name[p]);
  snprintf(ko, sizeof ko, "mole.pack.%s.offsets", k_prec_name[p]);
  snprintf(kr, sizeof kr, "mole.pack.%s.region", k_prec_name[p]);
  if (p == 1 && gguf_find_kv(f, kt) < 0) return MOLE_ERR_NOT_FOUND;
  // gate, up: [n_ff][n_embd]; down: [n_embd][n_ff]
  const int64_t ne0[3] = {n_embd, n_embd, n_ff}, ne1[3] = {n_ff, n_ff, n_embd};
  const uint64_t n3 = (uint64_t)n_layer * 3;
  mole_status st;
  {
    int64_t v;
    if ((st = get_arr(f, path, kr, (uint64_t)n_layer, (uint64_t)l, &v))) return st;
    lo->region = (uint64_t)v;
    if (lo->region == 0 || lo->region % EXPERTS_IO_ALIGN)
      return mole_errorf(MOLE_ERR_FORMAT, "%s: %s[%lld] = %llu is not a positive multiple of %d", path, kr, (long long)l,
                         (unsigned long long)lo->region, EXPERTS_IO_ALIGN);
    for (int j = 0; j < 3; j++) {
      const uint64_t i = (uint64_t)l * 3 + (uint64_t)j;
      if ((st = get_arr(f, path, kt, n3, i, &v))) return st;
      const quant_traits *tr = v < QT_COUNT ? quant_traits_of((quant_type)v) : NULL;
      if (!tr || (!quant_is_blob((int)v) && (!tr->vec_dot || !tr->to_float)))
        return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: %s[%llu] = %lld: mole cannot compute with type %s", path, kt,
                           (unsigned long long)i, (long long)v, quant_type_name((uint32_t)v));
      lo->type[j] = (quant_type)v;
      if ((st = get_arr(f, path, kb, n3, i, &v))) return st;
      lo->bytes[j] = (uint64_t)v;
      if ((st = get_arr(f, path, ko, n3, i, &v))) return st;
      lo->offsets[j] = (uint64_t)v;
      const bool blob = quant_is_blob(lo->type[j]);
      // a ternary blob's size varies by expert: bytes is the largest, with room for its fixed part
      const size_t want = lo->type[j] == QT_TQ1 ? tq1_codes_offset(ne1[j])
                          : lo->type[j] == QT_TQ2 ? tq2_matrix_bytes(ne1[j], ne0[j])
                                                 : quant_row_size(lo->type[j], ne0[j]) * (size_t)ne1[j];
      if (blob && ne0[j] % 4)
        return mole_errorf(MOLE_ERR_FORMAT, "%s: %s[%llu]: compressed matrices need rows of a multiple of 4 (%lld)", path,
                           kt, (unsigned long long)i, (long long)ne0[j]);
      if (want == 0 || (lo->type[j] == QT_TQ1 ? lo->bytes[j] < want : lo->bytes[j] != want))
        return mole_errorf(MOLE_ERR_FORMAT, "%s: %s[%llu] = %llu, but a [%lld][%lld] %s matrix has %zu bytes", path, kb,
                           (unsigned long long)i, (unsigned long long)lo->bytes[j], (long long)ne1[j], (long long)ne0[j],
                           quant_type_name(lo->type[j]), want);
      if (lo->offsets[j] > lo->region || lo->bytes[j] > lo->region - lo->offsets[j])
        return mole_errorf(MOLE_ERR_FORMAT, "%s: %s[%llu]: matrix at %llu (%llu bytes) exceeds the region of %llu bytes",
                           path, ko, (unsigned long long)i, (unsigned long long)lo->offsets[j],
                           (unsigned long long)lo->bytes[j], (unsigned long long)lo->region);
    }
  }
  return MOLE_OK;
}

// The region tensor of (layer, e, p), checked for size and alignment.
static mole_status find_region(const gguf_file *f, const char *path, int64_t layer, int64_t e, int p,
                               const experts_layout *lo, const gguf_tensor **out) {
  char name[96];
  snprintf(name, sizeof name, "blk.%lld.ffn_exps.%lld.%s", (long long)layer, (long long)e, k_prec_name[p]);
  const gguf_tensor *t = gguf_find_tensor(f, name);
  if (!t) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: packed expert store: missing region tensor '%s'", path, name);
  const uint64_t file_off = (uint64_t)((const char *)t->data - (const char *)gguf_base(f));
  if (t->size < lo->region || file_off % EXPERTS_IO_ALIGN)
    return mole_errorf(MOLE_ERR_FORMAT,
                       "%s: region tensor '%s' at file offset %llu has %zu bytes; expected %llu bytes at a multiple of %d",
                       path, name, (unsigned long long)file_off, t->size, (unsigned long long)lo->region, EXPERTS_IO_ALIGN);
  *out = t;
  return MOLE_OK;
}

static mole_status check_pack_header(const gguf_file *f, const char *path, const experts_dims *d) {
  int64_t v;
  mole_status st = get_key_int(f, path, EXPERTS_PACK_KEY_VERSION, &v);
  if (st) return st;
  if (v != EXPERTS_PACK_VERSION)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: %s = %lld: this mole reads version %d", path, EXPERTS_PACK_KEY_VERSION,
                       (long long)v, EXPERTS_PACK_VERSION);
  const struct {
    const char *key;
    int64_t want;
  } dims[] = {{"mole.pack.n_layer", d->n_layer},
              {"mole.pack.n_embd", d->n_embd},
              {"mole.pack.n_ff", d->n_ff},
              {"mole.pack.n_expert", d->n_expert}};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    if ((st = get_key_int(f, path, dims[i].key, &v))) return st;
    if (v != dims[i].want)
      return mole_errorf(MOLE_ERR_FORMAT, "%s: %s = %lld does not match the model's %lld", path, dims[i].key,
                         (long long)v, (long long)dims[i].want);
  }
  return MOLE_OK;
}

mole_status experts_store_describe(const gguf_file *f, const char *path, const experts_dims *d, int64_t layer,
                                   quant_matrix *gate, quant_matrix *up, quant_matrix *down) {
  mole_status st = check_pack_header(f, path, d);
  if (st) return st;
  experts_layout lo[EXPERTS_PREC_N];
  for (int p = 0; p < EXPERTS_PREC_N; p++) {
    st = experts_store_read_layout(f, path, p, d->n_layer, layer, d->n_embd, d->n_ff, &lo[p]);
    if (st == MOLE_ERR_NOT_FOUND && p == 1) break;
    if (st) return st;
    for (int64_t e = 0; e < d->n_expert; e++) {
      const gguf_tensor *t;
      if ((st = find_region(f, path, layer, e, p, &lo[p], &t))) return st;
    }
  }
  quant_matrix *out[3] = {gate, up, down};
  const int64_t ne0[3] = {d->n_embd, d->n_embd, d->n_ff}, ne1[3] = {d->n_ff, d->n_ff, d->n_embd};
  for (int j = 0; j < 3; j++) {
    *out[j] = (quant_matrix){.data = NULL, .type = lo[0].type[j], .ne0 = ne0[j], .ne1 = ne1[j], .ne2 = d->n_expert};
    out[j]->row_bytes = quant_row_size(lo[0].type[j], ne0[j]);  // 0 for blobs
    out[j]->mat_bytes = quant_is_blob(lo[0].type[j]) ? lo[0].bytes[j] : out[j]->row_bytes * (size_t)ne1[j];
  }
  return MOLE_OK;
}

static bool is_expert_tensor(const char *name) {
  return strstr(name, ".ffn_exps.") || strstr(name, "_exps.weight");
}

void experts_store_advise_load(const gguf_file *f) {
  bool any = false;  // dense models keep the kernel's read-around
  for (int64_t i = 0; i < gguf_n_tensors(f) && !any; i++) any = is_expert_tensor(gguf_tensor_at(f, i)->name);
  if (any) madvise((void *)gguf_base(f), gguf_size(f), MADV_RANDOM);  // a hint: failure is harmless
}

void experts_store_advise_mode(const gguf_file *f, bool tiered) {
  if (!tiered) {
    madvise((void *)gguf_base(f), gguf_size(f), MADV_NORMAL);
    return;
  }
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    if (is_expert_tensor(t->name) || t->size == 0) continue;
    const uintptr_t a = (uintptr_t)t->data / pg * pg, b = ((uintptr_t)t->data + t->size + pg - 1) / pg * pg;
    madvise((void *)a, b - a, MADV_WILLNEED);
  }
}

static uint64_t align_down(uint64_t v) { return v / EXPERTS_IO_ALIGN * EXPERTS_IO_ALIGN; }
static uint64_t align_up(uint64_t v) { return (v + EXPERTS_IO_ALIGN - 1) / EXPERTS_IO_ALIGN * EXPERTS_IO_ALIGN; }

int experts_store_extents(const experts_store *s, int p, int64_t layer, int64_t e, experts_extent ext[3],
                          size_t mat_buf[3]) {
  const uint64_t *off = s->mat_off[p] + (layer * s->n_expert + e) * 3;
  int order[3] = {0, 1, 2};
  for (int a = 0; a < 3; a++)
    for (int b = a + 1; b < 3; b++)
      if (off[order[b]] < off[order[a]]) {
        int t = order[a];
        order[a] = order[b];
        order[b] = t;
      }
  int n = 0;
  uint64_t buf = 0;
  for (int i = 0; i < 3; i++) {
    const int j = order[i];
    const uint64_t b = align_down(off[j]), en = align_up(off[j] + s->layout[p][layer].bytes[j]);
    if (n > 0 && b <= ext[n - 1].file_off + ext[n - 1].len) {
      // overlaps or touches the previous extent: grow it
      experts_extent *x = &ext[n - 1];
      const uint64_t end = MOLE_MAX(x->file_off + x->len, en);
      buf += end - (x->file_off + x->len);
      x->len = end - x->file_off;
    } else {
      ext[n++] = (experts_extent){.file_off = b, .len = en - b, .buf_off = buf};
      buf += en - b;
    }
    const experts_extent *x = &ext[n - 1];
    mat_buf[j] = (size_t)(x->buf_off + (off[j] - x->file_off));
  }
  return n;
}

void experts_store_views(const experts_store *s, int p, int64_t layer, const void *base, const uint64_t off[3],
                         const uint8_t *r16, quant_matrix out[3]) {
  const experts_layout *lo = &s->layout[p][layer];
  for (int j = 0; j < 3; j++) {
    out[j] = (quant_matrix){.data = (const char *)base + off[j], .type = lo->type[j], .ne0 = s->ne0[j],
                            .ne1 = s->ne1[j], .ne2 = 1};
    // in the weights image (r16 given) rows are contiguous; in the file or a slot, the file's rows
    out[j].row_bytes = r16 ? quant_row_size(lo->type[j], s->ne0[j]) : (size_t)lo->stride[j];
    out[j].mat_bytes = out[j].row_bytes * (size_t)s->ne1[j];
    out[j].layout = r16 && r16[j] ? QL_R16 : QL_ROWS;
    if (quant_is_blob(lo->type[j])) {  // one blob (quant_tq.h)
      out[j].row_bytes = 0;
      out[j].mat_bytes = (size_t)lo->bytes[j];
      out[j].book = s->book;
    }
  }
}

// The dictionary of a compressed file: tensor EXPERTS_TQ_BOOK, 3 bytes an entry.
static mole_status load_book(experts_store *s, const gguf_file *f, const char *path) {
  const gguf_tensor *t = gguf_find_tensor(f, EXPERTS_TQ_BOOK);
  if (!t)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: compressed experts (tq1_dict) but no dictionary tensor '%s'", path,
                       EXPERTS_TQ_BOOK);
  if (t->type != 24 || t->size % 3)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s': expected i8 bytes, 3 per entry (type %s, %zu bytes)", path,
                       EXPERTS_TQ_BOOK, quant_type_name(t->type), t->size);
  mole_status st = tq_book_new(t->data, (int64_t)(t->size / 3), &s->book);
  return st ? mole_error_prefix(st, "%s: tensor '%s': ", path, EXPERTS_TQ_BOOK) : MOLE_OK;
}

mole_status experts_store_check(const experts_store *s, int p, int64_t layer, int64_t e, const quant_matrix v[3]) {
  static const char *const names[3] = {"gate", "up", "down"};
  for (int j = 0; j < 3; j++) {
    if (v[j].type != QT_TQ1) continue;  // tq2 blobs have a fixed size and no invalid content
    char err[160];
    if (!tq1_check(s->book, v[j].data, v[j].mat_bytes, v[j].ne1, v[j].ne0, err, sizeof err))
      return mole_errorf(MOLE_ERR_FORMAT, "%s: layer %lld expert %lld (%s precision) %s matrix: %s", gguf_path(s->f),
                         (long long)layer, (long long)e, k_prec_name[p], names[j], err);
  }
  return MOLE_OK;
}

mole_status experts_store_open(experts_store *s, const experts_config *cfg) {
  memset(s, 0, sizeof *s);
  const experts_dims d = {cfg->n_layer, cfg->n_expert, cfg->n_embd, cfg->n_ff_exp};
  const gguf_file *f = cfg->gguf;
  const char *path = gguf_path(f);
  s->f = f;
  s->n_layer = cfg->n_layer;
  s->n_expert = cfg->n_expert;
  s->packed = experts_store_is_packed(f);
  // this process's share of each expert: rows [fe0, fe1) of gate and up, those columns of down
  const int64_t fe0 = cfg->ff0, Fl = cfg->n_ff_local;
  const int64_t ne0[3] = {d.n_embd, d.n_embd, Fl}, ne1[3] = {Fl, Fl, d.n_embd};
  memcpy(s->ne0, ne0, sizeof ne0);
  memcpy(s->ne1, ne1, sizeof ne1);
  const size_t nk = (size_t)(d.n_layer * d.n_expert) * 3;
  const char *base = gguf_base(f);
  mole_status st = MOLE_OK;
  if (s->packed && (st = check_pack_header(f, path, &d))) return st;
  s->has_low = s->packed;
  const int n_prec = s->packed ? 2 : 1;
  s->region_lo = UINT64_MAX;
  for (int p = 0; p < n_prec && !st; p++) {
    s->layout[p] = mole_calloc((size_t)d.n_layer, sizeof *s->layout[p]);
    s->mat_off[p] = mole_malloc(nk * sizeof *s->mat_off[p]);
    if (!s->layout[p] || !s->mat_off[p]) {
      st = mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the expert table", path);
      break;
    }
    for (int64_t l = 0; l < d.n_layer && !st; l++) {
      experts_layout *lo = &s->layout[p][l];
      const quant_matrix *t = cfg->stacks + l * 3;  // gate, up, down
      if (s->packed) {
        st = experts_store_read_layout(f, path, p, d.n_layer, l, d.n_embd, d.n_ff, lo);
        if (st == MOLE_ERR_NOT_FOUND && p == 1) {
          s->has_low = false;
          st = MOLE_OK;
          break;
        }
        // the share within each matrix of the region (packed files hold whole matrices)
        for (int j = 0; !st && j < 3; j++) {
          if (!quant_is_blob(lo->type[j])) continue;
          if (Fl != d.n_ff)  // a blob's rows cannot be sliced
            st = mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: compressed experts (%s) cannot be split across processes", path,
                             quant_type_name(lo->type[j]));
          if (lo->type[j] == QT_TQ1 && !s->book && !st) st = load_book(s, f, path);
        }
        for (int j = 0; !st && j < 3; j++) {
          if (quant_is_blob(lo->type[j])) continue;
          lo->stride[j] = quant_row_size(lo->type[j], j < 2 ? d.n_embd : d.n_ff);
          lo->offsets[j] += j < 2 ? (uint64_t)fe0 * lo->stride[j] : quant_row_size(lo->type[j], fe0);
        }
      } else {
        for (int j = 0; j < 3; j++) {  // the bound stacks are the share already
          lo->type[j] = t[j].type;
          lo->stride[j] = t[j].row_bytes;
        }
      }
      for (int j = 0; !st && j < 3; j++)
        if (!quant_is_blob(lo->type[j]))
          lo->bytes[j] = (uint64_t)(ne1[j] - 1) * lo->stride[j] + quant_row_size(lo->type[j], ne0[j]);
      for (int64_t e = 0; e < d.n_expert && !st; e++) {
        uint64_t *off = s->mat_off[p] + (l * d.n_expert + e) * 3;
        if (s->packed) {
          const gguf_tensor *rt;
          if ((st = find_region(f, path, l, e, p, lo, &rt))) break;
          const uint64_t r0 = (uint64_t)((const char *)rt->data - base);
          for (int j = 0; j < 3; j++) off[j] = r0 + lo->offsets[j];
          s->region_lo = MOLE_MIN(s->region_lo, r0);
          s->region_hi = MOLE_MAX(s->region_hi, r0 + lo->region);
          s->file_bytes += lo->region;
        } else {
          for (int j = 0; j < 3; j++) {
            MOLE_ASSERT(t[j].data);
            off[j] = (uint64_t)((const char *)t[j].data - base) + (uint64_t)e * t[j].mat_bytes;
            s->region_lo = MOLE_MIN(s->region_lo, off[j]);
            s->region_hi = MOLE_MAX(s->region_hi, off[j] + lo->bytes[j]);
          }
        }
        s->total_bytes[p] += lo->bytes[0] + lo->bytes[1] + lo->bytes[2];
      }
    }
    if (st || (p == 1 && !s->has_low)) break;
    // the largest slot any expert needs
    for (int64_t l = 0; l < d.n_layer; l++)
      for (int64_t e = 0; e < d.n_expert; e++) {
        experts_extent ext[3];
        size_t mb[3];
        const int n = experts_store_extents(s, p, l, e, ext, mb);
        s->slot_bytes[p] = MOLE_MAX(s->slot_bytes[p], (size_t)(ext[n - 1].buf_off + ext[n - 1].len));
      }
  }
  if (!s->packed) s->file_bytes = s->total_bytes[0];
  if (!s->has_low) {
    mole_free(s->layout[1]);
    mole_free(s->mat_off[1]);
    s->layout[1] = NULL;
    s->mat_off[1] = NULL;
    s->total_bytes[1] = 0;
  }
  if (st) experts_store_free(s);
  return st;
}

void experts_store_free(experts_store *s) {
  tq_book_free(s->book);
  for (int p = 0; p < EXPERTS_PREC_N; p++) {
    mole_free(s->layout[p]);
    mole_free(s->mat_off[p]);
  }
  memset(s, 0, sizeof *s);
}
