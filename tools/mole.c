// mole: the command-line tool. A thin layer over include/mole.h.
#include <stdio.h>
#include <string.h>

#include "mole.h"

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help")) {
    printf("usage: mole COMMAND [options]\n");
    return argc < 2 ? 2 : 0;
  }
  fprintf(stderr, "mole: unknown command '%s' (see mole --help)\n", argv[1]);
  return 2;
}
