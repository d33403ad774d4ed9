/* The Mamba-2 family on the CUDA backend with a bf16 recurrent state (route
 * state=bf16, docs/route.md "Mamba-2 with a bf16 state"), through the backend
 * interface, with f32 and bf16 weights. The bit-exact properties run on
 * synthetic checkpoints written at setup (the fixtures' head shapes, one
 * with a d_state that no lane split divides, and the published models'
 * head_dim 64 / d_state 128), so they need no fixtures; the tolerance and
 * greedy checks read ../shared/fixtures/mamba2 (MBD_FIXTURES_DIR) and skip
 * without them. The route says state=bf16; prefill in
 * chunks of several lengths (non-multiples of the kernel's chunks included)
 * then decoding == decoding token by token (memcmp of logits and state
 * images), long prefills (many rows; several kernel chunks and time windows;
 * the published models' head shape on a synthetic checkpoint) == batched
 * decoding; a sequence alone == any slot of batched steps of
 * 2..256; run to run and backend to backend; the state image is f32 holding
 * bf16 values, and export -> import (another backend too) -> continue is
 * bit-exact, the device stash likewise and smaller than on the f32-state
 * route; logits within the stated bound of the float64 fixtures, greedy
 * tokens where the reference's margin exceeds twice that bound. The CPU
 * backend and Mamba-3 refuse the bf16 state (Mamba-1 keeps it too:
 * test_mamba1_state_bf16.c). Exits 77 without a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/route.h"
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/model/mamba2.h"
#include "kernels/model/mamba3_synth.h"
#include "kernels/model/synth.h"
#include "support/backend_calls.h"
#include "support/model_check.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_model_test.h"

#include <unistd.h>

static const char *cases[] = {"tiny-d64-s16-c8", "small-d256-g2-s32-c16"};
#define NCASES 2

/* The bounds of docs/route.md ("Mamba-2 with a bf16 state"): the largest
 * absolute logit error against the float64 fixture, as a multiple of the
 * error of PyTorch's own bf16 run of it (weights, activations and state in
 * bf16). f32 weights with a bf16 state: a quarter of it (the CPU model
 * with the same roundings measured 0.05 and 0.11 of it); bf16 weights with
 * a bf16 state: twice it (the bf16 route's bound). */
#define BOUND_F32_WEIGHTS 0.25
#define BOUND_BF16_WEIGHTS 2.0

/* Synthetic checkpoints, written once at setup: Mamba-2 shapes (heads x
 * head_dim, d_state, groups) 8 x 16 / 16 / 1 and 8 x 32 / 32 / 2 (the
 * fixtures'), 8 x 24 / 24 / 2 (no lane split divides 24: partial lanes, no
 * vector access), 4 x 64 / 128 / 1 (the published models'); then a Mamba-1
 * model (which loads on this route) and a Mamba-3 model (which refuses it). */
enum { NSYN = 4, SYN_M1 = NSYN, SYN_M3 = NSYN + 1, NDIRS = NSYN + 2 };
static char g_dirs[NDIRS][64];
static mbd_mamba2_config g_cfg[NSYN];

static void synth_cfg(int k, mbd_mamba2_config *c) {
  static const int dm[NSYN] = {64, 128, 96, 128}, P[NSYN] = {16, 32, 24, 64},
                   N[NSYN] = {16, 32, 24, 128}, G[NSYN] = {1, 2, 2, 1};
  mbd_mamba2_synth_custom(dm[k], 2, 512, c);
  c->head_dim = P[k];
  c->n_heads = c->d_inner / P[k];
  c->d_state = N[k];
  c->n_groups = G[k];
}

static int write_synth(void) {
  mbd_error err = {0};
  for (int k = 0; k < NDIRS; k++) {
    snprintf(g_dirs[k], sizeof g_dirs[k], "/tmp/mbd_m2bf16_XXXXXX");
    if (!mkdtemp(g_dirs[k])) return -1;
  }
  for (int k = 0; k < NSYN; k++) {
    synth_cfg(k, &g_cfg[k]);
    if (mbd_mamba2_synth_write(&g_cfg[k], MBD_DTYPE_F32, 100 + (uint64_t)k, g_dirs[k], &err))
      goto fail;
  }
  mbd_mamba_config c1;
  mbd_synth_custom(64, 2, 256, &c1);
  if (mbd_synth_write(&c1, MBD_DTYPE_F32, 5, g_dirs[SYN_M1], &err)) goto fail;
  mbd_mamba3_config c3;
  if (mbd_mamba3_synth_shape("custom", 64, 2, 256, &c3, &err) ||
      mbd_mamba3_synth_write(&c3, MBD_DTYPE_F32, 6, g_dirs[SYN_M3], &err))
    goto fail;
  return 0;
fail:
  fprintf(stderr, "synthetic checkpoints: %s\n", err.msg);
  return -1;
}

/* SSM entries of synthetic model k: n_layer x heads x head_dim x d_state. */
static int64_t ssm_floats_of(int k) {
  return (int64_t)g_cfg[k].n_layer * g_cfg[k].d_inner * g_cfg[k].d_state;
}

static mbd_backend *backend_state(mbd_dtype_policy policy, mbd_state_dtype sd) {
  return gmt_backend(MBD_BACKEND_CUDA, policy, sd);
}
static mbd_backend *backend(mbd_dtype_policy policy) {
  return backend_state(policy, MBD_STATE_BF16);
}

static void test_route_says_bf16(void **state) {
  (void)state;
  gmt_check_route_bf16();
}

/* Prefill in chunks then decode == decode from the start (logits, state
 * images), forward == decode, run to run; f32 and bf16 weights. */
static void test_prefill_eq_decode(void **state) {
  (void)state;
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  for (int pi = 0; pi < 2; pi++) {
    mbd_backend *gb = backend(pols[pi]);
    for (int c = 0; c < NSYN; c++) {
      mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
      const int64_t chunks[] = {1, 2, 3, 4, 5, 7, 8, 13, 17, 33, 64};
      char what[32];
      snprintf(what, sizeof what, "model %d", c);
      gmt_check_forward_decode_prefill(gb, gm, 3, 37, c, ssm_floats_of(c), chunks,
                                       sizeof chunks / sizeof chunks[0], 6, what);
      print_message("%s weights, model %d (%d x %d, d_state %d, %d groups), state bf16: "
                    "prefill chunks == decode == forward\n",
                    mbd_dtype_policy_name(pols[pi]), c, g_cfg[c].n_heads, g_cfg[c].head_dim,
                    g_cfg[c].d_state, g_cfg[c].n_groups);
      gb->ops->model_destroy(gb, gm);
    }
    mbd_backend_destroy(&gb);
  }
}

/* Long prefills through the kernel's other shapes: 24 sequences of 100
 * tokens in one launch (four rows per lane, several chunks) against batched
 * decoding, and one sequence of 2500 tokens (more than one model chunk and
 * dt window) in one call and in pieces of 777 against decoding. */
static void test_long_prefill(void **state) {
  (void)state;
  mbd_backend *gb = backend(MBD_POLICY_F32);
  mbd_bmodel *gm = bc_load(gb, g_dirs[1]);
  const int64_t V = gb->ops->model_vocab(gm);
  mbd_error err = {0};
  {
    enum { NS = 24, TL = 100 };
    int64_t *ids = malloc((size_t)NS * TL * 8);
    for (int64_t i = 0; i < NS * TL; i++) ids[i] = (i * 7919 + 13) % V;
    float *fw = malloc((size_t)NS * TL * V * 4);
    assert_int_equal(gb->ops->forward(gb, gm, ids, NS, TL, false, fw, &err), 0);
    gmt_check_batched_decode(gb, gm, ids, NS, TL, V, fw, "model 1");
    free(fw);
    free(ids);
  }
  {
    enum { TL = 2500, PIECE = 777 };
    int64_t *ids = malloc((size_t)TL * 8);
    for (int64_t i = 0; i < TL; i++) ids[i] = (i * 104729 + 3) % V;
    gmt_check_long_prefill(gb, gm, ids, TL, V, PIECE, 0);
    free(ids);
  }
  print_message("long prefills == decoding (24 x 100 batched, 2500 alone and in pieces)\n");
  gb->ops->model_destroy(gb, gm);
  mbd_backend_destroy(&gb);
}

/* The published models' head shape (head_dim 64, d_state 128) on a small
 * synthetic checkpoint, where the kernel takes its other paths: 40
 * sequences of 64 tokens in one forward (four rows per lane in the 51-step
 * launch, one in the 13-step rest) == 40 batched decode steps at a time;
 * one sequence of 600 tokens prefilled == decoded (software-pipelined
 * prefill, eight lanes a row); the f32-state route's bits differ. */
static void test_real_head_shape(void **state) {
  (void)state;
  const char *dir = g_dirs[3];
  const mbd_mamba2_config cfg = g_cfg[3];
  assert_int_equal(cfg.head_dim, 64);
  assert_int_equal(cfg.d_state, 128);
  mbd_error err = {0};
  mbd_backend *gb = backend(MBD_POLICY_F32), *fb = backend_state(MBD_POLICY_F32, MBD_STATE_F32);
  mbd_bmodel *gm = bc_load(gb, dir), *fm = bc_load(fb, dir);
  const int64_t V = gb->ops->model_vocab(gm);
  {
    enum { NS = 40, TL = 64 };
    int64_t *ids = malloc((size_t)NS * TL * 8);
    for (int64_t i = 0; i < NS * TL; i++) ids[i] = (i * 7919 + 13) % V;
    float *fw = malloc((size_t)NS * TL * V * 4), *fw32 = malloc((size_t)NS * TL * V * 4);
    assert_int_equal(gb->ops->forward(gb, gm, ids, NS, TL, false, fw, &err), 0);
    assert_int_equal(fb->ops->forward(fb, fm, ids, NS, TL, false, fw32, &err), 0);
    assert_true(memcmp(fw, fw32, (size_t)NS * TL * V * 4) != 0); /* the state route matters */
    gmt_check_batched_decode(gb, gm, ids, NS, TL, V, fw, "head_dim 64 d_state 128");
    free(fw);
    free(fw32);
    free(ids);
  }
  {
    enum { TL = 600 };
    int64_t *ids = malloc((size_t)TL * 8);
    for (int64_t i = 0; i < TL; i++) ids[i] = (i * 104729 + 3) % V;
    gmt_check_long_prefill(gb, gm, ids, TL, V, 0,
                           (int64_t)cfg.n_layer * cfg.d_inner * cfg.d_state);
    free(ids);
  }
  print_message("head_dim 64, d_state 128: 40 x 64 forward == batched decode, 600 prefill == "
                "decode\n");
  gb->ops->model_destroy(gb, gm);
  fb->ops->model_destroy(fb, fm);
  mbd_backend_destroy(&gb);
  mbd_backend_destroy(&fb);
}

/* Batched steps of n = 2..256 sequences: every slot equals its solo run. */
static void test_batch_invariance(void **state) {
  (void)state;
  mbd_backend *gb = backend(MBD_POLICY_F32);
  for (int c = 1; c < NSYN; c += 2) { /* 8 x 32 / 32 / 2 groups, and 4 x 64 / 128 */
    mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
    char what[32];
    snprintf(what, sizeof what, "model %d", c);
    gmt_check_batch_invariance(gb, gm, 6, what);
    print_message("model %d, state bf16: batched steps 2..256 == solo\n", c);
    gb->ops->model_destroy(gb, gm);
  }
  mbd_backend_destroy(&gb);
}

/* Export after half the prompt, import into a fresh state (same backend and
 * a second one), continue: the bits of decoding from the start; the device
 * stash the same, and smaller than the f32-state route's. */
static void test_export_import(void **state) {
  (void)state;
  gmt_check_export_import(g_dirs[1], ssm_floats_of(1));
}

/* Logits against the float64 fixtures within the bound; greedy tokens of
 * the n_groups = 1 fixture by teacher forcing (the reference's tokens fed,
 * each step's logits within the bound of the reference's, the pick equal to
 * the reference's wherever its top-2 margin exceeds twice the bound). */
static void test_fixture_bound(void **state) {
  (void)state;
  int ran = 0;
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  const double factor[2] = {BOUND_F32_WEIGHTS, BOUND_BF16_WEIGHTS};
  for (int pi = 0; pi < 2; pi++) {
    mbd_backend *gb = backend(pols[pi]);
    for (int c = 0; c < NCASES; c++) {
      gmt_fixture f;
      if (gmt_fixture_load("mamba2", cases[c], &f)) continue;
      ran++;
      assert_non_null(f.glogits);
      mbd_bmodel *gm = bc_load(gb, f.dir);
      const int64_t B = f.B, T = f.T, V = f.V, G = f.G;
      mbd_error err = {0};
      char what[96];
      snprintf(what, sizeof what, "%s weights %s, state bf16", mbd_dtype_policy_name(pols[pi]),
               cases[c]);
      const double bound = gmt_check_logits_bound(gb, gm, &f, f.target, factor[pi], what);
      if (f.target_is_hf) {
        float *l = malloc((size_t)V * 4);
        double ge = 0;
        int checked = 0;
        for (int64_t s = 0; s < B; s++) {
          const int64_t *gs = f.greedy + s * (T + G);
          mbd_bstate *st = bc_new_state(gb, gm);
          assert_int_equal(gb->ops->prefill(gb, gm, st, gs, T, true, l, &err), 0);
          for (int64_t i = 0; i < G; i++) {
            if (i) assert_int_equal(gb->ops->step(gb, gm, &st, gs + T - 1 + i, 1, l, &err), 0);
            const float *r = f.glogits + (s * G + i) * V;
            const double e = mc_max_err(l, r, (size_t)V);
            if (e > ge) ge = e;
            int64_t am = 0, ar = 0;
            for (int64_t v = 1; v < V; v++) {
              if (l[v] > l[am]) am = v;
              if (r[v] > r[ar]) ar = v;
            }
            double second = -INFINITY;
            for (int64_t v = 0; v < V; v++)
              if (v != ar && r[v] > second) second = r[v];
            if (r[ar] - second > 2 * bound) {
              checked++;
              if (am != gs[T + i])
                fail_msg("%s sequence %lld greedy step %lld: picked %lld, reference %lld "
                         "(margin %.4g)", cases[c], (long long)s, (long long)i, (long long)am,
                         (long long)gs[T + i], r[ar] - second);
            }
          }
          gb->ops->state_free(gb, st);
        }
        print_message("   greedy: max abs err %.4g over %lld steps, %d picks checked\n", ge,
                      (long long)(B * G), checked);
        if (ge > bound) fail_msg("%s greedy logits err %.4g > bound %.4g", cases[c], ge, bound);
        free(l);
      }
      gb->ops->model_destroy(gb, gm);
      gmt_fixture_free(&f);
    }
    mbd_backend_destroy(&gb);
  }
  if (!ran) skip();
}

/* The CPU backend and Mamba-3 refuse a bf16 state, saying where it runs;
 * Mamba-1 loads. */
static void test_refusals(void **state) {
  (void)state;
  gmt_check_bf16_refusals(g_dirs[SYN_M3]);
  mbd_backend *gb = backend(MBD_POLICY_F32);
  mbd_bmodel *m = bc_load(gb, g_dirs[SYN_M1]);
  gb->ops->model_destroy(gb, m);
  mbd_backend_destroy(&gb);
}

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  return write_synth();
}

static int teardown(void **state) {
  (void)state;
  gmt_remove_checkpoints(g_dirs, NDIRS);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_route_says_bf16),   cmocka_unit_test(test_prefill_eq_decode),
      cmocka_unit_test(test_long_prefill),      cmocka_unit_test(test_real_head_shape),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_export_import),     cmocka_unit_test(test_fixture_bound),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
