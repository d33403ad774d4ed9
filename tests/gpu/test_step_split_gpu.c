/* The CUDA backend's split step (step_launch / step_wait, kernels/backend.h)
 * on a synthetic Mamba-1 checkpoint (deterministic f32 route): a loop of
 * launched steps, fed their own device-picked tokens, gives the next tokens,
 * logits rows [0, nlogits) and final states of the same loop run with
 * step_greedy, bit for bit; other calls between a launch and its wait (a
 * state export, a new state, a prefill of another state) are ordered after
 * the step and leave it intact; a second launch before the wait is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gpu_util.h"
#include "kernels/backend.h"
#include "kernels/model/synth.h"

#define NB 3    /* rows */
#define NT 5    /* prompt tokens */
#define STEPS 8 /* steps of the loop */

static char g_dir[64];
static mbd_backend *g_be;
static mbd_bmodel *g_m;
static int64_t g_v;

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  mbd_error err = {0};
  snprintf(g_dir, sizeof g_dir, "/tmp/mbd_split_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  mbd_mamba_config cfg;
  mbd_synth_custom(64, 2, 96, &cfg);
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state_capacity = 12, .max_batch = 4, .device = 0};
  if (mbd_synth_write(&cfg, MBD_DTYPE_F32, 3, g_dir, &err) ||
      mbd_backend_new(MBD_BACKEND_CUDA, &o, &g_be, &err) ||
      g_be->ops->model_load(g_be, g_dir, &g_m, &err)) {
    fprintf(stderr, "setup: %s\n", err.msg);
    return -1;
  }
  g_v = g_be->ops->model_vocab(g_m);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (g_m) g_be->ops->model_destroy(g_be, g_m);
  mbd_backend_destroy(&g_be);
  char cmd[100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  return 0;
}

/* NB fresh states, each fed its own prompt. */
static void prefilled(mbd_bstate **st) {
  mbd_error err = {0};
  float *l = malloc((size_t)g_v * sizeof(float));
  for (int i = 0; i < NB; i++) {
    int64_t ids[NT];
    for (int t = 0; t < NT; t++) ids[t] = (i * 31 + t * 7 + 3) % g_v;
    assert_int_equal(g_be->ops->state_new(g_be, g_m, &st[i], &err), 0);
    assert_int_equal(g_be->ops->prefill(g_be, g_m, st[i], ids, NT, true, l, &err), 0);
  }
  free(l);
}

static void test_split_equals_greedy(void **state) {
  (void)state;
  mbd_error err = {0};
  const size_t nv = (size_t)NB * (size_t)g_v;
  assert_non_null(g_be->ops->step_launch);
  assert_non_null(g_be->ops->step_wait);
  assert_true(mbd_backend_picks(g_be));
  mbd_bstate *a[NB], *b[NB], *other = NULL;
  prefilled(a);
  prefilled(b);
  float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
  int64_t ta[NB] = {1, 2, 3}, tb[NB] = {1, 2, 3}, na[NB], nb[NB];
  size_t each = g_be->ops->state_bytes(a[0]);
  uint8_t *ia = malloc(each), *ib = malloc(each);
  for (int k = 0; k < STEPS; k++) {
    int64_t nl = k % (NB + 1); /* 0..NB logits rows */
    assert_int_equal(g_be->ops->step_greedy(g_be, g_m, a, ta, NB, na, la, &err), 0);
    memset(lb, 0xff, nv * sizeof(float));
    assert_int_equal(mbd_backend_step_launch(g_be, g_m, b, tb, NB, nb, lb, nl, &err), 0);
    assert_int_equal(mbd_backend_step_launch(g_be, g_m, b, tb, NB, nb, lb, nl, &err),
                     MBD_E_STATE); /* one launched step at a time */
    if (k == 2) assert_int_equal(g_be->ops->state_save(b[0], ib, each, &err), 0);
    if (k == 4) assert_int_equal(g_be->ops->state_new(g_be, g_m, &other, &err), 0);
    if (k == 5) {
      int64_t ids[NT] = {4, 5, 6, 7, 8};
      float *l = malloc((size_t)g_v * sizeof(float));
      assert_int_equal(g_be->ops->prefill(g_be, g_m, other, ids, NT, true, l, &err), 0);
      free(l);
    }
    assert_int_equal(mbd_backend_step_wait(g_be, &err), 0);
    assert_memory_equal(nb, na, sizeof na);
    if (nl) assert_memory_equal(lb, la, (size_t)nl * (size_t)g_v * sizeof(float));
    if (k == 2) { /* exported between launch and wait: the state after this step */
      assert_int_equal(g_be->ops->state_save(a[0], ia, each, &err), 0);
      assert_memory_equal(ib, ia, each);
    }
    memcpy(ta, na, sizeof ta);
    memcpy(tb, nb, sizeof tb);
  }
  for (int i = 0; i < NB; i++) {
    assert_int_equal(g_be->ops->state_save(a[i], ia, each, &err), 0);
    assert_int_equal(g_be->ops->state_save(b[i], ib, each, &err), 0);
    assert_memory_equal(ia, ib, each);
  }
  assert_int_equal(mbd_backend_step_wait(g_be, &err), 0); /* nothing launched: nothing to do */
  for (int i = 0; i < NB; i++) {
    g_be->ops->state_free(g_be, a[i]);
    g_be->ops->state_free(g_be, b[i]);
  }
  g_be->ops->state_free(g_be, other);
  free(ia);
  free(ib);
  free(la);
  free(lb);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_split_equals_greedy)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
