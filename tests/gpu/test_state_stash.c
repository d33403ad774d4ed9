/* State stashes through the backend interface on the CUDA backend, for the
 * tiny fixture of each family (Mamba-1, -2, -3; deterministic f32 route): a
 * stash saved from a session exports the bytes state_save writes; loading
 * it back into that session after more tokens, or into another session,
 * gives state_save's bytes again and the same logits for the next tokens as
 * a state_load of the image (memcmp). Exits 77 with a reason when no CUDA
 * device is present; a family whose fixture is missing is skipped with a
 * printed line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "support/gpu_util.h"

#define T0 37 /* tokens before the stash */
#define T1 5  /* tokens after it */

/* Token ids below min(V, 256) (a padded vocabulary's tail is never a token). */
static void ids_of(int64_t V, uint64_t seed, int64_t *ids, int n) {
  uint64_t lim = (uint64_t)(V < 256 ? V : 256);
  for (int i = 0; i < n; i++) ids[i] = (int64_t)(gpu_test_rng(&seed) % lim);
}

/* The stash contract on model dir (family/fixture under MBD_FIXTURES_DIR). */
static void check_family(const char *fixture) {
  const char *root = getenv("MBD_FIXTURES_DIR");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", root ? root : ".", fixture);
  char cfg[1100];
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  FILE *f = fopen(cfg, "r");
  if (!f) {
    printf("skipping %s: no fixture at %s (set MBD_FIXTURES_DIR)\n", fixture, dir);
    return;
  }
  fclose(f);
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state_capacity = 4, .max_batch = 2, .device = 0};
  mbd_backend *be = NULL;
  mbd_bmodel *m = NULL;
  mbd_error err = {0};
  if (mbd_backend_cuda_new(&o, &be, &err)) fail_msg("cuda backend: %s", err.msg);
  assert_non_null(be->ops->stash_new);
  if (be->ops->model_load(be, dir, &m, &err)) fail_msg("%s: %s", fixture, err.msg);
  int64_t V = be->ops->model_vocab(m);
  size_t sb = be->ops->stash_bytes(be, m);
  assert_true(sb > 0);
  mbd_bstate *a = NULL, *b = NULL, *c = NULL;
  assert_int_equal(be->ops->state_new(be, m, &a, &err), 0);
  assert_int_equal(be->ops->state_new(be, m, &b, &err), 0);
  assert_int_equal(be->ops->state_new(be, m, &c, &err), 0);
  int64_t ids0[T0], ids1[T1];
  ids_of(V, 11, ids0, T0);
  ids_of(V, 12, ids1, T1);
  float *lg = malloc((size_t)V * 4), *want = malloc((size_t)V * 4);
  size_t n = be->ops->state_bytes(a);
  uint8_t *img = malloc(n), *got = malloc(n);
  assert_non_null(lg && want && img && got);
  assert_int_equal(be->ops->prefill(be, m, a, ids0, T0, true, lg, &err), 0);
  assert_int_equal(be->ops->state_save(a, img, n, &err), 0);

  mbd_bstash *st = NULL;
  assert_int_equal(be->ops->stash_new(be, m, &st, &err), 0);
  assert_int_equal(be->ops->stash_save(be, st, a, &err), 0);
  /* Export: state_save's bytes, position included. */
  memset(got, 0xA5, n);
  assert_int_equal(be->ops->stash_export(be, st, got, n, &err), 0);
  assert_memory_equal(got, img, n);
  /* The reference continuation: the image loaded into b, then T1 tokens. */
  assert_int_equal(be->ops->state_load(b, img, n, &err), 0);
  assert_int_equal(be->ops->prefill(be, m, b, ids1, T1, true, want, &err), 0);
  /* a goes on, then comes back from the stash: the image, then the same logits. */
  assert_int_equal(be->ops->prefill(be, m, a, ids1, T1, true, lg, &err), 0);
  assert_memory_equal(lg, want, (size_t)V * 4);
  assert_int_equal(be->ops->stash_load(be, a, st, &err), 0);
  assert_int_equal(be->ops->state_save(a, got, n, &err), 0);
  assert_memory_equal(got, img, n);
  assert_int_equal(be->ops->prefill(be, m, a, ids1, T1, true, lg, &err), 0);
  assert_memory_equal(lg, want, (size_t)V * 4);
  /* Into another session. */
  assert_int_equal(be->ops->stash_load(be, c, st, &err), 0);
  assert_int_equal(be->ops->state_save(c, got, n, &err), 0);
  assert_memory_equal(got, img, n);
  assert_int_equal(be->ops->prefill(be, m, c, ids1, T1, true, lg, &err), 0);
  assert_memory_equal(lg, want, (size_t)V * 4);
  /* A too-small export buffer is refused. */
  assert_int_not_equal(be->ops->stash_export(be, st, got, n - 1, &err), 0);
  printf("%s: stash of %zu device bytes, image of %zu bytes: export, load and continuation "
         "equal state_save/state_load by memcmp\n",
         fixture, sb, n);

  be->ops->stash_free(be, st);
  be->ops->state_free(be, a);
  be->ops->state_free(be, b);
  be->ops->state_free(be, c);
  be->ops->model_destroy(be, m);
  mbd_backend_destroy(&be);
  free(lg);
  free(want);
  free(img);
  free(got);
}

static void test_mamba1(void **state) {
  (void)state;
  check_family("mamba1/tiny-d64");
}
static void test_mamba2(void **state) {
  (void)state;
  check_family("mamba2/tiny-d64-s16-c8");
}
static void test_mamba3(void **state) {
  (void)state;
  check_family("mamba3/tiny-d64-s16-c16");
}

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mamba1), cmocka_unit_test(test_mamba2),
                                     cmocka_unit_test(test_mamba3)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
