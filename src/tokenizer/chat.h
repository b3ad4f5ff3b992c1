// tokenizer/chat: chat templates without a Jinja engine.
//
// The GGUF key `tokenizer.chat_template` holds a Jinja template. Like
// llama.cpp's llm_chat_detect_template (src/llama-chat.cpp), we recognise the
// common families by distinguishing substrings and render them with fixed C
// code whose output is byte-for-byte what llama.cpp's
// llama_chat_apply_template produces for the same family (the exceptions are
// noted at `tulu` below).
//
// Families (canonical name = the name llama.cpp uses; aliases in brackets):
//   chatml [qwen2, qwen3]  <|im_start|>role\n...<|im_end|>\n  (Qwen1.5/2/2.5/3, Qwen-MoE)
//   llama2 [mistral]       [INST] sys\nuser [/INST]assistant</s>  (Mistral-7B-Instruct-v0.2,
//                          Mixtral-8x7B-Instruct's first template: no system role, the
//                          system text opens the first [INST])
//   llama2-sys             as llama2 with <<SYS>>\n...\n<</SYS>>\n\n
//   llama2-sys-bos         as llama2-sys with <s> before every later [INST]
//   llama2-sys-strip       as llama2-sys with every message trimmed
//   mistral-v1             " [INST] sys\n\nuser [/INST] assistant</s>"  (Mixtral-8x7B-Instruct
//                          v0.1's current template, with system prompt)
//   mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken: later Mistral formats
//   llama3                 <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>, trimmed
//   deepseek               deepseek-coder: ### Instruction:/### Response: ... <|EOT|>
//   deepseek2              deepseek-llm, DeepSeek-MoE, DeepSeek-V2: "User: ...\n\nAssistant: ..."
//   deepseek3              DeepSeek-V3/R1: <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
//                          (as in llama.cpp, the system text is followed by "\n\n"; the
//                          model's own template writes it bare)
//   zephyr                 <|role|>\n...<|endoftext|>\n (llama.cpp's zephyr, which ends every
//                          message with <|endoftext|>, as stablelm-2-zephyr does)
//   tulu [olmoe]           <|role|>\n...\n with <|endoftext|> after assistant messages only:
//                          OLMoE-1B-7B-Instruct / Tulu 2. llama.cpp has no such format (its
//                          detector sends these templates, and real zephyr ones, to glmedge);
//                          this renders what the model's own template renders with
//                          transformers' Jinja settings (trim_blocks, lstrip_blocks).
//
// BOS: no format writes a BOS at the start, as in llama.cpp. The templates of
// Mistral/Mixtral, Llama-3, DeepSeek and OLMoE open with {{ bos_token }};
// llama.cpp gets that BOS from tokenizing the prompt with the vocabulary's
// add_bos setting (tokenizer.ggml.add_bos_token), so tokenize the output with
// that setting and with special tokens parsed. ChatML (Qwen) uses no BOS.
// llama2-sys-bos writes "<s>" between turns because its template does.
#ifndef MOLE_TOKENIZER_CHAT_H
#define MOLE_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

typedef enum chat_tmpl {
  CHAT_TMPL_UNKNOWN = 0,
  CHAT_TMPL_CHATML,
  CHAT_TMPL_LLAMA2,
  CHAT_TMPL_LLAMA2_SYS,
  CHAT_TMPL_LLAMA2_SYS_BOS,
  CHAT_TMPL_LLAMA2_SYS_STRIP,
  CHAT_TMPL_MISTRAL_V1,
  CHAT_TMPL_MISTRAL_V3,
  CHAT_TMPL_MISTRAL_V3_TEKKEN,
  CHAT_TMPL_MISTRAL_V7,
  CHAT_TMPL_MISTRAL_V7_TEKKEN,
  CHAT_TMPL_LLAMA3,
  CHAT_TMPL_DEEPSEEK,
  CHAT_TMPL_DEEPSEEK2,
  CHAT_TMPL_DEEPSEEK3,
  CHAT_TMPL_ZEPHYR,
  CHAT_TMPL_TULU,
  CHAT_TMPL_COUNT
} chat_tmpl;

typedef struct chat_msg {
  const char *role;     // "system", "user" or "assistant"
  const char *content;  // UTF-8, NUL-terminated
} chat_msg;

// The family of a tokenizer.chat_template string (or of a bare family name,
// as llama.cpp accepts); CHAT_TMPL_UNKNOWN for NULL, for a template of a
// family not listed above, or for one not recognised. The caller then asks
// the user for --template NAME (see chat_template_list).
chat_tmpl chat_template_detect(const char *tmpl);

// A --template NAME: canonical names and aliases above; CHAT_TMPL_UNKNOWN if none.
chat_tmpl chat_template_from_name(const char *name);

// Canonical name; "unknown" for CHAT_TMPL_UNKNOWN or an out-of-range value.
const char *chat_template_name(chat_tmpl t);

// "chatml, llama2, ..." : the canonical names, for error messages and --help.
const char *chat_template_list(void);

// Renders msgs [n] in family `tmpl`; with add_assistant_prompt, opens the
// assistant turn after the last message (the families of the [INST] kind
// have nothing to add). *out is NUL-terminated, allocated with mole_malloc:
// free it with mole_free.
// MOLE_ERR_ARG: unknown family (the message names --template and the list),
// n < 0, a NULL role or content, or a role other than system/user/assistant
// (the message names the index and role). MOLE_ERR_NOMEM.
mole_status chat_format(chat_tmpl tmpl, const chat_msg *msgs, int64_t n, bool add_assistant_prompt,
                        char **out);

#endif
