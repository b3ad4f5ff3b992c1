// tokenizer/bpe: byte-level BPE (tokenizer.ggml.model = gpt2) as llama.cpp's
// llm_tokenizer_bpe does it.
//
// 1. Pre-tokenize: the text (invalid UTF-8 -> U+FFFD) goes through the regexes
//    of its tokenizer.ggml.pre one after the other; each splits every piece of
//    the previous one into its matches and the gaps between them (gaps are
//    pieces too). llama.cpp runs them with hand-written splitters, std::regex on
//    a "collapsed" text, or std::wregex; we run the same regexes with PCRE2 on a
//    copy of the text where, as in all of llama.cpp's paths, non-ASCII
//    whitespace reads as \v. So \s must mean ASCII whitespace: the regexes are
//    compiled without PCRE2_UCP (\p{..} are Unicode properties regardless;
//    with UCP, \s would also match U+180E, which llama.cpp does not). Two more
//    stand-ins: surrogates, which llama.cpp's decoder lets through, read as the
//    noncharacter U+FDD0; and for the deepseek-v3 family '~' reads as U+FDD1,
//    because llama.cpp's collapsed \p{S} misses '~'.
// 2. Each piece's UTF-8 bytes map through the GPT-2 byte-to-unicode table.
// 3. Merge adjacent symbols by lowest merge rank (ties: leftmost), heap-driven.
// 4. Each symbol becomes its token; a symbol that is no token becomes the tokens
//    of its single bytes, where those exist (llama.cpp drops the rest).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

// ---- pre-tokenizers ---------------------------------------------------------
// Regexes transcribed from llama.cpp's llama-vocab.cpp (data). Edits, all
// equivalent for matching: (?=[\p{L}])([^a-z]) -> [^\P{L}a-z] (a class
// instead of a group repeated per character); deepseek-llm's \s+$ gets a
// (?<!\s) so that it is not quadratic on long runs of spaces; the deepseek-v3
// family lists U+FDD1 where it lists '~' (see above).

#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_LLAMA3                                                                                   \
  RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
                  "\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                \
  RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
                  "\\s+(?!\\S)|\\s+"
#define RX_PORO " ?[^(\\s|.,!?…。，、।۔،)]+"
#define RX_CJK "[一-龥ࠀ-一가-퟿]+"

static const char *const rx_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
static const char *const rx_gpt2[] = {RX_GPT2, NULL};
static const char *const rx_llama3[] = {RX_LLAMA3, NULL};
static const char *const rx_qwen2[] = {RX_QWEN2, NULL};
static const char *const rx_qwen35[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "(?<!\\s)\\s+$",
    RX_CJK,
    "\\p{N}+",
    NULL};
static const char *const rx_deepseek_coder[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL};
static const char *const rx_deepseek3[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}\\x{FDD1}][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const rx_starcoder[] = {"\\p{N}", RX_GPT2, NULL};
static const char *const rx_poro[] = {RX_PORO, NULL};
static const char *const rx_viking[] = {RX_PORO, "\\p{N}", NULL};
static const char *const rx_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+" RX_CONTRACTIONS
    "?|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*" RX_CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_chameleon[] = {"<sentinel:[0-9]+>",
                                           "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                                           "([\\t\\n]|    |  )",
                                           "\\p{N}",
                                           "[\\p{P}!-/:-@\\[-`{-~]",
                                           RX_GPT2,
                                           NULL};
static const char *const rx_bailing[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_seed_coder[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const rx_laguna[] = {"[^\\n]+|[\\n]+", RX_QWEN2, NULL};
static const char *const rx_gemma4[] = {"[^\\n]+|[\\n]+", NULL};
static const char *const rx_minicpm5[] = {
    "\\p{N}{1,3}",
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};

enum {
  PRE_NO_CLEAN = 1,       // clean_spaces = false
  PRE_IGNORE_MERGES = 2,  // a piece that is a whole token is taken as is
  PRE_ADD_BOS = 4,        // add_bos defaults to true
  PRE_NO_BOS = 8,         // no BOS token
  PRE_TILDE = 16,         // '~' reads as U+FDD1
  PRE_RAW = 32,           // gemma4: spaces escaped to U+2581 first, merges on raw UTF-8 (no GPT-2 byte map),
                          // <0xNN> tokens for bytes, a run of newlines that is a token taken whole
};

typedef struct {
  const char *names;  // space-separated; the first is the canonical name
  const char *const *rx;
  unsigned flags;
} bpe_pre;

static const bpe_pre bpe_pres[] = {
    {"default", rx_default, 0},
    {"gpt-2 phi-2 mpt olmo jais jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4 "
     "jina-v1-en jina-v2-code roberta-bpe",
     rx_gpt2, 0},
    {"trillion granite-docling", rx_gpt2, PRE_NO_CLEAN},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", rx_llama3,
     PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"dbrx smaug-bpe", rx_llama3, 0},
    {"glm4 chatglm-bpe", rx_llama3, PRE_NO_BOS},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan grok-2 solar-open", rx_qwen2, PRE_NO_CLEAN},
    {"megrez stablelm2", rx_qwen2, 0},
    {"qwen35", rx_qwen35, PRE_NO_CLEAN},
    {"deepseek-llm", rx_deepseek_llm, PRE_NO_CLEAN},
    {"deepseek-coder", rx_deepseek_coder, PRE_NO_CLEAN},
    {"deepseek-v3 hunyuan-dense joyai-llm", rx_deepseek3, PRE_NO_CLEAN | PRE_TILDE},
    {"falcon", rx_falcon, 0},
    {"starcoder refact codeshell exaone minerva-7b mellum2", rx_starcoder, 0},
    {"command-r smollm", rx_starcoder, PRE_NO_CLEAN},
    {"poro-chat", rx_poro, PRE_NO_CLEAN},
    {"bloom gpt3-finnish", rx_poro, 0},
    {"viking", rx_viking, PRE_NO_CLEAN},
    {"tekken", rx_tekken, PRE_NO_CLEAN | PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"gpt-4o llama4 kanana2 talkie minimax-m2", rx_gpt4o, PRE_NO_CLEAN},
    {"chameleon", rx_chameleon, PRE_NO_CLEAN | PRE_ADD_BOS},
    {"bailingmoe bailingmoe2 llada-moe", rx_bailing, PRE_NO_CLEAN},
    {"seed-coder", rx_seed_coder, PRE_NO_CLEAN},
    {"laguna", rx_laguna, PRE_NO_CLEAN},
    {"minicpm5", rx_minicpm5, PRE_IGNORE_MERGES},
    {"gemma4 granite-embed-multi-311m", rx_gemma4, PRE_RAW},
};

static const char *const bpe_pre_canon[] = {
    "default", "gpt-2",  "trillion", "llama3",    "dbrx",   "glm4",      "qwen2",      "megrez",  "qwen35",
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "command-r", "poro-chat", "bloom",
    "viking", "tekken", "gpt-4o", "chameleon", "bailingmoe", "seed-coder", "laguna", "minicpm5", "gemma4",
};
_Static_assert(sizeof bpe_pre_canon / sizeof bpe_pre_canon[0] == sizeof bpe_pres / sizeof bpe_pres[0],
               "one canonical name per pre-tokenizer");

// Index of the entry whose names include `name`; -1 if none.
static int bpe_pre_find(const char *name) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < sizeof bpe_pres / sizeof bpe_pres[0]; i++) {
    const char *p = bpe_pres[i].names;
    while (*p) {
      const char *e = strchr(p, ' ');
      size_t l = e ? (size_t)(e - p) : strlen(p);
      if (l == nl && !memcmp(p, name, nl)) return (int)i;
      p += l;
      while (*p == ' ') p++;
    }
  }
  return -1;
}

// ---- model ----------------------------------------------------------------------

struct tok_bpe {
  // merges: "first second" strings; rank = index
  char *mblob;
  uint64_t *moff;    // [n_merges] offset of merge i's first part in mblob
  uint32_t *mfirst;  // [n_merges] bytes of the first part
  uint32_t *msecond; // [n_merges] bytes of the second part
  int64_t n_merges;
  int32_t *mslots;   // open addressing (first, second) -> rank, -1 empty
  uint64_t mslot_mask;

  pcre2_general_context *gctx;
  pcre2_code *rx[TOK_MAX_REGEX];
  int n_rx;
  unsigned flags;  // PRE_*

  char enc[256][2];    // GPT-2 byte -> UTF-8 of its code point
  uint8_t enc_len[256];
  int16_t dec[324];    // code point (< 0x144) -> byte, -1 if none
};

static uint64_t bpe_hash(const char *s, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t bpe_pair_hash(const char *a, size_t an, const char *b, size_t bn) {
  uint64_t h = bpe_hash(a, an, 0xcbf29ce484222325ull);
  h = bpe_hash("\x01", 1, h);  // separator: (ab, c) and (a, bc) hash apart
  return bpe_hash(b, bn, h);
}

// Rank of merge (a, b); -1 if none.
static int32_t bpe_rank(const tok_bpe *b, const char *l, size_t ln, const char *r, size_t rn) {
  uint64_t i = bpe_pair_hash(l, ln, r, rn) & b->mslot_mask;
  for (;; i = (i + 1) & b->mslot_mask) {
    int32_t m = b->mslots[i];
    if (m < 0) return -1;
    const char *s = b->mblob + b->moff[m];
    if (b->mfirst[m] == ln && b->msecond[m] == rn && !memcmp(s, l, ln) && !memcmp(s + ln + 1, r, rn)) return m;
  }
}

static void *bpe_pcre_malloc(size_t n, void *ud) {
  (void)ud;
  return mole_malloc(n ? n : 1);
}

static void bpe_pcre_free(void *p, void *ud) {
  (void)ud;
  mole_free(p);
}

static void bpe_byte_map(tok_bpe *b) {
  // printable Latin-1 bytes map to themselves; the rest to U+0100 + k in byte order
  int k = 0;
  for (int i = 0; i < 324; i++) b->dec[i] = -1;
  for (int c = 0; c < 256; c++) {
    bool keep = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    uint32_t cp = keep ? (uint32_t)c : (uint32_t)(256 + k++);
    char tmp[4];
    int n = tok_utf8_put(cp, tmp);
    MOLE_ASSERT(n <= 2);
    memcpy(b->enc[c], tmp, (size_t)n);
    b->enc_len[c] = (uint8_t)n;
    b->dec[cp] = (int16_t)c;
  }
  MOLE_ASSERT(k == 68);
}

static mole_status bpe_load_merges(tok_bpe *b, const gguf_file *f) {
  const char *fname = gguf_path(f);
  int64_t ki = gguf_find_kv(f, "tokenizer.ggml.merges");
  if (ki < 0) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: tokenizer.ggml.merges: missing (needed by a gpt2 vocabulary)", fname);
  if (gguf_kv_type(f, ki) != GGUF_T_ARRAY || gguf_kv_arr_type(f, ki) != GGUF_T_STRING)
    return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.merges: not an array of strings", fname);
  uint64_t n = gguf_kv_arr_n(f, ki);
  if (n > (uint64_t)INT32_MAX) return mole_errorf(MOLE_ERR_FORMAT, "%s: tokenizer.ggml.merges: %llu merges", fname, (unsigned long long)n);
  size_t total = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t l = 0;
    gguf_kv_str(f, ki, i, &l);
    total += (size_t)l + 1;
  }
  uint64_t slots = 16;
  while (slots < 2 * n + 16) slots *= 2;
  b->mblob = mole_malloc(total + 1);
  b->moff = mole_malloc((n + 1) * sizeof *b->moff);
  b->mfirst = mole_malloc((n + 1) * sizeof *b->mfirst);
  b->msecond = mole_malloc((n + 1) * sizeof *b->msecond);
  b->mslots = mole_malloc(slots * sizeof *b->mslots);
  if (!b->mblob || !b->moff || !b->mfirst || !b->msecond || !b->mslots)
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for %llu merges", fname, (unsigned long long)n);
  memset(b->mslots, 0xff, slots * sizeof *b->mslots);
  b->mslot_mask = slots - 1;
  size_t at = 0;
  int64_t m = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t l = 0;
    const char *s = gguf_kv_str(f, ki, i, &l);
    // split at the first space after the first byte, as llama.cpp does
    const char *sp = l > 1 ? memchr(s + 1, ' ', (size_t)l - 1) : NULL;
    if (!sp) continue;  // malformed: llama.cpp stores an empty pair that never matches
    size_t fl = (size_t)(sp - s), sl = (size_t)l - fl - 1;
    if (bpe_rank(b, s, fl, sp + 1, sl) >= 0) continue;  // duplicate: the first (lowest) rank wins
    memcpy(b->mblob + at, s, (size_t)l);
    b->mblob[at + l] = 0;
    b->moff[m] = at;
    b->mfirst[m] = (uint32_t)fl;
    b->msecond[m] = (uint32_t)sl;
    at += (size_t)l + 1;
    // rank = m: the file's order without the skipped lines, which compares the same
    uint64_t h = bpe_pair_hash(s, fl, sp + 1, sl) & b->mslot_mask;
    while (b->mslots[h] >= 0) h = (h + 1) & b->mslot_mask;
    b->mslots[h] = (int32_t)m;
    m++;
  }
  b->n_merges = m;
  return MOLE_OK;
}

mole_status tok_bpe_load(tok_vocab *v, const gguf_file *f, const char *pre_of_model) {
  const char *fname = gguf_path(f);
  tok_bpe *b = mole_calloc(1, sizeof *b);
  if (!b) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory", fname);
  v->bpe = b;
  bpe_byte_map(b);
  mole_status st = bpe_load_merges(b, f);
  if (st != MOLE_OK) return st;

  const char *pre = pre_of_model;
  int pi;
  if (!pre && gguf_find_kv(f, "tokenizer.ggml.pre") >= 0) {
    st = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (st != MOLE_OK) return mole_error_prefix(st, "%s: ", fname);
  }
  if (!pre || !*pre) {
    mole_log(MOLE_LOG_WARN, "%s: no tokenizer.ggml.pre: using the 'default' pre-tokenizer", fname);
    pi = bpe_pre_find("default");
  } else {
    pi = bpe_pre_find(pre);
    if (pi < 0) {
      mole_log(MOLE_LOG_WARN, "%s: unknown pre-tokenizer '%s': using gpt-2's (tokens may differ from the model's own)",
               fname, pre);
      pi = bpe_pre_find("gpt-2");
    }
  }
  MOLE_ASSERT(pi >= 0);
  v->pre_name = bpe_pre_canon[pi];
  b->flags = bpe_pres[pi].flags;
  v->clean_spaces = !(b->flags & PRE_NO_CLEAN);
  v->add_bos = (b->flags & PRE_ADD_BOS) != 0;
  v->esc_space = (b->flags & PRE_RAW) != 0;
  if (b->flags & PRE_NO_BOS) v->bos = -1;

  b->gctx = pcre2_general_context_create(bpe_pcre_malloc, bpe_pcre_free, NULL);
  if (!b->gctx) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory (pcre2)", fname);
  pcre2_compile_context *cc = pcre2_compile_context_create(b->gctx);
  if (!cc) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory (pcre2)", fname);
  for (const char *const *rx = bpe_pres[pi].rx; *rx; rx++) {
    MOLE_ASSERT(b->n_rx < TOK_MAX_REGEX);
    int err = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)*rx, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &err, &eoff, cc);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      pcre2_compile_context_free(cc);
      // the regexes are ours: failing to compile one is a bug, but report it
      return mole_errorf(MOLE_ERR_INTERNAL, "%s: pre-tokenizer %s: regex %d: %s at %zu", fname, v->pre_name,
                         b->n_rx, (const char *)msg, (size_t)eoff);
    }
    // JIT when available; pcre2_match falls back to the interpreter otherwise
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    b->rx[b->n_rx++] = code;
  }
  pcre2_compile_context_free(cc);
  return MOLE_OK;
}

void tok_bpe_free(tok_bpe *b) {
  if (!b) return;
  for (int i = 0; i < b->n_rx; i++) pcre2_code_free(b->rx[i]);
  pcre2_general_context_free(b->gctx);
  mole_free(b->mblob);
  mole_free(b->moff);
  mole_free(b->mfirst);
  mole_free(b->msecond);
  mole_free(b->mslots);
  mole_free(b);
}

// ---- encoding ------------------------------------------------------------------

typedef struct {
  int32_t rank;
  int32_t left, right;
  uint32_t lsize, rsize;  // bytes of both sides when queued
} bpe_bigram;

typedef struct {
  size_t start;
  uint32_t n;  // 0 once merged into its left neighbour
  int32_t prev, next;
} bpe_sym;

typedef struct {
  uint32_t a, b;  // code points [a, b) of the text
} bpe_piece;

struct tok_bpe_ctx {
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
  uint32_t *cp;      // [n] code points
  size_t *mt_off;    // [n + 1] offset of code point i in mt
  char *mt;          // the text regexes see
  bpe_piece *pa, *pb;
  char *word;        // byte-encoded piece
  bpe_sym *sym;
  bpe_bigram *heap;
  int64_t cap_cp, cap_mt, cap_pa, cap_pb, cap_word, cap_sym, cap_heap;
  int64_t n_pa, n_pb, n_heap;
};

static mole_status bpe_grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return MOLE_OK;
  int64_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *np = mole_realloc(*p, (size_t)c * elem);
  if (!np) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%lld x %zu bytes)", (long long)c, elem);
  *p = np;
  *cap = c;
  return MOLE_OK;
}

mole_status tok_bpe_ctx_new(const tok_vocab *v, tok_bpe_ctx **out) {
  MOLE_ASSERT(v->bpe);
  tok_bpe_ctx *c = mole_calloc(1, sizeof *c);
  if (!c) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory");
  *out = c;
  pcre2_general_context *g = v->bpe->gctx;
  c->md = pcre2_match_data_create(4, g);
  c->mc = pcre2_match_context_create(g);
  c->js = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, g);
  if (!c->md || !c->mc || !c->js) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (pcre2)");
  pcre2_jit_stack_assign(c->mc, NULL, c->js);
  return MOLE_OK;
}

void tok_bpe_ctx_free(tok_bpe_ctx *c) {
  if (!c) return;
  pcre2_match_data_free(c->md);
  pcre2_match_context_free(c->mc);
  pcre2_jit_stack_free(c->js);
  mole_free(c->cp);
  mole_free(c->mt_off);
  mole_free(c->mt);
  mole_free(c->pa);
  mole_free(c->pb);
  mole_free(c->word);
  mole_free(c->sym);
  mole_free(c->heap);
  mole_free(c);
}

static bool bpe_is_space(uint32_t cp) {  // llama.cpp's whitespace set beyond ASCII
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static mole_status bpe_piece_push(tok_bpe_ctx *c, uint32_t a, uint32_t b) {
  if (a >= b) return MOLE_OK;
  mole_status st = bpe_grow((void **)&c->pb, &c->cap_pb, c->n_pb + 1, sizeof(bpe_piece));
  if (st != MOLE_OK) return st;
  c->pb[c->n_pb++] = (bpe_piece){a, b};
  return MOLE_OK;
}

// The code point index in [a, b] that starts at byte offset off of mt.
static uint32_t bpe_cp_at(const tok_bpe_ctx *c, uint32_t a, uint32_t b, size_t off) {
  while (a < b) {
    uint32_t m = a + (b - a) / 2;
    if (c->mt_off[m] < off) a = m + 1;
    else b = m;
  }
  return a;
}

// Splits every piece of pa with regex code into pb (matches and the gaps between).
static mole_status bpe_split(tok_bpe_ctx *c, const pcre2_code *code) {
  c->n_pb = 0;
  mole_status st = MOLE_OK;
  for (int64_t p = 0; p < c->n_pa && st == MOLE_OK; p++) {
    uint32_t a = c->pa[p].a, b = c->pa[p].b;
    const char *subj = c->mt + c->mt_off[a];
    size_t n = c->mt_off[b] - c->mt_off[a];
    size_t pos = 0, gap = 0;
    while (pos < n && st == MOLE_OK) {
      int rc = pcre2_match(code, (PCRE2_SPTR)subj, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(rc, msg, sizeof msg);
        mole_log(MOLE_LOG_WARN, "tokenizer: regex failed (%s); keeping %zu bytes as one piece", (const char *)msg,
                 n - gap);
        break;
      }
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
      size_t ms = ov[0], me = ov[1];
      if (me <= ms) {  // empty match (none of our regexes has one): step one character
        pos = ms + 1;
        while (pos < n && ((uint8_t)subj[pos] & 0xC0) == 0x80) pos++;
        continue;
      }
      uint32_t cs = bpe_cp_at(c, a, b, c->mt_off[a] + ms), ce = bpe_cp_at(c, a, b, c->mt_off[a] + me);
      uint32_t cg = bpe_cp_at(c, a, b, c->mt_off[a] + gap);
      st = bpe_piece_push(c, cg, cs);
      if (st == MOLE_OK) st = bpe_piece_push(c, cs, ce);
      gap = pos = me;
    }
    if (st == MOLE_OK && gap < n) st = bpe_piece_push(c, bpe_cp_at(c, a, b, c->mt_off[a] + gap), b);
  }
  return st;
}

static bool bpe_before(const bpe_bigram *x, const bpe_bigram *y) {
  return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static mole_status bpe_heap_push(tok_bpe_ctx *c, bpe_bigram g) {
  mole_status st = bpe_grow((void **)&c->heap, &c->cap_heap, c->n_heap + 1, sizeof g);
  if (st != MOLE_OK) return st;
  int64_t i = c->n_heap++;
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!bpe_before(&g, &c->heap[p])) break;
    c->heap[i] = c->heap[p];
    i = p;
  }
  c->heap[i] = g;
  return MOLE_OK;
}

static bpe_bigram bpe_heap_pop(tok_bpe_ctx *c) {
  MOLE_ASSERT(c->n_heap > 0);
  bpe_bigram top = c->heap[0], last = c->heap[--c->n_heap];
  int64_t i = 0;
  for (;;) {
    int64_t k = 2 * i + 1;
    if (k >= c->n_heap) break;
    if (k + 1 < c->n_heap && bpe_before(&c->heap[k + 1], &c->heap[k])) k++;
    if (!bpe_before(&c->heap[k], &last)) break;
    c->heap[i] = c->heap[k];
    i = k;
  }
  if (c->n_heap > 0) c->heap[i] = last;
  return top;
}

static mole_status bpe_try_bigram(const tok_vocab *v, tok_bpe_ctx *c, int32_t l, int32_t r) {
  if (l < 0 || r < 0) return MOLE_OK;
  const bpe_sym *L = &c->sym[l], *R = &c->sym[r];
  int32_t rank = bpe_rank(v->bpe, c->word + L->start, L->n, c->word + R->start, R->n);
  if (rank < 0) return MOLE_OK;
  return bpe_heap_push(c, (bpe_bigram){rank, l, r, L->n, R->n});
}

// BPE of the byte-encoded word c->word[0..n), tokens appended to out.
static mole_status bpe_merge_word(const tok_vocab *v, tok_bpe_ctx *c, size_t n, tok_ids *out) {
  const unsigned fl = v->bpe->flags;
  bool whole = (fl & PRE_IGNORE_MERGES) != 0;
  if (fl & PRE_RAW) {  // a run of newlines
    whole = true;
    for (size_t i = 0; i < n && whole; i++) whole = c->word[i] == '\n';
  }
  if (whole) {
    int32_t id = n <= v->max_len ? tok_map_find(v, c->word, n) : -1;
    if (id >= 0) return tok_ids_push(out, id);
  }
  int64_t n_sym = 0;
  for (size_t off = 0; off < n; n_sym++) off += MOLE_MIN(tok_utf8_len((uint8_t)c->word[off]), n - off);
  MOLE_ASSERT(n_sym <= INT32_MAX);  // at most 3 symbols per input byte (U+FFFD)
  mole_status st = bpe_grow((void **)&c->sym, &c->cap_sym, n_sym, sizeof(bpe_sym));
  if (st != MOLE_OK) return st;
  size_t off = 0;
  for (int32_t i = 0; i < (int32_t)n_sym; i++) {
    size_t l = MOLE_MIN(tok_utf8_len((uint8_t)c->word[off]), n - off);
    c->sym[i] = (bpe_sym){off, (uint32_t)l, i - 1, i + 1 == (int32_t)n_sym ? -1 : i + 1};
    off += l;
  }
  c->n_heap = 0;
  for (int32_t i = 1; i < (int32_t)n_sym && st == MOLE_OK; i++) st = bpe_try_bigram(v, c, i - 1, i);
  while (st == MOLE_OK && c->n_heap > 0) {
    bpe_bigram g = bpe_heap_pop(c);
    bpe_sym *L = &c->sym[g.left], *R = &c->sym[g.right];
    // stale unless both sides are still exactly what was queued
    if (L->n == 0 || R->n == 0 || L->n != g.lsize || R->n != g.rsize) continue;
    L->n += R->n;
    R->n = 0;
    L->next = R->next;
    if (R->next >= 0) c->sym[R->next].prev = g.left;
    st = bpe_try_bigram(v, c, L->prev, g.left);
    if (st == MOLE_OK) st = bpe_try_bigram(v, c, g.left, L->next);
  }
  for (int32_t i = 0; i != -1 && n_sym > 0 && st == MOLE_OK; i = c->sym[i].next) {
    const bpe_sym *y = &c->sym[i];
    int32_t id = y->n <= v->max_len ? tok_map_find(v, c->word + y->start, y->n) : -1;
    if (id >= 0) {
      st = tok_ids_push(out, id);
      continue;
    }
    for (uint32_t j = 0; j < y->n && st == MOLE_OK; j++) {
      const uint8_t byte = (uint8_t)c->word[y->start + j];
      char hex[7];
      snprintf(hex, sizeof hex, "<0x%02X>", byte);
      int32_t bt = fl & PRE_RAW ? tok_map_find(v, hex, 6) : tok_map_find(v, c->word + y->start + j, 1);
      if (bt >= 0) st = tok_ids_push(out, bt);
    }
  }
  return st;
}

mole_status tok_bpe_encode(const tok_vocab *v, tok_bpe_ctx *c, const char *text, size_t len, tok_ids *out) {
  const tok_bpe *b = v->bpe;
  if (len == 0) return MOLE_OK;
  MOLE_ASSERT(len <= TOK_MAX_TEXT);
  mole_status st = bpe_grow((void **)&c->cp, &c->cap_cp, (int64_t)len + 1, sizeof(uint32_t));
  if (st == MOLE_OK) st = bpe_grow((void **)&c->mt, &c->cap_mt, (int64_t)len * 4 + 1, 1);
  if (st != MOLE_OK) return st;
  // mt_off shares cap_cp's capacity
  size_t *mo = mole_realloc(c->mt_off, (size_t)c->cap_cp * sizeof *mo);
  if (!mo) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of text)", len);
  c->mt_off = mo;

  uint32_t n = 0;
  size_t mlen = 0;
  for (size_t i = 0; i < len;) {
    uint32_t cp = tok_utf8_next(text, len, &i);
    c->cp[n] = cp;
    c->mt_off[n++] = mlen;
    uint32_t m = cp;
    if (cp >= 0x80 && bpe_is_space(cp)) m = 0x0B;
    else if (cp >= 0xD800 && cp <= 0xDFFF) m = 0xFDD0;
    else if (cp == '~' && (b->flags & PRE_TILDE)) m = 0xFDD1;
    mlen += (size_t)tok_utf8_put(m, c->mt + mlen);
  }
  c->mt_off[n] = mlen;

  c->n_pa = 0;
  st = bpe_grow((void **)&c->pa, &c->cap_pa, 1, sizeof(bpe_piece));
  if (st != MOLE_OK) return st;
  c->pa[c->n_pa++] = (bpe_piece){0, n};
  for (int r = 0; r < b->n_rx && st == MOLE_OK; r++) {
    st = bpe_split(c, b->rx[r]);
    bpe_piece *tp = c->pa;
    int64_t tc = c->cap_pa;
    c->pa = c->pb;
    c->cap_pa = c->cap_pb;
    c->n_pa = c->n_pb;
    c->pb = tp;
    c->cap_pb = tc;
  }
  for (int64_t p = 0; p < c->n_pa && st == MOLE_OK; p++) {
    uint32_t a = c->pa[p].a, e = c->pa[p].b;
    st = bpe_grow((void **)&c->word, &c->cap_word, (int64_t)(e - a) * 8 + 1, 1);
    if (st != MOLE_OK) break;
    size_t wn = 0;
    for (uint32_t i = a; i < e; i++) {
      char u[4];
      int k = tok_utf8_put(c->cp[i], u);
      for (int j = 0; j < k; j++) {
        uint8_t byte = (uint8_t)u[j];
        if (b->flags & PRE_RAW) {
          c->word[wn++] = (char)byte;
          continue;
        }
        memcpy(c->word + wn, b->enc[byte], b->enc_len[byte]);
        wn += b->enc_len[byte];
      }
    }
    st = bpe_merge_word(v, c, wn, out);
  }
  return st;
}

// ---- decoding -------------------------------------------------------------------

void tok_bpe_decode_text(const tok_vocab *v, const char *text, size_t len, tok_sink *s) {
  const tok_bpe *b = v->bpe;
  if (b->flags & PRE_RAW) {
    tok_unescape_spaces(text, len, s);
    return;
  }
  for (size_t i = 0; i < len;) {
    uint32_t cp = tok_utf8_next(text, len, &i);
    if (cp < 324 && b->dec[cp] >= 0) {
      char byte = (char)b->dec[cp];
      tok_sink_put(s, &byte, 1);
      continue;
    }
    // as llama.cpp: "[UNK_BYTE_0x" + the code point's UTF-8 in hex + the token's text + "]"
    char u[4], hex[3];
    int k = tok_utf8_put(cp, u);
    tok_sink_put(s, "[UNK_BYTE_0x", 12);
    for (int j = 0; j < k; j++) {
      static const char digits[] = "0123456789abcdef";
      hex[0] = digits[(uint8_t)u[j] >> 4];
      hex[1] = digits[(uint8_t)u[j] & 15];
      tok_sink_put(s, hex, 2);
    }
    tok_sink_put(s, text, len);
    tok_sink_put(s, "]", 1);
  }
}
