/* Re-homing the durable sessions of a lost worker (broker/durable.h keeps
 * their checkpoints and token logs): each session gets a restore, a request
 * of the broker's own (an IMPORT with `replay`, `internal`) placed like any
 * other on a live worker of its route and model; the session's requests wait
 * for it, and those lost in flight are queued again, oldest first, to follow
 * it to its new worker (where a GENERATE resumes). broker/core.c calls these
 * at the points named below. */
#ifndef MBD_BROKER_REHOME_H
#define MBD_BROKER_REHOME_H

#include <stdbool.h>

#include "broker/core_impl.h"

/* When worker `name` (uid) has been removed: a restore for each of its
 * durable sessions. */
void mbd_brehome_start(mbd_bcore *c, const char *uid, const char *name);

/* Whether r is a command of a durable session of its caller, homed on a live
 * worker (so the core keeps its frames for a re-send). */
bool mbd_brehome_held(mbd_bcore *c, const breq *r);

/* In fail-over: keeps r when it belongs to a durable session being re-homed
 * (it waits for the restore; a GENERATE then continues), re-places a restore
 * lost with its worker, or fails either once POISON_CRASHES workers died
 * running it. Requests go to the queue head oldest first, after *last (the
 * one this loss queued before: NULL at first), so a session's STEPs reach its
 * new worker in their order. Returns whether r was dealt with. */
bool mbd_brehome_hold(mbd_bcore *c, breq *r, breq **last);

/* A reply to a restore r from worker w: FINAL {session} homes the session
 * there, ERROR loses it. */
void mbd_brehome_reply(mbd_bcore *c, breq *r, const mbd_bworker *w, const mbd_msg *m);

/* After a restore ended (at the end of each core entry point): requests of
 * sessions now lost hear why, the others are placed once their session is
 * homed. */
void mbd_brehome_wake(mbd_bcore *c);

#endif
