/* Worker lifecycle through the real processes: re-registration after the
 * broker dies and a new one takes its endpoints (liveness), idle sessions
 * expiring (--session-idle-s; the worker's log line, then NOT_FOUND), and
 * SIGTERM during a running GENERATE: the request gets exactly one final reply
 * (counted until the broker lists no worker) and the worker exits 0. Also a bad
 * --model directory fails fast with a message naming it. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <zmq.h>

#include "support/wh_requests.h"
#include "support/worker_harness.h"

static void test_bad_model_dir(void **state) {
  (void)state;
  wh h;
  int rc = wh_init(&h);
  if (rc == 77) exit(77); /* ctest: skipped */
  char exe[600];
  snprintf(exe, sizeof exe, "%s/mambad-worker", h.bin);
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "%s --connect ipc://%s/none --name w --model tiny=/nonexistent/dir 2>&1", exe, h.dir);
  FILE *p = popen(cmd, "r");
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  assert_non_null(strstr(out, "tiny"));
  assert_non_null(strstr(out, "/nonexistent/dir"));
  snprintf(cmd, sizeof cmd, "%s --connect x --name w --dtype f64 2>&1", exe);
  p = popen(cmd, "r");
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  st = pclose(p);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_non_null(strstr(out, "bf16"));
  wh_fini(&h);
}

/* Sends STATUS and reads replies until its answer, counting the final
 * replies (FINAL/ERROR, which must be errors) of request `tag` on the way.
 * Returns the number of workers STATUS listed, or -1 without an answer. */
static int status_counting(wh *h, uint64_t tag, int *finals) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  uint64_t st = wh_send(h, MBD_CMD_STATUS, &p.sb, 0, NULL, NULL);
  double guard = wh_now() + EV_HANG_MS / 1000.0;
  while (wh_now() < guard) {
    mbd_msg *m = wh_recv(h, 200);
    if (!m) continue;
    if (mbd_msg_tag(m) == tag && mbd_msg_cmd(m) != MBD_CMD_PARTIAL) {
      (*finals)++;
      assert_int_not_equal(wh_code(m), 0); /* shutting down / worker lost */
    }
    if (mbd_msg_tag(m) == st) {
      mbd_body *b = wh_body(m);
      const msgpack_object *ws = b ? mbd_obj_get(mbd_body_root(b), "workers") : NULL;
      int n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? (int)ws->via.array.size : -1;
      mbd_body_destroy(&b);
      mbd_msg_destroy(&m);
      return n;
    }
    mbd_msg_destroy(&m);
  }
  return -1;
}

/* SIGTERM after the broker died: the worker waits for a goodbye that cannot
 * come, says so, and still exits 0. */
static void test_sigterm_without_broker(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  h.worker_logs = true;
  pid_t w = wh_start_worker(&h, "wA", NULL);
  char log[400];
  wh_worker_log(&h, "wA", log, sizeof log);
  assert_int_equal(wh_wait_workers(&h, 1, EV_HANG_MS), 0);
  assert_true(wh_stop(h.broker, SIGKILL) < 0);
  h.broker = 0;
  int st = 0;
  assert_true(procs_stop(w, SIGTERM, EV_HANG_MS, &st) >= 0);
  h.procs[0] = 0;
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  if (!ev_wait_lines(log, "no goodbye from the broker", 1, EV_HANG_MS)) {
    procs_sh("cat '%s' >&2", log);
    fail_msg("the worker never logged 'no goodbye from the broker' (log above)");
  }
  wh_fini(&h);
}

static void test_reregister_idle_sigterm(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  h.worker_logs = true; /* the idle expiry is seen in the worker's log */
  pid_t w = wh_start_worker(&h, "wA", "--session-idle-s", "1", "--liveness", "3", NULL);
  char log[400];
  wh_worker_log(&h, "wA", log, sizeof log);
  assert_int_equal(wh_wait_workers(&h, 1, EV_HANG_MS), 0);
  /* Broker dies; a new one binds the same endpoints: the worker notices the
   * silence and registers again. */
  assert_true(wh_stop(h.broker, SIGKILL) < 0);
  zmq_close(h.sock);
  zmq_ctx_term(h.zctx);
  wh_start_broker(&h);
  double t0 = wh_now();
  assert_int_equal(wh_wait_workers(&h, 1, EV_HANG_MS), 0);
  fprintf(stderr, "re-registered %.2f s after the new broker started\n", wh_now() - t0);
  /* Idle expiry: a session untouched for > 1 s is closed; the worker logs it,
   * and a STEP after that finds no session. */
  char sid[64] = "";
  mbd_msg *m = wh_open(&h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  int64_t ids[3] = {5, 6, 7};
  m = wh_wait(&h, wh_send_prefill(&h, sid, ids, 3, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  if (!ev_wait_lines(log, "closed 1 idle session", 1, EV_HANG_MS)) {
    procs_sh("cat '%s' >&2", log);
    fail_msg("the worker never logged 'closed 1 idle session' (log above)");
  }
  m = wh_wait(&h, wh_send_step(&h, sid, 1), 30000);
  assert_int_equal(wh_code(m), MBD_E_NOT_FOUND);
  mbd_msg_destroy(&m);
  /* SIGTERM while a long GENERATE runs: exactly one final reply, exit 0. */
  m = wh_open(&h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&h, wh_send_prefill(&h, sid, ids, 3, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  uint64_t tag = wh_send_generate(&h, sid, 1000000, 0, 0);
  int partials = 0, finals = 0;
  double end = wh_now() + 30;
  while (partials < 3 && wh_now() < end) {
    m = wh_recv(&h, 200);
    if (m && mbd_msg_tag(m) == tag && mbd_msg_cmd(m) == MBD_CMD_PARTIAL) partials++;
    mbd_msg_destroy(&m);
  }
  assert_int_equal(partials, 3);
  assert_int_equal(wh_stop(w, SIGTERM), 0);
  h.procs[0] = 0;
  /* Once STATUS lists no worker the broker has handled every message of the
   * gone worker, and it answered them on this socket before that STATUS. */
  int listed = 1;
  double guard = wh_now() + EV_HANG_MS / 1000.0;
  while ((listed != 0 || finals == 0) && wh_now() < guard) listed = status_counting(&h, tag, &finals);
  assert_int_equal(listed, 0);
  assert_int_equal(finals, 1);
  wh_fini(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_bad_model_dir),
                                     cmocka_unit_test(test_sigterm_without_broker),
                                     cmocka_unit_test(test_reregister_idle_sigterm)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
