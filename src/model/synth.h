// synth: random-weight models in the exact GGUF layout of each supported
// architecture (tensor names, shapes, metadata keys, tokenizer fields), for
// tests, the demo and benchmarks. llama.cpp loads them too.
#ifndef MOLE_SYNTH_H
#define MOLE_SYNTH_H

#include "base/base.h"
#include "quant/quant.h"

typedef struct synth_params {
  const char *arch;       // mixtral | llama | qwen3moe | olmoe | qwen2moe
  int64_t n_embd;         // 1024
  int64_t n_layer;        // 8
  int64_t n_head;         // 0 = n_embd / 128 (at least 1)
  int64_t n_head_kv;      // 0 = n_head / 4 (at least 1)
  int64_t n_expert;       // 8 (0 for llama)
  int64_t n_expert_used;  // 2
  int64_t n_ff;           // expert (or dense) FFN width, 3584
  int64_t n_ff_shexp;     // qwen2moe shared expert width, 0 = n_ff
  int64_t n_vocab;        // 32000 (ignored with vocab_from)
  int64_t n_ctx;          // 4096
  quant_type type;        // type of the weight matrices
  uint64_t seed;
  const char *vocab_from; // copy tokenizer.* keys from this GGUF (optional)
  int n_threads;          // 0 = all cores
} synth_params;

synth_params synth_default_params(void);
// Writes the model to path. *bytes gets the file size (optional).
mole_status synth_write(const synth_params *p, const char *path, uint64_t *bytes);

#endif
