// dist_plan: mole plan. Every rank measures itself: how fast it streams the
// model's weights through a matvec (decode is bound by that), how fast it
// multiplies a batch (prefill), how much memory it may use (MemAvailable or
// its cgroup's limit), and its link to rank 0 (bandwidth and latency of a
// ping-pong). Rank 0 then gives each rank shares of heads, FFN columns,
// vocabulary rows and (hmp) tokens in proportion to its speed, so that all
// finish a step together, moving share from a rank whose share would not fit
// its memory to the others. The vocabulary projection goes whole to the
// root when streaming it there alone is faster than gathering every rank's
// rows of the logits over its link each token (a slow link), memory
// allowing. It writes the plan (JSON, read by --plan) with the profiles and
// the predicted time per token.
#include <cjson/cJSON.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "experts/budget.h"
#include "model/model.h"
#include "model/ops.h"
#include "parallel/parallel.h"
#include "parallel/shares.h"

enum { MAX_R = PARALLEL_MAX_RANKS };

typedef struct {
  double decode_gbs;   // weight bytes streamed per second through a one-token matvec
  double prefill_gflops;
  double mem_bytes;    // what this rank may still allocate
  double link_gbs;     // to rank 0 (rank 0: 0)
  double link_lat_us;
} rank_profile;

// The most common weight type of the file's big matrices (what decode streams).
static quant_type main_type(const gguf_file *f) {
  int64_t bytes[QT_COUNT] = {0};
  for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    if (t->n_dims >= 2 && t->type < QT_COUNT) bytes[t->type] += (int64_t)t->size;
  }
  int best = QT_F32;
  for (int t = 0; t < QT_COUNT; t++)
    if (bytes[t] > bytes[best] && quant_r16_supported((quant_type)t, 64)) best = t;
  return (quant_type)best;
}

// wall time each rate is measured over: ten periods of a CFS quota
enum { PROFILE_WINDOW_US = 1000000 };

static mole_status profile_compute(mole_model *m, quant_type t, size_t mib, rank_profile *p) {
  const int64_t k = 4096, rows = (int64_t)((mib << 20) / quant_row_size(t, k)) / 16 * 16;
  const size_t rb = quant_row_size(t, k);
  const quant_traits *tr = quant_traits_of(t), *vt = quant_traits_of(tr->vec_dot_type);
  char *W = mole_aligned_alloc(64, rb * (size_t)rows), *R = mole_aligned_alloc(64, rb * (size_t)rows);
  float *f = mole_malloc((size_t)k * sizeof(float));
  const int64_t nt = 64;
  char *X = mole_aligned_alloc(64, quant_row_size(tr->vec_dot_type, k) * nt);
  float *Y = mole_aligned_alloc(64, sizeof(float) * (size_t)rows * nt);
  if (!W || !R || !f || !X || !Y) {
    mole_aligned_free(W);
    mole_aligned_free(R);
    mole_aligned_free(X);
    mole_aligned_free(Y);
    mole_free(f);
    return mole_errorf(MOLE_ERR_NOMEM, "mole plan: out of memory for the %zu MiB matrix it profiles with", mib);
  }
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(m->comm.rank + 1);
  for (int64_t r = 0; r < rows; r++) {  // every row different (the host could merge equal pages)
    for (int64_t i = 0; i < k; i++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      f[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    tr->from_float(f, W + (size_t)r * rb, k);
  }
  for (int64_t j = 0; j < nt; j++) vt->from_float(f, X + (size_t)j * quant_row_size(tr->vec_dot_type, k), k);
  const bool r16 = quant_r16_preferred(t, rows);
  if (r16) quant_r16_pack(t, W, R, k, rows, 0, rows / 16);
  model_tensor w = {r16 ? R : W, t, k, rows, 1, rb, rb * (size_t)rows, r16 ? QL_R16 : QL_ROWS, NULL};
  const size_t xs = quant_row_size(tr->vec_dot_type, k);
  // Sustained rates: repetitions over a window of wall time, not the best
  // single one, so that a process under a CPU quota (cgroup cpu.cfs_quota_us:
  // a share of each 100 ms period) is measured at the speed it keeps, not at
  // the speed of a burst that fits in one period's quota.
  const int64_t window_us = PROFILE_WINDOW_US;
  ops_mm dm = {&w, 0, X, xs, 1, Y, rows, false, 0, NULL};
  ops_mm_run(m->pool, &dm, 1);  // warm-up
  int64_t reps = 0, t0 = mole_time_us(), dt;
  do {  // decode: every weight byte once per token
    ops_mm_run(m->pool, &dm, 1);
    reps++;
  } while ((dt = mole_time_us() - t0) < window_us || reps < 4);
  p->decode_gbs = (double)rb * (double)rows * (double)reps / ((double)dt / 1e6) / 1e9;
  const int64_t gr = MOLE_MIN(rows, 2048);
  model_tensor wg = w;
  wg.ne1 = gr;
  ops_mm pm = {&wg, 0, X, xs, nt, Y, gr, false, 0, NULL};
  reps = 0, t0 = mole_time_us();
  do {  // prefill: a batch of tokens per weight
    ops_mm_run(m->pool, &pm, 1);
    reps++;
  } while ((dt = mole_time_us() - t0) < window_us / 2 || reps < 2);
  p->prefill_gflops = 2.0 * (double)gr * (double)k * (double)nt * (double)reps / ((double)dt / 1e6) / 1e9;
  mole_aligned_free(W);
  mole_aligned_free(R);
  mole_aligned_free(X);
  mole_aligned_free(Y);
  mole_free(f);
  return MOLE_OK;
}

enum { LINK_BIG = 4 << 20 };

// buf: LINK_BIG bytes.
static void profile_link(MPI_Comm comm, int rank, int size, char *buf, rank_profile *p) {
  const int big = LINK_BIG;
  for (int r = 1; r < size; r++) {  // rank 0 with each rank in turn
    if (rank != 0 && rank != r) {
      MPI_Barrier(comm);
      continue;
    }
    const int peer = rank == 0 ? r : 0;
    double lat = 1e30, bw = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      for (int sz = 8; sz <= big; sz = sz == 8 ? big : big + 1) {
        const double t0 = MPI_Wtime();
        if (rank == 0) {
          MPI_Send(buf, sz, MPI_BYTE, peer, 7, comm);
          MPI_Recv(buf, sz, MPI_BYTE, peer, 7, comm, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(buf, sz, MPI_BYTE, peer, 7, comm, MPI_STATUS_IGNORE);
          MPI_Send(buf, sz, MPI_BYTE, peer, 7, comm);
        }
        const double dt = (MPI_Wtime() - t0) / 2;
        if (sz == 8) lat = MOLE_MIN(lat, dt);
        else bw = MOLE_MIN(bw, dt);
      }
    }
    if (rank == r) {
      p->link_lat_us = lat * 1e6;
      p->link_gbs = (double)big / bw / 1e9;
    }
    MPI_Barrier(comm);
  }
}

// Rank 0: the shares from every rank's profile, written as JSON.
static mole_status plan_write(const mole_model *m, const char *path, const mole_model_params *params,
                              const rank_profile *all, int size, const char *out_path) {
  // what splits (attention, FFN, experts, output) and what every rank keeps
  const uint64_t total = (uint64_t)gguf_size(m->gguf);
  const model_hparams *hp = &m->hp;
  uint64_t replicated = (uint64_t)quant_row_size(m->tok_embd.type, hp->n_embd) * (uint64_t)hp->n_vocab;
  for (int64_t l = 0; l < hp->n_layer; l++)
    replicated += (uint64_t)quant_row_size(m->layers[l].gate_inp.type, hp->n_embd) * (uint64_t)hp->n_expert;
  const double shardable = (double)(total - MOLE_MIN(replicated, total));
  double fixed[MAX_R], w[MAX_R];
  for (int r = 0; r < size; r++) fixed[r] = (double)replicated + 64.0 * 1048576.0;
  double speed[MAX_R], mem[MAX_R];
  for (int r = 0; r < size; r++) speed[r] = all[r].decode_gbs, mem[r] = all[r].mem_bytes;
  bool fits = false;
  mole_status st = shares_fit(speed, mem, fixed, size, shardable, w, &fits);
  if (st) return mole_error_prefix(st, "mole plan: %s: ", path);
  const bool hmp = params->parallel != MOLE_PARALLEL_TP;
  // The vocabulary projection: split like the rest, each rank's rows of the
  // logits then crossing its link to the root every token (V/N floats: on a
  // slow link the largest message of a decode step), or all of it on the
  // root, which then streams the whole matrix alone. Whichever is faster,
  // when the root's memory allows.
  const double out_bytes = (double)quant_row_size(m->output.type, hp->n_embd) * (double)hp->n_vocab;
  double t_split = 0, t_gather = 0;
  for (int r = 0; r < size; r++) {
    t_split = MOLE_MAX(t_split, w[r] * out_bytes / (all[r].decode_gbs * 1e9));
    if (r) t_gather = MOLE_MAX(t_gather, w[r] * (double)hp->n_vocab * 4.0 / (all[r].link_gbs * 1e9) + all[r].link_lat_us * 1e-6);
  }
  const double t_root = out_bytes / (all[0].decode_gbs * 1e9);
  const bool root_mem = all[0].mem_bytes <= 0 || fixed[0] + w[0] * shardable + (1.0 - w[0]) * out_bytes <= all[0].mem_bytes;
  const bool root_vocab = t_root < t_split + t_gather && root_mem;
  cJSON *root = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(root, "ranks");
  cJSON_AddStringToObject(root, "model", path);
  cJSON_AddStringToObject(root, "mode", hmp ? "hmp" : "tp");
  double worst = 0, lat = 0, bw = 1e30;
  for (int r = 0; r < size; r++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "heads", w[r]);
    cJSON_AddNumberToObject(e, "ffn", w[r]);
    cJSON_AddNumberToObject(e, "vocab", root_vocab ? (r == 0 ? 1.0 : 0.0) : w[r]);
    cJSON_AddNumberToObject(e, "seq", hmp ? w[r] : 1.0);
    cJSON *pr = cJSON_AddObjectToObject(e, "profile");
    cJSON_AddNumberToObject(pr, "decode_gbs", all[r].decode_gbs);
    cJSON_AddNumberToObject(pr, "prefill_gflops", all[r].prefill_gflops);
    cJSON_AddNumberToObject(pr, "mem_bytes", all[r].mem_bytes);
    if (r) {
      cJSON_AddNumberToObject(pr, "link_gbs", all[r].link_gbs);
      cJSON_AddNumberToObject(pr, "link_latency_us", all[r].link_lat_us);
      lat = MOLE_MAX(lat, all[r].link_lat_us);
      bw = MOLE_MIN(bw, all[r].link_gbs);
    }
    const double vocab_move = root_vocab ? (r == 0 ? (1.0 - w[r]) : -w[r]) * out_bytes : 0.0;
    cJSON_AddNumberToObject(e, "weight_bytes", fixed[r] + w[r] * shardable + vocab_move);
    cJSON_AddItemToArray(ranks, e);
    worst = MOLE_MAX(worst, w[r] * (double)mole_model_active_bytes(m) / (all[r].decode_gbs * 1e9));
  }
  // a decode token: the slowest share's weights, plus 4 collectives of a row
  // per layer, plus the logits (gathered, or the root's whole vocabulary)
  const double comm_s = (double)hp->n_layer * 4.0 * ((double)(size - 1) * (double)hp->n_embd * 4.0 / (bw * 1e9) + lat * 1e-6);
  worst += root_vocab ? t_root - t_split : t_gather;
  cJSON *vo = cJSON_AddObjectToObject(root, "vocabulary");
  cJSON_AddStringToObject(vo, "placed", root_vocab ? "root" : "split");
  cJSON_AddNumberToObject(vo, "split_ms", 1e3 * (t_split + t_gather));
  cJSON_AddNumberToObject(vo, "root_ms", 1e3 * t_root);
  cJSON_AddBoolToObject(vo, "root_fits", root_mem);
  cJSON *pred = cJSON_AddObjectToObject(root, "predicted");
  cJSON_AddNumberToObject(pred, "decode_ms_per_token", 1e3 * (worst + comm_s));
  cJSON_AddNumberToObject(pred, "compute_ms", 1e3 * worst);
  cJSON_AddNumberToObject(pred, "communication_ms", 1e3 * comm_s);
  cJSON_AddBoolToObject(root, "fits", fits);
  char *txt = cJSON_Print(root);
  cJSON_Delete(root);
  if (!txt) return mole_errorf(MOLE_ERR_NOMEM, "mole plan: out of memory");
  FILE *fp = out_path ? fopen(out_path, "w") : stdout;
  if (!fp) {
    cJSON_free(txt);
    return mole_errorf(MOLE_ERR_IO, "mole plan: -o %s: cannot write", out_path);
  }
  fprintf(fp, "%s\n", txt);
  if (out_path) fclose(fp);
  cJSON_free(txt);
  if (!fits)
    return mole_errorf(MOLE_ERR_NOMEM, "mole plan: the model does not fit these processes' memory%s",
                       out_path ? " (the plan was written anyway)" : "");
  return MOLE_OK;
}

mole_status mole_dist_plan(const char *path, const mole_model_params *params, const char *out_path) {
  const int rank = mole_dist_rank(), size = mole_dist_size();
  if (size < 2) return mole_errorf(MOLE_ERR_ARG, "mole plan: run it under mpirun with the processes to plan for");
  if (size > MAX_R) return mole_errorf(MOLE_ERR_ARG, "mole plan: at most %d processes", MAX_R);
  // the file's shapes and types; no weights copied
  mole_model_params mp = *params;
  mp.use_mmap = true;
  mp.offload.expert_budget = 0;
  mole_model *m = NULL;
  rank_profile me = {0};
  char *buf = NULL;
  mole_status st = model_load(path, &mp, NULL, &m);
  if (!st) {
    m->comm.rank = rank;
    experts_mem_info mi;
    experts_mem_probe(NULL, &mi);
    me.mem_bytes = mi.available > 0 ? (double)mi.available : 0;
    const size_t mib = (size_t)MOLE_MAX(16.0, MOLE_MIN(128.0, me.mem_bytes / 8 / 1048576.0));
    st = profile_compute(m, main_type(m->gguf), mib, &me);
  }
  if (!st && !(buf = mole_calloc(1, LINK_BIG))) st = mole_errorf(MOLE_ERR_NOMEM, "mole plan: out of memory");
  // the first collective: every rank gets here, whatever failed before
  if ((st = parallel_agree(MPI_COMM_WORLD, st))) {
    mole_free(buf);
    model_free(m);
    return st;
  }
  profile_link(MPI_COMM_WORLD, rank, size, buf, &me);
  mole_free(buf);
  rank_profile all[MAX_R];
  MPI_Gather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank == 0) st = plan_write(m, path, params, all, size, out_path);
  model_free(m);
  // rank 0's outcome (written or not, fits or not) is every rank's
  return parallel_agree(MPI_COMM_WORLD, st);
}
