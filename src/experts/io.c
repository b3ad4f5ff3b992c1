// Expert reads: io_uring with O_DIRECT, or a pthread pool doing pread.
//
// A request (one extent of one expert) is cut into chunks of up to
// IO_CHUNK bytes so several are in flight at once, which is what gets an
// NVMe disk to its bandwidth. Requests wait in a FIFO until a chunk slot is
// free; finished requests wait in a ring until reaped. All tables are sized
// at open.
#include "experts/io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// chunks in flight at once, and at most IO_BG of them for background
// (prefetch) requests: a demand read never waits behind more than IO_BG
// chunks of speculation.
enum { IO_CHUNK = 1 << 20, IO_QD = 16, IO_BG = 4, IO_WORKERS = 4 };

typedef struct io_req {
  uint64_t tag;
  char *buf;
  size_t len, issued;  // bytes, bytes handed out as chunks
  uint64_t off;
  int32_t chunks_out;  // chunks in flight
  int32_t err;
  bool bg;             // background: after every demand request, few chunks at once
  int32_t next;        // FIFO / free list link
} io_req;

typedef struct io_chunk {
  int32_t req;  // -1 = free
  bool bg;      // counted in bg_out
  size_t pos, len;
} io_chunk;

struct experts_io {
  int fd;
  bool direct, uring;
  uint64_t file_size;
  struct io_uring ring;
  int64_t max_req;
  io_req *reqs;
  int32_t free_req;
  int32_t pend_head[2], pend_tail[2];  // requests with bytes not yet handed out: demand, background
  int32_t bg_out;                      // background chunks in flight
  experts_io_done *done;         // ring [max_req]
  int64_t done_head, done_n;
  int64_t in_flight;             // requests not yet reaped
  int64_t busy_us, busy_since;   // time with reads in flight: closed intervals, start of the open one
  uint64_t bytes_done;           // bytes the device delivered (counted per chunk as it completes)
  io_chunk chunks[IO_QD];        // io_uring chunks in flight
  int32_t chunks_out;
  // pread pool
  pthread_t th[IO_WORKERS];
  int n_th;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  bool stop;
};

static void lock(experts_io *io) {
  if (!io->uring) pthread_mutex_lock(&io->mu);
}
static void unlock(experts_io *io) {
  if (!io->uring) pthread_mutex_unlock(&io->mu);
}

// A request whose bytes were all handed out and came back is done.
static void req_finish_chunk(experts_io *io, int32_t r, bool bg) {
  io_req *q = &io->reqs[r];
  q->chunks_out--;
  io->bg_out -= bg;
  if (q->chunks_out > 0 || q->issued < q->len) return;
  if (!io->direct && !q->err) posix_fadvise(io->fd, (off_t)q->off, (off_t)q->len, POSIX_FADV_DONTNEED);
  MOLE_ASSERT(io->done_n < io->max_req);
  io->done[(io->done_head + io->done_n) % io->max_req] = (experts_io_done){q->tag, q->err};
  io->done_n++;
  q->next = io->free_req;
  io->free_req = r;
}

// Takes the next chunk off the pending FIFOs, demand first: *r, *pos, *len.
// False when there is nothing (or only background work over its share).
static bool carve(experts_io *io, int32_t *r, size_t *pos, size_t *len, bool *bg) {
  int k = io->pend_head[0] >= 0 ? 0 : 1;
  if (io->pend_head[k] < 0 || (k == 1 && io->bg_out >= IO_BG)) return false;
  io_req *q = &io->reqs[io->pend_head[k]];
  *r = io->pend_head[k];
  *pos = q->issued;
  *len = MOLE_MIN((size_t)IO_CHUNK, q->len - q->issued);
  q->issued += *len;
  q->chunks_out++;
  io->bg_out += q->bg;
  *bg = q->bg;
  if (q->issued == q->len) {
    io->pend_head[k] = q->next;
    if (io->pend_head[k] < 0) io->pend_tail[k] = -1;
  }
  return true;
}

static bool pending(const experts_io *io) { return io->pend_head[0] >= 0 || io->pend_head[1] >= 0; }

// Bytes [pos+got, pos+len) of request r past the end of the file: zeroes.
static bool at_eof(const experts_io *io, const io_req *q, size_t pos, size_t got) {
  return q->off + pos + got >= io->file_size;
}

// ---- pread pool -------------------------------------------------------------
static void *worker(void *arg) {
  experts_io *io = arg;
  pthread_mutex_lock(&io->mu);
  for (;;) {
    int32_t r;
    size_t pos, len;
    bool bg;
    while (!io->stop && !carve(io, &r, &pos, &len, &bg)) pthread_cond_wait(&io->cv_work, &io->mu);
    if (io->stop) break;
    io_req *q = &io->reqs[r];
    char *buf = q->buf;
    const uint64_t off = q->off;
    pthread_mutex_unlock(&io->mu);
    int err = 0;
    size_t got = 0;
    while (got < len) {
      ssize_t n = pread(io->fd, buf + pos + got, len - got, (off_t)(off + pos + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        break;
      }
      if (n == 0 || (at_eof(io, q, pos, got + (size_t)n) && got + (size_t)n < len)) {
        got += (size_t)n;
        memset(buf + pos + got, 0, len - got);
        break;
      }
      got += (size_t)n;
    }
    pthread_mutex_lock(&io->mu);
    io->bytes_done += got;
    if (err && !q->err) q->err = err;
    req_finish_chunk(io, r, bg);
    pthread_cond_broadcast(&io->cv_done);
    if (bg && pending(io)) pthread_cond_broadcast(&io->cv_work);  // background share freed
  }
  pthread_mutex_unlock(&io->mu);
  return NULL;
}

// ---- io_uring -------------------------------------------------------------------
static void uring_fill(experts_io *io) {
  while (io->chunks_out < IO_QD && pending(io)) {
    int c = 0;
    while (io->chunks[c].req >= 0) c++;
    io_chunk *ch = &io->chunks[c];
    int32_t r;
    size_t pos, len;
    bool bg;
    if (!carve(io, &r, &pos, &len, &bg)) break;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    MOLE_ASSERT(sqe);  // IO_QD entries, at most IO_QD chunks in flight
    ch->req = r;
    ch->bg = bg;
    ch->pos = pos;
    ch->len = len;
    const io_req *q = &io->reqs[ch->req];
    io_uring_prep_read(sqe, io->fd, q->buf + ch->pos, (unsigned)ch->len, q->off + ch->pos);
    io_uring_sqe_set_data64(sqe, (uint64_t)c);
    io->chunks_out++;
  }
  io_uring_submit(&io->ring);
}

static void uring_complete(experts_io *io, struct io_uring_cqe *cqe) {
  io_chunk *ch = &io->chunks[io_uring_cqe_get_data64(cqe)];
  io_req *q = &io->reqs[ch->req];
  const int res = cqe->res;
  io_uring_cqe_seen(&io->ring, cqe);
  if (res > 0) io->bytes_done += (uint64_t)res;
  if (res == -EINTR || res == -EAGAIN || (res > 0 && (size_t)res < ch->len && !at_eof(io, q, ch->pos, (size_t)res))) {
    // resubmit what is left of the chunk
    const size_t got = res > 0 ? (size_t)res : 0;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    MOLE_ASSERT(sqe);  // this chunk's own entry was just freed
    ch->pos += got;
    ch->len -= got;
    io_uring_prep_read(sqe, io->fd, q->buf + ch->pos, (unsigned)ch->len, q->off + ch->pos);
    io_uring_sqe_set_data64(sqe, (uint64_t)(ch - io->chunks));
    return;
  }
  if (res < 0) {
    if (!q->err) q->err = -res;
  } else if ((size_t)res < ch->len) {
    memset(q->buf + ch->pos + res, 0, ch->len - (size_t)res);  // end of file
  }
  const int32_t r = ch->req;
  ch->req = -1;
  io->chunks_out--;
  req_finish_chunk(io, r, ch->bg);
}

// ---- interface ---------------------------------------------------------------------
mole_status experts_io_open(const char *path, const char *mode, int64_t max_requests, experts_io **out) {
  *out = NULL;
  bool want_uring = true;
  if (mode && !strcmp(mode, "pread")) want_uring = false;
  else if (mode && strcmp(mode, "uring"))
    return mole_errorf(MOLE_ERR_ARG, "expert I/O '%s': expected uring or pread", mode);
  MOLE_ASSERT(max_requests > 0);
  experts_io *io = mole_calloc(1, sizeof *io);
  if (!io) return mole_errorf(MOLE_ERR_NOMEM, "expert I/O: out of memory");
  io->fd = -1;
  io->max_req = max_requests;
  io->reqs = mole_calloc((size_t)max_requests, sizeof *io->reqs);
  io->done = mole_calloc((size_t)max_requests, sizeof *io->done);
  if (!io->reqs || !io->done) {
    experts_io_close(io);
    return mole_errorf(MOLE_ERR_NOMEM, "expert I/O: out of memory for %lld requests", (long long)max_requests);
  }
  for (int64_t i = 0; i < max_requests; i++) io->reqs[i].next = i + 1 < max_requests ? (int32_t)(i + 1) : -1;
  io->free_req = 0;
  io->pend_head[0] = io->pend_head[1] = io->pend_tail[0] = io->pend_tail[1] = -1;
  for (int c = 0; c < IO_QD; c++) io->chunks[c].req = -1;
  io->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  io->direct = io->fd >= 0;
  if (io->fd < 0 && errno == EINVAL) {
    io->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (io->fd >= 0)
      mole_log(MOLE_LOG_WARN, "%s: the file system refuses O_DIRECT; expert reads are buffered and dropped from the page cache",
               path);
  }
  struct stat sb;
  if (io->fd < 0 || fstat(io->fd, &sb) != 0) {
    int e = errno;
    experts_io_close(io);
    return mole_errorf(MOLE_ERR_IO, "%s: cannot open for expert reads: %s", path, strerror(e));
  }
  io->file_size = (uint64_t)sb.st_size;
  if (want_uring) {
    int r = io_uring_queue_init(IO_QD, &io->ring, 0);
    if (r == 0) {
      io->uring = true;
    } else {
      mole_log(MOLE_LOG_WARN, "io_uring is not available (%s); expert reads use the pread thread pool", strerror(-r));
    }
  }
  if (!io->uring) {
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cv_work, NULL);
    pthread_cond_init(&io->cv_done, NULL);
    io->n_th = -1;  // mutex initialised
    int n = 0;
    for (; n < IO_WORKERS; n++)
      if (pthread_create(&io->th[n], NULL, worker, io) != 0) break;
    io->n_th = n;
    if (n == 0) {
      experts_io_close(io);
      return mole_errorf(MOLE_ERR_INTERNAL, "expert I/O: cannot start a reader thread");
    }
  }
  *out = io;
  return MOLE_OK;
}

void experts_io_close(experts_io *io) {
  if (!io) return;
  if (io->uring) {
    // wait for reads still in flight: their buffers are about to be freed
    while (io->chunks_out > 0) {
      struct io_uring_cqe *cqe;
      if (io_uring_wait_cqe(&io->ring, &cqe) != 0) break;
      io->pend_head[0] = io->pend_head[1] = io->pend_tail[0] = io->pend_tail[1] = -1;
      uring_complete(io, cqe);
      io_uring_submit(&io->ring);  // a resubmitted remainder
    }
    io_uring_queue_exit(&io->ring);
  } else if (io->n_th != 0) {
    pthread_mutex_lock(&io->mu);
    io->pend_head[0] = io->pend_head[1] = io->pend_tail[0] = io->pend_tail[1] = -1;  // drop what was not started
    io->stop = true;
    pthread_cond_broadcast(&io->cv_work);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n_th; i++) pthread_join(io->th[i], NULL);
    pthread_mutex_destroy(&io->mu);
    pthread_cond_destroy(&io->cv_work);
    pthread_cond_destroy(&io->cv_done);
  }
  if (io->fd >= 0) close(io->fd);
  mole_free(io->reqs);
  mole_free(io->done);
  mole_free(io);
}

const char *experts_io_kind(const experts_io *io) { return io->uring ? "io_uring" : "pread"; }
bool experts_io_direct(const experts_io *io) { return io->direct; }
uint64_t experts_io_file_size(const experts_io *io) { return io->file_size; }
int64_t experts_io_in_flight(const experts_io *io) { return io->in_flight; }

mole_status experts_io_read(experts_io *io, void *buf, size_t len, uint64_t off, uint64_t tag, bool background) {
  if (io->direct)
    MOLE_ASSERT(len % EXPERTS_IO_ALIGN == 0 && off % EXPERTS_IO_ALIGN == 0 && (uintptr_t)buf % EXPERTS_IO_ALIGN == 0);
  MOLE_ASSERT(len > 0);
  lock(io);
  const int32_t r = io->free_req;
  if (r < 0) {
    unlock(io);
    return mole_errorf(MOLE_ERR_INTERNAL, "expert I/O: more than %lld reads in flight", (long long)io->max_req);
  }
  io_req *q = &io->reqs[r];
  io->free_req = q->next;
  *q = (io_req){.tag = tag, .buf = buf, .len = len, .off = off, .next = -1, .bg = background};
  const int k = background ? 1 : 0;
  if (io->pend_tail[k] >= 0) io->reqs[io->pend_tail[k]].next = r;
  else io->pend_head[k] = r;
  io->pend_tail[k] = r;
  if (io->in_flight++ == 0) io->busy_since = mole_time_us();
  if (!io->uring) pthread_cond_broadcast(&io->cv_work);
  unlock(io);
  return MOLE_OK;
}

void experts_io_promote(experts_io *io, uint64_t tag) {
  lock(io);
  // unlink the background requests with this tag, append them to the demand FIFO
  int32_t prev = -1, r = io->pend_head[1];
  while (r >= 0) {
    io_req *q = &io->reqs[r];
    const int32_t next = q->next;
    if (q->tag == tag) {
      if (prev >= 0) io->reqs[prev].next = next;
      else io->pend_head[1] = next;
      if (io->pend_tail[1] == r) io->pend_tail[1] = prev;
      q->bg = false;
      q->next = -1;
      if (io->pend_tail[0] >= 0) io->reqs[io->pend_tail[0]].next = r;
      else io->pend_head[0] = r;
      io->pend_tail[0] = r;
    } else {
      prev = r;
    }
    r = next;
  }
  if (!io->uring) pthread_cond_broadcast(&io->cv_work);
  unlock(io);
}

void experts_io_submit(experts_io *io) {
  if (io->uring) uring_fill(io);
}

int experts_io_reap(experts_io *io, bool wait, experts_io_done *done, int max) {
  if (io->uring) {
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&io->ring, &cqe) == 0) uring_complete(io, cqe);
    uring_fill(io);
    while (wait && io->done_n == 0 && io->chunks_out > 0) {
      int r = io_uring_wait_cqe(&io->ring, &cqe);
      if (r == -EINTR) continue;
      MOLE_ASSERT(r == 0);
      uring_complete(io, cqe);
      while (io_uring_peek_cqe(&io->ring, &cqe) == 0) uring_complete(io, cqe);
      uring_fill(io);
    }
  } else {
    pthread_mutex_lock(&io->mu);
    while (wait && io->done_n == 0 && io->in_flight > 0) pthread_cond_wait(&io->cv_done, &io->mu);
  }
  int n = 0;
  while (n < max && io->done_n > 0) {
    done[n++] = io->done[io->done_head];
    io->done_head = (io->done_head + 1) % io->max_req;
    io->done_n--;
    if (--io->in_flight == 0) io->busy_us += mole_time_us() - io->busy_since;
  }
  unlock(io);
  return n;
}

uint64_t experts_io_bytes_done(experts_io *io) {
  lock(io);
  const uint64_t b = io->bytes_done;
  unlock(io);
  return b;
}

int64_t experts_io_busy_us(const experts_io *io) {
  return io->busy_us + (io->in_flight > 0 ? mole_time_us() - io->busy_since : 0);
}
