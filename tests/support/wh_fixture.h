/* The tiny-d64 fixture as the worker tests use it: the expected inputs and
 * greedy continuations of expected.safetensors, and the CPU model loaded in
 * process as the reference the served replies are compared with. */
#ifndef MBD_TEST_WH_FIXTURE_H
#define MBD_TEST_WH_FIXTURE_H

#include <stdint.h>

#include "common/safetensors.h"
#include "kernels/model/mamba1.h"
#include "support/worker_harness.h"

typedef struct wh_fixture {
  mbd_safetensors *st;
  const int64_t *ids;      /* [B,T] */
  const int64_t *greedy;   /* [B,T+G] */
  int64_t B, T, G, V;      /* batch, prompt length, generated length, vocabulary */
  mbd_mamba1_model *model; /* in-process reference, f32 */
} wh_fixture;

/* Loads h->model_dir's fixture and model; 0 or -1 with a printed reason. */
int wh_fixture_load(const wh *h, wh_fixture *f);

/* Frees what wh_fixture_load loaded (also after a failed load). */
void wh_fixture_free(wh_fixture *f);

/* In-process reference: feeds ids[T] to state s; logits out [T,V]. */
void wh_ref_prefill(wh_fixture *f, mbd_mamba1_state *s, const int64_t *ids, int64_t T,
                    float *logits);

#endif
