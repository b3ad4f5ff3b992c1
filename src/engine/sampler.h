// engine/sampler: turns one row of logits into a token id, and watches the
// generated text for user stop strings.
//
// The chain is llama.cpp's default order (common/sampling.cpp):
//
//   penalties -> top_k -> top_p -> min_p -> temperature -> sample
//
// with llama.cpp's semantics for each stage (src/llama-sampling.cpp):
//   - penalties: over the last `repeat_last_n` accepted tokens, a token seen
//     c > 0 times gets logit /= repeat_penalty when the logit is > 0 and
//     logit *= repeat_penalty when it is <= 0, then
//     logit -= c * frequency_penalty + presence_penalty.
//     repeat_last_n == 0 turns all three penalties off.
//   - top_k: keep the k largest logits (k <= 0: off).
//   - top_p: softmax over what is left; keep the smallest prefix, in order of
//     decreasing probability, whose mass reaches p (the token that crosses p
//     is kept; p >= 1: off).
//   - min_p: keep tokens with probability >= p * (the largest probability),
//     i.e. logit >= max_logit + log(p), on the untempered logits (p <= 0: off).
//   - temperature: logits / T before the final softmax; T <= 0 is greedy:
//     the argmax of the penalised logits, ties to the lowest id (the other
//     filters never remove the argmax, so they are skipped).
//   - sample: one draw from softmax over the survivors.
//
// Logits that are NaN or -inf are never chosen; +inf counts as the largest
// finite float. If no logit is finite-or-+inf, sampler_sample returns 0.
//
// Memory: every buffer is allocated by sampler_init ([n_vocab] work arrays,
// [repeat_last_n] history); sampler_sample/sampler_accept allocate nothing.
// One sampler per sequence; not thread-safe.
#ifndef MOLE_ENGINE_SAMPLER_H
#define MOLE_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

// seed value asking for a seed taken from the clock (llama.cpp's default)
#define SAMPLER_SEED_RANDOM MOLE_SEED_RANDOM

// The public parameters (include/mole.h): temperature, top_k, top_p, min_p,
// repeat_penalty, repeat_last_n, presence/frequency_penalty, seed.
typedef mole_sampler_params sampler_params;

// llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05,
// repeat_penalty 1 (off), repeat_last_n 64, presence/frequency 0, random seed.
sampler_params sampler_params_default(void);

typedef struct sampler sampler;

// MOLE_ERR_ARG (message names the field) for n_vocab outside [1, INT32_MAX]
// or a parameter out of range (NaN, top_p/min_p outside [0,1], repeat_penalty
// <= 0, repeat_last_n < 0); MOLE_ERR_NOMEM if the buffers cannot be allocated.
mole_status sampler_init(const sampler_params *p, int64_t n_vocab, sampler **out);
void sampler_free(sampler *s);

// One token id in [0, n_vocab) from logits [n_vocab]. The logits are read,
// never written. Does not record the token: call sampler_accept with the
// token actually used (it may differ, e.g. a forced token).
int32_t sampler_sample(sampler *s, const float *logits);

// Appends a token to the penalty history (ids outside [0, n_vocab) are a
// broken invariant: MOLE_ASSERT). Feed prompt tokens too to penalise them.
void sampler_accept(sampler *s, int32_t token);

// Clears the history and restarts the random stream from the seed, so the
// same logits give the same tokens again.
void sampler_reset(sampler *s);

// The seed in use (the drawn one when SAMPLER_SEED_RANDOM was asked for).
uint64_t sampler_seed(const sampler *s);

// ---- stop strings -------------------------------------------------------
// Fed the generated text piece by piece, it says when any stop string has
// appeared (possibly split over pieces) and which bytes are safe to print:
// trailing bytes that may be the start of a stop string are held back until
// the next piece settles it, so a streaming printer never prints any part of
// a stop string. Text after a match is dropped.
//
//   stop_match r;
//   stop_matcher_feed(m, piece, n, &r);   // each generated piece
//   fwrite(r.emit, 1, r.n_emit, stdout);
//   if (r.matched) break;
//   ...
//   stop_matcher_flush(m, &r);            // end of generation: held bytes
//   fwrite(r.emit, 1, r.n_emit, stdout);
typedef struct stop_matcher stop_matcher;

typedef struct stop_match {
  bool matched;        // a stop string is complete (now or earlier)
  int32_t stop_index;  // which one (index into the init list), -1 when none
  const char *emit;    // bytes safe to print now; valid until the next call on the matcher
  size_t n_emit;
  size_t n_held;       // trailing bytes held back as a possible stop-string prefix
} stop_match;

// stops [n_stops] are copied. n_stops may be 0 (everything passes through);
// an empty or NULL stop string is MOLE_ERR_ARG.
mole_status stop_matcher_init(const char *const *stops, int64_t n_stops, stop_matcher **out);
void stop_matcher_free(stop_matcher *m);
void stop_matcher_reset(stop_matcher *m);

// Reserves room for pieces up to (longest stop + 256) bytes at init; a longer
// piece grows the buffer once (MOLE_ERR_NOMEM if that fails).
mole_status stop_matcher_feed(stop_matcher *m, const char *piece, size_t n, stop_match *out);

// End of the stream: releases the held bytes (none after a match).
void stop_matcher_flush(stop_matcher *m, stop_match *out);

#endif
