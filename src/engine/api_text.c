// engine: the public text API (include/mole.h): vocabularies (tokenize,
// detokenize, pieces, special ids), chat templates, the sampler and stop
// strings, over tokenizer/ and engine/sampler.
#include <string.h>

#include "engine/api.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

_Static_assert(MOLE_TOKENIZE_MAX_TEXT == TOK_MAX_TEXT, "mole.h's text limit is the tokenizer's");

// ---- vocabulary -------------------------------------------------------------

struct mole_vocab {
  tok_vocab *tok;
  char *chat_template;  // tokenizer.chat_template, NULL when absent
};

// The vocabulary of an open file (the model's or a mole_gguf's).
static mole_status vocab_of(const gguf_file *f, mole_vocab **out) {
  *out = NULL;
  mole_vocab *v = mole_calloc(1, sizeof *v);
  if (!v) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the vocabulary", gguf_path(f));
  mole_status st = tok_load(f, &v->tok);
  // a template that is not a string counts as none (as mole serve reads it)
  const int64_t k = gguf_find_kv(f, "tokenizer.chat_template");
  if (!st && k >= 0 && gguf_kv_type(f, k) == GGUF_T_STRING &&
      !(v->chat_template = mole_strdup(gguf_kv_str(f, k, 0, NULL))))
    st = mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the chat template", gguf_path(f));
  if (st) {
    mole_vocab_free(v);
    return st;
  }
  *out = v;
  return MOLE_OK;
}

mole_status mole_vocab_load(const char *path, mole_vocab **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_vocab_load: out is NULL");
  *out = NULL;
  if (!path) return mole_errorf(MOLE_ERR_ARG, "mole_vocab_load: no file given");
  gguf_file *f = NULL;
  mole_status st = gguf_open(path, &f);
  if (!st) st = vocab_of(f, out);
  gguf_close(f);
  return st;
}

mole_status mole_gguf_vocab(const mole_gguf *g, mole_vocab **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_vocab: out is NULL");
  *out = NULL;
  if (!g) return mole_errorf(MOLE_ERR_ARG, "mole_gguf_vocab: the file is NULL");
  return vocab_of(g->f, out);
}

mole_status mole_model_vocab(const mole_model *m, mole_vocab **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_model_vocab: out is NULL");
  *out = NULL;
  if (!m) return mole_errorf(MOLE_ERR_ARG, "mole_model_vocab: the model is NULL");
  return vocab_of(m->gguf, out);
}

void mole_vocab_free(mole_vocab *v) {
  if (!v) return;
  tok_free(v->tok);
  mole_free(v->chat_template);
  mole_free(v);
}

void mole_vocab_get_info(const mole_vocab *v, mole_vocab_info *out) {
  const tok_vocab *t = v->tok;
  const chat_tmpl ct = chat_template_detect(v->chat_template);
  *out = (mole_vocab_info){
      .model = tok_vocab_model(t) == TOK_MODEL_SPM ? "spm" : "bpe",
      .pre = tok_pre_name(t),
      .n_tokens = tok_n_vocab(t),
      .bos = tok_bos(t),
      .eos = tok_eos(t),
      .eot = tok_eot(t),
      .unk = tok_unk(t),
      .pad = tok_pad(t),
      .add_bos = tok_add_bos(t),
      .add_eos = tok_add_eos(t),
      .chat_template = v->chat_template,
      .chat_template_name = ct == CHAT_TMPL_UNKNOWN ? NULL : chat_template_name(ct),
  };
}

mole_status mole_tokenize(const mole_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                          int32_t **ids, int64_t *n) {
  if (!v || !ids || !n || (!text && len))
    return mole_errorf(MOLE_ERR_ARG, "mole_tokenize: %s is NULL", !v ? "the vocabulary" : !ids || !n ? "an output" : "the text");
  *ids = NULL;
  *n = 0;
  return tok_encode(v->tok, text ? text : "", len, add_special, parse_special, ids, n);
}

int64_t mole_token_piece(const mole_vocab *v, int32_t id, char *buf, size_t cap, bool render_special) {
  if (!v || (!buf && cap)) return -1;
  return tok_piece(v->tok, id, buf, cap, render_special);
}

bool mole_token_is_eog(const mole_vocab *v, int32_t id) { return v && tok_is_eog(v->tok, id); }

mole_status mole_detokenize(const mole_vocab *v, const int32_t *ids, int64_t n, unsigned flags, char **text,
                            size_t *len) {
  if (!v || !text || !len || (!ids && n) || n < 0)
    return mole_errorf(MOLE_ERR_ARG, "mole_detokenize: %s", n < 0 ? "a negative token count" : "a NULL argument");
  *text = NULL;
  *len = 0;
  const unsigned f = (flags & MOLE_DETOK_REMOVE_SPECIAL ? TOK_DECODE_REMOVE_SPECIAL : 0u) |
                     (flags & MOLE_DETOK_RENDER_SPECIAL ? TOK_DECODE_RENDER_SPECIAL : 0u) |
                     (flags & MOLE_DETOK_STRIP_SPACE ? TOK_DECODE_STRIP_SPACE : 0u) |
                     (flags & MOLE_DETOK_CLEAN_SPACES ? TOK_DECODE_CLEAN_SPACES : 0u);
  return tok_decode(v->tok, ids, n, f, text, len);
}

// ---- chat templates -----------------------------------------------------------

const char *mole_chat_template_from_name(const char *name) {
  const chat_tmpl t = chat_template_from_name(name);
  return t == CHAT_TMPL_UNKNOWN ? NULL : chat_template_name(t);
}

const char *mole_chat_template_detect(const char *jinja) {
  const chat_tmpl t = chat_template_detect(jinja);
  return t == CHAT_TMPL_UNKNOWN ? NULL : chat_template_name(t);
}

const char *mole_chat_template_list(void) { return chat_template_list(); }

mole_status mole_chat_apply(const char *tmpl, const mole_chat_msg *msgs, int64_t n, bool add_assistant, char **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_chat_apply: out is NULL");
  *out = NULL;
  if (!tmpl) return mole_errorf(MOLE_ERR_ARG, "chat template: no name given (known: %s)", chat_template_list());
  const chat_tmpl t = chat_template_from_name(tmpl);
  if (t == CHAT_TMPL_UNKNOWN)
    return mole_errorf(MOLE_ERR_ARG, "chat template '%s' is not one mole knows (known: %s)", tmpl, chat_template_list());
  if (n < 0 || (n > 0 && !msgs))
    return mole_errorf(MOLE_ERR_ARG, "mole_chat_apply: %s", n < 0 ? "a negative message count" : "the messages are NULL");
  chat_msg *cm = mole_malloc((size_t)(n > 0 ? n : 1) * sizeof *cm);
  if (!cm) return mole_errorf(MOLE_ERR_NOMEM, "chat template: out of memory for %lld messages", (long long)n);
  for (int64_t i = 0; i < n; i++) cm[i] = (chat_msg){msgs[i].role, msgs[i].content};
  mole_status st = chat_format(t, cm, n, add_assistant, out);
  mole_free(cm);
  return st;
}

// ---- sampler ------------------------------------------------------------------

struct mole_sampler {
  sampler *s;
  int64_t n_vocab;
};

mole_sampler_params mole_sampler_default_params(void) { return sampler_params_default(); }

mole_status mole_sampler_new(const mole_sampler_params *p, int64_t n_vocab, mole_sampler **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_sampler_new: out is NULL");
  *out = NULL;
  if (!p) return mole_errorf(MOLE_ERR_ARG, "mole_sampler_new: the parameters are NULL");
  mole_sampler *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "sampler: out of memory");
  mole_status st = sampler_init(p, n_vocab, &s->s);
  if (st) {
    mole_free(s);
    return st;
  }
  s->n_vocab = n_vocab;
  *out = s;
  return MOLE_OK;
}

void mole_sampler_free(mole_sampler *s) {
  if (!s) return;
  sampler_free(s->s);
  mole_free(s);
}

int32_t mole_sampler_sample(mole_sampler *s, const float *logits) { return sampler_sample(s->s, logits); }

mole_status mole_sampler_accept(mole_sampler *s, int32_t token) {
  if (token < 0 || token >= s->n_vocab)
    return mole_errorf(MOLE_ERR_ARG, "sampler: token %d is outside the vocabulary (0..%lld)", token,
                       (long long)s->n_vocab - 1);
  sampler_accept(s->s, token);
  return MOLE_OK;
}

void mole_sampler_reset(mole_sampler *s) { sampler_reset(s->s); }

uint64_t mole_sampler_seed(const mole_sampler *s) { return sampler_seed(s->s); }

// ---- stop strings -------------------------------------------------------------

struct mole_stop {
  stop_matcher *m;
};

static void stop_result(const stop_match *r, mole_stop_result *out) {
  *out = (mole_stop_result){r->matched, r->stop_index, r->emit, r->n_emit};
}

mole_status mole_stop_new(const char *const *stops, int64_t n, mole_stop **out) {
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_stop_new: out is NULL");
  *out = NULL;
  if (n < 0 || (n > 0 && !stops))
    return mole_errorf(MOLE_ERR_ARG, "stop strings: %s", n < 0 ? "a negative count" : "the list is NULL");
  mole_stop *m = mole_calloc(1, sizeof *m);
  if (!m) return mole_errorf(MOLE_ERR_NOMEM, "stop strings: out of memory");
  mole_status st = stop_matcher_init(stops, n, &m->m);
  if (st) {
    mole_free(m);
    return st;
  }
  *out = m;
  return MOLE_OK;
}

void mole_stop_free(mole_stop *m) {
  if (!m) return;
  stop_matcher_free(m->m);
  mole_free(m);
}

void mole_stop_reset(mole_stop *m) { stop_matcher_reset(m->m); }

mole_status mole_stop_feed(mole_stop *m, const char *piece, size_t n, mole_stop_result *out) {
  stop_match r;
  mole_status st = stop_matcher_feed(m->m, piece, n, &r);
  if (!st) stop_result(&r, out);
  return st;
}

void mole_stop_flush(mole_stop *m, mole_stop_result *out) {
  stop_match r;
  stop_matcher_flush(m->m, &r);
  stop_result(&r, out);
}
