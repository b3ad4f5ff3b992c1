// engine/train_retain_math: the pieces of mole train-retain (train_retain.h)
// that are plain arithmetic: the MLP's loss and its gradient, the labels,
// H2O's accumulated attention, the top-k overlap, AdamW and the schedule.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train_retain.h"
#include "quant/quant.h"

double train_retain_terms_loss(const train_retain_terms *t, float smooth) {
  double l = 0;
  if (t->n_fit) l += t->fit / (double)t->n_fit;
  if (t->n_sq) l += (double)smooth * t->sq / (double)t->n_sq;
  return l;
}

size_t train_retain_loss_tmp(const train_retain_mlp *w, int64_t n) {
  return (size_t)n * (size_t)(2 * w->n_hidden + 2 * w->n_out);
}

static float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

double train_retain_loss(const train_retain_mlp *w, const float *X, int64_t n, const float *Y, const uint8_t *mask,
                         const uint8_t *next, float smooth, train_retain_mlp *grad, train_retain_terms *terms,
                         float *tmp) {
  const int64_t D = w->d_in, H = w->n_hidden, K = w->n_out;
  MOLE_ASSERT(n >= 1 && D >= 1 && H >= 1 && K >= 1);
  float *A = tmp;           // [n][H] pre-activation
  float *Hh = A + n * H;    // [n][H] silu(A); later dL/dHh, then dL/dA
  float *P = Hh + n * H;    // [n][K] predictions
  float *dP = P + n * K;    // [n][K] dL/dP
  for (int64_t t = 0; t < n; t++) memcpy(A + t * H, w->b1, (size_t)H * sizeof(float));
  // A [n][H] += X [n][D] . w1^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)H, (int)D, 1.0f, X, (int)D, w->w1, (int)D, 1.0f, A,
              (int)H);
  for (int64_t i = 0; i < n * H; i++) Hh[i] = A[i] * sigmoid(A[i]);
  for (int64_t t = 0; t < n; t++) memcpy(P + t * K, w->b2, (size_t)K * sizeof(float));
  // P [n][K] += Hh [n][H] . w2^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)K, (int)H, 1.0f, Hh, (int)H, w->w2, (int)H, 1.0f, P,
              (int)K);
  train_retain_terms tm = {0};
  for (int64_t i = 0; i < n * K; i++) {
    if (!mask[i]) continue;
    const double d = (double)P[i] - (double)Y[i], a = fabs(d);
    tm.fit += a < 1.0 ? 0.5 * d * d : a - 0.5;
    tm.n_fit++;
  }
  for (int64_t t = 0; t + 1 < n; t++) {
    if (!next[t]) continue;
    for (int64_t g = 0; g < K; g++) {
      const double e = (double)P[(t + 1) * K + g] - (double)P[t * K + g];
      tm.sq += e * e;
    }
    tm.n_sq += K;
  }
  if (terms) {
    terms->fit += tm.fit;
    terms->sq += tm.sq;
    terms->n_fit += tm.n_fit;
    terms->n_sq += tm.n_sq;
  }
  const double loss = train_retain_terms_loss(&tm, smooth);
  if (!grad) return loss;
  MOLE_ASSERT(grad->d_in == D && grad->n_hidden == H && grad->n_out == K);
  // dL/dP: SmoothL1' = clamp(d, -1, 1) over the labelled, 2 smooth (P_t - P_t+1) / n_sq on each side of a pair
  const float inv_fit = tm.n_fit ? (float)(1.0 / (double)tm.n_fit) : 0.0f;
  const float c_sq = tm.n_sq ? (float)(2.0 * (double)smooth / (double)tm.n_sq) : 0.0f;
  for (int64_t i = 0; i < n * K; i++) dP[i] = mask[i] ? fminf(fmaxf(P[i] - Y[i], -1.0f), 1.0f) * inv_fit : 0.0f;
  for (int64_t t = 0; t + 1 < n; t++) {
    if (!next[t]) continue;
    for (int64_t g = 0; g < K; g++) {
      const float e = c_sq * (P[t * K + g] - P[(t + 1) * K + g]);
      dP[t * K + g] += e;
      dP[(t + 1) * K + g] -= e;
    }
  }
  // dw2 [K][H] = dP^T . Hh; db2 = column sums of dP
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)H, (int)n, 1.0f, dP, (int)K, Hh, (int)H, 0.0f,
              grad->w2, (int)H);
  for (int64_t g = 0; g < K; g++) {
    float s = 0;
    for (int64_t t = 0; t < n; t++) s += dP[t * K + g];
    grad->b2[g] = s;
  }
  // dHh [n][H] = dP . w2 (into Hh), then dA = dHh * silu'(A), silu'(a) = s (1 + a (1 - s))
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)K, 1.0f, dP, (int)K, w->w2, (int)H, 0.0f,
              Hh, (int)H);
  for (int64_t i = 0; i < n * H; i++) {
    const float s = sigmoid(A[i]);
    Hh[i] *= s * (1.0f + A[i] * (1.0f - s));
  }
  // dw1 [H][D] = dA^T . X; db1 = column sums of dA
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)D, (int)n, 1.0f, Hh, (int)H, X, (int)D, 0.0f,
              grad->w1, (int)D);
  for (int64_t j = 0; j < H; j++) grad->b1[j] = 0.0f;
  for (int64_t t = 0; t < n; t++)
    for (int64_t j = 0; j < H; j++) grad->b1[j] += Hh[t * H + j];
  return loss;
}

void train_retain_labels(const float *q, const float *k, int64_t n, int64_t n_head, int64_t n_head_kv,
                         int64_t head_dim, float scale, int64_t window, float *label) {
  MOLE_ASSERT(n_head_kv >= 1 && n_head % n_head_kv == 0 && window >= 1);
  const quant_traits *f32t = quant_traits_of(QT_F32);
  const int64_t G = n_head / n_head_kv, hd = head_dim, ldq = n_head * hd, ldk = n_head_kv * hd;
  for (int64_t j = 0; j < n; j++) {
    const int64_t i1 = MOLE_MIN(j + window, n - 1);
    for (int64_t g = 0; g < n_head_kv; g++) {
      const float *kj = k + j * ldk + g * hd;
      float best = -INFINITY;
      for (int64_t i = j + 1; i <= i1; i++)
        for (int64_t h = g * G; h < (g + 1) * G; h++) {
          float d;
          f32t->vec_dot(hd, &d, q + i * ldq + h * hd, kj);
          best = d > best ? d : best;
        }
      // scale > 0: the max of the scaled scores is the scaled max
      label[j * n_head_kv + g] = i1 > j ? best * scale : 0.0f;
    }
  }
}

void train_retain_h2o(const float *q, const float *k, int64_t n, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      float scale, float *acc, float *tmp) {
  MOLE_ASSERT(n_head_kv >= 1 && n_head % n_head_kv == 0);
  const quant_traits *f32t = quant_traits_of(QT_F32);
  const int64_t G = n_head / n_head_kv, hd = head_dim, ldq = n_head * hd, ldk = n_head_kv * hd;
  memset(acc, 0, (size_t)(n * n_head_kv) * sizeof(float));
  for (int64_t h = 0; h < n_head; h++) {
    const int64_t g = h / G;
    for (int64_t i = 0; i < n; i++) {
      const float *qi = q + i * ldq + h * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; j++) {
        f32t->vec_dot(hd, &tmp[j], qi, k + j * ldk + g * hd);
        tmp[j] *= scale;
        mx = tmp[j] > mx ? tmp[j] : mx;
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; j++) {
        tmp[j] = expf(tmp[j] - mx);
        sum += tmp[j];
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t j = 0; j <= i; j++) acc[j * n_head_kv + g] += tmp[j] * inv;
    }
  }
}

typedef struct {
  float s;
  int32_t j;
} ranked;

// by score, highest first; equal scores: the later key first
static int ranked_cmp(const void *pa, const void *pb) {
  const ranked *a = pa, *b = pb;
  if (a->s != b->s) return a->s > b->s ? -1 : 1;
  return a->j > b->j ? -1 : a->j < b->j;
}

size_t train_retain_overlap_tmp(int64_t n) { return (size_t)n * (2 * sizeof(ranked) + 1); }

double train_retain_overlap(const float *score, int64_t ss, const float *label, int64_t ls, int64_t n, int64_t top_k,
                            void *tmp) {
  MOLE_ASSERT(top_k >= 1 && top_k <= n && n <= INT32_MAX);
  ranked *a = tmp, *b = a + n;
  uint8_t *in = (uint8_t *)(b + n);
  for (int64_t j = 0; j < n; j++) {
    a[j] = (ranked){score[j * ss], (int32_t)j};
    b[j] = (ranked){label[j * ls], (int32_t)j};
    in[j] = 0;
  }
  qsort(a, (size_t)n, sizeof *a, ranked_cmp);
  qsort(b, (size_t)n, sizeof *b, ranked_cmp);
  for (int64_t i = 0; i < top_k; i++) in[b[i].j] = 1;
  int64_t hit = 0;
  for (int64_t i = 0; i < top_k; i++) hit += in[a[i].j];
  return (double)hit / (double)top_k;
}

void train_retain_adamw(float *w, const float *g, float *m, float *v, int64_t n, int64_t t, float lr, float wd) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
  for (int64_t i = 0; i < n; i++) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    w[i] -= lr * (wd * w[i] + (m[i] / c1) / (sqrtf(v[i] / c2) + eps));
  }
}

float train_retain_lr(float lr, int64_t t, int64_t total, int64_t warm) {
  if (t < warm) return lr * (float)(t + 1) / (float)warm;
  const double x = (double)(t - warm) / (double)MOLE_MAX(total - warm, 1);
  return (float)((double)lr * 0.5 * (1.0 + cos(M_PI * MOLE_MIN(x, 1.0))));
}
