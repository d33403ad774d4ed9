/* One meaning per knob, with real worker processes against a ZeroMQ ROUTER
 * standing where the broker's workers socket is (so the test sees READY as
 * sent and can refuse it):
 *  - READY's capacity is --capacity (in-flight requests); the route's
 *    state_capacity is --sessions, which defaults to --capacity;
 *  - --capacity beyond what the broker accepts fails at start (exit 2);
 *  - a refused READY (ERROR with tag 0) makes the worker exit non-zero with
 *    the broker's reason, instead of re-registering in a loop;
 *  - MBD_GEMM_MODE is honoured, an explicit --gemm-mode wins over it, and an
 *    invalid value stops the worker naming the three valid modes;
 *  - `mambad up` hands broker.max_message_mb to every worker it starts, and
 *    reports a crash-looping worker while its backoff grows;
 *  - a worker that cannot start says why, and `mambad status` shows it;
 *  - one request id follows a request from the CLI through the broker's and
 *    the worker's logs, whose lines carry an ISO-8601 date and time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/defaults.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "support/worker_harness.h"

static wh g;
static void *g_router;

static int setup(void **state) {
  (void)state;
  int rc = wh_init(&g);
  if (rc) return rc == 77 ? 0 : -1;
  g.zctx = zmq_ctx_new();
  g_router = zmq_socket(g.zctx, ZMQ_ROUTER);
  int linger = 0;
  zmq_setsockopt(g_router, ZMQ_LINGER, &linger, sizeof linger);
  return zmq_bind(g_router, g.workers) ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  if (g_router) zmq_close(g_router);
  g_router = NULL;
  wh_fini(&g);
  return 0;
}

/* Starts mambad-worker with output in dir/<name>.log; extra args NULL-ended. */
static pid_t worker(const char *name, const char *env, ...) {
  char exe[600], model[600], log[400];
  snprintf(exe, sizeof exe, "%s/mambad-worker", g.bin);
  snprintf(model, sizeof model, "tiny=%s", g.model_dir);
  snprintf(log, sizeof log, "%s/%s.log", g.dir, name);
  char *argv[32] = {exe, "--connect", g.workers, "--name", (char *)name, "--model", model,
                    "--heartbeat-ms", "100", "--liveness", "2", "--threads", "1"};
  int n = 13;
  va_list ap;
  va_start(ap, env);
  const char *a;
  while ((a = va_arg(ap, const char *)) && n < 30) argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  if (env) setenv("MBD_GEMM_MODE", env, 1);
  else unsetenv("MBD_GEMM_MODE");
  pid_t p = procs_spawn(argv, log);
  unsetenv("MBD_GEMM_MODE");
  return p;
}

/* Exit status of p within ms (reaped), or -1 if it is still running (then killed). */
static int exit_within(pid_t p, int ms) {
  for (int t = 0; t < ms; t += 20) {
    int st = 0;
    if (waitpid(p, &st, WNOHANG) == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    usleep(20000);
  }
  kill(p, SIGKILL);
  waitpid(p, NULL, 0);
  return -1;
}

static void read_log(const char *name, char *out, size_t cap) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s.log", g.dir, name);
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = '\0';
  fclose(f);
}

/* The next READY on the router: its decoded route and capacity; the routing
 * id goes to ident. Fails the test after 20 s. */
static void next_ready(mbd_route_identity *route, uint64_t *capacity, uint8_t *ident,
                       size_t *ident_len) {
  zmq_pollitem_t it = {.socket = g_router, .events = ZMQ_POLLIN};
  for (int k = 0; k < 200; k++) {
    if (zmq_poll(&it, 1, 100) <= 0) continue;
    mbd_msg *m = NULL;
    if (mbd_msg_recv(g_router, true, 0, &m, NULL)) {
      mbd_msg_destroy(&m);
      continue;
    }
    if (mbd_msg_cmd(m) != MBD_CMD_READY) {
      mbd_msg_destroy(&m);
      continue;
    }
    const void *peer = mbd_msg_peer(m, ident_len);
    memcpy(ident, peer, *ident_len);
    mbd_body *b = wh_body(m);
    char enc[1024] = "";
    assert_int_equal(mbd_obj_str(mbd_body_root(b), "route", true, enc, sizeof enc, NULL), 0);
    assert_int_equal(mbd_obj_u64(mbd_body_root(b), "capacity", true, capacity, NULL), 0);
    assert_int_equal(mbd_route_decode(enc, strlen(enc), route, NULL), 0);
    mbd_body_destroy(&b);
    mbd_msg_destroy(&m);
    return;
  }
  fail_msg("no READY within 20 s");
}

static void test_capacity_and_sessions(void **state) {
  (void)state;
  if (!g_router) skip();
  mbd_route_identity r;
  uint64_t cap = 0;
  uint8_t id[256];
  size_t idl = 0;
  pid_t p = worker("w1", NULL, "--capacity", "3", "--sessions", "7", NULL);
  next_ready(&r, &cap, id, &idl);
  assert_int_equal(cap, 3);
  assert_int_equal(r.state_capacity, 7);
  wh_stop(p, SIGTERM);
  p = worker("w2", NULL, "--capacity", "5", NULL);
  next_ready(&r, &cap, id, &idl);
  assert_int_equal(cap, 5);
  assert_int_equal(r.state_capacity, 5);
  wh_stop(p, SIGTERM);
  /* beyond the broker's limit: refused at start, naming the flag */
  char big[16], log[4096];
  snprintf(big, sizeof big, "%d", MBD_CAPACITY_MAX + 1);
  p = worker("w3", NULL, "--capacity", big, NULL);
  assert_int_equal(exit_within(p, 10000), 2);
  read_log("w3", log, sizeof log);
  assert_non_null(strstr(log, "--capacity"));
}

static void test_refused_ready_is_fatal(void **state) {
  (void)state;
  if (!g_router) skip();
  mbd_route_identity r;
  uint64_t cap = 0;
  uint8_t id[256];
  size_t idl = 0;
  pid_t p = worker("w4", NULL, NULL);
  next_ready(&r, &cap, id, &idl);
  mbd_msg *e = NULL;
  assert_int_equal(mbd_msg_new_error(0, MBD_E_INVALID, "READY: test refuses this worker", &e, NULL), 0);
  assert_int_equal(mbd_msg_set_peer(e, id, idl, NULL), 0);
  assert_int_equal(mbd_msg_send(&e, g_router, 0, NULL), 0);
  int rc = exit_within(p, 10000);
  assert_true(rc > 0);
  char log[8192];
  read_log("w4", log, sizeof log);
  assert_non_null(strstr(log, "refused this worker's registration"));
  assert_non_null(strstr(log, "test refuses this worker"));
}

static void test_gemm_mode_env(void **state) {
  (void)state;
  if (!g_router) skip();
  char log[8192];
  /* invalid: an error naming the three valid modes */
  pid_t p = worker("w5", "fastest", NULL);
  assert_int_equal(exit_within(p, 10000), 2);
  read_log("w5", log, sizeof log);
  assert_non_null(strstr(log, "MBD_GEMM_MODE"));
  assert_non_null(strstr(log, "deterministic"));
  assert_non_null(strstr(log, "cublas-fast"));
  assert_non_null(strstr(log, "cublas-pedantic"));
  /* honoured: the CPU backend runs deterministic only, so cublas-fast stops it */
  p = worker("w6", "cublas-fast", NULL);
  assert_int_not_equal(exit_within(p, 10000), 0);
  read_log("w6", log, sizeof log);
  assert_non_null(strstr(log, "cublas-fast"));
  /* an explicit flag wins over the environment */
  mbd_route_identity r;
  uint64_t cap = 0;
  uint8_t id[256];
  size_t idl = 0;
  p = worker("w7", "cublas-fast", "--gemm-mode", "deterministic", NULL);
  next_ready(&r, &cap, id, &idl);
  assert_int_equal(r.mode, MBD_GEMM_DETERMINISTIC);
  wh_stop(p, SIGTERM);
}

/* `mambad up`'s worker command lines carry broker.max_message_mb. */
static void test_up_passes_message_size(void **state) {
  (void)state;
  if (!g_router) skip();
  zmq_close(g_router); /* mambad up starts its own broker on a fresh endpoint pair */
  g_router = NULL;
  char yaml[2400], path[700], up[600], log[700];
  snprintf(path, sizeof path, "%s/deploy.yaml", g.dir);
  snprintf(yaml, sizeof yaml,
           "broker:\n  clients: ipc://%s/uc\n  workers: ipc://%s/uw\n  max_message_mb: 77\n"
           "models:\n  - name: tiny\n    path: %s\n"
           "workers:\n  - {name: k1, device: cpu, threads: 1}\n",
           g.dir, g.dir, g.model_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(yaml, f);
  fclose(f);
  snprintf(up, sizeof up, "%s/mambad-up", g.bin);
  snprintf(log, sizeof log, "%s/up.log", g.dir);
  char *argv[] = {up, "--config", path, NULL};
  pid_t p = procs_spawn(argv, log);
  /* find the worker among up's children and read its command line */
  bool found = false;
  for (int k = 0; k < 200 && !found; k++) {
    usleep(50000);
    char cmd[300], out[4096] = "";
    snprintf(cmd, sizeof cmd,
             "for c in $(pgrep -P %d); do tr '\\0' ' ' </proc/$c/cmdline; echo; done", (int)p);
    FILE *pp = popen(cmd, "r");
    if (!pp) continue;
    size_t n = fread(out, 1, sizeof out - 1, pp);
    out[n] = '\0';
    pclose(pp);
    char *w = strstr(out, "mambad-worker");
    if (w) {
      assert_non_null(strstr(w, "--max-message-mb 77"));
      found = true;
    }
  }
  procs_stop(p, SIGTERM, 10000, NULL);
  assert_true(found);
}

/* A worker whose model never loads: `mambad up` backs off more each time
 * and says it is crash-looping. */
static void test_up_reports_crash_loop(void **state) {
  (void)state;
  if (!g_router) skip();
  zmq_close(g_router);
  g_router = NULL;
  char yaml[2400], path[700], up[600], log[700], bad[400];
  snprintf(bad, sizeof bad, "%s/broken", g.dir);
  assert_int_equal(procs_sh("mkdir -p '%s' && echo '{}' > '%s/config.json'", bad, bad), 0);
  snprintf(path, sizeof path, "%s/deploy.yaml", g.dir);
  snprintf(yaml, sizeof yaml,
           "broker:\n  clients: ipc://%s/uc\n  workers: ipc://%s/uw\n"
           "models:\n  - name: broken\n    path: %s\n"
           "workers:\n  - {name: k2, device: cpu, threads: 1}\n",
           g.dir, g.dir, bad);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(yaml, f);
  fclose(f);
  snprintf(up, sizeof up, "%s/mambad-up", g.bin);
  snprintf(log, sizeof log, "%s/up.log", g.dir);
  char *argv[] = {up, "--config", path, NULL};
  pid_t p = procs_spawn(argv, log);
  static char text[1 << 16];
  bool looping = false;
  for (int k = 0; k < 300 && !looping; k++) {
    usleep(50000);
    text[0] = '\0';
    FILE *lf = fopen(log, "r");
    if (!lf) continue;
    size_t n = fread(text, 1, sizeof text - 1, lf);
    text[n] = '\0';
    fclose(lf);
    looping = strstr(text, "k2 is crash-looping") != NULL;
  }
  procs_stop(p, SIGTERM, 10000, NULL);
  assert_true(looping);
  /* the backoff grew: 250, 500, 1000, 2000 ms */
  assert_non_null(strstr(text, "restarting in 250 ms"));
  assert_non_null(strstr(text, "restarting in 500 ms"));
  assert_non_null(strstr(text, "restarting in 1000 ms"));
  assert_non_null(strstr(text, "restarting in 2000 ms"));
}

/* The request id of `mambad forward --verbose` shows in the broker's and the
 * worker's debug logs: one id follows the request client -> broker -> worker. */
static void test_request_id_follows(void **state) {
  (void)state;
  if (!g_router) skip();
  zmq_close(g_router);
  g_router = NULL;
  char exe[600], blog[400], wlog[400], model[600];
  snprintf(blog, sizeof blog, "%s/broker.log", g.dir);
  snprintf(wlog, sizeof wlog, "%s/wt.log", g.dir);
  setenv("MBD_LOG_LEVEL", "debug", 1);
  snprintf(exe, sizeof exe, "%s/mambad-broker", g.bin);
  char *bargv[] = {exe, "--clients", g.clients, "--workers", g.workers, "--heartbeat-ms", "200",
                   NULL};
  g.broker = procs_spawn(bargv, blog);
  char wexe[600];
  snprintf(wexe, sizeof wexe, "%s/mambad-worker", g.bin);
  snprintf(model, sizeof model, "tiny=%s", g.model_dir);
  char *wargv[] = {wexe, "--connect", g.workers, "--name", "wt", "--model", model,
                   "--heartbeat-ms", "200", "--threads", "1", NULL};
  pid_t w = procs_spawn(wargv, wlog);
  unsetenv("MBD_LOG_LEVEL");
  char out[8192] = "";
  int rc = -1;
  for (int k = 0; k < 100 && rc; k++) { /* until the worker has registered */
    usleep(100000);
    rc = procs_sh("'%s/mambad' model prompt --out '%s/in.st' --batch 1 --len 4 --vocab 256 "
                  ">/dev/null 2>&1 && MAMBAD_CONNECT='%s' '%s/mambad' forward --model tiny "
                  "--input '%s/in.st' --output '%s/out.st' --verbose 2>'%s/cli.err'",
                  g.bin, g.dir, g.clients, g.bin, g.dir, g.dir, g.dir);
  }
  assert_int_equal(rc, 0);
  char path[400];
  snprintf(path, sizeof path, "%s/cli.err", g.dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  fclose(f);
  const char *p = strstr(out, "request ");
  assert_non_null(p);
  char id[40] = "";
  assert_int_equal(sscanf(p, "request %39s", id), 1);
  assert_int_equal(strlen(id), 16);
  usleep(300000);
  static char text[1 << 17];
  char needle[64];
  snprintf(needle, sizeof needle, "request %s: forward", id);
  for (int k = 0; k < 2; k++) {
    f = fopen(k ? wlog : blog, "r");
    assert_non_null(f);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    if (!strstr(text, needle)) fail_msg("'%s' not in the %s log", needle, k ? "worker" : "broker");
    /* log lines carry an ISO-8601 date and time: [YYYY-MM-DDTHH:MM:SS.mmmZ] */
    const char *l = strstr(text, needle);
    while (l > text && l[-1] != '\n') l--;
    assert_true(l[0] == '[' && l[5] == '-' && l[8] == '-' && l[11] == 'T' && l[24] == 'Z');
  }
  wh_stop(w, SIGTERM);
}

/* A worker whose model does not load tells the broker why before it exits;
 * `mambad status` says which models have no worker and why, until a worker
 * of that name registers. */
static void test_status_says_why_model_missing(void **state) {
  (void)state;
  if (!g_router) skip();
  zmq_close(g_router);
  g_router = NULL;
  char exe[600], bad[400], model[600], out[8192];
  snprintf(bad, sizeof bad, "%s/broken", g.dir);
  assert_int_equal(procs_sh("mkdir -p '%s' && echo '{}' > '%s/config.json'", bad, bad), 0);
  snprintf(exe, sizeof exe, "%s/mambad-broker", g.bin);
  char *bargv[] = {exe, "--clients", g.clients, "--workers", g.workers, "--heartbeat-ms", "200",
                   NULL};
  g.broker = procs_spawn(bargv, NULL);
  char wexe[600];
  snprintf(wexe, sizeof wexe, "%s/mambad-worker", g.bin);
  snprintf(model, sizeof model, "broken=%s", bad);
  char *wargv[] = {wexe, "--connect", g.workers, "--name", "wbad", "--model", model, NULL};
  pid_t w = procs_spawn(wargv, NULL);
  assert_int_equal(exit_within(w, 20000), 1);
  bool said = false;
  for (int k = 0; k < 50 && !said; k++) {
    usleep(100000);
    if (procs_sh("MAMBAD_CONNECT='%s' '%s/mambad' status > '%s/status.out' 2>&1", g.clients, g.bin,
                 g.dir))
      continue;
    char path[400];
    snprintf(path, sizeof path, "%s/status.out", g.dir);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    said = strstr(out, "worker wbad is not running (models broken)") != NULL;
  }
  if (!said) fail_msg("status did not say why: %s", out);
  assert_non_null(strstr(out, "broken")); /* the loader's reason names the model */
  /* a worker of that name registers: the failure is history */
  snprintf(model, sizeof model, "tiny=%s", g.model_dir);
  char *gargv[] = {wexe, "--connect", g.workers, "--name", "wbad", "--model", model, "--threads",
                   "1", NULL};
  w = procs_spawn(gargv, NULL);
  bool cleared = false;
  for (int k = 0; k < 100 && !cleared; k++) {
    usleep(100000);
    if (procs_sh("MAMBAD_CONNECT='%s' '%s/mambad' status | grep -q '^wbad ' && "
                 "! MAMBAD_CONNECT='%s' '%s/mambad' status | grep -q 'not running'",
                 g.clients, g.bin, g.clients, g.bin) == 0)
      cleared = true;
  }
  wh_stop(w, SIGTERM);
  assert_true(cleared);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_capacity_and_sessions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused_ready_is_fatal, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gemm_mode_env, setup, teardown),
      cmocka_unit_test_setup_teardown(test_up_passes_message_size, setup, teardown),
      cmocka_unit_test_setup_teardown(test_up_reports_crash_loop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_request_id_follows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_status_says_why_model_missing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
