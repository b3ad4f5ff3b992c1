// tokenizer/chat internals shared by chat.c (families, detection, the
// llama.cpp formats), chat_harmony.c (gpt-oss) and chat_parse.c. Not part of
// the API.
#ifndef MOLE_TOKENIZER_CHAT_INTERNAL_H
#define MOLE_TOKENIZER_CHAT_INTERNAL_H

#include <cjson/cJSON.h>

#include "tokenizer/chat.h"

// A growing NUL-terminated string; oom is sticky (later puts do nothing).
typedef struct chat_buf {
  char *p;
  size_t len, cap;
  bool oom;
} chat_buf;

void chat_put_n(chat_buf *b, const char *s, size_t n);
void chat_put(chat_buf *b, const char *s);

// v as Jinja's tojson renders it (@huggingface/jinja and transformers agree):
// ", " and ": " separators, keys in their order, strings escaped as
// JSON.stringify does (non-ASCII kept), numbers as JavaScript prints them.
void chat_put_json(chat_buf *b, const cJSON *v);
// s[0..n) as a JSON string literal (tojson of a string).
void chat_put_json_str(chat_buf *b, const char *s, size_t n);

// gpt-oss (harmony): renders turns [n] as the model's Jinja template does.
mole_status chat_harmony_render(chat_buf *b, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt);

// GLM-4.5/4.6 (v47 false) or GLM-4.7: renders turns [n] (system, user, assistant) as their templates do.
mole_status chat_glm_render(chat_buf *b, bool v47, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt);

// Qwen3 (v35 false) or Qwen3.5: renders turns [n] (system, user, assistant) as their templates do.
mole_status chat_qwen_render(chat_buf *b, bool v35, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt);

// Gemma 4: renders turns [n] (system, developer, user, assistant) as its template does.
mole_status chat_gemma_render(chat_buf *b, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt);

#endif
