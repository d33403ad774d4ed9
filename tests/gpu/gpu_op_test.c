/* The GPU op tests' shared checks and buffers (see gpu_op_test.h). */
#include "tests/gpu/gpu_op_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/half.h"
#include "support/gpu_util.h"

void *dput(const void *h, size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n ? n : 16));
  if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  return d;
}

void *dzero(size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n ? n : 16));
  CK(cudaMemset(d, 0, n ? n : 16));
  return d;
}

void dget(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

void dfree(void *d) {
  if (d) CK(cudaFree(d));
}

size_t dsize(mbd_dtype dt) { return dt == MBD_DTYPE_F32 ? 4 : 2; }

float round_to(mbd_dtype dt, float v) {
  if (dt == MBD_DTYPE_BF16) return mbd_bf16_to_f32(mbd_f32_to_bf16(v));
  if (dt == MBD_DTYPE_F16) return mbd_f16_to_f32(mbd_f32_to_f16(v));
  return v;
}

void store(mbd_dtype dt, void *buf, size_t i, float v) {
  if (dt == MBD_DTYPE_F32)
    ((float *)buf)[i] = v;
  else if (dt == MBD_DTYPE_BF16)
    ((uint16_t *)buf)[i] = mbd_f32_to_bf16(v);
  else
    ((uint16_t *)buf)[i] = mbd_f32_to_f16(v);
}

float load(mbd_dtype dt, const void *buf, size_t i) {
  if (dt == MBD_DTYPE_F32) return ((const float *)buf)[i];
  if (dt == MBD_DTYPE_BF16) return mbd_bf16_to_f32(((const uint16_t *)buf)[i]);
  return mbd_f16_to_f32(((const uint16_t *)buf)[i]);
}

void *fill(mbd_dtype dt, size_t n, uint64_t *seed, float lo, float hi, float *f) {
  void *h = malloc(n * dsize(dt) + 16);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) {
    float v = lo + (hi - lo) * 0.5f * (gpu_test_uniform(seed) + 1.0f);
    store(dt, h, i, v);
    if (f) f[i] = load(dt, h, i);
  }
  return h;
}

float *fillf(size_t n, uint64_t *seed, float lo, float hi) {
  return fill(MBD_DTYPE_F32, n, seed, lo, hi, NULL);
}

void same_bytes(const char *what, const void *got, const void *want, size_t n, size_t es) {
  if (!memcmp(got, want, n * es)) return;
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) {
      uint32_t g = 0, w = 0;
      memcpy(&g, (const char *)got + i * es, es);
      memcpy(&w, (const char *)want + i * es, es);
      fail_msg("%s: element %zu of %zu differs: 0x%08x (tested) vs 0x%08x (reference)", what, i,
               n, g, w);
    }
}
