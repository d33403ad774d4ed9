/* The backend interface over the CUDA backend, on a synthetic Mamba-1
 * checkpoint (deterministic f32 route): a sharded copy of the checkpoint
 * (model.safetensors.index.json) loads to the same bits as the single file
 * (the one weight reader, mbd_st_dir); the batched prefill gives the bits of
 * separate prefills and of a stateless forward; step_greedy gives step's
 * logits and their argmax; a state image exported by the CPU backend imports
 * on the GPU and exports again byte for byte (one state format). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "support/gpu_util.h"
#include "kernels/backend.h"
#include "kernels/model/synth.h"
#include "kernels/state_blob.h"

#define NB 3 /* rows */
#define NT 5 /* tokens per row */

static char g_one[64], g_shard[64]; /* single-file and sharded checkpoint */
static mbd_backend *g_be;
static mbd_bmodel *g_m;
static int64_t g_v;
static int64_t g_ids[NB * NT];

static void rm_dir(const char *dir) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (dir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Copies g_one's tensors into two shards and an index in g_shard. */
static int write_shards(mbd_error *err) {
  char path[160];
  snprintf(path, sizeof path, "%s/model.safetensors", g_one);
  mbd_safetensors *src = NULL;
  mbd_st_writer *w[2] = {NULL, NULL};
  int rc = mbd_safetensors_open(path, &src, err);
  if (!rc) rc = mbd_st_writer_new(&w[0], err);
  if (!rc) rc = mbd_st_writer_new(&w[1], err);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_shard);
  FILE *idx = rc ? NULL : fopen(path, "w");
  if (!idx) rc = rc ? rc : mbd_error_set(err, MBD_E_IO, "cannot write %s", path);
  if (idx) fprintf(idx, "{\"weight_map\": {");
  for (size_t i = 0; !rc && i < mbd_safetensors_count(src); i++) {
    const mbd_st_entry *e = mbd_safetensors_at(src, i);
    rc = mbd_st_writer_add(w[i % 2], e->name, &e->desc, e->data, err);
    fprintf(idx, "%s\"%s\": \"s%zu.safetensors\"", i ? ", " : "", e->name, i % 2);
  }
  if (idx) {
    fprintf(idx, "}}\n");
    fclose(idx);
  }
  for (int k = 0; k < 2 && !rc; k++) {
    snprintf(path, sizeof path, "%s/s%d.safetensors", g_shard, k);
    rc = mbd_st_writer_write(w[k], path, err);
  }
  mbd_st_writer_destroy(&w[0]);
  mbd_st_writer_destroy(&w[1]);
  mbd_safetensors_destroy(&src);
  if (!rc) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/'", g_one, g_shard);
    if (system(cmd) != 0) rc = mbd_error_set(err, MBD_E_IO, "cannot copy config.json");
  }
  return rc;
}

static mbd_backend_opts cuda_opts(void) {
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state_capacity = 8, .max_batch = 4, .device = 0};
  return o;
}

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  mbd_error err = {0};
  snprintf(g_one, sizeof g_one, "/tmp/mbd_becuda1_XXXXXX");
  snprintf(g_shard, sizeof g_shard, "/tmp/mbd_becuda2_XXXXXX");
  if (!mkdtemp(g_one) || !mkdtemp(g_shard)) return -1;
  mbd_mamba_config cfg;
  mbd_synth_custom(64, 2, 96, &cfg);
  mbd_backend_opts o = cuda_opts();
  if (mbd_synth_write(&cfg, MBD_DTYPE_F32, 3, g_one, &err) || write_shards(&err) ||
      mbd_backend_new(MBD_BACKEND_CUDA, &o, &g_be, &err) ||
      g_be->ops->model_load(g_be, g_one, &g_m, &err)) {
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
  rm_dir(g_one);
  rm_dir(g_shard);
  return 0;
}

static void states_new(mbd_backend *be, mbd_bmodel *m, mbd_bstate **st, int n) {
  mbd_error err = {0};
  for (int i = 0; i < n; i++) assert_int_equal(be->ops->state_new(be, m, &st[i], &err), 0);
}

static void states_free(mbd_backend *be, mbd_bstate **st, int n) {
  for (int i = 0; i < n; i++) be->ops->state_free(be, st[i]);
}

static void test_sharded_load(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_bmodel *m2 = NULL;
  assert_int_equal(g_be->ops->model_load(g_be, g_shard, &m2, &err), 0);
  const size_t nl = (size_t)NB * NT * (size_t)g_v;
  float *a = malloc(nl * sizeof(float)), *b = malloc(nl * sizeof(float));
  assert_int_equal(g_be->ops->forward(g_be, g_m, g_ids, NB, NT, false, a, &err), 0);
  assert_int_equal(g_be->ops->forward(g_be, m2, g_ids, NB, NT, false, b, &err), 0);
  assert_memory_equal(a, b, nl * sizeof(float));
  g_be->ops->model_destroy(g_be, m2);
  free(a);
  free(b);
}

static void test_prefill_batch_and_greedy(void **state) {
  (void)state;
  mbd_error err = {0};
  const size_t nl = (size_t)NB * NT * (size_t)g_v, nv = (size_t)NB * (size_t)g_v;
  float *batch = malloc(nl * sizeof(float)), *solo = malloc(nl * sizeof(float));
  float *fwd = malloc(nl * sizeof(float));
  float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
  mbd_bstate *a[NB], *b[NB];
  states_new(g_be, g_m, a, NB);
  states_new(g_be, g_m, b, NB);
  assert_non_null(g_be->ops->prefill_batch);
  assert_int_equal(mbd_backend_prefill_batch(g_be, g_m, a, NB, g_ids, NT, false, batch, &err), 0);
  for (int i = 0; i < NB; i++)
    assert_int_equal(g_be->ops->prefill(g_be, g_m, b[i], g_ids + i * NT, NT, false,
                                        solo + (size_t)i * NT * (size_t)g_v, &err),
                     0);
  assert_memory_equal(batch, solo, nl * sizeof(float));
  assert_int_equal(g_be->ops->forward(g_be, g_m, g_ids, NB, NT, false, fwd, &err), 0);
  assert_memory_equal(batch, fwd, nl * sizeof(float));

  size_t each = g_be->ops->state_bytes(a[0]);
  uint8_t *ia = malloc(each), *ib = malloc(each);
  for (int i = 0; i < NB; i++) {
    assert_int_equal(g_be->ops->state_save(a[i], ia, each, &err), 0);
    assert_int_equal(g_be->ops->state_save(b[i], ib, each, &err), 0);
    assert_memory_equal(ia, ib, each);
  }
  assert_memory_equal(ia, MBD_STATE_IMAGE_MAGIC, 8);
  assert_int_equal(ia[28], MBD_STATE_FAMILY_MAMBA1);
  assert_int_equal(ia[32], NT);

  /* step_greedy: step's logits, and each row's argmax (lowest index on ties). */
  int64_t tok[NB] = {1, 2, 3}, next[NB] = {-1, -1, -1};
  assert_non_null(g_be->ops->step_greedy);
  assert_int_equal(g_be->ops->step(g_be, g_m, a, tok, NB, la, &err), 0);
  assert_int_equal(g_be->ops->step_greedy(g_be, g_m, b, tok, NB, next, lb, &err), 0);
  assert_memory_equal(la, lb, nv * sizeof(float));
  for (int i = 0; i < NB; i++) {
    int64_t best = 0;
    for (int64_t v = 1; v < g_v; v++)
      if (la[(size_t)i * (size_t)g_v + (size_t)v] > la[(size_t)i * (size_t)g_v + (size_t)best])
        best = v;
    assert_int_equal(next[i], best);
  }
  states_free(g_be, a, NB);
  states_free(g_be, b, NB);
  free(ia);
  free(ib);
  free(batch);
  free(solo);
  free(fwd);
  free(la);
  free(lb);
}

/* A CPU backend's state image imports on the GPU and exports unchanged. */
static void test_cpu_image_on_gpu(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32, .threads = 2,
                        .state_capacity = 2, .max_batch = 2};
  mbd_backend *cpu = NULL;
  mbd_bmodel *cm = NULL;
  mbd_bstate *cs = NULL, *gs = NULL;
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CPU, &o, &cpu, &err), 0);
  assert_int_equal(cpu->ops->model_load(cpu, g_one, &cm, &err), 0);
  states_new(cpu, cm, &cs, 1);
  float *l = malloc((size_t)g_v * sizeof(float));
  assert_int_equal(cpu->ops->prefill(cpu, cm, cs, g_ids, NT, true, l, &err), 0);
  size_t n = cpu->ops->state_bytes(cs);
  uint8_t *img = malloc(n), *back = malloc(n);
  assert_int_equal(cpu->ops->state_save(cs, img, n, &err), 0);
  states_new(g_be, g_m, &gs, 1);
  assert_int_equal(g_be->ops->state_bytes(gs), n);
  assert_int_equal(g_be->ops->state_load(gs, img, n, &err), 0);
  assert_int_equal(g_be->ops->state_save(gs, back, n, &err), 0);
  assert_memory_equal(img, back, n);
  img[28] = 1; /* another family */
  assert_int_equal(g_be->ops->state_load(gs, img, n, &err), MBD_E_SHAPE);
  states_free(g_be, &gs, 1);
  states_free(cpu, &cs, 1);
  cpu->ops->model_destroy(cpu, cm);
  mbd_backend_destroy(&cpu);
  free(img);
  free(back);
  free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sharded_load),
      cmocka_unit_test(test_prefill_batch_and_greedy),
      cmocka_unit_test(test_cpu_image_on_gpu),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
