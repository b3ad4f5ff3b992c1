// Model loading: unknown architectures, missing tensors, wrong shapes and
// unsupported RoPE scaling are clear errors; so are crafted files that once
// passed the loader and aborted later (a norm declared 2-D, more experts per
// token than the predictor holds, a RoPE longer than its table, ...); synth
// models of every architecture load and run; decode equals prefill. The
// architecture descriptions give each layer its blocks; the routing function
// does what route.c says; the step API of disaggregated serving gives the
// forward pass's logits bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/ops.h"
#include "model/route.h"
#include "model/synth.h"
#include "mole.h"
#include "testutil.h"

typedef void (*edit_fn)(gguf_writer *w);
static void set_arch_gptj(gguf_writer *w) { assert_int_equal(gguf_writer_set_str(w, "general.architecture", "gptj"), MOLE_OK); }
static void set_yarn(gguf_writer *w) { assert_int_equal(gguf_writer_set_str(w, "llama.rope.scaling.type", "yarn"), MOLE_OK); }
static void set_kv4(gguf_writer *w) { assert_int_equal(gguf_writer_set_u32(w, "llama.attention.head_count_kv", 4), MOLE_OK); }
static void set_heads0(gguf_writer *w) { assert_int_equal(gguf_writer_set_u32(w, "llama.attention.head_count", 0), MOLE_OK); }

// A tensor declared with another shape (n_dims, ne; 0 n_dims: as it is)
// and type (its f32 data converted; QT_COUNT: as it is).
typedef struct {
  const char *name;
  uint32_t n_dims;
  int64_t ne[4];
  quant_type type;
} tensor_edit;

// Rewrites src into path, with kv `drop_key` removed, tensor `drop_tensor`
// removed, `edit` applied to the metadata and `te` to its tensor (all optional).
static void rewrite_with(const char *src, const char *path, const char *drop_key, edit_fn edit, const char *drop_tensor,
                         const tensor_edit *te) {
  gguf_file *f;
  assert_int_equal(gguf_open(src, &f), MOLE_OK);
  gguf_writer *w;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  for (int64_t i = 0; i < gguf_n_kv(f); i++) {
    if (drop_key && !strcmp(gguf_kv_key(f, i), drop_key)) continue;
    assert_int_equal(gguf_writer_copy_kv(w, f, i), MOLE_OK);
  }
  if (edit) edit(w);
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    if (drop_tensor && !strcmp(t->name, drop_tensor)) continue;
    const bool ed = te && !strcmp(t->name, te->name);
    const uint32_t type = ed && te->type != QT_COUNT ? (uint32_t)te->type : t->type;
    assert_int_equal(gguf_writer_add_tensor(w, t->name, type, ed && te->n_dims ? te->n_dims : t->n_dims,
                                            ed && te->n_dims ? te->ne : t->ne, NULL),
                     MOLE_OK);
  }
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    if (drop_tensor && !strcmp(t->name, drop_tensor)) continue;
    if (te && !strcmp(t->name, te->name) && te->type != QT_COUNT) {
      assert_int_equal(t->type, QT_F32);
      const int64_t n = (int64_t)(t->size / sizeof(float));
      const size_t bytes = quant_row_size(te->type, n);
      void *buf = malloc(bytes);
      quant_traits_of(te->type)->from_float(t->data, buf, n);
      assert_int_equal(gguf_writer_write(w, buf, bytes), MOLE_OK);
      free(buf);
      continue;
    }
    assert_int_equal(gguf_writer_write(w, t->data, t->size), MOLE_OK);
  }
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  gguf_close(f);
}

static void rewrite(const char *src, const char *path, const char *drop_key, edit_fn edit, const char *drop_tensor) {
  rewrite_with(src, path, drop_key, edit, drop_tensor, NULL);
}

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  char *b = buf[k++ & 3];
  snprintf(b, 512, "/tmp/mole-test-model-%d-%s", (int)getpid(), name);
  return b;
}

static void expect_load_error(const char *path, mole_status want, const char *needle) {
  mole_model *m = NULL;
  mole_status st = mole_model_load(path, NULL, &m);
  if (st != want || !strstr(mole_last_error(), needle))
    fail_msg("load %s: status %d (%s), message '%s'; wanted status %d with '%s'", path, st, mole_status_str(st),
             mole_last_error(), want, needle);
  assert_null(m);
}

static void test_bad_models(void **state) {
  (void)state;
  const char *mix = tu_path("tests/data/conformance/models/mixtral.gguf");
  const char *p = tmp_path("bad.gguf");
  rewrite(mix, p, NULL, set_arch_gptj, NULL);
  expect_load_error(p, MOLE_ERR_UNSUPPORTED, "'gptj' is not supported");
  rewrite(mix, p, NULL, NULL, "blk.1.ffn_up_exps.weight");
  expect_load_error(p, MOLE_ERR_NOT_FOUND, "missing tensor 'blk.1.ffn_up_exps.weight'");
  rewrite(mix, p, "llama.embedding_length", NULL, NULL);
  expect_load_error(p, MOLE_ERR_NOT_FOUND, "llama.embedding_length");
  rewrite(mix, p, NULL, set_yarn, NULL);
  expect_load_error(p, MOLE_ERR_UNSUPPORTED, "yarn");
  rewrite(mix, p, "general.architecture", NULL, NULL);
  expect_load_error(p, MOLE_ERR_NOT_FOUND, "general.architecture");
  // a shape that does not match the hparams: 4 KV heads where attn_k has 2
  rewrite(mix, p, NULL, set_kv4, NULL);
  expect_load_error(p, MOLE_ERR_FORMAT, "blk.0.attn_k.weight");
  rewrite(mix, p, NULL, set_heads0, NULL);
  expect_load_error(p, MOLE_ERR_FORMAT, "head_count");
  expect_load_error(tmp_path("does-not-exist.gguf"), MOLE_ERR_IO, "does-not-exist");
  unlink(p);
}

static void test_missing_norm_tensor(void **state) {
  (void)state;
  const char *p = tmp_path("q3.gguf");
  rewrite(tu_path("tests/data/conformance/models/qwen3moe.gguf"), p, NULL, NULL, "blk.0.attn_k_norm.weight");
  expect_load_error(p, MOLE_ERR_NOT_FOUND, "blk.0.attn_k_norm.weight");
  rewrite(tu_path("tests/data/conformance/models/qwen2moe.gguf"), p, NULL, NULL, "blk.1.ffn_gate_inp_shexp.weight");
  expect_load_error(p, MOLE_ERR_NOT_FOUND, "ffn_gate_inp_shexp");
  unlink(p);
}

static void set_ctx0(gguf_writer *w) { assert_int_equal(gguf_writer_set_u32(w, "llama.context_length", 0), MOLE_OK); }
static void set_rot4096(gguf_writer *w) {
  // heads of 4096 dims rotated whole: within the key length, beyond ops_rope's table
  assert_int_equal(gguf_writer_set_u32(w, "llama.attention.key_length", 4096), MOLE_OK);
  assert_int_equal(gguf_writer_set_u32(w, "llama.rope.dimension_count", 4096), MOLE_OK);
}
static void set_base_inf(gguf_writer *w) { assert_int_equal(gguf_writer_set_f32(w, "llama.rope.freq_base", INFINITY), MOLE_OK); }

// Every tensor's whole declared shape: a norm declared [64, 1] (2-D) once
// passed the shape check and overran the loader's store of vectors (an
// abort); a matrix with dims beyond its own; types whose inputs mole cannot
// convert to at once. Each a clear error naming the file and the tensor.
static void test_crafted_tensors(void **state) {
  (void)state;
  const char *mix = tu_path("tests/data/conformance/models/mixtral.gguf");
  const char *p = tmp_path("crafted.gguf");
  const tensor_edit edits[] = {
      {"blk.0.attn_norm.weight", 2, {64, 1, 1, 1}, QT_COUNT},
      {"output_norm.weight", 3, {64, 1, 1, 1}, QT_COUNT},
      {"blk.2.ffn_norm.weight", 4, {64, 1, 1, 1}, QT_COUNT},
      {"blk.1.attn_q.weight", 4, {64, 64, 1, 1}, QT_COUNT},
      {"blk.1.ffn_gate_inp.weight", 3, {64, 8, 1, 1}, QT_COUNT},
      {"blk.0.attn_k.weight", 2, {32, 64, 1, 1}, QT_COUNT},
      {"blk.0.ffn_down_exps.weight", 4, {96, 64, 4, 2}, QT_COUNT},
  };
  const char *want[] = {"'blk.0.attn_norm.weight' has shape [64, 1] (2-D), expected [64] (1-D)",
                        "'output_norm.weight' has shape [64, 1, 1] (3-D), expected [64] (1-D)",
                        "'blk.2.ffn_norm.weight' has shape [64, 1, 1, 1] (4-D), expected [64] (1-D)",
                        "'blk.1.attn_q.weight' has shape [64, 64, 1, 1] (4-D), expected [64, 64] (2-D)",
                        "'blk.1.ffn_gate_inp.weight' has shape [64, 8, 1] (3-D), expected [64, 8] (2-D)",
                        "'blk.0.attn_k.weight' has shape [32, 64] (2-D), expected [64, 32] (2-D)",
                        "'blk.0.ffn_down_exps.weight' has shape [96, 64, 4, 2] (4-D), expected [96, 64, 8] (3-D)"};
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    rewrite_with(mix, p, NULL, NULL, NULL, &edits[i]);
    expect_load_error(p, MOLE_ERR_FORMAT, want[i]);
    expect_load_error(p, MOLE_ERR_FORMAT, p);  // the file, too
  }
  // attn_v in f16 while attn_q and attn_k take f32 input: a third type
  const tensor_edit v16 = {"blk.1.attn_v.weight", 0, {0}, QT_F16};
  rewrite_with(mix, p, NULL, NULL, NULL, &v16);
  expect_load_error(p, MOLE_ERR_UNSUPPORTED, "'blk.1.attn_v.weight' (f16) takes its input as f16, attn_q and attn_k as f32");
  const tensor_edit up16 = {"blk.2.ffn_up_exps.weight", 0, {0}, QT_F16};
  rewrite_with(mix, p, NULL, NULL, NULL, &up16);
  expect_load_error(p, MOLE_ERR_UNSUPPORTED, "blk.2: ffn_gate_exps (f32) and ffn_up_exps (f16)");
  // attn_k in f16 too: attn_v takes its type, as llama-quantize's Mixtral files (attn_k, attn_v in q8_0)
  const tensor_edit k16 = {"blk.1.attn_k.weight", 0, {0}, QT_F16};
  rewrite_with(mix, p, NULL, NULL, NULL, &k16);
  mole_model *m = NULL;
  if (mole_model_load(p, NULL, &m)) fail_msg("attn_k in f16: %s", mole_last_error());
  mole_model_free(m);
  unlink(p);
}

// Hyperparameters the later code indexes with, each in its range or an
// error naming the key: the context, RoPE's dims (ops_rope's table), its
// base.
static void test_crafted_hparams(void **state) {
  (void)state;
  const char *mix = tu_path("tests/data/conformance/models/mixtral.gguf");
  const char *p = tmp_path("crafted.gguf");
  rewrite(mix, p, NULL, set_ctx0, NULL);
  expect_load_error(p, MOLE_ERR_FORMAT, "llama.context_length = 0 is out of range");
  rewrite(mix, p, NULL, set_rot4096, NULL);
  char want[128];
  snprintf(want, sizeof want, "llama.rope.dimension_count = 4096 is out of range [0, %d]", (int)OPS_ROPE_MAX_ROT);
  expect_load_error(p, MOLE_ERR_FORMAT, want);
  rewrite(mix, p, NULL, set_base_inf, NULL);
  expect_load_error(p, MOLE_ERR_FORMAT, "rope.freq_base = inf");
  unlink(p);
}

// A model of 80 experts, k of them per token, offloaded (a budget of half
// the experts: the tiered provider, its predictor and prefetch).
// k = 65 once passed the loader and aborted in the predictor; now the
// loader names the key. k = 64 runs.
static void test_crafted_expert_count(void **state) {
  (void)state;
  const char *p = tmp_path("x80.gguf");
  for (int k = 64; k <= 65; k++) {
    synth_params sp = synth_default_params();
    sp.n_embd = 32;
    sp.n_layer = 3;
    sp.n_head = 2;
    sp.n_head_kv = 1;
    sp.n_expert = 80;
    sp.n_expert_used = k;
    sp.n_ff = 32;
    sp.n_vocab = 300;
    sp.type = QT_Q8_0;
    sp.n_threads = 2;
    if (synth_write(&sp, p, NULL)) fail_msg("synth: %s", mole_last_error());
    mole_model_params mp = mole_model_default_params();
    mp.n_threads = 2;
    mp.offload.expert_budget_frac = 0.5;
    mp.offload.io = "pread";
    mole_model *m = NULL;
    if (k == 65) {
      assert_int_equal(mole_model_load(p, &mp, &m), MOLE_ERR_FORMAT);
      assert_non_null(strstr(mole_last_error(), "llama.expert_used_count = 65 is out of range [1, 64]"));
      assert_non_null(strstr(mole_last_error(), p));
      assert_null(m);
      continue;
    }
    if (mole_model_load(p, &mp, &m)) fail_msg("k = 64, offloaded: %s", mole_last_error());
    mole_session_params spp = mole_session_default_params();
    spp.n_ctx = 32;
    mole_session *s;
    assert_int_equal(mole_session_new(m, &spp, &s), MOLE_OK);
    const int32_t toks[5] = {1, 17, 250, 3, 99};
    float *lg = malloc(300 * sizeof(float));
    assert_int_equal(mole_session_eval(s, toks, 3, lg, false), MOLE_OK);  // a prompt, then decode
    for (int i = 3; i < 5; i++) assert_int_equal(mole_session_eval(s, toks + i, 1, lg, false), MOLE_OK);
    for (int i = 0; i < 300; i++) assert_true(isfinite(lg[i]));
    free(lg);
    mole_session_free(s);
    mole_model_free(m);
  }
  unlink(p);
}

// Every architecture from synth, in f32 and in a quantized type: loads, and
// one-by-one decode equals one batch (exactly enough in f32; quantized types
// round activations, so a different summation order may flip a rounding).
static void test_synth_archs(void **state) {
  (void)state;
  const char *archs[] = {"mixtral", "llama", "qwen3moe", "olmoe", "qwen2moe"};
  const char *types[] = {"q4_0", "q8_0", "f16", "q4_k", "q6_k"};
  for (size_t a = 0; a < 10; a++) {
    const bool f32 = a >= 5;
    synth_params sp = synth_default_params();
    sp.arch = archs[a % 5];
    sp.n_embd = 256;
    sp.n_layer = 2;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_expert = 4;
    sp.n_ff = 256;
    sp.n_vocab = 300;
    sp.type = f32 ? QT_F32 : (quant_type)quant_type_from_name(types[a % 5]);
    sp.n_threads = 2;
    if (!strcmp(archs[a % 5], "llama")) sp.n_expert = 0;
    const char *p = tmp_path("synth.gguf");
    if (synth_write(&sp, p, NULL)) fail_msg("synth %s: %s", archs[a % 5], mole_last_error());
    mole_model *m;
    if (mole_model_load(p, NULL, &m)) fail_msg("load synth %s: %s", archs[a % 5], mole_last_error());
    assert_string_equal(mole_model_arch(m), !strcmp(archs[a % 5], "mixtral") ? "llama" : archs[a % 5]);
    // the auto expert budget's estimate of a session's scratch is what it takes
    for (int64_t b = 1; b <= 512; b *= 8) {
      const size_t before = mole_mem_current();
      model_scratch *sc;
      assert_int_equal(model_scratch_new(m, b, 300, &sc), MOLE_OK);
      const int64_t used = (int64_t)(mole_mem_current() - before), est = model_scratch_bytes(m, b, 300);
      if (used < est || used > est + 128 * 64) fail_msg("scratch of %lld tokens: %lld bytes, estimated %lld", (long long)b, (long long)used, (long long)est);
      model_scratch_free(sc);
    }
    mole_session_params spp = mole_session_default_params();
    spp.kv_type = MOLE_KV_F32;
    mole_session *s;
    assert_int_equal(mole_session_new(m, &spp, &s), MOLE_OK);
    const int32_t toks[7] = {1, 17, 250, 3, 99, 42, 7};
    const int64_t V = mole_model_n_vocab(m);
    float *a1 = malloc(7 * (size_t)V * sizeof(float)), *a2 = malloc(7 * (size_t)V * sizeof(float));
    assert_int_equal(mole_session_eval(s, toks, 7, a1, true), MOLE_OK);
    mole_session_reset(s);
    for (int i = 0; i < 7; i++) assert_int_equal(mole_session_eval(s, toks + i, 1, a2 + i * V, false), MOLE_OK);
    double d = 0, r = 0;
    for (int64_t i = 0; i < 7 * V; i++) {
      assert_true(isfinite(a1[i]));
      d += (a1[i] - a2[i]) * (double)(a1[i] - a2[i]);
      r += (double)a1[i] * a1[i];
    }
    if (sqrt(d / r) > (f32 ? 1e-5 : 5e-2)) fail_msg("%s %s: batch vs one-by-one rel %.3g", archs[a % 5], f32 ? "f32" : types[a % 5], sqrt(d / r));
    // out-of-vocabulary token is an error, not a crash
    int32_t bad = (int32_t)V;
    assert_int_equal(mole_session_eval(s, &bad, 1, a2, false), MOLE_ERR_ARG);
    free(a1);
    free(a2);
    mole_session_free(s);
    mole_model_free(m);
    unlink(p);
  }
}

// synth is deterministic for a seed, whatever the thread count.
static void test_synth_deterministic(void **state) {
  (void)state;
  synth_params sp = synth_default_params();
  sp.n_embd = 128;
  sp.n_layer = 1;
  sp.n_head = 2;
  sp.n_head_kv = 1;
  sp.n_expert = 2;
  sp.n_ff = 128;
  sp.n_vocab = 300;
  sp.n_threads = 1;
  const char *p1 = tmp_path("d1.gguf"), *p2 = tmp_path("d2.gguf");
  assert_int_equal(synth_write(&sp, p1, NULL), MOLE_OK);
  sp.n_threads = 2;
  assert_int_equal(synth_write(&sp, p2, NULL), MOLE_OK);
  size_t n1, n2;
  void *b1 = tu_read_file(p1, &n1), *b2 = tu_read_file(p2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  free(b1);
  free(b2);
  sp.arch = "gpt5";
  assert_int_equal(synth_write(&sp, p1, NULL), MOLE_ERR_ARG);
  unlink(p1);
  unlink(p2);
}

// Every layer of each conformance architecture runs the blocks its
// description names: the attention's q/k norm and biases, a dense or MoE
// FFN, the routing function, the shared expert.
static void test_arch_plans(void **state) {
  (void)state;
  const struct {
    const char *model;
    model_qk_norm qk_norm;
    bool qkv_bias;
    model_ffn_kind ffn;
    bool shexp;
  } k[] = {
      {"llama-dense", QK_NORM_NONE, false, FFN_DENSE, false}, {"mixtral", QK_NORM_NONE, false, FFN_MOE, false},
      {"qwen2moe", QK_NORM_NONE, true, FFN_MOE, true},        {"qwen3moe", QK_NORM_HEAD, false, FFN_MOE, false},
      {"olmoe", QK_NORM_FULL, false, FFN_MOE, false},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    mole_model *m = tu_load_fixture(k[i].model);
    for (int64_t il = 0; il < m->hp.n_layer; il++) {
      const model_layer_plan *p = &m->layers[il].plan;
      if (p->attn != ATTN_GQA || p->qk_norm != k[i].qk_norm || p->qkv_bias != k[i].qkv_bias || p->ffn != k[i].ffn ||
          p->shexp != k[i].shexp)
        fail_msg("%s layer %lld: plan attn %d qk_norm %d qkv_bias %d ffn %d shexp %d", k[i].model, (long long)il, p->attn,
                 p->qk_norm, p->qkv_bias, p->ffn, p->shexp);
      if (p->ffn == FFN_MOE) {
        assert_non_null(p->route);
        assert_string_equal(p->route->name, "softmax_topk");
      } else {
        assert_null(p->route);
      }
      // the tensors the blocks read are bound, and only those
      const model_layer *ly = &m->layers[il];
      assert_true((ly->q_norm != NULL) == (p->qk_norm != QK_NORM_NONE));
      assert_true((ly->gate_inp.data != NULL) == (p->ffn == FFN_MOE));
      assert_true((ly->ffn_gate.data != NULL) == (p->ffn == FFN_DENSE));
      assert_true((ly->gate_inp_shexp != NULL) == p->shexp);
    }
    mole_model_free(m);
  }
}

// softmax_topk: softmax over every expert, the k largest in descending
// order (the lower index on ties), renormalised when norm_topk, then scaled;
// an unknown name has no routing function.
static void test_route_softmax_topk(void **state) {
  (void)state;
  assert_null(route_find("no-such-routing"));
  const model_route *r = route_find("softmax_topk");
  assert_non_null(r);
  assert_string_equal(r->name, "softmax_topk");
  const float in[2][5] = {{0.5f, 2.0f, -1.0f, 2.0f, 1.0f}, {-3.0f, -3.0f, 4.0f, -3.0f, 0.0f}};
  for (int variant = 0; variant < 3; variant++) {
    model_hparams hp = {.n_expert = 5, .n_expert_used = 3};
    hp.norm_topk = variant >= 1;
    hp.expert_weights_scale = variant == 2 ? 2.5f : 0.0f;
    float logits[2][5];
    memcpy(logits, in, sizeof logits);
    int32_t sel[2][3];
    float w[2][3];
    r->fn(&hp, NULL, 2, &logits[0][0], &sel[0][0], &w[0][0]);
    const int32_t want_sel[2][3] = {{1, 3, 4}, {2, 4, 0}};
    for (int t = 0; t < 2; t++) {
      double z = 0, p[5];
      for (int e = 0; e < 5; e++) z += exp((double)in[t][e]);
      for (int e = 0; e < 5; e++) p[e] = exp((double)in[t][e]) / z;
      double sum = 0;
      for (int c = 0; c < 3; c++) sum += p[want_sel[t][c]];
      for (int c = 0; c < 3; c++) {
        assert_int_equal(sel[t][c], want_sel[t][c]);
        double want = p[want_sel[t][c]];
        if (hp.norm_topk) want /= sum;
        if (variant == 2) want *= 2.5;
        if (fabs(w[t][c] - want) > 1e-6 * want)
          fail_msg("variant %d token %d choice %d: weight %.9g, want %.9g", variant, t, c, w[t][c], want);
      }
    }
  }
}

// The step API (src/dist/disagg.c's attention side) with the routed experts
// computed through model_experts_rows (its expert side) in the same process:
// a prompt and two decode steps give model_forward's logits bit for bit.
static void test_step_api(void **state) {
  (void)state;
  const char *models[] = {"mixtral", "qwen2moe", "qwen3moe", "olmoe", "mixtral-q4_0"};
  enum { N_PROMPT = 7, N_DEC = 2, N_TOK = N_PROMPT + N_DEC, N_CTX = 32 };
  for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
    mole_model *m = tu_load_fixture(models[mi]);
    const model_hparams *hp = &m->hp;
    const int64_t V = hp->n_vocab, E = hp->n_embd, K = hp->n_expert_used;
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
    float *ref = malloc((size_t)(N_TOK * V) * sizeof(float)), *got = malloc((size_t)(N_TOK * V) * sizeof(float));
    model_kv *kv;
    model_scratch *s, *xs;
    assert_int_equal(kv_new(hp->n_layer, N_CTX, hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v, QT_F32, &kv),
                     MOLE_OK);
    assert_int_equal(model_scratch_new(m, N_PROMPT, N_CTX, &s), MOLE_OK);
    assert_int_equal(model_scratch_new(m, N_PROMPT * K, N_CTX, &xs), MOLE_OK);
    // the reference: the whole pass here
    assert_int_equal(model_forward(m, kv, s, toks, N_PROMPT, 0, ref, true), MOLE_OK);
    for (int i = N_PROMPT; i < N_TOK; i++) assert_int_equal(model_forward(m, kv, s, toks + i, 1, i, ref + i * V, false), MOLE_OK);
    // the same in steps, the experts through model_experts_rows
    kv_reset(kv);
    float *out = malloc((size_t)(N_PROMPT * K * E) * sizeof(float));
    const float *xin[N_PROMPT * 8];
    float *xout[N_PROMPT * 8];
    int32_t sel[N_PROMPT * 8];
    float w[N_PROMPT * 8];
    uint8_t done[N_PROMPT * 8];
    int64_t idx[N_PROMPT * 8];
    assert_true(K <= 8);
    for (int i = 0; i < N_TOK;) {
      const int64_t n = i == 0 ? N_PROMPT : 1;
      const model_seg seg = {kv, toks + i, n, i, got + i * V, n > 1};
      assert_int_equal(model_step_begin(m, s, &seg, 1), MOLE_OK);
      for (int64_t il = 0; il < hp->n_layer; il++) {
        model_moe_rows r;
        model_step_attn(m, s, il, &r);
        assert_int_equal(r.n, n);
        assert_int_equal(r.k, K);
        for (int64_t c = 0; c < n * K; c++) {
          xin[c] = r.xn + (c / K) * E;
          sel[c] = r.sel[c];
          w[c] = r.w[c];
          xout[c] = out + c * E;
        }
        assert_int_equal(model_experts_rows(m, xs, il, n * K, xin, sel, w, xout, done), MOLE_OK);
        for (int64_t c = 0; c < n * K; c++) idx[c] = done[c] ? c : -1;
        model_step_ffn_end(m, s, il, out, idx, E);
      }
      assert_int_equal(model_step_end(m, s, &seg, 1), MOLE_OK);
      i += (int)n;
    }
    if (memcmp(ref, got, (size_t)(N_TOK * V) * sizeof(float)) != 0) {
      int64_t i = 0;
      while (ref[i] == got[i]) i++;
      fail_msg("%s: logit %lld of the step API %.9g, the forward pass %.9g", models[mi], (long long)i, got[i], ref[i]);
    }
    free(out);
    free(ref);
    free(got);
    model_scratch_free(xs);
    model_scratch_free(s);
    kv_free(kv);
    mole_model_free(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_models),
      cmocka_unit_test(test_missing_norm_tensor),
      cmocka_unit_test(test_crafted_tensors),
      cmocka_unit_test(test_crafted_hparams),
      cmocka_unit_test(test_crafted_expert_count),
      cmocka_unit_test(test_synth_archs),
      cmocka_unit_test(test_synth_deterministic),
      cmocka_unit_test(test_arch_plans),
      cmocka_unit_test(test_route_softmax_topk),
      cmocka_unit_test(test_step_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
