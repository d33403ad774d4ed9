/* Broker core: the request state machine (routing, queue, deadlines,
 * heartbeats, failover) with no sockets. The reactor (broker.c) feeds it
 * received messages and the clock and gives it a send callback; tests do the
 * same with a fake clock and a callback that records messages, so every
 * routing decision is testable without ZeroMQ sockets. */
#ifndef MBD_BROKER_CORE_H
#define MBD_BROKER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/durable.h"
#include "broker/registry.h"
#include "common/status.h"
#include "common/wire.h"

#define MBD_BROKER_EP_MAX 256

/* Broker settings (command line: broker/main.c). */
typedef struct mbd_broker_config {
  char clients_ep[MBD_BROKER_EP_MAX]; /* ROUTER bound for clients */
  char workers_ep[MBD_BROKER_EP_MAX]; /* ROUTER bound for workers */
  int heartbeat_ms;                   /* heartbeat interval, both ways (default 1000) */
  int liveness;                       /* intervals of silence before a worker is dropped (3) */
  int queue_limit;                    /* requests waiting for capacity (1024); full -> BUSY */
  int64_t queue_mb;                   /* bytes (body + payloads) those may hold, MiB (512) */
  int64_t max_message_mb;             /* ZMQ_MAXMSGSIZE and receive cap, MiB (2048) */
  int64_t default_deadline_ms;        /* when a request names none (60000) */
  int hwm;                            /* SNDHWM/RCVHWM per socket (0 = 10000) */
  /* --default-digest NAME=DIGEST: unpinned requests for NAME get only these weights */
  struct {
    char name[MBD_BW_NAME_MAX];
    char digest[MBD_BW_DIGEST_MAX];
  } defaults[MBD_BW_DEFAULTS_MAX];
  int ndefaults;
  char curve_secret[512];             /* --curve-secret FILE: the broker's CURVE key pair ("" = none) */
  char client_keys[1024];             /* --client-keys SPEC: admitted client public keys */
  char worker_keys[1024];             /* --worker-keys SPEC: admitted worker public keys */
  char operator_keys[1024];           /* --operator-keys SPEC: clients who see STATUS detail */
  bool insecure_clients;              /* --insecure clients: tcp clients endpoint without CURVE */
  bool insecure_workers;              /* --insecure workers */
  char ipc_group[64];                 /* --ipc-group: group that may reach ipc sockets ("" = none) */
  int client_inflight;                /* unanswered requests one caller may have (1024); more -> BUSY */
  int reclaim_grace_ms;               /* --reclaim-grace-ms: a session's connection stays gone
                                         this long before the broker closes the session (5000) */
  int64_t durable_mb;                 /* --durable-mb: session checkpoints held, MiB (1024; 0 = none) */
} mbd_broker_config;

void mbd_broker_config_defaults(mbd_broker_config *c);
/* Parses argv (see mambad-broker --help); MBD_E_INVALID naming the bad option. */
int mbd_broker_config_parse(int argc, char **argv, mbd_broker_config *c, mbd_error *err);

/* Where a message goes. */
typedef enum mbd_bdest { MBD_BDEST_CLIENT = 0, MBD_BDEST_WORKER = 1 } mbd_bdest;
/* Sends and destroys *m (like mbd_msg_send, ZMQ_DONTWAIT). Returns 0 or a
 * status; MBD_E_NOT_FOUND means the peer is gone. Must not call back into the core. */
typedef int (*mbd_bcore_send_fn)(void *ctx, mbd_bdest dest, mbd_msg **m, mbd_error *err);

/* Whether the client at routing id `id` is still connected, found without
 * delivering anything it would read as a message (broker.c: an empty frame
 * under ROUTER_MANDATORY). Returns MBD_E_NOT_FOUND when it is gone. */
typedef int (*mbd_bcore_probe_fn)(void *ctx, const void *id, size_t len);

typedef struct mbd_bcore_stats {
  uint64_t requests;        /* client requests accepted for routing or STATUS */
  uint64_t forwarded;       /* sends to workers (re-sends included) */
  uint64_t replies;         /* worker replies forwarded to clients */
  uint64_t errors;          /* ERROR replies the broker itself sent to clients */
  uint64_t no_route, busy, timeouts, worker_lost;
  uint64_t busy_count, busy_bytes; /* BUSY because the queue was full by count / by bytes */
  uint64_t ambiguous;       /* unpinned requests refused: their model name had two digests */
  uint64_t failovers;       /* stateless requests re-sent after a worker loss */
  uint64_t late_dropped;    /* worker replies for tickets no longer live */
  uint64_t malformed;       /* malformed messages from clients or workers */
  uint64_t workers_joined, workers_lost;
  uint64_t cancelled;       /* requests stopped by CANCEL or because their client went away */
  uint64_t clients_gone;    /* client connections found gone with requests pending */
  uint64_t poisoned;        /* requests not re-sent after killing POISON_CRASHES workers */
} mbd_bcore_stats;

typedef struct mbd_bcore mbd_bcore;

/* A broker core with configuration cfg (copied) that sends every outgoing
 * message through send(ctx, ...); it owns no sockets (tests drive it directly). */
int mbd_bcore_new(const mbd_broker_config *cfg, mbd_bcore_send_fn send, void *ctx,
                  mbd_bcore **out, mbd_error *err);
/* Sets the client probe of mbd_bcore_on_disconnect (without one, clients are
 * probed with a HEARTBEAT message, which libmambad ignores). */
void mbd_bcore_set_probe(mbd_bcore *c, mbd_bcore_probe_fn probe);
/* Frees queued and in-flight state without sending anything. */
void mbd_bcore_destroy(mbd_bcore **c);

/* A message from the clients socket: recv_rc/recv_err are mbd_msg_recv's result
 * (malformed messages get an ERROR reply). Takes *m (set to NULL). */
void mbd_bcore_on_client(mbd_bcore *c, mbd_msg **m, int recv_rc, const mbd_error *recv_err,
                         int64_t now_ms);
/* A message from the workers socket (malformed ones are logged and dropped). */
void mbd_bcore_on_worker(mbd_bcore *c, mbd_msg **m, int recv_rc, const mbd_error *recv_err,
                         int64_t now_ms);
/* A socket reported a closed connection (ZMQ_EVENT_DISCONNECTED) on `side`:
 * the peers of that side are probed (a HEARTBEAT each, a few times over the
 * next second); one that can no longer be reached is gone. A gone client has
 * its queued requests dropped and its in-flight ones cancelled on their
 * workers (CANCEL); a gone worker is dropped with failover, without waiting
 * for its heartbeats to stop. */
void mbd_bcore_on_disconnect(mbd_bcore *c, mbd_bdest side, int64_t now_ms);
/* Timers: heartbeats out, silent workers dropped (with failover), deadlines. */
void mbd_bcore_tick(mbd_bcore *c, int64_t now_ms);
/* Milliseconds until the next tick is due (>= 0). */
int64_t mbd_bcore_next_due(const mbd_bcore *c, int64_t now_ms);

/* Shutdown, step 1: new requests get ERROR BUSY, queued ones are answered with
 * ERROR BUSY; in-flight ones may still finish. */
void mbd_bcore_shutdown(mbd_bcore *c, int64_t now_ms);
/* Shutdown, step 2: in-flight requests answered with ERROR WORKER_LOST, workers
 * sent DISCONNECT. */
void mbd_bcore_abort(mbd_bcore *c, int64_t now_ms);

size_t mbd_bcore_queue_len(const mbd_bcore *c);
/* Requests not yet answered (queued or in flight). */
size_t mbd_bcore_pending(const mbd_bcore *c);
const mbd_bcore_stats *mbd_bcore_get_stats(const mbd_bcore *c);
mbd_registry *mbd_bcore_registry(mbd_bcore *c);
/* Durable sessions' counters (re-homed sessions, replayed tokens, ...). */
const mbd_bdurable_stats *mbd_bcore_durable_stats(const mbd_bcore *c);

#endif
