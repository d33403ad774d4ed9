/* Deployment files (YAML): the broker's endpoints and limits, a model
 * catalogue, the workers to start, and security keys. `mambad up` reads one
 * and starts everything it lists; docs/cli.md shows a complete file.
 *
 *   broker:   {clients: EP, workers: EP, heartbeat_ms, liveness, queue_limit,
 *              max_message_mb, default_deadline_ms}
 *   durable:  {checkpoint_tokens, checkpoint_ms, budget_mb}   durable sessions: the
 *              cadence of every worker that sets none, the broker's --durable-mb
 *   prefix_cache: {mb, block, device_mb}   every worker's prefix state cache unless it
 *              sets its own
 *   state_dtype: f32 | bf16   every worker's recurrent state storage unless it sets its own
 *              (--state-dtype; bf16: Mamba-1 and Mamba-2 on CUDA only, so a cpu worker
 *              with bf16 is refused)
 *   models:   [{name, path, default_digest?}]  path relative to the YAML file's directory
 *   workers:  [{name, device: cpu | cuda:N | all, dtype, state_dtype, gemm_mode, threads,
 *              capacity, max_batch, session_idle_s, checkpoint_tokens,
 *              checkpoint_ms, prefix_cache_mb, prefix_block, prefix_cache_device_mb,
 *              models: [names], count}]
 *   http:     {listen: "HOST:PORT", max_body_bytes, conn_timeout_s, max_running,
 *              deadline_ms}    starts mambad-gateway serving every model
 *   security: {curve: bool, broker_key: FILE, worker_key: FILE, client_keys: SPEC,
 *              worker_keys: SPEC, operator_keys: SPEC, insecure: {clients, workers},
 *              ipc_group: GROUP,
 *              server_public_key, server_secret_key, client_public_keys: [..]}
 *
 * Unknown keys, duplicate keys, wrong types and out-of-range values are errors
 * naming the file, the line and the field ("deploy.yaml:12: workers[1].device:
 * ..."). A tcp endpoint needs `curve: true` (with broker_key, and worker_keys for a
 * tcp workers endpoint) or `insecure: {clients|workers: true}`; otherwise the
 * file is refused (docs/security.md). */
#ifndef MBD_DEPLOY_CONFIG_H
#define MBD_DEPLOY_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define MBD_DEPLOY_MAX_MODELS 32
#define MBD_DEPLOY_MAX_WORKERS 64
#define MBD_DEPLOY_MAX_CLIENT_KEYS 32
#define MBD_DEPLOY_NAME_MAX 64
#define MBD_DEPLOY_PATH_MAX 1024
#define MBD_DEPLOY_EP_MAX 256

typedef struct mbd_deploy_model {
  char name[MBD_DEPLOY_NAME_MAX]; /* catalogue name requests use */
  char path[MBD_DEPLOY_PATH_MAX]; /* checkpoint directory, resolved against the YAML dir */
  char default_digest[72];        /* hex prefix: unpinned requests for name get these weights
                                     only ("" = none; a name with two digests is then refused) */
  int line;                       /* 1-based line of the entry */
} mbd_deploy_model;

typedef enum mbd_deploy_device {
  MBD_DEPLOY_DEVICE_CPU = 0,
  MBD_DEPLOY_DEVICE_CUDA = 1, /* one GPU: cuda_index */
  MBD_DEPLOY_DEVICE_ALL = 2,  /* one worker per visible GPU */
} mbd_deploy_device;

/* A worker's prefix state cache (docs/architecture.md "Prefix state cache").
 * Each value is the worker's flag; `mambad up` passes the ones that differ
 * from the worker's default (common/defaults.h). A new cache setting is one
 * more field here, one key in the prefix_cache: section and in workers[]. */
typedef struct mbd_deploy_prefix_cache {
  int64_t mb; /* --prefix-cache-mb: host MiB per model (0 = off) */
  int block;  /* --prefix-block: tokens between cached boundaries (0 = off) */
  int64_t device_mb; /* --prefix-cache-device-mb: GPU workers' device tier per model (0 = host only) */
} mbd_deploy_prefix_cache;

typedef struct mbd_deploy_worker {
  char name[MBD_DEPLOY_NAME_MAX]; /* worker name (replicas get "-<i>" appended) */
  mbd_deploy_device device;
  int cuda_index;                 /* CUDA: device ordinal */
  char dtype[8];                  /* storage policy ("f32"), "" = worker default */
  char gemm_mode[24];             /* "deterministic" ..., "" = worker default */
  char state_dtype[8];            /* --state-dtype "f32" | "bf16": its own, else the top-level
                                     state_dtype:; "" = worker default (f32) */
  int threads;                    /* CPU threads, 0 = worker default */
  int capacity;                   /* in-flight requests (--capacity), 0 = worker default */
  int sessions;                   /* session slots (--sessions), 0 = worker default */
  int max_batch;                  /* batch size cap, 0 = worker default */
  int session_idle_s;             /* idle session expiry, 0 = worker default */
  int checkpoint_tokens;          /* --checkpoint-tokens: its own, else durable:'s; 0 = off */
  int checkpoint_ms;              /* --checkpoint-ms: its own, else durable:'s; 0 = off */
  mbd_deploy_prefix_cache prefix_cache; /* its own keys, else the prefix_cache: section's */
  int count;                      /* replicas (cpu only), >= 1 */
  size_t n_models;
  int models[MBD_DEPLOY_MAX_MODELS]; /* indexes into the catalogue */
  int line;
} mbd_deploy_worker;

typedef struct mbd_deploy_security {
  bool curve;                       /* tcp endpoints are CURVE servers (docs/security.md) */
  char server_public_key[41];       /* Z85, "" when absent (informational) */
  char server_secret_key[41];
  size_t n_client_keys;
  char client_public_keys[MBD_DEPLOY_MAX_CLIENT_KEYS][41]; /* admitted clients (inline) */
  /* Key files and key lists (a Z85 key, a key file or a directory of *.pub;
   * paths resolved against the YAML file's directory); "" when absent. */
  char broker_key[MBD_DEPLOY_PATH_MAX];    /* the broker's secret file (curve: required) */
  char worker_key[MBD_DEPLOY_PATH_MAX];    /* the workers' secret file (curve, tcp workers) */
  char client_keys[MBD_DEPLOY_PATH_MAX];   /* admitted client public keys */
  char worker_keys[MBD_DEPLOY_PATH_MAX];   /* admitted worker public keys */
  char operator_keys[MBD_DEPLOY_PATH_MAX]; /* clients that see STATUS detail */
  bool insecure_clients;            /* insecure: {clients: true}: tcp clients without CURVE */
  bool insecure_workers;            /* insecure: {workers: true} */
  char ipc_group[MBD_DEPLOY_NAME_MAX]; /* ipc_group: group that may reach the ipc sockets ("" = none) */
} mbd_deploy_security;

typedef struct mbd_deploy_http {
  bool enabled;                    /* the file has an http: section */
  char listen[64];                 /* "127.0.0.1:8000" */
  int64_t max_body_bytes;          /* 0 = gateway default */
  int64_t conn_timeout_s;          /* 0 = gateway default */
  int64_t max_running;             /* 0 = gateway default */
  int64_t deadline_ms;             /* 0 = gateway default */
  int line;
} mbd_deploy_http;

typedef struct mbd_deploy_config {
  char path[MBD_DEPLOY_PATH_MAX];  /* the file as given ("<memory>" label when parsed) */
  char clients_ep[MBD_DEPLOY_EP_MAX]; /* ipc:// or tcp:// */
  char workers_ep[MBD_DEPLOY_EP_MAX];
  /* defaults for these: common/defaults.h */
  int64_t heartbeat_ms;            /* heartbeat interval, both ways */
  int64_t liveness;                /* missed heartbeats before a peer is dead */
  int64_t queue_limit;             /* broker queue, requests */
  int64_t queue_mb;                /* broker queue, MiB of bodies and payloads */
  int64_t max_message_mb;          /* message cap of the broker and every worker */
  int64_t default_deadline_ms;     /* deadline of requests that name none */
  int64_t durable_mb;              /* durable.budget_mb: the broker's --durable-mb (0 = none) */
  int checkpoint_tokens;           /* durable.checkpoint_tokens: every worker's unless set */
  int checkpoint_ms;               /* durable.checkpoint_ms: likewise */
  mbd_deploy_prefix_cache prefix_cache; /* prefix_cache: every worker's unless set */
  char state_dtype[8];             /* state_dtype: every worker's unless set ("" = none given) */
  size_t n_models;
  mbd_deploy_model models[MBD_DEPLOY_MAX_MODELS];
  size_t n_workers;
  mbd_deploy_worker workers[MBD_DEPLOY_MAX_WORKERS];
  mbd_deploy_security security;
  mbd_deploy_http http;
} mbd_deploy_config;

/* Reads and validates `path`; model paths are resolved against its directory.
 * On success *out is heap-allocated (free with mbd_deploy_config_free). */
int mbd_deploy_config_load(const char *path, mbd_deploy_config **out, mbd_error *err);
/* Same from text of `len` bytes; `label` names it in errors and `base_dir`
 * resolves relative model paths. */
int mbd_deploy_config_parse(const char *text, size_t len, const char *label, const char *base_dir,
                            mbd_deploy_config **out, mbd_error *err);
void mbd_deploy_config_free(mbd_deploy_config **c);

/* The endpoint a client on this host uses for `ep` (a bind address): a tcp
 * wildcard host ('*' or 0.0.0.0) becomes 127.0.0.1; others are returned as is. */
void mbd_deploy_connect_endpoint(const char *ep, char *out, size_t cap);

#endif
