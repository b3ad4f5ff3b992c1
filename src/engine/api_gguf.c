// engine: the public GGUF inspection and tensor type API (include/mole.h)
// over gguf/ and quant/.
#include "engine/api.h"
#include "quant/quant.h"

_Static_assert((int)MOLE_GGUF_FLOAT64 == (int)GGUF_T_FLOAT64 && (int)MOLE_GGUF_ARRAY == (int)GGUF_T_ARRAY &&
                   (int)MOLE_GGUF_STRING == (int)GGUF_T_STRING && (int)MOLE_GGUF_BOOL == (int)GGUF_T_BOOL,
               "mole.h's GGUF value types are the file format's ids");
_Static_assert(GGUF_MAX_DIMS == 4, "mole_gguf_tensor holds every dimension");

mole_status mole_gguf_open(const char *path, mole_gguf **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_open: out is NULL");
  *out = NULL;
  if (!path) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_open: no file given");
  mole_gguf *g = mole_calloc(1, sizeof *g);
  if (!g) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", path);
  mole_status st = gguf_open(path, &g->f);
  if (st) {
    mole_free(g);
    return st;
  }
  *out = g;
  return MOLE_OK;
}

void mole_gguf_close(mole_gguf *g) {
  if (!g) return;
  gguf_close(g->f);
  mole_free(g);
}

void mole_gguf_get_info(const mole_gguf *g, mole_gguf_info *out) {
  const gguf_file *f = g->f;
  *out = (mole_gguf_info){gguf_version(f), gguf_alignment(f), gguf_data_offset(f),
                          gguf_size(f),    gguf_n_kv(f),      gguf_n_tensors(f)};
}

const char *mole_gguf_type_name(mole_gguf_type t) { return gguf_type_name((gguf_type)t); }

size_t mole_gguf_type_size(mole_gguf_type t) { return gguf_type_size((gguf_type)t); }

mole_status mole_gguf_kv_at(const mole_gguf *g, int64_t i, mole_gguf_kv *out) {
  if (!g || !out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_kv_at: a NULL argument");
  if (i < 0 || i >= gguf_n_kv(g->f))
    return mole_errorf(MOLE_ERR_ARG, "%s: metadata key %lld out of range (%lld keys)", gguf_path(g->f), (long long)i,
                       (long long)gguf_n_kv(g->f));
  const gguf_type t = gguf_kv_type(g->f, i), et = gguf_kv_arr_type(g->f, i);
  *out = (mole_gguf_kv){.key = gguf_kv_key(g->f, i),
                        .type = (mole_gguf_type)t,
                        .elem_type = (mole_gguf_type)et,
                        .n = gguf_kv_arr_n(g->f, i),
                        .data = et == GGUF_T_STRING ? NULL : gguf_kv_data(g->f, i)};
  return MOLE_OK;
}

const char *mole_gguf_kv_str(const mole_gguf *g, int64_t i, uint64_t j, uint64_t *len) {
  if (!g || i < 0 || i >= gguf_n_kv(g->f)) return NULL;
  return gguf_kv_str(g->f, i, j, len);
}

int64_t mole_gguf_find_kv(const mole_gguf *g, const char *key) {
  return g && key ? gguf_find_kv(g->f, key) : -1;
}

mole_status mole_gguf_get_int(const mole_gguf *g, const char *key, int64_t *out) {
  if (!g || !key || !out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_get_int: a NULL argument");
  return gguf_get_int(g->f, key, out);
}

mole_status mole_gguf_get_str(const mole_gguf *g, const char *key, const char **out) {
  if (!g || !key || !out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_get_str: a NULL argument");
  return gguf_get_str(g->f, key, out);
}

mole_status mole_gguf_tensor_at(const mole_gguf *g, int64_t i, mole_gguf_tensor *out) {
  if (!g || !out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_tensor_at: a NULL argument");
  if (i < 0 || i >= gguf_n_tensors(g->f))
    return mole_errorf(MOLE_ERR_ARG, "%s: tensor %lld out of range (%lld tensors)", gguf_path(g->f), (long long)i,
                       (long long)gguf_n_tensors(g->f));
  const gguf_tensor *t = gguf_tensor_at(g->f, i);
  *out = (mole_gguf_tensor){.name = t->name,
                            .type = (int)t->type,
                            .type_name = quant_type_name(t->type),
                            .n_dims = t->n_dims,
                            .ne = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]},
                            .offset = t->offset,
                            .bytes = t->size};
  return MOLE_OK;
}

const char *mole_type_name(int type) { return quant_type_name((uint32_t)type); }

int mole_type_from_name(const char *name) { return name ? quant_type_from_name(name) : -1; }

bool mole_type_writable(int type) {
  const quant_traits *tr = type >= 0 ? quant_traits_of((quant_type)type) : NULL;
  return tr && tr->from_float && tr->vec_dot;
}

bool mole_type_computable(int type) { return type >= 0 && quant_type_supported((uint32_t)type); }
