/* The worker's connection to the broker: the I/O thread with the DEALER
 * socket, and the compute side of the pipe. See conn.h. */
#include "worker/conn.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "common/protocol.h"

#define LOGC MBD_WSTATE_LOG
#define PIPE_EP "inproc://mbd-worker-pipe"
#define RELAY_MAX 256 /* messages relayed per direction per turn */
#define GOODBYE_MS 1000 /* how long a stopping worker waits for the broker's goodbye */

struct mbd_wconn {
  const mbd_wstate *st;       /* borrowed: options, identities */
  void *zctx;                 /* own ZeroMQ context */
  void *sock;                 /* DEALER to the broker: I/O thread only once started */
  void *mon;                  /* PAIR reading the DEALER's failed CURVE handshakes, or NULL */
  unsigned mon_gen;           /* monitor endpoints are per DEALER: a fresh name each time */
  void *pipe_io, *pipe_cmp;   /* PAIR ends: I/O thread's, compute thread's */
  pthread_t thread;
  bool started;
  atomic_bool failed;         /* the I/O thread ended on an error (in err) */
  mbd_error err;
  bool refused;               /* the broker refused READY: err says why, never retried */
  _Atomic uint64_t load, sessions; /* published by the compute thread */
  atomic_bool draining;       /* set by the compute thread on SIGTERM */
  pthread_mutex_t pfx_mu;     /* guards pfx: the compute thread writes, the I/O thread reads */
  uint8_t pfx[1024];          /* the heartbeat's `prefix` value (msgpack), pfx_len bytes */
  size_t pfx_len;
  double last_heard, next_hb; /* I/O thread's clock, seconds */
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int mbd_wconn_new(const mbd_wstate *st, mbd_wconn **out, mbd_error *err) {
  *out = NULL;
  mbd_wconn *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the connection");
  c->st = st;
  atomic_init(&c->failed, false);
  atomic_init(&c->load, 0);
  atomic_init(&c->sessions, 0);
  atomic_init(&c->draining, false);
  pthread_mutex_init(&c->pfx_mu, NULL);
  if (!(c->zctx = zmq_ctx_new())) {
    free(c);
    return mbd_error_set(err, MBD_E_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
  }
  *out = c;
  return MBD_OK;
}

/* Reads and frees whatever waits on a pipe end: a message still queued in an
 * inproc pipe when its sockets close is never freed (requests the broker
 * sent after the worker's last drain, replies the I/O thread did not relay). */
static void pipe_discard(void *end) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (zmq_msg_recv(&m, end, ZMQ_DONTWAIT) >= 0) {
    zmq_msg_close(&m);
    zmq_msg_init(&m);
  }
  zmq_msg_close(&m);
}

void mbd_wconn_destroy(mbd_wconn **pc) {
  if (!pc || !*pc) return;
  mbd_wconn *c = *pc;
  if (c->started) { /* not stopped: make its poll fail with ETERM */
    zmq_ctx_shutdown(c->zctx);
    pthread_join(c->thread, NULL);
  }
  if (c->sock && c->mon) zmq_socket_monitor(c->sock, NULL, 0); /* see sock_register */
  if (c->sock) zmq_close(c->sock);
  if (c->mon) zmq_close(c->mon);
  if (c->pipe_io) pipe_discard(c->pipe_io);
  if (c->pipe_cmp) pipe_discard(c->pipe_cmp);
  if (c->pipe_io) zmq_close(c->pipe_io);
  if (c->pipe_cmp) zmq_close(c->pipe_cmp);
  if (c->zctx) zmq_ctx_term(c->zctx);
  pthread_mutex_destroy(&c->pfx_mu);
  free(c);
  *pc = NULL;
}

/* Sends *m on the DEALER (I/O thread), ZMQ_DONTWAIT; with the broker gone or
 * stalled past the (large) send high-water mark the message is dropped and
 * logged, and the broker answers the client. */
static void sock_send(mbd_wconn *c, mbd_msg **m) {
  mbd_error e = {0};
  if (!c->sock) {
    mbd_msg_destroy(m);
    MBD_LOGW(LOGC, "not connected to the broker: message dropped");
    return;
  }
  if (mbd_msg_send(m, c->sock, ZMQ_DONTWAIT, &e))
    MBD_LOGW(LOGC, "send to broker failed (message dropped): %s", e.msg);
}

void mbd_wconn_send(void *ctx, mbd_msg **m) {
  mbd_wconn *c = ctx;
  mbd_error e = {0};
  if (mbd_msg_send(m, c->pipe_cmp, ZMQ_DONTWAIT, &e))
    MBD_LOGW(LOGC, "reply dropped on its way to the I/O thread: %s", e.msg);
}

void mbd_wconn_publish(mbd_wconn *c, uint64_t load, uint64_t sessions) {
  atomic_store(&c->load, load);
  atomic_store(&c->sessions, sessions);
}

void mbd_wconn_publish_prefix(mbd_wconn *c, const void *packed, size_t len) {
  pthread_mutex_lock(&c->pfx_mu);
  c->pfx_len = len <= sizeof c->pfx ? len : 0;
  if (c->pfx_len) memcpy(c->pfx, packed, c->pfx_len);
  pthread_mutex_unlock(&c->pfx_mu);
}

/* Sends a control message (tag 0) whose body is in sb (consumed). */
static void send_ctl_body(mbd_wconn *c, uint8_t cmd, msgpack_sbuffer *sb) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(cmd, 0, &m, &e) || mbd_msg_take_body(m, sb, &e)) {
    MBD_LOGE(LOGC, "cannot build %s: %s", mbd_cmd_name(cmd), e.msg);
    mbd_msg_destroy(&m);
  } else {
    sock_send(c, &m);
  }
  msgpack_sbuffer_destroy(sb);
}

static void send_ready(mbd_wconn *c) {
  const mbd_wstate *st = c->st;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 10);
  mbd_pack_kv_i64(&pk, "device", st->o.backend == MBD_BACKEND_CUDA ? st->o.device : -1);
  mbd_pack_kv_str(&pk, "name", st->o.name);
  mbd_pack_kv_str(&pk, "uid", st->uid);
  mbd_pack_kv_str(&pk, "route", st->route_enc);
  mbd_pack_kv_str(&pk, "route_id", st->route_id);
  mbd_pack_kv_str(&pk, "host_id", st->o.host_id);
  mbd_pack_kv_u64(&pk, "capacity", (uint64_t)st->o.capacity);
  mbd_pack_kv_u64(&pk, "max_batch", (uint64_t)st->o.max_batch);
  mbd_pack_str(&pk, "models");
  msgpack_pack_array(&pk, (uint32_t)st->nmodels);
  for (int i = 0; i < st->nmodels; i++) {
    const mbd_wmodel *m = &st->models[i];
    bool tok = m->tokenizer_digest[0] != '\0';
    msgpack_pack_map(&pk, tok ? 3 : 2);
    mbd_pack_kv_str(&pk, "name", m->name);
    mbd_pack_kv_str(&pk, "digest", m->digest);
    if (tok) mbd_pack_kv_str(&pk, "tokenizer_digest", m->tokenizer_digest);
  }
  mbd_pack_kv_u64(&pk, "pid", (uint64_t)getpid());
  send_ctl_body(c, MBD_CMD_READY, &sb);
}

/* HEARTBEAT {load, sessions[, draining: true][, prefix]} into sb. */
static void heartbeat_body(mbd_wconn *c, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  bool draining = atomic_load(&c->draining);
  pthread_mutex_lock(&c->pfx_mu);
  msgpack_pack_map(&pk, 2 + draining + (c->pfx_len > 0));
  mbd_pack_kv_u64(&pk, "load", atomic_load(&c->load));
  mbd_pack_kv_u64(&pk, "sessions", atomic_load(&c->sessions));
  if (draining) mbd_pack_kv_bool(&pk, "draining", true);
  if (c->pfx_len) {
    mbd_pack_str(&pk, "prefix");
    msgpack_sbuffer_write(sb, (const char *)c->pfx, c->pfx_len);
  }
  pthread_mutex_unlock(&c->pfx_mu);
}

static void send_heartbeat(mbd_wconn *c) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  heartbeat_body(c, &sb);
  send_ctl_body(c, MBD_CMD_HEARTBEAT, &sb);
}

void mbd_wconn_announce_draining(mbd_wconn *c) {
  atomic_store(&c->draining, true);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  heartbeat_body(c, &sb);
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(MBD_CMD_HEARTBEAT, 0, &m, &e) || mbd_msg_take_body(m, &sb, &e))
    mbd_msg_destroy(&m); /* the next periodic HEARTBEAT says it as well */
  else
    mbd_wconn_send(c, &m); /* through the pipe: ahead of nothing, behind earlier replies */
  msgpack_sbuffer_destroy(&sb);
}

/* With CURVE: watches the DEALER for a handshake the broker's ZAP handler
 * refused (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH), which nothing else reports: the
 * socket just reconnects and is refused again. */
static int sock_monitor(mbd_wconn *c, mbd_error *err) {
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://mbd-worker-mon-%u", c->mon_gen++);
  int zero = 0;
  if (zmq_socket_monitor(c->sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) ||
      !(c->mon = zmq_socket(c->zctx, ZMQ_PAIR)) ||
      zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero) ||
      zmq_setsockopt(c->mon, ZMQ_RCVTIMEO, &zero, sizeof zero) || zmq_connect(c->mon, ep))
    return mbd_error_set(err, MBD_E_IO, "socket monitor: %s", zmq_strerror(zmq_errno()));
  return MBD_OK;
}

/* Reads the monitor's events; a refused handshake makes the connection fail
 * for good (c->refused), naming the key the broker did not admit. */
static void read_monitor(mbd_wconn *c) {
  for (;;) {
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, c->mon, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&f);
      return;
    }
    uint16_t ev = 0;
    uint32_t status = 0;
    bool first = zmq_msg_size(&f) == 6 && zmq_msg_more(&f);
    if (first) {
      memcpy(&ev, zmq_msg_data(&f), 2);
      memcpy(&status, (const uint8_t *)zmq_msg_data(&f) + 2, 4);
    }
    zmq_msg_close(&f);
    if (!first || ev != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) continue;
    mbd_error_set(&c->err, MBD_E_INVALID,
                  "the broker at %s refused this worker's CURVE key %s (ZAP status %u): add the "
                  "worker's public key to the broker's --worker-keys, or check --server-key",
                  c->st->o.connect, c->st->o.curve_key.public_key, (unsigned)status);
    c->refused = true;
  }
}

/* (Re)creates the DEALER, connects and sends READY; restarts the liveness clock. */
static int sock_register(mbd_wconn *c, mbd_error *err) {
  const mbd_wstate *st = c->st;
  /* Monitoring stops before the socket closes: an event sent to a monitor
   * PAIR that is already closed stays in the inproc pipe, never freed. */
  if (c->sock && c->mon) zmq_socket_monitor(c->sock, NULL, 0);
  if (c->sock) zmq_close(c->sock);
  if (c->mon) zmq_close(c->mon);
  c->mon = NULL;
  c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
  if (!c->sock) return mbd_error_set(err, MBD_E_IO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  int linger = 0, rcvtimeo = 0, sndhwm = 1000000;
  zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(c->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
  /* recv after poll only: never block the I/O thread. */
  zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
  if (st->o.curve && (mbd_curve_client(c->sock, &st->o.curve_key, st->o.server_key, err) ||
                      sock_monitor(c, err)))
    return err->code;
  if (zmq_connect(c->sock, st->o.connect))
    return mbd_error_set(err, MBD_E_IO, "cannot connect to broker at %s: %s (check --connect)",
                         st->o.connect, zmq_strerror(zmq_errno()));
  send_ready(c);
  c->last_heard = mono_s();
  c->next_hb = c->last_heard + c->st->o.heartbeat_ms / 1000.0;
  MBD_LOGI(LOGC, "%s registering at %s: uid %s route %.16s…", st->o.name, st->o.connect, st->uid,
           st->route_id);
  return MBD_OK;
}

/* Broker -> compute: HEARTBEAT is liveness only, DISCONNECT asks for a new
 * registration (returns true), everything else goes into the pipe. A
 * malformed message is answered here when its tag is readable. */
static bool relay_in(mbd_wconn *c) {
  for (int k = 0; k < RELAY_MAX; k++) {
    mbd_msg *m = NULL;
    mbd_error e = {0};
    int rc = mbd_msg_recv(c->sock, false, c->st->o.max_message_bytes, &m, &e);
    if (rc == MBD_E_IO || (rc && !m)) return false; /* nothing more */
    c->last_heard = mono_s();
    if (rc) {
      uint64_t tag = mbd_msg_tag(m);
      MBD_LOGW(LOGC, "malformed message from broker: %s", e.msg);
      mbd_msg_destroy(&m);
      if (tag && !mbd_msg_new_error(tag, e.code ? e.code : rc, e.msg, &m, NULL)) sock_send(c, &m);
      continue;
    }
    uint8_t cmd = mbd_msg_cmd(m);
    if (cmd == MBD_CMD_HEARTBEAT) {
      mbd_msg_destroy(&m);
    } else if (cmd == MBD_CMD_ERROR && mbd_msg_tag(m) == 0) {
      /* The broker's answer to a READY it refused: the same READY would be
       * refused again, so registering in a loop helps nobody. */
      char why[MBD_ERROR_MSG_MAX - 64] = "no reason given";
      size_t blen = 0;
      const void *b = mbd_msg_body(m, &blen);
      mbd_body *body = NULL;
      if (!mbd_body_parse(b, blen, &body, NULL))
        mbd_obj_str(mbd_body_root(body), "message", false, why, sizeof why, NULL);
      mbd_body_destroy(&body);
      mbd_msg_destroy(&m);
      mbd_error_set(&c->err, MBD_E_INVALID, "the broker refused this worker's registration: %s",
                    why);
      c->refused = true;
      return false;
    } else if (cmd == MBD_CMD_DISCONNECT) {
      MBD_LOGI(LOGC, "broker sent DISCONNECT: re-registering");
      mbd_msg_destroy(&m);
      return true;
    } else if (mbd_msg_send(&m, c->pipe_io, ZMQ_DONTWAIT, &e)) {
      MBD_LOGE(LOGC, "request dropped on its way to the compute thread: %s", e.msg);
    }
  }
  return false;
}

/* Compute -> broker. Returns true on the compute thread's DISCONNECT (tag 0):
 * the last message, sent on to the broker. */
static bool relay_out(mbd_wconn *c) {
  for (int k = 0; k < RELAY_MAX; k++) {
    mbd_msg *m = NULL;
    mbd_error e = {0};
    int rc = mbd_msg_recv(c->pipe_io, false, 0, &m, &e);
    if (rc) {
      mbd_msg_destroy(&m);
      if (rc != MBD_E_IO) MBD_LOGE(LOGC, "bad message from the compute thread: %s", e.msg);
      return false;
    }
    bool quit = mbd_msg_cmd(m) == MBD_CMD_DISCONNECT && mbd_msg_tag(m) == 0;
    sock_send(c, &m);
    if (quit) return true;
  }
  return false;
}

/* After this worker's DISCONNECT: reads, and drops, what the broker sent
 * until its goodbye (a DISCONNECT back). Closing the DEALER while a message
 * is still arriving makes ZeroMQ leak the frames it had queued; after the
 * goodbye nothing more comes, and all this worker sent has arrived. The
 * requests dropped here are the broker's to re-send: it counts them lost.
 * Returns false when no goodbye came within GOODBYE_MS. */
static bool await_goodbye(mbd_wconn *c) {
  if (!c->sock) return false;
  double end = mono_s() + GOODBYE_MS / 1000.0;
  for (;;) {
    long left = (long)((end - mono_s()) * 1000.0);
    if (left <= 0) return false;
    zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, left) < 0 && zmq_errno() != EINTR) return false;
    for (int k = 0; k < RELAY_MAX && (it.revents & ZMQ_POLLIN); k++) {
      mbd_msg *m = NULL;
      int rc = mbd_msg_recv(c->sock, false, c->st->o.max_message_bytes, &m, NULL);
      if (rc == MBD_E_IO || (rc && !m)) break;
      bool bye = !rc && mbd_msg_cmd(m) == MBD_CMD_DISCONNECT && mbd_msg_tag(m) == 0;
      mbd_msg_destroy(&m);
      if (bye) return true;
    }
  }
}

static void *io_main(void *arg) {
  mbd_wconn *c = arg;
  double hb = c->st->o.heartbeat_ms / 1000.0;
  for (;;) {
    zmq_pollitem_t it[3] = {{c->sock, 0, ZMQ_POLLIN, 0},
                            {c->pipe_io, 0, ZMQ_POLLIN, 0},
                            {c->mon, 0, ZMQ_POLLIN, 0}};
    long timeout = (long)((c->next_hb - mono_s()) * 1000.0) + 1;
    if (timeout < 0) timeout = 0;
    if (zmq_poll(it, c->mon ? 3 : 2, timeout) < 0 && zmq_errno() != EINTR) {
      mbd_error_set(&c->err, MBD_E_IO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
      break;
    }
    /* Replies first: each one frees capacity on the broker. */
    if ((it[1].revents & ZMQ_POLLIN) && relay_out(c)) {
      /* Without a goodbye the last replies and DISCONNECT may still be
       * leaving: give them a while. */
      bool bye = await_goodbye(c);
      if (!bye)
        MBD_LOGW(LOGC, "no goodbye from the broker within %d ms (is it down?): closing anyway",
                 GOODBYE_MS);
      int linger = bye ? 0 : 1000;
      zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
      return NULL;
    }
    if (c->mon && (it[2].revents & ZMQ_POLLIN)) read_monitor(c);
    if (c->refused) break;
    bool again = (it[0].revents & ZMQ_POLLIN) && relay_in(c);
    if (c->refused) break;
    double t = mono_s();
    if (!again && t - c->last_heard > hb * c->st->o.liveness) {
      MBD_LOGW(LOGC, "broker silent for %.1f s: reconnecting", t - c->last_heard);
      again = true;
    }
    if (again && sock_register(c, &c->err)) break;
    t = mono_s();
    if (t >= c->next_hb) {
      send_heartbeat(c);
      c->next_hb = t + hb;
    }
  }
  MBD_LOGE(LOGC, "connection to the broker failed: %s", c->err.msg);
  atomic_store(&c->failed, true);
  return NULL;
}

int mbd_wconn_start(mbd_wconn *c, mbd_error *err) {
  int zero = 0;
  c->pipe_io = zmq_socket(c->zctx, ZMQ_PAIR);
  c->pipe_cmp = zmq_socket(c->zctx, ZMQ_PAIR);
  if (!c->pipe_io || !c->pipe_cmp)
    return mbd_error_set(err, MBD_E_IO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  /* No high-water mark on the pipe: what the compute thread produced must
   * reach the DEALER (whose own mark is large) rather than be dropped. */
  void *ends[2] = {c->pipe_io, c->pipe_cmp};
  for (int i = 0; i < 2; i++) {
    zmq_setsockopt(ends[i], ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(ends[i], ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(ends[i], ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(ends[i], ZMQ_RCVTIMEO, &zero, sizeof zero); /* recv after poll only */
  }
  if (zmq_bind(c->pipe_io, PIPE_EP) || zmq_connect(c->pipe_cmp, PIPE_EP))
    return mbd_error_set(err, MBD_E_IO, "worker pipe: %s", zmq_strerror(zmq_errno()));
  int rc = sock_register(c, err);
  if (rc) return rc;
  if (pthread_create(&c->thread, NULL, io_main, c))
    return mbd_error_set(err, MBD_E_IO, "cannot start the worker's I/O thread");
  c->started = true;
  return MBD_OK;
}

void mbd_wconn_stop(mbd_wconn *c, const char *reason) {
  if (!c->started) return;
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new_kv(MBD_CMD_DISCONNECT, 0, "reason", reason, &m, &e) ||
      mbd_msg_send(&m, c->pipe_cmp, 0, &e)) {
    /* The I/O thread cannot be told: it is stopped by closing the context. */
    MBD_LOGE(LOGC, "cannot stop the I/O thread cleanly: %s", e.msg);
    mbd_msg_destroy(&m);
    zmq_ctx_shutdown(c->zctx);
  }
  pthread_join(c->thread, NULL);
  c->started = false;
}

bool mbd_wconn_failed(const mbd_wconn *c, mbd_error *err) {
  if (!atomic_load(&c->failed)) return false;
  if (err) *err = c->err;
  return true;
}

int mbd_wconn_poll(mbd_wconn *c, long timeout_ms, mbd_error *err) {
  zmq_pollitem_t it = {.socket = c->pipe_cmp, .events = ZMQ_POLLIN};
  int pr = zmq_poll(&it, 1, timeout_ms);
  if (pr < 0) {
    if (zmq_errno() == EINTR) return 0;
    return mbd_error_set(err, MBD_E_IO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
  }
  return pr > 0 && (it.revents & ZMQ_POLLIN) ? 1 : 0;
}

int mbd_wconn_recv(mbd_wconn *c, mbd_msg **out, mbd_error *err) {
  return mbd_msg_recv(c->pipe_cmp, false, c->st->o.max_message_bytes, out, err);
}
