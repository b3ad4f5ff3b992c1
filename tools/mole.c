// mole: the command-line tool. A thin layer over include/mole.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mole.h"

typedef struct {
  const char *name;
  int (*fn)(int, char **);
  const char *what;
} command;

static const command k_cmds[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "interactive chat with the model's chat template"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"plan", cmd_plan, "each MPI process's shares of a model, from their profiles (mpirun)"},
    {"logits", cmd_logits, "write the logits of a token sequence (float32)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, counted as llama-perplexity counts it"},
    {"kld", cmd_kld, "KL divergence / top-1 agreement of a configuration against a reference"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"synth", cmd_synth, "write a random-weight model in a real architecture's layout"},
    {"bench", cmd_bench, "measure prompt and generation speed"},
    {"pack", cmd_pack, "rewrite a MoE model as a packed expert store for offloading"},
    {"compress", cmd_compress, "compress the experts under one bit per weight (GPTQ ternary, QMoE)"},
    {"train-retain", cmd_train_retain, "train Locret retaining heads for a model (KV eviction scores)"},
    {"cachesim", cmd_cachesim, "replay a routing trace through the expert cache"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: mole COMMAND [options]   (mole COMMAND --help for its options)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) fprintf(f, "  %-12s %s\n", k_cmds[i].name, k_cmds[i].what);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  // under mpirun (or asked for): several processes share the model; only rank 0 speaks
  bool dist = getenv("OMPI_COMM_WORLD_SIZE") != NULL || !strcmp(argv[1], "plan");
  for (int i = 2; i < argc; i++)
    dist = dist || !strcmp(argv[i], "--plan") || !strcmp(argv[i], "--disagg") ||
           (!strcmp(argv[i], "--parallel") && i + 1 < argc && (!strcmp(argv[i + 1], "hmp") || !strcmp(argv[i + 1], "tp")));
  if (dist) {
    if (mole_dist_init(&argc, &argv) != MOLE_OK) {
      fprintf(stderr, "mole: %s\n", mole_last_error());
      return 1;
    }
    if (mole_dist_rank() != 0) mole_log_quiet();
  }
  const char *isa = getenv("MOLE_ISA");
  if (isa && *isa && mole_isa_check(isa) != MOLE_OK) {
    fprintf(stderr, "mole: %s\n", mole_last_error());
    return 2;
  }
  for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
    if (!strcmp(argv[1], k_cmds[i].name)) {
      int rc = k_cmds[i].fn(argc - 1, argv + 1);
      mole_dist_finalize();
      return rc;
    }
  fprintf(stderr, "mole: unknown command '%s' (see mole --help)\n", argv[1]);
  return 2;
}
