/* CUDA context parts that need no GPU: MBD_GEMM_MODE parsing (invalid and
 * non-UTF-8 values name the three valid modes), env precedence, config
 * validation before any device access, the kernel digest, and the clear
 * "no CUDA device" error on machines without one (CI). Skipped (77) in builds
 * without the CUDA backend. */
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

static void assert_names_all_modes(const char *msg) {
  assert_non_null(strstr(msg, "deterministic"));
  assert_non_null(strstr(msg, "cublas-fast"));
  assert_non_null(strstr(msg, "cublas-pedantic"));
  assert_non_null(strstr(msg, "MBD_GEMM_MODE"));
}

static void test_env_value_parsing(void **st) {
  (void)st;
  mbd_error err;
  mbd_gemm_mode m = MBD_GEMM_CUBLAS_FAST;
  assert_int_equal(mbd_gpu_mode_from_env_value(NULL, MBD_GEMM_DETERMINISTIC, &m, &err), 0);
  assert_int_equal(m, MBD_GEMM_DETERMINISTIC);
  assert_int_equal(mbd_gpu_mode_from_env_value("cublas-pedantic", MBD_GEMM_DETERMINISTIC, &m, &err), 0);
  assert_int_equal(m, MBD_GEMM_CUBLAS_PEDANTIC);
  assert_int_equal(mbd_gpu_mode_from_env_value("cublas-fast", MBD_GEMM_DETERMINISTIC, &m, &err), 0);
  assert_int_equal(m, MBD_GEMM_CUBLAS_FAST);
  m = MBD_GEMM_DETERMINISTIC;
  const char *bad[] = {"", "fast", "Deterministic", "cublas-fast ", "\xff\xfe", "cublas\xc3("};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mbd_error_clear(&err);
    assert_int_equal(mbd_gpu_mode_from_env_value(bad[i], MBD_GEMM_DETERMINISTIC, &m, &err),
                     MBD_E_INVALID);
    assert_int_equal(err.code, MBD_E_INVALID);
    assert_names_all_modes(err.msg);
    assert_int_equal(m, MBD_GEMM_DETERMINISTIC); /* untouched on error */
    for (const char *p = err.msg; *p; p++) assert_true((unsigned char)*p < 0x80); /* escaped */
  }
}

static void test_new_from_env_rejects_before_device(void **st) {
  (void)st;
  mbd_error err;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  mbd_gpu_ctx *ctx = (mbd_gpu_ctx *)&cfg; /* must be reset to NULL */
  setenv("MBD_GEMM_MODE", "turbo", 1);
  assert_int_equal(mbd_gpu_ctx_new_from_env(&cfg, &ctx, &err), MBD_E_INVALID);
  assert_names_all_modes(err.msg);
  unsetenv("MBD_GEMM_MODE");
  cfg.family = MBD_FAMILY_TRIAD;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_UNSUPPORTED);
  assert_null(ctx);
  assert_non_null(strstr(err.msg, "triad"));
  cfg.family = MBD_FAMILY_INFERENCE;
  cfg.state_capacity = -1;
  assert_int_equal(mbd_gpu_ctx_new(&cfg, &ctx, &err), MBD_E_INVALID);
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
      cmocka_unit_test(test_env_value_parsing),
      cmocka_unit_test(test_new_from_env_rejects_before_device),
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
