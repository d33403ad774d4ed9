/* A worker state without sockets over the fake backend (see fake_worker.h). */
#include "support/fake_worker.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "worker/scheduler.h"

static double fw_now(void *ctx) { return ((fw *)ctx)->now; }

static void fw_send(void *ctx, mbd_msg **m) {
  fw *x = ctx;
  assert_true(x->nout < FW_OUT_MAX);
  x->out[x->nout++] = *m;
  *m = NULL;
}

void fw_opts(mbd_worker_opts *o, int sessions, int max_batch) {
  memset(o, 0, sizeof *o);
  snprintf(o->name, sizeof o->name, "w-test");
  o->capacity = sessions;
  o->sessions = sessions;
  o->max_batch = max_batch;
  o->max_message_bytes = (size_t)1 << 20;
}

void fw_init(fw *x, const mbd_worker_opts *o, const mbd_backend_ops *ops, double now) {
  memset(x, 0, sizeof *x);
  x->now = now;
  mbd_backend *be = fb_backend_new(ops, &x->fb);
  mbd_error err = {0};
  assert_int_equal(mbd_wstate_new(o, &be, fw_now, x, fw_send, x, &x->st, &err), 0);
  assert_null(be);
}

void fw_add_model(fw *x, const char *name, int64_t vocab) {
  mbd_error err = {0};
  assert_int_equal(mbd_wstate_add_model(x->st, name, "00", "", fb_model_new(vocab), &err), 0);
}

void fw_clear(fw *x) {
  for (int i = 0; i < x->nout; i++) mbd_msg_destroy(&x->out[i]);
  x->nout = 0;
}

void fw_fini(fw *x) {
  fw_clear(x);
  mbd_wstate_destroy(&x->st); /* frees x->fb with the backend */
}

mbd_wsession *fw_primed(fw *x, int64_t tok) {
  mbd_wsession *s = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_wstate_session_new(x->st, 0, &s, &err), 0);
  assert_int_equal(mbd_wsched_step(x->st, s, 1, tok, NULL, &err), 0);
  mbd_wsched_tick(x->st);
  fw_clear(x);
  return s;
}

mbd_wreq fw_generate_req(int64_t max_tokens, int64_t partial_every) {
  mbd_wreq q;
  memset(&q, 0, sizeof q);
  q.cmd = MBD_CMD_GENERATE;
  q.max_tokens = max_tokens;
  q.top_p = 1.0;
  q.partial_every = partial_every;
  return q;
}
