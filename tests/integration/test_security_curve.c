/* CURVE with ZAP on tcp endpoints, with real processes: a broker whose tcp
 * endpoints are CURVE servers admits a listed worker and a listed client
 * (requests route and are answered) and rejects an unlisted worker key and an
 * unlisted client key (never registered / never answered; the broker logs the
 * key). A worker whose key is refused exits non-zero saying so. STATUS detail
 * goes only to an operator key. Sessions of a CURVE client that was killed
 * are closed on their worker. tcp without CURVE is refused at start-up
 * unless marked insecure. No root needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/curve.h"
#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

static wh g_h;
static char g_cep[64], g_wep[64], g_log[320], g_wbadlog[320];
static mbd_curve_pair g_broker, g_wgood, g_wbad, g_cgood, g_cbad, g_op;
static pid_t g_bpid, g_wbadpid;

static void keyfile(const char *name, mbd_curve_pair *p, char *path, size_t cap) {
  char prefix[300];
  snprintf(prefix, sizeof prefix, "%s/%s", g_h.dir, name);
  assert_int_equal(mbd_curve_generate(p, NULL), 0);
  assert_int_equal(mbd_curve_write(prefix, p, NULL), 0);
  snprintf(path, cap, "%s.key", prefix);
}

/* Lines of the file at path that contain needle. */
static int log_count(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

/* Waits (ms is a guard against hangs) until the broker log has n lines with needle. */
static bool wait_log_n(const char *needle, int n, int ms) {
  for (int i = 0; i < ms / 20; i++) {
    if (log_count(g_log, needle) >= n) return true;
    usleep(20000);
  }
  return false;
}

static bool wait_log(const char *needle, int ms) { return wait_log_n(needle, 1, ms); }

/* A client DEALER to the clients endpoint with key pair k (NULL: no CURVE). */
static void client_open(wh *c, const mbd_curve_pair *k) {
  *c = g_h;
  c->zctx = zmq_ctx_new();
  c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
  if (k) assert_int_equal(mbd_curve_client(c->sock, k, g_broker.public_key, NULL), 0);
  assert_int_equal(zmq_connect(c->sock, g_cep), 0);
}

static void client_close(wh *c) {
  zmq_close(c->sock);
  zmq_ctx_term(c->zctx);
}

/* STATUS through c: number of workers, and whether worker 0 shows its uid. */
static int status(wh *c, int timeout_ms, bool *detail) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  uint64_t tag = wh_send(c, MBD_CMD_STATUS, &p.sb, 0, NULL, NULL);
  mbd_msg *m = wh_wait(c, tag, timeout_ms);
  if (!m) return -1;
  mbd_body *b = wh_body(m);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
  int n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? (int)ws->via.array.size : -1;
  if (detail) *detail = n > 0 && mbd_obj_get(&ws->via.array.ptr[0], "uid") != NULL;
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  return n;
}

static int setup(void **state) {
  (void)state;
  if (wh_init(&g_h)) return -1;
  int port = 20000 + (int)(getpid() % 20000);
  snprintf(g_cep, sizeof g_cep, "tcp://127.0.0.1:%d", port);
  snprintf(g_wep, sizeof g_wep, "tcp://127.0.0.1:%d", port + 1);
  snprintf(g_log, sizeof g_log, "%s/broker.log", g_h.dir);
  snprintf(g_wbadlog, sizeof g_wbadlog, "%s/wbad.log", g_h.dir);
  char bkey[320], wkey[320], wbad[320], ckey[320], cbad[320], opkey[320];
  keyfile("broker", &g_broker, bkey, sizeof bkey);
  keyfile("wgood", &g_wgood, wkey, sizeof wkey);
  keyfile("wbad", &g_wbad, wbad, sizeof wbad);
  keyfile("cgood", &g_cgood, ckey, sizeof ckey);
  keyfile("cbad", &g_cbad, cbad, sizeof cbad);
  keyfile("op", &g_op, opkey, sizeof opkey);
  char exe[600], wpub[320], cpub[320], oppub[320];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g_h.bin);
  snprintf(wpub, sizeof wpub, "%s/wgood.pub", g_h.dir);
  snprintf(cpub, sizeof cpub, "%s/cgood.pub", g_h.dir);
  snprintf(oppub, sizeof oppub, "%s/op.pub", g_h.dir);
  char *argv[] = {exe, "--clients", g_cep, "--workers", g_wep, "--heartbeat-ms", "200",
                  "--curve-secret", bkey, "--worker-keys", wpub, "--client-keys", cpub,
                  "--operator-keys", oppub, "--reclaim-grace-ms", "300", NULL};
  g_bpid = procs_spawn(argv, g_log);
  if (!wait_log("broker ready", 20000)) {
    procs_sh("cat '%s' >&2", g_log);
    return -1;
  }
  char wx[600], model[600];
  snprintf(wx, sizeof wx, "%s/mambad-worker", g_h.bin);
  snprintf(model, sizeof model, "tiny=%s", g_h.model_dir);
  char *good[] = {wx, "--connect", g_wep, "--name", "wgood", "--model", model, "--heartbeat-ms",
                  "200", "--threads", "1", "--capacity", "4", "--client-sessions", "2",
                  "--curve-secret", wkey, "--server-key", g_broker.public_key, NULL};
  char *bad[] = {wx, "--connect", g_wep, "--name", "wbad", "--model", model, "--heartbeat-ms",
                 "200", "--threads", "1", "--curve-secret", wbad, "--server-key",
                 g_broker.public_key, NULL};
  g_h.procs[g_h.nprocs++] = procs_spawn(good, NULL);
  g_wbadpid = procs_spawn(bad, g_wbadlog);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  g_h.broker = g_bpid;
  if (g_wbadpid > 0) procs_stop(g_wbadpid, SIGKILL, 1000, NULL);
  wh_fini(&g_h);
  return 0;
}

static void test_routing_over_curve(void **state) {
  (void)state;
  wh c;
  client_open(&c, &g_cgood);
  int n = -1;
  for (int i = 0; i < 200 && n < 1; i++) {
    n = status(&c, 5000, NULL);
    if (n < 1) usleep(50000);
  }
  assert_int_equal(n, 1);
  /* A GEMM routed to the CURVE worker and answered. */
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "f32");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 2);
  int64_t sa[2] = {2, 3}, sb[2] = {2, 3};
  wh_ref(&p.pk, "a", "f32", 2, sa, 0);
  wh_ref(&p.pk, "b", "f32", 2, sb, 1);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 0, 1, 0};
  const void *pl[2] = {a, b};
  size_t len[2] = {sizeof a, sizeof b};
  mbd_msg *m = wh_call(&c, MBD_CMD_GEMM, &p.sb, 2, pl, len);
  assert_non_null(m);
  assert_int_equal(wh_code(m), 0);
  char wname[64] = "";
  wh_str(m, "worker", wname, sizeof wname);
  assert_string_equal(wname, "wgood");
  size_t tl = 0;
  const float *cc = wh_tensor(m, &tl);
  assert_int_equal(tl, 16);
  float want[4] = {1, 2, 4, 5};
  assert_memory_equal(cc, want, sizeof want);
  mbd_msg_destroy(&m);
  bool detail = true;
  assert_int_equal(status(&c, 5000, &detail), 1);
  assert_false(detail); /* a plain client key: no uids, hosts, pids */
  client_close(&c);
  client_open(&c, &g_op);
  assert_int_equal(status(&c, 5000, &detail), 1);
  assert_true(detail);
  client_close(&c);
  /* The CLI (libmambad) over CURVE with its key from the environment; without
   * it, the same command cannot get an answer. */
  char out[400];
  snprintf(out, sizeof out, "%s/status.txt", g_h.dir);
  assert_int_equal(procs_sh("MAMBAD_CURVE_KEY='%s/cgood.key' MAMBAD_SERVER_KEY='%s/broker.pub' "
                            "'%s/mambad' status --connect '%s' > '%s' 2>&1",
                            g_h.dir, g_h.dir, g_h.bin, g_cep, out),
                   0);
  assert_int_equal(procs_sh("grep -q wgood '%s'", out), 0);
  assert_int_not_equal(procs_sh("'%s/mambad' status --connect '%s' --deadline-ms 500 >/dev/null 2>&1",
                                g_h.bin, g_cep),
                       0);
}

static void test_unlisted_keys_rejected(void **state) {
  (void)state;
  char needle[160];
  snprintf(needle, sizeof needle, "rejected workers connection from 127.0.0.1: key not admitted (key %s)",
           g_wbad.public_key);
  assert_true(wait_log(needle, 10000));
  wh c;
  client_open(&c, &g_cgood);
  assert_int_equal(status(&c, 5000, NULL), 1); /* only wgood */
  client_close(&c);
  client_open(&c, &g_cbad);
  assert_int_equal(status(&c, 1500, NULL), -1); /* handshake refused: no answer */
  client_close(&c);
  snprintf(needle, sizeof needle, "rejected clients connection from 127.0.0.1: key not admitted (key %s)",
           g_cbad.public_key);
  assert_true(wait_log(needle, 10000));
  client_open(&c, NULL); /* no CURVE at all */
  assert_int_equal(status(&c, 1500, NULL), -1);
  client_close(&c);
}

/* A worker whose CURVE key the broker does not admit cannot register: it
 * exits non-zero, saying that the broker refused its key (a supervisor then
 * backs off and reports it). */
static void test_refused_worker_exits(void **state) {
  (void)state;
  int st = procs_wait_exit(g_wbadpid, 30000);
  g_wbadpid = 0;
  if (st == -1) procs_sh("cat '%s' >&2", g_wbadlog);
  assert_int_not_equal(st, -1);
  assert_true(WIFEXITED(st));
  assert_int_not_equal(WEXITSTATUS(st), 0);
  char needle[160];
  snprintf(needle, sizeof needle, "refused this worker's CURVE key %s", g_wbad.public_key);
  if (log_count(g_wbadlog, needle) < 1) procs_sh("cat '%s' >&2", g_wbadlog);
  assert_true(log_count(g_wbadlog, needle) >= 1);
}

/* Opens sessions through c until it holds `want` (BUSY retried for up to 20 s). */
static int open_until(wh *c, int want) {
  int have = 0;
  for (int i = 0; i < 1000 && have < want; i++) {
    char sid[64] = "";
    mbd_msg *m = wh_open(c, sid, sizeof sid);
    int code = wh_code(m);
    mbd_msg_destroy(&m);
    if (code != 0 && code != MBD_E_BUSY) return -1;
    if (code == 0) have++;
    else usleep(20000);
  }
  return have == want ? 0 : -1;
}

/* A CURVE client holding its limit of sessions (--client-sessions 2) is
 * killed: the broker notices its connection is gone and, after the grace
 * period, closes both sessions on the worker, so the same key can open two
 * again long before the idle timeout. */
static void test_killed_tcp_client_reclaimed(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t p = fork();
  assert_true(p >= 0);
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a test that failed before the kill */
    close(fds[0]);
    wh c;
    client_open(&c, &g_cgood);
    char ok = open_until(&c, 2) == 0 ? 'k' : 'f';
    if (write(fds[1], &ok, 1) != 1) _exit(1);
    for (;;) pause(); /* holds the sessions until killed */
  }
  close(fds[1]);
  char ok = 0;
  assert_int_equal(read(fds[0], &ok, 1), 1);
  close(fds[0]);
  assert_int_equal(ok, 'k');
  /* Held: the same key is refused a third session. */
  wh c;
  client_open(&c, &g_cgood);
  char sid[64] = "";
  mbd_msg *m = wh_open(&c, sid, sizeof sid);
  assert_int_equal(wh_code(m), MBD_E_BUSY);
  mbd_msg_destroy(&m);
  client_close(&c);
  int before = log_count(g_log, "its connection is gone");
  assert_int_equal(kill(p, SIGKILL), 0);
  int st = 0;
  assert_int_equal(waitpid(p, &st, 0), p);
  if (!wait_log_n("its connection is gone", before + 2, 30000)) procs_sh("cat '%s' >&2", g_log);
  char needle[160];
  snprintf(needle, sizeof needle, "its client (key:%s) is gone", g_cgood.public_key);
  assert_true(log_count(g_log, needle) >= 2);
  client_open(&c, &g_cgood);
  assert_int_equal(open_until(&c, 2), 0); /* the worker freed them */
  client_close(&c);
}

static void test_tcp_without_curve_refused(void **state) {
  (void)state;
  char exe[600], log[400];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g_h.bin);
  snprintf(log, sizeof log, "%s/plain.log", g_h.dir);
  char *argv[] = {exe, "--clients", "tcp://127.0.0.1:1", "--workers", "tcp://127.0.0.1:2", NULL};
  pid_t p = procs_spawn(argv, log);
  int st = 0;
  assert_int_equal(waitpid(p, &st, 0), p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_routing_over_curve),
      cmocka_unit_test(test_unlisted_keys_rejected),
      cmocka_unit_test(test_refused_worker_exits),
      cmocka_unit_test(test_killed_tcp_client_reclaimed),
      cmocka_unit_test(test_tcp_without_curve_refused),
  };
  if (!getenv("MBD_BIN_DIR") || !getenv("MBD_FIXTURES_DIR")) return 77;
  if (!zmq_has("curve")) {
    printf("SKIP: this libzmq has no CURVE\n");
    return 77;
  }
  return cmocka_run_group_tests(tests, setup, teardown);
}
