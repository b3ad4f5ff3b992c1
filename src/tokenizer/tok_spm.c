// tokenizer/spm: SentencePiece BPE the way llama.cpp's llm_tokenizer_spm does
// it: split the (escaped) text into UTF-8 characters, then repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring token (ties: the
// leftmost), with a binary heap of candidate pairs and lazy invalidation;
// finally emit each symbol's token, or its bytes as <0xNN> tokens.
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct {
  size_t start;   // byte offset in the text
  uint32_t n;     // bytes; 0 once merged into its left neighbour
  int32_t prev;   // -1 at the start
  int32_t next;   // -1 at the end
} spm_sym;

typedef struct {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of left + right when queued
} spm_bigram;

typedef struct {
  spm_bigram *v;
  int64_t n, cap;
} spm_heap;

// a comes out before b: higher score, then the leftmost.
static bool spm_before(const spm_bigram *a, const spm_bigram *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static mole_status spm_heap_push(spm_heap *h, spm_bigram b) {
  if (h->n == h->cap) {
    int64_t cap = h->cap ? h->cap * 2 : 64;
    spm_bigram *nv = mole_realloc(h->v, (size_t)cap * sizeof *nv);
    if (!nv) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (spm heap of %lld)", (long long)cap);
    h->v = nv;
    h->cap = cap;
  }
  int64_t i = h->n++;
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!spm_before(&b, &h->v[p])) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = b;
  return MOLE_OK;
}

static spm_bigram spm_heap_pop(spm_heap *h) {
  MOLE_ASSERT(h->n > 0);
  spm_bigram top = h->v[0];
  spm_bigram last = h->v[--h->n];
  int64_t i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && spm_before(&h->v[c + 1], &h->v[c])) c++;
    if (!spm_before(&h->v[c], &last)) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n > 0) h->v[i] = last;
  return top;
}

typedef struct {
  const tok_vocab *v;
  const char *text;
  spm_sym *sym;
  spm_heap heap;
} spm_session;

static mole_status spm_try_bigram(spm_session *s, int32_t left, int32_t right) {
  if (left < 0 || right < 0) return MOLE_OK;
  size_t n = (size_t)s->sym[left].n + s->sym[right].n;
  if (n > s->v->max_len) return MOLE_OK;
  int32_t id = tok_map_find(s->v, s->text + s->sym[left].start, n);
  if (id < 0) return MOLE_OK;
  spm_bigram b = {s->v->score[id], left, right, (uint32_t)n};
  return spm_heap_push(&s->heap, b);
}

mole_status tok_spm_encode(const tok_vocab *v, const char *text, size_t len, tok_ids *out) {
  if (len == 0) return MOLE_OK;
  // symbols: one per UTF-8 character (by lead byte, clamped to the text)
  int64_t n_sym = 0;
  for (size_t off = 0; off < len; n_sym++) off += MOLE_MIN(tok_utf8_len((uint8_t)text[off]), len - off);
  MOLE_ASSERT(n_sym <= INT32_MAX);  // len <= 3 * (TOK_MAX_TEXT + 1)
  spm_session s = {v, text, mole_malloc((size_t)n_sym * sizeof(spm_sym)), {0}};
  if (!s.sym) return mole_errorf(MOLE_ERR_NOMEM, "tokenizer: out of memory (%lld symbols)", (long long)n_sym);
  size_t off = 0;
  for (int32_t i = 0; i < (int32_t)n_sym; i++) {
    size_t l = MOLE_MIN(tok_utf8_len((uint8_t)text[off]), len - off);
    s.sym[i] = (spm_sym){off, (uint32_t)l, i - 1, i + 1 == (int32_t)n_sym ? -1 : i + 1};
    off += l;
  }
  mole_status st = MOLE_OK;
  for (int32_t i = 1; i < (int32_t)n_sym && st == MOLE_OK; i++) st = spm_try_bigram(&s, i - 1, i);
  while (st == MOLE_OK && s.heap.n > 0) {
    spm_bigram b = spm_heap_pop(&s.heap);
    spm_sym *l = &s.sym[b.left], *r = &s.sym[b.right];
    // stale: one side already merged away, or either side has grown since
    if (l->n == 0 || r->n == 0 || (size_t)l->n + r->n != b.size) continue;
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) s.sym[r->next].prev = b.left;
    st = spm_try_bigram(&s, l->prev, b.left);
    if (st == MOLE_OK) st = spm_try_bigram(&s, b.left, l->next);
  }
  for (int32_t i = 0; i != -1 && st == MOLE_OK; i = s.sym[i].next) {
    const spm_sym *y = &s.sym[i];
    int32_t id = y->n <= v->max_len ? tok_map_find(v, text + y->start, y->n) : -1;
    if (id >= 0) {
      st = tok_ids_push(out, id);
      continue;
    }
    // not a token: its bytes, as byte tokens (or <unk> when the vocabulary lacks one)
    for (uint32_t j = 0; j < y->n && st == MOLE_OK; j++) {
      int32_t bt = v->byte_tok[(uint8_t)text[y->start + j]];
      if (bt < 0) bt = v->unk;
      if (bt >= 0) st = tok_ids_push(out, bt);
    }
  }
  mole_free(s.heap.v);
  mole_free(s.sym);
  return st;
}
