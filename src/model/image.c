// model/image: the weights a forward step reads, copied out of the file
// mapping into anonymous memory on huge pages, with every matrix mole has
// R16 kernels for repacked to that layout (quant.h, quant_r16.c).
//
// Decode reads every active weight byte once per token, so it is bound by
// memory bandwidth: huge pages spare the TLB misses of a 4 KiB-page mapping
// and R16 lets each thread stream one contiguous region instead of 16 rows
// at once with gathers and in-register transposes. llama.cpp's CPU backend
// does the same (its "repack" buffers). The cost is a copy at load time and
// the copy's memory instead of shared page cache; `--mmap` computes straight
// from the mapping instead.
//
// The image is compact: each matrix (a 2-D tensor, or one matrix of an
// expert stack) gets its own place, its rows contiguous even when the model
// tensor is a column slice of the file's (a tensor-parallel shard), and the
// tensors are repointed there; the expert provider keeps the places of the
// resident experts' matrices.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "experts/experts.h"
#include "model/model.h"

enum { IMG_HUGE = 2 << 20, IMG_ALIGN = 64, IMG_CHUNK_GROUPS = 64, IMG_CHUNK_BYTES = 1 << 20 };

// One matrix to bring into the image: ne1 rows of ne0 elements of `type` at
// src, `stride` bytes apart; it goes to image + dst.
typedef struct {
  const uint8_t *src;
  size_t stride;
  quant_type type;
  int64_t ne0, ne1;
  bool r16;
  size_t dst;
  int64_t chunk0;  // its first work chunk
} img_mat;

typedef struct {
  img_mat *mats;
  int64_t n, cap;
  int64_t n_chunks;
  size_t size;  // bytes so far (aligned places)
  bool oom;
} img_list;

static size_t mat_size(const img_mat *im) { return quant_row_size(im->type, im->ne0) * (size_t)im->ne1; }

// Rows per work chunk of a row-layout matrix: about 1 MiB, at least one row
// (a compressed expert is one row of bytes, often larger).
static int64_t rows_per_chunk(const img_mat *im) {
  return MOLE_MAX((int64_t)(IMG_CHUNK_BYTES / quant_row_size(im->type, im->ne0)), 1);
}

static int64_t mat_chunks(const img_mat *im) {
  if (im->r16) return (im->ne1 / 16 + IMG_CHUNK_GROUPS - 1) / IMG_CHUNK_GROUPS;
  const int64_t per = rows_per_chunk(im);
  return MOLE_MAX((im->ne1 + per - 1) / per, 1);
}

// The place of a new matrix in the image.
static size_t add_mat(img_list *L, const void *src, size_t stride, quant_type type, int64_t ne0, int64_t ne1) {
  if (ne0 == 0 || ne1 == 0) return L->size;  // an empty share: nothing to hold
  if (L->n == L->cap) {
    const int64_t cap = L->cap ? 2 * L->cap : 256;
    img_mat *p = mole_realloc(L->mats, (size_t)cap * sizeof *p);
    if (!p) {
      L->oom = true;
      return 0;
    }
    L->mats = p;
    L->cap = cap;
  }
  img_mat *im = &L->mats[L->n++];
  *im = (img_mat){src, stride, type, ne0, ne1, quant_r16_preferred(type, ne1), L->size, L->n_chunks};
  L->n_chunks += mat_chunks(im);
  L->size += (mat_size(im) + IMG_ALIGN - 1) / IMG_ALIGN * IMG_ALIGN;
  return im->dst;
}

static size_t add_expert(void *ctx, const void *src, size_t stride, quant_type type, int64_t ne0, int64_t ne1) {
  return add_mat(ctx, src, stride, type, ne0, ne1);
}

typedef struct {
  const img_list *L;
  uint8_t *base;
} img_job;

// The source pages of [a, b) are read once: unmap them (they stay in the
// page cache, unmapped and reclaimable, and leave this process's RSS).
static void drop_pages(const uint8_t *a, const uint8_t *b) {
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t lo = ((uintptr_t)a + pg - 1) / pg * pg, hi = (uintptr_t)b / pg * pg;
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void img_worker(void *ctx, int ith, int nth) {
  const img_job *j = ctx;
  const img_list *L = j->L;
  int64_t mi = 0;
  for (int64_t c = ith; c < L->n_chunks; c += nth) {
    while (mi + 1 < L->n && L->mats[mi + 1].chunk0 <= c) mi++;
    const img_mat *im = &L->mats[mi];
    const int64_t ci = c - im->chunk0;
    const size_t rb = quant_row_size(im->type, im->ne0);
    uint8_t *d = j->base + im->dst;
    int64_t r0, r1;  // the rows of this chunk
    if (im->r16) {
      const int64_t ng = im->ne1 / 16, g0 = ci * IMG_CHUNK_GROUPS, g1 = MOLE_MIN(g0 + IMG_CHUNK_GROUPS, ng);
      r0 = 16 * g0;
      r1 = g1 == ng ? im->ne1 : 16 * g1;
      if (im->stride == rb) {
        quant_r16_pack(im->type, im->src, d, im->ne0, im->ne1, g0, g1);
      } else {  // a column slice: its rows made contiguous first (load time: a buffer per chunk)
        uint8_t *rows = mole_malloc((size_t)(r1 - r0) * rb);
        MOLE_ASSERT(rows);
        for (int64_t r = r0; r < r1; r++) memcpy(rows + (size_t)(r - r0) * rb, im->src + (size_t)r * im->stride, rb);
        // the chunk as a matrix of its own rows: the same groups, the tail when it has it
        quant_r16_pack(im->type, rows, d + (size_t)r0 * rb, im->ne0, r1 - r0, 0, (r1 - r0) / 16);
        mole_free(rows);
      }
    } else {
      const int64_t per = rows_per_chunk(im);
      r0 = ci * per;
      r1 = MOLE_MIN(r0 + per, im->ne1);
      if (im->stride == rb) memcpy(d + (size_t)r0 * rb, im->src + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
      else
        for (int64_t r = r0; r < r1; r++) memcpy(d + (size_t)r * rb, im->src + (size_t)r * im->stride, rb);
    }
    drop_pages(im->src + (size_t)r0 * im->stride, im->src + (size_t)(r1 - 1) * im->stride + rb);
  }
}

// The matmul weights of a layer (the expert stacks come from the provider).
#define LAYER_MATS(ly) \
  { &(ly)->wq, &(ly)->wk, &(ly)->wv, &(ly)->wo, &(ly)->ffn_gate, &(ly)->ffn_up, &(ly)->ffn_down, &(ly)->gate_inp, \
    &(ly)->gate_shexp, &(ly)->up_shexp, &(ly)->down_shexp }

// Every 2-D weight the forward pass reads, in one fixed order: the build
// adds them in it and repoints them in it (the expert stacks come from the
// provider; the token embeddings only when the output shares them: an
// embedding row is read per token otherwise).
static int64_t for_each_weight(mole_model *m, model_tensor **out) {
  int64_t n = 0;
  for (int64_t il = 0; il < m->hp.n_layer; il++) {
    model_layer *ly = &m->layers[il];
    model_tensor *lt[] = LAYER_MATS(ly);
    for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++)
      if (lt[i]->data) {
        MOLE_ASSERT(lt[i]->ne2 == 1);
        if (out) out[n] = lt[i];
        n++;
      }
  }
  if (out) out[n] = &m->output;
  return n + 1;
}

mole_status model_image_build(mole_model *m) {
  const char *path = gguf_path(m->gguf);
  const bool tied = m->output.data == m->tok_embd.data;
  const int64_t nw = for_each_weight(m, NULL);
  model_tensor **ws = mole_malloc((size_t)nw * sizeof *ws);
  if (!ws) return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the weights image table", path);
  for_each_weight(m, ws);
  img_list L = {0};
  size_t *dst = mole_malloc((size_t)nw * sizeof *dst);
  if (!dst) {
    mole_free(ws);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the weights image table", path);
  }
  for (int64_t i = 0; i < nw; i++) dst[i] = add_mat(&L, ws[i]->data, ws[i]->row_bytes, ws[i]->type, ws[i]->ne0, ws[i]->ne1);
  mole_status st = m->experts ? experts_resident_matrices(m->experts, add_expert, &L) : MOLE_OK;
  if (st) {
    mole_free(dst);
    mole_free(ws);
    mole_free(L.mats);
    return st;
  }
  if (L.oom) {
    mole_free(dst);
    mole_free(ws);
    mole_free(L.mats);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the weights image table", path);
  }
  const size_t size = MOLE_MAX((L.size + IMG_HUGE - 1) / IMG_HUGE * IMG_HUGE, (size_t)IMG_HUGE);
  void *p = mmap(NULL, size + IMG_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    mole_free(dst);
    mole_free(ws);
    mole_free(L.mats);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: cannot map %zu bytes for the weights image", path, size);
  }
  // start on a huge page, give the slack back
  uint8_t *base = (uint8_t *)(((uintptr_t)p + IMG_HUGE - 1) / IMG_HUGE * IMG_HUGE);
  if (base > (uint8_t *)p) munmap(p, (size_t)(base - (uint8_t *)p));
  munmap(base + size, (size_t)((uint8_t *)p + IMG_HUGE - base));
  madvise(base, size, MADV_HUGEPAGE);  // a hint: without THP the copy still works
  m->image = base;
  m->image_size = size;
  img_job j = {&L, base};
  mole_pool_run(m->pool, img_worker, &j);
  mprotect(base, size, PROT_READ);  // the copies are read-only from here on
  int64_t bytes = 0;
  for (int64_t i = 0; i < L.n; i++) bytes += (int64_t)mat_size(&L.mats[i]);
  m->image_bytes = bytes;
  for (int64_t i = 0; i < nw; i++) {
    model_tensor *t = ws[i];
    t->data = base + dst[i];
    t->row_bytes = quant_row_size(t->type, t->ne0);
    t->mat_bytes = t->row_bytes * (size_t)t->ne1;
    t->layout = quant_r16_preferred(t->type, t->ne1) && t->ne0 > 0 ? QL_R16 : QL_ROWS;  // as add_mat decided
  }
  if (tied) m->tok_embd = m->output;
  mole_free(dst);
  mole_free(ws);
  mole_free(L.mats);
  return m->experts ? experts_use_image(m->experts, base) : MOLE_OK;
}

void model_image_free(mole_model *m) {
  if (m->image) munmap(m->image, m->image_size);
  m->image = NULL;
}
