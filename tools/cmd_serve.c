// mole serve: the OpenAI-compatible HTTP server (src/server/).
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"

static const char *k_help =
    "usage: mole serve -m FILE [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key K] [options]\n"
    "OpenAI-compatible HTTP API: POST /v1/chat/completions, POST /v1/completions (stream: true\n"
    "for server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus). Up to\n"
    "--parallel sequences decode together in one batch (a routed expert is fetched once per\n"
    "step for all of them); more requests wait in a queue. Ctrl-C / SIGTERM stops it cleanly.\n" CLI_MODEL_HELP
    "server (-c is the longest sequence of a slot and its KV cache, -b the prompt tokens prefilled\n"
    "per step; with --kv-budget N each slot's cache holds N entries and one step's tokens instead,\n"
    "and a conversation goes on in its slot's cache only while nothing was evicted or from all of it):\n"
    "      --host H          address to listen on (default: 127.0.0.1, loopback only)\n"
    "      --port P          port (default: 8080; 0 = any free port, printed)\n"
    "  -np, --parallel N     sequences decoding at once (default: 4); --parallel hmp|tp with a\n"
    "                        letter splits the model over MPI processes (see above)\n"
    "      --api-key K       require \"Authorization: Bearer K\" (all routes but /health)\n"
    "      --ctx-per-seq N   the same as -c\n"
    "      --template NAME   chat template (default: the model's; chatml if it has none known)\n"
    "      --alias NAME      model id in responses (default: general.name or the file name)\n"
    "      --max-body BYTES  larger request bodies get 413 (default: 4194304)\n"
    "      --max-queue N     requests waiting for a slot; more get 503 (default: 64)\n"
    "      --max-tokens N    cap and default of max_tokens (default: the context per sequence)\n"
    "      --timeout S       close a connection idle for S seconds (default: 60)\n";

int cmd_serve(int argc, char **argv) {
  cli_model_opts mo = {0};
  mole_server_params sp = mole_server_default_params();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t x;
    // --parallel N: slots (as llama-server's); --parallel hmp|tp: the model over MPI processes
    if ((!strcmp(a, "--parallel") || !strcmp(a, "-np")) && i + 1 < argc && argv[i + 1][0] >= '0' &&
        argv[i + 1][0] <= '9') {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 256, &x)) return 2;
      sp.parallel = (int)x;
      continue;
    }
    int r = cli_model_flag(argc, argv, &i, &mo);
    if (r < 0) return 2;
    if (r > 0) continue;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "--host")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      sp.host = v;
    } else if (!strcmp(a, "--port")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 65535, &x)) return 2;
      sp.port = (int)x;
    } else if (!strcmp(a, "--api-key")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if (!v[0])  // --api-key "$KEY" with KEY unset would otherwise serve without one
        return cli_usage_error("serve", "--api-key: the key is empty; leave the flag out to serve without a key");
      sp.api_key = v;
    } else if (!strcmp(a, "--ctx-per-seq")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 8, (int64_t)1 << 24, &mo.ctx)) return 2;
    } else if (!strcmp(a, "--template")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      sp.chat_template = v;
    } else if (!strcmp(a, "--alias")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      sp.model_name = v;
    } else if (!strcmp(a, "--max-body")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1024, (int64_t)1 << 34, &sp.max_body_bytes)) return 2;
    } else if (!strcmp(a, "--max-queue")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1 << 20, &sp.max_queue)) return 2;
    } else if (!strcmp(a, "--max-tokens")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, (int64_t)1 << 24, &sp.max_tokens)) return 2;
    } else if (!strcmp(a, "--timeout")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 86400, &x)) return 2;
      sp.timeout_s = (int)x;
    } else {
      return cli_usage_error("serve", "unknown option '%s'", a);
    }
  }
  if (!mo.model) return cli_usage_error("serve", "no model given (-m FILE)");
  if (mo.ctx > 0) sp.ctx_per_seq = mo.ctx;
  if (mo.batch > 0) sp.batch = mo.batch;
  const mole_session_params ss = cli_session_params(&mo);  // each slot's KV cache, bounded or not
  sp.kv_type = ss.kv_type;
  sp.kv_budget = ss.kv_budget;
  sp.kv_recent = ss.kv_recent;
  sp.kv_sinks = ss.kv_sinks;
  sp.kv_policy = ss.kv_policy;
  sp.kv_retain = ss.kv_retain;
  sp.kv_decay = ss.kv_decay;
  // the auto expert budget leaves room for every slot's cache and a step's scratch
  mo.batch = sp.batch + sp.parallel;
  mo.ctx = sp.kv_budget > 0 ? sp.kv_budget + mo.batch : sp.ctx_per_seq;
  mo.sessions = sp.parallel;
  // every thread the server starts inherits this mask: the signals wait for sigwait below
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
  mole_model *m;
  int rc = cli_load_model(&mo, &m);
  if (rc) return rc;
  mole_server *srv;
  mole_status st = mole_server_start(m, &sp, &srv);
  if (st) {
    mole_model_free(m);
    return cli_error("serve", st);
  }
  char desc[256];
  mole_model_describe(m, desc, sizeof desc);
  fprintf(stderr, "mole serve: %s\nmole serve: model '%s', %d parallel sequences; listening on http://%s:%d\n", desc,
          mole_server_model_id(srv), sp.parallel, sp.host, mole_server_port(srv));
  int sig = 0;
  sigwait(&sigs, &sig);
  fprintf(stderr, "mole serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  mole_server_free(srv);
  mole_model_print_stats(m, stderr);
  mole_model_free(m);
  return 0;
}
