/* The backend interface over the CPU backend, on a synthetic Mamba-1
 * checkpoint: the batched prefill (ops->prefill_batch and the per-state
 * fallback of mbd_backend_prefill_batch) gives the bits of separate prefills
 * and of a stateless forward; states export the family's image
 * (kernels/state_blob.h) and round-trip through it; a batched step gives
 * each state its solo bits. memcmp throughout: the contract is bit-identity.
 * A bf16 state is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/model/synth.h"
#include "kernels/state_blob.h"

#define NB 3 /* rows */
#define NT 5 /* tokens per row */

static char g_dir[64];
static mbd_backend *g_be;
static mbd_bmodel *g_m;
static int64_t g_v;
static int64_t g_ids[NB * NT];

static int setup(void **state) {
  (void)state;
  mbd_error err = {0};
  snprintf(g_dir, sizeof g_dir, "/tmp/mbd_becpu_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  mbd_mamba_config cfg;
  mbd_synth_custom(32, 2, 64, &cfg);
  if (mbd_synth_write(&cfg, MBD_DTYPE_F32, 9, g_dir, &err)) return -1;
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32, .threads = 2,
                        .state_capacity = 8, .max_batch = 8};
  if (mbd_backend_new(MBD_BACKEND_CPU, &o, &g_be, &err) ||
      g_be->ops->model_load(g_be, g_dir, &g_m, &err)) {
    fprintf(stderr, "setup: %s\n", err.msg);
    return -1;
  }
  g_v = g_be->ops->model_vocab(g_m);
  for (int i = 0; i < NB * NT; i++) g_ids[i] = (i * 37 + 11) % g_v;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (g_m) g_be->ops->model_destroy(g_be, g_m);
  mbd_backend_destroy(&g_be);
  char p[128];
  snprintf(p, sizeof p, "%s/config.json", g_dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
  unlink(p);
  rmdir(g_dir);
  return 0;
}

static void states_new(mbd_bstate **st, int n) {
  mbd_error err = {0};
  for (int i = 0; i < n; i++) assert_int_equal(g_be->ops->state_new(g_be, g_m, &st[i], &err), 0);
}

static void states_free(mbd_bstate **st, int n) {
  for (int i = 0; i < n; i++) g_be->ops->state_free(g_be, st[i]);
}

/* State images of n states, concatenated into a new buffer. */
static uint8_t *images(mbd_bstate *const *st, int n, size_t *each) {
  mbd_error err = {0};
  *each = g_be->ops->state_bytes(st[0]);
  uint8_t *buf = malloc(*each * (size_t)n);
  for (int i = 0; i < n; i++)
    assert_int_equal(g_be->ops->state_save(st[i], buf + *each * (size_t)i, *each, &err), 0);
  return buf;
}

static void test_prefill_batch_bits(void **state) {
  (void)state;
  mbd_error err = {0};
  const size_t nl = (size_t)NB * NT * (size_t)g_v;
  float *batch = malloc(nl * sizeof(float)), *solo = malloc(nl * sizeof(float));
  float *fwd = malloc(nl * sizeof(float)), *fb = malloc(nl * sizeof(float));
  float *last = malloc((size_t)NB * (size_t)g_v * sizeof(float));
  mbd_bstate *a[NB], *b[NB], *c[NB];
  states_new(a, NB);
  states_new(b, NB);
  states_new(c, NB);
  assert_non_null(g_be->ops->prefill_batch);
  assert_int_equal(mbd_backend_prefill_batch(g_be, g_m, a, NB, g_ids, NT, false, batch, &err), 0);
  for (int i = 0; i < NB; i++)
    assert_int_equal(g_be->ops->prefill(g_be, g_m, b[i], g_ids + i * NT, NT, false,
                                        solo + (size_t)i * NT * (size_t)g_v, &err),
                     0);
  assert_memory_equal(batch, solo, nl * sizeof(float));
  assert_int_equal(g_be->ops->forward(g_be, g_m, g_ids, NB, NT, false, fwd, &err), 0);
  assert_memory_equal(batch, fwd, nl * sizeof(float));

  /* The fallback for backends without prefill_batch: one prefill per state. */
  mbd_backend_ops ops = *g_be->ops;
  ops.prefill_batch = NULL;
  mbd_backend plain = {.ops = &ops, .impl = g_be->impl};
  assert_int_equal(mbd_backend_prefill_batch(&plain, g_m, c, NB, g_ids, NT, false, fb, &err), 0);
  assert_memory_equal(batch, fb, nl * sizeof(float));

  size_t each = 0, each2 = 0;
  uint8_t *ia = images(a, NB, &each), *ib = images(b, NB, &each2);
  assert_int_equal(each, each2);
  assert_memory_equal(ia, ib, each * NB);
  assert_memory_equal(ia, MBD_STATE_IMAGE_MAGIC, 8);
  assert_int_equal(ia[28], MBD_STATE_FAMILY_MAMBA1);
  assert_int_equal(ia[32], NT); /* position */
  free(ib);

  /* last_only gives the last rows of the full logits. */
  mbd_bstate *d[NB];
  states_new(d, NB);
  assert_int_equal(mbd_backend_prefill_batch(g_be, g_m, d, NB, g_ids, NT, true, last, &err), 0);
  for (int i = 0; i < NB; i++)
    assert_memory_equal(last + (size_t)i * (size_t)g_v,
                        batch + ((size_t)i * NT + NT - 1) * (size_t)g_v, (size_t)g_v * sizeof(float));

  /* One batched step = each state stepped alone; an imported image continues alike. */
  int64_t tok[NB] = {1, 2, 3};
  float *sb = malloc((size_t)NB * (size_t)g_v * sizeof(float));
  float *s1 = malloc((size_t)NB * (size_t)g_v * sizeof(float));
  assert_int_equal(g_be->ops->step(g_be, g_m, a, tok, NB, sb, &err), 0);
  for (int i = 0; i < NB; i++) {
    assert_int_equal(g_be->ops->state_load(c[i], ia + each * (size_t)i, each, &err), 0);
    assert_int_equal(g_be->ops->step(g_be, g_m, &c[i], &tok[i], 1, s1 + (size_t)i * (size_t)g_v,
                                     &err),
                     0);
  }
  assert_memory_equal(sb, s1, (size_t)NB * (size_t)g_v * sizeof(float));

  /* Bad input fails the call and names the token. */
  int64_t bad[NT] = {0, 1, g_v, 2, 3};
  assert_int_equal(mbd_backend_prefill_batch(g_be, g_m, d, 1, bad, NT, true, last, &err),
                   MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "position 2"));
  uint8_t junk[64] = {0};
  assert_int_equal(g_be->ops->state_load(d[0], junk, sizeof junk, &err), MBD_E_FORMAT);

  states_free(a, NB);
  states_free(b, NB);
  states_free(c, NB);
  states_free(d, NB);
  free(ia);
  free(sb);
  free(s1);
  free(batch);
  free(solo);
  free(fwd);
  free(fb);
  free(last);
}

/* A bf16 recurrent state is a Mamba-2-on-CUDA route: the CPU backend
 * refuses it when created, saying so; its route states state=f32. */
static void test_state_dtype(void **state) {
  (void)state;
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state = MBD_STATE_BF16, .threads = 1, .state_capacity = 2,
                        .max_batch = 2};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CPU, &o, &b, &err), MBD_E_UNSUPPORTED);
  assert_null(b);
  assert_non_null(
      strstr(err.msg, "state dtype bf16 is supported for Mamba-1 and Mamba-2 on CUDA only"));
  mbd_route_identity r;
  g_be->ops->route(g_be, &r);
  assert_int_equal(r.state, MBD_STATE_F32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_batch_bits),
      cmocka_unit_test(test_state_dtype),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
