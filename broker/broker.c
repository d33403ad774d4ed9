/* Broker reactor: sockets and the clock around the socket-free core. */
#include "broker/broker.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "broker/caller.h"
#include "broker/ipcdir.h"
#include "broker/zap.h"
#include "common/curve.h"
#include "common/log.h"

#define LOG "broker"
#define BATCH 512 /* messages per socket in one go, so neither side starves the other */

struct mbd_broker {
  mbd_broker_config cfg;
  void *zctx;
  void *clients, *workers;
  void *mon[2];  /* PAIR sockets reading ZMQ_EVENT_DISCONNECTED of clients, workers */
  mbd_bcore *core;
  mbd_ipc_access ipc; /* who may reach ipc sockets */
  bool curve;         /* tcp endpoints are CURVE servers */
  mbd_curve_pair key; /* the broker's key pair (curve) */
  mbd_zap_keys *keys; /* admitted public keys per role */
  void *zap;          /* REP on inproc://zeromq.zap.01 (curve) */
  /* Per side (mbd_bdest): true while the socket's last operation was a receive
   * that found nothing. Its ZMQ_FD then becomes readable when something new
   * comes; a send since may have consumed that signal, so a socket that is
   * not clean is drained before the reactor sleeps. */
  bool clean[2];
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int send_cb(void *ctx, mbd_bdest dest, mbd_msg **m, mbd_error *err) {
  mbd_broker *b = ctx;
  b->clean[dest] = false;
  return mbd_msg_send(m, dest == MBD_BDEST_CLIENT ? b->clients : b->workers, ZMQ_DONTWAIT, err);
}

/* The client probe of the core: the routing id with an empty frame after it.
 * Under ROUTER_MANDATORY an id that is no longer connected fails at once
 * with EHOSTUNREACH; a connected client gets one empty frame, which is not a
 * mambad message and is dropped by its receiver. */
static int probe_cb(void *ctx, const void *id, size_t len) {
  mbd_broker *b = ctx;
  b->clean[MBD_BDEST_CLIENT] = false;
  if (zmq_send(b->clients, id, len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return errno == EHOSTUNREACH ? MBD_E_NOT_FOUND : MBD_E_IO;
  zmq_send(b->clients, "", 0, ZMQ_DONTWAIT);
  return MBD_OK;
}

/* Watches s for closed connections: a PAIR socket on its monitor endpoint. */
static int make_monitor(mbd_broker *b, void *s, const char *ep, void **out, mbd_error *err) {
  if (zmq_socket_monitor(s, ep, ZMQ_EVENT_DISCONNECTED))
    return mbd_error_set(err, MBD_E_IO, "socket monitor: %s", zmq_strerror(errno));
  void *m = zmq_socket(b->zctx, ZMQ_PAIR);
  int zero = 0;
  if (!m || zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero) || zmq_connect(m, ep)) {
    if (m) zmq_close(m);
    return mbd_error_set(err, MBD_E_IO, "socket monitor: %s", zmq_strerror(errno));
  }
  *out = m;
  return MBD_OK;
}

/* Reads the waiting monitor events of side d (two frames each) and tells the
 * core. True when it read them all (its ZMQ_FD is armed again). */
static bool read_monitor(mbd_broker *b, int d) {
  bool any = false, drained = false;
  for (int i = 0; i < BATCH; i++) {
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, b->mon[d], ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&f);
      drained = true;
      break;
    }
    bool first = zmq_msg_size(&f) == 6 && zmq_msg_more(&f);
    zmq_msg_close(&f);
    any |= first;
  }
  if (any) mbd_bcore_on_disconnect(b->core, d == 0 ? MBD_BDEST_CLIENT : MBD_BDEST_WORKER, now_ms());
  return drained;
}

static bool is_tcp(const char *ep) { return !strncmp(ep, "tcp://", 6); }

/* The tcp rule: CURVE, or an endpoint the operator marked insecure (warned). */
static int check_transport(const mbd_broker *b, const char *ep, const char *role, bool insecure,
                           mbd_error *err) {
  if (!is_tcp(ep)) return MBD_OK;
  if (b->curve) return MBD_OK;
  if (!insecure)
    return mbd_error_set(err, MBD_E_INVALID,
                         "%s endpoint %s is tcp without CURVE: anyone who reaches the port could "
                         "connect. Give --curve-secret and the admitted keys, or pass --insecure %s "
                         "(YAML: insecure: true) to accept that",
                         role, ep, role);
  MBD_LOGW(LOG, "%s endpoint %s is tcp WITHOUT authentication or encryption (--insecure %s)", role,
           ep, role);
  return MBD_OK;
}

static int make_socket(mbd_broker *b, const char *ep, const char *domain, void **out,
                       mbd_error *err) {
  void *s = zmq_socket(b->zctx, ZMQ_ROUTER);
  if (!s) return mbd_error_set(err, MBD_E_IO, "creating a ROUTER socket: %s", zmq_strerror(errno));
  /* RCVTIMEO 0: a receive never blocks; the reactor drains each socket until
   * it finds nothing. */
  int one = 1, zero = 0, linger = 100, hwm = b->cfg.hwm;
  int hb_timeout = b->cfg.heartbeat_ms * b->cfg.liveness;
  int64_t maxmsg = b->cfg.max_message_mb * 1024 * 1024;
  if (zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
      zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof one) ||
      zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
      zmq_setsockopt(s, ZMQ_RCVTIMEO, &zero, sizeof zero) ||
      zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
      zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
      zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      /* ZMTP pings: a peer whose host vanished (no FIN ever comes) is closed
       * after the liveness period, which the monitor then reports. */
      zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &b->cfg.heartbeat_ms, sizeof(int)) ||
      zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout)) {
    int e = errno;
    zmq_close(s);
    return mbd_error_set(err, MBD_E_IO, "setting socket options: %s", zmq_strerror(e));
  }
  int rc = b->curve && is_tcp(ep) ? mbd_curve_server(s, &b->key, domain, err) : MBD_OK;
  if (!rc) rc = mbd_ipc_dir_prepare(ep, &b->ipc, err);
  if (rc) {
    zmq_close(s);
    return rc;
  }
  if (zmq_bind(s, ep)) {
    int e = errno;
    zmq_close(s);
    return mbd_error_set(err, MBD_E_IO, "cannot bind %s: %s (is another broker running there?)", ep,
                         zmq_strerror(e));
  }
  if ((rc = mbd_ipc_socket_secure(ep, &b->ipc, err))) {
    zmq_close(s);
    return rc;
  }
  *out = s;
  return MBD_OK;
}

/* With --curve-secret: the key pair, the admitted keys and the ZAP socket,
 * bound before any CURVE socket so no handshake goes unanswered. */
static int setup_curve(mbd_broker *b, mbd_error *err) {
  const mbd_broker_config *c = &b->cfg;
  if (!c->curve_secret[0]) {
    if (c->client_keys[0] || c->worker_keys[0] || c->operator_keys[0])
      return mbd_error_set(err, MBD_E_INVALID, "admitted keys given without --curve-secret");
    return MBD_OK;
  }
  int rc = mbd_curve_read_secret(c->curve_secret, &b->key, err);
  if (rc || (rc = mbd_zap_keys_new(&b->keys, err))) return rc;
  if ((c->client_keys[0] && (rc = mbd_zap_keys_add(b->keys, MBD_ZAP_CLIENTS, c->client_keys, err))) ||
      (c->worker_keys[0] && (rc = mbd_zap_keys_add(b->keys, MBD_ZAP_WORKERS, c->worker_keys, err))) ||
      (c->operator_keys[0] &&
       (rc = mbd_zap_keys_add(b->keys, MBD_ZAP_OPERATORS, c->operator_keys, err))))
    return rc;
  if (is_tcp(c->workers_ep) && !mbd_zap_keys_count(b->keys, MBD_ZAP_WORKERS))
    return mbd_error_set(err, MBD_E_INVALID,
                         "CURVE workers endpoint %s admits no key: give --worker-keys", c->workers_ep);
  b->zap = zmq_socket(b->zctx, ZMQ_REP);
  if (!b->zap || zmq_bind(b->zap, MBD_ZAP_ENDPOINT))
    return mbd_error_set(err, MBD_E_IO, "binding the ZAP handler: %s", zmq_strerror(errno));
  b->curve = true;
  MBD_LOGI(LOG, "CURVE on tcp endpoints: server key %s, %zu client, %zu worker, %zu operator keys",
           b->key.public_key, mbd_zap_keys_count(b->keys, MBD_ZAP_CLIENTS),
           mbd_zap_keys_count(b->keys, MBD_ZAP_WORKERS),
           mbd_zap_keys_count(b->keys, MBD_ZAP_OPERATORS));
  return MBD_OK;
}

int mbd_broker_new(const mbd_broker_config *cfg, mbd_broker **out, mbd_error *err) {
  *out = NULL;
  int rc;
  mbd_broker *b = calloc(1, sizeof *b);
  if (!b) return mbd_error_set(err, MBD_E_NOMEM, "out of memory creating the broker");
  b->cfg = *cfg;
  if (cfg->ipc_group[0]) {
    struct group *g = getgrnam(cfg->ipc_group);
    char *end = NULL;
    unsigned long gid = strtoul(cfg->ipc_group, &end, 10);
    if (!g && (!end || *end || end == cfg->ipc_group)) {
      rc = mbd_error_set(err, MBD_E_INVALID, "--ipc-group: no group '%s'", cfg->ipc_group);
      goto fail;
    }
    b->ipc.has_group = true;
    b->ipc.gid = g ? g->gr_gid : (gid_t)gid;
  }
  b->zctx = zmq_ctx_new();
  if (!b->zctx) {
    rc = mbd_error_set(err, MBD_E_IO, "creating the ZeroMQ context: %s", zmq_strerror(errno));
    goto fail;
  }
  if ((rc = setup_curve(b, err)) ||
      (rc = check_transport(b, cfg->clients_ep, "clients", cfg->insecure_clients, err)) ||
      (rc = check_transport(b, cfg->workers_ep, "workers", cfg->insecure_workers, err)) ||
      (rc = make_socket(b, cfg->clients_ep, "clients", &b->clients, err)) ||
      (rc = make_socket(b, cfg->workers_ep, "workers", &b->workers, err)) ||
      (rc = make_monitor(b, b->clients, "inproc://mbd-broker-mon-clients", &b->mon[0], err)) ||
      (rc = make_monitor(b, b->workers, "inproc://mbd-broker-mon-workers", &b->mon[1], err)) ||
      (rc = mbd_bcore_new(cfg, send_cb, b, &b->core, err)))
    goto fail;
  mbd_bcore_set_probe(b->core, probe_cb);
  *out = b;
  return MBD_OK;
fail:
  mbd_broker_destroy(&b);
  return rc;
}

void mbd_broker_destroy(mbd_broker **pb) {
  if (!pb || !*pb) return;
  mbd_broker *b = *pb;
  mbd_bcore_destroy(&b->core);
  /* Monitoring stops before the sockets close: closing them raises events,
   * and an event sent to a monitor PAIR that is already closed stays in the
   * inproc pipe, never freed. */
  if (b->clients && b->mon[0]) zmq_socket_monitor(b->clients, NULL, 0);
  if (b->workers && b->mon[1]) zmq_socket_monitor(b->workers, NULL, 0);
  if (b->clients) zmq_close(b->clients);
  if (b->workers) zmq_close(b->workers);
  for (int d = 0; d < 2; d++)
    if (b->mon[d]) zmq_close(b->mon[d]);
  if (b->zap) zmq_close(b->zap);
  mbd_zap_keys_destroy(&b->keys);
  if (b->zctx) zmq_ctx_term(b->zctx);
  free(b);
  *pb = NULL;
}

mbd_bcore *mbd_broker_core(mbd_broker *b) { return b->core; }

/* Receives what is queued on the socket of `side`, at most BATCH messages,
 * and hands each to the core. No ZMQ_EVENTS query per message: receives
 * return at once (RCVTIMEO 0), and the one that finds nothing leaves the
 * socket clean. */
static void pump(mbd_broker *b, mbd_bdest side) {
  bool client_side = side == MBD_BDEST_CLIENT;
  void *s = client_side ? b->clients : b->workers;
  size_t cap = (size_t)b->cfg.max_message_mb * 1024 * 1024;
  for (int i = 0; i < BATCH; i++) {
    mbd_msg *m = NULL;
    mbd_error err = {0};
    int rc = mbd_msg_recv(s, true, cap, &m, &err);
    if (rc == MBD_E_IO) {
      b->clean[side] = true; /* sends made while handling this batch came before */
      return;
    }
    if (rc == MBD_E_NOMEM) {
      MBD_LOGE(LOG, "%s", err.msg);
      continue;
    }
    /* The core and workers see only who we vouch for: every client request and
     * every worker READY carries the stamped caller. */
    if (rc == MBD_OK && (client_side || mbd_msg_cmd(m) == MBD_CMD_READY)) {
      mbd_bcaller who;
      const char *ep = client_side ? b->cfg.clients_ep : b->cfg.workers_ep;
      mbd_bcaller_of(m, !strncmp(ep, "ipc://", 6), &who);
      rc = mbd_bcaller_stamp(m, &who, &err);
    }
    if (client_side) mbd_bcore_on_client(b->core, &m, rc, &err, now_ms());
    else mbd_bcore_on_worker(b->core, &m, rc, &err, now_ms());
  }
  b->clean[side] = false; /* BATCH reached: more may be queued */
}

/* Drains both sockets until neither has anything left and nothing was sent
 * on either since its last empty receive; workers first (replies free
 * capacity). */
static void drain(mbd_broker *b) {
  while (!b->clean[MBD_BDEST_WORKER] || !b->clean[MBD_BDEST_CLIENT]) {
    if (!b->clean[MBD_BDEST_WORKER]) pump(b, MBD_BDEST_WORKER);
    if (!b->clean[MBD_BDEST_CLIENT]) pump(b, MBD_BDEST_CLIENT);
  }
}

/* ZMQ_FD of s (the descriptor poll(2) waits on). */
static int socket_fd(void *s) {
  int fd = -1;
  size_t len = sizeof fd;
  return zmq_getsockopt(s, ZMQ_FD, &fd, &len) ? -1 : fd;
}

/* One poll(2) over the sockets' ZMQ_FDs instead of zmq_poll, which queries
 * ZMQ_EVENTS (a system call each) of every socket twice per wake-up. A
 * ZMQ_FD only says that the socket has news, and only after the socket was
 * drained: hence the clean flags. */
int mbd_broker_run(mbd_broker *b, volatile sig_atomic_t *stop, int grace_ms, mbd_error *err) {
  enum { CLIENTS, WORKERS, MON_C, MON_W, ZAP, NFDS };
  void *socks[NFDS] = {b->clients, b->workers, b->mon[0], b->mon[1], b->zap};
  struct pollfd fds[NFDS];
  int nfds = b->zap ? NFDS : ZAP;
  for (int i = 0; i < nfds; i++) {
    fds[i] = (struct pollfd){socket_fd(socks[i]), POLLIN, 0};
    if (fds[i].fd < 0) return mbd_error_set(err, MBD_E_IO, "ZMQ_FD: %s", zmq_strerror(errno));
  }
  bool mon_pending[2] = {true, true}, zap_pending = b->zap != NULL;
  b->clean[0] = b->clean[1] = false;
  int64_t drain_until = -1;
  for (;;) {
    if (zap_pending) {
      mbd_zap_serve(b->zap, b->keys); /* serves until it finds nothing */
      zap_pending = false;
    }
    drain(b);
    for (int d = 0; d < 2; d++)
      if (mon_pending[d]) mon_pending[d] = !read_monitor(b, d);
    mbd_bcore_tick(b->core, now_ms());
    drain(b); /* what the timers sent, and what came meanwhile */
    int64_t now = now_ms();
    if (*stop && drain_until < 0) {
      MBD_LOGI(LOG, "stopping: refusing new requests, %zu queued answered, waiting up to %d ms for "
               "%zu in flight", mbd_bcore_queue_len(b->core), grace_ms,
               mbd_bcore_pending(b->core) - mbd_bcore_queue_len(b->core));
      mbd_bcore_shutdown(b->core, now);
      drain(b);
      drain_until = now + grace_ms;
    }
    if (drain_until >= 0 && (mbd_bcore_pending(b->core) == 0 || now >= drain_until)) break;
    int64_t wait = mbd_bcore_next_due(b->core, now);
    if (drain_until >= 0 && drain_until - now < wait) wait = drain_until - now;
    if (wait > 1000) wait = 1000;
    if (mon_pending[0] || mon_pending[1]) wait = 0;
    int rc = poll(fds, (nfds_t)nfds, (int)wait);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return mbd_error_set(err, MBD_E_IO, "poll: %s", strerror(errno));
    }
    if (fds[CLIENTS].revents) b->clean[MBD_BDEST_CLIENT] = false;
    if (fds[WORKERS].revents) b->clean[MBD_BDEST_WORKER] = false;
    if (fds[MON_C].revents) mon_pending[0] = true;
    if (fds[MON_W].revents) mon_pending[1] = true;
    if (nfds > ZAP && fds[ZAP].revents) zap_pending = true;
  }
  mbd_bcore_abort(b->core, now_ms());
  return MBD_OK;
}
