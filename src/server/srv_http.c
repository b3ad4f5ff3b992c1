// srv_http: libmicrohttpd glue for mole serve, and the public
// mole_server_* API. One thread per connection (a connection that streams
// or waits for its answer blocks only itself); the engine thread does the
// inference. Every error is an OpenAI-shaped JSON body with a 4xx/5xx code;
// a request whose client goes away (seen by poll() on its socket while it
// waits, or by a failed write) is cancelled and its slot freed.
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "model/model.h"
#include "server/server_internal.h"

struct mole_server {
  mole_model *m;
  mole_server_params p;
  tok_vocab *voc;
  srv_api_ctx api;
  srv_engine *eng;
  struct MHD_Daemon *d;
  char model_id[128];
  int port;
};

// per request: the body as it arrives, then the request once submitted
typedef struct {
  char *body;
  size_t n, cap;
  bool too_large;
  srv_req *req;
} conn_state;

typedef struct {
  mole_server *srv;
  srv_req *req;
  int fd;
  size_t sent;       // text bytes sent
  size_t rsent;      // reasoning bytes sent
  size_t tsent;      // tool argument bytes sent
  bool tool_sent;    // the tool call announced
  int64_t lp_sent;   // logprobs sent
  bool first, ended;
  char *out;         // the event being written
  size_t out_len, out_off;
} stream_state;

// ---- helpers -----------------------------------------------------------------------

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *type, const char *body) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *json) {
  if (!json) return send_body(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":\"internal_error\"}}");
  enum MHD_Result r = send_body(c, status, "application/json", json);
  mole_free(json);
  return r;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *msg) {
  return send_json(c, status, srv_api_error(status, msg));
}

// constant time in the key's length: no early exit on the first difference
static bool key_ok(const mole_server *s, struct MHD_Connection *c) {
  if (!s->p.api_key || !s->p.api_key[0]) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
  const char *got = h + 7, *want = s->p.api_key;
  const size_t ng = strlen(got), nw = strlen(want);
  unsigned diff = (unsigned)(ng != nw);
  for (size_t i = 0; i < nw; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < ng ? got[i] : 0);
  return diff == 0;
}

// Whether the client closed its side (or the socket failed).
static bool client_gone(int fd) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

static void cancel(mole_server *s, srv_req *r) {
  atomic_store(&r->cancelled, true);
  srv_engine_poke(s->eng);
}

// ---- streaming ------------------------------------------------------------------------

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  stream_state *ss = cls;
  srv_req *r = ss->req;
  while (ss->out_off == ss->out_len) {
    mole_free(ss->out);
    ss->out = NULL;
    ss->out_len = ss->out_off = 0;
    if (ss->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&r->mu);
    while (!r->done && r->n_text == ss->sent && r->n_reasoning == ss->rsent && r->n_tool_args == ss->tsent &&
           (ss->tool_sent || !r->tool_name[0]) && r->n_lp == ss->lp_sent && !ss->first) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 200 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&r->cv, &r->mu, &ts);
      if (!r->done && client_gone(ss->fd)) {
        pthread_mutex_unlock(&r->mu);
        cancel(ss->srv, r);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    char *ev;
    if (r->done && r->http_status) {  // failed after the stream began: an error event
      char *e = srv_api_error(r->http_status, r->err);
      size_t n = e ? strlen(e) + 32 : 0;
      ev = e ? mole_malloc(n) : NULL;
      if (ev) snprintf(ev, n, "data: %s\n\ndata: [DONE]\n\n", e);
      mole_free(e);
      ss->ended = true;
    } else {
      const bool head = r->tool_name[0] && !ss->tool_sent;
      const srv_span span = {ss->sent,     r->n_text, ss->rsent, r->n_reasoning, ss->lp_sent, r->n_lp,
                             head,         ss->tsent, r->n_tool_args};
      const char *fin = r->done ? (r->finish ? r->finish : "stop") : NULL;
      ev = srv_api_chunk(&ss->srv->api, r, &span, ss->first, fin);
      ss->first = false;
      ss->sent = span.to;
      ss->rsent = span.rto;
      ss->tsent = span.tto;
      ss->tool_sent |= head;
      ss->lp_sent = span.lp_to;
      if (fin && ev) {
        char *done = mole_malloc(strlen(ev) + 16);
        if (done) {
          strcpy(done, ev);
          strcat(done, "data: [DONE]\n\n");
        }
        mole_free(ev);
        ev = done;
        ss->ended = true;
      }
    }
    pthread_mutex_unlock(&r->mu);
    if (!ev) return MHD_CONTENT_READER_END_WITH_ERROR;
    ss->out = ev;
    ss->out_len = strlen(ev);
  }
  const size_t n = MOLE_MIN(max, ss->out_len - ss->out_off);
  memcpy(buf, ss->out + ss->out_off, n);
  ss->out_off += n;
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  stream_state *ss = cls;
  if (!ss->req->done) cancel(ss->srv, ss->req);  // the response ended early: the client is gone
  srv_req_release(ss->req);
  mole_free(ss->out);
  mole_free(ss);
}

// ---- routes --------------------------------------------------------------------------------

static enum MHD_Result completions(mole_server *s, struct MHD_Connection *c, conn_state *cs, bool chat) {
  char err[512];
  srv_req *r = srv_api_parse(&s->api, chat, cs->body ? cs->body : "", cs->n, err, sizeof err);
  if (!r) return send_error(c, 400, err);
  int status;
  if (srv_engine_submit(s->eng, r, &status) != MOLE_OK) {
    srv_req_release(r);
    return send_error(c, status, mole_last_error());
  }
  const int fd = conn_fd(c);
  if (r->stream) {
    stream_state *ss = mole_calloc(1, sizeof *ss);
    if (!ss) {
      cancel(s, r);
      srv_req_release(r);
      return send_error(c, 500, "out of memory");
    }
    *ss = (stream_state){.srv = s, .req = r, .fd = fd, .first = chat};
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, ss, sse_free);
    if (!resp) {
      sse_free(ss);
      return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  // the whole answer: wait, watching the client
  cs->req = r;
  pthread_mutex_lock(&r->mu);
  while (!r->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    if (!r->done && client_gone(fd)) {
      pthread_mutex_unlock(&r->mu);
      cancel(s, r);
      return MHD_NO;
    }
  }
  pthread_mutex_unlock(&r->mu);
  if (r->http_status) return send_error(c, r->http_status, r->err);
  return send_json(c, 200, srv_api_response(&s->api, r));
}

static enum MHD_Result models(mole_server *s, struct MHD_Connection *c) {
  cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON_AddStringToObject(m, "id", s->model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "mole");
  cJSON_AddItemToArray(data, m);
  char *j = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  enum MHD_Result r = j ? send_body(c, 200, "application/json", j) : MHD_NO;
  cJSON_free(j);
  return r;
}

static enum MHD_Result metrics(mole_server *s, struct MHD_Connection *c) {
  srv_metrics m;
  srv_engine_metrics(s->eng, &m);
  char buf[8192];
  int n = snprintf(buf, sizeof buf,
                   "# HELP mole_requests_running Requests in a slot.\n# TYPE mole_requests_running gauge\n"
                   "mole_requests_running %lld\n"
                   "# HELP mole_requests_queued Requests waiting for a slot.\n# TYPE mole_requests_queued gauge\n"
                   "mole_requests_queued %lld\n"
                   "# HELP mole_slots Slots (--parallel).\n# TYPE mole_slots gauge\nmole_slots %lld\n"
                   "# HELP mole_requests_total Requests ended, by outcome.\n# TYPE mole_requests_total counter\n"
                   "mole_requests_total{outcome=\"ok\"} %lld\nmole_requests_total{outcome=\"failed\"} %lld\n"
                   "mole_requests_total{outcome=\"cancelled\"} %lld\n"
                   "# HELP mole_prompt_tokens_total Prompt tokens evaluated.\n# TYPE mole_prompt_tokens_total counter\n"
                   "mole_prompt_tokens_total %lld\n"
                   "# HELP mole_cached_tokens_total Prompt tokens reused from a slot's cache.\n"
                   "# TYPE mole_cached_tokens_total counter\nmole_cached_tokens_total %lld\n"
                   "# HELP mole_generated_tokens_total Tokens generated.\n# TYPE mole_generated_tokens_total counter\n"
                   "mole_generated_tokens_total %lld\n"
                   "# HELP mole_generation_tokens_per_second Generated tokens per second over the last 5 s.\n"
                   "# TYPE mole_generation_tokens_per_second gauge\nmole_generation_tokens_per_second %.3f\n"
                   "# HELP mole_prompt_tokens_per_second Prompt tokens per second over the last 5 s.\n"
                   "# TYPE mole_prompt_tokens_per_second gauge\nmole_prompt_tokens_per_second %.3f\n"
                   "# HELP mole_steps_total Batched forward passes.\n# TYPE mole_steps_total counter\nmole_steps_total %lld\n"
                   "# HELP mole_busy_seconds_total Time in forward passes.\n# TYPE mole_busy_seconds_total counter\n"
                   "mole_busy_seconds_total %.3f\n"
                   "# HELP mole_kv_bytes Bytes of the slots' KV caches.\n# TYPE mole_kv_bytes gauge\nmole_kv_bytes %lld\n"
                   "# HELP mole_kv_entries KV entries the slots hold (per layer and KV head).\n"
                   "# TYPE mole_kv_entries gauge\nmole_kv_entries %lld\n"
                   "# HELP mole_kv_evicted_total KV entries evicted (bounded caches; summed over layers and KV heads).\n"
                   "# TYPE mole_kv_evicted_total counter\nmole_kv_evicted_total %lld\n",
                   (long long)m.running, (long long)m.queued, (long long)m.parallel, (long long)m.requests_ok,
                   (long long)m.requests_failed, (long long)m.requests_cancelled, (long long)m.prompt_tokens,
                   (long long)m.cached_tokens, (long long)m.gen_tokens, m.gen_tps, m.prompt_tps, (long long)m.steps,
                   m.busy_s, (long long)m.kv_bytes, (long long)m.kv_used, (long long)m.kv_evicted);
  if (m.has_experts && n > 0 && (size_t)n < sizeof buf)
    snprintf(buf + n, sizeof buf - (size_t)n,
             "# HELP mole_expert_hits_total Expert requests found in RAM, by precision.\n"
             "# TYPE mole_expert_hits_total counter\nmole_expert_hits_total{precision=\"high\"} %lld\n"
             "mole_expert_hits_total{precision=\"low\"} %lld\n"
             "# HELP mole_expert_misses_total Expert requests read from disk, by precision.\n"
             "# TYPE mole_expert_misses_total counter\nmole_expert_misses_total{precision=\"high\"} %lld\n"
             "mole_expert_misses_total{precision=\"low\"} %lld\n"
             "# HELP mole_expert_skips_total Routed choices skipped (HOBBIT t2).\n# TYPE mole_expert_skips_total counter\n"
             "mole_expert_skips_total %lld\n"
             "# HELP mole_expert_bytes_read_total Expert bytes read from disk.\n"
             "# TYPE mole_expert_bytes_read_total counter\nmole_expert_bytes_read_total %lld\n"
             "# HELP mole_expert_stall_seconds_total Time the forward pass waited for expert reads.\n"
             "# TYPE mole_expert_stall_seconds_total counter\nmole_expert_stall_seconds_total %.3f\n",
             (long long)m.hits[0], (long long)m.hits[1], (long long)m.misses[0], (long long)m.misses[1],
             (long long)m.skips, (long long)m.bytes_read, (double)m.stall_us / 1e6);
  return send_body(c, 200, "text/plain; version=0.0.4", buf);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  mole_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) {
    cs = mole_calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
    return MHD_YES;
  }
  if (*upload_size > 0) {  // the body, piece by piece, up to the limit
    const size_t n = *upload_size;
    *upload_size = 0;
    if (cs->too_large || cs->n + n > (size_t)s->p.max_body_bytes) {
      cs->too_large = true;
      return MHD_YES;
    }
    if (cs->n + n + 1 > cs->cap) {
      size_t cap = MOLE_MAX(cs->cap * 2, cs->n + n + 1024);
      char *b = mole_realloc(cs->body, cap);
      if (!b) return MHD_NO;
      cs->body = b;
      cs->cap = cap;
    }
    memcpy(cs->body + cs->n, upload, n);
    cs->n += n;
    cs->body[cs->n] = 0;
    return MHD_YES;
  }
  const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (!strcmp(url, "/health")) return get ? send_body(c, 200, "application/json", "{\"status\":\"ok\"}") : send_error(c, 405, "use GET");
  if (!key_ok(s, c)) return send_error(c, 401, "invalid or missing API key (Authorization: Bearer ...)");
  if (cs->too_large) {
    char m[128];
    snprintf(m, sizeof m, "the request body exceeds %lld bytes", (long long)s->p.max_body_bytes);
    return send_error(c, 413, m);
  }
  const bool chat = !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions");
  const bool cmpl = !strcmp(url, "/v1/completions") || !strcmp(url, "/completions");
  if (chat || cmpl) return post ? completions(s, c, cs, chat) : send_error(c, 405, "use POST");
  if (!strcmp(url, "/v1/models") || !strcmp(url, "/models")) return get ? models(s, c) : send_error(c, 405, "use GET");
  if (!strcmp(url, "/metrics")) return get ? metrics(s, c) : send_error(c, 405, "use GET");
  char m[256];
  snprintf(m, sizeof m, "no such endpoint: %s %.128s", method, url);
  return send_error(c, 404, m);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)c;
  mole_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) return;
  if (cs->req) {
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !cs->req->done) cancel(s, cs->req);
    srv_req_release(cs->req);
  }
  mole_free(cs->body);
  mole_free(cs);
  *con_cls = NULL;
}

// ---- public API --------------------------------------------------------------------------

mole_server_params mole_server_default_params(void) {
  return (mole_server_params){.host = "127.0.0.1", .port = 8080, .parallel = 4, .ctx_per_seq = 0, .batch = 256,
                              .kv_type = MOLE_KV_F16, .kv_budget = 0, .kv_recent = -1, .kv_sinks = -1,
                              .kv_policy = MOLE_KV_POLICY_AUTO, .kv_retain = NULL, .kv_decay = -1.0f,
                              .max_body_bytes = 4 << 20, .max_queue = 64, .max_tokens = 0, .timeout_s = 60};
}

mole_status mole_server_start(mole_model *m, const mole_server_params *params, mole_server **out) {
  *out = NULL;
  mole_server_params p = params ? *params : mole_server_default_params();
  if (p.port < 0 || p.port > 65535) return mole_errorf(MOLE_ERR_ARG, "--port %d: expected 0..65535", p.port);
  if (p.max_body_bytes < 1024) return mole_errorf(MOLE_ERR_ARG, "--max-body %lld: expected >= 1024", (long long)p.max_body_bytes);
  if (p.max_queue < 0) return mole_errorf(MOLE_ERR_ARG, "--max-queue %lld: expected >= 0", (long long)p.max_queue);
  if (p.timeout_s < 1) return mole_errorf(MOLE_ERR_ARG, "--timeout %d: expected >= 1 second", p.timeout_s);
  if (p.ctx_per_seq <= 0) p.ctx_per_seq = MOLE_MIN(mole_model_n_ctx_train(m), 4096);
  if (p.max_tokens <= 0) p.max_tokens = p.ctx_per_seq;
  mole_server *s = mole_calloc(1, sizeof *s);
  if (!s) return mole_errorf(MOLE_ERR_NOMEM, "server: out of memory");
  s->m = m;
  s->p = p;
  mole_status st = tok_load(m->gguf, &s->voc);
  // the model's chat template, or the one asked for; chatml when unknown
  chat_tmpl tmpl = CHAT_TMPL_UNKNOWN;
  if (!st && p.chat_template) {
    if ((tmpl = chat_template_from_name(p.chat_template)) == CHAT_TMPL_UNKNOWN)
      st = mole_errorf(MOLE_ERR_ARG, "--template: unknown template '%s' (known: %s)", p.chat_template, chat_template_list());
  } else if (!st) {
    const char *t = NULL;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &t) == MOLE_OK) tmpl = chat_template_detect(t);
    if (tmpl == CHAT_TMPL_UNKNOWN) {
      mole_log(MOLE_LOG_WARN, "serve: %s; using chatml for /v1/chat/completions (--template NAME to choose)",
               t ? "the model's chat template is not one mole knows" : "the model has no chat template");
      tmpl = CHAT_TMPL_CHATML;
    }
  }
  // the model's id: --alias, general.name, or the file name
  const char *name = p.model_name;
  if (!name && gguf_get_str(m->gguf, "general.name", &name) != MOLE_OK) name = NULL;
  if (!name) {
    const char *path = gguf_path(m->gguf), *sl = strrchr(path, '/');
    name = sl ? sl + 1 : path;
  }
  snprintf(s->model_id, sizeof s->model_id, "%s", name);
  s->api = (srv_api_ctx){s->voc, tmpl, s->model_id, p.max_tokens, p.ctx_per_seq - 1};
  srv_engine_params ep = {p.parallel, p.ctx_per_seq, p.batch + p.parallel, p.max_queue, mole_session_default_params()};
  ep.slot.kv_type = p.kv_type;
  ep.slot.kv_budget = p.kv_budget;
  ep.slot.kv_recent = p.kv_recent;
  ep.slot.kv_sinks = p.kv_sinks;
  ep.slot.kv_policy = p.kv_policy;
  ep.slot.kv_retain = p.kv_retain;
  ep.slot.kv_decay = p.kv_decay;
  if (!st) st = srv_engine_new(m, s->voc, &ep, &s->eng);
  if (st) {
    mole_server_free(s);
    return st;
  }
  // listen on host:port
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", p.port);
  int gai = getaddrinfo(p.host, port, &hints, &ai);
  if (gai != 0) {
    mole_server_free(s);
    return mole_errorf(MOLE_ERR_ARG, "--host %s: %s", p.host, gai_strerror(gai));
  }
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  const unsigned conn_limit = (unsigned)(p.parallel + p.max_queue + 32);
  s->d = MHD_start_daemon(flags, (uint16_t)p.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.timeout_s, MHD_OPTION_CONNECTION_LIMIT, conn_limit,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!s->d) {
    mole_server_free(s);
    return mole_errorf(MOLE_ERR_IO, "--host %s --port %d: cannot listen (in use, or not an address of this host)",
                       p.host, p.port);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : p.port;
  *out = s;
  return MOLE_OK;
}

int mole_server_port(const mole_server *s) { return s->port; }

const char *mole_server_model_id(const mole_server *s) { return s->model_id; }

void mole_server_free(mole_server *s) {
  if (!s) return;
  // no new connections; the engine ends what it holds (waiting connections
  // get their answers: 503); the daemon closes the rest and joins its
  // threads; only then is the engine freed
  if (s->d) MHD_quiesce_daemon(s->d);
  srv_engine_stop(s->eng);
  if (s->d) MHD_stop_daemon(s->d);
  srv_engine_free(s->eng);
  tok_free(s->voc);
  mole_free(s);
}
