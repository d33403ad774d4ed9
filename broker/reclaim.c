/* Tracked sessions of local clients, swept when their process is gone. */
#include "broker/reclaim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rsess {
  char id[128];
  char worker_uid[64];
  char caller[96];
  int64_t pid;
  struct rsess *next;
} rsess;

struct mbd_breclaim {
  rsess *head;
  size_t n;
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
                         const char *caller, int64_t pid) {
  if (!r || pid <= 0 || r->n >= MBD_RECLAIM_MAX || strlen(id) >= sizeof r->head->id) return;
  rsess *s = calloc(1, sizeof *s);
  if (!s) return; /* untracked: the idle timer still reclaims it */
  snprintf(s->id, sizeof s->id, "%s", id);
  snprintf(s->worker_uid, sizeof s->worker_uid, "%s", worker_uid);
  snprintf(s->caller, sizeof s->caller, "%s", caller);
  s->pid = pid;
  s->next = r->head;
  r->head = s;
  r->n++;
}

void mbd_breclaim_closed(mbd_breclaim *r, const char *id) {
  if (!r) return;
  for (rsess **p = &r->head; *p; p = &(*p)->next) {
    if (strcmp((*p)->id, id)) continue;
    rsess *s = *p;
    *p = s->next;
    free(s);
    r->n--;
    return;
  }
}

size_t mbd_breclaim_sweep(mbd_breclaim *r, bool (*alive)(int64_t pid),
                          void (*close)(void *ctx, const char *id, const char *worker_uid,
                                        const char *caller),
                          void *ctx) {
  size_t k = 0;
  for (rsess **p = r ? &r->head : NULL; p && *p;) {
    rsess *s = *p;
    if (alive(s->pid)) {
      p = &s->next;
      continue;
    }
    *p = s->next;
    r->n--;
    close(ctx, s->id, s->worker_uid, s->caller);
    free(s);
    k++;
  }
  return k;
}

size_t mbd_breclaim_count(const mbd_breclaim *r) { return r ? r->n : 0; }
