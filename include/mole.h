// mole: a C11 inference engine for Mixture-of-Experts models in GGUF files.
// Public API: opaque handles and status codes; no internal types.
#ifndef MOLE_H
#define MOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mole_status {
  MOLE_OK = 0,
  MOLE_ERR_IO,           // a file could not be opened/read/written
  MOLE_ERR_FORMAT,       // a file is malformed (the message names field and offset)
  MOLE_ERR_UNSUPPORTED,  // valid but not supported (architecture, type, rope scaling)
  MOLE_ERR_ARG,          // a bad argument or flag
  MOLE_ERR_NOMEM,        // out of memory
  MOLE_ERR_NOT_FOUND,    // a key/tensor/file that must exist does not
  MOLE_ERR_INTERNAL,
} mole_status;

const char *mole_status_str(mole_status st);
// Only errors on stderr from now on (no warnings or notes): for the MPI
// ranks that compute but do not speak.
void mole_log_quiet(void);
// The message of the last error on this thread ("file.gguf: offset 24: ...").
const char *mole_last_error(void);

// The SIMD kernels in use: "avx512vnni", "avx2" or "scalar". The environment
// variable MOLE_ISA=avx512|avx2|scalar selects a lower level than the CPU's
// best (to test or measure those kernels); mole_isa_check says whether a
// value is valid on this CPU (MOLE_ERR_ARG with a message if not).
const char *mole_isa(void);
mole_status mole_isa_check(const char *name);

// ---- model ----------------------------------------------------------------
typedef struct mole_model mole_model;

typedef enum { MOLE_KV_F16 = 0, MOLE_KV_F32 = 1 } mole_kv_type;

// Expert offloading (HOBBIT): where expert weights live and how they move.
typedef struct mole_offload_params {
  int64_t expert_budget;       // RAM for experts in bytes; 0 = all resident (mmap); -1 = auto (default:
                               // resident when the model fits in available memory / the cgroup limit)
  double expert_budget_frac;   // > 0: budget as a fraction of the experts' bytes (overrides expert_budget)
  const char *cache_policy;    // lru | lfu | lhu | fld | hobbit (default hobbit)
  float cache_weights[4];      // w_lru, w_lfu, w_lhu, w_fld summing to 1; all 0 = the defaults
  const char *io;              // "uring" | "pread" | NULL = uring when available
  float t1, t2;                // precision thresholds; 1, 1 = every chosen expert in high precision
  int prefetch_depth;          // layers predicted ahead; -1 = adaptive (default), 0 = off
  const char *trace_routing;   // write the routing trace here (NULL = none)
  // The sessions the auto budget leaves room for (KV cache and scratch), as
  // in mole_session_params: 0 = the same defaults (min(train ctx, 4096), 512);
  // session_count caches of that shape (a server's slots; 0 = 1) and one scratch.
  int64_t session_ctx, session_batch, session_count;
  mole_kv_type session_kv_type;
} mole_offload_params;

// Several processes (mpirun) computing one model: tp = Megatron tensor
// parallelism (replicated residual, all-reduce after each block); hmp =
// Galaxy's hybrid (tensor parallel blocks, norms and residual adds split by
// tokens: all-gather before a block, reduce-scatter after it).
typedef enum { MOLE_PARALLEL_NONE = 0, MOLE_PARALLEL_TP, MOLE_PARALLEL_HMP } mole_parallel;

typedef struct mole_model_params {
  int n_threads;  // default 0 = number of online CPUs
  mole_parallel parallel;  // with mole_dist_model_load; NONE there means hmp (or the plan's)
  const char *plan;        // mole plan's output: each process's shares (NULL = equal shares)
  bool no_overlap;         // hmp: plain collectives instead of rings overlapped with the matmuls
  // MegaScale-Infer (with mole_dist_model_load): attention, norms, routers,
  // embeddings and the KV caches on ranks [0, disagg_attn), each running its
  // own sequences; the routed experts split over the last disagg_expert
  // ranks. Both equal to the number of processes: co-located expert
  // parallelism (every rank both). 0, 0: not disaggregated.
  int disagg_attn, disagg_expert;
  int micro_batches;  // each attention rank's batch in this many parts (default 0 = 2)
  bool no_ping_pong;  // the parts one after another, never overlapping the experts' work
  // false (default): the weights every step reads are copied into memory on
  // huge pages, matrices repacked for the decode kernels (faster decode, the
  // copy's memory). true: computed straight from the file mapping (no copy,
  // page cache shared between processes, slower decode).
  bool use_mmap;
  mole_offload_params offload;
} mole_model_params;

mole_model_params mole_model_default_params(void);
mole_status mole_model_load(const char *path, const mole_model_params *params, mole_model **out);
void mole_model_free(mole_model *m);
int64_t mole_model_n_vocab(const mole_model *m);
int64_t mole_model_n_ctx_train(const mole_model *m);
const char *mole_model_arch(const mole_model *m);
// Weight bytes one decode step reads (attention, router, the used experts,
// output projection): the memory-bound floor is this / bandwidth.
uint64_t mole_model_active_bytes(const mole_model *m);
// Bytes of weights copied into the weights image (0 with use_mmap).
int64_t mole_model_image_bytes(const mole_model *m);
// One line summary: "arch, n_layer, n_embd, experts, type, size".
void mole_model_describe(const mole_model *m, char *buf, size_t n);
// Offload statistics (hits/misses per precision, skips, bytes read, stall
// time, prediction accuracy, resident bytes) as text.
void mole_model_print_stats(const mole_model *m, FILE *f);
// The same as one JSON object ({} for a dense model).
void mole_model_print_stats_json(const mole_model *m, FILE *f);

// ---- session (one sequence, its KV cache and scratch) -------------------
typedef struct mole_session mole_session;

// What a bounded KV cache keeps besides its sinks and recent entries (Locret's
// setting): AUTO = full without a budget, else locret with retaining heads,
// else h2o; STREAMING = the newest (StreamingLLM); H2O = the entries that got
// the most attention so far; LOCRET = the retaining heads' scores.
typedef enum {
  MOLE_KV_POLICY_AUTO = 0,
  MOLE_KV_POLICY_FULL,
  MOLE_KV_POLICY_STREAMING,
  MOLE_KV_POLICY_H2O,
  MOLE_KV_POLICY_LOCRET
} mole_kv_policy;

// Retaining heads (mole train-retain) loaded once for several sessions to
// share (a server's slots): mole_session_params.kv_heads.
typedef struct mole_kv_heads mole_kv_heads;
mole_status mole_kv_heads_load(const char *path, mole_kv_heads **out);
void mole_kv_heads_free(mole_kv_heads *h);

typedef struct mole_session_params {
  int64_t n_ctx;         // KV capacity in tokens; 0 = min(train ctx, 4096); ignored with a kv_budget
  int64_t n_batch;       // prefill chunk; 0 = 512
  mole_kv_type kv_type;  // default F16
  int n_threads;         // 0 = the model's
  // Bounded KV cache: after each chunk every layer and KV head keeps at most
  // kv_budget entries (0 = unbounded, the default): the first kv_sinks
  // positions, the newest kv_recent, and the best of the rest by kv_policy.
  // Memory is then (kv_budget + n_batch) slots however long the sequence.
  int64_t kv_budget;
  int64_t kv_recent;         // -1 = kv_budget / 4
  int64_t kv_sinks;          // -1 = 4 (at most kv_budget - kv_recent)
  mole_kv_policy kv_policy;
  const char *kv_retain;     // retaining heads file (mole train-retain) for LOCRET
  const mole_kv_heads *kv_heads;  // or heads already loaded (borrowed: they outlive the session)
  // LOCRET ranks an entry by its heads' score less kv_decay per position of
  // age (< 0 = 8 / kv_budget, the default; 0 = none, the paper's fixed scores)
  float kv_decay;
} mole_session_params;

mole_session_params mole_session_default_params(void);
mole_status mole_session_new(mole_model *m, const mole_session_params *p, mole_session **out);
void mole_session_free(mole_session *s);
void mole_session_reset(mole_session *s);
// Forgets every position from n_past on (0 <= n_past <= current), so a
// conversation can re-evaluate from a common prefix. A bounded KV cache that
// has evicted entries can only stay where it is or start over at 0
// (MOLE_ERR_ARG otherwise).
mole_status mole_session_rewind(mole_session *s, int64_t n_past);
int64_t mole_session_n_past(const mole_session *s);

// The KV cache as it stands.
typedef struct mole_kv_info {
  const char *policy;     // "full", "streaming", "h2o", "locret"
  int64_t budget, recent, sinks;  // 0, 0, 0 unbounded
  float decay;            // locret's score penalty per position of age
  int64_t capacity;       // slots allocated per layer and KV head
  int64_t used;           // slots in use
  int64_t n_past;         // positions seen
  int64_t evicted;        // entries evicted so far, summed over layers and KV heads
  int64_t bytes;          // resident bytes: rows, and a bounded cache's positions and scores
} mole_kv_info;
void mole_session_kv_info(const mole_session *s, mole_kv_info *out);
// Feeds n tokens at the current position. If logits != NULL it receives
// [n][n_vocab] floats when all_logits, else [n_vocab] for the last token.
mole_status mole_session_eval(mole_session *s, const int32_t *tokens, int64_t n, float *logits,
                              bool all_logits);

// ---- several sequences in one forward pass ---------------------------------
// Each session keeps its own KV cache and position; a batcher runs the new
// tokens of several sessions together: every matmul reads its weights once
// for all of them and each routed expert is fetched (from RAM or disk) once
// per step for every token routed to it. Each session's logits are exactly
// those it would get evaluated alone with the same token chunks.
typedef struct mole_batcher mole_batcher;

typedef struct mole_batch_item {
  mole_session *session;  // a session of the batcher's model, at most once per call
  const int32_t *tokens;  // n >= 1 tokens appended at the session's position
  int64_t n;
  float *logits;          // NULL, or [n][n_vocab] (all_logits) / [n_vocab] (the last token)
  bool all_logits;
} mole_batch_item;

// max_tokens: most tokens of one call (all items together); max_ctx: the
// largest n_ctx of the sessions it will see (0 = min(train ctx, 4096)).
mole_status mole_batcher_new(mole_model *m, int64_t max_tokens, int64_t max_ctx, mole_batcher **out);
void mole_batcher_free(mole_batcher *b);
// All items in one pass; on success every session advances by its n. The
// sessions must share one KV type and fit their new tokens in their context;
// one with a bounded KV cache (kv_budget) takes at most its n_batch tokens a
// pass and evicts after it, as mole_session_eval's chunks do.
mole_status mole_batcher_eval(mole_batcher *b, const mole_batch_item *items, int64_t n_items);

// ---- several processes (Open MPI) -------------------------------------------
// mpirun starts every process with the same command line. Each calls
// mole_dist_init first, then mole_dist_model_load: every process maps the
// same file and keeps only its share (heads, FFN columns, vocabulary rows).
// Rank 0 then uses the model as usual (sessions, batches, sampling: its
// calls drive everything); every other rank calls mole_dist_worker, which
// runs the passes rank 0 asks for and returns when rank 0 frees the model.
mole_status mole_dist_init(int *argc, char ***argv);
void mole_dist_finalize(void);
int mole_dist_rank(void);
int mole_dist_size(void);
mole_status mole_dist_model_load(const char *path, const mole_model_params *params, mole_model **out);
mole_status mole_dist_worker(mole_model *m);

// mole plan (every process of the mpirun calls it): profiles each process
// (weight streaming and batch speed, memory it may use, link to rank 0) and
// writes, on rank 0, shares that let all finish together within their memory
// (JSON for --plan; out NULL = stdout). MOLE_ERR_NOMEM when they cannot fit.
mole_status mole_dist_plan(const char *path, const mole_model_params *params, const char *out);

// Bytes each collective sent from this process, and how often it ran.
typedef struct mole_dist_counts {
  int64_t allreduce_bytes, allgather_bytes, reduce_scatter_bytes, logits_bytes, step_bytes;
  int64_t allreduce_calls, allgather_calls, reduce_scatter_calls;
} mole_dist_counts;
void mole_dist_get_counts(const mole_model *m, mole_dist_counts *out);

// Disaggregated serving (disagg_attn/disagg_expert): what every rank did
// since the last reset, gathered on rank 0 (every rank takes part: call it
// on rank 0 only, between passes). busy: computing; wait: in a pass waiting
// for the other side; the sides' idle fraction is wait / pass time.
typedef struct mole_disagg_rank {
  bool attn, expert;  // its roles
  int64_t passes, tokens;  // passes and tokens it ran attention for
  double pass_s, attn_s, expert_s, wait_s;
  int64_t bytes_sent;
} mole_disagg_rank;
mole_status mole_disagg_stats(mole_model *m, mole_disagg_rank *ranks, int max_ranks, int *n_ranks);
mole_status mole_disagg_reset_stats(mole_model *m);
// mole plan --disagg (every process of the mpirun calls it): profiles the
// attention side per batch size, the experts per rows and experts held, the
// link; searches the split (A + E or co-located), micro-batches and batch
// size (up to max_seqs sequences at context ctx) for the most tokens/s per
// process within max_tpot_ms per output token (<= 0: no bound) and every
// process's memory; rank 0 writes the plan, its prediction and every
// candidate's (JSON; out NULL = stdout).
mole_status mole_disagg_plan(const char *path, const mole_model_params *params, int64_t max_seqs, int64_t ctx,
                             double max_tpot_ms, const char *out);

// ---- OpenAI-compatible HTTP server --------------------------------------------
// /v1/chat/completions (the model's chat template; streaming with server-sent
// events or not), /v1/completions, /v1/models, /health, /metrics (Prometheus
// text). --parallel sequences decode together (continuous batching over a
// mole_batcher), more requests wait in a queue.
typedef struct mole_server mole_server;

typedef struct mole_server_params {
  const char *host;        // default "127.0.0.1" (loopback only)
  int port;                // default 8080; 0 = any free port (mole_server_port)
  int parallel;            // sequences decoding at once (slots), default 4
  const char *api_key;     // NULL/"" = none; else "Authorization: Bearer KEY" on every route but /health
  int64_t ctx_per_seq;     // longest sequence (prompt and output) of a slot, and its KV capacity when
                           // unbounded (0 = min(train ctx, 4096))
  int64_t batch;           // prompt tokens prefilled per step beside the decoding ones (default 256)
  mole_kv_type kv_type;    // default f16
  // A bounded KV cache per slot, as in mole_session_params (kv_budget 0 = none,
  // the default): each slot then holds kv_budget + a step's tokens however long
  // its sequence; a conversation reuses a slot's cache only while nothing was
  // evicted or when it goes on from everything the slot holds.
  int64_t kv_budget, kv_recent, kv_sinks;  // recent, sinks: -1 = the defaults
  mole_kv_policy kv_policy;
  const char *kv_retain;
  float kv_decay;                          // -1 = the default
  const char *chat_template;  // NULL = the model's (chatml when it has none mole knows)
  const char *model_name;  // the id in responses; NULL = general.name or the file name
  int64_t max_body_bytes;  // larger request bodies get 413 (default 4 MiB)
  int64_t max_queue;       // requests waiting beyond the slots; more get 503 (default 64)
  int64_t max_tokens;      // cap and default of max_tokens (0 = ctx_per_seq)
  int timeout_s;           // a connection idle this long (slow client) is closed (default 60)
} mole_server_params;

mole_server_params mole_server_default_params(void);
// Listening when it returns (threads: one per connection, one engine).
mole_status mole_server_start(mole_model *m, const mole_server_params *p, mole_server **out);
int mole_server_port(const mole_server *s);
const char *mole_server_model_id(const mole_server *s);
// Stops accepting, ends running and queued requests (503), closes every
// connection, frees. Block SIGINT/SIGTERM in the calling thread before
// mole_server_start and wait for them with sigwait to shut down cleanly.
void mole_server_free(mole_server *s);

#ifdef __cplusplus
}
#endif
#endif
