/* Sessions owned by their opener, replayed as a second uid through the real
 * broker and worker: nobody's STEP, EXPORT and CLOSE on root's session id all
 * get NOT_FOUND (as an id that was never open), root's session is untouched and
 * keeps serving; guessed ids never reach a live session; the per-client session
 * limit answers BUSY while other clients can still open; sessions of a client
 * process that exited are closed by the broker. Needs root to become
 * nobody; skips with the reason otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"
#include "support/security.h"

static wh g_h;
static pid_t g_worker;
static char g_sid[64];

static int setup(void **state) {
  (void)state;
  if (wh_init(&g_h)) return -1;
  wh_start_broker(&g_h);
  g_worker = wh_start_worker(&g_h, "w0", "--capacity", "8", "--client-sessions", "2", NULL);
  if (wh_wait_workers(&g_h, 1, 20000)) return -1;
  sec_open_socket(&g_h);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  wh_fini(&g_h);
  return 0;
}

/* Reply code of a session command {session: sid} (0 = FINAL). */
static int session_cmd(wh *h, uint8_t cmd, const char *sid) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, cmd == MBD_CMD_STEP ? 2 : 1);
  mbd_pack_kv_str(&p.pk, "session", sid);
  if (cmd == MBD_CMD_STEP) mbd_pack_kv_i64(&p.pk, "token", 1);
  mbd_msg *m = wh_call(h, cmd, &p.sb, 0, NULL, NULL);
  if (!m) return 1;
  int code = wh_code(m);
  mbd_msg_destroy(&m);
  return code;
}

static int foreign(wh *h) {
  SEC_CHECK(session_cmd(h, MBD_CMD_STEP, g_sid) == MBD_E_NOT_FOUND);
  SEC_CHECK(session_cmd(h, MBD_CMD_EXPORT, g_sid) == MBD_E_NOT_FOUND);
  SEC_CHECK(session_cmd(h, MBD_CMD_CLOSE, g_sid) == MBD_E_NOT_FOUND);
  /* Guessing: same worker uid, 200 random 128-bit tails. */
  const char *slash = strchr(g_sid, '/');
  SEC_CHECK(slash && strlen(slash + 1) == 32);
  srand((unsigned)getpid());
  for (int i = 0; i < 200; i++) {
    char g[64];
    int n = snprintf(g, sizeof g, "%.*s/", (int)(slash - g_sid), g_sid);
    for (int k = 0; k < 32; k++) n += snprintf(g + n, sizeof g - (size_t)n, "%x", rand() % 16);
    SEC_CHECK(session_cmd(h, MBD_CMD_STEP, g) == MBD_E_NOT_FOUND);
  }
  /* The second uid has its own quota. */
  char own[64] = "";
  mbd_msg *m = wh_open(h, own, sizeof own);
  SEC_CHECK(m && wh_code(m) == 0);
  mbd_msg_destroy(&m);
  SEC_CHECK(session_cmd(h, MBD_CMD_STEP, own) == 0);
  SEC_CHECK(session_cmd(h, MBD_CMD_CLOSE, own) == 0);
  return 0;
}

static void test_foreign_session(void **state) {
  (void)state;
  mbd_msg *m = wh_open(&g_h, g_sid, sizeof g_sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  assert_int_equal(session_cmd(&g_h, MBD_CMD_STEP, g_sid), 0);
  assert_int_equal(sec_as_nobody(&g_h, foreign), 0);
  /* Still root's, still open, still serving. */
  assert_int_equal(session_cmd(&g_h, MBD_CMD_STEP, g_sid), 0);
  assert_int_equal(session_cmd(&g_h, MBD_CMD_EXPORT, g_sid), 0);
  /* An id of a worker that does not exist: NOT_FOUND from the broker. */
  assert_int_equal(session_cmd(&g_h, MBD_CMD_STEP, "0000000000000000/00000000000000000000000000000000"),
                   MBD_E_NOT_FOUND);
  assert_int_equal(waitpid(g_worker, NULL, WNOHANG), 0);
}

static int nobody_opens(wh *h) {
  char own[64] = "";
  mbd_msg *m = wh_open(h, own, sizeof own);
  SEC_CHECK(m && wh_code(m) == 0);
  mbd_msg_destroy(&m);
  return 0;
}

static void test_client_session_limit(void **state) {
  (void)state;
  char second[64] = "", third[64] = "";
  mbd_msg *m = wh_open(&g_h, second, sizeof second); /* root now holds 2: its limit */
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_open(&g_h, third, sizeof third);
  assert_int_equal(wh_code(m), MBD_E_BUSY);
  char msg[512] = "";
  wh_str(m, "message", msg, sizeof msg);
  assert_non_null(strstr(msg, "--client-sessions"));
  mbd_msg_destroy(&m);
  assert_int_equal(sec_as_nobody(&g_h, nobody_opens), 0); /* slots remain for others */
  assert_int_equal(session_cmd(&g_h, MBD_CMD_CLOSE, second), 0);
  m = wh_open(&g_h, third, sizeof third);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

/* Opens sessions until it holds `want` (BUSY retried for up to 10 s). */
static int open_until(wh *h, int want) {
  int have = 0;
  for (int i = 0; i < 500 && have < want; i++) {
    char sid[64] = "";
    mbd_msg *m = wh_open(h, sid, sizeof sid);
    SEC_CHECK(m != NULL);
    int code = wh_code(m);
    mbd_msg_destroy(&m);
    SEC_CHECK(code == 0 || code == MBD_E_BUSY);
    if (code == 0) have++;
    else usleep(20000);
  }
  return have == want ? 0 : 150;
}

static int hold_two_and_exit(wh *h) { return open_until(h, 2); }
static int open_one(wh *h) { return open_until(h, 1); }

/* A client process that exits holding its limit of sessions: the broker
 * closes them (the process is gone), so the same uid can open again soon,
 * long before the workers' idle timeout (600 s). */
static void test_departed_client_reclaimed(void **state) {
  (void)state;
  assert_int_equal(sec_as_nobody(&g_h, hold_two_and_exit), 0);
  assert_int_equal(sec_as_nobody(&g_h, open_one), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_foreign_session),
      cmocka_unit_test(test_client_session_limit),
      cmocka_unit_test(test_departed_client_reclaimed),
  };
  int rc = sec_init();
  if (rc) return rc;
  return cmocka_run_group_tests(tests, setup, teardown);
}
