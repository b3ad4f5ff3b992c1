// srv_engine: continuous batching over --parallel slots.
//
// One thread runs steps. A step is one mole_batcher pass over: the next
// token of every generating slot, then chunks of the prompts being
// prefilled, up to step_tokens in all, so a long new prompt never stalls the
// streams that are running; each matmul reads its weights once for all of
// them and a routed expert is fetched once for every token that uses it.
// Requests join between steps (a queue feeds free slots) and leave when
// done; a slot keeps its tokens' KV cache, and a request that starts with
// tokens a free slot already holds (a conversation going on) takes that slot
// and skips them.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "experts/experts.h"
#include "model/model.h"
#include "server/server_internal.h"

typedef enum { SLOT_IDLE = 0, SLOT_PREFILL, SLOT_GEN } slot_state;

typedef struct {
  mole_session *s;
  slot_state st;
  srv_req *req;          // the engine's reference while running
  sampler *smp;          // per request
  stop_matcher *stop;    // per request
  chat_parser *parser;   // per request with a reasoning template: splits reasoning from content
  int32_t *hist;         // [ctx] tokens in the KV cache
  int64_t n_hist;
  int64_t n_prefilled;   // prompt tokens in the cache
  int32_t next_tok;      // SLOT_GEN: fed at the next step
  float *logits;         // [n_vocab]
  char utf8[4];          // bytes of a character not complete yet
  int n_utf8;
  int64_t last_used;     // step of its last request's end, for the LRU choice
  int64_t kv_evicted;    // its cache's evictions already counted in the metrics
} slot;

enum { RATE_RING = 64 };

struct srv_engine {
  mole_model *m;
  const tok_vocab *voc;
  srv_engine_params p;
  int64_t V;
  mole_batcher *b;
  mole_kv_heads *heads;  // locret's retaining heads, loaded once for every slot
  slot *slots;
  mole_batch_item *items;
  int *item_slot;
  pthread_t th;
  bool th_started;
  pthread_mutex_t mu;  // queue, stop flag, metrics
  pthread_cond_t cv;
  bool stop;
  srv_req *qhead, *qtail;
  int64_t qlen, running;
  srv_metrics mt;
  // rates: (time, prompt tokens, generated tokens) at recent steps
  int64_t ring_t[RATE_RING], ring_p[RATE_RING], ring_g[RATE_RING];
  int64_t ring_n;
};

// ---- requests --------------------------------------------------------------------

srv_req *srv_req_new(void) {
  srv_req *r = mole_calloc(1, sizeof *r);
  if (!r) return NULL;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  atomic_init(&r->refs, 1);
  atomic_init(&r->cancelled, false);
  r->top_logprobs = -1;
  return r;
}

void srv_req_release(srv_req *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  mole_free(r->prompt);
  for (int64_t i = 0; i < r->n_stops; i++) mole_free(r->stops[i]);
  mole_free(r->text);
  mole_free(r->reasoning);
  mole_free(r->tool_args);
  mole_free(r->lp);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  mole_free(r);
}

// Appends bytes to one of the request's outputs (under its lock) and wakes its reader.
static void req_append_to(srv_req *r, chat_part part, const char *s, size_t n) {
  if (n == 0) return;
  pthread_mutex_lock(&r->mu);
  char **buf = &r->text;
  size_t *len = &r->n_text, *cap = &r->cap_text;
  if (part == CHAT_PART_REASONING) buf = &r->reasoning, len = &r->n_reasoning, cap = &r->cap_reasoning;
  if (part == CHAT_PART_TOOL_ARGS) buf = &r->tool_args, len = &r->n_tool_args, cap = &r->cap_tool_args;
  if (*len + n + 1 > *cap) {
    size_t nc = MOLE_MAX(*cap * 2, *len + n + 256);
    char *t = mole_realloc(*buf, nc);
    if (!t) {  // keep what fits: the request ends short rather than wrong
      pthread_mutex_unlock(&r->mu);
      return;
    }
    *buf = t;
    *cap = nc;
  }
  memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = 0;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

// chat_parser's parts to the request's outputs. A second tool call in one
// output (gpt-oss stops at <|call|>, so only malformed output has one) adds
// its arguments to the first's.
static void req_part(void *ud, chat_part part, const char *s, size_t n) {
  srv_req *r = ud;
  if (part != CHAT_PART_TOOL_NAME) {
    req_append_to(r, part, s, n);
    return;
  }
  pthread_mutex_lock(&r->mu);
  if (!r->tool_name[0]) snprintf(r->tool_name, sizeof r->tool_name, "%.*s", (int)MOLE_MIN(n, sizeof r->tool_name - 1), s);
  if (!r->tool_name[0]) snprintf(r->tool_name, sizeof r->tool_name, "unnamed");
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

// Text let through by the stop matcher: to the parser when the request has one.
static void slot_output(slot *sl, const char *s, size_t n) {
  if (sl->parser) chat_parser_feed(sl->parser, s, n, req_part, sl->req);
  else req_append_to(sl->req, CHAT_PART_CONTENT, s, n);
}

static void req_finish(srv_req *r, const char *finish, int status, const char *err) {
  pthread_mutex_lock(&r->mu);
  r->done = true;
  r->finish = finish && r->tool_name[0] && !strcmp(finish, "stop") ? "tool_calls" : finish;
  if (status) {
    r->http_status = status;
    snprintf(r->err, sizeof r->err, "%s", err);
  }
  r->t_done = mole_time_us();
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

// ---- slots ------------------------------------------------------------------------

static void slot_end(srv_engine *e, slot *sl, const char *finish, int status, const char *err) {
  srv_req *r = sl->req;
  if (r) {
    if (!status && !atomic_load(&r->cancelled)) {
      // the held tail of a stop-string prefix, and a character cut short
      stop_match sm;
      stop_matcher_flush(sl->stop, &sm);
      slot_output(sl, sm.emit, sm.n_emit);
      if (sl->n_utf8) slot_output(sl, "\xEF\xBF\xBD", 3);  // U+FFFD for the incomplete character
      if (sl->parser) chat_parser_finish(sl->parser, req_part, r);
    }
    req_finish(r, finish, status, err);
    pthread_mutex_lock(&e->mu);
    if (status) e->mt.requests_failed++;
    else if (atomic_load(&r->cancelled)) e->mt.requests_cancelled++;
    else e->mt.requests_ok++;
    e->running--;
    pthread_mutex_unlock(&e->mu);
    srv_req_release(r);
  }
  sampler_free(sl->smp);
  stop_matcher_free(sl->stop);
  chat_parser_free(sl->parser);
  sl->smp = NULL;
  sl->stop = NULL;
  sl->parser = NULL;
  sl->req = NULL;
  sl->st = SLOT_IDLE;
  sl->n_utf8 = 0;
  sl->last_used = e->mt.steps;
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  int64_t i = 0;
  while (i < na && i < nb && a[i] == b[i]) i++;
  return i;
}

// The tokens of r's prompt that slot sl's cache can keep: their common prefix
// less one (at least one prompt token is evaluated: its logits give the first
// token); none when a bounded cache that has evicted would have to rewind.
static int64_t slot_reuse(const slot *sl, const srv_req *r) {
  const int64_t keep = MOLE_MIN(common_prefix(sl->hist, sl->n_hist, r->prompt, r->n_prompt), r->n_prompt - 1);
  if (keep < sl->n_hist) {
    mole_kv_info k;
    mole_session_kv_info(sl->s, &k);
    if (k.evicted > 0) return 0;
  }
  return keep;
}

// Puts r into a free slot: the one whose cache keeps the most of its prompt
// (the least recently used among equals).
static void slot_start(srv_engine *e, srv_req *r) {
  slot *best = NULL;
  int64_t keep = -1;
  for (int i = 0; i < e->p.parallel; i++) {
    slot *sl = &e->slots[i];
    if (sl->st != SLOT_IDLE) continue;
    const int64_t c = slot_reuse(sl, r);
    if (c > keep || (c == keep && sl->last_used < best->last_used)) best = sl, keep = c;
  }
  MOLE_ASSERT(best);
  mole_status st = mole_session_rewind(best->s, keep);
  MOLE_ASSERT(st == MOLE_OK);
  mole_kv_info k;
  mole_session_kv_info(best->s, &k);
  best->kv_evicted = k.evicted;  // 0 when the cache started over
  best->n_hist = keep;
  best->n_prefilled = keep;
  best->req = r;
  r->n_cached = keep;
  if ((st = sampler_init(&r->sp, e->V, &best->smp)) ||
      (st = stop_matcher_init((const char *const *)r->stops, r->n_stops, &best->stop)) ||
      (r->split != CHAT_TMPL_UNKNOWN && (st = chat_parser_new(r->split, &best->parser)))) {
    best->st = SLOT_PREFILL;  // slot_end expects a started slot
    slot_end(e, best, NULL, 400, mole_last_error());
    return;
  }
  if (best->parser && r->split_thinking) chat_parser_in_thinking(best->parser);
  for (int64_t i = 0; i < r->n_prompt; i++) sampler_accept(best->smp, r->prompt[i]);  // penalties see the prompt
  best->st = SLOT_PREFILL;
  pthread_mutex_lock(&e->mu);
  e->mt.cached_tokens += keep;
  pthread_mutex_unlock(&e->mu);
}

// log-softmax of the chosen token and the top alternatives
static void add_logprob(slot *sl, const float *lg, int64_t V, int32_t tok) {
  srv_req *r = sl->req;
  float mx = -INFINITY;
  for (int64_t i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < V; i++) sum += exp((double)lg[i] - mx);
  const float lse = mx + (float)log(sum);
  srv_logprob lp = {.token = tok, .logprob = lg[tok] - lse, .n_top = (int32_t)MOLE_MIN(r->top_logprobs, V)};
  // the n_top largest, best first, ties to the lower id: one pass inserting
  // into the sorted list (a later equal logit never displaces an earlier one)
  int32_t n = 0;
  for (int64_t i = 0; i < V && lp.n_top > 0; i++) {
    if (n == lp.n_top && !(lg[i] > lg[lp.top_tok[n - 1]])) continue;
    int32_t at = n < lp.n_top ? n++ : n - 1;
    for (; at > 0 && lg[i] > lg[lp.top_tok[at - 1]]; at--) lp.top_tok[at] = lp.top_tok[at - 1];
    lp.top_tok[at] = (int32_t)i;
  }
  for (int32_t k = 0; k < lp.n_top; k++) lp.top_lp[k] = lg[lp.top_tok[k]] - lse;
  pthread_mutex_lock(&r->mu);
  if (r->n_lp == r->cap_lp) {
    const int64_t cap = MOLE_MAX(2 * r->cap_lp, 64);
    srv_logprob *p = mole_realloc(r->lp, (size_t)cap * sizeof *p);
    if (p) r->lp = p, r->cap_lp = cap;
  }
  if (r->n_lp < r->cap_lp) r->lp[r->n_lp++] = lp;
  pthread_mutex_unlock(&r->mu);
}

size_t srv_utf8_take(char hold[4], int *n_hold, const char *piece, size_t n, char *out) {
  unsigned char in[4 + SRV_UTF8_MAX_PIECE];
  size_t m = (size_t)*n_hold, o = 0, i = 0;
  memcpy(in, hold, m);
  n = MOLE_MIN(n, (size_t)SRV_UTF8_MAX_PIECE);
  memcpy(in + m, piece, n);
  m += n;
  *n_hold = 0;
  while (i < m) {
    const unsigned char c = in[i];
    const size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    size_t k = 1;
    while (len > 1 && k < len && i + k < m && (in[i + k] & 0xC0) == 0x80) k++;
    // the second byte's range for E0/ED/F0/F4 (no overlongs, surrogates, > U+10FFFF)
    bool ok = len > 0;
    if (ok && len >= 3 && k >= 2) {
      const unsigned char d = in[i + 1];
      ok = !((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F));
    }
    if (ok && k < len && i + k == m) {  // cut short by the end: wait for more
      *n_hold = (int)(m - i);
      memcpy(hold, in + i, m - i);
      break;
    }
    if (ok && k == len) {
      memcpy(out + o, in + i, len);
      o += len;
      i += len;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    }
  }
  return o;
}

// The piece's valid UTF-8 (srv_utf8_take) goes to the stop matcher, what
// it lets through to the request.
static bool emit_text(slot *sl, const char *piece, size_t n) {
  char out[3 * (4 + SRV_UTF8_MAX_PIECE)];
  const size_t o = srv_utf8_take(sl->utf8, &sl->n_utf8, piece, n, out);
  stop_match sm;
  if (stop_matcher_feed(sl->stop, out, o, &sm) != MOLE_OK) return false;
  slot_output(sl, sm.emit, sm.n_emit);
  return sm.matched;
}

// The token sampled after a slot's last evaluated position: output, stops,
// limits; the slot goes on generating or ends.
static void slot_token(srv_engine *e, slot *sl) {
  srv_req *r = sl->req;
  const int32_t tok = sampler_sample(sl->smp, sl->logits);
  sampler_accept(sl->smp, tok);
  if (r->top_logprobs >= 0) add_logprob(sl, sl->logits, e->V, tok);
  pthread_mutex_lock(&r->mu);
  r->n_gen++;
  if (r->n_gen == 1) r->t_first = mole_time_us();
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_lock(&e->mu);
  e->mt.gen_tokens++;
  pthread_mutex_unlock(&e->mu);
  if (tok_is_eog(e->voc, tok)) {
    slot_end(e, sl, "stop", 0, NULL);
    return;
  }
  char piece[256];
  const int64_t pl = tok_piece(e->voc, tok, piece, sizeof piece, false);
  if (pl > 0 && emit_text(sl, piece, (size_t)MOLE_MIN(pl, (int64_t)sizeof piece))) {
    slot_end(e, sl, "stop", 0, NULL);
    return;
  }
  if (r->n_gen >= r->max_tokens || sl->n_hist + 1 > e->p.ctx_per_seq) {
    slot_end(e, sl, "length", 0, NULL);
    return;
  }
  sl->next_tok = tok;
  sl->st = SLOT_GEN;
}

// ---- steps ------------------------------------------------------------------------------

static void rate_sample(srv_engine *e) {
  const int64_t i = e->ring_n++ % RATE_RING;
  e->ring_t[i] = mole_time_us();
  e->ring_p[i] = e->mt.prompt_tokens;
  e->ring_g[i] = e->mt.gen_tokens;
  // rates over the samples of the last 5 s
  const int64_t now = e->ring_t[i], n = MOLE_MIN(e->ring_n, (int64_t)RATE_RING);
  int64_t o = i;
  for (int64_t k = 1; k < n; k++) {
    const int64_t j = (i - k + RATE_RING) % RATE_RING;
    if (now - e->ring_t[j] > 5000000) break;
    o = j;
  }
  const double dt = (double)(now - e->ring_t[o]) / 1e6;
  e->mt.gen_tps = dt > 0 ? (double)(e->ring_g[i] - e->ring_g[o]) / dt : 0;
  e->mt.prompt_tps = dt > 0 ? (double)(e->ring_p[i] - e->ring_p[o]) / dt : 0;
}

static void step(srv_engine *e) {
  int64_t n = 0, budget = e->p.step_tokens;
  // every generating slot's next token first: running streams never wait
  for (int i = 0; i < e->p.parallel; i++) {
    slot *sl = &e->slots[i];
    if (sl->st != SLOT_GEN) continue;
    e->items[n] = (mole_batch_item){sl->s, &sl->next_tok, 1, sl->logits, false};
    e->item_slot[n++] = i;
    budget--;
  }
  // then prompt chunks, oldest request first
  for (;;) {
    slot *pick = NULL;
    int pi = -1;
    for (int i = 0; i < e->p.parallel; i++) {
      slot *sl = &e->slots[i];
      bool in = false;
      for (int64_t k = 0; k < n; k++) in = in || e->item_slot[k] == i;
      if (sl->st != SLOT_PREFILL || in) continue;
      if (!pick || sl->req->t_submit < pick->req->t_submit) pick = sl, pi = i;
    }
    if (!pick || budget <= 0) break;
    const int64_t left = pick->req->n_prompt - pick->n_prefilled, c = MOLE_MIN(left, budget);
    e->items[n] = (mole_batch_item){pick->s, pick->req->prompt + pick->n_prefilled, c, c == left ? pick->logits : NULL,
                                    false};
    e->item_slot[n++] = pi;
    budget -= c;
  }
  if (n == 0) return;
  const int64_t t0 = mole_time_us();
  const mole_status st = mole_batcher_eval(e->b, e->items, n);
  pthread_mutex_lock(&e->mu);
  e->mt.busy_s += (double)(mole_time_us() - t0) / 1e6;
  e->mt.steps++;
  pthread_mutex_unlock(&e->mu);
  if (st) {  // nothing of the batch happened: its requests fail, their caches start over
    char err[256];
    snprintf(err, sizeof err, "inference failed: %s", mole_last_error());
    for (int64_t k = 0; k < n; k++) {
      slot *sl = &e->slots[e->item_slot[k]];
      mole_session_reset(sl->s);
      sl->n_hist = 0;
      sl->kv_evicted = 0;
      slot_end(e, sl, NULL, 500, err);
    }
    return;
  }
  for (int64_t k = 0; k < n; k++) {
    slot *sl = &e->slots[e->item_slot[k]];
    const mole_batch_item *it = &e->items[k];
    memcpy(sl->hist + sl->n_hist, it->tokens, (size_t)it->n * sizeof(int32_t));
    sl->n_hist += it->n;
    if (sl->st == SLOT_PREFILL) {
      sl->n_prefilled += it->n;
      pthread_mutex_lock(&e->mu);
      e->mt.prompt_tokens += it->n;
      pthread_mutex_unlock(&e->mu);
      if (!it->logits) continue;
    }
    slot_token(e, sl);
  }
  experts_stats xs;
  if (e->m->experts) experts_get_stats(e->m->experts, &xs);
  int64_t kv_used = 0, kv_evicted = 0;
  for (int i = 0; i < e->p.parallel; i++) {
    slot *sl = &e->slots[i];
    mole_kv_info k;
    mole_session_kv_info(sl->s, &k);
    kv_used += k.used;
    kv_evicted += k.evicted - sl->kv_evicted;
    sl->kv_evicted = k.evicted;
  }
  pthread_mutex_lock(&e->mu);
  e->mt.kv_used = kv_used;
  e->mt.kv_evicted += kv_evicted;
  rate_sample(e);
  if (e->m->experts) {
    e->mt.has_experts = true;
    e->mt.tiered = xs.tiered;
    for (int p = 0; p < 2; p++) e->mt.hits[p] = xs.total.hits[p], e->mt.misses[p] = xs.total.misses[p];
    e->mt.skips = xs.total.skips;
    e->mt.bytes_read = xs.total.bytes_read;
    e->mt.stall_us = xs.total.stall_us;
  }
  pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
  srv_engine *e = arg;
  for (;;) {
    // requests whose clients left: queued ones are dropped, running ones end
    for (int i = 0; i < e->p.parallel; i++) {
      slot *sl = &e->slots[i];
      if (sl->st != SLOT_IDLE && atomic_load(&sl->req->cancelled)) slot_end(e, sl, NULL, 0, NULL);
    }
    pthread_mutex_lock(&e->mu);
    for (;;) {
      bool active = false;
      for (int i = 0; i < e->p.parallel; i++) active = active || e->slots[i].st != SLOT_IDLE;
      if (e->stop || active || e->qhead) break;
      pthread_cond_wait(&e->cv, &e->mu);
    }
    if (e->stop) {
      pthread_mutex_unlock(&e->mu);
      break;
    }
    // queued requests into free slots
    srv_req *start[256];
    int n_start = 0;
    int free_slots = 0;
    for (int i = 0; i < e->p.parallel; i++) free_slots += e->slots[i].st == SLOT_IDLE;
    while (e->qhead && n_start < free_slots && n_start < 256) {
      srv_req *r = e->qhead;
      e->qhead = r->next;
      if (!e->qhead) e->qtail = NULL;
      e->qlen--;
      if (atomic_load(&r->cancelled)) {
        e->mt.requests_cancelled++;
        pthread_mutex_unlock(&e->mu);
        req_finish(r, NULL, 0, NULL);
        srv_req_release(r);
        pthread_mutex_lock(&e->mu);
        continue;
      }
      e->running++;
      start[n_start++] = r;
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n_start; i++) slot_start(e, start[i]);
    step(e);
  }
  // stopping: everything still here fails
  for (int i = 0; i < e->p.parallel; i++)
    if (e->slots[i].st != SLOT_IDLE) slot_end(e, &e->slots[i], NULL, 503, "the server is shutting down");
  pthread_mutex_lock(&e->mu);
  while (e->qhead) {
    srv_req *r = e->qhead;
    e->qhead = r->next;
    e->qlen--;
    pthread_mutex_unlock(&e->mu);
    req_finish(r, NULL, 503, "the server is shutting down");
    srv_req_release(r);
    pthread_mutex_lock(&e->mu);
  }
  e->qtail = NULL;
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

// ---- public -----------------------------------------------------------------------------

mole_status srv_engine_new(mole_model *m, const tok_vocab *voc, const srv_engine_params *p, srv_engine **out) {
  *out = NULL;
  if (p->parallel < 1 || p->parallel > 256) return mole_errorf(MOLE_ERR_ARG, "--parallel %d: expected 1..256", p->parallel);
  if (p->ctx_per_seq < 8) return mole_errorf(MOLE_ERR_ARG, "--ctx-per-seq %lld: expected >= 8", (long long)p->ctx_per_seq);
  if (p->step_tokens < p->parallel)
    return mole_errorf(MOLE_ERR_ARG, "-b %lld: a step must hold at least one token per slot (%d)",
                       (long long)p->step_tokens, p->parallel);
  srv_engine *e = mole_calloc(1, sizeof *e);
  if (!e) return mole_errorf(MOLE_ERR_NOMEM, "server: out of memory");
  e->m = m;
  e->voc = voc;
  e->p = *p;
  e->V = mole_model_n_vocab(m);
  e->mt.parallel = p->parallel;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  // a bounded slot holds its budget and one step's tokens (at most n_batch of its own)
  const int64_t n_batch = MOLE_MIN(p->step_tokens, p->ctx_per_seq), budget = p->slot.kv_budget;
  mole_status st = MOLE_OK;
  if (budget > 0 && budget >= p->ctx_per_seq)
    st = mole_errorf(MOLE_ERR_ARG, "--kv-budget %lld is not below the context per sequence (-c %lld): nothing would be evicted",
                     (long long)budget, (long long)p->ctx_per_seq);
  if (!st) st = mole_batcher_new(m, p->step_tokens, budget > 0 ? budget + n_batch : p->ctx_per_seq, &e->b);
  e->slots = mole_calloc((size_t)p->parallel, sizeof *e->slots);
  e->items = mole_calloc((size_t)p->step_tokens, sizeof *e->items);
  e->item_slot = mole_calloc((size_t)p->step_tokens, sizeof *e->item_slot);
  if (!st && (!e->slots || !e->items || !e->item_slot)) st = mole_errorf(MOLE_ERR_NOMEM, "server: out of memory");
  mole_session_params sp = p->slot;
  sp.n_ctx = p->ctx_per_seq;  // ignored when bounded: budget + n_batch
  sp.n_batch = n_batch;
  if (!st && sp.kv_retain && !sp.kv_heads) {  // one copy of the heads for all the slots
    st = mole_kv_heads_load(sp.kv_retain, &e->heads);
    sp.kv_retain = NULL;
    sp.kv_heads = e->heads;
  }
  for (int i = 0; i < p->parallel && !st; i++) {
    slot *sl = &e->slots[i];
    sl->hist = mole_malloc((size_t)p->ctx_per_seq * sizeof *sl->hist);
    sl->logits = mole_malloc((size_t)e->V * sizeof *sl->logits);
    if (!sl->hist || !sl->logits) st = mole_errorf(MOLE_ERR_NOMEM, "server: out of memory for slot %d", i);
    if (!st) st = mole_session_new(m, &sp, &sl->s);
    if (!st) {
      mole_kv_info k;
      mole_session_kv_info(sl->s, &k);
      e->mt.kv_bytes += k.bytes;
    }
  }
  if (!st && pthread_create(&e->th, NULL, engine_main, e) != 0)
    st = mole_errorf(MOLE_ERR_INTERNAL, "server: cannot start the engine thread");
  if (st) {
    srv_engine_free(e);
    return st;
  }
  e->th_started = true;
  *out = e;
  return MOLE_OK;
}

void srv_engine_stop(srv_engine *e) {
  if (!e || !e->th_started) return;
  pthread_mutex_lock(&e->mu);
  e->stop = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->th, NULL);
  e->th_started = false;
}

void srv_engine_free(srv_engine *e) {
  if (!e) return;
  srv_engine_stop(e);
  for (int i = 0; e->slots && i < e->p.parallel; i++) {
    mole_session_free(e->slots[i].s);
    mole_free(e->slots[i].hist);
    mole_free(e->slots[i].logits);
  }
  mole_batcher_free(e->b);
  mole_kv_heads_free(e->heads);
  mole_free(e->slots);
  mole_free(e->items);
  mole_free(e->item_slot);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  mole_free(e);
}

mole_status srv_engine_submit(srv_engine *e, srv_req *r, int *status) {
  if (r->n_prompt < 1) {
    *status = 400;
    return mole_errorf(MOLE_ERR_ARG, "the prompt is empty");
  }
  if (r->n_prompt >= e->p.ctx_per_seq) {
    *status = 400;
    return mole_errorf(MOLE_ERR_ARG, "the prompt has %lld tokens; the context per sequence is %lld (--ctx-per-seq)",
                       (long long)r->n_prompt, (long long)e->p.ctx_per_seq);
  }
  pthread_mutex_lock(&e->mu);
  if (e->stop) {
    pthread_mutex_unlock(&e->mu);
    *status = 503;
    return mole_errorf(MOLE_ERR_ARG, "the server is shutting down");
  }
  int free_slots = e->p.parallel - (int)e->running;
  if (e->qlen - free_slots >= e->p.max_queue) {
    pthread_mutex_unlock(&e->mu);
    *status = 503;
    return mole_errorf(MOLE_ERR_ARG, "the server is busy: %lld requests are waiting (--max-queue %lld)",
                       (long long)e->qlen, (long long)e->p.max_queue);
  }
  atomic_fetch_add(&r->refs, 1);
  r->t_submit = mole_time_us();
  r->next = NULL;
  if (e->qtail) e->qtail->next = r;
  else e->qhead = r;
  e->qtail = r;
  e->qlen++;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  *status = 200;
  return MOLE_OK;
}

void srv_engine_metrics(srv_engine *e, srv_metrics *out) {
  pthread_mutex_lock(&e->mu);
  *out = e->mt;
  out->queued = e->qlen;
  out->running = e->running;
  pthread_mutex_unlock(&e->mu);
}

void srv_engine_poke(srv_engine *e) {
  pthread_mutex_lock(&e->mu);
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}
