// Architecture table, hparams from GGUF metadata, and tensor binding with
// shape/type validation. Every problem is reported with the file and the
// key or tensor name.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "experts/experts.h"
#include "experts/store.h"
#include "model/model.h"
#include "model/ops.h"

typedef struct arch_desc {
  const char *name;
  model_arch arch;
  bool rope_neox, norm_topk, qk_norm_head, qk_norm_full, qkv_bias, shexp, needs_experts;
} arch_desc;

// Router semantics follow llama.cpp's build_moe_ffn calls per architecture:
// llama (Mixtral) and qwen3moe renormalise the chosen weights, qwen2moe and
// olmoe use the softmax probabilities as they are.
static const arch_desc k_archs[] = {
    {"llama", ARCH_LLAMA, false, true, false, false, false, false, false},
    {"qwen2moe", ARCH_QWEN2MOE, true, false, false, false, true, true, true},
    {"qwen3moe", ARCH_QWEN3MOE, true, true, true, false, false, false, true},
    {"olmoe", ARCH_OLMOE, true, false, false, true, false, false, true},
};

const char *model_arch_name(model_arch a) {
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (k_archs[i].arch == a) return k_archs[i].name;
  return "?";
}

typedef struct loader {
  mole_model *m;
  const gguf_file *f;
  const char *path;
  const char *arch;
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
  if (!(base > 0)) return mole_errorf(MOLE_ERR_FORMAT, "%s: %s.rope.freq_base = %g must be > 0", L->path, L->arch, base);
  hp->rope_base = (float)base;
  return MOLE_OK;
}

static mole_status load_hparams(loader *L, const arch_desc *ad) {
  model_hparams *hp = &L->m->hp;
  hp->arch = ad->arch;
  hp->rope_neox = ad->rope_neox;
  hp->norm_topk = ad->norm_topk;
  hp->qk_norm_head = ad->qk_norm_head;
  hp->qk_norm_full = ad->qk_norm_full;
  const int64_t BIG = (int64_t)1 << 24;
  TRY(get_int(L, "context_length", false, 4096, &hp->n_ctx_train));
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
  TRY(check_range(L, "rope.dimension_count", hp->n_rot, 0, hp->head_dim));
  if (hp->n_rot % 2) return mole_errorf(MOLE_ERR_FORMAT, "%s: rope.dimension_count %lld is odd", L->path, (long long)hp->n_rot);
  TRY(get_int(L, "feed_forward_length", false, 0, &hp->n_ff));
  TRY(check_range(L, "feed_forward_length", hp->n_ff, 0, BIG));
  TRY(get_int(L, "expert_count", false, 0, &hp->n_expert));
  TRY(check_range(L, "expert_count", hp->n_expert, 0, 4096));
  TRY(get_int(L, "expert_used_count", hp->n_expert > 0, 0, &hp->n_expert_used));
  if (hp->n_expert > 0) TRY(check_range(L, "expert_used_count", hp->n_expert_used, 1, hp->n_expert));
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

static mole_status check_shape(loader *L, const gguf_tensor *t, int64_t ne0, int64_t ne1, int64_t ne2) {
  int64_t want[3] = {ne0, ne1, ne2};
  uint32_t nd = ne2 > 1 ? 3 : (ne1 > 1 ? 2 : 1);
  bool ok = t->n_dims <= 3 && t->n_dims >= 1;
  for (int i = 0; i < 3 && ok; i++) ok = t->ne[i] == want[i];
  (void)nd;
  if (!ok)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                       L->path, t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)ne0, (long long)ne1, (long long)ne2);
  return MOLE_OK;
}

// A weight matrix (or stack of expert matrices) used in matmuls.
static mole_status bind_mat(loader *L, model_tensor *mt, const char *name, bool required, int64_t ne0, int64_t ne1,
                            int64_t ne2) {
  const gguf_tensor *t;
  memset(mt, 0, sizeof *mt);
  TRY(find(L, name, required, &t));
  if (!t) return MOLE_OK;
  TRY(check_shape(L, t, ne0, ne1, ne2));
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
  TRY(check_shape(L, t, n, 1, 1));
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
  const arch_desc *ad = NULL;
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (k_archs[i].arch == hp->arch) ad = &k_archs[i];
  int64_t E = hp->n_embd, q_dim = hp->n_head * hp->head_dim, k_dim = hp->n_head_kv * hp->head_dim,
          v_dim = hp->n_head_kv * hp->head_dim_v, o_dim = hp->n_head * hp->head_dim_v;
  char n[128];
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld." s, (long long)il), n)
  const model_shard *sh = &m->shard;
  const int64_t group = hp->n_head / hp->n_head_kv, hd = hp->head_dim, hdv = hp->head_dim_v;
  TRY(bind_vec(L, &ly->attn_norm, NAME("attn_norm.weight"), true, E));
  TRY(bind_mat(L, &ly->wq, NAME("attn_q.weight"), true, E, q_dim, 1));
  slice_rows(&ly->wq, sh->kvh0 * group * hd, sh->kvh1 * group * hd);
  TRY(bind_mat(L, &ly->wk, NAME("attn_k.weight"), true, E, k_dim, 1));
  slice_rows(&ly->wk, sh->kvh0 * hd, sh->kvh1 * hd);
  TRY(bind_mat(L, &ly->wv, NAME("attn_v.weight"), true, E, v_dim, 1));
  slice_rows(&ly->wv, sh->kvh0 * hdv, sh->kvh1 * hdv);
  TRY(bind_mat(L, &ly->wo, NAME("attn_output.weight"), true, o_dim, E, 1));
  TRY(slice_cols(L, &ly->wo, n, sh->kvh0 * group * hdv, sh->kvh1 * group * hdv));
  TRY(bind_vec(L, &ly->bq, NAME("attn_q.bias"), ad->qkv_bias, q_dim));
  TRY(bind_vec(L, &ly->bk, NAME("attn_k.bias"), ad->qkv_bias, k_dim));
  TRY(bind_vec(L, &ly->bv, NAME("attn_v.bias"), ad->qkv_bias, v_dim));
  if (ly->bq) ly->bq += sh->kvh0 * group * hd;
  if (ly->bk) ly->bk += sh->kvh0 * hd;
  if (ly->bv) ly->bv += sh->kvh0 * hdv;
  TRY(bind_vec(L, &ly->bo, NAME("attn_output.bias"), false, E));
  if (hp->qk_norm_head) {
    TRY(bind_vec(L, &ly->q_norm, NAME("attn_q_norm.weight"), true, hp->head_dim));
    TRY(bind_vec(L, &ly->k_norm, NAME("attn_k_norm.weight"), true, hp->head_dim));
  } else if (hp->qk_norm_full) {  // over the whole projection: this shard's part of the weights
    TRY(bind_vec(L, &ly->q_norm, NAME("attn_q_norm.weight"), true, q_dim));
    TRY(bind_vec(L, &ly->k_norm, NAME("attn_k_norm.weight"), true, k_dim));
    ly->q_norm += sh->kvh0 * group * hd;
    ly->k_norm += sh->kvh0 * hd;
  }
  TRY(bind_vec(L, &ly->ffn_norm, NAME("ffn_norm.weight"), true, E));
  if (hp->n_expert == 0) {
    if (hp->n_ff <= 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing '%s.feed_forward_length'", L->path, L->arch);
    TRY(bind_mat(L, &ly->ffn_gate, NAME("ffn_gate.weight"), true, E, hp->n_ff, 1));
    slice_rows(&ly->ffn_gate, sh->ff0, sh->ff1);
    TRY(bind_mat(L, &ly->ffn_up, NAME("ffn_up.weight"), true, E, hp->n_ff, 1));
    slice_rows(&ly->ffn_up, sh->ff0, sh->ff1);
    TRY(bind_mat(L, &ly->ffn_down, NAME("ffn_down.weight"), true, hp->n_ff, E, 1));
    TRY(slice_cols(L, &ly->ffn_down, n, sh->ff0, sh->ff1));
  } else {
    int64_t X = hp->n_expert, F = hp->n_ff_exp;
    TRY(bind_mat(L, &ly->gate_inp, NAME("ffn_gate_inp.weight"), true, E, X, 1));
    if (experts_store_is_packed(L->f)) {
      // packed expert store (mole pack): no ffn_*_exps stacks; shapes and types
      // come from its mole.pack.* metadata, the weights only via the provider
      TRY(experts_store_describe(L->f, L->path, hp, il, &ly->gate_exps, &ly->up_exps, &ly->down_exps));
    } else {
      TRY(bind_mat(L, &ly->gate_exps, NAME("ffn_gate_exps.weight"), true, E, F, X));
      slice_rows(&ly->gate_exps, sh->fe0, sh->fe1);
      TRY(bind_mat(L, &ly->up_exps, NAME("ffn_up_exps.weight"), true, E, F, X));
      slice_rows(&ly->up_exps, sh->fe0, sh->fe1);
      TRY(bind_mat(L, &ly->down_exps, NAME("ffn_down_exps.weight"), true, F, E, X));
      TRY(slice_cols(L, &ly->down_exps, n, sh->fe0, sh->fe1));
    }
    if (ad->shexp) {
      int64_t S = hp->n_ff_shexp;
      if (S <= 0)
        return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing '%s.expert_shared_feed_forward_length'", L->path, L->arch);
      TRY(bind_vec(L, &ly->gate_inp_shexp, NAME("ffn_gate_inp_shexp.weight"), true, E));
      TRY(bind_mat(L, &ly->gate_shexp, NAME("ffn_gate_shexp.weight"), true, E, S, 1));
      slice_rows(&ly->gate_shexp, sh->fs0, sh->fs1);
      TRY(bind_mat(L, &ly->up_shexp, NAME("ffn_up_shexp.weight"), true, E, S, 1));
      slice_rows(&ly->up_shexp, sh->fs0, sh->fs1);
      TRY(bind_mat(L, &ly->down_shexp, NAME("ffn_down_shexp.weight"), true, S, E, 1));
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
  TRY(bind_mat(L, &m->tok_embd, "token_embd.weight", true, hp->n_embd, hp->n_vocab, 1));
  TRY(bind_vec(L, &m->output_norm, "output_norm.weight", true, hp->n_embd));
  TRY(bind_mat(L, &m->output, "output.weight", false, hp->n_embd, hp->n_vocab, 1));
  if (!m->output.data) m->output = m->tok_embd;  // tied embeddings
  TRY(resolve_shard(L));
  slice_rows(&m->output, m->shard.voc0, m->shard.voc1);
  TRY(bind_vec(L, &m->rope_freqs, "rope_freqs.weight", false, hp->n_rot / 2));
  m->layers = mole_calloc((size_t)hp->n_layer, sizeof *m->layers);
  if (!m->layers) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", L->path);
  for (int64_t il = 0; il < hp->n_layer; il++) TRY(bind_layer(L, il));
  return MOLE_OK;
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
  const arch_desc *ad = NULL;
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (strcmp(k_archs[i].name, L.arch) == 0) ad = &k_archs[i];
  if (!ad) {
    st = mole_errorf(MOLE_ERR_UNSUPPORTED,
                     "%s: general.architecture '%s' is not supported (supported: llama, qwen2moe, qwen3moe, olmoe)",
                     path, L.arch);
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
  if (m->hp.n_expert > 0 && (st = experts_open(m, &m->experts))) goto fail;
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
