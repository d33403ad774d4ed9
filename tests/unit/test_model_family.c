/* Model family detection (kernels/model/family.h) and its use by the CPU
 * backend: config.json's model_type (or a state-spaces ssm_cfg.layer) picks
 * the family; one no family serves is refused naming it and the families of
 * this build; an unreadable config is left to the Mamba-1 loader's message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/model/family.h"

static char g_dir[64];

static void write_config(const char *text) {
  char p[128];
  snprintf(p, sizeof p, "%s/config.json", g_dir);
  if (!text) {
    unlink(p);
    return;
  }
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/mbd_family_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  write_config(NULL);
  rmdir(g_dir);
  return 0;
}

static void test_detect(void **state) {
  (void)state;
  const mbd_model_family *f = NULL;
  mbd_error err = {0};
  write_config("{\"model_type\": \"mamba\", \"hidden_size\": 64}");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba1");
  assert_non_null(f->cpu);
  assert_ptr_equal(mbd_model_family_find("mamba1"), f);
  assert_null(mbd_model_family_find("mamba9"));
  assert_null(mbd_model_family_find(NULL));

  write_config("{\"d_model\": 64, \"ssm_cfg\": {\"layer\": \"Mamba1\"}}");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba1");
  write_config("{\"d_model\": 64}"); /* state-spaces layout without a layer: Mamba-1 */
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba1");

  write_config("{\"model_type\": \"mamba2\"}");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba2");
  write_config("{\"model_type\": \"mamba9\"}");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_E_UNSUPPORTED);
  assert_null(f);
  assert_non_null(strstr(err.msg, "model_type 'mamba9'"));
  assert_non_null(strstr(err.msg, "mamba1 (model_type 'mamba')"));
  write_config("{\"d_model\": 64, \"ssm_cfg\": {\"layer\": \"Mamba9\"}}");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_E_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "ssm_cfg.layer 'Mamba9'"));

  /* Left to the Mamba-1 loader, which names the problem. */
  write_config("[1, 2]");
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba1");
  write_config(NULL);
  assert_int_equal(mbd_model_family_detect(g_dir, &f, &err), MBD_OK);
  assert_string_equal(f->name, "mamba1");
}

/* The CPU backend refuses a family it does not run before touching weights. */
static void test_backend_refuses(void **state) {
  (void)state;
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32, .threads = 1,
                        .state_capacity = 4, .max_batch = 4};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CPU, &o, &b, &err), MBD_OK);
  write_config("{\"model_type\": \"hyena\"}");
  mbd_bmodel *m = (mbd_bmodel *)1;
  assert_int_equal(b->ops->model_load(b, g_dir, &m, &err), MBD_E_UNSUPPORTED);
  assert_null(m);
  assert_non_null(strstr(err.msg, "'hyena'"));
  write_config("{\"model_type\": \"mamba\", \"hidden_size\": 64}"); /* no weights */
  assert_int_not_equal(b->ops->model_load(b, g_dir, &m, &err), MBD_OK);
  mbd_backend_destroy(&b);
  assert_null(b);
#ifndef MBD_HAVE_CUDA
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CUDA, &o, &b, &err), MBD_E_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "no CUDA backend"));
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_backend_refuses),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
