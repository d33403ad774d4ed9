/* A worker state without sockets for the worker's unit tests: the fake
 * backend (fake_backend.h) under mbd_wstate, a fake clock the test moves,
 * and a send callback that records every reply. */
#ifndef MBD_TEST_FAKE_WORKER_H
#define MBD_TEST_FAKE_WORKER_H

#include <stdint.h>

#include "common/protocol.h"
#include "support/fake_backend.h"
#include "worker/request.h"
#include "worker/state.h"

#define FW_OUT_MAX 256 /* replies recorded between two fw_clear */

typedef struct fw {
  double now;               /* the fake clock (seconds) */
  mbd_msg *out[FW_OUT_MAX]; /* replies sent, in order */
  int nout;                 /* entries of out in use */
  fb_backend *fb;           /* the fake backend's data, owned by st's backend */
  mbd_wstate *st;
} fw;

/* Zeroed options of worker "w-test" with `sessions` slots (capacity and
 * sessions), batches of max_batch rows and 1 MiB messages. */
void fw_opts(mbd_worker_opts *o, int sessions, int max_batch);

/* A state over a fake backend with ops (fb_ops or a copy), the clock at now,
 * no models yet. */
void fw_init(fw *x, const mbd_worker_opts *o, const mbd_backend_ops *ops, double now);

/* Adds a fake model `name` of the given vocabulary. */
void fw_add_model(fw *x, const char *name, int64_t vocab);

/* Destroys the recorded replies. */
void fw_clear(fw *x);

/* fw_clear, and destroys the state with its backend. */
void fw_fini(fw *x);

/* A new session of model 0 that consumed tok in a STEP (tag 1) of its own,
 * so it has logits to GENERATE from; the STEP's reply is cleared. */
mbd_wsession *fw_primed(fw *x, int64_t tok);

/* A GENERATE request: greedy, max_tokens, a PARTIAL every partial_every tokens. */
mbd_wreq fw_generate_req(int64_t max_tokens, int64_t partial_every);

#endif
