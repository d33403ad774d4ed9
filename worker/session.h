/* Session table: ids "<worker-uid>/<n>", a fixed number of slots (--capacity),
 * idle expiry. A session owns one recurrent state (opaque here: the backend
 * allocates it) and the scheduler's per-session flags.
 *
 * Slots are allocated once at start-up; opening a session when every slot is
 * taken is MBD_E_BUSY. Ids are never reused within a worker process (n counts
 * up), so a stale id from a closed session can never reach a new one. */
#ifndef MBD_WORKER_SESSION_H
#define MBD_WORKER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define MBD_SESSION_ID_MAX 64 /* "<uid>/<n>" incl. NUL */
#define MBD_WORKER_UID_MAX 40

typedef struct mbd_wsession {
  char id[MBD_SESSION_ID_MAX]; /* "" when the slot is free */
  int model;                   /* index into the worker's model registry */
  void *state;                 /* backend state, owned through the table's free callback */
  double last_used;            /* monotonic seconds of the last request */
  bool busy;                   /* a GENERATE loop runs on it: other requests get BUSY */
  void *user;                  /* scheduler data (the active generate job), borrowed */
} mbd_wsession;

typedef struct mbd_wsession_table mbd_wsession_table;

/* Called when a session's state must be released (close, expiry, destroy). */
typedef void (*mbd_wsession_free_fn)(void *ctx, mbd_wsession *s);

/* uid: the worker's unique id (no '/', at most MBD_WORKER_UID_MAX-1 chars).
 * capacity >= 1 slots. free_fn may be NULL. */
int mbd_wsession_table_new(const char *uid, size_t capacity, mbd_wsession_free_fn free_fn,
                          void *free_ctx, mbd_wsession_table **out, mbd_error *err);
/* Frees every open session through free_fn; NULL-safe; nulls *t. */
void mbd_wsession_table_destroy(mbd_wsession_table **t);

/* Takes a free slot for `model` with `state` (ownership passes to the table on
 * success only). MBD_E_BUSY when full (the message gives the capacity). */
int mbd_wsession_open(mbd_wsession_table *t, int model, void *state, double now,
                     mbd_wsession **out, mbd_error *err);
/* Looks an id up; MBD_E_NOT_FOUND (closed, expired, or another worker's id) or
 * MBD_E_INVALID (malformed) with a message naming the id. */
int mbd_wsession_find(mbd_wsession_table *t, const char *id, mbd_wsession **out, mbd_error *err);
/* Frees the session's state and the slot. */
void mbd_wsession_close(mbd_wsession_table *t, mbd_wsession *s);
/* Closes sessions idle for more than idle_s seconds (busy ones are kept);
 * returns how many were closed. idle_s <= 0 disables expiry. */
size_t mbd_wsession_expire(mbd_wsession_table *t, double now, double idle_s);

size_t mbd_wsession_count(const mbd_wsession_table *t);
size_t mbd_wsession_capacity(const mbd_wsession_table *t);
/* Slot i (0..capacity-1), NULL when free: for iteration by the scheduler. */
mbd_wsession *mbd_wsession_at(mbd_wsession_table *t, size_t i);

#endif
