/* The worker's connection to the broker, on a thread of its own so that the
 * broker always gets an answer, whatever the compute thread is doing.
 *
 * The I/O thread owns the ZeroMQ DEALER socket: it registers (READY), sends
 * HEARTBEAT every heartbeat interval, notices the broker's silence or its
 * DISCONNECT and registers again (same uid, so sessions stay reachable), and
 * relays everything else. Between it and the compute thread (the reactor,
 * worker.c) is an inproc PAIR pipe: requests and CANCELs go in, replies come
 * out, in order, without copies (frames are moved). The compute thread never
 * touches the DEALER and the I/O thread never touches the worker state: the
 * heartbeat's load and session count are published through atomics. */
#ifndef MBD_WORKER_CONN_H
#define MBD_WORKER_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/wire.h"
#include "worker/state.h"

typedef struct mbd_wconn mbd_wconn;

/* A connection for st (borrowed: options and identities, which do not change
 * while it runs) with its own ZeroMQ context; nothing is connected yet. */
int mbd_wconn_new(const mbd_wstate *st, mbd_wconn **out, mbd_error *err);
/* Stops the I/O thread if running (without DISCONNECT), closes everything;
 * NULL-safe; nulls *c. */
void mbd_wconn_destroy(mbd_wconn **c);

/* Creates the pipe, connects the DEALER to st->o.connect, sends READY
 * {device, name, uid, route, route_id, host_id, capacity, max_batch,
 * models: [{name, digest[, tokenizer_digest]}], pid} and starts the I/O
 * thread. */
int mbd_wconn_start(mbd_wconn *c, mbd_error *err);
/* Shutdown: the I/O thread sends every reply queued before this call, then
 * DISCONNECT {reason}, keeps unsent messages up to 2 s, and exits; joined
 * here. */
void mbd_wconn_stop(mbd_wconn *c, const char *reason);
/* Whether the I/O thread ended on its own (it could not re-create its socket). */
bool mbd_wconn_failed(const mbd_wconn *c, mbd_error *err);

/* Compute side. Waits up to timeout_ms (0: just looks) for a message from the
 * broker: 1 when one waits, 0 when none, MBD_E_IO when polling failed (EINTR
 * is 0). */
int mbd_wconn_poll(mbd_wconn *c, long timeout_ms, mbd_error *err);
/* Compute side: receives one waiting message without blocking (mbd_msg_recv's
 * contract, capped at st->o.max_message_bytes). */
int mbd_wconn_recv(mbd_wconn *c, mbd_msg **out, mbd_error *err);
/* Compute side: the load and session count the next HEARTBEAT reports. */
void mbd_wconn_publish(mbd_wconn *c, uint64_t load, uint64_t sessions);
/* Compute side: one msgpack value (len bytes, copied; len 0 = none) that the
 * next HEARTBEATs carry as `prefix` (the prefix cache's counters and hashes). */
void mbd_wconn_publish_prefix(mbd_wconn *c, const void *packed, size_t len);

/* Compute side, on SIGTERM: every HEARTBEAT from now on carries
 * `draining: true` (one goes out at once), so the broker sends no new work. */
void mbd_wconn_announce_draining(mbd_wconn *c);

/* mbd_wsend_fn for the compute thread (ctx is the mbd_wconn): into the pipe,
 * never blocking; the I/O thread sends it on to the broker. */
void mbd_wconn_send(void *ctx, mbd_msg **m);

#endif
