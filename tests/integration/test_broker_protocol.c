/* The real mambad-broker process, driven over ipc:// with raw ZeroMQ: the test
 * is a client (DEALER) and one or more minimal workers (DEALER peers written
 * here with the wire API: READY, heartbeats, FINAL replies, or silence).
 * Covers registration, route matching, NO_ROUTE text, late routes, heartbeat
 * expiry, exactly-once failover, deadlines, queue limits, malformed input, and
 * SIGTERM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/protocol.h"
#include "common/wire.h"
#include "support/events.h"
#include "support/procs.h"

#define HB_MS 100
/* Expiry after LIVENESS beats: wide enough that a loaded CI machine pausing
 * this process or the broker for hundreds of milliseconds does not drop
 * a fake worker that is meant to stay alive. */
#define LIVENESS 8

typedef struct fworker {
  void *s;
  char name[32], uid[32], route_id[65];
  int capacity;
  bool silent;       /* no heartbeats, no replies (a hung or dead worker) */
  bool answer;       /* reply FINAL to requests */
  int received;      /* requests received */
  uint64_t last_ticket;
  int64_t last_hb;
  int disconnects;   /* DISCONNECT messages received */
} fworker;

typedef struct env {
  char dir[64], cep[128], wep[128];
  pid_t pid;
  void *ctx, *client;
  fworker w[4];
  int nw;
  uint64_t next_tag;
  mbd_msg *stash[8]; /* client replies that came while another tag was awaited */
  int nstash;
} env;

static int64_t now_ms(void) { return ev_now_ms(); }

static void start_broker(env *e, const char *const *extra) {
  const char *bin = getenv("MBD_BIN_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/mambad-broker", bin ? bin : ".");
  if (access(path, X_OK)) {
    fprintf(stderr, "skip: %s not built\n", path);
    exit(77);
  }
  char logp[128], hb[16], lv[16];
  snprintf(logp, sizeof logp, "%s/broker.log", e->dir);
  snprintf(hb, sizeof hb, "%d", HB_MS);
  snprintf(lv, sizeof lv, "%d", LIVENESS);
  const char *argv[32] = {path, "--clients", e->cep, "--workers", e->wep, "--heartbeat-ms", hb,
                          "--liveness", lv};
  int n = 9;
  for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  e->pid = procs_spawn((char *const *)argv, logp);
  assert_true(e->pid > 0);
  if (!ev_wait_lines(logp, "broker ready clients=", 1, EV_HANG_MS))
    fail_msg("broker never printed 'broker ready' (%s)", logp);
}

static void *dealer(env *e, const char *ep, const char *id) {
  void *s = zmq_socket(e->ctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  if (id) zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
  assert_int_equal(zmq_connect(s, ep), 0);
  return s;
}

static int setup(void **state) {
  env *e = calloc(1, sizeof *e);
  snprintf(e->dir, sizeof e->dir, "/tmp/mbd-broker-XXXXXX");
  assert_non_null(mkdtemp(e->dir));
  snprintf(e->cep, sizeof e->cep, "ipc://%s/clients", e->dir);
  snprintf(e->wep, sizeof e->wep, "ipc://%s/workers", e->dir);
  e->ctx = zmq_ctx_new();
  e->next_tag = 1;
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state;
  for (int i = 0; i < e->nstash; i++) mbd_msg_destroy(&e->stash[i]);
  if (e->client) zmq_close(e->client);
  for (int i = 0; i < e->nw; i++) zmq_close(e->w[i].s);
  zmq_ctx_term(e->ctx);
  int rc = 0;
  if (e->pid > 0) {
    /* A clean SIGTERM exit is part of every test: sanitizer reports in the
     * broker (leaks, UB) turn into a non-zero status here. */
    int st = procs_stop(e->pid, SIGTERM, 5000, NULL);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = -1;
    if (rc) {
      char cmd[160];
      snprintf(cmd, sizeof cmd, "echo '--- broker log:'; cat %s/broker.log >&2", e->dir);
      if (system(cmd)) {
      }
    }
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
  if (system(cmd)) {
  }
  free(e);
  return rc;
}

static void fill_route(mbd_route_identity *r, mbd_dtype_policy p) {
  memset(r, 0, sizeof *r);
  r->mode = MBD_GEMM_DETERMINISTIC;
  r->policy = p;
  r->family = MBD_FAMILY_INFERENCE;
  r->backend = MBD_BACKEND_CPU;
  strcpy(r->isa, "x86-64-v3");
  memset(r->kernel_digest, 'a', 64);
  strcpy(r->compiler, "gcc-test");
  strcpy(r->device_name, "cpu");
  r->dispatch_rev = 1;
  r->state_capacity = 8;
}

static void send_body(void *s, uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb) {
  mbd_msg *m = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_msg_new(cmd, tag, &m, &err), 0);
  if (sb) assert_int_equal(mbd_msg_take_body(m, sb, &err), 0);
  assert_int_equal(mbd_msg_send(&m, s, 0, &err), 0);
}

/* Registers a fake worker with the given dtype policy and model "m". */
static fworker *add_worker(env *e, const char *name, mbd_dtype_policy p, int capacity,
                           const char *model, bool bad_id) {
  fworker *w = &e->w[e->nw++];
  memset(w, 0, sizeof *w);
  snprintf(w->name, sizeof w->name, "%s", name);
  snprintf(w->uid, sizeof w->uid, "uid-%s", name);
  w->capacity = capacity;
  w->answer = true;
  w->s = dealer(e, e->wep, w->name);
  mbd_route_identity r;
  fill_route(&r, p);
  char enc[1024];
  size_t len;
  assert_int_equal(mbd_route_encode(&r, enc, sizeof enc, &len, NULL), 0);
  mbd_route_id_hex(&r, w->route_id);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 8);
  mbd_pack_kv_str(&pk, "name", w->name);
  mbd_pack_kv_str(&pk, "uid", w->uid);
  mbd_pack_kv_str(&pk, "route", enc);
  mbd_pack_kv_str(&pk, "route_id", bad_id ? "00000000deadbeef" : w->route_id);
  mbd_pack_kv_str(&pk, "host_id", "test-host");
  mbd_pack_kv_u64(&pk, "capacity", (uint64_t)capacity);
  mbd_pack_kv_i64(&pk, "pid", getpid());
  mbd_pack_str(&pk, "models");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "name", model);
  mbd_pack_kv_str(&pk, "digest", "0123456789abcdef");
  send_body(w->s, MBD_CMD_READY, 0, &sb);
  msgpack_sbuffer_destroy(&sb);
  w->last_hb = now_ms();
  return w;
}

/* One worker message: answer requests, note control messages. */
static void worker_handle(fworker *w) {
  mbd_msg *m = NULL;
  mbd_error err = {0};
  int rc = mbd_msg_recv(w->s, false, 0, &m, &err);
  if (rc) {
    mbd_msg_destroy(&m);
    return;
  }
  uint8_t cmd = mbd_msg_cmd(m);
  if (cmd == MBD_CMD_DISCONNECT) w->disconnects++;
  if (mbd_cmd_is_request(cmd)) {
    w->received++;
    w->last_ticket = mbd_msg_tag(m);
    if (w->answer && !w->silent) {
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      msgpack_packer pk;
      msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
      msgpack_pack_map(&pk, cmd == MBD_CMD_OPEN ? 3 : 2);
      mbd_pack_kv_str(&pk, "route_id", w->route_id);
      mbd_pack_kv_str(&pk, "worker", w->name);
      if (cmd == MBD_CMD_OPEN) {
        char sess[64];
        snprintf(sess, sizeof sess, "%s/1", w->uid);
        mbd_pack_kv_str(&pk, "session", sess);
      }
      mbd_msg *r = NULL;
      assert_int_equal(mbd_msg_new(MBD_CMD_FINAL, mbd_msg_tag(m), &r, &err), 0);
      assert_int_equal(mbd_msg_take_body(r, &sb, &err), 0);
      msgpack_sbuffer_destroy(&sb);
      /* echo payloads back by move: the broker must forward them intact */
      for (size_t i = 0; i < mbd_msg_npayloads(m); i++) {
        zmq_msg_t z;
        assert_int_equal(mbd_msg_take_payload(m, i, &z, &err), 0);
        assert_int_equal(mbd_msg_add_payload_move(r, &z, &err), 0);
        zmq_msg_close(&z);
      }
      assert_int_equal(mbd_msg_send(&r, w->s, 0, &err), 0);
    }
  }
  mbd_msg_destroy(&m);
}

/* Runs the fake workers for up to ms; returns the first client message (or NULL). */
static mbd_msg *pump(env *e, int ms) {
  int64_t end = now_ms() + ms;
  for (;;) {
    int64_t now = now_ms();
    for (int i = 0; i < e->nw; i++) {
      fworker *w = &e->w[i];
      if (!w->silent && now - w->last_hb >= HB_MS) {
        send_body(w->s, MBD_CMD_HEARTBEAT, 0, NULL);
        w->last_hb = now;
      }
    }
    if (now >= end) return NULL;
    zmq_pollitem_t it[5];
    int n = 0;
    if (e->client) it[n++] = (zmq_pollitem_t){e->client, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < e->nw; i++) it[n++] = (zmq_pollitem_t){e->w[i].s, 0, ZMQ_POLLIN, 0};
    long wait = (long)(end - now < 20 ? end - now : 20);
    if (zmq_poll(it, n, wait) <= 0) continue;
    int k = 0;
    if (e->client) {
      if (it[k++].revents & ZMQ_POLLIN) {
        mbd_msg *m = NULL;
        mbd_error err = {0};
        int rc = mbd_msg_recv(e->client, false, 0, &m, &err);
        if (rc == 0) return m;
        mbd_msg_destroy(&m);
      }
    }
    for (int i = 0; i < e->nw; i++)
      if (it[k++].revents & ZMQ_POLLIN) worker_handle(&e->w[i]);
  }
}

/* Runs the fake workers until *a + *b reaches want (bounded by ms, so a
 * loaded machine only slows the test); no client message may arrive meanwhile. */
static void pump_until(env *e, const int *a, const int *b, int want, int ms) {
  for (int64_t end = now_ms() + ms; *a + *b < want && now_ms() < end;) assert_null(pump(e, 20));
}

/* Sends a routed request; returns its tag. */
static uint64_t request(env *e, uint8_t cmd, const char *dtype, const char *model, int deadline_ms,
                        const char *session) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  int n = (dtype ? 1 : 0) + (model ? 1 : 0) + (deadline_ms ? 1 : 0) + (session ? 1 : 0);
  msgpack_pack_map(&pk, (size_t)n);
  if (dtype) {
    mbd_route_want w;
    memset(&w, 0, sizeof w);
    snprintf(w.dtype, sizeof w.dtype, "%s", dtype);
    mbd_pack_str(&pk, "route");
    mbd_pack_route_want(&pk, &w);
  }
  if (model) mbd_pack_kv_str(&pk, "model", model);
  if (deadline_ms) mbd_pack_kv_u64(&pk, "deadline_ms", (uint64_t)deadline_ms);
  if (session) mbd_pack_kv_str(&pk, "session", session);
  uint64_t tag = e->next_tag++;
  send_body(e->client, cmd, tag, &sb);
  msgpack_sbuffer_destroy(&sb);
  return tag;
}

/* Waits for the reply to tag; checks command; returns the parsed body. */
/* Replies to different tags may come in either order (two deadlines that pass
 * in one broker tick under load): others are kept for their own expect. */
static mbd_body *expect_reply(env *e, uint64_t tag, uint8_t cmd, int ms) {
  mbd_msg *m = NULL;
  for (int i = 0; i < e->nstash && !m; i++)
    if (mbd_msg_tag(e->stash[i]) == tag) {
      m = e->stash[i];
      e->stash[i] = e->stash[--e->nstash];
    }
  for (int64_t end = now_ms() + ms; !m;) {
    int64_t left = end - now_ms();
    if (left <= 0) fail_msg("no reply to request %llu within %d ms", (unsigned long long)tag, ms);
    mbd_msg *x = pump(e, (int)left);
    if (x && mbd_msg_tag(x) == tag) m = x;
    else if (x && e->nstash < (int)(sizeof e->stash / sizeof e->stash[0])) e->stash[e->nstash++] = x;
    else if (x) fail_msg("too many replies to other requests while waiting for %llu",
                         (unsigned long long)tag);
  }
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  if (mbd_msg_cmd(m) != cmd) {
    char msg[512] = "";
    mbd_obj_str(mbd_body_root(body), "message", false, msg, sizeof msg, NULL);
    fail_msg("expected %s, got %s: %s", mbd_cmd_name(cmd), mbd_cmd_name(mbd_msg_cmd(m)), msg);
  }
  mbd_msg_destroy(&m);
  return body;
}

static void expect_error(env *e, uint64_t tag, int code, const char *needle, char *msg_out,
                         size_t cap) {
  mbd_body *b = expect_reply(e, tag, MBD_CMD_ERROR, EV_HANG_MS);
  int64_t c = 0;
  char msg[1024] = "";
  assert_int_equal(mbd_obj_i64(mbd_body_root(b), "code", true, &c, NULL), 0);
  mbd_obj_str(mbd_body_root(b), "message", true, msg, sizeof msg, NULL);
  if (c != code) fail_msg("expected error %d, got %d: %s", code, (int)c, msg);
  if (needle && !strstr(msg, needle)) fail_msg("error message '%s' lacks '%s'", msg, needle);
  if (msg_out) snprintf(msg_out, cap, "%s", msg);
  mbd_body_destroy(&b);
}

static void expect_served_by(env *e, uint64_t tag, const fworker *w) {
  mbd_body *b = expect_reply(e, tag, MBD_CMD_FINAL, EV_HANG_MS);
  char name[32] = "";
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "worker", true, name, sizeof name, NULL), 0);
  if (strcmp(name, w->name)) fail_msg("served by %s, expected %s", name, w->name);
  char rid[80];
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "route_id", true, rid, sizeof rid, NULL), 0);
  assert_string_equal(rid, w->route_id);
  mbd_body_destroy(&b);
}

/* STATUS until `n` workers are registered (the fake workers heartbeat meanwhile). */
static void wait_workers(env *e, size_t n) {
  for (int64_t end = now_ms() + EV_HANG_MS; now_ms() < end;) {
    uint64_t t = e->next_tag++;
    send_body(e->client, MBD_CMD_STATUS, t, NULL);
    mbd_body *b = expect_reply(e, t, MBD_CMD_FINAL, EV_HANG_MS);
    const msgpack_object *ws = mbd_obj_get(mbd_body_root(b), "workers");
    assert_non_null(ws);
    size_t have = ws->via.array.size;
    mbd_body_destroy(&b);
    if (have == n) return;
    pump(e, 20);
  }
  fail_msg("broker never reported %zu workers", n);
}

static void test_routing(void **state) {
  env *e = *state;
  start_broker(e, NULL);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 2, "m", false);
  fworker *b = add_worker(e, "wb", MBD_POLICY_BF16, 2, "m", false);
  wait_workers(e, 2);
  /* each goes to the matching one */
  expect_served_by(e, request(e, MBD_CMD_FORWARD, "bf16", "m", 0, NULL), b);
  expect_served_by(e, request(e, MBD_CMD_FORWARD, "f32", "m", 0, NULL), a);
  expect_served_by(e, request(e, MBD_CMD_GEMM, "bf16", NULL, 0, NULL), b);
  assert_int_equal(a->received, 1);
  assert_int_equal(b->received, 2);
  /* NO_ROUTE names the ask and what exists */
  char msg[1024];
  expect_error(e, request(e, MBD_CMD_FORWARD, "f16", "m", 0, NULL), MBD_E_NO_ROUTE, "dtype=f16",
               msg, sizeof msg);
  char shorta[9], shortb[9];
  snprintf(shorta, sizeof shorta, "%.8s", a->route_id);
  snprintf(shortb, sizeof shortb, "%.8s", b->route_id);
  assert_non_null(strstr(msg, shorta));
  assert_non_null(strstr(msg, shortb));
  assert_non_null(strstr(msg, "cpu/bf16/deterministic"));
  assert_non_null(strstr(msg, "models=[m@01234567]"));
  expect_error(e, request(e, MBD_CMD_FORWARD, "f32", "other", 0, NULL), MBD_E_NO_ROUTE,
               "model=other", NULL, 0);
  /* a route that appears later is served */
  fworker *c = add_worker(e, "wc", MBD_POLICY_F16, 1, "m", false);
  wait_workers(e, 3);
  expect_served_by(e, request(e, MBD_CMD_FORWARD, "f16", "m", 0, NULL), c);
  /* sessions: OPEN by route, then STEP goes to the owner by uid */
  uint64_t t = request(e, MBD_CMD_OPEN, "bf16", "m", 0, NULL);
  mbd_body *body = expect_reply(e, t, MBD_CMD_FINAL, EV_HANG_MS);
  char sess[64];
  assert_int_equal(mbd_obj_str(mbd_body_root(body), "session", true, sess, sizeof sess, NULL), 0);
  mbd_body_destroy(&body);
  assert_string_equal(sess, "uid-wb/1");
  int before = b->received;
  expect_served_by(e, request(e, MBD_CMD_STEP, NULL, NULL, 0, sess), b);
  assert_int_equal(b->received, before + 1);
  expect_error(e, request(e, MBD_CMD_STEP, NULL, NULL, 0, "uid-gone/3"), MBD_E_NOT_FOUND,
               "has registered", NULL, 0);
  /* STATUS content */
  t = e->next_tag++;
  send_body(e->client, MBD_CMD_STATUS, t, NULL);
  body = expect_reply(e, t, MBD_CMD_FINAL, EV_HANG_MS);
  const msgpack_object *ws = mbd_obj_get(mbd_body_root(body), "workers");
  assert_int_equal(ws->via.array.size, 3);
  bool found = false;
  for (uint32_t i = 0; i < ws->via.array.size; i++) {
    char rid[80], route[1024], name[32];
    const msgpack_object *w = &ws->via.array.ptr[i];
    assert_int_equal(mbd_obj_str(w, "route_id", true, rid, sizeof rid, NULL), 0);
    assert_int_equal(mbd_obj_str(w, "route", true, route, sizeof route, NULL), 0);
    assert_int_equal(mbd_obj_str(w, "name", true, name, sizeof name, NULL), 0);
    assert_non_null(strstr(route, "mambad-route/3"));
    if (!strcmp(name, "wb")) {
      found = true;
      assert_string_equal(rid, b->route_id);
    }
    assert_non_null(mbd_obj_get(w, "heartbeat_age_ms"));
    assert_non_null(mbd_obj_get(w, "models"));
  }
  assert_true(found);
  assert_non_null(mbd_obj_get(mbd_body_root(body), "counters"));
  mbd_body_destroy(&body);
  /* a READY whose route_id does not match its encoding is rejected */
  fworker *bad = add_worker(e, "wbad", MBD_POLICY_F32, 1, "m", true);
  (void)bad;
  pump(e, 100);
  wait_workers(e, 3);
}

static void test_heartbeat_expiry(void **state) {
  env *e = *state;
  start_broker(e, NULL);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 1, "m", false);
  add_worker(e, "wb", MBD_POLICY_BF16, 1, "m", false);
  wait_workers(e, 2);
  a->silent = true;
  wait_workers(e, 1); /* wa's silence outlived the liveness window */
  expect_error(e, request(e, MBD_CMD_FORWARD, "f32", "m", 0, NULL), MBD_E_NO_ROUTE, "dtype=f32",
               NULL, 0);
  /* the dropped worker speaks again: DISCONNECT tells it to re-register */
  a->silent = false;
  send_body(a->s, MBD_CMD_HEARTBEAT, 0, NULL);
  int none = 0;
  pump_until(e, &a->disconnects, &none, 1, EV_HANG_MS);
  assert_true(a->disconnects >= 1);
}

static void test_failover_once(void **state) {
  env *e = *state;
  start_broker(e, NULL);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 1, "m", false);
  fworker *b = add_worker(e, "wb", MBD_POLICY_F32, 1, "m", false);
  wait_workers(e, 2);
  assert_string_equal(a->route_id, b->route_id);
  /* both take it and go silent: the first loss re-sends, the second fails */
  a->answer = b->answer = false;
  uint64_t t = request(e, MBD_CMD_FORWARD, "f32", "m", 10000, NULL);
  pump_until(e, &a->received, &b->received, 1, EV_HANG_MS);
  assert_int_equal(a->received + b->received, 1);
  fworker *first = a->received ? a : b, *second = a->received ? b : a;
  first->silent = true;
  pump_until(e, &a->received, &b->received, 2, EV_HANG_MS);
  assert_null(pump(e, 100)); /* nothing more: no third send, no reply */
  assert_int_equal(second->received, 1); /* re-sent exactly once */
  assert_int_equal(first->received, 1);
  second->silent = true;
  expect_error(e, t, MBD_E_WORKER_LOST, "both died", NULL, 0); /* poison: not re-sent again */
  assert_int_equal(first->received + second->received, 2);

  /* a fresh pair: the re-send is answered by the survivor */
  fworker *c = add_worker(e, "wc", MBD_POLICY_BF16, 1, "m", false);
  fworker *d = add_worker(e, "wd", MBD_POLICY_BF16, 1, "m", false);
  wait_workers(e, 2);
  c->answer = d->answer = false;
  t = request(e, MBD_CMD_FORWARD, "bf16", "m", 10000, NULL);
  pump_until(e, &c->received, &d->received, 1, EV_HANG_MS);
  assert_int_equal(c->received + d->received, 1);
  fworker *f1 = c->received ? c : d, *f2 = c->received ? d : c;
  f1->silent = true;
  f2->answer = true;
  expect_served_by(e, t, f2);
  assert_int_equal(f1->received, 1);
  assert_int_equal(f2->received, 1);
}

static void test_deadlines_and_busy(void **state) {
  env *e = *state;
  const char *extra[] = {"--queue-limit", "1", NULL};
  start_broker(e, extra);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 1, "m", false);
  wait_workers(e, 1);
  a->answer = false;
  uint64_t t1 = request(e, MBD_CMD_FORWARD, "f32", "m", 300, NULL);  /* in flight, never answered */
  uint64_t t2 = request(e, MBD_CMD_FORWARD, "f32", "m", 200, NULL);  /* queued */
  uint64_t t3 = request(e, MBD_CMD_FORWARD, "f32", "m", 5000, NULL); /* queue full */
  expect_error(e, t3, MBD_E_BUSY, "queue is full", NULL, 0);
  expect_error(e, t2, MBD_E_TIMEOUT, "queued", NULL, 0);
  expect_error(e, t1, MBD_E_TIMEOUT, "while worker wa", NULL, 0);
  assert_int_equal(a->received, 1);
  /* the late reply is dropped: the client never hears about t1 again */
  uint64_t late = a->last_ticket;
  mbd_msg *r = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_msg_new(MBD_CMD_FINAL, late, &r, &err), 0);
  assert_int_equal(mbd_msg_send(&r, a->s, 0, &err), 0);
  assert_null(pump(e, 200));
  /* and the worker's slot is free again */
  a->answer = true;
  expect_served_by(e, request(e, MBD_CMD_FORWARD, "f32", "m", 2000, NULL), a);
}

static void raw_send(void *s, const void *const *f, const size_t *l, size_t n) {
  for (size_t i = 0; i < n; i++)
    assert_true(zmq_send(s, f[i], l[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* A header frame: 4 bytes of magic + version, the command, the tag. */
static void hdr13(uint8_t h[13], const char *magic4, uint8_t cmd, uint64_t tag) {
  memcpy(h, magic4, 4);
  h[4] = cmd;
  for (int i = 0; i < 8; i++) h[5 + i] = (uint8_t)(tag >> (8 * i));
}

static void test_malformed_corpus(void **state) {
  env *e = *state;
  const char *extra[] = {"--max-message-mb", "1", NULL};
  start_broker(e, extra);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 4, "m", false);
  wait_workers(e, 1);
  const uint8_t tag[8] = {0x33, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t fwd = MBD_CMD_FORWARD, em = 0x80;
  static uint8_t big[600 * 1024];
  /* header frames: magic + version, command, tag */
  uint8_t h_fwd[13], h_magic[13], h_v9[13], h_bogus[13], h_ready[13], h_zero[13], h_step[13];
  hdr13(h_fwd, "MBD\x02", fwd, 0x33);
  hdr13(h_magic, "XXX\x02", fwd, 0x33);
  hdr13(h_v9, "MBD\x09", fwd, 0x33);
  hdr13(h_bogus, "MBD\x02", 0x77, 0x33);
  hdr13(h_ready, "MBD\x02", MBD_CMD_READY, 0x33);
  hdr13(h_zero, "MBD\x02", fwd, 0);
  hdr13(h_step, "MBD\x02", MBD_CMD_STEP, 0x33);
  struct {
    const void *f[8];
    size_t l[8];
    size_t n;
    int code;
    bool has_tag;
  } cases[] = {
      {{h_magic, &em}, {13, 1}, 2, MBD_E_PROTOCOL, true},
      {{h_v9, &em}, {13, 1}, 2, MBD_E_PROTOCOL, true},
      {{"MBD\x01", &fwd, tag, &em}, {4, 1, 8, 1}, 4, MBD_E_PROTOCOL, false}, /* version 1 */
      {{h_bogus, &em}, {13, 1}, 2, MBD_E_PROTOCOL, true},
      {{h_fwd, &em}, {10, 1}, 2, MBD_E_PROTOCOL, false},
      {{h_fwd}, {13}, 1, MBD_E_PROTOCOL, true},
      {{h_fwd, "\x93\x01"}, {13, 2}, 2, MBD_E_FORMAT, true},
      {{h_fwd, "\xc1"}, {13, 1}, 2, MBD_E_FORMAT, true},
      {{h_fwd, "\xdf\xff\xff\xff\xff"}, {13, 5}, 2, MBD_E_FORMAT, true},
      {{h_fwd, &em, big, big}, {13, 1, sizeof big, sizeof big}, 4, MBD_E_TOO_LARGE, true},
      {{h_ready, &em}, {13, 1}, 2, MBD_E_PROTOCOL, true},
      {{h_zero, &em}, {13, 1}, 2, MBD_E_INVALID, false},
      /* {route: {dtype: "f64"}} */
      {{h_fwd, "\x81\xa5route\x81\xa5" "dtype\xa3" "f64"}, {13, 18}, 2, MBD_E_INVALID, true},
      /* {route: 5} */
      {{h_fwd, "\x81\xa5route\x05"}, {13, 8}, 2, MBD_E_INVALID, true},
      /* STEP {session: "noslash"} */
      {{h_step, "\x81\xa7session\xa7noslash"}, {13, 17}, 2, MBD_E_INVALID, true},
      /* STEP without session */
      {{h_step, &em}, {13, 1}, 2, MBD_E_INVALID, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    raw_send(e->client, cases[i].f, cases[i].l, cases[i].n);
    mbd_body *b = expect_reply(e, cases[i].has_tag ? 0x33 : 0, MBD_CMD_ERROR, 3000);
    int64_t code = 0;
    char name[32] = "", msg[512] = "";
    assert_int_equal(mbd_obj_i64(mbd_body_root(b), "code", true, &code, NULL), 0);
    assert_int_equal(mbd_obj_str(mbd_body_root(b), "error", true, name, sizeof name, NULL), 0);
    assert_int_equal(mbd_obj_str(mbd_body_root(b), "message", true, msg, sizeof msg, NULL), 0);
    if (code != cases[i].code) fail_msg("case %zu: expected %d, got %d: %s", i, cases[i].code, (int)code, msg);
    assert_string_equal(name, mbd_status_name(cases[i].code));
    assert_true(strlen(msg) > 0);
    mbd_body_destroy(&b);
    /* still serving */
    expect_served_by(e, request(e, MBD_CMD_FORWARD, "f32", "m", 0, NULL), a);
  }
  /* payload frames travel intact both ways */
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "model", "m");
  mbd_msg *m = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_msg_new(MBD_CMD_FORWARD, 4242, &m, &err), 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, &err), 0);
  msgpack_sbuffer_destroy(&sb);
  for (size_t i = 0; i < 1000; i++) big[i] = (uint8_t)(i * 13);
  assert_int_equal(mbd_msg_add_payload_copy(m, big, 1000, &err), 0);
  assert_int_equal(mbd_msg_send(&m, e->client, 0, &err), 0);
  m = pump(e, EV_HANG_MS);
  assert_non_null(m);
  assert_int_equal(mbd_msg_tag(m), 4242);
  assert_int_equal(mbd_msg_cmd(m), MBD_CMD_FINAL);
  size_t len;
  const void *p = mbd_msg_payload(m, 0, &len);
  assert_int_equal(len, 1000);
  assert_memory_equal(p, big, 1000);
  mbd_msg_destroy(&m);
}

static void test_sigterm(void **state) {
  env *e = *state;
  start_broker(e, NULL);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 1, "m", false);
  wait_workers(e, 1);
  a->answer = false;
  uint64_t t1 = request(e, MBD_CMD_FORWARD, "f32", "m", 10000, NULL); /* in flight */
  uint64_t t2 = request(e, MBD_CMD_FORWARD, "f32", "m", 10000, NULL); /* queued */
  int none = 0;
  pump_until(e, &a->received, &none, 1, EV_HANG_MS);
  assert_int_equal(a->received, 1);
  /* The broker reads this client's messages in order: once it answers a
   * STATUS sent after t2, t2 is in its queue. */
  uint64_t ts = e->next_tag++;
  send_body(e->client, MBD_CMD_STATUS, ts, NULL);
  mbd_body *sb = expect_reply(e, ts, MBD_CMD_FINAL, EV_HANG_MS);
  mbd_body_destroy(&sb);
  kill(e->pid, SIGTERM);
  expect_error(e, t2, MBD_E_BUSY, "shutting down", NULL, 0);
  expect_error(e, t1, MBD_E_WORKER_LOST, "shut down", NULL, 0);
  int st = procs_wait_exit(e->pid, EV_HANG_MS);
  assert_true(st != -1);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  e->pid = 0;
  pump_until(e, &a->disconnects, &none, 1, EV_HANG_MS);
  assert_true(a->disconnects >= 1);
}

/* A worker that stops sends DISCONNECT; the broker re-sends what it had in
 * flight and answers with a goodbye, the last thing the worker hears. */
static void test_worker_goodbye(void **state) {
  env *e = *state;
  start_broker(e, NULL);
  e->client = dealer(e, e->cep, NULL);
  fworker *a = add_worker(e, "wa", MBD_POLICY_F32, 1, "m", false);
  fworker *b = add_worker(e, "wb", MBD_POLICY_F32, 1, "m", false);
  wait_workers(e, 2);
  a->answer = b->answer = false;
  uint64_t t = request(e, MBD_CMD_FORWARD, "f32", "m", 10000, NULL);
  pump_until(e, &a->received, &b->received, 1, EV_HANG_MS);
  fworker *first = a->received ? a : b, *second = a->received ? b : a;
  second->answer = true;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "reason", "shutdown");
  send_body(first->s, MBD_CMD_DISCONNECT, 0, &sb);
  msgpack_sbuffer_destroy(&sb);
  first->silent = true; /* a stopped worker sends no heartbeats */
  expect_served_by(e, t, second);
  int none = 0;
  pump_until(e, &first->disconnects, &none, 1, EV_HANG_MS);
  assert_int_equal(first->disconnects, 1);
  int received = first->received;
  assert_null(pump(e, 300)); /* after the goodbye nothing more comes */
  assert_int_equal(first->received, received);
  assert_int_equal(first->disconnects, 1);
  wait_workers(e, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_routing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeat_expiry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failover_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deadlines_and_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_corpus, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm, setup, teardown),
      cmocka_unit_test_setup_teardown(test_worker_goodbye, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
