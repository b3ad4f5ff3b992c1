// tokenizer: the vocabulary (load, lookups, special tokens as llama.cpp's
// llama_vocab::impl::load sets them up), the special-token partition of the
// text, encode/decode dispatch. The models are in tok_spm.c and tok_bpe.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

// ---- UTF-8 ----------------------------------------------------------------------

uint32_t tok_utf8_next(const char *s, size_t n, size_t *i) {
  const uint8_t *u = (const uint8_t *)s;
  size_t o = *i;
  MOLE_ASSERT(o < n);
  uint8_t c = u[o];
  uint32_t cp;
  if (!(c & 0x80)) {
    *i = o + 1;
    return c;
  }
  if (!(c & 0x40)) goto bad;  // stray continuation byte
  if (!(c & 0x20)) {
    if (o + 1 >= n || (u[o + 1] & 0xC0) != 0x80) goto bad;
    *i = o + 2;
    return ((uint32_t)(c & 0x1F) << 6) | (u[o + 1] & 0x3F);
  }
  if (!(c & 0x10)) {
    if (o + 2 >= n || (u[o + 1] & 0xC0) != 0x80 || (u[o + 2] & 0xC0) != 0x80) goto bad;
    *i = o + 3;
    return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(u[o + 1] & 0x3F) << 6) | (u[o + 2] & 0x3F);
  }
  if (!(c & 0x08)) {
    if (o + 3 >= n || (u[o + 1] & 0xC0) != 0x80 || (u[o + 2] & 0xC0) != 0x80 || (u[o + 3] & 0xC0) != 0x80) goto bad;
    cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(u[o + 1] & 0x3F) << 12) | ((uint32_t)(u[o + 2] & 0x3F) << 6) |
         (u[o + 3] & 0x3F);
    if (cp > 0x10FFFF) goto bad;
    *i = o + 4;
    return cp;
  }
bad:
  *i = o + 1;
  return 0xFFFD;
}

int tok_utf8_put(uint32_t cp, char *out) {
  MOLE_ASSERT(cp <= 0x10FFFF);
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

mole_status tok_ids_push(tok_ids *ids, int32_t id) {
  if (ids->n == ids->cap) {
    int64_t cap = ids->cap ? ids->cap * 2 : 64;
    int32_t *nv = mole_realloc(ids->v, (size_t)cap * sizeof *nv);
    if (!nv) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%lld ids)", (long long)cap);
    ids->v = nv;
    ids->cap = cap;
  }
  ids->v[ids->n++] = id;
  return MOLE_OK;
}

// ---- text -> id map -----------------------------------------------------------

static uint64_t tok_hash(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

int32_t tok_map_find(const tok_vocab *v, const char *s, size_t len) {
  for (uint64_t i = tok_hash(s, len) & v->slot_mask;; i = (i + 1) & v->slot_mask) {
    int32_t id = v->slots[i];
    if (id < 0) return -1;
    if (v->len[id] == len && !memcmp(tok_str(v, id), s, len)) return id;
  }
}

static void tok_map_insert(tok_vocab *v, int32_t id) {
  const char *s = tok_str(v, id);
  size_t len = v->len[id];
  uint64_t i = tok_hash(s, len) & v->slot_mask;
  for (;; i = (i + 1) & v->slot_mask) {
    int32_t o = v->slots[i];
    if (o < 0) break;
    if (v->len[o] == len && !memcmp(tok_str(v, o), s, len)) break;  // duplicate text: the last id wins
  }
  v->slots[i] = id;
}

// ---- loading ----------------------------------------------------------------------

// Element j of integer array key i (any integer width); false if not an integer array.
static bool tok_arr_int(const gguf_file *f, int64_t i, uint64_t j, int64_t *out) {
  const uint8_t *d = gguf_kv_data(f, i);
  switch (gguf_kv_arr_type(f, i)) {
    case GGUF_T_INT8: *out = (int8_t)d[j]; return true;
    case GGUF_T_UINT8: *out = d[j]; return true;
    case GGUF_T_INT16: { int16_t x; memcpy(&x, d + 2 * j, 2); *out = x; return true; }
    case GGUF_T_UINT16: { uint16_t x; memcpy(&x, d + 2 * j, 2); *out = x; return true; }
    case GGUF_T_INT32: { int32_t x; memcpy(&x, d + 4 * j, 4); *out = x; return true; }
    case GGUF_T_UINT32: { uint32_t x; memcpy(&x, d + 4 * j, 4); *out = x; return true; }
    case GGUF_T_INT64: { int64_t x; memcpy(&x, d + 8 * j, 8); *out = x; return true; }
    case GGUF_T_UINT64: { uint64_t x; memcpy(&x, d + 8 * j, 8); *out = (int64_t)x; return true; }
    default: return false;
  }
}

// Array key `key` with at least n elements: its index, or -1 when absent.
static mole_status tok_find_array(const gguf_file *f, const char *key, int64_t n, int64_t *idx) {
  *idx = gguf_find_kv(f, key);
  if (*idx < 0) return MOLE_OK;
  if (gguf_kv_type(f, *idx) != GGUF_T_ARRAY)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s: not an array", gguf_path(f), key);
  if (gguf_kv_arr_n(f, *idx) < (uint64_t)n)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: %s: %llu elements for %lld tokens", gguf_path(f), key,
                       (unsigned long long)gguf_kv_arr_n(f, *idx), (long long)n);
  return MOLE_OK;
}

static mole_status tok_load_tokens(tok_vocab *v, const gguf_file *f) {
  const char *fname = gguf_path(f);
  int64_t ki = gguf_find_kv(f, "tokenizer.ggml.tokens");
  if (ki < 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: tokenizer.ggml.tokens: missing", fname);
  if (gguf_kv_type(f, ki) != GGUF_T_ARRAY || gguf_kv_arr_type(f, ki) != GGUF_T_STRING)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.tokens: not an array of strings", fname);
  uint64_t n = gguf_kv_arr_n(f, ki);
  if (n == 0 || n > (uint64_t)INT32_MAX - 1)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.tokens: %llu tokens", fname, (unsigned long long)n);
  v->n = (int64_t)n;
  size_t total = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t l = 0;
    gguf_kv_str(f, ki, i, &l);
    total += (l ? (size_t)l : 24) + 1;
  }
  uint64_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  v->blob = mole_malloc(total);
  v->off = mole_malloc(n * sizeof *v->off);
  v->len = mole_malloc(n * sizeof *v->len);
  v->score = mole_calloc(n, sizeof *v->score);
  v->attr = mole_malloc(n * sizeof *v->attr);
  v->slots = mole_malloc(slots * sizeof *v->slots);
  if (!v->blob || !v->off || !v->len || !v->score || !v->attr || !v->slots)
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for %llu tokens", fname, (unsigned long long)n);
  memset(v->slots, 0xff, slots * sizeof *v->slots);
  v->slot_mask = slots - 1;

  int64_t si, ti;
  mole_status st = tok_find_array(f, "tokenizer.ggml.scores", v->n, &si);
  if (st == MOLE_OK) st = tok_find_array(f, "tokenizer.ggml.token_type", v->n, &ti);
  if (st != MOLE_OK) return st;
  if (si >= 0 && gguf_kv_arr_type(f, si) != GGUF_T_FLOAT32 && gguf_kv_arr_type(f, si) != GGUF_T_FLOAT64)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.scores: not an array of floats", fname);
  int64_t dummy;
  if (ti >= 0 && !tok_arr_int(f, ti, 0, &dummy))
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.token_type: not an array of integers", fname);

  size_t at = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t l = 0;
    const char *s = gguf_kv_str(f, ki, i, &l);
    v->off[i] = at;
    if (l == 0) {  // as llama.cpp: an empty token gets a placeholder text
      mole_log(MOLE_LOG_WARN, "%s: empty token at index %llu", fname, (unsigned long long)i);
      l = (uint64_t)snprintf(v->blob + at, 25, "[EMPTY_%llu]", (unsigned long long)i);
    } else {
      memcpy(v->blob + at, s, (size_t)l);
    }
    v->blob[at + l] = 0;
    v->len[i] = (uint32_t)l;
    at += (size_t)l + 1;
    v->max_len = MOLE_MAX(v->max_len, (uint32_t)l);
    tok_map_insert(v, (int32_t)i);

    if (si >= 0) {
      const uint8_t *d = gguf_kv_data(f, si);
      if (gguf_kv_arr_type(f, si) == GGUF_T_FLOAT32) {
        memcpy(&v->score[i], d + 4 * i, 4);
      } else {
        double x;
        memcpy(&x, d + 8 * i, 8);
        v->score[i] = (float)x;
      }
    }
    int64_t type = TOK_TYPE_NORMAL;
    if (ti >= 0) tok_arr_int(f, ti, i, &type);
    switch (type) {
      case TOK_TYPE_UNKNOWN: v->attr[i] = TOK_ATTR_UNKNOWN; break;
      case TOK_TYPE_UNUSED: v->attr[i] = TOK_ATTR_UNUSED; break;
      case TOK_TYPE_NORMAL: v->attr[i] = TOK_ATTR_NORMAL; break;
      case TOK_TYPE_CONTROL: v->attr[i] = TOK_ATTR_CONTROL; break;
      case TOK_TYPE_USER_DEFINED: v->attr[i] = TOK_ATTR_USER_DEFINED; break;
      case TOK_TYPE_BYTE: v->attr[i] = TOK_ATTR_BYTE; break;
      default: v->attr[i] = 0; break;  // undefined
    }
  }
  return MOLE_OK;
}

// A special id key: kept when absent; a bad value keeps the default (as llama.cpp).
static void tok_load_id(tok_vocab *v, const gguf_file *f, const char *key, int32_t *id) {
  if (*id >= v->n) {
    mole_log(MOLE_LOG_WARN, "%s: default %s = %d out of the vocabulary, disabling", gguf_path(f), key, *id);
    *id = -1;
  }
  int64_t x;
  if (gguf_find_kv(f, key) < 0 || gguf_get_int(f, key, &x) != MOLE_OK) return;
  if (x < 0 || x >= v->n) {
    mole_log(MOLE_LOG_WARN, "%s: bad %s = %lld, using %d", gguf_path(f), key, (long long)x, *id);
    return;
  }
  *id = (int32_t)x;
}

static bool tok_is(const tok_vocab *v, int32_t id, const char *s) {
  size_t n = strlen(s);
  return v->len[id] == n && !memcmp(tok_str(v, id), s, n);
}

static bool tok_is_any(const tok_vocab *v, int32_t id, const char *const *list) {
  for (; *list; list++)
    if (tok_is(v, id, *list)) return true;
  return false;
}

static void tok_make_control(tok_vocab *v, int32_t id) {
  if (!(v->attr[id] & TOK_ATTR_CONTROL)) {
    mole_log(MOLE_LOG_DEBUG, "tokenizer: token %d '%s' looks like a control token; marking it so", id, tok_str(v, id));
    v->attr[id] |= TOK_ATTR_CONTROL;
  }
}

// llama.cpp's detection of EOT/EOM/FIM and end-of-generation tokens by their text.
static void tok_detect_special(tok_vocab *v) {
  static const char *const eot[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
                                    "<end_of_utterance>", NULL};
  static const char *const eom[] = {"<|eom_id|>", NULL};
  static const char *const fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                                        "▁<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
  static const char *const fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                                        "▁<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
  static const char *const fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                                        "▁<MID>", "<|code_middle|>", "<|middle|>", NULL};
  static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
  static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
  static const char *const fim_sep[] = {"<|file_sep|>", NULL};
  static const char *const eog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                    "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                    "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[", NULL};
  struct {
    int32_t *id;
    const char *const *texts;
  } finds[] = {{&v->eot, eot},         {&v->eom, eom},         {&v->fim_pre, fim_pre}, {&v->fim_suf, fim_suf},
               {&v->fim_mid, fim_mid}, {&v->fim_pad, fim_pad}, {&v->fim_rep, fim_rep}, {&v->fim_sep, fim_sep}};
  // (llama.cpp takes the first match in hash order; we take the first name listed)
  for (size_t k = 0; k < sizeof finds / sizeof finds[0]; k++) {
    for (const char *const *t = finds[k].texts; *t && *finds[k].id < 0; t++) {
      int32_t id = tok_map_find(v, *t, strlen(*t));
      if (id < 0) continue;
      *finds[k].id = id;
      tok_make_control(v, id);
    }
  }
  // control tokens named "unused..." are unused
  for (int32_t id = 0; id < v->n; id++)
    if ((v->attr[id] & TOK_ATTR_CONTROL) && strstr(tok_str(v, id), "unused")) v->attr[id] |= TOK_ATTR_UNUSED;
  // end of generation
  int32_t fixed[] = {v->fim_pad, v->fim_rep, v->fim_sep};
  for (size_t k = 0; k < 3; k++)
    if (fixed[k] >= 0) v->attr[fixed[k]] |= TOK_ATTR_EOG;
  static const char *const user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
  for (int32_t id = 0; id < v->n; id++) {
    if (tok_is_any(v, id, eog)) {
      v->attr[id] |= TOK_ATTR_EOG;
      tok_make_control(v, id);
    }
  }
  for (int32_t id = 0; id < v->n; id++)  // gpt-oss: always rendered
    if (tok_is_any(v, id, user)) v->attr[id] = TOK_ATTR_USER_DEFINED | (v->attr[id] & TOK_ATTR_EOG);
  int32_t always[] = {v->eos, v->eot, v->eom};
  for (size_t k = 0; k < 3; k++)
    if (always[k] >= 0) v->attr[always[k]] |= TOK_ATTR_EOG;
  // o200k_harmony / solar-open: <|end|> is no EOG when <|return|>+<|call|> or <|calls|>+<|flush|> are
  bool has_return = false, has_call = false, has_flush = false;
  int32_t end_id = -1, s_id = -1;
  bool has_tool_response = false;
  for (int32_t id = 0; id < v->n; id++) {
    if (!(v->attr[id] & TOK_ATTR_EOG)) continue;
    if (tok_is(v, id, "<|return|>")) has_return = true;
    else if (tok_is(v, id, "<|call|>") || tok_is(v, id, "<|calls|>")) has_call = true;
    else if (tok_is(v, id, "<|flush|>")) has_flush = true;
    else if (tok_is(v, id, "<|end|>")) end_id = id;
    else if (tok_is(v, id, "<|tool_response>")) has_tool_response = true;
    else if (tok_is(v, id, "</s>")) s_id = id;
  }
  if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) v->attr[end_id] = TOK_ATTR_USER_DEFINED;
  // gemma4 / paddleocr: </s> is no EOG when <|tool_response> is
  if (has_tool_response && s_id >= 0) v->attr[s_id] = TOK_ATTR_NORMAL;
}

static int tok_cmp_special(const void *pa, const void *pb, void *ud) {
  const tok_vocab *v = ud;
  int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
  if (v->len[a] != v->len[b]) return v->len[a] > v->len[b] ? -1 : 1;
  return (a > b) - (a < b);
}

static bool tok_contains_ci(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && (hay[i] >= 'A' && hay[i] <= 'Z' ? hay[i] + 32 : hay[i]) == needle[i]) i++;
    if (i == n) return true;
  }
  return false;
}

// Special tokens longest first, their trie, and llama.cpp's per-model strip flags.
static mole_status tok_build_special(tok_vocab *v, const gguf_file *f) {
  v->n_special = 0;
  for (int32_t id = 0; id < v->n; id++)
    if (v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) v->n_special++;
  v->special = mole_malloc((size_t)MOLE_MAX(v->n_special, 1) * sizeof *v->special);
  if (!v->special) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory");
  int64_t k = 0;
  int64_t trie_cap = 1;
  for (int32_t id = 0; id < v->n; id++) {
    if (v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) {
      v->special[k++] = id;
      trie_cap += v->len[id];
    }
  }
  qsort_r(v->special, (size_t)v->n_special, sizeof *v->special, tok_cmp_special, v);

  v->trie = mole_malloc((size_t)trie_cap * sizeof *v->trie);
  if (!v->trie) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory");
  v->trie[0] = (tok_trie_node){-1, -1, -1, 0};
  v->n_trie = 1;
  for (int64_t i = 0; i < v->n_special; i++) {
    const uint8_t *s = (const uint8_t *)tok_str(v, v->special[i]);
    int32_t node = 0;
    for (uint32_t j = 0; j < v->len[v->special[i]]; j++) {
      int32_t c = v->trie[node].child;
      while (c >= 0 && v->trie[c].byte != s[j]) c = v->trie[c].sibling;
      if (c < 0) {
        MOLE_ASSERT(v->n_trie < trie_cap);
        c = (int32_t)v->n_trie++;
        v->trie[c] = (tok_trie_node){-1, v->trie[node].child, -1, s[j]};
        v->trie[node].child = c;
      }
      node = c;
    }
    if (v->trie[node].special < 0) v->trie[node].special = (int32_t)i;  // same text twice: the first in order
  }

  // strip flags llama.cpp sets by model / tokenizer / architecture name
  const char *name = NULL, *pre = NULL, *arch = NULL;
  if (gguf_find_kv(f, "general.name") >= 0) gguf_get_str(f, "general.name", &name);
  if (gguf_find_kv(f, "tokenizer.ggml.pre") >= 0) gguf_get_str(f, "tokenizer.ggml.pre", &pre);
  if (gguf_find_kv(f, "general.architecture") >= 0) gguf_get_str(f, "general.architecture", &arch);
  if ((pre && (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code"))) ||
      (arch && (strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")))) {
    int32_t id = tok_map_find(v, "<mask>", 6);
    if (id >= 0) v->attr[id] |= TOK_ATTR_LSTRIP;
  } else if (name && (tok_contains_ci(name, "phi-3") || tok_contains_ci(name, "phi3"))) {
    for (int64_t i = 0; i < v->n_special; i++) v->attr[v->special[i]] |= TOK_ATTR_RSTRIP;
    int32_t id = tok_map_find(v, "</s>", 4);
    if (id >= 0) v->attr[id] |= TOK_ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (int j = 0; j < 3; j++) {
      id = tok_map_find(v, keep[j], strlen(keep[j]));
      if (id >= 0) v->attr[id] &= ~(uint32_t)TOK_ATTR_RSTRIP;
    }
  } else if (name && tok_contains_ci(name, "modern-bert")) {
    int32_t id = tok_map_find(v, "[MASK]", 6);
    if (id >= 0) v->attr[id] |= TOK_ATTR_LSTRIP;
  }
  return MOLE_OK;
}

mole_status tok_load(const gguf_file *f, tok_vocab **out) {
  *out = NULL;
  const char *fname = gguf_path(f);
  const char *model = NULL;
  if (gguf_find_kv(f, "tokenizer.ggml.model") < 0)
    return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: tokenizer.ggml.model: missing (no vocabulary)", fname);
  mole_status st = gguf_get_str(f, "tokenizer.ggml.model", &model);
  if (st != MOLE_OK) return mole_error_prefix(st, "%s: ", fname);
  tok_model m;
  const bool gemma4 = !strcmp(model, "gemma4");
  if (!strcmp(model, "llama")) m = TOK_MODEL_SPM;
  else if (!strcmp(model, "gpt2") || gemma4) m = TOK_MODEL_BPE;
  else
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model = '%s': only 'llama' (SentencePiece), "
                       "'gpt2' (byte-level BPE) and 'gemma4' (BPE over escaped spaces) are supported", fname, model);

  tok_vocab *v = mole_calloc(1, sizeof *v);
  if (!v) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", fname);
  v->model = m;
  v->eot = v->eom = v->sep = v->pad = v->mask = -1;
  v->fim_pre = v->fim_suf = v->fim_mid = v->fim_pad = v->fim_rep = v->fim_sep = -1;
  st = tok_load_tokens(v, f);
  if (st != MOLE_OK) goto fail;
  if (m == TOK_MODEL_SPM) {
    v->bos = 1, v->eos = 2, v->unk = 0;
    v->add_bos = true;
    v->add_space_prefix = true;
    v->clean_spaces = false;
    v->pre_name = "spm";
  } else {
    v->bos = v->eos = gemma4 ? -1 : 11;  // llama.cpp's defaults
    v->unk = -1;
    st = tok_bpe_load(v, f, gemma4 ? "gemma4" : NULL);
    if (st != MOLE_OK) goto fail;
  }
  static const struct {
    const char *key;
    size_t field;
  } ids[] = {
      {"tokenizer.ggml.bos_token_id", offsetof(tok_vocab, bos)},
      {"tokenizer.ggml.eos_token_id", offsetof(tok_vocab, eos)},
      {"tokenizer.ggml.eot_token_id", offsetof(tok_vocab, eot)},
      {"tokenizer.ggml.eom_token_id", offsetof(tok_vocab, eom)},
      {"tokenizer.ggml.unknown_token_id", offsetof(tok_vocab, unk)},
      {"tokenizer.ggml.seperator_token_id", offsetof(tok_vocab, sep)},
      {"tokenizer.ggml.padding_token_id", offsetof(tok_vocab, pad)},
      {"tokenizer.ggml.mask_token_id", offsetof(tok_vocab, mask)},
      {"tokenizer.ggml.fim_pre_token_id", offsetof(tok_vocab, fim_pre)},
      {"tokenizer.ggml.fim_suf_token_id", offsetof(tok_vocab, fim_suf)},
      {"tokenizer.ggml.fim_mid_token_id", offsetof(tok_vocab, fim_mid)},
      {"tokenizer.ggml.fim_pad_token_id", offsetof(tok_vocab, fim_pad)},
      {"tokenizer.ggml.fim_rep_token_id", offsetof(tok_vocab, fim_rep)},
      {"tokenizer.ggml.fim_sep_token_id", offsetof(tok_vocab, fim_sep)},
      {"tokenizer.ggml.prefix_token_id", offsetof(tok_vocab, fim_pre)},
      {"tokenizer.ggml.suffix_token_id", offsetof(tok_vocab, fim_suf)},
      {"tokenizer.ggml.middle_token_id", offsetof(tok_vocab, fim_mid)},
  };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    tok_load_id(v, f, ids[i].key, (int32_t *)((char *)v + ids[i].field));
  static const struct {
    const char *key;
    size_t field;
  } flags[] = {
      {"tokenizer.ggml.add_bos_token", offsetof(tok_vocab, add_bos)},
      {"tokenizer.ggml.add_eos_token", offsetof(tok_vocab, add_eos)},
      {"tokenizer.ggml.add_space_prefix", offsetof(tok_vocab, add_space_prefix)},
  };
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    bool b;
    if (gguf_find_kv(f, flags[i].key) >= 0 && gguf_get_bool(f, flags[i].key, &b) == MOLE_OK)
      *(bool *)((char *)v + flags[i].field) = b;
  }
  if (v->esc_space) v->add_bos = true;  // llama.cpp overrides it for gemma4
  for (int c = 0; c < 256; c++) {
    char hex[8];
    snprintf(hex, sizeof hex, "<0x%02X>", c);
    char one = (char)c;
    v->byte_tok[c] = tok_map_find(v, hex, 6);
    if (v->byte_tok[c] < 0) v->byte_tok[c] = tok_map_find(v, &one, 1);
  }
  tok_detect_special(v);
  st = tok_build_special(v, f);
  if (st != MOLE_OK) goto fail;
  *out = v;
  return MOLE_OK;
fail:
  tok_free(v);
  return st;
}

void tok_free(tok_vocab *v) {
  if (!v) return;
  tok_bpe_free(v->bpe);
  mole_free(v->blob);
  mole_free(v->off);
  mole_free(v->len);
  mole_free(v->score);
  mole_free(v->attr);
  mole_free(v->slots);
  mole_free(v->special);
  mole_free(v->trie);
  mole_free(v);
}

// ---- encoding ------------------------------------------------------------------------

typedef struct {
  size_t off, len;  // raw text text[off, off + len) when tok < 0
  int32_t tok;
} tok_frag;

typedef struct {
  tok_frag *v;
  int64_t n, cap;
} tok_frags;

static mole_status tok_frags_push(tok_frags *a, tok_frag f) {
  if (f.tok < 0 && f.len == 0) return MOLE_OK;
  if (a->n == a->cap) {
    int64_t cap = a->cap ? a->cap * 2 : 16;
    tok_frag *nv = mole_realloc(a->v, (size_t)cap * sizeof *nv);
    if (!nv) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%lld fragments)", (long long)cap);
    a->v = nv;
    a->cap = cap;
  }
  a->v[a->n++] = f;
  return MOLE_OK;
}

static bool tok_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Splits every raw fragment of *a around each occurrence of special token k
// (llama.cpp's tokenizer_st_partition, for one token), into *b.
static mole_status tok_split_special(const tok_vocab *v, const char *text, int32_t id, const tok_frags *a,
                                     tok_frags *b) {
  const char *t = tok_str(v, id);
  size_t tl = v->len[id];
  uint32_t attr = v->attr[id];
  mole_status st = MOLE_OK;
  b->n = 0;
  for (int64_t i = 0; i < a->n && st == MOLE_OK; i++) {
    tok_frag f = a->v[i];
    if (f.tok >= 0) {
      st = tok_frags_push(b, f);
      continue;
    }
    size_t base = f.off, blen = f.len;
    while (st == MOLE_OK) {
      const char *m = memmem(text + base, blen, t, tl);
      if (!m) {
        st = tok_frags_push(b, (tok_frag){base, blen, -1});
        break;
      }
      size_t at = (size_t)(m - text), ll = at - base;
      if (attr & TOK_ATTR_LSTRIP)
        while (ll > 0 && tok_isspace(text[base + ll - 1])) ll--;
      st = tok_frags_push(b, (tok_frag){base, ll, -1});
      if (st == MOLE_OK) st = tok_frags_push(b, (tok_frag){0, 0, id});
      if (at + tl >= base + blen) break;
      size_t ro = at + tl, rl = base + blen - ro;
      if (attr & TOK_ATTR_RSTRIP)
        while (rl > 0 && tok_isspace(text[ro])) ro++, rl--;
      base = ro;
      blen = rl;
    }
  }
  return st;
}

// The fragments of text: special tokens (by llama.cpp's rules) and raw text between.
static mole_status tok_partition(const tok_vocab *v, const char *text, size_t len, bool parse_special,
                                 tok_frags *out) {
  tok_frags a = {0}, b = {0};
  mole_status st = tok_frags_push(&a, (tok_frag){0, len, -1});
  // which special tokens occur at all (trie walk from every position)
  uint8_t *seen = NULL;
  if (st == MOLE_OK && v->n_special > 0) {
    seen = mole_calloc((size_t)(v->n_special + 7) / 8, 1);
    if (!seen) st = mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory");
  }
  bool any = false;
  for (size_t i = 0; seen && i < len; i++) {
    int32_t node = 0;
    for (size_t j = i; j < len; j++) {
      int32_t c = v->trie[node].child;
      while (c >= 0 && v->trie[c].byte != (uint8_t)text[j]) c = v->trie[c].sibling;
      if (c < 0) break;
      node = c;
      int32_t s = v->trie[node].special;
      if (s >= 0) {
        seen[s / 8] |= (uint8_t)(1u << (s % 8));
        any = true;
      }
    }
  }
  for (int64_t k = 0; any && k < v->n_special && st == MOLE_OK; k++) {
    if (!(seen[k / 8] & (1u << (k % 8)))) continue;
    int32_t id = v->special[k];
    if (!parse_special && (v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
    st = tok_split_special(v, text, id, &a, &b);
    tok_frags t = a;
    a = b;
    b = t;
  }
  mole_free(seen);
  mole_free(b.v);
  *out = a;
  return st;
}

// s[0..n) with every ' ' escaped to U+2581 (and one before it with prefix) into
// *buf (grown as needed; *cap its size), *m bytes.
static mole_status tok_escape_spaces(const char *s, size_t n, bool prefix, char **buf, size_t *cap, size_t *m) {
  const size_t need = (n + 1) * 3;
  if (need > *cap) {
    char *nb = mole_realloc(*buf, need);
    if (!nb) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", need);
    *buf = nb;
    *cap = need;
  }
  char *e = *buf;
  size_t k = 0;
  if (prefix) memcpy(e, "\xe2\x96\x81", 3), k = 3;
  for (size_t j = 0; j < n; j++) {
    if (s[j] == ' ') memcpy(e + k, "\xe2\x96\x81", 3), k += 3;
    else e[k++] = s[j];
  }
  *m = k;
  return MOLE_OK;
}

mole_status tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  if (len > TOK_MAX_TEXT)
    return mole_errorf(MOLE_ERR_ARG, "tokenizer: text of %zu bytes (at most %zu per call)", len, (size_t)TOK_MAX_TEXT);
  tok_ids out = {0};
  tok_frags fr = {0};
  tok_bpe_ctx *ctx = NULL;
  char *esc = NULL;  // the text with spaces escaped (SPM, gemma4)
  size_t cap = 0;
  mole_status st = len > 0 ? tok_partition(v, text, len, parse_special, &fr) : MOLE_OK;
  if (st == MOLE_OK && add_special && v->add_bos && v->bos >= 0) st = tok_ids_push(&out, v->bos);
  if (st == MOLE_OK && v->model == TOK_MODEL_SPM) {
    bool prev_special = true;  // a space goes before the first text, and after every special token
    for (int64_t i = 0; i < fr.n && st == MOLE_OK; i++) {
      if (fr.v[i].tok >= 0) {
        st = tok_ids_push(&out, fr.v[i].tok);
        prev_special = true;
        continue;
      }
      size_t m = 0;
      st = tok_escape_spaces(text + fr.v[i].off, fr.v[i].len, v->add_space_prefix && prev_special, &esc, &cap, &m);
      if (st != MOLE_OK) break;
      st = tok_spm_encode(v, esc, m, &out);
      prev_special = false;
    }
  } else if (st == MOLE_OK) {
    for (int64_t i = 0; i < fr.n && st == MOLE_OK; i++) {
      if (fr.v[i].tok >= 0) {
        st = tok_ids_push(&out, fr.v[i].tok);
        continue;
      }
      if (!ctx) st = tok_bpe_ctx_new(v, &ctx);
      const char *frag = text + fr.v[i].off;
      size_t fl = fr.v[i].len;
      if (st == MOLE_OK && v->esc_space) {
        st = tok_escape_spaces(frag, fl, false, &esc, &cap, &fl);
        frag = esc;
      }
      if (st == MOLE_OK) st = tok_bpe_encode(v, ctx, frag, fl, &out);
    }
  }
  if (st == MOLE_OK && add_special && v->add_eos && v->eos >= 0) st = tok_ids_push(&out, v->eos);
  if (st == MOLE_OK && !out.v) {
    out.v = mole_malloc(sizeof(int32_t));
    if (!out.v) st = mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory");
  }
  tok_bpe_ctx_free(ctx);
  mole_free(esc);
  mole_free(fr.v);
  if (st != MOLE_OK) {
    mole_free(out.v);
    return st;
  }
  *ids = out.v;
  *n = out.n;
  return MOLE_OK;
}

// ---- decoding -----------------------------------------------------------------------------

void tok_unescape_spaces(const char *text, size_t len, tok_sink *s) {
  for (size_t i = 0; i < len;) {
    if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
      tok_sink_put(s, " ", 1);
      i += 3;
    } else {
      tok_sink_put(s, text + i++, 1);
    }
  }
}

static void tok_piece_sink(const tok_vocab *v, int32_t id, bool render_special, tok_sink *s) {
  uint32_t attr = v->attr[id];
  const char *t = tok_str(v, id);
  size_t n = v->len[id];
  if (attr & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL)) {
    if (render_special) tok_sink_put(s, t, n);
  } else if (attr & TOK_ATTR_USER_DEFINED) {
    tok_sink_put(s, t, n);
  } else if (attr & TOK_ATTR_NORMAL) {
    if (v->model == TOK_MODEL_BPE) {
      tok_bpe_decode_text(v, t, n, s);
      return;
    }
    tok_unescape_spaces(t, n, s);
  } else if (attr & TOK_ATTR_BYTE) {  // "<0xNN>"
    unsigned x = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
      char c = t[i];
      unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                          : 16u;
      if (d == 16) break;
      x = x * 16 + d;
    }
    char byte = (char)x;
    tok_sink_put(s, &byte, 1);
  }
  // unused / undefined tokens render as nothing
}

int64_t tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap, bool render_special) {
  if (id < 0 || id >= v->n) return -1;
  tok_sink s = {buf, buf ? cap : 0, 0};
  tok_piece_sink(v, id, render_special, &s);
  return (int64_t)s.n;
}

// llama.cpp's clean-up of detokenized text (three in-place passes).
static size_t tok_clean_spaces(char *text, size_t total) {
  size_t total1 = total;
  total = total ? 1 : 0;
  for (size_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;  // " ?", " !", " .", " ,"
    text[total++] = x;
  }
  size_t total2 = total;
  total = total ? 1 : 0;
  for (size_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {  // " ' "
      total--;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  size_t total3 = total;
  total = total ? 1 : 0;
  for (size_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {  // " 's", " 'm"
        total--;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;  // " 're", " 've"
      }
    }
    text[total++] = x;
  }
  return total;
}

mole_status tok_decode(const tok_vocab *v, const int32_t *ids, int64_t n, unsigned flags, char **text,
                       size_t *len) {
  *text = NULL;
  *len = 0;
  if (n < 0) return mole_errorf(MOLE_ERR_ARG, "tokenizer: decode of %lld ids", (long long)n);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= v->n)
      return mole_errorf(MOLE_ERR_ARG, "tokenizer: id %d at position %lld is outside the vocabulary (%lld tokens)",
                         ids[i], (long long)i, (long long)v->n);
  bool remove_space = (flags & TOK_DECODE_STRIP_SPACE) && v->add_space_prefix;
  if ((flags & TOK_DECODE_REMOVE_SPECIAL) && v->add_bos && n > 0 && ids[0] == v->bos) {
    remove_space = false;
    ids++;
    n--;
  }
  if ((flags & TOK_DECODE_REMOVE_SPECIAL) && v->add_eos && n > 0 && ids[n - 1] == v->eos) n--;
  bool render = (flags & TOK_DECODE_RENDER_SPECIAL) != 0;
  tok_sink s = {NULL, 0, 0};
  for (int64_t i = 0; i < n; i++) tok_piece_sink(v, ids[i], render, &s);
  char *buf = mole_malloc(s.n + 1);
  if (!buf) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of text)", s.n + 1);
  size_t total = s.n;
  s = (tok_sink){buf, total, 0};
  for (int64_t i = 0; i < n; i++) {
    size_t at = s.n;
    tok_piece_sink(v, ids[i], render, &s);
    if (i == 0 && remove_space && s.n > at && buf[at] == ' ') {  // the first piece's leading space
      memmove(buf + at, buf + at + 1, s.n - at - 1);
      s.n--;
    }
  }
  total = s.n;
  if ((flags & TOK_DECODE_CLEAN_SPACES) && v->clean_spaces) total = tok_clean_spaces(buf, total);
  buf[total] = 0;
  *text = buf;
  *len = total;
  return MOLE_OK;
}

// ---- accessors ----------------------------------------------------------------------------

tok_model tok_vocab_model(const tok_vocab *v) { return v->model; }
const char *tok_pre_name(const tok_vocab *v) { return v->pre_name; }
int64_t tok_n_vocab(const tok_vocab *v) { return v->n; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_eot(const tok_vocab *v) { return v->eot; }
int32_t tok_unk(const tok_vocab *v) { return v->unk; }
int32_t tok_pad(const tok_vocab *v) { return v->pad; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos && v->bos >= 0; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos && v->eos >= 0; }

bool tok_is_eog(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n && (v->attr[id] & TOK_ATTR_EOG); }

tok_token_type tok_token_type_of(const tok_vocab *v, int32_t id) {
  if (id < 0 || id >= v->n) return TOK_TYPE_UNDEFINED;
  uint32_t a = v->attr[id];
  if (a & TOK_ATTR_CONTROL) return TOK_TYPE_CONTROL;
  if (a & TOK_ATTR_USER_DEFINED) return TOK_TYPE_USER_DEFINED;
  if (a & TOK_ATTR_UNKNOWN) return TOK_TYPE_UNKNOWN;
  if (a & TOK_ATTR_BYTE) return TOK_TYPE_BYTE;
  if (a & TOK_ATTR_UNUSED) return TOK_TYPE_UNUSED;
  if (a & TOK_ATTR_NORMAL) return TOK_TYPE_NORMAL;
  return TOK_TYPE_UNDEFINED;
}

const char *tok_text(const tok_vocab *v, int32_t id, size_t *len) {
  if (id < 0 || id >= v->n) return NULL;
  if (len) *len = v->len[id];
  return tok_str(v, id);
}

int32_t tok_find(const tok_vocab *v, const char *text, size_t len) {
  if (len > v->max_len) return -1;
  return tok_map_find(v, text, len);
}
