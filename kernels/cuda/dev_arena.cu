/* Device allocations of a GPU model and weight uploads (dev_arena.h). */
#include "kernels/cuda/dev_arena.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/half.h"
#include "kernels/cuda/gpu_check.h"

int mbd_dev_arena_alloc(mbd_dev_arena *a, size_t bytes, void **out, mbd_error *err) {
  *out = NULL;
  if (a->n == a->cap) {
    int nc = a->cap ? 2 * a->cap : 64;
    void **np = (void **)realloc(a->ptrs, (size_t)nc * sizeof(void *));
    if (!np) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
    a->ptrs = np;
    a->cap = nc;
  }
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 16);
  if (!mbd_gpu_status_ok(e))
    return mbd_error_set(err, MBD_E_NOMEM, "model: cudaMalloc of %zu bytes failed: %s", bytes,
                         mbd_gpu_status_name(e));
  a->ptrs[a->n++] = *out;
  return 0;
}

void mbd_dev_arena_free(mbd_dev_arena *a) {
  for (int i = 0; i < a->n; i++) cudaFree(a->ptrs[i]);
  free(a->ptrs);
  a->ptrs = NULL;
  a->n = a->cap = 0;
}

float mbd_dev_round_to(mbd_dtype dt, float v) {
  if (dt == MBD_DTYPE_BF16) return mbd_bf16_to_f32(mbd_f32_to_bf16(v));
  if (dt == MBD_DTYPE_F16) return mbd_f16_to_f32(mbd_f32_to_f16(v));
  return v;
}

int mbd_dev_arena_upload(mbd_dev_arena *a, mbd_dtype dt, const float *v, size_t n, int as_dtype,
                         void **out, mbd_error *err) {
  int rc = 0;
  size_t es = as_dtype ? mbd_dtype_size(dt) : 4;
  void *host = malloc(n * es + 4);
  if (!host) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  for (size_t i = 0; i < n; i++) {
    if (!as_dtype || dt == MBD_DTYPE_F32)
      ((float *)host)[i] = as_dtype ? v[i] : mbd_dev_round_to(dt, v[i]);
    else
      ((uint16_t *)host)[i] = dt == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(v[i]) : mbd_f32_to_f16(v[i]);
  }
  if ((rc = mbd_dev_arena_alloc(a, n * es, out, err))) goto fail;
  MBD_GPU_TRY(cudaMemcpy(*out, host, n * es, cudaMemcpyHostToDevice), err);
  a->param_bytes += n * mbd_dtype_size(dt);
fail:
  free(host);
  return rc;
}

int mbd_dev_arena_load(mbd_dev_arena *a, mbd_dtype dt, const mbd_st_dir *st, const char *name,
                       int ndim, const int64_t *shape, int as_dtype, void **out, mbd_error *err) {
  float *v = NULL;
  size_t n = 0;
  int rc = mbd_st_dir_read_f32(st, name, ndim, shape, &v, &n, err);
  if (!rc) rc = mbd_dev_arena_upload(a, dt, v, n, as_dtype, out, err);
  free(v);
  return rc;
}
