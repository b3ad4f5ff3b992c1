#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { SPIN_ITERS = 200000 };

// Kernel scratch (pool.h). Outside the allocator's accounting, like libc's
// own caches: most of a reservation is an upper bound the kernels never
// touch, so it is address space rather than memory.
typedef struct {
  void *p;
  size_t n;
} scratch_buf;

static _Thread_local scratch_buf t_own;            // mole_scratch_reserve
static _Thread_local const scratch_buf *t_job;     // the pool's, while a job runs on this thread
static pthread_key_t g_own_key;                    // frees t_own when its thread exits
static pthread_once_t g_own_once = PTHREAD_ONCE_INIT;

static void own_free(void *v) { free(((scratch_buf *)v)->p); }
static void own_key_init(void) { MOLE_ASSERT(pthread_key_create(&g_own_key, own_free) == 0); }

// Grows b to at least n bytes (64-byte aligned); false (b unchanged) when out of memory.
static bool scratch_grow(scratch_buf *b, size_t n) {
  if (n <= b->n) return true;
  void *p = NULL;
  if (posix_memalign(&p, 64, n) != 0) return false;
  free(b->p);
  b->p = p;
  b->n = n;
  return true;
}

typedef struct {
  mole_pool *pool;
  int ith;
  pthread_t tid;
} pool_worker;

struct mole_pool {
  int nth;
  pool_worker *workers;  // [nth-1]
  _Atomic uint64_t gen;  // bumped for each job
  _Atomic int n_done;    // workers finished with the current job
  _Atomic int stop;
  _Atomic int n_sleeping;
  mole_pool_fn fn;
  void *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  scratch_buf *scr;  // [nth] kernel scratch per thread, NULL until reserved
};

static void *pool_main(void *arg) {
  pool_worker *w = arg;
  mole_pool *p = w->pool;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    int spins = 0;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
           !atomic_load(&p->stop)) {
      if (++spins < SPIN_ITERS) {
        if (spins % 1024 == 0) sched_yield();  // let a descheduled caller run
        else CPU_RELAX();
        continue;
      }
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->n_sleeping, 1);
      while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
      atomic_fetch_sub(&p->n_sleeping, 1);
      pthread_mutex_unlock(&p->mu);
      spins = 0;
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = g;
    t_job = p->scr ? &p->scr[w->ith] : NULL;
    p->fn(p->ctx, w->ith, p->nth);
    t_job = NULL;
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
  }
}

mole_status mole_pool_init(int n_threads, mole_pool **out) {
  *out = NULL;
  if (n_threads < 1 || n_threads > 1024) return mole_errorf(MOLE_ERR_ARG, "threads: %d is out of range 1..1024", n_threads);
  mole_pool *p = mole_calloc(1, sizeof *p);
  if (!p) return mole_errorf(MOLE_ERR_NOMEM, "thread pool: out of memory");
  p->nth = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (n_threads > 1) {
    p->workers = mole_calloc((size_t)n_threads - 1, sizeof *p->workers);
    if (!p->workers) {
      mole_pool_free(p);
      return mole_errorf(MOLE_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 0; i < n_threads - 1; i++) {
      p->workers[i].pool = p;
      p->workers[i].ith = i + 1;
      if (pthread_create(&p->workers[i].tid, NULL, pool_main, &p->workers[i]) != 0) {
        p->nth = i + 1;  // only the started ones are joined
        mole_pool_free(p);
        return mole_errorf(MOLE_ERR_INTERNAL, "thread pool: pthread_create failed");
      }
    }
  }
  *out = p;
  return MOLE_OK;
}

void mole_pool_free(mole_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i + 1 < p->nth && p->workers; i++) pthread_join(p->workers[i].tid, NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  for (int i = 0; p->scr && i < p->nth; i++) free(p->scr[i].p);
  mole_free(p->scr);
  mole_free(p->workers);
  mole_free(p);
}

int mole_pool_nth(const mole_pool *p) { return p->nth; }

mole_status mole_pool_reserve(mole_pool *p, size_t bytes) {
  if (!p->scr && !(p->scr = mole_calloc((size_t)p->nth, sizeof *p->scr)))
    return mole_errorf(MOLE_ERR_NOMEM, "thread pool: out of memory");
  for (int i = 0; i < p->nth; i++)
    if (!scratch_grow(&p->scr[i], bytes))
      return mole_errorf(MOLE_ERR_NOMEM, "thread pool: out of memory for %zu bytes of kernel scratch per thread (%d threads)",
                         bytes, p->nth);
  return MOLE_OK;
}

mole_status mole_scratch_reserve(size_t bytes) {
  pthread_once(&g_own_once, own_key_init);
  if (!scratch_grow(&t_own, bytes))
    return mole_errorf(MOLE_ERR_NOMEM, "out of memory for %zu bytes of kernel scratch", bytes);
  pthread_setspecific(g_own_key, &t_own);
  return MOLE_OK;
}

void *mole_scratch(size_t *bytes) {
  const scratch_buf *b = t_job ? t_job : &t_own;
  *bytes = b->n;
  return b->p;
}

void mole_pool_run(mole_pool *p, mole_pool_fn fn, void *ctx) {
  // thread 0 is the caller: the pool's buffer 0 while fn runs here (jobs may nest across pools)
  const scratch_buf *outer = t_job;
  if (p->scr) t_job = &p->scr[0];
  if (p->nth == 1) {
    fn(ctx, 0, 1);
    t_job = outer;
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  atomic_store(&p->n_done, 0);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  if (atomic_load(&p->n_sleeping) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  fn(ctx, 0, p->nth);
  t_job = outer;
  // spin, then yield: a worker may have been descheduled on a busy machine
  for (int spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < p->nth - 1; spins++) {
    if (spins < 4096)
      CPU_RELAX();
    else
      sched_yield();
  }
}
