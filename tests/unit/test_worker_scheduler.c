/* The worker's batching scheduler without sockets: the fake backend of
 * tests/support (deterministic fake logits and a log of every batched
 * step), a fake clock, and a send callback that records every reply. Covers which sessions' steps share a batch and in what row
 * order, each STEP getting its own row's logits, a GENERATE loop's end
 * reasons (length, stop, deadline, backend error), device-picked greedy
 * tokens, idle expiry, and a backend failure mid-batch. */
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

/* ---- fixture: the fake worker (tests/support/fake_worker.h) ---------------- */

#define FAKE_V 16 /* vocab of model 0 */
#define FAKE_V1 8 /* vocab of model 1 */

/* A state of 8 sessions with models of vocab FAKE_V and (nmodels 2) FAKE_V1. */
static void fx_init(fw *x, const mbd_backend_ops *ops, int max_batch, int nmodels,
                    double idle_s) {
  mbd_worker_opts o;
  fw_opts(&o, 8, max_batch);
  o.session_idle_s = idle_s;
  fw_init(x, &o, ops, 100.0);
  for (int i = 0; i < nmodels; i++) {
    char name[16];
    snprintf(name, sizeof name, "m%d", i);
    fw_add_model(x, name, i == 0 ? FAKE_V : FAKE_V1);
  }
}

static mbd_wsession *open_session(fw *x, int model) {
  mbd_wsession *s = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_wstate_session_new(x->st, model, &s, &err), 0);
  return s;
}

static void step(fw *x, mbd_wsession *s, uint64_t tag, int64_t tok) {
  mbd_error err = {0};
  assert_int_equal(mbd_wsched_step(x->st, s, tag, tok, NULL, &err), 0);
}

static void generate(fw *x, mbd_wsession *s, uint64_t tag, const mbd_wreq *q) {
  mbd_error err = {0};
  assert_int_equal(mbd_wsched_generate(x->st, s, tag, q, &err), 0);
}

/* The recorded reply with this tag and cmd (the k-th such, 0-based), or NULL. */
static mbd_msg *reply(fw *x, uint64_t tag, uint8_t cmd, int k) {
  for (int i = 0; i < x->nout; i++)
    if (mbd_msg_tag(x->out[i]) == tag && mbd_msg_cmd(x->out[i]) == cmd && k-- == 0)
      return x->out[i];
  return NULL;
}

static int count_tag(fw *x, uint64_t tag) {
  int n = 0;
  for (int i = 0; i < x->nout; i++) n += mbd_msg_tag(x->out[i]) == tag;
  return n;
}

static mbd_body *body_of(const mbd_msg *m) {
  size_t len = 0;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_body_parse(b, len, &body, &err), 0);
  return body;
}

/* ERROR's code. */
static int64_t error_code(const mbd_msg *m) {
  assert_non_null(m);
  mbd_body *b = body_of(m);
  int64_t code = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_obj_i64(mbd_body_root(b), "code", true, &code, &err), 0);
  mbd_body_destroy(&b);
  return code;
}

/* A STEP's FINAL carries its [V] logits in payload frame 0: equal to what a
 * lone step of a state with hash h gives? */
static void assert_step_logits(const mbd_msg *m, uint64_t h, int64_t V) {
  assert_non_null(m);
  assert_int_equal(mbd_msg_npayloads(m), 1);
  size_t len = 0;
  const void *p = mbd_msg_payload(m, 0, &len);
  assert_int_equal(len, (size_t)V * sizeof(float));
  float want[FAKE_V];
  fb_logits(h, V, want);
  assert_memory_equal(p, want, len);
}

/* A FINAL or PARTIAL's tokens into out (at most cap); returns the count. */
static size_t tokens_of(const mbd_msg *m, int64_t *out, size_t cap) {
  assert_non_null(m);
  mbd_body *b = body_of(m);
  size_t n = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_obj_i64_array(mbd_body_root(b), "tokens", true, out, cap, &n, &err), 0);
  mbd_body_destroy(&b);
  return n;
}

static void assert_final(const mbd_msg *m, const char *reason, int64_t peak_batch) {
  assert_non_null(m);
  mbd_body *b = body_of(m);
  char r[32] = "";
  int64_t peak = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "reason", true, r, sizeof r, &err), 0);
  assert_int_equal(mbd_obj_i64(mbd_body_root(b), "peak_batch", true, &peak, &err), 0);
  assert_string_equal(r, reason);
  assert_int_equal(peak, peak_batch);
  mbd_body_destroy(&b);
}

/* The greedy tokens a session with hash h produces: each is the argmax of
 * the current logits, then fed. */
static void greedy_seq(uint64_t h, int64_t V, int64_t *out, int n) {
  for (int i = 0; i < n; i++) {
    out[i] = (int64_t)(h % (uint64_t)V);
    h = fb_mix(h, out[i]);
  }
}

static void assert_call(const fb_call *c, int model, int64_t n, const int *ids,
                        const int64_t *tokens) {
  assert_int_equal(c->model, model);
  assert_int_equal(c->n, n);
  for (int64_t i = 0; i < n; i++) {
    assert_int_equal(c->ids[i], ids[i]);
    assert_int_equal(c->tokens[i], tokens[i]);
  }
}

/* ---- tests -------------------------------------------------------------------- */

/* STEPs of one model share a batch in arrival order, one per session per
 * tick; another model's STEPs get their own call; each reply is its own
 * row's logits. */
static void test_step_batching(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 8, 2, 0);
  mbd_wsession *s0 = open_session(&x, 0), *s1 = open_session(&x, 0), *s2 = open_session(&x, 0);
  mbd_wsession *s3 = open_session(&x, 1);
  step(&x, s1, 11, 3);
  step(&x, s0, 12, 5);
  step(&x, s1, 13, 7); /* s1's second step waits for the next tick */
  step(&x, s3, 14, 2);
  step(&x, s2, 15, 1);
  assert_true(mbd_wsched_tick(x.st)); /* s1's second step is still queued */
  assert_int_equal(x.fb->ncalls, 2);
  assert_call(&x.fb->log[0], FAKE_V, 3, (int[]){1, 0, 2}, (int64_t[]){3, 5, 1});
  assert_call(&x.fb->log[1], FAKE_V1, 1, (int[]){3}, (int64_t[]){2});
  assert_int_equal(x.nout, 4);
  assert_step_logits(reply(&x, 11, MBD_CMD_FINAL, 0), fb_mix(0, 3), FAKE_V);
  assert_step_logits(reply(&x, 12, MBD_CMD_FINAL, 0), fb_mix(0, 5), FAKE_V);
  assert_step_logits(reply(&x, 15, MBD_CMD_FINAL, 0), fb_mix(0, 1), FAKE_V);
  assert_step_logits(reply(&x, 14, MBD_CMD_FINAL, 0), fb_mix(0, 2), FAKE_V1);
  assert_null(reply(&x, 13, MBD_CMD_FINAL, 0));
  fw_clear(&x);
  assert_false(mbd_wsched_tick(x.st));
  assert_int_equal(x.fb->ncalls, 3);
  assert_call(&x.fb->log[2], FAKE_V, 1, (int[]){1}, (int64_t[]){7});
  assert_step_logits(reply(&x, 13, MBD_CMD_FINAL, 0), fb_mix(fb_mix(0, 3), 7), FAKE_V);
  fw_clear(&x);
  /* Nothing queued: no backend call. */
  assert_false(mbd_wsched_tick(x.st));
  assert_int_equal(x.fb->ncalls, 3);
  fw_fini(&x);
}

/* GENERATE rows come first, in slot order from the round-robin start (one
 * slot further each tick), then queued STEPs; over max_batch the rest wait. */
static void test_generate_rows_first(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 3, 1, 0);
  mbd_wsession *s[4];
  for (int i = 0; i < 4; i++) s[i] = open_session(&x, 0);
  for (int i = 0; i < 3; i++) step(&x, s[i], (uint64_t)(1 + i), i); /* logits for GENERATE */
  mbd_wsched_tick(x.st); /* call 0: rows s0 s1 s2; rr is now 1 */
  step(&x, s[3], 4, 3);
  mbd_wsched_tick(x.st); /* call 1: s3; rr is now 2 */
  fw_clear(&x);
  mbd_wreq q = fw_generate_req(100, 1);
  generate(&x, s[0], 20, &q);
  generate(&x, s[2], 22, &q);
  step(&x, s[1], 31, 9);
  step(&x, s[3], 33, 8); /* over max_batch 3: waits */
  mbd_wsched_tick(x.st); /* rr 2: slots 2, 3, 0, 1 -> gen s2, gen s0, step s1 */
  int64_t t0[1], t2[1];
  greedy_seq(fb_mix(0, 0), FAKE_V, t0, 1);
  greedy_seq(fb_mix(0, 2), FAKE_V, t2, 1);
  assert_int_equal(x.fb->ncalls, 3);
  assert_call(&x.fb->log[2], FAKE_V, 3, (int[]){2, 0, 1}, (int64_t[]){t2[0], t0[0], 9});
  assert_step_logits(reply(&x, 31, MBD_CMD_FINAL, 0), fb_mix(fb_mix(0, 1), 9), FAKE_V);
  assert_null(reply(&x, 33, MBD_CMD_FINAL, 0));
  /* Each GENERATE streamed its own first token. */
  int64_t got[4];
  assert_int_equal(tokens_of(reply(&x, 20, MBD_CMD_PARTIAL, 0), got, 4), 1);
  assert_int_equal(got[0], t0[0]);
  assert_int_equal(tokens_of(reply(&x, 22, MBD_CMD_PARTIAL, 0), got, 4), 1);
  assert_int_equal(got[0], t2[0]);
  fw_clear(&x);
  mbd_wsched_tick(x.st); /* rr 3: slots 3, 0, 1, 2 -> gen s0, gen s2, step s3 */
  assert_int_equal(x.fb->log[3].n, 3);
  assert_int_equal(x.fb->log[3].ids[0], 0);
  assert_int_equal(x.fb->log[3].ids[1], 2);
  assert_int_equal(x.fb->log[3].ids[2], 3);
  assert_int_equal(x.fb->log[3].tokens[2], 8);
  fw_fini(&x);
}

/* max_tokens reached: FINAL reason "length" with every token, PARTIALs every
 * partial_every tokens before it; the session is free again. */
static void test_generate_length(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 4, 1, 0);
  mbd_wsession *s = fw_primed(&x, 6);
  mbd_wreq q = fw_generate_req(5, 2);
  generate(&x, s, 7, &q);
  assert_true(s->busy);
  for (int i = 0; i < 5; i++) mbd_wsched_tick(x.st);
  int64_t want[5], got[8];
  greedy_seq(fb_mix(0, 6), FAKE_V, want, 5);
  assert_int_equal(tokens_of(reply(&x, 7, MBD_CMD_PARTIAL, 0), got, 8), 2);
  assert_memory_equal(got, want, 2 * sizeof *got);
  assert_int_equal(tokens_of(reply(&x, 7, MBD_CMD_PARTIAL, 1), got, 8), 2);
  assert_memory_equal(got, want + 2, 2 * sizeof *got);
  assert_null(reply(&x, 7, MBD_CMD_PARTIAL, 2));
  mbd_msg *fin = reply(&x, 7, MBD_CMD_FINAL, 0);
  assert_int_equal(tokens_of(fin, got, 8), 5);
  assert_memory_equal(got, want, 5 * sizeof *got);
  assert_final(fin, "length", 1);
  assert_false(s->busy);
  assert_false(mbd_wsched_pending(x.st));
  /* The session consumed every returned token: a STEP continues from there. */
  fw_clear(&x);
  uint64_t h = fb_mix(0, 6);
  for (int i = 0; i < 5; i++) h = fb_mix(h, want[i]);
  step(&x, s, 8, 4);
  mbd_wsched_tick(x.st);
  assert_step_logits(reply(&x, 8, MBD_CMD_FINAL, 0), fb_mix(h, 4), FAKE_V);
  fw_fini(&x);
}

/* A stop token ends the loop with reason "stop"; it is included and fed. */
static void test_generate_stop(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 4, 1, 0);
  mbd_wsession *s = fw_primed(&x, 2);
  int64_t want[6], got[8];
  greedy_seq(fb_mix(0, 2), FAKE_V, want, 6);
  assert_true(want[1] != want[0]); /* the test needs a token that ends it early */
  int k = 1; /* stop at the first token that does not appear before it */
  for (bool seen = true; seen && k < 6;) {
    seen = false;
    for (int j = 0; j < k; j++) seen |= want[j] == want[k];
    if (seen) k++;
  }
  assert_true(k < 6);
  mbd_wreq q = fw_generate_req(50, 100);
  q.stop[0] = want[k];
  q.nstop = 1;
  generate(&x, s, 9, &q);
  for (int i = 0; i < 10 && mbd_wsched_pending(x.st); i++) mbd_wsched_tick(x.st);
  mbd_msg *fin = reply(&x, 9, MBD_CMD_FINAL, 0);
  size_t n = tokens_of(fin, got, 8);
  assert_int_equal(n, (size_t)k + 1);
  assert_memory_equal(got, want, n * sizeof *got);
  assert_final(fin, "stop", 1);
  assert_int_equal(x.fb->ncalls, 1 + k + 1); /* the stop token was fed */
  assert_int_equal(count_tag(&x, 9), 1);    /* partial_every 100: no PARTIAL */
  fw_fini(&x);
}

/* A tick that starts past the deadline answers ERROR TIMEOUT instead of
 * stepping; the session is no longer busy and keeps its current logits. */
static void test_generate_deadline(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 4, 1, 0);
  mbd_wsession *s = fw_primed(&x, 2);
  mbd_wreq q = fw_generate_req(50, 1);
  q.deadline_ms = 1500;
  generate(&x, s, 5, &q); /* deadline 101.5 */
  mbd_wsched_tick(x.st);
  x.now = 101.5; /* not past it yet */
  mbd_wsched_tick(x.st);
  assert_int_equal(x.fb->ncalls, 3);
  x.now = 101.6;
  assert_false(mbd_wsched_tick(x.st));
  assert_int_equal(x.fb->ncalls, 3); /* no step for it */
  assert_int_equal(error_code(reply(&x, 5, MBD_CMD_ERROR, 0)), MBD_E_TIMEOUT);
  assert_null(reply(&x, 5, MBD_CMD_FINAL, 0));
  assert_int_equal(count_tag(&x, 5), 3); /* two PARTIALs, one ERROR */
  assert_false(s->busy);
  assert_true(((mbd_wsess_data *)s->user)->has_logits);
  fw_fini(&x);
}

/* Greedy rows take their next token from the device: the same tokens as
 * host sampling, and logits reach the host only on the tick a row ends. */
static void test_generate_device_pick(void **state) {
  (void)state;
  static mbd_backend_ops greedy_ops; /* the fake, plus device-side greedy picks */
  greedy_ops = fb_ops;
  greedy_ops.step_greedy = fb_step_greedy;
  fw x;
  fx_init(&x, &greedy_ops, 4, 1, 0);
  mbd_wsession *s = open_session(&x, 0);
  step(&x, s, 1, 3);
  mbd_wsched_tick(x.st);
  assert_false(x.fb->log[0].greedy); /* STEP only: plain step with logits */
  fw_clear(&x);
  mbd_wreq q = fw_generate_req(4, 4);
  generate(&x, s, 2, &q);
  for (int i = 0; i < 4; i++) mbd_wsched_tick(x.st);
  int64_t want[4], got[8];
  greedy_seq(fb_mix(0, 3), FAKE_V, want, 4);
  mbd_msg *fin = reply(&x, 2, MBD_CMD_FINAL, 0);
  assert_int_equal(tokens_of(fin, got, 8), 4);
  assert_memory_equal(got, want, sizeof want);
  assert_final(fin, "length", 1);
  for (int i = 1; i <= 4; i++) {
    assert_true(x.fb->log[i].greedy);
    assert_int_equal(x.fb->log[i].logits, i == 4); /* only the last tick brings logits */
  }
  /* The session's logits are current after the loop. */
  uint64_t h = fb_mix(0, 3);
  for (int i = 0; i < 4; i++) h = fb_mix(h, want[i]);
  float cur[FAKE_V];
  fb_logits(h, FAKE_V, cur);
  assert_memory_equal(((mbd_wsess_data *)s->user)->logits, cur, sizeof cur);
  fw_fini(&x);
}

/* Sessions idle past session_idle_s close (generating ones never do), and
 * a STEP queued for a session that closed meanwhile is answered NOT_FOUND. */
static void test_session_expiry(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 4, 1, 10.0);
  mbd_wsession *a = open_session(&x, 0), *b = open_session(&x, 0), *g = open_session(&x, 0);
  char a_id[MBD_SESSION_ID_MAX];
  snprintf(a_id, sizeof a_id, "%s", a->id);
  step(&x, g, 1, 1);
  mbd_wsched_tick(x.st);
  mbd_wreq q = fw_generate_req(1000, 1000);
  generate(&x, g, 2, &q);
  x.now = 105.0;
  step(&x, b, 3, 4);
  mbd_wsched_tick(x.st); /* b used at 105; g steps too */
  assert_int_equal(mbd_wsched_expire(x.st), 0);
  step(&x, a, 4, 5); /* queued, then a expires before any tick */
  x.now = 110.5;
  assert_int_equal(mbd_wsched_expire(x.st), 1); /* a: idle 10.5 s */
  mbd_wsession *found = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_wsession_find(x.st->sessions, a_id, &found, &err), MBD_E_NOT_FOUND);
  assert_int_equal(mbd_wsession_count(x.st->sessions), 2);
  fw_clear(&x);
  mbd_wsched_tick(x.st);
  assert_int_equal(error_code(reply(&x, 4, MBD_CMD_ERROR, 0)), MBD_E_NOT_FOUND);
  x.now = 200.0;
  assert_int_equal(mbd_wsched_expire(x.st), 1); /* b; g is generating */
  assert_true(g->busy);
  assert_int_equal(mbd_wsession_count(x.st->sessions), 1);
  assert_int_equal(x.fb->live_states, 1);
  /* Expiry off: nothing closes. */
  x.st->o.session_idle_s = 0;
  mbd_wsched_fail_pending(x.st, "test over");
  assert_int_equal(error_code(reply(&x, 2, MBD_CMD_ERROR, 0)), MBD_E_STATE);
  x.now = 10000.0;
  assert_int_equal(mbd_wsched_expire(x.st), 0);
  fw_fini(&x);
}

/* A backend failure answers every request of the batch with its error (a
 * GENERATE ends there, its session free again) and the next batch is
 * served with the states as they were. */
static void test_backend_failure(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 8, 1, 0);
  mbd_wsession *s[3];
  for (int i = 0; i < 3; i++) s[i] = open_session(&x, 0);
  for (int i = 0; i < 3; i++) step(&x, s[i], (uint64_t)(1 + i), 10 + i);
  mbd_wsched_tick(x.st);
  fw_clear(&x);
  x.fb->fail_call = 2;
  mbd_wreq q = fw_generate_req(10, 1);
  generate(&x, s[0], 20, &q);
  generate(&x, s[1], 21, &q);
  step(&x, s[2], 22, 4);
  assert_false(mbd_wsched_tick(x.st));
  assert_int_equal(x.fb->log[1].n, 3);
  assert_int_equal(x.nout, 3);
  for (uint64_t tag = 20; tag <= 22; tag++) {
    assert_int_equal(error_code(reply(&x, tag, MBD_CMD_ERROR, 0)), MBD_E_DEVICE);
    assert_int_equal(count_tag(&x, tag), 1);
  }
  assert_false(s[0]->busy);
  assert_false(s[1]->busy);
  assert_int_equal(x.st->ngen, 0);
  fw_clear(&x);
  /* The next batch is served, from the states before the failed call. */
  for (int i = 0; i < 3; i++) step(&x, s[i], (uint64_t)(30 + i), 5);
  assert_false(mbd_wsched_tick(x.st));
  for (int i = 0; i < 3; i++)
    assert_step_logits(reply(&x, (uint64_t)(30 + i), MBD_CMD_FINAL, 0),
                       fb_mix(fb_mix(0, 10 + i), 5), FAKE_V);
  fw_clear(&x);
  q = fw_generate_req(2, 1);
  generate(&x, s[0], 40, &q);
  mbd_wsched_tick(x.st);
  mbd_wsched_tick(x.st);
  assert_final(reply(&x, 40, MBD_CMD_FINAL, 0), "length", 1);
  fw_fini(&x);
}

/* GENERATE's preconditions: a session that consumed no token, or one with a
 * STEP queued, is refused. */
static void test_generate_refused(void **state) {
  (void)state;
  fw x;
  fx_init(&x, &fb_ops, 4, 1, 0);
  mbd_wsession *s = open_session(&x, 0);
  mbd_wreq q = fw_generate_req(4, 1);
  mbd_error err = {0};
  assert_int_equal(mbd_wsched_generate(x.st, s, 1, &q, &err), MBD_E_STATE);
  assert_non_null(strstr(err.msg, "PREFILL"));
  step(&x, s, 2, 1);
  assert_int_equal(mbd_wsched_generate(x.st, s, 3, &q, &err), MBD_E_STATE); /* not run yet */
  mbd_wsched_tick(x.st);
  step(&x, s, 5, 1);
  assert_int_equal(mbd_wsched_generate(x.st, s, 3, &q, &err), MBD_E_BUSY);
  assert_non_null(strstr(err.msg, "STEP queued"));
  assert_int_equal(mbd_wsched_check_no_step(x.st, s, &err), MBD_E_BUSY);
  mbd_wsched_tick(x.st);
  assert_int_equal(mbd_wsched_check_no_step(x.st, s, &err), 0);
  q.temperature = -1.0;
  assert_int_equal(mbd_wsched_generate(x.st, s, 4, &q, &err), MBD_E_INVALID);
  assert_false(s->busy);
  assert_false(mbd_wsched_pending(x.st));
  fw_fini(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_batching),       cmocka_unit_test(test_generate_rows_first),
      cmocka_unit_test(test_generate_length),     cmocka_unit_test(test_generate_stop),
      cmocka_unit_test(test_generate_deadline),   cmocka_unit_test(test_generate_device_pick),
      cmocka_unit_test(test_session_expiry),      cmocka_unit_test(test_backend_failure),
      cmocka_unit_test(test_generate_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
