/* Request handlers: decodes one request message (GEMM, FORWARD, OPEN,
 * PREFILL, STEP, GENERATE, EXPORT, IMPORT, CLOSE), checks its route
 * constraint, and answers it, or queues it on the scheduler (STEP, GENERATE).
 * A bad request is answered with ERROR; the worker keeps serving. */
#ifndef MBD_WORKER_HANDLERS_H
#define MBD_WORKER_HANDLERS_H

#include "common/wire.h"
#include "worker/state.h"

/* Handles request msg (borrowed; payload frames are read, not taken):
 * exactly one reply (now or from the scheduler) per request. */
void mbd_whandle_request(mbd_wstate *st, mbd_msg *msg);

#endif
