/* The service on two GPUs (mambad-worker --device cuda:0 and cuda:1 behind
 * one broker, deterministic f32 route, tiny fixture):
 *  - both workers report the same route id (STATUS);
 *  - the same FORWARD gives identical bits on either worker;
 *  - a session exported from GPU 0 and imported on GPU 1 continues bit-exactly
 *    (greedy tokens and final state bytes equal the session left on GPU 0);
 *  - kill -9 of one worker under a FORWARD burst loses no request: every one
 *    is answered FINAL with the reference bits (broker failover).
 * Exits 77 with a reason when fewer than two CUDA devices are visible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "support/service_gpu.h"
#include "support/wh_sessions.h"

static wh g_h;
static pid_t g_w1;
static const int64_t V = 512;

static int setup(void **st) {
  (void)st;
  sg_init_or_skip(&g_h, 2);
  g_h.client_inflight = "100000"; /* this one client sends the traffic of many */
  wh_start_broker(&g_h);
  sg_start_gpu_worker(&g_h, "gpu0", 0, "256", "64");
  g_w1 = sg_start_gpu_worker(&g_h, "gpu1", 1, "256", "64");
  return wh_wait_workers(&g_h, 2, 60000) ? -1 : 0;
}

static int teardown(void **st) {
  (void)st;
  wh_fini(&g_h);
  return 0;
}

static void test_same_route_id(void **st) {
  (void)st;
  wh_assert_one_route(&g_h, 2, "cuda");
}

/* Sends the same forward until each worker answered at least twice; all
 * answers are bitwise equal. */
static void test_identical_bits_on_either(void **st) {
  (void)st;
  int64_t ids[3 * 21];
  uint64_t s = 17;
  for (int i = 0; i < 3 * 21; i++) ids[i] = (int64_t)(sg_rng(&s) % (uint64_t)V);
  enum { N = 64 };
  mbd_msg *r[N] = {0};
  uint64_t tg = g_h.next_tag;
  for (int i = 0; i < N; i++) wh_send_forward(&g_h, ids, 3, 21, false);
  assert_int_equal(wh_collect(&g_h, tg, N, r, 60000), 0);
  size_t n0 = 0;
  const void *p0 = wh_tensor(r[0], &n0);
  int on[2] = {0, 0};
  for (int i = 0; i < N; i++) {
    assert_int_equal(wh_code(r[i]), 0);
    char w[64] = "";
    wh_str(r[i], "worker", w, sizeof w);
    on[!strcmp(w, "gpu1")]++;
    size_t n = 0;
    const void *p = wh_tensor(r[i], &n);
    assert_int_equal(n, n0);
    assert_memory_equal(p, p0, n);
  }
  printf("forward answered %d times by gpu0 and %d by gpu1, all identical\n", on[0], on[1]);
  assert_true(on[0] > 0 && on[1] > 0);
  wh_free_all(r, N);
}

/* Opens sessions until one lands on `want` worker; returns its id in sid. */
static void open_on(const char *want, char *sid) {
  for (int k = 0; k < 50; k++) {
    mbd_msg *m = wh_open(&g_h, sid, 64);
    assert_int_equal(wh_code(m), 0);
    char w[64] = "";
    wh_str(m, "worker", w, sizeof w);
    mbd_msg_destroy(&m);
    if (!strcmp(w, want)) return;
  }
  fail_msg("no session landed on %s", want);
}

static void test_export_gpu0_continue_on_gpu1(void **st) {
  (void)st;
  char a[64], b[64] = "";
  open_on("gpu0", a);
  int64_t ids[30];
  uint64_t s = 23;
  for (int i = 0; i < 30; i++) ids[i] = (int64_t)(sg_rng(&s) % (uint64_t)V);
  mbd_msg *m = wh_wait(&g_h, wh_send_prefill(&g_h, a, ids, 30, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_generate(&g_h, a, 5, 0.0, 0), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_export(&g_h, a), 30000);
  assert_int_equal(wh_code(m), 0);
  char rid[80] = "";
  wh_str(m, "route_id", rid, sizeof rid);
  size_t n = 0;
  uint8_t *blob = sg_payload(m, &n);
  mbd_msg_destroy(&m);
  /* Import until the new session is on gpu1. */
  for (int k = 0; k < 50 && !b[0]; k++) {
    m = wh_wait(&g_h, sg_send_import(&g_h, blob, n, rid), 30000);
    assert_int_equal(wh_code(m), 0);
    char w[64] = "";
    wh_str(m, "worker", w, sizeof w);
    if (!strcmp(w, "gpu1")) wh_str(m, "session", b, sizeof b);
    mbd_msg_destroy(&m);
  }
  assert_true(b[0] != '\0');
  /* Continue both: seeded sampling then a step; tokens and states equal. */
  int64_t ta[40], tb[40];
  m = wh_wait(&g_h, wh_send_generate(&g_h, a, 40, 0.7, 5), 30000);
  assert_int_equal(wh_code(m), 0);
  assert_int_equal(wh_tokens(m, ta, 40), 40);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_generate(&g_h, b, 40, 0.7, 5), 30000);
  assert_int_equal(wh_code(m), 0);
  assert_int_equal(wh_tokens(m, tb, 40), 40);
  mbd_msg_destroy(&m);
  assert_memory_equal(ta, tb, sizeof ta);
  m = wh_wait(&g_h, sg_send_export(&g_h, a), 30000);
  size_t na = 0, nb = 0;
  uint8_t *ea = sg_payload(m, &na);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_export(&g_h, b), 30000);
  uint8_t *eb = sg_payload(m, &nb);
  mbd_msg_destroy(&m);
  assert_int_equal(na, nb);
  assert_memory_equal(ea, eb, na);
  assert_memory_not_equal(ea, blob, na); /* the state moved on */
  printf("session moved gpu0 -> gpu1: 40 further tokens and the %zu-byte state identical\n", na);
  free(ea);
  free(eb);
  free(blob);
}

static void test_kill9_under_load_loses_nothing(void **st) {
  (void)st;
  int64_t ids[2 * 17];
  uint64_t s = 99;
  for (int i = 0; i < 2 * 17; i++) ids[i] = (int64_t)(sg_rng(&s) % (uint64_t)V);
  mbd_msg *ref = wh_wait(&g_h, wh_send_forward(&g_h, ids, 2, 17, false), 30000);
  assert_int_equal(wh_code(ref), 0);
  size_t nref = 0;
  uint8_t *want = sg_payload(ref, &nref);
  mbd_msg_destroy(&ref);
  enum { N = 600 };
  mbd_msg **r = calloc(N, sizeof *r);
  uint64_t tg = g_h.next_tag;
  for (int i = 0; i < N; i++) {
    wh_send_forward(&g_h, ids, 2, 17, false);
    if (i == N / 3) kill(g_w1, SIGKILL); /* mid-burst */
  }
  size_t missing = wh_collect(&g_h, tg, N, r, 120000);
  assert_int_equal(missing, 0);
  int bad = 0, on1 = 0;
  for (int i = 0; i < N; i++) {
    if (wh_code(r[i])) {
      bad++;
      continue;
    }
    char w[64] = "";
    wh_str(r[i], "worker", w, sizeof w);
    on1 += !strcmp(w, "gpu1");
    size_t n = 0;
    const void *p = wh_tensor(r[i], &n);
    if (n != nref || memcmp(p, want, n)) bad++;
  }
  printf("kill -9 gpu1 during %d forwards: %d answered by gpu1 before dying, %d bad\n", N, on1,
         bad);
  assert_int_equal(bad, 0);
  waitpid(g_w1, NULL, 0);
  for (int i = 0; i < g_h.nprocs; i++)
    if (g_h.procs[i] == g_w1) g_h.procs[i] = 0;
  wh_free_all(r, N);
  free(r);
  free(want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_route_id),
      cmocka_unit_test(test_identical_bits_on_either),
      cmocka_unit_test(test_export_gpu0_continue_on_gpu1),
      cmocka_unit_test(test_kill9_under_load_loses_nothing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
