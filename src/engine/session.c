// engine: the public model/session API (include/mole.h) over model/ and kv/.
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "kv/kv.h"
#include "kv/retain.h"
#include "model/model.h"

struct mole_session {
  mole_model *m;
  model_kv *kv;
  kv_retain *retain;  // locret's heads, NULL otherwise
  bool own_retain;    // loaded for this session (not borrowed from mole_kv_heads)
  model_scratch *scratch;
  int64_t n_batch;
  int64_t n_past;
};

mole_model_params mole_model_default_params(void) {
  return (mole_model_params){
      .n_threads = 0,
      .offload = {.expert_budget = -1, .cache_policy = "hobbit", .t1 = 1.0f, .t2 = 1.0f, .prefetch_depth = -1},
  };
}

static int default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

mole_status mole_model_load(const char *path, const mole_model_params *params, mole_model **out) {
  mole_model_params p = params ? *params : mole_model_default_params();
  if (p.n_threads < 0 || p.n_threads > 1024)
    return mole_errorf(MOLE_ERR_ARG, "threads: %d is out of range (0 = all cores, up to 1024)", p.n_threads);
  if (!out) return mole_errorf(MOLE_ERR_ARG, "mole_model_load: out is NULL");
  if (!p.n_threads) p.n_threads = default_threads();
  return model_load(path, &p, NULL, out);
}

void mole_model_free(mole_model *m) { model_free(m); }

void mole_model_print_stats(const mole_model *m, FILE *f) {
  if (m->experts) experts_print_stats(m->experts, f);
}
int64_t mole_model_n_vocab(const mole_model *m) { return m->hp.n_vocab; }
int64_t mole_model_n_ctx_train(const mole_model *m) { return m->hp.n_ctx_train; }
const char *mole_model_arch(const mole_model *m) { return m->arch_name; }

const char *mole_isa(void) { return quant_isa_name(); }

void mole_log_quiet(void) { mole_log_set_level(MOLE_LOG_ERROR); }

mole_status mole_isa_check(const char *name) {
  const int want = quant_isa_from_name(name);
  if (want < 0) return mole_errorf(MOLE_ERR_ARG, "MOLE_ISA='%s' is not one of %s", name, QUANT_ISA_NAMES);
  if (want > quant_cpu_isa())
    return mole_errorf(MOLE_ERR_ARG, "MOLE_ISA=%s: this CPU does not have it (its best is %s)", name,
                       quant_isa_level_name(quant_cpu_isa()));
  return MOLE_OK;
}

int64_t mole_model_image_bytes(const mole_model *m) { return m->image_bytes; }

void mole_model_describe(const mole_model *m, char *buf, size_t n) {
  const model_hparams *hp = &m->hp;
  snprintf(buf, n, "%s: %lld layers, n_embd %lld, %lld heads (%lld kv), %lld experts (%lld used), ff %lld, vocab %lld, %.1f MiB",
           m->arch_name, (long long)hp->n_layer, (long long)hp->n_embd, (long long)hp->n_head,
           (long long)hp->n_head_kv, (long long)hp->n_expert, (long long)hp->n_expert_used,
           (long long)(hp->n_expert ? hp->n_ff_exp : hp->n_ff), (long long)hp->n_vocab,
           (double)gguf_size(m->gguf) / (1024.0 * 1024.0));
}

// bytes of a (possibly sliced) matrix's share: ne1 rows of ne0 elements
static uint64_t mat_bytes(const model_tensor *t) {
  return t->data || t->ne2 ? (uint64_t)quant_row_size(t->type, t->ne0) * (uint64_t)t->ne1 : 0;
}

uint64_t mole_model_active_bytes(const mole_model *m) {
  const model_hparams *hp = &m->hp;
  uint64_t b = mat_bytes(&m->output) + quant_row_size(m->tok_embd.type, m->tok_embd.ne0);
  for (int64_t il = 0; il < hp->n_layer; il++) {
    const model_layer *ly = &m->layers[il];
    b += mat_bytes(&ly->wq) + mat_bytes(&ly->wk) + mat_bytes(&ly->wv) + mat_bytes(&ly->wo);
    b += mat_bytes(&ly->ffn_gate) + mat_bytes(&ly->ffn_up) + mat_bytes(&ly->ffn_down);
    b += mat_bytes(&ly->gate_inp);
    b += (uint64_t)hp->n_expert_used * (mat_bytes(&ly->gate_exps) + mat_bytes(&ly->up_exps) + mat_bytes(&ly->down_exps));
    b += mat_bytes(&ly->gate_shexp) + mat_bytes(&ly->up_shexp) + mat_bytes(&ly->down_shexp);
  }
  return b;
}

void mole_model_print_stats_json(const mole_model *m, FILE *f) {
  if (!m->experts) {
    fputs("{}", f);
    return;
  }
  experts_stats st;
  experts_get_stats(m->experts, &st);
  const experts_counts *c = &st.total;
  const double tok = st.tokens > 0 ? (double)st.tokens : 1.0;
  fprintf(f,
          "{\"tiered\": %s, \"io\": \"%s\", \"policy\": \"%s\", \"t1\": %g, \"t2\": %g, \"prefetch_depth\": %d, "
          "\"budget_bytes\": %lld, \"resident_bytes\": %lld, \"tokens\": %lld, \"hits_high\": %lld, "
          "\"hits_low\": %lld, \"misses_high\": %lld, \"misses_low\": %lld, \"skips\": %lld, \"hit_rate\": %.4f, "
          "\"bytes_read\": %lld, \"bytes_per_token\": %.0f, \"stall_s\": %.4f, \"stall_gbps\": %.3f, "
          "\"disk_gbps\": %.3f, \"pred_accuracy\": %.4f, \"prefetch_on_tokens\": %lld}",
          st.tiered ? "true" : "false", st.io, st.policy, st.t1, st.t2, st.prefetch_depth, (long long)st.budget_bytes,
          (long long)st.resident_bytes, (long long)st.tokens, (long long)c->hits[0], (long long)c->hits[1],
          (long long)c->misses[0], (long long)c->misses[1], (long long)c->skips, st.hit_rate,
          (long long)c->bytes_read, (double)c->bytes_read / tok, (double)c->stall_us / 1e6, st.stall_gbps,
          st.disk_gbps, st.pred_accuracy, (long long)st.prefetch_on_tokens);
}

struct mole_kv_heads {
  kv_retain *r;
  char *path;  // for the errors that name it
};

mole_status mole_kv_heads_load(const char *path, mole_kv_heads **out) {
  *out = NULL;
  if (!path || !*path) return mole_errorf(MOLE_ERR_ARG, "retaining heads: no file given");
  mole_kv_heads *h = mole_calloc(1, sizeof *h);
  const size_t n = strlen(path) + 1;
  if (!h || !(h->path = mole_malloc(n))) {
    mole_free(h);
    return mole_errorf(MOLE_ERR_NOMEM, "retaining heads %s: out of memory", path);
  }
  memcpy(h->path, path, n);
  mole_status st = kv_retain_load(path, &h->r);
  if (st) {
    mole_kv_heads_free(h);
    return st;
  }
  *out = h;
  return MOLE_OK;
}

void mole_kv_heads_free(mole_kv_heads *h) {
  if (!h) return;
  kv_retain_free(h->r);
  mole_free(h->path);
  mole_free(h);
}

mole_session_params mole_session_default_params(void) {
  return (mole_session_params){.n_ctx = 0, .n_batch = 0, .kv_type = MOLE_KV_F16, .n_threads = 0,
                               .kv_budget = 0, .kv_recent = -1, .kv_sinks = -1, .kv_policy = MOLE_KV_POLICY_AUTO,
                               .kv_decay = -1.0f};
}

// The bounded-cache settings of p, checked, with their defaults filled in.
static mole_status bounded_params(const mole_model *m, const mole_session_params *p, kv_policy *pol, int64_t *recent,
                                  int64_t *sinks) {
  static const kv_policy map[] = {KV_FULL, KV_FULL, KV_STREAMING, KV_H2O, KV_LOCRET};
  if ((unsigned)p->kv_policy > MOLE_KV_POLICY_LOCRET)
    return mole_errorf(MOLE_ERR_ARG, "kv policy %d: expected full, streaming, h2o or locret", (int)p->kv_policy);
  if (p->kv_budget < 0 || p->kv_budget > ((int64_t)1 << 24))
    return mole_errorf(MOLE_ERR_ARG, "kv budget %lld is out of range (0 = unbounded, up to 16777216)",
                       (long long)p->kv_budget);
  if (p->kv_retain && p->kv_heads)
    return mole_errorf(MOLE_ERR_ARG, "retaining heads given twice (a file and loaded heads): give one");
  const bool heads = p->kv_retain || p->kv_heads;
  *pol = map[p->kv_policy];
  *recent = *sinks = 0;
  if (p->kv_budget == 0) {
    if (p->kv_policy != MOLE_KV_POLICY_AUTO && p->kv_policy != MOLE_KV_POLICY_FULL)
      return mole_errorf(MOLE_ERR_ARG, "kv policy %s needs a kv budget (--kv-budget N)", kv_policy_name(*pol));
    if (heads) return mole_errorf(MOLE_ERR_ARG, "retaining heads (--retain) need a kv budget and policy locret");
    if (p->kv_recent > 0 || p->kv_sinks > 0)
      return mole_errorf(MOLE_ERR_ARG, "kv recent/sinks need a kv budget (--kv-budget N)");
    return MOLE_OK;
  }
  if (p->kv_policy == MOLE_KV_POLICY_FULL)
    return mole_errorf(MOLE_ERR_ARG, "kv policy full keeps every entry: it takes no kv budget");
  if (p->kv_policy == MOLE_KV_POLICY_AUTO) *pol = heads ? KV_LOCRET : KV_H2O;
  if (*pol == KV_LOCRET && !heads)
    return mole_errorf(MOLE_ERR_ARG, "kv policy locret needs retaining heads (--retain FILE, from mole train-retain)");
  if (*pol != KV_LOCRET && heads)
    return mole_errorf(MOLE_ERR_ARG, "retaining heads (--retain) are used by kv policy locret only, not %s",
                       kv_policy_name(*pol));
  if (m->comm.size > 1)
    return mole_errorf(MOLE_ERR_ARG, "a kv budget is not supported across several processes (--parallel, --disagg)");
  const int64_t B = p->kv_budget;
  *recent = p->kv_recent >= 0 ? p->kv_recent : B / 4;
  *sinks = p->kv_sinks >= 0 ? p->kv_sinks : MOLE_MIN(4, B - *recent);
  if (*recent + *sinks > B)
    return mole_errorf(MOLE_ERR_ARG, "kv budget %lld is smaller than kv recent %lld + kv sinks %lld", (long long)B,
                       (long long)*recent, (long long)*sinks);
  return MOLE_OK;
}

mole_status mole_session_new(mole_model *m, const mole_session_params *params, mole_session **out) {
  *out = NULL;
  mole_session_params p = params ? *params : mole_session_default_params();
  if (p.n_ctx < 0 || p.n_ctx > ((int64_t)1 << 24))
    return mole_errorf(MOLE_ERR_ARG, "context size %lld is out of range", (long long)p.n_ctx);
  if (p.n_batch < 0 || p.n_batch > 65536)
    return mole_errorf(MOLE_ERR_ARG, "batch size %lld is out of range 1..65536", (long long)p.n_batch);
  if (p.kv_type != MOLE_KV_F16 && p.kv_type != MOLE_KV_F32)
    return mole_errorf(MOLE_ERR_ARG, "kv type %d: expected f16 or f32", (int)p.kv_type);
  kv_policy pol = KV_FULL;
  int64_t recent = 0, sinks = 0;
  mole_status st = bounded_params(m, &p, &pol, &recent, &sinks);
  if (st) return st;
  int64_t n_ctx = p.n_ctx, n_batch = p.n_batch;
  if (p.kv_budget > 0) {  // the budget and one chunk: the context no longer bounds memory
    if (n_batch <= 0) n_batch = 512;
    n_ctx = p.kv_budget + n_batch;
  }
  model_session_shape(m, &n_ctx, &n_batch);
  mole_session *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "session: out of memory");
  s->m = m;
  s->n_batch = n_batch;
  const model_hparams *hp = &m->hp;
  st = kv_new(hp->n_layer, n_ctx, m->loc.n_head_kv * hp->head_dim, m->loc.n_head_kv * hp->head_dim_v,
              p.kv_type == MOLE_KV_F32 ? QT_F32 : QT_F16, &s->kv);
  if (!st && pol == KV_LOCRET) {
    const char *path = p.kv_heads ? p.kv_heads->path : p.kv_retain;
    if (p.kv_heads) s->retain = p.kv_heads->r;
    else st = kv_retain_load(path, &s->retain), s->own_retain = true;
    if (!st) st = kv_retain_check(s->retain, path, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->head_dim_v);
  }
  if (!st && p.kv_budget > 0)
    st = kv_set_policy(s->kv, pol, p.kv_budget, recent, sinks, p.kv_decay < 0 ? 8.0f / (float)p.kv_budget : p.kv_decay,
                       hp->n_head_kv, s->retain, n_batch);
  if (st) {
    mole_session_free(s);
    return st;
  }
  *out = s;
  return MOLE_OK;
}

void mole_session_free(mole_session *s) {
  if (!s) return;
  if (s->kv && s->m->comm.kv_release) s->m->comm.kv_release(s->m->comm.ctx, s->kv->id);
  kv_free(s->kv);
  if (s->own_retain) kv_retain_free(s->retain);
  model_scratch_free(s->scratch);
  mole_free(s);
}

void mole_session_reset(mole_session *s) {
  s->n_past = 0;
  kv_reset(s->kv);
  if (s->m->experts) experts_reset_sequence(s->m->experts);  // per-sequence policy counters
}
int64_t mole_session_n_past(const mole_session *s) { return s->n_past; }

mole_status mole_session_rewind(mole_session *s, int64_t n_past) {
  if (n_past < 0 || n_past > s->n_past)
    return mole_errorf(MOLE_ERR_ARG, "rewind to %lld: the session holds %lld positions", (long long)n_past,
                       (long long)s->n_past);
  if (s->kv->budget > 0 && n_past != s->n_past) {
    if (n_past == 0) {  // starting over is always possible
      kv_reset(s->kv);
      s->n_past = 0;
      return MOLE_OK;
    }
    if (s->kv->n_evicted > 0)
      return mole_errorf(MOLE_ERR_ARG, "rewind to %lld: the bounded KV cache has evicted entries (it holds %lld of %lld positions)",
                         (long long)n_past, (long long)s->kv->n_used, (long long)s->n_past);
    s->kv->n_used = s->kv->n_pos = n_past;  // nothing evicted yet: slot = position
  }
  s->n_past = n_past;
  return MOLE_OK;
}

void mole_session_kv_info(const mole_session *s, mole_kv_info *out) {
  const model_kv *kv = s->kv;
  *out = (mole_kv_info){kv_policy_name(kv->policy), kv->budget, kv->recent, kv->sinks, kv->decay, kv->n_ctx,
                        kv->budget > 0 ? kv->n_used : s->n_past, s->n_past, kv->n_evicted, (int64_t)kv_bytes(kv)};
}

mole_status mole_session_eval(mole_session *s, const int32_t *tokens, int64_t n, float *logits, bool all_logits) {
  if (n <= 0) return mole_errorf(MOLE_ERR_ARG, "eval: no tokens");
  // the scratch on first use: a session a batcher runs (a server's slot) never needs its own
  mole_status st = s->scratch ? MOLE_OK : model_scratch_new(s->m, s->n_batch, s->kv->n_ctx, &s->scratch);
  if (st) return st;
  const int64_t V = s->m->hp.n_vocab;
  for (int64_t i = 0; i < n; i += s->n_batch) {
    const int64_t c = MOLE_MIN(s->n_batch, n - i);
    const bool last = i + c == n;
    float *lg = NULL;
    if (logits && all_logits) lg = logits + i * V;
    else if (logits && last) lg = logits;
    if ((st = model_forward(s->m, s->kv, s->scratch, tokens + i, c, s->n_past, lg, all_logits))) return st;
    s->n_past += c;
  }
  return MOLE_OK;
}

// ---- batcher -------------------------------------------------------------------

struct mole_batcher {
  mole_model *m;
  model_scratch *scratch;
  int64_t max_tokens, max_ctx;
  model_seg *segs;  // [max_tokens]: a sequence has at least one token
};

mole_status mole_batcher_new(mole_model *m, int64_t max_tokens, int64_t max_ctx, mole_batcher **out) {
  *out = NULL;
  if (max_tokens < 1 || max_tokens > 65536)
    return mole_errorf(MOLE_ERR_ARG, "batcher: max_tokens %lld is out of range 1..65536", (long long)max_tokens);
  if (max_ctx < 0 || max_ctx > ((int64_t)1 << 24))
    return mole_errorf(MOLE_ERR_ARG, "batcher: max_ctx %lld is out of range", (long long)max_ctx);
  int64_t n_ctx = max_ctx, n_batch = max_tokens;
  model_session_shape(m, &n_ctx, &n_batch);
  n_batch = max_tokens;  // a batch of many sequences may exceed one context
  mole_batcher *b = mole_calloc(1, sizeof *b);
  if (!b) return mole_errorf(MOLE_ERR_NOMEM, "batcher: out of memory");
  b->m = m;
  b->max_tokens = max_tokens;
  b->max_ctx = n_ctx;
  b->segs = mole_calloc((size_t)max_tokens, sizeof *b->segs);
  mole_status st = b->segs ? model_scratch_new(m, n_batch, n_ctx, &b->scratch)
                           : mole_errorf(MOLE_ERR_NOMEM, "batcher: out of memory");
  if (st) {
    mole_batcher_free(b);
    return st;
  }
  *out = b;
  return MOLE_OK;
}

void mole_batcher_free(mole_batcher *b) {
  if (!b) return;
  model_scratch_free(b->scratch);
  mole_free(b->segs);
  mole_free(b);
}

mole_status mole_batcher_eval(mole_batcher *b, const mole_batch_item *items, int64_t n_items) {
  if (n_items < 1 || n_items > b->max_tokens)
    return mole_errorf(MOLE_ERR_ARG, "batch: %lld items (1..%lld)", (long long)n_items, (long long)b->max_tokens);
  int64_t total = 0;
  for (int64_t i = 0; i < n_items; i++) {
    const mole_batch_item *it = &items[i];
    if (!it->session || it->session->m != b->m)
      return mole_errorf(MOLE_ERR_ARG, "batch item %lld: not a session of this model", (long long)i);
    if (it->n < 1 || !it->tokens) return mole_errorf(MOLE_ERR_ARG, "batch item %lld: no tokens", (long long)i);
    if (it->session->kv->n_ctx > b->max_ctx)
      return mole_errorf(MOLE_ERR_ARG, "batch item %lld: its context %lld exceeds the batcher's %lld", (long long)i,
                         (long long)it->session->kv->n_ctx, (long long)b->max_ctx);
    total += it->n;
    b->segs[i] = (model_seg){it->session->kv, it->tokens, it->n, it->session->n_past, it->logits, it->all_logits};
  }
  if (total > b->max_tokens)
    return mole_errorf(MOLE_ERR_ARG, "batch: %lld tokens exceed the batcher's %lld", (long long)total,
                       (long long)b->max_tokens);
  mole_status st = model_forward_batch(b->m, b->scratch, b->segs, n_items);
  if (st) return st;
  for (int64_t i = 0; i < n_items; i++) items[i].session->n_past += items[i].n;
  return MOLE_OK;
}
