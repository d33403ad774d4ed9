/* Worker options: one plain struct filled from the command line. */
#ifndef MBD_WORKER_OPTIONS_H
#define MBD_WORKER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/curve.h"
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
  bool curve;                        /* --curve-secret given: connect as a CURVE client */
  mbd_curve_pair curve_key;          /* --curve-secret FILE: this worker's key pair */
  char server_key[MBD_CURVE_KEY_LEN + 1]; /* --server-key KEY|FILE: the broker's public key */
  char name[MBD_WORKER_NAME_MAX];    /* worker name (FINAL `worker`) */
  char host_id[128];                 /* same-host detection for shm; default machine-id */
  mbd_backend_kind backend;          /* --device: cpu or cuda:N */
  int device;                        /* --device cuda:N: the CUDA ordinal N (-1 for cpu) */
  mbd_gemm_mode mode;                /* --gemm-mode */
  mbd_dtype_policy policy;           /* --dtype */
  mbd_state_dtype state;             /* --state-dtype: recurrent state storage (route `state`) */
  mbd_worker_model_opt models[MBD_WORKER_MAX_MODELS];
  int nmodels;
  int threads;                       /* --threads; 0 = one per CPU */
  int capacity;                      /* --capacity: requests in flight at once (READY capacity) */
  int sessions;                      /* --sessions: session slots (route state_capacity);
                                        defaults to capacity */
  int client_sessions;               /* --client-sessions: slots one client may hold (default
                                        3/4 of the session slots, at least 1) */
  int max_batch;                     /* --max-batch: rows per batched step */
  int heartbeat_ms;                  /* --heartbeat-ms */
  int liveness;                      /* --liveness: silent intervals before reconnecting */
  double session_idle_s;             /* --session-idle-s; <= 0 disables expiry */
  size_t max_message_bytes;          /* --max-message-mb */
  int slice_tokens;                  /* --slice-tokens: tokens of FORWARD/PREFILL per compute slice */
  int drain_ms;                      /* --drain-ms: after SIGTERM, time to finish started work */
  bool overlap_steps;                /* --overlap-steps: a step's replies while the next computes
                                        (worker/scheduler.h; off on checkpointing workers) */
  int checkpoint_tokens;             /* --checkpoint-tokens: checkpoint a session to the broker
                                        after this many consumed tokens (0 = off) */
  int checkpoint_ms;                 /* --checkpoint-ms: ... or after this many ms with tokens
                                        consumed since the last checkpoint (0 = off) */
  size_t prefix_cache_mb;            /* --prefix-cache-mb: prefix state cache per model; 0 = off */
  int prefix_block;                  /* --prefix-block: tokens between cached boundaries; 0 = off */
  size_t prefix_cache_device_mb;     /* --prefix-cache-device-mb: its device tier per model on
                                        GPU workers; 0 = host memory only */
} mbd_worker_opts;

/* Defaults, then argv (argv[0] skipped). MBD_E_INVALID naming the flag and the
 * accepted values on any bad or missing option. Fills host_id from
 * /etc/machine-id (or the hostname) unless --host-id is given. */
int mbd_worker_opts_parse(int argc, char **argv, mbd_worker_opts *o, mbd_error *err);
/* The usage text. */
const char *mbd_worker_usage(void);

#endif
