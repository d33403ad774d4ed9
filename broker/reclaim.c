/* Tracked sessions, swept when their client process or connection is gone. */
#include "broker/reclaim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rsess {
  char id[128];
  char worker_uid[64];
  char caller[96];
  int64_t pid;                        /* > 0: a local process; else the connection counts */
  uint8_t conn[MBD_RECLAIM_CONN_MAX]; /* the client's routing id */
  size_t conn_len;
  int64_t gone_ms;                    /* when its connection was found gone; 0 = not */
  struct rsess *next;
} rsess;

struct mbd_breclaim {
  rsess *head;
  size_t n;
  size_t ngone; /* sessions with gone_ms set */
};

mbd_breclaim *mbd_breclaim_new(void) { return calloc(1, sizeof(mbd_breclaim)); }

void mbd_breclaim_destroy(mbd_breclaim **pr) {
  if (!pr || !*pr) return;
  for (rsess *s = (*pr)->head, *n; s; s = n) {
    n = s->next;
    free(s);
  }
  free(*pr);
  *pr = NULL;
}

void mbd_breclaim_opened(mbd_breclaim *r, const char *id, const char *worker_uid,
                         const char *caller, int64_t pid, const uint8_t *conn, size_t len) {
  if (!r || (pid <= 0 && (!len || len > MBD_RECLAIM_CONN_MAX)) || r->n >= MBD_RECLAIM_MAX ||
      strlen(id) >= sizeof r->head->id)
    return;
  rsess *s = calloc(1, sizeof *s);
  if (!s) return; /* untracked: the idle timer still reclaims it */
  snprintf(s->id, sizeof s->id, "%s", id);
  snprintf(s->worker_uid, sizeof s->worker_uid, "%s", worker_uid);
  snprintf(s->caller, sizeof s->caller, "%s", caller);
  s->pid = pid > 0 ? pid : 0;
  if (!s->pid) {
    memcpy(s->conn, conn, len);
    s->conn_len = len;
  }
  s->next = r->head;
  r->head = s;
  r->n++;
}

static void unlink_sess(mbd_breclaim *r, rsess **p) {
  rsess *s = *p;
  *p = s->next;
  r->n--;
  if (s->gone_ms) r->ngone--;
  free(s);
}

void mbd_breclaim_closed(mbd_breclaim *r, const char *id) {
  if (!r) return;
  for (rsess **p = &r->head; *p; p = &(*p)->next)
    if (!strcmp((*p)->id, id)) {
      unlink_sess(r, p);
      return;
    }
}

static bool same_conn(const rsess *s, const uint8_t *conn, size_t len) {
  return s->conn_len == len && !memcmp(s->conn, conn, len);
}

void mbd_breclaim_probe(mbd_breclaim *r, mbd_breclaim_reachable_fn reachable, void *ctx,
                        int64_t now) {
  const rsess *prev = NULL; /* sessions of one client are often adjacent: one probe for them */
  bool prev_up = true;
  for (rsess *s = r ? r->head : NULL; s; s = s->next) {
    if (s->pid || s->gone_ms) continue;
    bool up = prev && same_conn(prev, s->conn, s->conn_len) ? prev_up
                                                            : reachable(ctx, s->conn, s->conn_len);
    prev = s;
    prev_up = up;
    if (up) continue;
    s->gone_ms = now > 0 ? now : 1;
    r->ngone++;
  }
}

static bool is_key_caller(const char *caller) {
  return !strncmp(caller, "key:", 4) || !strncmp(caller, "op:", 3);
}

void mbd_breclaim_seen(mbd_breclaim *r, const char *caller, const uint8_t *conn, size_t len) {
  if (!r || !r->ngone || !is_key_caller(caller) || !len || len > MBD_RECLAIM_CONN_MAX) return;
  for (rsess *s = r->head; s && r->ngone; s = s->next) {
    if (!s->gone_ms || strcmp(s->caller, caller)) continue;
    memcpy(s->conn, conn, len);
    s->conn_len = len;
    s->gone_ms = 0;
    r->ngone--;
  }
}

size_t mbd_breclaim_sweep(mbd_breclaim *r, bool (*alive)(int64_t pid), mbd_breclaim_close_fn close,
                          void *ctx, int64_t now, int64_t grace_ms) {
  size_t k = 0;
  for (rsess **p = r ? &r->head : NULL; p && *p;) {
    rsess *s = *p;
    const char *why = s->pid && !alive(s->pid)          ? "its process has exited"
                      : s->gone_ms && now - s->gone_ms >= grace_ms ? "its connection is gone"
                                                                   : NULL;
    if (!why) {
      p = &s->next;
      continue;
    }
    close(ctx, s->id, s->worker_uid, s->caller, why);
    unlink_sess(r, p);
    k++;
  }
  return k;
}

size_t mbd_breclaim_count(const mbd_breclaim *r) { return r ? r->n : 0; }
