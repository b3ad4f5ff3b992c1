// engine/api: what the public API's files (api_*.c) share: the handle of an
// open GGUF file.
#ifndef MOLE_ENGINE_API_H
#define MOLE_ENGINE_API_H

#include "gguf/gguf.h"

struct mole_gguf {
  gguf_file *f;
};

#endif
