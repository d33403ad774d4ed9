/* Shared by tests/integration/test_worker_*.c: starts the real mambad-broker
 * and mambad-worker processes (fork/exec from $MBD_BIN_DIR, ipc:// endpoints
 * in a mkdtemp directory) and talks to the broker as a client with the wire
 * API, so every test exercises the processes exactly as deployed.
 * Header-only (static functions): each test program includes it once. */
#ifndef MBD_TEST_WORKER_HARNESS_H
#define MBD_TEST_WORKER_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "procs.h"
#include "common/protocol.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "kernels/model/mamba1.h"

#define WH_MAX_PROCS 8

typedef struct wh {
  char dir[256];           /* mkdtemp directory holding the ipc sockets */
  char clients[320];       /* broker client endpoint */
  char workers[320];       /* broker worker endpoint */
  char bin[512];           /* $MBD_BIN_DIR */
  char model_dir[512];     /* fixture tiny-d64 */
  pid_t broker;
  pid_t procs[WH_MAX_PROCS]; /* workers, by start order */
  int nprocs;
  void *zctx, *sock;       /* client DEALER */
  uint64_t next_tag;
} wh;

static inline double wh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Output stays on the test's stdout/stderr; the child dies with the test. */
static inline pid_t wh_spawn(char *const argv[]) { return procs_spawn(argv, NULL); }

/* Returns 0, or 77 (skip) when binaries or fixtures are missing. */
static inline int wh_init(wh *h) {
  memset(h, 0, sizeof *h);
  const char *bin = getenv("MBD_BIN_DIR"), *fx = getenv("MBD_FIXTURES_DIR");
  if (!bin || !fx) return 77;
  snprintf(h->bin, sizeof h->bin, "%s", bin);
  snprintf(h->model_dir, sizeof h->model_dir, "%s/mamba1/tiny-d64", fx);
  char p[600];
  snprintf(p, sizeof p, "%s/mambad-broker", bin);
  if (access(p, X_OK)) return 77;
  snprintf(p, sizeof p, "%s/mambad-worker", bin);
  if (access(p, X_OK)) return 77;
  snprintf(p, sizeof p, "%s/config.json", h->model_dir);
  if (access(p, R_OK)) return 77;
  snprintf(h->dir, sizeof h->dir, "/tmp/mbd-wt-XXXXXX");
  if (!mkdtemp(h->dir)) return 1;
  snprintf(h->clients, sizeof h->clients, "ipc://%s/clients", h->dir);
  snprintf(h->workers, sizeof h->workers, "ipc://%s/workers", h->dir);
  h->next_tag = 1;
  return 0;
}

static inline void wh_start_broker(wh *h) {
  char exe[600];
  snprintf(exe, sizeof exe, "%s/mambad-broker", h->bin);
  char *argv[] = {exe, "--clients", h->clients, "--workers", h->workers, "--heartbeat-ms", "200",
                  "--liveness", "3", NULL};
  h->broker = wh_spawn(argv);
  h->zctx = zmq_ctx_new();
  h->sock = zmq_socket(h->zctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_connect(h->sock, h->clients);
}

/* Starts a worker serving the fixture as model "tiny"; extra args NULL-terminated. */
static inline pid_t wh_start_worker(wh *h, const char *name, ...) {
  char exe[600], model[600];
  snprintf(exe, sizeof exe, "%s/mambad-worker", h->bin);
  snprintf(model, sizeof model, "tiny=%s", h->model_dir);
  char *argv[32] = {exe, "--connect", h->workers, "--name", (char *)name, "--model", model,
                    "--heartbeat-ms", "200", "--threads", "2"};
  int n = 11;
  va_list ap;
  va_start(ap, name);
  const char *a;
  while ((a = va_arg(ap, const char *)) && n < 30) argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  pid_t p = wh_spawn(argv);
  if (h->nprocs < WH_MAX_PROCS) h->procs[h->nprocs++] = p;
  return p;
}

/* Stops a process with sig and reaps it; returns its exit status (or -sig). */
static inline int wh_stop(pid_t p, int sig) {
  if (p <= 0) return -1;
  int st = 0;
  procs_stop(p, sig, 10000, &st);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static inline void wh_fini(wh *h) {
  for (int i = 0; i < h->nprocs; i++) wh_stop(h->procs[i], SIGTERM);
  if (h->sock) zmq_close(h->sock);
  if (h->zctx) zmq_ctx_term(h->zctx);
  wh_stop(h->broker, SIGTERM);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
  if (system(cmd)) {
  }
}

/* Sends cmd with body sb (consumed) and n inline payloads; returns the tag. */
static inline uint64_t wh_send(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
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

/* Next reply (any tag), or NULL after timeout_ms. */
static inline mbd_msg *wh_recv(wh *h, int timeout_ms) {
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

/* Waits for the FINAL/ERROR of `tag` (PARTIALs of it are dropped; other tags
 * are a test bug here). NULL on timeout. */
static inline mbd_msg *wh_wait(wh *h, uint64_t tag, int timeout_ms) {
  double end = wh_now() + timeout_ms / 1000.0;
  while (wh_now() < end) {
    mbd_msg *m = wh_recv(h, 100);
    if (!m) continue;
    if (mbd_msg_tag(m) == tag && mbd_msg_cmd(m) != MBD_CMD_PARTIAL) return m;
    mbd_msg_destroy(&m);
  }
  return NULL;
}

static inline mbd_msg *wh_call(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
                        const size_t *lens) {
  uint64_t tag = wh_send(h, cmd, sb, n, pl, lens);
  return wh_wait(h, tag, 60000);
}

/* Body of a reply (caller destroys). */
static inline mbd_body *wh_body(const mbd_msg *m) {
  size_t len = 0;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  mbd_error e = {0};
  if (mbd_body_parse(b, len, &body, &e)) return NULL;
  return body;
}

/* Error code of an ERROR reply (0 for FINAL); prints the message. */
static inline int wh_code(const mbd_msg *m) {
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

typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} wh_pack;

static inline void wh_pack_init(wh_pack *p) {
  msgpack_sbuffer_init(&p->sb);
  msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

/* Packs {name, dtype, shape, frame} */
static inline void wh_ref(msgpack_packer *pk, const char *name, const char *dt, int ndim,
                   const int64_t *shape, int frame) {
  msgpack_pack_map(pk, 4);
  mbd_pack_kv_str(pk, "name", name);
  mbd_pack_kv_str(pk, "dtype", dt);
  mbd_pack_str(pk, "shape");
  msgpack_pack_array(pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_int64(pk, shape[i]);
  mbd_pack_kv_u64(pk, "frame", (uint64_t)frame);
}

/* Waits until the broker lists n workers (STATUS). Returns 0 or -1. */
static inline int wh_wait_workers(wh *h, int n, int timeout_ms) {
  double end = wh_now() + timeout_ms / 1000.0;
  while (wh_now() < end) {
    wh_pack p;
    wh_pack_init(&p);
    msgpack_pack_map(&p.pk, 0);
    mbd_msg *m = wh_call(h, MBD_CMD_STATUS, &p.sb, 0, NULL, NULL);
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
    usleep(100000);
  }
  return -1;
}

/* The payload bytes of the first tensor of a FINAL (pointer into m). */
static inline const void *wh_tensor(const mbd_msg *m, size_t *len) {
  return mbd_msg_payload(m, 0, len);
}

/* A string field of a reply body into dst. */
static inline int wh_str(const mbd_msg *m, const char *key, char *dst, size_t cap) {
  mbd_body *b = wh_body(m);
  int rc = b ? mbd_obj_str(mbd_body_root(b), key, true, dst, cap, NULL) : -1;
  mbd_body_destroy(&b);
  return rc;
}

/* An integer field of a reply body, or -1 when absent. */
static inline int64_t wh_i64(const mbd_msg *m, const char *key) {
  mbd_body *b = wh_body(m);
  int64_t v = -1;
  if (!b || mbd_obj_i64(mbd_body_root(b), key, true, &v, NULL)) v = -1;
  mbd_body_destroy(&b);
  return v;
}

/* Token array `tokens` of a reply into out[cap]; returns count or -1. */
static inline int wh_tokens(const mbd_msg *m, int64_t *out, size_t cap) {
  mbd_body *b = wh_body(m);
  size_t n = 0;
  int rc = b ? mbd_obj_i64_array(mbd_body_root(b), "tokens", true, out, cap, &n, NULL) : -1;
  mbd_body_destroy(&b);
  return rc ? -1 : (int)n;
}

/* ---- requests ---- */

static inline mbd_msg *wh_open(wh *h, char *sid, size_t cap) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_msg *m = wh_call(h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
  if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) wh_str(m, "session", sid, cap);
  return m;
}

static inline uint64_t wh_send_prefill(wh *h, const char *sid, const int64_t *ids, int64_t T,
                                bool last_only) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_bool(&p.pk, "last_only", last_only);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref(&p.pk, "input_ids", "i64", 1, &T, 0);
  const void *pl[1] = {ids};
  size_t lens[1] = {(size_t)T * 8};
  return wh_send(h, MBD_CMD_PREFILL, &p.sb, 1, pl, lens);
}

static inline uint64_t wh_send_step(wh *h, const char *sid, int64_t token) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_i64(&p.pk, "token", token);
  return wh_send(h, MBD_CMD_STEP, &p.sb, 0, NULL, NULL);
}

/* GENERATE; temperature 0 = greedy. */
static inline uint64_t wh_send_generate(wh *h, const char *sid, int64_t max_tokens, double temperature,
                                 uint64_t seed) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 4);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_i64(&p.pk, "max_tokens", max_tokens);
  mbd_pack_kv_f64(&p.pk, "temperature", temperature);
  mbd_pack_kv_u64(&p.pk, "seed", seed);
  return wh_send(h, MBD_CMD_GENERATE, &p.sb, 0, NULL, NULL);
}

/* IMPORT of an exported state blob (n bytes, i64 words) for model "tiny"
 * under `want` (exact route id, dtype, ...). */
static inline uint64_t wh_send_import(wh *h, const void *blob, size_t n, const mbd_route_want *want) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_str(&k.pk, "route");
  mbd_pack_route_want(&k.pk, want);
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  int64_t s[1] = {(int64_t)(n / 8)};
  wh_ref(&k.pk, "state", "i64", 1, s, 0);
  const void *pl[1] = {blob};
  size_t lens[1] = {n};
  return wh_send(h, MBD_CMD_IMPORT, &k.sb, 1, pl, lens);
}

static inline uint64_t wh_send_forward(wh *h, const int64_t *ids, int64_t B, int64_t T, bool last_only) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_kv_bool(&p.pk, "last_only", last_only);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  int64_t s[2] = {B, T};
  wh_ref(&p.pk, "input_ids", "i64", 2, s, 0);
  const void *pl[1] = {ids};
  size_t lens[1] = {(size_t)(B * T) * 8};
  return wh_send(h, MBD_CMD_FORWARD, &p.sb, 1, pl, lens);
}

/* ---- fixture + in-process reference ---- */

typedef struct wh_fixture {
  mbd_safetensors *st;
  const int64_t *ids;    /* [B,T] */
  const int64_t *greedy; /* [B,T+G] */
  int64_t B, T, G, V;
  mbd_mamba1_model *model; /* in-process reference, f32 */
} wh_fixture;

static inline int wh_fixture_load(const wh *h, wh_fixture *f) {
  memset(f, 0, sizeof *f);
  char p[600];
  mbd_error e = {0};
  snprintf(p, sizeof p, "%s/expected.safetensors", h->model_dir);
  if (mbd_safetensors_open(p, &f->st, &e)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(f->st, "input_ids");
  const mbd_st_entry *gr = mbd_safetensors_find(f->st, "greedy");
  if (!ids || !gr) return -1;
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->G = gr->desc.shape[1] - f->T;
  /* The mapping may be unaligned for i64: copy. */
  int64_t *a = malloc(ids->nbytes), *b = malloc(gr->nbytes);
  memcpy(a, ids->data, ids->nbytes);
  memcpy(b, gr->data, gr->nbytes);
  f->ids = a;
  f->greedy = b;
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  o.threads = 2;
  if (mbd_mamba1_load(h->model_dir, &o, &f->model, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return -1;
  }
  f->V = mbd_mamba1_vocab(f->model);
  return 0;
}

static inline void wh_fixture_free(wh_fixture *f) {
  free((void *)f->ids);
  free((void *)f->greedy);
  mbd_mamba1_destroy(&f->model);
  mbd_safetensors_destroy(&f->st);
}

/* In-process reference: feeds ids[T] to a fresh state; logits out [T,V]. */
static inline void wh_ref_prefill(wh_fixture *f, mbd_mamba1_state *s, const int64_t *ids, int64_t T,
                           float *logits) {
  int32_t *t = malloc((size_t)T * sizeof *t);
  for (int64_t i = 0; i < T; i++) t[i] = (int32_t)ids[i];
  const int32_t *row = t;
  mbd_error e = {0};
  if (mbd_mamba1_prefill(f->model, &s, 1, &row, &T, MBD_MAMBA1_LOGITS_ALL, logits, &e)) abort();
  free(t);
}

#endif
