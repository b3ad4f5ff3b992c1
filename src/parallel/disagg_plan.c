// parallel/disagg_plan: mole plan --disagg. MegaScale-Infer's plan search on
// profiled times.
//
// Every rank loads the model and profiles, all at once (so that the times
// include what the ranks of one machine take from each other: cores,
// memory bandwidth), on the real code paths:
//   T_a(b)  one decode pass of b sequences at context c on the attention
//           side (model_step_*: attention, norms, router, the weighted sum,
//           the output projection), the routed experts left out; per layer;
//   T_e(r, x)  one layer's routed experts on r rows spread over x experts
//           (model_experts_rows), for the x = X/E of every E;
//   T_c(s)  latency + s / bandwidth: the bandwidth of 1 MiB messages
//           between ranks 0 and N-1, the latency of every rank exchanging a
//           small message with every other at once, waiting as a pass does.
// For every split (A attention + E expert ranks, or all co-located), number
// of micro-batches m and batch size B (sequences), with b = B / (A m)
// tokens per micro-batch, r = A b k / E rows reaching an expert rank:
//   ping-pong:  pass = L max(m T_a(b), m T_e(r, X/E), T_a + T_e + 2 T_c) + R
//   without:    pass = L m (T_a(b) + T_e(r, X/E) + 2 T_c) + R
//   co-located: pass = L m (T_a(B/(N m)) + T_e(B k/(N m), X/N) + 2 T_c) + R
// plus the other attention ranks' logits to rank 0 over its link. With more
// processes than cores (profiled all busy), sides that take turns get the
// cores of the waiting side.
// (a micro-batch comes back for its next layer a round trip later at the
// earliest; R: the pass outside the layers, embeddings and logits, at B/A).
// (T_c of the b k rows one attention rank sends, each way). Time per output
// token = pass; tokens/s = B / pass, per rank / N. A plan is feasible when
// the pass meets the latency bound and every rank's weights and KV caches
// fit the memory it may use; the pick maximises tokens/s per rank.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "experts/budget.h"
#include "kv/kv.h"
#include "model/model.h"
#include "parallel/parallel.h"

enum { PB_MAX = 10, PR_MAX = 14, PX_MAX = 16 };

typedef struct {
  int nb;
  int64_t b[PB_MAX];
  double ta[PB_MAX];  // seconds per layer
  double tr[PB_MAX];  // seconds per pass outside the layers (embeddings, logits)
  int nr;
  int64_t r[PR_MAX];
  int nx;
  int64_t x[PX_MAX];             // experts per expert rank, per candidate E
  double te[PX_MAX][PR_MAX];     // seconds per layer
  double lat_s, bw_bps;
  double mem_bytes;
} dg_profile;

// Each time is a mean over at least PROFILE_MIN_S of repetitions (and 3):
// processes sharing cores run in scheduler slices of milliseconds, which a
// few short repetitions would sample at random.
#define PROFILE_MIN_S 0.05

// One attention-side decode pass of b sequences at context ctx: per layer,
// and the rest (embeddings, KV commits, logits) in *rest.
static double time_attn(mole_model *m, int64_t b, int64_t ctx, model_kv **kvs, model_scratch *s, float *lg,
                        int64_t *idx, double *rest) {
  const model_hparams *hp = &m->hp;
  model_seg segs[1024];
  int32_t tok[1024];
  for (int64_t i = 0; i < b; i++) {
    tok[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    segs[i] = (model_seg){kvs[i], &tok[i], 1, ctx, lg + i * hp->n_vocab, false};
  }
  for (int64_t i = 0; i < b * hp->n_expert_used; i++) idx[i] = -1;
  double t = 0, e = 0;
  int reps = 0;
  for (const double start = MPI_Wtime(); reps < 3 || MPI_Wtime() - start < PROFILE_MIN_S; reps++) {
    const double t0 = MPI_Wtime();
    mole_status st = model_step_begin(m, s, segs, b);
    MOLE_ASSERT(st == MOLE_OK);
    const double t1 = MPI_Wtime();
    for (int64_t il = 0; il < hp->n_layer; il++) {
      model_moe_rows r;
      model_step_attn(m, s, il, &r);
      model_step_ffn_end(m, s, il, lg, idx, hp->n_embd);
    }
    const double t2 = MPI_Wtime();
    st = model_step_end(m, s, segs, b);
    MOLE_ASSERT(st == MOLE_OK);
    t += (t2 - t1) / (double)hp->n_layer;
    e += (t1 - t0) + (MPI_Wtime() - t2);
  }
  *rest = e / reps;
  return t / reps;
}

// One layer's routed experts on r rows over experts [0, x), per layer.
static double time_experts(mole_model *m, int64_t r, int64_t x, model_scratch *s, const float *const *xin,
                           float *const *xout, int32_t *sel, float *w, uint8_t *done) {
  const model_hparams *hp = &m->hp;
  uint64_t q = 0x2545F4914F6CDD1Dull + (uint64_t)(r * 131 + x);
  for (int64_t i = 0; i < r; i++) {
    q ^= q << 13, q ^= q >> 7, q ^= q << 17;
    sel[i] = (int32_t)(q % (uint64_t)x);
    w[i] = 0.5f;
  }
  int reps = 0;
  const double start = MPI_Wtime();
  for (; reps < 3 || MPI_Wtime() - start < PROFILE_MIN_S; reps++)
    for (int64_t il = 0; il < hp->n_layer; il++) {
      mole_status st = model_experts_rows(m, s, il, r, xin, sel, w, xout, done);
      MOLE_ASSERT(st == MOLE_OK);
    }
  return (MPI_Wtime() - start) / reps / (double)hp->n_layer;
}

// The link's buffers: 1 MiB, then SMALL bytes to and from every rank, and
// their requests.
enum { LINK_BIG = 1 << 20, SMALL = 4 << 10 };
typedef struct {
  char *buf, *sb, *rb;  // [LINK_BIG], [size][SMALL] each
  MPI_Request *rq;      // [2 * size]
} link_bufs;

static mole_status link_bufs_new(int size, link_bufs *l) {
  l->buf = mole_calloc(LINK_BIG, 1);
  l->sb = mole_calloc((size_t)size * SMALL, 1);
  l->rb = mole_calloc((size_t)size * SMALL, 1);
  l->rq = mole_malloc((size_t)(2 * size) * sizeof *l->rq);
  if (l->buf && l->sb && l->rb && l->rq) return MOLE_OK;
  return mole_errorf(MOLE_ERR_NOMEM, "plan --disagg: out of memory for the link's buffers");
}

static void link_bufs_free(link_bufs *l) {
  mole_free(l->buf);
  mole_free(l->sb);
  mole_free(l->rb);
  mole_free(l->rq);
}

// Every rank sends SMALL bytes to every other and receives theirs (tag), napping while it waits.
static void exchange_all(int rank, int size, const link_bufs *l, int tag) {
  int n = 0;
  for (int q = 0; q < size; q++) {
    if (q == rank) continue;
    MPI_Irecv(l->rb + (size_t)q * SMALL, SMALL, MPI_BYTE, q, tag, MPI_COMM_WORLD, &l->rq[n++]);
    MPI_Isend(l->sb + (size_t)q * SMALL, SMALL, MPI_BYTE, q, tag, MPI_COMM_WORLD, &l->rq[n++]);
  }
  parallel_wait_for(l->rq, n, PARALLEL_NAP_PASS_US);
}

// The link: ranks 0 and N-1 ping-pong 1 MiB messages (bandwidth); then every
// rank exchanges 4 KiB with every other at once, waiting as a pass waits
// (napping), the latency of one such exchange: with more processes than
// cores it includes waiting for the others to be scheduled.
static void profile_link(int rank, int size, const link_bufs *l, dg_profile *p) {
  enum { BIG = LINK_BIG };
  char *buf = l->buf;
  const int peer = rank == 0 ? size - 1 : 0;
  MPI_Barrier(MPI_COMM_WORLD);
  double best = 1e30;
  for (int r = 0; r < 8; r++) {
    const double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf, BIG, MPI_BYTE, peer, 77, MPI_COMM_WORLD);
      MPI_Recv(buf, BIG, MPI_BYTE, peer, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == size - 1) {
      MPI_Recv(buf, BIG, MPI_BYTE, peer, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, BIG, MPI_BYTE, peer, 77, MPI_COMM_WORLD);
    }
    best = MOLE_MIN(best, (MPI_Wtime() - t0) / 2);
  }
  p->bw_bps = BIG / MOLE_MAX(best, 1e-9);
  MPI_Barrier(MPI_COMM_WORLD);
  int reps = 0;
  const double start = MPI_Wtime();
  for (int go = 1; go; reps++) {
    exchange_all(rank, size, l, 78);
    // the same count of exchanges on every rank: rank 0 says when to stop
    go = reps < 20 || MPI_Wtime() - start < 0.05;
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  p->lat_s = MOLE_MAX((MPI_Wtime() - start) / reps - (double)SMALL / p->bw_bps, 0);
}

// What an exchange costs inside a pass, where every rank computes between
// exchanges: rounds of one layer's experts on a few rows, then every rank
// exchanging with every other, against the same rounds without the
// exchanges. With more processes than cores, a rank that waits for one
// preempted by another process pays a scheduler slice; p->lat_s becomes the
// larger of the two latencies.
static void profile_sync(mole_model *m, int rank, int size, const link_bufs *l, model_scratch *xs, const float *const *xin,
                         float *const *xout, int32_t *sel, float *w, uint8_t *done, int64_t rows, dg_profile *p) {
  for (int64_t i = 0; i < rows; i++) sel[i] = (int32_t)(i % m->hp.n_expert), w[i] = 0.5f;
  // five alternations of 40 ms without and with the exchanges: the median difference
  enum { ALT = 5 };
  double diff[ALT];
  for (int k = 0; k < ALT; k++) {
    double t[2];
    for (int with = 0; with < 2; with++) {
      MPI_Barrier(MPI_COMM_WORLD);
      int reps = 0;
      const double start = MPI_Wtime();
      for (int go = 1; go; reps++) {
        mole_status st = model_experts_rows(m, xs, reps % m->hp.n_layer, rows, xin, sel, w, xout, done);
        MOLE_ASSERT(st == MOLE_OK);
        if (with) exchange_all(rank, size, l, 79);
        go = reps < 10 || MPI_Wtime() - start < 0.04;
        if (with) MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
      }
      t[with] = (MPI_Wtime() - start) / reps;
    }
    diff[k] = t[1] - t[0];
  }
  for (int i = 1; i < ALT; i++)  // insertion sort: the median
    for (int j = i; j > 0 && diff[j] < diff[j - 1]; j--) {
      const double x = diff[j];
      diff[j] = diff[j - 1];
      diff[j - 1] = x;
    }
  MPI_Bcast(diff, ALT, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // rank 0's, as the bare latency
  p->lat_s = MOLE_MAX(p->lat_s, diff[ALT / 2]);
}

// Linear interpolation of y over sorted x (clamped, extrapolated linearly above).
static double interp(const int64_t *xs, const double *ys, int n, double x) {
  if (x <= xs[0]) return ys[0] * MOLE_MAX(x, 0.0) / (double)xs[0] + (x > 0 ? 0 : 0);
  for (int i = 1; i < n; i++)
    if (x <= xs[i]) return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - (double)xs[i - 1]) / (double)(xs[i] - xs[i - 1]);
  const double slope = n > 1 ? (ys[n - 1] - ys[n - 2]) / (double)(xs[n - 1] - xs[n - 2]) : ys[0] / (double)xs[0];
  return ys[n - 1] + slope * (x - (double)xs[n - 1]);
}

typedef struct {
  int A, E;  // E = A = N: co-located
  int m;
  int64_t B;
  bool ping_pong;
  double pass_s, tps, tps_rank, mem_attn, mem_exp;
  bool fits;
} dg_plan;

static double te_of(const dg_profile *p, int64_t x, double rows) {
  for (int i = 0; i < p->nx; i++)
    if (p->x[i] == x) return rows <= 0 ? 0 : interp(p->r, p->te[i], p->nr, rows);
  MOLE_ASSERT(0);
  return 0;
}

static void predict(const dg_profile *p, const model_hparams *hp, int N, int cores, double wa, double we,
                    double kv_seq, dg_plan *q) {
  const bool coloc = q->A == N && q->E == N;
  const double k = (double)hp->n_expert_used, L = (double)hp->n_layer, row = (hp->n_embd + 2) * 4.0;
  const double b = (double)q->B / (q->A * q->m);  // tokens per micro-batch on an attention rank
  const double ta = b > 0 ? interp(p->b, p->ta, p->nb, b) : 0;
  const double rest = interp(p->b, p->tr, p->nb, (double)q->B / q->A);  // the rank's whole batch
  const int64_t xr = hp->n_expert / q->E;
  const double te = te_of(p, xr, q->A * b * k / q->E);
  const double tc = p->lat_s + b * k / q->E * row / p->bw_bps;
  // the other attention ranks' logits to rank 0 (where sampling is), over its link
  const double logits = (double)q->B * (q->A - 1) / q->A * (double)hp->n_vocab * 4 / p->bw_bps;
  // The profile ran with every process busy at once; with more processes
  // than cores, a side that waits for the other leaves its core to it: when
  // the sides take turns (no ping-pong, or one micro-batch), the busy side's
  // times shrink by that share.
  const bool turns = !coloc && (!q->ping_pong || q->m == 1);
  const double share = N > cores && turns ? (double)MOLE_MAX(MOLE_MAX(q->A, q->E), cores) / N : 1.0;
  // a micro-batch is back for its next layer after a round trip at the earliest
  if (coloc || turns)
    q->pass_s = L * q->m * (share * (ta + te) + 2 * tc) + share * rest + logits;
  else
    q->pass_s = L * MOLE_MAX(q->m * MOLE_MAX(ta, te), ta + te + 2 * tc) + rest + logits;
  q->tps = (double)q->B / q->pass_s;
  q->tps_rank = q->tps / N;
  q->mem_attn = wa + kv_seq * ceil((double)q->B / q->A) + (coloc ? we / N : 0);
  q->mem_exp = coloc ? q->mem_attn : we / q->E;
  q->fits = MOLE_MAX(q->mem_attn, q->mem_exp) <= p->mem_bytes;
}

static void plan_json(FILE *f, const dg_plan *q, int N) {
  fprintf(f, "{\"attn\": %d, \"expert\": %d, \"colocated\": %s, \"micro_batches\": %d, \"ping_pong\": %s, \"seqs\": %lld, "
             "\"pass_ms\": %.3f, \"tokens_per_s\": %.2f, \"tokens_per_s_per_rank\": %.2f, \"mem_attn_rank\": %.0f, "
             "\"mem_expert_rank\": %.0f, \"fits\": %s}",
          q->A, q->E, q->A == N && q->E == N ? "true" : "false", q->m, q->ping_pong ? "true" : "false",
          (long long)q->B, 1e3 * q->pass_s, q->tps, q->tps_rank, q->mem_attn, q->mem_exp, q->fits ? "true" : "false");
}

// What rank 0 profiles with: the attention side's caches, scratch, logits
// and choices, the expert side's rows, the link's buffers.
typedef struct {
  model_kv **kvs;  // [bmax]
  int64_t n_kvs;
  model_scratch *s, *xs;
  float *lg;      // [bmax][n_vocab]
  int64_t *idx;   // [bmax][n_expert_used]
  float *xbuf;    // [2][rmax][n_embd]
  const float **xin;
  float **xout;
  int32_t *sel;
  float *w;
  uint8_t *done;  // [rmax] each
  link_bufs link;
} prof_bufs;

static void prof_bufs_free(prof_bufs *b) {
  for (int64_t i = 0; i < b->n_kvs; i++) kv_free(b->kvs[i]);
  mole_free(b->kvs);
  model_scratch_free(b->s);
  model_scratch_free(b->xs);
  mole_free(b->lg);
  mole_free(b->idx);
  mole_free(b->xbuf);
  mole_free(b->xin);
  mole_free(b->xout);
  mole_free(b->sel);
  mole_free(b->w);
  mole_free(b->done);
  link_bufs_free(&b->link);
}

static mole_status prof_bufs_new(mole_model *m, const dg_profile *p, int64_t ctx, int N, prof_bufs *b) {
  const model_hparams *hp = &m->hp;
  const int64_t bmax = p->b[p->nb - 1], rmax = p->r[p->nr - 1], K = hp->n_expert_used;
  b->kvs = mole_calloc((size_t)bmax, sizeof *b->kvs);
  b->lg = mole_malloc((size_t)(bmax * hp->n_vocab) * sizeof(float));
  b->idx = mole_malloc((size_t)(bmax * K) * sizeof *b->idx);
  b->xbuf = mole_calloc((size_t)(2 * rmax * hp->n_embd), sizeof(float));
  b->xin = mole_malloc((size_t)rmax * sizeof *b->xin);
  b->xout = mole_malloc((size_t)rmax * sizeof *b->xout);
  b->sel = mole_malloc((size_t)rmax * sizeof *b->sel);
  b->w = mole_malloc((size_t)rmax * sizeof *b->w);
  b->done = mole_malloc((size_t)rmax);
  mole_status st = link_bufs_new(N, &b->link);
  if (!st && (!b->kvs || !b->lg || !b->idx || !b->xbuf || !b->xin || !b->xout || !b->sel || !b->w || !b->done))
    st = mole_errorf(MOLE_ERR_NOMEM, "plan --disagg: out of memory");
  // the attention side: bmax caches at context ctx (contents do not change the time)
  for (; b->n_kvs < bmax && !st; b->n_kvs++)
    st = kv_new(hp->n_layer, ctx + 2, hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v, QT_F16,
                &b->kvs[b->n_kvs]);
  if (!st) st = model_scratch_new(m, bmax, ctx + 2, &b->s);
  if (!st) st = model_scratch_new(m, rmax, 1, &b->xs);
  if (st) return st;
  for (int64_t i = 0; i < rmax; i++) {
    float *xi = b->xbuf + i * hp->n_embd;
    for (int64_t j = 0; j < hp->n_embd; j++) xi[j] = (float)((i * 31 + j * 17) % 97) / 97.0f - 0.5f;
    b->xin[i] = xi;
    b->xout[i] = b->xbuf + (rmax + i) * hp->n_embd;
  }
  return MOLE_OK;
}

// The sizes profiled: batches 1, 2, 4, .. up to max_seqs (a sequence per
// token in decode); rows 1, 2, 4, .. up to every token's every choice
// reaching one rank; the experts per rank of every count of expert ranks.
static void profile_sizes(dg_profile *p, const model_hparams *hp, int64_t max_seqs, int N) {
  for (int64_t b = 1; p->nb < PB_MAX; b *= 2) {
    p->b[p->nb++] = MOLE_MIN(b, max_seqs);
    if (b >= max_seqs) break;
  }
  const int64_t bmax = p->b[p->nb - 1], K = hp->n_expert_used;
  for (int64_t r = 1; p->nr < PR_MAX; r *= 2) {
    p->r[p->nr++] = MOLE_MIN(r, bmax * K);
    if (r >= bmax * K) break;
  }
  for (int E = 1; E <= N && p->nx < PX_MAX; E++) {
    const int64_t x = hp->n_expert / E;
    bool seen = false;
    for (int i = 0; i < p->nx; i++) seen = seen || p->x[i] == x;
    if (!seen && x >= 1) p->x[p->nx++] = x;
  }
}

// Rank 0: every candidate's prediction, the pick (JSON to out, NULL:
// stdout) and a summary on stderr.
static mole_status plan_write(const dg_profile *p, const model_hparams *hp, int N, int cores, double wa, double we,
                              double kv_seq, int64_t ctx, double max_tpot_ms, const char *out) {
  // candidates: every split, m = 1..4, ping-pong on and off, B = the profiled batch sizes
  dg_plan best = {0}, cand[2048];
  int nc = 0;
  for (int A = 1; A <= N; A++) {
    const int E = A == N ? N : N - A;
    for (int mm = 1; mm <= 4; mm++)
      for (int pp = 0; pp < 2; pp++) {
        if (A == N && pp) continue;  // co-located: no ping-pong between sides
        for (int bi = 0; bi < p->nb && nc < 2048; bi++) {
          dg_plan q = {.A = A, .E = E, .m = mm, .B = p->b[bi], .ping_pong = pp == 1};
          if (q.B < (int64_t)A * mm || hp->n_expert / E < 1) continue;
          predict(p, hp, N, cores, wa, we, kv_seq, &q);
          cand[nc++] = q;
          const bool ok_lat = max_tpot_ms <= 0 || 1e3 * q.pass_s <= max_tpot_ms;
          if (q.fits && ok_lat && q.tps_rank > best.tps_rank) best = q;
        }
      }
  }
  if (best.A == 0)
    return mole_errorf(MOLE_ERR_NOMEM, "plan --disagg: no split of %d processes meets %.1f ms per token within %.0f MiB per rank",
                       N, max_tpot_ms, p->mem_bytes / 1048576.0);
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) return mole_errorf(MOLE_ERR_IO, "plan: cannot write '%s'", out);
  fprintf(f, "{\"disagg\": true, \"ranks\": %d, \"ctx\": %lld, \"max_tpot_ms\": %.3f, \"pick\": ", N, (long long)ctx,
          max_tpot_ms);
  plan_json(f, &best, N);
  fprintf(f, ",\n \"profile\": {\"batch\": [");
  for (int i = 0; i < p->nb; i++)
    fprintf(f, "%s[%lld, %.4f, %.4f]", i ? ", " : "", (long long)p->b[i], 1e3 * p->ta[i], 1e3 * p->tr[i]);
  fprintf(f, "], \"experts\": [");
  for (int xi = 0; xi < p->nx; xi++) {
    fprintf(f, "%s{\"experts\": %lld, \"rows_ms\": [", xi ? ", " : "", (long long)p->x[xi]);
    for (int ri = 0; ri < p->nr; ri++) fprintf(f, "%s[%lld, %.4f]", ri ? ", " : "", (long long)p->r[ri], 1e3 * p->te[xi][ri]);
    fprintf(f, "]}");
  }
  fprintf(f, "], \"link_latency_us\": %.2f, \"link_gbs\": %.3f, \"mem_bytes\": %.0f, \"note\": \"batch: [sequences, ms per layer, ms per pass outside the layers]; experts: ms per layer\"},\n \"candidates\": [\n",
          1e6 * p->lat_s, p->bw_bps / 1e9, p->mem_bytes);
  for (int i = 0; i < nc; i++) {
    fprintf(f, "  ");
    plan_json(f, &cand[i], N);
    fprintf(f, "%s\n", i + 1 < nc ? "," : "");
  }
  fprintf(f, "]}\n");
  if (out) fclose(f);
  const dg_plan *q = &best;
  char split[64];
  if (q->A == N) snprintf(split, sizeof split, "co-located");
  else snprintf(split, sizeof split, "%d attention + %d expert", q->A, q->E);
  fprintf(stderr,
          "mole plan --disagg: %d ranks: %s, %d micro-batches%s, %lld sequences: predicted %.2f ms per token, "
          "%.1f tokens/s (%.1f per rank)\n",
          N, split, q->m, q->A == N ? "" : (q->ping_pong ? " ping-pong" : " one after another"),
          (long long)q->B, 1e3 * q->pass_s, q->tps, q->tps_rank);
  if (q->A != N) fprintf(stderr, "mole plan --disagg: run with --disagg attn=%d,expert=%d --micro-batches %d%s\n", q->A, q->E, q->m, q->ping_pong ? "" : " --no-ping-pong");
  else fprintf(stderr, "mole plan --disagg: run with --disagg colocated --micro-batches %d\n", q->m);
  return MOLE_OK;
}

mole_status mole_disagg_plan(const char *path, const mole_model_params *params, int64_t max_seqs, int64_t ctx,
                             double max_tpot_ms, const char *out) {
  if (!parallel_inited()) return mole_errorf(MOLE_ERR_ARG, "plan --disagg: run under mpirun (mole_dist_init)");
  const int threads = parallel_default_threads();  // (a collective: on every rank, before anything can fail)
  int rank, N;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &N);
  mole_status st = MOLE_OK;
  mole_model_params mp = *params;
  if (max_seqs < 1 || max_seqs > 1024)
    st = mole_errorf(MOLE_ERR_ARG, "plan --disagg: --seqs %lld: 1..1024", (long long)max_seqs);
  else if (ctx < 1 || ctx > 1 << 20)
    st = mole_errorf(MOLE_ERR_ARG, "plan --disagg: --ctx %lld: 1..1048576", (long long)ctx);
  else if (mp.n_threads < 0 || mp.n_threads > 1024)
    st = mole_errorf(MOLE_ERR_ARG, "threads: %d is out of range", mp.n_threads);
  if (mp.n_threads == 0) mp.n_threads = threads;
  mp.offload.expert_budget = 0;
  mp.offload.expert_budget_frac = 0;
  mole_model *m = NULL;
  if (!st) st = model_load(path, &mp, NULL, &m);
  if (!st && m->hp.n_expert == 0) st = mole_errorf(MOLE_ERR_ARG, "%s: plan --disagg: a dense model (no routed experts)", path);
  dg_profile p = {0};
  prof_bufs b = {0};
  if (!st) {
    experts_mem_info mi;
    experts_mem_probe(NULL, &mi);
    p.mem_bytes = mi.available > 0 ? (double)mi.available : 0;
    profile_sizes(&p, &m->hp, max_seqs, N);
    st = prof_bufs_new(m, &p, ctx, N, &b);
  }
  // the first collective after the load: every rank gets here, whatever failed before
  if ((st = parallel_agree(MPI_COMM_WORLD, st))) {
    prof_bufs_free(&b);
    model_free(m);
    return st;
  }
  const model_hparams *hp = &m->hp;
  const int64_t rmax = p.r[p.nr - 1];
  const double kv_seq = (double)kv_bytes(b.kvs[0]);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank profiles at once: the times include what they take from each other
  double rest;
  time_attn(m, 1, ctx, b.kvs, b.s, b.lg, b.idx, &rest);  // warm-up
  for (int i = 0; i < p.nb; i++) p.ta[i] = time_attn(m, p.b[i], ctx, b.kvs, b.s, b.lg, b.idx, &p.tr[i]);
  for (int xi = 0; xi < p.nx; xi++)
    for (int ri = 0; ri < p.nr; ri++)
      p.te[xi][ri] = time_experts(m, p.r[ri], p.x[xi], b.xs, b.xin, b.xout, b.sel, b.w, b.done);
  profile_link(rank, N, &b.link, &p);
  profile_sync(m, rank, N, &b.link, b.xs, b.xin, b.xout, b.sel, b.w, b.done, MOLE_MIN(rmax, 8), &p);
  // every rank's figures: the slowest rank's times, the least memory
  MPI_Allreduce(MPI_IN_PLACE, p.ta, PB_MAX, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, p.tr, PB_MAX, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, p.te, PX_MAX * PR_MAX, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &p.mem_bytes, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Bcast(&p.lat_s, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&p.bw_bps, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  // weights: the routed experts' bytes, the rest
  double we = 0, wall = 0;
  for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
    const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
    wall += (double)t->size;
    if (strstr(t->name, "_exps.")) we += (double)t->size;
  }
  // cores of the machine per process when they share one (the smallest node)
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN), here = 1;
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &here);
    MPI_Comm_free(&node);
  }
  cores = MOLE_MAX(cores, 1) * N / here;  // as if every node were this one: N processes on `cores` in all
  MPI_Allreduce(MPI_IN_PLACE, &cores, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) st = plan_write(&p, hp, N, cores, wall - we, we, kv_seq, ctx, max_tpot_ms, out);
  prof_bufs_free(&b);
  model_free(m);
  // rank 0's outcome is every rank's
  return parallel_agree(MPI_COMM_WORLD, st);
}
