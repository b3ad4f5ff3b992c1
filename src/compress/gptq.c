// compress/gptq: GPTQ (arXiv 2210.17323) on one weight matrix, per-row
// ternary or 2-bit grids, and round-to-nearest on the same grids.
//
// The Hessian is worked on in place, in one k x k buffer (the caller's):
//   H <- 2 H / n_samples, dead columns (H_ii == 0) get H_ii = 1 and W[:, i] = 0,
//   H_ii += lambda = damp * mean(diag H).
// GPTQ needs V, the upper Cholesky factor of H^-1 (H^-1 = V^T V). With J the
// reversal of the indices, J H J = U^T U (U upper) gives H^-1 = J U^-1 U^-T J,
// so V = J U^-T J: one Cholesky and one triangular inverse (2k^3/3 flops; the
// reference's Cholesky, inverse, Cholesky take 4k^3/3). J H J is the k*k
// floats in reverse order; LAPACK sees the row-major buffer as column-major
// (H is symmetric); spotrf('U') and strtri('U') touch only the flipped
// buffer's row-major lower triangle, which flipped back is the upper one: V
// ends up in the row-major upper triangle, row i of V (V[i][j], j >= i) the
// buffer's row i from its diagonal on, contiguous as the column loop reads it.
// The strict lower triangle keeps the scaled H throughout, so a failed
// factorization is retried (with damp * 10) after copying it back up and
// restoring the diagonal saved aside.
//
// The column loop (GPTQ's lazy batch updates): for each block of `block`
// columns, every row on its own quantizes its columns left to right, feeding
// err = (w - q) / V_ii forward into the block's later columns
// (w[j] -= err * V[i][j], a contiguous axpy); then one GEMM
// W[:, i2:] -= Err[:, block] V[block, i2:] applies the block to the rest.
// Since Delta = W - Q = Err V, the GPTQ loss Delta H_d Delta^T of a row is
// exactly the sum of its err^2 (H_d the dampened Hessian): info->err is that
// sum over all rows, divided by n_rows.
#include "compress/gptq.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>

#include "quant/quant.h"

enum { GPTQ_RETRIES = 3, GPTQ_TILE = 64, GPTQ_OBJ_ROWS = 64 };

// ---- grids ---------------------------------------------------------------------

typedef struct grid_row {
  float s;       // scale (an f16 value)
  float z;       // zero point (0 for ternary)
  float lo, hi;  // the integer range: ternary -1..1, 2-bit 0..3
  float dz;      // ternary: |w| / s at or under this rounds to 0 (0.5: to nearest)
} grid_row;

static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// The grid of one original row: the scale rounded to f16 before use.
static grid_row grid_of_row(gptq_grid g, const float *w, int64_t k, float dz) {
  grid_row r = {0.0f, 0.0f, -1.0f, 1.0f, dz};
  if (g == GPTQ_TERNARY) {
    float m = 0.0f;
    for (int64_t j = 0; j < k; j++) m = fabsf(w[j]) > m ? fabsf(w[j]) : m;
    r.s = quant_f16_to_f32(quant_f32_to_f16(m));
    return r;
  }
  // 2-bit: GPTQ's quantizer keeps 0 inside [min, max]
  float mn = 0.0f, mx = 0.0f;
  for (int64_t j = 0; j < k; j++) {
    mn = w[j] < mn ? w[j] : mn;
    mx = w[j] > mx ? w[j] : mx;
  }
  r.lo = 0.0f;
  r.hi = 3.0f;
  r.s = quant_f16_to_f32(quant_f32_to_f16((mx - mn) / 3.0f));
  if (r.s > 0.0f) r.z = clampf(rintf(-mn / r.s), 0.0f, 3.0f);
  return r;
}

// The grid integer of w (rintf: round half to even, as torch.round).
static inline float grid_q(const grid_row *g, float w) {
  if (!(g->s > 0.0f)) return g->z;
  if (g->dz > 0.5f) {  // ternary with a wider zero bin
    const float a = w / g->s;
    return a > g->dz ? 1.0f : a < -g->dz ? -1.0f : 0.0f;
  }
  return clampf(rintf(w / g->s) + g->z, g->lo, g->hi);
}

static inline float grid_deq(const grid_row *g, float q) { return g->s * (q - g->z); }

// ---- Hessian helpers -----------------------------------------------------------

// One triangle of the row-major H copied onto the other, tile by tile: up
// (H[j][i] = H[i][j] for j < i, the strict lower triangle copied up) or down.
static void mirror(float *H, int64_t k, bool up) {
  for (int64_t ib = 0; ib < k; ib += GPTQ_TILE)
    for (int64_t jb = 0; jb <= ib; jb += GPTQ_TILE) {
      const int64_t ie = MOLE_MIN(ib + GPTQ_TILE, k), je = MOLE_MIN(jb + GPTQ_TILE, k);
      for (int64_t i = ib; i < ie; i++)
        for (int64_t j = jb; j < je && j < i; j++) {
          float *lo = H + (size_t)i * k + j, *hi = H + (size_t)j * k + i;
          if (up) *hi = *lo;
          else *lo = *hi;
        }
    }
}

void gptq_hessian_add(float *H, const float *X, int64_t n, int64_t k, int64_t ldx) {
  MOLE_ASSERT(H && k > 0 && n >= 0 && ldx >= k);
  if (n == 0) return;
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)k, (int)n, 1.0f, X, (int)ldx, 1.0f, H, (int)k);
  mirror(H, k, false);
}

// Reverses the k*k floats of H in place: H[i][j] <-> H[k-1-i][k-1-j].
static void flip(float *H, int64_t k) {
  const size_t n = (size_t)k * (size_t)k;
  for (size_t i = 0, j = n - 1; i < j; i++, j--) {
    const float t = H[i];
    H[i] = H[j];
    H[j] = t;
  }
}

// Factor the dampened H into V (see the top of the file). H: scaled, its
// strict lower triangle intact; d0 [k]: the undampened diagonal. Returns the
// LAPACK info (0: success).
static int hinv_factor(float *H, int64_t k, const float *d0, float lam, bool restore) {
  if (restore) mirror(H, k, true);
  for (int64_t i = 0; i < k; i++) H[(size_t)i * k + i] = d0[i] + lam;
  const lapack_int n = (lapack_int)k;
  flip(H, k);
  lapack_int rc = LAPACKE_spotrf(LAPACK_COL_MAJOR, 'U', n, H, n);
  if (rc == 0) rc = LAPACKE_strtri(LAPACK_COL_MAJOR, 'U', 'N', n, H, n);
  flip(H, k);
  if (rc == 0)
    for (int64_t i = 0; i < k; i++) {
      const float d = H[(size_t)i * k + i];
      if (!(d > 0.0f) || !isfinite(d)) return (int)i + 1;
    }
  return (int)rc;
}

// sum over the rows of D of (alpha * d H d^T + lam * |d|^2), D [nr][k], H
// [k][k] symmetric (full), G [nr][k] scratch.
static double objective_rows(const float *D, int64_t nr, int64_t k, const float *H, float alpha, float lam,
                             float *G) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)k, (int)k, alpha, D, (int)k, H, (int)k, 0.0f,
              G, (int)k);
  double sum = 0.0;
  for (int64_t i = 0; i < nr * k; i++) sum += (double)D[i] * ((double)G[i] + (double)lam * D[i]);
  return sum;
}

// ---- round to nearest ----------------------------------------------------------

// RTN of every row on its grid (grids already in scale/zero); W becomes the
// dequantized result. When H is given, adds the loss alpha * D H D^T + lam |D|^2
// of D = W - Q to *err (rows in chunks: two GPTQ_OBJ_ROWS x k scratch rows).
static mole_status rtn_rows(float *W, int64_t n_rows, int64_t k, const grid_row *grids,
                            int8_t *q, const float *H, float alpha, float lam, double *err, int64_t *zeros) {
  float *D = NULL, *G = NULL;
  if (H) {
    D = mole_aligned_alloc(64, (size_t)GPTQ_OBJ_ROWS * k * sizeof(float));
    G = mole_aligned_alloc(64, (size_t)GPTQ_OBJ_ROWS * k * sizeof(float));
    if (!D || !G) {
      mole_aligned_free(D);
      mole_aligned_free(G);
      return mole_errorf(MOLE_ERR_NOMEM, "gptq: out of memory for the RTN loss (%lld columns)", (long long)k);
    }
  }
  int64_t nz = 0;
  double sum = 0.0;
  for (int64_t r0 = 0; r0 < n_rows; r0 += GPTQ_OBJ_ROWS) {
    const int64_t r1 = MOLE_MIN(r0 + GPTQ_OBJ_ROWS, n_rows);
    for (int64_t r = r0; r < r1; r++) {
      const grid_row *g = &grids[r];
      float *w = W + (size_t)r * k;
      int8_t *qr = q + (size_t)r * k;
      float *d = D ? D + (size_t)(r - r0) * k : NULL;
      for (int64_t j = 0; j < k; j++) {
        const float qi = grid_q(g, w[j]), deq = grid_deq(g, qi);
        qr[j] = (int8_t)qi;
        nz += qi == g->z;
        if (d) d[j] = w[j] - deq;
        w[j] = deq;
      }
    }
    if (H) sum += objective_rows(D, r1 - r0, k, H, alpha, lam, G);
  }
  mole_aligned_free(D);
  mole_aligned_free(G);
  *err += sum;
  *zeros += nz;
  return MOLE_OK;
}

// ---- GPTQ column loop ----------------------------------------------------------

// w[j] -= a * v[j] for j < n: the error feedback inside a block. Written with
// the compilers' generic vectors (gcc and clang; SSE at the baseline ISA)
// because -O2 does not vectorize a loop that needs a remainder.
typedef float gptq_v4 __attribute__((vector_size(16)));
static inline void axpy_neg(float *restrict w, const float *restrict v, float a, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    gptq_v4 w0, w1, v0, v1;
    memcpy(&w0, w + j, 16);
    memcpy(&w1, w + j + 4, 16);
    memcpy(&v0, v + j, 16);
    memcpy(&v1, v + j + 4, 16);
    w0 -= a * v0;
    w1 -= a * v1;
    memcpy(w + j, &w0, 16);
    memcpy(w + j + 4, &w1, 16);
  }
  for (; j < n; j++) w[j] -= a * v[j];
}

// V: the factor (row i of V at V + i*k, from column i on). Returns the loss sum.
static double gptq_columns(float *W, int64_t n_rows, int64_t k, const float *V, int64_t block, const grid_row *grids,
                           int8_t *q, float *Err, int64_t *zeros) {
  double loss = 0.0;
  int64_t nz = 0;
  for (int64_t i1 = 0; i1 < k; i1 += block) {
    const int64_t i2 = MOLE_MIN(i1 + block, k), nb = i2 - i1;
    for (int64_t r = 0; r < n_rows; r++) {
      const grid_row *g = &grids[r];
      float *w = W + (size_t)r * k + i1;
      int8_t *qr = q + (size_t)r * k + i1;
      float *e = Err + (size_t)r * nb;
      double rl = 0.0;
      for (int64_t i = 0; i < nb; i++) {
        const float *vr = V + (size_t)(i1 + i) * k + i1;  // V[i1 + i][i1 ..]
        const float wi = w[i], qi = grid_q(g, wi), deq = grid_deq(g, qi);
        const float er = (wi - deq) / vr[i];
        qr[i] = (int8_t)qi;
        nz += qi == g->z;
        w[i] = deq;
        e[i] = er;
        rl += (double)er * er;
        axpy_neg(w + i + 1, vr + i + 1, er, nb - i - 1);
      }
      loss += rl;
    }
    if (i2 < k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n_rows, (int)(k - i2), (int)nb, -1.0f, Err, (int)nb,
                  V + (size_t)i1 * k + i2, (int)k, 1.0f, W + i2, (int)k);
  }
  *zeros += nz;
  return loss;
}

// ---- act order -------------------------------------------------------------------
// GPTQ's "act order": columns quantized in order of decreasing H diagonal (the
// inputs with the most energy first, while the most columns remain to take
// their error). perm[j] = the original column at place j.

typedef struct {
  float key;
  int64_t col;
} col_key;

static int cmp_desc(const void *a, const void *b) {
  const col_key *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  return (x->col > y->col) - (x->col < y->col);  // ties: the lower column first (deterministic)
}

// Columns of the rows of M [n][k] to the order perm (gather through tmp [k]).
static void permute_cols(float *M, int64_t n, int64_t k, const int64_t *perm, float *tmp) {
  for (int64_t r = 0; r < n; r++) {
    float *row = M + (size_t)r * k;
    for (int64_t j = 0; j < k; j++) tmp[j] = row[perm[j]];
    memcpy(row, tmp, (size_t)k * sizeof *row);
  }
}

// The inverse: place j goes back to column perm[j].
static void unpermute_cols_f(float *M, int64_t n, int64_t k, const int64_t *perm, float *tmp) {
  for (int64_t r = 0; r < n; r++) {
    float *row = M + (size_t)r * k;
    for (int64_t j = 0; j < k; j++) tmp[perm[j]] = row[j];
    memcpy(row, tmp, (size_t)k * sizeof *row);
  }
}

static void unpermute_cols_q(int8_t *M, int64_t n, int64_t k, const int64_t *perm, int8_t *tmp) {
  for (int64_t r = 0; r < n; r++) {
    int8_t *row = M + (size_t)r * k;
    for (int64_t j = 0; j < k; j++) tmp[perm[j]] = row[j];
    memcpy(row, tmp, (size_t)k);
  }
}

// H [k][k] to P H P^T in place: its columns, then its rows (row j <- old row
// perm[j], following the permutation's cycles with one spare row).
static void permute_sym(float *H, int64_t k, const int64_t *perm, float *tmp, uint8_t *done) {
  permute_cols(H, k, k, perm, tmp);
  memset(done, 0, (size_t)k);
  for (int64_t s = 0; s < k; s++) {
    if (done[s]) continue;
    memcpy(tmp, H + (size_t)s * k, (size_t)k * sizeof *tmp);
    int64_t j = s;
    for (;;) {
      done[j] = 1;
      const int64_t from = perm[j];
      if (from == s) {
        memcpy(H + (size_t)j * k, tmp, (size_t)k * sizeof *tmp);
        break;
      }
      memcpy(H + (size_t)j * k, H + (size_t)from * k, (size_t)k * sizeof *tmp);
      j = from;
    }
  }
}

// ---- entry point ---------------------------------------------------------------

mole_status gptq_quantize(const gptq_params *p, float *W, int64_t n_rows, int64_t k, float *H, int64_t n_samples,
                          int8_t *q, float *scale, uint8_t *zero, gptq_info *info) {
  gptq_info inf = {false, 0.0f, 0.0, 0};
  if (info) *info = inf;
  if (!p || !W || !q || !scale) return mole_errorf(MOLE_ERR_ARG, "gptq: missing params, weights, q or scale");
  if (p->grid != GPTQ_TERNARY && p->grid != GPTQ_2BIT) return mole_errorf(MOLE_ERR_ARG, "gptq: grid %d", (int)p->grid);
  if (p->grid == GPTQ_2BIT && !zero) return mole_errorf(MOLE_ERR_ARG, "gptq: 2-bit grid needs the zero array");
  if (n_rows < 0 || k <= 0 || k > INT32_MAX / 2 || n_rows > INT32_MAX)
    return mole_errorf(MOLE_ERR_ARG, "gptq: bad shape %lld x %lld", (long long)n_rows, (long long)k);
  if (!(p->damp >= 0.0f) || !isfinite(p->damp)) return mole_errorf(MOLE_ERR_ARG, "gptq: damp %g", (double)p->damp);
  if (p->grid == GPTQ_TERNARY && !(p->dead_zone >= 0.5f && p->dead_zone < 1.0f))
    return mole_errorf(MOLE_ERR_ARG, "gptq: dead zone %g: need 0.5 <= dz < 1", (double)p->dead_zone);
  if (!p->rtn && (!H || n_samples <= 0))
    return mole_errorf(MOLE_ERR_ARG, "gptq: needs the Hessian and n_samples > 0 (got %lld)", (long long)n_samples);
  const int64_t block = p->block > 0 ? p->block : 128;
  if (n_rows == 0) return MOLE_OK;
  for (int64_t i = 0; i < n_rows * k; i++)
    if (!isfinite(W[i]))
      return mole_errorf(MOLE_ERR_ARG, "gptq: weight [%lld][%lld] is not finite", (long long)(i / k),
                         (long long)(i % k));

  grid_row *grids = mole_malloc((size_t)MOLE_MAX(n_rows, 1) * sizeof *grids);
  if (!grids) return mole_errorf(MOLE_ERR_NOMEM, "gptq: out of memory for %lld row grids", (long long)n_rows);
  for (int64_t r = 0; r < n_rows; r++) {
    grids[r] = grid_of_row(p->grid, W + (size_t)r * k, k, p->grid == GPTQ_TERNARY ? p->dead_zone : 0.5f);
    if (!isfinite(grids[r].s)) {
      mole_free(grids);
      return mole_errorf(MOLE_ERR_ARG, "gptq: row %lld: the scale overflows f16 (weights too large)", (long long)r);
    }
    scale[r] = grids[r].s;
    if (zero) zero[r] = (uint8_t)grids[r].z;
  }

  mole_status st = MOLE_OK;
  int64_t *perm = NULL;  // act order
  float *ptmp = NULL;
  const float alpha = H && n_samples > 0 ? (float)(2.0 / (double)n_samples) : 0.0f;
  if (p->rtn) {
    // the loss with the Hessian as given (2 H / n + lambda I), H untouched
    float lam = 0.0f;
    if (n_samples <= 0) H = NULL;
    if (H) {
      double dsum = 0.0;
      for (int64_t i = 0; i < k; i++) {
        const float d = alpha * H[(size_t)i * k + i];
        dsum += d == 0.0f ? 1.0 : d;
      }
      lam = (float)(p->damp * dsum / (double)k);
    }
    inf.damp_used = p->damp;
    inf.err = H ? 0.0 : NAN;
    st = rtn_rows(W, n_rows, k, grids, q, H, alpha, lam, &inf.err, &inf.zeros);
    goto done;
  }

  float *d0 = mole_malloc((size_t)k * sizeof(float));
  if (!d0) {
    st = mole_errorf(MOLE_ERR_NOMEM, "gptq: out of memory (%lld columns)", (long long)k);
    goto done;
  }
  // check, then scale; dead columns
  for (int64_t i = 0; i < k; i++) {
    const float *h = H + (size_t)i * k;
    bool fin = true;
    for (int64_t j = 0; j < k; j++) fin &= isfinite(h[j]) != 0;
    if (!fin) {
      int64_t j = 0;
      while (isfinite(h[j])) j++;
      mole_free(d0);
      st = mole_errorf(MOLE_ERR_ARG, "gptq: Hessian [%lld][%lld] is not finite", (long long)i, (long long)j);
      goto done;
    }
  }
  double dsum = 0.0;
  for (int64_t i = 0; i < k; i++) {
    float *h = H + (size_t)i * k;
    for (int64_t j = 0; j < k; j++) h[j] *= alpha;
    if (h[i] == 0.0f) {
      h[i] = 1.0f;
      for (int64_t r = 0; r < n_rows; r++) W[(size_t)r * k + i] = 0.0f;
    }
    d0[i] = h[i];
    dsum += h[i];
  }
  const double mean = dsum / (double)k;
  if (p->act_order) {
    perm = mole_malloc((size_t)k * sizeof *perm);
    ptmp = mole_malloc((size_t)k * sizeof(float));
    uint8_t *done_row = mole_malloc((size_t)k);
    col_key *keys = mole_malloc((size_t)k * sizeof *keys);
    if (!perm || !ptmp || !done_row || !keys) {
      mole_free(done_row);
      mole_free(keys);
      mole_free(d0);
      st = mole_errorf(MOLE_ERR_NOMEM, "gptq: out of memory (%lld columns)", (long long)k);
      goto done;
    }
    for (int64_t j = 0; j < k; j++) keys[j] = (col_key){d0[j], j};
    qsort(keys, (size_t)k, sizeof *keys, cmp_desc);
    for (int64_t j = 0; j < k; j++) perm[j] = keys[j].col;
    mole_free(keys);
    permute_sym(H, k, perm, ptmp, done_row);
    permute_cols(W, n_rows, k, perm, ptmp);
    mole_free(done_row);
    for (int64_t j = 0; j < k; j++) ptmp[j] = d0[perm[j]];
    memcpy(d0, ptmp, (size_t)k * sizeof *d0);
  }
  const int64_t t0 = mole_time_us();
  float damp = p->damp, tried = damp, lam = 0.0f;
  int rc = -1;
  for (int a = 0; a <= GPTQ_RETRIES; a++) {
    lam = (float)(damp * mean);
    tried = damp;
    rc = hinv_factor(H, k, d0, lam, a > 0);
    if (rc == 0) break;
    mole_log(MOLE_LOG_DEBUG, "gptq: %lld x %lld: Cholesky failed (info %d) at damp %g", (long long)n_rows,
             (long long)k, rc, (double)damp);
    damp = damp > 0.0f ? damp * 10.0f : 0.01f;
  }
  if (rc != 0) {
    // not positive definite even dampened: RTN, the loss with the restored H
    mirror(H, k, true);
    inf.rtn_fallback = true;
    inf.damp_used = p->damp;
    lam = (float)(p->damp * mean);
    for (int64_t i = 0; i < k; i++) H[(size_t)i * k + i] = d0[i];
    mole_log(MOLE_LOG_WARN, "gptq: %lld x %lld: Hessian not positive definite up to damp %g: round to nearest",
             (long long)n_rows, (long long)k, (double)tried);
    st = rtn_rows(W, n_rows, k, grids, q, H, 1.0f, lam, &inf.err, &inf.zeros);
    mole_free(d0);
    goto done;
  }
  inf.damp_used = tried;
  mole_free(d0);
  float *Err = mole_aligned_alloc(64, (size_t)MOLE_MAX(n_rows, 1) * (size_t)MOLE_MIN(block, k) * sizeof(float));
  if (!Err) {
    st = mole_errorf(MOLE_ERR_NOMEM, "gptq: out of memory for the %lld x %lld error block", (long long)n_rows,
                     (long long)block);
    goto done;
  }
  const int64_t t1 = mole_time_us();
  inf.err = gptq_columns(W, n_rows, k, H, MOLE_MIN(block, k), grids, q, Err, &inf.zeros);
  mole_aligned_free(Err);
  mole_log(MOLE_LOG_DEBUG, "gptq: %lld x %lld: factor %.2f s, columns %.2f s", (long long)n_rows, (long long)k,
           (double)(t1 - t0) / 1e6, (double)(mole_time_us() - t1) / 1e6);

done:
  if (perm && st == MOLE_OK) {  // back to the original columns
    unpermute_cols_f(W, n_rows, k, perm, ptmp);
    unpermute_cols_q(q, n_rows, k, perm, (int8_t *)ptmp);
  }
  mole_free(perm);
  mole_free(ptmp);
  mole_free(grids);
  if (n_rows > 0) inf.err /= (double)n_rows;
  if (info && st == MOLE_OK) *info = inf;
  return st;
}
