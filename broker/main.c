/* mambad-broker: parses the command line, binds, serves until SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker.h"
#include "common/log.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad-broker --clients EP --workers EP [--heartbeat-ms 1000] [--liveness 3]\n"
          "                     [--queue-limit 1024] [--queue-mb 512] [--max-message-mb 2048]\n"
          "                     [--default-deadline-ms 60000] [--hwm 10000] [--client-inflight 1024]\n"
          "                     [--default-digest NAME=DIGEST]... [--reclaim-grace-ms 5000]\n"
          "                     [--ipc-group GROUP] [--curve-secret FILE] [--client-keys SPEC]\n"
          "                     [--worker-keys SPEC] [--operator-keys SPEC]\n"
          "                     [--insecure clients|workers] [--durable-mb 1024]\n"
          "Routes client requests to workers whose numeric route matches (docs/architecture.md).\n"
          "EP: ZeroMQ endpoints, e.g. tcp://*:5555 or ipc:///run/mambad/clients.\n"
          "--default-digest: requests for model NAME that pin no digest get only the weights\n"
          "whose digest starts with DIGEST (else a name served with two digests is refused).\n"
          "ipc directories must belong to the broker's uid with mode 0700 (0750 with --ipc-group);\n"
          "sockets get 0600 (0660 and the group with --ipc-group).\n"
          "--reclaim-grace-ms: sessions of a tcp client whose connection is gone are closed\n"
          "after this long, unless the same CURVE key sends a request meanwhile.\n"
          "--durable-mb: session checkpoints (from workers with --checkpoint-tokens/-ms) the\n"
          "broker holds to re-home sessions of a dead worker; 0 = none.\n"
          "tcp endpoints are CURVE servers (--curve-secret, keys from `mambad keygen`) admitting\n"
          "only the listed public keys (SPEC: a key, a file of keys, or a directory of *.pub);\n"
          "tcp without CURVE is refused unless --insecure names the endpoint. docs/security.md.\n");
}

int main(int argc, char **argv) {
  mbd_log_init();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
  }
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  mbd_error err = {0};
  if (mbd_broker_config_parse(argc, argv, &cfg, &err)) {
    fprintf(stderr, "mambad-broker: %s\n", err.msg);
    usage(stderr);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: zmq_poll returns EINTR at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  mbd_broker *b = NULL;
  if (mbd_broker_new(&cfg, &b, &err)) {
    fprintf(stderr, "mambad-broker: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr, "broker ready clients=%s workers=%s\n", cfg.clients_ep, cfg.workers_ep);
  fflush(stderr);
  int rc = mbd_broker_run(b, &g_stop, 2000, &err);
  if (rc) fprintf(stderr, "mambad-broker: %s\n", err.msg);
  mbd_broker_destroy(&b);
  return rc ? 1 : 0;
}
