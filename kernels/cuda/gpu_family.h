/* Model families on the CUDA backend: per family (kernels/model/family.h
 * names them), the GPU model behind one vtable, so backend_cuda.c keeps the
 * session slots, forward chunks and batched steps once for every family.
 * C header: no CUDA types. A family's state lives in device slots that the
 * model preallocates (the context's state capacity); its image (kernels/
 * state_blob.h) is the family's header plus slot_read's payload, the same
 * bytes the family's CPU model exports. */
#ifndef MBD_KERNELS_GPU_FAMILY_H
#define MBD_KERNELS_GPU_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/model/family.h"
#include "kernels/state_blob.h"

/* What the CUDA backend asks of a model it loads. */
typedef struct mbd_gpu_model_opts {
  mbd_dtype dtype; /* weight storage f32 / bf16 / f16 (suits the context's policy) */
  int max_batch;   /* largest decode batch */
  int use_graphs;  /* 1: graph-replayed decode */
  const mbd_progress_opts *progress; /* loading progress (mbd_st_dir_set_progress); NULL: silent */
} mbd_gpu_model_opts;

/* One device array of a slot's state (kernels/cuda/state_stash.h copies them). */
typedef struct mbd_gpu_region {
  void *ptr;    /* device address */
  size_t bytes; /* its length */
} mbd_gpu_region;

#define MBD_GPU_REGIONS_MAX 4 /* regions one slot may report */

typedef struct mbd_gpu_model_ops {
  const char *name; /* the family's name ("mamba1") */
  /* The model borrows ctx, which must outlive it. */
  int (*load)(mbd_gpu_ctx *ctx, const char *dir, const mbd_gpu_model_opts *o, void **model,
              mbd_error *err);
  void (*destroy)(void *model); /* NULL-safe */
  int64_t (*vocab)(const void *model);
  int64_t (*slots)(const void *model); /* state slots */
  mbd_state_shape (*state_shape)(const void *model);
  size_t (*state_payload)(const void *model); /* bytes after the image header */
  int (*slot_reset)(void *model, int64_t slot, mbd_error *err);
  int (*slot_read)(void *model, int64_t slot, void *buf, size_t cap, mbd_error *err);
  int (*slot_write)(void *model, int64_t slot, const void *buf, size_t len, mbd_error *err);
  /* tokens [nseq, T] into slots[nseq] (distinct); logits as sel, [nseq, T, V] for ALL,
   * into host memory or device memory this device can address (step's stay host). */
  int (*prefill)(void *model, int nseq, int T, const int32_t *tokens, const int32_t *slots,
                 mbd_logits_sel sel, float *logits, mbd_error *err);
  /* One token per slot (1 <= n <= max_batch); greedy next[n] (may be NULL)
   * picked on the device; logits [n, V] (may be NULL). */
  int (*step)(void *model, int n, const int32_t *tokens, const int32_t *slots, int32_t *next,
              float *logits, mbd_error *err);
  /* Optional (NULL: no device copies of states): the device arrays that hold
   * slot's whole state, into out[0..MBD_GPU_REGIONS_MAX), in one fixed order;
   * returns their count (>= 1), or a negative status for a bad slot. Copying
   * them into another slot's regions gives that slot the same state. */
  int (*slot_regions)(void *model, int64_t slot, mbd_gpu_region *out, mbd_error *err);
  /* Optional (NULL: step, synchronously): step in two halves. step_launch
   * enqueues it (inputs read before it returns) with the copy of logits rows
   * [0, nlogits) into host logits, and returns; step_wait waits and writes
   * greedy next[n] (may be NULL). Nothing else runs on the model between. */
  int (*step_launch)(void *model, int n, const int32_t *tokens, const int32_t *slots,
                     float *logits, int nlogits, mbd_error *err);
  int (*step_wait)(void *model, int32_t *next, mbd_error *err);
  /* The recurrent state storages the family keeps: bit (1u << mbd_state_dtype)
   * each. The backend refuses a model whose family lacks its context's
   * (load assumes it was checked). */
  uint32_t state_dtypes;
} mbd_gpu_model_ops;

/* The GPU implementation of the family `name`, or NULL when none is built. */
const mbd_gpu_model_ops *mbd_gpu_model_ops_find(const char *name);

#endif
