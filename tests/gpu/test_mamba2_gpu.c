/* The Mamba-2 family on the CUDA backend against the CPU backend and the
 * transformers fixtures, through the backend interface: f32 logits and
 * state images bit-identical to the CPU model's (memcmp), within 1e-4 of the
 * reference at every position; prefill in chunks of several lengths then
 * decoding == decoding token by token (memcmp); a sequence alone == any slot
 * of batched steps of 2..256; run to run; a CPU state image continues on the
 * GPU bit-exactly; bf16 within 2x the fixture's bf16 error; graph-replayed
 * decode steps == eager ones (logits, picks, states by memcmp) on the model
 * vtable. Exits 77 without a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_family.h"
#include "support/backend_calls.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_model_test.h"

static const char *cases[] = {"tiny-d64-s16-c8", "small-d256-g2-s32-c16"};
#define NCASES 2

static mbd_backend *backend(mbd_backend_kind kind, mbd_dtype_policy policy) {
  return gmt_backend(kind, policy, MBD_STATE_F32);
}

/* The largest |a[i] - b[i]|, and in *mx the largest |b[i]|. */
static double max_err(const float *a, const float *b, size_t n, double *mx) {
  double e = 0;
  *mx = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > e) e = d;
    if (fabs(b[i]) > *mx) *mx = fabs(b[i]);
  }
  return e;
}

/* f32: GPU == CPU bits (forward, decode, state), reference tolerance,
 * prefill chunks == decode. */
static void test_f32_vs_cpu(void **state) {
  (void)state;
  int ran = 0;
  mbd_backend *gb = backend(MBD_BACKEND_CUDA, MBD_POLICY_F32);
  mbd_backend *cb = backend(MBD_BACKEND_CPU, MBD_POLICY_F32);
  for (int c = 0; c < NCASES; c++) {
    gmt_fixture f;
    if (gmt_fixture_load("mamba2", cases[c], &f)) continue;
    ran++;
    mbd_bmodel *gm = bc_load(gb, f.dir), *cm = bc_load(cb, f.dir);
    const int64_t B = f.B, T = f.T, V = f.V;
    assert_int_equal(gb->ops->model_vocab(gm), V);
    size_t n = (size_t)(B * T * V);
    float *g = malloc(n * 4), *cpu = malloc(n * 4);
    mbd_error err = {0};
    assert_int_equal(gb->ops->forward(gb, gm, f.ids, B, T, false, g, &err), 0);
    assert_int_equal(cb->ops->forward(cb, cm, f.ids, B, T, false, cpu, &err), 0);
    assert_memory_equal(g, cpu, n * 4);
    assert_int_equal(gb->ops->forward(gb, gm, f.ids, B, T, false, cpu, &err), 0);
    assert_memory_equal(g, cpu, n * 4); /* run to run */
    for (int64_t p = 0; p < B * T; p++) {
      double mx, e = max_err(g + p * V, f.target + p * V, (size_t)V, &mx);
      if (e / mx > 1e-4) fail_msg("%s position %lld: rel err %.3g", cases[c], (long long)p, e / mx);
    }
    /* decode token by token: GPU == CPU, logits and state image */
    float *gd = malloc((size_t)(T * V) * 4), *cd = malloc((size_t)(T * V) * 4);
    uint8_t *gi = NULL, *ci = NULL;
    size_t gn = 0, cn = 0;
    bc_decode_all(gb, gm, f.ids, T, V, gd, &gi, &gn);
    bc_decode_all(cb, cm, f.ids, T, V, cd, &ci, &cn);
    assert_memory_equal(gd, cd, (size_t)(T * V) * 4);
    assert_memory_equal(gd, g, (size_t)(T * V) * 4); /* decode == forward */
    assert_int_equal(gn, cn);
    assert_memory_equal(gi, ci, gn);
    /* prefill in chunks, then decode: the same bits */
    const int64_t chunks[] = {1, 2, 3, 5, 8, 13, 64};
    float *got = malloc((size_t)(T * V) * 4);
    gmt_check_chunked_prefill(gb, gm, f.ids, T, V, chunks, sizeof chunks / sizeof chunks[0], 7,
                              gd, gi, gn, cases[c]);
    /* a CPU image after half the prompt continues on the GPU */
    {
      const int64_t H = T / 2;
      mbd_bstate *cs = bc_new_state(cb, cm), *gs = bc_new_state(gb, gm);
      assert_int_equal(cb->ops->prefill(cb, cm, cs, f.ids, H, true, got, &err), 0);
      size_t in = 0;
      uint8_t *img = bc_save(cb, cs, &in);
      assert_int_equal(gb->ops->state_load(gs, img, in, &err), 0);
      assert_int_equal(gb->ops->prefill(gb, gm, gs, f.ids + H, T - H, false, got, &err), 0);
      assert_memory_equal(got, gd + H * V, (size_t)((T - H) * V) * 4);
      free(img);
      cb->ops->state_free(cb, cs);
      gb->ops->state_free(gb, gs);
    }
    print_message("%s: GPU f32 == CPU f32 bits, prefill chunks == decode\n", cases[c]);
    free(got);
    free(gd);
    free(cd);
    free(gi);
    free(ci);
    free(g);
    free(cpu);
    gb->ops->model_destroy(gb, gm);
    cb->ops->model_destroy(cb, cm);
    gmt_fixture_free(&f);
  }
  mbd_backend_destroy(&gb);
  mbd_backend_destroy(&cb);
  if (!ran) skip();
}

/* Batched steps of n = 2..256 sequences: every slot equals its solo run. */
static void test_batch_invariance(void **state) {
  (void)state;
  gmt_fixture f;
  if (gmt_fixture_load("mamba2", cases[1], &f)) skip();
  mbd_backend *gb = backend(MBD_BACKEND_CUDA, MBD_POLICY_F32);
  mbd_bmodel *gm = bc_load(gb, f.dir);
  const int64_t V = f.V;
  enum { NMAX = GMT_NMAX, STEPS = 6 };
  int64_t *tok = gmt_batch_tokens(V, STEPS);
  float *solo = gmt_solo_runs(gb, gm, V, tok, STEPS);
  gmt_check_batched_eq_solo(gb, gm, V, tok, STEPS, solo, cases[1]);
  float *rows = malloc((size_t)NMAX * V * 4);
  mbd_error err = {0};
  /* greedy picks on the device (step_greedy): the argmax of the solo logits */
  if (gb->ops->step_greedy) {
    mbd_bstate *st[NMAX];
    int64_t tk[NMAX], next[NMAX];
    for (int i = 0; i < NMAX; i++) st[i] = bc_new_state(gb, gm);
    for (int t = 0; t < STEPS; t++) {
      for (int i = 0; i < NMAX; i++) tk[i] = tok[i * STEPS + t];
      assert_int_equal(gb->ops->step_greedy(gb, gm, st, tk, NMAX, next, rows, &err), 0);
      for (int i = 0; i < NMAX; i++) {
        const float *l = solo + ((size_t)i * STEPS + t) * V;
        int64_t am = 0;
        for (int64_t v = 1; v < V; v++)
          if (l[v] > l[am]) am = v;
        assert_int_equal(next[i], am);
        assert_memory_equal(rows + (size_t)i * V, l, (size_t)V * 4);
      }
    }
    for (int i = 0; i < NMAX; i++) gb->ops->state_free(gb, st[i]);
  }
  free(rows);
  free(solo);
  free(tok);
  gb->ops->model_destroy(gb, gm);
  mbd_backend_destroy(&gb);
  gmt_fixture_free(&f);
}

/* bf16 route: within twice the error of PyTorch's bf16 run of the fixture
 * (the Mamba-1 GPU test's bound: GEMM inputs are rounded to bf16 here, and
 * the block norms take the 32-lane split). */
static void test_bf16(void **state) {
  (void)state;
  int ran = 0;
  mbd_backend *gb = backend(MBD_BACKEND_CUDA, MBD_POLICY_BF16);
  for (int c = 0; c < NCASES; c++) {
    gmt_fixture f;
    if (gmt_fixture_load("mamba2", cases[c], &f)) continue;
    ran++;
    mbd_bmodel *gm = bc_load(gb, f.dir);
    char what[64];
    snprintf(what, sizeof what, "%s bf16", cases[c]);
    gmt_check_logits_bound(gb, gm, &f, f.target, 2.0, what);
    gb->ops->model_destroy(gb, gm);
    gmt_fixture_free(&f);
  }
  mbd_backend_destroy(&gb);
  if (!ran) skip();
}

/* Decode steps of batches 1, 3, 5, 2, 8, 3 (buckets 1, 4, 8, 2, 8, 4: padded
 * rows, first captures and replays) after a prefill, on the family vtable
 * with graphs on and off: logits, greedy picks and state payloads equal by
 * memcmp, f32 and bf16. */
enum { GV_SLOTS = 8, GV_STEPS = 6, GV_PRE = 5 };
static void graph_run(const char *dir, mbd_dtype_policy pol, int graphs, float *logits,
                      int32_t *next, uint8_t **states, size_t *payload, int64_t *vocab) {
  static const int sizes[GV_STEPS] = {1, 3, 5, 2, 8, 3};
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.policy = pol;
  cfg.state_capacity = GV_SLOTS;
  mbd_gpu_ctx *ctx = NULL;
  mbd_error err = {0};
  if (mbd_gpu_ctx_new(&cfg, &ctx, &err)) fail_msg("context: %s", err.msg);
  const mbd_gpu_model_ops *f = mbd_gpu_model_ops_find("mamba2");
  assert_non_null(f);
  mbd_gpu_model_opts o = {.dtype = pol == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : MBD_DTYPE_F32,
                          .max_batch = GV_SLOTS, .use_graphs = graphs, .progress = NULL};
  void *m = NULL;
  if (f->load(ctx, dir, &o, &m, &err)) fail_msg("load: %s", err.msg);
  const int64_t V = f->vocab(m);
  *vocab = V;
  int32_t tok[GV_SLOTS * GV_PRE], slots[GV_SLOTS];
  for (int i = 0; i < GV_SLOTS * GV_PRE; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
  for (int i = 0; i < GV_SLOTS; i++) slots[i] = GV_SLOTS - 1 - i;
  if (f->prefill(m, GV_SLOTS, GV_PRE, tok, slots, MBD_LOGITS_NONE, NULL, &err))
    fail_msg("prefill: %s", err.msg);
  for (int k = 0; k < GV_STEPS; k++) {
    const int n = sizes[k];
    int32_t st[GV_SLOTS], tk[GV_SLOTS];
    for (int i = 0; i < n; i++) {
      st[i] = (int32_t)((i * 3 + k) % GV_SLOTS);
      tk[i] = (int32_t)((k * 101 + i * 7 + 3) % V);
    }
    if (f->step(m, n, tk, st, next + k * GV_SLOTS, logits + (size_t)k * GV_SLOTS * V, &err))
      fail_msg("step %d (batch %d, graphs %d): %s", k, n, graphs, err.msg);
  }
  *payload = f->state_payload(m);
  *states = malloc((size_t)GV_SLOTS * *payload);
  assert_non_null(*states);
  for (int i = 0; i < GV_SLOTS; i++)
    if (f->slot_read(m, i, *states + (size_t)i * *payload, *payload, &err))
      fail_msg("slot read: %s", err.msg);
  f->destroy(m);
  mbd_gpu_ctx_destroy(&ctx);
}

static void test_graph_vs_eager(void **state) {
  (void)state;
  gmt_fixture f;
  if (gmt_fixture_load("mamba2", cases[1], &f)) skip();
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  const size_t V = (size_t)f.V, nl = (size_t)GV_STEPS * GV_SLOTS * V;
  for (int pi = 0; pi < 2; pi++) {
    float *lg[2];
    int32_t nx[2][GV_STEPS * GV_SLOTS];
    uint8_t *im[2];
    size_t pay[2];
    int64_t voc[2];
    for (int g = 0; g < 2; g++) {
      lg[g] = calloc(nl, 4);
      memset(nx[g], 0, sizeof nx[g]);
      graph_run(f.dir, pols[pi], g, lg[g], nx[g], &im[g], &pay[g], &voc[g]);
    }
    assert_int_equal(voc[0], (int64_t)V);
    assert_int_equal(pay[0], pay[1]);
    assert_memory_equal(lg[0], lg[1], nl * 4);
    assert_memory_equal(nx[0], nx[1], sizeof nx[0]);
    assert_memory_equal(im[0], im[1], (size_t)GV_SLOTS * pay[0]);
    print_message("%s: graph decode == eager decode (logits, picks, states)\n",
                  pols[pi] == MBD_POLICY_F32 ? "f32" : "bf16");
    for (int g = 0; g < 2; g++) {
      free(lg[g]);
      free(im[g]);
    }
  }
  gmt_fixture_free(&f);
}

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32_vs_cpu),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_graph_vs_eager),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
