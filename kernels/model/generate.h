/* Generation loop on a Mamba-1 model: prefill the prompts, then pick and feed
 * one token per sequence per step until n_new tokens or a stop token. */
#ifndef MBD_GENERATE_H
#define MBD_GENERATE_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/model/mamba1.h"
#include "kernels/model/sampler.h"

typedef struct mbd_generate_params {
  int64_t n_new;            /* tokens to generate per sequence */
  mbd_sampling sampling;    /* greedy when temperature <= 0 */
  const uint64_t *seeds;    /* per-sequence seeds, or NULL: sampling.seed for all */
  const int32_t *stop;      /* stop tokens (included in the output), may be NULL */
  int nstop;
  /* When non-NULL the prompts were already fed (states are past them) and row
   * b's next-token logits are first_logits[b * first_stride .. + V); prompts
   * and lens are then only checked, not fed again. */
  const float *first_logits;
  int64_t first_stride;
} mbd_generate_params;

/* Continues each states[b] with prompt b (lens[b] >= 1 tokens) and writes up to
 * n_new tokens into out[b * n_new ...]; after a stop token the rest of the row
 * is -1 and counts[b] (may be NULL) says how many were generated. Sequences
 * that finish leave the batch; the others' bits do not change (batch
 * invariance). The states end after the last fed token (the final generated
 * token is not fed). */
int mbd_mamba1_generate(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                        const int32_t *const *prompts, const int64_t *lens,
                        const mbd_generate_params *gp, int32_t *out, int64_t *counts,
                        mbd_error *err);

#endif
