/* State stashes: device copies of slot states (see state_stash.h). A stash
 * is one cudaMalloc holding the slot's regions back to back. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gpu_check.h"

extern "C" {
#include "kernels/cuda/state_stash.h"
#include "kernels/state_blob.h"
}

struct mbd_state_stash {
  mbd_gpu_ctx *ctx;           /* borrowed */
  const mbd_gpu_model_ops *f; /* the model's family */
  void *model;                /* borrowed */
  int64_t scratch;            /* slot export overwrites */
  char *dev;                  /* [bytes] the regions back to back */
  size_t bytes;
  int64_t pos;                /* tokens the saved state had consumed */
};

/* The regions of slot `slot`; their count, or a negative status. */
static int regions(const mbd_gpu_model_ops *f, const void *model, int64_t slot,
                   mbd_gpu_region *r, mbd_error *err) {
  if (!f->slot_regions)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "the %s family reports no device regions of its state", f->name);
  int n = f->slot_regions((void *)model, slot, r, err);
  if (n > MBD_GPU_REGIONS_MAX)
    return mbd_error_set(err, MBD_E_INTERNAL, "%s: %d state regions, at most %d", f->name, n,
                         MBD_GPU_REGIONS_MAX);
  if (n == 0) return mbd_error_set(err, MBD_E_INTERNAL, "%s: no state regions", f->name);
  return n;
}

extern "C" size_t mbd_state_stash_bytes(const mbd_gpu_model_ops *f, void *model) {
  mbd_gpu_region r[MBD_GPU_REGIONS_MAX];
  mbd_error e = {};
  int n = regions(f, model, 0, r, &e);
  size_t sum = 0;
  for (int i = 0; i < n; i++) sum += r[i].bytes;
  return sum;
}

extern "C" int mbd_state_stash_new(mbd_gpu_ctx *ctx, const mbd_gpu_model_ops *f, void *model,
                                   int64_t scratch_slot, mbd_state_stash **out, mbd_error *err) {
  *out = NULL;
  size_t bytes = mbd_state_stash_bytes(f, model);
  if (!bytes)
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "the %s family keeps no device state copies",
                         f->name);
  mbd_state_stash *s = (mbd_state_stash *)calloc(1, sizeof *s);
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a state stash");
  int rc = mbd_gpu_alloc(ctx, bytes, (void **)&s->dev, err);
  if (rc) {
    (void)cudaGetLastError(); /* an out-of-memory must not stick to later calls */
    free(s);
    return rc;
  }
  s->ctx = ctx;
  s->f = f;
  s->model = model;
  s->scratch = scratch_slot;
  s->bytes = bytes;
  *out = s;
  return MBD_OK;
}

extern "C" void mbd_state_stash_free(mbd_state_stash **ps) {
  if (!ps || !*ps) return;
  mbd_gpu_free((*ps)->ctx, (*ps)->dev);
  free(*ps);
  *ps = NULL;
}

/* Copies between slot `slot` and the stash: to_stash or back. */
static int copy(const mbd_state_stash *s, const void *model, int64_t slot, bool to_stash,
                mbd_error *err) {
  if (model != s->model)
    return mbd_error_set(err, MBD_E_INVALID, "a state stash of one model used with another");
  mbd_gpu_region r[MBD_GPU_REGIONS_MAX];
  int n = regions(s->f, model, slot, r, err);
  if (n < 0) return n;
  cudaStream_t st = (cudaStream_t)mbd_gpu_ctx_stream(s->ctx);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].bytes > s->bytes - off)
      return mbd_error_set(err, MBD_E_INTERNAL, "state regions outgrew their stash");
    void *dst = to_stash ? s->dev + off : r[i].ptr;
    const void *src = to_stash ? (const void *)r[i].ptr : s->dev + off;
    MBD_GPU_CHECK(cudaMemcpyAsync(dst, src, r[i].bytes, cudaMemcpyDeviceToDevice, st), err);
    off += r[i].bytes;
  }
  return MBD_OK;
}

extern "C" int mbd_state_stash_save(mbd_state_stash *s, const void *model, int64_t slot,
                                    int64_t pos, mbd_error *err) {
  int rc = copy(s, model, slot, true, err);
  if (!rc) s->pos = pos;
  return rc;
}

extern "C" int mbd_state_stash_load(const mbd_state_stash *s, const void *model, int64_t slot,
                                    int64_t *pos, mbd_error *err) {
  int rc = copy(s, model, slot, false, err);
  if (!rc) *pos = s->pos;
  return rc;
}

extern "C" int mbd_state_stash_export(const mbd_state_stash *s, void *dst, size_t cap,
                                      mbd_error *err) {
  size_t need = MBD_STATE_IMAGE_HEADER + s->f->state_payload(s->model);
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "state stash export needs %zu bytes, buffer has %zu",
                         need, cap);
  int64_t pos = 0;
  int rc = mbd_state_stash_load(s, s->model, s->scratch, &pos, err);
  if (rc) return rc;
  unsigned char *p = (unsigned char *)dst;
  mbd_state_shape shape = s->f->state_shape(s->model);
  mbd_state_image_write_header(p, &shape, pos);
  /* slot_read waits for the stream, so the copy into the scratch slot is done. */
  return s->f->slot_read(s->model, s->scratch, p + MBD_STATE_IMAGE_HEADER,
                         need - MBD_STATE_IMAGE_HEADER, err);
}
