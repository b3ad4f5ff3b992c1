#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { SPIN_ITERS = 200000 };

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
    p->fn(p->ctx, w->ith, p->nth);
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
  mole_free(p->workers);
  mole_free(p);
}

int mole_pool_nth(const mole_pool *p) { return p->nth; }

void mole_pool_run(mole_pool *p, mole_pool_fn fn, void *ctx) {
  if (p->nth == 1) {
    fn(ctx, 0, 1);
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
  // spin, then yield: a worker may have been descheduled on a busy machine
  for (int spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < p->nth - 1; spins++) {
    if (spins < 4096)
      CPU_RELAX();
    else
      sched_yield();
  }
}
