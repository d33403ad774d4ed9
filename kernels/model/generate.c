/* Generation loop (see generate.h). Buffers are allocated once per call. */
#include "kernels/model/generate.h"

#include <stdlib.h>
#include <string.h>

int mbd_mamba1_generate(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                        const int32_t *const *prompts, const int64_t *lens,
                        const mbd_generate_params *gp, int32_t *out, int64_t *counts,
                        mbd_error *err) {
  if (!m || !gp || batch < 0 || gp->n_new < 0 || (batch > 0 && (!out || !lens || !prompts)))
    return mbd_error_set(err, MBD_E_INVALID, "generate: bad arguments");
  for (int b = 0; b < batch; b++)
    if (lens[b] < 1)
      return mbd_error_set(err, MBD_E_INVALID, "generate: prompt %d is empty", b);
  int rc = mbd_sampling_check(&gp->sampling, err);
  if (rc || batch == 0 || gp->n_new == 0) {
    for (int b = 0; b < batch && counts; b++) counts[b] = 0;
    return rc;
  }
  int64_t V = mbd_mamba1_vocab(m), N = gp->n_new;
  float *logits = malloc((size_t)batch * (size_t)V * sizeof(float));
  mbd_mamba1_state **act = malloc((size_t)batch * sizeof(*act));
  int *who = malloc((size_t)batch * sizeof(int));
  int32_t *feed = malloc((size_t)batch * sizeof(int32_t));
  mbd_sampler *smp = NULL;
  if (!logits || !act || !who || !feed) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "generate: out of memory");
    goto fail;
  }
  if ((rc = mbd_sampler_new(V, &smp, err))) goto fail;
  for (int64_t i = 0; i < (int64_t)batch * N; i++) out[i] = -1;
  if (gp->first_logits) {
    for (int b = 0; b < batch; b++)
      memcpy(logits + (int64_t)b * V, gp->first_logits + (int64_t)b * gp->first_stride,
             (size_t)V * sizeof(float));
  } else if ((rc = mbd_mamba1_prefill(m, states, batch, prompts, lens, MBD_MAMBA1_LOGITS_LAST,
                                      logits, err))) {
    goto fail;
  }
  int nact = batch;
  for (int b = 0; b < batch; b++) who[b] = b;
  for (int64_t step = 0; step < N && nact > 0; step++) {
    int keep = 0;
    for (int i = 0; i < nact; i++) {
      int b = who[i];
      mbd_sampling sp = gp->sampling;
      if (gp->seeds) sp.seed = gp->seeds[b];
      int32_t tok;
      if ((rc = mbd_sampler_pick(smp, &sp, (uint64_t)step, logits + (int64_t)i * V, &tok, err)))
        goto fail;
      out[(int64_t)b * N + step] = tok;
      if (counts) counts[b] = step + 1;
      int stop = 0;
      for (int k = 0; k < gp->nstop; k++) stop |= gp->stop[k] == tok;
      if (!stop) {
        who[keep] = b;
        feed[keep] = tok;
        act[keep] = states[b];
        keep++;
      }
    }
    nact = keep;
    if (step + 1 < N && nact > 0 &&
        (rc = mbd_mamba1_step(m, act, nact, feed, logits, err)))
      goto fail;
  }
fail:
  mbd_sampler_destroy(&smp);
  free(feed);
  free(who);
  free(act);
  free(logits);
  return rc;
}
