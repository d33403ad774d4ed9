/* Session checkpoints for durable sessions: the worker sends each session's
 * state (the MBDSESS1 blob of EXPORT) to the broker as CHECKPOINT, so the
 * broker can re-home the session on another worker of the same route when
 * this one dies (broker/durable.h; docs/architecture.md "Durable sessions").
 *
 * When: after OPEN and IMPORT (the base), at the end of every PREFILL and
 * GENERATE that consumed tokens, and in between every --checkpoint-tokens
 * consumed tokens or --checkpoint-ms with tokens consumed since the last one.
 * The one rule the broker relies on: a checkpoint covers only tokens the
 * broker has already been told about (STEP and GENERATE replies went out
 * before it: a generating session's unsent tokens are flushed as a PARTIAL
 * first; a PREFILL is checkpointed after its FINAL), so the broker's log of
 * tokens since the last checkpoint is exactly what a restore must replay.
 *
 * Restores arrive as IMPORT with `replay` (tokens fed after the state is
 * loaded) and continued generates as GENERATE with `resume` (the tokens the
 * loop already produced); both are plain request fields, parsed here. */
#ifndef MBD_WORKER_CHECKPOINT_H
#define MBD_WORKER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/wire.h"
#include "worker/session.h"
#include "worker/state.h"

/* The session blob of s (kernels/state_blob.h: state image + last logits)
 * in *blob (malloc'ed, the caller frees) of *size bytes (a multiple of 8). */
int mbd_wckpt_blob(mbd_wstate *st, const mbd_wsession *s, void **blob, size_t *size,
                   mbd_error *err);

/* Whether this worker checkpoints (--checkpoint-tokens or --checkpoint-ms set). */
bool mbd_wckpt_enabled(const mbd_wstate *st);
/* Counts n tokens consumed by s since its last checkpoint. */
void mbd_wckpt_consumed(mbd_wsession *s, int64_t n);
/* Whether s reaches --checkpoint-tokens with `extra` more tokens (the
 * scheduler fetches a device-picked greedy row's logits on that step, so the
 * checkpoint after it has them). */
bool mbd_wckpt_due_tokens(const mbd_wstate *st, const mbd_wsession *s, int64_t extra);
/* Sends s's checkpoint now (when enabled); a failure is logged, never fatal:
 * the session stays served, only less durable. */
void mbd_wckpt_emit(mbd_wstate *st, mbd_wsession *s);
/* mbd_wckpt_emit when s consumed tokens since its last checkpoint. */
void mbd_wckpt_settle(mbd_wstate *st, mbd_wsession *s);
/* The cadence pass after a tick: every session due (tokens or ms) and not
 * inside a PREFILL gets its checkpoint; a generating one has its unsent
 * tokens flushed as a PARTIAL first. Skips sessions whose logits are behind
 * the state (a device-picked greedy loop between its token-cadence steps,
 * whose logits the scheduler fetches: see mbd_wckpt_due_tokens). */
void mbd_wckpt_tick(mbd_wstate *st);
/* Tells the broker the sessions idle expiry is about to close (CHECKPOINT
 * {session, closed: true}), so it drops their checkpoints. */
void mbd_wckpt_expiring(mbd_wstate *st, double now, double idle_s);

/* IMPORT's optional `replay` (msg's body): feeds those tokens to s (its state
 * just loaded) as one prefill; s's logits then follow the last one. Absent:
 * nothing. MBD_E_INVALID for a token outside the vocabulary. */
int mbd_wckpt_replay(mbd_wstate *st, const mbd_msg *msg, mbd_wsession *s, mbd_error *err);
/* GENERATE's optional `resume` (msg's body): the tokens the loop already
 * produced, in *out (malloc'ed, the caller frees; NULL and *n = 0 when
 * absent). MBD_E_INVALID when there are more than max_tokens or one is
 * outside [0, vocab). */
int mbd_wckpt_resume_tokens(const mbd_msg *msg, int64_t max_tokens, int64_t vocab, int64_t **out,
                            int64_t *n, mbd_error *err);

#endif
