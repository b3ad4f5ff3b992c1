// tokenizer/chat: chat templates without a Jinja engine.
//
// The GGUF key `tokenizer.chat_template` holds a Jinja template. Like
// llama.cpp's llm_chat_detect_template (src/llama-chat.cpp), we recognise the
// common families by distinguishing substrings and render them with fixed C
// code whose output is byte-for-byte what llama.cpp's
// llama_chat_apply_template produces for the same family. The families with
// reasoning that llama.cpp's built-in list lacks (gpt-oss, glm4.5/4.7,
// qwen3/3.5, gemma4; and tulu) render byte for byte what the model's own Jinja
// template renders (tests/test_chat_ref.c checks them against it).
//
// Families (canonical name = the name llama.cpp uses; aliases in brackets):
//   chatml [qwen2]         <|im_start|>role\n...<|im_end|>\n  (Qwen1.5/2/2.5, Qwen-MoE)
//   qwen3                  Qwen3 (Qwen3-30B-A3B, 235B-A22B, Qwen3-Next): ChatML as the model's
//                          template renders it: the reasoning of the turns after the last
//                          user query in <think>\n...\n</think>\n\n, an empty think block
//                          opening the answer with thinking off (the same as chatml otherwise)
//   qwen3.5                Qwen3.5: as qwen3, messages trimmed, every answer after the last
//                          query with its think block, the prompt ending inside <think>
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
//                          model's own template writes it bare); R1's <think> output is
//                          split by chat_parser
//   glm4.5 [glm4.6]        GLM-4.5/4.6: [gMASK]<sop><|system|>\n...<|user|>\n...<|assistant|>
//                          \n<think>...</think>\nanswer, as the model's template renders it
//                          (reasoning kept after the last user message only; /nothink and an
//                          empty <think></think> with thinking off)
//   glm4.7                 GLM-4.7: the same without the newlines; the prompt ends inside
//                          <think> (</think> with thinking off)
//   zephyr                 <|role|>\n...<|endoftext|>\n (llama.cpp's zephyr, which ends every
//                          message with <|endoftext|>, as stablelm-2-zephyr does)
//   gpt-oss [harmony]      OpenAI's harmony format (gpt-oss-20b/120b):
//                          <|start|>role<|message|>...<|end|>, assistant turns on channels (<|channel|>analysis / final /
//                          commentary), a system message with the reasoning effort and the
//                          knowledge cutoff and date lines, the first system or developer
//                          message as the developer's "# Instructions", tools as a TypeScript
//                          namespace, tool calls and results; byte for byte the model's own
//                          Jinja template (tests/data/chat/gpt-oss.jinja) as transformers and
//                          @huggingface/jinja render it. Its output is split into reasoning
//                          (analysis) and content (final) by chat_parser below.
//   gemma4                 Gemma 4: <|turn>role\n...<turn|>\n (assistant as model), as the
//                          model's template renders it; thinking (off by default) is the
//                          <|channel>thought\n...<channel|> part of the answer
//   tulu [olmoe]           <|role|>\n...\n with <|endoftext|> after assistant messages only:
//                          OLMoE-1B-7B-Instruct / Tulu 2. llama.cpp has no such format (its
//                          detector sends these templates, and real zephyr ones, to glmedge);
//                          this renders what the model's own template renders with
//                          transformers' Jinja settings (trim_blocks, lstrip_blocks).
//
// BOS: no format writes a BOS at the start, as in llama.cpp. The templates of
// Mistral/Mixtral, Llama-3, DeepSeek, Gemma and OLMoE open with {{ bos_token }};
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
  CHAT_TMPL_GPT_OSS,
  CHAT_TMPL_GLM45,
  CHAT_TMPL_GLM47,
  CHAT_TMPL_QWEN3,
  CHAT_TMPL_QWEN35,
  CHAT_TMPL_GEMMA4,
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

// ---- turns with reasoning and tools ---------------------------------------------

// A turn of a conversation in the OpenAI API's terms. Families other than
// gpt-oss render role and content only (and refuse developer and tool turns).
typedef struct chat_turn {
  const char *role;       // "system", "developer", "user", "assistant" or "tool"
  const char *content;    // NULL: none (an assistant turn that only calls a tool)
  const char *reasoning;  // assistant: its reasoning (gpt-oss: analysis channel); NULL: none
  const char *tool_name;  // assistant: the function it calls (one call per turn); NULL: no call
  const char *tool_args;  // the call's arguments, JSON text (an object); NULL: {}
} chat_turn;

typedef enum chat_thinking {
  CHAT_THINK_DEFAULT = 0,  // not given: the template's default (on, but off for Gemma 4)
  CHAT_THINK_ON,           // enable_thinking = true
  CHAT_THINK_OFF,          // enable_thinking = false
} chat_thinking;

typedef struct chat_options {
  const char *reasoning_effort;  // gpt-oss: "low", "medium" or "high"; NULL: medium
  const char *date;              // gpt-oss: the "Current date:" line (YYYY-MM-DD); NULL: today, local time
  const char *model_identity;    // gpt-oss: the system message's first line; NULL: the template's
  const char *tools;             // the API's "tools": a JSON array of {"type": "function", "function":
                                 // {"name", "description", "parameters"}}; NULL: none
  chat_thinking thinking;        // the template's enable_thinking (GLM, Qwen3, Gemma 4)
} chat_options;

// chat_format for turns (opt may be NULL: the defaults above). gpt-oss, as its
// template: the first turn, when system or developer, is the developer
// message; later system/developer turns are dropped; an assistant turn with a
// tool call keeps its reasoning (or, without one, its content) as an analysis
// message unless a later assistant turn answers without a call; a tool turn
// gives the result of the latest call. MOLE_ERR_ARG, naming the turn: a role
// other than those above, channel markers in an assistant's content or
// reasoning, a tool turn with no call before it, content and reasoning both in
// a turn with a tool call, a reasoning effort other than low/medium/high,
// tool_args or tools that are not the JSON described; for the other families
// a tool turn or a tool call, and a developer turn except for gemma4 (which
// takes it as system); for qwen3.5 a later system turn or no user turn (its
// template's rules). The reasoning of glm4.5/4.7, qwen3/3.5 and gemma4 turns
// renders as their templates show it; the llama.cpp formats ignore it. A
// NULL content is "" for gpt-oss, GLM, Qwen3 and Gemma, an error elsewhere.
mole_status chat_format_turns(chat_tmpl tmpl, const chat_turn *turns, int64_t n, bool add_assistant_prompt,
                              const chat_options *opt, char **out);

// ---- the model's output, split ------------------------------------------------------

// Whether the family's output carries reasoning that chat_parser separates:
// gpt-oss (harmony channels), <think>...</think> for deepseek3, glm4.5,
// glm4.7, qwen3, qwen3.5 and chatml (QwQ, and Qwen3 under that name), and
// <|channel>thought...<channel|> for gemma4.
bool chat_template_has_reasoning(chat_tmpl t);

typedef enum chat_part {
  CHAT_PART_CONTENT,    // the answer (gpt-oss: final channel, or commentary without a recipient)
  CHAT_PART_REASONING,  // gpt-oss: analysis channel
  CHAT_PART_TOOL_NAME,  // a tool call begins: the function's name (gpt-oss: to=functions.NAME), whole
  CHAT_PART_TOOL_ARGS,  // text of the current call's arguments
} chat_part;

typedef void (*chat_emit_fn)(void *ud, chat_part part, const char *text, size_t n);

// Splits generated text (special tokens rendered, as tok_piece renders
// gpt-oss's <|channel|>, <|message|>, <|start|>, <|end|>, <|constrain|>) into
// parts, incrementally: feed it the text in pieces of any size (a marker may
// be cut anywhere); text that could still be the start of a marker is held
// until the next feed or chat_parser_finish. It starts after the prompt's
// assistant header ("<|start|>assistant"). Malformed output never fails: a
// header that is not one (no channel, an unknown channel, text that cannot be
// a header, one longer than 256 bytes, the end of the output) goes to content
// as the raw text, markers included. Families without reasoning pass
// everything to content. Fixed size: feeding allocates nothing.
typedef struct chat_parser chat_parser;
mole_status chat_parser_new(chat_tmpl t, chat_parser **out);
void chat_parser_feed(chat_parser *p, const char *text, size_t n, chat_emit_fn emit, void *ud);
// The prompt ended inside the thinking (it ends with "<think>" or "<think>\n",
// as GLM-4.7's does): the output starts as reasoning. Call before feeding.
void chat_parser_in_thinking(chat_parser *p);
// Releases held text (to content, or to the part it belongs to) at the end of the output.
void chat_parser_finish(chat_parser *p, chat_emit_fn emit, void *ud);
void chat_parser_free(chat_parser *p);

#endif
