/* Re-homing the durable sessions of a lost worker (see rehome.h). */
#include "broker/rehome.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/protocol.h"

/* A restore of durable session id (broker/durable.h) becomes a request of the
 * broker's own: placed like an IMPORT on a live worker of its route and model. */
static void restore_place(void *ctx, const char *id, const char *model, const char *digest,
                          const char *route_id, mbd_msg **m) {
  mbd_bcore *c = ctx;
  breq *r = calloc(1, sizeof *r);
  if (!r) {
    mbd_bdurable_failed(c->durable, id, "broker out of memory", c->now_ms);
    c->wake = true;
    return;
  }
  r->internal = true;
  r->cmd = MBD_CMD_IMPORT;
  snprintf(r->rid, sizeof r->rid, "restore");
  snprintf(r->session_id, sizeof r->session_id, "%s", id);
  snprintf(r->model, sizeof r->model, "%s", model);
  snprintf(r->digest, sizeof r->digest, "%s", digest);
  snprintf(r->want.route_id, sizeof r->want.route_id, "%s", route_id);
  r->start_ms = c->now_ms;
  r->deadline_ms = c->now_ms + c->cfg.default_deadline_ms;
  r->orig = *m;
  *m = NULL;
  r->state = RQ_WAITING;
  r->anext = c->all;
  if (c->all) c->all->aprev = r;
  c->all = r;
  c->pending++;
  if (!mbd_bcore_place(c, r)) mbd_bcore_q_push(c, r, true); /* before the session's requests */
}

bool mbd_brehome_hold(mbd_bcore *c, breq *r, breq **last) {
  const char *uid, *wid, *why = NULL;
  mbd_bdur_where where =
      r->internal     ? MBD_BDUR_MOVING
      : r->is_session ? mbd_bdurable_locate(c->durable, r->session_id, r->caller, &uid, &wid, &why)
                      : MBD_BDUR_NONE;
  char msg[512];
  if (where == MBD_BDUR_LOST) {
    snprintf(msg, sizeof msg, "session %s/...: %s", r->session_uid, why);
    mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
    return true;
  }
  if (where != MBD_BDUR_MOVING || !r->orig) return false;
  if (r->crashes >= POISON_CRASHES) {
    snprintf(msg, sizeof msg,
             "not re-sent: workers %s and %s both died while running this %s of a re-homed "
             "session, so it may be what kills them (a poison request)",
             r->crashed_on[0], r->crashed_on[1], mbd_cmd_name(r->cmd));
    c->st.poisoned++;
    mbd_bcore_req_fail(c, r, MBD_E_WORKER_LOST, msg);
    return true;
  }
  r->retried = true;
  if (r->internal && mbd_bcore_place(c, r)) return true;
  /* Oldest first at the queue head: a session's STEPs must reach its new worker in order. */
  if (*last) mbd_bcore_q_insert_before(c, r, (*last)->qnext);
  else mbd_bcore_q_push(c, r, true);
  *last = r;
  return true;
}

void mbd_brehome_wake(mbd_bcore *c) {
  if (!c->wake) return;
  c->wake = false;
  for (breq *r = c->qhead; r;) {
    breq *next = r->qnext;
    const char *uid, *wid, *why;
    if (r->is_session && mbd_bdurable_locate(c->durable, r->session_id, r->caller, &uid, &wid,
                                             &why) == MBD_BDUR_LOST) {
      mbd_bcore_q_del(c, r);
      mbd_bcore_place(c, r); /* answers it with the reason */
    }
    r = next;
  }
  mbd_bcore_drain(c);
}

void mbd_brehome_reply(mbd_bcore *c, breq *r, const mbd_bworker *w, const mbd_msg *m) {
  char wid[2 * MBD_BW_UID_MAX] = "", msg[MBD_ERROR_MSG_MAX] = "";
  mbd_body *body = NULL;
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  if (!mbd_body_parse(b, blen, &body, NULL)) {
    mbd_obj_str(mbd_body_root(body), "session", false, wid, sizeof wid, NULL);
    mbd_obj_str(mbd_body_root(body), "message", false, msg, sizeof msg, NULL);
  }
  mbd_body_destroy(&body);
  if (mbd_msg_cmd(m) == MBD_CMD_FINAL && wid[0]) {
    mbd_bdurable_restored(c->durable, r->session_id, w->uid, wid);
  } else {
    char why[MBD_ERROR_MSG_MAX + MBD_BW_NAME_MAX + 64];
    snprintf(why, sizeof why, "worker %s refused the restore: %s", w->name, msg);
    mbd_bdurable_failed(c->durable, r->session_id, why, c->now_ms);
  }
  c->wake = true;
}

void mbd_brehome_start(mbd_bcore *c, const char *uid, const char *name) {
  mbd_bdurable_rehome(c->durable, uid, name, restore_place, c, c->now_ms);
}

bool mbd_brehome_held(mbd_bcore *c, const breq *r) {
  const char *uid, *wid, *why;
  return r->is_session &&
         mbd_bdurable_locate(c->durable, r->session_id, r->caller, &uid, &wid, &why) ==
             MBD_BDUR_HOMED;
}
