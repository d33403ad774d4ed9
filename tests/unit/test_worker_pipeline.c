/* The scheduler with pipelined steps (st->pipeline: a batch's replies go out
 * after the next batch is launched) against the same scheduler finishing
 * every batch in its own tick: one workload, driven tick by tick the same
 * way, must send every request the same messages in the same order, byte
 * for byte. The fake backend picks greedy tokens "on the device", so rows
 * that need logits (STEPs, the sampled loop, loops ending) and rows that do
 * not share batches; batches hold 4 rows of 6 sessions (round-robin); one
 * loop passes its deadline, one is cancelled while its row is launched,
 * STEPs follow each other on one session, and one batched step fails while
 * the next batch (a STEP of another session in it) has been chosen. */
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
#include "worker/scheduler.h"
#include "worker/state.h"

#define V 16
#define NREC 1024
#define TICKS 40

/* One message sent, copied. */
typedef struct rec {
  uint64_t tag;
  uint8_t cmd;
  void *body, *pl; /* copies */
  size_t blen, plen;
} rec;

typedef struct run {
  rec r[NREC];
  int n;
  int launched_ticks; /* ticks that returned with a batch in flight */
  bool cancelled;     /* the cancel found its loop */
} run;

static void collect(fw *x, run *out) {
  for (int i = 0; i < x->nout; i++) {
    assert_true(out->n < NREC);
    rec *r = &out->r[out->n++];
    const mbd_msg *m = x->out[i];
    r->tag = mbd_msg_tag(m);
    r->cmd = mbd_msg_cmd(m);
    const void *b = mbd_msg_body(m, &r->blen);
    r->body = malloc(r->blen + 1);
    memcpy(r->body, b, r->blen);
    r->plen = 0;
    r->pl = NULL;
    if (mbd_msg_npayloads(m)) {
      const void *p = mbd_msg_payload(m, 0, &r->plen);
      r->pl = malloc(r->plen + 1);
      memcpy(r->pl, p, r->plen);
    }
  }
  fw_clear(x);
}

/* As the STEP handler does: a session of the launched batch is finished first. */
static void step_on(fw *x, mbd_wsession *s, uint64_t tag, int64_t tok) {
  if (((mbd_wsess_data *)s->user)->inflight) mbd_wsched_flush(x->st);
  mbd_error err = {0};
  assert_int_equal(mbd_wsched_step(x->st, s, tag, tok, NULL, &err), 0);
}

static void workload(bool pipeline, run *out) {
  static mbd_backend_ops ops;
  ops = fb_ops;
  ops.step_greedy = fb_step_greedy;
  mbd_worker_opts o;
  fw_opts(&o, 8, 4);
  fw x;
  fw_init(&x, &o, &ops, 100.0);
  fw_add_model(&x, "m0", V);
  mbd_wsession *s[7];
  for (int i = 0; i < 7; i++) s[i] = fw_primed(&x, i + 1);
  x.st->pipeline = pipeline;
  x.fb->fail_call = x.fb->ncalls + 9; /* 3 rows; the next batch, chosen meanwhile, has a STEP */
  struct {
    int64_t max, every;
    double temp;
    int64_t deadline_ms;
  } g[5] = {{9, 2, 0, 0}, {5, 1, 0, 0}, {7, 3, 0.9, 0}, {12, 4, 0, 1000}, {30, 1, 0, 0}};
  for (int i = 0; i < 5; i++) {
    mbd_wreq q = fw_generate_req(g[i].max, g[i].every);
    q.temperature = g[i].temp;
    q.seed = 5;
    q.deadline_ms = g[i].deadline_ms;
    if (i == 1) { /* ends with "stop" at its third token */
      q.stop[0] = 0;
      q.nstop = 1;
    }
    mbd_error err = {0};
    assert_int_equal(mbd_wsched_generate(x.st, s[i], 10 + (uint64_t)i, &q, &err), 0);
  }
  for (int t = 0; t < TICKS; t++) {
    if (t == 4) x.now += 2.0; /* loop 3 passes its deadline */
    if (t == 6) out->cancelled = mbd_wsched_cancel(x.st, 14, MBD_E_CANCELLED, "cancelled");
    if (t < 8) step_on(&x, s[5], 100 + (uint64_t)t, (t * 5 + 2) % V);
    if (t >= 8 && t < 16 && t % 2 == 0) step_on(&x, s[6], 200 + (uint64_t)t, t % V);
    mbd_wsched_tick(x.st);
    out->launched_ticks += x.st->fly != NULL;
    collect(&x, out);
  }
  mbd_wsched_flush(x.st);
  collect(&x, out);
  assert_false(mbd_wsched_pending(x.st));
  for (int i = 0; i < 7; i++) assert_false(s[i]->busy);
  fw_fini(&x);
}

static void free_run(run *r) {
  for (int i = 0; i < r->n; i++) {
    free(r->r[i].body);
    free(r->r[i].pl);
  }
}

/* The k-th message of `tag` in r, or NULL. */
static const rec *nth(const run *r, uint64_t tag, int k) {
  for (int i = 0; i < r->n; i++)
    if (r->r[i].tag == tag && k-- == 0) return &r->r[i];
  return NULL;
}

static void test_pipelined_equals_synchronous(void **state) {
  (void)state;
  static run sync_run, pipe_run;
  memset(&sync_run, 0, sizeof sync_run);
  memset(&pipe_run, 0, sizeof pipe_run);
  workload(false, &sync_run);
  workload(true, &pipe_run);
  assert_int_equal(sync_run.launched_ticks, 0);
  assert_true(pipe_run.launched_ticks > 10); /* the overlap really happened */
  assert_int_equal(pipe_run.n, sync_run.n);
  assert_true(pipe_run.cancelled == sync_run.cancelled);
  uint64_t tags[17] = {10, 11, 12, 13, 14};
  for (int t = 0; t < 8; t++) tags[5 + t] = 100 + (uint64_t)t;
  for (int t = 0; t < 4; t++) tags[13 + t] = 208 + 2 * (uint64_t)t;
  int finals = 0;
  for (int k = 0; k < 17; k++) {
    int c = 0;
    for (const rec *a; (a = nth(&sync_run, tags[k], c)); c++) {
      const rec *b = nth(&pipe_run, tags[k], c);
      assert_non_null(b);
      assert_int_equal(b->cmd, a->cmd);
      assert_int_equal(b->blen, a->blen);
      assert_memory_equal(b->body, a->body, a->blen);
      assert_int_equal(b->plen, a->plen);
      if (a->plen) assert_memory_equal(b->pl, a->pl, a->plen);
      finals += a->cmd != MBD_CMD_PARTIAL;
    }
    assert_null(nth(&pipe_run, tags[k], c));
    assert_true(c > 0);
  }
  assert_int_equal(finals, 17); /* every request ended once */
  /* The workload covers what it says: FINALs and ERRORs (the failed batch,
   * the deadline, the cancel). */
  int errors = 0, finals_ok = 0;
  for (int k = 0; k < 5; k++) {
    const rec *last = NULL;
    for (int c = 0; nth(&sync_run, tags[k], c); c++) last = nth(&sync_run, tags[k], c);
    errors += last->cmd == MBD_CMD_ERROR;
    finals_ok += last->cmd == MBD_CMD_FINAL;
  }
  assert_true(errors >= 2 && finals_ok >= 1);
  free_run(&sync_run);
  free_run(&pipe_run);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_pipelined_equals_synchronous)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
