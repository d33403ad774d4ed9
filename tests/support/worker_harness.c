/* Broker and worker processes under test, and the client socket (see
 * worker_harness.h). */
#include "support/worker_harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

double wh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Prints why the test cannot run; returns 77 (ctest: skipped). */
static int missing(const char *what, const char *path) {
  printf("skipped: %s %s\n", what, path);
  return 77;
}

int wh_init(wh *h) {
  memset(h, 0, sizeof *h);
  const char *bin = getenv("MBD_BIN_DIR"), *fx = getenv("MBD_FIXTURES_DIR");
  if (!bin || !fx) return missing("MBD_BIN_DIR or MBD_FIXTURES_DIR not set", "(ctest sets both)");
  snprintf(h->bin, sizeof h->bin, "%s", bin);
  snprintf(h->model_dir, sizeof h->model_dir, "%s/mamba1/tiny-d64", fx);
  char p[600];
  snprintf(p, sizeof p, "%s/mambad-broker", bin);
  if (access(p, X_OK)) return missing("program not built:", p);
  snprintf(p, sizeof p, "%s/mambad-worker", bin);
  if (access(p, X_OK)) return missing("program not built:", p);
  snprintf(p, sizeof p, "%s/config.json", h->model_dir);
  if (access(p, R_OK)) return missing("no fixture", p);
  snprintf(h->dir, sizeof h->dir, "/tmp/mbd-wt-XXXXXX");
  if (!mkdtemp(h->dir)) return 1;
  snprintf(h->clients, sizeof h->clients, "ipc://%s/clients", h->dir);
  snprintf(h->workers, sizeof h->workers, "ipc://%s/workers", h->dir);
  h->next_tag = 1;
  return 0;
}

void wh_init_or_skip(wh *h) {
  int rc = wh_init(h);
  if (rc == 77) exit(77);
  if (rc) {
    fprintf(stderr, "cannot make the test's temporary directory under /tmp\n");
    exit(1);
  }
}

void wh_start_broker(wh *h) {
  char exe[600];
  snprintf(exe, sizeof exe, "%s/mambad-broker", h->bin);
  char *argv[] = {exe,   "--clients",  h->clients, "--workers", h->workers, "--heartbeat-ms",
                  "200", "--liveness", "3",        NULL,        NULL,       NULL};
  if (h->client_inflight) {
    argv[9] = "--client-inflight";
    argv[10] = (char *)h->client_inflight;
  }
  /* Output stays on the test's stdout/stderr; the child dies with the test. */
  h->broker = procs_spawn(argv, NULL);
  h->zctx = zmq_ctx_new();
  h->sock = zmq_socket(h->zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_connect(h->sock, h->clients);
}

void wh_worker_log(const wh *h, const char *name, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s.log", h->dir, name);
}

pid_t wh_start_worker(wh *h, const char *name, ...) {
  char exe[600], model[600], log[400];
  snprintf(exe, sizeof exe, "%s/mambad-worker", h->bin);
  snprintf(model, sizeof model, "tiny=%s", h->model_dir);
  wh_worker_log(h, name, log, sizeof log);
  char *argv[32] = {exe,   "--connect",      h->workers, "--name",    (char *)name, "--model",
                    model, "--heartbeat-ms", "200",      "--threads", "2"};
  int n = 11;
  va_list ap;
  va_start(ap, name);
  const char *a;
  while ((a = va_arg(ap, const char *)) && n < 30) argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  pid_t p = procs_spawn(argv, h->worker_logs ? log : NULL);
  if (h->nprocs < WH_MAX_PROCS) h->procs[h->nprocs++] = p;
  return p;
}

int wh_stop(pid_t p, int sig) {
  if (p <= 0) return -1;
  int st = 0;
  procs_stop(p, sig, 10000, &st);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

void wh_fini(wh *h) {
  for (int i = 0; i < h->nprocs; i++) wh_stop(h->procs[i], SIGTERM);
  if (h->sock) zmq_close(h->sock);
  if (h->zctx) zmq_ctx_term(h->zctx);
  wh_stop(h->broker, SIGTERM);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", h->dir);
}

uint64_t wh_send(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
                 const size_t *lens) {
  uint64_t tag = h->next_tag++;
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(cmd, tag, &m, &e) || mbd_msg_take_body(m, sb, &e)) abort();
  for (int i = 0; i < n; i++)
    if (mbd_msg_add_payload_copy(m, pl[i], lens[i], &e)) abort();
  if (mbd_msg_send(&m, h->sock, 0, &e)) abort();
  msgpack_sbuffer_destroy(sb);
  return tag;
}

mbd_msg *wh_recv(wh *h, int timeout_ms) {
  zmq_pollitem_t it = {.socket = h->sock, .events = ZMQ_POLLIN};
  if (zmq_poll(&it, 1, timeout_ms) <= 0) return NULL;
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_recv(h->sock, false, 0, &m, &e)) {
    mbd_msg_destroy(&m);
    return NULL;
  }
  return m;
}

mbd_msg *wh_wait(wh *h, uint64_t tag, int timeout_ms) {
  double end = wh_now() + timeout_ms / 1000.0;
  while (wh_now() < end) {
    mbd_msg *m = wh_recv(h, 100);
    if (!m) continue;
    if (mbd_msg_tag(m) == tag && mbd_msg_cmd(m) != MBD_CMD_PARTIAL) return m;
    mbd_msg_destroy(&m);
  }
  return NULL;
}

mbd_msg *wh_call(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
                 const size_t *lens) {
  uint64_t tag = wh_send(h, cmd, sb, n, pl, lens);
  return wh_wait(h, tag, 60000);
}

size_t wh_collect(wh *h, uint64_t t0, size_t n, mbd_msg **out, int timeout_ms) {
  size_t got = 0;
  for (size_t i = 0; i < n; i++) got += out[i] != NULL;
  double end = wh_now() + timeout_ms / 1000.0;
  while (got < n && wh_now() < end) {
    mbd_msg *m = wh_recv(h, 200);
    if (!m) continue;
    uint64_t tag = mbd_msg_tag(m);
    if (tag < t0 || tag >= t0 + n || mbd_msg_cmd(m) == MBD_CMD_PARTIAL || out[tag - t0]) {
      mbd_msg_destroy(&m);
      continue;
    }
    out[tag - t0] = m;
    got++;
  }
  return n - got;
}

void wh_free_all(mbd_msg **m, size_t n) {
  for (size_t i = 0; i < n; i++) mbd_msg_destroy(&m[i]);
}

mbd_body *wh_body(const mbd_msg *m) {
  size_t len = 0;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  mbd_error e = {0};
  if (mbd_body_parse(b, len, &body, &e)) return NULL;
  return body;
}

int wh_code(const mbd_msg *m) {
  if (!m) return 999;
  if (mbd_msg_cmd(m) != MBD_CMD_ERROR) return 0;
  mbd_body *b = wh_body(m);
  int64_t code = 0;
  char msg[600] = "";
  mbd_obj_i64(mbd_body_root(b), "code", false, &code, NULL);
  mbd_obj_str(mbd_body_root(b), "message", false, msg, sizeof msg, NULL);
  fprintf(stderr, "  (ERROR %lld: %s)\n", (long long)code, msg);
  mbd_body_destroy(&b);
  return (int)code;
}

int wh_wait_workers(wh *h, int n, int timeout_ms) {
  double end = wh_now() + timeout_ms / 1000.0;
  while (wh_now() < end) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 0);
    mbd_msg *m = wh_call(h, MBD_CMD_STATUS, &sb, 0, NULL, NULL);
    if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) {
      mbd_body *b = wh_body(m);
      const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
      int have = ws && ws->type == MSGPACK_OBJECT_ARRAY ? (int)ws->via.array.size : 0;
      mbd_body_destroy(&b);
      mbd_msg_destroy(&m);
      if (have >= n) return 0;
    } else {
      mbd_msg_destroy(&m);
    }
    ev_nap_ms(100); /* between two STATUS polls */
  }
  return -1;
}

const void *wh_tensor(const mbd_msg *m, size_t *len) { return mbd_msg_payload(m, 0, len); }

int wh_str(const mbd_msg *m, const char *key, char *dst, size_t cap) {
  mbd_body *b = wh_body(m);
  int rc = b ? mbd_obj_str(mbd_body_root(b), key, true, dst, cap, NULL) : -1;
  mbd_body_destroy(&b);
  return rc;
}

int64_t wh_i64(const mbd_msg *m, const char *key) {
  mbd_body *b = wh_body(m);
  int64_t v = -1;
  if (!b || mbd_obj_i64(mbd_body_root(b), key, true, &v, NULL)) v = -1;
  mbd_body_destroy(&b);
  return v;
}

int wh_tokens(const mbd_msg *m, int64_t *out, size_t cap) {
  mbd_body *b = wh_body(m);
  size_t n = 0;
  int rc = b ? mbd_obj_i64_array(mbd_body_root(b), "tokens", true, out, cap, &n, NULL) : -1;
  mbd_body_destroy(&b);
  return rc ? -1 : (int)n;
}
