/* The gateway's shared context: options, the models it serves (each with its
 * tokenizer and chat template), a pool of broker clients (libmambad clients
 * are single-threaded: one per request at a time), the metrics, and a cached
 * view of which workers serve what (the broker's STATUS, at most ~1 s old). */
#ifndef MBD_GW_GATEWAY_H
#define MBD_GW_GATEWAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/gateway/chat.h"
#include "client/gateway/errors.h"
#include "client/gateway/metrics.h"
#include "client/mambad.h"
#include "common/tokenizer/tokenizer.h"

#define GW_MAX_MODELS 32

typedef struct gw_options {
  char connect[256];   /* broker clients endpoint */
  char host[64];       /* listen address ("127.0.0.1") */
  int port;            /* listen port */
  size_t max_body;     /* request body cap in bytes (default 1 MiB) */
  int conn_timeout_s;  /* idle connection timeout (default 30) */
  int max_conns;       /* open connections at once (default 256) */
  int max_running;     /* generations in flight at once (default 64) */
  int max_waiting;     /* requests waiting for a slot before 429 (default 256) */
  int64_t deadline_ms; /* per request (default 120000) */
  int chunk_tokens;    /* tokens per GENERATE (default 16): how soon stops take effect */
} gw_options;

typedef struct gw_model {
  char name[64];         /* catalogue name = the request's `model` */
  char dir[1024];        /* checkpoint directory */
  mbd_tokenizer *tok;    /* owned */
  gw_chat_template chat; /* GW_CHAT_NONE when the directory has none we can render */
  int32_t eos;           /* end-of-text id added to every stop list, -1 when none */
} gw_model;

typedef struct gw_client_pool gw_client_pool;

typedef struct gw_ctx {
  gw_options opt;
  size_t n_models;
  gw_model models[GW_MAX_MODELS];
  gw_metrics *metrics;
  gw_client_pool *pool;
  pthread_mutex_t mu; /* guards the slots */
  pthread_cond_t slot_cv;
  int running;               /* generations holding a slot */
  pthread_mutex_t status_mu; /* guards the status cache and its client */
  mbd_client *status_client; /* STATUS only, short deadline (owned; made on first use) */
  atomic_bool stopping;      /* shutting down: generations end at their next chunk */
  int streams;               /* stream threads running (under mu) */
  pthread_cond_t streams_cv; /* signalled when a stream thread ends */
  mbd_status_report *status; /* last STATUS (owned), NULL when the broker did not answer */
  int64_t status_ms;         /* when it was fetched (monotonic ms), 0 = never */
} gw_ctx;

int64_t gw_now_ms(void);
double gw_now_s(void);

/* The model named `name`, or NULL. */
gw_model *gw_find_model(gw_ctx *g, const char *name);
int gw_model_index(const gw_ctx *g, const gw_model *m);

/* Borrow / return a broker client (creates one when the pool is empty). */
mbd_client *gw_client_get(gw_ctx *g, mbd_error *err);
void gw_client_put(gw_ctx *g, mbd_client *c);
gw_client_pool *gw_client_pool_new(void);
void gw_client_pool_destroy(gw_client_pool **p);

/* Waits for a generation slot (counts as waiting meanwhile). 429 when
 * max_waiting requests wait already, 504 when the deadline passes first. */
int gw_slot_acquire(gw_ctx *g, int64_t deadline_ms_abs, gw_err *e);
void gw_slot_release(gw_ctx *g);

/* Calls fn with a STATUS no older than max_age_ms (refetched otherwise), or
 * with NULL when the broker does not answer. fn runs under the context's
 * lock: it must not call back into the gateway. */
typedef void (*gw_status_fn)(void *user, const mbd_status_report *r);
void gw_status_use(gw_ctx *g, int64_t max_age_ms, gw_status_fn fn, void *user);

/* Whether the model can be served: some live worker serves it and none
 * serves another tokenizer than the one loaded. Fills e (503) when not. */
int gw_model_check(gw_ctx *g, const gw_model *m, gw_err *e);

#endif
