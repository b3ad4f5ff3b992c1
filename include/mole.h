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

// ---- memory, time, files ----------------------------------------------------
// Frees a buffer this API allocated for the caller (token ids, text); NULL is
// a no-op.
void mole_free(void *p);
// A monotonic clock in microseconds.
int64_t mole_time_us(void);
// True when both paths exist and name the same file (device and inode),
// however they are spelled (./m.gguf, a link): an output about to be written
// over an input.
bool mole_same_file(const char *a, const char *b);
// A byte count for people into buf (n bytes): "1.5 GiB", "512.0 MiB",
// "12 KiB", "100 B". Returns buf.
const char *mole_format_bytes(char *buf, size_t n, double bytes);

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

// ---- GGUF files and tensor types ---------------------------------------------
// A GGUF file opened for reading (mapped, every field validated): its
// metadata and tensor table, for `mole inspect` and for reading a key or a
// vocabulary without loading any weights.
typedef struct mole_gguf mole_gguf;

// The value types of GGUF metadata (the file format's own ids).
typedef enum mole_gguf_type {
  MOLE_GGUF_UINT8 = 0,
  MOLE_GGUF_INT8 = 1,
  MOLE_GGUF_UINT16 = 2,
  MOLE_GGUF_INT16 = 3,
  MOLE_GGUF_UINT32 = 4,
  MOLE_GGUF_INT32 = 5,
  MOLE_GGUF_FLOAT32 = 6,
  MOLE_GGUF_BOOL = 7,
  MOLE_GGUF_STRING = 8,
  MOLE_GGUF_ARRAY = 9,
  MOLE_GGUF_UINT64 = 10,
  MOLE_GGUF_INT64 = 11,
  MOLE_GGUF_FLOAT64 = 12,
} mole_gguf_type;

// MOLE_ERR_IO (cannot open or map), MOLE_ERR_FORMAT (not a GGUF file, or a
// malformed one: the message names the file, the field and its byte offset).
mole_status mole_gguf_open(const char *path, mole_gguf **out);
void mole_gguf_close(mole_gguf *g);

typedef struct mole_gguf_info {
  uint32_t version;      // 2 or 3
  uint64_t alignment;    // of the tensor data
  uint64_t data_offset;  // where the tensor data section starts
  size_t size;           // bytes of the file
  int64_t n_kv;          // metadata keys
  int64_t n_tensors;
} mole_gguf_info;
void mole_gguf_get_info(const mole_gguf *g, mole_gguf_info *out);

// "u8", "i32", "f32", "bool", "string", "array", ...; "invalid" out of range.
const char *mole_gguf_type_name(mole_gguf_type t);
// Bytes of one number or bool of type t; 0 for strings and arrays.
size_t mole_gguf_type_size(mole_gguf_type t);

// Metadata key i (0 <= i < n_kv). Pointers stay valid until mole_gguf_close.
typedef struct mole_gguf_kv {
  const char *key;
  mole_gguf_type type;       // MOLE_GGUF_ARRAY for an array
  mole_gguf_type elem_type;  // an array's element type; type itself otherwise
  uint64_t n;                // an array's elements; 1 otherwise
  // numbers and bools: n elements of mole_gguf_type_size(elem_type) bytes,
  // little endian, not necessarily aligned (copy them out with memcpy)
  const void *data;
} mole_gguf_kv;
// MOLE_ERR_ARG for a NULL argument or i out of range.
mole_status mole_gguf_kv_at(const mole_gguf *g, int64_t i, mole_gguf_kv *out);
// A string value (j = 0) or element j of a string array, NUL-terminated;
// *len (optional) gets its length in bytes (it may hold NULs). NULL when key
// i holds no string or j is out of range.
const char *mole_gguf_kv_str(const mole_gguf *g, int64_t i, uint64_t j, uint64_t *len);
// The index of a key; -1 when absent.
int64_t mole_gguf_find_kv(const mole_gguf *g, const char *key);
// Typed getters: MOLE_ERR_NOT_FOUND when the key is absent, MOLE_ERR_FORMAT
// when it has another type (integers of any width convert to int64_t). The
// string stays valid until mole_gguf_close.
mole_status mole_gguf_get_int(const mole_gguf *g, const char *key, int64_t *out);
mole_status mole_gguf_get_str(const mole_gguf *g, const char *key, const char **out);

// Tensor i of the table (0 <= i < n_tensors); pointers valid until close.
typedef struct mole_gguf_tensor {
  const char *name;
  int type;               // the tensor type id (see mole_type_name)
  const char *type_name;  // "q4_k", "f32", ...; "type#N" for an id mole does not know
  uint32_t n_dims;        // 1..4
  int64_t ne[4];          // ne[0] is the row length; unused dimensions are 1
  uint64_t offset;        // from the start of the data section
  size_t bytes;
} mole_gguf_tensor;
// MOLE_ERR_ARG for a NULL argument or i out of range.
mole_status mole_gguf_tensor_at(const mole_gguf *g, int64_t i, mole_gguf_tensor *out);

// Tensor types are GGUF's (ggml's) type ids: 0 f32, 1 f16, 2 q4_0, 8 q8_0,
// 12 q4_k, 14 q6_k, 30 bf16, ... The lower-case name of one ("type#N" when
// mole does not know it), and the id of a name (any case; -1 when unknown).
const char *mole_type_name(int type);
int mole_type_from_name(const char *name);
// Whether mole can quantize weights to this type and compute with it (the
// types mole pack writes).
bool mole_type_writable(int type);
// Whether mole can compute with weights of this type (load a model holding
// them); a type may be computable without being writable (the IQ types,
// which need an importance matrix to make).
bool mole_type_computable(int type);

// ---- vocabulary: tokens and text -------------------------------------------------
// The tokenizer of a GGUF vocabulary (tokenizer.ggml.*: SentencePiece "llama"
// or byte-level BPE "gpt2"), giving llama.cpp's token ids. Immutable once
// made: every function below may run on several threads at once.
typedef struct mole_vocab mole_vocab;

// The vocabulary of a GGUF file, reading its metadata only (a vocab-only file
// such as llama.cpp's ggml-vocab-*.gguf, or a whole model: no weights are
// loaded). MOLE_ERR_NOT_FOUND (no tokenizer.ggml.* keys), MOLE_ERR_FORMAT,
// MOLE_ERR_UNSUPPORTED (a tokenizer model other than llama/gpt2); messages
// name the file and key.
mole_status mole_vocab_load(const char *path, mole_vocab **out);
// The same from a file already open, or from a loaded model's file (no
// second open). The vocabulary is the caller's: it may outlive g or m.
mole_status mole_gguf_vocab(const mole_gguf *g, mole_vocab **out);
mole_status mole_model_vocab(const mole_model *m, mole_vocab **out);
void mole_vocab_free(mole_vocab *v);

typedef struct mole_vocab_info {
  const char *model;   // "spm" or "bpe"
  const char *pre;     // the pre-tokenizer ("default", "llama3", ...; "spm" for SentencePiece)
  int64_t n_tokens;
  int32_t bos, eos, eot, unk, pad;  // special ids; -1 when the vocabulary has none
  bool add_bos, add_eos;  // whether mole_tokenize with add_special adds BOS / EOS
  const char *chat_template;       // tokenizer.chat_template (Jinja) as stored; NULL when absent
  const char *chat_template_name;  // its family (mole_chat_template_detect); NULL when absent or unknown
} mole_vocab_info;
void mole_vocab_get_info(const mole_vocab *v, mole_vocab_info *out);

// Longest text mole_tokenize takes (bytes).
#define MOLE_TOKENIZE_MAX_TEXT ((size_t)1 << 29)
// Token ids of text[0..len) (any bytes: NUL and invalid UTF-8 included).
// add_special: BOS first / EOS last as the vocabulary asks (add_bos,
// add_eos). parse_special: control tokens written in the text (<|im_end|>,
// ...) become their ids; without it they are tokenized as plain text. *ids
// gets *n ids (never NULL on success; free with mole_free). MOLE_ERR_ARG for
// a NULL argument or len > MOLE_TOKENIZE_MAX_TEXT, MOLE_ERR_NOMEM.
mole_status mole_tokenize(const mole_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                          int32_t **ids, int64_t *n);
// The bytes of one token, for streaming output (SPM's U+2581 as ' ', byte
// tokens as their byte, BPE's byte map undone); control tokens render as
// their text with render_special, else as nothing. Returns the piece's length
// (the bytes in buf are complete only when it is <= cap; nothing is written
// past cap), or -1 for an id out of range or a NULL vocabulary. A piece may
// be part of a UTF-8 character: join pieces before printing them as text.
int64_t mole_token_piece(const mole_vocab *v, int32_t id, char *buf, size_t cap, bool render_special);
// Whether generation ends at this token: EOS, EOT and the end-of-generation
// tokens llama.cpp recognises by their text (<|im_end|>, <|eot_id|>, ...).
bool mole_token_is_eog(const mole_vocab *v, int32_t id);

// mole_detokenize flags.
enum {
  MOLE_DETOK_REMOVE_SPECIAL = 1u << 0,  // drop a leading BOS and a trailing EOS the vocabulary adds
  MOLE_DETOK_RENDER_SPECIAL = 1u << 1,  // control tokens as their text (else nothing)
  MOLE_DETOK_STRIP_SPACE = 1u << 2,     // drop the first token's leading space (SPM's space
                                        // prefix) unless a BOS was removed: llama.cpp's rule
  MOLE_DETOK_CLEAN_SPACES = 1u << 3,    // the vocabulary's clean-up (" ." -> ".") when it asks for one
};
// The text of ids[0..n): *text gets *len bytes and a NUL (free with
// mole_free). With MOLE_DETOK_STRIP_SPACE (SPM) or 0 (BPE) it gives back the
// text mole_tokenize (without add_special) took, for text without special
// tokens. MOLE_ERR_ARG for an id out of range (named) or a NULL argument.
mole_status mole_detokenize(const mole_vocab *v, const int32_t *ids, int64_t n, unsigned flags, char **text,
                            size_t *len);

// ---- chat templates ------------------------------------------------------------
// The chat formats of common model families, rendered by fixed code (no
// Jinja engine) byte for byte as llama.cpp's llama_chat_apply_template renders
// them: chatml, llama2 (mistral), llama2-sys*, mistral-v1/v3/v7, llama3,
// deepseek, deepseek2, deepseek3, zephyr, tulu (olmoe).
typedef struct mole_chat_msg {
  const char *role;     // "system", "user" or "assistant"
  const char *content;  // UTF-8, NUL-terminated
} mole_chat_msg;

// The canonical name of a template given by name or alias (--template NAME);
// NULL when mole knows no such template.
const char *mole_chat_template_from_name(const char *name);
// The family of a tokenizer.chat_template (Jinja) string, or of a bare name;
// NULL when it is not one mole recognises.
const char *mole_chat_template_detect(const char *jinja);
// "chatml, llama2 (alias mistral), ...": the known names, for messages and help.
const char *mole_chat_template_list(void);
// Renders msgs[0..n) with template tmpl (a name or alias); with
// add_assistant, opens the assistant's turn after the last message. No
// template writes a BOS: tokenize the result with add_special (the
// vocabulary's BOS) and parse_special. *out is NUL-terminated (free with
// mole_free). MOLE_ERR_ARG: an unknown template (the message lists the known
// ones), n < 0, a NULL argument, or a message whose role is not system, user
// or assistant (named with its index).
mole_status mole_chat_apply(const char *tmpl, const mole_chat_msg *msgs, int64_t n, bool add_assistant, char **out);

// ---- sampling --------------------------------------------------------------------
// llama.cpp's default chain over one row of logits: penalties (over the last
// repeat_last_n accepted tokens) -> top_k -> top_p -> min_p -> temperature ->
// one draw. temperature <= 0 is greedy (the argmax, ties to the lowest id).
// NaN and -inf logits are never chosen.
#define MOLE_SEED_RANDOM UINT64_MAX  // a seed drawn from the clock

typedef struct mole_sampler_params {
  float temperature;        // 0 (or < 0) = greedy
  int32_t top_k;            // <= 0 = off
  float top_p;              // in [0, 1]; 1 = off
  float min_p;              // in [0, 1]; 0 = off
  float repeat_penalty;     // > 0; 1 = off
  int32_t repeat_last_n;    // >= 0; the window the penalties see; 0 = off
  float presence_penalty;   // 0 = off
  float frequency_penalty;  // 0 = off
  uint64_t seed;            // a fixed seed gives the same tokens again; MOLE_SEED_RANDOM = the clock
} mole_sampler_params;

// llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
// repeat_penalty 1, repeat_last_n 64, no presence/frequency penalty, a seed
// from the clock.
mole_sampler_params mole_sampler_default_params(void);

// One sampler per sequence (not thread-safe); it allocates nothing after
// mole_sampler_new.
typedef struct mole_sampler mole_sampler;
// MOLE_ERR_ARG (naming the field) for n_vocab outside [1, INT32_MAX] or a
// parameter out of range; MOLE_ERR_NOMEM.
mole_status mole_sampler_new(const mole_sampler_params *p, int64_t n_vocab, mole_sampler **out);
void mole_sampler_free(mole_sampler *s);
// A token id in [0, n_vocab) from logits[n_vocab] (read, not written). It
// does not record the token: call mole_sampler_accept with the token used.
int32_t mole_sampler_sample(mole_sampler *s, const float *logits);
// Adds a token to the penalties' history (prompt tokens too, to penalise
// them). MOLE_ERR_ARG for an id outside the vocabulary.
mole_status mole_sampler_accept(mole_sampler *s, int32_t token);
// Clears the history and restarts the random stream from the seed.
void mole_sampler_reset(mole_sampler *s);
// The seed in use (the drawn one for MOLE_SEED_RANDOM).
uint64_t mole_sampler_seed(const mole_sampler *s);

// Stop strings: fed the generated text piece by piece, says when one of them
// has appeared (possibly split over pieces) and which bytes are safe to print
// now (bytes that may start a stop string are held back until the next
// piece settles it, so no part of a stop string is ever printed).
typedef struct mole_stop mole_stop;
typedef struct mole_stop_result {
  bool matched;        // a stop string is complete (now or earlier); text after it is dropped
  int32_t stop_index;  // which one, -1 when none
  const char *emit;    // bytes safe to print now: valid until the next call on the matcher
  size_t n_emit;
} mole_stop_result;
// stops[0..n) are copied; n may be 0. MOLE_ERR_ARG for an empty or NULL string.
mole_status mole_stop_new(const char *const *stops, int64_t n, mole_stop **out);
void mole_stop_free(mole_stop *m);
void mole_stop_reset(mole_stop *m);
mole_status mole_stop_feed(mole_stop *m, const char *piece, size_t n, mole_stop_result *out);
// The end of the text: the bytes held back (none after a match).
void mole_stop_flush(mole_stop *m, mole_stop_result *out);

// ---- expert offloading settings and the cache simulator ---------------------------------
// An --expert-budget value: "2GiB", "512MiB", "1.5G", "300KB", "4096"
// (bytes; K/M/G/T and KiB.. are powers of 1024, KB/MB/GB/TB of 1000), "40%"
// (*frac = 0.4 of what holding every expert takes, *bytes = 0), "auto"
// (*bytes = -1) or "0" (every expert resident): mole_offload_params'
// expert_budget and expert_budget_frac. MOLE_ERR_ARG quoting the value.
mole_status mole_parse_budget(const char *s, int64_t *bytes, double *frac);
// A cache policy by name (any case): lru, lfu, lhu, fld, hobbit, and with
// offline also belady (alias opt: the offline optimum, which only the
// simulator can run). w_in: hobbit's weights w_lru, w_lfu, w_lhu, w_fld in
// [0, 1] summing to 1, or NULL / all 0 for the policy's own. *canonical
// (optional) gets the policy's name, w_out (optional) the weights in use.
// MOLE_ERR_ARG naming the policy or the weights.
mole_status mole_cache_policy_parse(const char *name, const float w_in[4], bool offline, const char **canonical,
                                    float w_out[4]);
// The name of cache policy i (lru, lfu, lhu, fld, hobbit, belady); NULL past the last.
const char *mole_cache_policy_at(int64_t i);

// `mole cachesim`: replays a routing trace (mole_offload_params.trace_routing)
// through the expert cache under a budget and a policy, without the model.
typedef struct mole_cachesim_params {
  int64_t budget;       // bytes (0: budget_frac)
  double budget_frac;   // of what holding every expert takes (both precisions when the trace has a low one)
  const char *policy;   // as mole_cache_policy_parse takes it, offline
  float weights[4];     // hobbit's weights; all 0 = the policy's own
  bool prefetch;        // replay the predictor's prefetches too (every policy but belady)
} mole_cachesim_params;

typedef struct mole_cachesim_result {
  const char *policy;     // canonical name
  float weights[4];       // in use
  bool offline;           // belady: loads on demand only, and gives the bound below
  int64_t n_layer, n_expert, n_used;  // the trace's model
  int64_t budget;         // bytes
  int64_t slots_high, slots_low;  // experts the budget holds per precision
  int64_t steps, tokens;
  int64_t hits_high, misses_high, hits_low, misses_low;
  int64_t prefetch_hits, prefetches, prefetch_unused;
  int64_t bytes_read;
  // belady: no policy replaying this trace under this budget without
  // prefetch has more than bound_hits hits of bound_requests; exact with one
  // precision, a relaxation with two
  int64_t bound_hits, bound_requests;
  bool bound_exact;
} mole_cachesim_result;
// Errors name the trace file and line, or the policy.
mole_status mole_cachesim(const char *trace, const mole_cachesim_params *p, mole_cachesim_result *out);

// ---- model files: synth, pack, compress, train-retain ------------------------------------
// `mole synth`: a model with random weights in the exact GGUF layout of an
// architecture (tensor names, shapes, metadata, tokenizer), for tests and
// benchmarks; llama.cpp loads it too.
typedef struct mole_synth_params {
  const char *arch;       // mixtral | llama | qwen3moe | olmoe | qwen2moe
  int64_t n_embd;         // 1024
  int64_t n_layer;        // 8
  int64_t n_head;         // 0 = n_embd / 128 (at least 1)
  int64_t n_head_kv;      // 0 = n_head / 4 (at least 1)
  int64_t n_expert;       // 8 (0 for a dense model)
  int64_t n_expert_used;  // 2
  int64_t n_ff;           // expert (or dense) FFN width, 3584
  int64_t n_ff_shexp;     // qwen2moe's shared expert width, 0 = n_ff
  int64_t n_vocab;        // 32000 (ignored with vocab_from)
  int64_t n_ctx;          // context_length written, 4096
  int type;               // tensor type id of the weight matrices (default q4_0)
  uint64_t seed;          // 42
  const char *vocab_from; // copy the tokenizer.* keys of this GGUF (optional)
  int n_threads;          // 0 = all cores
} mole_synth_params;
mole_synth_params mole_synth_default_params(void);
// Writes the model to path; *bytes (optional) gets the file's size. Errors
// name the parameter.
mole_status mole_synth(const mole_synth_params *p, const char *path, uint64_t *bytes);

// `mole pack`: rewrites a MoE GGUF as a packed expert store (docs/FORMAT.md):
// each expert of each layer one 4 KiB-aligned region per precision, so one
// expert in one precision is one read; the rest copied unchanged.
typedef struct mole_pack_params {
  int high;              // type id of the high-precision copies; -1 = each matrix's own (exact copy)
  int low;               // type id of the low-precision copies; -1 = none
  const char *low_file;  // or the low tier from a file: a compressed model of the same source (mole compress),
                         // or the same model in other tensor types (e.g. llama-quantize's), experts copied as they are
  int n_threads;         // 0 = all cores
} mole_pack_params;
mole_pack_params mole_pack_default_params(void);  // high -1, low -1, no low_file
// Progress lines go to log (may be NULL). Errors name the file and the tensor
// or key, or the type that does not fit a shape.
mole_status mole_pack(const char *in, const char *out, const mole_pack_params *p, FILE *log);

// `mole compress` (QMoE): every expert to about a bit per weight or less:
// GPTQ on a ternary (or 2-bit) per-row grid with calibration text, layer by
// layer, then a dictionary code the kernels decode inside the matvec. The
// output is a packed expert store.
typedef enum { MOLE_COMPRESS_TERNARY = 0, MOLE_COMPRESS_2BIT = 1 } mole_compress_grid;
#define MOLE_COMPRESS_CODE_WEIGHTS_MAX 64  // the most weights one dictionary code may cover

typedef struct mole_compress_params {
  const char *calib;      // calibration text file (required unless rtn)
  int64_t calib_tokens;   // tokens of it to use (16384)
  int64_t seq_len;        // tokens per calibration sequence, BOS first (512)
  mole_compress_grid grid;  // ternary (default) or 2-bit
  float damp;             // GPTQ dampening, a fraction of mean(diag H) (0.1)
  int64_t block;          // GPTQ lazy-batch columns (128)
  bool rtn;               // round to nearest on the same grid, no calibration
  bool act_order;         // GPTQ's columns by decreasing H diagonal
  double cap;             // an expert's calibration inputs capped at cap x the mean (4)
  float dead_zone;        // ternary: |w| <= dead_zone * s rounds to 0 (0.5: to nearest)
  int code_weights;       // ternary: the most weights a code covers (even, 2..MOLE_COMPRESS_CODE_WEIGHTS_MAX);
                          // 0 = auto (the default)
  int n_threads;          // 0 = all cores
} mole_compress_params;
mole_compress_params mole_compress_default_params(void);
// Compresses the MoE model `in` into `out`. Progress with an ETA goes to log,
// and on success the report (method, bits per weight, dictionary, errors,
// time, peak memory) to report (either may be NULL). Errors name the file,
// flag, layer or expert.
mole_status mole_compress(const char *in, const char *out, const mole_compress_params *p, FILE *log, FILE *report);

// `mole train-retain`: trains Locret's retaining heads (per layer a small MLP
// scoring how much later queries will attend to each key) for a model on a
// text, for MOLE_KV_POLICY_LOCRET, and compares them on held-out sequences
// with StreamingLLM's and H2O's choices.
typedef struct mole_train_retain_params {
  const char *data;   // training text (required)
  int64_t tokens;     // tokens of it to use, training and held out together (default 65536)
  int64_t seq_len;    // tokens per sequence, BOS first (default 512; capped at the model's train context)
  double heldout;     // the last fraction of the sequences held out (default 0.1)
  int64_t window;     // W: the queries after a key its label looks at (default 64)
  int64_t hidden;     // the MLP's hidden width (default 64)
  float smooth;       // weight of the smoothness term (default 0.01)
  float lr;           // AdamW peak learning rate (default 2e-3): linear warm-up, then cosine decay to 0
  float wd;           // AdamW decoupled weight decay on the weights, not on biases (default 0.01)
  int64_t batch;      // tokens per minibatch (default 256)
  int64_t epochs;     // passes over the training sequences (default 20); 0 = evaluate the initial heads only
  uint64_t seed;      // minibatch order, initial weights, the random policy (default 1)
  double max_mem;     // bytes the features, labels and buffers may take (default 8 GiB)
  int n_threads;      // 0 = all cores; layers train in parallel, one per thread
} mole_train_retain_params;
mole_train_retain_params mole_train_retain_default_params(void);

// What the training found: losses, and each policy's overlap with the labels.
typedef struct mole_retain_report mole_retain_report;
// Trains heads for `model` on p->data and writes them to `out`; progress to
// log (may be NULL). On success *report (optional) gets the report.
mole_status mole_train_retain(const char *model, const char *out, const mole_train_retain_params *p, FILE *log,
                              mole_retain_report **report);
void mole_retain_report_print(const mole_retain_report *r, FILE *f);
typedef enum { MOLE_REPORT_JSON = 0, MOLE_REPORT_CSV, MOLE_REPORT_PNG } mole_report_format;
// JSON: the whole report; CSV: the loss curve (epoch, train, held out); PNG:
// that curve plotted with gnuplot (MOLE_ERR_UNSUPPORTED without gnuplot).
mole_status mole_retain_report_save(const mole_retain_report *r, mole_report_format fmt, const char *path);
void mole_retain_report_free(mole_retain_report *r);

#ifdef __cplusplus
}
#endif
#endif
