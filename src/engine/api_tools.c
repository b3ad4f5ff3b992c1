// engine: the public API of the model-file tools and the offload settings
// (include/mole.h): budgets and cache policies, the cache simulator, synth,
// pack, compress and train-retain, over experts/, model/synth and engine/.
#include <string.h>

#include "engine/compress.h"
#include "engine/train_retain.h"
#include "experts/budget.h"
#include "experts/pack.h"
#include "experts/trace.h"
#include "model/synth.h"
#include "quant/quant_tq.h"

_Static_assert(MOLE_COMPRESS_CODE_WEIGHTS_MAX == 2 * TQ_PAIRS_MAX, "a code covers at most TQ_PAIRS_MAX pairs");

const char *mole_format_bytes(char *buf, size_t n, double bytes) { return experts_fmt_bytes(buf, n, bytes); }

// ---- offload settings and the cache simulator -----------------------------------

mole_status mole_parse_budget(const char *s, int64_t *bytes, double *frac) {
  if (!s || !bytes || !frac) return mole_errorf(MOLE_ERR_ARG, "mole_parse_budget: a NULL argument");
  return experts_parse_budget(s, bytes, frac);
}

mole_status mole_cache_policy_parse(const char *name, const float w_in[4], bool offline, const char **canonical,
                                    float w_out[4]) {
  experts_policy pol;
  float w[4];
  mole_status st = offline ? experts_policy_parse_offline(name, w_in, &pol, w) : experts_policy_parse(name, w_in, &pol, w);
  if (st) return st;
  if (canonical) *canonical = experts_policy_name(pol);
  if (w_out) memcpy(w_out, w, sizeof w);
  return MOLE_OK;
}

const char *mole_cache_policy_at(int64_t i) {
  return i >= 0 && i < EXPERTS_POLICY_COUNT ? experts_policy_name((experts_policy)i) : NULL;
}

mole_status mole_cachesim(const char *trace, const mole_cachesim_params *p, mole_cachesim_result *out) {
  if (!trace || !p || !out) return mole_errorf(MOLE_ERR_ARG, "mole_cachesim: a NULL argument");
  experts_sim_params sp = {.budget = p->budget, .budget_frac = p->budget_frac, .prefetch = p->prefetch};
  mole_status st = experts_policy_parse_offline(p->policy, p->weights, &sp.policy, sp.weights);
  if (st) return st;
  experts_sim_result r;
  if ((st = experts_cachesim(trace, &sp, &r))) return st;
  const experts_counts *c = &r.c;
  *out = (mole_cachesim_result){
      .policy = experts_policy_name(sp.policy),
      .offline = sp.policy == EXPERTS_POLICY_BELADY,
      .n_layer = r.h.n_layer,
      .n_expert = r.h.n_expert,
      .n_used = r.h.n_used,
      .budget = r.budget,
      .slots_high = r.slots[0],
      .slots_low = r.slots[1],
      .steps = r.steps,
      .tokens = r.tokens,
      .hits_high = c->hits[0],
      .misses_high = c->misses[0],
      .hits_low = c->hits[1],
      .misses_low = c->misses[1],
      .prefetch_hits = c->prefetch_hits[0] + c->prefetch_hits[1],
      .prefetches = c->prefetches,
      .prefetch_unused = c->prefetch_unused,
      .bytes_read = c->bytes_read,
      .bound_hits = r.bound_hits,
      .bound_requests = r.bound_requests,
      .bound_exact = r.bound_exact,
  };
  memcpy(out->weights, sp.weights, sizeof out->weights);
  return MOLE_OK;
}

// ---- synth, pack ------------------------------------------------------------------

mole_synth_params mole_synth_default_params(void) { return synth_default_params(); }

mole_status mole_synth(const mole_synth_params *p, const char *path, uint64_t *bytes) {
  if (!p || !path) return mole_errorf(MOLE_ERR_ARG, "mole_synth: %s is NULL", p ? "the output path" : "the parameters");
  return synth_write(p, path, bytes);
}

mole_pack_params mole_pack_default_params(void) { return (mole_pack_params){.high = -1, .low = -1}; }

mole_status mole_pack(const char *in, const char *out, const mole_pack_params *p, FILE *log) {
  if (!in || !out || !p) return mole_errorf(MOLE_ERR_ARG, "mole_pack: a NULL argument");
  if (p->low >= 0 && p->low_file)
    return mole_errorf(MOLE_ERR_ARG, "pack: a low type and a low file (%s) both given; the low tier is one or the other",
                       p->low_file);
  for (int k = 0; k < 2; k++) {
    const int t = k ? p->low : p->high;
    if (t >= 0 && !mole_type_writable(t))
      return mole_errorf(MOLE_ERR_ARG, "pack: the %s type %s is not one mole can write and compute with",
                         k ? "low" : "high", quant_type_name((uint32_t)t));
  }
  experts_pack_params pp = {.high = p->high, .low = p->low, .n_threads = p->n_threads};
  experts_pack_src *src = NULL;
  mole_status st = MOLE_OK;
  if (p->low_file && !(st = experts_pack_tier_open(p->low_file, in, &src))) {
    pp.tier[1] = experts_pack_src_tier(src);
    pp.book = experts_pack_src_book(src, &pp.book_n);
  }
  if (!st) st = experts_pack(in, out, &pp, log);
  experts_pack_tier_close(src);
  return st;
}

// ---- compress ---------------------------------------------------------------------

mole_compress_params mole_compress_default_params(void) {
  const compress_params d = compress_default_params();
  return (mole_compress_params){.calib = d.calib,
                                .calib_tokens = d.calib_tokens,
                                .seq_len = d.seq_len,
                                .grid = d.grid == GPTQ_2BIT ? MOLE_COMPRESS_2BIT : MOLE_COMPRESS_TERNARY,
                                .damp = d.damp,
                                .block = d.block,
                                .rtn = d.rtn,
                                .act_order = d.act_order,
                                .cap = d.cap,
                                .dead_zone = d.dead_zone,
                                .code_weights = 2 * d.code_pairs,
                                .n_threads = d.n_threads};
}

mole_status mole_compress(const char *in, const char *out, const mole_compress_params *p, FILE *log, FILE *report) {
  if (!in || !out || !p) return mole_errorf(MOLE_ERR_ARG, "mole_compress: a NULL argument");
  if (p->code_weights && (p->code_weights < 2 || p->code_weights > MOLE_COMPRESS_CODE_WEIGHTS_MAX || p->code_weights % 2))
    return mole_errorf(MOLE_ERR_ARG, "compress: code weights %d: expected 0 (auto) or an even number in 2..%d",
                       p->code_weights, MOLE_COMPRESS_CODE_WEIGHTS_MAX);
  if (p->grid != MOLE_COMPRESS_TERNARY && p->grid != MOLE_COMPRESS_2BIT)
    return mole_errorf(MOLE_ERR_ARG, "compress: grid %d is not ternary or 2-bit", (int)p->grid);
  const compress_params cp = {.calib = p->calib,
                              .calib_tokens = p->calib_tokens,
                              .seq_len = p->seq_len,
                              .grid = p->grid == MOLE_COMPRESS_2BIT ? GPTQ_2BIT : GPTQ_TERNARY,
                              .damp = p->damp,
                              .block = p->block,
                              .rtn = p->rtn,
                              .cap = p->cap,
                              .dead_zone = p->dead_zone,
                              .act_order = p->act_order,
                              .code_pairs = p->code_weights / 2,
                              .n_threads = p->n_threads};
  compress_report r;
  mole_status st = compress_model(in, out, &cp, log, &r);
  if (!st && report) compress_print_report(&r, &cp, report);
  return st;
}

// ---- train-retain -----------------------------------------------------------------

struct mole_retain_report {
  train_retain_report r;
  train_retain_params p;  // what it was trained with (the report prints them)
};

mole_train_retain_params mole_train_retain_default_params(void) { return train_retain_default_params(); }

mole_status mole_train_retain(const char *model, const char *out, const mole_train_retain_params *p, FILE *log,
                              mole_retain_report **report) {
  if (report) *report = NULL;
  if (!model || !out || !p) return mole_errorf(MOLE_ERR_ARG, "mole_train_retain: a NULL argument");
  mole_retain_report *h = mole_calloc(1, sizeof *h);
  if (!h) return mole_errorf(MOLE_ERR_NOMEM, "train-retain: out of memory");
  h->p = *p;
  mole_status st = train_retain_run(model, out, &h->p, log, &h->r);
  if (st || !report) {
    mole_retain_report_free(h);
    return st;
  }
  *report = h;
  return MOLE_OK;
}

void mole_retain_report_print(const mole_retain_report *r, FILE *f) { train_retain_print_report(&r->r, &r->p, f); }

mole_status mole_retain_report_save(const mole_retain_report *r, mole_report_format fmt, const char *path) {
  if (!r || !path) return mole_errorf(MOLE_ERR_ARG, "mole_retain_report_save: a NULL argument");
  switch (fmt) {
    case MOLE_REPORT_JSON: return train_retain_write_json(&r->r, &r->p, path);
    case MOLE_REPORT_CSV: return train_retain_write_csv(&r->r, path);
    case MOLE_REPORT_PNG: return train_retain_plot(&r->r, path);
  }
  return mole_errorf(MOLE_ERR_ARG, "train-retain: report format %d is not json, csv or png", (int)fmt);
}

void mole_retain_report_free(mole_retain_report *r) {
  if (!r) return;
  train_retain_report_free(&r->r);
  mole_free(r);
}
