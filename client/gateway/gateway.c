/* The shared context's helpers: clocks, the model table, the client pool,
 * generation slots, the cached STATUS and the per-model serving check. */
#include "client/gateway/gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL_MAX 256

struct gw_client_pool {
  pthread_mutex_t mu;
  mbd_client *idle[POOL_MAX];
  size_t n;
};

int64_t gw_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double gw_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

gw_model *gw_find_model(gw_ctx *g, const char *name) {
  for (size_t i = 0; i < g->n_models; i++)
    if (!strcmp(g->models[i].name, name)) return &g->models[i];
  return NULL;
}

int gw_model_index(const gw_ctx *g, const gw_model *m) { return m ? (int)(m - g->models) : -1; }

gw_client_pool *gw_client_pool_new(void) {
  gw_client_pool *p = calloc(1, sizeof *p);
  if (p) pthread_mutex_init(&p->mu, NULL);
  return p;
}

void gw_client_pool_destroy(gw_client_pool **pp) {
  if (!pp || !*pp) return;
  gw_client_pool *p = *pp;
  for (size_t i = 0; i < p->n; i++) mbd_client_destroy(&p->idle[i]);
  pthread_mutex_destroy(&p->mu);
  free(p);
  *pp = NULL;
}

mbd_client *gw_client_get(gw_ctx *g, mbd_error *err) {
  gw_client_pool *p = g->pool;
  pthread_mutex_lock(&p->mu);
  mbd_client *c = p->n ? p->idle[--p->n] : NULL;
  pthread_mutex_unlock(&p->mu);
  if (c) return c;
  mbd_client_options o;
  mbd_client_options_init(&o);
  o.deadline_ms = g->opt.deadline_ms;
  o.connect_ms = 2000;
  if (mbd_client_new(g->opt.connect, &o, &c, err)) return NULL;
  return c;
}

void gw_client_put(gw_ctx *g, mbd_client *c) {
  if (!c) return;
  gw_client_pool *p = g->pool;
  pthread_mutex_lock(&p->mu);
  if (p->n < POOL_MAX) {
    p->idle[p->n++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&p->mu);
  mbd_client_destroy(&c);
}

int gw_slot_acquire(gw_ctx *g, int64_t deadline_abs, gw_err *e) {
  pthread_mutex_lock(&g->mu);
  if (g->running < g->opt.max_running) {
    g->running++;
    pthread_mutex_unlock(&g->mu);
    gw_metrics_running(g->metrics, 1);
    return 0;
  }
  if (gw_metrics_waiting_now(g->metrics) >= g->opt.max_waiting) {
    pthread_mutex_unlock(&g->mu);
    return gw_err_set(e, 429, "rate_limit_error", "queue_full", NULL,
                      "the gateway's queue is full (%d generating, %d waiting): retry later",
                      g->opt.max_running, g->opt.max_waiting);
  }
  gw_metrics_waiting(g->metrics, 1);
  int rc = 0;
  while (g->running >= g->opt.max_running) {
    if (atomic_load(&g->stopping)) {
      rc = gw_err_set(e, 503, "service_unavailable", "shutting_down", NULL,
                      "the gateway is shutting down");
      break;
    }
    int64_t left = deadline_abs - gw_now_ms();
    if (left <= 0) {
      rc = gw_err_set(e, 504, "timeout", "deadline_exceeded", NULL,
                      "the request waited for a generation slot past its deadline");
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t step = left < 100 ? left : 100;
    ts.tv_nsec += (long)step * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&g->slot_cv, &g->mu, &ts);
  }
  if (rc == 0) g->running++;
  pthread_mutex_unlock(&g->mu);
  gw_metrics_waiting(g->metrics, -1);
  if (rc == 0) gw_metrics_running(g->metrics, 1);
  return rc;
}

void gw_slot_release(gw_ctx *g) {
  pthread_mutex_lock(&g->mu);
  g->running--;
  pthread_cond_signal(&g->slot_cv);
  pthread_mutex_unlock(&g->mu);
  gw_metrics_running(g->metrics, -1);
}

void gw_status_use(gw_ctx *g, int64_t max_age_ms, gw_status_fn fn, void *user) {
  pthread_mutex_lock(&g->status_mu);
  int64_t now = gw_now_ms();
  if (!g->status_ms || now - g->status_ms > max_age_ms) {
    mbd_error err = {0};
    mbd_status_report *r = NULL;
    if (!g->status_client) { /* a broker that is down costs a probe 2 s, not a request deadline */
      mbd_client_options o;
      mbd_client_options_init(&o);
      o.deadline_ms = 2000;
      o.connect_ms = 1000;
      if (mbd_client_new(g->opt.connect, &o, &g->status_client, &err)) g->status_client = NULL;
    }
    if (g->status_client && mbd_client_status(g->status_client, &r, &err)) r = NULL;
    mbd_status_report_free(&g->status);
    g->status = r;
    g->status_ms = now;
  }
  fn(user, g->status);
  pthread_mutex_unlock(&g->status_mu);
}

typedef struct check_ctx {
  const gw_model *m;
  gw_err *e;
  int rc;
} check_ctx;

static void check_fn(void *u, const mbd_status_report *r) {
  check_ctx *k = u;
  const gw_model *m = k->m;
  if (!r) {
    k->rc = gw_err_set(k->e, 503, "service_unavailable", "broker_unavailable", NULL,
                       "the broker at the gateway's --connect endpoint does not answer");
    return;
  }
  const char *want = mbd_tokenizer_digest(m->tok);
  size_t live = 0;
  for (size_t i = 0; i < r->n_workers; i++) {
    const mbd_worker_info *w = &r->workers[i];
    for (size_t j = 0; j < w->n_models; j++) {
      const mbd_model_info *mi = &w->models[j];
      if (strcmp(mi->name, m->name)) continue;
      if (mi->tokenizer_digest[0] && strcmp(mi->tokenizer_digest, want)) {
        k->rc = gw_err_set(k->e, 503, "service_unavailable", "tokenizer_mismatch", "model",
                           "worker %s serves model '%s' with tokenizer %.16s... but the gateway "
                           "loaded %.16s... from %s: text would be decoded with another "
                           "vocabulary; point both at the same model directory",
                           w->name, m->name, mi->tokenizer_digest, want, m->dir);
        return;
      }
      if (w->alive) live++;
    }
  }
  if (!live)
    k->rc = gw_err_set(k->e, 503, "service_unavailable", "no_worker", "model",
                       "no live worker serves model '%s' now", m->name);
}

int gw_model_check(gw_ctx *g, const gw_model *m, gw_err *e) {
  check_ctx k = {m, e, 0};
  gw_status_use(g, 1000, check_fn, &k);
  return k.rc;
}
