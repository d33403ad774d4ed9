/* The worker's shared state: the backend, its route, the model registry, the
 * session table, the step queue and the batch buffers, plus the two things
 * the state gets from its caller: a clock and a sink for outgoing messages.
 * The worker's modules (models, reply, scheduler, handlers, conn, the
 * reactor) read this struct; it includes only the leaf modules (options,
 * request, session, shm) and none of those that read it, so the worker's
 * includes have no cycle.
 *
 * Nothing here touches a socket or the wall clock: the compute thread
 * (worker.c) passes a monotonic clock and a send callback into the pipe to
 * the I/O thread (worker/conn.h); the scheduler's unit test passes a fake
 * clock and a callback that records. Only the compute thread touches it. */
#ifndef MBD_WORKER_STATE_H
#define MBD_WORKER_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "common/status.h"
#include "common/wire.h"
#include "kernels/backend.h"
#include "kernels/model/sampler.h"
#include "worker/options.h"
#include "worker/prefix_cache.h"
#include "worker/request.h"
#include "worker/session.h"
#include "worker/shm.h"

#define MBD_WSTATE_LOG "worker" /* log tag of every worker file */

/* One loaded model. */
typedef struct mbd_wmodel {
  char name[MBD_WORKER_NAME_MAX]; /* registry name */
  char digest[65];                /* model identity (weights + config), hex SHA-256 */
  char tokenizer_digest[65];      /* hex SHA-256 of tokenizer.json; "" when the dir has none */
  mbd_bmodel *bm;                 /* loaded on the backend */
  int64_t vocab;
  mbd_sampler *sampler;           /* scratch for GENERATE sampling */
  mbd_pcache *pcache;             /* prefix state cache (worker/prefix_cache.h); NULL = off */
  mbd_backend *be;                /* the worker's backend, for the cache's device tier */
} mbd_wmodel;

/* A GENERATE loop attached to its session. */
typedef struct mbd_wgen {
  uint64_t tag;          /* broker ticket */
  mbd_sampling sampling; /* greedy or seeded */
  int64_t max_tokens;
  int64_t stop[MBD_WREQ_MAX_STOP];
  size_t nstop;
  int64_t partial_every;
  double deadline; /* clock seconds; 0 = none */
  int64_t *tokens; /* generated so far, max_tokens entries */
  int64_t n;       /* count */
  int64_t sent;    /* tokens already streamed in PARTIALs */
  int64_t next;    /* the next token, already picked (on the device by the last step, or
                      from the session's logits when the loop was attached) */
  bool has_next;
  int64_t peak_batch; /* most rows of any batched step this loop ran in (FINAL reports it) */
  bool has_out;       /* the tokens also go to `out` (shm or CUDA IPC, I64 [max_tokens]) */
  mbd_tensor_ref out;
  /* Pipelined steps (worker/scheduler.c): a loop's replies go out with the
   * host work of its batch, which runs after the next batch is launched. */
  int posting;     /* rows of this loop waiting for that host work (one launched batch and
                      the one before it) */
  int over;        /* 0: goes on; 1: ended with `end` (FINAL); 2: failed with `fail` (ERROR):
                      answered by that host work, never stepped again */
  const char *end; /* "stop" or "length" */
  mbd_error fail;
} mbd_wgen;

/* Worker-side session data (mbd_wsession.user). */
typedef struct mbd_wsess_data {
  float *logits;     /* [V]: logits after the last consumed token */
  bool has_logits;   /* false until the first prefill/step/import */
  bool logits_stale; /* a device-picked step left `logits` behind the state */
  mbd_wgen *gen;     /* active GENERATE or NULL */
  int64_t ckpt_tokens; /* tokens consumed since the last checkpoint (worker/checkpoint.h) */
  double ckpt_at;      /* clock seconds of the last checkpoint */
  bool fresh;        /* opened by OPEN, nothing consumed yet: a PREFILL may use the prefix cache */
  bool inflight;     /* a row of the launched batch steps it (mbd_wsched_flush first) */
} mbd_wsess_data;

/* A queued STEP request. */
typedef struct mbd_wstep {
  struct mbd_wstep *next;
  uint64_t tag;
  double deadline; /* clock seconds; 0 = none */
  char session[MBD_SESSION_ID_MAX];
  int64_t token;
  mbd_tensor_ref out; /* shm output when has_out */
  bool has_out;
} mbd_wstep;

/* A FORWARD or PREFILL computed in slices of at most o.slice_tokens tokens
 * (FORWARD: groups of whole rows; PREFILL: chunks of the prompt), one slice
 * per scheduler tick, so session steps and control traffic run between them. */
typedef struct mbd_wjob {
  struct mbd_wjob *next;
  uint64_t tag;
  uint8_t cmd;                      /* MBD_CMD_FORWARD or MBD_CMD_PREFILL */
  int model;                        /* index in models[] */
  char session[MBD_SESSION_ID_MAX]; /* PREFILL: the session (busy while the job runs) */
  int64_t *ids;                     /* [B*T] own copy of the input ids */
  int64_t B, T;                     /* PREFILL: B = 1 */
  int64_t done;                     /* FORWARD: rows done; PREFILL: tokens consumed */
  bool last_only;
  mbd_tensor_desc ld;               /* the result: logits [B,T,V], [B,V], [T,V] or [1,V] */
  float *out;                       /* own buffer of ld's bytes; NULL: the result goes in
                                       place into the request's CUDA IPC output */
  mbd_wreq *q;                      /* the decoded request (outputs for the reply); owned */
  double deadline;                  /* clock seconds; 0 = none */
  mbd_pcache_plan *pfx;             /* PREFILL of a fresh session: its prefix boundaries, or NULL */
  bool pfx_begun;                   /* the prefix cache was consulted (first slice) */
} mbd_wjob;

/* One row of a batched step. */
typedef struct mbd_wrow {
  mbd_wsession *s;
  int64_t token;
  mbd_wstep *step;  /* NULL for a GENERATE row */
  size_t pos;       /* its row in the backend's batch (rows that need logits come first) */
  bool need_logits; /* its logits come to the host */
  bool copied;      /* ... and are in its session already (a loop that samples from them) */
  const char *end;  /* GENERATE: why the loop ends after this step, or NULL */
  int64_t upto;     /* GENERATE: its token count after this step */
} mbd_wrow;

/* One batched step of one model, from its launch to the host work after it
 * (replies, logits to the sessions), which runs while the next batch
 * computes. Arrays of max_batch rows; states, tokens, next and logits in
 * the backend's row order (mbd_wrow.pos). */
typedef struct mbd_wbatch {
  mbd_wrow *rows;       /* in the order the scheduler took them */
  size_t n;             /* rows; 0: the batch is free */
  int model;            /* index in models[] */
  mbd_bstate **states;
  int64_t *tokens;
  int64_t *next;        /* device-picked greedy tokens */
  float *logits;        /* [max_batch, max_vocab]: the first nlogits rows come back */
  bool logits_host;     /* logits came from be->ops->host_alloc (page-locked) */
  size_t nlogits;
  bool dev_pick;        /* the backend picks the greedy rows' next tokens */
  bool in_flight;       /* launched, not waited for */
  int rc;               /* the step's status once waited for */
  mbd_error err;
} mbd_wbatch;

/* Where the compute thread's time went over one busy period (clock
 * seconds), for the line the worker logs when it goes idle
 * (mbd_wsched_report). */
typedef struct mbd_wprof {
  double start;  /* clock at the period's first batch; 0: none yet */
  uint64_t batches, rows;
  double build;  /* choosing the next batch's rows (while the launched one computes) */
  double wait;   /* in step_wait: the host waited for the device */
  double settle; /* after the wait, taking what the next batch needs */
  double launch; /* tokens and launch of the next batch (the device idles meanwhile) */
  double post;   /* replies and logits of a batch, while the next one computes */
} mbd_wprof;

/* Monotonic seconds. */
typedef double (*mbd_wclock_fn)(void *ctx);
/* Sends *m and destroys it (sets *m to NULL); never blocks, never calls back
 * into the worker. A message that cannot leave is the callback's to log. */
typedef void (*mbd_wsend_fn)(void *ctx, mbd_msg **m);

typedef struct mbd_wstate {
  mbd_worker_opts o;    /* options (name, capacity, max_batch, limits) */
  char uid[MBD_WORKER_UID_MAX];
  mbd_backend *be;      /* owned */
  mbd_route_identity route;
  char route_id[65];
  char route_enc[1024];
  mbd_wmodel models[MBD_WORKER_MAX_MODELS];
  int nmodels;
  int64_t max_vocab;
  mbd_wsession_table *sessions;
  mbd_shm_cache *shm;
  /* scheduler (worker/scheduler.c) */
  mbd_wstep *q_head, *q_tail; /* queued STEPs, FIFO */
  size_t ngen;                /* active GENERATE loops */
  mbd_wbatch batch[2];        /* the launched batch and the one whose host work follows */
  mbd_wbatch *fly;            /* the launched batch not waited for, or NULL */
  bool pipeline;              /* a batch stays in flight past the tick (worker.c sets it) */
  mbd_wprof prof;             /* this busy period's time split */
  size_t rr;                  /* round-robin start over session slots */
  mbd_wjob *j_head, *j_tail;  /* sliced FORWARD/PREFILL jobs, round-robin one slice per tick */
  size_t njobs;
  bool draining;              /* SIGTERM seen: new requests get BUSY, started ones finish */
  uint64_t served;            /* requests handled */
  /* from the caller */
  mbd_wclock_fn now;
  void *now_ctx;
  mbd_wsend_fn send;
  void *send_ctx;
} mbd_wstate;

/* A state over backend *be (taken: *be is set to NULL, also on failure) with
 * no models yet: route identity, uid, session table (o->capacity slots), shm
 * cache and batch buffers (o->max_batch rows). now and send must be non-NULL. */
int mbd_wstate_new(const mbd_worker_opts *o, mbd_backend **be, mbd_wclock_fn now, void *now_ctx,
                   mbd_wsend_fn send, void *send_ctx, mbd_wstate **out, mbd_error *err);
/* Closes every session, frees models, buffers and the backend; NULL-safe;
 * nulls *st. Sends nothing. */
void mbd_wstate_destroy(mbd_wstate **st);

/* Registers a model loaded on st->be as `name` with its identities (bm taken,
 * destroyed on failure) and grows the batch logits buffer to its vocab. */
int mbd_wstate_add_model(mbd_wstate *st, const char *name, const char *digest,
                         const char *tokenizer_digest, mbd_bmodel *bm, mbd_error *err);

/* The caller's clock. */
double mbd_wstate_now(const mbd_wstate *st);

/* Opens a session of model mi with a fresh backend state and no logits yet;
 * MBD_E_BUSY when every slot is taken. */
int mbd_wstate_session_new(mbd_wstate *st, int mi, mbd_wsession **out, mbd_error *err);

/* Frees a GENERATE loop (NULL-safe). */
void mbd_wgen_free(mbd_wgen *g);
/* Frees a job and what it owns (NULL-safe). */
void mbd_wjob_free(mbd_wjob *j);

#endif
