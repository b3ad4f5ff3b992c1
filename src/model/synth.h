// synth: random-weight models in the exact GGUF layout of each supported
// architecture (tensor names, shapes, metadata keys, tokenizer fields), for
// tests, the demo and benchmarks. llama.cpp loads them too.
#ifndef MOLE_SYNTH_H
#define MOLE_SYNTH_H

#include "base/base.h"
#include "quant/quant.h"

// The public parameters (include/mole.h: arch, sizes, type, seed, vocab_from, threads).
typedef mole_synth_params synth_params;

synth_params synth_default_params(void);
// Writes the model to path. *bytes gets the file size (optional).
mole_status synth_write(const synth_params *p, const char *path, uint64_t *bytes);

#endif
