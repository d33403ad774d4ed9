/* A multi-host deployment in network namespaces the test makes itself: the
 * broker on "host" b, two CPU workers on w1 and w2 and the client on c, each
 * joined to b by a veth pair, everything over tcp with CURVE. Routing works
 * across the hosts; an unlisted worker key and an unlisted client key are
 * rejected; a worker host whose link goes down is dropped within the liveness
 * window, its in-flight stateless requests are re-sent to the other, which keeps
 * answering, and it rejoins when
 * the link is back. Needs root and iproute2 (`ip netns`); skips with the
 * reason otherwise. */
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/curve.h"
#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define IP "/usr/sbin/ip"

static wh g_h;
static char g_ns[4][32]; /* b, w1, w2, c */
static char g_log[320];
static mbd_curve_pair g_broker, g_w1, g_w2, g_wbad, g_cgood, g_cbad;
static pid_t g_pids[8];
static int g_npids;
static bool g_made;

static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  return procs_sh("%s", cmd);
}

static void keyfile(const char *name, mbd_curve_pair *p, char *path, size_t cap) {
  char prefix[300];
  snprintf(prefix, sizeof prefix, "%s/%s", g_h.dir, name);
  assert_int_equal(mbd_curve_generate(p, NULL), 0);
  assert_int_equal(mbd_curve_write(prefix, p, NULL), 0);
  snprintf(path, cap, "%s.key", prefix);
}

static bool log_has(const char *needle) {
  FILE *f = fopen(g_log, "r");
  if (!f) return false;
  char line[1024];
  bool hit = false;
  while (!hit && fgets(line, sizeof line, f)) hit = strstr(line, needle) != NULL;
  fclose(f);
  return hit;
}

static bool wait_log(const char *needle, int ms) {
  for (int i = 0; i < ms / 20; i++) {
    if (log_has(needle)) return true;
    usleep(20000);
  }
  return false;
}

/* Runs argv inside namespace ns (ip netns exec), output to log (NULL: ours). */
static pid_t spawn_in(const char *ns, char *const *argv, const char *log) {
  char *full[40] = {IP, "netns", "exec", (char *)ns};
  int n = 4;
  for (int i = 0; argv[i] && n < 39; i++) full[n++] = argv[i];
  full[n] = NULL;
  pid_t p = procs_spawn(full, log);
  if (g_npids < 8) g_pids[g_npids++] = p;
  return p;
}

static void *g_zctx;

static void *client(const mbd_curve_pair *k) {
  void *s = zmq_socket(g_zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  assert_int_equal(mbd_curve_client(s, k, g_broker.public_key, NULL), 0);
  assert_int_equal(zmq_connect(s, "tcp://10.77.3.1:5555"), 0);
  return s;
}

/* One request on socket s through a wh view of it; NULL after timeout_ms. */
static mbd_msg *call(void *s, uint8_t cmd, wh_pack *p, int n, const void *const *pl,
                     const size_t *len, int timeout_ms) {
  wh c = g_h;
  c.sock = s;
  uint64_t tag = wh_send(&c, cmd, &p->sb, n, pl, len);
  g_h.next_tag = c.next_tag;
  return wh_wait(&c, tag, timeout_ms);
}

static int nworkers(void *s) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  mbd_msg *m = call(s, MBD_CMD_STATUS, &p, 0, NULL, NULL, 3000);
  if (!m) return -1;
  mbd_body *b = wh_body(m);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
  int n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? (int)ws->via.array.size : -1;
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  return n;
}

static bool wait_workers(void *s, int n, int ms) {
  for (int i = 0; i < ms / 100; i++) {
    if (nworkers(s) == n) return true;
    usleep(100000);
  }
  return false;
}

/* Sends a small GEMM on s and returns its tag (the reply is left queued). */
static uint64_t send_gemm(void *s) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "f32");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 2);
  int64_t sh2[2] = {2, 3};
  wh_ref(&p.pk, "a", "f32", 2, sh2, 0);
  wh_ref(&p.pk, "b", "f32", 2, sh2, 1);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 0, 1, 0};
  const void *pl[2] = {a, b};
  size_t len[2] = {sizeof a, sizeof b};
  wh c = g_h;
  c.sock = s;
  uint64_t tag = wh_send(&c, MBD_CMD_GEMM, &p.sb, 2, pl, len);
  g_h.next_tag = c.next_tag;
  return tag;
}

/* The broker's failover counter (STATUS counters.failovers), -1 on no answer. */
static int64_t failovers(void *s) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  mbd_msg *m = call(s, MBD_CMD_STATUS, &p, 0, NULL, NULL, 3000);
  if (!m) return -1;
  mbd_body *b = wh_body(m);
  const msgpack_object *cn = mbd_obj_get(mbd_body_root(b), "counters");
  int64_t v = -1;
  if (cn) mbd_obj_i64(cn, "failovers", false, &v, NULL);
  mbd_body_destroy(&b);
  mbd_msg_destroy(&m);
  return v;
}

/* A small GEMM; returns the reply code (0 = FINAL), 1 when no answer. */
static int gemm(void *s) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "f32");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 2);
  int64_t sh2[2] = {2, 3};
  wh_ref(&p.pk, "a", "f32", 2, sh2, 0);
  wh_ref(&p.pk, "b", "f32", 2, sh2, 1);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 0, 1, 0};
  const void *pl[2] = {a, b};
  size_t len[2] = {sizeof a, sizeof b};
  mbd_msg *m = call(s, MBD_CMD_GEMM, &p, 2, pl, len, 10000);
  if (!m) return 1;
  int code = wh_code(m);
  mbd_msg_destroy(&m);
  return code;
}

static int setup(void **state) {
  (void)state;
  if (wh_init(&g_h)) return -1;
  const char *role[4] = {"b", "w1", "w2", "c"};
  for (int i = 0; i < 4; i++) snprintf(g_ns[i], sizeof g_ns[i], "mbd%d-%s", (int)getpid(), role[i]);
  g_made = true;
  int rc = 0;
  for (int i = 0; i < 4; i++) rc |= sh(IP " netns add %s", g_ns[i]);
  for (int i = 1; i < 4; i++) {
    rc |= sh(IP " -n %s link add vb%d type veth peer name vh%d netns %s", g_ns[0], i, i, g_ns[i]);
    rc |= sh(IP " -n %s addr add 10.77.%d.1/24 dev vb%d", g_ns[0], i, i);
    rc |= sh(IP " -n %s addr add 10.77.%d.2/24 dev vh%d", g_ns[i], i, i);
    rc |= sh(IP " -n %s link set vb%d up", g_ns[0], i);
    rc |= sh(IP " -n %s link set vh%d up", g_ns[i], i);
    rc |= sh(IP " -n %s link set lo up", g_ns[i]);
  }
  rc |= sh(IP " -n %s link set lo up", g_ns[0]);
  if (rc) return -1;
  char bkey[320], w1key[320], w2key[320], wbad[320], ckey[320], cbad[320];
  keyfile("broker", &g_broker, bkey, sizeof bkey);
  keyfile("w1", &g_w1, w1key, sizeof w1key);
  keyfile("w2", &g_w2, w2key, sizeof w2key);
  keyfile("wbad", &g_wbad, wbad, sizeof wbad);
  keyfile("cgood", &g_cgood, ckey, sizeof ckey);
  keyfile("cbad", &g_cbad, cbad, sizeof cbad);
  char exe[600], wkeys[700], cpub[320];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g_h.bin);
  snprintf(wkeys, sizeof wkeys, "%s/w1.pub,%s/w2.pub", g_h.dir, g_h.dir);
  snprintf(cpub, sizeof cpub, "%s/cgood.pub", g_h.dir);
  snprintf(g_log, sizeof g_log, "%s/broker.log", g_h.dir);
  char *bargv[] = {exe, "--clients", "tcp://*:5555", "--workers", "tcp://*:5556", "--heartbeat-ms",
                   "200", "--liveness", "3", "--curve-secret", bkey, "--worker-keys", wkeys,
                   "--client-keys", cpub, NULL};
  spawn_in(g_ns[0], bargv, g_log);
  if (!wait_log("broker ready", 20000)) return -1;
  char wx[600], model[600];
  snprintf(wx, sizeof wx, "%s/mambad-worker", g_h.bin);
  snprintf(model, sizeof model, "tiny=%s", g_h.model_dir);
  const char *names[3] = {"w1", "w2", "wbad"}, *keys[3] = {w1key, w2key, wbad};
  const char *eps[3] = {"tcp://10.77.1.1:5556", "tcp://10.77.2.1:5556", "tcp://10.77.2.1:5556"};
  for (int i = 0; i < 3; i++) {
    char *wargv[] = {wx, "--connect", (char *)eps[i], "--name", (char *)names[i], "--model", model,
                     "--heartbeat-ms", "200", "--liveness", "3", "--threads", "1",
                     "--curve-secret", (char *)keys[i], "--server-key", g_broker.public_key, NULL};
    spawn_in(g_ns[i == 0 ? 1 : 2], wargv, NULL);
  }
  /* This process becomes the client host. */
  char path[96];
  snprintf(path, sizeof path, "/run/netns/%s", g_ns[3]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET)) return -1;
  close(fd);
  g_zctx = zmq_ctx_new();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = g_npids - 1; i >= 0; i--) procs_stop(g_pids[i], SIGTERM, 5000, NULL);
  if (g_zctx) zmq_ctx_term(g_zctx);
  if (g_made)
    for (int i = 0; i < 4; i++) sh(IP " netns del %s 2>/dev/null", g_ns[i]);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_h.dir);
  if (system(cmd)) {
  }
  return 0;
}

static void test_across_hosts(void **state) {
  (void)state;
  void *s = client(&g_cgood);
  assert_true(wait_workers(s, 2, 20000));
  for (int i = 0; i < 8; i++) assert_int_equal(gemm(s), 0);
  /* Unlisted keys: the third worker never registers, a foreign client gets nothing. */
  char needle[160];
  snprintf(needle, sizeof needle, "key not admitted (key %s)", g_wbad.public_key);
  assert_true(wait_log(needle, 10000));
  assert_int_equal(nworkers(s), 2);
  void *bad = client(&g_cbad);
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  assert_null(call(bad, MBD_CMD_STATUS, &p, 0, NULL, NULL, 1500));
  zmq_close(bad);
  snprintf(needle, sizeof needle, "rejected clients connection from 10.77.3.2: key not admitted (key %s)",
           g_cbad.public_key);
  assert_true(wait_log(needle, 10000));
  zmq_close(s);
}

static void test_link_down_and_back(void **state) {
  (void)state;
  void *s = client(&g_cgood);
  assert_true(wait_workers(s, 2, 20000));
  int64_t before = failovers(s);
  assert_true(before >= 0);
  assert_int_equal(sh(IP " -n %s link set vb1 down", g_ns[0]), 0);
  /* Requests sent at once: the least-loaded choice gives w1 some of them,
   * stuck on the dead link; when w1 is dropped they are re-sent to w2. */
  uint64_t tags[4];
  for (int i = 0; i < 4; i++) tags[i] = send_gemm(s);
  wh c = g_h;
  c.sock = s;
  int answered = 0;
  for (int i = 0; i < 400 && answered < 4; i++) { /* replies come in any order */
    mbd_msg *m = wh_recv(&c, 100);
    if (!m) continue;
    bool ours = false;
    for (int k = 0; k < 4; k++) ours = ours || mbd_msg_tag(m) == tags[k];
    if (ours && mbd_msg_cmd(m) != MBD_CMD_PARTIAL) {
      assert_int_equal(wh_code(m), 0);
      answered++;
    }
    mbd_msg_destroy(&m);
  }
  assert_int_equal(answered, 4);
  assert_true(failovers(s) > before);
  /* Dropped within the liveness window (3 x 200 ms, polled for a few seconds),
   * and requests keep being answered by w2 meanwhile. */
  assert_true(wait_workers(s, 1, 10000));
  for (int i = 0; i < 4; i++) assert_int_equal(gemm(s), 0);
  assert_int_equal(sh(IP " -n %s link set vb1 up", g_ns[0]), 0);
  assert_true(wait_workers(s, 2, 30000)); /* w1 re-registers over the restored link */
  for (int i = 0; i < 4; i++) assert_int_equal(gemm(s), 0);
  zmq_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_across_hosts),
      cmocka_unit_test(test_link_down_and_back),
  };
  if (!getenv("MBD_BIN_DIR") || !getenv("MBD_FIXTURES_DIR")) return 77;
  if (geteuid() != 0) {
    printf("SKIP: needs root to create network namespaces and veth pairs\n");
    return 77;
  }
  if (access(IP, X_OK) || procs_sh(IP " netns list >/dev/null 2>&1")) {
    printf("SKIP: iproute2 (%s netns) is not usable here\n", IP);
    return 77;
  }
  if (!zmq_has("curve")) {
    printf("SKIP: this libzmq has no CURVE\n");
    return 77;
  }
  return cmocka_run_group_tests(tests, setup, teardown);
}
