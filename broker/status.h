/* The broker's STATUS reply body: models by (name, weights, tokenizer),
 * workers that could not start, live workers (their prefix caches, sessions,
 * load), queue, counters (durable sessions' too) and the settings clients
 * need. Only packing: broker/core.c gathers the view and sends the reply. */
#ifndef MBD_BROKER_STATUS_H
#define MBD_BROKER_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "broker/core.h"
#include "common/wire.h"

/* A worker that reported it could not start (DISCONNECT with an error). */
typedef struct mbd_bstart_failure {
  char name[MBD_BW_NAME_MAX];
  char error[256];
  char models[256]; /* the models it was to serve, comma-separated */
  int64_t at_ms;
} mbd_bstart_failure;

/* What STATUS shows, borrowed from the core for one reply. */
typedef struct mbd_bstatus_view {
  mbd_registry *reg;
  const mbd_bstart_failure *failed;
  size_t nfailed;
  size_t qlen, qbytes, pending; /* queued requests, their bytes, queued + in flight */
  const mbd_bcore_stats *stats;
  const mbd_bdurable_stats *durable;
  const mbd_broker_config *cfg;
} mbd_bstatus_view;

/* True when the STATUS request's caller (the reactor's stamp) may see worker
 * uids, route encodings, hosts and pids: operator keys, and local callers
 * running as the service's uid or root. */
bool mbd_bstatus_privileged(const mbd_msg *req);

/* The reply body, a map; `full` adds the privileged fields. */
void mbd_bstatus_pack(const mbd_bstatus_view *v, bool full, int64_t now, msgpack_packer *pk);

#endif
