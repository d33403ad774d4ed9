/* Request decoding for the worker: one struct for every request command,
 * filled from the msgpack body with each field checked, and tensor refs
 * resolved to bytes (inline payload frame or shared memory) with their sizes
 * checked. Everything here is request-level: errors fail the request with a
 * code and a message, never the worker. */
#ifndef MBD_WORKER_REQUEST_H
#define MBD_WORKER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/prefix_hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "kernels/backend.h"
#include "worker/session.h"
#include "worker/shm.h"

#define MBD_WREQ_MAX_TENSORS 4
#define MBD_WREQ_MAX_STOP 64
#define MBD_WREQ_MODEL_MAX 64
#define MBD_WREQ_MAX_TOKENS_CAP (1 << 20) /* generate: hard cap on max_tokens */
#define MBD_WCALLER_ID_MAX 96

/* The client that sent a request, as the broker stamped it into the body
 * (`caller`: {id, uid?, gid?, pid?}; the broker drops whatever a client put
 * there). docs/security.md says what each field is worth. */
typedef struct mbd_wcaller {
  char id[MBD_WCALLER_ID_MAX]; /* "uid:<n>" (ipc peer credentials), "key:<z85>" (CURVE); "" anonymous */
  bool has_uid;                /* uid/gid/pid are the peer credentials of an ipc connection */
  uint32_t uid, gid;
  int64_t pid;
} mbd_wcaller;

typedef struct mbd_wreq {
  uint8_t cmd;                        /* mbd_cmd */
  char model[MBD_WREQ_MODEL_MAX];     /* FORWARD, OPEN, IMPORT */
  char session[MBD_SESSION_ID_MAX];   /* PREFILL, STEP, GENERATE, EXPORT, CLOSE */
  int64_t deadline_ms;                /* relative; 0 = none */
  mbd_wcaller caller;                 /* who sent it (every command) */
  bool last_only;                     /* FORWARD, PREFILL */
  int64_t cache_points[MBD_PREFIX_POINTS_MAX]; /* PREFILL: prefix lengths to cache (besides blocks) */
  size_t ncache_points;
  mbd_dtype dtype;                    /* GEMM: storage dtype of A and B (default f32) */
  int64_t token;                      /* STEP */
  /* GENERATE */
  int64_t max_tokens;                 /* 1..MBD_WREQ_MAX_TOKENS_CAP */
  int64_t stop[MBD_WREQ_MAX_STOP];    /* stop token ids */
  size_t nstop;
  double temperature;                 /* 0 = greedy (default) */
  int64_t top_k;                      /* 0 = off */
  double top_p;                       /* 1 = off */
  uint64_t seed;                      /* sampling seed (default 0) */
  int64_t partial_every;              /* PARTIAL after this many tokens (default 1) */
  /* tensors */
  mbd_tensor_ref tensors[MBD_WREQ_MAX_TENSORS];
  size_t ntensors;
  mbd_tensor_ref outputs[MBD_WREQ_MAX_TENSORS]; /* optional shm / CUDA IPC outputs */
  size_t noutputs;
} mbd_wreq;

/* Decodes and checks the fields of request `cmd` from body map `root`. Every
 * tensor ref gets the caller's uid (mbd_tensor_ref.caller_*), so later shm
 * lookups check ownership against it. CUDA IPC refs are refused unless the
 * caller runs as the worker's own uid or root (an IPC handle has no owner the
 * worker could check; docs/security.md). */
int mbd_wreq_decode(uint8_t cmd, const msgpack_object *root, mbd_wreq *out, mbd_error *err);

/* Resolves an input tensor ref to its bytes: INLINE -> payload frame r->frame
 * of msg, whose length must equal the tensor's bytes; SHM -> the cache
 * (read-only, owned by r's caller; the offset must be a multiple of the
 * element size so the data is aligned). CUDA_IPC is MBD_E_UNSUPPORTED here. *nbytes receives the
 * tensor's byte size. */
int mbd_wreq_input(const mbd_tensor_ref *r, const mbd_msg *msg, mbd_shm_cache *shm,
                   const void **data, size_t *nbytes, mbd_error *err);

/* Resolves an output ref (must be SHM, owned and writable by r's caller,
 * dtype/shape must equal `want`, offset a multiple of the element size) to a
 * writable pointer. */
int mbd_wreq_output(const mbd_tensor_ref *r, const mbd_tensor_desc *want, mbd_shm_cache *shm,
                    void **data, mbd_error *err);

/* ---- CUDA IPC tensors in place, and outputs of either kind ---------------
 * A CUDA IPC ref resolves through the backend's ipc_map (kernels/backend.h:
 * handle cache, range check against the real allocation, the client's event
 * waited on) to device memory the backend uses in place. Backends without
 * device memory refuse IPC refs with MBD_E_UNSUPPORTED. */

/* Input r in place: *dev is its device address, *nbytes its size. */
int mbd_wreq_input_dev(mbd_backend *be, const mbd_tensor_ref *r, const void **dev, size_t *nbytes,
                       mbd_error *err);
/* Output r for a result `want` (dtype and shape must be equal): SHM -> the
 * mapped range (mbd_wreq_output), *on_device false; CUDA_IPC -> the client's
 * device memory, *on_device true. */
int mbd_wreq_output_at(mbd_backend *be, mbd_shm_cache *shm, const mbd_tensor_ref *r,
                       const mbd_tensor_desc *want, void **data, bool *on_device, mbd_error *err);
/* Writes nbytes of host src at byte `at` of output r (SHM or CUDA_IPC), for
 * results made on the host (STEP logits, GENERATE tokens, EXPORT state);
 * [at, at + nbytes) must lie within r's size. A shm object truncated during
 * the copy fails the reply (mbd_shm_cache_check), never the worker. */
int mbd_wreq_output_put(mbd_backend *be, mbd_shm_cache *shm, const mbd_tensor_ref *r, uint64_t at,
                        const void *src, size_t nbytes, mbd_error *err);
/* Reads nbytes at byte `at` of CUDA IPC ref r into host dst (a PREFILL's
 * last logits row, which its session keeps). */
int mbd_wreq_output_get(mbd_backend *be, const mbd_tensor_ref *r, uint64_t at, void *dst,
                        size_t nbytes, mbd_error *err);

#endif
