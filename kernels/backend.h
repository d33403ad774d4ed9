/* The compute backend interface: one vtable that the CPU backend
 * (cpu/backend_cpu.c) and the CUDA backend (cuda/backend_cuda.c) implement,
 * shared by the worker and the in-process tools (mambad-run, mambad-gemm), so
 * neither the worker's reactor, sessions and batching nor a tool ever sees a
 * device type or a model family. A backend opens a model of whichever family
 * its config.json names (kernels/model/family.h).
 *
 * Contract every backend keeps (the determinism contract of docs/route.md):
 * a batched `step` gives each state exactly the bits it would get alone, and
 * `forward` on a batch gives each row the bits it would get alone. All calls
 * come from the reactor thread; a backend may use its own threads inside. */
#ifndef MBD_KERNELS_BACKEND_H
#define MBD_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/protocol.h"
#include "common/route.h"
#include "common/status.h"
#include "common/tensor.h"

typedef struct mbd_backend mbd_backend;
typedef struct mbd_bmodel mbd_bmodel; /* a model loaded on a backend; opaque */
typedef struct mbd_bstate mbd_bstate; /* one session's recurrent state; opaque */
typedef struct mbd_bstash mbd_bstash; /* a copy of a state kept in device memory; opaque */

/* Options that decide the route (from the worker's or a tool's command line). */
typedef struct mbd_backend_opts {
  mbd_gemm_mode mode;      /* only deterministic on CPU */
  mbd_dtype_policy policy; /* weight storage dtype */
  mbd_state_dtype state;   /* recurrent state storage dtype (bf16: Mamba-1/2 on cuda only) */
  int threads;             /* <= 0: one per CPU */
  int64_t state_capacity;  /* session slots (part of the route) */
  int device;              /* CUDA device ordinal (cuda backend only) */
  int max_batch;           /* largest batched step (cuda: decode graph buckets) */
  int isa;                 /* CPU ISA level (mbd_cpu_isa; 0 = best available; cpu only) */
  /* Not part of the route: where model_load reports its progress on large
   * checkpoints (common/progress.h); NULL: silent. Borrowed: it must outlive
   * the backend. */
  const mbd_progress_opts *progress;
} mbd_backend_opts;

typedef struct mbd_backend_ops {
  const char *name; /* "cpu" */
  void (*destroy)(mbd_backend *b);
  /* Fills everything of the route identity this backend decides. */
  void (*route)(mbd_backend *b, mbd_route_identity *out);
  /* C[M,N] f32 = A[M,K] B[N,K]^T (+ bias[N]); A, B in f32/bf16/f16. */
  int (*gemm)(mbd_backend *b, int64_t M, int64_t N, int64_t K, mbd_dtype a_dtype, const void *A,
              mbd_dtype b_dtype, const void *B, const float *bias, float *C, mbd_error *err);
  int (*model_load)(mbd_backend *b, const char *dir, mbd_bmodel **out, mbd_error *err);
  void (*model_destroy)(mbd_backend *b, mbd_bmodel *m);
  int64_t (*model_vocab)(const mbd_bmodel *m);
  /* Stateless: ids [B,T] -> logits [B,T,V], or [B,V] (last position) when last_only. */
  int (*forward)(mbd_backend *b, mbd_bmodel *m, const int64_t *ids, int64_t B, int64_t T,
                 bool last_only, float *logits, mbd_error *err);
  int (*state_new)(mbd_backend *b, mbd_bmodel *m, mbd_bstate **out, mbd_error *err);
  void (*state_free)(mbd_backend *b, mbd_bstate *s);
  /* Exact byte image of a state (for EXPORT/IMPORT): size, save, load.
   * load refuses a blob of another shape (MBD_E_FORMAT / MBD_E_SHAPE). */
  size_t (*state_bytes)(const mbd_bstate *s);
  int (*state_save)(const mbd_bstate *s, void *dst, size_t cap, mbd_error *err);
  int (*state_load)(mbd_bstate *s, const void *src, size_t len, mbd_error *err);
  /* Feeds ids[T] into s; logits [T,V] or [1,V] when last_only. */
  int (*prefill)(mbd_backend *b, mbd_bmodel *m, mbd_bstate *s, const int64_t *ids, int64_t T,
                 bool last_only, float *logits, mbd_error *err);
  /* One token per state, n states at once: logits [n,V]. */
  int (*step)(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, const int64_t *tokens,
              int64_t n, float *logits, mbd_error *err);
  /* Optional: step, plus each row's greedy next token (argmax, lowest index
   * among equal maxima, NaN ignored: the sampler's greedy rule) picked where
   * the logits are, so a GENERATE loop need not bring logits to the host.
   * logits may be NULL (not returned); same bits as step otherwise. */
  int (*step_greedy)(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                     const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                     mbd_error *err);
  /* Optional (NULL: mbd_backend_step_launch runs step_greedy or step at
   * once): a batched step split in two, so the caller does host work while
   * the device computes. step_launch enqueues the step of states[0..n) with
   * tokens[n] (read before it returns; each state counts its token from
   * here on) and returns; step_wait waits for it and returns its status.
   * next (may be NULL: no pick) gets each row's greedy token as step_greedy
   * picks it; logits, a host buffer of [n,V], gets the logits of rows
   * [0, nlogits) (nlogits may be 0; the other rows are unspecified). Both
   * are written by the time step_wait returns and must be left alone until
   * then. Any other call on the backend between the two is ordered after the
   * launched step (it may wait for it); a second launch before the wait is
   * refused. Same bits as step and step_greedy. */
  int (*step_launch)(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                     const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                     int64_t nlogits, mbd_error *err);
  int (*step_wait)(mbd_backend *b, mbd_error *err);
  /* Optional (NULL on backends without device memory): CUDA IPC tensors.
   * ipc_map resolves the first nbytes of ref r to an address in this
   * backend's device address space: the handle is opened once and cached,
   * [offset, offset + size) is checked against the real allocation, and when
   * r names the client's event the backend's stream waits on it, so what
   * follows runs after the client's writes. Such an address may stand for
   * any tensor argument of gemm (A, B, bias, C) and for the logits of
   * forward, prefill and prefill_batch: the backend reads or writes it in
   * place on the device (token ids, step logits and state images stay host
   * memory). It stays valid until the backend has opened 256 other handles
   * (its cache), so callers resolve it again before a use that follows other
   * requests. Every op returns after its writes into such memory are
   * complete on the device.
   * ipc_read copies the nbytes of ref r (after the client's event) to host
   * dst; ipc_write copies host src into it. Bad, stale or foreign handles and
   * ranges outside the allocation fail the request, never the worker. */
  int (*ipc_map)(mbd_backend *b, const mbd_tensor_ref *r, size_t nbytes, void **dev,
                 mbd_error *err);
  int (*ipc_read)(mbd_backend *b, const mbd_tensor_ref *r, void *dst, size_t nbytes,
                  mbd_error *err);
  int (*ipc_write)(mbd_backend *b, const mbd_tensor_ref *r, const void *src, size_t nbytes,
                   mbd_error *err);
  /* Optional (NULL: plain malloc/free): host memory the device copies into
   * fastest (page-locked on CUDA), for the worker's batch logits buffer, so a
   * step that returns [n,V] logits is not bound by pageable staging. Returns
   * NULL when it cannot; host_free takes what host_alloc returned (NULL-safe). */
  void *(*host_alloc)(mbd_backend *b, size_t bytes);
  void (*host_free)(mbd_backend *b, void *p);
  /* Optional (NULL: one prefill per state; call mbd_backend_prefill_batch):
   * prefill of n states at once, row i feeding ids[i*T .. i*T+T) into
   * states[i] (distinct); logits [n,T,V], or [n,V] when last_only. Same bits
   * as n separate prefills. */
  int (*prefill_batch)(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, int64_t n,
                       const int64_t *ids, int64_t T, bool last_only, float *logits,
                       mbd_error *err);
  /* Optional (NULL on backends without device memory): state stashes, copies
   * of a state that stay in device memory (the worker's prefix cache).
   * stash_bytes: device bytes one stash of model m takes (0: m's family
   * keeps none). stash_new: one such stash (MBD_E_NOMEM when the device has
   * no room); stash_free takes it back (NULL-safe; may wait for the device).
   * stash_save copies state s of m into st, stash_load st into s (position
   * included): device-to-device, ordered with the backend's compute, the
   * same bits as state_save then state_load. stash_export writes st's state
   * image into host dst: the bytes state_save wrote for s at stash_save. */
  size_t (*stash_bytes)(mbd_backend *b, mbd_bmodel *m);
  int (*stash_new)(mbd_backend *b, mbd_bmodel *m, mbd_bstash **out, mbd_error *err);
  void (*stash_free)(mbd_backend *b, mbd_bstash *st);
  int (*stash_save)(mbd_backend *b, mbd_bstash *st, const mbd_bstate *s, mbd_error *err);
  int (*stash_load)(mbd_backend *b, mbd_bstate *s, const mbd_bstash *st, mbd_error *err);
  int (*stash_export)(mbd_backend *b, const mbd_bstash *st, void *dst, size_t cap,
                      mbd_error *err);
} mbd_backend_ops;

struct mbd_backend {
  const mbd_backend_ops *ops; /* the implementation */
  void *impl;                 /* its private data */
};

/* The CPU backend (portable C / AVX2, deterministic mode only). */
int mbd_backend_cpu_new(const mbd_backend_opts *opts, mbd_backend **out, mbd_error *err);
/* The CUDA backend on device opts->device (mbd_gpu_ctx + mbd_mamba1_gpu):
 * sessions in preallocated device slots, steps batched into graph-replayed
 * decodes. Only in builds with MBD_HAVE_CUDA (kernels/cuda/backend_cuda.c). */
int mbd_backend_cuda_new(const mbd_backend_opts *opts, mbd_backend **out, mbd_error *err);
/* The backend of `kind` (cpu or cuda). MBD_E_UNSUPPORTED saying how to get one
 * when this build has no CUDA backend. */
int mbd_backend_new(mbd_backend_kind kind, const mbd_backend_opts *opts, mbd_backend **out,
                    mbd_error *err);
/* Calls ops->destroy; NULL-safe; nulls *b. */
void mbd_backend_destroy(mbd_backend **b);
/* ops->prefill_batch, or one ops->prefill per state where a backend has none. */
int mbd_backend_prefill_batch(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, int64_t n,
                              const int64_t *ids, int64_t T, bool last_only, float *logits,
                              mbd_error *err);
/* Whether b picks greedy tokens where the logits are (step_greedy or
 * step_launch with next). */
bool mbd_backend_picks(const mbd_backend *b);
/* ops->step_launch, or (without one) the whole step now: step_greedy when
 * next is non-NULL (logits only when nlogits > 0), else step, which writes
 * all n rows' logits. A failure is returned here; mbd_backend_step_wait must
 * follow every successful launch. */
int mbd_backend_step_launch(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                            const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                            int64_t nlogits, mbd_error *err);
/* ops->step_wait, or MBD_OK where the launch did the whole step. */
int mbd_backend_step_wait(mbd_backend *b, mbd_error *err);
/* For implementations: token ids arrive as i64 on the wire, the models take
 * i32. Copies ids[0..n) into out; MBD_E_INVALID naming the first id outside
 * [0, vocab). */
int mbd_backend_tokens_i32(const int64_t *ids, int64_t n, int64_t vocab, int32_t *out,
                           mbd_error *err);

#endif
