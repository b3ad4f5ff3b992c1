// experts/io: asynchronous reads of expert regions from the model file,
// through io_uring (O_DIRECT) or a pthread pool doing pread. Offsets, lengths
// and buffers of reads are multiples of EXPERTS_IO_ALIGN (O_DIRECT's rule).
// Every table is sized at open: reading allocates nothing.
#ifndef MOLE_EXPERTS_IO_H
#define MOLE_EXPERTS_IO_H

#include "base/base.h"

enum { EXPERTS_IO_ALIGN = 4096 };

typedef struct experts_io experts_io;

typedef struct experts_io_done {
  uint64_t tag;  // the caller's tag of the request
  int32_t err;   // 0, or the errno of the failed read
} experts_io_done;

// Opens path for reading with O_DIRECT (buffered reads dropped from the page
// cache after use when the file system refuses O_DIRECT) and the engine
// `mode`: "uring", "pread" or NULL (io_uring when the kernel allows it). If
// io_uring cannot be set up, falls back to pread with a logged note.
// max_requests: reads in flight at once.
mole_status experts_io_open(const char *path, const char *mode, int64_t max_requests, experts_io **out);
void experts_io_close(experts_io *io);
const char *experts_io_kind(const experts_io *io);  // "io_uring" or "pread"
bool experts_io_direct(const experts_io *io);       // O_DIRECT in use
uint64_t experts_io_file_size(const experts_io *io);

// Queues a read of len bytes at off into buf; the file may end inside it
// (the rest is zeroed). Background reads (prefetches) go after every demand
// read and only a few of their chunks are in flight at once.
// MOLE_ERR_INTERNAL when max_requests are in flight.
mole_status experts_io_read(experts_io *io, void *buf, size_t len, uint64_t off, uint64_t tag, bool background);
// Moves the background reads of `tag` not yet started ahead, with the
// demand reads (a prefetch the forward pass now waits for).
void experts_io_promote(experts_io *io, uint64_t tag);
// Hands queued reads to the kernel / the workers.
void experts_io_submit(experts_io *io);
// Finished requests (up to max) into done; with wait, blocks until at least
// one finishes (returns 0 only when nothing is in flight).
int experts_io_reap(experts_io *io, bool wait, experts_io_done *done, int max);
int64_t experts_io_in_flight(const experts_io *io);
// Microseconds during which reads were in flight (queued or on the device,
// from the first submission to the reap of the last): the disk's busy time
// as the caller sees it (completions are noticed when reaped, so it errs long).
int64_t experts_io_busy_us(const experts_io *io);
// Bytes the device has delivered so far, as chunks complete (the pread
// workers count as they finish; io_uring completions are counted when reaped).
uint64_t experts_io_bytes_done(experts_io *io);

#endif
