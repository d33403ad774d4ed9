/* The batching scheduler: queued STEPs and running GENERATE loops of every
 * session, advanced by one batched backend step per model per tick, plus
 * deadlines and idle expiry. No sockets: replies leave through the state's
 * send callback (worker/reply.h) and time comes from the state's clock, so
 * tests/unit/test_worker_scheduler.c drives it with a fake backend and a
 * fake clock.
 *
 * One tick, per model: first every running GENERATE of the model (session
 * slots in round-robin order, the start moving by one slot per tick), each
 * picking its next token from its session's last logits (or taking the one
 * the backend picked on the device); then queued STEPs in arrival order, at
 * most one per session, up to max_batch rows; then ONE backend step over all
 * rows. Each STEP gets its own row's logits; each GENERATE row streams a
 * PARTIAL every partial_every tokens and ends with FINAL reason "stop" (a stop
 * token was produced: it is included and fed) or "length" (max_tokens
 * reached), or ERROR TIMEOUT when the tick starts past its deadline. A failed
 * backend step answers every request of that batch with the backend's error
 * (a GENERATE ends there) and the next tick serves again.
 *
 * Overlap (st->pipeline): the backend step is launched, not waited for; the
 * next tick waits for it, takes what its own batch needs (next tokens, which
 * loops end), launches that batch, and only then sends the first batch's
 * replies, so they are the same replies in the same order per request, sent
 * while the device computes (docs/architecture.md "Overlapped steps").
 *
 * After the batched steps, a tick runs ONE slice of one FORWARD or PREFILL
 * job (at most o.slice_tokens tokens, whole rows of a FORWARD), and that job
 * goes to the back of the job list: live sessions' steps wait for at most one
 * slice, and stateless and session work alternate tick by tick. Deadlines are
 * checked before every slice and every queued STEP: work whose answer nobody
 * waits for any more is not started. */
#ifndef MBD_WORKER_SCHEDULER_H
#define MBD_WORKER_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"
#include "worker/request.h"
#include "worker/session.h"
#include "worker/state.h"

/* Queues a STEP feeding `token` to s (already checked against the vocab);
 * its reply goes to `out` (an shm output, checked by the caller) when
 * non-NULL. MBD_E_NOMEM only. */
int mbd_wsched_step(mbd_wstate *st, mbd_wsession *s, uint64_t tag, int64_t token,
                    const mbd_tensor_ref *out, mbd_error *err);
/* The same with a deadline (clock seconds, 0 = none): a STEP still queued
 * past it is answered TIMEOUT and never computed. */
int mbd_wsched_step_until(mbd_wstate *st, mbd_wsession *s, uint64_t tag, int64_t token,
                          const mbd_tensor_ref *out, double deadline, mbd_error *err);
/* Queues a sliced FORWARD/PREFILL job (taken); a PREFILL's session must be
 * marked busy by the caller (the job frees it when it ends). */
void mbd_wsched_job(mbd_wstate *st, mbd_wjob *j);
/* Stops request `tag` wherever it is (queued STEP, job, GENERATE) and answers
 * it with ERROR code `why`; a stopped PREFILL leaves its session with the
 * tokens consumed so far. Returns false when no such request is running. */
bool mbd_wsched_cancel(mbd_wstate *st, uint64_t tag, int code, const char *why);
/* Attaches a GENERATE loop with q's fields (max_tokens, stop, sampling,
 * partial_every, deadline_ms from now) to s, which becomes busy until its
 * FINAL or ERROR. MBD_E_STATE when s has consumed no token yet, MBD_E_BUSY
 * when a STEP of s is queued, MBD_E_INVALID for bad sampling values. */
int mbd_wsched_generate(mbd_wstate *st, mbd_wsession *s, uint64_t tag, const mbd_wreq *q,
                        mbd_error *err);
/* The same for a loop that already produced done[0..ndone) (a GENERATE
 * continued after its session was re-homed; s has consumed them): it goes on
 * at token index ndone (the sampler's draw index too), PARTIALs carry only
 * new tokens, FINAL all of them. A loop already complete (ndone == max_tokens
 * or its last token a stop token) is answered FINAL at once. */
int mbd_wsched_generate_resume(mbd_wstate *st, mbd_wsession *s, uint64_t tag, const mbd_wreq *q,
                               const int64_t *done, int64_t ndone, mbd_error *err);
/* MBD_E_BUSY when a STEP of s is queued (requests that read or replace the
 * whole state must wait for it). */
int mbd_wsched_check_no_step(const mbd_wstate *st, const mbd_wsession *s, mbd_error *err);

/* Runs one batched step per model, then one slice of the oldest job (jobs
 * take turns); returns whether work remains queued. With st->pipeline the
 * last batch stays launched when the tick returns: its replies go out with
 * the next tick, after that tick has launched its own batch, so the host
 * work of one step runs while the device computes the next. */
bool mbd_wsched_tick(mbd_wstate *st);
/* Finishes the launched batch, if any: waits for it and sends its replies.
 * Whatever reads or changes a session that a launched batch steps
 * (mbd_wsess_data.inflight), or ends requests, calls this first; cancel,
 * expiry and the shutdown calls below do it themselves. */
void mbd_wsched_flush(mbd_wstate *st);
/* Logs how the last busy period's time split (device waits, host work
 * before and after each launch) when it ran 100 batches or more, and starts
 * a new one. */
void mbd_wsched_report(mbd_wstate *st);
/* Whether any STEP is queued, GENERATE running, job queued or batch launched. */
bool mbd_wsched_pending(const mbd_wstate *st);
/* The heartbeat's load: running GENERATEs, plus one when STEPs are queued. */
uint64_t mbd_wsched_load(const mbd_wstate *st);
/* Closes sessions idle for more than o.session_idle_s at the state's clock
 * (generating sessions are never idle); returns how many. A STEP queued for
 * a closed session is answered NOT_FOUND by the next tick. */
size_t mbd_wsched_expire(mbd_wstate *st);
/* Shutdown, first step: every running GENERATE ends with ERROR STATE `why`
 * (a loop's remaining length is unknown; jobs and queued STEPs are bounded
 * work and may still finish). A checkpointing worker instead hands each loop
 * over: unsent tokens as a PARTIAL, a checkpoint, and no reply, so the broker
 * continues it on another worker once this one disconnects (a loop whose
 * logits are still on the device ends with the ERROR). */
void mbd_wsched_stop_generates(mbd_wstate *st, const char *why);
/* Shutdown: every job, queued STEP and running GENERATE gets ERROR STATE `why`. */
void mbd_wsched_fail_pending(mbd_wstate *st, const char *why);

#endif
