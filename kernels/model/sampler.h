/* Token selection from logits: greedy, or seeded sampling with temperature,
 * top-k and top-p. The random draw for generated token number `step` of a
 * sequence is a pure function of (seed, step) (splitmix64 counter mode), so a
 * sequence samples the same tokens alone or in any batch. */
#ifndef MBD_SAMPLER_H
#define MBD_SAMPLER_H

#include <stdint.h>

#include "common/status.h"

typedef struct mbd_sampling {
  float temperature; /* <= 0: greedy */
  int top_k;         /* keep the k largest logits; <= 0: all */
  float top_p;       /* keep the smallest top set with mass >= top_p; >= 1: all */
  uint64_t seed;     /* PRNG key */
} mbd_sampling;

/* Greedy settings (temperature 0). */
void mbd_sampling_greedy(mbd_sampling *s);
/* MBD_E_INVALID for NaN/negative/infinite temperature, top_p <= 0 or NaN. */
int mbd_sampling_check(const mbd_sampling *s, mbd_error *err);

/* Index of the largest logit, lowest index on ties (NaN never wins). */
int32_t mbd_sampler_argmax(const float *logits, int64_t V);

/* Uniform double in [0, 1) for (seed, step): 53 random bits. */
double mbd_sampler_uniform(uint64_t seed, uint64_t step);

/* Holds scratch for a vocabulary size, allocated once. */
typedef struct mbd_sampler mbd_sampler;
int mbd_sampler_new(int64_t vocab, mbd_sampler **out, mbd_error *err);
void mbd_sampler_destroy(mbd_sampler **s);
/* Picks a token from logits[vocab] for generated token number `step`.
 * Candidates are ordered by (logit desc, index asc); probabilities
 * exp((l - max) / T) are computed in double. */
int mbd_sampler_pick(mbd_sampler *s, const mbd_sampling *p, uint64_t step, const float *logits,
                     int32_t *out, mbd_error *err);

#endif
