/* The worker's connection to the broker: a ZeroMQ DEALER socket that is
 * (re)created to register (READY), carries control messages (HEARTBEAT,
 * DISCONNECT), receives requests, and is the state's send callback. Sends
 * never block the reactor. */
#ifndef MBD_WORKER_CONN_H
#define MBD_WORKER_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/wire.h"
#include "worker/state.h"

typedef struct mbd_wconn mbd_wconn;

/* A connection for st (borrowed; READY and HEARTBEAT read it) with its own
 * ZeroMQ context and no socket yet. */
int mbd_wconn_new(const mbd_wstate *st, mbd_wconn **out, mbd_error *err);
/* Closes the socket (linger as set) and the context; NULL-safe; nulls *c. */
void mbd_wconn_destroy(mbd_wconn **c);

/* (Re)creates the DEALER socket, connects to st->o.connect and sends READY
 * {device, name, uid, route, route_id, host_id, capacity, max_batch,
 * models: [{name, digest[, tokenizer_digest]}], pid}. */
int mbd_wconn_register(mbd_wconn *c, mbd_error *err);
/* HEARTBEAT {load, sessions}. */
void mbd_wconn_heartbeat(mbd_wconn *c);
/* DISCONNECT {reason}. */
void mbd_wconn_disconnect(mbd_wconn *c, const char *reason);
/* Waits up to timeout_ms (0: just looks) for a readable socket: 1 when a
 * message waits, 0 when none, MBD_E_IO when polling failed (EINTR is 0). */
int mbd_wconn_poll(mbd_wconn *c, long timeout_ms, mbd_error *err);
/* Receives one waiting message without blocking (mbd_msg_recv's contract,
 * capped at st->o.max_message_bytes). */
int mbd_wconn_recv(mbd_wconn *c, mbd_msg **out, mbd_error *err);
/* Keeps unsent messages up to ms after the socket closes (shutdown). */
void mbd_wconn_set_linger(mbd_wconn *c, int ms);

/* mbd_wsend_fn over c's socket (ctx is the mbd_wconn): ZMQ_DONTWAIT; with the
 * broker gone or stalled past the (large) send high-water mark the message
 * is dropped and logged, and the broker answers the client. */
void mbd_wconn_send(void *ctx, mbd_msg **m);

#endif
