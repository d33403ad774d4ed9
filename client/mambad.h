/* libmambad: the C client of the mambad service.
 *
 * A client connects a DEALER socket to the broker's client endpoint and sends
 * one request at a time (docs/protocol.md): the request id is the tag, every
 * request carries a deadline, replies for other ids (late replies of requests
 * that already timed out) are dropped, and a request ends with exactly one
 * FINAL or ERROR.
 *
 * Thread-safety: none inside. One mbd_client (and the sessions opened through
 * it) belongs to one thread at a time; use one client per thread. Different
 * clients share nothing and may run in parallel. mbd_shm regions may be shared
 * between threads read-only.
 *
 * Ownership: `_new`/`_open` results are owned by the caller and released with
 * the matching `_destroy`/`_close`/`_free`/`_release` (all NULL-safe; the ones
 * taking `T **` null the caller's pointer). `const char *` results are borrowed
 * and valid as long as their owner. Every fallible function returns 0 or a
 * negative mbd_status and fills `err` (may be NULL). For failures the service
 * reported (ERROR replies) err->code is the service's code and err->msg its
 * message; mbd_client_last_reply() tells which worker and route answered. */
#ifndef MBD_MAMBAD_H
#define MBD_MAMBAD_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "common/status.h"
#include "common/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbd_client mbd_client;   /* one connection to a broker */
typedef struct mbd_session mbd_session; /* a session (recurrent state) on one worker */
typedef struct mbd_shm mbd_shm;         /* a POSIX shared-memory region */

/* ---- connection -------------------------------------------------------- */

typedef struct mbd_client_options {
  int64_t deadline_ms;      /* sent with every request; 0 = the broker's default */
  int64_t wait_ms;          /* how long the client waits when deadline_ms is 0 (default 120000) */
  int64_t connect_ms;       /* how long a request waits for the broker connection (default 5000) */
  mbd_route_want route;     /* default route constraints for gemm/forward/open/import */
  size_t max_message_bytes; /* largest reply accepted (default 2 GiB) */
  const char *curve_key;    /* CURVE: this client's secret key file (`mambad keygen`); NULL = none */
  const char *server_key;   /* CURVE: the broker's public key (Z85, or a file holding it) */
} mbd_client_options;

/* Fills defaults: no deadline of our own (broker default), any route. */
void mbd_client_options_init(mbd_client_options *o);

/* Connects to `endpoint` ("ipc:///run/mambad/clients.sock", "tcp://host:5555").
 * opt may be NULL (defaults). With curve_key and server_key the socket is a
 * CURVE client (docs/security.md); a bad key file is MBD_E_INVALID. Connecting is lazy: an unreachable broker shows
 * as MBD_E_TIMEOUT on the first request. MBD_E_INVALID for a malformed endpoint. */
int mbd_client_new(const char *endpoint, const mbd_client_options *opt, mbd_client **out,
                   mbd_error *err);
void mbd_client_destroy(mbd_client **c);

/* Who answered the last request (success or ERROR). Borrowed; overwritten by
 * the next request. Empty strings when the broker itself answered. */
typedef struct mbd_reply_meta {
  uint64_t request_id; /* tag of the request */
  char trace[24];      /* the body's request_id: the broker and the worker log it (debug) */
  int code;            /* 0 or the ERROR reply's code */
  char error[32];      /* ERROR: code name as sent ("NO_ROUTE") */
  char route_id[65];   /* serving route id (hex), "" when none */
  char worker[64];     /* serving worker's name, "" when none */
  char model_digest[72]; /* weights digest that answered (FORWARD, OPEN, IMPORT), "" when none */
  int64_t peak_batch;  /* GENERATE: most rows of any batched model step it ran in (1 = alone), 0 otherwise */
} mbd_reply_meta;
const mbd_reply_meta *mbd_client_last_reply(const mbd_client *c);

/* Cancels request `request_id` of this client (sends CANCEL; no reply of its
 * own): the broker answers the request with ERROR CANCELLED and tells its
 * worker to stop (a GENERATE stops between tokens, a PREFILL between
 * chunks). Inside a callback of the running request (mbd_token_cb), its id is
 * mbd_client_last_reply(c)->request_id. Cancelling a finished id does nothing. */
int mbd_client_cancel(mbd_client *c, uint64_t request_id, mbd_error *err);
/* While *flag is nonzero, the running request is cancelled and the call
 * returns MBD_E_CANCELLED; a signal handler may set it (e.g. SIGINT: Ctrl-C
 * stops a streaming generate). flag NULL: no interrupt. The flag is not reset. */
void mbd_client_set_interrupt(mbd_client *c, volatile sig_atomic_t *flag);

struct mbd_tensor_in;

/* Per-call overrides; pass NULL to use the client's options. */
typedef struct mbd_call_opts {
  const mbd_route_want *route; /* NULL = client default */
  int64_t deadline_ms;         /* 0 = client default */
  /* Where the request's result goes instead of the reply: a shm tensor
   * (mbd_shm_tensor) or device memory (mbd_tensor_device). NULL = inline in
   * the reply. Its dtype and shape must be the result's: GEMM c F32 [M,N];
   * FORWARD / PREFILL / STEP logits (as documented at each call); GENERATE
   * I64 [max_tokens] (tokens [0, n) are written; *tokens still gets them);
   * EXPORT I64 [n] with n * 8 >= the state's bytes (the state is written
   * from byte 0; the returned tensor's shape says how much). The returned
   * mbd_tensor_out then borrows the caller's memory (on_device says which). */
  const struct mbd_tensor_in *output;
} mbd_call_opts;

/* ---- tensors ----------------------------------------------------------- */

/* Private to libmambad: the CUDA IPC export of a device tensor. */
typedef struct mbd_tensor_ipc_ {
  uint8_t mem[64];   /* cudaIpcMemHandle_t of the allocation holding the tensor */
  uint8_t event[64]; /* cudaIpcEventHandle_t of the caller's event, when has_event */
  uint64_t offset;   /* of the tensor's first byte in that allocation */
  int32_t device;    /* CUDA ordinal of the allocation in this process */
  bool has_event;
} mbd_tensor_ipc_;

/* A request tensor: host bytes copied into the message, a reference into a
 * shared-memory region, or CUDA device memory (zero copy; worker on the same
 * host only). Zero it, then fill desc and one of data / shm (or use
 * mbd_shm_tensor, mbd_tensor_device). */
typedef struct mbd_tensor_in {
  mbd_tensor_desc desc; /* dtype + shape */
  const void *data;     /* inline bytes (ignored when shm or device is set); borrowed for the call */
  const mbd_shm *shm;   /* when non-NULL: bytes live at [offset, offset + nbytes) of shm */
  uint64_t offset;      /* byte offset into shm */
  const void *device;   /* when non-NULL: CUDA device memory of this process (mbd_tensor_device) */
  mbd_tensor_ipc_ ipc_; /* private: filled by mbd_tensor_device */
} mbd_tensor_in;

/* A reply tensor. data is owned by the library unless it points into memory
 * the caller passed as the output (mbd_call_opts.output: borrowed from that
 * mbd_shm or device buffer). */
typedef struct mbd_tensor_out {
  char name[64];        /* name from the reply ("logits") */
  mbd_tensor_desc desc; /* dtype + shape */
  void *data;           /* nbytes bytes, at least 4-byte aligned */
  size_t nbytes;
  bool on_device;       /* data is the caller's CUDA device memory (a device output) */
  void *owner_;         /* private: what to free */
} mbd_tensor_out;
/* Frees what the library owns and zeroes *t; NULL-safe. */
void mbd_tensor_out_release(mbd_tensor_out *t);

/* ---- shared memory ----------------------------------------------------- */

/* Creates and maps a new POSIX shm object of `size` bytes, zero-filled. name
 * may be NULL (a unique "/mambad-<pid>-<n>" is chosen). The object is
 * unlinked when the region is destroyed. */
int mbd_shm_create(const char *name, size_t size, mbd_shm **out, mbd_error *err);
void mbd_shm_destroy(mbd_shm **s);
void *mbd_shm_data(const mbd_shm *s);
size_t mbd_shm_size(const mbd_shm *s);
const char *mbd_shm_name(const mbd_shm *s); /* "/name" */
/* Convenience: a tensor_in describing desc at offset of s (checks the bounds). */
int mbd_shm_tensor(const mbd_shm *s, uint64_t offset, const mbd_tensor_desc *desc,
                   mbd_tensor_in *out, mbd_error *err);

/* ---- status ------------------------------------------------------------ */

typedef struct mbd_model_info {
  char name[64];
  char digest[72];           /* checkpoint digest as the worker reports it */
  char tokenizer_digest[72]; /* tokenizer.json digest, "" when the model has none */
} mbd_model_info;

/* A model as the broker routes it: a name and one weights digest. One name
 * served with two digests is two entries. */
typedef struct mbd_model_entry {
  char name[64];
  char digest[72];
  char tokenizer_digest[72];
  int64_t workers;  /* live workers serving it */
  bool is_default;  /* the deployment's default for the name */
} mbd_model_entry;

/* A worker's prefix state cache, from its heartbeats (docs/architecture.md). */
typedef struct mbd_prefix_cache_info {
  int64_t lookups;    /* PREFILLs of fresh sessions that asked for a cached prefix */
  int64_t hits;       /* of those, the ones that found one */
  int64_t hit_tokens; /* prompt tokens not prefilled thanks to hits */
  int64_t inserts;    /* prefix states stored */
  int64_t evictions;  /* dropped for the memory budget */
  int64_t bytes;      /* host bytes held now */
  int64_t entries;    /* held now, both tiers */
  int64_t device_hits;    /* of the hits, those served from device memory (GPU workers) */
  int64_t demotions;      /* entries moved from device to host memory */
  int64_t device_bytes;   /* device bytes held now */
  int64_t device_entries; /* of the entries, those in device memory */
} mbd_prefix_cache_info;

typedef struct mbd_worker_info {
  char name[64];
  char uid[64];
  char host_id[64];
  char route_id[65];    /* hex SHA-256 */
  char *route;          /* canonical route encoding (owned by the report), "" if absent */
  int64_t pid;
  int64_t capacity;     /* requests it accepts at once */
  int64_t load;         /* requests in flight now */
  int64_t sessions;     /* open sessions, -1 when not reported */
  int64_t heartbeat_age_ms; /* since the broker last heard from it, -1 when not reported */
  int64_t uptime_ms;    /* since it registered, -1 when not reported */
  bool alive;           /* heard from within the liveness window */
  size_t n_models;
  mbd_model_info *models;
  bool has_prefix_cache;            /* the worker reports a prefix state cache */
  mbd_prefix_cache_info prefix_cache;
} mbd_worker_info;

/* A worker that reported it could not start (e.g. a model that does not
 * load), until a worker of that name registers. */
typedef struct mbd_failed_worker {
  char name[64];
  char error[256];  /* its start-up error */
  char models[256]; /* the models it was to serve, comma-separated */
  int64_t age_ms;   /* since it reported */
} mbd_failed_worker;

/* The broker's durable sessions (checkpoints it holds to re-home the
 * sessions of a worker that dies; docs/architecture.md "Durable sessions").
 * Counters count since the broker started; "now" values are current. */
typedef struct mbd_durable_status {
  bool reported;                /* the broker sent these (false: all 0, budget_mb -1) */
  int64_t budget_mb;            /* its --durable-mb (0 = it keeps none), -1 if not sent */
  uint64_t sessions;            /* durable sessions held now */
  uint64_t checkpoint_bytes;    /* bytes held now: checkpoints, token logs, records */
  uint64_t checkpoints;         /* checkpoints kept */
  uint64_t checkpoints_dropped; /* checkpoints refused: over the budget */
  uint64_t sessions_rehomed;    /* sessions restored on another worker after theirs died */
  uint64_t replayed_tokens;     /* tokens those restores replayed after their checkpoints */
  uint64_t generates_resumed;   /* GENERATEs continued on the new worker */
  uint64_t sessions_lost;       /* sessions whose worker died and that could not be re-homed */
} mbd_durable_status;

typedef struct mbd_status_report {
  size_t n_workers;
  mbd_worker_info *workers;
  int64_t queue; /* requests waiting in the broker */
  size_t n_models;
  mbd_model_entry *models; /* distinct (name, digest) pairs */
  size_t n_failed;
  mbd_failed_worker *failed; /* workers that could not start, and why */
  mbd_durable_status durable; /* durable sessions */
} mbd_status_report;

/* Asks the broker for its workers, their routes, models and load. *out is
 * the caller's: free it with mbd_status_report_free (NULL-safe, nulls *r). */
int mbd_client_status(mbd_client *c, mbd_status_report **out, mbd_error *err);
void mbd_status_report_free(mbd_status_report **r);

/* ---- stateless requests ----------------------------------------------- */

/* C = A B^T (+ bias) under a route. a: [M,K], b: [N,K], bias: [N] or NULL.
 * dtype: storage policy name ("f32", "bf16", ...) or NULL for the route's. */
int mbd_client_gemm(mbd_client *c, const mbd_call_opts *o, const char *dtype,
                    const mbd_tensor_in *a, const mbd_tensor_in *b, const mbd_tensor_in *bias,
                    mbd_tensor_out *out_c, mbd_error *err);

/* Model names: "NAME" or "NAME@DIGEST" (DIGEST: a hex prefix of >= 8 chars
 * of the weights digest, `mambad status` lists them) pins the weights. A
 * name that the route serves with two digests must be pinned unless the
 * deployment marks a default (else ERROR INVALID listing the digests). The
 * digest that answered is in mbd_client_last_reply()->model_digest. */

/* input_ids I64 [B,T] -> logits F32 [B,T,V] ([B,V] when last_only). When
 * out_ref (or o->output) is a shm or device tensor, the worker is asked to
 * write the logits there. */
int mbd_client_forward(mbd_client *c, const mbd_call_opts *o, const char *model,
                       const mbd_tensor_in *input_ids, bool last_only,
                       const mbd_tensor_in *out_ref, mbd_tensor_out *logits, mbd_error *err);

/* ---- sessions ---------------------------------------------------------- */

/* Opens a session for `model` on a worker matching the route. The session
 * borrows c: close it before destroying the client. */
int mbd_session_open(mbd_client *c, const mbd_call_opts *o, const char *model, mbd_session **out,
                     mbd_error *err);
/* "<worker-uid>/<n>" as the worker named it; borrowed. */
const char *mbd_session_id(const mbd_session *s);
/* The weights digest the session runs (fixed at open), "" if not reported; borrowed. */
const char *mbd_session_model_digest(const mbd_session *s);
/* Feeds tokens (I64 [T] or [1,T]) -> logits F32 [T,V] ([1,V] when last_only). */
int mbd_session_prefill(mbd_session *s, const mbd_call_opts *o, const mbd_tensor_in *input_ids,
                        bool last_only, mbd_tensor_out *logits, mbd_error *err);

/* Prefix state cache (docs/architecture.md "Prefix state cache"). A worker
 * keeps the state of a fresh session's prompt at every multiple of its
 * --prefix-block and at the cache points a PREFILL marks; a later last_only
 * PREFILL of a fresh session whose prompt starts with a held prefix restores
 * it and computes only the rest, with the same bits. */

/* As mbd_session_open, for a session whose first PREFILL will be
 * prompt[0..n): the OPEN carries the routing hashes of the prompt's prefix
 * boundaries (multiples of block, 0 = the workers' default 256, and
 * points[0..npoints)), so the broker opens it on the worker holding the
 * longest cached prefix while that worker has room. */
int mbd_session_open_prompt(mbd_client *c, const mbd_call_opts *o, const char *model,
                            const int64_t *prompt, int64_t n, int64_t block,
                            const int64_t *points, size_t npoints, mbd_session **out,
                            mbd_error *err);
/* As mbd_session_prefill, also marking cache points: prefix lengths in
 * (0, T] (at most 64) where the worker keeps the state besides its block
 * multiples (the end of a system prompt, of few-shot examples). */
int mbd_session_prefill_cached(mbd_session *s, const mbd_call_opts *o,
                               const mbd_tensor_in *input_ids, bool last_only,
                               const int64_t *points, size_t npoints, mbd_tensor_out *logits,
                               mbd_error *err);
/* One token -> logits F32 [V]. */
int mbd_session_step(mbd_session *s, const mbd_call_opts *o, int64_t token,
                     mbd_tensor_out *logits, mbd_error *err);

typedef struct mbd_generate_params {
  int64_t max_tokens;   /* > 0 */
  const int64_t *stop;  /* stop token ids, may be NULL */
  size_t n_stop;
  double temperature;   /* 0 = greedy */
  int64_t top_k;        /* 0 = off */
  double top_p;         /* (0, 1]; 1 = off (the default), 0 reads as 1 */
  uint64_t seed;        /* sampling seed (used when temperature > 0) */
} mbd_generate_params;
void mbd_generate_params_init(mbd_generate_params *p); /* greedy, 16 tokens, top_p 1, top_k off */

/* Called for each streamed PARTIAL with the new tokens (borrowed for the call). */
typedef void (*mbd_token_cb)(void *user, const int64_t *tokens, size_t n);

/* Server-side generation loop. On success *tokens (malloc'd, caller frees) holds
 * all generated tokens and reason "length" or "stop". cb may be NULL. */
int mbd_session_generate(mbd_session *s, const mbd_call_opts *o, const mbd_generate_params *p,
                         mbd_token_cb cb, void *user, int64_t **tokens, size_t *n_tokens,
                         char reason[16], mbd_error *err);

/* Exported session state: opaque tensors to hand to mbd_session_import on a
 * worker with the same route id. */
typedef struct mbd_session_state {
  char model[64];
  char model_digest[72]; /* weights digest of the exporter; the import pins it */
  char route_id[65];
  size_t n_tensors;
  mbd_tensor_out *tensors;
} mbd_session_state;
/* Exports the session's state (the session stays open and usable). *out is
 * the caller's: free it with mbd_session_state_free (NULL-safe, nulls *st). */
int mbd_session_export(mbd_session *s, const mbd_call_opts *o, mbd_session_state **out,
                       mbd_error *err);
void mbd_session_state_free(mbd_session_state **st);
/* ---- CUDA device tensors ------------------------------------------------
 * A tensor in this process's CUDA device memory can be an input (any tensor
 * argument) or the output (mbd_call_opts.output) of any request. The worker,
 * on the same host and running as the same uid (or root), reads and writes
 * it in place through a CUDA IPC handle that the library exports; workers
 * cache opened handles, so a buffer reused across requests costs its open
 * once. Ordering, the rule the caller follows (docs/protocol.md, "CUDA IPC"):
 *  - inputs: with cuda_event, the worker's stream waits on the event's last
 *    record before touching the memory, so record it after the work that
 *    produces the data and before sending the request. Without an event the
 *    data must be complete (stream synchronized) before the call.
 *  - outputs: the reply comes after the worker's writes are complete on the
 *    device; when the call returns, the data is there for any stream.
 *  - do not free or reuse a buffer while a request naming it runs (also one
 *    that timed out or was cancelled: the worker may still be finishing).
 * In builds without CUDA these calls return MBD_E_UNSUPPORTED. */

/* Fills *out as the device tensor desc at `ptr` (anywhere inside a cudaMalloc
 * allocation of this process; the nbytes of desc must fit the allocation
 * from there). cuda_event (a cudaEvent_t created with cudaEventInterprocess |
 * cudaEventDisableTiming) may be NULL; it is exported once here and may be
 * recorded again for each request that reuses *out. MBD_E_INVALID when ptr
 * is not device memory or the range does not fit, MBD_E_DEVICE when CUDA
 * refuses the export. */
int mbd_tensor_device(const void *ptr, const mbd_tensor_desc *desc, void *cuda_event,
                      mbd_tensor_in *out, mbd_error *err);

struct mbd_tensor_ref; /* common/protocol.h: the request body's tensor ref */

/* Fills *out as a CUDA IPC ref to the tensor desc at byte `offset` of the
 * device allocation that starts at `alloc_base` (a cudaMalloc result; IPC
 * handles name whole allocations) and holds `alloc_bytes`. When `cuda_event`
 * (a cudaEvent_t created with cudaEventInterprocess | cudaEventDisableTiming)
 * is non-NULL, the caller records it after producing the data and the worker
 * waits on it before reading. Send the request with the client's host id
 * (mbd_client_host_id): only workers on the same host can open the handle.
 * MBD_E_INVALID when the range does not fit the allocation, MBD_E_DEVICE when
 * CUDA refuses the export. (For hand-packed requests; libmambad's own calls
 * take mbd_tensor_device tensors.) */
int mbd_cuda_ipc_ref(const void *alloc_base, size_t alloc_bytes, uint64_t offset,
                     const mbd_tensor_desc *desc, const char *name, void *cuda_event,
                     struct mbd_tensor_ref *out, mbd_error *err);
/* This machine's host id as workers report it (/etc/machine-id, else the
 * hostname) into buf. */
void mbd_client_host_id(char *buf, size_t cap);

/* Creates a session from exported state. The route defaults to the state's
 * exact route id (bit-exact continuation); o->route overrides it. */
int mbd_session_import(mbd_client *c, const mbd_call_opts *o, const mbd_session_state *st,
                       mbd_session **out, mbd_error *err);

/* Closes the session on the worker and frees the handle (always; *s becomes
 * NULL). Returns the CLOSE reply's status. NULL-safe. */
int mbd_session_close(mbd_session **s, mbd_error *err);

#ifdef __cplusplus
}
#endif

#endif
