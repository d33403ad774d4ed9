/* Tensor descriptor helpers: names, parsing, overflow-checked sizes. */
#include "common/tensor.h"

#include <stdio.h>
#include <strings.h>

size_t mbd_dtype_size(mbd_dtype dt) {
  switch (dt) {
    case MBD_DTYPE_F32: return 4;
    case MBD_DTYPE_BF16: return 2;
    case MBD_DTYPE_F16: return 2;
    case MBD_DTYPE_I64: return 8;
  }
  return 0;
}

const char *mbd_dtype_name(mbd_dtype dt) {
  switch (dt) {
    case MBD_DTYPE_F32: return "f32";
    case MBD_DTYPE_BF16: return "bf16";
    case MBD_DTYPE_F16: return "f16";
    case MBD_DTYPE_I64: return "i64";
  }
  return "?";
}

const char *mbd_dtype_st_name(mbd_dtype dt) {
  switch (dt) {
    case MBD_DTYPE_F32: return "F32";
    case MBD_DTYPE_BF16: return "BF16";
    case MBD_DTYPE_F16: return "F16";
    case MBD_DTYPE_I64: return "I64";
  }
  return "?";
}

int mbd_dtype_parse(const char *s, mbd_dtype *out, mbd_error *err) {
  static const mbd_dtype all[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16, MBD_DTYPE_I64};
  for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++) {
    if (!strcasecmp(s, mbd_dtype_name(all[i]))) {
      *out = all[i];
      return MBD_OK;
    }
  }
  return mbd_error_set(err, MBD_E_INVALID, "unknown dtype '%s' (valid: f32, bf16, f16, i64)",
                       s ? s : "(null)");
}

int mbd_tensor_desc_make(mbd_tensor_desc *d, mbd_dtype dt, int ndim, const int64_t *shape,
                         mbd_error *err) {
  if (ndim < 0 || ndim > MBD_MAX_DIMS)
    return mbd_error_set(err, MBD_E_SHAPE, "tensor has %d dims (at most %d supported)", ndim,
                         MBD_MAX_DIMS);
  d->dtype = dt;
  d->ndim = ndim;
  for (int i = 0; i < MBD_MAX_DIMS; i++) d->shape[i] = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return mbd_error_set(err, MBD_E_SHAPE, "tensor dim %d is negative (%lld)", i,
                           (long long)shape[i]);
    d->shape[i] = shape[i];
  }
  return MBD_OK;
}

int mbd_tensor_desc_numel(const mbd_tensor_desc *d, size_t *out, mbd_error *err) {
  if (d->ndim < 0 || d->ndim > MBD_MAX_DIMS)
    return mbd_error_set(err, MBD_E_SHAPE, "tensor has %d dims", d->ndim);
  size_t n = 1;
  for (int i = 0; i < d->ndim; i++) {
    if (d->shape[i] < 0) return mbd_error_set(err, MBD_E_SHAPE, "negative tensor dim");
    if (__builtin_mul_overflow(n, (size_t)d->shape[i], &n))
      return mbd_error_set(err, MBD_E_TOO_LARGE, "tensor element count overflows");
  }
  *out = n;
  return MBD_OK;
}

int mbd_tensor_desc_nbytes(const mbd_tensor_desc *d, size_t *out, mbd_error *err) {
  size_t n;
  int rc = mbd_tensor_desc_numel(d, &n, err);
  if (rc) return rc;
  size_t es = mbd_dtype_size(d->dtype);
  if (!es) return mbd_error_set(err, MBD_E_INVALID, "bad dtype %d", (int)d->dtype);
  if (__builtin_mul_overflow(n, es, out))
    return mbd_error_set(err, MBD_E_TOO_LARGE, "tensor byte size overflows");
  return MBD_OK;
}

void mbd_tensor_desc_format(const mbd_tensor_desc *d, char *buf, size_t cap) {
  if (!cap) return;
  size_t n = (size_t)snprintf(buf, cap, "%s[", mbd_dtype_name(d->dtype));
  for (int i = 0; i < d->ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)d->shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}
