// Helpers shared by the CLI commands: flag parsing with clear errors and
// the model/session flags every model-running command takes.
#ifndef MOLE_CLI_COMMON_H
#define MOLE_CLI_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

#include "mole.h"

#define CLI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CLI_MAX(a, b) ((a) > (b) ? (a) : (b))

typedef struct cli_model_opts {
  const char *model;     // -m FILE
  int threads;           // -t N (0 = all cores)
  int64_t ctx;           // -c N (0 = min(train ctx, 4096))
  int64_t batch;         // -b N (0 = 512)
  mole_kv_type kv_type;  // --kv-type f16|f32
  // bounded KV cache (Locret's setting)
  int64_t kv_budget;          // --kv-budget N (0 = unbounded)
  int64_t kv_recent, kv_sinks;  // --kv-recent N, --kv-sinks N (used when has_kv_*)
  bool has_kv_recent, has_kv_sinks;
  mole_kv_policy kv_policy;   // --kv-policy full|streaming|h2o|locret
  double kv_decay;            // --kv-decay X (used when has_kv_decay)
  bool has_kv_decay;
  const char *kv_retain;      // --retain FILE
  bool use_mmap;         // --mmap
  mole_parallel parallel;  // --parallel tp|hmp (under mpirun)
  const char *plan;        // --plan FILE
  bool no_overlap;         // --no-overlap
  int disagg_attn, disagg_expert;  // --disagg attn=A,expert=E | colocated
  bool disagg_coloc;
  int64_t micro_batches;   // --micro-batches N
  bool no_ping_pong;       // --no-ping-pong
  // expert offloading; each has_* says the flag was given (else the library default)
  bool has_budget, has_weights, has_t1, has_t2, has_prefetch;
  int64_t expert_budget;       // --expert-budget: bytes, 0 resident, -1 auto
  double expert_budget_frac;   // --expert-budget N%
  const char *cache_policy;    // --cache-policy
  float cache_weights[4];      // --cache-weights
  const char *io;              // --io uring|pread
  float t1, t2;                // --t1, --t2
  int prefetch_depth;          // --prefetch-depth
  const char *trace_routing;   // --trace-routing FILE
  int64_t sessions;            // KV caches the auto expert budget leaves room for (serve's slots; 0 = 1)
} cli_model_opts;

#define CLI_MODEL_HELP                                                          \
  "  -m, --model FILE     GGUF model (required)\n"                             \
  "  -t, --threads N      threads (default: all cores)\n"                      \
  "  -c, --ctx N          context size in tokens (default: min(train, 4096))\n" \
  "  -b, --batch N        prefill chunk in tokens (default: 512)\n"            \
  "      --kv-type T      KV cache type f16|f32 (default: f16)\n"             \
  "bounded KV cache (long prompts in constant memory; the prompt is prefilled in -b chunks):\n" \
  "      --kv-budget N    entries kept per layer and KV head after each chunk; 0 = unbounded\n" \
  "                       (default). With a budget -c no longer bounds memory or the context\n" \
  "      --kv-policy P    what decides the rest: streaming (the newest), h2o (most attention so\n" \
  "                       far), locret (retaining heads, --retain); default locret with --retain,\n" \
  "                       else h2o; full = no eviction (no budget)\n"                       \
  "      --kv-recent N    the newest N entries always stay (default: budget / 4)\n"   \
  "      --kv-sinks N     the first N positions always stay (default: 4)\n"          \
  "      --retain FILE    retaining heads for --kv-policy locret (mole train-retain)\n"  \
  "      --kv-decay X     locret: an entry's score less X per position of age (default\n"     \
  "                       8 / budget; 0 = the paper's fixed scores)\n"                    \
  "      --mmap           compute from the file mapping: no copy of the weights into memory\n" \
  "                       (shared page cache, slower decode; default: copied and repacked)\n" \
  "several processes (mpirun -np N mole ...; rank 0 prints, the others compute their share):\n" \
  "      --parallel M     hmp (tensor + sequence parallel, Galaxy) or tp (tensor parallel, Megatron)\n" \
  "      --plan FILE      each process's shares, from mole plan (default: equal shares)\n" \
  "      --no-overlap     hmp: plain collectives, no tiles overlapped with the transfers\n" \
  "      --disagg S       attention and experts on separate ranks (MegaScale-Infer): attn=A,expert=E\n" \
  "                       (mpirun -np A+E), or colocated (every rank both: expert parallelism)\n" \
  "      --micro-batches N  --disagg: each attention rank's batch in N ping-pong parts (default: 2)\n" \
  "      --no-ping-pong   --disagg: the parts one after another, not overlapped with the experts\n" \
  "expert offloading (MoE models larger than memory):\n"                        \
  "      --expert-budget B  RAM for experts: 2GiB, 512MiB, 40% (of the experts), 0 = all\n" \
  "                         resident (mmap), auto = resident if the model fits, else what\n" \
  "                         MemAvailable / the cgroup limit leaves (default: auto)\n" \
  "      --cache-policy P   lru|lfu|lhu|fld|hobbit (default: hobbit)\n"        \
  "      --cache-weights W  hobbit's w_lru,w_lfu,w_lhu,w_fld, summing to 1 (default: 0.4,0.2,0.1,0.3)\n" \
  "      --io uring|pread   expert reads: io_uring or a pread thread pool (default: uring if available)\n" \
  "      --t1 X, --t2 Y     precision thresholds on an expert's unimportance: <= t1 high, <= t2 low,\n" \
  "                         else skipped (default: 1, 1 = every chosen expert in high precision)\n" \
  "      --prefetch-depth N layers predicted ahead: 0 off, 1..4, -1 adaptive (default: -1)\n" \
  "      --trace-routing F  write the routing trace to F (for mole cachesim)\n"

// If argv[*i] is one of the model flags, consumes it (and its value) and
// returns 1; returns 0 when it is not; -1 after printing an error.
int cli_model_flag(int argc, char **argv, int *i, cli_model_opts *o);
// The value of flag argv[*i] (advancing *i), or NULL after printing an error.
const char *cli_value(int argc, char **argv, int *i);
int cli_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out);
// "1,2,3" -> malloc'd ids; prints an error naming the bad element.
int cli_parse_tokens(const char *flag, const char *s, int32_t **out, int64_t *n);
// Loads the model and a session from opts; prints errors.
// The session settings of the flags (-c, -b, --kv-*, --retain).
mole_session_params cli_session_params(const cli_model_opts *o);
int cli_open(const cli_model_opts *o, mole_model **m, mole_session **s);
int cli_load_model(const cli_model_opts *o, mole_model **m);  // the model only
// On an MPI rank other than 0, cli_open / cli_load_model do not return:
// the process serves rank 0's passes (mole_dist_worker) and exits.
// --stats: the KV cache's policy, entries and resident bytes (stderr).
void cli_print_kv(const mole_session *s, FILE *f);
int cli_error(const char *cmd, mole_status st);  // prints mole_last_error, returns 1
int cli_usage_error(const char *cmd, const char *fmt, ...);  // prints, returns 2
// An output that names the same file as an input (however spelled: ./m.gguf,
// a link): a usage error naming both, 2; else 0. NULL paths never clash.
int cli_output_clash(const char *cmd, const char *out_flag, const char *out, const char *in_flag, const char *in);

#endif
