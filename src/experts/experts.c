// The expert provider. This file holds the interface's front: the precision
// policy and the all-resident mode, whose views point into the GGUF mapping.
#include "experts/experts.h"

#include <string.h>

struct experts {
  mole_model *m;
  float t1, t2;
  // statistics
  int64_t n_steps, n_tokens;
  int64_t n_get[2];  // per precision
  int64_t n_skip;
};

mole_status experts_open(mole_model *m, experts **out) {
  *out = NULL;
  const mole_offload_params *o = &m->offload;
  if (!(o->t1 >= 0 && o->t1 <= 1 && o->t2 >= o->t1 && o->t2 <= 1))
    return mole_errorf(MOLE_ERR_ARG, "precision thresholds: need 0 <= t1 <= t2 <= 1 (got t1 %g, t2 %g)", o->t1, o->t2);
  experts *x = mole_calloc(1, sizeof *x);
  if (!x) return mole_errorf(MOLE_ERR_NOMEM, "experts: out of memory");
  x->m = m;
  x->t1 = o->t1;
  x->t2 = o->t2;
  *out = x;
  return MOLE_OK;
}

void experts_close(experts *x) { mole_free(x); }

bool experts_has_low(const experts *x) {
  (void)x;
  return false;
}

void experts_plan(experts *x, int64_t layer, int64_t n, int64_t k, const int32_t *sel, const float *w, uint8_t *prec) {
  (void)layer;
  (void)sel;
  const bool low = experts_has_low(x);
  for (int64_t t = 0; t < n; t++) {
    float sum = 0;
    for (int64_t j = 0; j < k; j++) sum += w[t * k + j];
    // unimportance of choice j: the normalised weight ranked above it
    float above = 0;
    for (int64_t j = 0; j < k; j++) {
      const float u = sum > 0 ? above / sum : 0;
      uint8_t p = u <= x->t1 ? EXPERT_HIGH : u <= x->t2 ? EXPERT_LOW : EXPERT_SKIP;
      if (p == EXPERT_LOW && !low) p = EXPERT_HIGH;
      prec[t * k + j] = p;
      if (p == EXPERT_SKIP) x->n_skip++;
      above += w[t * k + j];
    }
  }
}

static model_tensor slice(const model_tensor *t, int32_t e) {
  model_tensor v = *t;
  v.data = (const char *)t->data + (size_t)e * t->mat_bytes;
  v.ne2 = 1;
  return v;
}

mole_status experts_get(experts *x, int64_t layer, int32_t e, expert_prec p, expert_view *out) {
  MOLE_ASSERT(p == EXPERT_HIGH || p == EXPERT_LOW);
  MOLE_ASSERT(layer >= 0 && layer < x->m->hp.n_layer && e >= 0 && e < x->m->hp.n_expert);
  const model_layer *ly = &x->m->layers[layer];
  out->gate = slice(&ly->gate_exps, e);
  out->up = slice(&ly->up_exps, e);
  out->down = slice(&ly->down_exps, e);
  x->n_get[p]++;
  return MOLE_OK;
}

void experts_layer_done(experts *x, int64_t layer) {
  (void)x;
  (void)layer;
}

void experts_predict(experts *x, int64_t layer, const float *h) {
  (void)x;
  (void)layer;
  (void)h;
}

void experts_step_done(experts *x, int64_t n_tokens) {
  x->n_steps++;
  x->n_tokens += n_tokens;
}

void experts_reset_sequence(experts *x) { (void)x; }

void experts_print_stats(const experts *x, FILE *f) {
  fprintf(f, "experts: all resident (mapped); %lld high-precision uses, %lld skipped, over %lld tokens\n",
          (long long)x->n_get[EXPERT_HIGH], (long long)x->n_skip, (long long)x->n_tokens);
}
