#include "base/base.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static _Thread_local char g_err[1024];

const char *mole_last_error(void) { return g_err; }

const char *mole_status_str(mole_status st) {
  switch (st) {
    case MOLE_OK: return "ok";
    case MOLE_ERR_IO: return "I/O error";
    case MOLE_ERR_FORMAT: return "bad file format";
    case MOLE_ERR_UNSUPPORTED: return "unsupported";
    case MOLE_ERR_ARG: return "bad argument";
    case MOLE_ERR_NOMEM: return "out of memory";
    case MOLE_ERR_NOT_FOUND: return "not found";
    case MOLE_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

mole_status mole_errorf(mole_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return st;
}

mole_status mole_error_prefix(mole_status st, const char *fmt, ...) {
  char old[sizeof g_err];
  memcpy(old, g_err, sizeof old);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof g_err) snprintf(g_err + n, sizeof g_err - (size_t)n, "%s", old);
  return st;
}

_Noreturn void mole_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "mole: %s:%d: assertion failed: %s\n", file, line, expr);
  fflush(stderr);
  abort();
}

// Each block carries its size in a 16-byte header so the accounting is exact.
static _Atomic size_t g_mem_cur, g_mem_peak;

static void mem_account(size_t add, size_t sub) {
  size_t cur = atomic_fetch_add(&g_mem_cur, add) + add;
  atomic_fetch_sub(&g_mem_cur, sub);
  cur -= sub;
  size_t peak = atomic_load(&g_mem_peak);
  while (cur > peak && !atomic_compare_exchange_weak(&g_mem_peak, &peak, cur)) {
  }
}

void *mole_realloc(void *ptr, size_t nsize) {
  size_t osize = 0;
  unsigned char *base = NULL;
  if (ptr) {
    base = (unsigned char *)ptr - 16;
    memcpy(&osize, base, sizeof osize);
  }
  if (nsize == 0) {
    free(base);
    mem_account(0, osize);
    return NULL;
  }
  if (nsize > SIZE_MAX - 16) return NULL;
  unsigned char *nb = realloc(base, nsize + 16);
  if (!nb) return NULL;
  memcpy(nb, &nsize, sizeof nsize);
  mem_account(nsize, osize);
  return nb + 16;
}

void *mole_malloc(size_t n) { return mole_realloc(NULL, n ? n : 1); }

void *mole_calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  size_t bytes = (n && size) ? n * size : 1;
  void *p = mole_malloc(bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

void mole_free(void *p) {
  if (p) mole_realloc(p, 0);
}

char *mole_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = mole_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void *mole_aligned_alloc(size_t align, size_t n) {
  // Layout: [rn at base][...][align at p-8] p: user block of rn bytes.
  void *base = NULL;
  if (align < 16) align = 16;
  if (n > SIZE_MAX - 2 * align) return NULL;
  size_t rn = (n + align - 1) / align * align;
  if (rn == 0) rn = align;
  if (posix_memalign(&base, align, rn + align) != 0) return NULL;
  char *p = (char *)base + align;
  memcpy(base, &rn, sizeof rn);
  memcpy(p - sizeof align, &align, sizeof align);
  mem_account(rn, 0);
  return p;
}

void mole_aligned_free(void *p) {
  if (!p) return;
  size_t rn, align;
  memcpy(&align, (char *)p - sizeof align, sizeof align);
  char *base = (char *)p - align;
  memcpy(&rn, base, sizeof rn);
  mem_account(0, rn);
  free(base);
}

size_t mole_mem_current(void) { return atomic_load(&g_mem_cur); }
size_t mole_mem_peak(void) { return atomic_load(&g_mem_peak); }

static mole_log_level g_log_level = MOLE_LOG_WARN;
void mole_log_set_level(mole_log_level lvl) { g_log_level = lvl; }

void mole_log(mole_log_level lvl, const char *fmt, ...) {
  if (lvl > g_log_level) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  fprintf(stderr, "mole: %s: ", names[lvl]);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

int64_t mole_time_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

bool mole_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
