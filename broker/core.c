/* Broker core: requests from accept to final reply. See core.h.
 *
 * A request lives in one list of all requests (deadline scan) and, while it
 * waits for capacity, in the FIFO queue; once sent it is found by its ticket
 * in a chained hash. Every send to a worker uses a fresh ticket, so a reply
 * to an older send (a worker that was presumed dead, a request already
 * answered by a timeout) finds nothing and is dropped: a client never gets
 * two final replies. Stateless requests keep their original frames (a
 * reference-counted clone is what goes out) for one failover re-send; so do
 * commands of durable sessions (broker/durable.h), which wait for their
 * session's restore (a request of the broker's own, `internal`: see
 * broker/rehome.h) and follow it to its new worker. The request record and
 * the core's state are in broker/core_impl.h. */
#include "broker/core.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/defaults.h"
#include "broker/caller.h"
#include "broker/core_impl.h"
#include "broker/reclaim.h"
#include "broker/rehome.h"
#include "broker/status.h"
#include "common/log.h"
#include "common/protocol.h"

#define LOG "broker"
#define DEADLINE_MAX_MS MBD_DEADLINE_MS_MAX
#define HEADER_MAX_BYTES (256u << 10) /* routing fields of one request, decoded */
#define MAX_SENDS 3      /* sends of one stateless request (the first + re-sends) */
static const int64_t probe_after_ms[PROBE_ROUNDS] = {0, 10, 50, 200, 1000};

/* ---- plumbing ------------------------------------------------------------ */

#define WARN_EVERY_MS 1000


/* Logs a warning about input from workers at most once a second, saying how
 * many were left out since, so a flood of bad frames cannot flood the log. */
static void warn_limited(mbd_bcore *c, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void warn_limited(mbd_bcore *c, int64_t now, const char *fmt, ...) {
  if (c->warn_at_ms && now - c->warn_at_ms < WARN_EVERY_MS) {
    c->warn_suppressed++;
    return;
  }
  char line[MBD_ERROR_MSG_MAX + 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (c->warn_suppressed)
    MBD_LOGW(LOG, "%s (%" PRIu64 " similar warnings in the last %" PRId64 " ms not shown)", line,
             c->warn_suppressed, now - c->warn_at_ms);
  else MBD_LOGW(LOG, "%s", line);
  c->warn_at_ms = now;
  c->warn_suppressed = 0;
}

/* Records a worker's start failure (DISCONNECT {name, error, models} from a
 * peer that never registered), replacing an older one of the same name. */
static void note_start_failure(mbd_bcore *c, const msgpack_object *root, int64_t now) {
  char name[MBD_BW_NAME_MAX] = "", error[256] = "";
  if (mbd_obj_str(root, "name", true, name, sizeof name, NULL) ||
      mbd_obj_str(root, "error", true, error, sizeof error, NULL) || !name[0])
    return;
  size_t i = 0;
  while (i < c->nfailed && strcmp(c->failed[i].name, name)) i++;
  if (i == c->nfailed) {
    if (c->nfailed == FAILED_MAX) i = 0; /* full: the oldest slot goes */
    else c->nfailed++;
  }
  mbd_bstart_failure *f = &c->failed[i];
  snprintf(f->name, sizeof f->name, "%s", name);
  snprintf(f->error, sizeof f->error, "%s", error);
  f->models[0] = '\0';
  const msgpack_object *ms = mbd_obj_get(root, "models");
  size_t n = 0;
  for (uint32_t k = 0; ms && ms->type == MSGPACK_OBJECT_ARRAY && k < ms->via.array.size; k++) {
    const msgpack_object *o = &ms->via.array.ptr[k];
    if (o->type != MSGPACK_OBJECT_STR || n >= sizeof f->models) continue;
    int x = snprintf(f->models + n, sizeof f->models - n, "%s%.*s", n ? "," : "",
                     (int)(o->via.str.size < 64 ? o->via.str.size : 64), o->via.str.ptr);
    if (x > 0) n += (size_t)x;
  }
  f->at_ms = now;
  warn_limited(c, now, "worker %s could not start (models %s): %s", f->name,
               f->models[0] ? f->models : "-", f->error);
}

/* A worker of that name registered: its earlier start failure is history. */
static void clear_start_failure(mbd_bcore *c, const char *name) {
  for (size_t i = 0; i < c->nfailed; i++)
    if (!strcmp(c->failed[i].name, name)) {
      c->failed[i] = c->failed[--c->nfailed];
      return;
    }
}

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

void mbd_bcore_q_push(mbd_bcore *c, breq *r, bool front) {
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
  c->qbytes += r->bytes;
}

void mbd_bcore_q_insert_before(mbd_bcore *c, breq *r, breq *at) {
  if (!at) {
    mbd_bcore_q_push(c, r, false);
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
  c->qbytes += r->bytes;
}

void mbd_bcore_q_del(mbd_bcore *c, breq *r) {
  if (!r->queued) return;
  r->queued = false;
  if (r->qprev) r->qprev->qnext = r->qnext;
  else c->qhead = r->qnext;
  if (r->qnext) r->qnext->qprev = r->qprev;
  else c->qtail = r->qprev;
  r->qprev = r->qnext = NULL;
  c->qlen--;
  c->qbytes -= r->bytes;
}

/* Unlinks r from every structure and frees it. */
static void req_free(mbd_bcore *c, breq *r) {
  mbd_bcore_q_del(c, r);
  hash_del(c, r);
  if (r->state != RQ_ZOMBIE) c->pending--;
  if (r->aprev) r->aprev->anext = r->anext;
  else c->all = r->anext;
  if (r->anext) r->anext->aprev = r->aprev;
  mbd_msg_destroy(&r->orig);
  free(r->pfx);
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

void mbd_bcore_req_fail(mbd_bcore *c, breq *r, int code, const char *msg) {
  MBD_LOGD(LOG, "request %s: %s answered by the broker: %s %s", r->rid[0] ? r->rid : "-",
           mbd_cmd_name(r->cmd), mbd_status_name(code), msg);
  if (r->internal) { /* a restore: its session is lost, its waiting requests hear why */
    mbd_bdurable_failed(c->durable, r->session_id, msg, c->now_ms);
    c->wake = true;
  } else {
    client_error(c, r->client, r->client_len, r->client_tag, code, msg);
  }
  if (r->state == RQ_INFLIGHT && mbd_registry_find_gen(c->reg, r->worker_gen)) {
    r->state = RQ_ZOMBIE;
    c->pending--;
    mbd_msg_destroy(&r->orig);
    return;
  }
  req_free(c, r);
}

static void peer_ctl(mbd_bcore *c, const void *ident, size_t ident_len, uint8_t cmd,
                     const char *reason) {
  mbd_msg *m = NULL;
  if (reason ? mbd_msg_new_kv(cmd, 0, "reason", reason, &m, NULL) : mbd_msg_new(cmd, 0, &m, NULL))
    return;
  mbd_msg_set_peer(m, ident, ident_len, NULL);
  send_to(c, MBD_BDEST_WORKER, &m);
}

static void worker_ctl(mbd_bcore *c, const mbd_bworker *w, uint8_t cmd, const char *reason) {
  peer_ctl(c, w->ident, w->ident_len, cmd, reason);
}

/* Tells r's worker to stop r's ticket (CANCEL; the worker answers the ticket
 * with ERROR CANCELLED, which frees the slot). */
static void cancel_on_worker(mbd_bcore *c, uint64_t ticket, uint64_t gen) {
  mbd_bworker *w = mbd_registry_find_gen(c->reg, gen);
  mbd_msg *m = NULL;
  if (!w || mbd_msg_new(MBD_CMD_CANCEL, ticket, &m, NULL)) return;
  mbd_msg_set_peer(m, w->ident, w->ident_len, NULL);
  send_to(c, MBD_BDEST_WORKER, &m);
}

/* Stops r: queued -> freed, in flight -> CANCEL to its worker and a zombie
 * until the worker answers. `answer`: the client gets ERROR CANCELLED `why`
 * (a client that is gone gets nothing). */
static void req_cancel(mbd_bcore *c, breq *r, bool answer, const char *why) {
  c->st.cancelled++;
  bool inflight = r->state == RQ_INFLIGHT;
  uint64_t ticket = r->ticket, gen = r->worker_gen;
  if (answer) {
    mbd_bcore_req_fail(c, r, MBD_E_CANCELLED, why); /* the client hears first, then the worker */
  } else if (r->state == RQ_INFLIGHT && mbd_registry_find_gen(c->reg, r->worker_gen)) {
    r->state = RQ_ZOMBIE;
    c->pending--;
    mbd_msg_destroy(&r->orig);
  } else {
    req_free(c, r);
  }
  if (inflight) cancel_on_worker(c, ticket, gen);
}

/* The client at identity id is gone: its requests are stopped, nobody is
 * told (nobody can receive it). */
static void client_gone(mbd_bcore *c, const uint8_t *id, size_t len, const char *why) {
  size_t n = 0;
  for (breq *r = c->all; r;) {
    breq *next = r->anext;
    if (r->state != RQ_ZOMBIE && r->client_len == len && !memcmp(r->client, id, len)) {
      req_cancel(c, r, false, why);
      n++;
    }
    r = next;
  }
  if (!n) return;
  c->st.clients_gone++;
  MBD_LOGI(LOG, "a client went away (%s): %zu request(s) stopped", why, n);
  mbd_bcore_drain(c);
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

/* `prefix`: the routing hashes of the prompt's cached-prefix boundaries
 * (common/prefix_hash.h), at most MBD_PREFIX_HASHES_MAX unsigned integers. */
static int read_prefix(const msgpack_object *root, breq *r, mbd_error *err) {
  const msgpack_object *v = mbd_obj_get(root, "prefix");
  if (!v) return MBD_OK;
  if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > MBD_PREFIX_HASHES_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "prefix must be an array of at most %d routing hashes",
                         MBD_PREFIX_HASHES_MAX);
  if (!v->via.array.size) return MBD_OK;
  if (!(r->pfx = malloc(v->via.array.size * sizeof *r->pfx)))
    return mbd_error_set(err, MBD_E_NOMEM, "broker out of memory");
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    if (v->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return mbd_error_set(err, MBD_E_INVALID, "prefix entry %u is not an unsigned integer", i);
    r->pfx[r->npfx++] = v->via.array.ptr[i].via.u64;
  }
  return MBD_OK;
}

/* Reads a client request's routing facts into r: route constraint, model,
 * deadline (*dl, 0 = none given), owning worker of a session, IPC use,
 * prefix hashes (r->pfx, freed with r). */
static int req_read(const msgpack_object *root, uint8_t cmd, breq *r, uint64_t *dl,
                    mbd_error *err) {
  char session[2 * MBD_BW_UID_MAX] = "";
  int rc;
  if ((rc = mbd_obj_route_want(root, "route", &r->want, err)) ||
      (rc = mbd_obj_str(root, "model", false, r->model, sizeof r->model, err)) ||
      (rc = mbd_obj_str(root, "model_digest", false, r->digest, sizeof r->digest, err)) ||
      (rc = mbd_obj_u64(root, "deadline_ms", false, dl, err)) ||
      (rc = mbd_obj_str(root, "request_id", false, r->rid, sizeof r->rid, err)) ||
      (mbd_cmd_is_session(cmd) &&
       (rc = mbd_obj_str(root, "session", true, session, sizeof session, err))) ||
      (cmd == MBD_CMD_STEP && (rc = mbd_obj_i64(root, "token", false, &r->token, err))))
    return rc;
  if (r->digest[0] && !mbd_digest_prefix_ok(r->digest))
    return mbd_error_set(err, MBD_E_INVALID,
                         "model_digest '%s' is not a lower-case hex prefix of 8 to 64 characters "
                         "of a weights digest (mambad status lists them)",
                         r->digest);
  if (r->digest[0] && !r->model[0] && !mbd_cmd_is_session(cmd))
    return mbd_error_set(err, MBD_E_INVALID, "model_digest needs the model's name in 'model'");
  if (mbd_cmd_is_session(cmd)) {
    r->digest[0] = '\0'; /* a session's model was fixed when it was opened */
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
  if (!r->is_session && (rc = read_prefix(root, r, err))) return rc;
  return scan_ipc(root, r, err);
}

/* Remembers the sessions clients open and forgets those they close. */
static void track_session(mbd_bcore *c, const breq *r, const mbd_bworker *w, const mbd_msg *m) {
  if (r->cmd == MBD_CMD_CLOSE) {
    mbd_breclaim_closed(c->reclaim, r->session_id);
    return;
  }
  if (r->cmd != MBD_CMD_OPEN && r->cmd != MBD_CMD_IMPORT) return;
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  mbd_body *body = NULL;
  char sid[2 * MBD_BW_UID_MAX] = "";
  if (!mbd_body_parse(b, blen, &body, NULL) &&
      !mbd_obj_str(mbd_body_root(body), "session", true, sid, sizeof sid, NULL))
    mbd_breclaim_opened(c->reclaim, sid, w->uid, r->caller, r->caller_pid, r->client,
                        r->client_len);
  mbd_body_destroy(&body);
}

static bool is_stateless(uint8_t cmd) { return cmd == MBD_CMD_GEMM || cmd == MBD_CMD_FORWARD; }

/* Sends r to w under a fresh ticket. r is not in the queue. */
static void send_req(mbd_bcore *c, breq *r, mbd_bworker *w) {
  mbd_msg *m = NULL;
  mbd_error err = {0};
  if ((is_stateless(r->cmd) || r->internal || mbd_brehome_held(c, r)) && r->sends + 1 < MAX_SENDS) {
    if (mbd_msg_clone(r->orig, &m, &err)) {
      mbd_bcore_req_fail(c, r, MBD_E_NOMEM, "broker out of memory forwarding the request");
      return;
    }
  } else {
    m = r->orig; /* last possible send: hand the frames over */
    r->orig = NULL;
  }
  /* The worker gets the time left, so it stops where the broker gives up. */
  int64_t left = r->deadline_ms - c->now_ms;
  size_t blen = 0;
  const void *body = mbd_msg_body(m, &blen);
  msgpack_sbuffer sb, rw;
  msgpack_sbuffer_init(&sb);
  msgpack_sbuffer_init(&rw);
  /* A durable session: its id on the worker holding it now, a re-sent GENERATE's progress. */
  int rwc = r->is_session ? mbd_bdurable_rewrite(c->durable, r->session_id, r->caller, r->cmd,
                                                 r->retried, body, blen, &rw, &err)
                          : 0;
  if (rwc == 1) body = rw.data, blen = rw.size;
  if (rwc < 0 ||
      mbd_body_prepend_u64(body, blen, "deadline_ms", (uint64_t)(left > 1 ? left : 1), &sb,
                           &err) ||
      mbd_msg_take_body(m, &sb, &err)) {
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_destroy(&rw);
    mbd_msg_destroy(&m);
    mbd_bcore_req_fail(c, r, MBD_E_NOMEM, "broker out of memory forwarding the request");
    return;
  }
  msgpack_sbuffer_destroy(&sb);
  msgpack_sbuffer_destroy(&rw);
  r->sends++;
  r->ticket = ++c->next_ticket;
  r->worker_gen = w->gen;
  snprintf(r->worker_name, sizeof r->worker_name, "%s", w->name);
  r->state = RQ_INFLIGHT;
  hash_put(c, r);
  w->inflight++;
  mbd_msg_set_tag(m, r->ticket);
  mbd_msg_set_peer(m, w->ident, w->ident_len, NULL);
  c->st.forwarded++;
  MBD_LOGD(LOG, "request %s: %s (client tag %" PRIu64 ") to worker %s as ticket %" PRIu64 "%s",
           r->rid[0] ? r->rid : "-", mbd_cmd_name(r->cmd), r->client_tag, w->name, r->ticket,
           r->retried ? " (re-sent)" : "");
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
    mbd_bcore_req_fail(c, r, MBD_E_BUSY, msg);
  }
}

static void no_route(mbd_bcore *c, breq *r) {
  char msg[1024];
  mbd_registry_no_route_message(c->reg, &r->want, r->model, r->digest, msg, sizeof msg);
  mbd_bcore_req_fail(c, r, MBD_E_NO_ROUTE, msg);
}

static bool uid_seen(const mbd_bcore *c, const char *uid) {
  for (size_t i = 0; i < c->nseen; i++)
    if (!strcmp(c->seen_uids[i], uid)) return true;
  return false;
}

static void note_uid(mbd_bcore *c, const char *uid) {
  if (uid_seen(c, uid)) return;
  snprintf(c->seen_uids[c->seen_next], MBD_BW_UID_MAX, "%s", uid);
  c->seen_next = (c->seen_next + 1) % SEEN_UIDS;
  if (c->nseen < SEEN_UIDS) c->nseen++;
}

static void session_lost(mbd_bcore *c, breq *r) {
  char msg[512];
  if (!uid_seen(c, r->session_uid)) {
    snprintf(msg, sizeof msg,
             "session %s/...: no worker with uid %s has registered with this broker (a mistyped "
             "session id, a session of another deployment, or of a worker lost before this "
             "broker started)",
             r->session_uid, r->session_uid);
    mbd_bcore_req_fail(c, r, MBD_E_NOT_FOUND, msg);
    return;
  }
  snprintf(msg, sizeof msg,
           "the worker holding session %s/... (uid %s) is gone; sessions live on one worker: "
           "EXPORT a session's state while its worker lives and IMPORT it on another worker with "
           "the same route to move it",
           r->session_uid, r->session_uid);
  mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
}

/* The worker for a stateless request: GPU-affine on the client's host when
 * it carries CUDA IPC tensors. */
static mbd_bworker *select_for(mbd_bcore *c, breq *r, size_t *nmatch) {
  if (r->has_ipc)
    return mbd_registry_select_ipc(c->reg, &r->want, r->model, r->digest,
                                   r->digest_fixed ? r->tokenizer : NULL, r->client_host,
                                   r->ipc_device, NULL, nmatch);
  if (r->npfx)
    return mbd_registry_select_prefix(c->reg, &r->want, r->model, r->digest,
                                      r->digest_fixed ? r->tokenizer : NULL, r->pfx, r->npfx, NULL,
                                      nmatch);
  return mbd_registry_select(c->reg, &r->want, r->model, r->digest,
                             r->digest_fixed ? r->tokenizer : NULL, NULL, nmatch);
}

/* Fixes which weights r gets (once: a re-send goes to the same digest).
 * False when r was answered (the name is ambiguous). */
static bool resolve_digest(mbd_bcore *c, breq *r) {
  if (r->digest_fixed || !r->model[0]) return true;
  mbd_error err = {0};
  char d[MBD_BW_DIGEST_MAX];
  if (mbd_registry_resolve_digest(c->reg, &r->want, r->model, r->digest, d, r->tokenizer, &err)) {
    c->st.ambiguous++;
    mbd_bcore_req_fail(c, r, err.code, err.msg);
    return false;
  }
  snprintf(r->digest, sizeof r->digest, "%s", d);
  r->digest_fixed = strlen(d) == 64;
  return true;
}

bool mbd_bcore_place(mbd_bcore *c, breq *r) {
  if (r->is_session) {
    const char *uid = r->session_uid, *wid = NULL, *why = NULL;
    switch (mbd_bdurable_locate(c->durable, r->session_id, r->caller, &uid, &wid, &why)) {
    case MBD_BDUR_MOVING: return false; /* its restore is under way */
    case MBD_BDUR_LOST: {
      char msg[512];
      snprintf(msg, sizeof msg, "session %s/...: %s", r->session_uid, why);
      mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
      return true;
    }
    default: break;
    }
    mbd_bworker *w = mbd_registry_find_uid(c->reg, uid);
    if (!w || w->dead) { /* an id no live worker issued: as unknown as a closed one */
      if (!uid_seen(c, r->session_uid)) {
        session_lost(c, r); /* NOT_FOUND naming the uid no worker registered */
        return true;
      }
      mbd_bcore_req_fail(c, r, MBD_E_NOT_FOUND,
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
      mbd_bcore_req_fail(c, r, MBD_E_INVALID, msg);
      return true;
    }
    if (w->inflight >= w->capacity) return false;
    send_req(c, r, w);
    return true;
  }
  if (!resolve_digest(c, r)) return true;
  size_t nmatch = 0;
  mbd_bworker *w = select_for(c, r, &nmatch);
  if (w) {
    send_req(c, r, w);
    return true;
  }
  if (!nmatch) {
    if (r->internal) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "no other live worker of route %.16s serves model %s (weights %.16s); start one "
               "to keep sessions across worker loss",
               r->want.route_id, r->model, r->digest);
      mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
    } else if (r->retried) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "worker %s was lost while running this %s and no other live worker matches its "
               "route to retry it",
               r->worker_name, mbd_cmd_name(r->cmd));
      mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
    } else if (r->has_ipc) {
      char msg[1024];
      snprintf(msg, sizeof msg,
               "no GPU worker on host %s matches this request carrying CUDA IPC tensors (they "
               "can only be opened on the same host); send the tensors inline or in shm",
               r->client_host);
      mbd_bcore_req_fail(c, r, MBD_E_NO_ROUTE, msg);
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

void mbd_bcore_drain(mbd_bcore *c) {
  breq *r = c->qhead;
  while (r && any_capacity(c)) {
    breq *next = r->qnext;
    mbd_bcore_q_del(c, r);
    /* mbd_bcore_place() sends r, answers it (freed), or leaves it waiting: re-queue in
     * place to keep FIFO order. It touches no other request. */
    if (!mbd_bcore_place(c, r)) mbd_bcore_q_insert_before(c, r, next);
    r = next;
  }
}

/* ---- client side ---------------------------------------------------------------- */

static void status_reply(mbd_bcore *c, mbd_msg **req, int64_t now) {
  const mbd_bstatus_view v = {.reg = c->reg,
                              .failed = c->failed,
                              .nfailed = c->nfailed,
                              .qlen = c->qlen,
                              .qbytes = c->qbytes,
                              .pending = c->pending,
                              .stats = &c->st,
                              .durable = mbd_bdurable_get_stats(c->durable),
                              .cfg = &c->cfg};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  mbd_bstatus_pack(&v, mbd_bstatus_privileged(*req), now, &pk);
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
  c->now_ms = now;
  if (recv_rc) {
    c->st.malformed++;
    snprintf(msg, sizeof msg, "malformed request: %s", recv_err ? recv_err->msg : "");
    client_error(c, pcopy, plen, tag, recv_rc, msg);
    goto done;
  }
  if (cmd == MBD_CMD_CANCEL) { /* no reply of its own: the request ends CANCELLED */
    for (breq *q = c->all; q; q = q->anext) {
      if (q->state == RQ_ZOMBIE || q->client_tag != tag || q->client_len != plen ||
          memcmp(q->client, pcopy, plen))
        continue;
      req_cancel(c, q, true, "cancelled by the client");
      mbd_bcore_drain(c);
      break;
    }
    goto done;
  }
  if (cmd == MBD_CMD_HEARTBEAT) goto done; /* a client's keep-alive: nothing to do */
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
  /* The routing header only: bulk fields are skipped, never decoded. */
  static const char *const header_keys[] = {"route",   "model",   "model_digest", "deadline_ms",
                                            "session", "tensors", "outputs",      "host_id",
                                            "request_id", "caller",  "token",       "prefix",
                                            NULL};
  int rc = mbd_body_parse_keys(b, blen, header_keys, HEADER_MAX_BYTES, &body, &err);
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
  mbd_breclaim_seen(c->reclaim, r->caller, pcopy, plen); /* a key back within the grace period */
  if (dl == 0) dl = (uint64_t)c->cfg.default_deadline_ms;
  if (dl > DEADLINE_MAX_MS) dl = DEADLINE_MAX_MS;
  r->client_tag = tag;
  memcpy(r->client, pcopy, plen);
  r->client_len = plen;
  r->cmd = cmd;
  r->start_ms = now;
  r->deadline_ms = now + (int64_t)dl;
  r->bytes = blen;
  for (size_t i = 0; i < mbd_msg_npayloads(m); i++) {
    size_t pl = 0;
    mbd_msg_payload(m, i, &pl);
    r->bytes += pl;
  }
  r->orig = m;
  m = NULL;
  r->state = RQ_WAITING;
  r->anext = c->all;
  if (c->all) c->all->aprev = r;
  c->all = r;
  c->pending++;
  breq *nr = r;
  r = NULL;
  if (!mbd_bcore_place(c, nr)) {
    uint64_t qcap = (uint64_t)c->cfg.queue_mb << 20;
    if ((int)c->qlen >= c->cfg.queue_limit) {
      c->st.busy_count++;
      snprintf(msg, sizeof msg,
               "every worker matching route/model is at capacity and the broker queue is full "
               "by count (%d requests waiting, --queue-limit %d); retry later or add workers",
               (int)c->qlen, c->cfg.queue_limit);
      mbd_bcore_req_fail(c, nr, MBD_E_BUSY, msg);
    } else if (c->qbytes + nr->bytes > qcap) {
      c->st.busy_bytes++;
      snprintf(msg, sizeof msg,
               "every worker matching route/model is at capacity and the broker queue is full "
               "by bytes (%zu requests holding %.1f MiB waiting, this one %.1f MiB, --queue-mb "
               "%" PRId64 "); retry later or add workers",
               c->qlen, (double)c->qbytes / (1 << 20), (double)nr->bytes / (1 << 20),
               c->cfg.queue_mb);
      mbd_bcore_req_fail(c, nr, MBD_E_BUSY, msg);
    } else {
      mbd_bcore_q_push(c, nr, false);
    }
  }
done:
  if (r) free(r->pfx);
  free(r);
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
}

/* ---- worker side ----------------------------------------------------------------- */

/* Fails over or fails every request on worker generation `gen` (removed already). */
static void fail_over(mbd_bcore *c, uint64_t gen, const char *wname, const char *why, bool crash) {
  /* Detach first: placing one request may touch the lists. */
  breq *lost = NULL, *held = NULL; /* held: the last request queued by durable_hold */
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
    if (crash && r->crashes < POISON_CRASHES)
      snprintf(r->crashed_on[r->crashes++], sizeof r->crashed_on[0], "%s", wname);
    if (is_stateless(r->cmd) && r->crashes >= POISON_CRASHES) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "not re-sent: workers %s and %s both died while running this %s, so it may be what "
               "kills them (a poison request); check its inputs before sending it again",
               r->crashed_on[0], r->crashed_on[1], mbd_cmd_name(r->cmd));
      MBD_LOGW(LOG, "poison request: %s (client tag %" PRIu64 ") killed workers %s and %s",
               mbd_cmd_name(r->cmd), r->client_tag, r->crashed_on[0], r->crashed_on[1]);
      c->st.poisoned++;
      mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
      continue;
    }
    if (mbd_brehome_hold(c, r, &held)) continue;
    if (is_stateless(r->cmd) && r->orig) {
      r->retried = true;
      c->st.failovers++;
      MBD_LOGI(LOG, "re-sending %s (client tag %" PRIu64 ") lost on worker %s", mbd_cmd_name(r->cmd),
               r->client_tag, wname);
      /* Matching workers exist but are full: go first. */
      if (!mbd_bcore_place(c, r)) mbd_bcore_q_push(c, r, true);
      continue;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "worker %s was lost (%s) while running this %s%s", wname, why,
             mbd_cmd_name(r->cmd),
             r->retried ? " after it had already been re-sent"
             : is_stateless(r->cmd) ? ""
             : "; session state on that worker is gone (EXPORT/IMPORT moves a session to another worker)");
    mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
  }
}

static void worker_lost(mbd_bcore *c, mbd_bworker *w, const char *why) {
  uint64_t gen = w->gen;
  char name[MBD_BW_NAME_MAX];
  snprintf(name, sizeof name, "%s", w->name);
  MBD_LOGW(LOG, "worker %s (uid %s, route %.8s) dropped: %s", w->name, w->uid, w->route_id, why);
  c->st.workers_lost++;
  char uid[MBD_BW_UID_MAX];
  snprintf(uid, sizeof uid, "%s", w->uid);
  mbd_registry_remove(c->reg, w->ident, w->ident_len);
  mbd_brehome_start(c, uid, name);
  fail_over(c, gen, name, why, true);
  mbd_bcore_drain(c); /* queued requests that no longer match anything get NO_ROUTE */
  /* Queued requests for routes nobody serves any more: answer now, not at the deadline. */
  for (breq *r = c->qhead; r;) {
    breq *next = r->qnext;
    size_t nmatch = 0;
    const char *suid = r->session_uid, *wid, *swhy;
    mbd_bdur_where where = r->is_session ? mbd_bdurable_locate(c->durable, r->session_id,
                                                               r->caller, &suid, &wid, &swhy)
                                         : MBD_BDUR_NONE;
    if (where == MBD_BDUR_MOVING) {
      r = next;
      continue; /* waits for its restore */
    }
    bool gone = where == MBD_BDUR_LOST ? true
                : r->is_session        ? !mbd_registry_find_uid(c->reg, suid)
                                       : (select_for(c, r, &nmatch), nmatch == 0);
    if (gone && where == MBD_BDUR_LOST) {
      mbd_bcore_q_del(c, r);
      mbd_bcore_place(c, r); /* answers it with the reason */
    } else if (gone) {
      if (r->is_session) session_lost(c, r);
      else no_route(c, r);
    }
    r = next;
  }
}

/* Adds model_digest to a FINAL's body (a small map: tensors travel in the
 * payload frames, which stay untouched), so the client sees which weights
 * answered. A body that cannot be rewritten is forwarded as it was. */
static void add_digest(mbd_msg *m, const char *digest) {
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  if (!mbd_body_append_str(b, blen, "model_digest", digest, &sb, NULL))
    mbd_msg_take_body(m, &sb, NULL);
  msgpack_sbuffer_destroy(&sb);
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
    warn_limited(c, now, "rejected worker registration: %s", err.msg);
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
  w.sessions = -1; /* until its first heartbeat says */
  w.gen = ++c->next_gen;
  mbd_bworker old;
  bool replaced = false;
  rc = mbd_registry_add(c->reg, &w, &old, &replaced, &err);
  if (rc) {
    MBD_LOGE(LOG, "cannot register worker %s: %s", w.name, err.msg);
    return;
  }
  c->st.workers_joined++;
  clear_start_failure(c, w.name);
  note_uid(c, w.uid);
  MBD_LOGI(LOG, "worker %s registered: uid %s route %.8s (%s/%s/%s, state %s) capacity %d, "
           "%d model(s)%s",
           w.name, w.uid, w.route_id, mbd_backend_name(w.route.backend),
           mbd_dtype_policy_name(w.route.policy), mbd_gemm_mode_name(w.route.mode),
           mbd_state_dtype_name(w.route.state), w.capacity,
           w.nmodels, replaced ? " (re-registered)" : "");
  if (replaced) {
    c->st.workers_lost++;
    fail_over(c, old.gen, old.name, "it re-registered", false);
  }
  mbd_bcore_drain(c);
}

void mbd_bcore_on_worker(mbd_bcore *c, mbd_msg **pm, int recv_rc, const mbd_error *recv_err,
                         int64_t now) {
  mbd_msg *m = *pm;
  *pm = NULL;
  if (!m) return;
  c->now_ms = now;
  size_t plen = 0;
  const void *peer = mbd_msg_peer(m, &plen);
  if (recv_rc) {
    c->st.malformed++;
    warn_limited(c, now, "dropped a malformed message from a worker: %s",
                 recv_err ? recv_err->msg : "");
    goto done;
  }
  uint8_t cmd = mbd_msg_cmd(m);
  if (cmd == MBD_CMD_READY) {
    on_ready(c, m, now);
    goto done;
  }
  mbd_bworker *w = mbd_registry_find_ident(c->reg, peer, plen);
  if (!w && cmd == MBD_CMD_DISCONNECT) {
    static const char *const keys[] = {"name", "error", "models", NULL};
    mbd_body *body = NULL;
    size_t blen;
    const void *b = mbd_msg_body(m, &blen);
    if (!mbd_body_parse_keys(b, blen, keys, 4096, &body, NULL))
      note_start_failure(c, mbd_body_root(body), now);
    mbd_body_destroy(&body);
    /* A stopping worker the broker had dropped already waits for it as well. */
    peer_ctl(c, peer, plen, MBD_CMD_DISCONNECT, "goodbye");
    goto done;
  }
  if (!w) {
    if (cmd != MBD_CMD_DISCONNECT) {
      peer_ctl(c, peer, plen, MBD_CMD_DISCONNECT, "unknown worker: send READY to register");
      if (cmd == MBD_CMD_FINAL || cmd == MBD_CMD_ERROR || cmd == MBD_CMD_PARTIAL) c->st.late_dropped++;
    }
    goto done;
  }
  w->last_seen_ms = now;
  switch (cmd) {
  case MBD_CMD_HEARTBEAT: {
    /* {load, sessions, draining?, prefix?}: the open sessions and the prefix
     * cache (counters for STATUS, hashes for routing) are kept; a
     * worker that drains after SIGTERM gets no new work (capacity 0: it still
     * matches, so requests wait for other workers instead of failing
     * NO_ROUTE, and it keeps its running ones). */
    static const char *const keys[] = {"sessions", "draining", "prefix", NULL};
    mbd_body *body = NULL;
    size_t blen = 0;
    const void *b = mbd_msg_body(m, &blen);
    int64_t n = -1;
    bool draining = false;
    if (blen && !mbd_body_parse_keys(b, blen, keys, 2048, &body, NULL)) {
      mbd_obj_i64(mbd_body_root(body), "sessions", false, &n, NULL);
      mbd_obj_bool(mbd_body_root(body), "draining", false, &draining, NULL);
      const msgpack_object *pv = mbd_obj_get(mbd_body_root(body), "prefix");
      if (pv) mbd_bworker_read_prefix(w, pv);
    }
    mbd_body_destroy(&body);
    if (n >= 0) w->sessions = n;
    if (draining && w->capacity > 0) {
      MBD_LOGI(LOG, "worker %s is shutting down: no new work goes to it", w->name);
      w->capacity = 0;
    }
    break;
  }
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
    /* The goodbye goes last, after whatever worker_lost sends it: the worker
     * reads until the goodbye, so it never closes mid-message. */
    uint8_t ident[sizeof w->ident];
    size_t ident_len = w->ident_len;
    memcpy(ident, w->ident, ident_len);
    worker_lost(c, w, why);
    peer_ctl(c, ident, ident_len, MBD_CMD_DISCONNECT, "goodbye");
    break;
  }
  case MBD_CMD_CHECKPOINT:
    mbd_bdurable_checkpoint(c->durable, &m, w->uid, w->route_id);
    break;
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
    if (r->internal) {
      if (r->state == RQ_INFLIGHT && last) mbd_brehome_reply(c, r, w, m);
      if (last) {
        if (w->inflight > 0) w->inflight--;
        req_free(c, r);
        mbd_bcore_drain(c);
      }
      break;
    }
    /* What the session consumed, for its restore (zombies' replies too: the worker ran them). */
    if (r->is_session) mbd_bdurable_reply(c->durable, r->session_id, r->cmd, r->token, m);
    bool gone = false;
    mbd_error verr = {0};
    if (r->state == RQ_INFLIGHT && cmd != MBD_CMD_ERROR &&
        mbd_bcaller_vouch_reply(m, w->name, w->route_id, &verr)) {
      /* Replies name the worker as registered; one that cannot be rewritten is not sent. */
      c->st.malformed++;
      MBD_LOGW(LOG, "cannot vouch for a %s of worker %s (%s)", mbd_cmd_name(cmd), w->name, verr.msg);
      mbd_bcore_req_fail(c, r, MBD_E_INTERNAL, "the broker could not relay the worker's reply");
    }
    if (r->state == RQ_INFLIGHT && cmd == MBD_CMD_FINAL) track_session(c, r, w, m);
    if (r->state == RQ_INFLIGHT) {
      if (cmd == MBD_CMD_FINAL && r->digest_fixed) add_digest(m, r->digest);
      mbd_msg_set_tag(m, r->client_tag);
      mbd_msg_set_peer(m, r->client, r->client_len, NULL);
      c->st.replies++;
      mbd_error se = {0};
      gone = c->send(c->ctx, MBD_BDEST_CLIENT, &m, &se) == MBD_E_NOT_FOUND;
    } else {
      c->st.late_dropped++;
    }
    if (last) {
      MBD_LOGD(LOG, "request %s: %s from worker %s (ticket %" PRIu64 ")", r->rid[0] ? r->rid : "-",
               mbd_cmd_name(cmd), w->name, r->ticket);
      if (w->inflight > 0) w->inflight--;
      req_free(c, r);
    }
    if (gone && !last) { /* a stream nobody reads any more: stop it */
      uint8_t id[MBD_BW_IDENT_MAX];
      size_t il = r->client_len;
      memcpy(id, r->client, il);
      client_gone(c, id, il, "a reply could not be delivered");
    }
    if (last) mbd_bcore_drain(c);
    break;
  }
  default:
    c->st.malformed++;
    warn_limited(c, now, "worker %s sent %s, which workers may not send; dropped", w->name,
                 mbd_cmd_name(cmd));
    break;
  }
done:
  mbd_brehome_wake(c);
  mbd_msg_destroy(&m);
}

/* ---- timers ------------------------------------------------------------------------ */

/* Whether the client at conn can still be reached (the probe callback, or a HEARTBEAT). */
static bool client_reachable(void *ctx, const uint8_t *conn, size_t len) {
  mbd_bcore *c = ctx;
  if (c->probe) return c->probe(c->ctx, conn, len) != MBD_E_NOT_FOUND;
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(MBD_CMD_HEARTBEAT, 0, &m, NULL)) return true;
  mbd_msg_set_peer(m, conn, len, NULL);
  return c->send(c->ctx, MBD_BDEST_CLIENT, &m, &e) != MBD_E_NOT_FOUND;
}

/* One probe round on side d: a HEARTBEAT to each peer of that side; a peer
 * that can no longer be reached (ROUTER_MANDATORY: EHOSTUNREACH) is gone.
 * On the clients side this covers the clients that hold sessions as well. */
static void probe_round(mbd_bcore *c, mbd_bdest d) {
  if (d == MBD_BDEST_WORKER) {
    for (size_t i = 0; i < mbd_registry_count(c->reg); i++) {
      mbd_bworker *w = mbd_registry_at(c->reg, i);
      mbd_msg *m = NULL;
      mbd_error e = {0};
      if (w->dead || mbd_msg_new(MBD_CMD_HEARTBEAT, 0, &m, NULL)) continue;
      mbd_msg_set_peer(m, w->ident, w->ident_len, NULL);
      if (c->send(c->ctx, MBD_BDEST_WORKER, &m, &e) == MBD_E_NOT_FOUND) {
        MBD_LOGI(LOG, "worker %s: connection closed", w->name);
        w->dead = true; /* dropped with failover just below, in this tick */
      }
    }
    return;
  }
  mbd_breclaim_probe(c->reclaim, client_reachable, c, c->now_ms);
  for (breq *r = c->all; r;) {
    breq *next = r->anext;
    /* One probe per client identity: requests of one client are often adjacent. */
    bool dup = r->aprev && r->aprev->client_len == r->client_len &&
               !memcmp(r->aprev->client, r->client, r->client_len);
    if (r->state != RQ_ZOMBIE && !dup && !r->internal &&
        !client_reachable(c, r->client, r->client_len)) {
      uint8_t id[MBD_BW_IDENT_MAX];
      size_t il = r->client_len;
      memcpy(id, r->client, il);
      client_gone(c, id, il, "its connection closed");
      next = c->all; /* the list changed; stopped requests are zombies or gone */
    }
    r = next;
  }
}

void mbd_bcore_on_disconnect(mbd_bcore *c, mbd_bdest side, int64_t now) {
  c->now_ms = now;
  c->probe_t0[side] = now;
  c->probe_next[side] = 0;
}

static bool pid_alive(int64_t pid) {
  return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/* CLOSE {session, caller} to the session's worker on behalf of its departed
 * owner; the answer comes back under ticket 0 and is dropped. */
static void reclaim_close(void *ctx, const char *id, const char *worker_uid, const char *caller,
                          const char *why) {
  mbd_bcore *c = ctx;
  const char *wid = id, *lost_why;
  mbd_bdurable_locate(c->durable, id, NULL, &worker_uid, &wid, &lost_why); /* a re-homed session */
  mbd_bworker *w = mbd_registry_find_uid(c->reg, worker_uid);
  char sid[2 * MBD_BW_UID_MAX];
  snprintf(sid, sizeof sid, "%s", wid);
  mbd_bdurable_forget(c->durable, id);
  if (!w || w->dead) return;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "session", sid);
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
  MBD_LOGI(LOG, "closing session %s on %s: its client (%s) is gone (%s)", id, w->name,
           caller[0] ? caller : "anonymous", why);
  send_to(c, MBD_BDEST_WORKER, &m);
}

void mbd_bcore_tick(mbd_bcore *c, int64_t now) {
  c->now_ms = now;
  if (now >= c->next_reap_ms) {
    mbd_breclaim_sweep(c->reclaim, pid_alive, reclaim_close, c, now, c->cfg.reclaim_grace_ms);
    mbd_bdurable_sweep(c->durable, now);
    c->next_reap_ms = now + 1000;
  }
  for (int d = 0; d < 2; d++)
    while (c->probe_next[d] < PROBE_ROUNDS &&
           now >= c->probe_t0[d] + probe_after_ms[c->probe_next[d]]) {
      c->probe_next[d]++;
      probe_round(c, (mbd_bdest)d);
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
      bool inflight = r->state == RQ_INFLIGHT;
      uint64_t ticket = r->ticket, gen = r->worker_gen;
      mbd_bcore_req_fail(c, r, MBD_E_TIMEOUT, msg); /* frees or zombifies r only */
      if (inflight) cancel_on_worker(c, ticket, gen); /* in case it did not stop by itself */
    }
    r = next;
  }
  mbd_brehome_wake(c);
}

int64_t mbd_bcore_next_due(const mbd_bcore *c, int64_t now) {
  int64_t due = c->next_hb_ms;
  for (int d = 0; d < 2; d++)
    if (c->probe_next[d] < PROBE_ROUNDS && c->probe_t0[d] + probe_after_ms[c->probe_next[d]] < due)
      due = c->probe_t0[d] + probe_after_ms[c->probe_next[d]];
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
  while (c->qhead)
    mbd_bcore_req_fail(c, c->qhead, MBD_E_BUSY, "broker is shutting down; request not started");
}

void mbd_bcore_abort(mbd_bcore *c, int64_t now) {
  mbd_bcore_shutdown(c, now); /* queued requests first, as in an orderly shutdown */
  for (breq *r = c->all; r;) {
    breq *next = r->anext;
    if (r->state == RQ_INFLIGHT && !r->internal)
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
  c->probe_next[0] = c->probe_next[1] = PROBE_ROUNDS;
  c->send = send;
  c->ctx = ctx;
  int rc = mbd_registry_new(&c->reg, err);
  for (int i = 0; !rc && i < cfg->ndefaults; i++)
    rc = mbd_registry_set_default(c->reg, cfg->defaults[i].name, cfg->defaults[i].digest, err);
  if (rc) {
    mbd_registry_destroy(&c->reg);
    free(c);
    return rc;
  }
  if (!(c->reclaim = mbd_breclaim_new()) ||
      mbd_bdurable_new((uint64_t)cfg->durable_mb << 20, &c->durable, err)) {
    mbd_breclaim_destroy(&c->reclaim);
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
  mbd_bdurable_destroy(&c->durable);
  free(c);
  *pc = NULL;
}

void mbd_bcore_set_probe(mbd_bcore *c, mbd_bcore_probe_fn probe) { c->probe = probe; }

size_t mbd_bcore_queue_len(const mbd_bcore *c) { return c->qlen; }
size_t mbd_bcore_pending(const mbd_bcore *c) { return c->pending; }
const mbd_bcore_stats *mbd_bcore_get_stats(const mbd_bcore *c) { return &c->st; }
mbd_registry *mbd_bcore_registry(mbd_bcore *c) { return c->reg; }
const mbd_bdurable_stats *mbd_bcore_durable_stats(const mbd_bcore *c) {
  return mbd_bdurable_get_stats(c->durable);
}
