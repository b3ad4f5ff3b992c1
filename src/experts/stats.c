// Offload statistics: the struct for programs (bench --json) and the text
// of --stats.
#include <string.h>

#include "experts/budget.h"
#include "experts/experts_internal.h"

void experts_get_stats(const experts *x, experts_stats *o) {
  memset(o, 0, sizeof *o);
  const experts_store *st = &x->store;
  o->tiered = x->tiered;
  o->io = x->tiered ? experts_io_kind(x->io) : "mmap";
  o->direct = x->tiered && experts_io_direct(x->io);
  o->policy = experts_policy_name(x->policy);
  memcpy(o->weights, x->weights, sizeof o->weights);
  o->t1 = x->t1;
  o->t2 = x->t2;
  experts_predictor_stats ps = {0};
  if (x->pred) experts_predictor_get_stats(x->pred, &ps);
  o->prefetch_depth = ps.depth;
  o->has_low = st->has_low;
  o->budget_bytes = x->tiered ? x->budget : 0;
  for (int p = 0; p < 2; p++) {
    o->expert_bytes[p] = (int64_t)st->total_bytes[p];
    o->slot_bytes[p] = (int64_t)st->slot_bytes[p];
    if (!x->tiered) continue;
    o->slots[p] = x->tier.c.n_slots[p];
    for (int64_t s = 0; s < x->tier.c.n_slots[p]; s++)
      if (x->tier.c.slots[p][s].state == EXPERTS_SLOT_READY) o->resident_bytes += (int64_t)st->slot_bytes[p];
  }
  if (!x->tiered) o->resident_bytes = (int64_t)(st->total_bytes[0] + st->total_bytes[1]);
  o->tokens = x->n_tokens;
  o->steps = x->n_steps;
  o->total = x->total;
  o->last = x->last;
  memcpy(o->pred_correct_at, ps.correct_at, sizeof o->pred_correct_at);
  memcpy(o->pred_total_at, ps.total_at, sizeof o->pred_total_at);
  const experts_counts *t = &o->total;
  const int64_t hits = t->hits[0] + t->hits[1], req = hits + t->misses[0] + t->misses[1];
  o->hit_rate = req ? (double)hits / (double)req : -1;
  o->pred_accuracy = t->pred_total ? (double)t->pred_correct / (double)t->pred_total : -1;
  o->prefetch_useful = x->pred ? ps.useful : -1;
  o->prefetch_paused = x->pred && ps.paused;
  o->prefetch_on_tokens = ps.on_tokens;
  o->stall_gbps = t->stall_us > 0 ? (double)t->stall_bytes / ((double)t->stall_us * 1e3) : -1;
  const int64_t busy = x->tiered ? experts_io_busy_us(x->io) : 0;
  o->disk_gbps = busy > 0 && t->bytes_read > 0 ? (double)t->bytes_read / ((double)busy * 1e3) : -1;
}

static double pct(int64_t a, int64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

void experts_print_stats(const experts *x, FILE *f) {
  experts_stats s;
  experts_get_stats(x, &s);
  char a[32], b[32], c[32];
  const experts_counts *t = &s.total;
  const double ntok = (double)MOLE_MAX(s.tokens, 1);
  if (!s.tiered) {
    fprintf(f, "experts: all resident (mapped, %s); %lld high-", experts_fmt_bytes(a, sizeof a, (double)s.resident_bytes),
            (long long)t->hits[0]);
    if (s.has_low) fprintf(f, " and %lld low-", (long long)t->hits[1]);
    fprintf(f, "precision expert uses, %lld skipped, over %lld tokens\n", (long long)t->skips, (long long)s.tokens);
    if (t->pred_total)
      fprintf(f, "experts: prediction accuracy %.1f%% (depth %d)\n", 100.0 * s.pred_accuracy, s.prefetch_depth);
    return;
  }
  fprintf(f, "experts: tiered, budget %s: %lld high", experts_fmt_bytes(a, sizeof a, (double)s.budget_bytes),
          (long long)s.slots[0]);
  if (s.slots[1]) fprintf(f, " + %lld low", (long long)s.slots[1]);
  fprintf(f, " slots of %s", experts_fmt_bytes(b, sizeof b, (double)s.slot_bytes[0]));
  if (s.slots[1]) fprintf(f, " / %s", experts_fmt_bytes(c, sizeof c, (double)s.slot_bytes[1]));
  fprintf(f, "; policy %s (%.2g,%.2g,%.2g,%.2g), %s%s, t1 %.2g t2 %.2g, prefetch depth %d\n", s.policy,
          (double)s.weights[0], (double)s.weights[1], (double)s.weights[2], (double)s.weights[3], s.io,
          s.direct ? " O_DIRECT" : " buffered", (double)s.t1, (double)s.t2, s.prefetch_depth);
  for (int p = 0; p < (s.has_low ? 2 : 1); p++) {
    const int64_t req = t->hits[p] + t->misses[p];
    fprintf(f, "experts: %s precision: %lld requests, %.1f%% hits (%lld, of which %lld prefetched), %lld misses, %.2f misses/token\n",
            p ? "low" : "high", (long long)req, pct(t->hits[p], req), (long long)t->hits[p], (long long)t->prefetch_hits[p],
            (long long)t->misses[p], (double)t->misses[p] / ntok);
  }
  fprintf(f, "experts: %lld tokens in %lld steps; %lld choices skipped; read %s (%s/token) in %lld expert reads\n",
          (long long)s.tokens, (long long)s.steps, (long long)t->skips, experts_fmt_bytes(a, sizeof a, (double)t->bytes_read),
          experts_fmt_bytes(b, sizeof b, (double)t->bytes_read / ntok), (long long)t->reads);
  fprintf(f, "experts: I/O stall %.3f s (%.2f ms/token)", (double)t->stall_us / 1e6, (double)t->stall_us / 1e3 / ntok);
  if (s.stall_gbps >= 0) fprintf(f, ", the disk delivering %.2f GB/s meanwhile", s.stall_gbps);
  if (s.disk_gbps >= 0) fprintf(f, "; the disk read %.2f GB/s while it had reads", s.disk_gbps);
  fprintf(f, "\n");
  if (t->pred_total) {
    fprintf(f, "experts: prediction accuracy %.1f%% (", 100.0 * s.pred_accuracy);
    for (int d = 0; d < EXPERTS_MAX_DEPTH; d++)
      if (s.pred_total_at[d])
        fprintf(f, "%s%d ahead %.1f%%", d ? ", " : "", d + 1, pct(s.pred_correct_at[d], s.pred_total_at[d]));
    fprintf(f, "); %lld prefetched, %lld unused; predicted experts not in RAM used %.0f%% of the time",
            (long long)t->prefetches, (long long)t->prefetch_unused, 100.0 * s.prefetch_useful);
    if (x->depth_cfg < 0 && x->pred)
      fprintf(f, "; adaptive: prefetching for %lld of the decode tokens, %s now", (long long)s.prefetch_on_tokens,
              s.prefetch_paused ? "paused" : "on");
    fprintf(f, "\n");
  }
  const experts_counts *l = &s.last;
  fprintf(f, "experts: last token: %lld hits, %lld misses, %lld skipped, read %s, stall %.2f ms; resident %s of experts\n",
          (long long)(l->hits[0] + l->hits[1]), (long long)(l->misses[0] + l->misses[1]), (long long)l->skips,
          experts_fmt_bytes(a, sizeof a, (double)l->bytes_read), (double)l->stall_us / 1e3,
          experts_fmt_bytes(b, sizeof b, (double)s.resident_bytes));
}
