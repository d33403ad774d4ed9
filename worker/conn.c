/* The worker's DEALER connection to the broker: registration, control
 * messages, non-blocking sends and receives. See conn.h. */
#include "worker/conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "common/protocol.h"
#include "worker/scheduler.h"

#define LOGC MBD_WSTATE_LOG

struct mbd_wconn {
  const mbd_wstate *st; /* borrowed: options, identities, load */
  void *zctx;           /* own ZeroMQ context */
  void *sock;           /* DEALER; NULL before the first register */
};

int mbd_wconn_new(const mbd_wstate *st, mbd_wconn **out, mbd_error *err) {
  *out = NULL;
  mbd_wconn *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the connection");
  c->st = st;
  if (!(c->zctx = zmq_ctx_new())) {
    free(c);
    return mbd_error_set(err, MBD_E_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
  }
  *out = c;
  return MBD_OK;
}

void mbd_wconn_destroy(mbd_wconn **pc) {
  if (!pc || !*pc) return;
  mbd_wconn *c = *pc;
  if (c->sock) zmq_close(c->sock);
  if (c->zctx) zmq_ctx_term(c->zctx);
  free(c);
  *pc = NULL;
}

void mbd_wconn_send(void *ctx, mbd_msg **m) {
  mbd_wconn *c = ctx;
  mbd_error e = {0};
  if (!c->sock) {
    mbd_msg_destroy(m);
    MBD_LOGW(LOGC, "not connected to the broker: message dropped");
    return;
  }
  if (mbd_msg_send(m, c->sock, ZMQ_DONTWAIT, &e))
    MBD_LOGW(LOGC, "send to broker failed (message dropped): %s", e.msg);
}

/* Sends a control message (tag 0) whose body is in sb (consumed). */
static void send_ctl_body(mbd_wconn *c, uint8_t cmd, msgpack_sbuffer *sb) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(cmd, 0, &m, &e) || mbd_msg_take_body(m, sb, &e)) {
    MBD_LOGE(LOGC, "cannot build %s: %s", mbd_cmd_name(cmd), e.msg);
    mbd_msg_destroy(&m);
  } else {
    mbd_wconn_send(c, &m);
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

void mbd_wconn_heartbeat(mbd_wconn *c) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_u64(&pk, "load", mbd_wsched_load(c->st));
  mbd_pack_kv_u64(&pk, "sessions", (uint64_t)mbd_wsession_count(c->st->sessions));
  send_ctl_body(c, MBD_CMD_HEARTBEAT, &sb);
}

void mbd_wconn_disconnect(mbd_wconn *c, const char *reason) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "reason", reason);
  send_ctl_body(c, MBD_CMD_DISCONNECT, &sb);
}

int mbd_wconn_register(mbd_wconn *c, mbd_error *err) {
  const mbd_wstate *st = c->st;
  if (c->sock) zmq_close(c->sock);
  c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
  if (!c->sock) return mbd_error_set(err, MBD_E_IO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  int linger = 0, rcvtimeo = 0, sndhwm = 1000000;
  zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(c->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
  /* recv after poll only: never block the reactor. */
  zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
  if (st->o.curve && mbd_curve_client(c->sock, &st->o.curve_key, st->o.server_key, err))
    return err->code;
  if (zmq_connect(c->sock, st->o.connect))
    return mbd_error_set(err, MBD_E_IO, "cannot connect to broker at %s: %s (check --connect)",
                         st->o.connect, zmq_strerror(zmq_errno()));
  send_ready(c);
  MBD_LOGI(LOGC, "%s registered at %s: uid %s route %.16s…", st->o.name, st->o.connect, st->uid,
           st->route_id);
  return MBD_OK;
}

int mbd_wconn_poll(mbd_wconn *c, long timeout_ms, mbd_error *err) {
  zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
  int pr = zmq_poll(&it, 1, timeout_ms);
  if (pr < 0) {
    if (zmq_errno() == EINTR) return 0;
    return mbd_error_set(err, MBD_E_IO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
  }
  return pr > 0 && (it.revents & ZMQ_POLLIN) ? 1 : 0;
}

int mbd_wconn_recv(mbd_wconn *c, mbd_msg **out, mbd_error *err) {
  return mbd_msg_recv(c->sock, false, c->st->o.max_message_bytes, out, err);
}

void mbd_wconn_set_linger(mbd_wconn *c, int ms) {
  if (c->sock) zmq_setsockopt(c->sock, ZMQ_LINGER, &ms, sizeof ms);
}
