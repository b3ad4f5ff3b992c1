// server: the OpenAI-compatible HTTP server (mole serve). Three parts:
//   srv_engine.c  the scheduler: --parallel slots (a session each), a queue,
//                 and one thread that runs continuous batching steps: every
//                 running sequence's next token and chunks of new prompts in
//                 one mole_batcher pass, then sampling, detokenising, stops;
//   srv_api.c     the JSON of the API: requests parsed and checked into a
//                 srv_req, responses and stream chunks written;
//   srv_http.c    libmicrohttpd: routes, API key, limits, SSE streaming,
//                 cancellation when a client goes away, /metrics.
// A request is shared by its HTTP connection (which reads what the engine
// writes) and the engine (while it is queued or in a slot): a reference
// count frees it when both are done with it.
#ifndef MOLE_SERVER_INTERNAL_H
#define MOLE_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/sampler.h"
#include "mole.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

enum { SRV_MAX_STOPS = 16, SRV_MAX_TOP_LOGPROBS = 20 };

// One generated token's log-probability, and the top alternatives.
typedef struct srv_logprob {
  int32_t token;
  float logprob;
  int32_t n_top;
  int32_t top_tok[SRV_MAX_TOP_LOGPROBS];
  float top_lp[SRV_MAX_TOP_LOGPROBS];
} srv_logprob;

typedef struct srv_req {
  // ---- input: set before submission, read-only afterwards ----
  bool chat, stream;
  int32_t *prompt;  // [n_prompt] (mole_malloc)
  int64_t n_prompt;
  sampler_params sp;
  int64_t max_tokens;
  char *stops[SRV_MAX_STOPS];
  int64_t n_stops;
  int32_t top_logprobs;  // -1: no logprobs; else 0..SRV_MAX_TOP_LOGPROBS alternatives
  bool include_usage;    // stream: a last chunk with the usage (stream_options)
  chat_tmpl split;       // chat with a reasoning template: its output split by chat_parser;
                         // CHAT_TMPL_UNKNOWN: all of it is content
  bool split_thinking;   // the prompt ends inside <think>: the output starts as reasoning
  char id[48];
  int64_t created;       // unix seconds
  // ---- output: under mu ----
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char *text;            // generated text that is safe to show (no part of a stop string); with
  size_t n_text, cap_text;  // split: the content
  char *reasoning;       // with split: the reasoning (reasoning_content), as text is
  size_t n_reasoning, cap_reasoning;
  char tool_name[128];   // with split: the function the model calls ("" none; gpt-oss: one a response)
  char *tool_args;       // its arguments as the model writes them
  size_t n_tool_args, cap_tool_args;
  srv_logprob *lp;       // [n_lp] when top_logprobs >= 0
  int64_t n_lp, cap_lp;
  int64_t n_gen;         // tokens generated
  int64_t n_cached;      // prompt tokens found in the slot's cache
  bool done;
  const char *finish;    // "stop" | "length" | NULL while running
  int http_status;       // != 0: failed with this status and err
  char err[256];
  // timing (engine): microseconds
  int64_t t_submit, t_first, t_done;
  // ---- shared ----
  atomic_bool cancelled;  // the client went away: the engine drops it at its next step
  atomic_int refs;
  struct srv_req *next;   // queue link (engine)
} srv_req;

srv_req *srv_req_new(void);
void srv_req_release(srv_req *r);  // frees at the last reference

// ---- engine -----------------------------------------------------------------

typedef struct srv_engine srv_engine;

typedef struct srv_engine_params {
  int parallel;          // slots
  int64_t ctx_per_seq;   // KV capacity of each slot
  int64_t step_tokens;   // most tokens per step (prefill chunks fill what decode leaves)
  int64_t max_queue;     // queued requests beyond the slots; more are refused (503)
  mole_session_params slot;  // each slot's session: KV type and bounded-cache settings (n_ctx, n_batch: set here)
} srv_engine_params;

mole_status srv_engine_new(mole_model *m, const tok_vocab *voc, const srv_engine_params *p, srv_engine **out);
// Stops the thread: queued and running requests finish with an error (503),
// later submissions are refused. srv_engine_free stops it first if needed.
void srv_engine_stop(srv_engine *e);
void srv_engine_free(srv_engine *e);
// Queues r (takes a reference). MOLE_ERR_ARG with a message when refused:
// queue full (503), prompt too long (400), engine stopping (503); *status says which.
mole_status srv_engine_submit(srv_engine *e, srv_req *r, int *status);

typedef struct srv_metrics {
  int64_t queued, running, parallel;
  int64_t requests_ok, requests_failed, requests_cancelled;
  int64_t prompt_tokens, cached_tokens, gen_tokens, steps;
  double gen_tps, prompt_tps;  // over the last few seconds
  double busy_s;               // time spent in forward passes
  // the slots' KV caches: bytes allocated, entries held now, entries evicted (bounded caches)
  int64_t kv_bytes, kv_used, kv_evicted;
  // the expert provider's counters (MoE models), copied after each step
  bool has_experts, tiered;
  int64_t hits[2], misses[2], skips, bytes_read, stall_us;
} srv_metrics;
void srv_engine_metrics(srv_engine *e, srv_metrics *out);
// Wakes the engine after a request was marked cancelled (it notices at its
// next step, or now when it is idle).
void srv_engine_poke(srv_engine *e);

// Output text is valid UTF-8 whatever bytes the tokens carry: the held
// bytes (*n_hold of hold, a character not complete yet) plus piece [n <=
// SRV_UTF8_MAX_PIECE] become out (room for 3 * (4 + n) bytes): complete
// characters as they are, any byte that cannot start or continue a valid
// character as U+FFFD; a character still incomplete at the end is held.
// Returns the bytes written.
enum { SRV_UTF8_MAX_PIECE = 508 };
size_t srv_utf8_take(char hold[4], int *n_hold, const char *piece, size_t n, char *out);

// ---- API JSON -----------------------------------------------------------------

typedef struct srv_api_ctx {
  const tok_vocab *voc;
  chat_tmpl tmpl;
  const char *model_id;
  int64_t max_tokens;    // cap on max_tokens, and the default
  int64_t max_prompt;    // prompt tokens at most
} srv_api_ctx;

// Parses a /v1/chat/completions (chat) or /v1/completions body into a new
// request. On a bad request returns NULL and writes an OpenAI-style message
// into err (HTTP 400).
srv_req *srv_api_parse(const srv_api_ctx *c, bool chat, const char *body, size_t n, char *err, size_t cap);
// The whole response of a finished request (mole_malloc'd JSON).
char *srv_api_response(const srv_api_ctx *c, const srv_req *r);
// What a stream chunk carries: text [from, to), reasoning [rfrom, rto) (chat
// with a reasoning template), logprobs [lp_from, lp_to).
typedef struct srv_span {
  size_t from, to, rfrom, rto;
  int64_t lp_from, lp_to;
  bool tool_head;    // announce the tool call (its id and name)
  size_t tfrom, tto;  // tool arguments
} srv_span;

// One SSE event ("data: {...}\n\n") for span s of a streaming request: the
// text as content (chat) or text, the reasoning as reasoning_content, a tool
// call as tool_calls (as llama-server sends them); finish != NULL adds the
// finish_reason (and usage).
// first: the chat stream's opening chunk with the role. mole_malloc'd.
char *srv_api_chunk(const srv_api_ctx *c, const srv_req *r, const srv_span *s, bool first, const char *finish);
// {"error": {"message", "type", "code"}} (mole_malloc'd)
char *srv_api_error(int status, const char *message);

#endif
