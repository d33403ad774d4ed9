/* Broker core: requests from accept to final reply. See core.h.
 *
 * A request lives in one list of all requests (deadline scan) and, while it
 * waits for capacity, in the FIFO queue; once sent it is found by its ticket
 * in a chained hash. Every send to a worker uses a fresh ticket, so a reply
 * to an older send (a worker that was presumed dead, a request already
 * answered by a timeout) finds nothing and is dropped: a client never gets
 * two final replies. Stateless requests keep their original frames (a
 * reference-counted clone is what goes out) for one failover re-send. */
#include "broker/core.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/caller.h"
#include "broker/reclaim.h"
#include "common/log.h"
#include "common/protocol.h"

#define LOG "broker"
#define TICKET_BUCKETS 4096
#define DEADLINE_MAX_MS (24LL * 3600 * 1000)

/* WAITING: on no worker (queued, or being placed); INFLIGHT: sent, not
 * answered; ZOMBIE: answered by the broker (timeout), the worker's slot stays
 * busy until its reply arrives or it dies. */
typedef enum { RQ_WAITING, RQ_INFLIGHT, RQ_ZOMBIE } rq_state;

typedef struct breq {
  uint64_t ticket;                 /* current ticket while in flight */
  uint64_t client_tag;             /* the client's request id */
  uint8_t client[MBD_BW_IDENT_MAX];
  size_t client_len;
  char caller[MBD_BCALLER_ID_MAX]; /* the stamped caller id; "" = anonymous (then the routing id counts) */
  int64_t caller_pid;              /* local caller's process (ipc peer credentials), 0 = unknown */
  char session_id[2 * MBD_BW_UID_MAX]; /* session commands: the whole id */
  uint8_t cmd;
  mbd_route_want want;
  char model[MBD_BW_NAME_MAX];
  char session_uid[MBD_BW_UID_MAX]; /* session commands: the owning worker's uid */
  bool is_session;
  bool has_ipc;                    /* carries CUDA IPC tensors: same-host GPU workers only */
  int ipc_device;                  /* device of the first IPC tensor (GPU-affine routing) */
  char client_host[MBD_BW_NAME_MAX]; /* the client's host_id (required with IPC tensors) */
  int64_t start_ms, deadline_ms;   /* absolute, monotonic */
  mbd_msg *orig;                   /* kept for a re-send (stateless) or until first send */
  uint64_t worker_gen;             /* worker it is on (in flight / zombie) */
  char worker_name[MBD_BW_NAME_MAX];
  bool retried;                    /* the one failover re-send was used */
  rq_state state;
  bool queued, hashed;             /* linked in the queue / the ticket hash */
  struct breq *hnext;              /* ticket hash chain */
  struct breq *qprev, *qnext;      /* queue */
  struct breq *aprev, *anext;      /* all requests */
} breq;

struct mbd_bcore {
  mbd_broker_config cfg;
  mbd_bcore_send_fn send;
  void *ctx;
  mbd_registry *reg;
  breq *buckets[TICKET_BUCKETS];
  breq *qhead, *qtail;
  size_t qlen;
  breq *all;
  size_t pending;                  /* queued + in flight (not zombies) */
  uint64_t next_ticket, next_gen;
  int64_t next_hb_ms;
  int64_t next_reap_ms;            /* next sweep for sessions of departed local clients */
  mbd_breclaim *reclaim;           /* sessions of local clients, by process */
  bool shutting;
  mbd_bcore_stats st;
};

/* ---- plumbing ------------------------------------------------------------ */

static int64_t expiry_ms(const mbd_bcore *c) { return (int64_t)c->cfg.heartbeat_ms * c->cfg.liveness; }

static void hash_put(mbd_bcore *c, breq *r) {
  size_t b = r->ticket % TICKET_BUCKETS;
  r->hashed = true;
  r->hnext = c->buckets[b];
  c->buckets[b] = r;
}

static breq *hash_get(mbd_bcore *c, uint64_t ticket) {
  for (breq *r = c->buckets[ticket % TICKET_BUCKETS]; r; r = r->hnext)
    if (r->ticket == ticket) return r;
  return NULL;
}

static void hash_del(mbd_bcore *c, breq *r) {
  if (!r->hashed) return;
  r->hashed = false;
  for (breq **p = &c->buckets[r->ticket % TICKET_BUCKETS]; *p; p = &(*p)->hnext) {
    if (*p == r) {
      *p = r->hnext;
      r->hnext = NULL;
      return;
    }
  }
}

static void q_push(mbd_bcore *c, breq *r, bool front) {
  r->state = RQ_WAITING;
  r->queued = true;
  r->qprev = r->qnext = NULL;
  if (!c->qhead) {
    c->qhead = c->qtail = r;
  } else if (front) {
    r->qnext = c->qhead;
    c->qhead->qprev = r;
    c->qhead = r;
  } else {
    r->qprev = c->qtail;
    c->qtail->qnext = r;
    c->qtail = r;
  }
  c->qlen++;
}

/* Links r (not queued) just before `at` (NULL = at the tail). */
static void q_insert_before(mbd_bcore *c, breq *r, breq *at) {
  if (!at) {
    q_push(c, r, false);
    return;
  }
  r->state = RQ_WAITING;
  r->queued = true;
  r->qnext = at;
  r->qprev = at->qprev;
  if (at->qprev) at->qprev->qnext = r;
  else c->qhead = r;
  at->qprev = r;
  c->qlen++;
}

static void q_del(mbd_bcore *c, breq *r) {
  if (!r->queued) return;
  r->queued = false;
  if (r->qprev) r->qprev->qnext = r->qnext;
  else c->qhead = r->qnext;
  if (r->qnext) r->qnext->qprev = r->qprev;
  else c->qtail = r->qprev;
  r->qprev = r->qnext = NULL;
  c->qlen--;
}

/* Unlinks r from every structure and frees it. */
static void req_free(mbd_bcore *c, breq *r) {
  q_del(c, r);
  hash_del(c, r);
  if (r->state != RQ_ZOMBIE) c->pending--;
  if (r->aprev) r->aprev->anext = r->anext;
  else c->all = r->anext;
  if (r->anext) r->anext->aprev = r->aprev;
  mbd_msg_destroy(&r->orig);
  free(r);
}

static void send_to(mbd_bcore *c, mbd_bdest d, mbd_msg **m) {
  mbd_error err = {0};
  int rc = c->send(c->ctx, d, m, &err);
  if (rc) MBD_LOGD(LOG, "send to %s failed: %s", d == MBD_BDEST_CLIENT ? "client" : "worker", err.msg);
}

/* ERROR reply to a client peer (no request record needed). */
static void client_error(mbd_bcore *c, const void *peer, size_t plen, uint64_t tag, int code,
                         const char *msg) {
  mbd_msg *e = NULL;
  if (mbd_msg_new_error(tag, code, msg, &e, NULL)) return;
  if (mbd_msg_set_peer(e, peer, plen, NULL)) {
    mbd_msg_destroy(&e);
    return;
  }
  c->st.errors++;
  switch (code) {
  case MBD_E_NO_ROUTE: c->st.no_route++; break;
  case MBD_E_BUSY: c->st.busy++; break;
  case MBD_E_TIMEOUT: c->st.timeouts++; break;
  case MBD_E_WORKER_LOST: c->st.worker_lost++; break;
  default: break;
  }
  send_to(c, MBD_BDEST_CLIENT, &e);
}

/* Answers r with an ERROR and frees it, or turns an in-flight request into a
 * zombie (answered; the worker's slot stays busy until it replies or dies). */
static void req_fail(mbd_bcore *c, breq *r, int code, const char *msg) {
  client_error(c, r->client, r->client_len, r->client_tag, code, msg);
  if (r->state == RQ_INFLIGHT && mbd_registry_find_gen(c->reg, r->worker_gen)) {
    r->state = RQ_ZOMBIE;
    c->pending--;
    mbd_msg_destroy(&r->orig);
    return;
  }
  req_free(c, r);
}

static void worker_ctl(mbd_bcore *c, const mbd_bworker *w, uint8_t cmd, const char *reason) {
  mbd_msg *m = NULL;
  if (mbd_msg_new(cmd, 0, &m, NULL)) return;
  if (reason) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    mbd_pack_kv_str(&pk, "reason", reason);
    mbd_msg_take_body(m, &sb, NULL);
    msgpack_sbuffer_destroy(&sb);
  }
  mbd_msg_set_peer(m, w->ident, w->ident_len, NULL);
  send_to(c, MBD_BDEST_WORKER, &m);
}

/* ---- dispatch -------------------------------------------------------------- */

/* Finds CUDA IPC refs in the request's "tensors"/"outputs" (only the routing
 * facts: the worker checks the refs themselves) and the client's host_id. */
static int scan_ipc(const msgpack_object *root, breq *r, mbd_error *err) {
  static const char *const keys[2] = {"tensors", "outputs"};
  for (int k = 0; k < 2; k++) {
    const msgpack_object *a = mbd_obj_get(root, keys[k]);
    if (!a || a->type != MSGPACK_OBJECT_ARRAY) continue;
    for (uint32_t i = 0; i < a->via.array.size; i++) {
      const msgpack_object *t = &a->via.array.ptr[i], *ipc;
      if (t->type != MSGPACK_OBJECT_MAP || !(ipc = mbd_obj_get(t, "ipc"))) continue;
      if (!r->has_ipc) {
        int64_t dev = -1;
        if (ipc->type == MSGPACK_OBJECT_MAP) mbd_obj_i64(ipc, "device", false, &dev, NULL);
        r->ipc_device = (int)(dev >= 0 && dev <= 1023 ? dev : -1);
      }
      r->has_ipc = true;
    }
  }
  if (!r->has_ipc) return MBD_OK;
  int rc = mbd_obj_str(root, "host_id", false, r->client_host, sizeof r->client_host, err);
  if (rc) return rc;
  if (!r->client_host[0])
    return mbd_error_set(err, MBD_E_INVALID,
                         "a request with CUDA IPC tensors must carry the client's 'host_id' "
                         "(only workers on that host can open the handles)");
  return MBD_OK;
}

/* Reads a client request's routing facts into r: route constraint, model,
 * deadline (*dl, 0 = none given), owning worker of a session, IPC use. */
static int req_read(const msgpack_object *root, uint8_t cmd, breq *r, uint64_t *dl,
                    mbd_error *err) {
  char session[2 * MBD_BW_UID_MAX] = "";
  int rc;
  if ((rc = mbd_obj_route_want(root, "route", &r->want, err)) ||
      (rc = mbd_obj_str(root, "model", false, r->model, sizeof r->model, err)) ||
      (rc = mbd_obj_u64(root, "deadline_ms", false, dl, err)) ||
      (mbd_cmd_is_session(cmd) &&
       (rc = mbd_obj_str(root, "session", true, session, sizeof session, err))))
    return rc;
  if (mbd_cmd_is_session(cmd)) {
    const char *slash = strchr(session, '/');
    size_t ul = slash ? (size_t)(slash - session) : 0;
    if (!slash || ul == 0 || ul >= sizeof r->session_uid)
      return mbd_error_set(err, MBD_E_INVALID,
                           "session id '%s' is not of the form <worker-uid>/<n>", session);
    memcpy(r->session_uid, session, ul);
    r->session_uid[ul] = '\0';
    snprintf(r->session_id, sizeof r->session_id, "%s", session);
    r->is_session = true;
  }
  return scan_ipc(root, r, err);
}

/* Remembers sessions that local clients open and forgets those they close. */
static void track_session(mbd_bcore *c, const breq *r, const mbd_bworker *w, const mbd_msg *m) {
  if (r->cmd == MBD_CMD_CLOSE) {
    mbd_breclaim_closed(c->reclaim, r->session_id);
    return;
  }
  if ((r->cmd != MBD_CMD_OPEN && r->cmd != MBD_CMD_IMPORT) || r->caller_pid <= 0) return;
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  mbd_body *body = NULL;
  char sid[2 * MBD_BW_UID_MAX] = "";
  if (!mbd_body_parse(b, blen, &body, NULL) &&
      !mbd_obj_str(mbd_body_root(body), "session", true, sid, sizeof sid, NULL))
    mbd_breclaim_opened(c->reclaim, sid, w->uid, r->caller, r->caller_pid);
  mbd_body_destroy(&body);
}

static bool is_stateless(uint8_t cmd) { return cmd == MBD_CMD_GEMM || cmd == MBD_CMD_FORWARD; }

/* Sends r to w under a fresh ticket. r is not in the queue. */
static void send_req(mbd_bcore *c, breq *r, mbd_bworker *w) {
  mbd_msg *m = NULL;
  mbd_error err = {0};
  if (is_stateless(r->cmd) && !r->retried) {
    if (mbd_msg_clone(r->orig, &m, &err)) {
      req_fail(c, r, MBD_E_NOMEM, "broker out of memory forwarding the request");
      return;
    }
  } else {
    m = r->orig; /* last possible send: hand the frames over */
    r->orig = NULL;
  }
  r->ticket = ++c->next_ticket;
  r->worker_gen = w->gen;
  snprintf(r->worker_name, sizeof r->worker_name, "%s", w->name);
  r->state = RQ_INFLIGHT;
  hash_put(c, r);
  w->inflight++;
  mbd_msg_set_tag(m, r->ticket);
  mbd_msg_set_peer(m, w->ident, w->ident_len, NULL);
  c->st.forwarded++;
  int rc = c->send(c->ctx, MBD_BDEST_WORKER, &m, &err);
  if (rc == MBD_E_NOT_FOUND) {
    /* Gone without a goodbye: the next tick drops it and fails its requests over. */
    MBD_LOGW(LOG, "worker %s unreachable: dropping it at the next tick", w->name);
    w->dead = true;
  } else if (rc) {
    w->inflight--;
    hash_del(c, r);
    r->state = RQ_WAITING; /* not on a worker: req_fail frees it */
    char msg[MBD_ERROR_MSG_MAX + 64];
    snprintf(msg, sizeof msg, "worker %s cannot take the request: %.400s", w->name, err.msg);
    req_fail(c, r, MBD_E_BUSY, msg);
  }
}

static void no_route(mbd_bcore *c, breq *r) {
  char msg[1024];
  mbd_registry_no_route_message(c->reg, &r->want, r->model, msg, sizeof msg);
  req_fail(c, r, MBD_E_NO_ROUTE, msg);
}

static void session_lost(mbd_bcore *c, breq *r) {
  char msg[512];
  snprintf(msg, sizeof msg,
           "the worker holding session %s/... (uid %s) is gone; sessions live on one worker: "
           "EXPORT a session's state while its worker lives and IMPORT it on another worker with "
           "the same route to move it",
           r->session_uid, r->session_uid);
  req_fail(c, r, MBD_E_WORKER_LOST, msg);
}

/* The worker for a stateless request: GPU-affine on the client's host when
 * it carries CUDA IPC tensors. */
static mbd_bworker *select_for(mbd_bcore *c, breq *r, size_t *nmatch) {
  if (r->has_ipc)
    return mbd_registry_select_ipc(c->reg, &r->want, r->model, r->client_host, r->ipc_device, NULL,
                                   nmatch);
  return mbd_registry_select(c->reg, &r->want, r->model, NULL, nmatch);
}

/* Tries to place r (not queued). Returns true when it left r's fate decided
 * (sent or answered), false when it should wait for capacity. */
static bool place(mbd_bcore *c, breq *r) {
  if (r->is_session) {
    mbd_bworker *w = mbd_registry_find_uid(c->reg, r->session_uid);
    if (!w || w->dead) { /* an id no live worker issued: as unknown as a closed one */
      req_fail(c, r, MBD_E_NOT_FOUND,
               "session is not open: no live worker holds it (closed, expired, or its worker "
               "stopped; EXPORT a session while its worker lives to move it)");
      return true;
    }
    if (r->has_ipc && (w->device < 0 || strcmp(w->host_id, r->client_host))) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "session %s/... lives on worker %s (host %s) which cannot open CUDA IPC memory of "
               "host %s: send the tensor inline or in shm",
               r->session_uid, w->name, w->host_id, r->client_host);
      req_fail(c, r, MBD_E_INVALID, msg);
      return true;
    }
    if (w->inflight >= w->capacity) return false;
    send_req(c, r, w);
    return true;
  }
  size_t nmatch = 0;
  mbd_bworker *w = select_for(c, r, &nmatch);
  if (w) {
    send_req(c, r, w);
    return true;
  }
  if (!nmatch) {
    if (r->retried) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "worker %s was lost while running this %s and no other live worker matches its "
               "route to retry it",
               r->worker_name, mbd_cmd_name(r->cmd));
      req_fail(c, r, MBD_E_WORKER_LOST, msg);
    } else if (r->has_ipc) {
      char msg[1024];
      snprintf(msg, sizeof msg,
               "no GPU worker on host %s matches this request carrying CUDA IPC tensors (they "
               "can only be opened on the same host); send the tensors inline or in shm",
               r->client_host);
      req_fail(c, r, MBD_E_NO_ROUTE, msg);
    } else {
      no_route(c, r);
    }
    return true;
  }
  return false;
}

static bool any_capacity(mbd_bcore *c) {
  for (size_t i = 0; i < mbd_registry_count(c->reg); i++) {
    const mbd_bworker *w = mbd_registry_at(c->reg, i);
    if (!w->dead && w->inflight < w->capacity) return true;
  }
  return false;
}

/* Moves queued requests to workers with spare capacity, oldest first. */
static void drain_queue(mbd_bcore *c) {
  breq *r = c->qhead;
  while (r && any_capacity(c)) {
    breq *next = r->qnext;
    q_del(c, r);
    /* place() sends r, answers it (freed), or leaves it waiting: re-queue in
     * place to keep FIFO order. It touches no other request. */
    if (!place(c, r)) q_insert_before(c, r, next);
    r = next;
  }
}

/* ---- client side ---------------------------------------------------------------- */

/* STATUS detail (worker uids, route encodings, hosts, pids) goes to operator
 * keys and to local callers running as the service's uid or root; everyone
 * else sees what routing needs. The caller is the reactor's stamp. */
static bool status_privileged(const mbd_msg *req) {
  size_t blen = 0;
  const void *b = mbd_msg_body(req, &blen);
  mbd_body *body = NULL;
  if (mbd_body_parse(b, blen, &body, NULL)) return false;
  mbd_bcaller who;
  mbd_bcaller_read(mbd_body_root(body), &who);
  mbd_body_destroy(&body);
  if (!strncmp(who.id, "op:", 3)) return true;
  return who.has_uid && (who.uid == (uint32_t)geteuid() || who.uid == 0);
}

static void status_reply(mbd_bcore *c, mbd_msg **req, int64_t now) {
  bool full = status_privileged(*req);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  size_t n = mbd_registry_count(c->reg);
  msgpack_pack_map(&pk, 5);
  mbd_pack_str(&pk, "workers");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    const mbd_bworker *w = mbd_registry_at(c->reg, i);
    msgpack_pack_map(&pk, full ? 12 : 8);
    mbd_pack_kv_str(&pk, "name", w->name);
    if (full) mbd_pack_kv_str(&pk, "uid", w->uid);
    mbd_pack_kv_str(&pk, "route_id", w->route_id);
    if (full) mbd_pack_kv_str(&pk, "route", w->route_enc);
    mbd_pack_kv_str(&pk, "backend", mbd_backend_name(w->route.backend));
    if (full) mbd_pack_kv_str(&pk, "host_id", w->host_id);
    mbd_pack_kv_i64(&pk, "capacity", w->capacity);
    mbd_pack_kv_i64(&pk, "inflight", w->inflight);
    mbd_pack_kv_i64(&pk, "heartbeat_age_ms", now - w->last_seen_ms);
    if (full) mbd_pack_kv_i64(&pk, "pid", w->pid);
    mbd_pack_kv_i64(&pk, "uptime_ms", now - w->registered_ms);
    mbd_pack_str(&pk, "models");
    msgpack_pack_array(&pk, (size_t)w->nmodels);
    for (int k = 0; k < w->nmodels; k++) {
      msgpack_pack_map(&pk, 2);
      mbd_pack_kv_str(&pk, "name", w->models[k].name);
      mbd_pack_kv_str(&pk, "digest", w->models[k].digest);
    }
  }
  mbd_pack_kv_u64(&pk, "queue", c->qlen);
  mbd_pack_kv_u64(&pk, "pending", c->pending);
  mbd_pack_str(&pk, "counters");
  const mbd_bcore_stats *s = &c->st;
  msgpack_pack_map(&pk, 13);
  mbd_pack_kv_u64(&pk, "requests", s->requests);
  mbd_pack_kv_u64(&pk, "forwarded", s->forwarded);
  mbd_pack_kv_u64(&pk, "replies", s->replies);
  mbd_pack_kv_u64(&pk, "errors", s->errors);
  mbd_pack_kv_u64(&pk, "no_route", s->no_route);
  mbd_pack_kv_u64(&pk, "busy", s->busy);
  mbd_pack_kv_u64(&pk, "timeouts", s->timeouts);
  mbd_pack_kv_u64(&pk, "worker_lost", s->worker_lost);
  mbd_pack_kv_u64(&pk, "failovers", s->failovers);
  mbd_pack_kv_u64(&pk, "late_dropped", s->late_dropped);
  mbd_pack_kv_u64(&pk, "malformed", s->malformed);
  mbd_pack_kv_u64(&pk, "workers_joined", s->workers_joined);
  mbd_pack_kv_u64(&pk, "workers_lost", s->workers_lost);
  mbd_pack_str(&pk, "config");
  msgpack_pack_map(&pk, 5);
  mbd_pack_kv_i64(&pk, "client_inflight", c->cfg.client_inflight);
  mbd_pack_kv_i64(&pk, "heartbeat_ms", c->cfg.heartbeat_ms);
  mbd_pack_kv_i64(&pk, "liveness", c->cfg.liveness);
  mbd_pack_kv_i64(&pk, "queue_limit", c->cfg.queue_limit);
  mbd_pack_kv_i64(&pk, "default_deadline_ms", c->cfg.default_deadline_ms);
  /* A fresh FINAL to the request's peer and tag, so no payload a client
   * attached to its STATUS is ever echoed back. */
  mbd_msg *m = NULL;
  size_t pl = 0;
  const void *peer = mbd_msg_peer(*req, &pl);
  if (mbd_msg_new(MBD_CMD_FINAL, mbd_msg_tag(*req), &m, NULL) ||
      mbd_msg_set_peer(m, peer, pl, NULL) || mbd_msg_take_body(m, &sb, NULL))
    mbd_msg_destroy(&m);
  msgpack_sbuffer_destroy(&sb);
  mbd_msg_destroy(req);
  if (m) send_to(c, MBD_BDEST_CLIENT, &m);
}

/* True when the caller (by id, or by routing id when anonymous) already has
 * client_inflight unanswered requests. */
static bool caller_busy(const mbd_bcore *c, const char *id, const uint8_t *peer, size_t plen) {
  if (c->cfg.client_inflight <= 0) return false;
  int n = 0;
  for (const breq *r = c->all; r; r = r->anext) {
    if (r->state == RQ_ZOMBIE) continue;
    bool same = id[0] ? !strcmp(r->caller, id)
                      : !r->caller[0] && r->client_len == plen && !memcmp(r->client, peer, plen);
    if (same && ++n >= c->cfg.client_inflight) return true;
  }
  return false;
}

void mbd_bcore_on_client(mbd_bcore *c, mbd_msg **pm, int recv_rc, const mbd_error *recv_err,
                         int64_t now) {
  mbd_msg *m = *pm;
  *pm = NULL;
  if (!m) return;
  size_t plen = 0;
  const void *peer = mbd_msg_peer(m, &plen);
  uint8_t pcopy[MBD_BW_IDENT_MAX];
  if (plen > sizeof pcopy) plen = sizeof pcopy;
  if (plen) memcpy(pcopy, peer, plen);
  uint64_t tag = mbd_msg_tag(m);
  uint8_t cmd = mbd_msg_cmd(m);
  char msg[MBD_ERROR_MSG_MAX + 128];
  mbd_body *body = NULL;
  breq *r = NULL;
  if (recv_rc) {
    c->st.malformed++;
    snprintf(msg, sizeof msg, "malformed request: %s", recv_err ? recv_err->msg : "");
    client_error(c, pcopy, plen, tag, recv_rc, msg);
    goto done;
  }
  if (!mbd_cmd_is_request(cmd)) {
    c->st.malformed++;
    snprintf(msg, sizeof msg, "command %s (0x%02x) is not a client request", mbd_cmd_name(cmd), cmd);
    client_error(c, pcopy, plen, tag, MBD_E_PROTOCOL, msg);
    goto done;
  }
  if (tag == 0) {
    client_error(c, pcopy, plen, tag, MBD_E_INVALID, "request id (tag) must not be 0");
    goto done;
  }
  if (c->shutting) {
    client_error(c, pcopy, plen, tag, MBD_E_BUSY, "broker is shutting down; retry later");
    goto done;
  }
  c->st.requests++;
  if (cmd == MBD_CMD_STATUS) {
    status_reply(c, &m, now);
    goto done;
  }
  mbd_error err = {0};
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  int rc = mbd_body_parse(b, blen, &body, &err);
  if (rc) {
    client_error(c, pcopy, plen, tag, rc, err.msg);
    goto done;
  }
  r = calloc(1, sizeof *r);
  if (!r) {
    client_error(c, pcopy, plen, tag, MBD_E_NOMEM, "broker out of memory");
    goto done;
  }
  uint64_t dl = 0;
  if ((rc = req_read(mbd_body_root(body), cmd, r, &dl, &err))) {
    client_error(c, pcopy, plen, tag, rc, err.msg);
    goto done;
  }
  mbd_bcaller who;
  mbd_bcaller_read(mbd_body_root(body), &who);
  if (caller_busy(c, who.id, pcopy, plen)) {
    snprintf(msg, sizeof msg,
             "this client already has %d requests in flight (the per-client limit, "
             "--client-inflight); wait for replies before sending more",
             c->cfg.client_inflight);
    c->st.busy++;
    client_error(c, pcopy, plen, tag, MBD_E_BUSY, msg);
    goto done;
  }
  snprintf(r->caller, sizeof r->caller, "%s", who.id);
  r->caller_pid = who.has_uid ? who.pid : 0;
  if (dl == 0) dl = (uint64_t)c->cfg.default_deadline_ms;
  if (dl > DEADLINE_MAX_MS) dl = DEADLINE_MAX_MS;
  r->client_tag = tag;
  memcpy(r->client, pcopy, plen);
  r->client_len = plen;
  r->cmd = cmd;
  r->start_ms = now;
  r->deadline_ms = now + (int64_t)dl;
  r->orig = m;
  m = NULL;
  r->state = RQ_WAITING;
  r->anext = c->all;
  if (c->all) c->all->aprev = r;
  c->all = r;
  c->pending++;
  breq *nr = r;
  r = NULL;
  if (!place(c, nr)) {
    if ((int)c->qlen >= c->cfg.queue_limit) {
      snprintf(msg, sizeof msg,
               "every worker matching route/model is at capacity and the broker queue is full "
               "(%d waiting); retry later or add workers",
               c->cfg.queue_limit);
      req_fail(c, nr, MBD_E_BUSY, msg);
    } else {
      q_push(c, nr, false);
    }
  }
done:
  free(r);
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
}

/* ---- worker side ----------------------------------------------------------------- */

/* Fails over or fails every request on worker generation `gen` (removed already). */
static void fail_over(mbd_bcore *c, uint64_t gen, const char *wname, const char *why) {
  /* Detach first: placing one request may touch the lists. */
  breq *lost = NULL;
  for (breq *r = c->all; r; r = r->anext) {
    if (r->state == RQ_WAITING || r->worker_gen != gen) continue;
    hash_del(c, r);
    r->qnext = lost; /* reuse the queue link for the detached list */
    lost = r;
  }
  while (lost) {
    breq *r = lost;
    lost = r->qnext;
    r->qnext = NULL;
    if (r->state == RQ_ZOMBIE) {
      req_free(c, r); /* already answered */
      continue;
    }
    r->worker_gen = 0;
    r->state = RQ_WAITING;
    if (is_stateless(r->cmd) && !r->retried && r->orig) {
      r->retried = true;
      c->st.failovers++;
      MBD_LOGI(LOG, "re-sending %s (client tag %" PRIu64 ") lost on worker %s", mbd_cmd_name(r->cmd),
               r->client_tag, wname);
      if (!place(c, r)) q_push(c, r, true); /* matching workers exist but are full: go first */
      continue;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "worker %s was lost (%s) while running this %s%s", wname, why,
             mbd_cmd_name(r->cmd),
             r->retried ? " after it had already been re-sent once"
             : is_stateless(r->cmd) ? ""
             : "; session state on that worker is gone (EXPORT/IMPORT moves a session to another worker)");
    req_fail(c, r, MBD_E_WORKER_LOST, msg);
  }
}

static void worker_lost(mbd_bcore *c, mbd_bworker *w, const char *why) {
  uint64_t gen = w->gen;
  char name[MBD_BW_NAME_MAX];
  snprintf(name, sizeof name, "%s", w->name);
  MBD_LOGW(LOG, "worker %s (uid %s, route %.8s) dropped: %s", w->name, w->uid, w->route_id, why);
  c->st.workers_lost++;
  mbd_registry_remove(c->reg, w->ident, w->ident_len);
  fail_over(c, gen, name, why);
  drain_queue(c); /* queued requests that no longer match anything get NO_ROUTE */
  /* Queued requests for routes nobody serves any more: answer now, not at the deadline. */
  for (breq *r = c->qhead; r;) {
    breq *next = r->qnext;
    size_t nmatch = 0;
    bool gone = r->is_session ? !mbd_registry_find_uid(c->reg, r->session_uid)
                              : (select_for(c, r, &nmatch),
                                 nmatch == 0);
    if (gone) {
      if (r->is_session) session_lost(c, r);
      else no_route(c, r);
    }
    r = next;
  }
}

static void on_ready(mbd_bcore *c, mbd_msg *m, int64_t now) {
  mbd_bworker w;
  memset(&w, 0, sizeof w);
  mbd_error err = {0};
  mbd_body *body = NULL;
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  size_t plen = 0;
  const void *peer = mbd_msg_peer(m, &plen);
  int rc = mbd_body_parse(b, blen, &body, &err);
  if (!rc) rc = mbd_registry_parse_ready(mbd_body_root(body), &w, &err);
  if (!rc) { /* a uid stays with the peer that registered it first */
    mbd_bcaller who;
    mbd_bcaller_read(mbd_body_root(body), &who);
    snprintf(w.peer_id, sizeof w.peer_id, "%s", who.id);
    const mbd_bworker *same = mbd_registry_find_uid(c->reg, w.uid);
    if (same && strcmp(same->peer_id, w.peer_id))
      rc = mbd_error_set(&err, MBD_E_INVALID,
                         "worker uid %s is registered by another peer (%s); a worker may "
                         "re-register only under its own key or uid",
                         w.uid, same->peer_id[0] ? same->peer_id : "anonymous");
  }
  mbd_body_destroy(&body);
  if (rc) {
    MBD_LOGW(LOG, "rejected worker registration: %s", err.msg);
    c->st.malformed++;
    mbd_msg *e = NULL;
    if (!mbd_msg_new_error(0, rc, err.msg, &e, NULL) && !mbd_msg_set_peer(e, peer, plen, NULL))
      send_to(c, MBD_BDEST_WORKER, &e);
    mbd_msg_destroy(&e);
    return;
  }
  if (plen > sizeof w.ident) plen = sizeof w.ident;
  memcpy(w.ident, peer, plen);
  w.ident_len = plen;
  w.last_seen_ms = w.registered_ms = now;
  w.gen = ++c->next_gen;
  mbd_bworker old;
  bool replaced = false;
  rc = mbd_registry_add(c->reg, &w, &old, &replaced, &err);
  if (rc) {
    MBD_LOGE(LOG, "cannot register worker %s: %s", w.name, err.msg);
    return;
  }
  c->st.workers_joined++;
  MBD_LOGI(LOG, "worker %s registered: uid %s route %.8s (%s/%s/%s) capacity %d, %d model(s)%s",
           w.name, w.uid, w.route_id, mbd_backend_name(w.route.backend),
           mbd_dtype_policy_name(w.route.policy), mbd_gemm_mode_name(w.route.mode), w.capacity,
           w.nmodels, replaced ? " (re-registered)" : "");
  if (replaced) {
    c->st.workers_lost++;
    fail_over(c, old.gen, old.name, "it re-registered");
  }
  drain_queue(c);
}

void mbd_bcore_on_worker(mbd_bcore *c, mbd_msg **pm, int recv_rc, const mbd_error *recv_err,
                         int64_t now) {
  mbd_msg *m = *pm;
  *pm = NULL;
  if (!m) return;
  size_t plen = 0;
  const void *peer = mbd_msg_peer(m, &plen);
  if (recv_rc) {
    c->st.malformed++;
    MBD_LOGW(LOG, "dropped a malformed message from a worker: %s", recv_err ? recv_err->msg : "");
    goto done;
  }
  uint8_t cmd = mbd_msg_cmd(m);
  if (cmd == MBD_CMD_READY) {
    on_ready(c, m, now);
    goto done;
  }
  mbd_bworker *w = mbd_registry_find_ident(c->reg, peer, plen);
  if (!w) {
    if (cmd != MBD_CMD_DISCONNECT) {
      mbd_bworker tmp;
      memset(&tmp, 0, sizeof tmp);
      memcpy(tmp.ident, peer, plen);
      tmp.ident_len = plen;
      worker_ctl(c, &tmp, MBD_CMD_DISCONNECT, "unknown worker: send READY to register");
      if (cmd == MBD_CMD_FINAL || cmd == MBD_CMD_ERROR || cmd == MBD_CMD_PARTIAL) c->st.late_dropped++;
    }
    goto done;
  }
  w->last_seen_ms = now;
  switch (cmd) {
  case MBD_CMD_HEARTBEAT: break;
  case MBD_CMD_DISCONNECT: {
    char reason[160] = "";
    mbd_body *body = NULL;
    size_t blen;
    const void *b = mbd_msg_body(m, &blen);
    if (!mbd_body_parse(b, blen, &body, NULL))
      mbd_obj_str(mbd_body_root(body), "reason", false, reason, sizeof reason, NULL);
    mbd_body_destroy(&body);
    char why[200];
    snprintf(why, sizeof why, "it disconnected (%s)", reason[0] ? reason : "no reason given");
    worker_lost(c, w, why);
    break;
  }
  case MBD_CMD_PARTIAL:
  case MBD_CMD_FINAL:
  case MBD_CMD_ERROR: {
    breq *r = hash_get(c, mbd_msg_tag(m));
    if (!r || r->worker_gen != w->gen) {
      c->st.late_dropped++;
      MBD_LOGD(LOG, "dropped a %s for ticket %" PRIu64 " that is no longer live", mbd_cmd_name(cmd),
               mbd_msg_tag(m));
      break;
    }
    bool last = cmd != MBD_CMD_PARTIAL;
    mbd_error verr = {0};
    if (r->state == RQ_INFLIGHT && cmd != MBD_CMD_ERROR &&
        mbd_bcaller_vouch_reply(m, w->name, w->route_id, &verr)) {
      /* Replies name the worker as registered; one that cannot be rewritten is not sent. */
      c->st.malformed++;
      MBD_LOGW(LOG, "cannot vouch for a %s of worker %s (%s)", mbd_cmd_name(cmd), w->name, verr.msg);
      req_fail(c, r, MBD_E_INTERNAL, "the broker could not relay the worker's reply");
    }
    if (r->state == RQ_INFLIGHT && cmd == MBD_CMD_FINAL) track_session(c, r, w, m);
    if (r->state == RQ_INFLIGHT) {
      mbd_msg_set_tag(m, r->client_tag);
      mbd_msg_set_peer(m, r->client, r->client_len, NULL);
      c->st.replies++;
      send_to(c, MBD_BDEST_CLIENT, &m);
    } else {
      c->st.late_dropped++;
    }
    if (last) {
      if (w->inflight > 0) w->inflight--;
      req_free(c, r);
      drain_queue(c);
    }
    break;
  }
  default:
    c->st.malformed++;
    MBD_LOGW(LOG, "worker %s sent %s, which workers may not send; dropped", w->name, mbd_cmd_name(cmd));
    break;
  }
done:
  mbd_msg_destroy(&m);
}

/* ---- timers ------------------------------------------------------------------------ */

static bool pid_alive(int64_t pid) {
  return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/* CLOSE {session, caller} to the session's worker on behalf of its departed
 * owner; the answer comes back under ticket 0 and is dropped. */
static void reclaim_close(void *ctx, const char *id, const char *worker_uid, const char *caller) {
  mbd_bcore *c = ctx;
  mbd_bworker *w = mbd_registry_find_uid(c->reg, worker_uid);
  if (!w || w->dead) return;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "session", id);
  mbd_pack_str(&pk, "caller");
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "id", caller);
  mbd_msg *m = NULL;
  if (mbd_msg_new(MBD_CMD_CLOSE, 0, &m, NULL) || mbd_msg_set_peer(m, w->ident, w->ident_len, NULL) ||
      mbd_msg_take_body(m, &sb, NULL)) {
    mbd_msg_destroy(&m);
    msgpack_sbuffer_destroy(&sb);
    return;
  }
  msgpack_sbuffer_destroy(&sb);
  MBD_LOGI(LOG, "closing session %s on %s: its client (%s) has exited", id, w->name, caller);
  send_to(c, MBD_BDEST_WORKER, &m);
}

void mbd_bcore_tick(mbd_bcore *c, int64_t now) {
  if (now >= c->next_reap_ms) {
    mbd_breclaim_sweep(c->reclaim, pid_alive, reclaim_close, c);
    c->next_reap_ms = now + 1000;
  }
  if (now >= c->next_hb_ms) {
    for (size_t i = 0; i < mbd_registry_count(c->reg); i++)
      worker_ctl(c, mbd_registry_at(c->reg, i), MBD_CMD_HEARTBEAT, NULL);
    c->next_hb_ms = now + c->cfg.heartbeat_ms;
  }
  for (size_t i = 0; i < mbd_registry_count(c->reg);) {
    mbd_bworker *w = mbd_registry_at(c->reg, i);
    if (w->dead) {
      worker_lost(c, w, "it could not be reached");
      i = 0; /* the array changed */
    } else if (now - w->last_seen_ms > expiry_ms(c)) {
      char why[128];
      snprintf(why, sizeof why, "silent for %" PRId64 " ms (heartbeat %d ms x liveness %d)",
               now - w->last_seen_ms, c->cfg.heartbeat_ms, c->cfg.liveness);
      worker_lost(c, w, why);
      i = 0;
    } else {
      i++;
    }
  }
  for (breq *r = c->all; r;) {
    breq *next = r->anext;
    if (r->state != RQ_ZOMBIE && now >= r->deadline_ms) {
      char msg[256];
      if (r->state == RQ_WAITING)
        snprintf(msg, sizeof msg,
                 "deadline of %" PRId64 " ms passed while queued: every matching worker stayed at "
                 "capacity",
                 r->deadline_ms - r->start_ms);
      else
        snprintf(msg, sizeof msg, "deadline of %" PRId64 " ms passed while worker %s was running the %s",
                 r->deadline_ms - r->start_ms, r->worker_name, mbd_cmd_name(r->cmd));
      req_fail(c, r, MBD_E_TIMEOUT, msg); /* frees or zombifies r only */
    }
    r = next;
  }
}

int64_t mbd_bcore_next_due(const mbd_bcore *c, int64_t now) {
  int64_t due = c->next_hb_ms;
  for (const breq *r = c->all; r; r = r->anext)
    if (r->state != RQ_ZOMBIE && r->deadline_ms < due) due = r->deadline_ms;
  for (size_t i = 0; i < mbd_registry_count(c->reg); i++) {
    const mbd_bworker *w = mbd_registry_at(c->reg, i);
    int64_t e = w->last_seen_ms + expiry_ms(c) + 1;
    if (e < due) due = e;
  }
  return due > now ? due - now : 0;
}

/* ---- lifecycle ----------------------------------------------------------------- */

void mbd_bcore_shutdown(mbd_bcore *c, int64_t now) {
  (void)now;
  c->shutting = true;
  while (c->qhead) req_fail(c, c->qhead, MBD_E_BUSY, "broker is shutting down; request not started");
}

void mbd_bcore_abort(mbd_bcore *c, int64_t now) {
  mbd_bcore_shutdown(c, now); /* queued requests first, as in an orderly shutdown */
  for (breq *r = c->all; r;) {
    breq *next = r->anext;
    if (r->state == RQ_INFLIGHT)
      client_error(c, r->client, r->client_len, r->client_tag, MBD_E_WORKER_LOST,
                   "broker shut down before the worker answered");
    r = next;
  }
  while (c->all) req_free(c, c->all);
  for (size_t i = 0; i < mbd_registry_count(c->reg); i++)
    worker_ctl(c, mbd_registry_at(c->reg, i), MBD_CMD_DISCONNECT, "broker shutting down");
}

int mbd_bcore_new(const mbd_broker_config *cfg, mbd_bcore_send_fn send, void *ctx,
                  mbd_bcore **out, mbd_error *err) {
  *out = NULL;
  mbd_bcore *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory creating the broker");
  c->cfg = *cfg;
  c->send = send;
  c->ctx = ctx;
  int rc = mbd_registry_new(&c->reg, err);
  if (rc) {
    free(c);
    return rc;
  }
  if (!(c->reclaim = mbd_breclaim_new())) {
    mbd_registry_destroy(&c->reg);
    free(c);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory creating the broker");
  }
  *out = c;
  return MBD_OK;
}

void mbd_bcore_destroy(mbd_bcore **pc) {
  if (!pc || !*pc) return;
  mbd_bcore *c = *pc;
  while (c->all) {
    breq *r = c->all;
    c->all = r->anext;
    mbd_msg_destroy(&r->orig);
    free(r);
  }
  mbd_registry_destroy(&c->reg);
  mbd_breclaim_destroy(&c->reclaim);
  free(c);
  *pc = NULL;
}

size_t mbd_bcore_queue_len(const mbd_bcore *c) { return c->qlen; }
size_t mbd_bcore_pending(const mbd_bcore *c) { return c->pending; }
const mbd_bcore_stats *mbd_bcore_get_stats(const mbd_bcore *c) { return &c->st; }
mbd_registry *mbd_bcore_registry(mbd_bcore *c) { return c->reg; }
