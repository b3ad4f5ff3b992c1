// The attention kernel over an f32 KV cache (attn_job, blocks.h). Every
// token attends to its own sequence's cache (s->tok_kv), positions 0..its
// own (s->tok_pos): causal within the batch and across sequences.
#include <math.h>

#include "kv/kv.h"
#include "model/blocks.h"

// f32 cache, the reference mode: one (token, head) pair at a time,
// softmax(q.K^T * scale, causal) . V in the order ggml's AVX-512 build uses,
// so that logits match llama.cpp bit for bit there: the q.k dot of its
// vec_dot_f32; the exponentials with its polynomial exp over positions padded
// to 64, summed per block of 16 in its tree order and across blocks in double;
// p.V per output element accumulated in 16 lanes by position (its tinyBLAS
// gemm, batches) or in vec_dot_f32's 4x16 lanes (one token). Leaves the
// probabilities in sc [n_kv].
static void attn_pair_f32(const attn_job *j, int64_t t, int64_t h, float *sc) {
  const model_hparams *hp = &j->m->hp;
  const model_scratch *s = j->s;
  const int64_t hd = hp->head_dim, hdv = hp->head_dim_v, group = hp->n_head / hp->n_head_kv, NH = j->m->loc.n_head;
  const quant_traits *f32t = quant_traits_of(QT_F32);
  const int64_t g = h / group;
  const model_kv *kv = s->tok_kv[t];
  const int64_t n_kv = s->tok_nkv[t];  // causal: its own slot is the last it sees
  const bool batch = s->tok_segn[t] >= 2;  // ggml's order depends on its own batch's size
  const int64_t np = (n_kv + 63) & ~(int64_t)63;
  const float *q = s->q + t * NH * hd + h * hd;
  float mx = -INFINITY;
  for (int64_t i = 0; i < n_kv; i++) {
    float d;
    f32t->vec_dot(hd, &d, (const float *)kv_k_row(kv, j->layer, i) + g * hd, q);
    sc[i] = d * hp->attn_scale;
    mx = sc[i] > mx ? sc[i] : mx;
  }
  double sum = 0;
  for (int64_t b0 = 0; b0 < np; b0 += 16) {
    for (int64_t i = b0; i < b0 + 16; i++) sc[i] = i < n_kv ? ops_expf_poly_ref(sc[i] - mx) : 0.0f;
    sum += (double)ops_hsum16(sc + b0);
  }
  const float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n_kv; i++) sc[i] *= inv;
  float *o = s->att + t * NH * hdv + h * hdv;
  for (int64_t c = 0; c < hdv; c++) {
    float acc[4][16] = {{0}};
    for (int64_t i = 0; i < n_kv; i++) {
      const float v = ((const float *)kv_v_row(kv, j->layer, i))[g * hdv + c];
      float *a = batch ? &acc[0][i % 16] : &acc[(i % 64) / 16][i % 16];
      *a = fmaf(v, sc[i], *a);
    }
    if (!batch)
      for (int l = 0; l < 16; l++) acc[0][l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    o[c] = ops_hsum16(acc[0]);
  }
}

// Work items: (token, head) pairs; with h2o sums, (KV head, attention block)
// pairs (the same arithmetic per pair, in an order the sums can follow).
void attn_worker_f32(void *ctx, int ith, int nth) {
  const attn_job *j = ctx;
  model_scratch *s = j->s;
  const int64_t NH = j->m->loc.n_head, NKV = j->m->loc.n_head_kv, group = j->m->hp.n_head / j->m->hp.n_head_kv;
  float *sc = s->scores + (size_t)ith * (size_t)(s->n_ctx + 64);
  int64_t p0, p1;
  if (!j->h2o) {
    mole_split(j->n * NH, ith, nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) attn_pair_f32(j, p / NH, p % NH, sc);
    return;
  }
  const int64_t nb = j->blk1 - j->blk0;
  mole_split(NKV * nb, ith, nth, &p0, &p1);
  for (int64_t p = p0; p < p1; p++) {
    const int64_t g = p / nb, b = j->blk0 + p % nb, t0 = s->att_blk[2 * b], t1 = s->att_blk[2 * b + 1];
    float *a = kvpolicy_h2o_sums(s, b, g, s->tok_nkv[t1 - 1]);
    for (int64_t t = t0; t < t1; t++)
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        attn_pair_f32(j, t, h, sc);
        if (a)
          for (int64_t i = 0; i < s->tok_nkv[t]; i++) a[i] += sc[i];
      }
  }
}

// f16 cache: one work item is (KV head g, block of up to att_tb tokens of one
// sequence: s->att_blk). The scores
// of all the block's query rows (tokens x heads of the group) against the
