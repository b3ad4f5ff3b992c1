// libFuzzer target: a whole model from a hostile GGUF file, through
// everything a user's file goes through before the first token: the
// tokenizer's vocabulary (tok_load on the parsed file, then encoding and
// decoding a short text with special tokens), then, from a file (the loader
// maps files), mole_model_load (architecture, hyperparameters, tensor names,
// shapes and types; the weights copied and repacked) and a forward pass of
// two tokens, then two more one at a time; then, for a MoE model, the same
// with the experts offloaded (a budget of half their bytes, read with pread:
// the tiered provider, its cache, the predictor and prefetch two layers
// ahead). Whatever is rejected must be rejected with an error, never a crash
// or a read outside the input (ASan). Seeds (scripts/fuzz.sh): tiny models of
// every architecture from mole synth, and a tiny GPT-2 BPE vocabulary.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "mole.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[64];

static void remove_file(void) { unlink(g_path); }

// The model in g_path loaded with mp and run: two tokens, then two more one
// at a time. True when it loaded and has routed experts.
static bool run_model(const mole_model_params *mp) {
  mole_model *m = NULL;
  if (mole_model_load(g_path, mp, &m) != MOLE_OK) {
    MOLE_ASSERT(m == NULL && mole_last_error()[0] != '\0');
    return false;
  }
  const int64_t V = mole_model_n_vocab(m);
  MOLE_ASSERT(V > 0);
  mole_session_params sp = mole_session_default_params();
  sp.n_ctx = 8;
  mole_session *s = NULL;
  if (mole_session_new(m, &sp, &s) == MOLE_OK) {
    const int32_t toks[4] = {0, (int32_t)(V > 1 ? 1 : 0), (int32_t)(V - 1), 0};
    float *logits = malloc((size_t)V * sizeof *logits);
    bool ok = logits && mole_session_eval(s, toks, 2, logits, false) == MOLE_OK;
    for (int i = 2; i < 4 && ok; i++) ok = mole_session_eval(s, toks + i, 1, logits, false) == MOLE_OK;
    free(logits);
    mole_session_free(s);
  }
  const bool moe = m->hp.n_expert > 0;
  mole_model_free(m);
  return moe;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_path[0]) {
    snprintf(g_path, sizeof g_path, "/dev/shm/mole-fuzz-model-%d.gguf", (int)getpid());
    atexit(remove_file);
    mole_log_quiet();
  }
  gguf_file *g = NULL;
  if (gguf_open_buffer(data, size, "fuzz.gguf", &g) != MOLE_OK) return 0;  // fuzz_gguf covers the parser
  tok_vocab *voc = NULL;
  if (tok_load(g, &voc) == MOLE_OK) {
    int32_t *ids = NULL;
    int64_t n = 0;
    static const char text[] = "Hello, wor\xc3\xa9ld  12 <s></s><|endoftext|>\xff";
    if (tok_encode(voc, text, sizeof text - 1, true, true, &ids, &n) == MOLE_OK) {
      MOLE_ASSERT(ids && n >= 0);
      char *out = NULL;
      size_t len = 0;
      if (tok_decode(voc, ids, n, TOK_DECODE_LLAMA, &out, &len) == MOLE_OK) mole_free(out);
      mole_free(ids);
    }
    char piece[64];
    for (int32_t id = 0; id < 4; id++) (void)tok_piece(voc, id, piece, sizeof piece, true);
    tok_free(voc);
  }
  gguf_close(g);
  FILE *f = fopen(g_path, "wb");
  if (!f) return 0;
  const bool written = fwrite(data, 1, size, f) == size;
  if (fclose(f) != 0 || !written) return 0;
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = 1;
  const bool moe = run_model(&mp);
  if (moe) {
    mp.offload.expert_budget_frac = 0.5;
    mp.offload.io = "pread";
    mp.offload.prefetch_depth = 2;
    run_model(&mp);
  }
  return 0;
}
