/* The broker process's reactor: two ROUTER sockets (clients, workers), one
 * thread, poll(2) on their ZMQ_FDs with a timeout from the core's next timer; every handler
 * runs to completion without blocking (sends use ZMQ_DONTWAIT). */
#ifndef MBD_BROKER_H
#define MBD_BROKER_H

#include <signal.h>

#include "broker/core.h"

typedef struct mbd_broker mbd_broker;

/* Creates the ZeroMQ context and binds both sockets. MBD_E_IO naming the
 * endpoint when a bind fails (address in use, bad endpoint). */
int mbd_broker_new(const mbd_broker_config *cfg, mbd_broker **out, mbd_error *err);
void mbd_broker_destroy(mbd_broker **b);

/* Serves until *stop becomes non-zero (a signal handler sets it), then stops
 * accepting, answers queued requests with ERROR BUSY, gives in-flight requests
 * up to `grace_ms` to finish, answers the rest, tells workers DISCONNECT, and
 * returns 0. MBD_E_IO if polling fails for a reason other than EINTR. */
int mbd_broker_run(mbd_broker *b, volatile sig_atomic_t *stop, int grace_ms, mbd_error *err);

/* The core, for inspection (tests, status). */
mbd_bcore *mbd_broker_core(mbd_broker *b);

#endif
