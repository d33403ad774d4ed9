/* mambad-worker: parses the command line, loads the models (fail fast), then
 * serves the broker until SIGTERM/SIGINT. Exit 0 on a clean shutdown, 2 on bad
 * options, 1 on start-up failures. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "common/log.h"
#include "common/protocol.h"
#include "common/wire.h"
#include "worker/worker.h"

static volatile sig_atomic_t g_stop; /* set by SIGTERM/SIGINT, read by the reactor */

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

/* Tells the broker, best effort, why this worker could not start: a
 * DISCONNECT {name, error, models} that `mambad status` shows for the
 * models this worker was to serve. Waits at most a second for delivery. */
static void report_start_failure(const mbd_worker_opts *o, const char *why) {
  void *ctx = zmq_ctx_new();
  void *s = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
  int linger = 1000;
  mbd_msg *m = NULL;
  if (!s || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) || zmq_connect(s, o->connect) ||
      mbd_msg_new(MBD_CMD_DISCONNECT, 0, &m, NULL))
    goto done;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  mbd_pack_kv_str(&pk, "reason", "start failed");
  mbd_pack_kv_str(&pk, "name", o->name);
  mbd_pack_kv_str(&pk, "error", why);
  mbd_pack_str(&pk, "models");
  msgpack_pack_array(&pk, (size_t)o->nmodels);
  for (int i = 0; i < o->nmodels; i++) mbd_pack_str(&pk, o->models[i].name);
  mbd_msg_take_body(m, &sb, NULL);
  msgpack_sbuffer_destroy(&sb);
  mbd_msg_send(&m, s, ZMQ_DONTWAIT, NULL);
done:
  mbd_msg_destroy(&m);
  if (s) zmq_close(s);
  if (ctx) zmq_ctx_term(ctx);
}

int main(int argc, char **argv) {
  mbd_log_init();
  mbd_error err = {0};
  mbd_worker_opts o;
  if (mbd_worker_opts_parse(argc, argv, &o, &err)) {
    fprintf(stderr, "mambad-worker: %s\n", err.msg);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  mbd_worker *w = NULL;
  if (mbd_worker_new(&o, &w, &err)) {
    fprintf(stderr, "mambad-worker: %s\n", err.msg);
    report_start_failure(&o, err.msg);
    return 1;
  }
  printf("mambad-worker %s: route %s uid %s\n", o.name, mbd_worker_route_id(w),
         mbd_worker_uid(w));
  fflush(stdout);
  int rc = mbd_worker_run(w, &g_stop, &err);
  if (rc) fprintf(stderr, "mambad-worker: %s\n", err.msg);
  mbd_worker_destroy(&w);
  return rc ? 1 : 0;
}
