#include "sampling_flags.h"

#include <string.h>

#include "common.h"

int cli_sampling_flag(int argc, char **argv, int *i, mole_sampler_params *p) {
  const char *a = argv[*i], *v;
  double d;
  int64_t x;
  struct {
    const char *flag;
    float *dst;
    double lo, hi;
  } fl[] = {{"--temp", &p->temperature, 0, 100},         {"--top-p", &p->top_p, 0, 1},
            {"--min-p", &p->min_p, 0, 1},                {"--repeat-penalty", &p->repeat_penalty, 1e-6, 100},
            {"--presence-penalty", &p->presence_penalty, -100, 100},
            {"--frequency-penalty", &p->frequency_penalty, -100, 100}};
  for (size_t k = 0; k < sizeof fl / sizeof fl[0]; k++) {
    if (strcmp(a, fl[k].flag)) continue;
    if (!(v = cli_value(argc, argv, i)) || cli_parse_f64(a, v, fl[k].lo, fl[k].hi, &d)) return -1;
    *fl[k].dst = (float)d;
    return 1;
  }
  if (!strcmp(a, "--top-k")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, INT32_MAX, &x)) return -1;
    p->top_k = (int32_t)x;
    return 1;
  }
  if (!strcmp(a, "--repeat-last-n")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, INT32_MAX, &x)) return -1;
    p->repeat_last_n = (int32_t)x;
    return 1;
  }
  if (!strcmp(a, "--seed")) {
    if (!(v = cli_value(argc, argv, i)) || cli_parse_i64(a, v, 0, INT64_MAX, &x)) return -1;
    p->seed = (uint64_t)x;
    return 1;
  }
  return 0;
}
