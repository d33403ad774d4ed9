/* kill -9 of a worker under FORWARD load: two workers of one route serve a
 * burst of stateless FORWARDs; one is SIGKILLed mid-burst. Every request must
 * be answered exactly once (the broker re-sends the lost ones to the
 * survivor) and every answer must carry the right logits, bit for bit. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define NREQ 80

static wh g_h;
static wh_fixture g_f;

static void test_kill9(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const int64_t T = g_f.T, V = g_f.V;
  wh_start_broker(&g_h);
  pid_t a = wh_start_worker(&g_h, "wA", NULL);
  wh_start_worker(&g_h, "wB", NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  /* Reference last-position logits of every prefix length of prompt 0. */
  float *ref = malloc((size_t)(T * V) * 4);
  mbd_mamba1_state *s = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
  wh_ref_prefill(&g_f, s, g_f.ids, T, ref);
  mbd_mamba1_state_destroy(&s);
  /* Request i: prompt 0 truncated to 1 + i % T tokens, last_only. */
  uint64_t tags[NREQ];
  int answers[NREQ] = {0};
  for (int i = 0; i < NREQ; i++) tags[i] = wh_send_forward(&g_h, g_f.ids, 1, 1 + i % T, true);
  int got = 0, errors = 0;
  bool killed = false;
  double end = wh_now() + 120;
  while (got < NREQ && wh_now() < end) {
    if (!killed && got >= 5) {
      kill(a, SIGKILL);
      killed = true;
    }
    mbd_msg *m = wh_recv(&g_h, 200);
    if (!m) continue;
    int i = (int)(mbd_msg_tag(m) - tags[0]);
    assert_true(i >= 0 && i < NREQ);
    answers[i]++;
    got++;
    if (wh_code(m) == 0) {
      size_t len;
      const void *p = wh_tensor(m, &len);
      assert_int_equal(len, (size_t)V * 4);
      assert_memory_equal(p, ref + (i % T) * V, (size_t)V * 4);
    } else {
      errors++;
    }
    mbd_msg_destroy(&m);
  }
  assert_true(killed);
  /* Nothing more may arrive: no duplicates. */
  mbd_msg *extra = wh_recv(&g_h, 1500);
  if (extra) fprintf(stderr, "unexpected extra reply for tag %llu\n",
                     (unsigned long long)mbd_msg_tag(extra));
  assert_null(extra);
  for (int i = 0; i < NREQ; i++) assert_int_equal(answers[i], 1);
  fprintf(stderr, "%d answers, %d errors after kill -9 of one worker\n", got, errors);
  assert_int_equal(errors, 0); /* stateless work is re-sent, never failed */
  /* The kill really hit in-flight work: the broker re-sent some of it. */
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 0);
  mbd_msg *m = wh_call(&g_h, MBD_CMD_STATUS, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  mbd_body *b = wh_body(m);
  const msgpack_object *ctr = mbd_obj_get(mbd_body_root(b), "counters");
  uint64_t failovers = 0;
  assert_non_null(ctr);
  assert_int_equal(mbd_obj_u64(ctr, "failovers", true, &failovers, NULL), 0);
  fprintf(stderr, "broker failovers: %llu\n", (unsigned long long)failovers);
  assert_true(failovers > 0);
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  free(ref);
  int st = 0;
  waitpid(a, &st, 0);
  g_h.procs[0] = 0;
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill9)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
