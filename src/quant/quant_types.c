// The block geometry of every ggml/GGUF tensor type id, known or not
// supported: the GGUF reader validates sizes with it even for types the
// engine cannot compute with.
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "quant/quant_types.h"

typedef struct {
  const char *name;
  int64_t blck;
  size_t size;
} type_geom;

static const type_geom k_geom[QT_COUNT] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},        [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},     [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},     [10] = {"q2_k", 256, 84},
    [11] = {"q3_k", 256, 110},   [12] = {"q4_k", 256, 144},  [13] = {"q5_k", 256, 176},
    [14] = {"q6_k", 256, 210},   [15] = {"q8_k", 256, 292},  [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110}, [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},        [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},       [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},      [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
};

// mole's own blob types (quant_tq.h): named, but unknown to GGUF files
static const char *blob_name(uint32_t t) { return t == QT_TQ1 ? "tq1_dict" : t == QT_TQ2 ? "tq2_row" : NULL; }

bool quant_type_known(uint32_t t) { return t < QT_COUNT && k_geom[t].name != NULL; }

int64_t quant_blck_size(uint32_t t) { return quant_type_known(t) ? k_geom[t].blck : 0; }

size_t quant_type_size(uint32_t t) { return quant_type_known(t) ? k_geom[t].size : 0; }

const char *quant_type_name(uint32_t t) {
  static _Thread_local char buf[32];
  if (quant_type_known(t)) return k_geom[t].name;
  if (blob_name(t)) return blob_name(t);
  snprintf(buf, sizeof buf, "type#%u", t);
  return buf;
}

int quant_type_from_name(const char *name) {
  for (int t = 0; t < QT_COUNT; t++)
    if (k_geom[t].name && strcasecmp(k_geom[t].name, name) == 0) return t;
  return -1;
}

size_t quant_row_size(quant_type t, int64_t n) {
  if (!quant_type_known(t) || n < 0 || n % k_geom[t].blck != 0) return 0;
  return (size_t)(n / k_geom[t].blck) * k_geom[t].size;
}
