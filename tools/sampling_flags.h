// Sampling flags shared by run and chat.
#ifndef MOLE_CLI_SAMPLING_FLAGS_H
#define MOLE_CLI_SAMPLING_FLAGS_H

#include "mole.h"

#define CLI_SAMPLING_HELP                                                               \
  "      --temp T             temperature, 0 = greedy (default: 0.8)\n"                 \
  "      --top-k N            keep the N most likely tokens, 0 = off (default: 40)\n"   \
  "      --top-p P            nucleus sampling, 1 = off (default: 0.95)\n"              \
  "      --min-p P            drop tokens below P x the top probability (default: 0.05)\n" \
  "      --repeat-penalty R   penalise repeated tokens, 1 = off (default: 1.0)\n"       \
  "      --repeat-last-n N    window of the penalties (default: 64)\n"                  \
  "      --presence-penalty P (default: 0)\n"                                           \
  "      --frequency-penalty P (default: 0)\n"                                          \
  "      --seed S             random seed (default: from the clock)\n"

// Consumes a sampling flag: 1 consumed, 0 not one, -1 error printed.
int cli_sampling_flag(int argc, char **argv, int *i, mole_sampler_params *p);

#endif
