// tokenizer internals shared by tokenizer.c (vocabulary, special tokens,
// decoding), tok_spm.c and tok_bpe.c. Not part of the API.
#ifndef MOLE_TOK_INTERNAL_H
#define MOLE_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

// Token attributes (llama.cpp's llama_token_attr bits, plus EOG).
enum {
  TOK_ATTR_UNKNOWN = 1u << 0,
  TOK_ATTR_UNUSED = 1u << 1,
  TOK_ATTR_NORMAL = 1u << 2,
  TOK_ATTR_CONTROL = 1u << 3,
  TOK_ATTR_USER_DEFINED = 1u << 4,
  TOK_ATTR_BYTE = 1u << 5,
  TOK_ATTR_LSTRIP = 1u << 7,
  TOK_ATTR_RSTRIP = 1u << 8,
  TOK_ATTR_EOG = 1u << 16,
};

enum { TOK_MAX_REGEX = 8 };

// Trie node over the special tokens' texts (first-child / next-sibling).
typedef struct tok_trie_node {
  int32_t child;    // first child, -1 if none
  int32_t sibling;  // next sibling, -1 if none
  int32_t special;  // index into vocab->special of the token ending here, -1 if none
  uint8_t byte;
} tok_trie_node;

typedef struct tok_bpe tok_bpe;  // tok_bpe.c

struct tok_vocab {
  tok_model model;
  int64_t n;          // tokens
  char *blob;         // every token's text, each NUL-terminated
  uint64_t *off;      // [n] offset of token i in blob
  uint32_t *len;      // [n] bytes of token i
  float *score;       // [n] SPM merge scores (0 when absent)
  uint32_t *attr;     // [n] TOK_ATTR_*
  int32_t *slots;     // [slot_mask + 1] open-addressing text -> id, -1 empty
  uint64_t slot_mask;
  uint32_t max_len;   // longest token text

  int32_t bos, eos, eot, eom, unk, sep, pad, mask;
  int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
  bool add_bos, add_eos, add_space_prefix, clean_spaces;
  bool esc_space;     // BPE as gemma4: spaces escaped to U+2581 before it, merges on raw UTF-8

  int32_t *special;   // [n_special] CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
  int64_t n_special;
  tok_trie_node *trie;  // [n_trie], node 0 is the root
  int64_t n_trie;

  int32_t byte_tok[256];  // SPM: <0xNN> (or the byte itself) token, -1 if none
  tok_bpe *bpe;           // BPE model (NULL for SPM)
  const char *pre_name;   // static string
};

// A growable id array (mole_realloc).
typedef struct tok_ids {
  int32_t *v;
  int64_t n, cap;
} tok_ids;

mole_status tok_ids_push(tok_ids *ids, int32_t id);

// Vocabulary lookups.
int32_t tok_map_find(const tok_vocab *v, const char *s, size_t len);
static inline const char *tok_str(const tok_vocab *v, int32_t id) { return v->blob + v->off[id]; }

// SPM: appends the tokens of text[0..len) (already escaped: ' ' -> U+2581).
mole_status tok_spm_encode(const tok_vocab *v, const char *text, size_t len, tok_ids *out);

// BPE: loads merges and the pre-tokenizer (f's tokenizer.ggml.pre, or pre when not
// NULL: the model implies it), or frees them. Sets pre_name, add_bos, clean_spaces, esc_space.
mole_status tok_bpe_load(tok_vocab *v, const gguf_file *f, const char *pre);
void tok_bpe_free(tok_bpe *b);
// Per-call scratch for tok_bpe_encode (PCRE2 match data, JIT stack, buffers).
typedef struct tok_bpe_ctx tok_bpe_ctx;
mole_status tok_bpe_ctx_new(const tok_vocab *v, tok_bpe_ctx **out);
void tok_bpe_ctx_free(tok_bpe_ctx *c);
// Appends the tokens of one raw text fragment.
mole_status tok_bpe_encode(const tok_vocab *v, tok_bpe_ctx *c, const char *text, size_t len,
                           tok_ids *out);
// BPE: the bytes of a NORMAL token's text (inverse byte map, or U+2581 -> ' '
// with esc_space), appended via put.
typedef struct tok_sink {
  char *buf;
  size_t cap;
  size_t n;  // bytes produced (may exceed cap)
} tok_sink;
static inline void tok_sink_put(tok_sink *s, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++, s->n++)
    if (s->n < s->cap) s->buf[s->n] = p[i];
}
void tok_bpe_decode_text(const tok_vocab *v, const char *text, size_t len, tok_sink *s);
// text[0..len) with U+2581 as ' ' (SPM, gemma4).
void tok_unescape_spaces(const char *text, size_t len, tok_sink *s);

// llama.cpp's lenient UTF-8 decoder: the code point at s[*i..n), advancing *i;
// invalid sequences give U+FFFD and advance by one byte.
uint32_t tok_utf8_next(const char *s, size_t n, size_t *i);
// UTF-8 bytes of cp (<= 0x10FFFF; surrogates encoded as 3 bytes) into out[4]; returns the count.
int tok_utf8_put(uint32_t cp, char *out);
// Length of the UTF-8 sequence started by lead byte c (llama.cpp's unicode_len_utf8).
static inline size_t tok_utf8_len(uint8_t c) {
  static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}

#endif
