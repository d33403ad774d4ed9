/* mambad-worker: parses the command line, loads the models (fail fast), then
 * serves the broker until SIGTERM/SIGINT. Exit 0 on a clean shutdown, 2 on bad
 * options, 1 on start-up failures. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "worker/worker.h"

static volatile sig_atomic_t g_stop; /* set by SIGTERM/SIGINT, read by the reactor */

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
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
