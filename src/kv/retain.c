// kv/retain: retaining heads (retain.h): the side file and the scoring MLP.
#include "kv/retain.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

#define RETAIN_ARCH "mole-retain"

mole_status kv_retain_new(int64_t n_layer, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t head_dim_v,
                          int64_t n_hidden, kv_retain **out) {
  *out = NULL;
  if (n_layer < 1 || n_layer > 4096 || n_head < 1 || n_head > 4096 || n_head_kv < 1 || n_head_kv > n_head ||
      n_head % n_head_kv || head_dim < 1 || head_dim > 4096 || head_dim_v < 1 || head_dim_v > 4096 || n_hidden < 1 ||
      n_hidden > 65536)
    return mole_errorf(MOLE_ERR_ARG,
                       "retaining heads: bad geometry (layers %lld, heads %lld/%lld kv, head dims %lld/%lld, hidden %lld)",
                       (long long)n_layer, (long long)n_head, (long long)n_head_kv, (long long)head_dim,
                       (long long)head_dim_v, (long long)n_hidden);
  kv_retain *r = mole_calloc(1, sizeof *r);
  if (!r) return mole_errorf(MOLE_ERR_NOMEM, "retaining heads: out of memory");
  *r = (kv_retain){.n_layer = n_layer, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = head_dim,
                   .head_dim_v = head_dim_v, .n_hidden = n_hidden,
                   .d_in = n_head * head_dim + n_head_kv * head_dim + n_head_kv * head_dim_v};
  const size_t L = (size_t)n_layer, D = (size_t)r->d_in, H = (size_t)n_hidden, K = (size_t)n_head_kv;
  r->in_mean = mole_calloc(L * D, sizeof(float));
  r->in_scale = mole_calloc(L * D, sizeof(float));
  r->w1 = mole_calloc(L * H * D, sizeof(float));
  r->b1 = mole_calloc(L * H, sizeof(float));
  r->w2 = mole_calloc(L * K * H, sizeof(float));
  r->b2 = mole_calloc(L * K, sizeof(float));
  if (!r->in_mean || !r->in_scale || !r->w1 || !r->b1 || !r->w2 || !r->b2) {
    kv_retain_free(r);
    return mole_errorf(MOLE_ERR_NOMEM, "retaining heads: out of memory for %lld layers", (long long)n_layer);
  }
  for (size_t i = 0; i < L * D; i++) r->in_scale[i] = 1.0f;
  *out = r;
  return MOLE_OK;
}

void kv_retain_free(kv_retain *r) {
  if (!r) return;
  mole_free(r->in_mean);
  mole_free(r->in_scale);
  mole_free(r->w1);
  mole_free(r->b1);
  mole_free(r->w2);
  mole_free(r->b2);
  mole_free(r);
}

// the tensors of one layer: name suffix, destination, shape (ne0 = row length)
typedef struct {
  const char *name;
  float *dst;
  int64_t ne0, ne1;
} retain_tensor;

static int layer_tensors(const kv_retain *r, int64_t l, retain_tensor t[6]) {
  const size_t D = (size_t)r->d_in, H = (size_t)r->n_hidden, K = (size_t)r->n_head_kv, ul = (size_t)l;
  t[0] = (retain_tensor){"in_mean", r->in_mean + ul * D, r->d_in, 1};
  t[1] = (retain_tensor){"in_scale", r->in_scale + ul * D, r->d_in, 1};
  t[2] = (retain_tensor){"w1", r->w1 + ul * H * D, r->d_in, r->n_hidden};
  t[3] = (retain_tensor){"b1", r->b1 + ul * H, r->n_hidden, 1};
  t[4] = (retain_tensor){"w2", r->w2 + ul * K * H, r->n_hidden, r->n_head_kv};
  t[5] = (retain_tensor){"b2", r->b2 + ul * K, r->n_head_kv, 1};
  return 6;
}

static const char *const KEYS[] = {"mole.retain.n_layer",    "mole.retain.n_head",     "mole.retain.n_head_kv",
                                   "mole.retain.head_dim",   "mole.retain.head_dim_v", "mole.retain.n_hidden"};

mole_status kv_retain_load(const char *path, kv_retain **out) {
  *out = NULL;
  gguf_file *f = NULL;
  mole_status st = gguf_open(path, &f);
  if (st) return st;
  const char *arch = NULL;
  if (gguf_get_str(f, "general.architecture", &arch) || strcmp(arch, RETAIN_ARCH)) {
    st = mole_errorf(MOLE_ERR_FORMAT, "%s: not a retaining-heads file (general.architecture is '%s', expected '%s')",
                     path, arch ? arch : "(missing)", RETAIN_ARCH);
    gguf_close(f);
    return st;
  }
  int64_t v[6];
  for (int i = 0; i < 6; i++)
    if (gguf_get_int(f, KEYS[i], &v[i])) {
      st = mole_errorf(MOLE_ERR_FORMAT, "%s: retaining heads: key %s is missing or not an integer", path, KEYS[i]);
      gguf_close(f);
      return st;
    }
  kv_retain *r = NULL;
  if ((st = kv_retain_new(v[0], v[1], v[2], v[3], v[4], v[5], &r))) {
    st = mole_errorf(MOLE_ERR_FORMAT, "%s: %s", path, mole_last_error());
    gguf_close(f);
    return st;
  }
  int64_t w = 0;
  if (!gguf_get_int(f, "mole.retain.window", &w)) r->window = w;
  const char *ma = NULL;
  if (!gguf_get_str(f, "mole.retain.model_arch", &ma)) snprintf(r->model_arch, sizeof r->model_arch, "%s", ma);
  for (int64_t l = 0; l < r->n_layer && !st; l++) {
    retain_tensor t[6];
    const int nt = layer_tensors(r, l, t);
    for (int i = 0; i < nt && !st; i++) {
      char name[64];
      snprintf(name, sizeof name, "retain.%lld.%s", (long long)l, t[i].name);
      const gguf_tensor *g = gguf_find_tensor(f, name);
      if (!g) {
        st = mole_errorf(MOLE_ERR_FORMAT, "%s: retaining heads: tensor %s is missing", path, name);
      } else if (g->type != QT_F32 || g->ne[0] != t[i].ne0 || g->ne[1] != t[i].ne1 || g->ne[2] != 1 || g->ne[3] != 1) {
        st = mole_errorf(MOLE_ERR_FORMAT, "%s: retaining heads: tensor %s is %s [%lld, %lld], expected f32 [%lld, %lld]",
                         path, name, quant_type_name((quant_type)g->type), (long long)g->ne[0], (long long)g->ne[1],
                         (long long)t[i].ne0, (long long)t[i].ne1);
      } else {
        const size_t n = (size_t)(t[i].ne0 * t[i].ne1);
        memcpy(t[i].dst, g->data, n * sizeof(float));
        for (size_t j = 0; j < n && !st; j++)
          if (!isfinite(t[i].dst[j]))
            st = mole_errorf(MOLE_ERR_FORMAT, "%s: retaining heads: tensor %s element %zu is not finite", path, name, j);
      }
    }
  }
  gguf_close(f);
  if (st) {
    kv_retain_free(r);
    return st;
  }
  *out = r;
  return MOLE_OK;
}

mole_status kv_retain_check(const kv_retain *r, const char *path, int64_t n_layer, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, int64_t head_dim_v) {
  const int64_t have[5] = {r->n_layer, r->n_head, r->n_head_kv, r->head_dim, r->head_dim_v};
  const int64_t want[5] = {n_layer, n_head, n_head_kv, head_dim, head_dim_v};
  const char *what[5] = {"layers", "attention heads", "KV heads", "key head size", "value head size"};
  for (int i = 0; i < 5; i++)
    if (have[i] != want[i])
      return mole_errorf(MOLE_ERR_ARG, "%s: retaining heads for another model: %lld %s (%s), the model has %lld", path,
                         (long long)have[i], what[i], KEYS[i], (long long)want[i]);
  return MOLE_OK;
}

mole_status kv_retain_save(const kv_retain *r, const char *path) {
  gguf_writer *w = NULL;
  mole_status st = gguf_writer_new(&w);
  if (st) return st;
  const int64_t v[6] = {r->n_layer, r->n_head, r->n_head_kv, r->head_dim, r->head_dim_v, r->n_hidden};
  if (!st) st = gguf_writer_set_str(w, "general.architecture", RETAIN_ARCH);
  if (!st) st = gguf_writer_set_str(w, "mole.retain.model_arch", r->model_arch);
  for (int i = 0; i < 6 && !st; i++) st = gguf_writer_set_u32(w, KEYS[i], (uint32_t)v[i]);
  if (!st) st = gguf_writer_set_u32(w, "mole.retain.window", (uint32_t)r->window);
  for (int64_t l = 0; l < r->n_layer && !st; l++) {
    retain_tensor t[6];
    const int nt = layer_tensors(r, l, t);
    for (int i = 0; i < nt && !st; i++) {
      char name[64];
      snprintf(name, sizeof name, "retain.%lld.%s", (long long)l, t[i].name);
      const int64_t ne[2] = {t[i].ne0, t[i].ne1};
      st = gguf_writer_add_tensor(w, name, QT_F32, t[i].ne1 > 1 ? 2 : 1, ne, NULL);
    }
  }
  if (!st) st = gguf_writer_begin(w, path);
  for (int64_t l = 0; l < r->n_layer && !st; l++) {
    retain_tensor t[6];
    const int nt = layer_tensors(r, l, t);
    for (int i = 0; i < nt && !st; i++) st = gguf_writer_write(w, t[i].dst, (size_t)(t[i].ne0 * t[i].ne1) * sizeof(float));
  }
  if (!st) st = gguf_writer_finish(w);
  gguf_writer_free(w);
  return st;
}

size_t kv_retain_tmp_bytes(const kv_retain *r, int64_t n) {
  return (size_t)n * (size_t)(r->d_in + r->n_hidden) * sizeof(float);
}

void kv_retain_input(const kv_retain *r, int64_t layer, const float *q, const float *k, const float *v, float *x) {
  const int64_t nq = r->n_head * r->head_dim, nk = r->n_head_kv * r->head_dim, nv = r->n_head_kv * r->head_dim_v;
  const float *mu = r->in_mean + layer * r->d_in, *sc = r->in_scale + layer * r->d_in;
  for (int64_t i = 0; i < nq; i++) x[i] = (q[i] - mu[i]) * sc[i];
  for (int64_t i = 0; i < nk; i++) x[nq + i] = (k[i] - mu[nq + i]) * sc[nq + i];
  for (int64_t i = 0; i < nv; i++) x[nq + nk + i] = (v[i] - mu[nq + nk + i]) * sc[nq + nk + i];
}

void kv_retain_score(const kv_retain *r, int64_t layer, int64_t n, const float *q, int64_t ldq, const float *k,
                     int64_t ldk, const float *v, int64_t ldv, float *out, int64_t ldo, float *tmp) {
  const int64_t D = r->d_in, H = r->n_hidden, K = r->n_head_kv;
  float *X = tmp, *Hh = tmp + n * D;  // [n][D], [n][H]
  for (int64_t t = 0; t < n; t++) kv_retain_input(r, layer, q + t * ldq, k + t * ldk, v + t * ldv, X + t * D);
  const float *w1 = r->w1 + layer * H * D, *b1 = r->b1 + layer * H;
  const float *w2 = r->w2 + layer * K * H, *b2 = r->b2 + layer * K;
  for (int64_t t = 0; t < n; t++) memcpy(Hh + t * H, b1, (size_t)H * sizeof(float));
  // Hh [n][H] += X [n][D] . w1^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)H, (int)D, 1.0f, X, (int)D, w1, (int)D, 1.0f, Hh,
              (int)H);
  for (int64_t i = 0; i < n * H; i++) Hh[i] = Hh[i] / (1.0f + expf(-Hh[i]));
  for (int64_t t = 0; t < n; t++)
    for (int64_t g = 0; g < K; g++) {
      float s = b2[g];
      for (int64_t j = 0; j < H; j++) s += w2[g * H + j] * Hh[t * H + j];
      out[t * ldo + g] = s;
    }
}
