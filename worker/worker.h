/* The worker process: the single-threaded reactor that registers with the
 * broker, keeps heartbeats flowing, serves requests (worker/handlers.h) and
 * batches session steps (worker/scheduler.h). Options are in
 * worker/options.h, model identities in worker/models.h.
 *
 * One reactor tick: poll the broker socket (timeout 0 while work is pending),
 * drain every waiting message (cheap requests answered at once; STEPs queued;
 * GENERATE loops attached to their session), then run ONE batched model step
 * per model over the queued STEPs and one token of every active GENERATE (up
 * to --max-batch), send replies and partials, send a heartbeat when due, and
 * expire idle sessions. Generation therefore advances one token per tick,
 * interleaved with everything else, and heartbeats keep flowing. A FORWARD or
 * PREFILL runs inside the tick that received it (bounded by the message size
 * cap); see docs/architecture.md. */
#ifndef MBD_WORKER_WORKER_H
#define MBD_WORKER_WORKER_H

#include <signal.h>

#include "common/route.h"
#include "common/status.h"
#include "worker/models.h"
#include "worker/options.h"

typedef struct mbd_worker mbd_worker;

/* Creates the backend, loads every model (fail fast: the error names the model
 * and the directory), computes identities. No socket yet. */
int mbd_worker_new(const mbd_worker_opts *o, mbd_worker **out, mbd_error *err);
void mbd_worker_destroy(mbd_worker **w);

const mbd_route_identity *mbd_worker_route(const mbd_worker *w);
const char *mbd_worker_route_id(const mbd_worker *w);
const char *mbd_worker_uid(const mbd_worker *w);

/* Connects, registers and serves until *stop becomes nonzero (SIGTERM): then
 * finishes the in-flight batch, answers every pending request with ERROR
 * (code STATE, "worker shutting down"), sends DISCONNECT and returns 0.
 * Errors only for failures to set up the socket. */
int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err);

#endif
