// tokenizer: SentencePiece (SPM) and byte-level BPE tokenizers built from a
// GGUF vocabulary (`tokenizer.ggml.*`), producing the same ids as llama.cpp.
//
// Models:
//   tokenizer.ggml.model = "llama"  SentencePiece: score-ordered bigram merges
//                                   (a heap, O(n log n)), byte fallback <0xNN>,
//                                   spaces escaped to U+2581, a space prefixed to
//                                   the text (and after every special token) when
//                                   tokenizer.ggml.add_space_prefix (default true).
//   tokenizer.ggml.model = "gpt2"   byte-level BPE: pre-tokenizer regexes chosen by
//                                   tokenizer.ggml.pre (PCRE2, JIT-compiled at load),
//                                   GPT-2 byte-to-unicode map, merges by rank from
//                                   tokenizer.ggml.merges.
//   tokenizer.ggml.model = "gemma4" Gemma 4's BPE (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4):
//                                   spaces escaped to U+2581, the text split at runs of
//                                   newlines only, merges on raw UTF-8 (no byte map), a
//                                   newline run that is a token taken whole, <0xNN> tokens
//                                   for bytes; BOS always added. (Also a gpt2 vocabulary
//                                   with tokenizer.ggml.pre = gemma4.)
// Other models (bert, t5, rwkv, ...) fail to load with MOLE_ERR_UNSUPPORTED.
//
// Pre-tokenizers (tokenizer.ggml.pre), the names llama.cpp accepts:
//   default (also when the key is absent), gpt-2 (phi-2, mpt, olmo, jais, jina-*,
//   gigachat, a.x-4.0, mellum, modern-bert, exaone4, roberta-bpe, trillion,
//   granite-docling), llama3 (llama-bpe, llama-v3, falcon3, falcon-h1, pixtral,
//   midm-2.0, lfm2, jina-v5-nano, dbrx, smaug-bpe, glm4, chatglm-bpe), qwen2
//   (deepseek-r1-qwen, kormo, f2llmv2, megrez, stablelm2, hunyuan, grok-2,
//   solar-open), qwen35, deepseek-llm, deepseek-coder, deepseek-v3 (hunyuan-dense,
//   joyai-llm), falcon, starcoder (refact, command-r, smollm, codeshell, exaone,
//   minerva-7b, mellum2), gpt-4o (llama4, kanana2, talkie, minimax-m2), tekken,
//   poro-chat (bloom, gpt3-finnish), viking, chameleon, seed-coder, bailingmoe
//   (bailingmoe2, llada-moe), laguna, minicpm5, gemma4 (granite-embed-multi-311m).
//   An unknown name loads with the gpt-2 regex and a warning (llama.cpp refuses
//   such a file); kimi-k2, afmoe, superbpe, tiny_aya, youtu, exaone-moe, jais-2
//   and the like are unknown here.
//
// Where this differs from llama.cpp (all outside its test vectors):
//   - character classes come from PCRE2's Unicode tables rather than llama.cpp's
//     own (they differ only for characters new in recent Unicode versions);
//   - invalid UTF-8 becomes U+FFFD in BPE text, as in llama.cpp, and so do 4-byte
//     sequences above U+10FFFF (llama.cpp throws on those);
//   - an SPM byte with no <0xNN> token becomes the unknown token (llama.cpp throws).
//
// Special tokens (token types CONTROL=3, USER_DEFINED=4, UNKNOWN=2 of
// tokenizer.ggml.token_type) are cut out of the text before the model runs,
// longest first, as llama.cpp does: USER_DEFINED tokens always (they are part of
// the vocabulary's normal text, e.g. DeepSeek's added characters, Phi-3's </s>);
// CONTROL and UNKNOWN tokens only with parse_special. Without parse_special a
// control token's text is tokenized as plain text.
//
// A tok_vocab is immutable after tok_load; every function below may be called
// from several threads at once.
#ifndef MOLE_TOKENIZER_H
#define MOLE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "gguf/gguf.h"

typedef struct tok_vocab tok_vocab;

typedef enum { TOK_MODEL_SPM = 1, TOK_MODEL_BPE = 2 } tok_model;

// Token types as stored in tokenizer.ggml.token_type.
typedef enum {
  TOK_TYPE_UNDEFINED = 0,
  TOK_TYPE_NORMAL = 1,
  TOK_TYPE_UNKNOWN = 2,
  TOK_TYPE_CONTROL = 3,
  TOK_TYPE_USER_DEFINED = 4,
  TOK_TYPE_UNUSED = 5,
  TOK_TYPE_BYTE = 6,
} tok_token_type;

// Builds the tokenizer of f's vocabulary. Everything needed is copied: f may be
// closed afterwards. MOLE_ERR_NOT_FOUND (no tokenizer.ggml.model / tokens / merges),
// MOLE_ERR_FORMAT (keys of the wrong type or size), MOLE_ERR_UNSUPPORTED (a model
// other than llama/gpt2), MOLE_ERR_NOMEM. Messages name the file and key.
mole_status tok_load(const gguf_file *f, tok_vocab **out);
void tok_free(tok_vocab *v);

// Tokenizes text[0..len) (any bytes; NUL and invalid UTF-8 included).
// add_special: BOS first / EOS last per the vocabulary's add_bos / add_eos flags
// (tok_add_bos, tok_add_eos). parse_special: control tokens written in the text
// become their ids (see above). *ids gets a mole_malloc'd array (never NULL on
// success, free with mole_free) of *n ids. MOLE_ERR_ARG for len > TOK_MAX_TEXT,
// MOLE_ERR_NOMEM. Time: O(len log len), plus one pass over the text per distinct
// special token it holds; memory O(len).
#define TOK_MAX_TEXT ((size_t)1 << 29)
mole_status tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                       bool parse_special, int32_t **ids, int64_t *n);

// The bytes of one token, for streaming output: SPM U+2581 -> ' ', <0xNN> -> the
// byte; BPE: the inverse GPT-2 byte map; user-defined tokens: their text. Control
// and unknown tokens render as their text with render_special, else as nothing.
// Returns the piece's length in bytes (the bytes in buf are complete only when
// that is <= cap; nothing is written past cap), or -1 for an id out of range.
// A piece may be part of a UTF-8 character: concatenate before printing.
int64_t tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap, bool render_special);

enum {
  // Drop a leading BOS and a trailing EOS when the vocabulary adds them.
  TOK_DECODE_REMOVE_SPECIAL = 1u << 0,
  // Render control/unknown tokens as their text (else as nothing).
  TOK_DECODE_RENDER_SPECIAL = 1u << 1,
  // Remove the first token's leading space when the vocabulary prefixes one
  // (SPM's add_space_prefix), unless a BOS was removed: llama.cpp's rule.
  TOK_DECODE_STRIP_SPACE = 1u << 2,
  // Apply the vocabulary's clean-up (" ." -> ".", " 's" -> "'s", ...) when it asks
  // for one (most gpt2-style vocabularies), as llama.cpp does.
  TOK_DECODE_CLEAN_SPACES = 1u << 3,
  // What llama_detokenize does (with remove_special/unparse_special off).
  TOK_DECODE_LLAMA = TOK_DECODE_STRIP_SPACE | TOK_DECODE_CLEAN_SPACES,
};

// Text of ids[0..n): *text gets a NUL-terminated mole_malloc'd string (free with
// mole_free) of *len bytes (not counting the NUL; the text itself may hold NULs).
// flags: TOK_DECODE_*. decode(encode(s)) == s for every s in valid UTF-8 (BPE) /
// any bytes (SPM) with flags TOK_DECODE_STRIP_SPACE (SPM) or 0 (BPE), unless s
// holds special tokens. MOLE_ERR_ARG for an id out of range, MOLE_ERR_NOMEM.
mole_status tok_decode(const tok_vocab *v, const int32_t *ids, int64_t n, unsigned flags, char **text,
                       size_t *len);

// ---- vocabulary ------------------------------------------------------------
tok_model tok_vocab_model(const tok_vocab *v);
// The pre-tokenizer in use ("default", "llama3", ...; "spm" for SentencePiece).
const char *tok_pre_name(const tok_vocab *v);
int64_t tok_n_vocab(const tok_vocab *v);
// Special ids; -1 when the vocabulary has none.
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);  // end of turn: <|eot_id|>, <|im_end|>, <|end|>, ...
int32_t tok_unk(const tok_vocab *v);
int32_t tok_pad(const tok_vocab *v);
// Whether generation ends at id: EOS, EOT, EOM and the end-of-generation tokens
// llama.cpp recognises by text (<|im_end|>, <|endoftext|>, <|eot_id|>, <|end|>,
// <end_of_turn>, <|fim_pad|>, ...). False for ids out of range.
bool tok_is_eog(const tok_vocab *v, int32_t id);
// Whether tok_encode(add_special) adds BOS / EOS.
bool tok_add_bos(const tok_vocab *v);
bool tok_add_eos(const tok_vocab *v);
// Type of a token (after llama.cpp's fix-ups: EOG-looking tokens become CONTROL);
// TOK_TYPE_UNDEFINED out of range.
tok_token_type tok_token_type_of(const tok_vocab *v, int32_t id);
// The token's text as stored in the vocabulary (SPM "▁Hello", BPE "ĠHello"),
// NUL-terminated; *len (optional) gets its length. NULL out of range.
const char *tok_text(const tok_vocab *v, int32_t id, size_t *len);
// Id of the token whose stored text is text[0..len); -1 if none.
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

#endif
