/* Session table: ids "<worker-uid>/<32 hex>", a fixed number of slots
 * (--capacity), an owner per session, per-owner limits, idle expiry. A session
 * owns one recurrent state (opaque here: the backend allocates it) and the
 * scheduler's per-session flags.
 *
 * The 32 hex digits are 128 bits from getrandom(), so an id is a capability
 * nobody can guess, and it is bound to the caller that opened it (the broker's
 * `caller.id`): a lookup by anyone else reads exactly like an id that is not
 * open (MBD_E_NOT_FOUND), so a foreign id reveals nothing. Slots are allocated
 * once at start-up; opening a session when every slot is taken, or when the
 * owner already holds its limit, is MBD_E_BUSY. */
#ifndef MBD_WORKER_SESSION_H
#define MBD_WORKER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define MBD_SESSION_ID_MAX 64 /* "<uid>/<32 hex>" incl. NUL */
#define MBD_WORKER_UID_MAX 31  /* so that uid + '/' + 32 hex + NUL fits an id */
#define MBD_SESSION_OWNER_MAX 96

typedef struct mbd_wsession {
  char id[MBD_SESSION_ID_MAX]; /* "" when the slot is free */
  char owner[MBD_SESSION_OWNER_MAX]; /* caller id of the opener ("" = anonymous) */
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
 * success only), owned by nobody yet (see mbd_wsession_own). MBD_E_BUSY when
 * full (the message gives the capacity); MBD_E_IO when no random bytes. */
int mbd_wsession_open(mbd_wsession_table *t, int model, void *state, double now,
                     mbd_wsession **out, mbd_error *err);
/* MBD_E_BUSY when `owner` already holds `limit` sessions (limit <= 0: no
 * limit): checked before opening one for it. */
int mbd_wsession_admit(const mbd_wsession_table *t, const char *owner, int limit, mbd_error *err);
/* Binds s to `owner` (NULL = ""). */
void mbd_wsession_own(mbd_wsession *s, const char *owner);
/* Sessions held by `owner`. */
size_t mbd_wsession_count_owned(const mbd_wsession_table *t, const char *owner);
/* Looks an id up; MBD_E_NOT_FOUND (closed, expired, or another worker's id) or
 * MBD_E_INVALID (malformed) with a message naming the id. No owner check: for
 * the worker's own bookkeeping. */
int mbd_wsession_find(mbd_wsession_table *t, const char *id, mbd_wsession **out, mbd_error *err);
/* Looks an id up for a request from `owner` (NULL = ""): a session of another
 * owner is MBD_E_NOT_FOUND with the same message as a closed one. */
int mbd_wsession_find_for(mbd_wsession_table *t, const char *id, const char *owner,
                          mbd_wsession **out, mbd_error *err);
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
