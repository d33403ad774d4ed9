/* Mamba-3 SISO on the CUDA backend against the CPU model (the f32 contract:
 * bit-identical logits and states, memcmp) and the state-spaces/mamba
 * fixtures: prefill and step-by-step logits equal the CPU's at every
 * position; prefill of T then decode == decode from the start; alone == any
 * slot of batches 2..B; a CPU state image continues on the GPU with the CPU's
 * bits; greedy picks equal the fixture's. Skips (77) without a device or the
 * fixtures. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cuda/mamba3_gpu.h"
#include "kernels/model/mamba3.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_model_test.h"

/* Fails the test with the call and its error (a local `err`). */
#define CHECK_OK(call)                                   \
  do {                                                   \
    if ((call) != 0) fail_msg("%s: %s", #call, err.msg); \
  } while (0)

static const char *cases[] = {"tiny-d64-s16-c16", "small-d256-s32-c16"};

static mbd_gpu_ctx *make_ctx(int64_t cap) {
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.policy = MBD_POLICY_F32;
  cfg.state_capacity = cap;
  mbd_gpu_ctx *ctx = NULL;
  mbd_error err = {0};
  CHECK_OK(mbd_gpu_ctx_new(&cfg, &ctx, &err));
  return ctx;
}

/* CPU reference of one sequence: logits [T, V] and its state image. */
static uint8_t *cpu_run(mbd_mamba3_model *m, const int32_t *tok, int64_t T, float *logits,
                        size_t *len) {
  mbd_mamba3_state *s = NULL;
  mbd_error err = {0};
  CHECK_OK(mbd_mamba3_state_new(m, &s, &err));
  CHECK_OK(mbd_mamba3_prefill(m, &s, 1, &tok, &T, MBD_LOGITS_ALL, logits, &err));
  *len = mbd_mamba3_state_export_size(s);
  uint8_t *img = malloc(*len);
  CHECK_OK(mbd_mamba3_state_export(s, img, *len, NULL, &err));
  mbd_mamba3_state_destroy(&s);
  return img;
}

static void test_gpu_vs_cpu(void **state) {
  (void)state;
  gpu_test_require_device();
  int ran = 0;
  for (int c = 0; c < 2; c++) {
    gmt_fixture f;
    if (gmt_fixture_load("mamba3", cases[c], &f)) continue;
    ran++;
    assert_non_null(f.greedy);
    const int B = (int)f.B, T = (int)f.T, V = (int)f.V;
    int32_t *ids = malloc((size_t)B * T * sizeof(int32_t)); /* the Mamba-3 entries' tokens */
    assert_non_null(ids);
    for (int i = 0; i < B * T; i++) ids[i] = (int32_t)f.ids[i];
    assert_true(B <= 8 && T <= 64); /* the local arrays below */
    mbd_error err = {0};
    mbd_mamba3_options o;
    mbd_mamba3_options_default(&o);
    mbd_mamba3_model *cpu = NULL;
    CHECK_OK(mbd_mamba3_load(f.dir, &o, &cpu, &err));
    mbd_gpu_ctx *ctx = make_ctx(32);
    mbd_mamba3_gpu *g = NULL;
    CHECK_OK(mbd_mamba3_gpu_load(ctx, f.dir, MBD_DTYPE_F32, 8, &g, &err));
    const size_t pay = mbd_mamba3_gpu_state_bytes(g);
    float *ref = malloc((size_t)B * T * V * 4), *got = malloc((size_t)B * T * V * 4);
    uint8_t *img[8];
    size_t ilen = 0;
    for (int b = 0; b < B; b++)
      img[b] = cpu_run(cpu, ids + b * T, T, ref + (size_t)b * T * V, &ilen);
    assert_int_equal(ilen, MBD_STATE_IMAGE_HEADER + pay);
    uint8_t *buf = malloc(pay);
    /* prefill, all sequences at once, slots 0..B-1 */
    int32_t slots[8];
    for (int b = 0; b < B; b++) {
      slots[b] = b;
      CHECK_OK(mbd_mamba3_gpu_slot_reset(g, b, &err));
    }
    CHECK_OK(mbd_mamba3_gpu_prefill(g, B, T, ids, slots, MBD_LOGITS_ALL, got, &err));
    assert_memory_equal(got, ref, (size_t)B * T * V * 4);
    for (int b = 0; b < B; b++) {
      CHECK_OK(mbd_mamba3_gpu_slot_read(g, b, buf, pay, &err));
      assert_memory_equal(buf, img[b] + MBD_STATE_IMAGE_HEADER, pay);
    }
    /* any slot of a batch of 2..B (sequences rotated through the slots) */
    for (int n = 2; n <= B; n++)
      for (int rot = 0; rot < n; rot++) {
        int32_t tk[8 * 64];
        for (int j = 0; j < n; j++) {
          slots[j] = 24 + j;
          CHECK_OK(mbd_mamba3_gpu_slot_reset(g, slots[j], &err));
          memcpy(tk + j * T, ids + ((j + rot) % n) * T, (size_t)T * sizeof(int32_t));
        }
        CHECK_OK(mbd_mamba3_gpu_prefill(g, n, T, tk, slots, MBD_LOGITS_ALL, got, &err));
        for (int j = 0; j < n; j++)
          assert_memory_equal(got + (size_t)j * T * V, ref + (size_t)((j + rot) % n) * T * V,
                              (size_t)T * V * 4);
      }
    /* step by step from the start, slots 10.., with greedy picks after */
    int32_t tok[8], next[8];
    for (int b = 0; b < B; b++) {
      slots[b] = 10 + b;
      CHECK_OK(mbd_mamba3_gpu_slot_reset(g, slots[b], &err));
    }
    float *row = malloc((size_t)B * V * 4);
    for (int t = 0; t < T; t++) {
      for (int b = 0; b < B; b++) tok[b] = ids[b * T + t];
      CHECK_OK(mbd_mamba3_gpu_step(g, B, tok, slots, next, row, &err));
      for (int b = 0; b < B; b++)
        assert_memory_equal(row + (size_t)b * V, ref + ((size_t)b * T + t) * V, (size_t)V * 4);
    }
    for (int k = 0; k < f.G; k++) {
      for (int b = 0; b < B; b++) {
        int64_t want = f.greedy[(size_t)b * (T + f.G) + T + k];
        if (next[b] != want) fail_msg("%s seq %d greedy %d: %d != %lld", cases[c], b, k, next[b],
                                      (long long)want);
        tok[b] = next[b];
      }
      CHECK_OK(mbd_mamba3_gpu_step(g, B, tok, slots, next, NULL, &err));
    }
    /* prefill of n then decode == the CPU's uninterrupted run, n across chunkings */
    static const int splits[] = {1, 2, 7, 16, 17};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
      const int n = splits[k] < T ? splits[k] : T - 1;
      int32_t s0 = 20;
      CHECK_OK(mbd_mamba3_gpu_slot_reset(g, s0, &err));
      CHECK_OK(mbd_mamba3_gpu_prefill(g, 1, n, ids, &s0, MBD_LOGITS_ALL, got, &err));
      for (int t = n; t < T; t++)
        CHECK_OK(mbd_mamba3_gpu_step(g, 1, ids + t, &s0, NULL, got + (size_t)t * V, &err));
      assert_memory_equal(got, ref, (size_t)T * V * 4);
      CHECK_OK(mbd_mamba3_gpu_slot_read(g, s0, buf, pay, &err));
      assert_memory_equal(buf, img[0] + MBD_STATE_IMAGE_HEADER, pay);
    }
    /* a CPU image mid-sequence continues on the GPU with the CPU's bits */
    {
      const int64_t h = T / 2;
      mbd_mamba3_state *s = NULL;
      CHECK_OK(mbd_mamba3_state_new(cpu, &s, &err));
      const int32_t *tp = ids + T;
      int64_t hl = h;
      CHECK_OK(mbd_mamba3_prefill(cpu, &s, 1, &tp, &hl, MBD_LOGITS_NONE, NULL, &err));
      uint8_t *mid = malloc(ilen);
      CHECK_OK(mbd_mamba3_state_export(s, mid, ilen, NULL, &err));
      int32_t s0 = 21;
      CHECK_OK(mbd_mamba3_gpu_slot_write(g, s0, mid + MBD_STATE_IMAGE_HEADER, pay, &err));
      CHECK_OK(mbd_mamba3_gpu_prefill(g, 1, (int)(T - h), ids + T + h, &s0, MBD_LOGITS_ALL,
                                      got, &err));
      assert_memory_equal(got, ref + ((size_t)T + h) * V, (size_t)(T - h) * V * 4);
      free(mid);
      mbd_mamba3_state_destroy(&s);
    }
    for (int b = 0; b < B; b++) free(img[b]);
    free(buf);
    free(row);
    free(ref);
    free(got);
    mbd_mamba3_gpu_destroy(&g);
    mbd_gpu_ctx_destroy(&ctx);
    mbd_mamba3_destroy(&cpu);
    free(ids);
    gmt_fixture_free(&f);
  }
  if (!ran) skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_gpu_vs_cpu)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
