// The public API that the CLI is built on (include/mole.h): vocabularies
// (llama.cpp's tokenizer vectors through mole_tokenize, round trips through
// mole_detokenize and the pieces, the vocabulary of a loaded model), chat
// templates, the sampler and stop strings, GGUF inspection and tensor types,
// budgets, cache policies and the cache simulator, synth/pack/compress, and
// bad input (NULL, a file that is not GGUF, an unknown template) with a
// status and a message that names what was wrong.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "mole.h"
#include "testutil.h"

static const char *const k_vocabs[] = {"llama-spm", "gpt-2", "deepseek-coder", "phi-3"};
enum { N_VOCABS = sizeof k_vocabs / sizeof k_vocabs[0] };

static const char *vocab_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf", name);
  return tu_path(buf);
}

static const char *model_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "tests/data/conformance/models/%s.gguf", name);
  return tu_path(buf);
}

static mole_vocab *load_vocab(const char *path) {
  mole_vocab *v = NULL;
  if (mole_vocab_load(path, &v) != MOLE_OK) fail_msg("%s: %s", path, mole_last_error());
  assert_non_null(v);
  return v;
}

// The flags under which detokenize gives back the text tokenize took.
static unsigned round_trip_flags(const mole_vocab *v) {
  mole_vocab_info vi;
  mole_vocab_get_info(v, &vi);
  return strcmp(vi.model, "spm") ? 0u : (unsigned)MOLE_DETOK_STRIP_SPACE;
}

// The pieces of ids joined: the text as a streaming printer shows it.
static char *join_pieces(const mole_vocab *v, const int32_t *ids, int64_t n, size_t *len) {
  size_t cap = 64, k = 0;
  char *s = malloc(cap);
  for (int64_t i = 0; i < n; i++) {
    const int64_t pl = mole_token_piece(v, ids[i], NULL, 0, false);
    assert_true(pl >= 0);
    while (k + (size_t)pl + 1 > cap) s = realloc(s, cap *= 2);
    assert_int_equal(mole_token_piece(v, ids[i], s + k, (size_t)pl, false), pl);
    k += (size_t)pl;
  }
  s[k] = 0;
  *len = k;
  return s;
}

// ---- tokenizer vectors -------------------------------------------------------------------

// llama.cpp's vectors: mole_tokenize gives the ids, mole_detokenize gives the
// text back, and the pieces joined equal the detokenized text (no clean-up).
static int check_vectors(const char *name, const mole_vocab *v) {
  char inp_rel[256], out_rel[256];
  snprintf(inp_rel, sizeof inp_rel, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf.inp", name);
  snprintf(out_rel, sizeof out_rel, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf.out", name);
  tu_vector *vec = NULL;
  const int nv = tu_vectors_read(inp_rel, out_rel, &vec);
  for (int k = 0; k < nv; k++) {
    const tu_vector *t = &vec[k];
    int32_t *ids = NULL;
    int64_t n = -1;
    assert_int_equal(mole_tokenize(v, t->text, t->len, false, false, &ids, &n), MOLE_OK);
    assert_non_null(ids);
    if (n != t->n || (n && memcmp(ids, t->ids, (size_t)n * sizeof *ids)))
      fail_msg("%s: vector %d '%.*s': %lld ids, want %lld", name, k, (int)t->len, t->text, (long long)n, (long long)t->n);
    char *text = NULL;
    size_t tn = 0;
    assert_int_equal(mole_detokenize(v, ids, n, round_trip_flags(v), &text, &tn), MOLE_OK);
    if (tn != t->len || memcmp(text, t->text, tn))
      fail_msg("%s: vector %d: round trip of '%.*s' gave '%s'", name, k, (int)t->len, t->text, text);
    mole_free(text);
    assert_int_equal(mole_detokenize(v, ids, n, 0, &text, &tn), MOLE_OK);
    size_t pn = 0;
    char *pieces = join_pieces(v, ids, n, &pn);
    if (pn != tn || memcmp(pieces, text, tn)) fail_msg("%s: vector %d: pieces '%s', detokenized '%s'", name, k, pieces, text);
    free(pieces);
    mole_free(text);
    mole_free(ids);
  }
  tu_vectors_free(vec, nv);
  return nv;
}

static void test_vectors(void **state) {
  (void)state;
  for (int k = 0; k < N_VOCABS; k++) {
    mole_vocab *v = load_vocab(vocab_path(k_vocabs[k]));
    assert_int_equal(check_vectors(k_vocabs[k], v), 46);
    mole_vocab_free(v);
  }
}

// Special tokens, BOS/EOS, parse_special and the vocabulary's facts.
static void test_special(void **state) {
  (void)state;
  mole_vocab *v = load_vocab(vocab_path("llama-spm"));
  mole_vocab_info vi;
  mole_vocab_get_info(v, &vi);
  assert_string_equal(vi.model, "spm");
  assert_int_equal(vi.n_tokens, 32000);
  assert_int_equal(vi.bos, 1);
  assert_int_equal(vi.eos, 2);
  assert_true(vi.add_bos);
  assert_false(vi.add_eos);
  assert_null(vi.chat_template);
  int32_t *ids;
  int64_t n;
  assert_int_equal(mole_tokenize(v, "Hi", 2, true, false, &ids, &n), MOLE_OK);
  assert_true(n >= 2);
  assert_int_equal(ids[0], 1);  // BOS
  mole_free(ids);
  // </s> is a control token: one id with parse_special, text without
  assert_int_equal(mole_tokenize(v, "</s>", 4, false, true, &ids, &n), MOLE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], 2);
  mole_free(ids);
  assert_int_equal(mole_tokenize(v, "</s>", 4, false, false, &ids, &n), MOLE_OK);
  assert_true(n > 1);
  mole_free(ids);
  assert_true(mole_token_is_eog(v, 2));
  assert_false(mole_token_is_eog(v, 100));
  assert_false(mole_token_is_eog(v, -1));
  // pieces: a control token renders only with render_special; out of range is -1;
  // a short buffer gets the length and nothing past cap
  char buf[8] = "xxxxxxx";
  assert_int_equal(mole_token_piece(v, 2, buf, sizeof buf, false), 0);
  assert_int_equal(mole_token_piece(v, 2, buf, sizeof buf, true), 4);
  assert_memory_equal(buf, "</s>", 4);
  assert_int_equal(mole_token_piece(v, 32000, buf, sizeof buf, true), -1);
  assert_int_equal(mole_token_piece(v, -5, buf, sizeof buf, true), -1);
  memset(buf, 'x', sizeof buf);
  assert_int_equal(mole_token_piece(v, 2, buf, 2, true), 4);
  assert_int_equal(buf[2], 'x');
  // remove_special drops the BOS tokenize added (and then the space prefix stays, as in
  // llama.cpp); strip_space drops that space when the text starts at the first token
  assert_int_equal(mole_tokenize(v, "Hello world", 11, true, false, &ids, &n), MOLE_OK);
  char *text;
  size_t tn;
  assert_int_equal(mole_detokenize(v, ids, n, MOLE_DETOK_REMOVE_SPECIAL | MOLE_DETOK_STRIP_SPACE, &text, &tn), MOLE_OK);
  assert_string_equal(text, " Hello world");
  mole_free(text);
  assert_int_equal(mole_detokenize(v, ids + 1, n - 1, MOLE_DETOK_STRIP_SPACE, &text, &tn), MOLE_OK);
  assert_string_equal(text, "Hello world");
  mole_free(text);
  assert_int_equal(mole_detokenize(v, ids, n, MOLE_DETOK_RENDER_SPECIAL, &text, &tn), MOLE_OK);
  assert_string_equal(text, "<s> Hello world");
  mole_free(text);
  mole_free(ids);
  // an empty text: no ids, a non-NULL array
  assert_int_equal(mole_tokenize(v, "", 0, false, false, &ids, &n), MOLE_OK);
  assert_non_null(ids);
  assert_int_equal(n, 0);
  mole_free(ids);
  mole_vocab_free(v);

  // phi-3 carries a chat template mole does not render: the text, no family
  v = load_vocab(vocab_path("phi-3"));
  mole_vocab_get_info(v, &vi);
  assert_non_null(vi.chat_template);
  assert_non_null(strstr(vi.chat_template, "<|assistant|>"));
  assert_null(vi.chat_template_name);
  assert_true(vi.eot >= 0);
  assert_true(mole_token_is_eog(v, vi.eot));
  mole_vocab_free(v);
}

// The vocabulary of a loaded model is the file's: the same ids as the
// vocab-only path and through an open mole_gguf, its size the model's n_vocab.
static void test_model_vocab(void **state) {
  (void)state;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mole_model *m = NULL;
  assert_int_equal(mole_model_load(model_path("qwen3moe"), &mp, &m), MOLE_OK);
  mole_vocab *a = NULL, *b = load_vocab(model_path("qwen3moe")), *c = NULL;
  assert_int_equal(mole_model_vocab(m, &a), MOLE_OK);
  mole_gguf *g = NULL;
  assert_int_equal(mole_gguf_open(model_path("qwen3moe"), &g), MOLE_OK);
  assert_int_equal(mole_gguf_vocab(g, &c), MOLE_OK);
  mole_gguf_close(g);  // the vocabulary outlives the file handle
  mole_vocab_info vi;
  mole_vocab_get_info(a, &vi);
  assert_int_equal(vi.n_tokens, mole_model_n_vocab(m));
  mole_model_free(m);  // and the model
  static const char *const texts[] = {"Hello world", " leading space", "x <|im_end|> y", "123 4567 ..."};
  for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
    int32_t *ia, *ib, *ic;
    int64_t na, nb, nc;
    const size_t len = strlen(texts[t]);
    assert_int_equal(mole_tokenize(a, texts[t], len, true, true, &ia, &na), MOLE_OK);
    assert_int_equal(mole_tokenize(b, texts[t], len, true, true, &ib, &nb), MOLE_OK);
    assert_int_equal(mole_tokenize(c, texts[t], len, true, true, &ic, &nc), MOLE_OK);
    assert_int_equal(na, nb);
    assert_int_equal(na, nc);
    assert_memory_equal(ia, ib, (size_t)na * sizeof *ia);
    assert_memory_equal(ia, ic, (size_t)na * sizeof *ia);
    mole_free(ia);
    mole_free(ib);
    mole_free(ic);
  }
  mole_vocab_free(a);
  mole_vocab_free(b);
  mole_vocab_free(c);
}

// ---- chat templates ------------------------------------------------------------------------

static void test_chat(void **state) {
  (void)state;
  const mole_chat_msg msgs[] = {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
  char *out = NULL;
  assert_int_equal(mole_chat_apply("chatml", msgs, 4, true, &out), MOLE_OK);
  assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1"
                           "<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
  mole_free(out);
  // an alias renders the same family; without add_assistant no open turn
  assert_int_equal(mole_chat_apply("qwen2", msgs + 1, 1, false, &out), MOLE_OK);
  assert_string_equal(out, "<|im_start|>user\nU1<|im_end|>\n");
  mole_free(out);
  assert_int_equal(mole_chat_apply("llama3", msgs + 1, 1, true, &out), MOLE_OK);
  assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
  mole_free(out);
  // names, aliases, detection from a Jinja template
  assert_string_equal(mole_chat_template_from_name("qwen2"), "chatml");
  assert_string_equal(mole_chat_template_from_name("qwen3"), "qwen3");  // its own family: thinking
  assert_string_equal(mole_chat_template_from_name("olmoe"), "tulu");
  assert_null(mole_chat_template_from_name("nope"));
  assert_null(mole_chat_template_from_name(NULL));
  assert_string_equal(mole_chat_template_detect("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% endfor %}"),
                      "chatml");
  assert_string_equal(mole_chat_template_detect("llama3"), "llama3");
  assert_null(mole_chat_template_detect("{{ messages }}"));
  assert_null(mole_chat_template_detect(NULL));
  assert_non_null(strstr(mole_chat_template_list(), "chatml"));
  // bad input: an unknown template (named, with the list), a bad role (its index), NULLs
  out = (char *)1;
  assert_int_equal(mole_chat_apply("nope", msgs, 4, true, &out), MOLE_ERR_ARG);
  assert_null(out);
  assert_non_null(strstr(mole_last_error(), "'nope'"));
  assert_non_null(strstr(mole_last_error(), "chatml"));
  const mole_chat_msg bad[] = {{"user", "hi"}, {"robot", "beep"}};
  assert_int_equal(mole_chat_apply("chatml", bad, 2, true, &out), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "robot"));
  assert_non_null(strstr(mole_last_error(), "1"));
  assert_int_equal(mole_chat_apply("chatml", NULL, 2, true, &out), MOLE_ERR_ARG);
  assert_int_equal(mole_chat_apply("chatml", msgs, -1, true, &out), MOLE_ERR_ARG);
  assert_int_equal(mole_chat_apply(NULL, msgs, 1, true, &out), MOLE_ERR_ARG);
  assert_int_equal(mole_chat_apply("chatml", msgs, 1, true, NULL), MOLE_ERR_ARG);
}

// ---- sampler, stop strings -----------------------------------------------------------------

enum { SV = 1000 };

static void draw(mole_sampler *s, const float *lg, int32_t *out, int n) {
  for (int i = 0; i < n; i++) {
    out[i] = mole_sampler_sample(s, lg);
    assert_true(out[i] >= 0 && out[i] < SV);
    assert_int_equal(mole_sampler_accept(s, out[i]), MOLE_OK);
  }
}

static void test_sampler(void **state) {
  (void)state;
  static float lg[SV];
  uint64_t r = 5;
  for (int i = 0; i < SV; i++) lg[i] = 3.0f * tu_gauss(&r);
  mole_sampler_params p = mole_sampler_default_params();
  assert_true(p.temperature > 0.79f && p.temperature < 0.81f);
  assert_int_equal(p.top_k, 40);
  assert_true(p.seed == MOLE_SEED_RANDOM);
  p.temperature = 1.5f;
  p.top_k = 0;
  p.min_p = 0;
  p.repeat_penalty = 1.2f;
  p.seed = 42;
  mole_sampler *a = NULL, *b = NULL;
  assert_int_equal(mole_sampler_new(&p, SV, &a), MOLE_OK);
  assert_int_equal(mole_sampler_new(&p, SV, &b), MOLE_OK);
  assert_true(mole_sampler_seed(a) == 42);
  int32_t ta[64], tb[64], tc[64];
  draw(a, lg, ta, 64);
  draw(b, lg, tb, 64);
  assert_memory_equal(ta, tb, sizeof ta);  // the same seed, the same tokens
  int distinct = 0;
  for (int i = 1; i < 64; i++) distinct += ta[i] != ta[0];
  assert_true(distinct > 0);  // it samples, not greedy
  mole_sampler_reset(a);  // the history and the random stream start over
  draw(a, lg, tc, 64);
  assert_memory_equal(ta, tc, sizeof ta);
  mole_sampler_free(b);
  p.seed = 43;
  assert_int_equal(mole_sampler_new(&p, SV, &b), MOLE_OK);
  draw(b, lg, tb, 64);
  assert_true(memcmp(ta, tb, sizeof ta) != 0);
  mole_sampler_free(b);
  // greedy: the argmax
  p.temperature = 0;
  assert_int_equal(mole_sampler_new(&p, SV, &b), MOLE_OK);
  int32_t best = 0;
  for (int i = 1; i < SV; i++) best = lg[i] > lg[best] ? i : best;
  assert_int_equal(mole_sampler_sample(b, lg), best);
  mole_sampler_free(b);
  // bad input: a token outside the vocabulary, parameters out of range, NULLs
  assert_int_equal(mole_sampler_accept(a, SV), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "1000"));
  assert_int_equal(mole_sampler_accept(a, -1), MOLE_ERR_ARG);
  mole_sampler_free(a);
  p.top_p = 2.0f;
  a = (mole_sampler *)1;
  assert_int_equal(mole_sampler_new(&p, SV, &a), MOLE_ERR_ARG);
  assert_null(a);
  assert_non_null(strstr(mole_last_error(), "top_p"));
  p = mole_sampler_default_params();
  assert_int_equal(mole_sampler_new(&p, 0, &a), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "n_vocab"));
  assert_int_equal(mole_sampler_new(NULL, SV, &a), MOLE_ERR_ARG);
  assert_int_equal(mole_sampler_new(&p, SV, NULL), MOLE_ERR_ARG);
}

static void test_stop(void **state) {
  (void)state;
  const char *const stops[] = {"lo w", "END"};
  mole_stop *m = NULL;
  assert_int_equal(mole_stop_new(stops, 2, &m), MOLE_OK);
  mole_stop_result r;
  assert_int_equal(mole_stop_feed(m, "Hel", 3, &r), MOLE_OK);  // the 'l' may start "lo w": held back
  assert_false(r.matched);
  assert_int_equal(r.n_emit, 2);
  assert_memory_equal(r.emit, "He", 2);
  assert_int_equal(mole_stop_feed(m, "lo ", 3, &r), MOLE_OK);  // "l" settled, "lo " held
  assert_false(r.matched);
  assert_int_equal(r.n_emit, 1);
  assert_memory_equal(r.emit, "l", 1);
  assert_int_equal(mole_stop_feed(m, "world", 5, &r), MOLE_OK);
  assert_true(r.matched);
  assert_int_equal(r.stop_index, 0);
  assert_int_equal(r.n_emit, 0);
  mole_stop_flush(m, &r);
  assert_int_equal(r.n_emit, 0);
  mole_stop_reset(m);  // a new text: held bytes come out at the end
  assert_int_equal(mole_stop_feed(m, "xyEN", 4, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 2);
  mole_stop_flush(m, &r);
  assert_false(r.matched);
  assert_int_equal(r.n_emit, 2);
  assert_memory_equal(r.emit, "EN", 2);
  mole_stop_free(m);
  const char *const empty[] = {""};
  assert_int_equal(mole_stop_new(empty, 1, &m), MOLE_ERR_ARG);
  assert_null(m);
  assert_int_equal(mole_stop_new(NULL, 1, &m), MOLE_ERR_ARG);
  assert_int_equal(mole_stop_new(NULL, 0, &m), MOLE_OK);  // no stop strings: everything passes
  assert_int_equal(mole_stop_feed(m, "abc", 3, &r), MOLE_OK);
  assert_int_equal(r.n_emit, 3);
  mole_stop_free(m);
}

// ---- GGUF inspection, tensor types ---------------------------------------------------------

static void test_gguf(void **state) {
  (void)state;
  mole_gguf *g = NULL;
  assert_int_equal(mole_gguf_open(model_path("mixtral"), &g), MOLE_OK);
  mole_gguf_info gi;
  mole_gguf_get_info(g, &gi);
  assert_int_equal(gi.version, 3);
  assert_int_equal(gi.alignment, 32);
  assert_int_equal(gi.n_kv, 22);
  assert_int_equal(gi.n_tensors, 33);
  assert_true(gi.data_offset > 0 && gi.data_offset < gi.size);
  const char *arch = NULL;
  assert_int_equal(mole_gguf_get_str(g, "general.architecture", &arch), MOLE_OK);
  assert_string_equal(arch, "llama");
  int64_t x = 0;
  assert_int_equal(mole_gguf_get_int(g, "llama.expert_count", &x), MOLE_OK);
  assert_int_equal(x, 8);
  assert_int_equal(mole_gguf_get_int(g, "no.such.key", &x), MOLE_ERR_NOT_FOUND);
  assert_int_equal(mole_gguf_get_int(g, "general.architecture", &x), MOLE_ERR_FORMAT);
  assert_int_equal(mole_gguf_find_kv(g, "no.such.key"), -1);
  // every key: a scalar number with data, a string without, arrays with n elements
  bool saw_array = false;
  for (int64_t i = 0; i < gi.n_kv; i++) {
    mole_gguf_kv kv;
    assert_int_equal(mole_gguf_kv_at(g, i, &kv), MOLE_OK);
    assert_int_equal(mole_gguf_find_kv(g, kv.key), i);
    if (kv.elem_type == MOLE_GGUF_STRING) {
      assert_null(kv.data);
      uint64_t len = 0;
      const char *s = mole_gguf_kv_str(g, i, 0, &len);
      assert_non_null(s);
      assert_int_equal(strlen(s), len);
    } else {
      assert_non_null(kv.data);
      assert_true(mole_gguf_type_size(kv.elem_type) > 0);
      assert_null(mole_gguf_kv_str(g, i, 0, NULL));
    }
    if (!strcmp(kv.key, "tokenizer.ggml.tokens")) {
      saw_array = true;
      assert_int_equal(kv.type, MOLE_GGUF_ARRAY);
      assert_int_equal(kv.n, 512);
      assert_string_equal(mole_gguf_kv_str(g, i, 1, NULL), "<s>");
      assert_null(mole_gguf_kv_str(g, i, 512, NULL));
    }
    if (!strcmp(kv.key, "llama.block_count")) {
      assert_int_equal(kv.type, MOLE_GGUF_UINT32);
      assert_string_equal(mole_gguf_type_name(kv.type), "u32");
      uint32_t v;
      memcpy(&v, kv.data, sizeof v);
      assert_int_equal(v, 3);
    }
  }
  assert_true(saw_array);
  // the tensor table: offsets in order, sizes within the file
  uint64_t end = 0;
  for (int64_t i = 0; i < gi.n_tensors; i++) {
    mole_gguf_tensor t;
    assert_int_equal(mole_gguf_tensor_at(g, i, &t), MOLE_OK);
    assert_true(t.n_dims >= 1 && t.n_dims <= 4);
    assert_true(t.offset >= end);
    end = t.offset + t.bytes;
    assert_true(gi.data_offset + end <= gi.size);
    assert_string_equal(t.type_name, mole_type_name(t.type));
    if (!strcmp(t.name, "token_embd.weight")) {
      assert_int_equal(t.n_dims, 2);
      assert_int_equal(t.ne[0], 64);
      assert_int_equal(t.ne[1], 512);
      assert_int_equal(t.ne[2], 1);
      assert_string_equal(t.type_name, "f32");
      assert_int_equal(t.bytes, 64 * 512 * 4);
    }
  }
  // out of range and NULL: MOLE_ERR_ARG naming the index
  mole_gguf_kv kv;
  mole_gguf_tensor t;
  assert_int_equal(mole_gguf_kv_at(g, gi.n_kv, &kv), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "22"));
  assert_int_equal(mole_gguf_kv_at(g, -1, &kv), MOLE_ERR_ARG);
  assert_int_equal(mole_gguf_tensor_at(g, gi.n_tensors, &t), MOLE_ERR_ARG);
  assert_int_equal(mole_gguf_tensor_at(NULL, 0, &t), MOLE_ERR_ARG);
  assert_null(mole_gguf_kv_str(g, -1, 0, NULL));
  mole_gguf_close(g);
  mole_gguf_close(NULL);

  // tensor types
  assert_int_equal(mole_type_from_name("q4_k"), 12);
  assert_int_equal(mole_type_from_name("Q8_0"), 8);
  assert_int_equal(mole_type_from_name("q3_q"), -1);
  assert_int_equal(mole_type_from_name(NULL), -1);
  assert_string_equal(mole_type_name(30), "bf16");
  assert_true(mole_type_writable(8));   // q8_0
  assert_true(mole_type_writable(14));  // q6_k
  assert_false(mole_type_writable(15));  // q8_k: activations only
  assert_false(mole_type_writable(-1));
  assert_false(mole_type_writable(1000));
  char b[32];
  assert_string_equal(mole_format_bytes(b, sizeof b, 1536.0 * 1024 * 1024), "1.5 GiB");
}

// Files that are not what they should be: a status and a message naming the file.
static void test_bad_files(void **state) {
  (void)state;
  const char *json = tu_path("tests/data/conformance/refs/mixtral/ref.json");
  mole_gguf *g = (mole_gguf *)1;
  assert_int_equal(mole_gguf_open(json, &g), MOLE_ERR_FORMAT);
  assert_null(g);
  assert_non_null(strstr(mole_last_error(), "ref.json"));
  assert_non_null(strstr(mole_last_error(), "magic"));
  mole_vocab *v = (mole_vocab *)1;
  assert_int_equal(mole_vocab_load(json, &v), MOLE_ERR_FORMAT);
  assert_null(v);
  assert_non_null(strstr(mole_last_error(), "magic"));
  assert_int_equal(mole_vocab_load("/nonexistent/x.gguf", &v), MOLE_ERR_IO);
  assert_non_null(strstr(mole_last_error(), "/nonexistent/x.gguf"));
  assert_int_equal(mole_gguf_open(NULL, &g), MOLE_ERR_ARG);
  assert_int_equal(mole_vocab_load(NULL, &v), MOLE_ERR_ARG);
  assert_int_equal(mole_vocab_load(json, NULL), MOLE_ERR_ARG);
  assert_int_equal(mole_model_vocab(NULL, &v), MOLE_ERR_ARG);
  assert_int_equal(mole_gguf_vocab(NULL, &v), MOLE_ERR_ARG);
  // a GGUF without a vocabulary: not found, naming the key
  char path[256];
  snprintf(path, sizeof path, "/tmp/mole-test-api-%d-novocab.gguf", (int)getpid());
  gguf_writer *w = NULL;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_str(w, "general.architecture", "llama"), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  assert_int_equal(mole_vocab_load(path, &v), MOLE_ERR_NOT_FOUND);
  assert_non_null(strstr(mole_last_error(), "tokenizer.ggml.model"));
  unlink(path);
  // NULL handles and buffers
  v = load_vocab(vocab_path("gpt-2"));
  int32_t *ids = (int32_t *)1;
  int64_t n = 5;
  assert_int_equal(mole_tokenize(NULL, "x", 1, false, false, &ids, &n), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "vocabulary"));
  assert_int_equal(mole_tokenize(v, NULL, 3, false, false, &ids, &n), MOLE_ERR_ARG);
  assert_int_equal(mole_tokenize(v, "x", 1, false, false, NULL, &n), MOLE_ERR_ARG);
  assert_int_equal(mole_tokenize(v, "x", MOLE_TOKENIZE_MAX_TEXT + 1, false, false, &ids, &n), MOLE_ERR_ARG);
  const int32_t oov[] = {5, 1 << 30};
  char *text = (char *)1;
  size_t tn = 0;
  assert_int_equal(mole_detokenize(v, oov, 2, 0, &text, &tn), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "1073741824"));
  assert_int_equal(mole_detokenize(v, NULL, 2, 0, &text, &tn), MOLE_ERR_ARG);
  assert_int_equal(mole_detokenize(v, oov, -1, 0, &text, &tn), MOLE_ERR_ARG);
  assert_int_equal(mole_token_piece(NULL, 5, NULL, 0, false), -1);
  assert_false(mole_token_is_eog(NULL, 5));
  mole_vocab_free(v);
  mole_vocab_free(NULL);
}

// ---- offload settings, the cache simulator ---------------------------------------------------

static void test_budget_policy(void **state) {
  (void)state;
  int64_t bytes = 0;
  double frac = 0;
  assert_int_equal(mole_parse_budget("2GiB", &bytes, &frac), MOLE_OK);
  assert_int_equal(bytes, (int64_t)2 << 30);
  assert_int_equal(mole_parse_budget("40%", &bytes, &frac), MOLE_OK);
  assert_int_equal(bytes, 0);
  assert_true(frac > 0.399 && frac < 0.401);
  assert_int_equal(mole_parse_budget("auto", &bytes, &frac), MOLE_OK);
  assert_int_equal(bytes, -1);
  assert_int_equal(mole_parse_budget("12XB", &bytes, &frac), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "12XB"));
  assert_int_equal(mole_parse_budget(NULL, &bytes, &frac), MOLE_ERR_ARG);

  const char *name = NULL;
  float w[4];
  assert_int_equal(mole_cache_policy_parse("LRU", NULL, false, &name, w), MOLE_OK);
  assert_string_equal(name, "lru");
  assert_true(w[0] == 1 && w[1] == 0 && w[2] == 0 && w[3] == 0);
  assert_int_equal(mole_cache_policy_parse(NULL, NULL, false, &name, w), MOLE_OK);
  assert_string_equal(name, "hobbit");
  const float mine[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  assert_int_equal(mole_cache_policy_parse("hobbit", mine, false, NULL, w), MOLE_OK);
  assert_memory_equal(w, mine, sizeof mine);
  assert_int_equal(mole_cache_policy_parse("lru", mine, false, NULL, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "hobbit"));
  const float bad[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  assert_int_equal(mole_cache_policy_parse("hobbit", bad, false, NULL, NULL), MOLE_ERR_ARG);
  assert_int_equal(mole_cache_policy_parse("belady", NULL, false, NULL, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "cachesim"));
  assert_int_equal(mole_cache_policy_parse("opt", NULL, true, &name, NULL), MOLE_OK);
  assert_string_equal(name, "belady");
  assert_int_equal(mole_cache_policy_parse("mru", NULL, true, NULL, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "'mru'"));
  int64_t np = 0;
  while (mole_cache_policy_at(np)) np++;
  assert_int_equal(np, 6);
  assert_string_equal(mole_cache_policy_at(4), "hobbit");
  assert_null(mole_cache_policy_at(-1));
}

// A routing trace written by a run with an expert budget, replayed by every
// policy: the requests are the run's, belady's bound caps every policy's hits.
static void test_cachesim(void **state) {
  (void)state;
  char trace[256];
  snprintf(trace, sizeof trace, "/tmp/mole-test-api-%d.trace", (int)getpid());
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  mp.offload.expert_budget_frac = 0.5;
  mp.offload.trace_routing = trace;
  mole_model *m = NULL;
  mole_session *s = NULL;
  assert_int_equal(mole_model_load(model_path("mixtral"), &mp, &m), MOLE_OK);
  assert_int_equal(mole_session_new(m, NULL, &s), MOLE_OK);
  int32_t toks[24];
  for (int i = 0; i < 24; i++) toks[i] = (int32_t)(7 + 19 * i) % 500;
  assert_int_equal(mole_session_eval(s, toks, 8, NULL, false), MOLE_OK);
  for (int i = 8; i < 24; i++) assert_int_equal(mole_session_eval(s, toks + i, 1, NULL, false), MOLE_OK);
  mole_session_free(s);
  mole_model_free(m);  // closes the trace

  mole_cachesim_params cp = {.budget_frac = 0.5};
  int64_t requests = -1, bound = -1;
  for (int64_t p = 0; mole_cache_policy_at(p); p++) {
    cp.policy = mole_cache_policy_at(p);
    mole_cachesim_result r;
    if (mole_cachesim(trace, &cp, &r)) fail_msg("%s: %s", cp.policy, mole_last_error());
    assert_string_equal(r.policy, cp.policy);
    assert_int_equal(r.n_layer, 3);
    assert_int_equal(r.n_expert, 8);
    assert_int_equal(r.n_used, 2);
    assert_int_equal(r.steps, 17);
    assert_int_equal(r.tokens, 24);
    assert_true(r.slots_high > 0 && r.slots_high < 24);
    const int64_t req = r.hits_high + r.misses_high + r.hits_low + r.misses_low;
    assert_true(req > 0);
    if (requests >= 0) assert_int_equal(req, requests);
    requests = req;
    if (r.offline) {
      assert_string_equal(r.policy, "belady");
      assert_true(r.bound_exact);
      assert_int_equal(r.bound_requests, req);
      bound = r.bound_hits;
    }
  }
  assert_true(bound >= 0);
  for (int64_t p = 0; mole_cache_policy_at(p); p++) {
    cp.policy = mole_cache_policy_at(p);
    mole_cachesim_result r;
    assert_int_equal(mole_cachesim(trace, &cp, &r), MOLE_OK);
    assert_true(r.hits_high + r.hits_low <= bound);
  }
  // bad input: a policy, a trace that is not one, NULL
  cp.policy = "mru";
  mole_cachesim_result r;
  assert_int_equal(mole_cachesim(trace, &cp, &r), MOLE_ERR_ARG);
  cp.policy = "lru";
  assert_int_equal(mole_cachesim(tu_path("tests/data/conformance/refs/mixtral/ref.json"), &cp, &r), MOLE_ERR_FORMAT);
  assert_non_null(strstr(mole_last_error(), "ref.json"));
  assert_int_equal(mole_cachesim(NULL, &cp, &r), MOLE_ERR_ARG);
  unlink(trace);
}

// ---- synth, pack, compress, train-retain -------------------------------------------------------

static void test_model_files(void **state) {
  (void)state;
  char synth[256], packed[256], comp[256], both[256];
  const int pid = (int)getpid();
  snprintf(synth, sizeof synth, "/tmp/mole-test-api-%d-synth.gguf", pid);
  snprintf(packed, sizeof packed, "/tmp/mole-test-api-%d-packed.gguf", pid);
  snprintf(comp, sizeof comp, "/tmp/mole-test-api-%d-tq.gguf", pid);
  snprintf(both, sizeof both, "/tmp/mole-test-api-%d-both.gguf", pid);
  mole_synth_params sp = mole_synth_default_params();
  assert_string_equal(sp.arch, "mixtral");
  sp.n_embd = 128;
  sp.n_layer = 2;
  sp.n_head = 2;
  sp.n_head_kv = 1;
  sp.n_expert = 4;
  sp.n_ff = 256;
  sp.type = mole_type_from_name("q8_0");
  sp.vocab_from = vocab_path("llama-spm");
  sp.n_threads = 1;
  uint64_t bytes = 0;
  if (mole_synth(&sp, synth, &bytes)) fail_msg("synth: %s", mole_last_error());
  mole_gguf *g = NULL;
  assert_int_equal(mole_gguf_open(synth, &g), MOLE_OK);
  mole_gguf_info gi;
  mole_gguf_get_info(g, &gi);
  assert_int_equal(gi.size, bytes);
  mole_gguf_close(g);
  mole_vocab *v = load_vocab(synth);  // --vocab-from: the vocabulary of the source
  mole_vocab_info vi;
  mole_vocab_get_info(v, &vi);
  assert_int_equal(vi.n_tokens, 32000);
  mole_vocab_free(v);
  sp.arch = "gpt5";
  assert_int_equal(mole_synth(&sp, synth, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "gpt5"));

  // pack with a q4_0 low tier; compress (round to nearest) and pack its experts as the low tier
  mole_pack_params pp = mole_pack_default_params();
  pp.low = mole_type_from_name("q4_0");
  pp.n_threads = 1;
  if (mole_pack(synth, packed, &pp, NULL)) fail_msg("pack: %s", mole_last_error());
  assert_int_equal(mole_gguf_open(packed, &g), MOLE_OK);
  assert_true(mole_gguf_find_kv(g, "mole.pack.low.types") >= 0);
  mole_gguf_close(g);
  pp.high = mole_type_from_name("q8_k");
  assert_int_equal(mole_pack(synth, packed, &pp, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "q8_k"));

  mole_compress_params cp = mole_compress_default_params();
  assert_int_equal(cp.code_weights, 0);
  assert_int_equal(cp.grid, MOLE_COMPRESS_TERNARY);
  cp.rtn = true;
  cp.n_threads = 1;
  char *rep = NULL;
  size_t rep_n = 0;
  FILE *rf = open_memstream(&rep, &rep_n);
  if (mole_compress(synth, comp, &cp, NULL, rf)) fail_msg("compress: %s", mole_last_error());
  fclose(rf);
  assert_non_null(strstr(rep, "round-to-nearest, ternary grid"));
  assert_non_null(strstr(rep, "bits per weight"));
  free(rep);
  pp = mole_pack_default_params();
  pp.low_file = comp;
  pp.n_threads = 1;
  if (mole_pack(synth, both, &pp, NULL)) fail_msg("pack --low FILE: %s", mole_last_error());
  pp.low = 2;
  assert_int_equal(mole_pack(synth, both, &pp, NULL), MOLE_ERR_ARG);  // a low type and a low file
  cp.code_weights = 31;
  assert_int_equal(mole_compress(synth, comp, &cp, NULL, NULL), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "31"));
  assert_int_equal(mole_compress(NULL, comp, &cp, NULL, NULL), MOLE_ERR_ARG);

  // train-retain: a missing text is an error naming it, and no report
  mole_train_retain_params tp = mole_train_retain_default_params();
  assert_int_equal(tp.window, 64);
  tp.data = "/nonexistent/text.txt";
  tp.n_threads = 1;
  mole_retain_report *r = (mole_retain_report *)1;
  mole_status st = mole_train_retain(synth, comp, &tp, NULL, &r);
  assert_int_not_equal(st, MOLE_OK);
  assert_null(r);
  assert_non_null(strstr(mole_last_error(), "/nonexistent/text.txt"));
  assert_int_equal(mole_train_retain(synth, comp, NULL, NULL, &r), MOLE_ERR_ARG);
  mole_retain_report_free(NULL);
  unlink(synth);
  unlink(packed);
  unlink(comp);
  unlink(both);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),       cmocka_unit_test(test_special),  cmocka_unit_test(test_model_vocab),
      cmocka_unit_test(test_chat),          cmocka_unit_test(test_sampler),  cmocka_unit_test(test_stop),
      cmocka_unit_test(test_gguf),          cmocka_unit_test(test_bad_files), cmocka_unit_test(test_budget_policy),
      cmocka_unit_test(test_cachesim),      cmocka_unit_test(test_model_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
