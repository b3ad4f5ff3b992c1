// Offloading (HOBBIT): a MoE layer's routed experts computed as the expert
// provider (src/experts/) supplies their weights. (token, choice) pairs are
// grouped by (expert, precision) so each expert's matrices are read once per
// batch; the provider supplies the weights (mapped, or from its RAM cache)
// and its plan says which precision each choice gets, or that it is skipped.
// Groups are computed as their weights land: every group already resident
// is computed in one set while the others are still being read; only when
// none is ready does the layer wait, for one. When the budget holds fewer
// experts than the layer uses at once (a prompt batch), computed groups are
// released so that the rest get slots: the layer is computed in waves.
#include <string.h>

#include "model/blocks.h"

// offload_experts' progress on a group: not used, weights not obtained yet,
// computed and still pinned, computed and released.
enum { GRP_UNUSED = 0, GRP_PENDING, GRP_HELD, GRP_DONE };

// Releases the computed groups still pinned: the groups without a slot need the room.
static void offload_release_held(mole_model *m, model_scratch *s, int64_t il) {
  for (int64_t g = 0; g < 2 * m->hp.n_expert; g++)
    if (s->grp_state[g] == GRP_HELD) {
      experts_release(m->experts, il, (int32_t)(g / 2), (expert_prec)(g % 2));
      s->grp_state[g] = GRP_DONE;
    }
}

// In: n rows of s->xn with K choices each (s->sel, s->selw [n][K]). Out: the
// unweighted output of choice i in s->ff_o row s->tok_slot[i] (-1: skipped).
mole_status offload_experts(mole_model *m, model_scratch *s, int64_t il, int64_t n, int64_t K) {
  const int64_t G = 2 * m->hp.n_expert;
  experts *xp = m->experts;
  experts_plan(xp, il, n, K, s->sel, s->selw, s->prec);
  // groups g = 2*expert + precision: slots [grp_off[g], grp_off[g]+grp_cnt[g])
  memset(s->grp_cnt, 0, (size_t)G * sizeof *s->grp_cnt);
  for (int64_t i = 0; i < n * K; i++)
    if (s->prec[i] != EXPERT_SKIP) s->grp_cnt[2 * s->sel[i] + s->prec[i]]++;
  int64_t off = 0;
  for (int64_t g = 0; g < G; g++) {
    s->grp_off[g] = off;
    off += s->grp_cnt[g];
    s->grp_cnt[g] = 0;
  }
  for (int64_t i = 0; i < n * K; i++) {
    s->tok_slot[i] = -1;
    if (s->prec[i] == EXPERT_SKIP) continue;
    const int64_t g = 2 * s->sel[i] + s->prec[i];
    const int64_t slot = s->grp_off[g] + s->grp_cnt[g]++;
    s->slot_tok[slot] = i / K;
    s->tok_slot[i] = slot;
  }
  int64_t n_pending = 0;
  for (int64_t g = 0; g < G; g++) {
    s->grp_state[g] = s->grp_cnt[g] ? GRP_PENDING : GRP_UNUSED;
    n_pending += s->grp_cnt[g] > 0;
  }
  quant_type conv_t[2] = {QT_COUNT, QT_COUNT};
  mole_status st = MOLE_OK;
  while (n_pending > 0) {
    // every pending group whose weights are here; else the first being read,
    // else the first still without a slot
    int64_t nr = 0, loading = -1, no_slot = -1;
    for (int64_t g = 0; g < G; g++) {
      if (s->grp_state[g] != GRP_PENDING) continue;
      const experts_avail a = experts_ready(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2));
      if (a == EXPERTS_READY) s->grp_list[nr++] = g;
      else if (a == EXPERTS_LOADING && loading < 0) loading = g;
      else if (a == EXPERTS_NO_SLOT && no_slot < 0) no_slot = g;
    }
    if (nr == 0) {
      const int64_t g = loading >= 0 ? loading : no_slot;
      if (loading < 0) offload_release_held(m, s, il);  // its slot can only come from computed groups
      st = experts_get(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2), &s->views[g]);  // blocks
      if (st) break;
      s->grp_list[nr++] = g;
      // and whatever else landed meanwhile
      for (int64_t h = 0; h < G; h++)
        if (h != g && s->grp_state[h] == GRP_PENDING &&
            experts_ready(xp, il, (int32_t)(h / 2), (expert_prec)(h % 2)) == EXPERTS_READY)
          s->grp_list[nr++] = h;
    }
    for (int64_t i = 0; i < nr && !st; i++) {
      const int64_t g = s->grp_list[i];
      st = experts_get(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2), &s->views[g]);  // resident: no wait
    }
    if (st) break;
    moe_compute_groups(m, s, n, s->grp_list, nr, conv_t);
    for (int64_t i = 0; i < nr; i++) s->grp_state[s->grp_list[i]] = GRP_HELD;
    n_pending -= nr;
    // groups still without a slot get those of the computed ones
    if (no_slot >= 0) offload_release_held(m, s, il);
  }
  experts_layer_done(xp, il);
  return st;
}

