// mole synth: random-weight models in the exact layout of real architectures.
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "mole.h"

static const char *k_help =
    "usage: mole synth --arch ARCH [options] -o FILE\n"
    "Writes a GGUF model with random weights in the layout of a real architecture.\n"
    "  --arch A          mixtral|llama|qwen3moe|olmoe|qwen2moe (default: mixtral)\n"
    "  --embd N          embedding width (default: 1024)\n"
    "  --layers N        layers (default: 8)\n"
    "  --heads N         attention heads (default: embd/128)\n"
    "  --heads-kv N      KV heads (default: heads/4; olmoe: heads)\n"
    "  --experts N       experts per layer (default: 8; llama is dense)\n"
    "  --used N          experts used per token (default: 2)\n"
    "  --ff N            expert (or dense) FFN width (default: 3584)\n"
    "  --ff-shexp N      qwen2moe shared expert width (default: --ff)\n"
    "  --vocab N         vocabulary size of the made-up SPM vocab (default: 32000)\n"
    "  --vocab-from FILE copy the tokenizer.* fields (and vocab size) of another GGUF\n"
    "  --ctx N           context_length written (default: 4096)\n"
    "  --type T          weight type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k (default: q4_0)\n"
    "  --seed S          random seed (default: 42)\n"
    "  -t N              threads (default: all cores)\n"
    "  -o FILE           output (required)\n";

int cmd_synth(int argc, char **argv) {
  mole_synth_params p = mole_synth_default_params();
  const char *out = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t x;
    struct {
      const char *flag;
      int64_t *dst;
      int64_t lo, hi;
    } ints[] = {{"--embd", &p.n_embd, 1, 1 << 20},      {"--layers", &p.n_layer, 1, 4096},
                {"--heads", &p.n_head, 1, 4096},         {"--heads-kv", &p.n_head_kv, 1, 4096},
                {"--experts", &p.n_expert, 1, 4096},     {"--used", &p.n_expert_used, 1, 4096},
                {"--ff", &p.n_ff, 1, 1 << 22},           {"--ff-shexp", &p.n_ff_shexp, 1, 1 << 22},
                {"--vocab", &p.n_vocab, 260, 1 << 22},   {"--ctx", &p.n_ctx, 1, 1 << 24}};
    bool done = false;
    for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++) {
      if (strcmp(a, ints[k].flag)) continue;
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, ints[k].lo, ints[k].hi, ints[k].dst)) return 2;
      done = true;
    }
    if (done) continue;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(k_help, stdout);
      return 0;
    } else if (!strcmp(a, "--arch")) {
      if (!(p.arch = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--vocab-from")) {
      if (!(p.vocab_from = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--type")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if ((p.type = mole_type_from_name(v)) < 0) return cli_usage_error("synth", "--type: unknown type '%s'", v);
    } else if (!strcmp(a, "--seed")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 0, INT64_MAX, &x)) return 2;
      p.seed = (uint64_t)x;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      if (!(v = cli_value(argc, argv, &i)) || cli_parse_i64(a, v, 1, 1024, &x)) return 2;
      p.n_threads = (int)x;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else {
      return cli_usage_error("synth", "unknown flag '%s'", a);
    }
  }
  if (!out) return cli_usage_error("synth", "-o FILE is required");
  if (!strcmp(p.arch, "llama")) p.n_expert = 0;
  int64_t t0 = mole_time_us();
  uint64_t bytes = 0;
  mole_status st = mole_synth(&p, out, &bytes);
  if (st) return cli_error("synth", st);
  double s = (double)(mole_time_us() - t0) / 1e6;
  fprintf(stderr, "mole synth: wrote %s: %.1f MiB in %.2f s (%.2f GB/s)\n", out, (double)bytes / 1048576.0, s,
          (double)bytes / 1e9 / (s > 0 ? s : 1e-9));
  return 0;
}
