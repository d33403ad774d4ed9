/* Session table: fixed slots, random ids bound to an owner, idle expiry. */
#include "worker/session.h"

#include <errno.h>
#include <inttypes.h>
#include <sys/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mbd_wsession_table {
  char uid[MBD_WORKER_UID_MAX]; /* id prefix */
  size_t uid_len;
  mbd_wsession *slots; /* capacity entries; id[0] == '\0' = free */
  size_t capacity;
  size_t count;     /* open sessions */
  mbd_wsession_free_fn free_fn;
  void *free_ctx;
};

int mbd_wsession_table_new(const char *uid, size_t capacity, mbd_wsession_free_fn free_fn,
                          void *free_ctx, mbd_wsession_table **out, mbd_error *err) {
  *out = NULL;
  size_t n = uid ? strlen(uid) : 0;
  if (n == 0 || n >= MBD_WORKER_UID_MAX || strchr(uid, '/'))
    return mbd_error_set(err, MBD_E_INVALID, "worker uid must be 1..%d characters without '/'",
                         MBD_WORKER_UID_MAX - 1);
  if (capacity == 0) return mbd_error_set(err, MBD_E_INVALID, "session capacity must be >= 1");
  mbd_wsession_table *t = calloc(1, sizeof *t);
  if (!t) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the session table");
  t->slots = calloc(capacity, sizeof *t->slots);
  if (!t->slots) {
    free(t);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for %zu session slots", capacity);
  }
  memcpy(t->uid, uid, n + 1);
  t->uid_len = n;
  t->capacity = capacity;
  t->free_fn = free_fn;
  t->free_ctx = free_ctx;
  *out = t;
  return MBD_OK;
}

void mbd_wsession_close(mbd_wsession_table *t, mbd_wsession *s) {
  if (!s || !s->id[0]) return;
  if (t->free_fn) t->free_fn(t->free_ctx, s);
  memset(s, 0, sizeof *s);
  t->count--;
}

void mbd_wsession_table_destroy(mbd_wsession_table **pt) {
  if (!pt || !*pt) return;
  mbd_wsession_table *t = *pt;
  for (size_t i = 0; i < t->capacity; i++) mbd_wsession_close(t, &t->slots[i]);
  free(t->slots);
  free(t);
  *pt = NULL;
}

int mbd_wsession_open(mbd_wsession_table *t, int model, void *state, double now,
                     mbd_wsession **out, mbd_error *err) {
  *out = NULL;
  for (size_t i = 0; i < t->capacity; i++) {
    mbd_wsession *s = &t->slots[i];
    if (s->id[0]) continue;
    uint8_t rnd[16];
    size_t got = 0;
    while (got < sizeof rnd) {
      ssize_t r = getrandom(rnd + got, sizeof rnd - got, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return mbd_error_set(err, MBD_E_IO, "no random bytes for a session id: %s",
                             strerror(errno));
      got += (size_t)r;
    }
    memset(s, 0, sizeof *s);
    char hex[33];
    for (int k = 0; k < 16; k++) snprintf(hex + 2 * k, 3, "%02x", rnd[k]);
    snprintf(s->id, sizeof s->id, "%s/%s", t->uid, hex);
    s->model = model;
    s->state = state;
    s->last_used = now;
    t->count++;
    *out = s;
    return MBD_OK;
  }
  return mbd_error_set(err, MBD_E_BUSY,
                       "all %zu session slots are in use: close idle sessions or start the "
                       "worker with a larger --sessions",
                       t->capacity);
}

int mbd_wsession_admit(const mbd_wsession_table *t, const char *owner, int limit, mbd_error *err) {
  if (limit <= 0 || mbd_wsession_count_owned(t, owner) < (size_t)limit) return MBD_OK;
  return mbd_error_set(err, MBD_E_BUSY,
                       "this client already holds %d sessions on this worker (the per-client "
                       "limit, --client-sessions): close some first",
                       limit);
}

void mbd_wsession_own(mbd_wsession *s, const char *owner) {
  snprintf(s->owner, sizeof s->owner, "%s", owner ? owner : "");
}

size_t mbd_wsession_count_owned(const mbd_wsession_table *t, const char *owner) {
  size_t n = 0;
  for (size_t i = 0; i < t->capacity; i++)
    n += t->slots[i].id[0] && !strcmp(t->slots[i].owner, owner ? owner : "");
  return n;
}

int mbd_wsession_find_for(mbd_wsession_table *t, const char *id, const char *owner,
                          mbd_wsession **out, mbd_error *err) {
  int rc = mbd_wsession_find(t, id, out, err);
  if (rc) return rc;
  if (!strcmp((*out)->owner, owner ? owner : "")) return MBD_OK;
  *out = NULL;
  return mbd_error_set(err, MBD_E_NOT_FOUND,
                       "session '%s' is not open (closed, or expired after being idle)", id);
}

int mbd_wsession_find(mbd_wsession_table *t, const char *id, mbd_wsession **out, mbd_error *err) {
  *out = NULL;
  size_t n = id ? strnlen(id, MBD_SESSION_ID_MAX) : 0;
  if (n == 0 || n >= MBD_SESSION_ID_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "session id is empty or longer than %d characters",
                         MBD_SESSION_ID_MAX - 1);
  if (n <= t->uid_len + 1 || memcmp(id, t->uid, t->uid_len) || id[t->uid_len] != '/')
    return mbd_error_set(err, MBD_E_NOT_FOUND,
                         "session '%s' does not belong to this worker (uid %s): it was opened "
                         "elsewhere or the worker restarted",
                         id, t->uid);
  for (size_t i = 0; i < t->capacity; i++) {
    if (t->slots[i].id[0] && !strcmp(t->slots[i].id, id)) {
      *out = &t->slots[i];
      return MBD_OK;
    }
  }
  return mbd_error_set(err, MBD_E_NOT_FOUND,
                       "session '%s' is not open (closed, or expired after being idle)", id);
}

size_t mbd_wsession_expire(mbd_wsession_table *t, double now, double idle_s) {
  if (idle_s <= 0) return 0;
  size_t n = 0;
  for (size_t i = 0; i < t->capacity; i++) {
    mbd_wsession *s = &t->slots[i];
    if (s->id[0] && !s->busy && now - s->last_used > idle_s) {
      mbd_wsession_close(t, s);
      n++;
    }
  }
  return n;
}

size_t mbd_wsession_count(const mbd_wsession_table *t) { return t->count; }
size_t mbd_wsession_capacity(const mbd_wsession_table *t) { return t->capacity; }

mbd_wsession *mbd_wsession_at(mbd_wsession_table *t, size_t i) {
  return (i < t->capacity && t->slots[i].id[0]) ? &t->slots[i] : NULL;
}
