/* The worker's checkpoints without sockets: a fake backend whose greedy
 * tokens are picked "on the device" (step_greedy), a fake clock and a send
 * callback that records. Checks the rule the broker relies on (a CHECKPOINT
 * covers only tokens already reported in replies before it, unsent ones
 * flushed as a PARTIAL), that a device-picked greedy loop's checkpoint
 * carries the current logits, GENERATE resume (continues at its index; an
 * already complete loop is answered at once) and the SIGTERM hand-over (a
 * checkpoint, no reply). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "support/fake_worker.h"
#include "worker/checkpoint.h"
#include "worker/scheduler.h"
#include "worker/state.h"

#define V 16

/* The fake backend with greedy picks "on the device" and checkpoints. */
static mbd_backend_ops g_ops;

/* A worker of 4 sessions with one model of vocab V, checkpointing every
 * ckpt_tokens tokens. */
static void init_worker(fw *x, int ckpt_tokens) {
  g_ops = fb_ops;
  g_ops.step_greedy = fb_step_greedy;
  g_ops.state_bytes = fb_state_bytes;
  g_ops.state_save = fb_state_save;
  mbd_worker_opts o;
  fw_opts(&o, 4, 4);
  o.checkpoint_tokens = ckpt_tokens;
  fw_init(x, &o, &g_ops, 10.0);
  fw_add_model(x, "m", V);
}

/* Token count of a PARTIAL/FINAL body. */
static int64_t ntokens(const mbd_msg *m) {
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  const msgpack_object *t = mbd_obj_get(mbd_body_root(body), "tokens");
  assert_non_null(t);
  int64_t n = t->via.array.size;
  mbd_body_destroy(&body);
  return n;
}

static void test_checkpoint_covers_reported_tokens(void **state) {
  (void)state;
  fw x;
  init_worker(&x, 4);
  fw_primed(&x, 3); /* 1 token consumed, not yet checkpointed (below the cadence) */
  mbd_wreq q = fw_generate_req(10, 3);
  mbd_wsession *s = mbd_wsession_at(x.st->sessions, 0);
  assert_int_equal(mbd_wsched_generate(x.st, s, 7, &q, NULL), 0);
  for (int i = 0; i < 12 && x.st->ngen; i++) mbd_wsched_tick(x.st);
  assert_int_equal(x.st->ngen, 0);
  int64_t reported = 1, nckpt = 0;
  for (int i = 0; i < x.nout; i++) {
    const mbd_msg *m = x.out[i];
    if (mbd_msg_cmd(m) == MBD_CMD_PARTIAL) reported += ntokens(m);
    if (mbd_msg_cmd(m) == MBD_CMD_FINAL) reported = 1 + ntokens(m);
    if (mbd_msg_cmd(m) != MBD_CMD_CHECKPOINT) continue;
    nckpt++;
    size_t len = 0;
    const uint8_t *blob = mbd_msg_payload(m, 0, &len);
    fb_state fs;
    memcpy(&fs, blob + 256, sizeof fs);
    /* The state covers exactly the tokens reported before it... */
    assert_int_equal(fs.n, reported);
    /* ...and its logits are the state's, though greedy picks stay on the device. */
    uint32_t flags;
    memcpy(&flags, blob + 12, 4);
    assert_int_equal(flags & 1, 1);
    float want[V];
    fb_logits(fs.h, V, want);
    assert_memory_equal(blob + 256 + sizeof fs, want, sizeof want);
  }
  /* 1 + 10 tokens, cadence 4: after tokens 4 and 8, and at the loop's end. */
  assert_int_equal(nckpt, 3);
  fw_fini(&x);
}

static void test_resume(void **state) {
  (void)state;
  fw x;
  init_worker(&x, 4);
  mbd_wsession *s = fw_primed(&x, 3);
  mbd_wreq q = fw_generate_req(5, 1);
  const int64_t done[3] = {9, 8, 7};
  assert_int_equal(mbd_wsched_generate_resume(x.st, s, 7, &q, done, 3, NULL), 0);
  for (int i = 0; i < 6 && x.st->ngen; i++) mbd_wsched_tick(x.st);
  int64_t partial = 0, final = -1;
  for (int i = 0; i < x.nout; i++) {
    if (mbd_msg_cmd(x.out[i]) == MBD_CMD_PARTIAL) partial += ntokens(x.out[i]);
    if (mbd_msg_cmd(x.out[i]) == MBD_CMD_FINAL) final = ntokens(x.out[i]);
  }
  assert_int_equal(partial, 1); /* only new tokens stream; the last comes in the FINAL */
  assert_int_equal(final, 5);   /* the FINAL lists all of them */
  fw_clear(&x);
  /* A loop that already reached max_tokens is answered at once, stepping nothing. */
  const int64_t all[5] = {1, 2, 3, 4, 5};
  assert_int_equal(mbd_wsched_generate_resume(x.st, s, 8, &q, all, 5, NULL), 0);
  assert_int_equal(x.st->ngen, 0);
  assert_int_equal(x.nout, 1);
  assert_int_equal(mbd_msg_cmd(x.out[0]), MBD_CMD_FINAL);
  assert_int_equal(ntokens(x.out[0]), 5);
  fw_fini(&x);
}

/* Whether the recorded replies hold an ERROR / a CHECKPOINT. */
static void kinds(fw *x, bool *error, bool *ckpt) {
  *error = *ckpt = false;
  for (int i = 0; i < x->nout; i++) {
    *error |= mbd_msg_cmd(x->out[i]) == MBD_CMD_ERROR;
    *ckpt |= mbd_msg_cmd(x->out[i]) == MBD_CMD_CHECKPOINT;
  }
}

static void test_sigterm_hand_over(void **state) {
  (void)state;
  fw x;
  init_worker(&x, 100);
  mbd_wsession *s = fw_primed(&x, 3);
  /* A loop whose logits are current (a sampled one) is handed over: a
   * checkpoint, no reply, the session free. */
  mbd_wreq q = fw_generate_req(50, 4);
  q.temperature = 0.5;
  assert_int_equal(mbd_wsched_generate(x.st, s, 8, &q, NULL), 0);
  mbd_wsched_tick(x.st);
  fw_clear(&x);
  mbd_wsched_stop_generates(x.st, "stopping");
  bool error, ckpt;
  kinds(&x, &error, &ckpt);
  assert_true(ckpt && !error);
  assert_int_equal(x.st->ngen, 0);
  assert_false(s->busy);
  fw_clear(&x);
  /* A greedy loop whose logits stayed on the device ends with its ERROR. */
  s = fw_primed(&x, 3);
  q.temperature = 0;
  assert_int_equal(mbd_wsched_generate(x.st, s, 9, &q, NULL), 0);
  mbd_wsched_tick(x.st);
  mbd_wsched_tick(x.st);
  fw_clear(&x);
  mbd_wsched_stop_generates(x.st, "stopping");
  kinds(&x, &error, &ckpt);
  assert_true(error);
  fw_fini(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checkpoint_covers_reported_tokens),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_sigterm_hand_over),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
