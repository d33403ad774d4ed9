/* CUDA context parts that need no GPU: config validation before any device
 * access, the kernel digest, and the clear "no CUDA device" error on machines
 * without one (CI). Skipped (77) in builds without the CUDA backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef MBD_HAVE_CUDA
#include "kernels/cuda/gpu_ctx.h"

static void test_config_rejected_before_device(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  assert_int_equal(cfg.decode, MBD_DECODE_PERSISTENT);
  mbd_gpu_ctx *ctx = (mbd_gpu_ctx *)&cfg; /* must be reset to NULL */
  cfg.family = MBD_FAMILY_TRIAD;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_UNSUPPORTED);
  assert_null(ctx);
  assert_non_null(strstr(err.msg, "triad"));
  cfg.family = MBD_FAMILY_INFERENCE;
  cfg.state_capacity = -1;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_INVALID);
  cfg.state_capacity = 1;
  cfg.mode = (mbd_gemm_mode)3;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_INVALID);
  cfg.mode = MBD_GEMM_DETERMINISTIC;
  cfg.decode = (mbd_decode_path)2;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "decode path 2"));
  assert_int_equal(mbd_gpu_ctx_new(NULL, &ctx, &err), MBD_E_INVALID);
  mbd_gpu_ctx_destroy(NULL);
  mbd_gpu_ctx *none = NULL;
  mbd_gpu_ctx_destroy(&none);
}

static void test_no_device_error(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  mbd_gpu_ctx *ctx = NULL;
  int rc = mbd_gpu_ctx_new(&cfg, &ctx, &err);
  if (rc == 0) { /* a GPU is present: the error path is not reachable here */
    mbd_gpu_ctx_destroy(&ctx);
    skip();
  }
  assert_int_equal(rc, MBD_E_DEVICE);
  assert_null(ctx);
  assert_non_null(strstr(err.msg, "no CUDA device: cudaGetDeviceCount returned"));
}

static void test_kernel_digest(void **st) {
  (void)st;
  char a[65], b[65];
  mbd_gpu_kernel_digest(a);
  mbd_gpu_kernel_digest(b);
  assert_string_equal(a, b);
  assert_int_equal(strlen(a), 64);
  assert_int_equal(strspn(a, "0123456789abcdef"), 64);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_rejected_before_device),
      cmocka_unit_test(test_no_device_error),
      cmocka_unit_test(test_kernel_digest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  printf("SKIP: built without the CUDA backend (MBD_HAVE_CUDA off)\n");
  return 77;
}
#endif
