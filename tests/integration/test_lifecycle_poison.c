/* Dead workers and poison requests through the real processes. The broker
 * runs with heartbeat 1000 ms x liveness 30, so heartbeat silence would take
 * 30 s to notice: everything checked here comes from the socket monitor
 * (ZMQ_EVENT_DISCONNECTED, then a probe that finds the peer gone).
 *
 * - kill -9 of a worker running a GENERATE: the request ends WORKER_LOST
 *   with the reason "could not be reached" (the socket), not "silent for".
 * - A FORWARD whose workers die under it twice (kill -9 of whichever worker
 *   runs it) is not sent to the third: WORKER_LOST naming both workers,
 *   counters failovers 1 and poisoned 1, and the third worker never got it. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <signal.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/wh_sessions.h"
#include "support/worker_harness.h"

static void start_broker_slow_hb(wh *h) {
  char exe[600];
  snprintf(exe, sizeof exe, "%s/mambad-broker", h->bin);
  char *argv[] = {exe, "--clients", h->clients, "--workers", h->workers, "--heartbeat-ms", "1000",
                  "--liveness", "30", NULL};
  h->broker = procs_spawn(argv, NULL);
  h->zctx = zmq_ctx_new();
  h->sock = zmq_socket(h->zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_connect(h->sock, h->clients);
}

/* The name of the worker with a request in flight ("" when none). */
static void busy_worker(wh *h, char *name, size_t cap) {
  name[0] = '\0';
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 0);
  mbd_msg *m = wh_call(h, MBD_CMD_STATUS, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  mbd_body *b = wh_body(m);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
  for (uint32_t i = 0; ws && i < ws->via.array.size; i++) {
    int64_t inflight = 0;
    mbd_obj_i64(&ws->via.array.ptr[i], "inflight", true, &inflight, NULL);
    if (inflight > 0) mbd_obj_str(&ws->via.array.ptr[i], "name", true, name, cap, NULL);
  }
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
}

static void test_kill9_seen_by_socket(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  start_broker_slow_hb(&h);
  pid_t w = wh_start_worker(&h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  char sid[64];
  mbd_msg *m = wh_open(&h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  int64_t ids[3] = {5, 6, 7};
  m = wh_wait(&h, wh_send_prefill(&h, sid, ids, 3, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  uint64_t tag = wh_send_generate(&h, sid, 1000000, 0, 0);
  usleep(200000);
  int st = 0;
  procs_stop(w, SIGKILL, 10000, &st);
  h.procs[0] = 0;
  /* Well inside the 30 s that heartbeat silence would take. */
  m = wh_wait(&h, tag, 15000);
  assert_non_null(m);
  char msg[600];
  wh_str(m, "message", msg, sizeof msg);
  fprintf(stderr, "after kill -9: %s\n", msg);
  assert_int_equal(wh_code(m), MBD_E_WORKER_LOST);
  assert_non_null(strstr(msg, "could not be reached"));
  mbd_msg_destroy(&m);
  wh_fini(&h);
}

static void test_poison_not_resent(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  start_broker_slow_hb(&h);
  const char *names[3] = {"wA", "wB", "wC"};
  pid_t pids[3];
  for (int i = 0; i < 3; i++) pids[i] = wh_start_worker(&h, names[i], NULL);
  assert_int_equal(wh_wait_workers(&h, 3, 30000), 0);
  /* About a second of compute: time to see which worker runs it and kill it. */
  int64_t *ids = malloc(32 * 2048 * sizeof *ids);
  for (int i = 0; i < 32 * 2048; i++) ids[i] = (i * 7919) % 512;
  uint64_t tag = wh_send_forward(&h, ids, 32, 2048, true);
  int kills = 0;
  bool dead[3] = {false, false, false};
  mbd_msg *fin = NULL;
  double end = wh_now() + 60;
  while (!fin && wh_now() < end) {
    char busy[64];
    busy_worker(&h, busy, sizeof busy);
    for (int i = 0; i < 3 && kills < 2; i++) {
      if (dead[i] || strcmp(busy, names[i])) continue;
      int st = 0;
      procs_stop(pids[i], SIGKILL, 10000, &st);
      h.procs[i] = 0;
      dead[i] = true;
      kills++;
    }
    mbd_msg *m = wh_recv(&h, 20);
    if (m && mbd_msg_tag(m) == tag) fin = m;
    else mbd_msg_destroy(&m);
  }
  assert_non_null(fin);
  char msg[600];
  wh_str(fin, "message", msg, sizeof msg);
  fprintf(stderr, "after %d kills: %s\n", kills, msg);
  assert_int_equal(kills, 2);
  assert_int_equal(wh_code(fin), MBD_E_WORKER_LOST);
  assert_non_null(strstr(msg, "both died"));
  mbd_msg_destroy(&fin);
  assert_int_equal(wh_counter(&h, "failovers"), 1);
  assert_int_equal(wh_counter(&h, "poisoned"), 1);
  assert_int_equal(wh_counter(&h, "forwarded"), 2); /* never sent to the third worker */
  free(ids);
  wh_fini(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill9_seen_by_socket),
                                     cmocka_unit_test(test_poison_not_resent)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
