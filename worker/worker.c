/* The worker's compute thread: creates the backend, the state and the
 * models, then polls the pipe from the I/O thread, drains requests into the
 * handlers, ticks the scheduler, expires idle sessions, and drains on
 * SIGTERM. See worker.h. */
#include "worker/worker.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "common/wire.h"
#include "kernels/backend.h"
#include "worker/conn.h"
#include "worker/checkpoint.h"
#include "worker/handlers.h"
#include "worker/prefix_job.h"
#include "worker/reply.h"
#include "worker/scheduler.h"
#include "worker/state.h"

#define LOGC MBD_WSTATE_LOG
#define DRAIN_MAX 256    /* messages handled per tick before computing */
#define IDLE_POLL_MS 50L /* longest wait for a message while no work is pending */
#define DRAIN_QUIET_S 0.1 /* draining ends this long after the last message, with no work left */

struct mbd_worker {
  mbd_wstate *st;  /* everything the handlers and the scheduler share */
  mbd_wconn *conn; /* while mbd_worker_run runs (its I/O thread talks to the broker) */
  uint64_t pfx_version; /* prefix cache version last published (+1, so 0 = never) */
};

/* Hands the prefix cache's counters and hashes to the heartbeat when they changed. */
static void publish_prefix(mbd_worker *w) {
  uint64_t v = mbd_wpfx_version(w->st) + 1;
  if (v == w->pfx_version) return;
  w->pfx_version = v;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  if (mbd_wpfx_pack(w->st, &pk)) mbd_wconn_publish_prefix(w->conn, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
}

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
  mbd_backend_opts bo = {.mode = o->mode, .policy = o->policy, .state = o->state,
                         .threads = o->threads,
                         .state_capacity = o->sessions, .device = o->device,
                         .max_batch = o->max_batch};
  bo.progress = &k_load_progress;
  if ((rc = mbd_backend_new(o->backend, &bo, &be, err))) goto fail;
  if ((rc = mbd_wstate_new(o, &be, now_s, NULL, drop_send, NULL, &w->st, err))) goto fail;
  if ((rc = mbd_wmodels_load(w->st, o, err))) goto fail;
  /* A step's replies go out while the next step computes; a checkpointing
   * worker keeps them in order with its checkpoints instead (a checkpoint
   * covers only tokens already replied). */
  w->st->pipeline = o->overlap_steps && !mbd_wckpt_enabled(w->st);
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

/* Drains waiting messages from the I/O thread: requests to the handlers,
 * CANCEL to the scheduler. Returns how many it took. */
static int drain(mbd_worker *w) {
  for (int k = 0; k < DRAIN_MAX; k++) {
    mbd_msg *m = NULL;
    mbd_error e = {0};
    int rc = mbd_wconn_recv(w->conn, &m, &e);
    if (rc == MBD_E_IO || (rc && !m)) return k; /* nothing more */
    if (rc) { /* malformed: answer with the tag when readable */
      uint64_t tag = mbd_msg_tag(m);
      MBD_LOGW(LOGC, "malformed message from broker: %s", e.msg);
      if (tag) mbd_wreply_err(w->st, tag, &e);
      mbd_msg_destroy(&m);
      continue;
    }
    uint8_t cmd = mbd_msg_cmd(m);
    if (cmd == MBD_CMD_CANCEL) {
      if (mbd_wsched_cancel(w->st, mbd_msg_tag(m), MBD_E_CANCELLED,
                            "cancelled (by the client, or because it went away)"))
        MBD_LOGD(LOGC, "cancelled ticket %" PRIu64, mbd_msg_tag(m));
    } else if (mbd_cmd_is_request(cmd) && cmd != MBD_CMD_STATUS) {
      mbd_whandle_request(w->st, m);
    } else {
      mbd_wreply_error(w->st, mbd_msg_tag(m), MBD_E_PROTOCOL,
                       "workers accept request commands only");
    }
    mbd_msg_destroy(&m);
  }
  return DRAIN_MAX;
}

int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err) {
  mbd_wstate *st = w->st;
  int rc = mbd_wconn_new(st, &w->conn, err);
  if (rc) return rc;
  st->send = mbd_wconn_send;
  st->send_ctx = w->conn;
  if ((rc = mbd_wconn_start(w->conn, err))) goto done;
  double next_expire = mbd_wstate_now(st) + 1.0, drain_end = 0, last_msg = 0;
  bool busy = false;
  for (;;) {
    double t = mbd_wstate_now(st);
    if (*stop && !st->draining) {
      st->draining = true;
      mbd_wconn_announce_draining(w->conn);
      drain_end = t + st->o.drain_ms / 1000.0;
      last_msg = t;
      MBD_LOGI(LOGC, "%s: stopping; finishing started work for up to %d ms", st->o.name,
               st->o.drain_ms);
      char why[160];
      snprintf(why, sizeof why, "worker %s is shutting down (SIGTERM): generation stopped",
               st->o.name);
      mbd_wsched_stop_generates(st, why);
    }
    /* Draining ends at drain_end, or earlier once no work is left and the
     * requests the broker sent before it heard of the drain had time to come. */
    if (st->draining && (t >= drain_end || (!mbd_wsched_pending(st) && t - last_msg >= DRAIN_QUIET_S)))
      break;
    if (mbd_wconn_failed(w->conn, err)) {
      rc = err->code ? err->code : MBD_E_IO;
      break;
    }
    /* The poll also bounds how long a stop waits to be seen while idle. */
    int pr = mbd_wconn_poll(w->conn, busy ? 0 : IDLE_POLL_MS, err);
    if (pr < 0) {
      rc = pr;
      break;
    }
    if (pr > 0 && drain(w) > 0) last_msg = mbd_wstate_now(st);
    bool was_busy = busy;
    busy = mbd_wsched_tick(st);
    if (was_busy && !busy) mbd_wsched_report(st);
    mbd_wconn_publish(w->conn, mbd_wsched_load(st), (uint64_t)mbd_wsession_count(st->sessions));
    publish_prefix(w);
    t = mbd_wstate_now(st);
    if (t >= next_expire) {
      size_t n = mbd_wsched_expire(st);
      if (n) MBD_LOGI(LOGC, "closed %zu idle session(s)", n);
      next_expire = t + 1.0;
    }
  }
  if (!rc) {
    char why[160];
    snprintf(why, sizeof why,
             "worker %s shut down (SIGTERM) before this request finished (drain period %d ms): "
             "resend it",
             st->o.name, st->o.drain_ms);
    mbd_wsched_fail_pending(st, why);
    /* Requests that came after the drain period: answered, not left unread. */
    while (drain(w) > 0) mbd_wsched_fail_pending(st, why);
    mbd_wconn_stop(w->conn, "shutdown");
    MBD_LOGI(LOGC, "%s: shut down after %" PRIu64 " requests", st->o.name, st->served);
  }
done:
  st->send = drop_send;
  st->send_ctx = NULL;
  mbd_wconn_destroy(&w->conn);
  return rc;
}
