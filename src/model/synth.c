#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include <pthread.h>
#include "gguf/gguf.h"

synth_params synth_default_params(void) {
  return (synth_params){.arch = "mixtral", .n_embd = 1024, .n_layer = 8, .n_expert = 8, .n_expert_used = 2,
                        .n_ff = 3584, .n_vocab = 32000, .n_ctx = 4096, .type = QT_Q4_0, .seed = 42};
}

// One tensor to write: name, shape and how to fill it. Token embeddings are
// drawn larger (rms ~0.4) than the other matrices (rms ~0.7/sqrt(n)): at the
// small scale, the residual stream is dominated by what near-uniform random
// attention adds, the running mean of the sequence's values, which all its
// tokens share, so most tokens went to the same 2 of 8 experts (95% in some
// layers). With the token dominating, routing depends on the token, experts
// are used about evenly and consecutive tokens share experts a little more
// often than chance in later layers, which is closer to trained MoE models.
typedef enum { FILL_MATRIX, FILL_NORM, FILL_BIAS, FILL_ROUTER, FILL_EMBD } fill_kind;
typedef struct {
  char name[64];
  uint32_t n_dims;
  int64_t ne[3];
  quant_type type;
  fill_kind fill;
} synth_tensor;

typedef struct {
  synth_tensor *t;
  int64_t n, cap;
} tensor_list;

static mole_status add(tensor_list *l, const char *name, quant_type type, fill_kind fill, int64_t ne0, int64_t ne1,
                       int64_t ne2) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? l->cap * 2 : 64;
    synth_tensor *t = mole_realloc(l->t, (size_t)cap * sizeof *t);
    if (!t) return mole_errorf(MOLE_ERR_NOMEM, "synth: out of memory");
    l->t = t;
    l->cap = cap;
  }
  synth_tensor *t = &l->t[l->n++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ne[0] = ne0;
  t->ne[1] = ne1;
  t->ne[2] = ne2;
  t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
  t->type = type;
  t->fill = fill;
  return MOLE_OK;
}

// ---- deterministic random numbers, independent of the thread count -------
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Random values come from a table of 64Ki triangular samples in [-1, 1],
// read from a per-row random offset with a per-row odd stride: cheap enough
// to write GB/s, and every row differs.
enum { POOL_BITS = 16, POOL_N = 1 << POOL_BITS };
static float g_pool[POOL_N];
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void pool_init_values(void) {
  uint64_t s = 0x5EED;
  for (int i = 0; i < POOL_N; i++) {
    uint64_t r = splitmix(&s);
    float u1 = (float)(r & 0xFFFFFF) / 16777216.0f, u2 = (float)((r >> 24) & 0xFFFFFF) / 16777216.0f;
    g_pool[i] = u1 + u2 - 1.0f;
  }
}

static void fill_row(float *x, int64_t n, uint64_t seed, float a) {
  uint64_t s = seed;
  const uint64_t r = splitmix(&s);
  uint32_t off = (uint32_t)r & (POOL_N - 1), stride = ((uint32_t)(r >> 32) & (POOL_N - 1)) | 1;
  for (int64_t i = 0; i < n; i++) {
    x[i] = g_pool[off] * a;
    off = (off + stride) & (POOL_N - 1);
  }
}

typedef struct {
  const synth_tensor *t;
  uint64_t seed;
  int64_t row0, n_rows;  // rows of this chunk (all dims above 0 flattened)
  void *out;             // n_rows quantized rows
  size_t row_bytes;
  float *tmp;            // [nth][ne0]
} fill_job;

static void fill_worker(void *ctx, int ith, int nth) {
  const fill_job *j = ctx;
  const synth_tensor *t = j->t;
  const quant_traits *tr = quant_traits_of(t->type);
  float *x = j->tmp + (size_t)ith * (size_t)t->ne[0];
  int64_t r0, r1;
  mole_split(j->n_rows, ith, nth, &r0, &r1);
  const float a = t->fill == FILL_NORM ? 0.1f : t->fill == FILL_BIAS ? 0.05f
                : t->fill == FILL_ROUTER ? 2.0f / sqrtf((float)t->ne[0])
                : t->fill == FILL_EMBD ? 1.0f
                                         : 1.7f / sqrtf((float)t->ne[0]);
  for (int64_t r = r0; r < r1; r++) {
    fill_row(x, t->ne[0], j->seed ^ ((uint64_t)(j->row0 + r) * 0xD1B54A32D192ED03ull), a);
    if (t->fill == FILL_NORM)
      for (int64_t i = 0; i < t->ne[0]; i++) x[i] += 1.0f;
    tr->from_float(x, (char *)j->out + (size_t)r * j->row_bytes, t->ne[0]);
  }
}

static mole_status write_tensor(gguf_writer *w, mole_pool *pool, const synth_tensor *t, uint64_t seed, void *buf,
                                size_t buf_bytes, float *tmp) {
  const size_t rb = quant_row_size(t->type, t->ne[0]);
  const int64_t rows = t->ne[1] * t->ne[2];
  const int64_t chunk = MOLE_MAX((int64_t)(buf_bytes / rb), 1);
  for (int64_t r = 0; r < rows; r += chunk) {
    fill_job j = {t, seed, r, MOLE_MIN(chunk, rows - r), buf, rb, tmp};
    mole_pool_run(pool, fill_worker, &j);
    mole_status st = gguf_writer_write(w, buf, (size_t)j.n_rows * rb);
    if (st) return st;
  }
  return MOLE_OK;
}

// A made-up SentencePiece vocabulary so llama.cpp (and mole) can load the
// model without --vocab-from: <unk>, <s>, </s>, 256 byte tokens, then pieces.
static mole_status synth_vocab(gguf_writer *w, int64_t n) {
  if (n < 259 + 1) return mole_errorf(MOLE_ERR_ARG, "synth: --vocab %lld is too small (at least 260)", (long long)n);
  char **toks = mole_calloc((size_t)n, sizeof *toks);
  float *scores = mole_calloc((size_t)n, sizeof *scores);
  int32_t *types = mole_calloc((size_t)n, sizeof *types);
  char *pool = mole_malloc((size_t)n * 16);
  mole_status st = MOLE_OK;
  if (!toks || !scores || !types || !pool) {
    st = mole_errorf(MOLE_ERR_NOMEM, "synth: out of memory");
    goto done;
  }
  static const char *alpha = "etaoinshrdlucmfwypvbgkjqxz";
  for (int64_t i = 0; i < n; i++) {
    char *s = pool + i * 16;
    toks[i] = s;
    if (i == 0) snprintf(s, 16, "<unk>"), types[i] = 2;
    else if (i == 1) snprintf(s, 16, "<s>"), types[i] = 3;
    else if (i == 2) snprintf(s, 16, "</s>"), types[i] = 3;
    else if (i < 259) snprintf(s, 16, "<0x%02X>", (unsigned)(i - 3)), types[i] = 6;
    else {
      // "▁" + letters of the index in base 26: unique, plausible pieces
      int64_t k = i - 259;
      int p = snprintf(s, 16, "\xe2\x96\x81");
      do {
        s[p++] = alpha[k % 26];
        k /= 26;
      } while (k && p < 14);
      s[p] = 0;
      types[i] = 1;
      scores[i] = -(float)(i - 259);
    }
  }
  if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) ||
      (st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "default")) ||
      (st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n)) ||
      (st = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, (uint64_t)n)) ||
      (st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n)) ||
      (st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
      (st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
      (st = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)))
    goto done;
done:
  mole_free(toks);
  mole_free(scores);
  mole_free(types);
  mole_free(pool);
  return st;
}

static int ftype_of(quant_type t) {
  switch (t) {
    case QT_F32: return 0;
    case QT_F16: return 1;
    case QT_Q4_0: return 2;
    case QT_Q4_1: return 3;
    case QT_Q8_0: return 7;
    case QT_Q5_0: return 8;
    case QT_Q5_1: return 9;
    case QT_Q4_K: return 14;
    case QT_Q5_K: return 16;
    case QT_Q6_K: return 18;
    case QT_BF16: return 32;
    default: return 0;
  }
}

#define TRY(x)                    \
  do {                            \
    if ((st = (x)) != MOLE_OK) goto done; \
  } while (0)

mole_status synth_write(const synth_params *p, const char *path, uint64_t *bytes) {
  mole_status st = MOLE_OK;
  quant_init();
  pthread_once(&g_pool_once, pool_init_values);
  const char *arch = p->arch;
  bool dense = !strcmp(arch, "llama"), mixtral = !strcmp(arch, "mixtral"), qwen3 = !strcmp(arch, "qwen3moe"),
       olmoe = !strcmp(arch, "olmoe"), qwen2 = !strcmp(arch, "qwen2moe");
  if (!dense && !mixtral && !qwen3 && !olmoe && !qwen2)
    return mole_errorf(MOLE_ERR_ARG, "synth: --arch '%s' is not one of mixtral, llama, qwen3moe, olmoe, qwen2moe", arch);
  const char *garch = (dense || mixtral) ? "llama" : arch;
  const quant_traits *tr = quant_traits_of(p->type);
  if (!tr || !tr->from_float || p->type == QT_Q8_K || p->type == QT_Q8_1)
    return mole_errorf(MOLE_ERR_ARG, "synth: --type %s cannot be written", quant_type_name(p->type));
  const int64_t E = p->n_embd, L = p->n_layer, F = p->n_ff;
  const int64_t H = p->n_head ? p->n_head : MOLE_MAX(E / 128, 1);
  // OLMoE has no GQA (llama.cpp checks its k norm against the whole width)
  const int64_t HKV = p->n_head_kv ? p->n_head_kv : olmoe ? H : MOLE_MAX(H / 4, 1);
  const int64_t X = dense ? 0 : p->n_expert, S = p->n_ff_shexp ? p->n_ff_shexp : F;
  if (E <= 0 || L <= 0 || F <= 0 || H <= 0 || E % H || H % HKV || (E / H) % 2)
    return mole_errorf(MOLE_ERR_ARG, "synth: bad shape: embd %lld, heads %lld, kv heads %lld, ff %lld (embd must "
                       "divide into heads of even size, heads into kv heads)", (long long)E, (long long)H,
                       (long long)HKV, (long long)F);
  if (!dense && (X < 1 || p->n_expert_used < 1 || p->n_expert_used > X))
    return mole_errorf(MOLE_ERR_ARG, "synth: --experts %lld / --used %lld: need 1 <= used <= experts", (long long)X,
                       (long long)p->n_expert_used);
  const int64_t blk = quant_blck_size(p->type);
  if (E % blk || F % blk || (qwen2 && S % blk))
    return mole_errorf(MOLE_ERR_ARG, "synth: --embd %lld and --ff %lld must be multiples of %lld for type %s",
                       (long long)E, (long long)F, (long long)blk, quant_type_name(p->type));
  const int64_t HD = E / H;

  gguf_writer *w = NULL;
  mole_pool *pool = NULL;
  gguf_file *vf = NULL;
  tensor_list tl = {0};
  void *buf = NULL;
  float *tmp = NULL;
  TRY(gguf_writer_new(&w));
  char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", garch, s), key)
  TRY(gguf_writer_set_str(w, "general.architecture", garch));
  char name[96];
  snprintf(name, sizeof name, "mole-synth-%s-%s", arch, quant_type_name(p->type));
  TRY(gguf_writer_set_str(w, "general.name", name));
  TRY(gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx));
  TRY(gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)E));
  TRY(gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)L));
  TRY(gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)F));
  TRY(gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)H));
  TRY(gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)HKV));
  TRY(gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f));
  TRY(gguf_writer_set_f32(w, KEY("rope.freq_base"), qwen3 ? 1000000.0f : 10000.0f));
  TRY(gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)HD));
  if (!dense) {
    TRY(gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)X));
    TRY(gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used));
  }
  if (qwen3 || qwen2) TRY(gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)F));
  if (qwen2) TRY(gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)S));
  if (qwen3) {
    TRY(gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)HD));
    TRY(gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)HD));
  }
  TRY(gguf_writer_set_u32(w, "general.file_type", (uint32_t)ftype_of(p->type)));
  TRY(gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef KEY
  int64_t V = p->n_vocab;
  if (p->vocab_from) {
    TRY(gguf_open(p->vocab_from, &vf));
    int64_t ti = gguf_find_kv(vf, "tokenizer.ggml.tokens");
    if (ti < 0) {
      st = mole_errorf(MOLE_ERR_NOT_FOUND, "synth: --vocab-from %s has no tokenizer.ggml.tokens", p->vocab_from);
      goto done;
    }
    V = (int64_t)gguf_kv_arr_n(vf, ti);
    for (int64_t i = 0; i < gguf_n_kv(vf); i++)
      if (!strncmp(gguf_kv_key(vf, i), "tokenizer.", 10)) TRY(gguf_writer_copy_kv(w, vf, i));
  } else {
    TRY(synth_vocab(w, V));
  }
  // tensors, in the order llama.cpp's converter writes them
  const quant_type T = p->type;
  TRY(add(&tl, "token_embd.weight", T, FILL_EMBD, E, V, 1));
  for (int64_t il = 0; il < L; il++) {
    char n[64];
#define N(s) (snprintf(n, sizeof n, "blk.%lld." s, (long long)il), n)
    TRY(add(&tl, N("attn_norm.weight"), QT_F32, FILL_NORM, E, 1, 1));
    TRY(add(&tl, N("attn_q.weight"), T, FILL_MATRIX, E, H * HD, 1));
    TRY(add(&tl, N("attn_k.weight"), T, FILL_MATRIX, E, HKV * HD, 1));
    TRY(add(&tl, N("attn_v.weight"), T, FILL_MATRIX, E, HKV * HD, 1));
    TRY(add(&tl, N("attn_output.weight"), T, FILL_MATRIX, H * HD, E, 1));
    if (qwen2) {
      TRY(add(&tl, N("attn_q.bias"), QT_F32, FILL_BIAS, H * HD, 1, 1));
      TRY(add(&tl, N("attn_k.bias"), QT_F32, FILL_BIAS, HKV * HD, 1, 1));
      TRY(add(&tl, N("attn_v.bias"), QT_F32, FILL_BIAS, HKV * HD, 1, 1));
    }
    if (qwen3) {
      TRY(add(&tl, N("attn_q_norm.weight"), QT_F32, FILL_NORM, HD, 1, 1));
      TRY(add(&tl, N("attn_k_norm.weight"), QT_F32, FILL_NORM, HD, 1, 1));
    }
    if (olmoe) {
      TRY(add(&tl, N("attn_q_norm.weight"), QT_F32, FILL_NORM, H * HD, 1, 1));
      TRY(add(&tl, N("attn_k_norm.weight"), QT_F32, FILL_NORM, HKV * HD, 1, 1));
    }
    TRY(add(&tl, N("ffn_norm.weight"), QT_F32, FILL_NORM, E, 1, 1));
    if (dense) {
      TRY(add(&tl, N("ffn_gate.weight"), T, FILL_MATRIX, E, F, 1));
      TRY(add(&tl, N("ffn_up.weight"), T, FILL_MATRIX, E, F, 1));
      TRY(add(&tl, N("ffn_down.weight"), T, FILL_MATRIX, F, E, 1));
    } else {
      TRY(add(&tl, N("ffn_gate_inp.weight"), QT_F32, FILL_ROUTER, E, X, 1));
      TRY(add(&tl, N("ffn_gate_exps.weight"), T, FILL_MATRIX, E, F, X));
      TRY(add(&tl, N("ffn_up_exps.weight"), T, FILL_MATRIX, E, F, X));
      TRY(add(&tl, N("ffn_down_exps.weight"), T, FILL_MATRIX, F, E, X));
      if (qwen2) {
        TRY(add(&tl, N("ffn_gate_inp_shexp.weight"), QT_F32, FILL_ROUTER, E, 1, 1));
        TRY(add(&tl, N("ffn_gate_shexp.weight"), T, FILL_MATRIX, E, S, 1));
        TRY(add(&tl, N("ffn_up_shexp.weight"), T, FILL_MATRIX, E, S, 1));
        TRY(add(&tl, N("ffn_down_shexp.weight"), T, FILL_MATRIX, S, E, 1));
      }
    }
#undef N
  }
  TRY(add(&tl, "output_norm.weight", QT_F32, FILL_NORM, E, 1, 1));
  TRY(add(&tl, "output.weight", T, FILL_MATRIX, E, V, 1));
  for (int64_t i = 0; i < tl.n; i++)
    TRY(gguf_writer_add_tensor(w, tl.t[i].name, tl.t[i].type, tl.t[i].n_dims, tl.t[i].ne, NULL));
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nth = p->n_threads ? p->n_threads : (int)(ncpu > 0 ? ncpu : 1);
  TRY(mole_pool_init(nth, &pool));
  const size_t buf_bytes = (size_t)16 << 20;
  int64_t max_ne0 = MOLE_MAX(MOLE_MAX(E, F), MOLE_MAX(S, H * HD));
  buf = mole_aligned_alloc(64, buf_bytes + quant_row_size(QT_F32, max_ne0));
  tmp = mole_aligned_alloc(64, (size_t)nth * (size_t)max_ne0 * sizeof(float));
  if (!buf || !tmp) {
    st = mole_errorf(MOLE_ERR_NOMEM, "synth: out of memory");
    goto done;
  }
  TRY(gguf_writer_begin(w, path));
  for (int64_t i = 0; i < tl.n; i++) {
    uint64_t s = p->seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1;
    TRY(write_tensor(w, pool, &tl.t[i], splitmix(&s), buf, buf_bytes, tmp));
  }
  TRY(gguf_writer_finish(w));
  if (bytes) {
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      *bytes = (uint64_t)ftell(f);
      fclose(f);
    }
  }
done:
  gguf_writer_free(w);
  gguf_close(vf);
  mole_pool_free(pool);
  mole_free(tl.t);
  mole_aligned_free(buf);
  mole_aligned_free(tmp);
  return st;
}
