/* `mambad up` end to end: a YAML in a temporary directory starts the broker
 * and a CPU worker; the client's status shows the worker (also through the
 * CLI); a worker killed with SIGKILL is restarted by the supervisor (its
 * restart line in up.log) and re-registers (new uid, same name, same route);
 * SIGTERM stops everything with exit status 0 and no child left. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "support/svc.h"

static svc s; /* file scope so the teardown can stop it after a failed assert */

static int teardown(void **state) {
  (void)state;
  svc_cleanup(&s);
  return 0;
}

static void test_up_status_restart_stop(void **state) {
  (void)state;
  if (!svc_init(&s)) exit(77); /* ctest: skipped */
  char yaml[700], out[8192];
  svc_yaml(&s, "  - {name: w32, device: cpu, dtype: f32, threads: 1, capacity: 4}\n", yaml);
  svc_up(&s, yaml);
  mbd_client *c = svc_client(&s);
  assert_non_null(c);
  const char *names[] = {"w32"};
  mbd_worker_info w;
  int64_t ms = svc_wait_workers(c, names, 1, NULL, &w, EV_HANG_MS);
  if (ms < 0) {
    svc_sh(&s, out, sizeof out, "cat '%s/up.log'", s.dir);
    fprintf(stderr, "worker never registered; up.log:\n%s\n", out);
  }
  assert_true(ms >= 0);
  fprintf(stderr, "worker registered %lld ms after status started answering\n", (long long)ms);

  /* the status report, field by field */
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_client_status(c, &r, &err), 0);
  const mbd_worker_info *wi = svc_find(r, "w32");
  assert_non_null(wi);
  if (!wi) return; /* tells the compiler what assert_non_null guarantees */
  assert_int_equal(strlen(wi->route_id), 64);
  assert_non_null(strstr(wi->route, "dtype=f32"));
  assert_non_null(strstr(wi->route, "backend=cpu"));
  assert_int_equal(wi->n_models, 1);
  assert_string_equal(wi->models[0].name, "tiny");
  assert_true(wi->pid > 0);
  assert_int_equal(wi->capacity, 4);
  char route_id[65];
  snprintf(route_id, sizeof route_id, "%s", wi->route_id);
  mbd_status_report_free(&r);
  assert_null(r);

  /* the CLI shows the same */
  assert_int_equal(svc_sh(&s, out, sizeof out, "'%s/mambad' status --connect '%s'", s.bin, s.clients), 0);
  assert_non_null(strstr(out, "w32"));
  assert_non_null(strstr(out, "tiny"));
  assert_null(strstr(out, route_id)); /* short id only */
  assert_int_equal(
      svc_sh(&s, out, sizeof out, "'%s/mambad' status --full --connect '%s'", s.bin, s.clients), 0);
  assert_non_null(strstr(out, route_id));
  assert_non_null(strstr(out, "mambad-route/3"));

  /* kill -9: the supervisor restarts it and it re-registers */
  pid_t old_pid = (pid_t)w.pid;
  char old_uid[64];
  snprintf(old_uid, sizeof old_uid, "%s", w.uid);
  assert_int_equal(kill(old_pid, SIGKILL), 0);
  int64_t t0 = ev_now_ms();
  char up_log[700], restart[128];
  snprintf(up_log, sizeof up_log, "%s/up.log", s.dir);
  snprintf(restart, sizeof restart, "w32 (pid %d) killed by signal 9", (int)old_pid);
  if (!ev_wait_lines(up_log, restart, 1, EV_HANG_MS)) {
    svc_sh(&s, out, sizeof out, "cat '%s'", up_log);
    fail_msg("no '%s' line in up.log:\n%s", restart, out);
  }
  mbd_worker_info nw;
  ms = svc_wait_workers(c, names, 1, old_uid, &nw, EV_HANG_MS);
  assert_true(ms >= 0);
  fprintf(stderr, "killed worker re-registered after %lld ms (liveness window 600 ms + backoff)\n",
          (long long)(ev_now_ms() - t0));
  assert_true(nw.pid != old_pid);
  assert_string_not_equal(nw.uid, old_uid);
  assert_string_equal(nw.route_id, route_id); /* same build, same route */

  /* and it serves */
  int64_t ids[4] = {1, 2, 3, 4}, shape[2] = {1, 4};
  mbd_tensor_in in = {.data = ids};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  mbd_tensor_out logits = {0};
  assert_int_equal(mbd_client_forward(c, NULL, "tiny", &in, true, NULL, &logits, &err), 0);
  assert_string_equal(mbd_client_last_reply(c)->worker, "w32");
  assert_int_equal(logits.desc.ndim, 2);
  assert_int_equal(logits.desc.shape[1], 512);
  mbd_tensor_out_release(&logits);
  mbd_client_destroy(&c);

  /* SIGTERM: clean stop, exit 0, children gone */
  int st = svc_down(&s, EV_HANG_MS);
  assert_true(st >= 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  /* up reaps its children before it exits: the worker's pid is gone now. */
  assert_int_equal(kill((pid_t)nw.pid, 0), -1);
  assert_int_equal(errno, ESRCH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_up_status_restart_stop, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
