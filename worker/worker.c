/* The worker reactor: creates the backend, the state and the models, then
 * polls the broker connection, drains requests into the handlers, ticks the
 * scheduler, sends heartbeats and expires idle sessions. See worker.h. */
#include "worker/worker.h"

#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "common/wire.h"
#include "kernels/backend.h"
#include "worker/conn.h"
#include "worker/handlers.h"
#include "worker/reply.h"
#include "worker/scheduler.h"
#include "worker/state.h"

#define LOGC MBD_WSTATE_LOG
#define DRAIN_MAX 256 /* messages handled per tick before computing */

struct mbd_worker {
  mbd_wstate *st;    /* everything the handlers and the scheduler share */
  mbd_wconn *conn;   /* while mbd_worker_run runs */
  double last_heard; /* clock seconds of the broker's last message */
  double next_hb;    /* when the next HEARTBEAT is due */
  mbd_error refused; /* the broker refused our READY (code != 0): fatal, never retried */
};

static double now_s(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The send callback outside mbd_worker_run: nothing can leave. */
static void drop_send(void *ctx, mbd_msg **m) {
  (void)ctx;
  MBD_LOGW(LOGC, "not connected to the broker: message dropped");
  mbd_msg_destroy(m);
}

/* Loading progress of large checkpoints (a line every 256 MiB or 5 s), logged. */
static void log_progress(void *user, const mbd_progress_info *p) {
  char line[512];
  (void)user;
  mbd_progress_format(p, line, sizeof line);
  MBD_LOGI(LOGC, "%s", line);
}

static const mbd_progress_opts k_load_progress = {.fn = log_progress,
                                                  .min_bytes = MBD_PROGRESS_MIN_BYTES,
                                                  .every_bytes = MBD_PROGRESS_EVERY_BYTES,
                                                  .every_s = MBD_PROGRESS_EVERY_S};

int mbd_worker_new(const mbd_worker_opts *o, mbd_worker **out, mbd_error *err) {
  *out = NULL;
  int rc;
  if (o->nmodels == 0)
    MBD_LOGW(LOGC, "no --model given: this worker serves GEMM requests only");
  mbd_worker *w = calloc(1, sizeof *w);
  if (!w) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the worker");
  mbd_backend *be = NULL;
  mbd_backend_opts bo = {.mode = o->mode, .policy = o->policy, .threads = o->threads,
                         .state_capacity = o->sessions, .device = o->device,
                         .max_batch = o->max_batch};
  bo.progress = &k_load_progress;
  if ((rc = mbd_backend_new(o->backend, &bo, &be, err))) goto fail;
  if ((rc = mbd_wstate_new(o, &be, now_s, NULL, drop_send, NULL, &w->st, err))) goto fail;
  if ((rc = mbd_wmodels_load(w->st, o, err))) goto fail;
  *out = w;
  return MBD_OK;
fail:
  mbd_worker_destroy(&w);
  return rc;
}

void mbd_worker_destroy(mbd_worker **pw) {
  if (!pw || !*pw) return;
  mbd_worker *w = *pw;
  mbd_wstate_destroy(&w->st);
  mbd_wconn_destroy(&w->conn);
  free(w);
  *pw = NULL;
}

const mbd_route_identity *mbd_worker_route(const mbd_worker *w) { return &w->st->route; }
const char *mbd_worker_route_id(const mbd_worker *w) { return w->st->route_id; }
const char *mbd_worker_uid(const mbd_worker *w) { return w->st->uid; }

/* (Re)registers with the broker and restarts the liveness clock. */
static int connect_broker(mbd_worker *w, mbd_error *err) {
  int rc = mbd_wconn_register(w->conn, err);
  if (rc) return rc;
  double t = mbd_wstate_now(w->st);
  w->last_heard = t;
  w->next_hb = t + w->st->o.heartbeat_ms / 1000.0;
  return MBD_OK;
}

/* Drains waiting messages; returns false when the broker asked us to re-register. */
static bool drain(mbd_worker *w) {
  for (int k = 0; k < DRAIN_MAX; k++) {
    mbd_msg *m = NULL;
    mbd_error e = {0};
    int rc = mbd_wconn_recv(w->conn, &m, &e);
    if (rc == MBD_E_IO || (rc && !m)) return true; /* nothing more */
    w->last_heard = mbd_wstate_now(w->st);
    if (rc) { /* malformed: answer with the tag when readable */
      uint64_t tag = mbd_msg_tag(m);
      MBD_LOGW(LOGC, "malformed message from broker: %s", e.msg);
      if (tag) mbd_wreply_err(w->st, tag, &e);
      mbd_msg_destroy(&m);
      continue;
    }
    uint8_t cmd = mbd_msg_cmd(m);
    if (cmd == MBD_CMD_HEARTBEAT) {
      /* liveness only */
    } else if (cmd == MBD_CMD_DISCONNECT) {
      MBD_LOGI(LOGC, "broker sent DISCONNECT: re-registering");
      mbd_msg_destroy(&m);
      return false;
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
      mbd_error_set(&w->refused, MBD_E_INVALID,
                    "the broker refused this worker's registration: %s", why);
      mbd_msg_destroy(&m);
      return false;
    } else if (mbd_cmd_is_request(cmd) && cmd != MBD_CMD_STATUS) {
      mbd_whandle_request(w->st, m);
    } else {
      mbd_wreply_error(w->st, mbd_msg_tag(m), MBD_E_PROTOCOL,
                       "workers accept request commands only");
    }
    mbd_msg_destroy(&m);
  }
  return true;
}

int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err) {
  mbd_wstate *st = w->st;
  int rc = mbd_wconn_new(st, &w->conn, err);
  if (rc) return rc;
  st->send = mbd_wconn_send;
  st->send_ctx = w->conn;
  if ((rc = connect_broker(w, err))) goto done;
  double hb = st->o.heartbeat_ms / 1000.0, next_expire = mbd_wstate_now(st) + 1.0;
  bool busy = false;
  while (!*stop) {
    double t = mbd_wstate_now(st);
    long timeout = busy ? 0 : (long)((w->next_hb - t) * 1000.0) + 1;
    if (timeout < 0) timeout = 0;
    int pr = mbd_wconn_poll(w->conn, timeout, err);
    if (pr < 0) {
      rc = pr;
      break;
    }
    if (*stop) break;
    bool ok = true;
    if (pr > 0) ok = drain(w);
    if (w->refused.code) {
      rc = mbd_error_set(err, w->refused.code, "%s", w->refused.msg);
      break;
    }
    t = mbd_wstate_now(st);
    if (!ok || t - w->last_heard > hb * st->o.liveness) {
      if (ok) MBD_LOGW(LOGC, "broker silent for %.1f s: reconnecting", t - w->last_heard);
      if ((rc = connect_broker(w, err))) break;
    }
    busy = mbd_wsched_tick(st);
    t = mbd_wstate_now(st);
    if (t >= w->next_hb) {
      mbd_wconn_heartbeat(w->conn);
      w->next_hb = t + hb;
    }
    if (t >= next_expire) {
      size_t n = mbd_wsched_expire(st);
      if (n) MBD_LOGI(LOGC, "closed %zu idle session(s)", n);
      next_expire = t + 1.0;
    }
  }
  if (!rc) {
    mbd_wsched_fail_pending(st, "worker shutting down (SIGTERM): resend the request");
    mbd_wconn_disconnect(w->conn, "shutdown");
    MBD_LOGI(LOGC, "%s: shut down after %" PRIu64 " requests", st->o.name, st->served);
    /* Let the last replies and DISCONNECT leave before the socket closes. */
    mbd_wconn_set_linger(w->conn, 2000);
  }
done:
  st->send = drop_send;
  st->send_ctx = NULL;
  mbd_wconn_destroy(&w->conn);
  return rc;
}
