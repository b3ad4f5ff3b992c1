// mole train-retain: train Locret's retaining heads for a model (engine/train_retain.h).
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole train-retain -m MODEL --data TEXT -o HEADS.gguf [options]\n"
    "Trains Locret's retaining heads (arXiv 2410.01805): per layer a small MLP that reads a token's\n"
    "pre-RoPE q, k and v and scores, per KV head, how much later queries will attend to its key; the\n"
    "KV cache keeps the best-scored entries when it must evict. The model runs over the text in\n"
    "sequences; a key's label is its largest pre-softmax score from the next W queries of any query\n"
    "head of its group. Each layer's MLP is trained alone (SmoothL1 + a smoothness term between\n"
    "neighbouring tokens, AdamW) and compared on the held-out sequences with StreamingLLM's\n"
    "recency and H2O's accumulated attention: the overlap of each policy's top 10% of keys with\n"
    "the top 10% by label. HEADS.gguf is a retaining-heads file (docs/FORMAT.md).\n"
    "  -m, --model FILE    GGUF model (required)\n"
    "  --data TEXT         text file to train on (required); its first --tokens tokens are used\n"
    "  -o FILE             output heads file (required)\n"
    "  --tokens N          tokens, training and held out together (default 65536)\n"
    "  --seq-len N         tokens per sequence, BOS first (default 512; at most the model's train context)\n"
    "  --heldout X         fraction of the sequences held out, the last ones (default 0.1)\n"
    "  --window W          a key's label looks at the next W queries (default 64)\n"
    "  --hidden N          the MLP's hidden width (default 64)\n"
    "  --smooth X          weight of the smoothness term (default 0.01)\n"
    "  --lr X              AdamW peak learning rate: warm-up, then cosine decay to 0 (default 0.002)\n"
    "  --wd X              AdamW weight decay on the weights, not the biases (default 0.01)\n"
    "  --batch N           tokens per minibatch, in runs of 16 consecutive tokens (default 256)\n"
    "  --epochs N          passes over the training sequences (default 20; 0: evaluate untrained heads)\n"
    "  --seed N            minibatch order, initial weights, the random policy (default 1)\n"
    "  --max-mem GIB       refuse to start if features, labels and buffers need more (default 8)\n"
    "  --csv FILE          write the loss curve: epoch, train loss, held-out loss (epoch 0: before training)\n"
    "  --png FILE          plot the loss curve with gnuplot\n"
    "  --report FILE       write the report as JSON\n"
    "  -t N                threads: the model's passes, and layers trained in parallel (default: all cores)\n";

int cmd_train_retain(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *csv = NULL, *png = NULL, *json = NULL;
  mole_train_retain_params p = mole_train_retain_default_params();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t x;
    double d;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      if (!(model = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-o")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--data")) {
      if (!(p.data = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--tokens")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 4, (int64_t)1 << 32, &p.tokens)) return 2;
    } else if (!strcmp(a, "--seq-len")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 4, 1 << 20, &p.seq_len)) return 2;
    } else if (!strcmp(a, "--heldout")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0.001, 0.9, &p.heldout)) return 2;
    } else if (!strcmp(a, "--window")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1 << 20, &p.window)) return 2;
    } else if (!strcmp(a, "--hidden")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 65536, &p.hidden)) return 2;
    } else if (!strcmp(a, "--smooth")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0, 1e4, &d)) return 2;
      p.smooth = (float)d;
    } else if (!strcmp(a, "--lr")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 1e-7, 10, &d)) return 2;
      p.lr = (float)d;
    } else if (!strcmp(a, "--wd")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 0, 10, &d)) return 2;
      p.wd = (float)d;
    } else if (!strcmp(a, "--batch")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1 << 20, &p.batch)) return 2;
    } else if (!strcmp(a, "--epochs")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1000000, &p.epochs)) return 2;
    } else if (!strcmp(a, "--seed")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, INT64_MAX, &x)) return 2;
      p.seed = (uint64_t)x;
    } else if (!strcmp(a, "--max-mem")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_f64(a, v, 1e-6, 1 << 20, &d)) return 2;
      p.max_mem = d * 1073741824.0;
    } else if (!strcmp(a, "--csv")) {
      if (!(csv = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--png")) {
      if (!(png = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--report")) {
      if (!(json = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, 1024, &x)) return 2;
      p.n_threads = (int)x;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("train-retain", "unknown flag '%s'", a);
    } else {
      return cli_usage_error("train-retain", "unexpected argument '%s' (the model goes after -m)", a);
    }
  }
  if (!model) return cli_usage_error("train-retain", "-m MODEL is required");
  if (!p.data) return cli_usage_error("train-retain", "--data TEXT is required (the text to train on)");
  if (!out) return cli_usage_error("train-retain", "-o FILE is required (where the heads go)");
  const char *outs[][2] = {{"-o", out}, {"--csv", csv}, {"--png", png}, {"--report", json}};
  for (int o = 0; o < 4; o++)
    if (cli_output_clash("train-retain", outs[o][0], outs[o][1], "-m", model) ||
        cli_output_clash("train-retain", outs[o][0], outs[o][1], "--data", p.data))
      return 2;
  mole_retain_report *r = NULL;
  mole_status st = mole_train_retain(model, out, &p, stderr, &r);
  if (st) return cli_error("train-retain", st);
  mole_retain_report_print(r, stdout);
  int rc = 0;
  if (json && (st = mole_retain_report_save(r, MOLE_REPORT_JSON, json))) rc = cli_error("train-retain", st);
  if (csv && (st = mole_retain_report_save(r, MOLE_REPORT_CSV, csv))) rc = cli_error("train-retain", st);
  if (png && (st = mole_retain_report_save(r, MOLE_REPORT_PNG, png))) {
    // the heads are trained and written: a missing plot is only a warning
    fprintf(stderr, "train-retain: warning: %s\n", mole_last_error());
  }
  mole_retain_report_free(r);
  return rc;
}
