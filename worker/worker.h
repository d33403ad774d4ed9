/* The worker process core: options, model registry with identities, the route
 * identity, and the single-threaded reactor that registers with the broker,
 * keeps heartbeats flowing, serves requests and batches session steps.
 *
 * One reactor tick: poll the broker socket (timeout 0 while work is pending),
 * drain every waiting message (cheap requests answered at once; STEPs queued;
 * GENERATE loops attached to their session), then run ONE batched model step
 * per model over the queued STEPs and one token of every active GENERATE (up
 * to --max-batch), send replies and partials, send a heartbeat when due, and
 * expire idle sessions. Generation therefore advances one token per tick,
 * interleaved with everything else, and heartbeats keep flowing. A FORWARD or
 * PREFILL runs inside the tick that received it (bounded by the message size
 * cap); see docs/architecture.md. */
#ifndef MBD_WORKER_WORKER_H
#define MBD_WORKER_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "common/status.h"

#define MBD_WORKER_MAX_MODELS 16
#define MBD_WORKER_NAME_MAX 64
#define MBD_WORKER_PATH_MAX 1024

typedef struct mbd_worker_model_opt {
  char name[MBD_WORKER_NAME_MAX]; /* registry name (request field `model`) */
  char dir[MBD_WORKER_PATH_MAX];  /* Hugging Face checkpoint directory */
} mbd_worker_model_opt;

typedef struct mbd_worker_opts {
  char connect[256];                 /* broker's workers endpoint */
  char name[MBD_WORKER_NAME_MAX];    /* worker name (FINAL `worker`) */
  char host_id[128];                 /* same-host detection for shm; default machine-id */
  mbd_backend_kind backend;          /* --device: cpu or cuda:N */
  int device;                        /* --device cuda:N: the CUDA ordinal N (-1 for cpu) */
  mbd_gemm_mode mode;                /* --gemm-mode */
  mbd_dtype_policy policy;           /* --dtype */
  mbd_worker_model_opt models[MBD_WORKER_MAX_MODELS];
  int nmodels;
  int threads;                       /* --threads; 0 = one per CPU */
  int capacity;                      /* --capacity: session slots */
  int max_batch;                     /* --max-batch: rows per batched step */
  int heartbeat_ms;                  /* --heartbeat-ms */
  int liveness;                      /* --liveness: silent intervals before reconnecting */
  double session_idle_s;             /* --session-idle-s; <= 0 disables expiry */
  size_t max_message_bytes;          /* --max-message-mb */
} mbd_worker_opts;

/* Defaults, then argv (argv[0] skipped). MBD_E_INVALID naming the flag and the
 * accepted values on any bad or missing option. Fills host_id from
 * /etc/machine-id (or the hostname) unless --host-id is given. */
int mbd_worker_opts_parse(int argc, char **argv, mbd_worker_opts *o, mbd_error *err);
/* The usage text. */
const char *mbd_worker_usage(void);

/* Model identity: SHA-256 (hex) over, in file-name order, "<file>\n<sha256 hex>\n"
 * for config.json and every *.safetensors file of dir. MBD_E_NOT_FOUND when dir
 * has no safetensors file. */
int mbd_worker_model_digest(const char *dir, char out[65], mbd_error *err);

typedef struct mbd_worker mbd_worker;

/* Creates the backend, loads every model (fail fast: the error names the model
 * and the directory), computes identities. No socket yet. */
int mbd_worker_new(const mbd_worker_opts *o, mbd_worker **out, mbd_error *err);
void mbd_worker_destroy(mbd_worker **w);

const mbd_route_identity *mbd_worker_route(const mbd_worker *w);
const char *mbd_worker_route_id(const mbd_worker *w);
const char *mbd_worker_uid(const mbd_worker *w);

/* Connects, registers and serves until *stop becomes nonzero (SIGTERM): then
 * finishes the in-flight batch, answers every pending request with ERROR
 * (code STATE, "worker shutting down"), sends DISCONNECT and returns 0.
 * Errors only for failures to set up the socket. */
int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err);

#endif
