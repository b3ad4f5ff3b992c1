// tokenizer: llama.cpp's test vectors for four vocabularies (two SentencePiece,
// two byte-level BPE), round trips, special tokens, every pre-tokenizer's
// regexes, random and pathological inputs.
//
// Vectors: tests/data/conformance/tokenizer/ggml-vocab-*.gguf{,.inp,.out}, from
// llama.cpp (MIT licence; see tests/data/conformance/CREDITS.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

static const char *const k_vocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-coder"};
enum { N_VOCABS = 4 };

typedef struct {
  gguf_file *f;
  tok_vocab *v;
} vocab_h;

static vocab_h open_vocab(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf", name);
  vocab_h h = {0};
  mole_status st = gguf_open(tu_path(rel), &h.f);
  if (st != MOLE_OK) fail_msg("%s: %s", rel, mole_last_error());
  st = tok_load(h.f, &h.v);
  if (st != MOLE_OK) fail_msg("%s: %s", rel, mole_last_error());
  return h;
}

static void close_vocab(vocab_h h) {
  tok_free(h.v);
  gguf_close(h.f);
}

static bool is_spm(const tok_vocab *v) { return tok_vocab_model(v) == TOK_MODEL_SPM; }

// Strict UTF-8 validity (no overlongs, surrogates or code points past U+10FFFF).
static bool valid_utf8(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t k;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      k = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      k = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      k = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + k >= n) return false;
    for (size_t j = 1; j <= k; j++) {
      if ((u[i + j] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (u[i + j] & 0x3F);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += k + 1;
  }
  return true;
}

// Whether decode(encode(s)) must give s back: valid UTF-8, no escaped-space
// character in SPM text, and no special token cut out of it.
static bool round_trips(const tok_vocab *v, const char *s, size_t n, const int32_t *ids, int64_t n_ids) {
  if (!valid_utf8(s, n)) return false;
  if (is_spm(v) && memmem(s, n, "\xe2\x96\x81", 3)) return false;
  for (int64_t i = 0; i < n_ids; i++) {
    tok_token_type t = tok_token_type_of(v, ids[i]);
    if (t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN) return false;
  }
  return true;
}

static unsigned round_trip_flags(const tok_vocab *v) { return is_spm(v) ? TOK_DECODE_STRIP_SPACE : 0; }

static void check_round_trip(const tok_vocab *v, const char *what, const char *s, size_t n, const int32_t *ids,
                             int64_t n_ids) {
  char *out = NULL;
  size_t out_n = 0;
  assert_int_equal(tok_decode(v, ids, n_ids, round_trip_flags(v), &out, &out_n), MOLE_OK);
  if (out_n != n || memcmp(out, s, n)) fail_msg("%s: round trip of '%.*s' gave '%s'", what, (int)n, s, out);
  mole_free(out);
}

// ---- llama.cpp's vectors --------------------------------------------------------------

// Every vector of one vocabulary (llama.cpp's test-tokenizer-0 format: texts split by
// "\n__ggml_vocab_test__\n" in .inp, one line of ids each in .out): mole's ids equal
// the expected ones and decode back to the text. Returns how many vectors ran.
static int check_vectors(const char *name, vocab_h h, const char *inp_rel, const char *out_rel) {
  size_t inp_n = 0, out_n = 0;
  char *inp = tu_read_file(tu_path(inp_rel), &inp_n);
  char *outp = tu_read_file(tu_path(out_rel), &out_n);
  if (!inp || !outp) fail_msg("%s: cannot read %s or %s", name, inp_rel, out_rel);
  static const char sep[] = "\n__ggml_vocab_test__\n";
  const size_t sep_n = sizeof sep - 1;
  const char *s = inp, *end = inp + inp_n, *line = outp, *out_end = outp + out_n;
  int idx = 0;
  while (s < end) {
    const char *e = memmem(s, (size_t)(end - s), sep, sep_n);
    if (!e) e = end;
    const char *le = memchr(line, '\n', (size_t)(out_end - line));
    if (!le) le = out_end;
    assert_true(line < out_end || le == out_end);
    // expected ids of this line
    int32_t want[4096];
    int64_t n_want = 0;
    for (const char *p = line; p < le;) {
      char *q;
      long x = strtol(p, &q, 10);
      if (q == p) {
        p++;
        continue;
      }
      assert_true(n_want < 4096);
      want[n_want++] = (int32_t)x;
      p = q;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    size_t sn = (size_t)(e - s);
    assert_int_equal(tok_encode(h.v, s, sn, false, false, &ids, &n), MOLE_OK);
    bool same = n == n_want && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
    if (!same) {
      char got[8192];
      int at = 0;
      for (int64_t i = 0; i < n && at < 8000; i++) at += snprintf(got + at, sizeof got - (size_t)at, " %d", ids[i]);
      got[at] = 0;
      fail_msg("%s: vector %d '%.*s':\n  want%.*s\n  got %s", name, idx, (int)sn, s, (int)(le - line), line, got);
    }
    // round trip (no vector holds a special token's text... except deepseek's
    // user-defined characters, which render as themselves)
    char *dec = NULL;
    size_t dec_n = 0;
    assert_int_equal(tok_decode(h.v, ids, n, round_trip_flags(h.v), &dec, &dec_n), MOLE_OK);
    if (dec_n != sn || memcmp(dec, s, sn)) fail_msg("%s: vector %d: round trip of '%.*s' gave '%s'", name, idx, (int)sn, s, dec);
    mole_free(dec);
    mole_free(ids);
    idx++;
    s = e + sep_n;
    line = le < out_end ? le + 1 : out_end;
  }
  free(inp);
  free(outp);
  return idx;
}

static void test_vectors(void **state) {
  (void)state;
  int64_t total = 0;
  for (int k = 0; k < N_VOCABS; k++) {
    vocab_h h = open_vocab(k_vocabs[k]);
    char inp[256], out[256];
    snprintf(inp, sizeof inp, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf.inp", k_vocabs[k]);
    snprintf(out, sizeof out, "tests/data/conformance/tokenizer/ggml-vocab-%s.gguf.out", k_vocabs[k]);
    const int n = check_vectors(k_vocabs[k], h, inp, out);
    assert_int_equal(n, 46);
    total += n;
    close_vocab(h);
  }
  assert_int_equal(total, 4 * 46);
}

// The trained evaluation model's own BPE (eval-model/): held-out lines and edge
// cases, the ids llama.cpp gives (which are also the trainer's, scripts/train/bpe.py).
static void test_eval_model_vectors(void **state) {
  (void)state;
  vocab_h h = {0};
  const char *rel = "eval-model/" EVAL_MODEL_FILE;
  if (gguf_open(tu_path(rel), &h.f) != MOLE_OK || tok_load(h.f, &h.v) != MOLE_OK) fail_msg("%s: %s", rel, mole_last_error());
  assert_string_equal(tok_pre_name(h.v), "gpt-2");
  assert_int_equal(check_vectors("eval-model", h, "eval-model/tokenizer.inp", "eval-model/tokenizer.out"), 210);
  close_vocab(h);
}

// ---- vocabulary facts, special tokens ------------------------------------------------------

static int64_t encode(const tok_vocab *v, const char *s, bool add_special, bool parse_special, int32_t *out,
                      int64_t cap) {
  int32_t *ids = NULL;
  int64_t n = 0;
  assert_int_equal(tok_encode(v, s, strlen(s), add_special, parse_special, &ids, &n), MOLE_OK);
  assert_non_null(ids);
  assert_true(n <= cap);
  memcpy(out, ids, (size_t)n * sizeof *ids);
  mole_free(ids);
  return n;
}

static bool contains(const int32_t *ids, int64_t n, int32_t id) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

static void test_vocab_facts(void **state) {
  (void)state;
  vocab_h h = open_vocab("llama-spm");
  assert_int_equal(tok_n_vocab(h.v), 32000);
  assert_int_equal(tok_bos(h.v), 1);
  assert_int_equal(tok_eos(h.v), 2);
  assert_int_equal(tok_unk(h.v), 0);
  assert_true(tok_add_bos(h.v));
  assert_false(tok_add_eos(h.v));
  assert_true(tok_is_eog(h.v, 2));
  assert_false(tok_is_eog(h.v, 1));
  assert_false(tok_is_eog(h.v, -1));
  assert_false(tok_is_eog(h.v, 32000));
  assert_string_equal(tok_pre_name(h.v), "spm");
  size_t l = 0;
  assert_string_equal(tok_text(h.v, 1, &l), "<s>");
  assert_int_equal(l, 3);
  assert_null(tok_text(h.v, 32000, NULL));
  assert_int_equal(tok_find(h.v, "<s>", 3), 1);
  assert_int_equal(tok_find(h.v, "\xe2\x96\x81Hello", 8), 15043);
  assert_int_equal(tok_find(h.v, "no such token at all", 20), -1);
  assert_int_equal(tok_token_type_of(h.v, 1), TOK_TYPE_CONTROL);
  assert_int_equal(tok_token_type_of(h.v, 3), TOK_TYPE_BYTE);
  int32_t ids[64];
  int64_t n = encode(h.v, "Hello world", true, false, ids, 64);  // BOS, then "▁Hello ▁world"
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 15043);
  assert_int_equal(ids[2], 3186);
  n = encode(h.v, "", true, false, ids, 64);  // as SentencePiece: "" -> [BOS]
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], 1);
  n = encode(h.v, "", false, false, ids, 64);
  assert_int_equal(n, 0);
  // pieces: escaped space, byte tokens, control tokens only when rendered
  char buf[16];
  assert_int_equal(tok_piece(h.v, 15043, buf, sizeof buf, false), 6);
  assert_memory_equal(buf, " Hello", 6);
  assert_int_equal(tok_piece(h.v, 3 + 0x0A, buf, sizeof buf, false), 1);  // <0x0A>
  assert_int_equal(buf[0], '\n');
  assert_int_equal(tok_piece(h.v, 1, buf, sizeof buf, false), 0);
  assert_int_equal(tok_piece(h.v, 1, buf, sizeof buf, true), 3);
  assert_int_equal(tok_piece(h.v, 15043, buf, 2, false), 6);  // too small: length still reported
  assert_int_equal(tok_piece(h.v, -1, buf, sizeof buf, false), -1);
  // decode: llama.cpp's rules for the leading space and BOS
  int32_t seq[] = {1, 15043, 3186, 2};
  char *text = NULL;
  size_t tn = 0;
  assert_int_equal(tok_decode(h.v, seq + 1, 2, TOK_DECODE_LLAMA, &text, &tn), MOLE_OK);
  assert_string_equal(text, "Hello world");
  mole_free(text);
  assert_int_equal(tok_decode(h.v, seq + 1, 2, 0, &text, &tn), MOLE_OK);
  assert_string_equal(text, " Hello world");
  mole_free(text);
  assert_int_equal(tok_decode(h.v, seq, 4, TOK_DECODE_LLAMA | TOK_DECODE_REMOVE_SPECIAL, &text, &tn), MOLE_OK);
  assert_string_equal(text, " Hello world");  // a removed BOS keeps the space; </s> renders as nothing
  mole_free(text);
  assert_int_equal(tok_decode(h.v, seq, 4, TOK_DECODE_RENDER_SPECIAL, &text, &tn), MOLE_OK);
  assert_string_equal(text, "<s> Hello world</s>");
  mole_free(text);
  int32_t bad[] = {5, 32000};
  assert_int_equal(tok_decode(h.v, bad, 2, 0, &text, &tn), MOLE_ERR_ARG);
  close_vocab(h);

  h = open_vocab("gpt-2");
  assert_int_equal(tok_bos(h.v), 50256);
  assert_int_equal(tok_eos(h.v), 50256);
  assert_int_equal(tok_eot(h.v), 50256);  // <|endoftext|>
  assert_true(tok_is_eog(h.v, 50256));
  assert_false(tok_add_bos(h.v));
  assert_string_equal(tok_pre_name(h.v), "gpt-2");
  n = encode(h.v, "Hello world", true, false, ids, 64);
  assert_int_equal(n, 2);
  assert_int_equal(ids[0], 15496);
  assert_int_equal(ids[1], 995);
  assert_int_equal(tok_piece(h.v, 995, buf, sizeof buf, false), 6);  // "Ġworld"
  assert_memory_equal(buf, " world", 6);
  // clean-up of spaces before punctuation, as llama.cpp's detokenizer
  n = encode(h.v, "Hello , world . It 's", false, false, ids, 64);
  assert_int_equal(tok_decode(h.v, ids, n, TOK_DECODE_LLAMA, &text, &tn), MOLE_OK);
  assert_string_equal(text, "Hello, world. It's");
  mole_free(text);
  assert_int_equal(tok_decode(h.v, ids, n, 0, &text, &tn), MOLE_OK);
  assert_string_equal(text, "Hello , world . It 's");
  mole_free(text);
  close_vocab(h);

  h = open_vocab("deepseek-coder");
  assert_string_equal(tok_pre_name(h.v), "deepseek-coder");
  assert_true(tok_add_bos(h.v));
  assert_int_equal(tok_bos(h.v), 32013);
  assert_true(tok_is_eog(h.v, 32014));  // <｜end▁of▁sentence｜>
  assert_int_equal(tok_eot(h.v), 32014);
  assert_false(tok_is_eog(h.v, 32021));  // <|EOT|> is no name llama.cpp knows
  close_vocab(h);
}

static void test_special_tokens(void **state) {
  (void)state;
  int32_t ids[256];
  // phi-3: <|user|> (32010) and <|end|> (32007) are control tokens
  vocab_h h = open_vocab("phi-3");
  assert_true(tok_is_eog(h.v, 32007));  // <|end|>
  assert_true(tok_is_eog(h.v, 32000));  // <|endoftext|>
  assert_int_equal(tok_eot(h.v), 32007);  // <|end|> comes before <|endoftext|> in llama.cpp's list
  const char *chat = "<|user|>\nHi<|end|>\n<|assistant|>";
  int64_t n = encode(h.v, chat, true, true, ids, 256);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 32010);
  assert_true(contains(ids, n, 32007));
  assert_int_equal(ids[n - 1], 32001);
  // phi-3's special tokens strip the whitespace after them (llama.cpp's rstrip), so
  // "\n" after <|user|> is gone and "Hi" gets the space prefix: ▁Hi
  assert_int_equal(ids[2], tok_find(h.v, "\xe2\x96\x81Hi", 5));
  n = encode(h.v, chat, false, false, ids, 256);
  assert_false(contains(ids, n, 32010));
  assert_false(contains(ids, n, 32007));
  char *text = NULL;
  size_t tn = 0;
  assert_int_equal(tok_decode(h.v, ids, n, TOK_DECODE_STRIP_SPACE, &text, &tn), MOLE_OK);
  assert_string_equal(text, chat);  // as text, it round-trips
  mole_free(text);
  // </s> is USER_DEFINED in phi-3, but llama.cpp's EOG names make it CONTROL too:
  // parsed only with parse_special
  n = encode(h.v, "a</s>b", false, false, ids, 256);
  assert_false(contains(ids, n, 2));
  n = encode(h.v, "a</s>b", false, true, ids, 256);
  assert_true(contains(ids, n, 2));
  assert_true(tok_is_eog(h.v, 2));
  close_vocab(h);

  // gpt-2: <|endoftext|> only with parse_special
  h = open_vocab("gpt-2");
  n = encode(h.v, "<|endoftext|>", false, true, ids, 256);
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], 50256);
  n = encode(h.v, "<|endoftext|>", false, false, ids, 256);
  assert_true(n > 1);
  assert_false(contains(ids, n, 50256));
  n = encode(h.v, "a<|endoftext|><|endoftext|>b", false, true, ids, 256);
  assert_int_equal(n, 4);
  assert_int_equal(ids[1], 50256);
  assert_int_equal(ids[2], 50256);
  assert_int_equal(tok_decode(h.v, ids, n, TOK_DECODE_RENDER_SPECIAL, &text, &tn), MOLE_OK);
  assert_string_equal(text, "a<|endoftext|><|endoftext|>b");
  mole_free(text);
  assert_int_equal(tok_decode(h.v, ids, n, 0, &text, &tn), MOLE_OK);
  assert_string_equal(text, "ab");
  mole_free(text);
  close_vocab(h);

  // deepseek-coder: added single characters (USER_DEFINED) are always cut out
  h = open_vocab("deepseek-coder");
  n = encode(h.v, "x\xc3\xb5y", false, false, ids, 256);  // "xõy"
  assert_int_equal(n, 3);
  assert_int_equal(ids[1], 32000);
  n = encode(h.v, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", true, true, ids, 256);
  assert_int_equal(n, 2);  // BOS + the same token parsed
  assert_int_equal(ids[0], 32013);
  assert_int_equal(ids[1], 32013);
  close_vocab(h);
}

// ---- every pre-tokenizer ------------------------------------------------------------------

// Writes gpt-2's vocabulary with tokenizer.ggml.pre = pre into path.
static void write_with_pre(const gguf_file *src, const char *pre, const char *path) {
  gguf_writer *w = NULL;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  for (int64_t i = 0; i < gguf_n_kv(src); i++)
    if (strcmp(gguf_kv_key(src, i), "tokenizer.ggml.pre")) assert_int_equal(gguf_writer_copy_kv(w, src, i), MOLE_OK);
  if (pre) assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
}

static void fuzz_one(const tok_vocab *v, const char *what, uint64_t *rng, int iters);

static void test_pre_tokenizers(void **state) {
  (void)state;
  static const char *const pres[] = {
      "default", "gpt-2", "mpt", "olmo", "llama3", "llama-bpe", "dbrx", "smaug-bpe", "qwen2", "qwen35",
      "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "refact", "command-r", "gpt-4o",
      "tekken", "poro-chat", "viking", "chameleon", "bailingmoe", "seed-coder", "laguna", "minicpm5",
      "glm4", "hunyuan", "stablelm2", "megrez", "bloom", "llama4", "no-such-pre", NULL};
  static const char *const canon[] = {
      "default", "gpt-2", "gpt-2", "gpt-2", "llama3", "llama3", "dbrx", "dbrx", "qwen2", "qwen35",
      "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "starcoder", "command-r", "gpt-4o",
      "tekken", "poro-chat", "viking", "chameleon", "bailingmoe", "seed-coder", "laguna", "minicpm5",
      "glm4", "qwen2", "megrez", "megrez", "bloom", "gpt-4o", "gpt-2"};
  vocab_h g = open_vocab("gpt-2");
  char path[] = "/tmp/mole-test-tok-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  uint64_t rng = 7;
  const char *sample = "Hello, y'all! How're you 😁 ?我想在apple工作1314151天～ 3.14159  \n\n\tdone~~";
  for (int k = 0; pres[k] || k == 0; k++) {
    const char *pre = pres[k];
    write_with_pre(g.f, pre, path);
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    assert_int_equal(gguf_open(path, &f), MOLE_OK);
    if (tok_load(f, &v) != MOLE_OK) fail_msg("pre %s: %s", pre, mole_last_error());
    assert_string_equal(tok_pre_name(v), canon[k]);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(tok_encode(v, sample, strlen(sample), false, false, &ids, &n), MOLE_OK);
    assert_true(n > 10);
    check_round_trip(v, pre, sample, strlen(sample), ids, n);
    mole_free(ids);
    fuzz_one(v, pre, &rng, tu_asan() ? 40 : 150);
    tok_free(v);
    gguf_close(f);
  }
  // no tokenizer.ggml.pre at all: llama.cpp's 'default'
  write_with_pre(g.f, NULL, path);
  gguf_file *f = NULL;
  tok_vocab *v = NULL;
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(tok_load(f, &v), MOLE_OK);
  assert_string_equal(tok_pre_name(v), "default");
  tok_free(v);
  gguf_close(f);
  unlink(path);
  close_vocab(g);
}

// llama.cpp's ids (llama_tokenize, no BOS, no special parsing) for these texts under
// gpt-2's vocabulary with tokenizer.ggml.pre set to each name: recorded with
// llama.cpp (github.com/unslothai/llama.cpp at d32676d, built from source).
static const char *const k_pre_texts[] = {
    "Hello, y'all! How're you \360\237\230\201 ?\346\210\221\346\203\263\345\234\250apple\345\267\245\344\275\2341314151\345\244\251\357\275\236 3.14159  \n\n\tdone~~",
    "\343\200\200x\302\240y\302\205z \341\240\216 w\342\200\250 ~a ~~ ",
    "IT'S 'RE 12345678 \331\241\331\242\331\243 \302\262  \302\277Qu\303\251?  \r\n\r\n  ",
    "ab\377\300\200cd\355\240\200 e",
    "\303\234n\303\257c\303\266d\303\251 \303\200\303\211\303\216 na\303\257ve  \316\223\316\225\316\231\316\221 \317\203\316\277\317\205 \320\234\320\270\321\200 \344\270\255\346\226\207 \355\225\234\352\265\255\354\226\264 \343\201\253\343\201\273\343\202\223\343\201\224",
};
static const struct {
  const char *pre;
  int text;
  const char *ids;
} k_pre_vectors[] = {
    {"default", 0, "15496 11 331 6 439 0 1374 6 260 345 30325 223 220 30 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 220 18 13 23756 3270 220 220 628 197 28060 4907"},
    {"default", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 220 93 64 220 4907 220"},
    {"default", 2, "2043 6 50 220 6 2200 220 10163 29228 3695 220 149 94 149 95 149 96 220 31185 220 220 126 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"default", 3, "397 4210 188 10210 169 254 222 304"},
    {"default", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"llama3", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 220 18 13 23756 3270 220 220 628 197 28060 4907"},
    {"llama3", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"llama3", 2, "2043 6 50 705 2200 220 10163 29228 3695 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"llama3", 3, "397 4210 188 10210 169 254 222 304"},
    {"llama3", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"qwen2", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"qwen2", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"qwen2", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"qwen2", 3, "397 4210 188 10210 169 254 222 304"},
    {"qwen2", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"qwen35", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"qwen35", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"qwen35", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"qwen35", 3, "397 4210 188 10210 169 254 222 304"},
    {"qwen35", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"deepseek-llm", 0, "15496 11 331 6 439 0 1374 6 260 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 1485 1415 24309 25465 171 121 252 220 18 13 1415 19707 220 220 198 198 197 28060 4907"},
    {"deepseek-llm", 1, "5099 222 87 1849 88 126 227 89 220 157 254 236 266 447 101 5299 64 220 4907 220"},
    {"deepseek-llm", 2, "2043 6 50 705 2200 220 10163 2231 30924 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"deepseek-llm", 3, "397 4210 188 10210 169 254 222 304"},
    {"deepseek-llm", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 12385 26884 303 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 220 28618 2515 119 22174 2515 242"},
    {"deepseek-coder", 0, "15496 11 331 6 439 0 1374 6 260 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 198 198 197 28060 4907"},
    {"deepseek-coder", 1, "5099 222 87 1849 88 126 227 89 220 157 254 236 266 447 101 5299 64 220 4907 220"},
    {"deepseek-coder", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"deepseek-coder", 3, "397 4210 188 10210 169 254 222 304"},
    {"deepseek-coder", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 220 28618 2515 119 22174 2515 242"},
    {"deepseek-v3", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 220 18 13 23756 3270 220 220 628 197 28060 4907"},
    {"deepseek-v3", 1, "5099 222 87 1849 88 126 227 89 220 157 254 236 266 447 101 220 93 64 220 4907 220"},
    {"deepseek-v3", 2, "2043 6 50 705 2200 220 10163 29228 3695 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"deepseek-v3", 3, "397 4210 188 10210 169 254 222 304"},
    {"deepseek-v3", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 220 28618 2515 119 22174 2515 242"},
    {"falcon", 0, "15496 11 331 6 439 0 1374 6 260 345 30325 223 220 30 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 513 13 23756 3270 220 220 628 197 28060 4907"},
    {"falcon", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 220 93 64 220 4907 220"},
    {"falcon", 2, "2043 6 50 220 6 2200 220 10163 29228 3695 18923 94 149 95 149 96 1587 110 220 220 126 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"falcon", 3, "397 4210 188 10210 169 254 222 304"},
    {"falcon", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"starcoder", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"starcoder", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"starcoder", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"starcoder", 3, "397 4210 188 10210 169 254 222 304"},
    {"starcoder", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"gpt-4o", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 220 18 13 23756 3270 220 220 628 197 28060 4907"},
    {"gpt-4o", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"gpt-4o", 2, "2043 6 50 705 2200 220 10163 29228 3695 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"gpt-4o", 3, "397 4210 188 10210 169 254 222 304"},
    {"gpt-4o", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"tekken", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"tekken", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"tekken", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"tekken", 3, "397 4210 188 10210 169 254 222 304"},
    {"tekken", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"chameleon", 0, "15496 11 331 6 439 0 1374 6 260 345 30325 223 220 30 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 198 198 197 28060 93 93"},
    {"chameleon", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 220 93 64 220 93 93 220"},
    {"chameleon", 2, "2043 6 50 220 6 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 220 126 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"chameleon", 3, "397 4210 188 10210 169 254 222 304"},
    {"chameleon", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 220 138 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"poro-chat", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 1485 1415 24309 25465 171 121 252 513 13 1415 19707 220 220 628 197 28060 4907"},
    {"poro-chat", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"poro-chat", 2, "2043 6 50 705 2200 17031 2231 30924 18923 94 149 95 149 96 1587 110 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"poro-chat", 3, "397 4210 188 10210 169 254 222 304"},
    {"poro-chat", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"bailingmoe", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"bailingmoe", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"bailingmoe", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"bailingmoe", 3, "397 4210 188 10210 169 254 222 304"},
    {"bailingmoe", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"seed-coder", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 16 18 16 19 16 20 16 25465 171 121 252 220 18 13 16 19 16 20 24 220 220 628 197 28060 4907"},
    {"seed-coder", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"seed-coder", 2, "2043 6 50 705 2200 220 16 17 18 19 20 21 22 23 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"seed-coder", 3, "397 4210 188 10210 169 254 222 304"},
    {"seed-coder", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
    {"minicpm5", 0, "15496 11 331 6 439 0 1374 821 345 30325 223 5633 22755 239 46349 111 28839 101 18040 32432 98 43291 22042 35038 16 25465 171 121 252 220 18 13 23756 3270 220 220 628 197 28060 4907"},
    {"minicpm5", 1, "5099 222 87 1849 88 126 227 89 28053 254 236 266 447 101 5299 64 220 4907 220"},
    {"minicpm5", 2, "2043 6 50 705 2200 220 10163 29228 3695 220 149 94 149 95 149 96 220 31185 220 1587 123 4507 2634 30 220 220 201 198 201 198 220 220"},
    {"minicpm5", 3, "397 4210 188 10210 169 254 222 304"},
    {"minicpm5", 4, "127 250 77 26884 66 9101 67 2634 6184 222 38351 127 236 41492 220 7377 241 138 243 138 247 138 239 18074 225 26517 139 227 12466 250 18849 21169 220 40792 23877 229 220 47991 250 166 113 255 168 244 112 23294 104 2515 119 22174 2515 242"},
};

static void test_pre_vectors(void **state) {
  (void)state;
  vocab_h g = open_vocab("gpt-2");
  char path[] = "/tmp/mole-test-tok-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  const char *loaded = NULL;
  gguf_file *f = NULL;
  tok_vocab *v = NULL;
  for (size_t k = 0; k < sizeof k_pre_vectors / sizeof k_pre_vectors[0]; k++) {
    if (!loaded || strcmp(loaded, k_pre_vectors[k].pre)) {
      tok_free(v);
      gguf_close(f);
      write_with_pre(g.f, k_pre_vectors[k].pre, path);
      assert_int_equal(gguf_open(path, &f), MOLE_OK);
      assert_int_equal(tok_load(f, &v), MOLE_OK);
      loaded = k_pre_vectors[k].pre;
    }
    const char *text = k_pre_texts[k_pre_vectors[k].text];
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(tok_encode(v, text, strlen(text), false, false, &ids, &n), MOLE_OK);
    char got[4096];
    size_t at = 0;
    for (int64_t i = 0; i < n && at < sizeof got - 16; i++) at += (size_t)snprintf(got + at, sizeof got - at, i ? " %d" : "%d", ids[i]);
    got[at] = 0;
    if (strcmp(got, k_pre_vectors[k].ids))
      fail_msg("pre %s, text %d:\n  want %s\n  got  %s", loaded, k_pre_vectors[k].text, k_pre_vectors[k].ids, got);
    mole_free(ids);
  }
  tok_free(v);
  gguf_close(f);
  unlink(path);
  close_vocab(g);
}

// The gpt-2 split by hand for the pre-tokenizers whose rules differ visibly.
static void test_pre_splits(void **state) {
  (void)state;
  vocab_h g = open_vocab("gpt-2");
  char path[] = "/tmp/mole-test-tok-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  static const struct {
    const char *pre, *text, *pieces;  // pieces: the tokens' pieces, '|'-separated
  } cases[] = {
      // llama3: digits in groups of three, a leading non-letter joins the word
      {"llama3", "12345", "123|45"},
      {"qwen2", "12345", "1|2|3|4|5"},
      {"gpt-2", "12345", "123|45"},  // gpt-2 has "123" and "45" tokens and merges them so
      {"starcoder", "12345", "1|2|3|4|5"},
      {"gpt-2", "don't", "don|'t"},
      {"deepseek-llm", "don't", "don|'|t"},
      {"deepseek-coder", "don't 42", "don|'|t| |4|2"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    write_with_pre(g.f, cases[k].pre, path);
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    assert_int_equal(gguf_open(path, &f), MOLE_OK);
    assert_int_equal(tok_load(f, &v), MOLE_OK);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(tok_encode(v, cases[k].text, strlen(cases[k].text), false, false, &ids, &n), MOLE_OK);
    char got[256] = {0};
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
      if (i) got[at++] = '|';
      int64_t pn = tok_piece(v, ids[i], got + at, sizeof got - at - 1, false);
      at += (size_t)pn;
    }
    got[at] = 0;
    if (strcmp(got, cases[k].pieces)) fail_msg("pre %s, '%s': got '%s', want '%s'", cases[k].pre, cases[k].text, got, cases[k].pieces);
    mole_free(ids);
    tok_free(v);
    gguf_close(f);
  }
  unlink(path);
  close_vocab(g);
}

// ---- random and pathological input ------------------------------------------------------------

static size_t random_text(uint64_t *rng, char *buf, size_t cap) {
  size_t n = (size_t)(tu_rand_u64(rng) % 300);
  if (n > cap) n = cap;
  int kind = (int)(tu_rand_u64(rng) % 4);
  size_t i = 0;
  while (i < n) {
    uint64_t r = tu_rand_u64(rng);
    if (kind == 0) {  // raw bytes
      buf[i++] = (char)r;
    } else if (kind == 1) {  // ASCII with lots of spaces/newlines/punctuation
      static const char set[] = " \n\t\r  abcXYZ019'.,!?<>|~$`-_";
      buf[i++] = set[r % (sizeof set - 1)];
    } else {  // valid UTF-8 code points of every length (kind 3: mixed with stray bytes)
      uint32_t cp;
      switch (r % 4) {
        case 0: cp = (uint32_t)(r >> 8) % 0x80; break;
        case 1: cp = 0x80 + (uint32_t)(r >> 8) % 0x780; break;
        case 2: cp = 0x800 + (uint32_t)(r >> 8) % 0xF800; break;
        default: cp = 0x10000 + (uint32_t)(r >> 8) % 0x100000; break;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x3000;
      if (kind == 3 && (r >> 40) % 16 == 0) cp = 0x110000;  // a stray byte instead
      char tmp[4];
      int k;
      if (cp == 0x110000) {
        tmp[0] = (char)(0x80 | (r >> 50));
        k = 1;
      } else if (cp < 0x80) {
        tmp[0] = (char)cp, k = 1;
      } else if (cp < 0x800) {
        tmp[0] = (char)(0xC0 | (cp >> 6)), tmp[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
      } else if (cp < 0x10000) {
        tmp[0] = (char)(0xE0 | (cp >> 12)), tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        tmp[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
      } else {
        tmp[0] = (char)(0xF0 | (cp >> 18)), tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), tmp[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
      }
      if (i + (size_t)k > n) break;
      memcpy(buf + i, tmp, (size_t)k);
      i += (size_t)k;
    }
  }
  return i;
}

static void fuzz_one(const tok_vocab *v, const char *what, uint64_t *rng, int iters) {
  char buf[512];
  for (int it = 0; it < iters; it++) {
    size_t n = random_text(rng, buf, sizeof buf);
    bool parse = (tu_rand_u64(rng) & 1) != 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    assert_int_equal(tok_encode(v, buf, n, parse, parse, &ids, &n_ids), MOLE_OK);
    for (int64_t i = 0; i < n_ids; i++) assert_true(ids[i] >= 0 && ids[i] < tok_n_vocab(v));
    if (!parse && round_trips(v, buf, n, ids, n_ids)) check_round_trip(v, what, buf, n, ids, n_ids);
    // decoding anything never fails
    char *out = NULL;
    size_t out_n = 0;
    assert_int_equal(tok_decode(v, ids, n_ids, TOK_DECODE_LLAMA | TOK_DECODE_RENDER_SPECIAL, &out, &out_n), MOLE_OK);
    mole_free(out);
    mole_free(ids);
  }
}

static void test_fuzz(void **state) {
  (void)state;
  uint64_t rng = 12345;
  for (int k = 0; k < N_VOCABS; k++) {
    vocab_h h = open_vocab(k_vocabs[k]);
    fuzz_one(h.v, k_vocabs[k], &rng, 2000);
    close_vocab(h);
  }
}

// Long inputs of every shape that could make a regex or a merge loop quadratic.
static void test_long_inputs(void **state) {
  (void)state;
  size_t n = tu_asan() || tu_emulated() ? 60000 : 400000;
  char *buf = malloc(n + 1);
  assert_non_null(buf);
  static const char *const units[] = {" ", "a", "7", "\n", "!", " a", "\xe4\xb8\x80", "\xe3\x80\x80", "\xff",
                                      "ab ", "A", "'s", "<|endoftext|>", "\t\n "};
  for (int k = 0; k < N_VOCABS; k++) {
    vocab_h h = open_vocab(k_vocabs[k]);
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
      size_t ul = strlen(units[u]), m = 0;
      while (m + ul <= n) {
        memcpy(buf + m, units[u], ul);
        m += ul;
      }
      int64_t t0 = mole_time_us();
      int32_t *ids = NULL;
      int64_t n_ids = 0;
      assert_int_equal(tok_encode(h.v, buf, m, true, true, &ids, &n_ids), MOLE_OK);
      int64_t dt = mole_time_us() - t0;
      if (dt > 20 * 1000 * 1000) fail_msg("%s: %zu bytes of '%s' took %lld ms", k_vocabs[k], m, units[u], (long long)(dt / 1000));
      if (round_trips(h.v, buf, m, ids, n_ids)) check_round_trip(h.v, k_vocabs[k], buf, m, ids, n_ids);
      mole_free(ids);
    }
    close_vocab(h);
  }
  free(buf);
}

static void test_load_errors(void **state) {
  (void)state;
  vocab_h g = open_vocab("gpt-2");
  char path[] = "/tmp/mole-test-tok-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  // an unsupported model
  gguf_writer *w = NULL;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "bert"), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  gguf_file *f = NULL;
  tok_vocab *v = NULL;
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(tok_load(f, &v), MOLE_ERR_UNSUPPORTED);
  assert_null(v);
  assert_non_null(strstr(mole_last_error(), "bert"));
  gguf_close(f);
  // gpt2 without merges
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  for (int64_t i = 0; i < gguf_n_kv(g.f); i++)
    if (strcmp(gguf_kv_key(g.f, i), "tokenizer.ggml.merges")) assert_int_equal(gguf_writer_copy_kv(w, g.f, i), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(tok_load(f, &v), MOLE_ERR_NOT_FOUND);
  assert_non_null(strstr(mole_last_error(), "tokenizer.ggml.merges"));
  gguf_close(f);
  // no vocabulary at all
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_str(w, "general.name", "x"), MOLE_OK);
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(tok_load(f, &v), MOLE_ERR_NOT_FOUND);
  gguf_close(f);
  unlink(path);
  close_vocab(g);
}

// tokenizer.ggml.model = gemma4 on a small hand-made vocabulary: spaces escaped
// to U+2581, merges on raw UTF-8, a newline run that is a token taken whole
// (a longer one merged), <0xNN> for a byte with no token, BOS added, and back.
static void test_gemma4_model(void **state) {
  (void)state;
  enum { N_BASE = 4, N_WORDS = 12 };
  static const char *const words[N_WORDS] = {"\xe2\x96\x81", "h",  "e",   "l",     "o",     "\n",
                                             "\n\n",        "he", "ll",  "llo",   "hello", "\xe2\x96\x81hello"};
  static const char *const merges[] = {"h e", "l l", "ll o", "he llo", "\xe2\x96\x81 hello", "\n \n"};
  const char *toks[N_BASE + 256 + N_WORDS];
  char bytes[256][8];
  int32_t types[N_BASE + 256 + N_WORDS];
  static const char *const base[N_BASE] = {"<pad>", "<eos>", "<bos>", "<unk>"};
  for (int i = 0; i < N_BASE; i++) toks[i] = base[i], types[i] = TOK_TYPE_CONTROL;
  for (int i = 0; i < 256; i++) {
    snprintf(bytes[i], sizeof bytes[i], "<0x%02X>", i);
    toks[N_BASE + i] = bytes[i], types[N_BASE + i] = TOK_TYPE_BYTE;
  }
  for (int i = 0; i < N_WORDS; i++) toks[N_BASE + 256 + i] = words[i], types[N_BASE + 256 + i] = TOK_TYPE_NORMAL;
  const int32_t W = N_BASE + 256;  // id of words[0]
  char path[] = "/tmp/mole_gemma4_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  gguf_writer *w = NULL;
  assert_int_equal(gguf_writer_new(&w), MOLE_OK);
  assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4"), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, N_BASE + 256 + N_WORDS), MOLE_OK);
  assert_int_equal(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, N_BASE + 256 + N_WORDS),
                   MOLE_OK);
  assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 6), MOLE_OK);
  assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2), MOLE_OK);
  assert_int_equal(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false), MOLE_OK);  // overridden
  assert_int_equal(gguf_writer_begin(w, path), MOLE_OK);
  assert_int_equal(gguf_writer_finish(w), MOLE_OK);
  gguf_writer_free(w);
  gguf_file *f = NULL;
  tok_vocab *v = NULL;
  assert_int_equal(gguf_open(path, &f), MOLE_OK);
  assert_int_equal(tok_load(f, &v), MOLE_OK);
  assert_string_equal(tok_pre_name(v), "gemma4");
  assert_true(tok_add_bos(v));
  int32_t ids[64];
  // "hello hello\n\n\n\x01": BOS, hello, ▁hello, "\n\n"+"\n" (a run of three is no token: merged), <0x01>
  const char *s = "hello hello\n\n\n\x01";
  int64_t n = encode(v, s, true, false, ids, 64);
  const int32_t want[] = {2, W + 10, W + 11, W + 6, W + 5, N_BASE + 1};
  assert_int_equal(n, 6);
  assert_memory_equal(ids, want, sizeof want);
  n = encode(v, "\n\n", false, false, ids, 64);  // a newline run that is a token: whole
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], W + 6);
  char *text = NULL;
  size_t tn = 0;
  n = encode(v, s, false, false, ids, 64);
  assert_int_equal(tok_decode(v, ids, n, 0, &text, &tn), MOLE_OK);
  assert_int_equal(tn, strlen(s));
  assert_memory_equal(text, s, tn);
  mole_free(text);
  tok_free(v);
  gguf_close(f);
  unlink(path);
}

// Everything goes through mole_malloc (PCRE2 included) and comes back.
static void test_memory(void **state) {
  (void)state;
  size_t base = mole_mem_current();
  for (int k = 0; k < N_VOCABS; k++) {
    vocab_h h = open_vocab(k_vocabs[k]);
    int32_t *ids = NULL;
    int64_t n = 0;
    const char *s = "Hello <|endoftext|> world \xff\xfe 123";
    assert_int_equal(tok_encode(h.v, s, strlen(s), true, true, &ids, &n), MOLE_OK);
    char *text = NULL;
    size_t tn = 0;
    assert_int_equal(tok_decode(h.v, ids, n, TOK_DECODE_LLAMA, &text, &tn), MOLE_OK);
    mole_free(text);
    mole_free(ids);
    assert_int_equal(tok_encode(h.v, s, TOK_MAX_TEXT + 1, false, false, &ids, &n), MOLE_ERR_ARG);
    close_vocab(h);
  }
  assert_int_equal(mole_mem_current(), base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors), cmocka_unit_test(test_eval_model_vectors),        cmocka_unit_test(test_vocab_facts),
      cmocka_unit_test(test_special_tokens), cmocka_unit_test(test_pre_tokenizers),
      cmocka_unit_test(test_pre_vectors),    cmocka_unit_test(test_pre_splits),
      cmocka_unit_test(test_fuzz),
      cmocka_unit_test(test_long_inputs),    cmocka_unit_test(test_load_errors),
      cmocka_unit_test(test_memory),         cmocka_unit_test(test_gemma4_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
