/* SSE queue + libmicrohttpd content reader (thread-per-connection mode: the
 * reader may block, waking every 100 ms to check for a hang-up). */

#include "client/gateway/sse.h"

#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gw_sse {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled on data, end, gone and drain */
  char *buf;         /* queued bytes [head, len) */
  size_t head, len, cap;
  bool ended, gone;
  int refs;
  int fd;
  int idle_timeout_s;
};

gw_sse *gw_sse_new(int fd, int idle_timeout_s) {
  gw_sse *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  s->refs = 1;
  s->fd = fd;
  s->idle_timeout_s = idle_timeout_s > 0 ? idle_timeout_s : 30;
  return s;
}

static void wait_ms(gw_sse *s, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

int gw_sse_data(gw_sse *s, const char *json) {
  size_t n = strlen(json) + 8;
  pthread_mutex_lock(&s->mu);
  for (int waited = 0; !s->gone && s->len - s->head > GW_SSE_MAX_QUEUED; waited += 100) {
    if (waited >= s->idle_timeout_s * 1000)
      s->gone = true; /* the reader stalled: give it up */
    else
      wait_ms(s, 100);
  }
  if (s->gone) {
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  if (s->head > 0 && s->head == s->len) s->head = s->len = 0;
  if (s->len + n + 1 > s->cap) {
    if (s->head) { /* compact before growing */
      memmove(s->buf, s->buf + s->head, s->len - s->head);
      s->len -= s->head;
      s->head = 0;
    }
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n + 1) cap *= 2;
    char *q = cap > s->cap ? realloc(s->buf, cap) : s->buf;
    if (!q) {
      s->gone = true;
      pthread_mutex_unlock(&s->mu);
      return -1;
    }
    s->buf = q;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, "data: ", 6);
  memcpy(s->buf + s->len + 6, json, n - 8);
  memcpy(s->buf + s->len + n - 2, "\n\n", 2);
  s->len += n;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void gw_sse_end(gw_sse *s) {
  pthread_mutex_lock(&s->mu);
  s->ended = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

bool gw_sse_gone(gw_sse *s) {
  pthread_mutex_lock(&s->mu);
  bool g = s->gone;
  pthread_mutex_unlock(&s->mu);
  return g;
}

bool gw_peer_gone(int fd) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  int n = poll(&p, 1, 0);
  return n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max) {
  (void)pos;
  gw_sse *s = cls;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (s->gone) break;
    if (s->len > s->head) {
      size_t n = s->len - s->head < max ? s->len - s->head : max;
      memcpy(out, s->buf + s->head, n);
      s->head += n;
      pthread_cond_broadcast(&s->cv); /* room for a waiting producer */
      pthread_mutex_unlock(&s->mu);
      return (ssize_t)n;
    }
    if (s->ended) {
      pthread_mutex_unlock(&s->mu);
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (gw_peer_gone(s->fd)) {
      s->gone = true;
      pthread_cond_broadcast(&s->cv);
      break;
    }
    wait_ms(s, 100);
  }
  pthread_mutex_unlock(&s->mu);
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void release(void *cls) {
  gw_sse *s = cls;
  pthread_mutex_lock(&s->mu);
  if (!s->ended || s->len > s->head) s->gone = true; /* response torn down before the end */
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  gw_sse_unref(&s);
}

struct MHD_Response *gw_sse_response(gw_sse *s) {
  pthread_mutex_lock(&s->mu);
  s->refs++;
  pthread_mutex_unlock(&s->mu);
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, s, release);
  if (!r) {
    gw_sse *t = s;
    gw_sse_unref(&t);
    return NULL;
  }
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  return r;
}

void gw_sse_unref(gw_sse **sp) {
  if (!sp || !*sp) return;
  gw_sse *s = *sp;
  *sp = NULL;
  pthread_mutex_lock(&s->mu);
  int left = --s->refs;
  pthread_mutex_unlock(&s->mu);
  if (left) return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->buf);
  free(s);
}
