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
// The image mirrors the file: a tensor at file offset o lies at image + o, so
// every offset table (the expert store's) stays valid. The mirror is reserved
// without backing (MAP_NORESERVE): only the copied ranges take memory.
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "experts/experts.h"
#include "model/model.h"

enum { IMG_HUGE = 2 << 20, IMG_CHUNK_GROUPS = 64, IMG_CHUNK_BYTES = 1 << 20 };

// One matrix to bring into the image: [ne1][ne0] of `type` at file offset off.
typedef struct {
  uint64_t off;
  quant_type type;
  int64_t ne0, ne1;
  bool r16;
  int64_t chunk0;  // its first work chunk
} img_mat;

typedef struct {
  mole_model *m;
  img_mat *mats;
  int64_t n, cap;
  int64_t n_chunks;
  int64_t bytes;
  bool oom;
} img_list;

static int64_t mat_chunks(const img_mat *im) {
  if (im->r16) return (im->ne1 / 16 + IMG_CHUNK_GROUPS - 1) / IMG_CHUNK_GROUPS;
  const int64_t bytes = (int64_t)quant_row_size(im->type, im->ne0) * im->ne1;
  return MOLE_MAX((bytes + IMG_CHUNK_BYTES - 1) / IMG_CHUNK_BYTES, 1);
}

static void add_mat(img_list *L, uint64_t off, quant_type type, int64_t ne0, int64_t ne1) {
  if (L->n == L->cap) {
    const int64_t cap = L->cap ? 2 * L->cap : 256;
    img_mat *p = mole_realloc(L->mats, (size_t)cap * sizeof *p);
    if (!p) {
      L->oom = true;
      return;
    }
    L->mats = p;
    L->cap = cap;
  }
  img_mat *im = &L->mats[L->n++];
  *im = (img_mat){off, type, ne0, ne1, quant_r16_preferred(type, ne1), L->n_chunks};
  L->n_chunks += mat_chunks(im);
  L->bytes += (int64_t)quant_row_size(type, ne0) * ne1;
}

// every matrix of a (possibly stacked) model tensor
static void add_tensor(img_list *L, const model_tensor *t) {
  if (!t->data) return;
  const uint64_t off = (uint64_t)((const char *)t->data - (const char *)gguf_base(L->m->gguf));
  for (int64_t e = 0; e < t->ne2; e++) add_mat(L, off + (uint64_t)e * t->mat_bytes, t->type, t->ne0, t->ne1);
}

static void add_expert(void *ctx, uint64_t off, quant_type type, int64_t ne0, int64_t ne1) {
  add_mat(ctx, off, type, ne0, ne1);
}

typedef struct {
  const img_list *L;
  const uint8_t *src;
  uint8_t *dst;
} img_job;

static void img_worker(void *ctx, int ith, int nth) {
  const img_job *j = ctx;
  const img_list *L = j->L;
  int64_t mi = 0;
  for (int64_t c = ith; c < L->n_chunks; c += nth) {
    while (mi + 1 < L->n && L->mats[mi + 1].chunk0 <= c) mi++;
    const img_mat *im = &L->mats[mi];
    const int64_t ci = c - im->chunk0;
    const size_t rb = quant_row_size(im->type, im->ne0);
    const uint8_t *s = j->src + im->off;
    uint8_t *d = j->dst + im->off;
    size_t lo, hi;  // the source bytes of this chunk
    if (im->r16) {
      const int64_t ng = im->ne1 / 16, g0 = ci * IMG_CHUNK_GROUPS, g1 = MOLE_MIN(g0 + IMG_CHUNK_GROUPS, ng);
      quant_r16_pack(im->type, s, d, im->ne0, im->ne1, g0, g1);
      lo = (size_t)g0 * 16 * rb;
      hi = g1 == ng ? rb * (size_t)im->ne1 : (size_t)g1 * 16 * rb;
    } else {
      const size_t bytes = rb * (size_t)im->ne1;
      lo = (size_t)ci * IMG_CHUNK_BYTES;
      hi = MOLE_MIN(lo + IMG_CHUNK_BYTES, bytes);
      memcpy(d + lo, s + lo, hi - lo);
    }
    // read once: unmap the source pages (they stay in the page cache, now
    // unmapped and reclaimable, and leave this process's RSS)
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)(s + lo) + pg - 1) / pg * pg, b = (uintptr_t)(s + hi) / pg * pg;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
  }
}

static void repoint(mole_model *m, model_tensor *t) {
  if (!t->data) return;
  const size_t off = (size_t)((const char *)t->data - (const char *)gguf_base(m->gguf));
  t->data = m->image + off;
  // every matrix of the tensor was packed on its own, as add_mat decided
  t->layout = quant_r16_preferred(t->type, t->ne1) ? QL_R16 : QL_ROWS;
}

// The matmul weights of a layer (the expert stacks come from the provider).
#define LAYER_MATS(ly) \
  { &(ly)->wq, &(ly)->wk, &(ly)->wv, &(ly)->wo, &(ly)->ffn_gate, &(ly)->ffn_up, &(ly)->ffn_down, &(ly)->gate_inp, \
    &(ly)->gate_shexp, &(ly)->up_shexp, &(ly)->down_shexp }

mole_status model_image_build(mole_model *m) {
  img_list L = {.m = m};
  const bool tied = m->output.data == m->tok_embd.data;
  for (int64_t il = 0; il < m->hp.n_layer; il++) {
    model_layer *ly = &m->layers[il];
    model_tensor *ts[] = LAYER_MATS(ly);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) add_tensor(&L, ts[i]);
  }
  add_tensor(&L, &m->output);  // the token embeddings only when tied: a row per token is read otherwise
  if (m->experts) experts_resident_matrices(m->experts, add_expert, &L);
  if (L.oom) {
    mole_free(L.mats);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: out of memory for the weights image table", gguf_path(m->gguf));
  }
  const size_t size = (gguf_size(m->gguf) + IMG_HUGE - 1) / IMG_HUGE * IMG_HUGE;
  void *p = mmap(NULL, size + IMG_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    mole_free(L.mats);
    return mole_errorf(MOLE_ERR_NOMEM, "%s: cannot reserve %zu bytes for the weights image", gguf_path(m->gguf),
                       size);
  }
  // start on a huge page, give the slack back
  uint8_t *base = (uint8_t *)(((uintptr_t)p + IMG_HUGE - 1) / IMG_HUGE * IMG_HUGE);
  if (base > (uint8_t *)p) munmap(p, (size_t)(base - (uint8_t *)p));
  munmap(base + size, (size_t)((uint8_t *)p + IMG_HUGE - base));
  madvise(base, size, MADV_HUGEPAGE);  // a hint: without THP the copy still works
  m->image = base;
  m->image_size = size;
  img_job j = {&L, gguf_base(m->gguf), base};
  mole_pool_run(m->pool, img_worker, &j);
  m->image_bytes = L.bytes;
  // the copies are read-only from here on
  mprotect(base, size, PROT_READ);
  for (int64_t il = 0; il < m->hp.n_layer; il++) {
    model_layer *ly = &m->layers[il];
    model_tensor *ts[] = LAYER_MATS(ly);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) repoint(m, ts[i]);
  }
  repoint(m, &m->output);
  if (tied) m->tok_embd = m->output;
  mole_free(L.mats);
  return m->experts ? experts_use_image(m->experts, m->image) : MOLE_OK;
}

void model_image_free(mole_model *m) {
  if (m->image) munmap(m->image, m->image_size);
  m->image = NULL;
}
