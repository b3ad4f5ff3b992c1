// engine/compress: mole compress (see compress.h). The flow, per layer l:
//   1. calibration: every sequence through the model; the routed-FFN hook
//      (model_moe_hook) records layer l's FFN inputs and routing, computes
//      layers < l with their compressed experts, and skips layers > l;
//   2. per expert: its tokens (capped), H = X^T X for gate and up, GPTQ on
//      both, the SwiGLU hidden of the compressed pair, H of that for down,
//      GPTQ on down; the result goes to the temporary file as 2-bit rows
//      (ternary t as q = t + 1 on zero 1: the same values the final code holds);
// then the dictionary from the ternary rows seen, and the packed file, each
// expert's matrices coded from the temporary file as the writer asks for them.
#include "engine/compress.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/pool.h"
#include "compress/codebook.h"
#include "experts/io.h"
#include "experts/pack.h"
#include "experts/store.h"
#include "model/model.h"
#include "model/ops.h"
#include "quant/quant_tq.h"
#include "tokenizer/tokenizer.h"

#include <cblas.h>

enum { CB_SAMPLE_WEIGHTS = 24 << 20 };  // ternary weights the dictionary counts (rows sampled evenly)
static const char *const k_mat[3] = {"gate", "up", "down"};

compress_params compress_default_params(void) {
  return (compress_params){.calib_tokens = 16384, .seq_len = 512, .grid = GPTQ_TERNARY, .damp = 0.1f, .block = 128,
                           .cap = 4.0, .dead_zone = 0.5f};
}

typedef struct cmp_ctx {
  const compress_params *p;
  const char *in;
  mole_model *m;
  int64_t L, X, K, E, F;
  // the temporary file: a 2-bit blob per (layer, expert, matrix)
  int fd;
  uint8_t *tmp;
  size_t tmp_bytes, mat_bytes[3], exp_bytes;
  // calibration capture of the target layer
  int64_t target;
  float *cap_x;      // [cap_max][E]
  int32_t *cap_sel;  // [cap_max][K]
  int64_t cap_n, cap_max;
  // the hook's scratch for compressed layers ([seq_len] rows)
  float *hx, *hg, *hu, *hd;
  int64_t *hrow;     // (token, choice) pairs of one expert
  int64_t h_max;
  // ternary statistics and the dictionary
  cb_builder *cb;
  tq_symstats sym;
  int64_t sample_stride, rows_seen;
  uint64_t *tq1_size;  // [L][X][3] coded sizes
  tq_book *book;
  uint8_t *compact;
  int64_t book_n;
  experts_layout *layout;  // [L] of the output
  int8_t *tbuf;            // [max rows * k] ternary rows being coded
  float *sbuf;             // [max rows] scales
  compress_report *rep;
  int64_t t0, experts_done;
  FILE *log;
  bool tty;  // log is a terminal
} cmp_ctx;

static uint8_t *tmp_blob(const cmp_ctx *c, int64_t l, int64_t e, int j) {
  size_t off = (size_t)(l * c->X + e) * c->exp_bytes;
  for (int i = 0; i < j; i++) off += c->mat_bytes[i];
  return c->tmp + off;
}

static int64_t rows_of(const cmp_ctx *c, int j) { return j == 2 ? c->E : c->F; }
static int64_t cols_of(const cmp_ctx *c, int j) { return j == 2 ? c->F : c->E; }

// ---- a threaded 2-bit matmul for the hook ------------------------------------------

typedef struct {
  const void *W;
  int64_t rows, k, n;
  const float *x;
  float *y;
} tq2_job;

static void tq2_worker(void *ctx, int ith, int nth) {
  const tq2_job *j = ctx;
  const int64_t groups = (j->rows + 15) / 16;
  int64_t g0, g1;
  mole_split(groups, ith, nth, &g0, &g1);
  const int64_t r0 = g0 * 16, r1 = MOLE_MIN(g1 * 16, j->rows);
  if (r0 < r1) quant_tq2_gemm(j->W, j->rows, j->x, (size_t)j->k * sizeof(float), j->y, j->rows, r0, r1, j->n, j->k);
}

static void tq2_mm(cmp_ctx *c, const void *W, int64_t rows, int64_t k, const float *x, int64_t n, float *y) {
  tq2_job j = {W, rows, k, n, x, y};
  mole_pool_run(c->m->pool, tq2_worker, &j);
}

// The routed-FFN hook (model_moe_hook).
static bool moe_hook(void *ctx, int64_t il, int64_t n, const float *xn, const int32_t *sel, const float *w, float *y) {
  cmp_ctx *c = ctx;
  const int64_t E = c->E, F = c->F, K = c->K;
  if (il == c->target) {  // record, and let the source experts compute it
    const int64_t take = MOLE_MIN(n, c->cap_max - c->cap_n);
    memcpy(c->cap_x + c->cap_n * E, xn, (size_t)(take * E) * sizeof(float));
    memcpy(c->cap_sel + c->cap_n * K, sel, (size_t)(take * K) * sizeof(int32_t));
    c->cap_n += take;
    return false;
  }
  memset(y, 0, (size_t)(n * E) * sizeof(float));
  if (il > c->target) return true;  // not needed for this capture
  MOLE_ASSERT(n <= c->h_max);
  for (int64_t e = 0; e < c->X; e++) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < n * K; i++)
      if (sel[i] == e) c->hrow[cnt++] = i;
    if (!cnt) continue;
    for (int64_t a = 0; a < cnt; a++) memcpy(c->hx + a * E, xn + (c->hrow[a] / K) * E, (size_t)E * sizeof(float));
    tq2_mm(c, tmp_blob(c, il, e, 0), F, E, c->hx, cnt, c->hg);
    tq2_mm(c, tmp_blob(c, il, e, 1), F, E, c->hx, cnt, c->hu);
    for (int64_t a = 0; a < cnt; a++) ops_swiglu(c->hg + a * F, c->hg + a * F, c->hu + a * F, F);
    tq2_mm(c, tmp_blob(c, il, e, 2), E, F, c->hg, cnt, c->hd);
    for (int64_t a = 0; a < cnt; a++) ops_axpy(y + (c->hrow[a] / K) * E, c->hd + a * E, w[c->hrow[a]], E);
  }
  return true;
}

// ---- calibration ---------------------------------------------------------------------

static mole_status read_text(const char *path, char **out, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return mole_errorf(MOLE_ERR_IO, "--calib: cannot open '%s': %s", path, strerror(errno));
  size_t cap = 1 << 20, len = 0;
  char *b = mole_malloc(cap + 1);
  while (b) {
    const size_t k = fread(b + len, 1, cap - len, f);
    len += k;
    if (k == 0 || len >= (size_t)64 << 20) break;  // 64 MiB of text is more than any calibration needs
    if (len == cap) {
      char *nb = mole_realloc(b, 2 * cap + 1);
      if (!nb) break;
      b = nb;
      cap *= 2;
    }
  }
  const bool err = ferror(f);
  fclose(f);
  if (!b) return mole_errorf(MOLE_ERR_NOMEM, "--calib: out of memory reading '%s'", path);
  if (err) {
    mole_free(b);
    return mole_errorf(MOLE_ERR_IO, "--calib: cannot read '%s'", path);
  }
  b[len] = 0;
  *out = b;
  *n = len;
  return MOLE_OK;
}

typedef struct calib {
  int32_t *toks;  // [n_seq][seq_len]
  int64_t n_seq, seq_len;
} calib;

static mole_status calib_load(cmp_ctx *c, calib *cb) {
  char *text = NULL;
  size_t len = 0;
  tok_vocab *voc = NULL;
  int32_t *ids = NULL;
  int64_t n_ids = 0;
  mole_status st = read_text(c->p->calib, &text, &len);
  if (!st) st = tok_load(c->m->gguf, &voc);
  if (!st) st = tok_encode(voc, text, len, false, false, &ids, &n_ids);
  mole_free(text);
  if (st) {
    tok_free(voc);
    return st;
  }
  const bool bos = tok_add_bos(voc) && tok_bos(voc) >= 0;
  const int32_t bos_id = tok_bos(voc);
  tok_free(voc);
  const int64_t S = c->p->seq_len, body = bos ? S - 1 : S;
  int64_t n_seq = MOLE_MIN(n_ids / body, (c->p->calib_tokens + S - 1) / S);
  if (n_seq < 1) {
    mole_free(ids);
    return mole_errorf(MOLE_ERR_ARG, "--calib: '%s' has %lld tokens; one calibration sequence needs %lld (--seq-len)",
                       c->p->calib, (long long)n_ids, (long long)body);
  }
  const int64_t V = c->m->hp.n_vocab;
  cb->toks = mole_malloc((size_t)(n_seq * S) * sizeof *cb->toks);
  if (!cb->toks) {
    mole_free(ids);
    return mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for %lld calibration tokens", (long long)(n_seq * S));
  }
  for (int64_t s = 0; s < n_seq; s++) {
    int32_t *t = cb->toks + s * S;
    if (bos) *t++ = bos_id;
    memcpy(t, ids + s * body, (size_t)body * sizeof *t);
  }
  mole_free(ids);
  for (int64_t i = 0; i < n_seq * S; i++)
    if (cb->toks[i] < 0 || cb->toks[i] >= V)
      return mole_errorf(MOLE_ERR_FORMAT, "--calib: token %d is outside the vocabulary", cb->toks[i]);
  cb->n_seq = n_seq;
  cb->seq_len = S;
  return MOLE_OK;
}

// Runs every calibration sequence with the hook capturing layer l.
static mole_status calib_run(cmp_ctx *c, const calib *cb, mole_session *s, int64_t l) {
  c->target = l;
  c->cap_n = 0;
  for (int64_t q = 0; q < cb->n_seq; q++) {
    mole_session_reset(s);
    mole_status st = mole_session_eval(s, cb->toks + q * cb->seq_len, cb->seq_len, NULL, false);
    if (st) return mole_error_prefix(st, "compress: calibration sequence %lld, layer %lld: ", (long long)q, (long long)l);
  }
  return MOLE_OK;
}

// ---- one expert ----------------------------------------------------------------------

// Matrix j of expert e of layer l from the source file as floats [rows][k].
static mole_status source_matrix(cmp_ctx *c, int64_t l, int64_t e, int j, float *W) {
  char name[96];
  snprintf(name, sizeof name, "blk.%lld.ffn_%s_exps.weight", (long long)l, k_mat[j]);
  const gguf_tensor *t = gguf_find_tensor(c->m->gguf, name);
  if (!t) return mole_errorf(MOLE_ERR_NOT_FOUND, "%s: missing tensor '%s'", c->in, name);
  const quant_traits *tr = quant_traits_of(t->type);
  if (!tr || !tr->to_float)
    return mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which mole cannot read", c->in, name,
                       quant_type_name(t->type));
  const int64_t rows = rows_of(c, j), k = cols_of(c, j);
  const size_t rb = quant_row_size(t->type, k), mat = rb * (size_t)rows;
  const char *src = (const char *)t->data + (size_t)e * mat;
  for (int64_t r = 0; r < rows; r++) tr->to_float(src + (size_t)r * rb, W + r * k, k);
  // read once: out of this process's memory (the page cache keeps it if there is room)
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t a = ((uintptr_t)src + pg - 1) / pg * pg, b = ((uintptr_t)src + mat) / pg * pg;
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
  return MOLE_OK;
}

// Quantizes W (rows x k) with H (or RTN), stores the 2-bit blob, counts.
static mole_status quantize(cmp_ctx *c, int64_t l, int64_t e, int j, float *W, float *H, int64_t n_samples,
                            int8_t *q, float *scale, uint8_t *zero) {
  const int64_t rows = rows_of(c, j), k = cols_of(c, j);
  gptq_params gp = {.grid = c->p->grid, .damp = c->p->damp, .block = c->p->block, .rtn = c->p->rtn || !H,
                    .dead_zone = c->p->dead_zone, .act_order = c->p->act_order};
  gptq_info info;
  mole_status st = gptq_quantize(&gp, W, rows, k, H, n_samples, q, scale, zero, &info);
  if (st) return mole_error_prefix(st, "compress: layer %lld expert %lld %s: ", (long long)l, (long long)e, k_mat[j]);
  c->rep->matrices++;
  c->rep->fallbacks += info.rtn_fallback;
  if (isfinite(info.err)) c->rep->gptq_err += info.err;
  if (c->p->grid == GPTQ_TERNARY) {
    tq_symstats_add(&c->sym, q, rows * k);
    for (int64_t r = 0; r < rows; r++, c->rows_seen++)
      if (c->rows_seen % c->sample_stride == 0) cb_builder_add_row(c->cb, q + r * k, k);
    for (int64_t i = 0; i < rows * k; i++) q[i] = (int8_t)(q[i] + 1);  // t -> 2-bit q on zero 1
    memset(zero, 1, (size_t)rows);
  } else {
    c->rep->zero_frac += (double)info.zeros;
  }
  const size_t sz = tq2_encode((const uint8_t *)q, scale, zero, rows, k, tmp_blob(c, l, e, j));
  MOLE_ASSERT(sz == c->mat_bytes[j]);
  return MOLE_OK;
}

// X^T X of the rows of x [n][k].
static float *hessian(const float *x, int64_t n, int64_t k) {
  float *H = mole_aligned_alloc(64, (size_t)(k * k) * sizeof *H);
  if (!H) return NULL;
  memset(H, 0, (size_t)(k * k) * sizeof *H);
  gptq_hessian_add(H, x, n, k, k);
  return H;
}

typedef struct expert_buf {
  float *W[3];     // [rows][k] each
  int8_t *q;       // [max rows * k]
  float *scale;    // [max rows]
  uint8_t *zero;   // [max rows]
  float *xe;       // [cap][E] the expert's calibration inputs
  float *g, *u;    // [cap][F] its hidden
} expert_buf;

static mole_status compress_expert(cmp_ctx *c, expert_buf *b, int64_t l, int64_t e) {
  const int64_t E = c->E, F = c->F, K = c->K;
  mole_status st = MOLE_OK;
  for (int j = 0; j < 3 && !st; j++) st = source_matrix(c, l, e, j, b->W[j]);
  if (st) return st;
  int64_t n = 0;
  if (!c->p->rtn) {
    // the expert's tokens, evenly thinned to the cap
    int64_t cnt = 0;
    for (int64_t i = 0; i < c->cap_n * K; i++) cnt += c->cap_sel[i] == e;
    const int64_t cap = (int64_t)ceil(c->p->cap * (double)(c->cap_n * K) / (double)c->X);
    const int64_t keep = MOLE_MIN(cnt, MOLE_MAX(cap, 1));
    int64_t seen = 0;
    for (int64_t i = 0; i < c->cap_n * K; i++) {
      if (c->cap_sel[i] != e) continue;
      // token number `seen` of cnt is kept when it starts a new 1/keep share
      if (n < keep && (seen * keep) / cnt == n) memcpy(b->xe + (n++) * E, c->cap_x + (i / K) * E, (size_t)E * sizeof(float));
      seen++;
    }
    if (n == 0) c->rep->no_data++;
  }
  float *H = NULL;
  if (n > 0 && !(H = hessian(b->xe, n, E))) return mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for H");
  float *H2 = NULL;
  if (H) {
    H2 = mole_aligned_alloc(64, (size_t)(E * E) * sizeof *H2);
    if (!H2) st = mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for H");
    else memcpy(H2, H, (size_t)(E * E) * sizeof *H2);
  }
  if (!st) st = quantize(c, l, e, 0, b->W[0], H, n, b->q, b->scale, b->zero);
  if (!st) st = quantize(c, l, e, 1, b->W[1], H2, n, b->q, b->scale, b->zero);
  mole_aligned_free(H);
  mole_aligned_free(H2);
  H = NULL;
  if (!st && n > 0) {
    // the hidden of the compressed gate and up: silu(x Wg^T) * (x Wu^T)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)E, 1.0f, b->xe, (int)E, b->W[0], (int)E,
                0.0f, b->g, (int)F);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)E, 1.0f, b->xe, (int)E, b->W[1], (int)E,
                0.0f, b->u, (int)F);
    for (int64_t a = 0; a < n; a++) ops_swiglu(b->g + a * F, b->g + a * F, b->u + a * F, F);
    if (!(H = hessian(b->g, n, F))) st = mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for H of down (%lld^2)",
                                                     (long long)F);
  }
  if (!st) st = quantize(c, l, e, 2, b->W[2], H, n, b->q, b->scale, b->zero);
  mole_aligned_free(H);
  return st;
}

static void progress(cmp_ctx *c, int64_t l, int64_t e) {
  if (!c->log) return;
  c->experts_done++;
  const double el = (double)(mole_time_us() - c->t0) * 1e-6;
  const double eta = el / (double)c->experts_done * (double)(c->L * c->X - c->experts_done);
  // on a terminal one line rewritten after every expert; in a log a line per layer
  if (!c->tty && e + 1 < c->X) return;
  fprintf(c->log, "%scompress: layer %lld/%lld expert %lld/%lld  %.0f s, ETA %.0f s%s", c->tty ? "\r" : "",
          (long long)l + 1, (long long)c->L, (long long)e + 1, (long long)c->X, el, eta, c->tty ? "   " : "\n");
  fflush(c->log);
}

// ---- the output ----------------------------------------------------------------------

// The ternary rows and scales of a 2-bit blob of the temporary file (q - zero).
static void blob_ternary(const cmp_ctx *c, int64_t l, int64_t e, int j) {
  const int64_t rows = rows_of(c, j), k = cols_of(c, j);
  const uint8_t *b = tmp_blob(c, l, e, j);
  const uint8_t *zero = b + 2 * rows, *q = b + ((3 * (size_t)rows + 3) & ~(size_t)3);
  for (int64_t r = 0; r < rows; r++) {
    uint16_t h;
    memcpy(&h, b + 2 * r, 2);
    c->sbuf[r] = quant_f16_to_f32(h);
    const uint8_t *qr = q + (size_t)r * (size_t)(k / 4);
    for (int64_t i = 0; i < k; i++) c->tbuf[r * k + i] = (int8_t)(((qr[i / 4] >> (2 * (i % 4))) & 3) - zero[r]);
  }
}

static mole_status fill_region(void *ctx, int64_t l, int64_t e, void *region) {
  cmp_ctx *c = ctx;
  const experts_layout *lo = &c->layout[l];
  for (int j = 0; j < 3; j++) {
    uint8_t *dst = (uint8_t *)region + lo->offsets[j];
    if (c->p->grid != GPTQ_TERNARY) {
      memcpy(dst, tmp_blob(c, l, e, j), c->mat_bytes[j]);
      continue;
    }
    blob_ternary(c, l, e, j);
    const size_t sz = tq1_encode(c->book, c->tbuf, c->sbuf, rows_of(c, j), cols_of(c, j), dst, (size_t)lo->bytes[j]);
    MOLE_ASSERT(sz == c->tq1_size[(l * c->X + e) * 3 + j]);
  }
  return MOLE_OK;
}

static mole_status plan_output(cmp_ctx *c) {
  c->layout = mole_calloc((size_t)c->L, sizeof *c->layout);
  c->tq1_size = mole_calloc((size_t)(c->L * c->X * 3), sizeof *c->tq1_size);
  if (!c->layout || !c->tq1_size) return mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory");
  compress_report *r = c->rep;
  for (int64_t l = 0; l < c->L; l++) {
    experts_layout *lo = &c->layout[l];
    uint64_t at = 0;
    for (int j = 0; j < 3; j++) {
      lo->type[j] = c->p->grid == GPTQ_TERNARY ? QT_TQ1 : QT_TQ2;
      uint64_t mx = 0;
      for (int64_t e = 0; e < c->X; e++) {
        uint64_t sz = c->mat_bytes[j];
        if (c->p->grid == GPTQ_TERNARY) {
          blob_ternary(c, l, e, j);
          sz = tq1_encode(c->book, c->tbuf, c->sbuf, rows_of(c, j), cols_of(c, j), NULL, 0);
          c->tq1_size[(l * c->X + e) * 3 + j] = sz;
        }
        r->payload_bytes += (int64_t)sz;
        mx = MOLE_MAX(mx, sz);
      }
      lo->bytes[j] = mx;
      lo->offsets[j] = at;
      at = (at + mx + 63) / 64 * 64;
    }
    lo->region = (at + EXPERTS_IO_ALIGN - 1) / EXPERTS_IO_ALIGN * EXPERTS_IO_ALIGN;
    r->region_bytes += (int64_t)(lo->region * (uint64_t)c->X);
  }
  return MOLE_OK;
}

// ---- the whole run -------------------------------------------------------------------

static mole_status check_params(const compress_params *p) {
  if (!p->rtn && (!p->calib || !*p->calib))
    return mole_errorf(MOLE_ERR_ARG, "--calib TEXT is required (calibration text for GPTQ), or --rtn");
  if (p->calib_tokens < 1) return mole_errorf(MOLE_ERR_ARG, "--calib-tokens %lld: need >= 1", (long long)p->calib_tokens);
  if (p->seq_len < 2) return mole_errorf(MOLE_ERR_ARG, "--seq-len %lld: need >= 2", (long long)p->seq_len);
  if (!(p->damp > 0 && p->damp <= 10)) return mole_errorf(MOLE_ERR_ARG, "--damp %g: need 0 < damp <= 10", (double)p->damp);
  if (p->block < 1 || p->block > 65536) return mole_errorf(MOLE_ERR_ARG, "--block %lld: need 1..65536", (long long)p->block);
  if (!(p->cap >= 1)) return mole_errorf(MOLE_ERR_ARG, "compress: sample cap %g: need >= 1", p->cap);
  if (!(p->dead_zone >= 0.5f && p->dead_zone < 1.0f))
    return mole_errorf(MOLE_ERR_ARG, "--dead-zone %g: need 0.5 <= X < 1", (double)p->dead_zone);
  return MOLE_OK;
}

static mole_status open_tmp(cmp_ctx *c, const char *out) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", out);
  char *slash = strrchr(dir, '/');
  if (slash) slash[1] = 0;
  else snprintf(dir, sizeof dir, "./");
  char path[4200];
  snprintf(path, sizeof path, "%s.mole-compress-XXXXXX", dir);
  c->fd = mkstemp(path);
  if (c->fd < 0) return mole_errorf(MOLE_ERR_IO, "compress: cannot create a temporary file in '%s': %s", dir, strerror(errno));
  unlink(path);  // gone when closed, whatever happens
  if (ftruncate(c->fd, (off_t)c->tmp_bytes))
    return mole_errorf(MOLE_ERR_IO, "compress: cannot size the temporary file in '%s' to %zu bytes: %s", dir,
                       c->tmp_bytes, strerror(errno));
  c->tmp = mmap(NULL, c->tmp_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
  if (c->tmp == MAP_FAILED) {
    c->tmp = NULL;
    return mole_errorf(MOLE_ERR_IO, "compress: cannot map the temporary file: %s", strerror(errno));
  }
  return MOLE_OK;
}

mole_status compress_model(const char *in, const char *out, const compress_params *p, FILE *log, compress_report *rep) {
  memset(rep, 0, sizeof *rep);
  mole_status st = check_params(p);
  if (st) return st;
  cmp_ctx c = {.p = p, .in = in, .fd = -1, .rep = rep, .log = log, .t0 = mole_time_us(), .tty = log && isatty(fileno(log))};
  mole_session *sess = NULL;
  calib cb = {0};
  expert_buf b = {0};
  mole_model_params mp = mole_model_default_params();
  mp.n_threads = p->n_threads;
  mp.use_mmap = true;  // no copy of the weights: each expert is read once
  if ((st = mole_model_load(in, &mp, &c.m))) return st;
  mole_model *m = c.m;
  const model_hparams *hp = &m->hp;
  if (hp->n_expert == 0) {
    st = mole_errorf(MOLE_ERR_ARG, "%s: a dense model (no experts): mole compress compresses MoE experts", in);
    goto done;
  }
  if (experts_store_is_packed(m->gguf)) {
    st = mole_errorf(MOLE_ERR_ARG, "%s: a packed or compressed store; compress the source GGUF", in);
    goto done;
  }
  c.L = hp->n_layer, c.X = hp->n_expert, c.K = hp->n_expert_used, c.E = hp->n_embd, c.F = hp->n_ff_exp;
  if (c.E % 4 || c.F % 4) {
    st = mole_errorf(MOLE_ERR_UNSUPPORTED, "%s: widths %lld and %lld: compressed rows need multiples of 4", in,
                     (long long)c.E, (long long)c.F);
    goto done;
  }
  for (int j = 0; j < 3; j++) c.mat_bytes[j] = tq2_matrix_bytes(rows_of(&c, j), cols_of(&c, j));
  c.exp_bytes = c.mat_bytes[0] + c.mat_bytes[1] + c.mat_bytes[2];
  c.tmp_bytes = c.exp_bytes * (size_t)(c.L * c.X);
  if ((st = open_tmp(&c, out))) goto done;
  const int64_t total_w = c.L * c.X * 3 * c.E * c.F, max_rows = MOLE_MAX(c.E, c.F);
  rep->expert_weights = total_w;
  c.sample_stride = MOLE_MAX(1, total_w / CB_SAMPLE_WEIGHTS);
  if (p->grid == GPTQ_TERNARY && (st = cb_builder_new((int64_t)1 << 22, &c.cb))) goto done;
  // buffers of one expert
  for (int j = 0; j < 3; j++) b.W[j] = mole_aligned_alloc(64, (size_t)(c.E * c.F) * sizeof(float));
  b.q = mole_malloc((size_t)(c.E * c.F));
  b.scale = mole_malloc((size_t)max_rows * sizeof(float));
  b.zero = mole_malloc((size_t)max_rows);
  c.tbuf = mole_malloc((size_t)(c.E * c.F));
  c.sbuf = mole_malloc((size_t)max_rows * sizeof(float));
  if (!b.W[0] || !b.W[1] || !b.W[2] || !b.q || !b.scale || !b.zero || !c.tbuf || !c.sbuf) {
    st = mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for one expert's matrices (%lld x %lld)", (long long)c.F,
                     (long long)c.E);
    goto done;
  }
  if (!p->rtn) {
    if ((st = calib_load(&c, &cb))) goto done;
    const int64_t N = cb.n_seq * cb.seq_len;
    rep->calib_tokens = N;
    const int64_t cap = (int64_t)ceil(p->cap * (double)(N * c.K) / (double)c.X);
    c.cap_max = N;
    c.h_max = cb.seq_len * c.K;
    c.cap_x = mole_malloc((size_t)(N * c.E) * sizeof(float));
    c.cap_sel = mole_malloc((size_t)(N * c.K) * sizeof(int32_t));
    c.hx = mole_malloc((size_t)(c.h_max * c.E) * sizeof(float));
    c.hg = mole_malloc((size_t)(c.h_max * c.F) * sizeof(float));
    c.hu = mole_malloc((size_t)(c.h_max * c.F) * sizeof(float));
    c.hd = mole_malloc((size_t)(c.h_max * c.E) * sizeof(float));
    c.hrow = mole_malloc((size_t)c.h_max * sizeof(int64_t));
    b.xe = mole_malloc((size_t)(MOLE_MIN(cap, N) * c.E) * sizeof(float));
    b.g = mole_malloc((size_t)(MOLE_MIN(cap, N) * c.F) * sizeof(float));
    b.u = mole_malloc((size_t)(MOLE_MIN(cap, N) * c.F) * sizeof(float));
    if (!c.cap_x || !c.cap_sel || !c.hx || !c.hg || !c.hu || !c.hd || !c.hrow || !b.xe || !b.g || !b.u) {
      st = mole_errorf(MOLE_ERR_NOMEM, "compress: out of memory for %lld calibration tokens (--calib-tokens)", (long long)N);
      goto done;
    }
    mole_session_params sp = mole_session_default_params();
    sp.n_ctx = cb.seq_len;
    sp.n_batch = cb.seq_len;
    if ((st = mole_session_new(m, &sp, &sess))) goto done;
    m->moe_hook = moe_hook;
    m->moe_hook_ctx = &c;
  }
  for (int64_t l = 0; l < c.L && !st; l++) {
    if (!p->rtn && (st = calib_run(&c, &cb, sess, l))) break;
    for (int64_t e = 0; e < c.X && !st; e++) {
      st = compress_expert(&c, &b, l, e);
      progress(&c, l, e);
    }
  }
  if (c.tty) fprintf(log, "\n");
  m->moe_hook = NULL;
  if (st) goto done;
  if (p->grid == GPTQ_TERNARY) {
    cb_finish_info fi;
    if ((st = cb_builder_finish(c.cb, TQ_BOOK_MAX, p->code_pairs, &c.compact, &c.book_n, &fi))) goto done;
    if ((st = tq_book_new(c.compact, c.book_n, &c.book))) goto done;
    rep->book_entries = c.book_n;
    rep->code_pairs = fi.pairs;
    rep->wide_saving = fi.wide_saving;
    rep->book_bytes = 3 * c.book_n;
    rep->zero_frac = c.sym.weights ? (double)c.sym.zeros / (double)c.sym.weights : 0;
    rep->entropy = tq_symstats_entropy(&c.sym);
    rep->pair_entropy = tq_symstats_pair_entropy(&c.sym);
  } else {
    rep->zero_frac /= (double)total_w;
  }
  if ((st = plan_output(&c))) goto done;
  rep->bits = (double)(rep->payload_bytes + rep->book_bytes) * 8.0 / (double)total_w;
  rep->bits_file = (double)(rep->region_bytes + rep->book_bytes) * 8.0 / (double)total_w;
  if (log) fprintf(log, "compress: writing %s\n", out);
  experts_pack_tier tier = {c.layout, fill_region, &c};
  experts_pack_params pp = {.high = -1, .low = -1, .n_threads = p->n_threads, .tier = {&tier, NULL},
                            .book = c.compact, .book_n = c.book_n, .quiet = true};
  st = experts_pack(in, out, &pp, log);
done:
  rep->seconds = (double)(mole_time_us() - c.t0) * 1e-6;
  struct rusage ru;
  if (!getrusage(RUSAGE_SELF, &ru)) rep->peak_rss = (int64_t)ru.ru_maxrss * 1024;
  mole_session_free(sess);
  mole_model_free(c.m);
  if (c.tmp) munmap(c.tmp, c.tmp_bytes);
  if (c.fd >= 0) close(c.fd);
  cb_builder_free(c.cb);
  tq_book_free(c.book);
  mole_free(c.compact);
  mole_free(c.layout);
  mole_free(c.tq1_size);
  mole_free(cb.toks);
  for (int j = 0; j < 3; j++) mole_aligned_free(b.W[j]);
  mole_free(b.q);
  mole_free(b.scale);
  mole_free(b.zero);
  mole_free(b.xe);
  mole_free(b.g);
  mole_free(b.u);
  mole_free(c.tbuf);
  mole_free(c.sbuf);
  mole_free(c.cap_x);
  mole_free(c.cap_sel);
  mole_free(c.hx);
  mole_free(c.hg);
  mole_free(c.hu);
  mole_free(c.hd);
  mole_free(c.hrow);
  return st;
}

void compress_print_report(const compress_report *r, const compress_params *p, FILE *f) {
  const bool tern = p->grid == GPTQ_TERNARY;
  fprintf(f, "method            %s, %s grid\n", p->rtn ? "round-to-nearest" : "GPTQ", tern ? "ternary" : "2-bit");
  if (!p->rtn)
    fprintf(f, "calibration       %lld tokens (damp %g, block %lld, cap %gx mean)\n", (long long)r->calib_tokens,
            (double)p->damp, (long long)p->block, p->cap);
  if (p->act_order && !p->rtn) fprintf(f, "column order      act order (decreasing H diagonal)\n");
  if (tern && p->dead_zone != 0.5f) fprintf(f, "dead zone         |w| <= %g s rounds to 0\n", (double)p->dead_zone);
  fprintf(f, "expert weights    %lld in %lld matrices (%lld fell back to RTN, %lld experts without data)\n",
          (long long)r->expert_weights, (long long)r->matrices, (long long)r->fallbacks, (long long)r->no_data);
  fprintf(f, "zero fraction     %.4f\n", r->zero_frac);
  if (tern) {
    fprintf(f, "entropy bound     %.4f bits/weight (order 0), %.4f (pairs)\n", r->entropy, r->pair_entropy);
    fprintf(f, "dictionary        %lld entries, %lld bytes, codes of up to %d weights", (long long)r->book_entries,
            (long long)r->book_bytes, 2 * r->code_pairs);
    if (p->code_pairs == 0)
      fprintf(f, " (auto: %d would %s %.1f%% of the codes)", 2 * TQ_PAIRS_MAX,
              r->wide_saving >= 0 ? "save" : "add", 100 * fabs(r->wide_saving));
    fprintf(f, "\n");
  }
  fprintf(f, "bits per weight   %.4f (codes, row index, grids and dictionary: %lld bytes)\n", r->bits,
          (long long)(r->payload_bytes + r->book_bytes));
  fprintf(f, "in the file       %.4f (regions padded to each layer's largest expert, 4 KiB)\n", r->bits_file);
  if (!p->rtn) fprintf(f, "GPTQ objective    %.6g (sum over matrices)\n", r->gptq_err);
  fprintf(f, "time              %.1f s\n", r->seconds);
  fprintf(f, "peak RSS          %.1f MiB\n", (double)r->peak_rss / 1048576.0);
}
