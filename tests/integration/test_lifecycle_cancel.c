/* Request lifecycle through the real processes (broker + CPU worker, and the
 * `mambad` CLI as a client that goes away):
 *
 * - CANCEL stops a streaming GENERATE: the client gets ERROR CANCELLED, the
 *   worker stops the loop (the session takes a STEP again, the broker's
 *   in-flight count returns to 0).
 * - The broker's default deadline reaches the worker: a GENERATE sent
 *   without a deadline times out at the broker's default and the worker stops
 *   it there (slot and session free again) instead of running to max_tokens.
 * - A `mambad generate` killed with SIGKILL mid-stream: the broker notices
 *   the closed connection and cancels its request on the worker (counters
 *   clients_gone and cancelled; in-flight back to 0).
 * - A client that sends 200 FORWARDs and closes its socket: most are never
 *   sent to the worker, the running ones are cancelled there.
 * - Ctrl-C (SIGINT) of a streaming `mambad generate` cancels the request
 *   and exits 130; `--temperature 0.8` works with the sampling defaults.
 *
 * Every check is on counters and states that can only change once the work
 * stopped (an unstopped 1,000,000-token GENERATE keeps the session busy and
 * the in-flight count at 1 for minutes); the waits are bounded loops. */
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

#define LONG_GEN 1000000

/* A broker like wh_start_broker's, with --default-deadline-ms dl. */
static void start_broker_dl(wh *h, const char *dl) {
  char exe[600];
  snprintf(exe, sizeof exe, "%s/mambad-broker", h->bin);
  char *argv[] = {exe, "--clients", h->clients, "--workers", h->workers, "--heartbeat-ms", "200",
                  "--liveness", "3", "--default-deadline-ms", (char *)dl, NULL};
  h->broker = procs_spawn(argv, NULL);
  h->zctx = zmq_ctx_new();
  h->sock = zmq_socket(h->zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_connect(h->sock, h->clients);
}

/* Waits (bounded) until workers[0].inflight is 0; returns it. */
static int64_t wait_idle(wh *h) {
  int64_t v = -1;
  for (int i = 0; i < 100 && (v = wh_worker_inflight(h, 0)) != 0; i++) usleep(50000);
  return v;
}

/* A STEP on sid succeeds (not BUSY: no GENERATE holds it) within a bounded wait. */
static int step_until_free(wh *h, const char *sid) {
  int code = 999;
  for (int i = 0; i < 100; i++) {
    mbd_msg *m = wh_wait(h, wh_send_step(h, sid, 1), 30000);
    code = wh_code(m);
    mbd_msg_destroy(&m);
    if (code != MBD_E_BUSY) break;
    usleep(50000);
  }
  return code;
}

static void open_prefilled(wh *h, char *sid, size_t cap) {
  mbd_msg *m = wh_open(h, sid, cap);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  int64_t ids[3] = {5, 6, 7};
  m = wh_wait(h, wh_send_prefill(h, sid, ids, 3, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

/* Receives until n PARTIALs of tag came (bounded). */
static int wait_partials(wh *h, uint64_t tag, int n) {
  int got = 0;
  double end = wh_now() + 30;
  while (got < n && wh_now() < end) {
    mbd_msg *m = wh_recv(h, 200);
    if (m && mbd_msg_tag(m) == tag && mbd_msg_cmd(m) == MBD_CMD_PARTIAL) got++;
    mbd_msg_destroy(&m);
  }
  return got;
}

static void test_cancel_stops_stream(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  wh_start_worker(&h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  char sid[64];
  open_prefilled(&h, sid, sizeof sid);
  uint64_t tag = wh_send_generate(&h, sid, LONG_GEN, 0, 0);
  assert_int_equal(wait_partials(&h, tag, 3), 3);
  mbd_msg *c = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_CANCEL, tag, &c, NULL), 0);
  assert_int_equal(mbd_msg_send(&c, h.sock, 0, NULL), 0);
  mbd_msg *m = wh_wait(&h, tag, 10000);
  assert_int_equal(wh_code(m), MBD_E_CANCELLED);
  mbd_msg_destroy(&m);
  assert_int_equal(wh_counter(&h, "cancelled"), 1);
  assert_int_equal(wait_idle(&h), 0); /* the worker answered the ticket: it stopped */
  assert_int_equal(step_until_free(&h, sid), 0);
  wh_fini(&h);
}

static void test_default_deadline_reaches_worker(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  start_broker_dl(&h, "800");
  wh_start_worker(&h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  char sid[64];
  open_prefilled(&h, sid, sizeof sid);
  /* No deadline_ms of its own: the broker's 800 ms default applies. */
  uint64_t tag = wh_send_generate(&h, sid, LONG_GEN, 0, 0);
  mbd_msg *m = wh_wait(&h, tag, 30000);
  assert_int_equal(wh_code(m), MBD_E_TIMEOUT);
  mbd_msg_destroy(&m);
  assert_int_equal(wait_idle(&h), 0);
  assert_int_equal(step_until_free(&h, sid), 0);
  wh_fini(&h);
}

/* Writes the fixture's input_ids to dir/in.safetensors (the CLI's prompt file). */
static void prompt_file(const wh *h, char *path, size_t cap) {
  snprintf(path, cap, "%s/in.safetensors", h->dir);
  char src[700];
  snprintf(src, sizeof src, "%s/expected.safetensors", h->model_dir);
  /* expected.safetensors holds input_ids (and more): the CLI reads input_ids only. */
  assert_int_equal(procs_sh("cp '%s' '%s'", src, path), 0);
}

/* Starts `mambad generate` of LONG_GEN tokens, stdout+stderr to log. */
static pid_t start_cli_generate(const wh *h, const char *in, const char *log) {
  char exe[600], n[32];
  snprintf(exe, sizeof exe, "%s/mambad", h->bin);
  snprintf(n, sizeof n, "%d", LONG_GEN);
  char *argv[16] = {exe, "generate", "--connect", (char *)h->clients, "--model", "tiny",
                    "--input", (char *)in, "--max-tokens", n, NULL};
  return procs_spawn(argv, log);
}

/* Waits (bounded) until the broker relayed n more worker replies than
 * `base` (the CLI's PARTIALs: its stdout is a buffered file here). */
static void wait_streaming(wh *h, int64_t base, int64_t n) {
  for (int i = 0; i < 600; i++) {
    if ((int64_t)wh_counter(h, "replies") >= base + n) return;
    usleep(50000);
  }
  fail_msg("the CLI's generate is not streaming");
}

static void test_client_killed_and_ctrl_c(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  wh_start_worker(&h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  char in[700], log[700];
  snprintf(log, sizeof log, "%s/mambad", h.bin);
  if (access(log, X_OK)) { /* the CLI is not built: nothing to test here */
    wh_fini(&h);
    skip();
  }
  prompt_file(&h, in, sizeof in);
  /* kill -9 mid-stream: the broker cancels the request on the worker. */
  snprintf(log, sizeof log, "%s/kill.log", h.dir);
  pid_t p = start_cli_generate(&h, in, log);
  wait_streaming(&h, (int64_t)wh_counter(&h, "replies"), 50);
  assert_int_equal(wh_worker_inflight(&h, 0), 1);
  int st = 0;
  procs_stop(p, SIGKILL, 10000, &st);
  assert_int_equal(wait_idle(&h), 0);
  assert_int_equal(wh_counter(&h, "clients_gone"), 1);
  assert_int_equal(wh_counter(&h, "cancelled"), 1);
  /* Ctrl-C: cancelled, exit status 130. */
  snprintf(log, sizeof log, "%s/int.log", h.dir);
  p = start_cli_generate(&h, in, log);
  wait_streaming(&h, (int64_t)wh_counter(&h, "replies"), 50);
  assert_true(procs_stop(p, SIGINT, 10000, &st) >= 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 130);
  assert_int_equal(wait_idle(&h), 0);
  assert_int_equal(wh_counter(&h, "cancelled"), 2);
  assert_int_equal(procs_sh("grep -q interrupted '%s'", log), 0);
  /* Sampling with the library's defaults (top_p 1, top_k off). */
  assert_int_equal(procs_sh("'%s/mambad' generate --connect '%s' --model tiny --input '%s' "
                            "--max-tokens 8 --temperature 0.8 > '%s/temp.log' 2>&1",
                            h.bin, h.clients, in, h.dir),
                   0);
  wh_fini(&h);
}

/* A client sends 200 FORWARDs [1, 2048] (more than the worker's 64 slots
 * take at once) and closes its socket: the broker drops the queued ones and
 * cancels the running ones, so far fewer than 200 are ever sent on. */
static void test_gone_client_burst(void **state) {
  (void)state;
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  wh_start_worker(&h, "wA", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  int64_t *ids = malloc(2048 * sizeof *ids);
  for (int i = 0; i < 2048; i++) ids[i] = (i * 31) % 512;
  /* The burst comes from a second connection, which then goes away. */
  void *main_sock = h.sock;
  h.sock = zmq_socket(h.zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(h.sock, ZMQ_LINGER, &linger, sizeof linger);
  assert_int_equal(zmq_connect(h.sock, h.clients), 0);
  for (int i = 0; i < 200; i++) wh_send_forward(&h, ids, 1, 2048, true);
  usleep(100000);
  zmq_close(h.sock);
  h.sock = main_sock;
  int64_t queue = -1, inflight = -1;
  for (int i = 0; i < 200 && (queue != 0 || inflight != 0); i++) {
    inflight = wh_worker_inflight(&h, 0);
    wh_pack k;
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 0);
    mbd_msg *m = wh_call(&h, MBD_CMD_STATUS, &k.sb, 0, NULL, NULL);
    mbd_body *b = wh_body(m);
    mbd_obj_i64(mbd_body_root(b), "queue", true, &queue, NULL);
    mbd_body_destroy(&b);
    mbd_msg_destroy(&m);
    usleep(50000);
  }
  assert_int_equal(queue, 0);
  assert_int_equal(inflight, 0);
  int64_t fwd = (int64_t)wh_counter(&h, "forwarded"), can = (int64_t)wh_counter(&h, "cancelled"),
          rep = (int64_t)wh_counter(&h, "replies");
  fprintf(stderr, "200 requests of a client that left: %lld sent to the worker, %lld answered, "
                  "%lld cancelled\n", (long long)fwd, (long long)rep, (long long)can);
  assert_true(fwd < 200);
  assert_int_equal(can + rep, 200);
  assert_int_equal(wh_counter(&h, "clients_gone"), 1);
  free(ids);
  wh_fini(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cancel_stops_stream),
                                     cmocka_unit_test(test_default_deadline_reaches_worker),
                                     cmocka_unit_test(test_client_killed_and_ctrl_c),
                                     cmocka_unit_test(test_gone_client_burst)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
