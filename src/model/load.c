// Hparams from GGUF metadata, and tensor binding with shape/type validation,
// as the architecture's description (arch.c) asks. Every problem is reported
// with the file and the key or tensor name.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "experts/experts.h"
#include "experts/store.h"
#include "model/arch.h"
#include "model/model.h"
#include "model/ops.h"

// The most experts a token may use: the predictor keeps one prediction's
// choices on the stack (experts/predict.c). llama.cpp takes up to
// expert_count (at most 512); the models out there use 1 to 16.

typedef struct loader {
  mole_model *m;
  const gguf_file *f;
  const char *path;
  const char *arch;
  const arch_desc *ad;  // its description
  float *f32_next;  // bump pointer into m->f32_store
  float *f32_end;
} loader;

// ---- metadata -----------------------------------------------------------
static mole_status get_int(loader *L, const char *suffix, bool required, int64_t def, int64_t *out) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
  int64_t ki = gguf_find_kv(L->f, key);
  if (ki < 0) {
    if (required) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing metadata key '%s'", L->path, key);
    *out = def;
    return MOLE_OK;
  }
  if (gguf_kv_type(L->f, ki) == GGUF_T_ARRAY) {
    // per-layer values: supported only when they are all equal
    uint64_t n = gguf_kv_arr_n(L->f, ki);
    int64_t v0 = 0;
    for (uint64_t i = 0; i < n; i++) {
      int64_t v;
      mole_status st = gguf_get_arr_int(L->f, key, i, &v);
      if (st) return mole_error_prefix(st, "%s: ", L->path);
      if (i == 0) v0 = v;
      if (v != v0)
        return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: '%s' varies per layer (%lld vs %lld): not supported", L->path,
                           key, (long long)v0, (long long)v);
    }
    if (n == 0) return mole_errorf(MOLE_ERR_FORMAT, "%s: '%s' is an empty array", L->path, key);
    *out = v0;
    return MOLE_OK;
  }
  mole_status st = gguf_get_int(L->f, key, out);
  if (st) return mole_error_prefix(st, "%s: ", L->path);
  return MOLE_OK;
}

static mole_status get_float(loader *L, const char *suffix, bool required, double def, double *out) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
  if (gguf_find_kv(L->f, key) < 0) {
    if (required) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing metadata key '%s'", L->path, key);
    *out = def;
    return MOLE_OK;
  }
  mole_status st = gguf_get_float(L->f, key, out);
  if (st) return mole_error_prefix(st, "%s: ", L->path);
  return MOLE_OK;
}

static mole_status check_range(loader *L, const char *what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s.%s = %lld is out of range [%lld, %lld]", L->path, L->arch, what,
                       (long long)v, (long long)lo, (long long)hi);
  return MOLE_OK;
}

#define TRY(x)                     \
  do {                             \
    mole_status st_ = (x);         \
    if (st_ != MOLE_OK) return st_; \
  } while (0)

static mole_status load_rope(loader *L, model_hparams *hp) {
  char key[128];
  snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch);
  const char *stype = "none";
  if (gguf_find_kv(L->f, key) >= 0) {
    mole_status st = gguf_get_str(L->f, key, &stype);
    if (st) return mole_error_prefix(st, "%s: ", L->path);
  }
  double factor = 0;
  TRY(get_float(L, "rope.scaling.factor", false, 0.0, &factor));
  if (factor == 0) TRY(get_float(L, "rope.scale_linear", false, 0.0, &factor));
  hp->rope_freq_scale = 1.0f;
  if (strcmp(stype, "none") == 0) {
    // a factor without a type is linear scaling in llama.cpp
    if (factor != 0 && factor != 1) hp->rope_freq_scale = (float)(1.0 / factor);
  } else if (strcmp(stype, "linear") == 0) {
    if (factor != 0) hp->rope_freq_scale = (float)(1.0 / factor);
  } else {
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: %s = '%s': mole supports only none and linear RoPE scaling",
                       L->path, key, stype);
  }
  double attn_factor = 1.0;
  TRY(get_float(L, "rope.scaling.attn_factor", false, 1.0, &attn_factor));
  if (attn_factor != 1.0)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: %s.rope.scaling.attn_factor = %g is not supported (only 1)", L->path,
                       L->arch, attn_factor);
  double base;
  TRY(get_float(L, "rope.freq_base", false, 10000.0, &base));
  if (!(base > 0) || !isfinite(base))
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s.rope.freq_base = %g must be > 0", L->path, L->arch, base);
  hp->rope_base = (float)base;
  return MOLE_OK;
}

static mole_status load_hparams(loader *L, const arch_desc *ad) {
  model_hparams *hp = &L->m->hp;
  hp->rope_neox = ad->rope_neox;
  hp->norm_topk = ad->norm_topk;
  const int64_t BIG = (int64_t)1 << 24;
  TRY(get_int(L, "context_length", false, 4096, &hp->n_ctx_train));
  TRY(check_range(L, "context_length", hp->n_ctx_train, 1, INT32_MAX));
  TRY(get_int(L, "embedding_length", true, 0, &hp->n_embd));
  TRY(check_range(L, "embedding_length", hp->n_embd, 1, BIG));
  TRY(get_int(L, "block_count", true, 0, &hp->n_layer));
  TRY(check_range(L, "block_count", hp->n_layer, 1, 4096));
  TRY(get_int(L, "attention.head_count", true, 0, &hp->n_head));
  TRY(check_range(L, "attention.head_count", hp->n_head, 1, 4096));
  TRY(get_int(L, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv));
  TRY(check_range(L, "attention.head_count_kv", hp->n_head_kv, 1, hp->n_head));
  if (hp->n_head % hp->n_head_kv != 0)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: head_count %lld is not a multiple of head_count_kv %lld", L->path,
                       (long long)hp->n_head, (long long)hp->n_head_kv);
  TRY(get_int(L, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim));
  TRY(check_range(L, "attention.key_length", hp->head_dim, 1, 65536));
  TRY(get_int(L, "attention.value_length", false, hp->n_embd / hp->n_head, &hp->head_dim_v));
  TRY(check_range(L, "attention.value_length", hp->head_dim_v, 1, 65536));
  TRY(get_int(L, "rope.dimension_count", false, hp->head_dim, &hp->n_rot));
  TRY(check_range(L, "rope.dimension_count", hp->n_rot, 0, MOLE_MIN(hp->head_dim, (int64_t)OPS_ROPE_MAX_ROT)));
  if (hp->n_rot % 2) return mole_errorf(MOLE_ERR_FORMAT, "%s: rope.dimension_count %lld is odd", L->path, (long long)hp->n_rot);
  TRY(get_int(L, "feed_forward_length", false, 0, &hp->n_ff));
  TRY(check_range(L, "feed_forward_length", hp->n_ff, 0, BIG));
  TRY(get_int(L, "expert_count", false, 0, &hp->n_expert));
  TRY(check_range(L, "expert_count", hp->n_expert, 0, 4096));
  TRY(get_int(L, "expert_used_count", hp->n_expert > 0, 0, &hp->n_expert_used));
  if (hp->n_expert > 0)
    TRY(check_range(L, "expert_used_count", hp->n_expert_used, 1, MOLE_MIN(hp->n_expert, (int64_t)EXPERTS_MAX_USED)));
  if (ad->needs_experts && hp->n_expert == 0)
    return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: architecture %s needs '%s.expert_count'", L->path, ad->name, ad->name);
  TRY(get_int(L, "expert_feed_forward_length", false, hp->n_ff, &hp->n_ff_exp));
  TRY(check_range(L, "expert_feed_forward_length", hp->n_ff_exp, hp->n_expert ? 1 : 0, BIG));
  TRY(get_int(L, "expert_shared_feed_forward_length", false, ad->shexp ? hp->n_ff : 0, &hp->n_ff_shexp));
  TRY(check_range(L, "expert_shared_feed_forward_length", hp->n_ff_shexp, 0, BIG));
  double eps;
  TRY(get_float(L, "attention.layer_norm_rms_epsilon", true, 0, &eps));
  if (!(eps > 0 && eps < 1))
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s.attention.layer_norm_rms_epsilon = %g out of range", L->path, L->arch, eps);
  hp->rms_eps = (float)eps;
  double scale;
  TRY(get_float(L, "attention.scale", false, 0.0, &scale));
  hp->attn_scale = scale != 0 ? (float)scale : 1.0f / sqrtf((float)hp->head_dim);
  TRY(get_float(L, "expert_weights_scale", false, 0.0, &scale));
  hp->expert_weights_scale = (float)scale;
  int64_t gating;
  TRY(get_int(L, "expert_gating_func", false, 1, &gating));
  if (gating != 1)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: %s.expert_gating_func = %lld: only softmax (1) is implemented", L->path,
                       L->arch, (long long)gating);
  return load_rope(L, hp);
}

// ---- tensors ------------------------------------------------------------
static mole_status find(loader *L, const char *name, bool required, const gguf_tensor **out) {
  *out = gguf_find_tensor(L->f, name);
  if (!*out && required)
    return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing tensor '%s' (required by architecture %s)", L->path, name, L->arch);
  return MOLE_OK;
}

// "[a, b, c]": the first nd of ne.
static void shape_str(char *buf, size_t n, const int64_t *ne, uint32_t nd) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (uint32_t i = 0; i < nd && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)ne[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

// The tensor's whole declared shape against the expected [ne0, ne1, ne2] of
// nd dims: every dim (the fourth is 1), and the number of dims: a vector
// (nd 1) declared 1-D, a matrix or a stack of them in no more dims than nd
// (ggml writes a shape without its trailing dims of 1: fewer is the same
// shape).
static mole_status check_shape(loader *L, const gguf_tensor *t, uint32_t nd, int64_t ne0, int64_t ne1, int64_t ne2) {
  const int64_t want[4] = {ne0, ne1, ne2, 1};
  bool ok = nd == 1 ? t->n_dims == 1 : t->n_dims >= 1 && t->n_dims <= nd;
  for (int i = 0; i < 4 && ok; i++) ok = t->ne[i] == want[i];
  if (ok) return MOLE_OK;
  char got[128], exp[128];
  shape_str(got, sizeof got, t->ne, MOLE_MIN(t->n_dims, 4u));
  shape_str(exp, sizeof exp, want, nd);
  return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s' has shape %s (%u-D), expected %s (%u-D)", L->path, t->name, got,
                     t->n_dims, exp, nd);
}

// A weight used in matmuls: a matrix [ne1][ne0] (nd 2), or a stack of
// expert matrices [ne2][ne1][ne0] (nd 3).
static mole_status bind_tensor(loader *L, model_tensor *mt, const char *name, bool required, uint32_t nd, int64_t ne0,
                               int64_t ne1, int64_t ne2) {
  const gguf_tensor *t;
  memset(mt, 0, sizeof *mt);
  TRY(find(L, name, required, &t));
  if (!t) return MOLE_OK;
  TRY(check_shape(L, t, nd, ne0, ne1, ne2));
  const quant_traits *tr = quant_traits_of((quant_type)t->type);
  if (!tr || !tr->vec_dot || !tr->to_float)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which mole cannot compute with", L->path,
                       name, quant_type_name(t->type));
  mt->data = t->data;
  mt->type = (quant_type)t->type;
  mt->ne0 = ne0;
  mt->ne1 = ne1;
  mt->ne2 = ne2;
  mt->row_bytes = quant_row_size(mt->type, ne0);
  mt->mat_bytes = mt->row_bytes * (size_t)ne1;
  return MOLE_OK;
}

static mole_status bind_mat(loader *L, model_tensor *mt, const char *name, bool required, int64_t ne0, int64_t ne1) {
  return bind_tensor(L, mt, name, required, 2, ne0, ne1, 1);
}

static mole_status bind_stack(loader *L, model_tensor *mt, const char *name, bool required, int64_t ne0, int64_t ne1,
                              int64_t ne2) {
  return bind_tensor(L, mt, name, required, 3, ne0, ne1, ne2);
}

// A shard's rows [r0, r1) of a bound matrix (column parallel).
static void slice_rows(model_tensor *mt, int64_t r0, int64_t r1) {
  if (!mt->data) return;
  mt->data = (const char *)mt->data + (size_t)r0 * mt->row_bytes;
  mt->ne1 = r1 - r0;
}

// A shard's columns [c0, c1) of every row of a bound matrix (row parallel):
// they must start and end on quantization blocks.
static mole_status slice_cols(loader *L, model_tensor *mt, const char *name, int64_t c0, int64_t c1) {
  if (!mt->data) return MOLE_OK;
  const int64_t bs = quant_blck_size(mt->type);
  if (c0 % bs || (c1 % bs && c1 != mt->ne0))
    return mole_errorf(MOLE_ERR_ARG,
                       "%s: tensor '%s' (%s, blocks of %lld): this process's columns [%lld, %lld) do not fall on "
                       "blocks; give shares in multiples of %lld columns",
                       L->path, name, quant_type_name(mt->type), (long long)bs, (long long)c0, (long long)c1,
                       (long long)bs);
  mt->data = (const char *)mt->data + quant_row_size(mt->type, c0);
  mt->ne0 = c1 - c0;
  return MOLE_OK;
}

// A vector (norm weight, bias), converted to f32 once.
static mole_status bind_vec(loader *L, const float **out, const char *name, bool required, int64_t n) {
  const gguf_tensor *t;
  *out = NULL;
  TRY(find(L, name, required, &t));
  if (!t) return MOLE_OK;
  TRY(check_shape(L, t, 1, n, 1, 1));
  const quant_traits *tr = quant_traits_of((quant_type)t->type);
  if (!tr || !tr->to_float)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which mole cannot read", L->path, name,
                       quant_type_name(t->type));
  MOLE_ASSERT(L->f32_next + n <= L->f32_end);
  tr->to_float(t->data, L->f32_next, n);
  *out = L->f32_next;
  L->f32_next += n;
  return MOLE_OK;
}

static mole_status bind_layer(loader *L, int64_t il) {
  mole_model *m = L->m;
  const model_hparams *hp = &m->hp;
  model_layer *ly = &m->layers[il];
  arch_layer_plan(L->ad, hp, il, &ly->plan);
  int64_t E = hp->n_embd, q_dim = hp->n_head * hp->head_dim, k_dim = hp->n_head_kv * hp->head_dim,
          v_dim = hp->n_head_kv * hp->head_dim_v, o_dim = hp->n_head * hp->head_dim_v;
  char n[128];
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld." s, (long long)il), n)
  const model_shard *sh = &m->shard;
  const int64_t group = hp->n_head / hp->n_head_kv, hd = hp->head_dim, hdv = hp->head_dim_v;
  TRY(bind_vec(L, &ly->attn_norm, NAME("attn_norm.weight"), true, E));
  TRY(bind_mat(L, &ly->wq, NAME("attn_q.weight"), true, E, q_dim));
  slice_rows(&ly->wq, sh->kvh0 * group * hd, sh->kvh1 * group * hd);
  TRY(bind_mat(L, &ly->wk, NAME("attn_k.weight"), true, E, k_dim));
  slice_rows(&ly->wk, sh->kvh0 * hd, sh->kvh1 * hd);
  TRY(bind_mat(L, &ly->wv, NAME("attn_v.weight"), true, E, v_dim));
  // the block's input is converted for attn_q's type and attn_k's; attn_v takes one of them
  const quant_type vq = ops_vec_type(&ly->wq), vk = ops_vec_type(&ly->wk), vv = ops_vec_type(&ly->wv);
  if (vv != vq && vv != vk)
    return mole_errorf(MOLE_ERR_UNSUPPORTED,
                       "%s: tensor '%s' (%s) takes its input as %s, attn_q and attn_k as %s and %s: mole converts an "
                       "attention block's input to at most two types",
                       L->path, n, quant_type_name(ly->wv.type), quant_type_name(vv), quant_type_name(vq),
                       quant_type_name(vk));
  slice_rows(&ly->wv, sh->kvh0 * hdv, sh->kvh1 * hdv);
  TRY(bind_mat(L, &ly->wo, NAME("attn_output.weight"), true, o_dim, E));
  TRY(slice_cols(L, &ly->wo, n, sh->kvh0 * group * hdv, sh->kvh1 * group * hdv));
  TRY(bind_vec(L, &ly->bq, NAME("attn_q.bias"), ly->plan.qkv_bias, q_dim));
  TRY(bind_vec(L, &ly->bk, NAME("attn_k.bias"), ly->plan.qkv_bias, k_dim));
  TRY(bind_vec(L, &ly->bv, NAME("attn_v.bias"), ly->plan.qkv_bias, v_dim));
  if (ly->bq) ly->bq += sh->kvh0 * group * hd;
  if (ly->bk) ly->bk += sh->kvh0 * hd;
  if (ly->bv) ly->bv += sh->kvh0 * hdv;
  TRY(bind_vec(L, &ly->bo, NAME("attn_output.bias"), false, E));
  if (ly->plan.qk_norm == QK_NORM_HEAD) {
    TRY(bind_vec(L, &ly->q_norm, NAME("attn_q_norm.weight"), true, hp->head_dim));
    TRY(bind_vec(L, &ly->k_norm, NAME("attn_k_norm.weight"), true, hp->head_dim));
  } else if (ly->plan.qk_norm == QK_NORM_FULL) {  // over the whole projection: this shard's part of the weights
    TRY(bind_vec(L, &ly->q_norm, NAME("attn_q_norm.weight"), true, q_dim));
    TRY(bind_vec(L, &ly->k_norm, NAME("attn_k_norm.weight"), true, k_dim));
    ly->q_norm += sh->kvh0 * group * hd;
    ly->k_norm += sh->kvh0 * hd;
  }
  TRY(bind_vec(L, &ly->ffn_norm, NAME("ffn_norm.weight"), true, E));
  if (ly->plan.ffn == FFN_DENSE) {
    if (hp->n_ff <= 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing '%s.feed_forward_length'", L->path, L->arch);
    TRY(bind_mat(L, &ly->ffn_gate, NAME("ffn_gate.weight"), true, E, hp->n_ff));
    slice_rows(&ly->ffn_gate, sh->ff0, sh->ff1);
    TRY(bind_mat(L, &ly->ffn_up, NAME("ffn_up.weight"), true, E, hp->n_ff));
    slice_rows(&ly->ffn_up, sh->ff0, sh->ff1);
    TRY(bind_mat(L, &ly->ffn_down, NAME("ffn_down.weight"), true, hp->n_ff, E));
    TRY(slice_cols(L, &ly->ffn_down, n, sh->ff0, sh->ff1));
  } else {
    int64_t X = hp->n_expert, F = hp->n_ff_exp;
    TRY(bind_mat(L, &ly->gate_inp, NAME("ffn_gate_inp.weight"), true, E, X));
    if (experts_store_is_packed(L->f)) {
      // packed expert store (mole pack): no ffn_*_exps stacks; shapes and types
      // come from its mole.pack.* metadata, the weights only via the provider
      const experts_dims d = {hp->n_layer, hp->n_expert, hp->n_embd, hp->n_ff_exp};
      TRY(experts_store_describe(L->f, L->path, &d, il, &ly->gate_exps, &ly->up_exps, &ly->down_exps));
    } else {
      TRY(bind_stack(L, &ly->gate_exps, NAME("ffn_gate_exps.weight"), true, E, F, X));
      slice_rows(&ly->gate_exps, sh->fe0, sh->fe1);
      TRY(bind_stack(L, &ly->up_exps, NAME("ffn_up_exps.weight"), true, E, F, X));
      slice_rows(&ly->up_exps, sh->fe0, sh->fe1);
      TRY(bind_stack(L, &ly->down_exps, NAME("ffn_down_exps.weight"), true, F, E, X));
      TRY(slice_cols(L, &ly->down_exps, n, sh->fe0, sh->fe1));
    }
    if (ops_vec_type(&ly->gate_exps) != ops_vec_type(&ly->up_exps))
      return mole_errorf(MOLE_ERR_UNSUPPORTED,
                         "%s: blk.%lld: ffn_gate_exps (%s) and ffn_up_exps (%s) take their input as %s and %s: mole "
                         "needs one type for both",
                         L->path, (long long)il, quant_type_name(ly->gate_exps.type), quant_type_name(ly->up_exps.type),
                         quant_type_name(ops_vec_type(&ly->gate_exps)), quant_type_name(ops_vec_type(&ly->up_exps)));
    if (ly->plan.shexp) {
      int64_t S = hp->n_ff_shexp;
      if (S <= 0)
        return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing '%s.expert_shared_feed_forward_length'", L->path, L->arch);
      TRY(bind_vec(L, &ly->gate_inp_shexp, NAME("ffn_gate_inp_shexp.weight"), true, E));
      TRY(bind_mat(L, &ly->gate_shexp, NAME("ffn_gate_shexp.weight"), true, E, S));
      slice_rows(&ly->gate_shexp, sh->fs0, sh->fs1);
      TRY(bind_mat(L, &ly->up_shexp, NAME("ffn_up_shexp.weight"), true, E, S));
      slice_rows(&ly->up_shexp, sh->fs0, sh->fs1);
      TRY(bind_mat(L, &ly->down_shexp, NAME("ffn_down_shexp.weight"), true, S, E));
      TRY(slice_cols(L, &ly->down_shexp, n, sh->fs0, sh->fs1));
    }
  }
#undef NAME
  return MOLE_OK;
}

// The shard's 0 ends become the whole ranges; the ranges are checked and the
// local dimensions follow.
static mole_status resolve_shard(loader *L) {
  mole_model *m = L->m;
  const model_hparams *hp = &m->hp;
  model_shard *s = &m->shard;
  struct {
    const char *what;
    int64_t *a, *b, n;
  } r[] = {{"KV heads", &s->kvh0, &s->kvh1, hp->n_head_kv}, {"FFN columns", &s->ff0, &s->ff1, hp->n_ff},
           {"expert FFN columns", &s->fe0, &s->fe1, hp->n_ff_exp},
           {"shared expert FFN columns", &s->fs0, &s->fs1, hp->n_ff_shexp},
           {"vocabulary rows", &s->voc0, &s->voc1, hp->n_vocab},
           {"routed experts", &s->ex0, &s->ex1, hp->n_expert}};
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    if (!s->given && *r[i].a == 0 && *r[i].b == 0) *r[i].b = r[i].n;
    if (*r[i].a < 0 || *r[i].a > *r[i].b || *r[i].b > r[i].n)
      return mole_errorf(MOLE_ERR_ARG, "%s: shard: %s [%lld, %lld) outside [0, %lld)", L->path, r[i].what,
                         (long long)*r[i].a, (long long)*r[i].b, (long long)r[i].n);
  }
  const int64_t group = hp->n_head / hp->n_head_kv;
  m->loc = (model_local){(s->kvh1 - s->kvh0) * group, s->kvh1 - s->kvh0, s->ff1 - s->ff0, s->fe1 - s->fe0,
                         s->fs1 - s->fs0, s->voc1 - s->voc0};
  return MOLE_OK;
}

static mole_status bind_all(loader *L) {
  mole_model *m = L->m;
  model_hparams *hp = &m->hp;
  const gguf_tensor *te;
  TRY(find(L, "token_embd.weight", true, &te));
  if (te->n_dims != 2 || te->ne[0] != hp->n_embd)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor 'token_embd.weight' has shape [%lld, %lld], expected [%lld, n_vocab]",
                       L->path, (long long)te->ne[0], (long long)te->ne[1], (long long)hp->n_embd);
  hp->n_vocab = te->ne[1];
  TRY(bind_mat(L, &m->tok_embd, "token_embd.weight", true, hp->n_embd, hp->n_vocab));
  TRY(bind_vec(L, &m->output_norm, "output_norm.weight", true, hp->n_embd));
  TRY(bind_mat(L, &m->output, "output.weight", false, hp->n_embd, hp->n_vocab));
  if (!m->output.data) m->output = m->tok_embd;  // tied embeddings
  TRY(resolve_shard(L));
  slice_rows(&m->output, m->shard.voc0, m->shard.voc1);
  TRY(bind_vec(L, &m->rope_freqs, "rope_freqs.weight", false, hp->n_rot / 2));
  m->layers = mole_calloc((size_t)hp->n_layer, sizeof *m->layers);
  if (!m->layers) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", L->path);
  for (int64_t il = 0; il < hp->n_layer; il++) TRY(bind_layer(L, il));
  return MOLE_OK;
}

// The expert provider of m (experts/experts.h), from what the model knows:
// its dimensions and share, the expert stacks and routers as bound, and the
// memory the rest of the process needs (the auto budget leaves it free): the
// KV caches and scratch of the sessions the caller said it will run
// (--ctx, --batch, --kv-type; session_count caches) and a margin for code,
// stacks and the allocator.
static mole_status open_experts(mole_model *m) {
  const model_hparams *hp = &m->hp;
  const mole_offload_params *o = &m->offload;
  int64_t ctx = o->session_ctx, batch = o->session_batch;
  model_session_shape(m, &ctx, &batch);
  const int64_t kv_elt = o->session_kv_type == MOLE_KV_F32 ? 4 : 2;
  const int64_t kv = hp->n_layer * ctx * m->loc.n_head_kv * (hp->head_dim + hp->head_dim_v) * kv_elt *
                     MOLE_MAX(o->session_count, 1);
  // [n_layer][3] expert stacks (gate, up, down), [n_layer] routers
  quant_matrix *mats = mole_malloc((size_t)(4 * hp->n_layer) * sizeof *mats);
  if (!mats) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", gguf_path(m->gguf));
  for (int64_t l = 0; l < hp->n_layer; l++) {
    const model_layer *ly = &m->layers[l];
    mats[3 * l] = ly->gate_exps;
    mats[3 * l + 1] = ly->up_exps;
    mats[3 * l + 2] = ly->down_exps;
    mats[3 * hp->n_layer + l] = ly->gate_inp;
  }
  const experts_config cfg = {
      .gguf = m->gguf,
      .n_layer = hp->n_layer,
      .n_expert = hp->n_expert,
      .n_expert_used = hp->n_expert_used,
      .n_embd = hp->n_embd,
      .n_ff_exp = hp->n_ff_exp,
      .ff0 = m->shard.fe0,
      .n_ff_local = m->loc.n_ff_exp,
      .ex0 = m->shard.ex0,
      .ex1 = m->shard.ex1,
      .stacks = mats,
      .routers = mats + 3 * hp->n_layer,
      .offload = *o,
      .headroom = kv + model_scratch_bytes(m, batch, ctx) + ((int64_t)32 << 20),
      // token embeddings are read a row per token (unless the output projection shares them)
      .cold_bytes = m->tok_embd.data != m->output.data ? (int64_t)(m->tok_embd.row_bytes * (size_t)m->tok_embd.ne1) : 0,
      .pool = m->pool,
  };
  mole_status st = experts_open(&cfg, &m->experts);
  mole_free(mats);
  return st;
}

mole_status model_load(const char *path, const mole_model_params *p, const model_shard *shard, mole_model **out) {
  *out = NULL;
  quant_init();
  if (mole_same_file(p->offload.trace_routing, path))
    return mole_errorf(MOLE_ERR_ARG, "--trace-routing: %s is the model file %s; the trace would overwrite it",
                       p->offload.trace_routing, path);
  mole_model *m = mole_calloc(1, sizeof *m);
  if (!m) return mole_errorf(MOLE_ERR_NOMEM, "out of memory");
  if (shard) m->shard = *shard;
  mole_status st = gguf_open(path, &m->gguf);
  if (st) goto fail;
  experts_store_advise_load(m->gguf);  // no read-around into experts while binding (experts/store.h)
  loader L = {.m = m, .f = m->gguf, .path = path};
  st = gguf_get_str(m->gguf, "general.architecture", &L.arch);
  if (st) {
    mole_error_prefix(st, "%s: ", path);
    goto fail;
  }
  const arch_desc *ad = L.ad = arch_find(L.arch);
  if (!ad) {
    char names[256];
    arch_list(names, sizeof names);
    st = mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: general.architecture '%s' is not supported (supported: %s)", path,
                     L.arch, names);
    goto fail;
  }
  snprintf(m->arch_name, sizeof m->arch_name, "%s", ad->name);
  if ((st = load_hparams(&L, ad))) goto fail;
  // room for every 1-D tensor as f32
  int64_t nvec = 0;
  for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
    const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
    if (t->n_dims == 1) nvec += t->ne[0];
  }
  m->f32_store = mole_malloc((size_t)(nvec > 0 ? nvec : 1) * sizeof(float));
  if (!m->f32_store) {
    st = mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", path);
    goto fail;
  }
  L.f32_next = m->f32_store;
  L.f32_end = m->f32_store + nvec;
  if ((st = bind_all(&L))) goto fail;
  m->n_threads = p->n_threads;
  m->offload = p->offload;
  if ((st = mole_pool_init(p->n_threads, &m->pool))) goto fail;
  if ((st = ops_mm_reserve(m))) goto fail;
  if (m->hp.n_expert > 0 && (st = open_experts(m))) goto fail;
  if (!p->use_mmap && (st = model_image_build(m))) goto fail;
  *out = m;
  return MOLE_OK;
fail:
  model_free(m);
  return st;
}

void model_free(mole_model *m) {
  if (!m) return;
  if (m->comm.close) m->comm.close(m->comm.ctx);
  experts_close(m->experts);
  model_image_free(m);
  mole_pool_free(m->pool);
  mole_free(m->layers);
  mole_free(m->f32_store);
  gguf_close(m->gguf);
  mole_free(m);
}
