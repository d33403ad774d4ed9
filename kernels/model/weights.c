/* Checkpoint tensors for the CPU models (see weights.h). */
#include "kernels/model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/portable_math.h"

/* v rounded through storage dtype dt (f32: v itself). */
static float round_to(mbd_dtype dt, float v) {
  if (dt == MBD_DTYPE_BF16) return mbd_bf16_to_f32(mbd_f32_to_bf16(v));
  if (dt == MBD_DTYPE_F16) return mbd_f16_to_f32(mbd_f32_to_f16(v));
  return v;
}

int mbd_weights_vec(const mbd_st_dir *s, const char *name, int ndim, const int64_t *shape,
                    mbd_dtype dt, float **out, size_t *bytes, mbd_error *err) {
  const mbd_st_entry *e = NULL;
  int rc = mbd_st_dir_get_float(s, name, ndim, shape, &e, err);
  if (rc) return rc;
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  float *v = malloc(n * sizeof(float) + 1);
  if (!v) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory loading %s", name);
  for (size_t i = 0; i < n; i++) v[i] = round_to(dt, mbd_st_entry_f32(e, i));
  if (bytes) *bytes += n * mbd_dtype_size(dt);
  *out = v;
  return MBD_OK;
}

int mbd_weights_mat(const mbd_st_dir *s, const char *name, int64_t rows, int64_t cols,
                    mbd_dtype dt, mbd_cpu_wpack **out, size_t *bytes, mbd_error *err) {
  const mbd_st_entry *e = NULL;
  int64_t shape[2] = {rows, cols};
  int rc = mbd_st_dir_get_float(s, name, 2, shape, &e, err);
  if (rc) return rc;
  const void *src = e->data;
  void *copy = NULL;
  if (((uintptr_t)src) % mbd_dtype_size(e->desc.dtype) != 0) { /* unaligned mapping */
    copy = malloc(e->nbytes);
    if (!copy) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory loading %s", name);
    memcpy(copy, src, e->nbytes);
    src = copy;
  }
  rc = mbd_cpu_wpack_new(dt, rows, cols, e->desc.dtype, src, cols, out, err);
  free(copy);
  if (rc) return mbd_error_prefix(err, "model tensor %s", name);
  if (bytes) *bytes += mbd_cpu_wpack_nbytes(*out);
  return MBD_OK;
}

/* The depthwise conv weight `name` [channels, 1, dc] as a new f32 array
 * [dc][channels], tap-major (the layout of mbd_cpu_conv_step), rounded
 * through dt; *bytes as mbd_weights_vec. */
static int load_conv(const mbd_st_dir *s, const char *name, int64_t channels, int64_t dc,
                     mbd_dtype dt, float **out, size_t *bytes, mbd_error *err) {
  int64_t shape[3] = {channels, 1, dc};
  float *cw = NULL;
  int rc = mbd_weights_vec(s, name, 3, shape, dt, &cw, bytes, err);
  if (rc) return rc;
  float *w = malloc((size_t)(channels * dc) * sizeof(float));
  if (!w) {
    free(cw);
    return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  }
  for (int64_t ch = 0; ch < channels; ch++)
    for (int64_t j = 0; j < dc; j++) w[j * channels + ch] = cw[ch * dc + j];
  free(cw);
  *out = w;
  return MBD_OK;
}

int mbd_weights_load_layer(const mbd_st_dir *s, int i, const mbd_weight_spec *w, size_t n,
                           mbd_dtype dt, void *layer, size_t *bytes, mbd_error *err) {
  char name[256];
  for (size_t k = 0; k < n; k++) {
    const mbd_weight_spec *t = &w[k];
    void *field = (char *)layer + t->offset;
    snprintf(name, sizeof name, "backbone.layers.%d.%s", i, t->suffix);
    int rc;
    switch (t->kind) {
    case MBD_WEIGHT_MAT:
      rc = mbd_weights_mat(s, name, t->shape[0], t->shape[1], dt, field, bytes, err);
      break;
    case MBD_WEIGHT_CONV:
      rc = load_conv(s, name, t->shape[0], t->shape[1], dt, field, bytes, err);
      break;
    default:
      rc = mbd_weights_vec(s, name, t->ndim, t->shape, t->f32 ? MBD_DTYPE_F32 : dt, field, bytes,
                           err);
    }
    if (rc) return rc;
    if (t->neg_exp) {
      float *v = *(float **)field;
      size_t nv = 1;
      for (int d = 0; d < t->ndim; d++) nv *= (size_t)t->shape[d];
      for (size_t j = 0; j < nv; j++) v[j] = -mbd_pm_expf(v[j]);
    }
  }
  return MBD_OK;
}

void mbd_weights_free_layer(const mbd_weight_spec *w, size_t n, void *layer) {
  for (size_t k = 0; k < n; k++) {
    void *field = (char *)layer + w[k].offset;
    if (w[k].kind == MBD_WEIGHT_MAT) {
      mbd_cpu_wpack_destroy((mbd_cpu_wpack **)field);
    } else {
      free(*(float **)field);
      *(float **)field = NULL;
    }
  }
}
