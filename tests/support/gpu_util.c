/* GPU test helpers (see gpu_util.h). */
#include "support/gpu_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cuda/gpu_ctx.h"

void gpu_test_require_device(void) {
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  mbd_gpu_ctx *ctx = NULL;
  mbd_error err;
  mbd_error_clear(&err);
  if (mbd_gpu_ctx_new(&cfg, &ctx, &err) < 0) {
    if (strstr(err.msg, "no CUDA device")) {
      printf("SKIP: %s\n", err.msg);
      exit(77);
    }
    fprintf(stderr, "GPU context creation failed: %s\n", err.msg);
    exit(1);
  }
  mbd_gpu_ctx_destroy(&ctx);
}

uint64_t gpu_test_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float gpu_test_uniform(uint64_t *s) {
  return (float)((double)(gpu_test_rng(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

void gpu_test_fill(mbd_dtype dt, size_t n, uint64_t *seed, void *dst, float *f) {
  for (size_t i = 0; i < n; i++) {
    float v = gpu_test_uniform(seed);
    if (dt == MBD_DTYPE_F32) {
      ((float *)dst)[i] = v;
    } else {
      uint16_t h = dt == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(v) : mbd_f32_to_f16(v);
      ((uint16_t *)dst)[i] = h;
      v = dt == MBD_DTYPE_BF16 ? mbd_bf16_to_f32(h) : mbd_f16_to_f32(h);
    }
    if (f) f[i] = v;
  }
}

float gpu_test_tf32(float v) {
  uint32_t u = mbd_f32_to_bits(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;
  u += 0x1000u;
  u &= 0xffffe000u;
  return mbd_bits_to_f32(u);
}
