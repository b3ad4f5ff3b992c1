// gguf: GGUF v2/v3 reader (mmap, every field validated) and writer.
#ifndef MOLE_GGUF_H
#define MOLE_GGUF_H

#include <stdio.h>

#include "base/base.h"

typedef enum {
  GGUF_T_UINT8 = 0,
  GGUF_T_INT8 = 1,
  GGUF_T_UINT16 = 2,
  GGUF_T_INT16 = 3,
  GGUF_T_UINT32 = 4,
  GGUF_T_INT32 = 5,
  GGUF_T_FLOAT32 = 6,
  GGUF_T_BOOL = 7,
  GGUF_T_STRING = 8,
  GGUF_T_ARRAY = 9,
  GGUF_T_UINT64 = 10,
  GGUF_T_INT64 = 11,
  GGUF_T_FLOAT64 = 12,
  GGUF_T_COUNT
} gguf_type;

enum { GGUF_MAX_DIMS = 4, GGUF_DEFAULT_ALIGNMENT = 32 };

const char *gguf_type_name(gguf_type t);  // "u32", "string", ...; "invalid" out of range
size_t gguf_type_size(gguf_type t);       // bytes of one numeric/bool element; 0 for string/array

typedef struct gguf_tensor {
  const char *name;        // nul-terminated
  uint32_t n_dims;         // 1..4
  int64_t ne[GGUF_MAX_DIMS];  // ne[0] is the row length (contiguous); unused dims are 1
  uint32_t type;           // quant_type id
  uint64_t offset;         // from the start of the data section
  size_t size;             // bytes
  const void *data;        // into the mapping
} gguf_tensor;

typedef struct gguf_file gguf_file;

// Maps and validates `path`. On failure the message names the file, the
// field and its byte offset.
mole_status gguf_open(const char *path, gguf_file **out);
// Same, over a caller's buffer (fuzzing, tests); buf must outlive the file.
mole_status gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file **out);
void gguf_close(gguf_file *f);

const char *gguf_path(const gguf_file *f);
uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f);  // start of the tensor data section
const void *gguf_base(const gguf_file *f);       // whole mapping
size_t gguf_size(const gguf_file *f);

// metadata
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_kv(const gguf_file *f, const char *key);  // -1 if absent
const char *gguf_kv_key(const gguf_file *f, int64_t i);
gguf_type gguf_kv_type(const gguf_file *f, int64_t i);
gguf_type gguf_kv_arr_type(const gguf_file *f, int64_t i);  // element type of an ARRAY
uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i);     // elements of an ARRAY (1 otherwise)
// Raw elements of a numeric/bool array (or the scalar itself); little endian.
const void *gguf_kv_data(const gguf_file *f, int64_t i);
// String value (or element j of a string array); *len gets the byte length.
// The returned pointer is nul-terminated.
const char *gguf_kv_str(const gguf_file *f, int64_t i, uint64_t j, uint64_t *len);

// Typed getters: MOLE_ERR_NOT_FOUND when the key is absent (message set),
// MOLE_ERR_FORMAT when it has an incompatible type. Integers of any width
// convert to int64/uint; floats of either width to double.
mole_status gguf_get_int(const gguf_file *f, const char *key, int64_t *out);
mole_status gguf_get_float(const gguf_file *f, const char *key, double *out);
mole_status gguf_get_bool(const gguf_file *f, const char *key, bool *out);
mole_status gguf_get_str(const gguf_file *f, const char *key, const char **out);
// Element i of an integer array key (per-layer hparams), any int width.
mole_status gguf_get_arr_int(const gguf_file *f, const char *key, uint64_t i, int64_t *out);

// tensors
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);  // NULL if absent

// ---- writer ---------------------------------------------------------------
// Build metadata and tensor infos, then write the header and stream each
// tensor's data in the order added (data may be produced chunk by chunk).
typedef struct gguf_writer gguf_writer;

mole_status gguf_writer_new(gguf_writer **out);
void gguf_writer_free(gguf_writer *w);
void gguf_writer_set_alignment(gguf_writer *w, uint64_t align);  // default 32
mole_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
mole_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
mole_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
mole_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
mole_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
mole_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
// Numeric/bool array of n elements of elem_type (copied).
mole_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type, const void *data, uint64_t n);
mole_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
// Copies key i of src (any type, arrays included).
mole_status gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i);
// Adds a tensor info; returns its index via *idx (optional). Offsets are
// assigned in order with the alignment padding.
mole_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                   const int64_t *ne, int64_t *idx);
// Writes magic, version 3, metadata and tensor infos, and pads to the data section.
mole_status gguf_writer_begin(gguf_writer *w, const char *path);
// Appends bytes of the current tensor; moves to the next tensor (with
// padding) once its size is complete. Sizes must add up exactly.
mole_status gguf_writer_write(gguf_writer *w, const void *data, size_t n);
// Checks every tensor was written in full, flushes and closes.
mole_status gguf_writer_finish(gguf_writer *w);

#endif
