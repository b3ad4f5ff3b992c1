// base: status codes and error messages, always-on asserts, the one
// allocator entry point, logging, timers.
#ifndef MOLE_BASE_H
#define MOLE_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mole.h"

// ---- errors -------------------------------------------------------------
// Bad input returns a status and leaves a message (thread-local) saying what
// was wrong and where: `return mole_errorf(MOLE_ERR_FORMAT, "%s: offset %llu: ...", ...)`.
#if defined(__GNUC__)
#define MOLE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MOLE_PRINTF(a, b)
#endif
mole_status mole_errorf(mole_status st, const char *fmt, ...) MOLE_PRINTF(2, 3);
// Prefix the current message with more context ("model.gguf: " + old).
mole_status mole_error_prefix(mole_status st, const char *fmt, ...) MOLE_PRINTF(2, 3);

// A broken invariant: always on (not NDEBUG-dependent), prints file:line, aborts.
_Noreturn void mole_assert_fail(const char *expr, const char *file, int line);
#define MOLE_ASSERT(c) ((c) ? (void)0 : mole_assert_fail(#c, __FILE__, __LINE__))

// ---- memory -------------------------------------------------------------
// One allocator entry point (Lua style): nsize == 0 frees; otherwise
// (re)allocates. Returns NULL on failure (callers report MOLE_ERR_NOMEM).
void *mole_realloc(void *ptr, size_t nsize);
void *mole_malloc(size_t n);
void *mole_calloc(size_t n, size_t size);
void mole_free(void *p);
char *mole_strdup(const char *s);
// 64-byte (or larger power of two) aligned blocks; free with mole_aligned_free.
void *mole_aligned_alloc(size_t align, size_t n);
void mole_aligned_free(void *p);
// Bytes currently allocated through the entry points above, and the peak.
size_t mole_mem_current(void);
size_t mole_mem_peak(void);

// ---- logging ------------------------------------------------------------
typedef enum { MOLE_LOG_ERROR = 0, MOLE_LOG_WARN, MOLE_LOG_INFO, MOLE_LOG_DEBUG } mole_log_level;
void mole_log_set_level(mole_log_level lvl);
void mole_log(mole_log_level lvl, const char *fmt, ...) MOLE_PRINTF(2, 3);

// ---- files --------------------------------------------------------------
// True when both paths exist and name the same file (device and inode), however
// they are spelled: an output that would be written over an input.
bool mole_same_file(const char *a, const char *b);

// ---- time ---------------------------------------------------------------
int64_t mole_time_us(void);  // monotonic microseconds

#define MOLE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MOLE_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
