// The forward pass shared by every supported architecture (llama/Mixtral,
// qwen2moe, qwen3moe, olmoe): one readable loop over layers, with the
// per-architecture differences as hparams flags. Shapes beside each buffer.
#include <math.h>
#include <string.h>

#include "experts/experts.h"
#include "kv/kv.h"
#include "kv/retain.h"
#include "model/ops.h"
#include "quant/quant_exact.h"

enum { ATT_VT = 32 };  // keys per tile of the f16 attention's p.V
// h2o: the attention blocks of a pass run in rounds whose per-block sums fit
// this many floats (a long chunk's blocks would otherwise need blocks x
// KV heads x context floats at once)
enum { H2O_ROUND_FLOATS = 1 << 20 };

struct model_scratch {
  int64_t n_batch, n_ctx, n_assign_max, ff_max;
  size_t q_row;       // bytes of one converted activation row (largest k)
  float *x;           // [n_batch][n_embd] residual stream
  float *xn;          // [n_batch][n_embd] normed input of a block
  float *q;           // [n_batch][n_head*head_dim]
  float *k;           // [n_batch][n_head_kv*head_dim]
  float *v;           // [n_batch][n_head_kv*head_dim_v]
  float *att;         // [n_batch][n_head*head_dim_v]
  float *y;           // [n_batch][n_embd] block output
  float *sh;          // [n_batch][n_embd] shared expert output
  float *scores;      // [nth][n_ctx + 64] attention scores per thread (f32 cache)
  float *vacc;        // [nth][ATT_VT][head_dim_v] value rows as f32 per thread (a tile of keys)
  int64_t att_tb;     // tokens per attention block (f16 cache)
  float *att_s;       // [nth][att_tb*group][n_ctx] scores of a block (f16 cache)
  uint16_t *att_q;    // [nth][att_tb*group][head_dim] f16 queries of a block
  uint16_t *att_p16;  // [nth][n_ctx] one row of probabilities in f16
  void *xq;           // [n_assign_max][q_row] converted activations
  void *hq;           // [n_assign_max][q_row] converted FFN hidden rows
  float *ff_g;        // [n_assign_max][ff_max]
  float *ff_u;        // [n_assign_max][ff_max]
  float *ff_o;        // [n_assign_max][n_embd] expert outputs
  float *router;      // [n_batch][n_expert] logits, then probabilities
  int32_t *sel;       // [n_batch][n_expert_used] chosen experts
  float *selw;        // [n_batch][n_expert_used] their weights
  uint8_t *prec;      // [n_batch][n_expert_used] precision of each choice
  int64_t *grp_cnt;   // [2*n_expert] slots of each (expert, precision) group
  int64_t *grp_off;   // [2*n_expert] first slot of each group
  expert_view *views; // [2*n_expert] weights of each group in use
  int64_t *slot_tok;  // [n_assign_max] token of each assignment slot
  int64_t *tok_slot;  // [n_batch][n_expert_used] slot of each (token, choice)
  int64_t *grp_list;  // [2*n_expert] groups computed together
  uint8_t *grp_state; // [2*n_expert] moe_ffn's progress on each group (MOE_*)
  ops_mm *tasks;      // [4*n_expert + 4]
  // the batch's sequences (model_forward_batch)
  int64_t n_seg, n_out;
  int64_t *seg_ends;  // [n_batch] cumulative token counts per sequence
  int64_t *tok_pos;   // [n_batch] position of each token
  int64_t *tok_nkv;   // [n_batch] cache slots each token attends to (its own is the last)
  float *h2o;         // [a round's h2o blocks][n_head_kv][their cache's n_ctx] attention each slot received from a block
  int64_t h2o_cap;    // floats at h2o: a round's blocks fit (grown on demand, h2o_round or one block's)
  int64_t h2o_round;  // floats a round may take (H2O_ROUND_FLOATS)
  int64_t *blk_h2o;   // [n_batch] offset of each attention block's sums in h2o in its round; -1: not h2o
  bool any_h2o;       // a sequence of the batch has a bounded h2o cache
  void *retain_tmp;   // kv_retain_tmp_bytes of the pass's largest locret sequence (grown on demand)
  size_t retain_tmp_cap;
  model_kv **tok_kv;  // [n_batch] KV cache of each token's sequence
  int64_t *tok_segn;  // [n_batch] tokens of each token's sequence in this batch
  int64_t n_blk;
  int64_t *att_blk;   // [n_batch][2] attention blocks (f16 cache): first, end token, one sequence each
  int64_t *out_tok;   // [n_batch] tokens whose logits are wanted
  int64_t n_out_seg;
  int64_t *out_ends;  // [n_batch] cumulative counts of those per sequence
  int64_t *sub_ends;  // [n_batch] segment ends within a tile of rows (model_comm overlap)
  float *lg_local;    // [n_batch][local vocab rows] this process's logits slice (sharded output)
};

void model_session_shape(const mole_model *m, int64_t *n_ctx, int64_t *n_batch) {
  if (*n_ctx <= 0) *n_ctx = MOLE_MIN(m->hp.n_ctx_train, 4096);
  if (*n_batch <= 0) *n_batch = 512;
  if (*n_batch > *n_ctx) *n_batch = *n_ctx;
}

// The scratch's buffers: one walk over them either allocates (s != NULL) or
// only adds up their bytes, so the size estimate cannot drift from the code.
static bool scratch_walk(const mole_model *m, int64_t n_batch, int64_t n_ctx, model_scratch *s, int64_t *bytes) {
  const model_hparams *hp = &m->hp;
  const int nth = m->n_threads;
  const model_local *lc = &m->loc;  // this process's share of heads and columns
  const int64_t ff_max = MOLE_MAX(MOLE_MAX(lc->n_ff, lc->n_ff_exp), lc->n_ff_shexp);
  const int64_t kmax = MOLE_MAX(MOLE_MAX(hp->n_embd, ff_max), lc->n_head * hp->head_dim_v);
  const size_t q_row = (size_t)kmax * 4 + 64;  // f32 is the widest activation type
  const int64_t q_dim = lc->n_head * hp->head_dim, kv_dim = lc->n_head_kv * hp->head_dim,
                v_dim = lc->n_head_kv * hp->head_dim_v, o_dim = lc->n_head * hp->head_dim_v;
  const int64_t X = MOLE_MAX(hp->n_expert, 1), U = MOLE_MAX(hp->n_expert_used, 1);
  const int64_t B = n_batch, A = n_batch * U;
  const int64_t group = hp->n_head / hp->n_head_kv, att_tb = MOLE_MAX(64 / group, 1);
  model_scratch dummy;
  model_scratch *t = s ? s : &dummy;
  if (s) {
    s->n_batch = n_batch;
    s->n_ctx = n_ctx;
    s->n_assign_max = A;
    s->ff_max = ff_max;
    s->q_row = q_row;
    s->att_tb = att_tb;
    s->h2o_round = H2O_ROUND_FLOATS;
  }
  int64_t sum = 0;
  bool ok = true;
#define ALLOC(p, n)                                                                      \
  do {                                                                                   \
    const size_t nb_ = (size_t)(n) * sizeof *(t->p);                                     \
    sum += (int64_t)nb_;                                                                 \
    if (s) ok = ok && (s->p = mole_aligned_alloc(64, nb_)) != NULL;                      \
  } while (0)
#define ALLOC_BYTES(p, nb)                                                               \
  do {                                                                                   \
    sum += (int64_t)(nb);                                                                \
    if (s) ok = ok && (s->p = mole_aligned_alloc(64, (size_t)(nb))) != NULL;             \
  } while (0)
  ALLOC(x, B * hp->n_embd);
  ALLOC(xn, B * hp->n_embd);
  ALLOC(q, B * q_dim);
  ALLOC(k, B * kv_dim);
  ALLOC(v, B * v_dim);
  ALLOC(att, B * o_dim);
  ALLOC(y, B * hp->n_embd);
  ALLOC(sh, B * hp->n_embd);
  ALLOC(scores, nth * (n_ctx + 64));
  ALLOC(vacc, nth * ATT_VT * hp->head_dim_v);
  ALLOC(att_s, nth * att_tb * group * n_ctx);
  ALLOC(att_q, nth * att_tb * group * hp->head_dim);
  ALLOC(att_p16, nth * n_ctx);
  ALLOC_BYTES(xq, (size_t)A * q_row);
  ALLOC_BYTES(hq, (size_t)A * q_row);
  ALLOC(ff_g, A * ff_max);
  ALLOC(ff_u, A * ff_max);
  ALLOC(ff_o, A * hp->n_embd);
  ALLOC(router, B * X);
  ALLOC(sel, B * U);
  ALLOC(selw, B * U);
  ALLOC(prec, B * U);
  ALLOC(grp_cnt, 2 * X);
  ALLOC(grp_off, 2 * X);
  ALLOC(views, 2 * X);
  ALLOC(slot_tok, A);
  ALLOC(tok_slot, B * U);
  ALLOC(grp_list, 2 * X);
  ALLOC(grp_state, 2 * X);
  ALLOC(tasks, 4 * X + 4);
  ALLOC(seg_ends, B);
  ALLOC(tok_pos, B);
  ALLOC(tok_nkv, B);
  ALLOC(blk_h2o, B);
  ALLOC(tok_kv, B);
  ALLOC(tok_segn, B);
  ALLOC(att_blk, 2 * B);
  ALLOC(out_tok, B);
  ALLOC(out_ends, B);
  ALLOC(sub_ends, B);
  ALLOC(lg_local, m->loc.n_vocab < hp->n_vocab ? B * m->loc.n_vocab : 1);
#undef ALLOC
#undef ALLOC_BYTES
  if (bytes) *bytes = sum;
  return ok;
}

void model_scratch_set_h2o_round(model_scratch *s, int64_t floats) { s->h2o_round = MOLE_MAX(floats, 1); }

int64_t model_scratch_bytes(const mole_model *m, int64_t n_batch, int64_t n_ctx) {
  int64_t b = 0;
  scratch_walk(m, n_batch, n_ctx, NULL, &b);
  return b;
}

mole_status model_scratch_new(const mole_model *m, int64_t n_batch, int64_t n_ctx, model_scratch **out) {
  *out = NULL;
  model_scratch *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "scratch: out of memory");
  if (!scratch_walk(m, n_batch, n_ctx, s, NULL)) {
    model_scratch_free(s);
    return mole_errorf(MOLE_ERR_NOMEM, "scratch: cannot allocate buffers for a batch of %lld tokens", (long long)n_batch);
  }
  *out = s;
  return MOLE_OK;
}

void model_scratch_free(model_scratch *s) {
  if (!s) return;
  void *bufs[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->y, s->sh, s->scores, s->vacc, s->att_s, s->att_q, s->att_p16, s->xq, s->hq,
                  s->ff_g, s->ff_u, s->ff_o, s->router, s->sel, s->selw, s->prec, s->grp_cnt, s->grp_off, s->views, s->slot_tok,
                  s->tok_slot, s->grp_list, s->grp_state, s->tasks, s->seg_ends, s->tok_pos, s->tok_nkv, s->h2o, s->blk_h2o, s->retain_tmp, s->tok_kv, s->tok_segn,
                  s->att_blk, s->out_tok, s->out_ends, s->sub_ends, s->lg_local};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mole_aligned_free(bufs[i]);
  mole_free(s);
}

// ---- attention ------------------------------------------------------------
// Every token attends to its own sequence's cache (s->tok_kv), positions
// 0..its own (s->tok_pos): causal within the batch and across sequences.
typedef struct {
  const mole_model *m;
  model_scratch *s;
  int64_t layer, n;
  bool h2o;            // a sequence of the batch is h2o: blocks add their attention weights into s->h2o
  int64_t blk0, blk1;  // the attention blocks of this run (one round)
} attn_job;

// The h2o sums of attention block b for KV head g (zeroed for its n_kv
// keys), or NULL when b's sequence does not keep them. One work item owns a
// (block, head) pair, so the sums do not depend on threads or on the batch.
static float *h2o_sums(const model_scratch *s, int64_t b, int64_t g, int64_t n_kv) {
  if (s->blk_h2o[b] < 0) return NULL;
  float *a = s->h2o + s->blk_h2o[b] + g * s->tok_kv[s->att_blk[2 * b]]->n_ctx;
  memset(a, 0, (size_t)n_kv * sizeof(float));
  return a;
}

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
static void attn_worker(void *ctx, int ith, int nth) {
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
    float *a = h2o_sums(s, b, g, s->tok_nkv[t1 - 1]);
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
// keys are one f16 matmul (queries rounded to f16, as ggml does); each value
// row is converted once per block and added into every query's output with
// its probability rounded to f16.
static void attn_worker_f16(void *ctx, int ith, int nth) {
  const attn_job *j = ctx;
  const model_hparams *hp = &j->m->hp;
  model_scratch *s = j->s;
  const int64_t hd = hp->head_dim, hdv = hp->head_dim_v, group = hp->n_head / hp->n_head_kv, TB = s->att_tb;
  const int64_t n_blk = j->blk1 - j->blk0, ldq = j->m->loc.n_head * hd, ldo = j->m->loc.n_head * hdv;
  const quant_traits *f16t = quant_traits_of(QT_F16);
  float *S = s->att_s + (size_t)ith * (size_t)(TB * group * s->n_ctx);
  uint16_t *Q = s->att_q + (size_t)ith * (size_t)(TB * group * hd);
  float *vr = s->vacc + (size_t)ith * (size_t)(ATT_VT * hdv);
  uint16_t *p16 = s->att_p16 + (size_t)ith * (size_t)s->n_ctx;
  int64_t p0, p1;
  mole_split(j->m->loc.n_head_kv * n_blk, ith, nth, &p0, &p1);
  for (int64_t p = p0; p < p1; p++) {
    const int64_t g = p / n_blk, b = j->blk0 + p % n_blk, t0 = s->att_blk[2 * b], t1 = s->att_blk[2 * b + 1];
    const model_kv *kv = s->tok_kv[t0];
    const int64_t rows = (t1 - t0) * group, n_kv = s->tok_nkv[t1 - 1];  // keys any row of the block sees
    float *h2o = j->h2o ? h2o_sums(s, b, g, n_kv) : NULL;
    MOLE_ASSERT(t1 - t0 <= TB);
    for (int64_t t = t0; t < t1; t++)
      for (int64_t h = 0; h < group; h++)
        f16t->from_float(s->q + t * ldq + (g * group + h) * hd, Q + ((t - t0) * group + h) * hd, hd);
    quant_gemm(QT_F16, (const char *)kv_k_row(kv, j->layer, 0) + (size_t)g * (size_t)hd * 2, kv->k_row, Q,
               (size_t)hd * 2, S, s->n_ctx, 0, n_kv, rows, hd);
    for (int64_t r = 0; r < rows; r++) {
      const int64_t t = t0 + r / group, len = s->tok_nkv[t];
      float *sc = S + r * s->n_ctx, mx = -INFINITY;
      for (int64_t i = 0; i < len; i++) {
        sc[i] *= hp->attn_scale;
        mx = sc[i] > mx ? sc[i] : mx;
      }
      double sum = 0;
      for (int64_t i = 0; i < len; i++) {
        sc[i] = expf(sc[i] - mx);
        sum += sc[i];
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t i = 0; i < len; i++) sc[i] *= inv;
      f16t->from_float(sc, p16, len);  // probabilities rounded to f16 (a row at a time: the SIMD twins)
      f16t->to_float(p16, sc, len);
      if (h2o)
        for (int64_t i = 0; i < len; i++) h2o[i] += sc[i];
      memset(s->att + t * ldo + (g * group + r % group) * hdv, 0, (size_t)hdv * sizeof(float));
    }
    // p.V a tile of ATT_VT keys at a time: each query row's output adds the
    // tile's value rows in key order (as one axpy per key would)
    for (int64_t i0 = 0; i0 < n_kv; i0 += ATT_VT) {
      const int64_t i1 = MOLE_MIN(i0 + ATT_VT, n_kv);
      for (int64_t i = i0; i < i1; i++)
        f16t->to_float((const uint16_t *)kv_v_row(kv, j->layer, i) + g * hdv, vr + (i - i0) * hdv, hdv);
      for (int64_t r = 0; r < rows; r++) {
        const int64_t t = t0 + r / group, lim = MOLE_MIN(i1, s->tok_nkv[t]);  // causal
        if (lim > i0)
          ops_pv(s->att + t * ldo + (g * group + r % group) * hdv, S + r * s->n_ctx + i0, vr, lim - i0, hdv);
      }
    }
  }
}

// Converts n rows of `x` (stride ldx, length k) for a matmul with w into s->xq.
static void convert_for(const mole_model *m, model_scratch *s, const model_tensor *w, const float *x, int64_t ldx,
                        int64_t n, int64_t k, void *dst) {
  ops_convert_rows(m->pool, ops_vec_type(w), x, ldx, n, k, dst, s->q_row);
}

// A dense matmul over the batch's n tokens (each sequence's tokens in the
// order they would have alone, s->seg_ends).
static ops_mm mm_of(const model_scratch *s, const model_tensor *w, const void *x, size_t xstride, int64_t n, float *y,
                    int64_t ldy) {
  return (ops_mm){w, 0, x, xstride, n, y, ldy, false, s->n_seg, s->seg_ends};
}
// The sequences' ends clipped to token rows [a, b), counted from a, into
// s->sub_ends; returns how many.
static int64_t clip_ends(model_scratch *s, int64_t a, int64_t b) {
  int64_t k = 0;
  for (int64_t i = 0; i < s->n_seg; i++) {
    const int64_t e = MOLE_MIN(s->seg_ends[i], b);
    if (e > a && (k == 0 || e - a > s->sub_ends[k - 1])) s->sub_ends[k++] = e - a;
  }
  return k;
}
// The same over token rows [a, b) only (a tile around a collective).
static ops_mm mm_rows(model_scratch *s, const model_tensor *w, const void *x, size_t xstride, int64_t a, int64_t b,
                      float *y, int64_t ldy) {
  const int64_t k = clip_ends(s, a, b);
  return (ops_mm){w, 0, (const char *)x + (size_t)a * xstride, xstride, b - a, y + a * ldy, ldy, false, k, s->sub_ends};
}
// One expert's share of a routed matmul (per-token orders).
static ops_mm mm_expert(const model_tensor *w, const void *x, size_t xstride, int64_t n, float *y, int64_t ldy) {
  return (ops_mm){w, 0, x, xstride, n, y, ldy, true, 0, NULL};
}

// The token rows this process's connective blocks (norms, residuals) hold:
// its share of the batch (hmp), else all of them.
static void own_rows(const mole_model *m, int64_t n, int64_t *t0, int64_t *t1) {
  if (m->comm.hmp) {
    m->comm.token_split(m->comm.ctx, n, m->comm.rank, t0, t1);
  } else {
    *t0 = 0;
    *t1 = n;
  }
}

// Rows [a, b) of xn through a layer's projections, around a collective.
typedef struct {
  mole_model *m;
  model_scratch *s;
  const model_layer *ly;
  int64_t F;  // dense FFN: its columns here
} rows_job;

static void qkv_rows(void *user, int64_t a, int64_t b) {
  rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const model_layer *ly = j->ly;
  const int64_t E = m->hp.n_embd, q_dim = m->loc.n_head * m->hp.head_dim, k_dim = m->loc.n_head_kv * m->hp.head_dim,
                v_dim = m->loc.n_head_kv * m->hp.head_dim_v;
  // converted once when the types agree
  char *xq = (char *)s->xq + (size_t)a * s->q_row, *xk = xq, *xv = xq;
  convert_for(m, s, &ly->wq, s->xn + a * E, E, b - a, E, xq);
  if (ops_vec_type(&ly->wk) != ops_vec_type(&ly->wq)) {
    xk = (char *)s->hq + (size_t)a * s->q_row;
    convert_for(m, s, &ly->wk, s->xn + a * E, E, b - a, E, xk);
  }
  MOLE_ASSERT(ops_vec_type(&ly->wv) == ops_vec_type(&ly->wq) || ops_vec_type(&ly->wv) == ops_vec_type(&ly->wk));
  if (ops_vec_type(&ly->wv) != ops_vec_type(&ly->wq)) xv = xk;
  // rows relative to the tile: mm_rows offsets x and y by a
  ops_mm t3[3] = {mm_rows(s, &ly->wq, xq - (size_t)a * s->q_row, s->q_row, a, b, s->q, q_dim),
                  mm_rows(s, &ly->wk, xk - (size_t)a * s->q_row, s->q_row, a, b, s->k, k_dim),
                  mm_rows(s, &ly->wv, xv - (size_t)a * s->q_row, s->q_row, a, b, s->v, v_dim)};
  ops_mm_run(m->pool, t3, 3);
}

static void wo_rows(void *user, int64_t a, int64_t b) {
  rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const int64_t E = m->hp.n_embd, o_dim = m->loc.n_head * m->hp.head_dim_v;
  convert_for(m, s, &j->ly->wo, s->att + a * o_dim, o_dim, b - a, o_dim, (char *)s->xq + (size_t)a * s->q_row);
  ops_mm t1 = mm_rows(s, &j->ly->wo, s->xq, s->q_row, a, b, s->y, E);
  ops_mm_run(m->pool, &t1, 1);
}

// y over the processes: the sum of the row-parallel matmul's parts, made by
// fill(a, b); with hmp only this process's rows are summed here.
static void reduce_rows(mole_model *m, model_scratch *s, int64_t n, model_rows_fn fill, void *user) {
  const int64_t E = m->hp.n_embd;
  if (m->comm.hmp) {
    m->comm.reduce_scatter(m->comm.ctx, s->y, n, E, fill, user);
    return;
  }
  if (fill) fill(user, 0, n);
  if (m->comm.allreduce) m->comm.allreduce(m->comm.ctx, s->y, n * E, false);
}

// xn of every token: this process's rows gathered with the others' (hmp),
// compute(a, b) run on the rows as they come; else compute on all of them.
static void gather_rows(mole_model *m, model_scratch *s, int64_t n, model_rows_fn compute, void *user) {
  if (m->comm.hmp) {
    m->comm.allgather(m->comm.ctx, s->xn, n, m->hp.n_embd, compute, user);
    return;
  }
  if (compute) compute(user, 0, n);
}

// RMS norm of x over the whole projection when a process holds only part of
// it (olmoe's q/k norm under tensor parallelism): the sum of squares of
// every process's part.
static void norm_full(mole_model *m, float *x, const float *w, int64_t n_local, int64_t n_global) {
  double sum = 0.0;
  for (int64_t i = 0; i < n_local; i++) sum += (double)(x[i] * x[i]);
  if (m->comm.allreduce) m->comm.allreduce(m->comm.ctx, &sum, 1, true);
  const float scale = 1.0f / sqrtf((float)(sum / (double)n_global) + m->hp.rms_eps);
  for (int64_t i = 0; i < n_local; i++) x[i] = (x[i] * scale) * w[i];
}

// h2o: the attention each entry received from the round's blocks, added
// into its cache's scores a block at a time in block order (so the same
// whatever the threads or the other sequences of the batch).
static void h2o_add(model_scratch *s, int64_t il, int64_t NKV, int64_t blk0, int64_t blk1) {
  for (int64_t b = blk0; b < blk1; b++) {
    if (s->blk_h2o[b] < 0) continue;
    model_kv *kv = s->tok_kv[s->att_blk[2 * b]];
    const int64_t n_kv = s->tok_nkv[s->att_blk[2 * b + 1] - 1];
    for (int64_t g = 0; g < NKV; g++) {
      const float *a = s->h2o + s->blk_h2o[b] + g * kv->n_ctx;
      float *sc = kv_score_row(kv, il, g);
      for (int64_t i = 0; i < n_kv; i++) sc[i] += a[i];
    }
  }
}

static void attention_block(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t NH = m->loc.n_head, NKV = m->loc.n_head_kv;  // this process's heads
  const int64_t E = hp->n_embd, hd = hp->head_dim, q_dim = NH * hd, k_dim = NKV * hd, v_dim = NKV * hp->head_dim_v;
  const bool split = m->loc.n_head < hp->n_head;
  int64_t t0, t1;
  own_rows(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, ly->attn_norm, E, hp->rms_eps);
  // Q, K, V: this process's heads of every token
  rows_job rj = {m, s, ly, 0};
  gather_rows(m, s, n, qkv_rows, &rj);
  if (!m->comm.hmp) qkv_rows(&rj, 0, n);
  for (int64_t t = 0; t < n; t++) {
    float *q = s->q + t * q_dim, *k = s->k + t * k_dim, *v = s->v + t * v_dim;
    if (ly->bq) for (int64_t i = 0; i < q_dim; i++) q[i] += ly->bq[i];
    if (ly->bk) for (int64_t i = 0; i < k_dim; i++) k[i] += ly->bk[i];
    if (ly->bv) for (int64_t i = 0; i < v_dim; i++) v[i] += ly->bv[i];
    if (hp->qk_norm_full && split) {
      norm_full(m, q, ly->q_norm, q_dim, hp->n_head * hd);
      norm_full(m, k, ly->k_norm, k_dim, hp->n_head_kv * hd);
    } else if (hp->qk_norm_full) {
      ops_rmsnorm(q, q, ly->q_norm, q_dim, hp->rms_eps);
      ops_rmsnorm(k, k, ly->k_norm, k_dim, hp->rms_eps);
    } else if (hp->qk_norm_head) {
      for (int64_t h = 0; h < NH; h++) ops_rmsnorm(q + h * hd, q + h * hd, ly->q_norm, hd, hp->rms_eps);
      for (int64_t h = 0; h < NKV; h++) ops_rmsnorm(k + h * hd, k + h * hd, ly->k_norm, hd, hp->rms_eps);
    }
  }
  if (m->attn_hook) m->attn_hook(m->attn_hook_ctx, il, n, s->q, s->k, s->v, false);
  // locret: a sequence's new entries are scored by its retaining heads (kv->retain_out [its n][NKV])
  for (int64_t i = 0, a = 0; i < s->n_seg; a = s->seg_ends[i++]) {
    model_kv *kv = s->tok_kv[a];
    if (kv->policy == KV_LOCRET)
      kv_retain_score(kv->retain, il, s->seg_ends[i] - a, s->q + a * q_dim, q_dim, s->k + a * k_dim, k_dim,
                      s->v + a * v_dim, v_dim, kv->retain_out, NKV, s->retain_tmp);
  }
  for (int64_t t = 0; t < n; t++) {
    float *q = s->q + t * q_dim, *k = s->k + t * k_dim;
    ops_rope(q, NH, hd, s->tok_pos[t], hp, m->rope_freqs);
    ops_rope(k, NKV, hd, s->tok_pos[t], hp, m->rope_freqs);
  }
  if (m->attn_hook) m->attn_hook(m->attn_hook_ctx, il, n, s->q, s->k, s->v, true);
  for (int64_t i = 0, a = 0; i < s->n_seg; a = s->seg_ends[i++])
    for (int64_t t = a; t < s->seg_ends[i]; t++) {
      model_kv *kv = s->tok_kv[t];
      kv_store(kv, il, s->tok_nkv[t] - 1, s->tok_pos[t], s->k + t * k_dim, s->v + t * v_dim,
               kv->policy == KV_LOCRET ? kv->retain_out + (t - a) * NKV : NULL);
    }
  // the attention blocks in one run, or in rounds whose h2o sums fit
  // h2o_round floats (a round's first block always fits s->h2o: batch_setup)
  const int64_t lim = MOLE_MIN(s->h2o_cap, s->h2o_round);
  for (int64_t r0 = 0, r1; r0 < s->n_blk; r0 = r1) {
    int64_t used = 0;
    for (r1 = r0; r1 < s->n_blk; r1++) {
      const model_kv *kv = s->tok_kv[s->att_blk[2 * r1]];
      const int64_t need = kv->policy == KV_H2O ? NKV * kv->n_ctx : 0;
      if (r1 > r0 && used + need > lim) break;
      MOLE_ASSERT(used + need <= s->h2o_cap);
      s->blk_h2o[r1] = need ? used : -1;
      used += need;
    }
    attn_job aj = {m, s, il, n, s->any_h2o, r0, r1};
    mole_pool_run(m->pool, s->tok_kv[0]->type == QT_F16 ? attn_worker_f16 : attn_worker, &aj);
    if (s->any_h2o) h2o_add(s, il, NKV, r0, r1);
  }
  // the output projection: this process's heads' part, summed over processes
  reduce_rows(m, s, n, wo_rows, &rj);
  for (int64_t t = t0; t < t1; t++) {
    float *x = s->x + t * E, *y = s->y + t * E;
    if (ly->bo) for (int64_t i = 0; i < E; i++) y[i] += ly->bo[i];
    for (int64_t i = 0; i < E; i++) x[i] += y[i];
  }
}

// silu(gate) * up for rows [a, b) of a dense FFN (this process's columns)
static void gate_up_rows(void *user, int64_t a, int64_t b) {
  rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const model_tensor *wg = j->ly ? &j->ly->ffn_gate : NULL, *wu = j->ly ? &j->ly->ffn_up : NULL;
  const int64_t E = m->hp.n_embd, F = j->F;
  char *xg = (char *)s->xq + (size_t)a * s->q_row, *xu = xg;
  convert_for(m, s, wg, s->xn + a * E, E, b - a, E, xg);
  if (ops_vec_type(wu) != ops_vec_type(wg)) {
    xu = (char *)s->hq + (size_t)a * s->q_row;
    convert_for(m, s, wu, s->xn + a * E, E, b - a, E, xu);
  }
  ops_mm t2[2] = {mm_rows(s, wg, xg - (size_t)a * s->q_row, s->q_row, a, b, s->ff_g, F),
                  mm_rows(s, wu, xu - (size_t)a * s->q_row, s->q_row, a, b, s->ff_u, F)};
  ops_mm_run(m->pool, t2, 2);
  for (int64_t t = a; t < b; t++) ops_swiglu(s->ff_g + t * F, s->ff_g + t * F, s->ff_u + t * F, F);
}

static void down_rows(void *user, int64_t a, int64_t b) {
  rows_job *j = user;
  mole_model *m = j->m;
  model_scratch *s = j->s;
  const int64_t F = j->F;
  convert_for(m, s, &j->ly->ffn_down, s->ff_g + a * F, F, b - a, F, (char *)s->hq + (size_t)a * s->q_row);
  ops_mm t1 = mm_rows(s, &j->ly->ffn_down, s->hq, s->q_row, a, b, s->y, m->hp.n_embd);
  ops_mm_run(m->pool, &t1, 1);
}

// silu(gate) * up -> down for a shared expert, into y (this process's columns).
static void dense_ffn(mole_model *m, model_scratch *s, const model_tensor *wg, const model_tensor *wu,
                      const model_tensor *wd, int64_t n, int64_t F, float *y) {
  const int64_t E = m->hp.n_embd;
  convert_for(m, s, wg, s->xn, E, n, E, s->xq);
  const void *xu = s->xq;
  if (ops_vec_type(wu) != ops_vec_type(wg)) {
    convert_for(m, s, wu, s->xn, E, n, E, s->hq);
    xu = s->hq;
  }
  ops_mm t2[2] = {mm_of(s, wg, s->xq, s->q_row, n, s->ff_g, F), mm_of(s, wu, xu, s->q_row, n, s->ff_u, F)};
  ops_mm_run(m->pool, t2, 2);
  for (int64_t t = 0; t < n; t++) ops_swiglu(s->ff_g + t * F, s->ff_g + t * F, s->ff_u + t * F, F);
  convert_for(m, s, wd, s->ff_g, F, n, F, s->hq);
  ops_mm t1 = mm_of(s, wd, s->hq, s->q_row, n, y, E);
  ops_mm_run(m->pool, &t1, 1);
}

// Router: softmax over all experts, top-k, optional renormalisation.
static void route(const model_hparams *hp, model_scratch *s, int64_t n) {
  const int64_t X = hp->n_expert, K = hp->n_expert_used;
  for (int64_t t = 0; t < n; t++) {
    float *p = s->router + t * X;
    float mx = -INFINITY;
    for (int64_t e = 0; e < X; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < X; e++) {
      p[e] = expf(p[e] - mx);
      sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t e = 0; e < X; e++) p[e] *= inv;
    int32_t *sel = s->sel + t * K;
    float *w = s->selw + t * K;
    ops_topk(p, X, K, sel, w);
    if (hp->norm_topk) {
      float ws = 0;
      for (int64_t k = 0; k < K; k++) ws += w[k];
      if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;
      for (int64_t k = 0; k < K; k++) w[k] /= ws;
    }
    if (hp->expert_weights_scale != 0 && hp->expert_weights_scale != 1)
      for (int64_t k = 0; k < K; k++) w[k] *= hp->expert_weights_scale;
  }
}

// Computes the groups gs[0..ng) of a routed layer, whose weights are in
// s->views: gate and up of every group as one batch of tasks, swiglu, then
// down as another batch. Each group's result depends only on its own slots,
// so computing the groups in any sets gives the same bits. s->hq keeps the
// layer's input rows converted for up to two vector types (conv_t, converted
// on first use, kept for the layer's later sets); a group's slots in s->xq get
// its tokens' rows, which its hidden rows converted for down replace once
// gate and up are done.
static void moe_compute(mole_model *m, model_scratch *s, int64_t n, const int64_t *gs, int64_t ng,
                        quant_type conv_t[2]) {
  const int64_t E = m->hp.n_embd, F = m->loc.n_ff_exp;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const quant_type vt = ops_vec_type(&s->views[g].gate);
    MOLE_ASSERT(vt == ops_vec_type(&s->views[g].up));
    int c = conv_t[0] == vt ? 0 : conv_t[1] == vt ? 1 : conv_t[0] == QT_COUNT ? 0 : 1;
    if (conv_t[c] != vt) {
      MOLE_ASSERT(conv_t[c] == QT_COUNT);
      conv_t[c] = vt;
      ops_convert_rows(m->pool, vt, s->xn, E, n, E, c == 0 ? s->hq : (char *)s->hq + (size_t)n * s->q_row, s->q_row);
    }
    const char *src = c == 0 ? s->hq : (char *)s->hq + (size_t)n * s->q_row;
    const size_t rb = quant_row_size(vt, E);
    for (int64_t a = s->grp_off[g]; a < s->grp_off[g] + s->grp_cnt[g]; a++)
      memcpy((char *)s->xq + (size_t)a * s->q_row, src + (size_t)s->slot_tok[a] * s->q_row, rb);
  }
  int64_t nt = 0;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const size_t o = (size_t)s->grp_off[g];
    s->tasks[nt++] = mm_expert(&s->views[g].gate, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_g + o * (size_t)F, F);
    s->tasks[nt++] = mm_expert(&s->views[g].up, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_u + o * (size_t)F, F);
  }
  ops_mm_run(m->pool, s->tasks, nt);
  nt = 0;
  for (int64_t i = 0; i < ng; i++) {
    const int64_t g = gs[i];
    const size_t o = (size_t)s->grp_off[g];
    for (int64_t a = s->grp_off[g]; a < s->grp_off[g] + s->grp_cnt[g]; a++)
      ops_swiglu(s->ff_g + a * F, s->ff_g + a * F, s->ff_u + a * F, F);
    convert_for(m, s, &s->views[g].down, s->ff_g + o * (size_t)F, F, s->grp_cnt[g], F,
                (char *)s->xq + o * s->q_row);
    s->tasks[nt++] = mm_expert(&s->views[g].down, (char *)s->xq + o * s->q_row, s->q_row, s->grp_cnt[g],
                               s->ff_o + o * (size_t)E, E);
  }
  ops_mm_run(m->pool, s->tasks, nt);
}

// moe_ffn's progress on a group: not used, weights not obtained yet, computed
// and still pinned, computed and released.
enum { MOE_UNUSED = 0, MOE_PENDING, MOE_HELD, MOE_DONE };

// Releases the computed groups still pinned: the groups without a slot need the room.
static void moe_release_held(mole_model *m, model_scratch *s, int64_t il) {
  for (int64_t g = 0; g < 2 * m->hp.n_expert; g++)
    if (s->grp_state[g] == MOE_HELD) {
      experts_release(m->experts, il, (int32_t)(g / 2), (expert_prec)(g % 2));
      s->grp_state[g] = MOE_DONE;
    }
}

// Router logits of the n rows of s->xn, softmax, top-k: s->sel, s->selw [n][K].
static void moe_route(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_layer *ly = &m->layers[il];
  const int64_t E = m->hp.n_embd, X = m->hp.n_expert;
  convert_for(m, s, &ly->gate_inp, s->xn, E, n, E, s->xq);
  ops_mm tr = mm_of(s, &ly->gate_inp, s->xq, s->q_row, n, s->router, X);
  ops_mm_run(m->pool, &tr, 1);
  route(&m->hp, s, n);
}

// Routed experts. (token, choice) pairs are grouped by (expert, precision) so
// each expert's matrices are read once per batch; the provider supplies the
// weights (mapped, or from its RAM cache) and the plan says which precision
// each choice gets, or that it is skipped. Groups are computed as their
// weights land: every group already resident is computed in one set while
// the others are still being read; only when none is ready does the layer
// wait, for one. When the budget holds fewer experts than the layer uses at
// once (a prompt batch), computed groups are released so that the rest get
// slots: the layer is computed in waves.
// In: n rows of s->xn with k choices each (s->sel, s->selw [n][k]). Out: the
// unweighted output of choice i in s->ff_o row s->tok_slot[i] (-1: skipped).
static mole_status moe_experts(mole_model *m, model_scratch *s, int64_t il, int64_t n, int64_t K) {
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
    s->grp_state[g] = s->grp_cnt[g] ? MOE_PENDING : MOE_UNUSED;
    n_pending += s->grp_cnt[g] > 0;
  }
  quant_type conv_t[2] = {QT_COUNT, QT_COUNT};
  mole_status st = MOLE_OK;
  while (n_pending > 0) {
    // every pending group whose weights are here; else the first being read,
    // else the first still without a slot
    int64_t nr = 0, loading = -1, no_slot = -1;
    for (int64_t g = 0; g < G; g++) {
      if (s->grp_state[g] != MOE_PENDING) continue;
      const experts_avail a = experts_ready(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2));
      if (a == EXPERTS_READY) s->grp_list[nr++] = g;
      else if (a == EXPERTS_LOADING && loading < 0) loading = g;
      else if (a == EXPERTS_NO_SLOT && no_slot < 0) no_slot = g;
    }
    if (nr == 0) {
      const int64_t g = loading >= 0 ? loading : no_slot;
      if (loading < 0) moe_release_held(m, s, il);  // its slot can only come from computed groups
      st = experts_get(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2), &s->views[g]);  // blocks
      if (st) break;
      s->grp_list[nr++] = g;
      // and whatever else landed meanwhile
      for (int64_t h = 0; h < G; h++)
        if (h != g && s->grp_state[h] == MOE_PENDING &&
            experts_ready(xp, il, (int32_t)(h / 2), (expert_prec)(h % 2)) == EXPERTS_READY)
          s->grp_list[nr++] = h;
    }
    for (int64_t i = 0; i < nr && !st; i++) {
      const int64_t g = s->grp_list[i];
      st = experts_get(xp, il, (int32_t)(g / 2), (expert_prec)(g % 2), &s->views[g]);  // resident: no wait
    }
    if (st) break;
    moe_compute(m, s, n, s->grp_list, nr, conv_t);
    for (int64_t i = 0; i < nr; i++) s->grp_state[s->grp_list[i]] = MOE_HELD;
    n_pending -= nr;
    // groups still without a slot get those of the computed ones
    if (no_slot >= 0) moe_release_held(m, s, il);
  }
  experts_layer_done(xp, il);
  return st;
}

// y [n][E] = the choices' outputs (rows idx[t*K + k] of out, -1: skipped)
// weighted by the router, added in the router's order as llama.cpp adds the
// expert views.
static void moe_combine(const mole_model *m, model_scratch *s, int64_t n, const float *out, const int64_t *idx,
                        int64_t stride) {
  const int64_t E = m->hp.n_embd, K = m->hp.n_expert_used;
  for (int64_t t = 0; t < n; t++) {
    float *y = s->y + t * E;
    memset(y, 0, (size_t)E * sizeof *y);
    for (int64_t k = 0; k < K; k++) {
      const int64_t r = idx[t * K + k];
      if (r >= 0) ops_axpy(y, out + r * stride, s->selw[t * K + k], E);
    }
  }
}

static mole_status moe_ffn(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  moe_route(m, s, il, n);
  if (m->moe_hook && m->moe_hook(m->moe_hook_ctx, il, n, s->xn, s->sel, s->selw, s->y)) return MOLE_OK;
  if (n == 1) experts_predict(m->experts, il, s->xn);
  mole_status st = moe_experts(m, s, il, n, m->hp.n_expert_used);
  if (st) return st;
  moe_combine(m, s, n, s->ff_o, s->tok_slot, m->hp.n_embd);
  return MOLE_OK;
}

// The FFN's input: this process's rows normed, every token's where rows are
// split (a MoE layer's routing groups all tokens: no tiles).
static void moe_pre(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd;
  int64_t t0, t1;
  own_rows(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, m->layers[il].ffn_norm, E, hp->rms_eps);
  gather_rows(m, s, n, NULL, NULL);
}

// After the routed experts' sum is in y [n][E]: the shared expert's part added.
static void moe_shared(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t E = hp->n_embd;
  if (ly->gate_inp_shexp) {
    // shared expert, scaled by sigmoid(w . x), as llama.cpp's qwen2moe graph
    // computes it: w . x a mul_mat of a one-row f32 matrix (ggml_vec_dot_f32's
    // order whatever the batch), the sigmoid as silu(g) / g
    float *sh = s->sh;
    dense_ffn(m, s, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, n, m->loc.n_ff_shexp, sh);
    for (int64_t t = 0; t < n; t++) {
      const float *xn = s->xn + t * E;
      float g;
      quant_exact_dot_ref(QX_F32_VEC, E, &g, ly->gate_inp_shexp, xn);
      g = g != 0.0f ? (g / (1.0f + expf(-g))) / g : 0.5f;  // (0/0 would be NaN there)
      float *y = s->y + t * E;
      for (int64_t i = 0; i < E; i++) y[i] += sh[t * E + i] * g;
    }
  }
}

// After the routed experts' sum is in y: the shared expert, the sum over
// processes, the residual add.
static void moe_post(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const int64_t E = m->hp.n_embd;
  moe_shared(m, s, il, n);
  reduce_rows(m, s, n, NULL, NULL);
  int64_t t0, t1;
  own_rows(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++)
    for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
}

// The whole MoE FFN (routing, experts, their sum, the shared expert) of
// token rows [a, b) only: xn, y and sh seen from row a, the sequences' ends
// clipped to the rows (every step is per token), for the hmp exchange,
// which runs it on rows as they arrive.
typedef struct {
  mole_model *m;
  model_scratch *s;
  int64_t il;
  mole_status st;
} moe_rows_job;

static void moe_rows(void *user, int64_t a, int64_t b) {
  moe_rows_job *j = user;
  model_scratch *s = j->s;
  if (j->st || b <= a) return;
  const int64_t E = j->m->hp.n_embd;
  float *xn = s->xn, *y = s->y, *sh = s->sh;
  int64_t *ends = s->seg_ends, n_seg = s->n_seg;
  s->n_seg = clip_ends(s, a, b);  // (no mm_rows in here to overwrite sub_ends)
  s->seg_ends = s->sub_ends;
  s->xn += a * E;
  s->y += a * E;
  if (sh) s->sh += a * E;
  j->st = moe_ffn(j->m, s, j->il, b - a);
  if (!j->st) moe_shared(j->m, s, j->il, b - a);
  s->xn = xn;
  s->y = y;
  s->sh = sh;
  s->seg_ends = ends;
  s->n_seg = n_seg;
}

static mole_status ffn_block(mole_model *m, model_scratch *s, int64_t il, int64_t n) {
  const model_hparams *hp = &m->hp;
  const model_layer *ly = &m->layers[il];
  const int64_t E = hp->n_embd;
  if (hp->n_expert > 0 && m->comm.hmp && m->comm.exchange) {
    // this process's rows normed; every token's FFN computed as its rows
    // arrive, the sums of this process's rows back here
    int64_t t0, t1;
    own_rows(m, n, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, ly->ffn_norm, E, hp->rms_eps);
    moe_rows_job j = {m, s, il, MOLE_OK};
    m->comm.exchange(m->comm.ctx, s->xn, s->y, n, E, moe_rows, &j);
    if (j.st) return j.st;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
    return MOLE_OK;
  }
  if (hp->n_expert > 0) {
    moe_pre(m, s, il, n);
    mole_status st = moe_ffn(m, s, il, n);
    if (st) return st;
    moe_post(m, s, il, n);
    return MOLE_OK;
  }
  int64_t t0, t1;
  own_rows(m, n, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) ops_rmsnorm(s->xn + t * E, s->x + t * E, ly->ffn_norm, E, hp->rms_eps);
  // dense: gate and up tile by tile as rows arrive, down tile by tile as they leave
  rows_job rj = {m, s, ly, m->loc.n_ff};
  gather_rows(m, s, n, gate_up_rows, &rj);
  if (!m->comm.hmp) gate_up_rows(&rj, 0, n);
  reduce_rows(m, s, n, down_rows, &rj);
  for (int64_t t = t0; t < t1; t++)
    for (int64_t i = 0; i < E; i++) s->x[t * E + i] += s->y[t * E + i];
  return MOLE_OK;
}

// Fills the scratch's per-token tables from the sequences and checks them.
static mole_status batch_setup(const mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs,
                               int64_t *n_out) {
  const int64_t V = m->hp.n_vocab, TB = s->att_tb;
  int64_t n = 0, no = 0, h2o_len = 0, h2o_blk = 0;
  size_t retain_tmp = 0;
  s->n_seg = s->n_out_seg = s->n_blk = 0;
  for (int64_t i = 0; i < n_segs; i++) {
    const model_seg *g = &segs[i];
    if (g->n <= 0 || n + g->n > s->n_batch)
      return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens in all but the batch holds 1..%lld", (long long)(n + g->n),
                         (long long)s->n_batch);
    if (g->kv->type != segs[0].kv->type)
      return mole_errorf(MOLE_ERR_ARG, "forward: the sequences of one batch need one KV cache type");
    for (int64_t j = 0; j < i; j++)
      if (segs[j].kv == g->kv) return mole_errorf(MOLE_ERR_ARG, "forward: a sequence appears twice in one batch");
    model_kv *kv = g->kv;
    if (kv->budget > 0) {  // bounded: slots after the entries kept, positions go on
      if (g->n > kv->max_pass)
        return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens of one sequence in a pass; its bounded KV cache takes %lld",
                           (long long)g->n, (long long)kv->max_pass);
      if (kv->policy == KV_LOCRET) retain_tmp = MOLE_MAX(retain_tmp, kv_retain_tmp_bytes(kv->retain, g->n));
      if (g->n_past != kv->n_pos)
        return mole_errorf(MOLE_ERR_ARG, "forward: position %lld but the bounded KV cache is at %lld",
                           (long long)g->n_past, (long long)kv->n_pos);
      if (kv->n_used + g->n > kv->n_ctx || g->n_past + g->n > INT32_MAX)
        return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens do not fit the bounded KV cache (%lld + %lld slots)",
                           (long long)g->n, (long long)kv->budget, (long long)(kv->n_ctx - kv->budget));
    } else {
      if (g->n_past < 0 || g->n_past + g->n > kv->n_ctx)
        return mole_errorf(MOLE_ERR_ARG, "context full: %lld + %lld tokens exceed the context of %lld",
                           (long long)g->n_past, (long long)g->n, (long long)kv->n_ctx);
      kv->n_used = kv->n_pos = g->n_past;  // slot = position
    }
    for (int64_t t = 0; t < g->n; t++) {
      if (g->tokens[t] < 0 || g->tokens[t] >= V)
        return mole_errorf(MOLE_ERR_ARG, "token %d at index %lld is out of the vocabulary (0..%lld)", g->tokens[t],
                           (long long)t, (long long)V - 1);
      s->tok_pos[n + t] = g->n_past + t;
      s->tok_nkv[n + t] = g->kv->n_used + t + 1;
      s->tok_kv[n + t] = g->kv;
      s->tok_segn[n + t] = g->n;
    }
    for (int64_t t0 = 0; t0 < g->n; t0 += TB) {
      if (kv->policy == KV_H2O) {
        h2o_len += m->loc.n_head_kv * kv->n_ctx;
        h2o_blk = MOLE_MAX(h2o_blk, m->loc.n_head_kv * kv->n_ctx);
      }
      s->att_blk[2 * s->n_blk] = n + t0;
      s->att_blk[2 * s->n_blk++ + 1] = n + MOLE_MIN(t0 + TB, g->n);
    }
    if (g->logits) {
      for (int64_t t = g->all_logits ? 0 : g->n - 1; t < g->n; t++) s->out_tok[no++] = n + t;
      s->out_ends[s->n_out_seg++] = no;
    }
    n += g->n;
    s->seg_ends[s->n_seg++] = n;
  }
  if (n == 0) return mole_errorf(MOLE_ERR_ARG, "forward: no tokens");
  s->any_h2o = h2o_len > 0;
  // the h2o sums of a round of blocks: all of them, or as many as H2O_ROUND_FLOATS holds (one at least)
  const int64_t h2o_need = MOLE_MIN(h2o_len, MOLE_MAX(h2o_blk, s->h2o_round));
  if (h2o_need > s->h2o_cap) {
    mole_aligned_free(s->h2o);
    s->h2o_cap = 0;
    if (!(s->h2o = mole_aligned_alloc(64, (size_t)h2o_need * sizeof(float))))
      return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for the h2o sums (%lld floats)", (long long)h2o_need);
    s->h2o_cap = h2o_need;
  }
  if (retain_tmp > s->retain_tmp_cap) {  // the retaining heads' scratch, shared by the pass's locret sequences
    mole_aligned_free(s->retain_tmp);
    s->retain_tmp_cap = 0;
    if (!(s->retain_tmp = mole_aligned_alloc(64, retain_tmp)))
      return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for the retaining heads' scratch (%zu bytes)", retain_tmp);
    s->retain_tmp_cap = retain_tmp;
  }
  *n_out = no;
  return MOLE_OK;
}

// The batch's tables and its tokens' embeddings in s->x.
static mole_status forward_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
  mole_status st = batch_setup(m, s, segs, n_segs, &s->n_out);
  if (st) return st;
  const quant_traits *et = quant_traits_of(m->tok_embd.type);
  for (int64_t i = 0, t = 0; i < n_segs; i++)
    for (int64_t j = 0; j < segs[i].n; j++, t++) {
      const int32_t tok = segs[i].tokens[j];
      const char *row = (const char *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes;
      if (m->tok_embd.layout == QL_R16) {  // shared with the output projection, repacked
        quant_r16_row(m->tok_embd.type, m->tok_embd.data, E, V, tok, s->xq);
        row = s->xq;
      }
      et->to_float(row, s->x + t * E, E);
    }
  return MOLE_OK;
}

static mole_status forward_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs);

mole_status model_forward_batch(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  if (m->comm.forward && m->comm.rank == 0) return m->comm.forward(m->comm.ctx, s, segs, n_segs);
  mole_status st = forward_begin(m, s, segs, n_segs);
  if (st) return st;
  if (m->comm.step && m->comm.rank == 0 && (st = m->comm.step(m->comm.ctx, segs, n_segs))) return st;
  const int64_t n = s->seg_ends[s->n_seg - 1];
  for (int64_t il = 0; il < m->hp.n_layer; il++) {
    attention_block(m, s, il, n);
    if ((st = ffn_block(m, s, il, n))) return st;
  }
  if (m->experts) experts_step_done(m->experts, n);
  return forward_end(m, s, segs, n_segs);
}

// ---- stepwise: the routed experts elsewhere (src/parallel/disagg.c) ----------------

mole_status model_step_begin(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  MOLE_ASSERT(m->hp.n_expert > 0);
  return forward_begin(m, s, segs, n_segs);
}

void model_step_attn(mole_model *m, model_scratch *s, int64_t il, model_moe_rows *out) {
  const int64_t n = s->seg_ends[s->n_seg - 1];
  attention_block(m, s, il, n);
  moe_pre(m, s, il, n);
  moe_route(m, s, il, n);
  *out = (model_moe_rows){n, m->hp.n_expert_used, s->xn, s->sel, s->selw};
}

void model_step_ffn_end(mole_model *m, model_scratch *s, int64_t il, const float *out, const int64_t *idx,
                        int64_t stride) {
  const int64_t n = s->seg_ends[s->n_seg - 1];
  moe_combine(m, s, n, out, idx, stride);
  moe_post(m, s, il, n);
}

mole_status model_step_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  return forward_end(m, s, segs, n_segs);
}

mole_status model_experts_rows(mole_model *m, model_scratch *s, int64_t il, int64_t n, const float *const *xn,
                               const int32_t *sel, const float *w, float *const *out, uint8_t *done) {
  const int64_t E = m->hp.n_embd;
  if (n == 0) return MOLE_OK;
  MOLE_ASSERT(m->experts && n <= s->n_batch);
  for (int64_t r = 0; r < n; r++) memcpy(s->xn + r * E, xn[r], (size_t)E * sizeof(float));
  memcpy(s->sel, sel, (size_t)n * sizeof *sel);
  memcpy(s->selw, w, (size_t)n * sizeof *w);
  mole_status st = moe_experts(m, s, il, n, 1);
  if (st) return st;
  for (int64_t r = 0; r < n; r++) {
    const int64_t slot = s->tok_slot[r];
    done[r] = slot >= 0;
    if (slot >= 0) memcpy(out[r], s->ff_o + slot * E, (size_t)E * sizeof(float));
  }
  return MOLE_OK;
}

// The KV caches' commits, then the logits wanted.
static mole_status forward_end(mole_model *m, model_scratch *s, const model_seg *segs, int64_t n_segs) {
  const model_hparams *hp = &m->hp;
  const int64_t E = hp->n_embd, V = hp->n_vocab, no = s->n_out, n = s->seg_ends[s->n_seg - 1];
  for (int64_t i = 0; i < n_segs; i++) kv_commit(segs[i].kv, segs[i].n);  // eviction, if bounded
  if (no == 0) return MOLE_OK;
  // every token's final x where rows are split between processes
  if (m->comm.hmp) {
    int64_t t0, t1;
    own_rows(m, n, &t0, &t1);
    memcpy(s->xn + t0 * E, s->x + t0 * E, (size_t)((t1 - t0) * E) * sizeof(float));
    m->comm.allgather(m->comm.ctx, s->xn, n, E, NULL, NULL);
    memcpy(s->x, s->xn, (size_t)(n * E) * sizeof(float));
  }
  if (m->comm.root_vocab && m->comm.rank != 0) return MOLE_OK;  // no gather: the root has every row
  // the vocabulary projection of the tokens that want logits, each
  // sequence's as a mul_mat of its own
  for (int64_t r = 0; r < no; r++) ops_rmsnorm(s->xn + r * E, s->x + s->out_tok[r] * E, m->output_norm, E, hp->rms_eps);
  convert_for(m, s, &m->output, s->xn, E, no, E, s->xq);
  const int64_t VL = m->loc.n_vocab;
  if (VL < V) {  // this process's vocabulary rows; the root gathers them
    ops_mm to = {&m->output, 0, s->xq, s->q_row, no, s->lg_local, VL, false, s->n_out_seg, s->out_ends};
    ops_mm_run(m->pool, &to, 1);
    float *all = NULL;
    if (m->comm.rank == 0) {
      all = s->ff_g;
      if ((size_t)no * (size_t)V > (size_t)s->n_assign_max * (size_t)s->ff_max) {
        all = mole_malloc((size_t)no * (size_t)V * sizeof(float));  // all logits of a long prompt: rare
        if (!all) return mole_errorf(MOLE_ERR_NOMEM, "forward: out of memory for %lld rows of logits", (long long)no);
      }
    }
    m->comm.gather_logits(m->comm.ctx, s->lg_local, no, VL, all);
    if (m->comm.rank == 0)
      for (int64_t i = 0, o = 0, r0 = 0; i < n_segs; i++) {
        if (!segs[i].logits) continue;
        const int64_t r1 = s->out_ends[o++];
        memcpy(segs[i].logits, all + r0 * V, (size_t)((r1 - r0) * V) * sizeof(float));
        r0 = r1;
      }
    if (all != s->ff_g) mole_free(all);
    return MOLE_OK;
  }
  float *lg = s->ff_g;  // [no][V] when it fits the scratch, else per sequence straight into its buffer
  const bool staged = (size_t)no * (size_t)V <= (size_t)s->n_assign_max * (size_t)s->ff_max;
  if (staged) {
    ops_mm to = {&m->output, 0, s->xq, s->q_row, no, lg, V, false, s->n_out_seg, s->out_ends};
    ops_mm_run(m->pool, &to, 1);
  }
  for (int64_t i = 0, o = 0, r0 = 0; i < n_segs; i++) {
    if (!segs[i].logits) continue;
    const int64_t r1 = s->out_ends[o++], nr = r1 - r0;
    if (staged) {
      memcpy(segs[i].logits, lg + r0 * V, (size_t)(nr * V) * sizeof(float));
    } else {
      ops_mm to = {&m->output, 0, (char *)s->xq + (size_t)r0 * s->q_row, s->q_row, nr, segs[i].logits, V, false, 0, NULL};
      ops_mm_run(m->pool, &to, 1);
    }
    r0 = r1;
  }
  return MOLE_OK;
}

mole_status model_forward(mole_model *m, model_kv *kv, model_scratch *s, const int32_t *tokens, int64_t n,
                          int64_t n_past, float *logits, bool all_logits) {
  if (n <= 0) return mole_errorf(MOLE_ERR_ARG, "forward: %lld tokens", (long long)n);
  const model_seg seg = {kv, tokens, n, n_past, logits, all_logits};
  return model_forward_batch(m, s, &seg, 1);
}
