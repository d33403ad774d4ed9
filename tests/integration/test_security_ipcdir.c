/* The broker's ipc socket directories, as a squatter would meet them: a
 * directory of another uid, a world-writable one, or a symlink is refused at
 * start-up (exit 1, no socket); a missing one is created 0700 with sockets
 * 0600; with --ipc-group the group (and only it) gets in: 0750 / 0660, and a
 * client of that group is served. Needs root (to own directories as nobody and
 * to connect as nobody); skips with the reason otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

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
static char g_root[128];

/* Runs a broker on ipc sockets in dir (extra flag pair optional); returns its
 * exit status when it exits within 5 s, or 0 with *running set once both
 * sockets exist. */
static int run_broker(const char *dir, const char *flag, const char *val, pid_t *running) {
  char exe[600], c[400], w[400];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g_h.bin);
  snprintf(c, sizeof c, "ipc://%s/clients", dir);
  snprintf(w, sizeof w, "ipc://%s/workers", dir);
  char *argv[] = {exe, "--clients", c, "--workers", w, (char *)flag, (char *)val, NULL};
  if (!flag) argv[5] = NULL;
  pid_t p = procs_spawn(argv, NULL);
  char cs[400];
  snprintf(cs, sizeof cs, "%s/workers", dir);
  for (int i = 0; i < 500; i++) {
    int st = 0;
    if (waitpid(p, &st, WNOHANG) == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (access(cs, F_OK) == 0) {
      *running = p;
      return 0;
    }
    usleep(10000);
  }
  procs_stop(p, SIGKILL, 1000, NULL);
  return -1;
}

static int setup(void **state) {
  (void)state;
  if (wh_init(&g_h)) return -1;
  snprintf(g_root, sizeof g_root, "%.100s", g_h.dir);
  chmod(g_root, 0755); /* nobody must traverse it in the group test */
  return 0;
}

static int teardown(void **state) {
  (void)state;
  wh_fini(&g_h);
  return 0;
}

static void expect_refused(const char *dir) {
  pid_t p = 0;
  assert_int_equal(run_broker(dir, NULL, NULL, &p), 1);
  char s[400];
  snprintf(s, sizeof s, "%s/clients", dir);
  assert_int_not_equal(access(s, F_OK), 0);
}

static void test_squatted_directories_refused(void **state) {
  (void)state;
  char d[300];
  snprintf(d, sizeof d, "%s/foreign", g_root); /* another uid's */
  assert_int_equal(mkdir(d, 0700), 0);
  assert_int_equal(chown(d, sec_nobody_uid, sec_nobody_gid), 0);
  expect_refused(d);
  snprintf(d, sizeof d, "%s/open", g_root); /* world-writable */
  assert_int_equal(mkdir(d, 0700), 0);
  assert_int_equal(chmod(d, 0777), 0);
  expect_refused(d);
  snprintf(d, sizeof d, "%s/readable", g_root); /* others may list and connect */
  assert_int_equal(mkdir(d, 0755), 0);
  assert_int_equal(chmod(d, 0755), 0);
  expect_refused(d);
  char target[300];
  snprintf(target, sizeof target, "%s/real", g_root); /* a symlink to a good directory */
  assert_int_equal(mkdir(target, 0700), 0);
  snprintf(d, sizeof d, "%s/link", g_root);
  assert_int_equal(symlink(target, d), 0);
  expect_refused(d);
}

static void test_created_private(void **state) {
  (void)state;
  char d[300], s[400];
  snprintf(d, sizeof d, "%s/fresh", g_root);
  umask(0);
  pid_t p = 0;
  int rc = run_broker(d, NULL, NULL, &p);
  umask(022);
  assert_int_equal(rc, 0);
  struct stat st;
  assert_int_equal(lstat(d, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0700);
  assert_int_equal(st.st_uid, geteuid());
  snprintf(s, sizeof s, "%s/clients", d);
  assert_int_equal(lstat(s, &st), 0);
  assert_true(S_ISSOCK(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600); /* even under umask 000 */
  procs_stop(p, SIGTERM, 5000, NULL);
}

static int g_status_code = -1;
static int nobody_status(wh *h) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 0);
  uint64_t tag = wh_send(h, MBD_CMD_STATUS, &k.sb, 0, NULL, NULL);
  mbd_msg *m = wh_wait(h, tag, 5000);
  SEC_CHECK(m != NULL);
  g_status_code = wh_code(m);
  SEC_CHECK(g_status_code == 0);
  mbd_msg_destroy(&m);
  return 0;
}

static void test_group_access(void **state) {
  (void)state;
  char d[256], s[300], gid[32];
  snprintf(d, sizeof d, "%s/grp", g_root);
  snprintf(gid, sizeof gid, "%u", (unsigned)sec_nobody_gid);
  pid_t p = 0;
  assert_int_equal(run_broker(d, "--ipc-group", gid, &p), 0);
  struct stat st;
  assert_int_equal(lstat(d, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0750);
  assert_int_equal(st.st_gid, sec_nobody_gid);
  snprintf(s, sizeof s, "%s/clients", d);
  assert_int_equal(lstat(s, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0660);
  assert_int_equal(st.st_gid, sec_nobody_gid);
  wh c = g_h;
  snprintf(c.clients, sizeof c.clients, "ipc://%s", s);
  assert_int_equal(sec_as_nobody(&c, nobody_status), 0);
  procs_stop(p, SIGTERM, 5000, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_squatted_directories_refused),
      cmocka_unit_test(test_created_private),
      cmocka_unit_test(test_group_access),
  };
  int rc = sec_init();
  if (rc) return rc;
  return cmocka_run_group_tests(tests, setup, teardown);
}
