/* `mambad up` on a deployment whose endpoints are tcp + CURVE, with real
 * processes: the supervisor's readiness poll is admitted (with a key pair
 * of its own that it adds to the broker's operator keys), so it prints
 * "ready" with the workers' pids, although the YAML admits no client key at
 * all. No root needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/curve.h"
#include "support/events.h"
#include "support/svc.h"

static svc s; /* file scope so the teardown can stop it after a failed assert */

static int teardown(void **state) {
  (void)state;
  svc_cleanup(&s);
  return 0;
}

/* Makes the key pair dir/name.{key,pub}. */
static void keypair(const char *name) {
  char prefix[300];
  mbd_curve_pair p;
  snprintf(prefix, sizeof prefix, "%s/%s", s.dir, name);
  assert_int_equal(mbd_curve_generate(&p, NULL), 0);
  assert_int_equal(mbd_curve_write(prefix, &p, NULL), 0);
}

/* True once up.log has a line starting with prefix; the line goes to out. */
static bool up_line(const char *prefix, char *out, size_t cap) {
  char path[700], line[1024];
  snprintf(path, sizeof path, "%s/up.log", s.dir);
  FILE *f = fopen(path, "r");
  bool hit = false;
  while (f && !hit && fgets(line, sizeof line, f))
    if (!strncmp(line, prefix, strlen(prefix))) {
      hit = true;
      snprintf(out, cap, "%s", line);
    }
  if (f) fclose(f);
  return hit;
}

static void test_up_ready_over_curve(void **state) {
  (void)state;
  if (!zmq_has("curve")) skip();
  keypair("broker");
  keypair("worker");
  int port = 40000 + (int)(getpid() % 20000);
  char yaml[700];
  svc_write(&s, "deploy.yaml", yaml,
            "broker:\n  clients: tcp://127.0.0.1:%d\n  workers: tcp://127.0.0.1:%d\n"
            "  heartbeat_ms: 200\n  liveness: 3\n"
            "models:\n  - name: tiny\n    path: %s\n"
            "workers:\n  - {name: w0, device: cpu, dtype: f32, threads: 1, capacity: 4}\n"
            "security:\n  curve: true\n  broker_key: %s/broker.key\n"
            "  worker_key: %s/worker.key\n  worker_keys: %s/worker.pub\n",
            port, port + 1, s.fixture, s.dir, s.dir, s.dir);
  setenv("TMPDIR", s.dir, 1); /* where the supervisor puts the poll's key for a moment */
  svc_up(&s, yaml);
  char line[1024] = "";
  bool ready = false;
  for (int i = 0; i < EV_HANG_MS / 50 && !ready; i++) {
    ready = up_line("mambad up: ready", line, sizeof line);
    if (!ready) usleep(50000);
  }
  if (!ready) {
    char out[8192];
    svc_sh(&s, out, sizeof out, "cat '%s/up.log'", s.dir);
    fprintf(stderr, "%s\n", out);
  }
  assert_true(ready);
  assert_non_null(strstr(line, "1 worker registered"));
  /* The poll is an operator: STATUS told it the worker's pid. */
  char wl[1024] = "";
  assert_true(up_line("  worker w0", wl, sizeof wl));
  const char *pid = strstr(wl, " pid ");
  assert_non_null(pid);
  assert_true(atoll(pid + 5) > 0);
  /* The poll's secret was written under $TMPDIR only for the client to read: gone now. */
  char out[256];
  assert_int_not_equal(svc_sh(&s, out, sizeof out, "ls -d '%s'/mambad-up-*", s.dir), 0);
}

int main(void) {
  if (!svc_init(&s)) return 77; /* ctest: skipped */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_up_ready_over_curve, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
