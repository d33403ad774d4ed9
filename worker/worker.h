/* The worker process: an I/O thread (worker/conn.h) that registers with the
 * broker, keeps heartbeats flowing and relays messages, and the compute
 * thread run here, which serves requests (worker/handlers.h) and schedules
 * the compute (worker/scheduler.h). Options are in worker/options.h, model
 * identities in worker/models.h.
 *
 * One tick of the compute thread: poll the pipe from the I/O thread (timeout
 * 0 while work is pending), drain the waiting messages (requests checked and
 * queued: STEPs, GENERATE loops attached to their session, FORWARD/PREFILL
 * as sliced jobs; CANCELs applied), then ONE batched model step per model
 * over the queued STEPs and one token of every active GENERATE (up to
 * --max-batch), then one slice of one FORWARD/PREFILL job (at most
 * --slice-tokens tokens), and idle expiry once a second. Live sessions
 * therefore wait for at most one slice, and the broker hears heartbeats
 * whatever the compute does; see docs/architecture.md. */
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
 * new requests get BUSY, GENERATE loops end with ERROR STATE, jobs and
 * queued STEPs may finish for up to --drain-ms, the rest get ERROR STATE
 * ("worker shut down"); then DISCONNECT, and it returns 0. Errors for
 * failures to set up the connection, or when the I/O thread lost it. */
int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err);

#endif
